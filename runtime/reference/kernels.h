// Reference kernels: one plain, obviously correct C++ kernel per op, the ground truth of every
// test. Each family lives in its own file and registers itself in the table below.
#pragma once

#include <array>
#include <span>
#include <vector>

#include "ir/graph.h"
#include "ir/op_table.h"
#include "runtime/tensor.h"

namespace kiln::runtime {

// Inputs and outputs are contiguous; outputs are allocated by the caller with the types that
// shape inference gave, so a kernel only computes. A dtype the kernel does not support is an
// kUnimplemented error naming the op and dtype, never a wrong answer.
using RefKernel = Status (*)(const ir::AttrView& attrs, std::span<const Tensor> inputs,
                             std::span<Tensor> outputs);

using RefKernelTable = std::array<RefKernel, ir::kNumOps>;

// Family registrars (reference/*.cpp).
void registerPointwiseKernels(RefKernelTable& t);
void registerLinalgKernels(RefKernelTable& t);      // matmul, gemm, linear
void registerConvPoolKernels(RefKernelTable& t);    // conv2d, pooling
void registerNormKernels(RefKernelTable& t);        // batch_norm, layer_norm, softmax, log_softmax
void registerReduceKernels(RefKernelTable& t);      // reduce_*
void registerMovementKernels(RefKernelTable& t);    // reshape .. gather
void registerLossKernels(RefKernelTable& t);        // nll_loss, cross_entropy_loss
void registerValueSizedKernels(RefKernelTable& t);  // nonzero .. unique_inverse

// The size that an op whose output is sized by its inputs' values (ops.def's `count` attribute:
// nonzero, non_max_suppression, unique_indices) takes from `inputs`: what a model run in stages
// imports the op with (compiler/staged.h). `attrs` are the op's other attributes. For cast (to
// i64), the value of its one-element integer or bool input (bool: 0 or 1): a value the import needs
// that the model computes (an If's condition, a Loop's trip count). kInvalidArgument for other
// ops.
Expected<int64_t> valueSizedCount(ir::OpKind op, const ir::AttrMap& attrs,
                                  std::span<const Tensor> inputs);

// nullptr when the op has no reference kernel (a test asserts none is missing).
RefKernel referenceKernel(ir::OpKind op);

// The loss kernels' check of class-index targets (i64 or i32): each in [0, classes) or equal to
// `ignore`, else kInvalidArgument naming `op`, the position, the value and the valid range.
Status checkClassIndices(std::string_view op, const Tensor& target, int64_t classes,
                         int64_t ignore);

// The errors of those checks for one index: `value` at `position` (text: a device's report may
// bound them, "2147483647 or more"), against a target described by `target` ("i64[4]") or a
// data tensor's dim.
std::string classIndexError(std::string_view op, std::string_view value, std::string_view position,
                            std::string_view target, int64_t classes, int64_t ignore);
std::string positionError(std::string_view op, std::string_view value, std::string_view position,
                          int64_t size, int axis, std::string_view data);

// The scatters' check of their indices (i64 or i32), each resolved as they read it: index i,
// component c = i % limits.size() of a tuple, in [-limits[c], limits[c]) along dim dims[c], else
// kInvalidArgument with resolvedIndexError (no position: the reference's scatters name none).
Status checkResolvedIndices(std::string_view op, const Tensor& indices,
                            std::span<const int64_t> limits, std::span<const int> dims);
std::string resolvedIndexError(std::string_view op, std::string_view value, int dim, int64_t size);

// Integer div's and mod's check of their divisor (an integer dtype): every element non-zero, else
// kInvalidArgument with zeroDivisorError (the first zero's flat index in the divisor).
Status checkNonZeroDivisor(std::string_view op, const Tensor& divisor);
std::string zeroDivisorError(std::string_view op, std::string_view divisor,
                             std::string_view position);

// The gathers' check of positions (i64 or i32 `indices`) along dim `axis`, of size `size`, of a
// data tensor described by `data` ("f32[5,3]"): each in [-size, size), else kInvalidArgument
// naming `op`, the position, the value and the valid range.
Status checkPositions(std::string_view op, const Tensor& indices, int64_t size, int axis,
                      std::string_view data);

// Infers output types, allocates outputs and runs the reference kernel; inputs may be
// non-contiguous. The convenience entry point for tests and constant folding.
Expected<std::vector<Tensor>> runReferenceOp(ir::OpKind op, std::vector<Tensor> inputs,
                                             const ir::AttrMap& attrs = {},
                                             Allocator* alloc = nullptr);

// Evaluates one node on constant inputs with the reference kernels: constant folding at
// compile time uses it.
Expected<std::vector<ir::TensorData>> evaluateNode(const ir::Node& node,
                                                   std::span<const ir::TensorData> inputs);

}  // namespace kiln::runtime
