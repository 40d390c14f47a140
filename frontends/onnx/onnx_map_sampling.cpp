// ONNX's GridSample (16, 20, 22) composed from kiln's ops: each output location's grid
// coordinates are made pixel coordinates (align_corners or not), rounded (nearest), brought back
// inside the image where they leave it (border: clamped; reflection: reflected), then each
// interpolation tap (1 for nearest, 2 per dim for linear, 4 per dim for cubic with Keys'
// A = -0.75) reads the input by gather_elements on the spatial dims flattened, weighted, and the
// taps summed. A tap outside the image reads 0 (zeros), the edge (border) or its reflection.
// The rules are ONNX's reference implementation's, which are PyTorch's grid_sample's but for
// cubic with border padding (below): f32 and f64; 2-D and 3-D inputs (cubic 2-D only, as ONNX).
#include <cmath>
#include <string>
#include <vector>

#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_map_util.h"
#include "frontends/onnx/onnx_tensor.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::OpKind;
using ir::Shape;
using ir::Value;

enum class Mode { kNearest, kLinear, kCubic };
enum class Padding { kZeros, kBorder, kReflection };

class GridSampler {
 public:
  GridSampler(NodeContext& ctx, ir::DType dtype) : ctx_(ctx), dt_(dtype) {}

  Expected<Value*> op(OpKind k, std::vector<Value*> in, ir::AttrMap attrs = {}) {
    return ctx_.emit(k, std::move(in), std::move(attrs));
  }
  Expected<Value*> scalar(double v) { return scalarConstant(ctx_, dt_, v); }
  Expected<Value*> affine(Value* x, double a, double b) {  // a x + b
    KILN_ASSIGN_OR_RETURN(Value * av, scalar(a));
    KILN_ASSIGN_OR_RETURN(Value * bv, scalar(b));
    KILN_ASSIGN_OR_RETURN(Value * ax, op(OpKind::kMul, {x, av}));
    return op(OpKind::kAdd, {ax, bv});
  }
  Expected<Value*> compare(OpKind k, Value* x, double v) {
    KILN_ASSIGN_OR_RETURN(Value * c, scalar(v));
    return op(k, {x, c});
  }

  // ONNX's reflection of x into [lo, hi] by the nearer border, repeatedly (x outside it).
  Expected<Value*> reflect(Value* x, double lo, double hi) {
    const double range = hi - lo;
    if (range <= 0) return scalar(lo);
    // Below: d = lo - x, n = floor(d / range), r = d - n range, n even ? lo + r : hi - r.
    // Above: d = x - hi, ... n even ? hi - r : lo + r.
    KILN_ASSIGN_OR_RETURN(Value * below, compare(OpKind::kLess, x, lo));
    KILN_ASSIGN_OR_RETURN(Value * dBelow, affine(x, -1, lo));
    KILN_ASSIGN_OR_RETURN(Value * dAbove, affine(x, 1, -hi));
    KILN_ASSIGN_OR_RETURN(Value * d, op(OpKind::kWhere, {below, dBelow, dAbove}));
    KILN_ASSIGN_OR_RETURN(Value * q, affine(d, 1 / range, 0));
    KILN_ASSIGN_OR_RETURN(Value * n, op(OpKind::kFloor, {q}));
    KILN_ASSIGN_OR_RETURN(Value * nr, affine(n, -range, 0));
    KILN_ASSIGN_OR_RETURN(Value * r, op(OpKind::kAdd, {d, nr}));
    // n even: floor(n / 2) * 2 == n.
    KILN_ASSIGN_OR_RETURN(Value * half, affine(n, 0.5, 0));
    KILN_ASSIGN_OR_RETURN(Value * halfFloor, op(OpKind::kFloor, {half}));
    KILN_ASSIGN_OR_RETURN(Value * twice, affine(halfFloor, 2, 0));
    KILN_ASSIGN_OR_RETURN(Value * even, op(OpKind::kEqual, {twice, n}));
    KILN_ASSIGN_OR_RETURN(Value * loPlus, affine(r, 1, lo));
    KILN_ASSIGN_OR_RETURN(Value * hiMinus, affine(r, -1, hi));
    // Below and odd, or above and even: hi - r; else lo + r.
    KILN_ASSIGN_OR_RETURN(Value * toHi, op(OpKind::kLogicalXor, {below, even}));
    return op(OpKind::kWhere, {toHi, hiMinus, loPlus});
  }

  // Cubic convolution weights (Keys, A = -0.75) of taps -1, 0, 1, 2 at fraction t.
  Expected<std::vector<Value*>> cubicWeights(Value* t) {
    const double a = -0.75;
    // Outer taps at distance s (t + 1 or 2 - t): ((a s - 5a) s + 8a) s - 4a.
    auto outer = [&](Value* s) -> Expected<Value*> {
      KILN_ASSIGN_OR_RETURN(Value * p, affine(s, a, -5 * a));
      KILN_ASSIGN_OR_RETURN(p, op(OpKind::kMul, {p, s}));
      KILN_ASSIGN_OR_RETURN(p, affine(p, 1, 8 * a));
      KILN_ASSIGN_OR_RETURN(p, op(OpKind::kMul, {p, s}));
      return affine(p, 1, -4 * a);
    };
    // Inner taps at distance s (t or 1 - t): ((a + 2) s - (a + 3)) s s + 1.
    auto inner = [&](Value* s) -> Expected<Value*> {
      KILN_ASSIGN_OR_RETURN(Value * p, affine(s, a + 2, -(a + 3)));
      KILN_ASSIGN_OR_RETURN(p, op(OpKind::kMul, {p, s}));
      KILN_ASSIGN_OR_RETURN(p, op(OpKind::kMul, {p, s}));
      return affine(p, 1, 1);
    };
    KILN_ASSIGN_OR_RETURN(Value * tp1, affine(t, 1, 1));
    KILN_ASSIGN_OR_RETURN(Value * om, affine(t, -1, 1));
    KILN_ASSIGN_OR_RETURN(Value * tm2, affine(t, -1, 2));
    KILN_ASSIGN_OR_RETURN(Value * w0, outer(tp1));
    KILN_ASSIGN_OR_RETURN(Value * w1, inner(t));
    KILN_ASSIGN_OR_RETURN(Value * w2, inner(om));
    KILN_ASSIGN_OR_RETURN(Value * w3, outer(tm2));
    return std::vector<Value*>{w0, w1, w2, w3};
  }

  struct Tap {
    Value* index = nullptr;   // i64, inside [0, size).
    Value* weight = nullptr;  // null: 1.
  };

  // The tap at float position `i` (an integer value) of a dim of `size`: its index and, for
  // zeros padding, a weight of 0 outside the image.
  Expected<Tap> tap(Value* i, int64_t size, Padding padding, double lo, double hi, Value* w) {
    Tap t;
    t.weight = w;
    Value* pos = i;
    if (padding == Padding::kReflection) {
      KILN_ASSIGN_OR_RETURN(Value * outside, outsideOf(i, lo, hi));
      KILN_ASSIGN_OR_RETURN(Value * r, reflect(i, lo, hi));
      KILN_ASSIGN_OR_RETURN(pos, op(OpKind::kWhere, {outside, r, i}));
    }
    if (padding == Padding::kZeros) {
      KILN_ASSIGN_OR_RETURN(Value * ge, compare(OpKind::kGreaterEqual, i, 0));
      KILN_ASSIGN_OR_RETURN(Value * lt, compare(OpKind::kLess, i, static_cast<double>(size)));
      KILN_ASSIGN_OR_RETURN(Value * inside, op(OpKind::kLogicalAnd, {ge, lt}));
      KILN_ASSIGN_OR_RETURN(Value * one, scalar(1));
      KILN_ASSIGN_OR_RETURN(Value * zero, scalar(0));
      KILN_ASSIGN_OR_RETURN(Value * mask, op(OpKind::kWhere, {inside, one, zero}));
      if (t.weight) {
        KILN_ASSIGN_OR_RETURN(t.weight, op(OpKind::kMul, {t.weight, mask}));
      } else {
        t.weight = mask;
      }
    }
    // Clamped (border; zeros: a read the weight discards), then truncated toward 0 as ONNX's int().
    KILN_ASSIGN_OR_RETURN(
        pos, op(OpKind::kClip, {pos}, {{"min", 0.0}, {"max", static_cast<double>(size - 1)}}));
    KILN_ASSIGN_OR_RETURN(t.index, op(OpKind::kCast, {pos}, {{"to", std::string("i64")}}));
    return t;
  }

  Expected<Value*> outsideOf(Value* x, double lo, double hi) {
    KILN_ASSIGN_OR_RETURN(Value * l, compare(OpKind::kLess, x, lo));
    KILN_ASSIGN_OR_RETURN(Value * g, compare(OpKind::kGreater, x, hi));
    return op(OpKind::kLogicalOr, {l, g});
  }

  Status run();

 private:
  NodeContext& ctx_;
  ir::DType dt_;
};

Status GridSampler::run() {
  NodeContext& ctx = ctx_;
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, floatInput(ctx));
  KILN_ASSIGN_OR_RETURN(ir::TensorType gt, ctx.inputType(1));
  const int spatial = xt.rank() - 2;
  if (spatial < 1 || gt.rank() != xt.rank() || gt.shape.back() != spatial ||
      gt.shape[0] != xt.shape[0] || gt.dtype != xt.dtype)
    return ctx.invalid("X " + xt.toString() + " and grid " + gt.toString() +
                       " must be [N, C, spatial...] and [N, out spatial..., " +
                       std::to_string(spatial) + "] of one float type");
  if (spatial < 2 || spatial > 3)
    return ctx.unsupported("GridSample over " + std::to_string(spatial) +
                           " spatial dims (kiln composes 2 and 3)");
  KILN_ASSIGN_OR_RETURN(std::string modeName,
                        ctx.attrString("mode", ctx.version() >= 20 ? "linear" : "bilinear"));
  Mode mode;
  if (modeName == "nearest") {
    mode = Mode::kNearest;
  } else if (modeName == (ctx.version() >= 20 ? "linear" : "bilinear")) {
    mode = Mode::kLinear;
  } else if (modeName == (ctx.version() >= 20 ? "cubic" : "bicubic")) {
    mode = Mode::kCubic;
  } else {
    return ctx.invalid("mode '" + modeName + "' is not one of GridSample " +
                       std::to_string(ctx.version()) + "'s");
  }
  if (mode == Mode::kCubic && spatial != 2)
    return ctx.unsupported("cubic GridSample over " + std::to_string(spatial) +
                           " spatial dims (ONNX defines it for 2)");
  KILN_ASSIGN_OR_RETURN(std::string padName, ctx.attrString("padding_mode", "zeros"));
  Padding padding;
  if (padName == "zeros")
    padding = Padding::kZeros;
  else if (padName == "border")
    padding = Padding::kBorder;
  else if (padName == "reflection")
    padding = Padding::kReflection;
  else
    return ctx.invalid("padding_mode must be zeros, border or reflection, got '" + padName + "'");
  KILN_ASSIGN_OR_RETURN(bool align, ctx.attrBool("align_corners", false));

  const int64_t n = xt.shape[0], c = xt.shape[1];
  int64_t in = 1, out = 1;
  for (int d = 0; d < spatial; ++d) in *= xt.shape[static_cast<size_t>(d + 2)];
  ir::Shape outShape{n, c};
  for (int d = 0; d < spatial; ++d) {
    out *= gt.shape[static_cast<size_t>(d + 1)];
    outShape.push_back(gt.shape[static_cast<size_t>(d + 1)]);
  }
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * grid, ctx.value(1));
  KILN_ASSIGN_OR_RETURN(Value * flatX, op(OpKind::kReshape, {x}, {{"shape", ir::Shape{n, c, in}}}));

  // Per spatial dim d (0: the first, D or H): its taps (index, weight).
  std::vector<std::vector<Tap>> taps(static_cast<size_t>(spatial));
  const int64_t last = gt.rank() - 1;
  for (int d = 0; d < spatial; ++d) {
    const int64_t size = xt.shape[static_cast<size_t>(d + 2)];
    const double lo = align ? 0.0 : -0.5, hi = align ? size - 1.0 : size - 0.5;
    // The grid's last dim lists x (the last spatial dim) first.
    const int64_t comp = spatial - 1 - d;
    KILN_ASSIGN_OR_RETURN(Value * g, op(OpKind::kSlice, {grid},
                                        {{"starts", std::vector<int64_t>{comp}},
                                         {"ends", std::vector<int64_t>{comp + 1}},
                                         {"axes", std::vector<int64_t>{last}}}));
    KILN_ASSIGN_OR_RETURN(g, op(OpKind::kSqueeze, {g}, {{"axes", std::vector<int64_t>{last}}}));
    // Pixel coordinate: (g + 1) / 2 (size - 1), or ((g + 1) size - 1) / 2.
    Value* p = nullptr;
    if (align) {
      KILN_ASSIGN_OR_RETURN(p, affine(g, (size - 1) / 2.0, (size - 1) / 2.0));
    } else {
      KILN_ASSIGN_OR_RETURN(p, affine(g, size / 2.0, (size - 1) / 2.0));
    }
    if (mode == Mode::kNearest) {
      KILN_ASSIGN_OR_RETURN(p, op(OpKind::kRound, {p}));  // Half to even, as np.rint.
    }
    // Cubic with border padding clamps each tap, not the coordinate, as PyTorch's grid_sample
    // and ONNX Runtime do (ONNX's reference clamps the coordinate first, which differs where it
    // lies just outside the image; the specification does not say which).
    if (padding != Padding::kZeros && !(mode == Mode::kCubic && padding == Padding::kBorder)) {
      KILN_ASSIGN_OR_RETURN(Value * outside, outsideOf(p, lo, hi));
      Value* inside = nullptr;
      if (padding == Padding::kBorder) {
        KILN_ASSIGN_OR_RETURN(
            inside, op(OpKind::kClip, {p}, {{"min", 0.0}, {"max", static_cast<double>(size - 1)}}));
      } else {
        KILN_ASSIGN_OR_RETURN(inside, reflect(p, lo, hi));
      }
      KILN_ASSIGN_OR_RETURN(p, op(OpKind::kWhere, {outside, inside, p}));
    }
    auto& dimTaps = taps[static_cast<size_t>(d)];
    if (mode == Mode::kNearest) {
      KILN_ASSIGN_OR_RETURN(Tap t, tap(p, size, padding, lo, hi, nullptr));
      dimTaps.push_back(t);
      continue;
    }
    KILN_ASSIGN_OR_RETURN(Value * base, op(OpKind::kFloor, {p}));
    KILN_ASSIGN_OR_RETURN(Value * frac, op(OpKind::kSub, {p, base}));
    std::vector<Value*> weights;
    int64_t first = 0;
    if (mode == Mode::kLinear) {
      KILN_ASSIGN_OR_RETURN(Value * w0, affine(frac, -1, 1));
      weights = {w0, frac};
    } else {
      KILN_ASSIGN_OR_RETURN(weights, cubicWeights(frac));
      first = -1;
    }
    for (size_t k = 0; k < weights.size(); ++k) {
      KILN_ASSIGN_OR_RETURN(Value * i, affine(base, 1, static_cast<double>(first) + k));
      KILN_ASSIGN_OR_RETURN(Tap t, tap(i, size, padding, lo, hi, weights[k]));
      dimTaps.push_back(t);
    }
  }

  // Every combination of the dims' taps: a gather of the flat position, times its weight.
  ir::Shape weightShape{n, 1};
  for (size_t d = 1; d + 1 < gt.shape.size(); ++d) weightShape.push_back(gt.shape[d]);
  Value* sum = nullptr;
  std::vector<size_t> pick(static_cast<size_t>(spatial), 0);
  for (bool more = true; more;) {
    Value* flat = nullptr;
    Value* weight = nullptr;
    int64_t stride = 1;
    for (int d = spatial - 1; d >= 0; --d) {
      const Tap& t = taps[static_cast<size_t>(d)][pick[static_cast<size_t>(d)]];
      Value* term = t.index;
      if (stride != 1) {
        ir::TensorData s(ir::DType::kI64, {});
        *s.as<int64_t>() = stride;
        KILN_ASSIGN_OR_RETURN(Value * sv, ctx.constantValue(std::move(s)));
        KILN_ASSIGN_OR_RETURN(term, op(OpKind::kMul, {term, sv}));
      }
      if (flat) {
        KILN_ASSIGN_OR_RETURN(flat, op(OpKind::kAdd, {flat, term}));
      } else {
        flat = term;
      }
      if (t.weight) {
        if (weight) {
          KILN_ASSIGN_OR_RETURN(weight, op(OpKind::kMul, {weight, t.weight}));
        } else {
          weight = t.weight;
        }
      }
      stride *= xt.shape[static_cast<size_t>(d + 2)];
    }
    KILN_ASSIGN_OR_RETURN(Value * idx,
                          op(OpKind::kReshape, {flat}, {{"shape", ir::Shape{n, 1, out}}}));
    KILN_ASSIGN_OR_RETURN(idx, op(OpKind::kExpand, {idx}, {{"shape", ir::Shape{n, c, out}}}));
    KILN_ASSIGN_OR_RETURN(Value * v,
                          op(OpKind::kGatherElements, {flatX, idx}, {{"axis", int64_t{2}}}));
    KILN_ASSIGN_OR_RETURN(v, op(OpKind::kReshape, {v}, {{"shape", outShape}}));
    if (weight) {
      KILN_ASSIGN_OR_RETURN(Value * w, op(OpKind::kReshape, {weight}, {{"shape", weightShape}}));
      KILN_ASSIGN_OR_RETURN(v, op(OpKind::kMul, {v, w}));
    }
    if (sum) {
      KILN_ASSIGN_OR_RETURN(sum, op(OpKind::kAdd, {sum, v}));
    } else {
      sum = v;
    }
    // The next combination (the last dim fastest).
    more = false;
    for (int d = spatial - 1; d >= 0; --d) {
      size_t& k = pick[static_cast<size_t>(d)];
      if (++k < taps[static_cast<size_t>(d)].size()) {
        more = true;
        break;
      }
      k = 0;
    }
  }
  ctx.setOutput(0, sum);
  return Status::ok();
}

Status mapGridSample(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  GridSampler s(ctx, xt.dtype);
  return s.run();
}

// AffineGrid (20): the normalized coordinates of every output pixel, (x, y[, z], 1) with x along
// the last dim (align_corners: -1 .. 1 through the corner pixels' centres; else through the
// pixels' edges), times theta^T: [H*W, 3] x [N, 3, 2] -> [N, H, W, 2] (3-D: 4 and 3). The size
// must be known at import.
Status mapAffineGrid(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType tt, floatInput(ctx));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> size, ctx.constInts(1, "size"));
  KILN_ASSIGN_OR_RETURN(bool align, ctx.attrBool("align_corners", false));
  const int64_t spatial = static_cast<int64_t>(size.size()) - 2;
  if ((spatial != 2 && spatial != 3) || tt.rank() != 3 || tt.shape[0] != size[0] ||
      tt.shape[1] != spatial || tt.shape[2] != spatial + 1)
    return ctx.invalid("theta " + tt.toString() + " and size " + ir::shapeToString(size) +
                       " must be [N, 2, 3] and [N, C, H, W], or [N, 3, 4] and [N, C, D, H, W]");
  for (int64_t d : size)
    if (d < 1) return ctx.invalid("size " + ir::shapeToString(size) + " must be positive");
  const Shape dims(size.begin() + 2, size.end());
  int64_t points = 1;
  for (int64_t d : dims)
    if (!ir::accumulateElements(points, d) || points > kMaxFoldElements)
      return ctx.unsupported("an AffineGrid of " + ir::shapeToString(dims) + " (too large)");
  if (points * (spatial + 1) > kMaxFoldElements)
    return ctx.unsupported("an AffineGrid of " + ir::shapeToString(dims) + " (too large)");
  // Row p of the base: the coordinates of point p, x (the last dim) first, then 1.
  ir::TensorData base = filledTensor(tt.dtype, {points, spatial + 1}, 1);
  auto coord = [&](int64_t i, int64_t n) {
    if (align) return n == 1 ? -1.0 : -1.0 + 2.0 * static_cast<double>(i) / (n - 1);
    return (2.0 * static_cast<double>(i) + 1.0) / n - 1.0;
  };
  for (int64_t p = 0; p < points; ++p) {
    int64_t rest = p;
    for (int64_t d = spatial - 1; d >= 0; --d) {  // Dim d's index; x is the last dim.
      const int64_t n = dims[static_cast<size_t>(d)], i = rest % n;
      rest /= n;
      const double c = coord(i, n);
      const size_t at = static_cast<size_t>(p * (spatial + 1) + (spatial - 1 - d));
      if (tt.dtype == ir::DType::kF32)
        base.as<float>()[at] = static_cast<float>(c);
      else
        base.as<double>()[at] = c;
    }
  }
  KILN_ASSIGN_OR_RETURN(Value * b, ctx.constantValue(std::move(base)));
  KILN_ASSIGN_OR_RETURN(Value * theta, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * thetaT, ctx.emit(OpKind::kTranspose, {theta},
                                                 {{"perm", std::vector<int64_t>{0, 2, 1}}}));
  KILN_ASSIGN_OR_RETURN(Value * g, ctx.emit(OpKind::kMatMul, {b, thetaT}));
  Shape out{size[0]};
  out.insert(out.end(), dims.begin(), dims.end());
  out.push_back(spatial);
  return ctx.emit(OpKind::kReshape, {g}, {{"shape", out}}, 0).status();
}

}  // namespace

// GridSample 16: 4-D, modes bilinear / bicubic / nearest; 20: N-D, modes linear / cubic /
// nearest; 22 adds bfloat16 (refused: f32 and f64 only).
std::vector<MapperEntry> samplingMappers() {
  return {{"GridSample", {16, 20, 22}, mapGridSample}, {"AffineGrid", {20}, mapAffineGrid}};
}

}  // namespace kiln::frontends::onnx_import
