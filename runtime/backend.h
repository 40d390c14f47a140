// The Backend interface: the one seam between a plan (or an eager run) and the hardware.
// A backend is memory (allocate, free, host mappings), a stream (an ordered queue of copies,
// kernel launches and library/reference op calls), the loading of generated kernel code, a
// registry of library calls (which op, dtype and layout it runs), capabilities and a name.
// The plan executor (runtime/plan.h), the eager interpreter (runtime/eager.h) and the plan
// builder (compiler/) use nothing else: the CPU is one implementation (runtime/cpu/), and a
// backend whose memory is not host-addressable fits the same calls (opaque handles, explicit
// copies, an asynchronous queue; tests/runtime/test_backend.cpp registers one).
// Models read: ggml's backend vtables, tinygrad's allocator/compiler/runtime quartet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "runtime/allocator.h"
#include "runtime/library/kernels.h"

namespace kiln::runtime {

class Backend;

// A place in a backend's memory: a handle from Backend::allocate or Backend::mapHost and a byte
// offset into it. Only the backend that made the handle may read it (on the CPU it is a host
// pointer; on a GPU a device pointer; elsewhere an opaque id).
struct DeviceAddress {
  void* handle = nullptr;
  int64_t offset = 0;
  DeviceAddress at(int64_t bytes) const { return {handle, offset + bytes}; }
};

// A dense tensor in a backend's memory. Activations in layout kNHWC keep their logical NCHW
// shape (LibraryOptions::channelsLast says so to the library call).
struct DeviceTensor {
  DeviceAddress address;
  ir::TensorType type;
};

// Memory owned on a backend (or a view of host memory from mapHost); frees itself. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend* owner, void* handle, size_t bytes) noexcept
      : owner_(owner), handle_(handle), bytes_(bytes) {}
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  DeviceAddress address(int64_t offset = 0) const { return {handle_, offset}; }
  size_t bytes() const { return bytes_; }
  bool defined() const { return handle_ != nullptr; }
  bool owned() const { return owner_ != nullptr; }  // Else a view: nothing to free.
  void reset() noexcept;
  // Gives up ownership without freeing and returns the handle (a backend's stream frees it in
  // stream order).
  void* detach() noexcept;

 private:
  Backend* owner_ = nullptr;  // Null: not owned (a view); nothing to free.
  void* handle_ = nullptr;
  size_t bytes_ = 0;
};

// One op call of a plan or an eager run: the op on the backend's library kernel with fused
// post-ops (`library`), or on its plain kernel (a library kernel where the backend has one for
// the dtype, else the reference kernel). kAdd post-ops read the last `numExtra` inputs.
struct OpCall {
  std::string_view name;  // The node, for errors.
  ir::OpKind op = ir::OpKind::kAdd;
  const ir::AttrMap* attrs = nullptr;
  bool library = false;
  std::span<const PostOp> postOps;
  int numExtra = 0;
  LibraryOptions options;  // Its cache belongs to the caller (a plan executor).
};

// A generated kernel launch. `entry` comes from a KernelModule of the same backend; the
// kernel covers `units` work units (elements or rows) and touches `elements` elements.
struct KernelLaunch {
  std::string_view name;
  const void* entry = nullptr;
  int64_t units = 0;
  int64_t elements = 0;
  // CUDA code: threads per block and blocks (codegen::cudaLaunchGeometry), and the bytes each
  // argument covers (the emu device checks every access against them).
  int block = 0;
  int64_t grid = 0;
  std::span<const int64_t> argBytes;
  // CPU code split in chunks of rows (codegen::cpuRowSplit, PlanStep::scratchBytes): the
  // stream passes this many bytes of scratch (64-byte aligned) after the arguments, runs the
  // units, then calls the entry once with begin = units to combine them.
  int64_t scratchBytes = 0;
};

// Work a stream recorded once and replays (a CUDA graph): see Stream::beginCapture.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
};

// An ordered queue on one backend. Every call is enqueued in order; a backend may run them
// later (on another thread or a device) and report the first error at synchronize(), as CUDA
// streams do. Addresses must stay valid until synchronize() returns. One stream per run; a
// stream is used by one thread at a time.
class Stream {
 public:
  virtual ~Stream() = default;
  // Compute threads this stream's work runs on (the CPU's grant; 1 elsewhere).
  virtual int threads() const { return 1; }
  virtual Status upload(DeviceAddress dst, const std::byte* src, size_t bytes) = 0;
  // The bytes are in `dst` once synchronize() returned.
  virtual Status download(std::byte* dst, DeviceAddress src, size_t bytes) = 0;
  virtual Status copy(DeviceAddress dst, DeviceAddress src, size_t bytes) = 0;
  // Arguments: the kernel's inputs then its outputs, as the kernel IR lists them.
  virtual Status launch(const KernelLaunch& kernel, std::span<const DeviceAddress> args) = 0;
  virtual Status run(const OpCall& call, std::span<const DeviceTensor> inputs,
                     std::span<const DeviceTensor> outputs) = 0;
  // Frees `buffer` once the work enqueued before this call is done (cudaFreeAsync's order): an
  // eager run frees each intermediate right after enqueuing its last reader.
  virtual void free(DeviceBuffer buffer) = 0;
  // Waits for everything enqueued; the first error of an enqueued call, naming it.
  virtual Status synchronize() = 0;

  // Capture (optional; CUDA graphs): between beginCapture and endCapture, copies, launches and
  // op calls are recorded, not run; replay enqueues the recorded work again, reading and writing
  // the same addresses. Backends without it return kUnimplemented from beginCapture.
  virtual bool canCapture() const { return false; }
  virtual Status beginCapture() { return unimplemented("this backend's streams cannot capture"); }
  virtual Expected<std::shared_ptr<CapturedWork>> endCapture() {
    return unimplemented("this backend's streams cannot capture");
  }
  virtual Status replay(CapturedWork& work) {
    (void)work;
    return unimplemented("this backend's streams cannot capture");
  }

  // Device time (optional; CUDA events): markStart and markEnd record the stream's position,
  // and after synchronize() markedMs is the device time between the two marks, what `kiln bench`
  // reports for a GPU (PyTorch's torch.cuda.Event timing). Streams whose work runs on the calling
  // thread (the CPU) have none: their wall time is their device time.
  virtual bool canTime() const { return false; }
  virtual Status markStart() { return unimplemented("this backend's streams have no timer"); }
  virtual Status markEnd() { return unimplemented("this backend's streams have no timer"); }
  virtual Expected<double> markedMs() {
    return unimplemented("this backend's streams have no timer");
  }

  // Makes the work enqueued on this stream from now on wait for the work enqueued so far on
  // `external`, a native stream of the backend's device (CUDA: a CUstream; 1 the legacy default
  // stream, 2 the per-thread default one, as DLPack's `stream` argument): how a run reads
  // tensors another library wrote on its own stream. The CPU's work runs at once: nothing waits.
  virtual Status waitForExternal(uintptr_t external) {
    (void)external;
    return Status::ok();
  }

  // NaN check (optional; the CPU): whether op calls with LibraryOptions::fuseActivations may be
  // checked, clearInvalid() clears the floating-point invalid flag on every thread the stream's
  // work runs on, and invalidRaised() (after synchronize) says whether any of them raised it
  // since. A plan run that fused activations runs again without them where it was raised.
  virtual bool canCheckInvalid() const { return false; }
  virtual void clearInvalid() {}
  virtual bool invalidRaised() { return false; }
};

// Generated kernels loaded on a backend. Entry points stay valid while the module lives.
class KernelModule {
 public:
  virtual ~KernelModule() = default;
  virtual Expected<const void*> entry(std::string_view kernelName) = 0;
};

// Compiled kernel code of one module, in the backend's BackendCaps::kernelCode format.
struct KernelObject {
  std::string name;
  std::span<const std::byte> bytes;
};

// Whether kernel code of this format is kiln's CUDA C (for a GPU, or for the emu device).
inline bool isCudaKernelCode(std::string_view code) {
  return code == "cubin" || code == "cuda-emu-object";
}

struct BackendCaps {
  // The code generated kernels are compiled to: "host-object" (kiln's C++ kernels compiled by
  // Clang to an ELF object for this machine), "cuda-emu-object" (kiln's CUDA C compiled by
  // Clang for this machine with `cuda.sourcePrefix`, run by the emu device), "cubin" (kiln's
  // CUDA C compiled by NVRTC for `cuda.smArch`), or empty: the backend runs no generated code and
  // the plan builder runs every group op by op.
  std::string kernelCode;
  // What CUDA code needs from its device: the architecture, the launch geometry's limits, and
  // text around each module (emu: its SIMT prelude, and one entry line per kernel, "{name}"
  // standing for the kernel's name).
  struct Cuda {
    int smArch = 0;
    int multiProcessors = 0;
    int maxThreadsPerBlock = 1024;
    std::string sourcePrefix;
    std::string entryLine;
  } cuda;
  bool runsCudaKernels() const { return isCudaKernelCode(kernelCode); }
  // Library calls take fused post-ops (conv/matmul epilogues) and channels-last activations
  // where hasLibraryKernel says so; without it, fusion keeps library ops alone.
  bool libraryEpilogues = false;
  // Handles are host pointers: mapHost views host memory without a copy.
  bool hostAddressable = false;
  // Library calls take LibraryOptions::tf32 (a GPU's tensor cores; emu rounds the operands).
  bool tf32 = false;
  // Generated kernels and library products take f16/bf16 operands (products accumulating in
  // f32): the autocast precisions (--precision bf16|fp16) compile for it.
  bool lowPrecision = false;
  // How its library computes f16/bf16 products where not all of them are native (some operands
  // widened to f32 and the result rounded once: correct, slower than f32), for compiles and
  // `kiln train` to say; empty where every product is native (a GPU's tensor cores).
  std::string lowPrecisionNote;
  // When layout selection runs convolution chains channels-last (NHWC), where hasLibraryKernel
  // takes NHWC: always (the CPU: oneDNN's fastest convolutions are NHWC), on tensor cores only
  // (a GPU: cuDNN's tensor-core kernels — tf32, bf16, fp16 — are NHWC-native and transpose NCHW
  // operands in extra kernels, while its fp32 FMA kernels run NCHW natively), or never.
  enum class ChannelsLast : uint8_t {
    kNever,
    kTensorCores,
    kAlways
  } channelsLast = ChannelsLast::kNever;
  // Channels-last convolutions read their filters channels-last too (KRSC, cuDNN's NHWC
  // kernels), so layout selection relayouts the weights (folded at compile time); the CPU's
  // library reads plain OIHW filters.
  bool channelsLastFilters = false;
  // The device library choices are made for, in cache keys of timed choices: empty for the host
  // CPU (whose identity the keys hold already), else the GPU's name, architecture and libraries.
  std::string device;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual const BackendCaps& caps() const = 0;

  // Memory. allocate: kResourceExhausted (naming the bytes) when it is out of memory.
  virtual Expected<DeviceBuffer> allocate(size_t bytes) = 0;
  // Host bytes as backend memory: a view of them (no copy) where handles are host pointers,
  // else a new allocation. Either way the bytes reach the device with Stream::upload and come
  // back with Stream::download (both skip the copy when source and destination are the same
  // bytes), so one code path serves both.
  virtual Expected<DeviceBuffer> mapHost(std::byte* host, size_t bytes) = 0;
  // Where the host tensors a run returns are allocated (the CPU backend's own allocator, so
  // that eager statistics count the outputs).
  virtual Allocator& hostAllocator() = 0;
  // Statistics of the memory this backend allocated (eager runs report the peak).
  virtual AllocatorStats memoryStats() const = 0;
  virtual void resetPeakMemory() = 0;

  // A stream for one run; `threadsWanted` bounds the compute threads (<= 0: the default). May
  // block until the backend's compute threads are free (the CPU's ComputeThreads).
  virtual Expected<std::unique_ptr<Stream>> openStream(int threadsWanted) = 0;

  // Loads compiled kernel modules (caps().kernelCode); kUnimplemented where it has none.
  virtual Expected<std::shared_ptr<KernelModule>> loadKernels(
      std::span<const KernelObject> objects) = 0;

  // The library registry: whether a library call (with post-ops, through OpCall::library)
  // runs `op` with this output dtype and activation layout.
  virtual bool hasLibraryKernel(ir::OpKind op, ir::DType dtype, ir::Layout layout) const = 0;

  // Whether a library call of `op` applies post-ops `post` (in order) fused, through
  // OpCall::postOps; asked only where caps().libraryEpilogues. The CPU's library takes every
  // chain of PostOp kinds; a GPU's the ones its libraries compute exactly (library_call.h).
  virtual bool runsPostOps(ir::OpKind op, std::span<const PostOp> post) const {
    (void)op, (void)post;
    return true;
  }

  // The algorithms the library kernel of `op` can run for these attributes and input types
  // (OpCall::options.algo), the library's usual pick first: the candidates compile-time
  // autotuning times. Empty: one implementation, or the library chooses alone.
  virtual std::vector<ConvAlgo> libraryAlgorithms(ir::OpKind op, const ir::AttrView& attrs,
                                                  std::span<const ir::TensorType> inputs) const {
    (void)op, (void)attrs, (void)inputs;
    return {};
  }

 protected:
  friend class DeviceBuffer;
  virtual void release(void* handle, size_t bytes) noexcept = 0;
};

// The backends of this process by name. "cpu" is always there; others register themselves
// (a test backend, later "cuda" and "emu"). Registering a taken name is kInvalidArgument.
Status registerBackend(std::shared_ptr<Backend> backend);
// kNotFound naming the registered backends.
Expected<std::shared_ptr<Backend>> findBackend(std::string_view name);
std::vector<std::string> backendNames();
// The backend plans and eager runs use when none is named: the CPU.
std::shared_ptr<Backend> defaultBackend();

}  // namespace kiln::runtime
