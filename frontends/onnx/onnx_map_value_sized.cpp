// ONNX ops whose output size depends on their inputs' values: NonZero, Compress (a gather at
// NonZero's positions of its condition), NonMaxSuppression and Unique. kiln compiles for static
// shapes, so each such node asks for its size at run time (NodeContext::runtimeSize): the model is
// imported in stages, each ending where the next needs a size (onnxStages), and the node is
// imported with it.
#include <string>
#include <vector>

#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_map_util.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::OpKind;

// NonZero (9, 13): i64 [rank, count] of the coordinates of x's non-zero elements.
Status mapNonZero(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t count, ctx.runtimeSize(OpKind::kNonZero, {}, {0}));
  return foldOrEmit(ctx, OpKind::kNonZero, {0}, {{"count", count}});
}

// Compress (9, 11): the slices of input along `axis` (without one: the elements of the flattened
// input) where the bool condition [L] is true; L may be shorter than that dim (the rest are not
// taken). A condition longer than the dim with a true element past it is a run-time error of
// the gather.
Status mapCompress(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType x, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(ir::TensorType cond, ctx.inputType(1));
  if (cond.dtype != ir::DType::kBool || cond.rank() != 1)
    return ctx.invalid("condition must be a 1-D bool tensor, got " + cond.toString());
  KILN_ASSIGN_OR_RETURN(int64_t count, ctx.runtimeSize(OpKind::kNonZero, {}, {1}));
  KILN_ASSIGN_OR_RETURN(ir::Value * c, ctx.value(1));
  KILN_ASSIGN_OR_RETURN(ir::Value * positions, ctx.emit(OpKind::kNonZero, {c}, {{"count", count}}));
  KILN_ASSIGN_OR_RETURN(
      positions, ctx.emit(OpKind::kReshape, {positions},
                          {{"shape", std::vector<int64_t>{count}}, {"allowzero", int64_t{1}}}));
  KILN_ASSIGN_OR_RETURN(ir::Value * data, ctx.value(0));
  int64_t axis = 0;
  if (ctx.hasAttr("axis")) {
    KILN_ASSIGN_OR_RETURN(int64_t a, ctx.attrInt("axis"));
    KILN_ASSIGN_OR_RETURN(int normalized, ir::normalizeAxis(a, x.shape.size(), "axis"));
    axis = normalized;
  } else {
    KILN_ASSIGN_OR_RETURN(data, ctx.emit(OpKind::kReshape, {data},
                                         {{"shape", std::vector<int64_t>{x.numElements()}},
                                          {"allowzero", int64_t{1}}}));
  }
  return ctx.emit(OpKind::kGather, {data, positions}, {{"axis", axis}}, 0).status();
}

// NonMaxSuppression (10, 11): boxes, scores and the optional max_output_boxes_per_class,
// iou_threshold and score_threshold (each one value, read at run time) -> i64 [count, 3].
Status mapNonMaxSuppression(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t cpb, ctx.attrInt("center_point_box", 0));
  if (cpb != 0 && cpb != 1)
    return ctx.invalid("center_point_box must be 0 or 1, got " + std::to_string(cpb));
  ir::AttrMap attrs{{"center_point_box", cpb}};
  std::vector<size_t> given{0, 1};
  const char* flags[] = {"has_max_output", "has_iou_threshold", "has_score_threshold"};
  for (size_t i = 2; i < 5; ++i)
    if (ctx.hasInput(i)) {
      attrs[flags[i - 2]] = int64_t{1};
      given.push_back(i);
    }
  KILN_ASSIGN_OR_RETURN(int64_t count, ctx.runtimeSize(OpKind::kNonMaxSuppression, attrs, given));
  std::vector<ir::Value*> values;
  for (size_t i : given) {
    KILN_ASSIGN_OR_RETURN(ir::Value * v, ctx.value(i, /*trainable=*/false));
    values.push_back(v);
  }
  attrs["count"] = count;
  return ctx.emit(OpKind::kNonMaxSuppression, std::move(values), std::move(attrs), 0).status();
}

// Unique (11, 28): Y and the optional indices, inverse_indices and counts, of the flattened X
// (no `axis`) or of its slices along `axis`. indices is kiln's unique_indices (its count known
// at run time), Y gathers X at them, inverse_indices is unique_inverse, and counts adds a one per
// item at its inverse index.
Status mapUnique(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType x, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(bool sorted, ctx.attrBool("sorted", true));
  ir::AttrMap attrs{{"sorted", int64_t{sorted}}};
  int64_t axis = 0, items = x.numElements();
  if (ctx.hasAttr("axis")) {
    KILN_ASSIGN_OR_RETURN(int64_t a, ctx.attrInt("axis"));
    KILN_ASSIGN_OR_RETURN(int normalized, ir::normalizeAxis(a, x.shape.size(), "axis"));
    axis = normalized;
    items = x.shape[static_cast<size_t>(axis)];
    attrs["axis"] = axis;
    attrs["has_axis"] = int64_t{1};
  }
  KILN_ASSIGN_OR_RETURN(int64_t count, ctx.runtimeSize(OpKind::kUniqueIndices, attrs, {0}));
  KILN_ASSIGN_OR_RETURN(ir::Value * data, ctx.value(0, /*trainable=*/false));
  ir::AttrMap withCount = attrs;
  withCount["count"] = count;
  KILN_ASSIGN_OR_RETURN(ir::Value * first, ctx.emit(OpKind::kUniqueIndices, {data}, withCount,
                                                    ctx.outputUsed(1) ? 1 : -1));
  ir::Value* source = data;
  if (!ctx.hasAttr("axis")) {
    KILN_ASSIGN_OR_RETURN(
        source, ctx.emit(OpKind::kReshape, {data},
                         {{"shape", std::vector<int64_t>{items}}, {"allowzero", int64_t{1}}}));
  }
  KILN_TRY(ctx.emit(OpKind::kGather, {source, first}, {{"axis", axis}}, 0).status());
  if (!ctx.outputUsed(2) && !ctx.outputUsed(3)) return Status::ok();
  KILN_ASSIGN_OR_RETURN(ir::Value * inverse, ctx.emit(OpKind::kUniqueInverse, {data}, attrs,
                                                      ctx.outputUsed(2) ? 2 : -1));
  if (!ctx.outputUsed(3)) return Status::ok();
  // Scalars broadcast at run time: the graph stays small however many items x has.
  auto filled = [&](int64_t n, double value) -> Expected<ir::Value*> {
    KILN_ASSIGN_OR_RETURN(ir::Value * scalar,
                          ctx.constantValue(filledTensor(ir::DType::kI64, {}, value)));
    return ctx.emit(OpKind::kExpand, {scalar}, {{"shape", ir::Shape{n}}});
  };
  KILN_ASSIGN_OR_RETURN(ir::Value * zeros, filled(count, 0));
  KILN_ASSIGN_OR_RETURN(ir::Value * ones, filled(items, 1));
  return ctx
      .emit(OpKind::kScatterElements, {zeros, inverse, ones},
            {{"axis", int64_t{0}}, {"reduction", std::string("add")}}, 3)
      .status();
}

}  // namespace

std::vector<MapperEntry> valueSizedMappers() {
  return {
      {"NonZero", {9, 13}, mapNonZero},
      {"Compress", {9, 11, 28}, mapCompress},
      {"NonMaxSuppression", {10, 11}, mapNonMaxSuppression},
      {"Unique", {11, 28}, mapUnique},
  };
}

}  // namespace kiln::frontends::onnx_import
