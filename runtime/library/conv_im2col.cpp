// conv2d as im2col + lib::sgemm, one GEMM per (image, group), for both layouts.
//  - NCHW: col[(c,kh,kw)][oh*OW+ow], y_g[M/g, P] = w_g[M/g, K] * col[K, P]; the OIHW weights
//    are already the [M, K] row-major operand.
//  - NHWC: col[oh*OW+ow][(kh,kw,c)] (each tap copies C/g contiguous channels),
//    y[P, M] (ld M) = col[P, K] * w'^T with the weights reordered to [M][kh][kw][C/g] (kept
//    in the caller's LibraryCache when there is one).
// 1x1 stride-1 unpadded convolutions skip im2col: the input itself is the GEMM operand.
// Bias and post-ops run in one epilogue pass per image, while its output is still in cache.

#include <algorithm>
#include <climits>
#include <cstring>
#include <utility>

#include "runtime/cpu/chunk_queues.h"
#include "runtime/library/dnnl_support.h"
#include "runtime/library/epilogue.h"
#include "runtime/library/families.h"
#include "runtime/library/library_cache.h"

namespace kiln::runtime::lib {

namespace {

constexpr int64_t kParallelMin = 1 << 15;  // Elements below which one thread builds col.

// The outputs o in [0, out) whose tap at `offset` (kernel index * dilation) reads inside
// [0, in): 0 <= o * stride - padBegin + offset < in. Empty when lo == hi.
std::pair<int64_t, int64_t> validOutputs(int64_t in, int64_t out, int64_t stride, int64_t padBegin,
                                         int64_t offset) {
  const int64_t shift = padBegin - offset;
  const int64_t lo = shift > 0 ? std::min(out, (shift + stride - 1) / stride) : 0;
  const int64_t last = in + shift - 1;  // The largest allowed o * stride.
  const int64_t hi = last < 0 ? 0 : std::min(out, last / stride + 1);
  return {lo, std::max(lo, hi)};
}

// col[K, P] from one image's group of channel planes x (NCHW).
void im2colNchw(const float* x, float* col, const ConvGeometry& g) {
  const int64_t taps = g.kh * g.kw, rows = g.cPerGroup() * taps, p = g.oh * g.ow;
  parallelUnits(rows, rows * p >= kParallelMin, [&](int64_t q) {
    const int64_t c = q / taps, kh = q % taps / g.kw, kw = q % g.kw;
    const float* plane = x + c * g.h * g.w;
    const auto [owLo, owHi] = validOutputs(g.w, g.ow, g.strideW, g.padLeft, kw * g.dilW);
    float* out = col + q * p;
    for (int64_t oh = 0; oh < g.oh; ++oh) {
      float* o = out + oh * g.ow;
      const int64_t ih = oh * g.strideH - g.padTop + kh * g.dilH;
      if (ih < 0 || ih >= g.h || owLo == owHi) {
        std::fill(o, o + g.ow, 0.f);
        continue;
      }
      std::fill(o, o + owLo, 0.f);
      const float* row = plane + ih * g.w + owLo * g.strideW - g.padLeft + kw * g.dilW;
      if (g.strideW == 1) {
        std::memcpy(o + owLo, row, (owHi - owLo) * sizeof(float));
      } else {
        for (int64_t j = 0; j < owHi - owLo; ++j) o[owLo + j] = row[j * g.strideW];
      }
      std::fill(o + owHi, o + g.ow, 0.f);
    }
  });
}

// col[P, K] for group `group` of one image x (NHWC).
void im2colNhwc(const float* x, int64_t group, float* col, const ConvGeometry& g) {
  const int64_t cg = g.cPerGroup(), k = g.kh * g.kw * cg, p = g.oh * g.ow;
  const float* xg = x + group * cg;
  parallelUnits(p, p * k >= kParallelMin, [&](int64_t i) {
    const int64_t oh = i / g.ow, ow = i % g.ow;
    float* out = col + i * k;
    for (int64_t kh = 0; kh < g.kh; ++kh) {
      const int64_t ih = oh * g.strideH - g.padTop + kh * g.dilH;
      for (int64_t kw = 0; kw < g.kw; ++kw, out += cg) {
        const int64_t iw = ow * g.strideW - g.padLeft + kw * g.dilW;
        if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w)
          std::fill(out, out + cg, 0.f);
        else
          std::memcpy(out, xg + (ih * g.w + iw) * g.c, cg * sizeof(float));
      }
    }
  });
}

// OIHW [M][C/g][kh][kw] -> [M][kh][kw][C/g], the NHWC GEMM's weight operand.
void weightsToChannelsLast(const float* w, float* out, const ConvGeometry& g) {
  const int64_t cg = g.cPerGroup(), taps = g.kh * g.kw;
  parallelUnits(g.m, g.m * cg * taps >= kParallelMin, [&](int64_t m) {
    for (int64_t c = 0; c < cg; ++c)
      for (int64_t t = 0; t < taps; ++t) out[(m * taps + t) * cg + c] = w[(m * cg + c) * taps + t];
  });
}

void runNchw(const Call& call, const ConvGeometry& g, std::span<const ResolvedPostOp> post) {
  if (call.options.prepare) return;  // The OIHW weights are the GEMM's operand as they are.
  const float* x = call.in[0].data<float>();
  const float* w = call.in[1].data<float>();
  const Addend bias{call.in.size() == 3 ? call.in[2].data<float>() : nullptr, 1, 0, 1.f};
  float* y = call.out.data<float>();
  const int64_t cg = g.cPerGroup(), mg = g.mPerGroup(), k = cg * g.kh * g.kw, p = g.oh * g.ow;
  const bool pointwise = g.isPointwise();
  float* col = pointwise ? nullptr : scratchFloats(Scratch::kSrc, static_cast<size_t>(k * p));
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t gi = 0; gi < g.group; ++gi) {
      const float* xg = x + (n * g.c + gi * cg) * g.h * g.w;
      if (!pointwise) im2colNchw(xg, col, g);
      sgemm(false, false, mg, p, k, 1.f, w + gi * mg * k, k, pointwise ? xg : col, p, 0.f,
            y + (n * g.m + gi * mg) * p, p);
    }
    const int64_t offset = n * g.m * p;
    applyEpilogue(y + offset, g.m, p, p, bias, offsetPostOps(post, offset));
  }
}

void runNhwc(const Call& call, const ConvGeometry& g, std::span<const ResolvedPostOp> post) {
  const Tensor& wt = call.in[1];
  const float* x = call.in[0].data<float>();
  const Addend bias{call.in.size() == 3 ? call.in[2].data<float>() : nullptr, 0, 1, 1.f};
  float* y = call.out.data<float>();
  const int64_t cg = g.cPerGroup(), mg = g.mPerGroup(), k = cg * g.kh * g.kw, p = g.oh * g.ow;
  const bool pointwise = g.isPointwise();

  if (call.options.prepare && !call.options.cache) return;  // Nothing to keep, nothing read.
  // With one tap the OIHW weights already are [M][kh][kw][C/g].
  const float* w = wt.data<float>();
  std::shared_ptr<const AlignedBuffer> cached;
  if (g.kh * g.kw != 1) {
    const size_t bytes = static_cast<size_t>(g.m * k) * sizeof(float);
    auto fill = [&](std::byte* to) {
      weightsToChannelsLast(wt.data<float>(), reinterpret_cast<float*>(to), g);
    };
    if (call.options.cache) {
      CacheKey key("im2col-nhwc-weights");
      key.add(wt.shape());
      cached = call.options.cache->impl().getOrCreate(key.str(), wt, bytes, fill);
      w = reinterpret_cast<const float*>(cached->data());
    } else {
      std::byte* tmp = scratch(Scratch::kWeights, bytes);
      fill(tmp);
      w = reinterpret_cast<const float*>(tmp);
    }
  }
  if (call.options.prepare) return;

  if (pointwise && g.group == 1) {  // The whole batch is one [N*P, C] x [C, M] GEMM.
    sgemm(false, true, g.n * p, g.m, g.c, 1.f, x, g.c, w, g.c, 0.f, y, g.m);
    applyEpilogue(y, g.n * p, g.m, g.m, bias, post);
    return;
  }
  float* col = pointwise ? nullptr : scratchFloats(Scratch::kSrc, static_cast<size_t>(p * k));
  for (int64_t n = 0; n < g.n; ++n) {
    const float* xn = x + n * g.h * g.w * g.c;
    for (int64_t gi = 0; gi < g.group; ++gi) {
      if (!pointwise) im2colNhwc(xn, gi, col, g);
      sgemm(false, true, p, mg, k, 1.f, pointwise ? xn + gi * cg : col, pointwise ? g.c : k,
            w + gi * mg * k, k, 0.f, y + n * p * g.m + gi * mg, g.m);
    }
    const int64_t offset = n * p * g.m;
    applyEpilogue(y + offset, p, g.m, g.m, bias, offsetPostOps(post, offset));
  }
}

}  // namespace

Status runConvIm2col(const Call& call, const ConvGeometry& g) {
  if (call.options.prepare) warmUpSgemm();
  const auto post = resolvePostOps(call.post, call.extra);
  if (call.options.channelsLast)
    runNhwc(call, g, post);
  else
    runNchw(call, g, post);
  return Status::ok();
}

}  // namespace kiln::runtime::lib
