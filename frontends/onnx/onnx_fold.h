// Import-time evaluation of small constant tensors: the shape arithmetic ONNX exporters emit
// (Shape -> Gather -> Concat -> Reshape, masks from Equal/Where, ConstantOfShape, Range) is
// folded so that kiln graphs get static attributes. kiln's frontends may not call the runtime's
// reference kernels (docs/design.md layering), so this is a small evaluator of its own.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ir/attributes.h"
#include "ir/op_table.h"
#include "ir/tensor_data.h"

namespace kiln::frontends::onnx_import {

// Results larger than this are not folded: the node becomes kiln ops instead (or, where kiln
// has none, an error), so that a file cannot make the importer allocate without bound.
inline constexpr int64_t kMaxFoldElements = int64_t{1} << 20;

// Whether the evaluator reads and writes elements of `dtype` (f16 and bf16 it does not).
bool foldableDType(ir::DType dtype);

// Element i as int64 (floats truncate) or as double.
int64_t elementAsInt(const ir::TensorData& t, int64_t i);
double elementAsDouble(const ir::TensorData& t, int64_t i);

// The values of an integer tensor (any rank); `what` names it in the error otherwise.
Expected<std::vector<int64_t>> toInts(const ir::TensorData& t, const std::string& what);
// One number from a one-element tensor of any foldable dtype.
Expected<double> toScalar(const ir::TensorData& t, const std::string& what);

ir::TensorData intTensor(const std::vector<int64_t>& values, ir::Shape shape);
ir::TensorData int1d(const std::vector<int64_t>& values);
// A tensor of `shape` filled with `value` converted to `dtype` (shape must be small).
ir::TensorData filledTensor(ir::DType dtype, const ir::Shape& shape, double value);
// The same elements with another shape (element counts must match).
ir::TensorData withShape(const ir::TensorData& t, ir::Shape shape);

// Evaluates a kiln op on constants: movement ops (reshape, flatten, squeeze, unsqueeze,
// transpose, concat, slice, expand, gather) on any dtype, pointwise arithmetic (add, sub, mul,
// div, maximum, minimum, neg, abs, where, cast) on foldable dtypes. Output types come from the
// op table's shape inference. Errors are invalid input (an index out of range, an integer
// division by zero or overflow) or kUnimplemented for an op or dtype it does not evaluate.
Expected<ir::TensorData> evaluateOp(ir::OpKind op, std::span<const ir::TensorData* const> inputs,
                                    const ir::AttrMap& attrs = {});

// ONNX comparisons and logic, which kiln has no ops for: bool results with broadcasting.
enum class Compare { kEqual, kLess, kGreater, kLessOrEqual, kGreaterOrEqual, kAnd, kOr, kXor };
Expected<ir::TensorData> evaluateCompare(Compare op, const ir::TensorData& a,
                                         const ir::TensorData& b);
Expected<ir::TensorData> evaluateNot(const ir::TensorData& a);
// ONNX's ReduceSum, ReduceMean, ReduceMax, ReduceMin and ReduceProd over `axes` (every dim when
// empty) of a non-empty float or integer tensor, in its dtype (a mean of floats only); NaN
// inputs, integer overflow and empty reductions are kUnimplemented: kiln computes those at run
// time, as the op's kernels define them.
enum class Reduce { kSum, kMean, kMax, kMin, kProd };
Expected<ir::TensorData> evaluateReduce(Reduce op, const ir::TensorData& x,
                                        const std::vector<int64_t>& axes, bool keepdims);
// ONNX Mod: fmod=0 (integers only) takes the divisor's sign, fmod=1 the dividend's.
Expected<ir::TensorData> evaluateMod(const ir::TensorData& a, const ir::TensorData& b, bool fmod);

}  // namespace kiln::frontends::onnx_import
