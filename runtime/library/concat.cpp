// concat: any rank in plain (row-major) layout, and 4-D channels-last (NHWC) tensors along any
// axis, so that layout selection keeps a concatenation between convolutions (SqueezeNet's fire
// modules, DenseNet's blocks) channels-last instead of converting its inputs to NCHW and its
// output back.
//
// Where every input is a run of whole rows of the output (plain along any axis; NHWC along
// channels), kiln copies them itself: the output in blocks of rows, each block filled from every
// input while its lines are in cache. oneDNN's concat primitive (the other NHWC axes) moved
// DenseNet's NHWC channel concatenations (up to 32 inputs of 32 channels: 128-byte pieces) at
// 23 GB/s where a copy runs at 40-70.
#include <dnnl.hpp>

#include <algorithm>
#include <cstring>

#include "runtime/cpu/chunk_queues.h"
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

// Copies `n` floats; the loop is vectorized (memcpy is a call per piece, and pieces are small).
void copyFloats(float* __restrict dst, const float* __restrict src, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) dst[j] = src[j];
}

// out[r][offset_i .. offset_i + width_i) = in_i[r][0 .. width_i) for every row r < rows, in
// elements of `bytes` bytes.
void concatRows(std::span<const Tensor* const> in, std::span<const int64_t> width, int64_t rows,
                std::byte* out, size_t bytes) {
  int64_t total = 0;
  for (int64_t w : width) total += w;
  // Blocks of about 16 KiB of output; a block is filled from every input before the next.
  const int64_t blockRows = std::max<int64_t>(1, (int64_t{16} << 10) / (total * int64_t(bytes)));
  const int64_t blocks = (rows + blockRows - 1) / blockRows;
  const bool parallel = rows * total * int64_t(bytes) >= (int64_t{1} << 16);
  parallelUnits(blocks, parallel, [&](int64_t b) {
    const int64_t r0 = b * blockRows, r1 = std::min(rows, r0 + blockRows);
    int64_t offset = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const int64_t w = width[i];
      const std::byte* src = in[i]->rawData();
      for (int64_t r = r0; r < r1; ++r) {
        std::byte* to = out + (r * total + offset) * int64_t(bytes);
        const std::byte* from = src + r * w * int64_t(bytes);
        if (bytes == sizeof(float))
          copyFloats(reinterpret_cast<float*>(to), reinterpret_cast<const float*>(from), w);
        else
          std::memcpy(to, from, static_cast<size_t>(w) * bytes);
      }
      offset += w;
    }
  });
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
  // Rows of the output, in memory order: everything before the axis (NHWC along channels: the
  // pixels), each input's row its part of the axis times everything after it.
  if (!channelsLast || axis == 1) {
    if (call.options.prepare) return Status::ok();
    const ir::Shape& os = call.out.shape();
    int64_t rows = 1, inner = 1;
    if (channelsLast) {
      rows = os[0] * os[2] * os[3];
    } else {
      for (int64_t d = 0; d < axis; ++d) rows *= os[static_cast<size_t>(d)];
      for (int64_t d = axis + 1; d < rank; ++d) inner *= os[static_cast<size_t>(d)];
    }
    std::vector<int64_t> width;
    for (const Tensor* t : used) width.push_back(t->shape()[static_cast<size_t>(axis)] * inner);
    concatRows(used, width, rows, call.out.rawData(), ir::dtypeSize(call.out.dtype()));
    return Status::ok();
  }
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
  if (call.options.prepare) {  // The scratch the runs will use, mapped now.
    (void)scratchpad(plan->scratchMd);
    return Status::ok();
  }
  std::unordered_map<int, memory> args;
  for (size_t i = 0; i < used.size(); ++i)
    args.emplace(DNNL_ARG_MULTIPLE_SRC + static_cast<int>(i),
                 memory(srcs[i], cpuEngine(),
                        static_cast<void*>(const_cast<std::byte*>(used[i]->rawData()))));
  args.emplace(DNNL_ARG_DST, memory(dst, cpuEngine(), call.out.rawData()));
  if (std::byte* pad = scratchpad(plan->scratchMd))
    args.emplace(DNNL_ARG_SCRATCHPAD, memory(plan->scratchMd, cpuEngine(), pad));
  plan->prim.execute(threadStream(), args);
  return Status::ok();
}

}  // namespace kiln::runtime::lib
