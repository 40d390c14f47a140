#include "passes/autodiff.h"

#include "passes/graph_builder.h"

#include <algorithm>
#include <array>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

namespace kiln::passes {

namespace {

using ir::OpKind;
using ir::Value;

// Emits the backward nodes of one forward node, named `<node>.backward`.
class Emitter : public GraphBuilder {
 public:
  Emitter(ir::Graph& g, const ir::Node& n)
      : GraphBuilder(g, nullptr, &n, ".backward", "building the gradient of " + n.describe()),
        n_(n) {}

  const ir::Node& node() const { return n_; }
  Value* in(size_t i) const { return n_.input(i); }
  Value* out() const { return n_.output(0); }
  ir::AttrView attrs() const { return ir::AttrView(n_.info(), n_.attrs()); }

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
  // From the output, y > 0 exactly where x > 0 (NaN: neither), as PyTorch's threshold_backward:
  // the output is usually saved anyway (the next conv's or pool's backward reads it), so the
  // input need not be kept for the backward pass.
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kReluBackward, {g, e.out()}));
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
// g (t + x s (1 - t^2)), t = tanh(softplus(x)), s = sigmoid(x) (softplus' = sigmoid)
Expected<Grads> gradMish(Emitter& e, Value* g) {
  Value* x = e.in(0);
  KILN_ASSIGN_OR_RETURN(Value * one, e.scalar(x->type().dtype, 1.0));
  KILN_ASSIGN_OR_RETURN(Value * ex, e.op(OpKind::kExp, {x}));
  KILN_ASSIGN_OR_RETURN(Value * onePlus, e.op(OpKind::kAdd, {one, ex}));
  KILN_ASSIGN_OR_RETURN(Value * sp, e.op(OpKind::kLog, {onePlus}));
  KILN_ASSIGN_OR_RETURN(Value * t, e.op(OpKind::kTanh, {sp}));
  KILN_ASSIGN_OR_RETURN(Value * s, e.op(OpKind::kSigmoid, {x}));
  KILN_ASSIGN_OR_RETURN(Value * tt, e.op(OpKind::kMul, {t, t}));
  KILN_ASSIGN_OR_RETURN(Value * c, e.op(OpKind::kSub, {one, tt}));
  KILN_ASSIGN_OR_RETURN(Value * xs, e.op(OpKind::kMul, {x, s}));
  KILN_ASSIGN_OR_RETURN(Value * xsc, e.op(OpKind::kMul, {xs, c}));
  KILN_ASSIGN_OR_RETURN(Value * d, e.op(OpKind::kAdd, {t, xsc}));
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
  // The dropout op is the inference identity; training graphs use dropout_train
  // (passes/training_mode.h).
  (void)e;
  return Grads{g};
}
Expected<Grads> gradDropoutTrain(Emitter& e, Value* g) {
  const auto a = e.attrs();
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kDropoutBackward, {g, e.in(1)},
                                         {{"ratio", a.getFloat("ratio")},
                                          {"seed", a.getInt("seed")},
                                          {"offset", a.getInt("offset")}}));
  return Grads{dx, nullptr};
}
// The pointwise ops whose derivative is an op of its own, (grad, x) with the forward attributes.
Expected<Grads> gradByBackwardOp(Emitter& e, Value* g, OpKind backward, ir::AttrMap attrs) {
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(backward, {g, e.in(0)}, std::move(attrs)));
  return Grads{dx};
}
Expected<Grads> gradAbs(Emitter& e, Value* g) {
  return gradByBackwardOp(e, g, OpKind::kAbsBackward, {});
}
Expected<Grads> gradLeakyRelu(Emitter& e, Value* g) {
  return gradByBackwardOp(e, g, OpKind::kLeakyReluBackward,
                          {{"alpha", e.attrs().getFloat("alpha")}});
}
Expected<Grads> gradClip(Emitter& e, Value* g) {
  return gradByBackwardOp(e, g, OpKind::kClipBackward,
                          {{"min", e.attrs().getFloat("min")}, {"max", e.attrs().getFloat("max")}});
}
Expected<Grads> gradGelu(Emitter& e, Value* g) {
  return gradByBackwardOp(e, g, OpKind::kGeluBackward,
                          {{"approximate", e.attrs().getString("approximate")}});
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
Expected<Grads> gradPow(Emitter& e, Value* g) {  // y = a^b: g b a^(b-1), g y log a
  KILN_ASSIGN_OR_RETURN(Value * one, e.scalar(g->type().dtype, 1.0));
  KILN_ASSIGN_OR_RETURN(Value * bm1, e.op(OpKind::kSub, {e.in(1), one}));
  KILN_ASSIGN_OR_RETURN(Value * p, e.op(OpKind::kPow, {e.in(0), bm1}));
  KILN_ASSIGN_OR_RETURN(Value * bp, e.op(OpKind::kMul, {e.in(1), p}));
  KILN_ASSIGN_OR_RETURN(Value * ga, e.op(OpKind::kMul, {g, bp}));
  KILN_ASSIGN_OR_RETURN(Value * la, e.op(OpKind::kLog, {e.in(0)}));
  KILN_ASSIGN_OR_RETURN(Value * yl, e.op(OpKind::kMul, {e.out(), la}));
  KILN_ASSIGN_OR_RETURN(Value * gb, e.op(OpKind::kMul, {g, yl}));
  KILN_ASSIGN_OR_RETURN(Value * da, e.unbroadcast(ga, e.in(0)->type().shape));
  KILN_ASSIGN_OR_RETURN(Value * db, e.unbroadcast(gb, e.in(1)->type().shape));
  return Grads{da, db};
}
// maximum / minimum: the winner takes grad, a tie splits it (PyTorch's rule).
Expected<Grads> gradExtremum(Emitter& e, Value* g, OpKind backward) {
  KILN_ASSIGN_OR_RETURN(Value * ga, e.op(backward, {g, e.in(0), e.in(1)}));
  KILN_ASSIGN_OR_RETURN(Value * gb, e.op(backward, {g, e.in(1), e.in(0)}));
  KILN_ASSIGN_OR_RETURN(Value * da, e.unbroadcast(ga, e.in(0)->type().shape));
  KILN_ASSIGN_OR_RETURN(Value * db, e.unbroadcast(gb, e.in(1)->type().shape));
  return Grads{da, db};
}
Expected<Grads> gradMaximum(Emitter& e, Value* g) {
  return gradExtremum(e, g, OpKind::kMaximumBackward);
}
Expected<Grads> gradMinimum(Emitter& e, Value* g) {
  return gradExtremum(e, g, OpKind::kMinimumBackward);
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

// Y = alpha op(A) op(B) + beta C with op(M) = M or M^T.
Expected<Grads> gradGemm(Emitter& e, Value* g) {
  const auto a = e.attrs();
  const double alpha = a.getFloat("alpha"), beta = a.getFloat("beta");
  const bool ta = a.getInt("transA") != 0, tb = a.getInt("transB") != 0;
  Value* opA = e.in(0);
  Value* opB = e.in(1);
  if (ta) {
    KILN_ASSIGN_OR_RETURN(opA, e.transposeLast(opA));
  }
  if (tb) {
    KILN_ASSIGN_OR_RETURN(opB, e.transposeLast(opB));
  }
  Value* ga = g;
  if (alpha != 1.0) {
    KILN_ASSIGN_OR_RETURN(ga, e.mulScalar(g, alpha));
  }
  // d op(A) = alpha g op(B)^T, d op(B) = alpha op(A)^T g; d A = (d op(A))^T when transposed,
  // which is alpha op(B) g^T.
  Value* da;
  Value* db;
  if (ta) {
    KILN_ASSIGN_OR_RETURN(Value * gt, e.transposeLast(ga));
    KILN_ASSIGN_OR_RETURN(da, e.op(OpKind::kMatMul, {opB, gt}));
  } else {
    KILN_ASSIGN_OR_RETURN(Value * bt, e.transposeLast(opB));
    KILN_ASSIGN_OR_RETURN(da, e.op(OpKind::kMatMul, {ga, bt}));
  }
  if (tb) {
    KILN_ASSIGN_OR_RETURN(Value * gt, e.transposeLast(ga));
    KILN_ASSIGN_OR_RETURN(db, e.op(OpKind::kMatMul, {gt, opA}));
  } else {
    KILN_ASSIGN_OR_RETURN(Value * at, e.transposeLast(opA));
    KILN_ASSIGN_OR_RETURN(db, e.op(OpKind::kMatMul, {at, ga}));
  }
  Grads out{da, db};
  if (e.node().numInputs() > 2) {
    Value* gc = g;
    if (beta != 1.0) {
      KILN_ASSIGN_OR_RETURN(gc, e.mulScalar(g, beta));
    }
    KILN_ASSIGN_OR_RETURN(Value * dc, e.unbroadcast(gc, e.in(2)->type().shape));
    out.push_back(dc);
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
    KILN_ASSIGN_OR_RETURN(Value * db, e.op(OpKind::kConv2dBackwardBias, {g}));
    out.push_back(db);
  }
  return out;
}
// y = conv_transpose2d(x, w) is conv2d_backward_data(x, w, y): linear in x and in w, so that
// dx = conv2d(dy, w) and dw = conv2d_backward_weight(x, dy, w) (the convolution's input dy, its
// output gradient x).
Expected<Grads> gradConvTranspose2d(Emitter& e, Value* g) {
  if (e.in(0)->type().layout == ir::Layout::kNHWC)
    return e.unsupported("channels-last activations (differentiate before layout selection)");
  const ir::AttrMap a = windowAttrs(e, {"strides", "pads", "dilations", "group"});
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kConv2d, {g, e.in(1)}, a));
  KILN_ASSIGN_OR_RETURN(Value * dw, e.op(OpKind::kConv2dBackwardWeight, {e.in(0), g, e.in(1)}, a));
  return Grads{dx, dw};
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
Expected<Grads> gradReduceMax(Emitter& e, Value* g) {
  const auto a = e.attrs();
  KILN_ASSIGN_OR_RETURN(Value * dx,
                        e.op(OpKind::kReduceMaxBackward, {g, e.in(0), e.out()},
                             {{"axes", a.getInts("axes")}, {"keepdims", a.getInt("keepdims")}}));
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

// layer_norm over dims [axis, rank): with xhat = (x - mean) r, r = 1 / sqrt(var + eps) and
// h = g scale, dx = r (h - mean(h) - xhat mean(h xhat)); d scale = sum g xhat, d bias = sum g
// over the leading dims.
Expected<Grads> gradLayerNorm(Emitter& e, Value* g) {
  Value* x = e.in(0);
  const size_t rank = x->type().rank();
  const int64_t axis = e.normAxis(e.attrs().getInt("axis"), rank);
  std::vector<int64_t> axes;
  for (int64_t i = axis; i < static_cast<int64_t>(rank); ++i) axes.push_back(i);
  const ir::AttrMap keep{{"axes", axes}, {"keepdims", int64_t{1}}};
  KILN_ASSIGN_OR_RETURN(Value * mean, e.op(OpKind::kReduceMean, {x}, keep));
  KILN_ASSIGN_OR_RETURN(Value * xc, e.op(OpKind::kSub, {x, mean}));
  KILN_ASSIGN_OR_RETURN(Value * sq, e.op(OpKind::kMul, {xc, xc}));
  KILN_ASSIGN_OR_RETURN(Value * var, e.op(OpKind::kReduceMean, {sq}, keep));
  KILN_ASSIGN_OR_RETURN(Value * eps, e.scalar(x->type().dtype, e.attrs().getFloat("epsilon")));
  KILN_ASSIGN_OR_RETURN(Value * ve, e.op(OpKind::kAdd, {var, eps}));
  KILN_ASSIGN_OR_RETURN(Value * r, e.op(OpKind::kRsqrt, {ve}));
  KILN_ASSIGN_OR_RETURN(Value * xhat, e.op(OpKind::kMul, {xc, r}));
  Value* h = g;
  if (e.node().numInputs() > 1) {
    KILN_ASSIGN_OR_RETURN(h, e.op(OpKind::kMul, {g, e.in(1)}));
  }
  KILN_ASSIGN_OR_RETURN(Value * mh, e.op(OpKind::kReduceMean, {h}, keep));
  KILN_ASSIGN_OR_RETURN(Value * hx, e.op(OpKind::kMul, {h, xhat}));
  KILN_ASSIGN_OR_RETURN(Value * mhx, e.op(OpKind::kReduceMean, {hx}, keep));
  KILN_ASSIGN_OR_RETURN(Value * t1, e.op(OpKind::kSub, {h, mh}));
  KILN_ASSIGN_OR_RETURN(Value * t2, e.op(OpKind::kMul, {xhat, mhx}));
  KILN_ASSIGN_OR_RETURN(Value * t3, e.op(OpKind::kSub, {t1, t2}));
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kMul, {t3, r}));
  Grads out{dx};
  if (e.node().numInputs() > 1) {
    KILN_ASSIGN_OR_RETURN(Value * gx, e.op(OpKind::kMul, {g, xhat}));
    KILN_ASSIGN_OR_RETURN(Value * ds, e.unbroadcast(gx, e.in(1)->type().shape));
    out.push_back(ds);
  }
  if (e.node().numInputs() > 2) {
    KILN_ASSIGN_OR_RETURN(Value * db, e.unbroadcast(g, e.in(2)->type().shape));
    out.push_back(db);
  }
  return out;
}
// Inference-mode batch_norm (fixed statistics): an affine map per channel, y = (x - mean) k +
// bias with k = scale / sqrt(var + eps).
Expected<Grads> gradBatchNorm(Emitter& e, Value* g) {
  Value* x = e.in(0);
  const ir::Shape& xs = x->type().shape;
  const int64_t c = xs[1];
  ir::Shape perChannel{c};
  for (size_t i = 2; i < xs.size(); ++i) perChannel.push_back(1);
  std::vector<int64_t> axes{0};
  for (size_t i = 2; i < xs.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  const ir::AttrMap sum{{"axes", axes}, {"keepdims", int64_t{0}}};
  KILN_ASSIGN_OR_RETURN(Value * eps, e.scalar(x->type().dtype, e.attrs().getFloat("epsilon")));
  KILN_ASSIGN_OR_RETURN(Value * ve, e.op(OpKind::kAdd, {e.in(4), eps}));
  KILN_ASSIGN_OR_RETURN(Value * inv, e.op(OpKind::kRsqrt, {ve}));        // [C]
  KILN_ASSIGN_OR_RETURN(Value * k, e.op(OpKind::kMul, {e.in(1), inv}));  // [C]
  KILN_ASSIGN_OR_RETURN(Value * kc, e.reshape(k, perChannel));
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kMul, {g, kc}));
  KILN_ASSIGN_OR_RETURN(Value * mc, e.reshape(e.in(3), perChannel));
  KILN_ASSIGN_OR_RETURN(Value * xc, e.op(OpKind::kSub, {x, mc}));
  KILN_ASSIGN_OR_RETURN(Value * gxc, e.op(OpKind::kMul, {g, xc}));
  KILN_ASSIGN_OR_RETURN(Value * sgxc, e.op(OpKind::kReduceSum, {gxc}, sum));  // [C]
  KILN_ASSIGN_OR_RETURN(Value * dbias, e.op(OpKind::kReduceSum, {g}, sum));   // [C]
  KILN_ASSIGN_OR_RETURN(Value * dscale, e.op(OpKind::kMul, {sgxc, inv}));
  KILN_ASSIGN_OR_RETURN(Value * nk, e.op(OpKind::kNeg, {k}));
  KILN_ASSIGN_OR_RETURN(Value * dmean, e.op(OpKind::kMul, {dbias, nk}));
  // d var = sum(g xc) scale (-1/2) inv^3
  KILN_ASSIGN_OR_RETURN(Value * inv2, e.op(OpKind::kMul, {inv, inv}));
  KILN_ASSIGN_OR_RETURN(Value * kinv2, e.op(OpKind::kMul, {k, inv2}));
  KILN_ASSIGN_OR_RETURN(Value * t, e.op(OpKind::kMul, {sgxc, kinv2}));
  KILN_ASSIGN_OR_RETURN(Value * dvar, e.mulScalar(t, -0.5));
  return Grads{dx, dscale, dbias, dmean, dvar};
}

// Training-mode BatchNorm: batch_norm_train(x, scale, bias, mean, var) with mean and var from
// batch_norm_stats(x). The gradient of x includes the path through the statistics, so none
// flows to mean and var.
Expected<Grads> gradBatchNormTrain(Emitter& e, Value* g) {
  const ir::AttrMap eps{{"epsilon", e.attrs().getFloat("epsilon")}};
  KILN_ASSIGN_OR_RETURN(
      Value * sums, e.op(OpKind::kBatchNormBackwardReduce, {g, e.in(0), e.in(3), e.in(4)}, eps));
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kBatchNormBackward,
                                         {g, e.in(0), e.in(3), e.in(4), e.in(1), sums}, eps));
  KILN_ASSIGN_OR_RETURN(Value * dscale, e.row(sums, 0));
  KILN_ASSIGN_OR_RETURN(Value * dbias, e.row(sums, 1));
  return Grads{dx, dscale, dbias, nullptr, nullptr};
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
  // softmax(x) - one_hot(target), scaled, in one op (the softmax is recomputed from the logits).
  KILN_ASSIGN_OR_RETURN(
      Value * dx, e.op(OpKind::kCrossEntropyLossBackward, {g, e.in(0), e.in(1)}, lossAttrs(e)));
  return Grads{dx, nullptr};
}

Expected<Grads> gradMseLoss(Emitter& e, Value* g) {  // 2 (x - t) g, / count with mean
  KILN_ASSIGN_OR_RETURN(Value * d, e.op(OpKind::kSub, {e.in(0), e.in(1)}));
  double scale = 2.0;
  if (e.attrs().getString("reduction") == "mean")
    scale /= static_cast<double>(std::max<int64_t>(e.in(0)->type().numElements(), 1));
  KILN_ASSIGN_OR_RETURN(Value * gs, e.mulScalar(g, scale));
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kMul, {d, gs}));
  KILN_ASSIGN_OR_RETURN(Value * dt, e.op(OpKind::kNeg, {dx}));
  return Grads{dx, dt};
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

Expected<Grads> gradGather(Emitter& e, Value* g) {
  KILN_ASSIGN_OR_RETURN(Value * dx, e.op(OpKind::kGatherBackward, {g, e.in(1), e.in(0)},
                                         {{"axis", e.attrs().getInt("axis")}}));
  return Grads{dx, nullptr};
}
// The slice's window, padded back to the input's shape with zeros along each sliced axis.
Expected<Grads> gradSlice(Emitter& e, Value* g) {
  const auto a = e.attrs();
  const ir::Shape& xs = e.in(0)->type().shape;
  const size_t r = xs.size();
  const std::vector<int64_t> starts = a.getInts("starts"), steps = a.getInts("steps");
  std::vector<int64_t> axes = a.getInts("axes");
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  for (int64_t s : steps)
    if (s != 1) return e.unsupported("steps other than 1");
  Value* d = g;
  for (size_t i = 0; i < axes.size(); ++i) {
    const size_t ax = static_cast<size_t>(e.normAxis(axes[i], r));
    const int64_t dim = xs[ax], len = e.out()->type().shape[ax];
    int64_t begin = starts[i] < 0 ? starts[i] + dim : starts[i];
    begin = std::clamp<int64_t>(begin, 0, dim);
    if (len == 0) begin = 0;
    const int64_t after = dim - begin - len;
    std::vector<Value*> parts;
    auto zeros = [&](int64_t n) -> Expected<Value*> {
      ir::Shape zs = d->type().shape;
      zs[ax] = n;
      KILN_ASSIGN_OR_RETURN(Value * z, e.scalar(g->type().dtype, 0.0));
      return e.op(OpKind::kExpand, {z}, {{"shape", zs}});
    };
    if (begin > 0) {
      KILN_ASSIGN_OR_RETURN(Value * z, zeros(begin));
      parts.push_back(z);
    }
    if (len > 0) parts.push_back(d);
    if (after > 0) {
      KILN_ASSIGN_OR_RETURN(Value * z, zeros(after));
      parts.push_back(z);
    }
    if (parts.size() == 1) {
      d = parts[0];
      continue;
    }
    KILN_ASSIGN_OR_RETURN(d, e.op(OpKind::kConcat, parts, {{"axis", static_cast<int64_t>(ax)}}));
  }
  return Grads{d};
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
    set(OpKind::kMish, gradMish);
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
    set(OpKind::kConvTranspose2d, gradConvTranspose2d);
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
    set(OpKind::kMseLoss, gradMseLoss);
    set(OpKind::kAbs, gradAbs);
    set(OpKind::kLeakyRelu, gradLeakyRelu);
    set(OpKind::kClip, gradClip);
    set(OpKind::kGelu, gradGelu);
    set(OpKind::kPow, gradPow);
    set(OpKind::kGemm, gradGemm);
    set(OpKind::kLayerNorm, gradLayerNorm);
    set(OpKind::kBatchNorm, gradBatchNorm);
    set(OpKind::kBatchNormTrain, gradBatchNormTrain);
    set(OpKind::kSlice, gradSlice);
    set(OpKind::kGather, gradGather);
    set(OpKind::kMaximum, gradMaximum);
    set(OpKind::kMinimum, gradMinimum);
    set(OpKind::kReduceMax, gradReduceMax);
    set(OpKind::kDropoutTrain, gradDropoutTrain);
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
