// max_pool2d and avg_pool2d through oneDNN 2.6's pooling_v2 (which has dilation), on NCHW or
// NHWC activations as they are (pooling is memory-bound: a reorder would double its traffic).
//
// ceil_mode. oneDNN sizes outputs with floor only, so the bottom/right padding is enlarged
// until its output size equals shape inference's. Max pooling never picks a padded cell, and
// exclude-padding averages count only input cells, so both are exact. Include-padding
// averages divide by the whole window, while kiln (as PyTorch) divides by the window clipped
// to the padded input, not the extra ceil cells: the few outputs whose window reaches past the
// padded input are recomputed here with the reference formula.
//
// Dilated max windows whose taps all land in the padding are set to -inf, as the reference.
//
// NaN: oneDNN's max pooling lets a NaN input lose (its comparisons are false), while the
// reference (as PyTorch) propagates it. A vectorized scan of the input for NaN (one read of
// it, parallel) finds the rare inputs that hold any, and only then the outputs whose windows
// hold one are set to NaN, so max pooling is exact at the cost of that scan.
#include <algorithm>
#include <array>
#include <limits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/library/dnnl_support.h"
#include "runtime/library/epilogue.h"
#include "runtime/library/families.h"
#include "runtime/library/vmath.h"

namespace kiln::runtime::lib {

namespace {

using dnnl::memory;

struct PoolPlan {
  dnnl::pooling_v2_forward prim;
  memory::desc srcMd, dstMd, scratchMd;
};

PlanCache<PoolPlan>& poolPlans() {
  static PlanCache<PoolPlan> cache(kPlanCacheCapacity);
  return cache;
}

struct PoolGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0, oh = 0, ow = 0;
  int64_t kh = 1, kw = 1, strideH = 1, strideW = 1, dilH = 1, dilW = 1;
  int64_t padTop = 0, padLeft = 0, padBottom = 0, padRight = 0;
  int64_t extraBottom = 0, extraRight = 0;  // Added by ceil_mode so that oneDNN's sizes match.
};

PoolGeometry geometryOf(const Call& call) {
  const ir::AttrView& a = call.attrs;
  const auto& k = a.getInts("kernel");
  const auto& st = a.getInts("strides");
  const auto& pads = a.getInts("pads");
  std::vector<int64_t> dil{1, 1};
  if (a.op().findAttr("dilations")) dil = a.getInts("dilations");
  const ir::Shape& x = call.in[0].shape();
  const ir::Shape& y = call.out.shape();
  PoolGeometry g;
  g.n = x[0];
  g.c = x[1];
  g.h = x[2];
  g.w = x[3];
  g.oh = y[2];
  g.ow = y[3];
  g.kh = k[0];
  g.kw = k[1];
  g.strideH = st[0];
  g.strideW = st[1];
  g.dilH = dil[0];
  g.dilW = dil[1];
  g.padTop = pads[0];
  g.padLeft = pads[1];
  g.padBottom = pads[2];
  g.padRight = pads[3];
  // The padding that makes floor((in + pads - span) / stride) + 1 the inferred size.
  const int64_t spanH = (g.kh - 1) * g.dilH + 1, spanW = (g.kw - 1) * g.dilW + 1;
  g.extraBottom =
      std::max<int64_t>(0, (g.oh - 1) * g.strideH + spanH - (g.h + g.padTop + g.padBottom));
  g.extraRight =
      std::max<int64_t>(0, (g.ow - 1) * g.strideW + spanW - (g.w + g.padLeft + g.padRight));
  return g;
}

Expected<std::shared_ptr<const PoolPlan>> makePlan(const PoolGeometry& g, dnnl::algorithm alg,
                                                   bool channelsLast) {
  const auto tag = channelsLast ? memory::format_tag::nhwc : memory::format_tag::nchw;
  const auto f32 = memory::data_type::f32;
  auto plan = std::make_shared<PoolPlan>();
  plan->srcMd = memory::desc({g.n, g.c, g.h, g.w}, f32, tag);
  plan->dstMd = memory::desc({g.n, g.c, g.oh, g.ow}, f32, tag);
  try {
    dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, alg, plan->srcMd,
                                     plan->dstMd, {g.strideH, g.strideW}, {g.kh, g.kw},
                                     {g.dilH - 1, g.dilW - 1}, {g.padTop, g.padLeft},
                                     {g.padBottom + g.extraBottom, g.padRight + g.extraRight});
    dnnl::pooling_v2_forward::primitive_desc pd(d, makeAttr(dnnl::post_ops()), cpuEngine());
    plan->prim = dnnl::pooling_v2_forward(pd);
    plan->scratchMd = pd.scratchpad_desc();
  } catch (const dnnl::error&) {
    // oneDNN rejects, e.g., exclude-padding windows that can lie wholly in (enlarged) padding.
    return unimplemented("oneDNN pooling cannot express these pads, kernel and ceil_mode");
  }
  return std::shared_ptr<const PoolPlan>(std::move(plan));
}

// The output cells (oh, ow) for which rowSelected(oh) or colSelected(ow).
template <class Row, class Col>
std::vector<std::pair<int64_t, int64_t>> cellsWhere(const PoolGeometry& g, Row rowSelected,
                                                    Col colSelected) {
  std::vector<std::pair<int64_t, int64_t>> cells;
  for (int64_t oh = 0; oh < g.oh; ++oh)
    for (int64_t ow = 0; ow < g.ow; ++ow)
      if (rowSelected(oh) || colSelected(ow)) cells.emplace_back(oh, ow);
  return cells;
}

// Sets y(n, c, oh, ow) = f(input plane, input strides, oh, ow) for the given cells of every
// (n, c) plane, in either layout.
template <class F>
void rewriteCells(const Tensor& xt, Tensor& yt, const PoolGeometry& g, bool channelsLast,
                  const std::vector<std::pair<int64_t, int64_t>>& cells, F f) {
  if (cells.empty()) return;
  const float* x = xt.data<float>();
  float* y = yt.data<float>();
  // Element strides of [n, c, h, w] for the input and output in their layout.
  auto strides = [&](int64_t h, int64_t w) -> std::array<int64_t, 4> {
    if (channelsLast) return {h * w * g.c, 1, w * g.c, g.c};
    return {g.c * h * w, h * w, w, 1};
  };
  const auto xs = strides(g.h, g.w), ys = strides(g.oh, g.ow);
  const int64_t planes = g.n * g.c;
#pragma omp parallel for schedule(static) if (planes * static_cast <int64_t>(cells.size()) > 4096)
  for (int64_t plane = 0; plane < planes; ++plane) {
    const int64_t n = plane / g.c, c = plane % g.c;
    const float* xp = x + n * xs[0] + c * xs[1];
    float* yp = y + n * ys[0] + c * ys[1];
    for (const auto& [oh, ow] : cells) yp[oh * ys[2] + ow * ys[3]] = f(xp, xs, oh, ow);
  }
}

// Include-padding averages whose window reaches past the padded input (only ceil_mode's last
// rows and columns can), recomputed with the reference formula.
void fixCeilBorder(const Tensor& x, Tensor& y, const PoolGeometry& g, bool channelsLast) {
  const auto cells = cellsWhere(
      g, [&](int64_t oh) { return oh * g.strideH - g.padTop + g.kh > g.h + g.padBottom; },
      [&](int64_t ow) { return ow * g.strideW - g.padLeft + g.kw > g.w + g.padRight; });
  rewriteCells(x, y, g, channelsLast, cells,
               [&](const float* xp, const std::array<int64_t, 4>& xs, int64_t oh, int64_t ow) {
                 const int64_t h0 = oh * g.strideH - g.padTop, w0 = ow * g.strideW - g.padLeft;
                 const int64_t h1 = std::min(h0 + g.kh, g.h + g.padBottom);
                 const int64_t w1 = std::min(w0 + g.kw, g.w + g.padRight);
                 const int64_t hs = std::max<int64_t>(h0, 0), he = std::min(h1, g.h);
                 const int64_t ws = std::max<int64_t>(w0, 0), we = std::min(w1, g.w);
                 float sum = 0.f;
                 for (int64_t ih = hs; ih < he; ++ih)
                   for (int64_t iw = ws; iw < we; ++iw) sum += xp[ih * xs[2] + iw * xs[3]];
                 return sum / static_cast<float>((h1 - h0) * (w1 - w0));
               });
}

// Dilated max windows can skip every input cell (taps only in the padding); the reference
// then gives -inf, which oneDNN does not.
void fixEmptyMaxWindows(const Tensor& x, Tensor& y, const PoolGeometry& g, bool channelsLast) {
  auto empty = [](int64_t o, int64_t stride, int64_t padBegin, int64_t kernel, int64_t dil,
                  int64_t in) {
    for (int64_t t = 0; t < kernel; ++t) {
      const int64_t i = o * stride - padBegin + t * dil;
      if (i >= 0 && i < in) return false;
    }
    return true;
  };
  const auto cells = cellsWhere(
      g, [&](int64_t oh) { return empty(oh, g.strideH, g.padTop, g.kh, g.dilH, g.h); },
      [&](int64_t ow) { return empty(ow, g.strideW, g.padLeft, g.kw, g.dilW, g.w); });
  rewriteCells(x, y, g, channelsLast, cells,
               [](const float*, const std::array<int64_t, 4>&, int64_t, int64_t) {
                 return -std::numeric_limits<float>::infinity();
               });
}

// Cloned for AVX-512 and AVX2: the scan reads the whole input, about as long as the pooling.
KILN_CPU_CLONES bool anyNaN(const float* x, int64_t n) {
  constexpr int64_t kBlock = 1 << 14;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  bool found = false;
#pragma omp parallel for schedule(static) reduction(|| : found) if (blocks > 4)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t end = std::min(n, (b + 1) * kBlock);
    // A count, not a bool: GCC vectorizes this form (an unordered compare per 4 lanes), and
    // ran `nan |= x[i] != x[i]` one ucomiss at a time (mnist_cnn's pool: 14 us for 1 us of
    // pooling).
    int32_t nans = 0;
    for (int64_t i = b * kBlock; i < end; ++i) nans += x[i] != x[i];
    found = found || nans > 0;
  }
  return found;
}

// The output positions along one dim whose window takes input position `i`.
template <class F>
void windowsTaking(int64_t i, int64_t stride, int64_t padBegin, int64_t kernel, int64_t dil,
                   int64_t out, F&& f) {
  for (int64_t t = 0; t < kernel; ++t) {
    const int64_t num = i + padBegin - t * dil;
    if (num >= 0 && num % stride == 0 && num / stride < out) f(num / stride);
  }
}

// Sets every max-pooling output whose window holds a NaN input to NaN (see the file comment).
void propagateMaxNaN(const Tensor& x, Tensor& y, const PoolGeometry& g, bool channelsLast) {
  const float* in = x.data<float>();
  if (!anyNaN(in, x.numElements())) return;
  float* out = y.data<float>();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t c = 0; c < g.c; ++c)
      for (int64_t h = 0; h < g.h; ++h)
        for (int64_t w = 0; w < g.w; ++w) {
          const int64_t xi = channelsLast ? ((n * g.h + h) * g.w + w) * g.c + c
                                          : ((n * g.c + c) * g.h + h) * g.w + w;
          if (in[xi] == in[xi]) continue;
          windowsTaking(h, g.strideH, g.padTop, g.kh, g.dilH, g.oh, [&](int64_t oh) {
            windowsTaking(w, g.strideW, g.padLeft, g.kw, g.dilW, g.ow, [&](int64_t ow) {
              out[channelsLast ? ((n * g.oh + oh) * g.ow + ow) * g.c + c
                               : ((n * g.c + c) * g.oh + oh) * g.ow + ow] = nan;
            });
          });
        }
}

}  // namespace

Status runPool2d(const Call& call) {
  const bool isMax = call.attrs.op().kind == ir::OpKind::kMaxPool2d;
  const bool includePad = !isMax && call.attrs.getInt("count_include_pad") != 0;
  const auto alg = isMax        ? dnnl::algorithm::pooling_max
                   : includePad ? dnnl::algorithm::pooling_avg_include_padding
                                : dnnl::algorithm::pooling_avg_exclude_padding;
  const PoolGeometry g = geometryOf(call);
  const bool channelsLast = call.options.channelsLast;
  CacheKey key("pool2d");
  key.add(static_cast<int64_t>(alg)).add(int64_t{channelsLast});
  for (int64_t v :
       {g.n, g.c, g.h, g.w, g.oh, g.ow, g.kh, g.kw, g.strideH, g.strideW, g.dilH, g.dilW, g.padTop,
        g.padLeft, g.padBottom, g.padRight, g.extraBottom, g.extraRight})
    key.add(v);
  key.add(int64_t{maxThreads()});
  KILN_ASSIGN_OR_RETURN(
      std::shared_ptr<const PoolPlan> plan,
      poolPlans().getOrCreate(key.str(), [&] { return makePlan(g, alg, channelsLast); }));
  if (call.options.prepare) {  // The scratch the runs will use, mapped now.
    (void)scratchpad(plan->scratchMd);
    return Status::ok();
  }

  CallArgs args(plan.get());
  args.set(DNNL_ARG_SRC, plan->srcMd, call.in[0].rawData())
      .set(DNNL_ARG_DST, plan->dstMd, call.out.rawData());
  if (std::byte* pad = scratchpad(plan->scratchMd))
    args.set(DNNL_ARG_SCRATCHPAD, plan->scratchMd, pad);
  plan->prim.execute(threadStream(), args.map());

  if (includePad && (g.extraBottom > 0 || g.extraRight > 0))
    fixCeilBorder(call.in[0], call.out, g, channelsLast);
  if (isMax && (g.dilH > 1 || g.dilW > 1))
    fixEmptyMaxWindows(call.in[0], call.out, g, channelsLast);
  if (isMax) propagateMaxNaN(call.in[0], call.out, g, channelsLast);
  if (!call.post.empty()) {
    const auto post = resolvePostOps(call.post, call.extra);
    const int64_t cols = g.oh * g.ow;
    applyEpilogue(call.out.data<float>(), call.out.numElements() / cols, cols, cols, Addend{},
                  post);
  }
  return Status::ok();
}

}  // namespace kiln::runtime::lib
