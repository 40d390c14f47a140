// ONNX data-movement ops onto kiln's: Reshape, Flatten, Transpose, Concat, Slice, Split (as
// slices), Squeeze, Unsqueeze, Expand and Gather. Their shape-like inputs (shape, axes, starts,
// ...) must be known at import; on constant data they are evaluated at import.
#include "frontends/onnx/onnx_map_util.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::OpKind;

Status mapReshape(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(auto shape, ctx.constInts(1, "shape"));
  bool allowZero = false;
  if (ctx.opset() >= 14) {
    KILN_ASSIGN_OR_RETURN(allowZero, ctx.attrBool("allowzero", false));
  }
  return foldOrEmit(ctx, OpKind::kReshape, {0},
                    {{"shape", shape}, {"allowzero", int64_t{allowZero}}});
}

Status mapFlatten(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.attrInt("axis", 1));
  return foldOrEmit(ctx, OpKind::kFlatten, {0}, {{"axis", axis}});
}

Status mapTranspose(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(auto perm, ctx.attrInts("perm", std::vector<int64_t>{}));
  return foldOrEmit(ctx, OpKind::kTranspose, {0}, {{"perm", perm}});
}

Status mapConcat(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.attrInt("axis"));
  std::vector<size_t> inputs;
  for (size_t i = 0; i < ctx.numInputs(); ++i)
    if (ctx.hasInput(i)) inputs.push_back(i);
  return foldOrEmit(ctx, OpKind::kConcat, inputs, {{"axis", axis}});
}

Status mapSlice(NodeContext& ctx) {
  ir::AttrMap attrs;
  KILN_ASSIGN_OR_RETURN(attrs["starts"], ctx.constInts(1, "starts"));
  KILN_ASSIGN_OR_RETURN(attrs["ends"], ctx.constInts(2, "ends"));
  if (ctx.hasInput(3)) {
    KILN_ASSIGN_OR_RETURN(attrs["axes"], ctx.constInts(3, "axes"));
  }
  if (ctx.hasInput(4)) {
    KILN_ASSIGN_OR_RETURN(attrs["steps"], ctx.constInts(4, "steps"));
  }
  return foldOrEmit(ctx, OpKind::kSlice, {0}, std::move(attrs));
}

// Split: one slice per output, along `axis`.
Status mapSplit(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.attrInt("axis", 0));
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(int a, ir::normalizeAxis(axis, xt.shape.size(), "axis"));
  const int64_t dim = xt.shape[static_cast<size_t>(a)];
  const auto n = static_cast<int64_t>(ctx.numOutputs());
  std::vector<int64_t> sizes;
  if (ctx.opset() >= 13 && ctx.hasInput(1)) {
    KILN_ASSIGN_OR_RETURN(sizes, ctx.constInts(1, "split"));
  } else if (ctx.opset() < 13) {
    KILN_ASSIGN_OR_RETURN(sizes, ctx.attrInts("split", std::vector<int64_t>{}));
  }
  if (sizes.empty()) {
    if (dim % n != 0)
      return ctx.invalid("cannot split a dim of " + std::to_string(dim) + " into " +
                         std::to_string(n) + " equal parts");
    sizes.assign(static_cast<size_t>(n), dim / n);
  }
  int64_t total = 0;
  for (int64_t s : sizes)
    if (s < 0 || __builtin_add_overflow(total, s, &total))
      return ctx.invalid("split sizes " + ir::shapeToString(sizes) + " must be >= 0");
  if (static_cast<int64_t>(sizes.size()) != n || total != dim)
    return ctx.invalid("split sizes " + ir::shapeToString(sizes) + " must be " + std::to_string(n) +
                       " sizes adding up to " + std::to_string(dim));
  int64_t start = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    const ir::AttrMap attrs{{"starts", std::vector<int64_t>{start}},
                            {"ends", std::vector<int64_t>{start + sizes[k]}},
                            {"axes", std::vector<int64_t>{a}}};
    start += sizes[k];
    if (ctx.proto().output(static_cast<int>(k)).empty()) continue;
    KILN_TRY(foldOrEmit(ctx, OpKind::kSlice, {0}, attrs, k));
  }
  return Status::ok();
}

Status mapSqueeze(NodeContext& ctx) {
  std::vector<int64_t> axes;
  if (ctx.opset() >= 13) {
    if (ctx.hasInput(1)) {
      KILN_ASSIGN_OR_RETURN(axes, ctx.constInts(1, "axes"));
    }
  } else {
    KILN_ASSIGN_OR_RETURN(axes, ctx.attrInts("axes", std::vector<int64_t>{}));
  }
  return foldOrEmit(ctx, OpKind::kSqueeze, {0}, {{"axes", axes}});
}

Status mapUnsqueeze(NodeContext& ctx) {
  std::vector<int64_t> axes;
  if (ctx.opset() >= 13) {
    KILN_ASSIGN_OR_RETURN(axes, ctx.constInts(1, "axes"));
  } else {
    KILN_ASSIGN_OR_RETURN(axes, ctx.attrInts("axes"));
  }
  return foldOrEmit(ctx, OpKind::kUnsqueeze, {0}, {{"axes", axes}});
}

Status mapExpand(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(auto shape, ctx.constInts(1, "shape"));
  return foldOrEmit(ctx, OpKind::kExpand, {0}, {{"shape", shape}});
}

Status mapGather(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.attrInt("axis", 0));
  return foldOrEmit(ctx, OpKind::kGather, {0, 1}, {{"axis", axis}});
}

}  // namespace

std::vector<MapperEntry> movementMappers() {
  return {
      {"Reshape", mapReshape}, {"Flatten", mapFlatten},     {"Transpose", mapTranspose},
      {"Concat", mapConcat},   {"Slice", mapSlice},         {"Split", mapSplit},
      {"Squeeze", mapSqueeze}, {"Unsqueeze", mapUnsqueeze}, {"Expand", mapExpand},
      {"Gather", mapGather},
  };
}

}  // namespace kiln::frontends::onnx_import
