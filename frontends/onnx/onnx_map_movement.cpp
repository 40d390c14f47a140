// ONNX data-movement ops onto kiln's: Reshape, Flatten, Transpose, Concat, Slice, Split (as
// slices), Squeeze, Unsqueeze, Expand and Gather. Their shape-like inputs (shape, axes, starts,
// ...) must be known at import; on constant data they are evaluated at import.
#include <algorithm>

#include "frontends/onnx/onnx_map_util.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::OpKind;

Status mapReshape(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(auto shape, ctx.constInts(1, "shape"));
  bool allowZero = false;
  if (ctx.version() >= 14) {
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
  if (ctx.version() < 10) {
    // Version 1: starts, ends and axes are attributes; no steps.
    KILN_ASSIGN_OR_RETURN(attrs["starts"], ctx.attrInts("starts"));
    KILN_ASSIGN_OR_RETURN(attrs["ends"], ctx.attrInts("ends"));
    if (ctx.hasAttr("axes")) {
      KILN_ASSIGN_OR_RETURN(attrs["axes"], ctx.attrInts("axes"));
    }
    return foldOrEmit(ctx, OpKind::kSlice, {0}, std::move(attrs));
  }
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
  if (ctx.version() >= 13 && ctx.hasInput(1)) {
    KILN_ASSIGN_OR_RETURN(sizes, ctx.constInts(1, "split"));
  } else if (ctx.version() < 13) {
    KILN_ASSIGN_OR_RETURN(sizes, ctx.attrInts("split", std::vector<int64_t>{}));
  }
  if (sizes.empty() && ctx.version() >= 18) {
    // Version 18: without split sizes, num_outputs (required then) parts of ceil(dim / n),
    // the last one smaller when the dim does not divide evenly.
    if (!ctx.hasAttr("num_outputs"))
      return ctx.invalid("Split needs the split input or the num_outputs attribute");
    KILN_ASSIGN_OR_RETURN(int64_t parts, ctx.attrInt("num_outputs"));
    if (parts != n)
      return ctx.invalid("num_outputs is " + std::to_string(parts) + " but the node has " +
                         std::to_string(n) + " outputs");
    if (n < 1) return ctx.invalid("num_outputs must be >= 1");
    const int64_t chunk = dim / n + (dim % n != 0);
    for (int64_t k = 0, left = dim; k < n; ++k, left -= chunk)
      sizes.push_back(std::max<int64_t>(0, std::min(chunk, left)));
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
  if (ctx.version() >= 13) {
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
  if (ctx.version() >= 13) {
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

// Versions, checked against the specification (the others only add element types): Reshape
// 14 adds allowzero; Slice 10 moves starts/ends/axes to inputs and adds steps; Split 13 moves
// split to an input and 18 adds num_outputs (uneven last part); Squeeze and Unsqueeze 13 move
// axes to an input.
std::vector<MapperEntry> movementMappers() {
  return {
      {"Reshape", {5, 13, 14, 19, 21, 23, 24, 25}, mapReshape},
      {"Flatten", {1, 9, 11, 13, 21, 23, 24, 25}, mapFlatten},
      {"Transpose", {1, 13, 21, 23, 24, 25}, mapTranspose},
      {"Concat", {4, 11, 13}, mapConcat},
      {"Slice", {1, 10, 11, 13}, mapSlice},
      {"Split", {2, 11, 13, 18}, mapSplit},
      {"Squeeze", {1, 11, 13, 21, 23, 24, 25}, mapSqueeze},
      {"Unsqueeze", {1, 11, 13, 21, 23, 24, 25}, mapUnsqueeze},
      {"Expand", {8, 13}, mapExpand},
      {"Gather", {1, 11, 13}, mapGather},
      {"GatherElements",
       {11, 13},
       [](NodeContext& ctx) {
         KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.attrInt("axis", 0));
         return foldOrEmit(ctx, ir::OpKind::kGatherElements, {0, 1}, {{"axis", axis}});
       }},
  };
}

}  // namespace kiln::frontends::onnx_import
