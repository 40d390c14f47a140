// Work units in chunks that a team of threads claims as it runs: the CPU backend's kernel
// launches (runtime/cpu/cpu_backend.cpp) and the library kernels' loops (parallelUnits).
#pragma once

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace kiln::runtime {

// A kernel's work units in chunks that the team claims as it runs. Thread t first takes the
// chunks of its own static share, front to back, as a static split would run them (consecutive
// kernels find their rows where the same thread wrote them); when its share is done it takes
// chunks from the back of the others' shares. A thread slowed by something outside the process
// then delays the step by its share's tail, not by its whole share. On this project's 2-vCPU VM
// each vCPU in turn ran the same single-thread code 1.6x slower for seconds at a time (one thread
// pinned to each CPU in turn; the host's other tenants, most likely), and under a static split
// every step ran at the slower one's pace: mobilenet_v3_small's runs took 1.3-1.4x longer than
// with these queues (medians of 175-208 interleaved rounds in one process). Which thread runs a
// chunk does not change its result.
class ChunkQueues {
 public:
  // Shares of `chunks` for `threads` threads; the shares' cache lines are written here, by the
  // thread that then starts the team.
  void reset(int threads, int64_t chunks) {
    if (threads > capacity_) {
      shares_ = std::make_unique<Share[]>(static_cast<size_t>(threads));
      capacity_ = threads;
    }
    threads_ = threads;
    for (int t = 0; t < threads; ++t) {
      const uint64_t front = static_cast<uint64_t>(chunks * t / threads);
      const uint64_t back = static_cast<uint64_t>(chunks * (t + 1) / threads);
      shares_[t].frontBack.store(front | back << 32, std::memory_order_relaxed);
    }
  }

  // The next chunk for team member t: its own share's front, else another share's back; -1 when
  // every chunk is taken.
  int64_t next(int t) {
    if (int64_t c = take(shares_[t % threads_], /*fromBack=*/false); c >= 0) return c;
    for (int v = 1; v < threads_; ++v)
      if (int64_t c = take(shares_[(t + v) % threads_], /*fromBack=*/true); c >= 0) return c;
    return -1;
  }

 private:
  struct alignas(64) Share {
    std::atomic<uint64_t> frontBack{0};  // [front, back) of the share's untaken chunks.
  };

  static int64_t take(Share& s, bool fromBack) {
    uint64_t old = s.frontBack.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t front = old & 0xffffffffu, back = old >> 32;
      if (front >= back) return -1;
      const uint64_t taken = fromBack ? front | (back - 1) << 32 : (front + 1) | back << 32;
      if (s.frontBack.compare_exchange_weak(old, taken, std::memory_order_relaxed))
        return static_cast<int64_t>(fromBack ? back - 1 : front);
    }
  }

  std::unique_ptr<Share[]> shares_;
  int capacity_ = 0;
  int threads_ = 0;
};

// Units are split in up to this many chunks per thread.
inline constexpr int64_t kChunksPerThread = 8;

// body(c) for every chunk c in [0, chunks) on a team of `threads`, each claiming chunks from
// `queues` (reset here, by the caller, before the team starts).
template <class Body>
void runChunks(ChunkQueues& queues, int threads, int64_t chunks, Body&& body) {
  queues.reset(threads, chunks);
#pragma omp parallel num_threads(threads)
  for (int64_t c; (c = queues.next(omp_get_thread_num())) >= 0;) body(c);
}

// body(i) for every i in [0, n): when `parallel`, on the caller's OpenMP team (at most n
// threads), its units claimed from ChunkQueues, so that a thread slowed from outside costs the
// loop its share's tail instead of its whole share (as `omp parallel for schedule(static)`
// would); otherwise, inside a parallel region or with one thread, in order on this thread. For
// loops whose units compute the same bits on any thread; body must not throw.
template <class Body>
void parallelUnits(int64_t n, bool parallel, Body&& body) {
  const int threads = parallel && n > 1 && !omp_in_parallel()
                          ? static_cast<int>(std::min<int64_t>(omp_get_max_threads(), n))
                          : 1;
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  thread_local ChunkQueues queues;  // The caller's, shared by its team.
  const int64_t chunks = std::min<int64_t>(n, threads * kChunksPerThread);
  runChunks(queues, threads, chunks, [&](int64_t c) {
    for (int64_t i = n * c / chunks; i < n * (c + 1) / chunks; ++i) body(i);
  });
}

}  // namespace kiln::runtime
