#include "passes/autodiff.h"

#include <array>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

namespace kiln::passes {

namespace {

using ir::OpKind;
using ir::Value;

// Emits the backward nodes of one forward node.
class Emitter {
 public:
  Emitter(ir::Graph& g, const ir::Node& n) : g_(g), n_(n) {}

  const ir::Node& node() const { return n_; }
  Value* in(size_t i) const { return n_.input(i); }
  Value* out() const { return n_.output(0); }
  ir::AttrView attrs() const { return ir::AttrView(n_.info(), n_.attrs()); }

  Expected<Value*> op(OpKind k, std::vector<Value*> ins, ir::AttrMap a = {}) {
    auto node = g_.addNode(k, std::move(ins), std::move(a));
    if (!node) return node.status().withContext("building the gradient of " + n_.describe());
    if (!n_.name().empty()) (*node)->setName(n_.name() + ".backward");
    return (*node)->output(0);
  }
  Expected<Value*> scalar(ir::DType dtype, double v) {
    return g_.addParameter(g_.freshName(), ir::TensorData::scalar(dtype, v), /*trainable=*/false);
  }
  Expected<Value*> reshape(Value* v, const ir::Shape& shape) {
    if (v->type().shape == shape) return v;
    const bool zero = std::find(shape.begin(), shape.end(), 0) != shape.end();
    return op(OpKind::kReshape, {v}, {{"shape", shape}, {"allowzero", int64_t{zero}}});
  }
  // Sums `grad` over the dims that broadcasting added or stretched to get back `shape`.
  Expected<Value*> unbroadcast(Value* grad, const ir::Shape& shape) {
    const ir::Shape& gs = grad->type().shape;
    if (gs == shape) return grad;
    const size_t extra = gs.size() - shape.size();
    std::vector<int64_t> axes;
    for (size_t i = 0; i < gs.size(); ++i)
      if (i < extra || (shape[i - extra] == 1 && gs[i] != 1))
        axes.push_back(static_cast<int64_t>(i));
    Value* summed = grad;
    if (!axes.empty()) {
      KILN_ASSIGN_OR_RETURN(
          summed, op(OpKind::kReduceSum, {grad}, {{"axes", axes}, {"keepdims", int64_t{1}}}));
    }
    return reshape(summed, shape);
  }
  Expected<Value*> mulScalar(Value* v, double s) {
    KILN_ASSIGN_OR_RETURN(Value * c, scalar(v->type().dtype, s));
    return op(OpKind::kMul, {v, c});
  }
  // The last two dims swapped.
  Expected<Value*> transposeLast(Value* v) {
    const int64_t r = static_cast<int64_t>(v->type().rank());
    std::vector<int64_t> perm(static_cast<size_t>(r));
    std::iota(perm.begin(), perm.end(), 0);
    std::swap(perm[r - 1], perm[r - 2]);
    return op(OpKind::kTranspose, {v}, {{"perm", perm}});
  }
  // sum over `axis` keeping it, for softmax-style backward.
  Expected<Value*> sumKeep(Value* v, int64_t axis) {
    return op(OpKind::kReduceSum, {v},
              {{"axes", std::vector<int64_t>{axis}}, {"keepdims", int64_t{1}}});
  }
  int64_t normAxis(int64_t axis, size_t rank) const {
    return axis < 0 ? axis + static_cast<int64_t>(rank) : axis;
  }
  Status unsupported(const std::string& why) const {
    return unimplemented("autodiff: no gradient for " + n_.describe() + ": " + why);
  }

 private:
  ir::Graph& g_;
  const ir::Node& n_;
};

using Grads = std::vector<Value*>;
using GradFn = Expected<Grads> (*)(Emitter& e, Value* g);

// ---- Pointwise.
Expected<Grads> gradNeg(Emitter& e, Value* g) {
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kNeg, {g}));
  return Grads{dx};
}
Expected<Grads> gradRelu(Emitter& e, Value* g) {
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kReluBackward, {g, e.in(0)}));
  return Grads{dx};
}
Expected<Grads> gradExp(Emitter& e, Value* g) {
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kMul, {g, e.out()}));
  return Grads{dx};
}
Expected<Grads> gradLog(Emitter& e, Value* g) {
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kDiv, {g, e.in(0)}));
  return Grads{dx};
}
Expected<Grads> gradSqrt(Emitter& e, Value* g) {  // g / (2 sqrt x)
  KILN_ASSIGN_OR_RETURN(Value * half, e.mulScalar(g, 0.5));
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kDiv, {half, e.out()}));
  return Grads{dx};
}
Expected<Grads> gradRsqrt(Emitter& e, Value* g) {  // -g y^3 / 2
  KILN_ASSIGN_OR_RETURN(Value * y2, e.op(OpKind::kMul, {e.out(), e.out()}));
  KILN_ASSIGN_OR_RETURN(Value * y3, e.op(OpKind::kMul, {y2, e.out()}));
  KILN_ASSIGN_OR_RETURN(Value * gy3, e.op(OpKind::kMul, {g, y3}));
  KILN_ASSIGN_OR_RETURN(Value * dx, e.mulScalar(gy3, -0.5));
  return Grads{dx};
}
Expected<Grads> gradTanh(Emitter& e, Value* g) {  // g (1 - y^2)
  KILN_ASSIGN_OR_RETURN(Value * one, e.scalar(e.out()->type().dtype, 1.0));
  KILN_ASSIGN_OR_RETURN(Value * y2, e.op(OpKind::kMul, {e.out(), e.out()}));
  KILN_ASSIGN_OR_RETURN(Value * d, e.op(OpKind::kSub, {one, y2}));
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kMul, {g, d}));
  return Grads{dx};
}
Expected<Grads> gradSigmoid(Emitter& e, Value* g) {  // g y (1 - y)
  KILN_ASSIGN_OR_RETURN(Value * one, e.scalar(e.out()->type().dtype, 1.0));
  KILN_ASSIGN_OR_RETURN(Value * c, e.op(OpKind::kSub, {one, e.out()}));
  KILN_ASSIGN_OR_RETURN(Value * d, e.op(OpKind::kMul, {e.out(), c}));
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kMul, {g, d}));
  return Grads{dx};
}
Expected<Grads> gradSilu(Emitter& e, Value* g) {  // g s (1 + x (1 - s)), s = sigmoid(x)
  KILN_ASSIGN_OR_RETURN(Value * s, e.op(OpKind::kSigmoid, {e.in(0)}));
  KILN_ASSIGN_OR_RETURN(Value * one, e.scalar(s->type().dtype, 1.0));
  KILN_ASSIGN_OR_RETURN(Value * c, e.op(OpKind::kSub, {one, s}));
  KILN_ASSIGN_OR_RETURN(Value * xc, e.op(OpKind::kMul, {e.in(0), c}));
  KILN_ASSIGN_OR_RETURN(Value * t, e.op(OpKind::kAdd, {one, xc}));
  KILN_ASSIGN_OR_RETURN(Value * d, e.op(OpKind::kMul, {s, t}));
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kMul, {g, d}));
  return Grads{dx};
}
Expected<Grads> gradCast(Emitter& e, Value* g) {
  if (!ir::isFloat(e.in(0)->type().dtype)) return Grads{nullptr};
  KILN_ASSIGN_OR_RETURN(
      Value * dx,
      e.op(OpKind::kCast, {g}, {{"to", std::string(ir::dtypeName(e.in(0)->type().dtype))}}));
  return Grads{dx};
}
Expected<Grads> gradRelayout(Emitter& e, Value* g) {
  // The gradient arrives in whatever layout its producer chose; it leaves in the input's.
  const ir::Layout from = g->type().layout, to = e.in(0)->type().layout;
  if (from == to) return Grads{g};
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kRelayout, {g},
                                         {{"from", std::string(ir::layoutName(from))},
                                          {"to", std::string(ir::layoutName(to))}}));
  return Grads{dx};
}
Expected<Grads> gradDropout(Emitter& e, Value* g) {
  // The dropout op is the inference identity; training-mode dropout is not built yet.
  (void)e;
  return Grads{g};
}
Expected<Grads> gradAdd(Emitter& e, Value* g) {
  KILN_ASSIGN_OR_RETURN(Value * da, e.unbroadcast(g, e.in(0)->type().shape));
  KILN_ASSIGN_OR_RETURN(Value * db, e.unbroadcast(g, e.in(1)->type().shape));
  return Grads{da, db};
}
Expected<Grads> gradSub(Emitter& e, Value* g) {
  KILN_ASSIGN_OR_RETURN(Value * da, e.unbroadcast(g, e.in(0)->type().shape));
  KILN_ASSIGN_OR_RETURN(Value * ng, e.op(OpKind::kNeg, {g}));
  KILN_ASSIGN_OR_RETURN(Value * db, e.unbroadcast(ng, e.in(1)->type().shape));
  return Grads{da, db};
}
Expected<Grads> gradMul(Emitter& e, Value* g) {
  KILN_ASSIGN_OR_RETURN(Value * gb, e.op(OpKind::kMul, {g, e.in(1)}));
  KILN_ASSIGN_OR_RETURN(Value * ga, e.op(OpKind::kMul, {g, e.in(0)}));
  KILN_ASSIGN_OR_RETURN(Value * da, e.unbroadcast(gb, e.in(0)->type().shape));
  KILN_ASSIGN_OR_RETURN(Value * db, e.unbroadcast(ga, e.in(1)->type().shape));
  return Grads{da, db};
}
Expected<Grads> gradDiv(Emitter& e, Value* g) {  // y = a / b: g / b, -g y / b
  KILN_ASSIGN_OR_RETURN(Value * gb, e.op(OpKind::kDiv, {g, e.in(1)}));
  KILN_ASSIGN_OR_RETURN(Value * gy, e.op(OpKind::kMul, {gb, e.out()}));
  KILN_ASSIGN_OR_RETURN(Value * ngy, e.op(OpKind::kNeg, {gy}));
  KILN_ASSIGN_OR_RETURN(Value * da, e.unbroadcast(gb, e.in(0)->type().shape));
  KILN_ASSIGN_OR_RETURN(Value * db, e.unbroadcast(ngy, e.in(1)->type().shape));
  return Grads{da, db};
}
Expected<Grads> gradWhere(Emitter& e, Value* g) {
  KILN_ASSIGN_OR_RETURN(Value * zero, e.scalar(g->type().dtype, 0.0));
  KILN_ASSIGN_OR_RETURN(Value * gx, e.op(OpKind::kWhere, {e.in(0), g, zero}));
  KILN_ASSIGN_OR_RETURN(Value * gy, e.op(OpKind::kWhere, {e.in(0), zero, g}));
  KILN_ASSIGN_OR_RETURN(Value * dx, e.unbroadcast(gx, e.in(1)->type().shape));
  KILN_ASSIGN_OR_RETURN(Value * dy, e.unbroadcast(gy, e.in(2)->type().shape));
  return Grads{nullptr, dx, dy};
}

// ---- Matrix products.
Expected<Grads> gradMatMul(Emitter& e, Value* g) {
  Value* a = e.in(0);
  Value* b = e.in(1);
  if (a->type().rank() < 2 || b->type().rank() < 2)
    return e.unsupported("1-D operands (promote them to matrices with unsqueeze)");
  KILN_ASSIGN_OR_RETURN(Value * bt, e.transposeLast(b));
  KILN_ASSIGN_OR_RETURN(Value * at, e.transposeLast(a));
  KILN_ASSIGN_OR_RETURN(Value * ga, e.op(OpKind::kMatMul, {g, bt}));
  KILN_ASSIGN_OR_RETURN(Value * gb, e.op(OpKind::kMatMul, {at, g}));
  KILN_ASSIGN_OR_RETURN(Value * da, e.unbroadcast(ga, a->type().shape));
  KILN_ASSIGN_OR_RETURN(Value * db, e.unbroadcast(gb, b->type().shape));
  return Grads{da, db};
}
// linear(x [...,K], w [N,K], b [N]) = x w^T + b.
Expected<Grads> gradLinear(Emitter& e, Value* g) {
  Value* x = e.in(0);
  Value* w = e.in(1);
  const int64_t n = w->type().shape[0], k = w->type().shape[1];
  const int64_t m = x->type().numElements() / std::max<int64_t>(k, 1);
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kMatMul, {g, w}));
  KILN_ASSIGN_OR_RETURN(Value * g2, e.reshape(g, {m, n}));
  KILN_ASSIGN_OR_RETURN(Value * x2, e.reshape(x, {m, k}));
  KILN_ASSIGN_OR_RETURN(Value * g2t, e.transposeLast(g2));
  KILN_ASSIGN_OR_RETURN(Value * dw, e.op(OpKind::kMatMul, {g2t, x2}));
  Grads out{dx, dw};
  if (e.node().numInputs() > 2) {
    KILN_ASSIGN_OR_RETURN(Value * db,
                          e.op(OpKind::kReduceSum, {g2},
                               {{"axes", std::vector<int64_t>{0}}, {"keepdims", int64_t{0}}}));
    out.push_back(db);
  }
  return out;
}

// ---- Convolution and pooling: backward ops of their own (reference kernels).
ir::AttrMap windowAttrs(const Emitter& e, std::initializer_list<const char*> names) {
  const auto a = e.attrs();
  ir::AttrMap out;
  for (const char* n : names) {
    if (a.op().findAttr(n) == nullptr) continue;
    const ir::AttrSpec* spec = a.op().findAttr(n);
    if (spec->kind == ir::AttrKind::kInts)
      out[n] = a.getInts(n);
    else
      out[n] = a.getInt(n);
  }
  return out;
}
Expected<Grads> gradConv2d(Emitter& e, Value* g) {
  if (e.in(0)->type().layout == ir::Layout::kNHWC)
    return e.unsupported("channels-last activations (differentiate before layout selection)");
  const ir::AttrMap a = windowAttrs(e, {"strides", "pads", "dilations", "group"});
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kConv2dBackwardData, {g, e.in(1), e.in(0)}, a));
  KILN_ASSIGN_OR_RETURN(Value * dw, e.op(OpKind::kConv2dBackwardWeight, {g, e.in(0), e.in(1)}, a));
  Grads out{dx, dw};
  if (e.node().numInputs() > 2) {
    KILN_ASSIGN_OR_RETURN(
        Value * db, e.op(OpKind::kReduceSum, {g},
                         {{"axes", std::vector<int64_t>{0, 2, 3}}, {"keepdims", int64_t{0}}}));
    out.push_back(db);
  }
  return out;
}
Expected<Grads> gradPool(Emitter& e, Value* g, OpKind backward) {
  if (e.in(0)->type().layout == ir::Layout::kNHWC)
    return e.unsupported("channels-last activations (differentiate before layout selection)");
  const ir::AttrMap a =
      windowAttrs(e, {"kernel", "strides", "pads", "dilations", "ceil_mode", "count_include_pad"});
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(backward, {g, e.in(0)}, a));
  return Grads{dx};
}
Expected<Grads> gradMaxPool2d(Emitter& e, Value* g) {
  return gradPool(e, g, OpKind::kMaxPool2dBackward);
}
Expected<Grads> gradAvgPool2d(Emitter& e, Value* g) {
  return gradPool(e, g, OpKind::kAvgPool2dBackward);
}

// ---- Reductions and normalizations.
// The gradient of a sum over `axes` (empty: all) with or without keepdims: g, with the reduced
// dims put back as 1, expanded to x's shape, times `scale`.
Expected<Value*> expandReduced(Emitter& e, Value* g, const ir::Shape& xShape,
                               std::vector<int64_t> axes, double scale) {
  const size_t r = xShape.size();
  if (axes.empty())
    for (size_t i = 0; i < r; ++i) axes.push_back(static_cast<int64_t>(i));
  ir::Shape keep = xShape;
  for (int64_t a : axes) keep[static_cast<size_t>(e.normAxis(a, r))] = 1;
  KILN_ASSIGN_OR_RETURN(Value * gk, e.reshape(g, keep));
  Value* dx = gk;
  if (keep != xShape) {
    KILN_ASSIGN_OR_RETURN(dx, e.op(OpKind::kExpand, {gk}, {{"shape", xShape}}));
  }
  if (scale != 1.0) return e.mulScalar(dx, scale);
  return dx;
}
Expected<Grads> gradReduceSum(Emitter& e, Value* g) {
  KILN_ASSIGN_OR_RETURN(Value * dx,
                        expandReduced(e, g, e.in(0)->type().shape, e.attrs().getInts("axes"), 1.0));
  return Grads{dx};
}
Expected<Grads> gradReduceMean(Emitter& e, Value* g) {
  const ir::Shape& xs = e.in(0)->type().shape;
  const int64_t count =
      e.in(0)->type().numElements() / std::max<int64_t>(1, e.out()->type().numElements());
  KILN_ASSIGN_OR_RETURN(Value * dx,
                        expandReduced(e, g, xs, e.attrs().getInts("axes"),
                                      1.0 / static_cast<double>(std::max<int64_t>(count, 1))));
  return Grads{dx};
}
Expected<Grads> gradGlobalAvgPool(Emitter& e, Value* g) {
  const ir::Shape& xs = e.in(0)->type().shape;
  std::vector<int64_t> spatial;
  int64_t count = 1;
  for (size_t i = 2; i < xs.size(); ++i) {
    spatial.push_back(static_cast<int64_t>(i));
    count *= xs[i];
  }
  KILN_ASSIGN_OR_RETURN(
      Value * dx,
      expandReduced(e, g, xs, spatial, 1.0 / static_cast<double>(std::max<int64_t>(count, 1))));
  return Grads{dx};
}
Expected<Grads> gradSoftmax(Emitter& e, Value* g) {  // y (g - sum(g y))
  const int64_t axis = e.normAxis(e.attrs().getInt("axis"), e.out()->type().rank());
  KILN_ASSIGN_OR_RETURN(Value * gy, e.op(OpKind::kMul, {g, e.out()}));
  KILN_ASSIGN_OR_RETURN(Value * s, e.sumKeep(gy, axis));
  KILN_ASSIGN_OR_RETURN(Value * d, e.op(OpKind::kSub, {g, s}));
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kMul, {e.out(), d}));
  return Grads{dx};
}
// g - exp(y) sum(g) over the axis, for y = log_softmax(x).
Expected<Value*> logSoftmaxBackward(Emitter& e, Value* g, Value* y, int64_t axis) {
  KILN_ASSIGN_OR_RETURN(Value * s, e.sumKeep(g, axis));
  KILN_ASSIGN_OR_RETURN(Value * p, e.op(OpKind::kExp, {y}));
  KILN_ASSIGN_OR_RETURN(Value * ps, e.op(OpKind::kMul, {p, s}));
  return e.op(OpKind::kSub, {g, ps});
}
Expected<Grads> gradLogSoftmax(Emitter& e, Value* g) {
  const int64_t axis = e.normAxis(e.attrs().getInt("axis"), e.out()->type().rank());
  KILN_ASSIGN_OR_RETURN(Value * dx, logSoftmaxBackward(e, g, e.out(), axis));
  return Grads{dx};
}

// ---- Losses.
ir::AttrMap lossAttrs(const Emitter& e) {
  const auto a = e.attrs();
  return {{"ignore_index", a.getInt("ignore_index")}, {"reduction", a.getString("reduction")}};
}
Expected<Grads> gradNllLoss(Emitter& e, Value* g) {
  KILN_ASSIGN_OR_RETURN(Value * dx,
                        e.op(OpKind::kNllLossBackward, {g, e.in(0), e.in(1)}, lossAttrs(e)));
  return Grads{dx, nullptr};
}
Expected<Grads> gradCrossEntropyLoss(Emitter& e, Value* g) {
  // cross_entropy_loss = nll_loss(log_softmax(x, 1)): the log-probabilities are recomputed.
  KILN_ASSIGN_OR_RETURN(Value * ls, e.op(OpKind::kLogSoftmax, {e.in(0)}, {{"axis", int64_t{1}}}));
  KILN_ASSIGN_OR_RETURN(Value * dls,
                        e.op(OpKind::kNllLossBackward, {g, ls, e.in(1)}, lossAttrs(e)));
  KILN_ASSIGN_OR_RETURN(Value * dx, logSoftmaxBackward(e, dls, ls, 1));
  return Grads{dx, nullptr};
}

// ---- Data movement.
Expected<Grads> gradReshapeLike(Emitter& e, Value* g) {  // reshape, flatten, squeeze, unsqueeze
  KILN_ASSIGN_OR_RETURN(Value * dx, e.reshape(g, e.in(0)->type().shape));
  return Grads{dx};
}
Expected<Grads> gradTranspose(Emitter& e, Value* g) {
  std::vector<int64_t> perm = e.attrs().getInts("perm");
  const size_t r = e.in(0)->type().rank();
  if (perm.empty())
    for (size_t i = 0; i < r; ++i) perm.push_back(static_cast<int64_t>(r - 1 - i));
  std::vector<int64_t> inverse(r);
  for (size_t i = 0; i < r; ++i)
    inverse[static_cast<size_t>(e.normAxis(perm[i], r))] = static_cast<int64_t>(i);
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kTranspose, {g}, {{"perm", inverse}}));
  return Grads{dx};
}
Expected<Grads> gradExpand(Emitter& e, Value* g) {
  KILN_ASSIGN_OR_RETURN(Value * dx, e.unbroadcast(g, e.in(0)->type().shape));
  return Grads{dx};
}
Expected<Grads> gradConcat(Emitter& e, Value* g) {
  const int64_t axis = e.normAxis(e.attrs().getInt("axis"), e.out()->type().rank());
  Grads out;
  int64_t offset = 0;
  for (size_t i = 0; i < e.node().numInputs(); ++i) {
    const int64_t size = e.in(i)->type().shape[static_cast<size_t>(axis)];
    KILN_ASSIGN_OR_RETURN(Value * d, e.op(OpKind::kSlice, {g},
                                          {{"starts", std::vector<int64_t>{offset}},
                                           {"ends", std::vector<int64_t>{offset + size}},
                                           {"axes", std::vector<int64_t>{axis}}}));
    out.push_back(d);
    offset += size;
  }
  return out;
}

const std::array<GradFn, ir::kNumOps>& builders() {
  static const std::array<GradFn, ir::kNumOps> table = [] {
    std::array<GradFn, ir::kNumOps> t{};
    auto set = [&](OpKind k, GradFn f) { t[static_cast<size_t>(k)] = f; };
    set(OpKind::kNeg, gradNeg);
    set(OpKind::kRelu, gradRelu);
    set(OpKind::kSigmoid, gradSigmoid);
    set(OpKind::kTanh, gradTanh);
    set(OpKind::kSilu, gradSilu);
    set(OpKind::kExp, gradExp);
    set(OpKind::kLog, gradLog);
    set(OpKind::kSqrt, gradSqrt);
    set(OpKind::kRsqrt, gradRsqrt);
    set(OpKind::kCast, gradCast);
    set(OpKind::kRelayout, gradRelayout);
    set(OpKind::kDropout, gradDropout);
    set(OpKind::kAdd, gradAdd);
    set(OpKind::kSub, gradSub);
    set(OpKind::kMul, gradMul);
    set(OpKind::kDiv, gradDiv);
    set(OpKind::kWhere, gradWhere);
    set(OpKind::kMatMul, gradMatMul);
    set(OpKind::kLinear, gradLinear);
    set(OpKind::kConv2d, gradConv2d);
    set(OpKind::kMaxPool2d, gradMaxPool2d);
    set(OpKind::kAvgPool2d, gradAvgPool2d);
    set(OpKind::kGlobalAvgPool, gradGlobalAvgPool);
    set(OpKind::kSoftmax, gradSoftmax);
    set(OpKind::kLogSoftmax, gradLogSoftmax);
    set(OpKind::kReduceSum, gradReduceSum);
    set(OpKind::kReduceMean, gradReduceMean);
    set(OpKind::kReshape, gradReshapeLike);
    set(OpKind::kFlatten, gradReshapeLike);
    set(OpKind::kSqueeze, gradReshapeLike);
    set(OpKind::kUnsqueeze, gradReshapeLike);
    set(OpKind::kTranspose, gradTranspose);
    set(OpKind::kConcat, gradConcat);
    set(OpKind::kExpand, gradExpand);
    set(OpKind::kNllLoss, gradNllLoss);
    set(OpKind::kCrossEntropyLoss, gradCrossEntropyLoss);
    return t;
  }();
  return table;
}

}  // namespace

bool hasGradientBuilder(ir::OpKind op) {
  return builders()[static_cast<size_t>(op)] != nullptr;
}

Expected<std::vector<Value*>> appendBackward(ir::Graph& g, Value* loss,
                                             std::span<Value* const> wrt) {
  if (!loss || !ir::isFloat(loss->type().dtype) || !loss->type().shape.empty())
    return invalidArgument(
        "autodiff: the loss must be a floating-point scalar, got " +
        (loss ? "%" + loss->name() + " : " + loss->type().toString() : std::string("nothing")));
  for (Value* v : wrt)
    if (!v || (!v->isParameter() && !v->isInput()) || !ir::isFloat(v->type().dtype))
      return invalidArgument(
          "autodiff: gradients are taken with respect to floating-point "
          "parameters or graph inputs, got " +
          (v ? "%" + v->name() + " : " + v->type().toString() : "nothing"));
  const std::vector<ir::Node*> forward = g.nodes();  // Before anything is appended.

  // The nodes between `wrt` and `loss`.
  std::unordered_set<const Value*> fromWrt(wrt.begin(), wrt.end());
  for (const ir::Node* n : forward)
    for (const Value* in : n->inputs())
      if (fromWrt.count(in)) {
        for (const Value* o : n->outputs()) fromWrt.insert(o);
        break;
      }

  std::unordered_map<const Value*, Value*> grad;
  const ir::DType dt = loss->type().dtype;
  KILN_ASSIGN_OR_RETURN(grad[loss],
                        g.addParameter(g.freshName(), ir::TensorData::scalar(dt, 1.0), false));
  for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
    const ir::Node* n = *it;
    if (n->outputs().size() != 1) continue;
    auto gy = grad.find(n->output(0));
    if (gy == grad.end() || !fromWrt.count(n->output(0))) continue;
    const GradFn fn = builders()[static_cast<size_t>(n->op())];
    if (!fn)
      return unimplemented("autodiff: " + n->describe() + " lies between the parameters and the " +
                           "loss, and op '" + std::string(ir::opName(n->op())) +
                           "' has no gradient builder yet");
    Emitter e(g, *n);
    KILN_ASSIGN_OR_RETURN(Grads dins, fn(e, gy->second));
    for (size_t i = 0; i < n->numInputs() && i < dins.size(); ++i) {
      Value* in = n->input(i);
      Value* d = dins[i];
      if (!d || !fromWrt.count(in) || !ir::isFloat(in->type().dtype)) continue;
      if (d->type().shape != in->type().shape || d->type().dtype != in->type().dtype)
        return internalError("autodiff: the gradient of input " + std::to_string(i) + " of " +
                             n->describe() + " is " + d->type().toString() + ", expected " +
                             in->type().toString());
      auto [slot, fresh] = grad.emplace(in, d);
      if (!fresh) {
        auto sum = g.addNode(OpKind::kAdd, {slot->second, d});
        if (!sum) return sum.status();
        slot->second = (*sum)->output(0);
      }
    }
  }

  std::vector<Value*> out;
  for (Value* v : wrt) {
    auto it = grad.find(v);
    if (it != grad.end()) {
      out.push_back(it->second);
      continue;
    }
    // The loss does not depend on v.
    KILN_ASSIGN_OR_RETURN(
        Value * z,
        g.addParameter(g.freshName(), ir::TensorData::scalar(v->type().dtype, 0.0), false));
    auto node = g.addNode(OpKind::kExpand, {z}, {{"shape", v->type().shape}});
    if (!node) return node.status();
    out.push_back((*node)->output(0));
  }
  return out;
}

}  // namespace kiln::passes
