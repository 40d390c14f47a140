// attention(q, kt, v[, mask]) = softmax(scale * q @ kt + mask) @ v on the CPU, tiled as
// FlashAttention does (Dao et al. 2022; its second version's loop order): each task takes a
// block of query rows of one batch and walks the keys in tiles, so the scores exist one
// [rows, keys] tile at a time (32 KiB, in L1/L2) and never as the whole [S, T] matrix:
//   tile = scale * q_rows @ kt[:, keys] (+ mask)                    lib::sgemm, one thread
//   m' = max(m, rowmax(tile)); p = exp(tile - m'); c = exp(m - m')
//   l = l c + rowsum(p); out_rows = out_rows c + p @ v[keys]         lib::sgemm, one thread
// and at the end out_rows /= l. Tasks (batch x row block) run on the OpenMP pool. (lib::sgemm
// on oneDNN: 64x64x128 5.5 us, 64x128x64 6.6, against OpenBLAS 0.3.21's 9.0 and 9.2 on a Zen 5.)
//
// NaN and infinities as the unfused ops give them (ops.def): the running maximum keeps a NaN,
// so a NaN score makes its row NaN; a +inf score makes exp(inf - inf) = NaN; a row whose
// scores so far are all -inf (masked) takes no weight (p = 0, l = 0) instead of exp(-inf -
// -inf) = NaN, so a later unmasked tile still gives the right row, and a row masked throughout
// ends as 0 / 0 = NaN, as softmax of an all -inf row.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "runtime/cpu/chunk_queues.h"
#include "runtime/library/dnnl_support.h"
#include "runtime/library/families.h"
#include "runtime/library/vmath.h"
#include "runtime/reference/helpers.h"

namespace kiln::runtime::lib {

namespace {

constexpr int64_t kRows = 64;   // Query rows per task.
constexpr int64_t kKeys = 128;  // Keys per tile: a 64 x 128 tile is 32 KiB.

// p[j] = exp(p[j] - m) in place; returns their sum. Cloned for AVX-512 and AVX2 (the library
// is compiled for every x86-64; the loader picks the clone this CPU runs).
KILN_CPU_CLONES float expShiftedSum(float* p, int64_t n, float m) {
  float sum = 0.f;
  // The sum in any order (a reduction over vector lanes): GCC keeps a float sum in order,
  // and so scalar, without leave to reassociate it.
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    const float e = vexpNonpos(p[j] - m);  // p[j] <= m, or NaN.
    p[j] = e;
    sum += e;
  }
  return sum;
}

// The maximum of x[0..n), NaN if any is NaN (as the softmax reference's).
KILN_CPU_CLONES float rowMax(const float* x, int64_t n) {
  float m = -std::numeric_limits<float>::infinity();
  int32_t nans = 0;  // Counted apart: the max reduction below may ignore a NaN.
#pragma omp simd reduction(max : m) reduction(+ : nans)
  for (int64_t j = 0; j < n; ++j) {
    m = x[j] > m ? x[j] : m;
    nans += x[j] != x[j];
  }
  return nans > 0 ? std::numeric_limits<float>::quiet_NaN() : m;
}

// y[0..n) *= c.
KILN_CPU_CLONES void scaleRow(float* y, int64_t n, float c) {
  for (int64_t k = 0; k < n; ++k) y[k] *= c;
}

float nanMax(float a, float b) {
  return a != a || b != b ? std::numeric_limits<float>::quiet_NaN() : std::max(a, b);
}

}  // namespace

Status runAttention(const Call& call) {
  const ir::Shape& qs = call.in[0].shape();
  const int64_t s = qs[qs.size() - 2], d = qs.back(), t = call.in[1].shape().back();
  const int64_t dv = call.in[2].shape().back();
  const ir::Shape batchShape(qs.begin(), qs.end() - 2);
  const int64_t batches = ir::numElements(batchShape);
  if (!call.post.empty()) return unimplemented("attention takes no post-ops");
  if (call.options.prepare) {  // Nothing to make ahead but oneDNN's sgemm kernels.
    warmUpSgemm();
    return Status::ok();
  }
  float* y = call.out.data<float>();
  if (call.out.numElements() == 0) return Status::ok();
  if (t == 0) {  // Softmax over no keys weights nothing: an empty sum, as the unfused ops.
    std::fill(y, y + call.out.numElements(), 0.f);
    return Status::ok();
  }
  const float* q = call.in[0].data<float>();
  const float* kt = call.in[1].data<float>();
  const float* v = call.in[2].data<float>();
  const float scale = static_cast<float>(call.attrs.getFloat("scale"));

  // The mask's element offset for each batch, and its row and column strides (0: broadcast).
  const float* mask = call.in.size() == 4 ? call.in[3].data<float>() : nullptr;
  std::vector<int64_t> maskBatch;
  int64_t maskRow = 0, maskCol = 0;
  if (mask) {
    ir::Shape scores = batchShape;
    scores.push_back(s);
    scores.push_back(t);
    const std::vector<int64_t> st = ref::broadcastStrides(call.in[3].shape(), scores);
    maskRow = st[st.size() - 2];
    maskCol = st.back();
    maskBatch.assign(static_cast<size_t>(batches), 0);
    ref::forEachStrided<1>(batchShape, {std::vector<int64_t>(st.begin(), st.end() - 2)}, {0},
                           [&](int64_t i, const std::array<int64_t, 1>& off) {
                             maskBatch[static_cast<size_t>(i)] = off[0];
                           });
  }

  const int64_t rowBlocks = (s + kRows - 1) / kRows;
  const int64_t tasks = batches * rowBlocks;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  parallelUnits(tasks, batches * s * t * (d + dv) > (1 << 16), [&](int64_t task) {
    const int64_t b = task / rowBlocks, r0 = (task % rowBlocks) * kRows;
    const int64_t rows = std::min(kRows, s - r0);
    const float* qb = q + (b * s + r0) * d;
    const float* ktb = kt + b * d * t;
    const float* vb = v + b * t * dv;
    float* out = y + (b * s + r0) * dv;
    float* tile = scratchFloats(Scratch::kSrc, static_cast<size_t>(kRows * kKeys));
    float* m = scratchFloats(Scratch::kExtra, static_cast<size_t>(2 * kRows));
    float* l = m + kRows;
    std::fill(m, m + rows, kNegInf);
    std::fill(l, l + rows, 0.f);
    std::fill(out, out + rows * dv, 0.f);
    for (int64_t j0 = 0; j0 < t; j0 += kKeys) {
      const int64_t keys = std::min(kKeys, t - j0);
      if (d == 0)
        std::fill(tile, tile + rows * keys, 0.f);  // Empty dot products.
      else
        sgemm(false, false, rows, keys, d, scale, qb, d, ktb + j0, t, 0.f, tile, keys);
      for (int64_t i = 0; i < rows; ++i) {
        float* p = tile + i * keys;
        if (mask) {
          const float* mr =
              mask + maskBatch[static_cast<size_t>(b)] + (r0 + i) * maskRow + j0 * maskCol;
          for (int64_t j = 0; j < keys; ++j) p[j] += mr[j * maskCol];
        }
        const float mNew = nanMax(m[i], rowMax(p, keys));
        if (mNew == kNegInf) {  // Every score so far is -inf: no weight yet.
          std::fill(p, p + keys, 0.f);
          continue;
        }
        const float c = std::exp(m[i] - mNew);  // 0 after an all -inf start; NaN stays NaN.
        l[i] = l[i] * c + expShiftedSum(p, keys, mNew);
        m[i] = mNew;
        if (c != 1.f) scaleRow(out + i * dv, dv, c);
      }
      sgemm(false, false, rows, dv, keys, 1.f, tile, keys, vb + j0 * dv, dv, 1.f, out, dv);
    }
    for (int64_t i = 0; i < rows; ++i)  // 0 / 0 = NaN where a row was masked throughout.
      scaleRow(out + i * dv, dv, 1.f / l[i]);
  });
  return Status::ok();
}

}  // namespace kiln::runtime::lib
