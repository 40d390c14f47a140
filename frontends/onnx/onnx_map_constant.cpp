// ONNX ops whose results are known at import once shapes are static: Constant, Shape, Size,
// ConstantOfShape and Range. They become constants (parameters where kiln ops read them). And
// OptionalHasElement and OptionalGetElement, of the values kiln has: kiln imports no optional
// types (no Optional node, no optional graph input), so a present input is a tensor.
#include <cmath>
#include <cstring>

#include "frontends/file_io.h"
#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_map_util.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::DType;
using ir::OpKind;

Status mapConstant(NodeContext& ctx) {
  if (ctx.hasAttr("value")) {
    KILN_ASSIGN_OR_RETURN(ir::TensorData t, ctx.attrTensor("value"));
    ctx.setConstantOutput(0, std::move(t));
  } else if (ctx.hasAttr("value_float")) {
    KILN_ASSIGN_OR_RETURN(double v, ctx.attrFloat("value_float"));
    ctx.setConstantOutput(0, filledTensor(DType::kF32, {}, v));
  } else if (ctx.hasAttr("value_floats")) {
    KILN_ASSIGN_OR_RETURN(auto v, ctx.attrFloats("value_floats"));
    ir::TensorData t(DType::kF32, {static_cast<int64_t>(v.size())});
    for (size_t i = 0; i < v.size(); ++i) t.as<float>()[i] = static_cast<float>(v[i]);
    ctx.setConstantOutput(0, std::move(t));
  } else if (ctx.hasAttr("value_int")) {
    KILN_ASSIGN_OR_RETURN(int64_t v, ctx.attrInt("value_int"));
    ctx.setConstantOutput(0, intTensor({v}, {}));
  } else if (ctx.hasAttr("value_ints")) {
    KILN_ASSIGN_OR_RETURN(auto v, ctx.attrInts("value_ints"));
    ctx.setConstantOutput(0, int1d(v));
  } else {
    return ctx.unsupported("a Constant of strings or a sparse tensor (kiln has neither)");
  }
  return Status::ok();
}

Status mapShape(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  const auto rank = static_cast<int64_t>(t.shape.size());
  int64_t start = 0, end = rank;
  if (ctx.version() >= 15) {
    KILN_ASSIGN_OR_RETURN(start, ctx.attrInt("start", 0));
    KILN_ASSIGN_OR_RETURN(end, ctx.attrInt("end", rank));
  }
  // Negative bounds count from the end; both clamp to [0, rank].
  auto clampAxis = [&](int64_t a) { return std::clamp<int64_t>(a < 0 ? a + rank : a, 0, rank); };
  start = clampAxis(start);
  end = std::max(start, clampAxis(end));
  ctx.setConstantOutput(
      0, int1d(std::vector<int64_t>(t.shape.begin() + start, t.shape.begin() + end)));
  return Status::ok();
}

Status mapSize(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  ctx.setConstantOutput(0, intTensor({t.numElements()}, {}));
  return Status::ok();
}

Status mapConstantOfShape(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(auto shape, ctx.constInts(0, "shape"));
  std::vector<uint64_t> dims;
  for (int64_t d : shape) {
    if (d < 0) return ctx.invalid("shape " + ir::shapeToString(shape) + " has a negative dim");
    dims.push_back(static_cast<uint64_t>(d));
  }
  ir::TensorData value = filledTensor(DType::kF32, {1}, 0.0);
  if (ctx.hasAttr("value")) {
    KILN_ASSIGN_OR_RETURN(value, ctx.attrTensor("value"));
    if (value.numElements() != 1)
      return ctx.invalid("attribute 'value' must hold one element, got " + value.type().toString());
  }
  if (!checkedByteSize(dims, ir::dtypeSize(value.dtype())))
    return ctx.invalid("shape " + ir::shapeToString(shape) + " is too large");
  const int64_t n = ir::numElements(shape);
  if (n > kMaxFoldElements) {
    // Too large to hold at import: kiln broadcasts the one value at run time.
    KILN_ASSIGN_OR_RETURN(ir::Value * scalar, ctx.constantValue(withShape(value, {})));
    return ctx.emit(OpKind::kExpand, {scalar}, {{"shape", shape}}, 0).status();
  }
  ir::TensorData out(value.dtype(), shape);
  const size_t es = ir::dtypeSize(value.dtype());
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(out.data() + static_cast<size_t>(i) * es, value.data(), es);
  ctx.setConstantOutput(0, std::move(out));
  return Status::ok();
}

Status mapRange(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* start, ctx.requireConstant(0));
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* limit, ctx.requireConstant(1));
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* delta, ctx.requireConstant(2));
  if (!start || !limit || !delta)
    return ctx.unsupported("start, limit and delta must be known at import (kiln has no range op)");
  const DType dtype = start->dtype();
  const bool half = dtype == DType::kF16 || dtype == DType::kBF16;  // Version 27 on.
  for (const ir::TensorData* t : {start, limit, delta})
    if (t->numElements() != 1 || t->dtype() != dtype || (!foldableDType(dtype) && !half))
      return ctx.invalid("start, limit and delta must be scalars of one type, got " +
                         t->type().toString());
  int64_t n = 0;
  if (half) {
    // Computed in stash_type (FLOAT by default, or DOUBLE) as NumPy's arange fills it, the step
    // taken as the difference of the first two values, then rounded to the half type.
    KILN_ASSIGN_OR_RETURN(int64_t stash, ctx.attrInt("stash_type", 1));
    if (stash != 1 && stash != 11)
      return ctx.invalid("stash_type must be FLOAT (1) or DOUBLE (11), got " +
                         std::to_string(stash));
    const double s = elementAsDouble(*start, 0), l = elementAsDouble(*limit, 0),
                 d = elementAsDouble(*delta, 0);
    const double count = std::ceil((l - s) / d);
    if (d == 0 || !std::isfinite(count))
      return ctx.invalid("Range with delta " + std::to_string(d) + " has no finite length");
    if (count > static_cast<double>(kMaxFoldElements))
      return ctx.unsupported("Range of " + std::to_string(count) + " elements is too large");
    n = std::max<int64_t>(0, static_cast<int64_t>(count));
    ir::TensorData out(dtype, {n});
    const float s32 = static_cast<float>(s), step32 = static_cast<float>(s + d) - s32;
    const double step64 = (s + d) - s;
    for (int64_t i = 0; i < n; ++i) {
      const double v = stash == 1 ? static_cast<double>(s32 + static_cast<float>(i) * step32)
                                  : s + static_cast<double>(i) * step64;
      const ir::TensorData e = ir::TensorData::scalar(dtype, v);  // Rounds to the half type.
      std::memcpy(out.data() + static_cast<size_t>(i) * 2, e.data(), 2);
    }
    ctx.setConstantOutput(0, std::move(out));
    return Status::ok();
  }
  if (ir::isFloat(dtype)) {
    const double s = elementAsDouble(*start, 0), l = elementAsDouble(*limit, 0),
                 d = elementAsDouble(*delta, 0);
    const double count = std::ceil((l - s) / d);
    if (d == 0 || !std::isfinite(count))
      return ctx.invalid("Range with start " + std::to_string(s) + ", limit " + std::to_string(l) +
                         " and delta " + std::to_string(d) + " has no finite length");
    if (count > static_cast<double>(kMaxFoldElements))
      return ctx.unsupported("Range of " + std::to_string(count) + " elements is too large");
    n = std::max<int64_t>(0, static_cast<int64_t>(count));
    ir::TensorData out = filledTensor(dtype, {n}, 0);
    for (int64_t i = 0; i < n; ++i) {
      ir::TensorData v = filledTensor(dtype, {}, s + static_cast<double>(i) * d);
      std::memcpy(out.data() + static_cast<size_t>(i) * ir::dtypeSize(dtype), v.data(),
                  ir::dtypeSize(dtype));
    }
    ctx.setConstantOutput(0, std::move(out));
    return Status::ok();
  }
  const int64_t s = elementAsInt(*start, 0), l = elementAsInt(*limit, 0),
                d = elementAsInt(*delta, 0);
  if (d == 0) return ctx.invalid("Range with delta 0");
  // ceil((l - s) / d) in 128 bits, so that no input overflows.
  const __int128 span = static_cast<__int128>(l) - s;
  __int128 count = span / d + ((span % d != 0) && ((span > 0) == (d > 0)));
  if (count > kMaxFoldElements)
    return ctx.unsupported("Range of " + std::to_string(static_cast<int64_t>(count)) +
                           " elements is too large");
  n = count > 0 ? static_cast<int64_t>(count) : 0;
  std::vector<int64_t> values(static_cast<size_t>(n));
  // Every element lies between start and limit, so it fits even where i * d alone would not.
  for (int64_t i = 0; i < n; ++i)
    values[static_cast<size_t>(i)] = static_cast<int64_t>(s + static_cast<__int128>(i) * d);
  const ir::TensorData all = int1d(values);
  const ir::TensorData* in[] = {&all};
  KILN_ASSIGN_OR_RETURN(ir::TensorData out,
                        evaluateOp(OpKind::kCast, in, {{"to", std::string(ir::dtypeName(dtype))}}));
  ctx.setConstantOutput(0, std::move(out));
  return Status::ok();
}

// OptionalHasElement (15, 18): true for a tensor input, false without an input (18 on: an input
// left out or named "").
Status mapOptionalHasElement(NodeContext& ctx) {
  ir::TensorData t(DType::kBool, {});
  *t.as<bool>() = ctx.hasInput(0);
  ctx.setConstantOutput(0, std::move(t));
  return Status::ok();
}

// OptionalGetElement (15, 18): a tensor input is its own element.
Status mapOptionalGetElement(NodeContext& ctx) {
  if (!ctx.hasInput(0)) return ctx.invalid("OptionalGetElement needs an input");
  return alias(ctx, 0);
}

}  // namespace

std::vector<MapperEntry> constantMappers() {
  // Versions: Constant 11 adds sparse values (refused), 12 the value_* attributes; Shape 15
  // adds start and end; Range 27's stash_type only concerns float16/bfloat16 (not folded by
  // kiln). The rest only add element types.
  return {
      {"Constant", {1, 9, 11, 12, 13, 19, 21, 23, 24, 25}, mapConstant},
      {"Shape", {1, 13, 15, 19, 21, 23, 24, 25}, mapShape},
      {"Size", {1, 13, 19, 21, 23, 24, 25}, mapSize},
      {"ConstantOfShape", {9, 20, 21, 23, 24, 25}, mapConstantOfShape},
      {"Range", {11, 27}, mapRange},
      // 18 takes tensors and an empty input; 28 adds element types.
      {"OptionalHasElement", {15, 18, 28}, mapOptionalHasElement},
      {"OptionalGetElement", {15, 18, 28}, mapOptionalGetElement},
  };
}

}  // namespace kiln::frontends::onnx_import
