#include "runtime/cpu/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <cfenv>
#include <cstring>

#include "runtime/cpu/chunk_queues.h"
#include "runtime/cpu/compute_threads.h"
#include "runtime/object_loader.h"
#include "runtime/reference/kernels.h"

namespace kiln::runtime {

namespace {

// Below this many elements a kernel runs on the calling thread: waking the pool costs more.
constexpr int64_t kParallelThreshold = 1 << 15;

// The CPU kernel ABI (codegen/render.h): work units [begin, end) of `units`.
using KernelFn = void (*)(void* const* args, long long begin, long long end);

std::byte* host(DeviceAddress a) {
  return static_cast<std::byte*>(a.handle) + a.offset;
}

Tensor hostTensor(const DeviceTensor& t) {
  return Tensor::wrap(host(t.address), t.type.dtype, t.type.shape);
}

// Runs every call at once on the calling thread, with the compute threads granted for the run.
class CpuStream final : public Stream {
 public:
  explicit CpuStream(int threadsWanted)
      : grant_(threadsWanted > 0 ? threadsWanted : numThreads()) {}

  int threads() const override { return grant_.threads(); }

  Status upload(DeviceAddress dst, const std::byte* src, size_t bytes) override {
    if (host(dst) != src) std::memcpy(host(dst), src, bytes);
    return Status::ok();
  }
  Status download(std::byte* dst, DeviceAddress src, size_t bytes) override {
    if (host(src) != dst) std::memcpy(dst, host(src), bytes);
    return Status::ok();
  }
  Status copy(DeviceAddress dst, DeviceAddress src, size_t bytes) override {
    if (host(dst) != host(src)) std::memmove(host(dst), host(src), bytes);
    return Status::ok();
  }

  Status launch(const KernelLaunch& k, std::span<const DeviceAddress> args) override {
    args_.clear();
    for (const DeviceAddress& a : args) args_.push_back(host(a));
    if (k.scratchBytes > 0) {  // A reduction split in chunks of rows: their partial results.
      if (scratch_.size() < static_cast<size_t>(k.scratchBytes) + 64)
        scratch_.resize(static_cast<size_t>(k.scratchBytes) + 64);
      args_.push_back(reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratch_.data()) + 63) &
                                              ~uintptr_t{63}));
    }
    const auto fn = reinterpret_cast<KernelFn>(const_cast<void*>(k.entry));
    void* const* a = args_.data();
    const int64_t units = k.units;
    const int nt = k.elements < kParallelThreshold
                       ? 1
                       : static_cast<int>(std::min<int64_t>(grant_.threads(), units));
    if (nt <= 1) {
      fn(a, 0, units);
    } else {
      const int64_t chunks = std::min<int64_t>(units, nt * kChunksPerThread);
      runChunks(chunks_, nt, chunks,
                [&](int64_t c) { fn(a, units * c / chunks, units * (c + 1) / chunks); });
    }
    if (k.scratchBytes > 0) fn(a, units, units + 1);  // Combines the chunks' partial results.
    return Status::ok();
  }

  Status run(const OpCall& c, std::span<const DeviceTensor> inputs,
             std::span<const DeviceTensor> outputs) override {
    in_.clear();
    out_.clear();
    for (const DeviceTensor& t : inputs) in_.push_back(hostTensor(t));
    for (const DeviceTensor& t : outputs) out_.push_back(hostTensor(t));
    return runOnHost(c, in_, out_);
  }

  void free(DeviceBuffer buffer) override {
    buffer.reset();
  }  // Its work is done already.
  Status synchronize() override {
    return Status::ok();
  }

  // The stream's work runs on the calling thread and its OpenMP team of grant_.threads() (libgomp
  // keeps a caller's team threads, so team member i is one thread for every region); each has
  // its own floating-point status flags.
  bool canCheckInvalid() const override {
    return fusedActivationsFlagNaN();
  }
  void clearInvalid() override {
#pragma omp parallel num_threads(grant_.threads())
    feclearexcept(FE_INVALID);
  }
  bool invalidRaised() override {
    int raised = 0;
#pragma omp parallel num_threads(grant_.threads()) reduction(| : raised)
    raised |= fetestexcept(FE_INVALID) != 0;
    return raised != 0;
  }

 private:
  ThreadGrant grant_;
  std::vector<void*> args_;
  std::vector<std::byte> scratch_;  // Partial results of split reductions (KernelLaunch).
  ChunkQueues chunks_;
  std::vector<Tensor> in_, out_;
};

class CpuModule final : public KernelModule {
 public:
  LoadedObjects objects;
  Expected<const void*> entry(std::string_view name) override {
    KILN_ASSIGN_OR_RETURN(void* p, objects.lookup(name));
    return static_cast<const void*>(p);
  }
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(CachingAllocator* alloc) : alloc_(alloc) {
    caps_.kernelCode = "host-object";
    caps_.libraryEpilogues = true;
    caps_.channelsLast = BackendCaps::ChannelsLast::kAlways;
    caps_.lowPrecision = true;
    caps_.lowPrecisionNote =
        nativeBf16Convolutions()
            ? "bf16 convolutions and their gradients run on oneDNN's native bf16 kernels (this "
              "CPU has AVX512-BF16); matmuls and every fp16 product read their operands widened "
              "to f32 and round their results once (slower than fp32)"
            : "every bf16/fp16 convolution and matmul reads its operands widened to f32 and "
              "rounds its result once (this CPU has no native bf16 arithmetic): the numerics of "
              "autocast, slower than fp32";
    caps_.hostAddressable = true;
  }
  std::string_view name() const override { return "cpu"; }
  const BackendCaps& caps() const override { return caps_; }

  Expected<DeviceBuffer> allocate(size_t bytes) override {
    void* p = alloc_->allocate(bytes);
    if (!p) return allocationFailure(*alloc_, bytes, "CPU memory");
    return DeviceBuffer(this, p, bytes);
  }
  Expected<DeviceBuffer> mapHost(std::byte* hostBytes, size_t bytes) override {
    return DeviceBuffer(nullptr, hostBytes, bytes);  // A view: the host's bytes are the CPU's.
  }
  Allocator& hostAllocator() override { return *alloc_; }
  AllocatorStats memoryStats() const override { return alloc_->stats(); }
  void resetPeakMemory() override { alloc_->resetPeak(); }

  Expected<std::unique_ptr<Stream>> openStream(int threadsWanted) override {
    return std::unique_ptr<Stream>(std::make_unique<CpuStream>(threadsWanted));
  }

  Expected<std::shared_ptr<KernelModule>> loadKernels(
      std::span<const KernelObject> objects) override {
    auto m = std::make_shared<CpuModule>();
    for (const KernelObject& o : objects) KILN_TRY(m->objects.add(o.bytes, o.name));
    return std::shared_ptr<KernelModule>(std::move(m));
  }

  // oneDNN takes f32 library ops (ops.def's kLibrary), and f16/bf16 ones converted to
  // f32 and back (autocast; runLibraryWithPostOps); those marked kChannelsLast also take NHWC
  // activations.
  bool hasLibraryKernel(ir::OpKind op, ir::DType dtype, ir::Layout layout) const override {
    const ir::OpInfo& info = ir::opInfo(op);
    if (!info.has(ir::kLibrary) ||
        (dtype != ir::DType::kF32 && dtype != ir::DType::kF16 && dtype != ir::DType::kBF16))
      return false;
    return layout == ir::Layout::kPlain ||
           (layout == ir::Layout::kNHWC && info.has(ir::kChannelsLast));
  }

  // Convolutions: oneDNN direct, oneDNN Winograd where it applies, im2col + lib::sgemm.
  std::vector<ConvAlgo> libraryAlgorithms(ir::OpKind op, const ir::AttrView& attrs,
                                          std::span<const ir::TensorType> inputs) const override {
    if (op != ir::OpKind::kConv2d || inputs.size() < 2 || inputs[0].dtype != ir::DType::kF32)
      return {};
    return convAlgorithms(attrs, inputs[0].shape, inputs[1].shape);
  }

 protected:
  void release(void* handle, size_t bytes) noexcept override { alloc_->deallocate(handle, bytes); }

 private:
  CachingAllocator* alloc_;
  BackendCaps caps_;
};

}  // namespace

Status runOnHost(const OpCall& c, std::span<const Tensor> inputs, std::span<Tensor> outputs) {
  static const ir::AttrMap noAttrs;
  const ir::AttrView attrs(ir::opInfo(c.op), c.attrs ? *c.attrs : noAttrs);
  if (c.library) {
    const size_t main = inputs.size() - static_cast<size_t>(c.numExtra);
    return runLibraryWithPostOps(c.op, attrs, inputs.first(main), c.postOps, inputs.subspan(main),
                                 outputs[0], c.options);
  }
  RefKernel k = outputs.empty() ? nullptr : libraryKernel(c.op, outputs[0].dtype());
  if (!k) k = referenceKernel(c.op);
  if (!k)
    return unimplemented(std::string(c.name) + ": op '" + std::string(ir::opName(c.op)) +
                         "' has no CPU kernel");
  return k(attrs, inputs, outputs);
}

std::shared_ptr<Backend> makeCpuBackend(CachingAllocator* alloc) {
  return std::make_shared<CpuBackend>(alloc);
}

}  // namespace kiln::runtime
