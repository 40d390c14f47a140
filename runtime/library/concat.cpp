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
  const dnnl::concat::primitive_desc pd(dst, static_cast<int>(axis), srcs, cpuEngine());
  // The primitive is created at every call: oneDNN's primitive cache keeps it.
  if (call.options.prepare) {
    dnnl::concat prepared(pd);
    return Status::ok();
  }
  std::unordered_map<int, memory> args;
  for (size_t i = 0; i < used.size(); ++i)
    args.emplace(DNNL_ARG_MULTIPLE_SRC + static_cast<int>(i),
                 memory(srcs[i], cpuEngine(),
                        static_cast<void*>(const_cast<std::byte*>(used[i]->rawData()))));
  args.emplace(DNNL_ARG_DST, memory(dst, cpuEngine(), call.out.rawData()));
  if (const size_t bytes = pd.scratchpad_desc().get_size(); bytes > 0)
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 memory(pd.scratchpad_desc(), cpuEngine(), scratch(Scratch::kPrimitive, bytes)));
  dnnl::concat(pd).execute(threadStream(), args);
  return Status::ok();
}

}  // namespace kiln::runtime::lib
