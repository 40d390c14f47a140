#include "runtime/plan.h"

#include <fcntl.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string_view>

#include "ir/timing.h"
#include "runtime/reference/kernels.h"

namespace kiln::runtime {

namespace {
// Below this many elements a kernel runs on the calling thread: waking the pool costs more.
constexpr int64_t kParallelThreshold = 1 << 15;
}  // namespace

namespace {

// The ComputeThreads budget. `total` starts as OpenMP's default and changes only through
// setNumThreads.
struct Budget {
  std::mutex mu;
  std::condition_variable cv;
  int total = 0;
  int inUse = 0;
  int callers = 0;  // Runs holding threads or waiting for them.
  int peak = 0;
  uint64_t nextTicket = 0;  // Tickets of acquire() calls, in arrival order.
  uint64_t nowServing = 0;  // The ticket that may take threads next.
  std::atomic<bool> loadAware{true};
  // /proc/loadavg's runnable count, and when it was read.
  int runnable = 0;
  std::chrono::steady_clock::time_point readAt{};
};

Budget& budget() {
  static Budget* b = [] {
    auto* p = new Budget;  // Never destroyed: runs may still release during exit.
    p->total = std::max(1, omp_get_max_threads());
    const char* env = std::getenv("KILN_LOAD_AWARE");
    p->loadAware = !(env && std::string_view(env) == "0");
    return p;
  }();
  return *b;
}

// Threads runnable on the whole machine now (the 4th field of /proc/loadavg, "3/150"), or -1.
int runnableThreads() {
  const int fd = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char text[128];
  const ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (n <= 0) return -1;
  text[n] = '\0';
  const char* slash = std::strchr(text, '/');
  if (!slash) return -1;
  const char* start = slash;
  while (start > text && start[-1] >= '0' && start[-1] <= '9') --start;
  return start == slash ? -1 : std::atoi(start);
}

// Cores the other processes leave free, with b.mu held.
int freeCoresLocked(Budget& b) {
  static const int online = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  static const int usable = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    return ::sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : online;
  }();
  // On a subset of the CPUs (a container's cpuset), the machine-wide runnable count says
  // nothing about the cores this process may use: no load is subtracted.
  if (usable < online) return usable;
  const auto now = std::chrono::steady_clock::now();
  if (now - b.readAt > std::chrono::milliseconds(10)) {
    b.runnable = runnableThreads();
    b.readAt = now;
  }
  if (b.runnable < 0) return online;
  // This process's own runnable threads: the caller and its OpenMP team, whose threads spin
  // for a while after every parallel region (eager runs and other libraries' regions use the
  // same team), and the other callers. Counting the team when it already sleeps can only keep
  // threads under a partial load.
  const int own = b.total + (b.callers - 1);
  const int others = std::max(0, b.runnable - own);
  return std::max(1, online - others);
}

// Holds granted compute threads for one run and sets them as the calling thread's OpenMP
// count (a per-thread setting in libgomp), restoring the old count afterwards.
class ThreadGrant {
 public:
  explicit ThreadGrant(int wanted)
      : previous_(omp_get_max_threads()), granted_(ComputeThreads::acquire(wanted)) {
    omp_set_num_threads(granted_);
  }
  ~ThreadGrant() {
    omp_set_num_threads(previous_);
    ComputeThreads::release(granted_);
  }
  ThreadGrant(const ThreadGrant&) = delete;
  ThreadGrant& operator=(const ThreadGrant&) = delete;
  int threads() const { return granted_; }

 private:
  int previous_;
  int granted_;
};

}  // namespace

void setNumThreads(int threads) {
  if (threads <= 0) return;
  omp_set_num_threads(threads);
  Budget& b = budget();
  std::lock_guard lock(b.mu);
  b.total = threads;
  b.cv.notify_all();
}

int numThreads() {
  Budget& b = budget();
  std::lock_guard lock(b.mu);
  return b.total;
}

int ComputeThreads::acquire(int wanted) {
  Budget& b = budget();
  std::unique_lock lock(b.mu);
  ++b.callers;
  // First come, first served: a run is granted threads only at the head of the queue, so that
  // under many callers none waits much longer than the others (the p99 of a serving load).
  const uint64_t ticket = b.nextTicket++;
  int granted = 0;
  b.cv.wait(lock, [&] {
    if (b.nowServing != ticket) return false;
    // Alone: up to the whole budget (and the free cores), once every thread is free. With
    // company: one thread.
    int want = b.callers == 1 ? std::clamp(wanted, 1, b.total) : 1;
    if (want > 1 && b.loadAware.load(std::memory_order_relaxed))
      want = std::min(want, freeCoresLocked(b));
    if (b.total - b.inUse < want) return false;
    granted = want;
    return true;
  });
  b.inUse += granted;
  b.peak = std::max(b.peak, b.inUse);
  ++b.nowServing;
  lock.unlock();
  b.cv.notify_all();  // The next in the queue may fit in what is left.
  return granted;
}

void ComputeThreads::release(int threads) {
  Budget& b = budget();
  {
    std::lock_guard lock(b.mu);
    b.inUse -= threads;
    --b.callers;
  }
  b.cv.notify_all();
}

void ComputeThreads::setLoadAware(bool on) {
  budget().loadAware = on;
}

int ComputeThreads::freeCores() {
  Budget& b = budget();
  std::lock_guard lock(b.mu);
  return freeCoresLocked(b);
}

int ComputeThreads::peakInUse() {
  Budget& b = budget();
  std::lock_guard lock(b.mu);
  return b.peak;
}

bool Plan::writesParameters() const {
  for (int p : outputParameter)
    if (p >= 0) return true;
  for (const PlanStep& s : steps)
    for (const BufferRef& b : s.outputs)
      if (b.kind == BufferRef::Kind::kParameter) return true;
  return false;
}

int64_t Plan::parameterBytes() const {
  int64_t b = 0;
  for (const ir::TensorData& d : parameters) b += static_cast<int64_t>(d.byteSize());
  return b;
}

int64_t Plan::bytesPerCall() const {
  int64_t b = arenaBytes;
  for (size_t i = 0; i < outputs.size(); ++i)
    if (i >= outputParameter.size() || outputParameter[i] < 0)
      b += static_cast<int64_t>(outputs[i].byteSize());
  return b;
}

// Scratch arenas, one per call in progress, reused across calls.
struct PlanExecutor::Arenas {
  struct Arena {
    std::unique_ptr<std::byte[]> storage;  // Uninitialized: pages commit when first written.
    std::byte* base = nullptr;             // 64-byte aligned.
  };
  explicit Arenas(int64_t bytes) : bytes(bytes) {}

  Expected<Arena> take() {
    {
      std::unique_lock lock(mu);
      // Under a memory limit, a call waits for an arena once `max` exist.
      cv.wait(lock, [&] { return !free.empty() || max == 0 || allocated < max; });
      if (!free.empty()) {
        Arena a = std::move(free.back());
        free.pop_back();
        return a;
      }
      ++allocated;  // Reserved now, so that concurrent calls respect `max`.
    }
    Arena a;
    a.storage.reset(new (std::nothrow) std::byte[static_cast<size_t>(bytes) + 64]);
    if (!a.storage) {
      {
        std::lock_guard lock(mu);
        --allocated;
      }
      cv.notify_one();
      return resourceExhausted("cannot allocate the plan's " + std::to_string(bytes) +
                               "-byte scratch arena: out of memory");
    }
    const auto addr = reinterpret_cast<uintptr_t>(a.storage.get());
    a.base = a.storage.get() + ((64 - addr % 64) % 64);
    return a;
  }
  void give(Arena a) {
    {
      std::lock_guard lock(mu);
      free.push_back(std::move(a));
    }
    cv.notify_one();
  }

  const int64_t bytes;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Arena> free;
  size_t allocated = 0;
  size_t max = 0;  // 0: no bound.
};

PlanExecutor::PlanExecutor(std::shared_ptr<const Plan> plan, int threads)
    : plan_(std::move(plan)),
      threads_(threads),
      serialized_(plan_->writesParameters()),
      cache_(std::make_unique<LibraryCache>()),
      arenas_(std::make_unique<Arenas>(plan_->arenaBytes)) {}

PlanExecutor::~PlanExecutor() = default;

PlanRunStats PlanExecutor::lastStats() const {
  std::lock_guard lock(statsMu_);
  return lastStats_;
}

void PlanExecutor::clearLibraryCache() {
  std::unique_lock lock(runMu_);
  cache_->clear();
}

Status PlanExecutor::limitMemory(int64_t limitBytes) {
  if (limitBytes <= 0) return Status::ok();
  const Plan& p = *plan_;
  const int64_t weights = p.parameterBytes(), perCall = p.bytesPerCall();
  auto mb = [](int64_t b) {
    char s[32];
    std::snprintf(s, sizeof(s), "%.1f MB", static_cast<double>(b) / 1e6);
    return std::string(s);
  };
  if (weights + perCall > limitBytes)
    return resourceExhausted("the model needs " + mb(weights + perCall) + " (weights " +
                             mb(weights) + ", activations arena " + mb(p.arenaBytes) +
                             ", outputs " + mb(perCall - p.arenaBytes) +
                             "), more than the memory limit of " + mb(limitBytes) +
                             "; raise the limit (--max-memory), or use a smaller batch");
  std::lock_guard lock(arenas_->mu);
  arenas_->max = perCall > 0 ? static_cast<size_t>((limitBytes - weights) / perCall) : 0;
  return Status::ok();
}

size_t PlanExecutor::arenasAllocated() const {
  std::lock_guard lock(arenas_->mu);
  return arenas_->allocated;
}

Expected<std::vector<Tensor>> PlanExecutor::run(std::span<const Tensor> inputs,
                                                PlanRunStats* statsOut) {
  const auto tWait = std::chrono::steady_clock::now();
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
  // A serialized plan (in-place parameter writes) runs alone; clearLibraryCache waits for
  // every run.
  std::shared_lock<std::shared_mutex> shared(runMu_, std::defer_lock);
  std::unique_lock<std::shared_mutex> exclusive(runMu_, std::defer_lock);
  if (serialized_)
    exclusive.lock();
  else
    shared.lock();
  // The arena first, then the threads: a call never holds compute threads while it waits for
  // memory (under limitMemory).
  KILN_ASSIGN_OR_RETURN(Arenas::Arena arena, arenas_->take());
  struct GiveBack {
    Arenas& pool;
    Arenas::Arena& arena;
    ~GiveBack() { pool.give(std::move(arena)); }
  } giveBack{*arenas_, arena};
  std::byte* const arenaBase = arena.base;
  const ThreadGrant grant(threads_ > 0 ? threads_ : numThreads());

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
        return arenaBase + b.offset;
      case BufferRef::Kind::kOutput:
        return outs[b.index].rawData();
    }
    return nullptr;
  };
  // A tensor view of a buffer, for reference kernels.
  auto view = [&](const BufferRef& b) {
    return Tensor::wrap(address(b), b.type.dtype, b.type.shape);
  };

  const bool profiling = profiling_.load(std::memory_order_relaxed);
  PlanRunStats stats;
  stats.threads = grant.threads();
  const auto t0 = std::chrono::steady_clock::now();
  stats.waitMs = msBetween(tWait, t0);
  std::vector<void*> args;
  std::vector<Tensor> tin, tout;
  for (const PlanStep& s : p.steps) {
    const auto ts =
        profiling ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    switch (s.kind) {
      case PlanStep::Kind::kKernel: {
        args.clear();
        for (const auto& b : s.inputs) args.push_back(address(b));
        for (const auto& b : s.outputs) args.push_back(address(b));
        void* const* a = args.data();
        const int64_t units = s.units;
        const int threads = grant.threads();
        const int nt = s.elements < kParallelThreshold
                           ? 1
                           : static_cast<int>(std::min<int64_t>(threads, units));
        if (nt <= 1) {
          s.fn(a, 0, units);
        } else {
#pragma omp parallel for num_threads(nt) schedule(static, 1)
          for (int t = 0; t < nt; ++t) s.fn(a, units * t / nt, units * (t + 1) / nt);
        }
        ++stats.kernelSteps;
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
        ++stats.opSteps;
        break;
      }
      case PlanStep::Kind::kCopy:
        std::memcpy(address(s.outputs[0]), address(s.inputs[0]), s.outputs[0].type.byteSize());
        break;
    }
    if (profiling) stats.stepMs.push_back(msBetween(ts, std::chrono::steady_clock::now()));
  }
  stats.totalMs = msBetween(t0, std::chrono::steady_clock::now());
  {
    std::lock_guard lock(statsMu_);
    lastStats_ = stats;
  }
  if (statsOut) *statsOut = std::move(stats);
  return outs;
}

}  // namespace kiln::runtime
