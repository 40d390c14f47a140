// Library kernels: the fast CPU implementations of library ops (oneDNN for convolution and
// pooling, OpenBLAS or oneDNN for matmul/gemm/linear), with fused epilogues (post-ops). Eager
// and compiled execution both use them; ops and dtypes without one run the reference kernel.
#pragma once

#include <span>
#include <vector>

#include "runtime/reference/kernels.h"

namespace kiln::runtime {

// An epilogue applied to a library op's output before it is stored: y = post(y).
struct PostOp {
  enum class Kind : uint8_t {
    kRelu,
    kLeakyRelu,  // alpha: the slope
    kClip,       // alpha: min, beta: max
    kSigmoid,
    kTanh,
    kGeluErf,
    kGeluTanh,
    kAdd,        // y += extra[input] (same shape as y): a residual or broadcast-free add
  };
  Kind kind = Kind::kRelu;
  double alpha = 0;
  double beta = 0;
  int input = -1;
  bool operator==(const PostOp&) const = default;
};

// A library kernel for (op, dtype), or nullptr when there is none (use the reference).
// Same ABI as reference kernels: contiguous inputs, preallocated contiguous outputs.
RefKernel libraryKernel(ir::OpKind op, ir::DType dtype);

// The same ops with an epilogue: `extra` holds the tensors kAdd post-ops read.
// Supported for conv2d, linear, gemm and matmul in f32; kUnimplemented otherwise.
Status runLibraryWithPostOps(ir::OpKind op, const ir::AttrView& attrs,
                             std::span<const Tensor> inputs, std::span<const PostOp> post,
                             std::span<const Tensor> extra, Tensor& output);

}  // namespace kiln::runtime
