// Profiles (compiler/profile.h) and the machine's peaks (compiler/machine_peak.h): every executed
// step is one event, the rows add up to the events, and the FLOPs a profile counts are
// ir::countWork's; the FMA peak is one that cores at a real clock can give.
#include <catch2/catch.hpp>

#include "compiler/compile.h"
#include "compiler/machine_peak.h"
#include "compiler/profile.h"
#include "ir/flops.h"
#include "models/zoo.h"
#include "random_inputs.h"
#include "runtime/cpu/compute_threads.h"
#include "runtime/eager.h"

using namespace kiln;

TEST_CASE("profile: one event per executed step, rows that add up, countWork's FLOPs") {
  const std::string name = GENERATE(as<std::string>{}, "mlp", "mnist_cnn");
  INFO(name);
  auto g = models::buildModel(name, {.batch = 2, .seed = 1});
  REQUIRE(g.hasValue());
  compiler::CompileOptions opts;
  opts.useCache = false;
  auto cm = compiler::compile(*g, opts);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  const auto inputs = testing::randomInputs(*g, 3);
  runtime::EagerExecutor eager(*g);
  (*cm)->setProfiling(true);
  constexpr int kRuns = 3;
  std::vector<runtime::PlanRunStats> compiledRuns(kRuns);
  std::vector<runtime::EagerStats> eagerRuns;
  for (int r = 0; r < kRuns; ++r) {
    REQUIRE((*cm)->run(inputs, &compiledRuns[r]).hasValue());
    REQUIRE(eager.run(inputs).hasValue());
    eagerRuns.push_back(eager.lastStats());
  }
  const compiler::Profile pc = compiler::profileCompiled(**cm, compiledRuns);
  const compiler::Profile pe = compiler::profileEager(eagerRuns);
  const size_t steps = (*cm)->plan().steps.size();
  CHECK(pc.events.size() == kRuns * steps);
  CHECK(pe.events.size() == kRuns * g->numNodes());
  for (const compiler::Profile* p : {&pc, &pe}) {
    int64_t calls = 0;
    double ms = 0;
    for (const auto& row : p->rows) {
      calls += row.calls;
      ms += row.ms;
      CHECK(row.bytes > 0);
    }
    CHECK(calls == static_cast<int64_t>(p->events.size()));
    double eventMs = 0;
    for (const auto& e : p->events) eventMs += e.ms;
    CHECK(ms == Approx(eventMs));
    // Each run's steps start in order, after the one before has started.
    for (size_t i = 1; i < p->events.size(); ++i)
      if (p->events[i].run == p->events[i - 1].run)
        CHECK(p->events[i].startMs >= p->events[i - 1].startMs);
  }
  // Eager runs the graph as given: its FLOPs are the graph's.
  int64_t eagerFlops = 0;
  for (const auto& row : pe.rows) eagerFlops += row.flops;
  CHECK(eagerFlops == kRuns * ir::countWork(*g).flops());
  // Compiled: the optimized graph's (BatchNorm folded away), step by step; the products'
  // multiply-accumulates are all still there.
  int64_t compiledFlops = 0, stepFlops = 0;
  for (const auto& row : pc.rows) compiledFlops += row.flops;
  for (const auto& w : (*cm)->report().stepWork) stepFlops += w.work.flops();
  CHECK(compiledFlops == kRuns * stepFlops);
  int64_t macs = 0;
  for (const auto& w : (*cm)->report().stepWork) macs += w.work.macs;
  CHECK(macs == ir::countWork(*g).macs);
}

TEST_CASE("machine peak: an FMA rate that cores at a real clock can give, and a copy rate") {
  auto p = compiler::measureMachinePeak(runtime::numThreads());
  INFO(p.status().message());
  REQUIRE(p.hasValue());
  INFO(p->gflops << " GFLOP/s, " << p->isa << ", implied " << p->impliedGHz << " GHz");
  CHECK(p->gflops > 0);
  // Chains folded together by the compiler would over-report several times: two FMA units of
  // this width would need a clock far above any CPU's (a loaded machine only lowers it).
  CHECK(p->impliedGHz < 6.5);
  CHECK(p->copyGBps > 0);
}
