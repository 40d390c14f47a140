// The CUDA backend: a runtime::Backend over a device table (device_api.h) — the real GPU
// ("cuda") or the emulation device ("emu"), with one code path above the table:
// - memory: a stream-ordered caching allocator (DeviceCachingAllocator) for everything the
//   plan executor and the eager interpreter allocate (plan arenas are one allocation each, reused
//   across runs by the executor's pool);
// - kernels: modules of kiln's CUDA C in the device's code format (BackendCaps::kernelCode),
//   launched with codegen's geometry and each argument's extent;
// - ops without a device kernel yet run on the host in stream order (inputs copied to pinned
//   host buffers, the CPU's kernel run by a host function, outputs copied back): correct
//   everywhere, slow on a GPU, and reported by the compiler;
// - streams: one device stream per run, pooled; errors surface at synchronize().
// Concurrency: as on the CPU, each call of a plan takes its own stream and arena (PlanExecutor),
// so concurrent callers run side by side on the device.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/backend.h"
#include "runtime/gpu/device_api.h"

namespace kiln::runtime::gpu {

struct DeviceAllocatorStats {
  int64_t bytesInUse = 0;      // Live blocks (rounded sizes).
  int64_t peakBytesInUse = 0;  // Since the last resetPeak().
  int64_t bytesCached = 0;     // Free blocks kept for reuse (including those still pending).
  int64_t blocksCached = 0;
  int64_t blocksPending = 0;  // Freed on a stream whose work on them is not done yet.
  int64_t allocations = 0;
  int64_t cacheHits = 0;      // Served from cached blocks.
  int64_t deviceMallocs = 0;  // Served by the device (cache misses).
  int64_t cacheFlushes = 0;   // The cache emptied to satisfy an allocation.
  // Bytes of live blocks beyond what was asked for: rounding and best-fit reuse.
  int64_t bytesWasted = 0;
};

// PyTorch's caching allocator, simplified: sizes round to 512 bytes below 1 MiB and to 2 MiB
// above; a freed block is cached by size and reused by the best fit within 1/8 of the request
// (so one big block never serves a small request); a block freed in stream order (free with an
// event recorded after its last use) is reused only once that event completes. When the device
// is out of memory, the cache is emptied and the allocation tried once more. Thread-safe.
class DeviceCachingAllocator {
 public:
  explicit DeviceCachingAllocator(std::shared_ptr<DeviceApi> device) : dev_(std::move(device)) {}
  ~DeviceCachingAllocator();
  static size_t roundSize(size_t bytes);
  Expected<DevicePtr> allocate(size_t bytes);
  // `after`: an event recorded on the stream after the block's last use (ownership passes to
  // the allocator), or null when no work on the block is pending.
  void free(DevicePtr p, EventHandle after = nullptr);
  Status emptyCache();
  DeviceAllocatorStats stats() const;
  void resetPeak();

 private:
  void collectPendingLocked();
  Status emptyCacheLocked();
  std::shared_ptr<DeviceApi> dev_;
  mutable std::mutex mu_;
  std::multimap<size_t, DevicePtr> free_;
  struct Pending {
    DevicePtr p;
    size_t size;
    EventHandle event;
  };
  std::vector<Pending> pending_;
  struct Live {
    size_t size;
    size_t asked;
  };
  std::map<DevicePtr, Live> live_;
  DeviceAllocatorStats stats_;
};

// The backend over `device`, named `name` ("cuda", "emu").
std::shared_ptr<Backend> makeGpuBackend(std::string name, std::shared_ptr<DeviceApi> device);

// The device table and allocator of a backend made by makeGpuBackend (null otherwise).
DeviceApi* gpuDevice(Backend& backend);
DeviceCachingAllocator* gpuAllocator(Backend& backend);

// The backend for --device NAME: "cpu"; "emu" (made and registered on first use); "cuda" (the
// first CUDA device, opened and registered on first use; kNotFound with one line naming the
// CUDA error where there is none). Anything else: kInvalidArgument listing the devices.
Expected<std::shared_ptr<Backend>> backendForDevice(std::string_view name);

}  // namespace kiln::runtime::gpu
