// conv2d through oneDNN 2.6 (convolution_direct, which picks brgconv on AVX-512, and
// convolution_winograd), with bias, post-ops, either activation layout, and cached plans.
//
// Layouts. oneDNN is given the user's layout where that is fast, else `any` plus reorders:
//  - NHWC activations go to the primitive as they are (brgconv reads and writes NHWC).
//  - NCHW activations use `any` (brgconv picks NHWC) and are reordered in and out. Measured
//    (2 threads, N=1 @56x56): 3x3 64->64 with a primitive fixed to NCHW is x64:gemm:jit at
//    185 GFLOP/s, brgconv plus both reorders 370; 1x1 256->64 is 190-300 (noisy) against
//    240-260, where the reorders of 256 input channels cost a third of the time.
//  - Winograd exists for blocked layouts only, so it always reorders.
// Weights are OIHW (goihw with groups) and reordered into the primitive's format, through
// the caller's LibraryCache when there is one.
//
// bf16 operands (autocast, where runtime::nativeBf16Convolutions()): the source and weights are
// bf16, the bias, the destination and the post-ops' addends f32 (the caller rounds the result
// once), so that the products run on oneDNN's bf16 kernels (vdpbf16ps, f32 accumulation). A shape
// oneDNN would run on its reference code is kUnimplemented: the caller converts instead.
//
// Post-ops. The leading kAdds go into the primitive, and relu and clip too where the caller
// checks for NaN (fusedPostOpPrefix; otherwise activations run in kiln's epilogue, which keeps
// NaN as the reference does): the first kAdd becomes a sum post-op
// (dst is prefilled with the residual: brgconv keeps its fast path, which a binary post-op with
// a plain NCHW addend loses) and later ones binary adds. When the primitive cannot fuse them,
// or fusing would fall back to oneDNN's reference implementation, the primitive runs without
// post-ops. kiln's epilogue pass applies whatever the primitive did not.
#include <omp.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "runtime/cpu/compute_threads.h"
#include "runtime/library/dnnl_support.h"
#include "runtime/library/epilogue.h"
#include "runtime/library/families.h"
#include "runtime/library/library_cache.h"

namespace kiln::runtime::lib {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

struct ConvPlan {
  std::string key;
  // Keys the reordered weights in a LibraryCache: the format they are reordered into, not the
  // plan (whose key holds the thread count), so that runs granted different thread counts
  // share one copy when the primitives take the same format.
  std::string weightsKey;
  dnnl::convolution_forward prim;
  memory::desc srcMd, weightsMd, dstMd;              // What the primitive reads and writes.
  memory::desc userSrcMd, userWeightsMd, userDstMd;  // What the caller holds.
  memory::desc scratchMd, biasMd;
  std::optional<ReorderPlan> srcIn, weightsIn, dstIn, dstOut;
  size_t fusedPostOps = 0;       // Leading post-ops in the primitive; the epilogue runs the rest.
  int sumPostOp = -1;            // The post-op index done as a sum (dst prefilled with it).
  std::vector<int> binaryIndex;  // Per post-op: its binary post-op position, or -1.
};

PlanCache<ConvPlan>& convPlans() {
  static PlanCache<ConvPlan> cache(kPlanCacheCapacity);
  return cache;
}

memory::desc activationMd(int64_t n, int64_t c, int64_t h, int64_t w, bool channelsLast,
                          memory::data_type type = memory::data_type::f32) {
  return memory::desc({n, c, h, w}, type, channelsLast ? Tag::nhwc : Tag::nchw);
}

memory::dims weightDims(const ConvGeometry& g) {
  if (g.group == 1) return {g.m, g.c, g.kh, g.kw};
  return {g.group, g.mPerGroup(), g.cPerGroup(), g.kh, g.kw};
}

std::string planKey(const ConvGeometry& g, ConvAlgo algo, bool channelsLast, bool bias,
                    std::span<const PostOp> post, memory::data_type in = memory::data_type::f32,
                    bool weightsCached = true) {
  CacheKey key("conv2d");
  key.add(int64_t{static_cast<int64_t>(algo)}).add(int64_t{channelsLast}).add(int64_t{bias});
  key.add(int64_t{static_cast<int64_t>(in)}).add(int64_t{weightsCached});
  for (int64_t v : {g.n, g.c, g.h, g.w, g.m, g.kh, g.kw, g.oh, g.ow, g.group, g.strideH, g.strideW,
                    g.padTop, g.padLeft, g.padBottom, g.padRight, g.dilH, g.dilW})
    key.add(v);
  key.add(post).add(int64_t{maxThreads()});
  return key.str();
}

// `in`: the source's and the weights' type (f32 or bf16); everything else is f32.
// `weightsCached`: the reordered weights are kept across calls (a LibraryCache), so winograd
// takes them transformed (forward_inference: a transform of 512x512 3x3 weights costs 42 ms);
// otherwise (training: the weights change every step) it takes them blocked and transforms
// them inside each call (forward_training: 0.5 ms for the reorder).
Expected<std::shared_ptr<const ConvPlan>> makePlan(std::string key, const ConvGeometry& g,
                                                   ConvAlgo algo, bool channelsLast, bool bias,
                                                   std::span<const PostOp> post,
                                                   memory::data_type in = memory::data_type::f32,
                                                   bool weightsCached = true) {
  const auto f32 = memory::data_type::f32;
  auto plan = std::make_shared<ConvPlan>();
  plan->key = std::move(key);
  plan->userSrcMd = activationMd(g.n, g.c, g.h, g.w, channelsLast, in);
  plan->userDstMd = activationMd(g.n, g.m, g.oh, g.ow, channelsLast);
  plan->userWeightsMd = memory::desc(weightDims(g), in, g.group == 1 ? Tag::oihw : Tag::goihw);
  const memory::desc weightsAny(weightDims(g), in, Tag::any);
  const memory::desc biasMd = bias ? memory::desc({g.m}, f32, Tag::x) : memory::desc();
  const auto alg = algo == ConvAlgo::kWinograd ? dnnl::algorithm::convolution_winograd
                                               : dnnl::algorithm::convolution_direct;
  const auto prop = algo == ConvAlgo::kWinograd && !weightsCached
                        ? dnnl::prop_kind::forward_training
                        : dnnl::prop_kind::forward_inference;
  // Activation formats to try, best first (see the file comment).
  std::vector<std::pair<memory::desc, memory::desc>> formats;
  if (channelsLast && alg == dnnl::algorithm::convolution_direct)
    formats.emplace_back(plan->userSrcMd, plan->userDstMd);
  formats.emplace_back(memory::desc({g.n, g.c, g.h, g.w}, in, Tag::any),
                       memory::desc({g.n, g.m, g.oh, g.ow}, f32, Tag::any));

  auto tryCreate = [&](const std::pair<memory::desc, memory::desc>& fmt,
                       const dnnl::primitive_attr& attr)
      -> std::optional<dnnl::convolution_forward::primitive_desc> {
    try {
      dnnl::convolution_forward::desc d(prop, alg, fmt.first, weightsAny, biasMd, fmt.second,
                                        {g.strideH, g.strideW}, {g.dilH - 1, g.dilW - 1},
                                        {g.padTop, g.padLeft}, {g.padBottom, g.padRight});
      return dnnl::convolution_forward::primitive_desc(d, attr, cpuEngine());
    } catch (const dnnl::error&) {
      return std::nullopt;
    }
  };

  std::optional<dnnl::convolution_forward::primitive_desc> pd;
  // The caller passes only the post-ops it lets the primitive run (fusedPostOpPrefix).
  if (const size_t exact = fusedPostOpPrefix(post, /*activations=*/true); exact > 0) {
    dnnl::post_ops ops;
    appendPostOps(ops, post.first(exact), /*sumForFirstAdd=*/true, plan->userDstMd,
                  plan->binaryIndex);
    const dnnl::primitive_attr fusedAttr = makeAttr(ops);
    for (const auto& fmt : formats) {
      pd = tryCreate(fmt, fusedAttr);
      if (pd && !isReferenceImpl(*pd)) break;
      pd.reset();
    }
    plan->fusedPostOps = pd ? exact : 0;
  }
  if (plan->fusedPostOps == 0) plan->binaryIndex.clear();
  plan->binaryIndex.resize(post.size(), -1);  // The epilogue's post-ops read their addends.
  if (!pd) {
    const dnnl::primitive_attr plainAttr = makeAttr(dnnl::post_ops());
    for (const auto& fmt : formats)
      if ((pd = tryCreate(fmt, plainAttr))) break;
  }
  if (!pd)
    return unimplemented(std::string("oneDNN has no ") + std::string(convAlgoName(algo)) +
                         " convolution for this shape");
  if (in != f32 && isReferenceImpl(*pd))
    return unimplemented("oneDNN runs this bf16 convolution on its reference code");
  {
    for (size_t i = 0; i < plan->fusedPostOps; ++i) {
      if (post[i].kind == PostOp::Kind::kAdd && plan->binaryIndex[i] < 0) {
        plan->sumPostOp = static_cast<int>(i);
        break;
      }
    }
  }
  plan->prim = dnnl::convolution_forward(*pd);
  plan->srcMd = pd->src_desc();
  plan->weightsMd = pd->weights_desc();
  plan->weightsKey = "conv-weights:" + describeMd(plan->weightsMd);
  plan->dstMd = pd->dst_desc();
  plan->scratchMd = pd->scratchpad_desc();
  plan->biasMd = biasMd;
  if (plan->srcMd != plan->userSrcMd) plan->srcIn = makeReorder(plan->userSrcMd, plan->srcMd);
  if (plan->weightsMd != plan->userWeightsMd)
    plan->weightsIn = makeReorder(plan->userWeightsMd, plan->weightsMd);
  if (plan->dstMd != plan->userDstMd) {
    plan->dstOut = makeReorder(plan->dstMd, plan->userDstMd);
    if (plan->sumPostOp >= 0) plan->dstIn = makeReorder(plan->userDstMd, plan->dstMd);
  }
  return std::shared_ptr<const ConvPlan>(std::move(plan));
}

}  // namespace

namespace {

// A yes/no answer per key, computed once per process (negative ones included: the plan cache
// keeps only plans that exist). The lock is not held while computing (a probe runs
// primitives); threads racing on one key compute the same answer.
bool memoized(const std::string& key, const std::function<bool()>& compute) {
  static std::mutex mu;
  static std::unordered_map<std::string, bool> answers;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = answers.find(key); it != answers.end()) return it->second;
  }
  const bool answer = compute();
  std::lock_guard<std::mutex> lock(mu);
  answers.emplace(key, answer);
  return answer;
}

// A key of the shape (and the budget: runtime::numThreads()), not of this call's thread count.
std::string shapeKey(std::string_view family, const ConvGeometry& g, bool weightsCached) {
  CacheKey key(family);
  for (int64_t v : {g.n, g.c, g.h, g.w, g.m, g.oh, g.ow, g.padTop, g.padLeft, g.padBottom,
                    g.padRight, int64_t{weightsCached}, int64_t{numThreads()}})
    key.add(v);
  return key.str();
}

// The thread counts a call can be granted (runtime::ComputeThreads: 1 to the budget; fewer than
// the budget while other runs are in progress or the machine is loaded): every count up to 8,
// then powers of two and the budget itself.
std::vector<int> grantableThreadCounts() {
  const int budget = std::max(1, numThreads());
  std::vector<int> counts;
  for (int t = 1; t <= budget; t = t < 8 ? t + 1 : t * 2) counts.push_back(t);
  if (counts.back() != budget) counts.push_back(budget);
  return counts;
}

// `fuseAdds`: leading kAdd post-ops go into the primitive (a sum post-op, binary adds); false:
// every post-op runs in kiln's epilogue pass.
Status runConvWhole(const Call& call, const ConvGeometry& g, ConvAlgo algo, bool fuseAdds = true);

// Whether winograd computes this shape to the same bits whatever the thread count a call is
// granted, which kiln promises for every compiled model (tests/compiler/test_concurrency.cpp):
// oneDNN 2.6 sizes its winograd schedule by the thread count (W_SGD where the tiles split into
// at least 1.5 blocks a thread and a block fits L2, else W_S_G_D), and the two sum the channels
// in different orders. Measured: 32 -> 64 channels at 14x14, batch 2, differs between 1 and 2
// threads; resnet18's and resnet50's shapes do not. Probed once per shape and budget
// (runtime::numThreads()): each grantable count (grantableThreadCounts) runs the primitive made
// for it on the same data, and the outputs must be equal bit for bit. It costs a compile the
// first calls of each winograd shape: resnet18 at batch 1 115 -> 270 ms, resnet50 at batch 32
// 180 -> 800 ms (2 threads).
bool probeWinogradThreadInvariance(const ConvGeometry& g, bool weightsCached) {
  const std::vector<int> counts = grantableThreadCounts();
  if (counts.size() == 1) return true;  // One thread count: nothing to differ from.
  auto x = Tensor::empty(ir::DType::kF32, {g.n, g.c, g.h, g.w});
  auto w = Tensor::empty(ir::DType::kF32, {g.m, g.c, g.kh, g.kw});
  if (!x || !w) return false;
  uint32_t state = 12345;
  for (Tensor* t : {&*x, &*w}) {
    float* v = t->data<float>();
    for (int64_t i = 0; i < t->numElements(); ++i) {
      state = state * 1664525u + 1013904223u;
      v[i] = static_cast<float>(state >> 8) * 0x1p-24f - 0.5f;
    }
  }
  const std::vector<Tensor> in{*x, *w};
  const ir::AttrMap noAttrs;  // runConvWhole reads the geometry, not the attributes.
  const ir::AttrView attrs(ir::opInfo(ir::OpKind::kConv2d), noAttrs);
  struct RestoreThreads {
    int before = omp_get_max_threads();
    ~RestoreThreads() { omp_set_num_threads(before); }
  } restore;
  std::optional<Tensor> first;
  for (const int t : counts) {
    omp_set_num_threads(t);
    auto out = Tensor::empty(ir::DType::kF32, {g.n, g.m, g.oh, g.ow});
    if (!out) return false;
    LibraryCache cache;  // As the calls will hold the weights: cached, or reordered per call.
    LibraryOptions options;
    options.algo = ConvAlgo::kWinograd;
    options.cache = weightsCached ? &cache : nullptr;
    if (!runConvWhole({attrs, in, {}, {}, *out, options}, g, ConvAlgo::kWinograd).isOk())
      return false;
    if (!first)
      first = std::move(*out);
    else if (!out->toData().bitwiseEqual(first->toData()))
      return false;
  }
  return true;
}

}  // namespace

bool winogradAvailable(const ConvGeometry& g) {
  // Winograd needs a square 3x3 stride-1 dense kernel in every oneDNN implementation; skip
  // the probe (and its primitive descriptor) for everything else.
  if (g.group != 1 || g.kh != 3 || g.kw != 3 || g.strideH != 1 || g.strideW != 1 || g.dilH != 1 ||
      g.dilW != 1)
    return false;
  const std::string key = planKey(g, ConvAlgo::kWinograd, false, false, {});
  return memoized("available:" + key, [&] {
    return convPlans()
        .getOrCreate(key, [&] { return makePlan(key, g, ConvAlgo::kWinograd, false, false, {}); })
        .hasValue();
  });
}

bool winogradThreadInvariant(const ConvGeometry& g, bool weightsCached) {
  return memoized(shapeKey("winograd-thread-invariant", g, weightsCached), [&] {
    try {
      return probeWinogradThreadInvariance(g, weightsCached);
    } catch (const std::exception&) {  // oneDNN or allocation failures: direct it is.
      return false;
    }
  });
}

// Measured on an AMD Zen 5 (AVX-512, 2 threads), a 3x3 convolution from NHWC to NHWC
// (winograd's reorders to and from its blocked format included), winograd's time over the
// direct one's. C -> C channels at batch 1: C=16 1.1-2.2 at every size, C=32 0.84 (56x56) to 2.2
// (7x7), C=64 0.51 (112x112) to 1.5 (7x7), C=128 0.40-0.92, C>=256 0.37-0.89; at batch 32: C=16
// 1.2-3.4, C=32 0.73-0.76 at 56 and 28 but 1.19 at 14x14, C=64 0.57-0.86, C=256 0.45-0.61, C=128
// at 7x7 1.02. Other channel pairs at batch 1: 128 -> 32 (densenet's) 0.68 (56x56), 0.70 (28),
// 0.94 (14), 1.44 (7); 32 -> 128 0.65 (28), 48 -> 192 0.79 (13x13), 16 -> 64 0.90 (56).
// Its costs beyond the products are the transforms, per tile and channel (C + M against the
// products' C x M), and the tiles' waste where the output is no multiple of its 4x4 tiles (14 ->
// 16: 1.31x the work): `score` below, C x M / (C + M) over that waste, must be >= 16 (C = M = 32
// at 56x56 gives 16: 0.84; at 14x14 12.2: 1.16-1.19), and the product N x OH x OW x C x M large
// enough (C = M = 64 at 7x7, batch 1, 3.6 MFLOP: 1.52). The same holds for the two gradients
// (resnet18's 3x3 layers at batch 32: data 15.9 -> 6.7 ms, weights 17.7 -> 13.2 ms at 64
// channels, 14.7 -> 7.1 and 13.2 -> 9.0 ms at 512).
// Weights transformed in each call (not cached: training) cost about as much as 1,000 output
// pixels' products (batch 1, 512 channels at 7x7: 1.9 ms, direct 0.37; 64 at 56x56: 0.30 ms,
// direct 0.44), so there winograd needs that many pixels too.
bool prefersWinograd(const ConvGeometry& g, bool weightsCached) {
  constexpr double kMinScore = 16;
  constexpr int64_t kMinProduct = int64_t{1} << 19;  // N*OH*OW*C*M.
  constexpr int64_t kMinPixelsPerTransform = 1024;   // N*OH*OW.
  constexpr int64_t kTile = 4;                       // oneDNN's F(4x4, 3x3).
  if (g.c <= 0 || g.m <= 0 || g.oh <= 0 || g.ow <= 0) return false;
  const int64_t pixels = g.n * g.oh * g.ow;
  if (pixels * g.c * g.m < kMinProduct) return false;
  if (!weightsCached && pixels < kMinPixelsPerTransform) return false;
  const double waste = static_cast<double>((g.oh + kTile - 1) / kTile * kTile *
                                           ((g.ow + kTile - 1) / kTile * kTile)) /
                       static_cast<double>(g.oh * g.ow);
  const double score = static_cast<double>(g.c * g.m) / static_cast<double>(g.c + g.m) / waste;
  if (score < kMinScore) return false;
  // One lookup a call once the shape is known (this runs at every kAuto convolution).
  return memoized(shapeKey("winograd-preferred", g, weightsCached), [&] {
    return winogradAvailable(g) && winogradThreadInvariant(g, weightsCached);
  });
}

namespace {

// Images per slice of a large channels-last convolution whose post-ops end in kiln's epilogue
// pass (an activation after oneDNN: fusedPostOpPrefix), or 0 for one call: the largest
// divisor of the batch whose output slice fits in kSliceBytes, so that the epilogue reads the
// slice back from the cache oneDNN just wrote it to instead of from memory. A slice's residual
// adds run in that pass too, not as oneDNN's sum post-op: brgconv reads a prefilled dst at 14
// GB/s (a 1x1 64->256 convolution at batch 32, 56x56: 7.6 ms, 15.1 ms with the sum), where the
// pass streams the residual once. resnet50 at batch 32 (2 threads): conv2d+add+relu 176 -> 148
// ms, the model 622-633 -> 596-612 ms; slices of 1 MB were as fast, of 12 MB 3% slower.
int64_t imagesPerSlice(const Call& call, const ConvGeometry& g) {
  constexpr int64_t kSliceBytes = int64_t{4} << 20;
  if (!call.options.channelsLast || g.n < 2 ||
      fusedPostOpPrefix(call.post, /*activations=*/false) == call.post.size())
    return 0;
  // Activations oneDNN may run (fuseActivations) need no pass at all, unless a residual add
  // comes with them: that one is faster in the pass than as the sum post-op (below; resnet50 at
  // batch 32: 530 ms sliced, 540 with everything fused).
  const bool adds = std::any_of(call.post.begin(), call.post.end(),
                                [](const PostOp& p) { return p.kind == PostOp::Kind::kAdd; });
  if (!adds && fusedPostOpPrefix(call.post, call.options.fuseActivations) == call.post.size())
    return 0;
  const int64_t image = g.m * g.oh * g.ow * static_cast<int64_t>(sizeof(float));
  if (image * g.n <= 2 * kSliceBytes) return 0;
  int64_t best = 1;
  for (int64_t k = 1; k < g.n; ++k)
    if (g.n % k == 0 && k * image <= kSliceBytes) best = k;
  return best;
}

}  // namespace

Status runConvDnnl(const Call& call, const ConvGeometry& g, ConvAlgo algo) {
  const int64_t slice = algo == ConvAlgo::kDirect ? imagesPerSlice(call, g) : 0;
  if (slice == 0) return runConvWhole(call, g, algo);
  // Channels-last images are contiguous: each slice is a view of the batch's tensors.
  auto view = [&](const Tensor& t, int64_t first) {
    Shape shape = t.shape();
    const size_t image = t.byteSize() / static_cast<size_t>(shape[0]);
    shape[0] = slice;
    return Tensor::wrap(const_cast<std::byte*>(t.rawData()) + image * static_cast<size_t>(first),
                        t.dtype(), shape);
  };
  ConvGeometry gs = g;
  gs.n = slice;
  std::vector<Tensor> in(call.in.begin(), call.in.end()), extra(call.extra.size());
  for (int64_t first = 0; first < g.n; first += slice) {
    in[0] = view(call.in[0], first);
    for (size_t i = 0; i < extra.size(); ++i) extra[i] = view(call.extra[i], first);
    Tensor out = view(call.out, first);
    KILN_TRY(runConvWhole({call.attrs, in, call.post, extra, out, call.options}, gs, algo,
                          /*fuseAdds=*/false));
    if (call.options.prepare) break;  // Every slice runs the same plan.
  }
  return Status::ok();
}

namespace {

Status runConvWhole(const Call& call, const ConvGeometry& g, ConvAlgo algo, bool fuseAdds) {
  const bool bias = call.in.size() == 3;
  const bool channelsLast = call.options.channelsLast;
  const memory::data_type in = operandType(call.in[0].dtype());
  const std::span<const PostOp> fused =
      fuseAdds ? call.post.first(fusedPostOpPrefix(call.post, call.options.fuseActivations))
               : std::span<const PostOp>{};
  const bool weightsCached = call.options.cache != nullptr;
  const std::string key = planKey(g, algo, channelsLast, bias, fused, in, weightsCached);
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const ConvPlan> plan, convPlans().getOrCreate(key, [&] {
    return makePlan(key, g, algo, channelsLast, bias, fused, in, weightsCached);
  }));
  // Preparing reads the weights only, and keeps them only in a cache.
  if (call.options.prepare && !call.options.cache) return Status::ok();
  // Weights: the caller's, cached reordered ones, or reordered now.
  const Tensor& w = call.in[1];
  const void* weights = w.rawData();
  std::shared_ptr<const AlignedBuffer> cached;  // Keeps a cache entry alive during the call.
  if (plan->weightsIn) {
    auto fill = [&](std::byte* to) { runReorder(*plan->weightsIn, w.rawData(), to); };
    if (call.options.cache) {
      cached = call.options.cache->impl().getOrCreate(plan->weightsKey, w,
                                                      plan->weightsMd.get_size(), fill);
      weights = cached->data();
    } else {
      std::byte* tmp = scratch(Scratch::kWeights, plan->weightsMd.get_size());
      fill(tmp);
      weights = tmp;
    }
  }
  if (call.options.prepare) {  // The scratch the runs will use, mapped now.
    if (plan->srcIn) (void)scratch(Scratch::kSrc, plan->srcMd.get_size());
    if (plan->dstOut) (void)scratch(Scratch::kDst, plan->dstMd.get_size());
    (void)scratchpad(plan->scratchMd);
    return Status::ok();
  }
  // The sum post-op's residual may be the output itself; any other aliased extra is copied.
  int keep = plan->sumPostOp >= 0 ? call.post[plan->sumPostOp].input : -1;
  for (size_t i = 0; i < call.post.size(); ++i)
    if (static_cast<int>(i) != plan->sumPostOp && call.post[i].input == keep) keep = -1;
  const std::vector<Tensor> extra = detachAliasedExtras(call.extra, call.out, keep);
  float* y = call.out.data<float>();
  // Source.
  const void* src = call.in[0].rawData();
  if (plan->srcIn) {
    void* tmp = scratch(Scratch::kSrc, plan->srcMd.get_size());
    runReorder(*plan->srcIn, src, tmp);
    src = tmp;
  }
  // Destination, prefilled with the residual of a sum post-op.
  void* dst = plan->dstOut ? static_cast<void*>(scratch(Scratch::kDst, plan->dstMd.get_size()))
                           : static_cast<void*>(y);
  if (plan->sumPostOp >= 0) {
    const Tensor& residual = extra[static_cast<size_t>(call.post[plan->sumPostOp].input)];
    if (plan->dstIn)
      runReorder(*plan->dstIn, residual.rawData(), dst);
    else if (residual.rawData() != dst)  // An in-place residual is already there.
      parallelCopy(static_cast<float*>(dst), residual.data<float>(), residual.numElements());
  }

  CallArgs args(plan.get());
  args.set(DNNL_ARG_SRC, plan->srcMd, src)
      .set(DNNL_ARG_WEIGHTS, plan->weightsMd, weights)
      .set(DNNL_ARG_DST, plan->dstMd, dst);
  if (bias) args.set(DNNL_ARG_BIAS, plan->biasMd, call.in[2].rawData());
  for (size_t i = 0; i < plan->binaryIndex.size(); ++i) {
    if (plan->binaryIndex[i] < 0) continue;
    const Tensor& addend = extra[static_cast<size_t>(call.post[i].input)];
    args.set(DNNL_ARG_ATTR_MULTIPLE_POST_OP(plan->binaryIndex[i]) | DNNL_ARG_SRC_1, plan->userDstMd,
             addend.rawData());
  }
  if (std::byte* pad = scratchpad(plan->scratchMd))
    args.set(DNNL_ARG_SCRATCHPAD, plan->scratchMd, pad);
  plan->prim.execute(threadStream(), args.map());
  if (plan->dstOut) runReorder(*plan->dstOut, dst, y);

  if (plan->fusedPostOps < call.post.size()) {
    const auto post = resolvePostOps(call.post, extra);
    const int64_t cols = g.oh * g.ow;
    applyEpilogue(y, call.out.numElements() / cols, cols, cols, Addend{},
                  std::span(post).subspan(plan->fusedPostOps));
  }
  return Status::ok();
}

}  // namespace

}  // namespace kiln::runtime::lib
