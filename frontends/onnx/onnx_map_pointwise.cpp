// ONNX pointwise ops onto kiln's: unary and binary arithmetic, activations, Cast, Clip, Where,
// n-ary Max/Min/Sum as chains, comparisons (folded only), Identity and Dropout (aliases), GELU.
#include <limits>

#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_map_util.h"
#include "frontends/onnx/onnx_tensor.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::OpKind;

template <OpKind kOp>
Status mapUnary(NodeContext& ctx) {
  return foldOrEmit(ctx, kOp, {0});
}

template <OpKind kOp>
Status mapBinary(NodeContext& ctx) {
  return foldOrEmit(ctx, kOp, {0, 1});
}

Status mapPow(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType base, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(ir::TensorType exponent, ctx.inputType(1));
  if (!ir::isFloat(base.dtype))
    return ctx.unsupported("Pow of " + base.toString() + ": kiln's pow takes floats");
  if (exponent.dtype == base.dtype) return foldOrEmit(ctx, OpKind::kPow, {0, 1});
  // ONNX lets the exponent have another type (opset 12+); kiln's pow takes one dtype.
  const ir::AttrMap cast{{"to", std::string(ir::dtypeName(base.dtype))}};
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* c, ctx.constant(1));
  ir::Value* e = nullptr;
  if (c) {
    const ir::TensorData* in[] = {c};
    auto folded = evaluateOp(OpKind::kCast, in, cast);
    if (folded) {
      KILN_ASSIGN_OR_RETURN(e, ctx.constantValue(std::move(*folded)));
    }
  }
  if (!e) {
    KILN_ASSIGN_OR_RETURN(ir::Value * raw, ctx.value(1));
    KILN_ASSIGN_OR_RETURN(e, ctx.emit(OpKind::kCast, {raw}, cast));
  }
  return ctx.emit(OpKind::kPow, {x, e}, {}, 0).status();
}

// Max, Min and Sum take one or more inputs: a chain of binary ops.
template <OpKind kOp>
Status mapVariadic(NodeContext& ctx) {
  if (ctx.numInputs() == 1) return alias(ctx, 0);
  if (ctx.allInputsConstant()) {
    std::optional<ir::TensorData> acc;
    bool folded = true;
    for (size_t i = 0; i < ctx.numInputs() && folded; ++i) {
      KILN_ASSIGN_OR_RETURN(const ir::TensorData* c, ctx.constant(i));
      if (!acc) {
        acc = *c;
        continue;
      }
      const ir::TensorData* in[] = {&*acc, c};
      auto r = evaluateOp(kOp, in);
      if (!r && r.status().code() != ErrorCode::kUnimplemented) return r.status();
      folded = r.hasValue();
      if (folded) acc = std::move(*r);
    }
    if (folded) {
      ctx.setConstantOutput(0, std::move(*acc));
      return Status::ok();
    }
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * acc, ctx.value(0));
  for (size_t i = 1; i < ctx.numInputs(); ++i) {
    KILN_ASSIGN_OR_RETURN(ir::Value * v, ctx.value(i));
    const bool last = i + 1 == ctx.numInputs();
    KILN_ASSIGN_OR_RETURN(acc, ctx.emit(kOp, {acc, v}, {}, last ? 0 : -1));
  }
  return Status::ok();
}

Status mapLeakyRelu(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(double alpha, ctx.attrFloat("alpha", 0.01));
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  return ctx.emit(OpKind::kLeakyRelu, {x}, {{"alpha", alpha}}, 0).status();
}

Status mapReciprocal(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  if (!foldableDType(t.dtype) || !ir::isFloat(t.dtype))
    return ctx.unsupported("Reciprocal of " + t.toString() + " (kiln maps f32 and f64)");
  KILN_ASSIGN_OR_RETURN(ir::Value * one, ctx.constantValue(filledTensor(t.dtype, {}, 1.0)));
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  return ctx.emit(OpKind::kDiv, {one, x}, {}, 0).status();
}

Status mapCast(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t to, ctx.attrInt("to"));
  auto dtype = dtypeFromOnnx(static_cast<int32_t>(to));
  if (!dtype)
    return ctx.unsupported("cast to " + onnxTypeName(static_cast<int32_t>(to)) +
                           ", which kiln does not support");
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  if (t.dtype == *dtype) return alias(ctx, 0);
  return foldOrEmit(ctx, OpKind::kCast, {0}, {{"to", std::string(ir::dtypeName(*dtype))}});
}

Status mapClip(NodeContext& ctx) {
  // Opset 11+: min and max are optional scalar inputs (earlier opsets are not imported).
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  if (ctx.hasInput(1)) {
    KILN_ASSIGN_OR_RETURN(lo, ctx.constScalar(1, "min"));
  }
  if (ctx.hasInput(2)) {
    KILN_ASSIGN_OR_RETURN(hi, ctx.constScalar(2, "max"));
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  return ctx.emit(OpKind::kClip, {x}, {{"min", lo}, {"max", hi}}, 0).status();
}

Status mapIdentity(NodeContext& ctx) {
  return alias(ctx, 0);
}

Status mapDropout(NodeContext& ctx) {
  // Inference: the identity. A training_mode input (opset 12+) must be a constant false.
  if (ctx.hasInput(2)) {
    KILN_ASSIGN_OR_RETURN(double training, ctx.constScalar(2, "training_mode"));
    if (training != 0) return ctx.unsupported("training_mode=true (kiln imports inference graphs)");
  }
  KILN_TRY(requireUnused(ctx, 1, "mask"));
  return alias(ctx, 0);
}

template <Compare kOp>
Status mapCompare(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* a, ctx.constant(0));
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* b, ctx.constant(1));
  if (!a || !b)
    return ctx.unsupported("kiln has no comparison or logic ops; they are imported only when " +
                           std::string("their inputs are known at import (shape arithmetic)"));
  KILN_ASSIGN_OR_RETURN(ir::TensorData r, evaluateCompare(kOp, *a, *b));
  ctx.setConstantOutput(0, std::move(r));
  return Status::ok();
}

Status mapNot(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* a, ctx.constant(0));
  if (!a)
    return ctx.unsupported("kiln has no logic ops; Not is imported only when its input is " +
                           std::string("known at import"));
  KILN_ASSIGN_OR_RETURN(ir::TensorData r, evaluateNot(*a));
  ctx.setConstantOutput(0, std::move(r));
  return Status::ok();
}

Status mapMod(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(bool fmod, ctx.attrBool("fmod", false));
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* a, ctx.constant(0));
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* b, ctx.constant(1));
  if (!a || !b)
    return ctx.unsupported("kiln has no remainder op; Mod is imported only when its inputs are " +
                           std::string("known at import (shape arithmetic)"));
  KILN_ASSIGN_OR_RETURN(ir::TensorData r, evaluateMod(*a, *b, fmod));
  ctx.setConstantOutput(0, std::move(r));
  return Status::ok();
}

}  // namespace

Status mapGelu(NodeContext& ctx) {
  if (const std::string* x = ctx.geluInput()) {
    KILN_ASSIGN_OR_RETURN(ir::Value * v, ctx.valueNamed(*x));
    return ctx.emit(OpKind::kGelu, {v}, {}, 0).status();
  }
  // com.microsoft.Gelu: the exact (erf) GELU.
  KILN_ASSIGN_OR_RETURN(ir::Value * v, ctx.value(0));
  return ctx.emit(OpKind::kGelu, {v}, {}, 0).status();
}

std::vector<MapperEntry> pointwiseMappers() {
  return {
      {"Neg", mapUnary<OpKind::kNeg>},
      {"Abs", mapUnary<OpKind::kAbs>},
      {"Relu", mapUnary<OpKind::kRelu>},
      {"Sigmoid", mapUnary<OpKind::kSigmoid>},
      {"Tanh", mapUnary<OpKind::kTanh>},
      {"Exp", mapUnary<OpKind::kExp>},
      {"Log", mapUnary<OpKind::kLog>},
      {"Sqrt", mapUnary<OpKind::kSqrt>},
      {"LeakyRelu", mapLeakyRelu},
      {"Reciprocal", mapReciprocal},
      {"Add", mapBinary<OpKind::kAdd>},
      {"Sub", mapBinary<OpKind::kSub>},
      {"Mul", mapBinary<OpKind::kMul>},
      {"Div", mapBinary<OpKind::kDiv>},
      {"Pow", mapPow},
      {"Max", mapVariadic<OpKind::kMaximum>},
      {"Min", mapVariadic<OpKind::kMinimum>},
      {"Sum", mapVariadic<OpKind::kAdd>},
      {"Where",
       [](NodeContext& ctx) {
         return foldOrEmit(ctx, OpKind::kWhere, {0, 1, 2});
       }},
      {"Cast", mapCast},
      {"Clip", mapClip},
      {"Identity", mapIdentity},
      {"Dropout", mapDropout},
      {"Equal", mapCompare<Compare::kEqual>},
      {"Less", mapCompare<Compare::kLess>},
      {"Greater", mapCompare<Compare::kGreater>},
      {"LessOrEqual", mapCompare<Compare::kLessOrEqual>},
      {"GreaterOrEqual", mapCompare<Compare::kGreaterOrEqual>},
      {"And", mapCompare<Compare::kAnd>},
      {"Or", mapCompare<Compare::kOr>},
      {"Xor", mapCompare<Compare::kXor>},
      {"Not", mapNot},
      {"Mod", mapMod},
  };
}

}  // namespace kiln::frontends::onnx_import
