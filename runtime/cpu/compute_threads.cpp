#include "runtime/cpu/compute_threads.h"

#include <fcntl.h>
#include <omp.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>

namespace kiln::runtime {

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
  // /proc/loadavg's runnable count, when it was read, and the reading before it.
  int runnable = 0;
  int previousRunnable = -1;
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
    b.previousRunnable = b.runnable;
    b.runnable = runnableThreads();
    b.readAt = now;
  }
  if (b.runnable < 0) return online;
  // A load seen in two readings (10 ms or more apart): a thread runnable for a moment (a kernel
  // worker, this VM's monitor) must not halve the next 10 ms of runs. On an idle 2-core VM 1%
  // of readings show one such thread; 2 of 6 slow 10-run timings of mobilenet_v3_small (1.1 ms
  // a run) read 3 runnable threads, which alone gave the runs of the next 10 ms one thread.
  const int runnable =
      b.previousRunnable < 0 ? b.runnable : std::min(b.runnable, b.previousRunnable);
  // This process's own runnable threads: the caller and its OpenMP team, whose threads spin
  // for a while after every parallel region (eager runs and other libraries' regions use the
  // same team), and the other callers. Counting the team when it already sleeps can only keep
  // threads under a partial load.
  const int own = b.total + (b.callers - 1);
  const int others = std::max(0, runnable - own);
  return std::max(1, online - others);
}

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

bool ComputeThreads::loadAware() {
  return budget().loadAware.load();
}

void ComputeThreads::setLoadAware(bool on) {
  budget().loadAware = on;
}

int ComputeThreads::freeCores() {
  Budget& b = budget();
  std::lock_guard lock(b.mu);
  return freeCoresLocked(b);
}

ThreadGrant::ThreadGrant(int wanted)
    : previous_(omp_get_max_threads()), granted_(ComputeThreads::acquire(wanted)) {
  omp_set_num_threads(granted_);
}

ThreadGrant::~ThreadGrant() {
  omp_set_num_threads(previous_);
  ComputeThreads::release(granted_);
}

int ComputeThreads::peakInUse() {
  Budget& b = budget();
  std::lock_guard lock(b.mu);
  return b.peak;
}

}  // namespace kiln::runtime
