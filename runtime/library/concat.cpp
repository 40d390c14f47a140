// concat with oneDNN's concat primitive: any rank in plain (row-major) layout, and 4-D
// channels-last (NHWC) tensors along any axis, so that layout selection keeps a concatenation
// between convolutions (SqueezeNet's fire modules, DenseNet's blocks) channels-last instead of
// converting its inputs to NCHW and its output back.
#include <dnnl.hpp>

#include "runtime/library/dnnl_support.h"
#include "runtime/library/families.h"

namespace kiln::runtime::lib {

namespace {

using dnnl::memory;

memory::desc descOf(const ir::Shape& shape, bool channelsLast) {
  const memory::dims dims(shape.begin(), shape.end());
  return channelsLast ? memory::desc(dims, memory::data_type::f32, memory::format_tag::nhwc)
                      : plainMd(dims);
}

struct ConcatPlan {
  dnnl::concat prim;
  memory::desc scratchMd;
};

// Primitives by shapes: making the primitive descriptor costs about 10 us a call even where
// oneDNN's own primitive cache then hits (SqueezeNet's first concat: 44 us a step for 30 us
// of copying).
PlanCache<ConcatPlan>& concatPlans() {
  static PlanCache<ConcatPlan> cache(kPlanCacheCapacity);
  return cache;
}

}  // namespace

Status runConcat(const Call& call) {
  const int rank = call.out.rank();
  if (rank == 0 || rank > DNNL_MAX_NDIMS)
    return unimplemented("concat of rank " + std::to_string(rank) + " tensors");
  const bool channelsLast = call.options.channelsLast;
  if (channelsLast && rank != 4) return invalidArgument("concat: channels-last needs 4-D tensors");
  int64_t axis = call.attrs.getInt("axis");
  if (axis < 0) axis += rank;
  std::vector<memory::desc> srcs;
  std::vector<const Tensor*> used;
  for (const Tensor& t : call.in) {
    if (t.numElements() == 0) continue;  // Adds nothing; oneDNN takes no empty source.
    srcs.push_back(descOf(t.shape(), channelsLast));
    used.push_back(&t);
  }
  if (srcs.empty()) return Status::ok();  // An empty output.
  const memory::desc dst = descOf(call.out.shape(), channelsLast);
  CacheKey key("concat");
  key.add(int64_t{channelsLast}).add(axis).add(int64_t{maxThreads()});
  for (const Tensor* t : used) key.add(std::span<const int64_t>(t->shape()));
  key.add(std::span<const int64_t>(call.out.shape()));
  KILN_ASSIGN_OR_RETURN(
      std::shared_ptr<const ConcatPlan> plan,
      concatPlans().getOrCreate(key.str(), [&]() -> Expected<std::shared_ptr<const ConcatPlan>> {
        const dnnl::concat::primitive_desc pd(dst, static_cast<int>(axis), srcs, cpuEngine(),
                                              makeAttr(dnnl::post_ops()));
        auto made = std::make_shared<ConcatPlan>();
        made->prim = dnnl::concat(pd);
        made->scratchMd = pd.scratchpad_desc();
        return std::shared_ptr<const ConcatPlan>(std::move(made));
      }));
  if (call.options.prepare) return Status::ok();
  std::unordered_map<int, memory> args;
  for (size_t i = 0; i < used.size(); ++i)
    args.emplace(DNNL_ARG_MULTIPLE_SRC + static_cast<int>(i),
                 memory(srcs[i], cpuEngine(),
                        static_cast<void*>(const_cast<std::byte*>(used[i]->rawData()))));
  args.emplace(DNNL_ARG_DST, memory(dst, cpuEngine(), call.out.rawData()));
  if (const size_t bytes = plan->scratchMd.get_size(); bytes > 0)
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 memory(plan->scratchMd, cpuEngine(), scratch(Scratch::kPrimitive, bytes)));
  plan->prim.execute(threadStream(), args);
  return Status::ok();
}

}  // namespace kiln::runtime::lib
