#include "runtime/plan.h"

#include <omp.h>

#include <chrono>
#include <cstring>

#include "runtime/reference/kernels.h"

namespace kiln::runtime {

namespace {
// Below this many elements a kernel runs on the calling thread: waking the pool costs more.
constexpr int64_t kParallelThreshold = 1 << 15;
}  // namespace

void setNumThreads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
}
int numThreads() {
  return omp_get_max_threads();
}

PlanExecutor::PlanExecutor(std::shared_ptr<const Plan> plan, int threads)
    : plan_(std::move(plan)), threads_(threads), cache_(std::make_unique<LibraryCache>()) {
  arenaStorage_.reset(new std::byte[static_cast<size_t>(plan_->arenaBytes) + 64]);
  auto addr = reinterpret_cast<uintptr_t>(arenaStorage_.get());
  arena_ = arenaStorage_.get() + ((64 - addr % 64) % 64);
}

Expected<std::vector<Tensor>> PlanExecutor::run(std::span<const Tensor> inputs) {
  const Plan& p = *plan_;
  if (inputs.size() != p.inputs.size())
    return invalidArgument("the compiled model takes " + std::to_string(p.inputs.size()) +
                           " inputs, got " + std::to_string(inputs.size()));
  std::vector<Tensor> ins;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].dtype() != p.inputs[i].dtype || inputs[i].shape() != p.inputs[i].shape)
      return invalidArgument("input '" + p.inputNames[i] + "' (#" + std::to_string(i) +
                             "): expected " +
                             ir::TensorType{p.inputs[i].dtype, p.inputs[i].shape}.toString() +
                             ", got " + inputs[i].describe());
    KILN_ASSIGN_OR_RETURN(Tensor c, inputs[i].contiguous());
    ins.push_back(std::move(c));
  }
  std::vector<Tensor> outs;
  for (size_t i = 0; i < p.outputs.size(); ++i) {
    const auto& t = p.outputs[i];
    if (i < p.outputParameter.size() && p.outputParameter[i] >= 0) {
      // Written over its parameter in place: the result is a view of it.
      const ir::TensorData& d = p.parameters[static_cast<size_t>(p.outputParameter[i])];
      outs.push_back(Tensor::wrap(const_cast<std::byte*>(d.data()), t.dtype, t.shape));
      continue;
    }
    KILN_ASSIGN_OR_RETURN(Tensor o, Tensor::empty(t.dtype, t.shape));
    outs.push_back(std::move(o));
  }
  auto address = [&](const BufferRef& b) -> std::byte* {
    switch (b.kind) {
      case BufferRef::Kind::kInput:
        return ins[b.index].rawData();
      case BufferRef::Kind::kParameter:
        return const_cast<std::byte*>(p.parameters[b.index].data());
      case BufferRef::Kind::kArena:
        return arena_ + b.offset;
      case BufferRef::Kind::kOutput:
        return outs[b.index].rawData();
    }
    return nullptr;
  };
  // A tensor view of a buffer, for reference kernels.
  auto view = [&](const BufferRef& b) {
    return Tensor::wrap(address(b), b.type.dtype, b.type.shape);
  };

  stats_ = PlanRunStats{};
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<void*> args;
  std::vector<Tensor> tin, tout;
  for (const PlanStep& s : p.steps) {
    const auto ts =
        profiling_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    switch (s.kind) {
      case PlanStep::Kind::kKernel: {
        args.clear();
        for (const auto& b : s.inputs) args.push_back(address(b));
        for (const auto& b : s.outputs) args.push_back(address(b));
        void* const* a = args.data();
        const int64_t units = s.units;
        const int threads = threads_ > 0 ? threads_ : omp_get_max_threads();
        const int nt = s.elements < kParallelThreshold
                           ? 1
                           : static_cast<int>(std::min<int64_t>(threads, units));
        if (nt <= 1) {
          s.fn(a, 0, units);
        } else {
#pragma omp parallel for num_threads(nt) schedule(static, 1)
          for (int t = 0; t < nt; ++t) s.fn(a, units * t / nt, units * (t + 1) / nt);
        }
        ++stats_.kernelSteps;
        break;
      }
      case PlanStep::Kind::kOp: {
        tin.clear();
        tout.clear();
        for (const auto& b : s.inputs) tin.push_back(view(b));
        for (const auto& b : s.outputs) tout.push_back(view(b));
        Status st;
        if (s.library) {
          const size_t main = tin.size() - static_cast<size_t>(s.numExtra);
          LibraryOptions o = s.libraryOptions;
          o.cache = cache_.get();
          st = runLibraryWithPostOps(s.op, ir::AttrView(ir::opInfo(s.op), s.attrs),
                                     std::span<const Tensor>(tin.data(), main), s.postOps,
                                     std::span<const Tensor>(tin.data() + main, s.numExtra),
                                     tout[0], o);
        } else {
          RefKernel k = libraryKernel(s.op, s.outputs[0].type.dtype);
          if (!k) k = referenceKernel(s.op);
          st = k(ir::AttrView(ir::opInfo(s.op), s.attrs), tin, tout);
        }
        if (!st.isOk()) return st.withContext(s.name);
        ++stats_.opSteps;
        break;
      }
      case PlanStep::Kind::kCopy:
        std::memcpy(address(s.outputs[0]), address(s.inputs[0]), s.outputs[0].type.byteSize());
        break;
    }
    if (profiling_)
      stats_.stepMs.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ts).count());
  }
  stats_.totalMs =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return outs;
}

}  // namespace kiln::runtime
