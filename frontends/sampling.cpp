// Sampling at computed positions and deformable convolution composed from kiln's ops
// (sampling.h).
#include "frontends/sampling.h"

#include <string>
#include <utility>

#include "ir/infer.h"
#include "ir/types.h"

namespace kiln::frontends {

namespace {

using ir::OpKind;
using ir::Shape;
using ir::Value;

class Sampler {
 public:
  Sampler(const Emitter& e, ir::DType dtype) : e_(e), dt_(dtype) {}

  Expected<Value*> op(OpKind k, std::vector<Value*> in, ir::AttrMap attrs = {}) {
    return e_.node(k, std::move(in), std::move(attrs));
  }
  Expected<Value*> scalar(double v) { return e_.constant(ir::TensorData::scalar(dt_, v)); }
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
  Expected<Tap> tap(Value* i, int64_t size, SamplePadding padding, double lo, double hi, Value* w) {
    Tap t;
    t.weight = w;
    Value* pos = i;
    if (padding == SamplePadding::kReflection) {
      KILN_ASSIGN_OR_RETURN(Value * outside, outsideOf(i, lo, hi));
      KILN_ASSIGN_OR_RETURN(Value * r, reflect(i, lo, hi));
      KILN_ASSIGN_OR_RETURN(pos, op(OpKind::kWhere, {outside, r, i}));
    }
    if (padding == SamplePadding::kZeros) {
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

  // channelsLast: the samples as [N, P, C] instead of [N, C, P...].
  Expected<Value*> sampleAt(Value* x, const std::vector<Value*>& pos, const SampleOptions& o,
                            bool channelsLast = false);

 private:
  const Emitter& e_;
  ir::DType dt_;
};

Expected<Value*> Sampler::sampleAt(Value* x, const std::vector<Value*>& pos, const SampleOptions& o,
                                   bool channelsLast) {
  const ir::TensorType& xt = x->type();
  const int spatial = xt.rank() - 2;
  const Shape& ps = pos[0]->type().shape;  // [N, P...]
  const int64_t n = xt.shape[0], c = xt.shape[1];
  int64_t in = 1, out = 1;
  for (int d = 0; d < spatial; ++d) in *= xt.shape[static_cast<size_t>(d + 2)];
  Shape outShape{n, c};
  for (size_t d = 1; d < ps.size(); ++d) {
    out *= ps[d];
    outShape.push_back(ps[d]);
  }
  // The image channels-last, [N*S, C]: each tap a gather of whole rows (C values read together)
  // by one index per image and position, not an index per channel.
  KILN_ASSIGN_OR_RETURN(Value * rows, op(OpKind::kReshape, {x}, {{"shape", Shape{n, c, in}}}));
  KILN_ASSIGN_OR_RETURN(rows,
                        op(OpKind::kTranspose, {rows}, {{"perm", std::vector<int64_t>{0, 2, 1}}}));
  KILN_ASSIGN_OR_RETURN(rows, op(OpKind::kReshape, {rows}, {{"shape", Shape{n * in, c}}}));
  // Image b's first row, b * S, added to every index.
  ir::TensorData first(ir::DType::kI64, {n, 1});
  for (int64_t b = 0; b < n; ++b) first.as<int64_t>()[b] = b * in;
  KILN_ASSIGN_OR_RETURN(Value * imageRow, e_.constant(std::move(first)));

  // Per spatial dim d (0: the first, D or H): its taps (index, weight).
  std::vector<std::vector<Tap>> taps(static_cast<size_t>(spatial));
  for (int d = 0; d < spatial; ++d) {
    const int64_t size = xt.shape[static_cast<size_t>(d + 2)];
    const double lo = o.alignCorners ? 0.0 : -0.5;
    const double hi = o.alignCorners ? size - 1.0 : size - 0.5;
    Value* p = pos[static_cast<size_t>(d)];
    if (o.mode == SampleMode::kNearest) {
      KILN_ASSIGN_OR_RETURN(p, op(OpKind::kRound, {p}));  // Half to even, as np.rint.
    }
    // Cubic with border padding clamps each tap, not the coordinate, as PyTorch's grid_sample
    // and ONNX Runtime do (ONNX's reference clamps the coordinate first, which differs where it
    // lies just outside the image; the specification does not say which).
    if (o.padding != SamplePadding::kZeros &&
        !(o.mode == SampleMode::kCubic && o.padding == SamplePadding::kBorder)) {
      KILN_ASSIGN_OR_RETURN(Value * outside, outsideOf(p, lo, hi));
      Value* inside = nullptr;
      if (o.padding == SamplePadding::kBorder) {
        KILN_ASSIGN_OR_RETURN(
            inside, op(OpKind::kClip, {p}, {{"min", 0.0}, {"max", static_cast<double>(size - 1)}}));
      } else {
        KILN_ASSIGN_OR_RETURN(inside, reflect(p, lo, hi));
      }
      KILN_ASSIGN_OR_RETURN(p, op(OpKind::kWhere, {outside, inside, p}));
    }
    auto& dimTaps = taps[static_cast<size_t>(d)];
    if (o.mode == SampleMode::kNearest) {
      KILN_ASSIGN_OR_RETURN(Tap t, tap(p, size, o.padding, lo, hi, nullptr));
      dimTaps.push_back(t);
      continue;
    }
    KILN_ASSIGN_OR_RETURN(Value * base, op(OpKind::kFloor, {p}));
    KILN_ASSIGN_OR_RETURN(Value * frac, op(OpKind::kSub, {p, base}));
    std::vector<Value*> weights;
    int64_t first = 0;
    if (o.mode == SampleMode::kLinear) {
      KILN_ASSIGN_OR_RETURN(Value * w0, affine(frac, -1, 1));
      weights = {w0, frac};
    } else {
      KILN_ASSIGN_OR_RETURN(weights, cubicWeights(frac));
      first = -1;
    }
    for (size_t k = 0; k < weights.size(); ++k) {
      KILN_ASSIGN_OR_RETURN(Value * i, affine(base, 1, static_cast<double>(first) + k));
      KILN_ASSIGN_OR_RETURN(Tap t, tap(i, size, o.padding, lo, hi, weights[k]));
      dimTaps.push_back(t);
    }
  }

  // Every combination of the dims' taps: a gather of the flat position, times its weight.
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
        KILN_ASSIGN_OR_RETURN(Value * sv, e_.constant(ir::TensorData::scalar(
                                              ir::DType::kI64, static_cast<double>(stride))));
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
    KILN_ASSIGN_OR_RETURN(Value * idx, op(OpKind::kReshape, {flat}, {{"shape", Shape{n, out}}}));
    KILN_ASSIGN_OR_RETURN(idx, op(OpKind::kAdd, {idx, imageRow}));
    KILN_ASSIGN_OR_RETURN(Value * v, op(OpKind::kGather, {rows, idx}, {{"axis", int64_t{0}}}));
    if (weight) {  // [N, P, C] times [N, P, 1].
      KILN_ASSIGN_OR_RETURN(Value * w,
                            op(OpKind::kReshape, {weight}, {{"shape", Shape{n, out, 1}}}));
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
  if (channelsLast) return sum;
  // [N, P, C] back to [N, C, P...].
  KILN_ASSIGN_OR_RETURN(sum,
                        op(OpKind::kTranspose, {sum}, {{"perm", std::vector<int64_t>{0, 2, 1}}}));
  return op(OpKind::kReshape, {sum}, {{"shape", outShape}});
}

// The most elements a constant of these lowerings holds (a malformed model's sizes are bounded
// only by the types' 2^48).
constexpr int64_t kMaxConstant = int64_t{1} << 24;

// x [N, C, S...] an image these lowerings sample: f32 or f64, no empty spatial dim (a tap would
// have nowhere to read), N within kMaxConstant (each tap adds the image's first row index).
Status requireSampled(const ir::TensorType& t, const char* what) {
  if (t.dtype != ir::DType::kF32 && t.dtype != ir::DType::kF64)
    return unimplemented(std::string(what) + " " + t.toString() +
                         " (kiln composes sampling for f32 and f64)");
  bool empty = t.rank() < 3;
  for (size_t d = 2; d < t.shape.size(); ++d) empty = empty || t.shape[d] < 1;
  if (empty)
    return invalidArgument(std::string(what) + " " + t.toString() +
                           ": the image must be [N, C, spatial...] with every spatial dim >= 1");
  if (t.shape[0] > kMaxConstant)
    return unimplemented(std::string(what) + " " + t.toString() +
                         ": kiln samples batches of at most 2^24 images (a row index each)");
  return Status::ok();
}

}  // namespace

Expected<Value*> emitGridSample(const Emitter& e, Value* x, Value* grid,
                                const SampleOptions& options) {
  const ir::TensorType& xt = x->type();
  const ir::TensorType& gt = grid->type();
  KILN_TRY(requireSampled(xt, "GridSample of"));
  Sampler s(e, xt.dtype);
  const int spatial = xt.rank() - 2;
  const int64_t last = gt.rank() - 1;
  std::vector<Value*> pos;
  for (int d = 0; d < spatial; ++d) {
    const int64_t size = xt.shape[static_cast<size_t>(d + 2)];
    // The grid's last dim lists x (the last spatial dim) first.
    const int64_t comp = spatial - 1 - d;
    KILN_ASSIGN_OR_RETURN(Value * g, s.op(OpKind::kSlice, {grid},
                                          {{"starts", std::vector<int64_t>{comp}},
                                           {"ends", std::vector<int64_t>{comp + 1}},
                                           {"axes", std::vector<int64_t>{last}}}));
    KILN_ASSIGN_OR_RETURN(g, s.op(OpKind::kSqueeze, {g}, {{"axes", std::vector<int64_t>{last}}}));
    // Pixel coordinate: (g + 1) / 2 (size - 1), or ((g + 1) size - 1) / 2.
    Value* p = nullptr;
    if (options.alignCorners) {
      KILN_ASSIGN_OR_RETURN(p, s.affine(g, (size - 1) / 2.0, (size - 1) / 2.0));
    } else {
      KILN_ASSIGN_OR_RETURN(p, s.affine(g, size / 2.0, (size - 1) / 2.0));
    }
    pos.push_back(p);
  }
  return s.sampleAt(x, pos, options);
}

Expected<Value*> emitDeformConv2d(const Emitter& e, Value* x, Value* w, Value* offset, Value* mask,
                                  Value* bias, const DeformWindow& window, int64_t group,
                                  int64_t offsetGroup) {
  const ir::TensorType &xt = x->type(), &wt = w->type(), &ot = offset->type();
  KILN_TRY(requireSampled(xt, "deform_conv2d of"));
  auto shapes = [&] {
    std::string s = "x " + xt.toString() + ", w " + wt.toString() + ", offset " + ot.toString();
    if (mask) s += ", mask " + mask->type().toString();
    if (bias) s += ", bias " + bias->type().toString();
    return s + ", group " + std::to_string(group) + ", offset_group " + std::to_string(offsetGroup);
  };
  if (xt.rank() != 4 || wt.rank() != 4 || ot.rank() != 4 || wt.dtype != xt.dtype ||
      ot.dtype != xt.dtype)
    return invalidArgument("deform_conv2d: x, w and offset must be 4-D of one float dtype; " +
                           shapes());
  const int64_t n = xt.shape[0], c = xt.shape[1], h = xt.shape[2], wd = xt.shape[3];
  const int64_t m = wt.shape[0], kh = wt.shape[2], kw = wt.shape[3];
  if (group < 1 || offsetGroup < 1 || group > c || offsetGroup > c || c % group != 0 ||
      wt.shape[1] != c / group || m % group != 0 || c % offsetGroup != 0)
    return invalidArgument(
        "deform_conv2d: the channels must divide into the groups (w [M, C/group, "
        "kh, kw], M and C multiples of group, C of offset_group); " +
        shapes());
  KILN_ASSIGN_OR_RETURN(
      const int64_t oh,
      ir::windowOutputSize(h, kh, window.strides[0], window.pads[0], window.pads[2],
                           window.dilations[0], false, "deform_conv2d height"));
  KILN_ASSIGN_OR_RETURN(
      const int64_t ow,
      ir::windowOutputSize(wd, kw, window.strides[1], window.pads[1], window.pads[3],
                           window.dilations[1], false, "deform_conv2d width"));
  // kh*kw is the filter's and oh*ow the offset's (checked below) element counts; the columns
  // [N, C*kh*kw, oh*ow] must be one too.
  const int64_t taps = kh * kw, positions = oh * ow;
  int64_t columns = 1;
  if (!ir::accumulateElements(columns, n) || !ir::accumulateElements(columns, c) ||
      !ir::accumulateElements(columns, taps) || !ir::accumulateElements(columns, positions))
    return invalidArgument(
        "deform_conv2d: its columns [N, C*kh*kw, oh*ow] would have more "
        "elements than int64 counts; " +
        shapes());
  if (oh < 1 || ow < 1 || ot.shape != Shape{n, offsetGroup * taps * 2, oh, ow})
    return invalidArgument("deform_conv2d: offset must be [N, offset_group*kh*kw*2, oh, ow] = " +
                           ir::shapeToString(Shape{n, offsetGroup * taps * 2, oh, ow}) + "; " +
                           shapes());
  if (mask && (mask->type().dtype != xt.dtype ||
               mask->type().shape != Shape{n, offsetGroup * taps, oh, ow}))
    return invalidArgument("deform_conv2d: mask must be [N, offset_group*kh*kw, oh, ow] = " +
                           ir::shapeToString(Shape{n, offsetGroup * taps, oh, ow}) + "; " +
                           shapes());
  if (bias && (bias->type().dtype != xt.dtype || bias->type().shape != Shape{m}))
    return invalidArgument("deform_conv2d: bias must be [M]; " + shapes());

  Sampler s(e, xt.dtype);
  auto op = [&](OpKind k, std::vector<Value*> in, ir::AttrMap a = {}) {
    return s.op(k, std::move(in), std::move(a));
  };
  auto reshape = [&](Value* v, Shape shape) {
    return op(OpKind::kReshape, {v}, {{"shape", shape}});
  };
  // The sampled points in output-position-major order (oh, ow, kh, kw), so that one position's
  // taps and channels are one row of the columns. Where each reads without offsets is separable:
  // row i*sh - pt + a*dh as [1, oh, 1, kh, 1], column j*sw - pl + b*dw as [1, 1, ow, 1, kw],
  // added to the offsets (dy, dx: offset's pairs split) moved to [N*offset_group, oh, ow, kh, kw].
  const int64_t points = taps * positions, images = n * offsetGroup;
  if (oh > kMaxConstant / kh || ow > kMaxConstant / kw || images > kMaxConstant)
    return unimplemented(
        "deform_conv2d: kiln builds the taps' base positions (oh x kh and ow x kw) and a row "
        "index per image and offset group as constants of at most 2^24 elements each; " +
        shapes());
  const std::vector<int64_t> positionMajor{0, 3, 4, 1, 2};
  auto baseOf = [&](int d, int64_t o, int64_t k) {
    ir::TensorData t(xt.dtype, d == 0 ? Shape{1, o, 1, k, 1} : Shape{1, 1, o, 1, k});
    const size_t sd = static_cast<size_t>(d);
    for (int64_t i = 0; i < o; ++i)
      for (int64_t a = 0; a < k; ++a) {
        const double v = static_cast<double>(i * window.strides[sd] - window.pads[sd] +
                                             a * window.dilations[sd]);
        if (xt.dtype == ir::DType::kF32)
          t.as<float>()[i * k + a] = static_cast<float>(v);
        else
          t.as<double>()[i * k + a] = v;
      }
    return t;
  };
  KILN_ASSIGN_OR_RETURN(Value * off, reshape(offset, {images, taps, 2, positions}));
  std::vector<Value*> pos;
  for (int d = 0; d < 2; ++d) {
    KILN_ASSIGN_OR_RETURN(Value * delta, op(OpKind::kSlice, {off},
                                            {{"starts", std::vector<int64_t>{d}},
                                             {"ends", std::vector<int64_t>{d + 1}},
                                             {"axes", std::vector<int64_t>{2}}}));
    KILN_ASSIGN_OR_RETURN(delta, reshape(delta, {images, kh, kw, oh, ow}));
    KILN_ASSIGN_OR_RETURN(delta, op(OpKind::kTranspose, {delta}, {{"perm", positionMajor}}));
    KILN_ASSIGN_OR_RETURN(Value * b, e.constant(d == 0 ? baseOf(0, oh, kh) : baseOf(1, ow, kw)));
    KILN_ASSIGN_OR_RETURN(Value * p, op(OpKind::kAdd, {delta, b}));
    KILN_ASSIGN_OR_RETURN(p, reshape(p, {images, points}));
    pos.push_back(p);
  }
  // Each offset group's channels sampled at its points, channels-last: [N*og, L*kh*kw, C/og].
  KILN_ASSIGN_OR_RETURN(Value * xg, reshape(x, {images, c / offsetGroup, h, wd}));
  KILN_ASSIGN_OR_RETURN(Value * cols,
                        s.sampleAt(xg, pos, {SampleMode::kLinear, SamplePadding::kZeros, true},
                                   /*channelsLast=*/true));
  if (mask) {
    KILN_ASSIGN_OR_RETURN(Value * mk, reshape(mask, {images, kh, kw, oh, ow}));
    KILN_ASSIGN_OR_RETURN(mk, op(OpKind::kTranspose, {mk}, {{"perm", positionMajor}}));
    KILN_ASSIGN_OR_RETURN(mk, reshape(mk, {images, points, 1}));
    KILN_ASSIGN_OR_RETURN(cols, op(OpKind::kMul, {cols, mk}));
  }
  if (group == 1 && offsetGroup == 1) {
    // One matmul a image, the columns as they are: [L, kh*kw*C] x the filter as
    // [kh*kw*C, M] (a transposition of the filter, not of the columns), then the output
    // [L, M] transposed, kh*kw*C/M times fewer elements than the columns.
    KILN_ASSIGN_OR_RETURN(cols, reshape(cols, {n, positions, taps * c}));
    KILN_ASSIGN_OR_RETURN(
        Value * filter, op(OpKind::kTranspose, {w}, {{"perm", std::vector<int64_t>{2, 3, 1, 0}}}));
    KILN_ASSIGN_OR_RETURN(filter, reshape(filter, {taps * c, m}));
    KILN_ASSIGN_OR_RETURN(Value * y, op(OpKind::kMatMul, {cols, filter}));
    if (bias) {
      KILN_ASSIGN_OR_RETURN(y, op(OpKind::kAdd, {y, bias}));
    }
    KILN_ASSIGN_OR_RETURN(y,
                          op(OpKind::kTranspose, {y}, {{"perm", std::vector<int64_t>{0, 2, 1}}}));
    return reshape(y, {n, m, oh, ow});
  }
  // Groups: the columns transposed to [N*og, C/og, kh*kw, L], which is [N, C, kh*kw, L]: per
  // group [C/g*kh*kw, L], times the filter's [M/g, C/g*kh*kw].
  KILN_ASSIGN_OR_RETURN(cols, reshape(cols, {images, positions, taps, c / offsetGroup}));
  KILN_ASSIGN_OR_RETURN(
      cols, op(OpKind::kTranspose, {cols}, {{"perm", std::vector<int64_t>{0, 3, 2, 1}}}));
  const int64_t depth = c / group * taps;
  KILN_ASSIGN_OR_RETURN(cols, reshape(cols, {n, group, depth, positions}));
  KILN_ASSIGN_OR_RETURN(Value * filter, reshape(w, {group, m / group, depth}));
  KILN_ASSIGN_OR_RETURN(Value * y, op(OpKind::kMatMul, {filter, cols}));
  KILN_ASSIGN_OR_RETURN(y, reshape(y, {n, m, oh, ow}));
  if (!bias) return y;
  KILN_ASSIGN_OR_RETURN(Value * b, reshape(bias, {1, m, 1, 1}));
  return op(OpKind::kAdd, {y, b});
}

}  // namespace kiln::frontends
