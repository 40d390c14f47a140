// kiln's own epilogue pass for library kernels whose post-ops oneDNN does not fuse (the BLAS
// path, im2col, pooling, and post-op chains a oneDNN primitive rejects): one cache-friendly
// pass over the output that adds a bias (or gemm's beta*C) and applies the post-ops in order,
// with the reference kernels' formulas. Also the handling of kAdd inputs that alias the output.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/library/kernels.h"

namespace kiln::runtime::lib {

// A value added to y(r, c) before the post-ops: scale * data[r * rowStride + c * colStride]
// (a bias along rows or columns, or gemm's broadcast C). No addend when data is nullptr.
struct Addend {
  const float* data = nullptr;
  int64_t rowStride = 0;
  int64_t colStride = 0;
  float scale = 1.f;
};

// A post-op with its kAdd tensor resolved to a pointer laid out like y (same ld).
struct ResolvedPostOp {
  PostOp::Kind kind = PostOp::Kind::kRelu;
  float alpha = 0.f;
  float beta = 0.f;
  const float* extra = nullptr;
};

// Resolves `post` against `extra` (kAdd reads extra[op.input]'s data).
std::vector<ResolvedPostOp> resolvePostOps(std::span<const PostOp> post,
                                           std::span<const Tensor> extra);

// The same post-ops with each kAdd pointer advanced by `offset` elements (a sub-block of y).
std::vector<ResolvedPostOp> offsetPostOps(std::span<const ResolvedPostOp> post, int64_t offset);

// y(r, c) = y[r * ld + c] for r < rows, c < cols becomes post(y + addend), in parallel on the
// OpenMP pool. A kAdd reads extra[r * ld + c].
void applyEpilogue(float* y, int64_t rows, int64_t cols, int64_t ld, const Addend& addend,
                   std::span<const ResolvedPostOp> post);

// Copies n floats on the OpenMP pool (prefilling an output with a residual).
void parallelCopy(float* dst, const float* src, int64_t n);

// `extra` with every tensor that shares memory with `out` replaced by a copy, except extra
// number `keep`: kernels overwrite the output before their epilogue reads the kAdd inputs,
// so an in-place residual must be read from elsewhere (oneDNN's sum post-op is the exception:
// it reads dst itself).
std::vector<Tensor> detachAliasedExtras(std::span<const Tensor> extra, const Tensor& out,
                                        int keep = -1);

inline bool needsEpilogue(const Addend& addend, std::span<const ResolvedPostOp> post) {
  return addend.data != nullptr || !post.empty();
}

}  // namespace kiln::runtime::lib
