// ONNX Pad and Resize, which kiln has no ops for, composed from kiln's: Pad is slices (negative
// pads) and concats with broadcast fill values, reflections, edges or wrapped slices (or, zero
// padding read only by Conv nodes, folded into their pads); Resize (nearest and linear) is a
// gather per resized dim with indices computed at import, blended with static weights for linear.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_map_util.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::OpKind;

// Zero padding of the spatial dims only, read only as the data input of Conv nodes that pad
// explicitly: those Conv nodes take the padding into their own pads.
bool foldsIntoConvs(NodeContext& ctx, const std::vector<int64_t>& pads, int rank, double value,
                    const std::string& mode) {
  if (mode != "constant" || value != 0 || (rank != 3 && rank != 4)) return false;
  for (int d = 0; d < 2 * rank; ++d)
    if (pads[d] < 0 || ((d % rank) < 2 && pads[d] != 0)) return false;
  const auto& consumers = ctx.outputConsumers(0);
  if (consumers.empty() || static_cast<int>(consumers.size()) != ctx.outputConsumerCount(0))
    return false;  // Also read as a graph output.
  const std::string& out = ctx.proto().output(0);
  for (const ::onnx::NodeProto* c : consumers) {
    if (c->op_type() != "Conv" || (!c->domain().empty() && c->domain() != "ai.onnx")) return false;
    for (int i = 1; i < c->input_size(); ++i)
      if (c->input(i) == out) return false;
    for (const auto& a : c->attribute())
      if (a.name() == "auto_pad" && a.s() != "NOTSET") return false;
  }
  return true;
}

Status mapPad(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::string mode, ctx.attrString("mode", "constant"));
  if (mode != "constant" && mode != "reflect" && mode != "edge" && mode != "wrap")
    return ctx.unsupported("mode '" + mode + "' (kiln maps constant, reflect, edge and wrap)");
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  const int r = xt.rank();
  std::vector<int64_t> pads;
  double value = 0;
  // The fill of constant mode: `value`, or where constant_value is computed at run time or of a
  // type kiln does not fold at import (f16, bf16: an attention's -inf bias), that value itself.
  ir::Value* runtimeFill = nullptr;
  if (ctx.version() < 11) {
    // Version 2: pads and value are attributes.
    KILN_ASSIGN_OR_RETURN(pads, ctx.attrInts("pads"));
    KILN_ASSIGN_OR_RETURN(value, ctx.attrFloat("value", 0.0));
  } else {
    KILN_ASSIGN_OR_RETURN(pads, ctx.constInts(1, "pads"));
    if (ctx.hasInput(2)) {
      KILN_ASSIGN_OR_RETURN(ir::TensorType vt, ctx.inputType(2));
      KILN_ASSIGN_OR_RETURN(const ir::TensorData* vc, ctx.constant(2));
      if (vt.dtype != xt.dtype || ir::numElements(vt.shape) != 1)
        return ctx.invalid("constant_value " + vt.toString() + " must be one " +
                           std::string(ir::dtypeName(xt.dtype)) + " element");
      if (vc && foldableDType(vt.dtype)) {
        KILN_ASSIGN_OR_RETURN(value, ctx.constScalar(2, "constant_value"));
      } else {
        KILN_ASSIGN_OR_RETURN(runtimeFill, ctx.value(2, /*trainable=*/false));
        if (vt.rank() != 0) {
          KILN_ASSIGN_OR_RETURN(
              runtimeFill, ctx.emit(OpKind::kReshape, {runtimeFill}, {{"shape", ir::Shape{}}}));
        }
      }
    }
  }
  if (ctx.version() >= 18 && ctx.hasInput(3)) {
    // Version 18: pads for the listed axes only (begins, then ends); the others get none.
    KILN_ASSIGN_OR_RETURN(auto axes, ctx.constInts(3, "axes"));
    if (pads.size() != 2 * axes.size())
      return ctx.invalid("pads " + ir::shapeToString(pads) + " must have 2 values per axis of " +
                         ir::shapeToString(axes));
    std::vector<int64_t> full(static_cast<size_t>(2 * r), 0);
    std::vector<bool> seen(static_cast<size_t>(r), false);
    for (size_t k = 0; k < axes.size(); ++k) {
      KILN_ASSIGN_OR_RETURN(int a, ir::normalizeAxis(axes[k], static_cast<size_t>(r), "axes"));
      if (seen[static_cast<size_t>(a)])
        return ctx.invalid("axes " + ir::shapeToString(axes) + " repeat an axis");
      seen[static_cast<size_t>(a)] = true;
      full[static_cast<size_t>(a)] = pads[k];
      full[static_cast<size_t>(a + r)] = pads[k + axes.size()];
    }
    pads = std::move(full);
  }
  if (static_cast<int>(pads.size()) != 2 * r)
    return ctx.invalid("pads " + ir::shapeToString(pads) + " must have " + std::to_string(2 * r) +
                       " values for a rank-" + std::to_string(r) + " input");
  if (std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; })) return alias(ctx, 0);
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* xc, ctx.constant(0));
  if (!xc && !runtimeFill && foldsIntoConvs(ctx, pads, r, value, mode)) {
    std::vector<int64_t> spatial;
    for (int d = 2; d < r; ++d) spatial.push_back(pads[d]);
    for (int d = 2; d < r; ++d) spatial.push_back(pads[d + r]);
    KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
    ctx.setPaddedOutput(0, x, std::move(spatial));
    return Status::ok();
  }

  KILN_ASSIGN_OR_RETURN(ir::Value * cur, ctx.value(0));
  ir::Value* fill = nullptr;
  if (mode == "constant" && runtimeFill) {
    fill = runtimeFill;
  } else if (mode == "constant") {
    // filledTensor cannot write f16/bf16, but zero is all-zero bits in every dtype (a non-zero
    // f16/bf16 value comes as an input: runtimeFill).
    if (value != 0 && !foldableDType(xt.dtype))
      return ctx.unsupported("a non-zero pad value attribute for " + xt.toString());
    KILN_ASSIGN_OR_RETURN(fill, ctx.constantValue(filledTensor(xt.dtype, {}, value)));
  }
  auto slice = [&](ir::Value* v, int d, int64_t start, int64_t end, int64_t step) {
    return ctx.emit(OpKind::kSlice, {v},
                    {{"starts", std::vector<int64_t>{start}},
                     {"ends", std::vector<int64_t>{end}},
                     {"axes", std::vector<int64_t>{d}},
                     {"steps", std::vector<int64_t>{step}}});
  };
  auto expand = [&](ir::Value* v, int d, int64_t n) {
    ir::Shape shape = cur->type().shape;
    shape[static_cast<size_t>(d)] = n;
    return ctx.emit(OpKind::kExpand, {v}, {{"shape", shape}});
  };
  for (int d = 0; d < r; ++d) {
    int64_t before = pads[d], after = pads[d + r];
    const int64_t dim = cur->type().shape[static_cast<size_t>(d)];
    if (before < 0 || after < 0) {
      const int64_t start = std::max<int64_t>(0, -before), end = dim - std::max<int64_t>(0, -after);
      if (end < start)
        return ctx.invalid("negative pads " + ir::shapeToString(pads) + " remove more than " +
                           "the whole of dim " + std::to_string(d) + " (" + std::to_string(dim) +
                           ")");
      KILN_ASSIGN_OR_RETURN(cur, slice(cur, d, start, end, 1));
      before = std::max<int64_t>(before, 0);
      after = std::max<int64_t>(after, 0);
    }
    if (before == 0 && after == 0) continue;
    const int64_t n = cur->type().shape[static_cast<size_t>(d)];
    std::vector<ir::Value*> parts;
    if (mode == "wrap") {
      // As NumPy's pad: before, the last (before mod n) values, then whole copies; after,
      // whole copies, then the first (after mod n) values.
      if (n == 0) return ctx.invalid("wrap padding of an empty dim " + std::to_string(d));
      constexpr int64_t kMaxCopies = 1024;  // Concat inputs: the copies of the dim.
      if (before / n + after / n >= kMaxCopies)
        return ctx.unsupported("wrap pads " + ir::shapeToString(pads) + " repeat dim " +
                               std::to_string(d) + " (" + std::to_string(n) + ") more than " +
                               std::to_string(kMaxCopies) + " times");
      if (before % n != 0) {
        KILN_ASSIGN_OR_RETURN(ir::Value * p, slice(cur, d, n - before % n, n, 1));
        parts.push_back(p);
      }
      parts.insert(parts.end(), static_cast<size_t>(before / n + 1 + after / n), cur);
      if (after % n != 0) {
        KILN_ASSIGN_OR_RETURN(ir::Value * p, slice(cur, d, 0, after % n, 1));
        parts.push_back(p);
      }
      KILN_ASSIGN_OR_RETURN(cur, ctx.emit(OpKind::kConcat, parts, {{"axis", int64_t{d}}}));
      continue;
    }
    // The values that go before (side 0) or after (side 1) the tensor along d.
    auto padding = [&](int side, int64_t count) -> Expected<ir::Value*> {
      if (mode == "constant") return expand(fill, d, count);
      if (mode == "edge") {
        if (n == 0) return ctx.invalid("edge padding of an empty dim " + std::to_string(d));
        KILN_ASSIGN_OR_RETURN(ir::Value * edge,
                              side == 0 ? slice(cur, d, 0, 1, 1) : slice(cur, d, n - 1, n, 1));
        return expand(edge, d, count);
      }
      if (count >= n)
        return ctx.invalid("reflect padding of " + std::to_string(count) + " needs a larger " +
                           "dim; dim " + std::to_string(d) + " is " + std::to_string(n));
      // x[count], ..., x[1] before; x[n-2], ..., x[n-1-count] after. Ends are exclusive; the
      // smallest int64 stands for "before index 0" in a backward slice.
      if (side == 0) return slice(cur, d, count, 0, -1);
      const int64_t end = n - 2 - count < 0 ? std::numeric_limits<int64_t>::min() : n - 2 - count;
      return slice(cur, d, n - 2, end, -1);
    };
    if (before > 0) {
      KILN_ASSIGN_OR_RETURN(ir::Value * p, padding(0, before));
      parts.push_back(p);
    }
    parts.push_back(cur);
    if (after > 0) {
      KILN_ASSIGN_OR_RETURN(ir::Value * p, padding(1, after));
      parts.push_back(p);
    }
    KILN_ASSIGN_OR_RETURN(cur, ctx.emit(OpKind::kConcat, parts, {{"axis", int64_t{d}}}));
  }
  ctx.setOutput(0, cur);
  return Status::ok();
}

// The input coordinate of output index i along one dim (ONNX Resize,
// coordinate_transformation_mode).
// The output length in these formulas is scale * in, unrounded (as ONNX's reference computes
// it): with scales given, it need not be the integer output size.
double sourceCoordinate(const std::string& mode, int64_t i, double scale, int64_t in,
                        int64_t outSize) {
  const double x = static_cast<double>(i);
  const double out = scale * static_cast<double>(in);
  if (mode == "half_pixel") return (x + 0.5) / scale - 0.5;
  if (mode == "half_pixel_symmetric") {
    const double adjustment = static_cast<double>(outSize) / out;
    const double offset = static_cast<double>(in) / 2 * (1 - adjustment);
    return offset + (x + 0.5) / scale - 0.5;
  }
  if (mode == "pytorch_half_pixel") return out > 1 ? (x + 0.5) / scale - 0.5 : 0.0;
  if (mode == "align_corners") return out == 1 ? 0.0 : x * static_cast<double>(in - 1) / (out - 1);
  if (mode == "asymmetric") return x / scale;
  return (x + 0.5) / scale;  // tf_half_pixel_for_nearest
}

// The resize of one dim as a matrix: row i holds output i's weights over the input (cubic,
// antialiased linear or cubic, any coordinate mode), as ONNX's reference computes them: the
// coefficients of the fraction of the source coordinate (1 at an integer), over the n input
// positions nearest to it (ties to the lower), edge positions standing in past the ends
// (exclude_outside: their weights dropped and the rest renormalized). tf_crop_and_resize: a
// source outside the input is the extrapolation value (`extrapolated`, its row 0).
struct ResizeMatrix {
  std::vector<double> w;  // [out, in]
  std::vector<bool> extrapolated;
};

std::vector<double> resizeCoefficients(const std::string& mode, bool antialias, double ratio,
                                       double scale, double a, const std::string& nearest) {
  if (mode == "nearest") {
    if (ratio == 1.0) return {0, 1};
    const bool second = nearest == "round_prefer_floor"  ? ratio > 0.5
                        : nearest == "round_prefer_ceil" ? ratio >= 0.5
                                                         : nearest == "ceil";
    return {second ? 0.0 : 1.0, second ? 1.0 : 0.0};
  }
  if (!antialias) {
    if (mode == "linear") return {1 - ratio, ratio};
    const double r = ratio, q = 1 - ratio;
    return {((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
            ((a + 2) * r - (a + 3)) * r * r + 1, ((a + 2) * q - (a + 3)) * q * q + 1,
            ((a * (q + 1) - 5 * a) * (q + 1) + 8 * a) * (q + 1) - 4 * a};
  }
  const double sc = std::min(scale, 1.0);
  std::vector<double> c;
  if (mode == "linear") {
    const int64_t start = static_cast<int64_t>(std::floor(-1 / sc) + 1);
    for (int64_t k = start; k < start + 2 - 2 * start; ++k)
      c.push_back(std::clamp(1 - std::abs((static_cast<double>(k) - ratio) * sc), 0.0, 1.0));
  } else {
    const int64_t start = static_cast<int64_t>(std::floor(-2 / sc) + 1);
    for (int64_t k = start; k < 2 - start; ++k) {
      const double x = std::abs(sc * (static_cast<double>(k) - ratio));
      const double x2 = x * x, x3 = x2 * x;
      c.push_back(x <= 1  ? (a + 2) * x3 - (a + 3) * x2 + 1
                  : x < 2 ? a * x3 - 5 * a * x2 + 8 * a * x - 4 * a
                          : 0.0);
    }
  }
  double sum = 0;
  for (double v : c) sum += v;
  for (double& v : c) v /= sum;
  return c;
}

Expected<ResizeMatrix> resizeMatrix(NodeContext& ctx, const std::string& mode,
                                    const std::string& coord, const std::string& nearest,
                                    bool antialias, bool excludeOutside, double a, double scale,
                                    int64_t in, int64_t out, double roiStart, double roiEnd) {
  ResizeMatrix m;
  m.w.assign(static_cast<size_t>(in * out), 0.0);
  m.extrapolated.assign(static_cast<size_t>(out), false);
  for (int64_t i = 0; i < out; ++i) {
    double x;
    if (coord == "tf_crop_and_resize") {
      const double outWidth = scale * static_cast<double>(in);
      x = outWidth == 1 ? (roiEnd - roiStart) * static_cast<double>(in - 1) / 2
                        : static_cast<double>(i) * (roiEnd - roiStart) *
                              static_cast<double>(in - 1) / (outWidth - 1);
      x += roiStart * static_cast<double>(in - 1);
      if (x < 0 || x > static_cast<double>(in - 1)) {
        m.extrapolated[static_cast<size_t>(i)] = true;
        continue;
      }
    } else {
      x = sourceCoordinate(coord, i, scale, in, out);
    }
    const double ratio = x == std::floor(x) ? 1.0 : x - std::floor(x);
    std::vector<double> c = resizeCoefficients(mode, antialias, ratio, scale, a, nearest);
    const int64_t n = static_cast<int64_t>(c.size());
    // The n positions nearest x, ties to the lower: from ceil(x) - n/2 (n is even).
    const int64_t first = static_cast<int64_t>(std::ceil(x)) - n / 2;
    if (excludeOutside) {
      double sum = 0;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t j = first + k;
        if (j < 0 || j >= in) c[static_cast<size_t>(k)] = 0;
        sum += c[static_cast<size_t>(k)];
      }
      if (sum == 0)
        return ctx.invalid("exclude_outside leaves output " + std::to_string(i) +
                           " no input to read");
      for (double& v : c) v /= sum;
    }
    for (int64_t k = 0; k < n; ++k) {
      const int64_t j = std::clamp<int64_t>(first + k, 0, in - 1);
      m.w[static_cast<size_t>(i * in + j)] += c[static_cast<size_t>(k)];
    }
  }
  return m;
}

int64_t roundNearest(const std::string& mode, double x) {
  if (mode == "floor") return static_cast<int64_t>(std::floor(x));
  if (mode == "ceil") return static_cast<int64_t>(std::ceil(x));
  const double fl = std::floor(x);
  if (x - fl == 0.5) return static_cast<int64_t>(mode == "round_prefer_ceil" ? fl + 1 : fl);
  return static_cast<int64_t>(std::round(x));
}

// Upsample (7: scales attribute; 9: scales input 1) and Resize 10 (scales input 1): nearest or
// linear, with the asymmetric transform (x_in = x_out / scale) and, for nearest, ONNX Runtime's
// "simple" rounding: floor where upsampling, ceil where downsampling.
struct LegacyResize {
  std::vector<double> scales;
  std::string mode;
};

Expected<LegacyResize> legacyResize(NodeContext& ctx) {
  LegacyResize l;
  KILN_ASSIGN_OR_RETURN(l.mode, ctx.attrString("mode", "nearest"));
  if (l.mode == "bilinear" || l.mode == "trilinear") l.mode = "linear";  // Upsample 7's names.
  if (l.mode != "nearest" && l.mode != "linear")
    return ctx.invalid("mode '" + l.mode + "' is not nearest or linear");
  if (ctx.opType() == "Upsample" && ctx.version() < 9) {
    KILN_ASSIGN_OR_RETURN(auto f, ctx.attrFloats("scales"));
    l.scales.assign(f.begin(), f.end());
  } else {
    KILN_ASSIGN_OR_RETURN(const ir::TensorData* given, ctx.requireConstant(1));
    if (!given) return ctx.unsupported("scales (input 1) must be known at import");
    if (!ir::isFloat(given->dtype()))
      return ctx.invalid("scales must be floats, got " + given->type().toString());
    for (int64_t i = 0; i < given->numElements(); ++i)
      l.scales.push_back(elementAsDouble(*given, i));
  }
  return l;
}

Status mapResizeWith(NodeContext& ctx, const LegacyResize* legacy) {
  std::string policy = "stretch";
  bool antialias = false;
  if (!legacy && ctx.version() >= 18) {
    // Version 18's additions: antialias, axes and keep_aspect_ratio_policy (below).
    KILN_ASSIGN_OR_RETURN(antialias, ctx.attrBool("antialias", false));
    KILN_ASSIGN_OR_RETURN(policy, ctx.attrString("keep_aspect_ratio_policy", "stretch"));
    if (policy != "stretch" && policy != "not_larger" && policy != "not_smaller")
      return ctx.invalid("keep_aspect_ratio_policy '" + policy + "'");
  }
  std::string mode = "nearest", coord = "asymmetric", nearest = "floor";
  if (legacy) {
    mode = legacy->mode;
    bool up = false, down = false;
    for (double v : legacy->scales) (v >= 1 ? up : down) |= v != 1;
    if (up && down && mode == "nearest")
      return ctx.unsupported(
          "nearest with scales that both enlarge and shrink (kiln rounds one "
          "way per node)");
    if (down) nearest = "ceil";
  } else {
    KILN_ASSIGN_OR_RETURN(mode, ctx.attrString("mode", "nearest"));
    KILN_ASSIGN_OR_RETURN(coord, ctx.attrString("coordinate_transformation_mode", "half_pixel"));
    KILN_ASSIGN_OR_RETURN(nearest, ctx.attrString("nearest_mode", "round_prefer_floor"));
  }
  if (mode != "nearest" && mode != "linear" && mode != "cubic")
    return ctx.invalid("mode '" + mode + "' is not nearest, linear or cubic");
  if (coord != "half_pixel" && coord != "pytorch_half_pixel" && coord != "align_corners" &&
      coord != "asymmetric" && coord != "tf_half_pixel_for_nearest" &&
      coord != "half_pixel_symmetric" && coord != "tf_crop_and_resize")
    return ctx.invalid("coordinate_transformation_mode '" + coord + "'");
  if (antialias && mode == "nearest") antialias = false;  // ONNX: linear and cubic only.
  KILN_ASSIGN_OR_RETURN(double cubicA, ctx.attrFloat("cubic_coeff_a", -0.75));
  KILN_ASSIGN_OR_RETURN(bool excludeOutside, ctx.attrBool("exclude_outside", false));
  KILN_ASSIGN_OR_RETURN(double extrapolation, ctx.attrFloat("extrapolation_value", 0.0));
  // Cubic, antialiased and crop-and-resize weights are a matrix per dim; nearest and linear
  // otherwise gather (one or two taps).
  const bool byMatrix = mode == "cubic" || antialias || coord == "tf_crop_and_resize";
  if (nearest != "round_prefer_floor" && nearest != "round_prefer_ceil" && nearest != "floor" &&
      nearest != "ceil")
    return ctx.invalid("nearest_mode '" + nearest + "'");
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  const size_t r = xt.shape.size();
  if ((mode != "nearest" || byMatrix) && (!ir::isFloat(xt.dtype) || !foldableDType(xt.dtype)))
    return ctx.unsupported(mode + " Resize of " + xt.toString() + " (kiln blends f32 and f64)");

  // The axes that scales or sizes name (version 18's axes attribute; all dims by default).
  std::vector<int> axes;
  if (ctx.hasAttr("axes")) {
    KILN_ASSIGN_OR_RETURN(auto given, ctx.attrInts("axes"));
    for (int64_t a : given) {
      KILN_ASSIGN_OR_RETURN(int n, ir::normalizeAxis(a, r, "axes"));
      if (std::find(axes.begin(), axes.end(), n) != axes.end())
        return ctx.invalid("axes " + ir::shapeToString(given) + " repeat an axis");
      axes.push_back(n);
    }
  } else {
    for (size_t d = 0; d < r; ++d) axes.push_back(static_cast<int>(d));
  }
  const size_t na = axes.size();
  std::vector<double> scales(r, 1.0);
  std::vector<int64_t> sizes(xt.shape.begin(), xt.shape.end());
  std::optional<ir::TensorData> legacyScales;
  if (legacy) {
    legacyScales = ir::TensorData(ir::DType::kF64, {static_cast<int64_t>(legacy->scales.size())});
    std::copy(legacy->scales.begin(), legacy->scales.end(), legacyScales->as<double>());
    if (legacy->scales.size() != xt.shape.size())
      return ctx.invalid("scales must have one value per dim of " + xt.toString() + ", got " +
                         std::to_string(legacy->scales.size()));
  }
  const ir::TensorData* scalesData = legacy ? &*legacyScales : nullptr;
  if (!legacy) {
    KILN_ASSIGN_OR_RETURN(scalesData, ctx.requireConstant(2));
    if (ctx.hasInput(2) && !scalesData) return ctx.unsupported("scales must be known at import");
  }
  if (scalesData && (legacy || scalesData->numElements() > 0)) {
    if (scalesData->numElements() != static_cast<int64_t>(na) || !ir::isFloat(scalesData->dtype()))
      return ctx.invalid("scales must be " + std::to_string(na) + " floats, got " +
                         scalesData->type().toString());
    for (size_t i = 0; i < na; ++i) {
      const size_t d = static_cast<size_t>(axes[i]);
      const float s = static_cast<float>(elementAsDouble(*scalesData, static_cast<int64_t>(i)));
      if (!(s > 0) || !std::isfinite(s)) return ctx.invalid("scales must be positive");
      // As ONNX shape inference computes it, in float.
      const float size = std::floor(static_cast<float>(xt.shape[d]) * s);
      if (size > static_cast<float>(std::numeric_limits<int32_t>::max()))
        return ctx.invalid("scale " + std::to_string(s) + " makes dim " + std::to_string(d) +
                           " too large");
      scales[d] = s;
      sizes[d] = static_cast<int64_t>(size);
    }
  } else if (!legacy && ctx.hasInput(3)) {
    KILN_ASSIGN_OR_RETURN(auto given, ctx.constInts(3, "sizes"));
    if (given.size() != na)
      return ctx.invalid("sizes " + ir::shapeToString(given) + " must have " + std::to_string(na) +
                         " values");
    for (size_t i = 0; i < na; ++i) {
      const size_t d = static_cast<size_t>(axes[i]);
      if (given[i] < 0 || given[i] > std::numeric_limits<int32_t>::max())
        return ctx.invalid("sizes " + ir::shapeToString(given) + " are out of range");
      sizes[d] = given[i];
      scales[d] =
          xt.shape[d] ? static_cast<double>(given[i]) / static_cast<double>(xt.shape[d]) : 1.0;
    }
    if (policy != "stretch") {
      // One scale for every named axis, the smallest (not_larger) or the largest
      // (not_smaller), and sizes rounded half up from it, as ONNX defines.
      double one = policy == "not_larger" ? INFINITY : 0;
      for (int d : axes)
        one = policy == "not_larger" ? std::min(one, scales[d]) : std::max(one, scales[d]);
      for (int d : axes) {
        scales[d] = one;
        sizes[d] = static_cast<int64_t>(one * static_cast<double>(xt.shape[d]) + 0.5);
      }
    }
  } else {
    return ctx.invalid("Resize needs scales or sizes");
  }

  // tf_crop_and_resize's region: roi (input 1) [starts..., ends...] over the named axes.
  std::vector<double> roiStart(r, 0.0), roiEnd(r, 1.0);
  if (coord == "tf_crop_and_resize") {
    KILN_ASSIGN_OR_RETURN(const ir::TensorData* roi, ctx.requireConstant(1));
    if (!roi || roi->numElements() != static_cast<int64_t>(2 * na))
      return ctx.invalid("tf_crop_and_resize needs roi (input 1) known at import with " +
                         std::to_string(2 * na) + " values");
    for (size_t i = 0; i < na; ++i) {
      roiStart[static_cast<size_t>(axes[i])] = elementAsDouble(*roi, static_cast<int64_t>(i));
      roiEnd[static_cast<size_t>(axes[i])] = elementAsDouble(*roi, static_cast<int64_t>(i + na));
    }
  }

  KILN_ASSIGN_OR_RETURN(ir::Value * cur, ctx.value(0));
  for (size_t d = 0; d < r; ++d) {
    const int64_t in = xt.shape[d], out = sizes[d];
    if (in == out && scales[d] == 1.0 && coord != "tf_crop_and_resize") continue;
    if (byMatrix) {
      if (in == 0) return ctx.invalid("cannot resize an empty dim " + std::to_string(d));
      if (out > (int64_t{1} << 22) / in)
        return ctx.unsupported("a " + mode + " Resize of dim " + std::to_string(d) + " from " +
                               std::to_string(in) + " to " + std::to_string(out) +
                               " (kiln multiplies by an [out, in] matrix of weights: at most "
                               "2^22 entries)");
      KILN_ASSIGN_OR_RETURN(
          ResizeMatrix m, resizeMatrix(ctx, mode, coord, nearest, antialias, excludeOutside, cubicA,
                                       scales[d], in, out, roiStart[d], roiEnd[d]));
      // cur moved to [..., in] along d, times W^T [in, out], moved back.
      ir::TensorData wt(xt.dtype, {in, out});
      for (int64_t j = 0; j < in; ++j)
        for (int64_t i = 0; i < out; ++i) {
          const double v = m.w[static_cast<size_t>(i * in + j)];
          if (xt.dtype == ir::DType::kF32)
            wt.as<float>()[j * out + i] = static_cast<float>(v);
          else
            wt.as<double>()[j * out + i] = v;
        }
      std::vector<int64_t> perm;
      for (size_t k = 0; k < r; ++k)
        if (k != d) perm.push_back(static_cast<int64_t>(k));
      perm.push_back(static_cast<int64_t>(d));
      std::vector<int64_t> back(r);
      for (size_t k = 0; k < r; ++k) back[static_cast<size_t>(perm[k])] = static_cast<int64_t>(k);
      const bool last = d + 1 == r;
      if (!last) {
        KILN_ASSIGN_OR_RETURN(cur, ctx.emit(OpKind::kTranspose, {cur}, {{"perm", perm}}));
      }
      KILN_ASSIGN_OR_RETURN(ir::Value * wv, ctx.constantValue(std::move(wt)));
      KILN_ASSIGN_OR_RETURN(cur, ctx.emit(OpKind::kMatMul, {cur, wv}));
      if (!last) {
        KILN_ASSIGN_OR_RETURN(cur, ctx.emit(OpKind::kTranspose, {cur}, {{"perm", back}}));
      }
      if (std::find(m.extrapolated.begin(), m.extrapolated.end(), true) != m.extrapolated.end()) {
        ir::Shape eShape(r, 1);
        eShape[d] = out;
        ir::TensorData e = filledTensor(xt.dtype, eShape, 0);
        for (int64_t i = 0; i < out; ++i)
          if (m.extrapolated[static_cast<size_t>(i)]) {
            if (xt.dtype == ir::DType::kF32)
              e.as<float>()[i] = static_cast<float>(extrapolation);
            else
              e.as<double>()[i] = extrapolation;
          }
        KILN_ASSIGN_OR_RETURN(ir::Value * ev, ctx.constantValue(std::move(e)));
        KILN_ASSIGN_OR_RETURN(cur, ctx.emit(OpKind::kAdd, {cur, ev}));
      }
      continue;
    }
    if (in == 0) return ctx.invalid("cannot resize an empty dim " + std::to_string(d));
    // The gather indices and blend weights are import-time tables of `out` entries each.
    constexpr int64_t kMaxResized = int64_t{1} << 20;
    if (out > kMaxResized)
      return ctx.unsupported("Resize of dim " + std::to_string(d) + " to " + std::to_string(out) +
                             " (kiln builds its index tables at import: at most " +
                             std::to_string(kMaxResized) + " per dim)");
    std::vector<int64_t> lo(static_cast<size_t>(out)), hi(static_cast<size_t>(out));
    std::vector<double> wHi(static_cast<size_t>(out));
    for (int64_t i = 0; i < out; ++i) {
      const double x = sourceCoordinate(coord, i, scales[d], in, out);
      const size_t k = static_cast<size_t>(i);
      if (mode == "nearest") {
        lo[k] = std::clamp<int64_t>(roundNearest(nearest, x), 0, in - 1);
        continue;
      }
      const double c = std::clamp(x, 0.0, static_cast<double>(in - 1));
      lo[k] = static_cast<int64_t>(std::floor(c));
      hi[k] = std::min(lo[k] + 1, in - 1);
      wHi[k] = c - static_cast<double>(lo[k]);
    }
    const ir::AttrMap axis{{"axis", static_cast<int64_t>(d)}};
    KILN_ASSIGN_OR_RETURN(ir::Value * loIdx, ctx.constantValue(int1d(lo)));
    KILN_ASSIGN_OR_RETURN(ir::Value * a, ctx.emit(OpKind::kGather, {cur, loIdx}, axis));
    if (mode == "nearest") {
      cur = a;
      continue;
    }
    ir::Shape wShape(r, 1);
    wShape[d] = out;
    ir::TensorData w0(xt.dtype, wShape), w1(xt.dtype, wShape);
    for (int64_t i = 0; i < out; ++i) {
      const double h = wHi[static_cast<size_t>(i)];
      if (xt.dtype == ir::DType::kF32) {
        w0.as<float>()[i] = static_cast<float>(1.0 - h);
        w1.as<float>()[i] = static_cast<float>(h);
      } else {
        w0.as<double>()[i] = 1.0 - h;
        w1.as<double>()[i] = h;
      }
    }
    KILN_ASSIGN_OR_RETURN(ir::Value * hiIdx, ctx.constantValue(int1d(hi)));
    KILN_ASSIGN_OR_RETURN(ir::Value * b, ctx.emit(OpKind::kGather, {cur, hiIdx}, axis));
    KILN_ASSIGN_OR_RETURN(ir::Value * w0v, ctx.constantValue(std::move(w0)));
    KILN_ASSIGN_OR_RETURN(ir::Value * w1v, ctx.constantValue(std::move(w1)));
    KILN_ASSIGN_OR_RETURN(ir::Value * aw, ctx.emit(OpKind::kMul, {a, w0v}));
    KILN_ASSIGN_OR_RETURN(ir::Value * bw, ctx.emit(OpKind::kMul, {b, w1v}));
    KILN_ASSIGN_OR_RETURN(cur, ctx.emit(OpKind::kAdd, {aw, bw}));
  }
  ctx.setOutput(0, cur);
  return Status::ok();
}

Status mapResize(NodeContext& ctx) {
  if (ctx.version() >= 11) return mapResizeWith(ctx, nullptr);
  KILN_ASSIGN_OR_RETURN(LegacyResize l, legacyResize(ctx));
  return mapResizeWith(ctx, &l);
}

}  // namespace

// Versions: Pad 2 takes pads and value as attributes, 11 as inputs, 18 adds the axes input, 19
// the wrap mode (refused with the other unknown modes); Upsample 7 and 9 and Resize 10 take
// scales alone (LegacyResize), Resize 11 is the first with roi, scales and sizes inputs, 18 adds
// antialias, axes and keep_aspect_ratio_policy, 19 the half_pixel_symmetric mode. The rest only
// add element types.
std::vector<MapperEntry> padResizeMappers() {
  return {{"Pad", {2, 11, 13, 18, 19, 21, 23, 24, 25}, mapPad},
          {"Resize", {10, 11, 13, 18, 19}, mapResize},
          {"Upsample", {7, 9}, mapResize}};
}

}  // namespace kiln::frontends::onnx_import
