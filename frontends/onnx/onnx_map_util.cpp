#include "frontends/onnx/onnx_map_util.h"

#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_tensor.h"
#include "ir/narrow.h"

namespace kiln::frontends::onnx_import {

Status foldOrEmit(NodeContext& ctx, ir::OpKind op, const std::vector<size_t>& inputs,
                  ir::AttrMap attrs, size_t out) {
  std::vector<const ir::TensorData*> constants;
  for (size_t i : inputs) {
    KILN_ASSIGN_OR_RETURN(const ir::TensorData* c, ctx.constant(i));
    if (!c) break;
    constants.push_back(c);
  }
  if (constants.size() == inputs.size()) {
    auto folded = evaluateOp(op, constants, attrs);
    if (folded) {
      // A weight reshaped or transposed at import stays a weight.
      bool trainable = false;
      for (size_t i : inputs) trainable |= ctx.inputTrainable(i);
      ctx.setConstantOutput(out, std::move(*folded), trainable);
      return Status::ok();
    }
    // kUnimplemented: too large or not evaluated here; kiln computes it at run time instead.
    if (folded.status().code() != ErrorCode::kUnimplemented) return folded.status();
  }
  std::vector<ir::Value*> values;
  for (size_t i : inputs) {
    KILN_ASSIGN_OR_RETURN(ir::Value * v, ctx.value(i));
    values.push_back(v);
  }
  return ctx.emit(op, std::move(values), std::move(attrs), static_cast<int>(out)).status();
}

Status emitCast(NodeContext& ctx, ir::DType to) {
  KILN_ASSIGN_OR_RETURN(bool saturate, ctx.attrBool("saturate", true));
  KILN_ASSIGN_OR_RETURN(std::string round, ctx.attrString("round_mode", "up"));
  if (!ir::parseE8M0Round(round))
    return ctx.invalid("round_mode must be up, down or nearest, got '" + round + "'");
  return foldOrEmit(ctx, ir::OpKind::kCast, {0},
                    {{"to", std::string(ir::dtypeName(to))},
                     {"saturate", int64_t{saturate}},
                     {"round_mode", round}});
}

Expected<ir::Value*> scalarConstant(NodeContext& ctx, ir::DType dtype, double v) {
  return ctx.constantValue(filledTensor(dtype, {}, v));
}

Emitter emitterOf(NodeContext& ctx) {
  return {[&ctx](ir::OpKind op, std::vector<ir::Value*> ins, ir::AttrMap attrs) {
            return ctx.emit(op, std::move(ins), std::move(attrs));
          },
          [&ctx](ir::TensorData d) { return ctx.constantValue(std::move(d)); }};
}

Expected<ir::TensorType> floatInput(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  if (t.dtype != ir::DType::kF32 && t.dtype != ir::DType::kF64)
    return ctx.unsupported(ctx.opType() + " of " + t.toString() +
                           " (kiln composes it for f32 and f64)");
  return t;
}

Status alias(NodeContext& ctx, size_t i, size_t k) {
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* c, ctx.constant(i));
  if (c) {
    ctx.setConstantOutput(k, *c, ctx.inputTrainable(i));
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * v, ctx.value(i));
  ctx.setOutput(k, v);
  return Status::ok();
}

Status requireUnused(NodeContext& ctx, size_t k, const std::string& what) {
  if (ctx.outputUsed(k))
    return ctx.unsupported("output " + std::to_string(k) + " (" + what +
                           ") is used; kiln computes only the inference output");
  return Status::ok();
}

Expected<int> inputRank(NodeContext& ctx, size_t i) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(i));
  return t.rank();
}

Expected<std::optional<std::vector<int64_t>>> reduceAxes(NodeContext& ctx, int inputFrom) {
  std::vector<int64_t> axes;
  if (ctx.version() >= inputFrom) {
    if (ctx.hasInput(1)) {
      KILN_ASSIGN_OR_RETURN(axes, ctx.constInts(1, "axes"));
    }
    KILN_ASSIGN_OR_RETURN(bool noop, ctx.attrBool("noop_with_empty_axes", false));
    if (axes.empty() && noop) return std::optional<std::vector<int64_t>>();
  } else {
    KILN_ASSIGN_OR_RETURN(axes, ctx.attrInts("axes", std::vector<int64_t>{}));
  }
  return std::optional<std::vector<int64_t>>(std::move(axes));
}

Status requireStashType(NodeContext& ctx, ir::DType x) {
  KILN_ASSIGN_OR_RETURN(int64_t stash, ctx.attrInt("stash_type", 1));
  if (dtypeFromOnnx(static_cast<int32_t>(stash)) != x)
    return ctx.unsupported(ctx.opType() + " with stash_type " +
                           onnxTypeName(static_cast<int32_t>(stash)) + " and " +
                           std::string(ir::dtypeName(x)) +
                           " input (kiln computes the statistics in the input's dtype)");
  return Status::ok();
}

}  // namespace kiln::frontends::onnx_import
