// ONNX pointwise ops onto kiln's: unary and binary arithmetic, activations, Cast, Clip, Where,
// n-ary Max/Min/Sum as chains, comparisons (folded only), Identity and Dropout (aliases), GELU.
#include <limits>

#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_map_util.h"
#include "frontends/onnx/onnx_tensor.h"
#include "ir/narrow.h"

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
  if (base.dtype == ir::DType::kI32 || base.dtype == ir::DType::kI64) {
    // Integer powers through f64 (exact while the result stays below 2^53), the result
    // converted back to the base's type as ONNX's reference does (numpy power, astype).
    const ir::AttrMap wide{{"to", std::string("f64")}};
    KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
    KILN_ASSIGN_OR_RETURN(ir::Value * e, ctx.value(1));
    KILN_ASSIGN_OR_RETURN(ir::Value * xw, ctx.emit(OpKind::kCast, {x}, wide));
    KILN_ASSIGN_OR_RETURN(ir::Value * ew, ctx.emit(OpKind::kCast, {e}, wide));
    KILN_ASSIGN_OR_RETURN(ir::Value * p, ctx.emit(OpKind::kPow, {xw, ew}));
    return ctx.emit(OpKind::kCast, {p}, {{"to", std::string(ir::dtypeName(base.dtype))}}, 0)
        .status();
  }
  if (!ir::isFloat(base.dtype))
    return ctx.unsupported("Pow of " + base.toString() + ": kiln's pow takes floats, i32 and i64");
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
  const ir::TensorData one = filledTensor(t.dtype, {}, 1.0);
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* known, ctx.constant(0));
  if (known && !ctx.inputTrainable(0)) {  // Shape arithmetic: evaluated at import.
    const ir::TensorData* in[] = {&one, known};
    if (Expected<ir::TensorData> r = evaluateOp(OpKind::kDiv, in); r) {
      ctx.setConstantOutput(0, std::move(*r));
      return Status::ok();
    }
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * unit, ctx.constantValue(one));
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  return ctx.emit(OpKind::kDiv, {unit, x}, {}, 0).status();
}

// Cast's and BitCast's `to`, a dtype kiln has.
Expected<ir::DType> castTarget(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t to, ctx.attrInt("to"));
  auto dtype = dtypeFromOnnx(static_cast<int32_t>(to));
  if (!dtype)
    return ctx.unsupported(ctx.opType() + " to " + onnxTypeName(static_cast<int32_t>(to)) +
                           ", which kiln does not support");
  return *dtype;
}

Status mapCast(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::DType dtype, castTarget(ctx));
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  if (t.dtype == dtype) return alias(ctx, 0);
  return emitCast(ctx, dtype);
}

// BitCast (26): kiln's bitcast (same-size dtypes; not to bool from another, nor the 4- and 2-bit
// ones).
Status mapBitCast(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::DType dtype, castTarget(ctx));
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  if (t.dtype == dtype) return alias(ctx, 0);
  // ONNX's rule (the bits' width, as ONNX counts it); what else kiln refuses is its op's reason.
  auto bits = [](ir::DType d) {
    return ir::isNarrow(d) ? ir::narrowFileBits(d) : 8 * static_cast<int>(ir::dtypeSize(d));
  };
  if (bits(t.dtype) != bits(dtype))
    return ctx.invalid("input " + t.toString() + " has " + std::to_string(bits(t.dtype)) +
                       "-bit elements, " + std::string(ir::dtypeName(dtype)) + " " +
                       std::to_string(bits(dtype)) + "-bit ones: BitCast needs equal widths");
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  return ctx.emit(OpKind::kBitcast, {x}, {{"to", std::string(ir::dtypeName(dtype))}}, 0).status();
}

Status mapClip(NodeContext& ctx) {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  if (ctx.version() < 11) {
    // Version 6: min and max are attributes (defaults: the float range's ends).
    KILN_ASSIGN_OR_RETURN(lo, ctx.attrFloat("min", -std::numeric_limits<float>::max()));
    KILN_ASSIGN_OR_RETURN(hi, ctx.attrFloat("max", std::numeric_limits<float>::max()));
  }
  // Version 11 on: min and max are optional scalar inputs.
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
  // Inference, or training with a ratio of 0 (nothing dropped): the identity. A training_mode
  // input (opset 12+) must be a constant.
  if (ctx.hasInput(2)) {
    KILN_ASSIGN_OR_RETURN(double training, ctx.constScalar(2, "training_mode"));
    double ratio = 0.5;
    if (training != 0 && ctx.hasInput(1)) {
      KILN_ASSIGN_OR_RETURN(ratio, ctx.constScalar(1, "ratio"));
    }
    if (training != 0 && ratio != 0)
      return ctx.unsupported(
          "training_mode=true with a ratio above 0 (its mask is random; kiln imports inference "
          "graphs)");
  }
  if (ctx.outputUsed(1)) {
    // At inference nothing is dropped: the mask is all true (bool from version 10, before it
    // ones of the input's type), a constant of x's static shape.
    KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
    ctx.setConstantOutput(
        1, filledTensor(ctx.version() >= 10 ? ir::DType::kBool : t.dtype, t.shape, 1.0));
  }
  return alias(ctx, 0);
}

// Output 0 as `evaluate(a, b)` when inputs 0 and 1 are known at import: true when it folded,
// false when an input is unknown or the evaluator does not handle them (kUnimplemented).
template <class F>
Expected<bool> foldKnownPair(NodeContext& ctx, F evaluate) {
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* a, ctx.constant(0));
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* b, ctx.constant(1));
  if (!a || !b) return false;
  Expected<ir::TensorData> r = evaluate(*a, *b);
  if (!r) {
    if (r.status().code() != ErrorCode::kUnimplemented) return r.status();
    return false;
  }
  ctx.setConstantOutput(0, std::move(*r));
  return true;
}

// Folded at import when both inputs are known (shape arithmetic), else kiln's op; Equal of
// bools is not(xor).
template <Compare kOp, OpKind kKiln>
Status mapCompare(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(bool folded,
                        foldKnownPair(ctx, [](const ir::TensorData& a, const ir::TensorData& b) {
                          return evaluateCompare(kOp, a, b);
                        }));
  if (folded) return Status::ok();
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0, false));
  KILN_ASSIGN_OR_RETURN(ir::Value * y, ctx.value(1, false));
  if (kOp == Compare::kEqual && x->type().dtype == ir::DType::kBool) {
    KILN_ASSIGN_OR_RETURN(ir::Value * ne, ctx.emit(OpKind::kLogicalXor, {x, y}));
    return ctx.emit(OpKind::kLogicalNot, {ne}, {}, 0).status();
  }
  return ctx.emit(kKiln, {x, y}, {}, 0).status();
}

Status mapNot(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* a, ctx.constant(0));
  if (a) {
    KILN_ASSIGN_OR_RETURN(ir::TensorData r, evaluateNot(*a));
    ctx.setConstantOutput(0, std::move(r));
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0, false));
  return ctx.emit(OpKind::kLogicalNot, {x}, {}, 0).status();
}

// A unary op with float attributes, each with its ONNX default.
template <OpKind kOp>
Status mapUnaryWithAttrs(NodeContext& ctx,
                         std::initializer_list<std::pair<const char*, double>> attrs) {
  ir::AttrMap a;
  for (const auto& [name, def] : attrs) {
    KILN_ASSIGN_OR_RETURN(a[name], ctx.attrFloat(name, def));
  }
  return foldOrEmit(ctx, kOp, {0}, std::move(a));
}

// Gelu (opset 20): approximate "none" (erf) or "tanh".
Status mapOnnxGelu(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::string approximate, ctx.attrString("approximate", "none"));
  if (approximate != "none" && approximate != "tanh")
    return ctx.invalid("approximate must be \"none\" or \"tanh\", got \"" + approximate + "\"");
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  if (!ir::isFloat(t.dtype)) return ctx.invalid("Gelu of " + t.toString() + " (it takes floats)");
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  return ctx.emit(OpKind::kGelu, {x}, {{"approximate", approximate}}, 0).status();
}

Status mapMod(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(bool fmod, ctx.attrBool("fmod", false));
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  // Version 28 defines fmod=0 for floats (a - floor(a / b) b, the divisor's sign); before, it
  // was invalid.
  if (ir::isFloat(t.dtype) && !fmod && ctx.version() < 28)
    return ctx.invalid("Mod of " + t.toString() + " needs fmod=1 before version 28");
  if (!(ir::isFloat(t.dtype) && !fmod)) {  // The evaluator has no float fmod=0.
    KILN_ASSIGN_OR_RETURN(
        bool folded, foldKnownPair(ctx, [fmod](const ir::TensorData& a, const ir::TensorData& b) {
          return evaluateMod(a, b, fmod);
        }));
    if (folded) return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0, false));
  KILN_ASSIGN_OR_RETURN(ir::Value * y, ctx.value(1, false));
  return ctx.emit(OpKind::kMod, {x, y}, {{"fmod", int64_t{fmod}}}, 0).status();
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

// Versions: each since_version from opset 7 on (and the one in effect at opset 7), checked
// against the specification. Most later versions only add element types (bfloat16, int8,
// float8, int4, ...), which kiln checks itself; the ones that change behaviour are handled in
// the mapper (Clip 11: min/max became inputs; Dropout 12: ratio and training_mode inputs;
// Cast 19/24: saturate and round_mode only concern float8 types, which kiln refuses).
std::vector<MapperEntry> pointwiseMappers() {
  return {
      {"Neg", {6, 13}, mapUnary<OpKind::kNeg>},
      {"Abs", {6, 13}, mapUnary<OpKind::kAbs>},
      {"Relu", {6, 13, 14}, mapUnary<OpKind::kRelu>},
      {"Sigmoid", {6, 13}, mapUnary<OpKind::kSigmoid>},
      {"Tanh", {6, 13}, mapUnary<OpKind::kTanh>},
      {"Exp", {6, 13}, mapUnary<OpKind::kExp>},
      {"Log", {6, 13}, mapUnary<OpKind::kLog>},
      {"Sqrt", {6, 13}, mapUnary<OpKind::kSqrt>},
      {"Mish", {18, 22}, mapUnary<OpKind::kMish>},
      {"LeakyRelu", {6, 16}, mapLeakyRelu},
      {"Reciprocal", {6, 13}, mapReciprocal},
      {"Gelu", {20}, mapOnnxGelu},
      {"Erf", {9, 13}, mapUnary<OpKind::kErf>},
      {"Floor", {6, 13}, mapUnary<OpKind::kFloor>},
      {"Ceil", {6, 13}, mapUnary<OpKind::kCeil>},
      {"Round", {11, 22}, mapUnary<OpKind::kRound>},
      {"Sign", {9, 13}, mapUnary<OpKind::kSign>},
      {"Sin", {7, 22}, mapUnary<OpKind::kSin>},
      {"Cos", {7, 22}, mapUnary<OpKind::kCos>},
      {"Tan", {7, 22}, mapUnary<OpKind::kTan>},
      {"Asin", {7, 22}, mapUnary<OpKind::kAsin>},
      {"Acos", {7, 22}, mapUnary<OpKind::kAcos>},
      {"Atan", {7, 22}, mapUnary<OpKind::kAtan>},
      {"Sinh", {9, 22}, mapUnary<OpKind::kSinh>},
      {"Cosh", {9, 22}, mapUnary<OpKind::kCosh>},
      {"Asinh", {9, 22}, mapUnary<OpKind::kAsinh>},
      {"Acosh", {9, 22}, mapUnary<OpKind::kAcosh>},
      {"Atanh", {9, 22}, mapUnary<OpKind::kAtanh>},
      {"Softplus", {1, 22}, mapUnary<OpKind::kSoftplus>},
      {"Elu",
       {6, 22},
       [](NodeContext& c) {
         return mapUnaryWithAttrs<OpKind::kElu>(c, {{"alpha", 1.0}});
       }},
      {"Selu",
       {6, 22},
       [](NodeContext& c) {
         return mapUnaryWithAttrs<OpKind::kSelu>(
             c, {{"alpha", 1.67326319217681884765625}, {"gamma", 1.05070102214813232421875}});
       }},
      {"Celu",
       {12, 28},
       [](NodeContext& c) {
         return mapUnaryWithAttrs<OpKind::kCelu>(c, {{"alpha", 1.0}});
       }},
      {"ThresholdedRelu",
       {10, 22},
       [](NodeContext& c) {
         return mapUnaryWithAttrs<OpKind::kThresholdedRelu>(c, {{"alpha", 1.0}});
       }},
      {"Add", {7, 13, 14}, mapBinary<OpKind::kAdd>},
      {"Sub", {7, 13, 14}, mapBinary<OpKind::kSub>},
      {"Mul", {7, 13, 14}, mapBinary<OpKind::kMul>},
      {"Div", {7, 13, 14}, mapBinary<OpKind::kDiv>},
      {"Pow", {7, 12, 13, 15}, mapPow},
      // Version 6 takes same-shape inputs; 8 broadcasts, which kiln's chain does for both.
      {"Max", {6, 8, 12, 13}, mapVariadic<OpKind::kMaximum>},
      {"Min", {6, 8, 12, 13}, mapVariadic<OpKind::kMinimum>},
      {"Sum", {6, 8, 13}, mapVariadic<OpKind::kAdd>},
      {"Where",
       {9, 16},
       [](NodeContext& ctx) {
         return foldOrEmit(ctx, OpKind::kWhere, {0, 1, 2});
       }},
      {"Cast", {6, 9, 13, 19, 21, 23, 24, 25, 28}, mapCast},
      {"BitCast", {26}, mapBitCast},
      {"Clip", {6, 11, 12, 13}, mapClip},
      {"Identity", {1, 13, 14, 16, 19, 21, 23, 24, 25}, mapIdentity},
      {"Dropout", {7, 10, 12, 13, 22}, mapDropout},
      {"Equal", {7, 11, 13, 19}, mapCompare<Compare::kEqual, OpKind::kEqual>},
      {"Less", {7, 9, 13}, mapCompare<Compare::kLess, OpKind::kLess>},
      {"Greater", {7, 9, 13}, mapCompare<Compare::kGreater, OpKind::kGreater>},
      {"LessOrEqual", {12, 16}, mapCompare<Compare::kLessOrEqual, OpKind::kLessEqual>},
      {"GreaterOrEqual", {12, 16}, mapCompare<Compare::kGreaterOrEqual, OpKind::kGreaterEqual>},
      {"And", {7}, mapCompare<Compare::kAnd, OpKind::kLogicalAnd>},
      {"Or", {7}, mapCompare<Compare::kOr, OpKind::kLogicalOr>},
      {"Xor", {7}, mapCompare<Compare::kXor, OpKind::kLogicalXor>},
      {"Not", {1}, mapNot},
      {"Mod", {10, 13, 28}, mapMod},
  };
}

}  // namespace kiln::frontends::onnx_import
