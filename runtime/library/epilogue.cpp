// The library kernels' own epilogue pass (see epilogue.h). Each task takes a chunk of one
// row that fits in L1, adds the addend and applies every post-op to it before moving on, so
// the output is read and written once however long the post-op chain is.
#include "runtime/library/epilogue.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <numbers>

#include "runtime/cpu/chunk_queues.h"
#include "runtime/library/vmath.h"

namespace kiln::runtime::lib {

namespace {

constexpr int64_t kChunk = 2048;           // Floats per task: 8 KiB, well inside L1.
constexpr int64_t kParallelMin = 1 << 14;  // Below this many elements one thread is faster.

// y = sigmoid(y), vectorized (vmath.h; libm's expf one element at a time made efficientnet's
// squeeze-excite gates, conv + sigmoid over a few hundred channels, 14 us a call). Cloned for
// AVX-512 and AVX2.
KILN_CPU_CLONES void sigmoidRow(float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = vsigmoid(y[i]);
}

// One post-op over n contiguous elements, with the reference kernels' formulas
// (runtime/reference/pointwise.cpp) in float.
void applyOne(const ResolvedPostOp& op, float* __restrict y, const float* __restrict e, int64_t n) {
  switch (op.kind) {
    case PostOp::Kind::kRelu:
      for (int64_t i = 0; i < n; ++i) y[i] = y[i] < 0.f ? 0.f : y[i];  // NaN passes.
      break;
    case PostOp::Kind::kLeakyRelu: {
      const float a = op.alpha;
      for (int64_t i = 0; i < n; ++i) y[i] = y[i] >= 0.f ? y[i] : a * y[i];
      break;
    }
    case PostOp::Kind::kClip: {
      const float lo = op.alpha, hi = op.beta;
      for (int64_t i = 0; i < n; ++i) {
        const float v = y[i] < lo ? lo : y[i];
        y[i] = hi < v ? hi : v;
      }
      break;
    }
    case PostOp::Kind::kSigmoid:
      sigmoidRow(y, n);
      break;
    case PostOp::Kind::kTanh:
      for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(y[i]);
      break;
    case PostOp::Kind::kGeluErf:
      for (int64_t i = 0; i < n; ++i)
        y[i] = y[i] * 0.5f * (1.f + std::erf(y[i] / std::numbers::sqrt2_v<float>));
      break;
    case PostOp::Kind::kGeluTanh: {
      const float k = std::numbers::sqrt2_v<float> * std::numbers::inv_sqrtpi_v<float>;
      for (int64_t i = 0; i < n; ++i) {
        const float x = y[i];
        y[i] = 0.5f * x * (1.f + std::tanh(k * (x + 0.044715f * x * x * x)));
      }
      break;
    }
    case PostOp::Kind::kAdd:
      for (int64_t i = 0; i < n; ++i) y[i] += e[i];
      break;
  }
}

void epilogueChunk(float* y, int64_t r, int64_t c0, int64_t n, int64_t ld, const Addend& addend,
                   std::span<const ResolvedPostOp> post) {
  float* row = y + r * ld + c0;
  if (addend.data) {
    const float s = addend.scale;
    const float* a = addend.data + r * addend.rowStride + c0 * addend.colStride;
    if (addend.colStride == 0) {
      const float v = s * a[0];
      for (int64_t i = 0; i < n; ++i) row[i] += v;
    } else if (addend.colStride == 1) {
      for (int64_t i = 0; i < n; ++i) row[i] += s * a[i];
    } else {
      for (int64_t i = 0; i < n; ++i) row[i] += s * a[i * addend.colStride];
    }
  }
  for (const ResolvedPostOp& op : post)
    applyOne(op, row, op.extra ? op.extra + r * ld + c0 : nullptr, n);
}

}  // namespace

std::vector<ResolvedPostOp> resolvePostOps(std::span<const PostOp> post,
                                           std::span<const Tensor> extra) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::vector<ResolvedPostOp> out;
  out.reserve(post.size());
  for (const PostOp& p : post) {
    ResolvedPostOp r;
    r.kind = p.kind;
    r.alpha = static_cast<float>(p.alpha);
    r.beta = static_cast<float>(p.beta);
    if (p.kind == PostOp::Kind::kClip) {
      // As the clip op: a NaN bound means no bound.
      r.alpha = std::isnan(p.alpha) ? -kInf : r.alpha;
      r.beta = std::isnan(p.beta) ? kInf : r.beta;
    }
    if (p.kind == PostOp::Kind::kAdd) r.extra = extra[static_cast<size_t>(p.input)].data<float>();
    out.push_back(r);
  }
  return out;
}

std::vector<ResolvedPostOp> offsetPostOps(std::span<const ResolvedPostOp> post, int64_t offset) {
  std::vector<ResolvedPostOp> out(post.begin(), post.end());
  for (ResolvedPostOp& p : out)
    if (p.extra) p.extra += offset;
  return out;
}

void parallelCopy(float* dst, const float* src, int64_t n) {
  constexpr int64_t kBlock = 1 << 16;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallelUnits(blocks, true, [&](int64_t b) {
    const int64_t begin = b * kBlock;
    std::memcpy(dst + begin, src + begin, std::min(kBlock, n - begin) * sizeof(float));
  });
}

std::vector<Tensor> detachAliasedExtras(std::span<const Tensor> extra, const Tensor& out,
                                        int keep) {
  std::vector<Tensor> result(extra.begin(), extra.end());
  const std::byte* outBegin = out.rawData();
  const std::byte* outEnd = outBegin + out.byteSize();
  for (size_t i = 0; i < result.size(); ++i) {
    const std::byte* begin = result[i].rawData();
    const std::byte* end = begin + result[i].byteSize();
    if (static_cast<int>(i) == keep || end <= outBegin || outEnd <= begin) continue;
    auto copy = Tensor::empty(result[i].dtype(), result[i].shape());
    if (!copy.hasValue()) throw std::bad_alloc();
    parallelCopy(copy->data<float>(), result[i].data<float>(), result[i].numElements());
    result[i] = *copy;
  }
  return result;
}

void applyEpilogue(float* y, int64_t rows, int64_t cols, int64_t ld, const Addend& addend,
                   std::span<const ResolvedPostOp> post) {
  if (!needsEpilogue(addend, post) || rows <= 0 || cols <= 0) return;
  const int64_t chunksPerRow = (cols + kChunk - 1) / kChunk;
  const int64_t tasks = rows * chunksPerRow;
  auto run = [&](int64_t t) {
    const int64_t r = t / chunksPerRow, c0 = (t % chunksPerRow) * kChunk;
    epilogueChunk(y, r, c0, std::min(kChunk, cols - c0), ld, addend, post);
  };
  parallelUnits(tasks, rows * cols >= kParallelMin, run);
}

}  // namespace kiln::runtime::lib
