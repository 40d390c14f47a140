#include "runtime/gpu/emu_device.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/gpu/simt.h"
#include "runtime/object_loader.h"

namespace kiln::runtime::gpu {

namespace {

using Op = std::function<Status()>;
using Clock = std::chrono::steady_clock;

struct EmuEvent {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;   // Records enqueued.
  uint64_t completed = 0;  // Records that ran.
  Clock::time_point time{};
};

// An in-order queue run by its own worker thread. After a failure the rest of the queue is
// skipped until synchronize() reports it (CUDA's sticky stream errors, per stream).
class EmuStream {
 public:
  EmuStream() : worker_([this] { work(); }) {}
  ~EmuStream() {
    (void)synchronize();
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  Status enqueue(Op op) {
    std::lock_guard lock(mu_);
    if (capture_) {
      capture_->push_back(std::move(op));
      return Status::ok();
    }
    queue_.push_back(std::move(op));
    cv_.notify_all();
    return Status::ok();
  }
  Status synchronize() {
    std::unique_lock lock(mu_);
    if (capture_) return invalidArgument("emu: synchronize on a stream that is capturing a graph");
    idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
    return std::exchange(error_, Status::ok());
  }
  Status beginCapture() {
    std::lock_guard lock(mu_);
    if (capture_) return invalidArgument("emu: the stream is capturing a graph already");
    capture_ = std::make_unique<std::vector<Op>>();
    return Status::ok();
  }
  Expected<std::vector<Op>> endCapture() {
    std::lock_guard lock(mu_);
    if (!capture_) return invalidArgument("emu: endCapture on a stream that is not capturing");
    std::vector<Op> ops = std::move(*capture_);
    capture_.reset();
    return ops;
  }

 private:
  void work() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      Op op = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      const bool skip = !error_.isOk();
      lock.unlock();
      Status s = skip ? Status::ok() : op();
      op = nullptr;  // Frees what the op holds before the stream reports idle.
      lock.lock();
      if (!s.isOk() && error_.isOk()) error_ = std::move(s);
      busy_ = false;
      idle_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<Op> queue_;
  std::unique_ptr<std::vector<Op>> capture_;
  bool busy_ = false, stop_ = false;
  Status error_;
  std::thread worker_;
};

struct EmuFunction {
  std::string name;
  EmuEntry entry = nullptr;
};

struct EmuModule {
  std::string name;
  LoadedObjects objects;
  std::list<EmuFunction> functions;  // Stable addresses: handles point at them.
};

struct EmuGraph {
  std::vector<Op> ops;
};

class EmuDevice final : public DeviceApi {
 public:
  explicit EmuDevice(const EmuOptions& o) {
    int64_t mem = o.memoryBytes;
    if (mem <= 0) {
      const char* env = std::getenv("KILN_EMU_MEMORY_MB");
      mem = env && std::atoll(env) > 0 ? std::atoll(env) * (int64_t{1} << 20) : int64_t{16} << 30;
    }
    props_.name = "kiln emu (CUDA semantics on the host)";
    props_.libraries = "the CPU's library (oneDNN) on the descriptors cuDNN/cuBLASLt take";
    props_.smArch = o.smArch;
    props_.multiProcessors = o.multiProcessors;
    props_.totalMemory = mem;
  }
  ~EmuDevice() override {
    for (auto& [base, bytes] : allocations_) std::free(reinterpret_cast<void*>(base));
  }

  const DeviceProps& props() const override { return props_; }
  std::string_view codeFormat() const override { return "cuda-emu-object"; }

  Expected<DevicePtr> malloc(size_t bytes) override {
    const size_t rounded = std::max<size_t>(256, (bytes + 255) / 256 * 256);
    std::lock_guard lock(memMu_);
    if (counters_.bytesInUse + static_cast<int64_t>(rounded) > props_.totalMemory)
      return resourceExhausted("out of device memory: allocating " + bytesText(bytes) + " with " +
                               bytesText(counters_.bytesInUse) + " of " +
                               bytesText(props_.totalMemory) +
                               " in use on the emu device (its size: KILN_EMU_MEMORY_MB)");
    void* p = std::aligned_alloc(256, rounded);  // cudaMalloc's alignment.
    if (!p)
      return resourceExhausted("emu: the host is out of memory allocating " + bytesText(bytes));
    allocations_.emplace(reinterpret_cast<DevicePtr>(p), rounded);
    counters_.bytesInUse += static_cast<int64_t>(rounded);
    ++counters_.liveAllocations;
    return reinterpret_cast<DevicePtr>(p);
  }
  Status free(DevicePtr p) override {
    std::lock_guard lock(memMu_);
    auto it = allocations_.find(p);
    if (it == allocations_.end())
      return invalidArgument("emu: free of address " + std::to_string(p) +
                             ", which is not the start of a live allocation");
    counters_.bytesInUse -= static_cast<int64_t>(it->second);
    --counters_.liveAllocations;
    std::free(reinterpret_cast<void*>(p));
    allocations_.erase(it);
    return Status::ok();
  }
  Expected<void*> mallocHost(size_t bytes) override {
    void* p = std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64));
    if (!p)
      return resourceExhausted("emu: cannot allocate " + bytesText(bytes) + " of host memory");
    std::lock_guard lock(memMu_);
    ++counters_.hostAllocations;
    return p;
  }
  void freeHost(void* p) override { std::free(p); }

  Status copyToDevice(DevicePtr dst, const void* src, size_t bytes, StreamHandle s) override {
    KILN_TRY(checkRange(dst, bytes, "copy to the device"));
    return stream(s).enqueue([dst, src, bytes] {
      std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
      return Status::ok();
    });
  }
  Status copyToHost(void* dst, DevicePtr src, size_t bytes, StreamHandle s) override {
    KILN_TRY(checkRange(src, bytes, "copy to the host"));
    return stream(s).enqueue([dst, src, bytes] {
      std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
      return Status::ok();
    });
  }
  Status copyOnDevice(DevicePtr dst, DevicePtr src, size_t bytes, StreamHandle s) override {
    KILN_TRY(checkRange(dst, bytes, "device copy (destination)"));
    KILN_TRY(checkRange(src, bytes, "device copy (source)"));
    return stream(s).enqueue([dst, src, bytes] {
      std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), bytes);
      return Status::ok();
    });
  }

  Expected<ModuleHandle> loadModule(std::span<const std::byte> image,
                                    std::string_view name) override {
    auto m = std::make_unique<EmuModule>();
    m->name = std::string(name);
    KILN_TRY(m->objects.define("kiln_emu_runtime", &emuRuntime()));
    KILN_TRY(m->objects.add(image, m->name));
    std::lock_guard lock(modMu_);
    EmuModule* raw = m.get();
    modules_.emplace(raw, std::move(m));
    return reinterpret_cast<ModuleHandle>(raw);
  }
  void unloadModule(ModuleHandle m) override {
    std::lock_guard lock(modMu_);
    modules_.erase(reinterpret_cast<EmuModule*>(m));
  }
  Expected<FunctionHandle> function(ModuleHandle mh, std::string_view kernel) override {
    auto* m = reinterpret_cast<EmuModule*>(mh);
    KILN_ASSIGN_OR_RETURN(void* p, m->objects.lookup("kiln_emu_entry_" + std::string(kernel)));
    std::lock_guard lock(modMu_);
    m->functions.push_back({std::string(kernel), reinterpret_cast<EmuEntry>(p)});
    return reinterpret_cast<FunctionHandle>(&m->functions.back());
  }

  Status launch(FunctionHandle fh, Dim3 grid, Dim3 block, size_t dynamicSharedBytes, StreamHandle s,
                void** params, std::span<const int64_t> argBytes) override {
    const auto* f = reinterpret_cast<const EmuFunction*>(fh);
    // The parameters are copied now, as cuLaunchKernel does: every parameter of a kiln kernel
    // is 8 bytes (a pointer, or a scalar in argBytes as -1).
    struct Launch {
      SimtLaunch simt;
      std::vector<uint64_t> values;
      std::vector<void*> params;
      std::vector<std::pair<char*, char*>> ranges;
    };
    auto l = std::make_shared<Launch>();
    l->values.resize(argBytes.size());
    for (size_t i = 0; i < argBytes.size(); ++i) {
      std::memcpy(&l->values[i], params[i], 8);
      if (argBytes[i] >= 0) {
        char* b = reinterpret_cast<char*>(l->values[i]);
        KILN_TRY(checkRange(l->values[i], static_cast<size_t>(argBytes[i]),
                            "kernel '" + f->name + "' argument " + std::to_string(i)));
        l->ranges.emplace_back(b, b + argBytes[i]);
      } else {
        l->ranges.emplace_back(nullptr, nullptr);
      }
    }
    for (uint64_t& v : l->values) l->params.push_back(&v);
    l->simt.kernel = f->name;
    l->simt.entry = f->entry;
    l->simt.grid = grid;
    l->simt.block = block;
    l->simt.dynamicSharedBytes = dynamicSharedBytes;
    l->simt.sharedLimit = props_.sharedBytesPerBlock;
    l->simt.maxThreadsPerBlock = props_.maxThreadsPerBlock;
    l->simt.params = l->params.data();
    l->simt.ranges = l->ranges;
    return stream(s).enqueue([this, l] {
      ++launches_;
      return runGrid(l->simt);
    });
  }
  Status launchHostFunc(StreamHandle s, HostFn fn, void* data) override {
    return stream(s).enqueue([this, fn, data] {
      ++hostFunctions_;
      fn(data);
      return Status::ok();
    });
  }

  bool hasLibraryCalls() const override { return true; }
  std::vector<ConvAlgo> convAlgorithms(const ConvDescriptor& c) override {
    return hostConvAlgorithms(c);  // Its library is the CPU's.
  }
  // The CPU's library on the descriptor's shapes; every operand must lie in live memory.
  Status libraryCall(const LibraryCall& call, std::span<const DevicePtr> operands,
                     StreamHandle s) override {
    const std::vector<int64_t> bytes = operandBytes(call);
    if (bytes.size() != operands.size())
      return internalError("emu: " + call.describe() + " takes " + std::to_string(bytes.size()) +
                           " operands, got " + std::to_string(operands.size()));
    std::vector<void*> ptrs;
    for (size_t i = 0; i < operands.size(); ++i) {
      KILN_TRY(checkRange(operands[i], static_cast<size_t>(bytes[i]),
                          call.describe() + " operand " + std::to_string(i)));
      ptrs.push_back(reinterpret_cast<void*>(operands[i]));
    }
    return stream(s).enqueue([this, call, ptrs] {
      ++libraryCalls_;
      return runLibraryCallOnHost(call, ptrs);
    });
  }

  Expected<StreamHandle> createStream() override {
    return reinterpret_cast<StreamHandle>(new EmuStream);
  }
  void destroyStream(StreamHandle s) override { delete reinterpret_cast<EmuStream*>(s); }
  Status synchronize(StreamHandle s) override { return stream(s).synchronize(); }

  Expected<EventHandle> createEvent() override {
    return reinterpret_cast<EventHandle>(new EmuEvent);
  }
  void destroyEvent(EventHandle e) override { delete reinterpret_cast<EmuEvent*>(e); }
  Status recordEvent(EventHandle eh, StreamHandle s) override {
    auto* e = reinterpret_cast<EmuEvent*>(eh);
    uint64_t n;
    {
      std::lock_guard lock(e->mu);
      n = ++e->recorded;
      // CUDA's default streams (0, legacy 1, per-thread 2): nothing runs on them here, so the
      // event is done at once.
      if (reinterpret_cast<uintptr_t>(s) <= 2) {
        e->completed = std::max(e->completed, n);
        e->time = Clock::now();
        e->cv.notify_all();
        return Status::ok();
      }
    }
    return stream(s).enqueue([e, n] {
      std::lock_guard lock(e->mu);
      e->completed = std::max(e->completed, n);
      e->time = Clock::now();
      e->cv.notify_all();
      return Status::ok();
    });
  }
  Status waitEvent(StreamHandle s, EventHandle eh) override {
    auto* e = reinterpret_cast<EmuEvent*>(eh);
    uint64_t n;
    {
      std::lock_guard lock(e->mu);
      n = e->recorded;
    }
    return stream(s).enqueue([e, n] {
      std::unique_lock lock(e->mu);
      e->cv.wait(lock, [&] { return e->completed >= n; });
      return Status::ok();
    });
  }
  Expected<bool> eventDone(EventHandle eh) override {
    auto* e = reinterpret_cast<EmuEvent*>(eh);
    std::lock_guard lock(e->mu);
    return e->completed >= e->recorded;
  }
  Status synchronizeEvent(EventHandle eh) override {
    auto* e = reinterpret_cast<EmuEvent*>(eh);
    std::unique_lock lock(e->mu);
    const uint64_t n = e->recorded;
    e->cv.wait(lock, [&] { return e->completed >= n; });
    return Status::ok();
  }
  Expected<float> elapsedMs(EventHandle start, EventHandle end) override {
    auto* a = reinterpret_cast<EmuEvent*>(start);
    auto* b = reinterpret_cast<EmuEvent*>(end);
    std::scoped_lock lock(a->mu, b->mu);
    if (a->completed == 0 || b->completed == 0 || a->completed < a->recorded ||
        b->completed < b->recorded)
      return invalidArgument("emu: elapsed time of an event that has not completed");
    return std::chrono::duration<float, std::milli>(b->time - a->time).count();
  }

  Status beginCapture(StreamHandle s) override { return stream(s).beginCapture(); }
  Expected<GraphHandle> endCapture(StreamHandle s) override {
    KILN_ASSIGN_OR_RETURN(std::vector<Op> ops, stream(s).endCapture());
    auto* g = new EmuGraph{std::move(ops)};
    return reinterpret_cast<GraphHandle>(g);
  }
  Status launchGraph(GraphHandle gh, StreamHandle s) override {
    auto* g = reinterpret_cast<EmuGraph*>(gh);
    return stream(s).enqueue([this, g] {
      ++graphLaunches_;
      for (const Op& op : g->ops) KILN_TRY(op());
      return Status::ok();
    });
  }
  void destroyGraph(GraphHandle g) override { delete reinterpret_cast<EmuGraph*>(g); }

  EmuCounters counters() const {
    std::lock_guard lock(memMu_);
    EmuCounters c = counters_;
    c.kernelLaunches = launches_;
    c.graphLaunches = graphLaunches_;
    c.hostFunctions = hostFunctions_;
    c.libraryCalls = libraryCalls_;
    return c;
  }

 private:
  EmuStream& stream(StreamHandle s) { return *reinterpret_cast<EmuStream*>(s); }

  // [p, p + bytes) must lie in one live allocation.
  Status checkRange(DevicePtr p, size_t bytes, const std::string& what) const {
    std::lock_guard lock(memMu_);
    auto it = allocations_.upper_bound(p);
    if (it != allocations_.begin()) {
      --it;
      if (p >= it->first && p + bytes <= it->first + it->second) return Status::ok();
    }
    return invalidArgument("emu: " + what + " of " + std::to_string(bytes) + " bytes at address " +
                           std::to_string(p) + " is outside every live device allocation");
  }

  DeviceProps props_;
  mutable std::mutex memMu_;
  std::map<DevicePtr, size_t> allocations_;
  EmuCounters counters_;
  std::mutex modMu_;
  std::map<EmuModule*, std::unique_ptr<EmuModule>> modules_;
  std::atomic<int64_t> launches_{0}, graphLaunches_{0}, hostFunctions_{0}, libraryCalls_{0};
};

}  // namespace

std::string bytesText(int64_t b) {
  char buf[64];
  if (b >= (int64_t{1} << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1 << 30));
  else if (b >= (1 << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  else
    std::snprintf(buf, sizeof buf, "%lld bytes", static_cast<long long>(b));
  return buf;
}

std::shared_ptr<DeviceApi> makeEmuDevice(const EmuOptions& options) {
  return std::make_shared<EmuDevice>(options);
}

Expected<EmuCounters> emuCounters(const DeviceApi& device) {
  const auto* emu = dynamic_cast<const EmuDevice*>(&device);
  if (!emu) return invalidArgument("not an emu device");
  return emu->counters();
}

}  // namespace kiln::runtime::gpu
