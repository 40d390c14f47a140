#include "runtime/cpu/chunk_queues.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

using kiln::runtime::ChunkQueues;

TEST_CASE("chunk queues: a thread takes its own share in order, then the others' from the back") {
  ChunkQueues q;
  q.reset(2, 10);
  std::vector<int64_t> got;
  for (int64_t c; (c = q.next(0)) >= 0;) got.push_back(c);
  // Its share [0, 5) front to back, then thread 1's [5, 10) from the back.
  CHECK(got == std::vector<int64_t>{0, 1, 2, 3, 4, 9, 8, 7, 6, 5});
  CHECK(q.next(1) == -1);

  q.reset(2, 10);  // Reused: fresh shares.
  CHECK(q.next(1) == 5);
  CHECK(q.next(0) == 0);
  q.reset(3,
          2);  // Fewer chunks than threads: thread 0's share is empty; 1's is [0, 1), 2's [1, 2).
  CHECK(q.next(0) == 0);
  CHECK(q.next(0) == 1);
  CHECK(q.next(0) == -1);
}

// Racing threads, a late one and one that never comes (an OpenMP team smaller than asked for):
// every chunk runs exactly once. Thread 0 starts only after the others are done, so they took
// its whole share (a slow thread, made deterministic).
TEST_CASE("chunk queues: every chunk is taken exactly once by racing threads") {
  for (const int present : {4, 3, 1}) {
    DYNAMIC_SECTION(present << " of 4 threads") {
      ChunkQueues q;
      const int64_t chunks = 4000;
      q.reset(4, chunks);
      std::vector<std::vector<int64_t>> taken(present);
      std::atomic<int> finished{0};
      std::vector<std::thread> team;
      for (int t = 0; t < present; ++t)
        team.emplace_back([&, t] {
          if (t == 0)
            while (finished.load() < present - 1) std::this_thread::yield();
          for (int64_t c; (c = q.next(t)) >= 0;) taken[t].push_back(c);
          ++finished;
        });
      for (auto& th : team) th.join();
      std::vector<int> count(chunks, 0);
      for (const auto& v : taken)
        for (int64_t c : v) ++count[c];
      int64_t once = 0;
      for (int n : count) once += n == 1;
      CHECK(once == chunks);
      if (present > 1) CHECK(taken[0].empty());  // The others took the late thread's share.
    }
  }
}

// The library kernels' loops: every unit once on the team, and in order on the caller when not
// parallel or already inside a parallel region.
TEST_CASE("parallelUnits: every unit runs once; serial when not parallel or inside a region") {
  using kiln::runtime::parallelUnits;
  const int before = omp_get_max_threads();
  omp_set_num_threads(2);
  const int64_t n = 1000;
  std::vector<std::atomic<int>> count(n);
  parallelUnits(n, true, [&](int64_t i) { ++count[i]; });
  int64_t once = 0;
  for (auto& c : count) once += c.load() == 1;
  CHECK(once == n);

  std::vector<int64_t> order;
  parallelUnits(5, false, [&](int64_t i) { order.push_back(i); });
  CHECK(order == std::vector<int64_t>{0, 1, 2, 3, 4});
  order.clear();
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    parallelUnits(5, true, [&](int64_t i) {
      CHECK(omp_get_num_threads() == 2);  // Still the outer team: no nested one.
      order.push_back(i);
    });
  }
  CHECK(order == std::vector<int64_t>{0, 1, 2, 3, 4});
  omp_set_num_threads(before);
}
