// Many threads calling one compiled model: CompiledModel, a loaded artifact and JitModule, each
// from 8 threads x 200 calls (KILN_TEST_CALLS overrides the count, for slow sanitizer builds),
// must give bit for bit what single-threaded calls give; JIT first calls of one signature
// compile once; the compute threads stay within the budget; a training step serializes.
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "compiler/artifact.h"
#include "compiler/jit.h"
#include "compiler/train.h"
#include "frontends/test_files.h"
#include "models/zoo.h"
#include "runtime/cpu/compute_threads.h"
#include "runtime/library/dnnl_support.h"

using namespace kiln;
using runtime::Tensor;

namespace {

namespace fs = std::filesystem;

constexpr int kThreads = 8;
constexpr int kInputs = 5;  // Distinct inputs; call c of thread t uses input (t + c) % kInputs.

int callsPerThread() {
  const char* env = std::getenv("KILN_TEST_CALLS");
  return env ? std::max(1, std::atoi(env)) : 200;
}

using kiln::test::TempDir;

std::vector<Tensor> randomInput(const ir::TensorType& t, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  Tensor x = *Tensor::empty(t.dtype, t.shape);
  for (int64_t i = 0; i < x.numElements(); ++i) x.data<float>()[i] = dist(rng);
  return {x};
}

using RunFn = std::function<Expected<std::vector<Tensor>>(const std::vector<Tensor>&)>;

// Runs `run` from kThreads threads, callsPerThread() calls each, and counts the calls whose
// outputs are not bitwise `expected[input]`. Errors count as mismatches and are kept.
struct Outcome {
  int mismatches = 0;
  int calls = 0;
  std::string firstError;
};

Outcome hammer(const RunFn& run, const std::vector<std::vector<Tensor>>& inputs,
               const std::vector<std::vector<Tensor>>& expected, int callsDivisor = 1) {
  const int callsEach = std::max(1, callsPerThread() / callsDivisor);
  std::atomic<int> mismatches{0}, calls{0};
  std::mutex errorMu;
  std::string firstError;
  std::atomic<bool> go{false};
  {
    std::vector<std::jthread> pool;
    for (int t = 0; t < kThreads; ++t)
      pool.emplace_back([&, t] {
        while (!go.load()) std::this_thread::yield();  // Start together.
        for (int c = 0; c < callsEach; ++c) {
          const size_t k = static_cast<size_t>((t + c) % kInputs);
          auto got = run(inputs[k]);
          ++calls;
          bool same = got.hasValue() && got->size() == expected[k].size();
          for (size_t i = 0; same && i < got->size(); ++i)
            same = (*got)[i].toData().bitwiseEqual(expected[k][i].toData());
          if (!same) {
            ++mismatches;
            std::lock_guard lock(errorMu);
            if (firstError.empty())
              firstError = got.hasValue() ? "output differs" : got.status().message();
          }
        }
      });
    go = true;
  }
  return {mismatches.load(), calls.load(), firstError};
}

// The expected outputs: each input run once, alone, by the same runner.
std::vector<std::vector<Tensor>> singleThreaded(const RunFn& run,
                                                const std::vector<std::vector<Tensor>>& inputs) {
  std::vector<std::vector<Tensor>> out;
  for (const auto& in : inputs) {
    auto r = run(in);
    INFO(r.status().message());
    REQUIRE(r.hasValue());
    out.push_back(std::move(*r));
  }
  return out;
}

compiler::CompileOptions options(const TempDir& dir) {
  compiler::CompileOptions o;
  o.cacheDir = dir.file("cache");
  return o;
}

// The budget of 2 compute threads for these tests (ctest runs them with OMP_NUM_THREADS=1): a
// call alone takes 2, calls in company 1 each. Under ThreadSanitizer 1: libgomp is not
// instrumented, so TSan cannot see the synchronization inside kiln's OpenMP regions and would
// report the runtime, not kiln (tests/sanitizers/tsan.supp).
#if defined(__SANITIZE_THREAD__)
constexpr int kBudget = 1;
#else
constexpr int kBudget = 2;
#endif
struct TwoThreads {
  int before = runtime::numThreads();
  TwoThreads() { runtime::setNumThreads(kBudget); }
  ~TwoThreads() { runtime::setNumThreads(before); }
};

void checkHammer(const RunFn& run, const ir::TensorType& inputType, int callsDivisor = 1) {
  std::vector<std::vector<Tensor>> inputs;
  for (int k = 0; k < kInputs; ++k) inputs.push_back(randomInput(inputType, 100 + k));
  const auto expected = singleThreaded(run, inputs);
  const Outcome o = hammer(run, inputs, expected, callsDivisor);
  INFO(o.firstError << " (" << o.calls << " calls)");
  CHECK(o.mismatches == 0);
  CHECK(runtime::ComputeThreads::peakInUse() <= kBudget);
}

}  // namespace

TEST_CASE("concurrency: one CompiledModel from 8 threads is bitwise single-threaded") {
  TempDir dir;
  TwoThreads budget;
  for (const std::string name : {"mnist_cnn", "bert_layer"}) {
    DYNAMIC_SECTION(name) {
      auto g = models::buildModel(name, {name == "bert_layer" ? 1 : 2, 0});
      REQUIRE(g.hasValue());
      auto cm = compiler::compile(*g, options(dir));
      INFO(cm.status().message());
      REQUIRE(cm.hasValue());
      compiler::CompiledModel& model = **cm;
      model.setProfiling(true);  // Per-call statistics are written by every call.
      checkHammer(
          [&](const std::vector<Tensor>& in) {
            runtime::PlanRunStats stats;
            auto r = model.run(in, &stats);
            // Each call's own statistics describe that call.
            if (r.hasValue() && stats.stepMs.size() != model.plan().steps.size())
              return Expected<std::vector<Tensor>>(internalError("stats of another call"));
            return r;
          },
          // bert_layer is ~20x mnist_cnn's work: 10 calls per thread for 200 of mnist's.
          model.plan().inputs[0], name == "bert_layer" ? 20 : 1);
      // One arena per call in progress at most, reused across calls.
      CHECK(model.arenasAllocated() >= 1);
      CHECK(model.arenasAllocated() <= static_cast<size_t>(kThreads));
    }
  }
}

TEST_CASE("concurrency: one loaded artifact from 8 threads is bitwise single-threaded") {
  TempDir dir;
  TwoThreads budget;
  auto g = models::buildModel("mnist_cnn", {2, 0});
  REQUIRE(g.hasValue());
  auto cm = compiler::compile(*g, options(dir));
  REQUIRE(cm.hasValue());
  const std::string path = dir.file("m.kiln");
  REQUIRE(compiler::saveArtifact(**cm, path, "mnist_cnn").isOk());
  auto loaded = kiln::load(path);
  INFO(loaded.status().message());
  REQUIRE(loaded.hasValue());
  runtime::LoadedModel& model = **loaded;
  checkHammer([&](const std::vector<Tensor>& in) { return model.run(in); }, model.plan().inputs[0]);
}

TEST_CASE("concurrency: JitModule from 8 threads compiles each signature once") {
  TempDir dir;
  TwoThreads budget;
  auto g = models::buildModel("mnist_cnn", {2, 0});
  REQUIRE(g.hasValue());
  std::ostringstream log;
  auto opts = options(dir);
  compiler::JitModule m(*g, opts);
  const ir::TensorType b2 = g->inputs()[0]->type();
  ir::TensorType b3 = b2;
  b3.shape[0] = 3;

  SECTION("first calls of one signature, all at once") {
    std::vector<std::vector<Tensor>> inputs;
    for (int k = 0; k < kInputs; ++k) inputs.push_back(randomInput(b2, 200 + k));
    // The expected outputs come from a separately compiled model (so that the module's first
    // call is one of the concurrent ones).
    auto ref = compiler::compile(*g, opts);
    REQUIRE(ref.hasValue());
    const auto expected =
        singleThreaded([&](const std::vector<Tensor>& in) { return (*ref)->run(in); }, inputs);
    const Outcome o =
        hammer([&](const std::vector<Tensor>& in) { return m(in); }, inputs, expected);
    INFO(o.firstError);
    CHECK(o.mismatches == 0);
    CHECK(m.compiles() == 1);
  }
  SECTION("two signatures compile concurrently and each runs its own model") {
    std::vector<std::vector<Tensor>> inputs;
    for (int k = 0; k < kInputs; ++k) inputs.push_back(randomInput(k % 2 ? b3 : b2, 300 + k));
    std::vector<std::vector<Tensor>> expected;
    for (int k = 0; k < kInputs; ++k) {
      auto gk = models::buildModel("mnist_cnn", {k % 2 ? 3 : 2, 0});
      REQUIRE(gk.hasValue());
      auto ref = compiler::compile(*gk, opts);
      REQUIRE(ref.hasValue());
      auto r = (*ref)->run(inputs[static_cast<size_t>(k)]);
      REQUIRE(r.hasValue());
      expected.push_back(std::move(*r));
    }
    const Outcome o =
        hammer([&](const std::vector<Tensor>& in) { return m(in); }, inputs, expected);
    INFO(o.firstError);
    CHECK(o.mismatches == 0);
    CHECK(m.compiles() == 2);
    CHECK(m.log().size() == 2);
  }
  CHECK(runtime::ComputeThreads::peakInUse() <= kBudget);
}

// Load awareness off: a call's grant then does not depend on what else the machine runs at that
// instant (OpenBLAS's products, kiln's sgemm until 2026-11-28, differed in their last bits between
// thread counts: mlp's 4x512 by 512x256 linear on 1 and on 2 threads on an AMD EPYC).
struct LoadAwareOff {
  bool before = runtime::ComputeThreads::loadAware();
  LoadAwareOff() { runtime::ComputeThreads::setLoadAware(false); }
  ~LoadAwareOff() { runtime::ComputeThreads::setLoadAware(before); }
};

TEST_CASE("concurrency: a training step's callers are serialized") {
  TempDir dir;
  TwoThreads budget;
  LoadAwareOff fixedGrants;
  // Every caller trains on the same batch, so the parameters after N steps do not depend on
  // which thread ran which step, only on the steps being whole and one at a time.
  auto make = [&] {
    auto g = models::buildModel("mlp", {4, 1});
    REQUIRE(g.hasValue());
    compiler::TrainOptions o;
    o.compile = options(dir);
    auto step = compiler::TrainingStep::create(std::move(*g), o);
    INFO(step.status().message());
    REQUIRE(step.hasValue());
    return std::move(*step);
  };
  auto serial = make();
  auto shared = make();
  REQUIRE(shared->compiled() != nullptr);
  CHECK(shared->compiled()->plan().writesParameters());
  const ir::TensorType xt = shared->graph().inputs()[0]->type();
  const Tensor x = randomInput(xt, 7)[0];
  Tensor y = *Tensor::empty(ir::DType::kI64, {4});
  for (int i = 0; i < 4; ++i) y.data<int64_t>()[i] = i * 3 % 10;
  constexpr int kSteps = 4;
  for (int i = 0; i < kThreads * kSteps; ++i) REQUIRE((*serial)(x, y).hasValue());
  std::atomic<int> failures{0};  // Catch's macros are not for other threads.
  {
    std::vector<std::jthread> pool;
    for (int t = 0; t < kThreads; ++t)
      pool.emplace_back([&] {
        for (int i = 0; i < kSteps; ++i) failures += !(*shared)(x, y).hasValue();
      });
  }
  CHECK(failures == 0);
  const auto& a = serial->graph().parameters();
  const auto& b = shared->graph().parameters();
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    INFO(a[i]->name());
    CHECK(a[i]->data().bitwiseEqual(b[i]->data()));
  }
}

TEST_CASE("memory limit: a model that does not fit fails before allocating; calls past it wait") {
  TempDir dir;
  TwoThreads budget;
  auto g = models::buildModel("mnist_cnn", {2, 0});
  REQUIRE(g.hasValue());
  // Far too little: an error that names the amounts, before any arena exists.
  auto opts = options(dir);
  opts.maxMemoryBytes = 1'000'000;  // The weights alone are 4.8 MB.
  auto tooSmall = compiler::compile(*g, opts);
  REQUIRE_FALSE(tooSmall.hasValue());
  CHECK(tooSmall.status().code() == ErrorCode::kResourceExhausted);
  CHECK(tooSmall.status().isUserError());
  CHECK_THAT(tooSmall.status().message(),
             Catch::Contains("the model needs") && Catch::Contains("weights 4.8 MB") &&
                 Catch::Contains("more than the memory limit of 1.0 MB"));

  // Room for the weights and exactly one call: 8 threads share one arena, one call at a time.
  auto ref = compiler::compile(*g, options(dir));
  REQUIRE(ref.hasValue());
  const runtime::Plan& plan = (*ref)->plan();
  opts.maxMemoryBytes = plan.parameterBytes() + plan.bytesPerCall() + plan.bytesPerCall() / 2;
  auto limited = compiler::compile(*g, opts);
  INFO(limited.status().message());
  REQUIRE(limited.hasValue());
  // At most the first call's arena before it (prepare makes a small one: no page faults in the
  // first run).
  CHECK((*limited)->arenasAllocated() <= 1);
  checkHammer([&](const std::vector<Tensor>& in) { return (*limited)->run(in); }, plan.inputs[0]);
  CHECK((*limited)->arenasAllocated() == 1);
}

TEST_CASE("concurrency: a run granted one thread finds its library primitives made by compile") {
  // oneDNN's primitives are made per thread count. compile() prepares them for the whole budget
  // and for one thread, the grant of a run among others (or on a loaded machine): neither run
  // below makes one on its way (a first run of 9-13 ms instead of 1.7 on mobilenet_v3_small).
  TempDir dir;
  TwoThreads budget;
  // Under ThreadSanitizer the budget is one thread (above): no run gets two, and the grant held
  // below would leave the run none.
  if (kBudget < 2) return;
  LoadAwareOff steady;  // A run alone gets both threads whatever else this machine runs.
  auto g = models::buildModel("mnist_cnn", {2, 0});
  REQUIRE(g.hasValue());
  auto m = compiler::compile(*g, options(dir));
  REQUIRE(m.hasValue());
  const std::vector<Tensor> in = randomInput((*m)->plan().inputs[0], 7);
  const uint64_t made = runtime::lib::plansMade.load();
  {
    runtime::ThreadGrant other(1);  // Another caller holds a thread: the run gets the other.
    auto out = (*m)->run(in);
    INFO(out.status().message());
    REQUIRE(out.hasValue());
    CHECK((*m)->lastStats().threads == 1);
  }
  auto out = (*m)->run(in);
  REQUIRE(out.hasValue());
  CHECK((*m)->lastStats().threads == 2);
  CHECK(runtime::lib::plansMade.load() == made);
}

TEST_CASE("concurrency: a JIT compile that throws is an error for every waiting caller") {
  TempDir dir;
  auto g = models::buildModel("mlp", {2, 0});
  REQUIRE(g.hasValue());
  // A specializer that throws, as an allocation inside LLVM might: callers of the new shape get
  // an error instead of waiting forever on a compile that never finishes.
  compiler::JitModule m(*g, options(dir), 8,
                        [](std::span<const ir::TensorType>) -> Expected<ir::Graph> {
                          throw std::runtime_error("specializer exploded");
                        });
  ir::TensorType t = g->inputs()[0]->type();
  t.shape[0] = 3;
  const std::vector<Tensor> in = randomInput(t, 1);
  std::atomic<int> errors{0};
  {
    std::vector<std::jthread> pool;
    for (int i = 0; i < kThreads; ++i)
      pool.emplace_back([&] {
        auto r = m(in);
        errors +=
            !r.hasValue() && r.status().message().find("specializer exploded") != std::string::npos;
      });
  }
  CHECK(errors == kThreads);
  CHECK(m.compiles() == 0);
}
