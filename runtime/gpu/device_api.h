// The GPU device table: the small set of calls the CUDA backend makes to a device (memory,
// async copies, modules and launches, streams, events, graph capture). Two implementations:
// the real CUDA driver API loaded with dlopen (cuda_driver.cpp; no libcuda link, so binaries
// start on machines without a driver), and the emulation device `emu` (emu_device.h), which
// runs the same generated CUDA C on the host with real SIMT semantics. Everything above this
// table (gpu_backend.h: the caching allocator, argument packing, launch geometry, host
// fallbacks, stream ordering, graph capture) is one code path for both, so it is tested on every
// machine.
//
// Semantics follow CUDA's: work enqueued on one stream runs in order; calls return at once and
// an asynchronous failure (a faulting kernel, a failing host function) is reported by the next
// synchronize() of that stream (emu: with the kernel, block and thread named). While a stream is
// capturing, what is enqueued on it is recorded into the graph instead of run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/status.h"
#include "runtime/gpu/library_call.h"

namespace kiln::runtime::gpu {

using DevicePtr = uint64_t;  // An address in device memory (CUdeviceptr); 0 is null.

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
  uint64_t count() const { return uint64_t{x} * y * z; }
};

struct DeviceProps {
  std::string name;         // "NVIDIA H100 80GB HBM3", "kiln emu".
  int smArch = 0;           // 90 for sm_90: the architecture kernels are compiled for.
  int multiProcessors = 1;  // Streaming multiprocessors (launch geometry sizes grids by it).
  int maxThreadsPerBlock = 1024;
  int maxThreadsPerMultiProcessor = 2048;
  int64_t sharedBytesPerBlock = 48 * 1024;
  int64_t totalMemory = 0;  // Bytes; under emu, its limit.
  int warpSize = 32;
  std::string libraries;  // What runs library calls, and what the fused-ReLU check found.
};

// Opaque handles of the device's objects.
struct StreamTag;
struct EventTag;
struct ModuleTag;
struct FunctionTag;
struct GraphTag;
using StreamHandle = StreamTag*;
using EventHandle = EventTag*;
using ModuleHandle = ModuleTag*;
using FunctionHandle = FunctionTag*;
using GraphHandle = GraphTag*;  // An instantiated, launchable graph (cudaGraphExec_t).

// A host function enqueued on a stream (cuLaunchHostFunc). It may touch pinned host memory but
// must not call the device.
using HostFn = void (*)(void* data);

class DeviceApi {
 public:
  virtual ~DeviceApi() = default;
  virtual const DeviceProps& props() const = 0;
  // The code loadModule takes: "cubin" (the real device; PTX is JIT-compiled by the driver
  // too), or "cuda-emu-object" (a host ELF object of kiln's CUDA C built with the emu prelude).
  virtual std::string_view codeFormat() const = 0;

  // Memory. malloc: kResourceExhausted naming the amount when the device is out of memory.
  virtual Expected<DevicePtr> malloc(size_t bytes) = 0;
  virtual Status free(DevicePtr p) = 0;
  // Page-locked host memory, the source and target of truly asynchronous copies.
  virtual Expected<void*> mallocHost(size_t bytes) = 0;
  virtual void freeHost(void* p) = 0;
  virtual Status copyToDevice(DevicePtr dst, const void* src, size_t bytes, StreamHandle s) = 0;
  virtual Status copyToHost(void* dst, DevicePtr src, size_t bytes, StreamHandle s) = 0;
  virtual Status copyOnDevice(DevicePtr dst, DevicePtr src, size_t bytes, StreamHandle s) = 0;

  // Code. `name` labels the module in errors.
  virtual Expected<ModuleHandle> loadModule(std::span<const std::byte> image,
                                            std::string_view name) = 0;
  virtual void unloadModule(ModuleHandle m) = 0;
  // An extern "C" __global__ function of a loaded module.
  virtual Expected<FunctionHandle> function(ModuleHandle m, std::string_view kernel) = 0;
  // params: a pointer to each argument's value (cuLaunchKernel's kernelParams). argBytes: the
  // bytes each pointer argument may touch from its address; emu checks every access against
  // them, the real device ignores them.
  virtual Status launch(FunctionHandle f, Dim3 grid, Dim3 block, size_t dynamicSharedBytes,
                        StreamHandle s, void** params, std::span<const int64_t> argBytes) = 0;
  virtual Status launchHostFunc(StreamHandle s, HostFn fn, void* data) = 0;

  // Library calls (library_call.h): whether the device runs them (cuDNN and cuBLASLt on a GPU,
  // the CPU's library on emu), and one call on `operands` (inputs then the output, as
  // describeLibraryCall orders them).
  virtual bool hasLibraryCalls() const = 0;
  // The algorithms the device's library can run forward convolution `c` with, its heuristic's
  // pick first (ConvDescriptor::algo; compile-time autotuning times them). Empty: none to
  // choose from.
  virtual std::vector<ConvAlgo> convAlgorithms(const ConvDescriptor& c) = 0;
  // Whether the library computes epilogue `e` as kiln does, as far as the device found at
  // start-up (the real device's checks; emu applies kiln's formulas): the fusion pass only
  // fuses chains a device takes in every dtype (what it refused stays generated kernels).
  virtual bool takesEpilogue(const LibraryEpilogue& e) const {
    (void)e;
    return true;
  }
  virtual Status libraryCall(const LibraryCall& call, std::span<const DevicePtr> operands,
                             StreamHandle s) = 0;

  // Streams and events.
  virtual Expected<StreamHandle> createStream() = 0;
  virtual void destroyStream(StreamHandle s) = 0;
  // Waits for everything enqueued on `s`; the first asynchronous error since the last call.
  virtual Status synchronize(StreamHandle s) = 0;
  virtual Expected<EventHandle> createEvent() = 0;
  virtual void destroyEvent(EventHandle e) = 0;
  virtual Status recordEvent(EventHandle e, StreamHandle s) = 0;
  // Work enqueued on `s` after this call waits for `e`'s recorded work.
  virtual Status waitEvent(StreamHandle s, EventHandle e) = 0;
  // Whether the work `e` recorded is done (an event never recorded is done).
  virtual Expected<bool> eventDone(EventHandle e) = 0;
  virtual Status synchronizeEvent(EventHandle e) = 0;
  // Milliseconds between two completed events.
  virtual Expected<float> elapsedMs(EventHandle start, EventHandle end) = 0;

  // Graphs: between beginCapture and endCapture, work enqueued on `s` is recorded, not run.
  // endCapture returns the instantiated graph; launchGraph enqueues all of it on a stream.
  virtual Status beginCapture(StreamHandle s) = 0;
  virtual Expected<GraphHandle> endCapture(StreamHandle s) = 0;
  virtual Status launchGraph(GraphHandle g, StreamHandle s) = 0;
  virtual void destroyGraph(GraphHandle g) = 0;
};

// "512 bytes", "8.0 MiB", "1.50 GiB": amounts in the devices' error messages.
std::string bytesText(int64_t bytes);

// The first CUDA device through the driver API (libcuda.so.1 loaded with dlopen). Without a
// usable driver or device: kNotFound with one line naming the CUDA error, e.g. "no CUDA
// device: CUDA driver not found (libcuda.so.1: cannot open shared object file)".
Expected<std::shared_ptr<DeviceApi>> openCudaDevice();

}  // namespace kiln::runtime::gpu
