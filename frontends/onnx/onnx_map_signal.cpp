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

Status mapDft(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatInput(ctx));
  const int rank = t.rank();
  if (rank < 2 || (t.shape.back() != 1 && t.shape.back() != 2))
    return ctx.invalid("input " + t.toString() +
                       " must be [..., signal dims, 1] (real) or [..., 2] (complex)");
  const bool complexIn = t.shape.back() == 2;
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
  const int64_t m = t.shape[static_cast<size_t>(axis)];  // Input length along the axis.
  int64_t n = inverse && onesided ? 2 * (m - 1) : m;     // The transform's length.
  if (ctx.hasInput(1)) {
    KILN_ASSIGN_OR_RETURN(double len, ctx.constScalar(1, "dft_length"));
    n = static_cast<int64_t>(len);
  }
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
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
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
  ctx.setOutput(0, y);
  return Status::ok();
}

}  // namespace

// DFT 20 takes the axis as an input (default -2) where 17 has an attribute (default 1).
std::vector<MapperEntry> signalMappers() {
  return {{"DFT", {17, 20}, mapDft}};
}

}  // namespace kiln::frontends::onnx_import
