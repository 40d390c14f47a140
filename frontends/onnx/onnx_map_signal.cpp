// ONNX's DFT (17, 20) as matrix products: the transformed axis moved last, then the real and
// imaginary parts multiplied by cos/sin matrices known at import, in f64 whatever the input's
// float type (a f32 sum of n products is off by n ulps of the largest term, which buries the
// small coefficients of a spectrum; the result is rounded once to the input's type). An O(n^2)
// transform, which
// for the lengths models use, framing windows of a few hundred samples, is a few small
// matmuls; above 4096 along the axis it is refused). Forward, inverse (scaled by 1/n), onesided
// (the first n/2 + 1 frequencies) and the inverse of a onesided spectrum (NumPy's irfft: the
// Hermitian extension, the imaginary parts of the DC and Nyquist terms ignored). dft_length
// truncates or zero-pads the signal, as NumPy's n.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <string>
#include <vector>

#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_map_util.h"
#include "frontends/onnx/onnx_tensor.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::OpKind;
using ir::Value;

constexpr int64_t kMaxDftLength = 4096;

// `x` ([..., signal dims, 1 or 2], f32 or f64) transformed along `axis` with length n: the
// output [..., outLen, ..., 2] (1 for irfft) of x's type.
Expected<Value*> transform(NodeContext& ctx, Value* x, int axis, int64_t n, bool inverse,
                           bool onesided) {
  const ir::TensorType t = x->type();
  const int rank = t.rank();
  const bool complexIn = t.shape.back() == 2;
  const int64_t m = t.shape[static_cast<size_t>(axis)];  // Input length along the axis.
  if (n < 1) return ctx.invalid("dft_length must be 1 or more, got " + std::to_string(n));
  if (n > kMaxDftLength || m > kMaxDftLength)
    return ctx.unsupported("a DFT of length " + std::to_string(std::max(n, m)) +
                           " (kiln multiplies by a matrix of cosines and sines; at most " +
                           std::to_string(kMaxDftLength) + ")");
  // Input terms used (the rest is truncated; missing ones are zeros) and output terms.
  const bool irfft = inverse && onesided;
  const int64_t used = std::min(m, irfft ? n / 2 + 1 : n);
  const int64_t outLen = irfft ? n : (onesided ? n / 2 + 1 : n);

  // Matrices [used, outLen]: the angle 2 pi j k / n between input term j and output term k.
  // Forward: Y = X e^{-i angle}; inverse: x = X e^{+i angle} / n; irfft: the real part of the
  // Hermitian extension's inverse, each term k with 0 < k < n/2 counted twice.
  const ir::DType f64 = ir::DType::kF64;
  ir::TensorData cosM = filledTensor(f64, {used, outLen}, 0);
  ir::TensorData sinM = filledTensor(f64, {used, outLen}, 0);
  for (int64_t j = 0; j < used; ++j)
    for (int64_t k = 0; k < outLen; ++k) {
      // The product j k reduced mod n keeps the angle exact for long transforms.
      const double angle =
          2 * std::numbers::pi * static_cast<double>((j * k) % n) / static_cast<double>(n);
      double scale = inverse ? 1.0 / static_cast<double>(n) : 1.0;
      if (irfft && j > 0 && 2 * j != n) scale *= 2;
      const size_t at = static_cast<size_t>(j * outLen + k);
      cosM.as<double>()[at] = scale * std::cos(angle);
      sinM.as<double>()[at] = scale * std::sin(angle);
    }
  KILN_ASSIGN_OR_RETURN(Value * cv, ctx.constantValue(std::move(cosM)));
  KILN_ASSIGN_OR_RETURN(Value * sv, ctx.constantValue(std::move(sinM)));

  // The real and imaginary parts, the axis moved last, truncated to the terms used.
  if (t.dtype != f64) {
    KILN_ASSIGN_OR_RETURN(x, ctx.emit(OpKind::kCast, {x}, {{"to", std::string("f64")}}));
  }
  std::vector<int64_t> perm;
  for (int d = 0; d < rank - 1; ++d)
    if (d != axis) perm.push_back(d);
  perm.push_back(axis);
  std::vector<int64_t> back(perm.size());
  for (size_t d = 0; d < perm.size(); ++d)
    back[static_cast<size_t>(perm[d])] = static_cast<int64_t>(d);
  const int64_t last = rank - 1;
  auto part = [&](int64_t which) -> Expected<Value*> {
    KILN_ASSIGN_OR_RETURN(Value * p, ctx.emit(OpKind::kSlice, {x},
                                              {{"starts", std::vector<int64_t>{which}},
                                               {"ends", std::vector<int64_t>{which + 1}},
                                               {"axes", std::vector<int64_t>{last}}}));
    KILN_ASSIGN_OR_RETURN(p,
                          ctx.emit(OpKind::kSqueeze, {p}, {{"axes", std::vector<int64_t>{last}}}));
    if (axis != rank - 2) {
      KILN_ASSIGN_OR_RETURN(p, ctx.emit(OpKind::kTranspose, {p}, {{"perm", perm}}));
    }
    if (used < m) {
      KILN_ASSIGN_OR_RETURN(p, ctx.emit(OpKind::kSlice, {p},
                                        {{"starts", std::vector<int64_t>{0}},
                                         {"ends", std::vector<int64_t>{used}},
                                         {"axes", std::vector<int64_t>{last - 1}}}));
    }
    return p;
  };
  KILN_ASSIGN_OR_RETURN(Value * xr, part(0));
  Value* xi = nullptr;
  if (complexIn) {
    KILN_ASSIGN_OR_RETURN(xi, part(1));
  }
  auto mm = [&](Value* a, Value* b) { return ctx.emit(OpKind::kMatMul, {a, b}); };
  // Forward: yr = xr C + xi S, yi = xi C - xr S. Inverse: yr = xr C - xi S, yi = xi C + xr S.
  KILN_ASSIGN_OR_RETURN(Value * yr, mm(xr, cv));
  if (xi) {
    KILN_ASSIGN_OR_RETURN(Value * t2, mm(xi, sv));
    KILN_ASSIGN_OR_RETURN(yr, ctx.emit(inverse ? OpKind::kSub : OpKind::kAdd, {yr, t2}));
  }
  std::vector<Value*> parts{yr};
  if (!irfft) {
    KILN_ASSIGN_OR_RETURN(Value * rs, mm(xr, sv));
    Value* yi = nullptr;
    if (xi) {
      KILN_ASSIGN_OR_RETURN(Value * ic, mm(xi, cv));
      KILN_ASSIGN_OR_RETURN(yi, ctx.emit(inverse ? OpKind::kAdd : OpKind::kSub, {ic, rs}));
    } else if (inverse) {
      yi = rs;
    } else {
      KILN_ASSIGN_OR_RETURN(yi, ctx.emit(OpKind::kNeg, {rs}));
    }
    parts.push_back(yi);
  }
  for (Value*& p : parts) {
    if (axis != rank - 2) {
      KILN_ASSIGN_OR_RETURN(p, ctx.emit(OpKind::kTranspose, {p}, {{"perm", back}}));
    }
    KILN_ASSIGN_OR_RETURN(
        p, ctx.emit(OpKind::kUnsqueeze, {p}, {{"axes", std::vector<int64_t>{last}}}));
  }
  Value* y = parts[0];
  if (parts.size() == 2) {
    KILN_ASSIGN_OR_RETURN(y, ctx.emit(OpKind::kConcat, parts, {{"axis", last}}));
  }
  if (t.dtype != f64) {
    KILN_ASSIGN_OR_RETURN(
        y, ctx.emit(OpKind::kCast, {y}, {{"to", std::string(ir::dtypeName(t.dtype))}}));
  }
  return y;
}

// The signal input's type: f32 or f64, [..., 1] (real) or [..., 2] (complex).
Expected<ir::TensorType> signalInput(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatInput(ctx));
  if (t.rank() < 2 || (t.shape.back() != 1 && t.shape.back() != 2))
    return ctx.invalid("input " + t.toString() +
                       " must be [..., signal dims, 1] (real) or [..., 2] (complex)");
  return t;
}

Status mapDft(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, signalInput(ctx));
  const int rank = t.rank();
  int64_t axisValue = 1;
  if (ctx.version() >= 20) {
    axisValue = -2;
    if (ctx.hasInput(2)) {
      KILN_ASSIGN_OR_RETURN(double a, ctx.constScalar(2, "axis"));
      axisValue = static_cast<int64_t>(a);
    }
  } else {
    KILN_ASSIGN_OR_RETURN(axisValue, ctx.attrInt("axis", 1));
  }
  KILN_ASSIGN_OR_RETURN(int axis, ir::normalizeAxis(axisValue, t.shape.size(), "axis"));
  if (axis == rank - 1)
    return ctx.invalid("axis " + std::to_string(axisValue) +
                       " is the real/imaginary dim; it must name a signal dim");
  KILN_ASSIGN_OR_RETURN(bool inverse, ctx.attrBool("inverse", false));
  KILN_ASSIGN_OR_RETURN(bool onesided, ctx.attrBool("onesided", false));
  const int64_t m = t.shape[static_cast<size_t>(axis)];
  int64_t n = inverse && onesided ? 2 * (m - 1) : m;  // The transform's length.
  if (ctx.hasInput(1)) {
    KILN_ASSIGN_OR_RETURN(double len, ctx.constScalar(1, "dft_length"));
    n = static_cast<int64_t>(len);
  }
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * y, transform(ctx, x, axis, n, inverse, onesided));
  ctx.setOutput(0, y);
  return Status::ok();
}

// STFT (17): frames of frame_length samples every frame_step (as many as fit:
// 1 + (length - frame_length) / frame_step), gathered into [B, frames, frame_length, 1 or 2],
// times the window, each transformed (onesided: frame_length / 2 + 1 bins) ->
// [B, frames, bins, 2]. frame_step and frame_length must be known at import.
Status mapStft(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, signalInput(ctx));
  if (t.rank() != 3)
    return ctx.invalid("signal " + t.toString() + " must be [batch, length, 1 or 2]");
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* stepData, ctx.requireConstant(1));
  if (!stepData) return ctx.unsupported("a frame_step computed at run time");
  if (stepData->numElements() != 1 || ir::isFloat(stepData->dtype()))
    return ctx.invalid("frame_step must be one integer, got " + stepData->type().toString());
  const int64_t step = elementAsInt(*stepData, 0);
  int64_t frameLength = -1;
  if (ctx.hasInput(3)) {
    KILN_ASSIGN_OR_RETURN(const ir::TensorData* lenData, ctx.requireConstant(3));
    if (!lenData) return ctx.unsupported("a frame_length computed at run time");
    if (lenData->numElements() != 1 || ir::isFloat(lenData->dtype()))
      return ctx.invalid("frame_length must be one integer, got " + lenData->type().toString());
    frameLength = elementAsInt(*lenData, 0);
  }
  Value* window = nullptr;
  if (ctx.hasInput(2)) {
    KILN_ASSIGN_OR_RETURN(ir::TensorType wt, ctx.inputType(2));
    if (wt.rank() != 1 || wt.dtype != t.dtype || (frameLength >= 0 && wt.shape[0] != frameLength))
      return ctx.invalid("window " + wt.toString() + " must be 1-D of the signal's type" +
                         (frameLength >= 0
                              ? " with frame_length " + std::to_string(frameLength) + " values"
                              : std::string()));
    frameLength = wt.shape[0];
    KILN_ASSIGN_OR_RETURN(window, ctx.value(2));
  }
  const int64_t length = t.shape[1];
  if (frameLength < 0) frameLength = length;
  if (step < 1 || frameLength < 1 || frameLength > length)
    return ctx.invalid("frame_step " + std::to_string(step) + " and frame_length " +
                       std::to_string(frameLength) + " must be positive and fit the signal of " +
                       std::to_string(length));
  KILN_ASSIGN_OR_RETURN(bool onesided, ctx.attrBool("onesided", true));
  if (frameLength > kMaxDftLength)
    return ctx.unsupported("frames of " + std::to_string(frameLength) +
                           " samples (a DFT of at most " + std::to_string(kMaxDftLength) + ")");
  const int64_t frames = 1 + (length - frameLength) / step;
  if (frames > kMaxFoldElements / frameLength)
    return ctx.unsupported(std::to_string(frames) +
                           " frames (kiln builds their positions at import)");
  std::vector<int64_t> positions;
  for (int64_t f = 0; f < frames; ++f)
    for (int64_t j = 0; j < frameLength; ++j) positions.push_back(f * step + j);
  KILN_ASSIGN_OR_RETURN(Value * idx,
                        ctx.constantValue(intTensor(positions, {frames, frameLength})));
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * framed,
                        ctx.emit(OpKind::kGather, {x, idx}, {{"axis", int64_t{1}}}));
  if (window) {
    KILN_ASSIGN_OR_RETURN(
        window, ctx.emit(OpKind::kReshape, {window}, {{"shape", ir::Shape{frameLength, 1}}}));
    KILN_ASSIGN_OR_RETURN(framed, ctx.emit(OpKind::kMul, {framed, window}));
  }
  KILN_ASSIGN_OR_RETURN(Value * y, transform(ctx, framed, 2, frameLength, false, onesided));
  ctx.setOutput(0, y);
  return Status::ok();
}

// MelWeightMatrix (17): a constant [dft_length / 2 + 1, num_mel_bins] of triangular filters, by
// ONNX's reference step for step (its band edges floored to DFT bins; the mel scale's log1p in
// the edges' type, the rest in double), converted to output_datatype. Every input must be known
// at import.
Status mapMelWeightMatrix(NodeContext& ctx) {
  std::vector<double> in;
  for (size_t i = 0; i < 5; ++i) {
    KILN_ASSIGN_OR_RETURN(const ir::TensorData* d, ctx.requireConstant(i));
    if (!d) return ctx.unsupported("an input computed at run time (MelWeightMatrix is a constant)");
    if (d->numElements() != 1)
      return ctx.invalid("input " + std::to_string(i) + " must be one value, got " +
                         d->type().toString());
    in.push_back(elementAsDouble(*d, 0));
  }
  KILN_ASSIGN_OR_RETURN(ir::TensorType edgeType, ctx.inputType(3));
  const int64_t bins = static_cast<int64_t>(in[0]), dftLength = static_cast<int64_t>(in[1]);
  const int64_t rate = static_cast<int64_t>(in[2]);
  if (bins < 1 || dftLength < 1 || rate < 1)
    return ctx.invalid("num_mel_bins, dft_length and sample_rate must be positive");
  const int64_t spectrogramBins = dftLength / 2 + 1;
  if (bins > kMaxFoldElements || spectrogramBins > kMaxFoldElements / bins)
    return ctx.unsupported("a MelWeightMatrix of " + std::to_string(spectrogramBins * bins) +
                           " elements (too large)");
  auto mel = [&](double hz) {
    if (edgeType.dtype == ir::DType::kF32)
      return static_cast<double>(2595.0f * std::log1p(static_cast<float>(hz) / 700.0f)) /
             std::log(10.0);
    return 2595 * std::log1p(hz / 700) / std::log(10.0);
  };
  const double lowMel = mel(in[3]), highMel = mel(in[4]);
  const double step = (highMel - lowMel) / static_cast<double>(bins + 2);
  std::vector<int64_t> edge(static_cast<size_t>(bins + 2));
  for (int64_t i = 0; i < bins + 2; ++i) {
    const double hz =
        700 * std::expm1((static_cast<double>(i) * step + lowMel) / 2595 * std::log(10.0));
    edge[static_cast<size_t>(i)] =
        static_cast<int64_t>(std::floor(static_cast<double>(dftLength + 1) * hz / rate));
  }
  std::vector<double> w(static_cast<size_t>(spectrogramBins * bins), 0.0);
  auto at = [&](int64_t j, int64_t i) -> Expected<double*> {
    if (j < 0 || j >= spectrogramBins)
      return ctx.invalid("a band edge falls at DFT bin " + std::to_string(j) + ", outside 0.." +
                         std::to_string(spectrogramBins - 1) +
                         " (upper_edge_hertz above the Nyquist frequency?)");
    return &w[static_cast<size_t>(j * bins + i)];
  };
  for (int64_t i = 0; i < bins; ++i) {
    const int64_t lo = edge[static_cast<size_t>(i)], mid = edge[static_cast<size_t>(i + 1)],
                  hi = edge[static_cast<size_t>(i + 2)];
    if (mid == lo) {
      KILN_ASSIGN_OR_RETURN(double* p, at(mid, i));
      *p = 1;
    } else {
      for (int64_t j = lo; j <= mid; ++j) {
        KILN_ASSIGN_OR_RETURN(double* p, at(j, i));
        *p = static_cast<double>(j - lo) / static_cast<double>(mid - lo);
      }
    }
    for (int64_t j = mid; j < hi; ++j) {
      KILN_ASSIGN_OR_RETURN(double* p, at(j, i));
      *p = static_cast<double>(hi - j) / static_cast<double>(hi - mid);
    }
  }
  KILN_ASSIGN_OR_RETURN(int64_t code, ctx.attrInt("output_datatype", 1));
  auto dtype = dtypeFromOnnx(static_cast<int32_t>(code));
  if (!dtype || !foldableDType(*dtype))
    return ctx.unsupported("output_datatype " + onnxTypeName(static_cast<int32_t>(code)));
  ir::TensorData out = filledTensor(*dtype, {spectrogramBins, bins}, 0);
  const size_t es = ir::dtypeSize(*dtype);
  for (size_t k = 0; k < w.size(); ++k) {
    const ir::TensorData e = filledTensor(*dtype, {}, w[k]);
    std::memcpy(out.data() + k * es, e.data(), es);
  }
  ctx.setConstantOutput(0, std::move(out));
  return Status::ok();
}

}  // namespace

// DFT 20 takes the axis as an input (default -2) where 17 has an attribute (default 1).
std::vector<MapperEntry> signalMappers() {
  return {{"DFT", {17, 20}, mapDft},
          {"STFT", {17}, mapStft},
          {"MelWeightMatrix", {17}, mapMelWeightMatrix}};
}

}  // namespace kiln::frontends::onnx_import
