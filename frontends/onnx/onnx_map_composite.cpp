// ONNX ops that kiln has no op of its own for but composes exactly from its ops: CastLike,
// Trilu (a where with a mask known at import), RMSNormalization, the derived reductions
// (ReduceSumSquare, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp), activations (HardSigmoid,
// HardSwish, Softsign, PRelu, Swish), Mean, and the losses (NegativeLogLikelihoodLoss,
// SoftmaxCrossEntropyLoss) on kiln's nll_loss and log_softmax.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>

#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_map_util.h"
#include "frontends/onnx/onnx_tensor.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::OpKind;

Status mapCastLike(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(ir::TensorType like, ctx.inputType(1));
  if (t.dtype == like.dtype) return alias(ctx, 0);
  return emitCast(ctx, like.dtype);
}

// Trilu: where(mask, x, 0), the mask over the last two dims known at import.
Status mapTrilu(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  if (t.rank() < 2) return ctx.invalid("input " + t.toString() + " must have rank 2 or more");
  KILN_ASSIGN_OR_RETURN(bool upper, ctx.attrBool("upper", true));
  const int64_t n = t.shape[t.shape.size() - 2], m = t.shape.back();
  int64_t k = 0;
  if (ctx.hasInput(1)) {
    KILN_ASSIGN_OR_RETURN(auto ks, ctx.constInts(1, "k"));
    if (ks.size() != 1) return ctx.invalid("k must hold one value, got " + ir::shapeToString(ks));
    // Diagonals beyond the matrix select all or nothing; clamping keeps j - i from overflowing.
    k = std::clamp<int64_t>(ks[0], -n - 1, m + 1);
  }
  ir::TensorData mask(ir::DType::kBool, {n, m});
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j)
      mask.as<uint8_t>()[i * m + j] = upper ? (j - i >= k) : (j - i <= k);
  KILN_ASSIGN_OR_RETURN(ir::Value * maskValue, ctx.constantValue(std::move(mask)));
  ir::TensorData zero(t.dtype, {});
  std::memset(zero.as<std::byte>(), 0, ir::dtypeSize(t.dtype));  // Zero in every dtype.
  KILN_ASSIGN_OR_RETURN(ir::Value * zeroValue, ctx.constantValue(std::move(zero)));
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  return ctx.emit(OpKind::kWhere, {maskValue, x, zeroValue}, {}, 0).status();
}

// The axes [axis, rank) of a normalization.
Expected<std::vector<int64_t>> trailingAxes(NodeContext& ctx, const ir::TensorType& t) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.attrInt("axis", -1));
  KILN_ASSIGN_OR_RETURN(int a, ir::normalizeAxis(axis, t.shape.size(), "axis"));
  std::vector<int64_t> axes;
  for (int d = a; d < t.rank(); ++d) axes.push_back(d);
  return axes;
}

// RMSNormalization (23): x / sqrt(mean(x^2 over [axis, rank)) + epsilon) * scale, computed in
// x's dtype, which stash_type must name.
Status mapRmsNorm(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatInput(ctx));
  KILN_TRY(requireStashType(ctx, t.dtype));
  KILN_ASSIGN_OR_RETURN(auto axes, trailingAxes(ctx, t));
  KILN_ASSIGN_OR_RETURN(double eps, ctx.attrFloat("epsilon", 1e-5));
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(ir::Value * scale, ctx.value(1));
  KILN_ASSIGN_OR_RETURN(ir::Value * sq, ctx.emit(OpKind::kMul, {x, x}));
  KILN_ASSIGN_OR_RETURN(ir::Value * ms, ctx.emit(OpKind::kReduceMean, {sq},
                                                 {{"axes", axes}, {"keepdims", int64_t{1}}}));
  KILN_ASSIGN_OR_RETURN(ir::Value * e, scalarConstant(ctx, t.dtype, eps));
  KILN_ASSIGN_OR_RETURN(ir::Value * d, ctx.emit(OpKind::kAdd, {ms, e}));
  KILN_ASSIGN_OR_RETURN(ir::Value * r, ctx.emit(OpKind::kRsqrt, {d}));
  KILN_ASSIGN_OR_RETURN(ir::Value * y, ctx.emit(OpKind::kMul, {x, r}));
  return ctx.emit(OpKind::kMul, {y, scale}, {}, 0).status();
}

enum class Derived { kSumSquare, kL1, kL2, kLogSum, kLogSumExp };

// The reductions ONNX derives from a sum: composed from reduce_sum (and reduce_max for a stable
// log-sum-exp) over kiln's pointwise ops.
template <Derived kKind>
Status mapDerivedReduce(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(bool keepdims, ctx.attrBool("keepdims", true));
  KILN_ASSIGN_OR_RETURN(auto maybeAxes, reduceAxes(ctx, 18));
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  if (!maybeAxes) {
    // The identity reduction still applies the element function (ONNX's reference does).
    switch (kKind) {
      case Derived::kSumSquare:
        return ctx.emit(OpKind::kMul, {x, x}, {}, 0).status();
      case Derived::kL1:
      case Derived::kL2:
        return ctx.emit(OpKind::kAbs, {x}, {}, 0).status();
      case Derived::kLogSum:
        return ctx.emit(OpKind::kLog, {x}, {}, 0).status();
      case Derived::kLogSumExp:
        return alias(ctx, 0);
    }
  }
  const ir::AttrMap keep{{"axes", *maybeAxes}, {"keepdims", int64_t{1}}};
  const ir::AttrMap attrs{{"axes", *maybeAxes}, {"keepdims", int64_t{keepdims}}};
  switch (kKind) {
    case Derived::kSumSquare: {
      KILN_ASSIGN_OR_RETURN(ir::Value * sq, ctx.emit(OpKind::kMul, {x, x}));
      return ctx.emit(OpKind::kReduceSum, {sq}, attrs, 0).status();
    }
    case Derived::kL1: {
      KILN_ASSIGN_OR_RETURN(ir::Value * a, ctx.emit(OpKind::kAbs, {x}));
      return ctx.emit(OpKind::kReduceSum, {a}, attrs, 0).status();
    }
    case Derived::kL2: {
      if (!ir::isFloat(t.dtype))
        return ctx.unsupported("ReduceL2 of " + t.toString() + " (kiln's sqrt takes floats)");
      KILN_ASSIGN_OR_RETURN(ir::Value * sq, ctx.emit(OpKind::kMul, {x, x}));
      KILN_ASSIGN_OR_RETURN(ir::Value * s, ctx.emit(OpKind::kReduceSum, {sq}, attrs));
      return ctx.emit(OpKind::kSqrt, {s}, {}, 0).status();
    }
    case Derived::kLogSum: {
      KILN_ASSIGN_OR_RETURN(ir::Value * s, ctx.emit(OpKind::kReduceSum, {x}, attrs));
      return ctx.emit(OpKind::kLog, {s}, {}, 0).status();
    }
    case Derived::kLogSumExp: {
      // max + log(sum(exp(x - max))), the max kept finite so that -inf rows stay -inf.
      KILN_ASSIGN_OR_RETURN(ir::TensorType ft, floatInput(ctx));
      KILN_ASSIGN_OR_RETURN(ir::Value * m, ctx.emit(OpKind::kReduceMax, {x}, keep));
      KILN_ASSIGN_OR_RETURN(ir::Value * lo,
                            scalarConstant(ctx, ft.dtype, -std::numeric_limits<double>::max()));
      KILN_ASSIGN_OR_RETURN(ir::Value * hi,
                            scalarConstant(ctx, ft.dtype, std::numeric_limits<double>::max()));
      KILN_ASSIGN_OR_RETURN(ir::Value * mc, ctx.emit(OpKind::kMaximum, {m, lo}));
      KILN_ASSIGN_OR_RETURN(mc, ctx.emit(OpKind::kMinimum, {mc, hi}));
      KILN_ASSIGN_OR_RETURN(ir::Value * d, ctx.emit(OpKind::kSub, {x, mc}));
      KILN_ASSIGN_OR_RETURN(ir::Value * e, ctx.emit(OpKind::kExp, {d}));
      KILN_ASSIGN_OR_RETURN(ir::Value * s, ctx.emit(OpKind::kReduceSum, {e}, keep));
      KILN_ASSIGN_OR_RETURN(ir::Value * l, ctx.emit(OpKind::kLog, {s}));
      if (keepdims) return ctx.emit(OpKind::kAdd, {l, mc}, {}, 0).status();
      // Without keepdims: the kept-dims result reshaped without the reduced dims.
      std::vector<bool> reduced(t.shape.size(), maybeAxes->empty());
      for (int64_t ax : *maybeAxes) {
        KILN_ASSIGN_OR_RETURN(int a, ir::normalizeAxis(ax, t.shape.size(), "axes"));
        reduced[static_cast<size_t>(a)] = true;
      }
      ir::Shape shape;
      for (size_t d = 0; d < t.shape.size(); ++d)
        if (!reduced[d]) shape.push_back(t.shape[d]);
      KILN_ASSIGN_OR_RETURN(ir::Value * y, ctx.emit(OpKind::kAdd, {l, mc}));
      return ctx.emit(OpKind::kReshape, {y}, {{"shape", shape}, {"allowzero", int64_t{1}}}, 0)
          .status();
    }
  }
  return internalError("unhandled reduction");
}

// HardSigmoid: clip(alpha x + beta, 0, 1); HardSwish: x HardSigmoid(x) with 1/6 and 1/2.
Expected<ir::Value*> hardSigmoid(NodeContext& ctx, ir::Value* x, ir::DType dtype, double alpha,
                                 double beta, int output) {
  KILN_ASSIGN_OR_RETURN(ir::Value * a, scalarConstant(ctx, dtype, alpha));
  KILN_ASSIGN_OR_RETURN(ir::Value * b, scalarConstant(ctx, dtype, beta));
  KILN_ASSIGN_OR_RETURN(ir::Value * ax, ctx.emit(OpKind::kMul, {x, a}));
  KILN_ASSIGN_OR_RETURN(ir::Value * axb, ctx.emit(OpKind::kAdd, {ax, b}));
  return ctx.emit(OpKind::kClip, {axb}, {{"min", 0.0}, {"max", 1.0}}, output);
}

Status mapHardSigmoid(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatInput(ctx));
  KILN_ASSIGN_OR_RETURN(double alpha, ctx.attrFloat("alpha", 0.2));
  KILN_ASSIGN_OR_RETURN(double beta, ctx.attrFloat("beta", 0.5));
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  return hardSigmoid(ctx, x, t.dtype, alpha, beta, 0).status();
}

Status mapHardSwish(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatInput(ctx));
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(ir::Value * h, hardSigmoid(ctx, x, t.dtype, 1.0 / 6.0, 0.5, -1));
  return ctx.emit(OpKind::kMul, {x, h}, {}, 0).status();
}

// Softsign: x / (1 + |x|).
Status mapSoftsign(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatInput(ctx));
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(ir::Value * one, scalarConstant(ctx, t.dtype, 1.0));
  KILN_ASSIGN_OR_RETURN(ir::Value * a, ctx.emit(OpKind::kAbs, {x}));
  KILN_ASSIGN_OR_RETURN(ir::Value * d, ctx.emit(OpKind::kAdd, {one, a}));
  return ctx.emit(OpKind::kDiv, {x, d}, {}, 0).status();
}

// PRelu: x < 0 ? slope x : x (slope broadcasts to x).
Status mapPRelu(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatInput(ctx));
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(ir::Value * slope, ctx.value(1));
  if (slope->type().dtype != t.dtype)
    return ctx.invalid("slope " + slope->type().toString() + " must have the input's dtype");
  KILN_ASSIGN_OR_RETURN(ir::Value * zero, scalarConstant(ctx, t.dtype, 0.0));
  KILN_ASSIGN_OR_RETURN(ir::Value * negative, ctx.emit(OpKind::kLess, {x, zero}));
  KILN_ASSIGN_OR_RETURN(ir::Value * sx, ctx.emit(OpKind::kMul, {slope, x}));
  KILN_ASSIGN_OR_RETURN(ir::Value * y, ctx.emit(OpKind::kWhere, {negative, sx, x}));
  if (y->type().shape != t.shape)
    return ctx.invalid("slope " + slope->type().toString() + " must broadcast to the input " +
                       t.toString());
  ctx.setOutput(0, y);
  return Status::ok();
}

// x sigmoid(alpha x): silu when alpha is 1. Any float type (silu, mul and sigmoid take halves,
// each rounding its result once).
Expected<ir::Value*> swish(NodeContext& ctx, ir::Value* x, double alpha, int output) {
  if (alpha == 1.0) return ctx.emit(OpKind::kSilu, {x}, {}, output);
  KILN_ASSIGN_OR_RETURN(ir::Value * a, scalarConstant(ctx, x->type().dtype, alpha));
  KILN_ASSIGN_OR_RETURN(ir::Value * ax, ctx.emit(OpKind::kMul, {x, a}));
  KILN_ASSIGN_OR_RETURN(ir::Value * s, ctx.emit(OpKind::kSigmoid, {ax}));
  return ctx.emit(OpKind::kMul, {x, s}, {}, output);
}

Expected<ir::TensorType> anyFloatInput(NodeContext& ctx, size_t i) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(i));
  if (!ir::isFloat(t.dtype))
    return ctx.unsupported(ctx.opType() + " of " + t.toString() + " (floats only)");
  return t;
}

// Swish (24): x sigmoid(alpha x).
Status mapSwish(NodeContext& ctx) {
  KILN_TRY(anyFloatInput(ctx, 0).status());
  KILN_ASSIGN_OR_RETURN(double alpha, ctx.attrFloat("alpha", 1.0));
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  return swish(ctx, x, alpha, 0).status();
}

// SwiGLU (28): Swish_alpha(A) * B, A and B of one shape and type (no broadcasting).
Status mapSwiGlu(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType a, anyFloatInput(ctx, 0));
  KILN_ASSIGN_OR_RETURN(ir::TensorType b, ctx.inputType(1));
  if (a != b)
    return ctx.invalid("A " + a.toString() + " and B " + b.toString() +
                       " must have one shape and type (SwiGLU does not broadcast)");
  KILN_ASSIGN_OR_RETURN(double alpha, ctx.attrFloat("alpha", 1.0));
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(ir::Value * v, ctx.value(1));
  KILN_ASSIGN_OR_RETURN(ir::Value * gate, swish(ctx, x, alpha, -1));
  return ctx.emit(OpKind::kMul, {gate, v}, {}, 0).status();
}

// Mean: the sum of the inputs (broadcast) divided by their count.
Status mapMean(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatInput(ctx));
  KILN_ASSIGN_OR_RETURN(ir::Value * acc, ctx.value(0));
  if (ctx.numInputs() == 1) return alias(ctx, 0);
  for (size_t i = 1; i < ctx.numInputs(); ++i) {
    KILN_ASSIGN_OR_RETURN(ir::Value * v, ctx.value(i));
    KILN_ASSIGN_OR_RETURN(acc, ctx.emit(OpKind::kAdd, {acc, v}));
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * n,
                        scalarConstant(ctx, t.dtype, static_cast<double>(ctx.numInputs())));
  return ctx.emit(OpKind::kDiv, {acc, n}, {}, 0).status();
}

struct LossAttrs {
  std::string reduction;
  std::optional<int64_t> ignore;
};

Expected<LossAttrs> lossAttrs(NodeContext& ctx) {
  LossAttrs a;
  KILN_ASSIGN_OR_RETURN(a.reduction, ctx.attrString("reduction", "mean"));
  if (a.reduction != "mean" && a.reduction != "sum" && a.reduction != "none")
    return ctx.invalid("reduction must be mean, sum or none, got '" + a.reduction + "'");
  if (ctx.hasAttr("ignore_index")) {
    KILN_ASSIGN_OR_RETURN(int64_t v, ctx.attrInt("ignore_index"));
    a.ignore = v;
  }
  return a;
}

// The negative log-likelihood of `logp` (log-probabilities [N, C, ...]) at input 1's targets,
// with ONNX's class weights (input 2) when given: each element's loss times its target class's
// weight, a mean dividing by the sum of those weights. Ignored targets weigh 0. Without
// ignore_index nothing is ignored (kiln's nll_loss then ignores the smallest int64, which no
// class index equals).
Status emitNll(NodeContext& ctx, ir::Value* logp, const LossAttrs& a) {
  KILN_ASSIGN_OR_RETURN(ir::Value * target, ctx.value(1, /*trainable=*/false));
  const int64_t ignore = a.ignore.value_or(std::numeric_limits<int64_t>::min());
  if (!ctx.hasInput(2))
    return ctx
        .emit(OpKind::kNllLoss, {logp, target},
              {{"reduction", a.reduction}, {"ignore_index", ignore}}, 0)
        .status();
  KILN_ASSIGN_OR_RETURN(ir::Value * weight, ctx.value(2, /*trainable=*/false));
  const ir::Shape& xs = logp->type().shape;
  if (xs.size() < 2 || weight->type().shape != ir::Shape{xs[1]})
    return ctx.invalid("weight " + weight->type().toString() + " must be [C] for input " +
                       logp->type().toString());
  ir::Value* safeTarget = target;
  ir::Value* keep = nullptr;
  if (a.ignore) {
    // Ignored targets may be out of the weights' range: gather at class 0 and zero them. The
    // comparison is in i64, as nll_loss compares (an i32 target is widened, not the index cut).
    KILN_ASSIGN_OR_RETURN(ir::Value * ig, ctx.constantValue(intTensor({ignore}, {})));
    ir::Value* wide = target;
    if (target->type().dtype != ir::DType::kI64) {
      KILN_ASSIGN_OR_RETURN(wide, ctx.emit(OpKind::kCast, {target}, {{"to", std::string("i64")}}));
    }
    KILN_ASSIGN_OR_RETURN(ir::Value * isIgnored, ctx.emit(OpKind::kEqual, {wide, ig}));
    KILN_ASSIGN_OR_RETURN(keep, ctx.emit(OpKind::kLogicalNot, {isIgnored}));
    ir::TensorData zeroIndex(target->type().dtype, {});
    std::memset(zeroIndex.as<std::byte>(), 0, ir::dtypeSize(target->type().dtype));
    KILN_ASSIGN_OR_RETURN(ir::Value * z, ctx.constantValue(std::move(zeroIndex)));
    KILN_ASSIGN_OR_RETURN(safeTarget, ctx.emit(OpKind::kWhere, {keep, target, z}));
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * w,
                        ctx.emit(OpKind::kGather, {weight, safeTarget}, {{"axis", int64_t{0}}}));
  if (keep) {
    KILN_ASSIGN_OR_RETURN(ir::Value * zero, scalarConstant(ctx, w->type().dtype, 0.0));
    KILN_ASSIGN_OR_RETURN(w, ctx.emit(OpKind::kWhere, {keep, w, zero}));
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * l,
                        ctx.emit(OpKind::kNllLoss, {logp, target},
                                 {{"reduction", std::string("none")}, {"ignore_index", ignore}}));
  const bool last = a.reduction == "none";
  KILN_ASSIGN_OR_RETURN(ir::Value * lw, ctx.emit(OpKind::kMul, {l, w}, {}, last ? 0 : -1));
  if (last) return Status::ok();
  const ir::AttrMap all{{"axes", std::vector<int64_t>{}}, {"keepdims", int64_t{0}}};
  if (a.reduction == "sum") return ctx.emit(OpKind::kReduceSum, {lw}, all, 0).status();
  KILN_ASSIGN_OR_RETURN(ir::Value * num, ctx.emit(OpKind::kReduceSum, {lw}, all));
  KILN_ASSIGN_OR_RETURN(ir::Value * den, ctx.emit(OpKind::kReduceSum, {w}, all));
  return ctx.emit(OpKind::kDiv, {num, den}, {}, 0).status();
}

Status mapNllLoss(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(LossAttrs a, lossAttrs(ctx));
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  return emitNll(ctx, x, a);
}

// SoftmaxCrossEntropyLoss: log_softmax over dim 1 (output 1, log_prob), then the NLL.
Status mapSoftmaxCrossEntropy(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(LossAttrs a, lossAttrs(ctx));
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(ir::Value * logp, ctx.emit(OpKind::kLogSoftmax, {x}, {{"axis", int64_t{1}}},
                                                   ctx.outputUsed(1) ? 1 : -1));
  return emitNll(ctx, logp, a);
}

}  // namespace

// Versions: every since_version from opset 7 on; the later ones only add element types, except
// Reduce*'s axes input (18), handled as in the Reduce ops.
std::vector<MapperEntry> compositeMappers() {
  return {
      {"CastLike", {15, 19, 21, 23, 24, 25}, mapCastLike},
      {"Trilu", {14}, mapTrilu},
      {"RMSNormalization", {23}, mapRmsNorm},
      {"ReduceSumSquare", {1, 11, 13, 18}, mapDerivedReduce<Derived::kSumSquare>},
      {"ReduceL1", {1, 11, 13, 18}, mapDerivedReduce<Derived::kL1>},
      {"ReduceL2", {1, 11, 13, 18}, mapDerivedReduce<Derived::kL2>},
      {"ReduceLogSum", {1, 11, 13, 18, 28}, mapDerivedReduce<Derived::kLogSum>},
      {"ReduceLogSumExp", {1, 11, 13, 18, 28}, mapDerivedReduce<Derived::kLogSumExp>},
      {"HardSigmoid", {6, 22}, mapHardSigmoid},
      {"HardSwish", {14, 22}, mapHardSwish},
      {"Softsign", {1, 22}, mapSoftsign},
      {"PRelu", {7, 9, 16}, mapPRelu},
      {"Swish", {24}, mapSwish},
      {"SwiGLU", {28}, mapSwiGlu},
      {"Mean", {6, 8, 13}, mapMean},
      {"NegativeLogLikelihoodLoss", {12, 13, 22}, mapNllLoss},
      {"SoftmaxCrossEntropyLoss", {12, 13}, mapSoftmaxCrossEntropy},
  };
}

}  // namespace kiln::frontends::onnx_import
