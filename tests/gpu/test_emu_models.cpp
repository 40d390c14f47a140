// The CUDA backend on the emu device, end to end: every zoo model (forward, compiled and
// eager; a training step for the trainable ones) and the committed ONNX test models match the
// CPU; every generated kernel kind runs over random shapes and random launch geometries (block
// sizes 32..1024, grids with partial tail blocks) against the reference kernels.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <thread>

#include "compiler/compile.h"
#include "compiler/eager_kernels.h"
#include "compiler/train.h"
#include "frontends/onnx/onnx_import.h"
#include "ir/parser.h"
#include "models/zoo.h"
#include "random_inputs.h"
#include "runtime/eager.h"
#include "runtime/gpu/emu_device.h"
#include "runtime/gpu/gpu_backend.h"

using namespace kiln;
using runtime::Tensor;

namespace {

// The device under test: emu, or $KILN_TEST_DEVICE (scripts/gpu-check.sh sets cuda).
std::shared_ptr<runtime::Backend> emu() {
  const char* env = std::getenv("KILN_TEST_DEVICE");
  auto b = runtime::gpu::backendForDevice(env && *env ? env : "emu");
  INFO(b.status().message());
  REQUIRE(b.hasValue());
  return *b;
}

// One kernel cache directory for the process, removed at exit: the tests compile the same
// models more than once.
struct CacheDir {
  std::string path =
      (std::filesystem::temp_directory_path() / ("kiln_test_emu_" + std::to_string(::getpid())))
          .string();
  ~CacheDir() { std::filesystem::remove_all(path); }
};
struct TempCache {
  std::string path = [] {
    static const CacheDir dir;
    return dir.path;
  }();
};

// max |a - b| / max(|b|, floor); integer and bool outputs must be equal.
void checkClose(const Expected<std::vector<Tensor>>& got, const std::vector<Tensor>& want,
                double tol = 1e-4) {
  INFO(got.status().message());
  REQUIRE(got.hasValue());
  REQUIRE(got->size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const Tensor& a = (*got)[i];
    const Tensor& b = want[i];
    REQUIRE(a.shape() == b.shape());
    REQUIRE(a.dtype() == b.dtype());
    double maxRef = 0, maxDiff = 0;
    for (int64_t k = 0; k < b.numElements(); ++k) {
      const double x = a.elementAsDouble(k), y = b.elementAsDouble(k);
      if (std::isnan(y)) {
        CHECK(std::isnan(x));
        continue;
      }
      maxRef = std::max(maxRef, std::fabs(y));
      maxDiff = std::max(maxDiff, std::fabs(x - y));
    }
    INFO("output " << i << ": max diff " << maxDiff << " of max " << maxRef);
    if (ir::isFloat(b.dtype()))
      CHECK(maxDiff <= tol * std::max(maxRef, 1.0));
    else
      CHECK(maxDiff == 0);
  }
}

// `g` compiled for the device under test, with the process's kernel cache.
std::unique_ptr<compiler::CompiledModel> compileForDevice(const ir::Graph& g) {
  TempCache cache;
  compiler::CompileOptions o;
  o.cacheDir = cache.path;
  o.backend = emu();
  auto cm = compiler::compile(g, o);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  return std::move(*cm);
}

// The CPU's eager outputs of `g` on `ins`.
std::vector<Tensor> cpuEager(const ir::Graph& g, const std::vector<Tensor>& ins) {
  auto want = runtime::EagerExecutor(g).run(ins);
  INFO(want.status().message());
  REQUIRE(want.hasValue());
  return std::move(*want);
}
}  // namespace

TEST_CASE("emu: every zoo model runs compiled and eager on the emu device, matching the CPU") {
  const auto models = models::listModels();
  const std::string name = GENERATE_COPY(from_range([&] {
    std::vector<std::string> n;
    for (const auto& m : models) n.push_back(m.name);
    return n;
  }()));
  INFO(name);
  auto g = models::buildModel(name, {2, 5});
  REQUIRE(g.hasValue());
  const std::vector<Tensor> ins = testing::randomInputs(*g, 9);
  const std::vector<Tensor> want = cpuEager(*g, ins);
  const auto cm = compileForDevice(*g);
  const auto& plan = cm->plan();
  int kernels = 0, libraryCalls = 0;
  for (const auto& s : plan.steps) {
    if (s.kind == runtime::PlanStep::Kind::kKernel) {
      ++kernels;
      CHECK(s.block >= 32);
      CHECK(s.block % 32 == 0);
      CHECK(s.grid >= 1);
    }
    libraryCalls += s.kind == runtime::PlanStep::Kind::kOp && s.library;
  }
  CHECK(kernels + libraryCalls > 0);
  CHECK(cm->report().hostSteps == 0);
  CHECK(cm->report().generatedKernels == kernels);
  runtime::PlanRunStats stats;
  checkClose(cm->run(ins, &stats), want);
  CHECK(stats.graphCaptured);  // The first call recorded a CUDA graph and replayed it.
  CHECK(stats.graphReplayed);
  // Other inputs through the same graph: they are copied in before each replay.
  const std::vector<Tensor> ins2 = testing::randomInputs(*g, 10);
  checkClose(cm->run(ins2, &stats), cpuEager(*g, ins2));
  CHECK_FALSE(stats.graphCaptured);
  CHECK(stats.graphReplayed);
  CHECK(cm->graphsCaptured() == 1);
  CHECK(cm->arenasAllocated() == 1);
  // Without graphs (--no-cuda-graph): every step enqueued again, the same results.
  cm->setGraphs(false);
  checkClose(cm->run(ins, &stats), want);
  CHECK_FALSE(stats.graphReplayed);

  // Eager: every op on the host but the library calls, then with a generated kernel per op.
  runtime::EagerExecutor eager(*g, emu());
  checkClose(eager.run(ins), want);
  TempCache cache;
  compiler::CompileOptions ko;
  ko.cacheDir = cache.path;
  REQUIRE(compiler::useDeviceKernels(eager, emu(), ko).isOk());
  runtime::gpu::DeviceApi& dev = *runtime::gpu::gpuDevice(*emu());
  const auto before = runtime::gpu::emuCounters(dev);
  checkClose(eager.run(ins), want);
  if (before.hasValue()) {  // On emu: nothing ran on the host, every op was a device kernel.
    const auto after = runtime::gpu::emuCounters(dev);
    CHECK(after->hostFunctions == before->hostFunctions);
    CHECK(after->kernelLaunches + after->libraryCalls >
          before->kernelLaunches + before->libraryCalls);
  }
}

TEST_CASE("emu: eager keeps the weights on the device, and device runs are timed by events") {
  auto g = models::buildModel("mlp", {2, 5});
  REQUIRE(g.hasValue());
  const std::vector<Tensor> ins = testing::randomInputs(*g, 4);
  runtime::EagerExecutor eager(*g, emu());
  // Counted by the backend's allocator (its cache may serve them without a device malloc).
  const int64_t bytesBefore = emu()->memoryStats().bytesInUse;
  const auto first = eager.run(ins);
  checkClose(first, cpuEager(*g, ins));
  // The weights stay on the device between runs (a model moved to a GPU), like a plan's.
  CHECK(emu()->memoryStats().bytesInUse - bytesBefore >= g->parameterBytes());
  CHECK(eager.lastStats().deviceMs >= 0);
  runtime::EagerExecutor onCpu(*g);
  REQUIRE(onCpu.run(ins).hasValue());
  CHECK(onCpu.lastStats().deviceMs < 0);  // The CPU's streams have no timer.

  // New weight values reach the device after parametersChanged (an optimizer step), not before.
  ir::Value* w = g->parameters().front();
  ir::TensorData d = w->data();
  float* f = reinterpret_cast<float*>(d.data());
  for (int64_t i = 0; i < w->type().numElements(); ++i) f[i] *= -2.f;
  checkClose(eager.run(ins), *first);
  eager.parametersChanged();
  checkClose(eager.run(ins), cpuEager(*g, ins));

  auto cm = compileForDevice(*g);
  runtime::PlanRunStats stats;
  checkClose(cm->run(ins, &stats), cpuEager(*g, ins));
  CHECK(stats.deviceMs >= 0);
}

TEST_CASE("emu: a compiled training step on the emu device matches the CPU's") {
  const std::string name = GENERATE(as<std::string>{}, "mlp", "mnist_cnn", "resnet18");
  INFO(name);
  TempCache cache;
  compiler::TrainOptions cpu;
  cpu.compile.cacheDir = cache.path;
  // The CPU without library epilogues: with BatchNorm over few values the gradients are
  // ill-conditioned, and oneDNN's channels-last convolutions with fused post-ops round
  // differently from the plain ones the emu device's descriptors run.
  cpu.compile.libraryFusion = false;
  cpu.sgd = {.lr = 0.01, .momentum = 0.9, .weightDecay = 1e-4, .nesterov = false};
  compiler::TrainOptions onEmu = cpu;
  onEmu.compile.backend = emu();
  const models::ModelOptions mo{.batch = 4, .seed = 7, .imageSize = name == "resnet18" ? 64 : 0};
  std::vector<std::unique_ptr<compiler::TrainingStep>> steps;
  for (const auto* o : {&cpu, &onEmu}) {
    auto model = models::buildModel(name, mo);
    REQUIRE(model.hasValue());
    auto s = compiler::TrainingStep::create(std::move(model).value(), *o);
    INFO(s.status().message());
    REQUIRE(s.hasValue());
    steps.push_back(std::move(*s));
  }
  const ir::Shape shape = steps[0]->graph().inputs()[0]->type().shape;
  std::mt19937 rng(3);
  for (int step = 0; step < 2; ++step) {
    Tensor x = *Tensor::empty(ir::DType::kF32, shape);
    for (int64_t i = 0; i < x.numElements(); ++i)
      x.data<float>()[i] = std::uniform_real_distribution<float>(-1, 1)(rng);
    const ir::TensorType tt = steps[0]->targetType();
    Tensor t = *Tensor::zeros(tt.dtype, tt.shape);
    for (int64_t i = 0; i < t.numElements(); ++i)
      t.data<int64_t>()[i] = static_cast<int64_t>(rng() % 10);
    std::vector<double> losses;
    for (auto& s : steps) {
      auto r = (*s)(x, t);
      INFO(r.status().message());
      REQUIRE(r.hasValue());
      losses.push_back(r->loss);
    }
    INFO("losses " << losses[0] << " " << losses[1]);
    CHECK(std::fabs(losses[1] - losses[0]) <= 1e-4 * std::max(1.0, std::fabs(losses[0])));
  }
  // The updated weights came back from the device and match: the difference is small against
  // how far the two steps moved them (BatchNorm over few values makes the gradients
  // ill-conditioned, so rounding differences grow, but stay far below the updates).
  auto initial = models::buildModel(name, mo);  // The same seed: the same initial weights.
  REQUIRE(initial.hasValue());
  const auto& p0 = steps[0]->graph().parameters();
  const auto& p1 = steps[1]->graph().parameters();
  for (size_t i = 0; i < p0.size(); ++i) {
    if (!p0[i]->trainable() || p0[i]->data().dtype() != ir::DType::kF32) continue;
    const ir::Value* start = nullptr;
    for (const ir::Value* p : initial->parameters())
      if (p->name() == p0[i]->name()) start = p;
    REQUIRE(start);
    INFO(p0[i]->name());
    const float* a = p0[i]->data().as<float>();
    const float* c = p1[i]->data().as<float>();
    const float* w = start->data().as<float>();
    double diff = 0, moved = 0;
    for (int64_t k = 0; k < p0[i]->data().numElements(); ++k) {
      diff = std::max(diff, std::fabs(static_cast<double>(a[k]) - c[k]));
      moved = std::max(moved, std::fabs(static_cast<double>(a[k]) - w[k]));
    }
    CHECK(moved > 0);
    CHECK(diff <= 1e-2 * moved + 1e-6);
  }
}

TEST_CASE("emu: the committed ONNX test models run on the emu device, matching the CPU") {
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(KILN_TEST_DATA_DIR) + "/onnx")) {
    if (entry.path().extension() != ".onnx") continue;
    INFO(entry.path().string());
    auto g = frontends::loadOnnx(entry.path().string());
    INFO(g.status().message());
    REQUIRE(g.hasValue());
    const std::vector<Tensor> ins = testing::randomInputs(*g, 4);
    const std::vector<Tensor> want = cpuEager(*g, ins);
    checkClose(compileForDevice(*g)->run(ins), want);
    runtime::EagerExecutor eager(*g, emu());
    checkClose(eager.run(ins), want);
  }
}

namespace {

struct KindCase {
  const char* kind;
  const char* ir;  // {R} and {C} stand for the random row and column counts.
};

// One graph per generated kernel kind.
const KindCase kKinds[] = {
    {"pointwise", R"(graph g(%x : f32[{R},{C}], %y : f32[{R},{C}]) {
  %a : f32[{R},{C}] = mul(%x, %y)
  %b : f32[{R},{C}] = gelu(%a)
  %c : f32[{R},{C}] = add(%b, %x)
  return %c
})"},
    {"broadcast", R"(graph g(%x : f32[{R},{C}], %b : f32[{C}], %s : f32[{R},1]) {
  %a : f32[{R},{C}] = add(%x, %b)
  %m : f32[{R},{C}] = mul(%a, %s)
  %r : f32[{R},{C}] = relu(%m)
  return %r
})"},
    {"reduction", R"(graph g(%x : f32[{R},{C}]) {
  %e : f32[{R},{C}] = exp(%x)
  %s : f32[{R},1] = reduce_sum(%e) {axes=[1]}
  %m : f32[{R},1] = reduce_max(%x) {axes=[1]}
  %d : f32[{R},1] = sub(%s, %m)
  return %d
})"},
    {"softmax", R"(graph g(%x : f32[{R},{C}], %k : f32[{R},{C}]) {
  %a : f32[{R},{C}] = mul(%x, %k)
  %p : f32[{R},{C}] = softmax(%a) {axis=1}
  return %p
})"},
    {"layernorm", R"(graph g(%x : f32[{R},{C}], %w : f32[{C}], %b : f32[{C}]) {
  %y : f32[{R},{C}] = layer_norm(%x, %w, %b) {axis=1}
  %z : f32[{R},{C}] = gelu(%y)
  return %z
})"},
    {"strided view", R"(graph g(%x : f32[{R},{C}], %y : f32[{C},{R}]) {
  %t : f32[{C},{R}] = transpose(%x) {perm=[1,0]}
  %a : f32[{C},{R}] = add(%t, %y)
  return %a
})"},
    {"epilogue",
     R"(graph g(%x : f32[{R},{C}], %w : f32[{C},{C}], %b : f32[{C}], %r : f32[{R},{C}]) {
  %m : f32[{R},{C}] = matmul(%x, %w)
  %a : f32[{R},{C}] = add(%m, %b)
  %s : f32[{R},{C}] = add(%a, %r)
  %o : f32[{R},{C}] = relu(%s)
  return %o
})"},
};

std::string substitute(std::string s, int64_t rows, int64_t cols) {
  for (auto [key, v] : {std::pair{std::string("{R}"), rows}, std::pair{std::string("{C}"), cols}})
    for (size_t at = s.find(key); at != std::string::npos; at = s.find(key))
      s.replace(at, key.size(), std::to_string(v));
  return s;
}

}  // namespace

TEST_CASE("emu: every generated kernel kind over random shapes and launch geometries") {
  std::mt19937 rng(11);
  for (const KindCase& kc : kKinds) {
    for (int trial = 0; trial < 4; ++trial) {
      const int64_t rows = std::uniform_int_distribution<int64_t>(1, 40)(rng);
      const int64_t cols = std::uniform_int_distribution<int64_t>(1, 700)(rng);
      INFO(kc.kind << " [" << rows << "," << cols << "]");
      auto g = ir::parseGraph(substitute(kc.ir, rows, cols));
      INFO(g.status().message());
      REQUIRE(g.hasValue());
      const std::vector<Tensor> ins = testing::randomInputs(*g, 20 + trial);
      const std::vector<Tensor> want = cpuEager(*g, ins);
      const auto cm = compileForDevice(*g);
      REQUIRE(cm->report().generatedKernels > 0);
      checkClose(cm->run(ins), want);  // Codegen's geometry.
      // The same kernels under random geometries: 32..1024 threads, grids from 1 block (the
      // grid-stride loops do all the work) to more blocks than work (tail and idle blocks).
      auto plan = std::make_shared<runtime::Plan>(cm->plan());
      for (auto& s : plan->steps) {
        if (s.kind != runtime::PlanStep::Kind::kKernel) continue;
        s.block = 32 * std::uniform_int_distribution<int>(1, 32)(rng);
        const int64_t needed = (s.elements + s.block - 1) / s.block;
        s.grid = std::uniform_int_distribution<int64_t>(1, needed + 3)(rng);
      }
      runtime::PlanExecutor exec(plan);
      checkClose(exec.run(ins), want);
    }
  }
}

TEST_CASE("emu: concurrent callers each take a stream, an arena and a graph, with right results") {
  auto g = models::buildModel("mnist_cnn", {2, 3});
  REQUIRE(g.hasValue());
  constexpr int kThreads = 4, kCalls = 6;
  std::vector<std::vector<Tensor>> inputs, wants;
  for (int i = 0; i < kThreads; ++i) {
    inputs.push_back(testing::randomInputs(*g, 100 + i));
    auto w = runtime::EagerExecutor(*g).run(inputs.back());
    REQUIRE(w.hasValue());
    wants.push_back(*w);
  }
  const auto cm = compileForDevice(*g);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kThreads);
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int c = 0; c < kCalls; ++c) {
        const int which = (t + c) % kThreads;  // Every thread meets every input.
        auto got = cm->run(inputs[which]);
        if (!got) {
          errors[t] = got.status().message();
          return;
        }
        for (int64_t k = 0; k < wants[which][0].numElements(); ++k)
          if (std::fabs((*got)[0].elementAsDouble(k) - wants[which][0].elementAsDouble(k)) > 1e-4) {
            errors[t] = "call " + std::to_string(c) + ": wrong result at " + std::to_string(k);
            return;
          }
      }
    });
  for (auto& th : threads) th.join();
  for (const auto& e : errors) CHECK(e == "");
  // One graph per slot: as many as calls ever ran at once.
  CHECK(cm->graphsCaptured() == static_cast<int64_t>(cm->arenasAllocated()));
  CHECK(cm->arenasAllocated() >= 1);
}
