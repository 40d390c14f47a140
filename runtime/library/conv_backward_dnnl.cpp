// The gradients of conv2d through oneDNN 2.6: conv2d_backward_data (d input) and
// conv2d_backward_weight (d weight), NCHW or channels-last (NHWC) activations and OIHW weights.
// Channels-last activations run as they are; for NCHW ones the primitives choose their formats
// (`any`; brgconv on AVX-512 works channels-last or blocked) and kiln reorders in and out, as
// conv_dnnl.cpp does for NCHW forward convolutions.
// Shapes that oneDNN would run on its reference implementation return kUnimplemented, so that
// kiln's own reference kernel (parallel, vectorized) runs them instead.
// bf16 operands (autocast, where runtime::nativeBf16Convolutions()): the two operands read are
// bf16, the gradient written f32 (the caller rounds it once), on oneDNN's bf16 kernels. Algorithm:
// winograd where the forward convolution would take it by default (prefersWinograd: f32, 3x3 stride
// 1, enough channels) or where the node asks for it; it works in oneDNN's blocked formats, so its
// activations are reordered in and out as NCHW ones are.
#include <optional>
#include <string>
#include <unordered_map>

#include "runtime/library/dnnl_support.h"
#include "runtime/library/families.h"

namespace kiln::runtime::lib {

namespace {

using dnnl::memory;
using Tag = memory::format_tag;

// One backward primitive and the reorders between the caller's formats and its own, for the
// two operands it reads (a, b) and the one it writes (out).
struct BackwardPlan {
  dnnl::primitive prim;
  int argA = 0, argB = 0, argOut = 0;
  memory::desc aMd, bMd, outMd, scratchMd;
  std::optional<ReorderPlan> aIn, bIn, outOut;
};

PlanCache<BackwardPlan>& plans() {
  static PlanCache<BackwardPlan> cache(kPlanCacheCapacity);
  return cache;
}

std::optional<ReorderPlan> reorderIfNeeded(const memory::desc& from, const memory::desc& to) {
  if (from == to) return std::nullopt;
  return makeReorder(from, to);
}

// Channels-last activations run as they are on the direct algorithm (its backward runs nhwc as
// fast as blocked formats: resnet18's layer1 shape 15.0 / 14.4 ms against 15.0 / 15.8), NCHW
// ones and winograd's in the primitive's choice of format.
// `in`: the type of the operands read (f32 or bf16); the gradient written is f32.
Expected<std::shared_ptr<const BackwardPlan>> makePlan(const ConvGeometry& g, bool weights,
                                                       bool nhwc, memory::data_type in,
                                                       bool winograd) {
  const auto f32 = memory::data_type::f32;
  // The gradient written is f32, what it is computed from `in`.
  const auto srcType = weights ? in : f32, wType = weights ? f32 : in;
  const memory::dims src{g.n, g.c, g.h, g.w}, dst{g.n, g.m, g.oh, g.ow};
  const memory::dims wdims = g.group == 1
                                 ? memory::dims{g.m, g.c, g.kh, g.kw}
                                 : memory::dims{g.group, g.mPerGroup(), g.cPerGroup(), g.kh, g.kw};
  const Tag activations = nhwc && !winograd ? Tag::nhwc : Tag::any,
            user = nhwc ? Tag::nhwc : Tag::nchw;
  const memory::desc srcAny(src, srcType, activations), dstAny(dst, in, activations),
      wAny(wdims, wType, Tag::any);
  const memory::desc srcUser(src, srcType, user), dstUser(dst, in, user),
      wUser(wdims, wType, g.group == 1 ? Tag::oihw : Tag::goihw);
  const memory::dims strides{g.strideH, g.strideW}, dil{g.dilH - 1, g.dilW - 1},
      padL{g.padTop, g.padLeft}, padR{g.padBottom, g.padRight};
  const auto alg =
      winograd ? dnnl::algorithm::convolution_winograd : dnnl::algorithm::convolution_direct;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  // The forward the gradients belong to (its operands all in `in`).
  const dnnl::convolution_forward::primitive_desc hint(
      dnnl::convolution_forward::desc(
          dnnl::prop_kind::forward_training, alg, memory::desc(src, in, activations),
          memory::desc(wdims, in, Tag::any), dstAny, strides, dil, padL, padR),
      cpuEngine());
  auto plan = std::make_shared<BackwardPlan>();
  if (weights) {
    dnnl::convolution_backward_weights::primitive_desc pd(
        dnnl::convolution_backward_weights::desc(alg, srcAny, wAny, dstAny, strides, dil, padL,
                                                 padR),
        attr, cpuEngine(), hint);
    if (isReferenceImpl(pd))
      return unimplemented("oneDNN runs this backward-weights shape on its reference");
    plan->prim = dnnl::convolution_backward_weights(pd);
    plan->argA = DNNL_ARG_DIFF_DST;
    plan->argB = DNNL_ARG_SRC;
    plan->argOut = DNNL_ARG_DIFF_WEIGHTS;
    plan->aMd = pd.diff_dst_desc();
    plan->bMd = pd.src_desc();
    plan->outMd = pd.diff_weights_desc();
    plan->scratchMd = pd.scratchpad_desc();
    plan->aIn = reorderIfNeeded(dstUser, plan->aMd);
    plan->bIn = reorderIfNeeded(srcUser, plan->bMd);
    plan->outOut = reorderIfNeeded(plan->outMd, wUser);
  } else {
    dnnl::convolution_backward_data::primitive_desc pd(
        dnnl::convolution_backward_data::desc(alg, srcAny, wAny, dstAny, strides, dil, padL, padR),
        attr, cpuEngine(), hint);
    if (isReferenceImpl(pd))
      return unimplemented("oneDNN runs this backward-data shape on its reference");
    plan->prim = dnnl::convolution_backward_data(pd);
    plan->argA = DNNL_ARG_DIFF_DST;
    plan->argB = DNNL_ARG_WEIGHTS;
    plan->argOut = DNNL_ARG_DIFF_SRC;
    plan->aMd = pd.diff_dst_desc();
    plan->bMd = pd.weights_desc();
    plan->outMd = pd.diff_src_desc();
    plan->scratchMd = pd.scratchpad_desc();
    plan->aIn = reorderIfNeeded(dstUser, plan->aMd);
    plan->bIn = reorderIfNeeded(wUser, plan->bMd);
    plan->outOut = reorderIfNeeded(plan->outMd, srcUser);
  }
  return std::shared_ptr<const BackwardPlan>(std::move(plan));
}

}  // namespace

// in: backward data (grad, weight, input), backward weight (grad, input, weight).
Status runConvBackwardDnnl(const Call& call, bool weights) {
  const Tensor& grad = call.in[0];
  const Tensor& x = weights ? call.in[1] : call.in[2];
  const Tensor& w = weights ? call.in[2] : call.in[1];
  const ConvGeometry g = ConvGeometry::of(call.attrs, x.shape(), w.shape());
  if (g.c == 0 || g.m == 0) return unimplemented("an empty convolution");
  CacheKey key(weights ? "conv2d_backward_weight" : "conv2d_backward_data");
  for (int64_t v : {g.n, g.c, g.h, g.w, g.m, g.kh, g.kw, g.oh, g.ow, g.group, g.strideH, g.strideW,
                    g.padTop, g.padLeft, g.padBottom, g.padRight, g.dilH, g.dilW})
    key.add(v);
  key.add(int64_t{maxThreads()});
  key.add(int64_t{call.options.channelsLast});
  const memory::data_type in = operandType(grad.dtype());
  key.add(int64_t{static_cast<int64_t>(in)});
  const bool winograd =
      in == memory::data_type::f32 &&
      (call.options.algo == ConvAlgo::kWinograd ||
       (call.options.algo == ConvAlgo::kAuto && prefersWinograd(g, /*weightsCached=*/false)));
  key.add(int64_t{winograd});
  KILN_ASSIGN_OR_RETURN(
      std::shared_ptr<const BackwardPlan> plan,
      plans().getOrCreate(key.str(), [&]() -> Expected<std::shared_ptr<const BackwardPlan>> {
        try {
          return makePlan(g, weights, call.options.channelsLast, in, winograd);
        } catch (const dnnl::error& e) {
          return unimplemented(std::string("oneDNN has no primitive: ") + e.what());
        }
      }));
  if (call.options.prepare) return Status::ok();
  const void* a = grad.rawData();
  const void* b = weights ? x.rawData() : w.rawData();
  if (plan->aIn) {
    void* tmp = scratch(Scratch::kDst, plan->aMd.get_size());
    runReorder(*plan->aIn, a, tmp);
    a = tmp;
  }
  if (plan->bIn) {
    void* tmp = scratch(weights ? Scratch::kSrc : Scratch::kWeights, plan->bMd.get_size());
    runReorder(*plan->bIn, b, tmp);
    b = tmp;
  }
  void* out = plan->outOut ? static_cast<void*>(scratch(Scratch::kExtra, plan->outMd.get_size()))
                           : call.out.rawData();
  std::unordered_map<int, memory> args{
      {plan->argA, memory(plan->aMd, cpuEngine(), const_cast<void*>(a))},
      {plan->argB, memory(plan->bMd, cpuEngine(), const_cast<void*>(b))},
      {plan->argOut, memory(plan->outMd, cpuEngine(), out)}};
  if (std::byte* pad = scratchpad(plan->scratchMd))
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(plan->scratchMd, cpuEngine(), pad));
  plan->prim.execute(threadStream(), args);
  if (plan->outOut) runReorder(*plan->outOut, out, call.out.rawData());
  return Status::ok();
}

}  // namespace kiln::runtime::lib
