// max_pool2d and avg_pool2d on NCHW or NHWC activations as they are, with kiln's own loops.
//
// oneDNN 2.6's pooling was 3-9x slower than ONNX Runtime's on the models' shapes (a 2-core Zen
// 3, AVX2, 2 threads: resnet's stem 3x3/2 over [1,64,112,112] 428-455 us against ONNX Runtime's
// 125, mnist_cnn's 2x2/2 over [1,64,24,24] 22 us against 8), and it needed three passes of
// fixes after it: NaN (its max lets a NaN lose), dilated windows wholly in the padding (-inf in
// the reference) and ceil_mode's include-padding divisors. Pooling is memory-bound; these loops
// read each window's taps as they lie and compute every output the way the reference kernel
// does (runtime/reference/conv_pool.cpp), so the results are the reference's bit for bit:
//  - max: -inf, then each tap in the input in order (rows, then columns), a tap greater than
//    the best or the first NaN taking over (a NaN stays); padded cells are never taps;
//  - avg: 0 plus each tap in the same order, divided by the taps in the input (exclude
//    padding) or by the window clipped to the padded input (count_include_pad; ceil_mode's
//    cells past the padding are not counted), as PyTorch divides.
// NHWC runs an output pixel's channels as one vector loop per tap; NCHW an output row per tap,
// along the row. Work units are output rows, split between the threads in chunks.
#include <algorithm>
#include <limits>

#include "runtime/cpu/chunk_queues.h"
#include "runtime/cpu/cpu_clones.h"
#include "runtime/library/epilogue.h"
#include "runtime/library/families.h"

namespace kiln::runtime::lib {

namespace {

// A half-open range [lo, hi). Not std::pair: clang 16 with libstdc++ 12 in C++20 left
// `pair<long, long>(const long&, const long&)` undefined at link in the fuzz build.
struct Span {
  int64_t lo = 0, hi = 0;
};

// One spatial dim of the windows: output o's taps are start(o) + t * dil for t < kernel.
struct Axis {
  int64_t in = 0, out = 0, kernel = 1, stride = 1, dil = 1, padBegin = 0, padEnd = 0;

  int64_t start(int64_t o) const { return o * stride - padBegin; }
  // The taps [lo, hi) of output o that land in the input.
  Span taps(int64_t o) const {
    const int64_t s = start(o);
    const int64_t lo = s >= 0 ? 0 : (-s + dil - 1) / dil;
    const int64_t hi = s > in - 1 ? 0 : std::min(kernel, (in - 1 - s) / dil + 1);
    return {lo, std::max(lo, hi)};
  }
  // The outputs [lo, hi) whose tap t lands in the input (t's outputs are contiguous).
  Span outputsOf(int64_t t) const {
    const int64_t off = padBegin - t * dil;  // o * stride >= off and o * stride < in + off.
    const int64_t lo = off <= 0 ? 0 : (off + stride - 1) / stride;
    const int64_t hi = in + off <= 0 ? 0 : std::min(out, (in + off - 1) / stride + 1);
    return {lo, std::max(lo, hi)};
  }
  // The include-padding divisor's extent: the window clipped to the padded input.
  int64_t paddedExtent(int64_t o) const {
    return std::min(start(o) + kernel, in + padEnd) - start(o);
  }
};

struct Geometry {
  int64_t n = 0, c = 0;
  Axis h, w;
};

Geometry geometryOf(const Call& call) {
  const ir::AttrView& a = call.attrs;
  const auto& k = a.getInts("kernel");
  const auto& st = a.getInts("strides");
  const auto& pads = a.getInts("pads");
  std::vector<int64_t> dil{1, 1};
  if (a.op().findAttr("dilations")) dil = a.getInts("dilations");
  const ir::Shape& x = call.in[0].shape();
  const ir::Shape& y = call.out.shape();  // [N, C, OH, OW] whatever the layout.
  Geometry g;
  g.n = x[0];
  g.c = x[1];
  g.h = Axis{x[2], y[2], k[0], st[0], dil[0], pads[0], pads[2]};
  g.w = Axis{x[3], y[3], k[1], st[1], dil[1], pads[1], pads[3]};
  return g;
}

// The reference's max step: a tap greater than the best, or the first NaN, takes over; a NaN
// best stays.
inline float maxTap(float best, float v) {
  return (v > best || (v != v && best == best)) ? v : best;
}

// y[i] = max (or +) of y[i] and x[i * stride], for i < n; the contiguous forms vectorize.
inline void maxInto(float* __restrict y, const float* __restrict x, int64_t n, int64_t stride) {
  for (int64_t i = 0; i < n; ++i) y[i] = maxTap(y[i], x[i * stride]);
}

inline void maxIntoContiguous(float* __restrict y, const float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = maxTap(y[i], x[i]);
}

inline void addInto(float* __restrict y, const float* __restrict x, int64_t n, int64_t stride) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i * stride];
}

inline void addIntoContiguous(float* __restrict y, const float* __restrict x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

inline void divideBy(float* y, int64_t n, float d) {
  for (int64_t i = 0; i < n; ++i) y[i] /= d;
}

// The divisor of output (oh, ow): taps in the input, or the window clipped to the padded input.
float divisor(const Geometry& g, bool includePad, int64_t oh, int64_t ow) {
  if (includePad) return static_cast<float>(g.h.paddedExtent(oh) * g.w.paddedExtent(ow));
  const auto [h0, h1] = g.h.taps(oh);
  const auto [w0, w1] = g.w.taps(ow);
  return static_cast<float>((h1 - h0) * (w1 - w0));
}

// Output row (n, oh) of an NHWC tensor: every pixel's C channels, tap by tap. Cloned, the
// tap loops inlined in each clone.
KILN_CPU_CLONES void poolRowNhwc(const float* x, float* y, const Geometry& g, bool isMax,
                                 bool includePad, int64_t n, int64_t oh) {
  const int64_t c = g.c;
  const auto [kh0, kh1] = g.h.taps(oh);
  for (int64_t ow = 0; ow < g.w.out; ++ow) {
    float* out = y + ((n * g.h.out + oh) * g.w.out + ow) * c;
    std::fill(out, out + c, isMax ? -std::numeric_limits<float>::infinity() : 0.f);
    const auto [kw0, kw1] = g.w.taps(ow);
    for (int64_t kh = kh0; kh < kh1; ++kh) {
      const int64_t ih = g.h.start(oh) + kh * g.h.dil;
      for (int64_t kw = kw0; kw < kw1; ++kw) {
        const int64_t iw = g.w.start(ow) + kw * g.w.dil;
        const float* tap = x + ((n * g.h.in + ih) * g.w.in + iw) * c;
        if (isMax)
          maxIntoContiguous(out, tap, c);
        else
          addIntoContiguous(out, tap, c);
      }
    }
    if (!isMax) divideBy(out, c, divisor(g, includePad, oh, ow));
  }
}

// Output row (plane, oh) of an NCHW tensor: each tap over the outputs it lands in.
KILN_CPU_CLONES void poolRowNchw(const float* x, float* y, const Geometry& g, bool isMax,
                                 bool includePad, int64_t plane, int64_t oh) {
  const float* in = x + plane * g.h.in * g.w.in;
  float* out = y + (plane * g.h.out + oh) * g.w.out;
  std::fill(out, out + g.w.out, isMax ? -std::numeric_limits<float>::infinity() : 0.f);
  const auto [kh0, kh1] = g.h.taps(oh);
  for (int64_t kh = kh0; kh < kh1; ++kh) {
    const float* row = in + (g.h.start(oh) + kh * g.h.dil) * g.w.in;
    for (int64_t kw = 0; kw < g.w.kernel; ++kw) {
      const auto [o0, o1] = g.w.outputsOf(kw);
      if (o0 >= o1) continue;
      const float* tap = row + g.w.start(o0) + kw * g.w.dil;
      if (isMax)
        maxInto(out + o0, tap, o1 - o0, g.w.stride);
      else
        addInto(out + o0, tap, o1 - o0, g.w.stride);
    }
  }
  if (!isMax)
    for (int64_t ow = 0; ow < g.w.out; ++ow) out[ow] /= divisor(g, includePad, oh, ow);
}

}  // namespace

Status runPool2d(const Call& call) {
  // Nothing to prepare (no plan, no scratch), nothing to compute for an empty output.
  if (call.options.prepare || call.out.numElements() == 0) return Status::ok();
  const bool isMax = call.attrs.op().kind == ir::OpKind::kMaxPool2d;
  const bool includePad = !isMax && call.attrs.getInt("count_include_pad") != 0;
  const Geometry g = geometryOf(call);
  const bool channelsLast = call.options.channelsLast;
  const float* x = call.in[0].data<float>();
  float* y = call.out.data<float>();
  // A unit is an output row: (n, oh) in NHWC, (n, c, oh) in NCHW. Threads from 2^15 taps
  // (mnist_cnn's 36,864: 13 us on one thread, 6.5 on two).
  const int64_t units = (channelsLast ? g.n : g.n * g.c) * g.h.out;
  const int64_t taps = call.out.numElements() * g.h.kernel * g.w.kernel;
  parallelUnits(units, taps > (int64_t{1} << 15), [&](int64_t u) {
    const int64_t outer = u / g.h.out, oh = u % g.h.out;
    if (channelsLast)
      poolRowNhwc(x, y, g, isMax, includePad, outer, oh);
    else
      poolRowNchw(x, y, g, isMax, includePad, outer, oh);
  });
  if (!call.post.empty()) {
    const auto post = resolvePostOps(call.post, call.extra);
    const int64_t cols = g.h.out * g.w.out;
    applyEpilogue(y, call.out.numElements() / cols, cols, cols, Addend{}, post);
  }
  return Status::ok();
}

}  // namespace kiln::runtime::lib
