// The CUDA backend on the emu device, end to end: every zoo model (forward, compiled and
// eager; a training step for the trainable ones) and the committed ONNX test models match the
// CPU; every generated kernel kind runs over random shapes and random launch geometries (block
// sizes 32..1024, grids with partial tail blocks) against the reference kernels.
#include <unistd.h>

#include <bit>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <random>
#include <thread>

#include "compiler/compile.h"
#include "compiler/eager_kernels.h"
#include "compiler/staged.h"
#include "compiler/train.h"
#include "frontends/onnx/onnx_import.h"
#include "gpu_test_util.h"
#include "ir/parser.h"
#include "models/zoo.h"
#include "random_inputs.h"
#include "runtime/eager.h"
#include "runtime/gpu/emu_device.h"
#include "runtime/gpu/gpu_backend.h"
#include "runtime/reference/helpers.h"

using namespace kiln;
using runtime::Tensor;

namespace {

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
      // A NaN where a number is wanted is an infinite difference (std::max would drop it).
      maxDiff = std::isnan(x) ? INFINITY : std::max(maxDiff, std::fabs(x - y));
    }
    INFO("output " << i << ": max diff " << maxDiff << " of max " << maxRef);
    // A half-precision result may differ by one unit in its last place (an f32 value next to a
    // rounding boundary on either side): 2^-7 relative for bf16, 2^-10 for f16.
    if (b.dtype() == ir::DType::kBF16) tol = std::max(tol, 1.0 / 128);
    if (b.dtype() == ir::DType::kF16) tol = std::max(tol, 1.0 / 1024);
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
  o.backend = testing::testDevice();
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
std::vector<std::string> zooModelNames() {
  std::vector<std::string> names;
  for (const auto& m : models::listModels()) names.push_back(m.name);
  return names;
}

}  // namespace

TEST_CASE("emu: every zoo model runs compiled and eager on the emu device, matching the CPU") {
  const std::string name = GENERATE(from_range(zooModelNames()));
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
  // fp32 on a GPU stays NCHW: cuDNN's FMA kernels run it natively (BackendCaps::channelsLast).
  for (const ir::Node* n : cm->optimizedGraph().nodes())
    CHECK(n->output()->type().layout == ir::Layout::kPlain);
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
  runtime::EagerExecutor eager(*g, testing::testDevice());
  checkClose(eager.run(ins), want);
  TempCache cache;
  compiler::CompileOptions ko;
  ko.cacheDir = cache.path;
  REQUIRE(compiler::useDeviceKernels(eager, testing::testDevice(), ko).isOk());
  runtime::gpu::DeviceApi& dev = *runtime::gpu::gpuDevice(*testing::testDevice());
  const auto before = runtime::gpu::emuCounters(dev);
  checkClose(eager.run(ins), want);
  if (before.hasValue()) {  // On emu: nothing ran on the host, every op was a device kernel.
    const auto after = runtime::gpu::emuCounters(dev);
    CHECK(after->hostFunctions == before->hostFunctions);
    CHECK(after->kernelLaunches + after->libraryCalls >
          before->kernelLaunches + before->libraryCalls);
  }
}

TEST_CASE("emu: --precision bf16|fp16 autocasts every zoo model, compiled and eager") {
  // Products in bf16/f16 (f32 accumulation, the result rounded once), the ops after them as
  // PyTorch runs them. Against the CPU's eager run of the same autocast graph (its library
  // products converted, its other ops the reference kernels; the rounding points are the same,
  // so differences are single-ulp flips carried through the network) and, loosely, against the
  // fp32 model (the precision the user gave up).
  const std::string name = GENERATE(from_range(zooModelNames()));
  const compiler::Precision precision =
      GENERATE(compiler::Precision::kBf16, compiler::Precision::kFp16);
  const bool bf16 = precision == compiler::Precision::kBf16;
  INFO(name << " " << compiler::precisionName(precision));
  auto g = models::buildModel(name, {2, 5});
  REQUIRE(g.hasValue());
  const std::vector<Tensor> ins = testing::randomInputs(*g, 9);
  auto autocast = compiler::withPrecision(*g, precision);
  REQUIRE(autocast.hasValue());
  int products = 0, lowProducts = 0;
  for (const ir::Node* n : autocast->nodes()) {
    products += n->info().has(ir::kAutocast);
    lowProducts += n->info().has(ir::kAutocast) &&
                   n->output()->type().dtype == compiler::autocastDType(precision);
  }
  CHECK(lowProducts == products);
  const std::vector<Tensor> want = cpuEager(*autocast, ins);
  TempCache cache;
  compiler::CompileOptions o;
  o.cacheDir = cache.path;
  o.backend = testing::testDevice();
  o.precision = precision;
  o.cudaCheck = true;  // The f16/bf16 kernels compile with NVRTC for sm_80 and sm_90.
  auto cm = compiler::compile(*g, o);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  CHECK((*cm)->report().hostSteps == 0);
  CHECK((*cm)->report().cudaErrors.empty());
  CHECK((*cm)->report().cudaKernelsChecked == (*cm)->report().compiledKernels);
  CHECK((*cm)->report().precision == compiler::precisionName(precision));
  if (products > 0) {  // Inference weights are stored in the low precision.
    int lowWeights = 0;
    for (const ir::Value* p : (*cm)->optimizedGraph().parameters())
      lowWeights += p->type().dtype == compiler::autocastDType(precision);
    CHECK(lowWeights > 0);
  }
  // On tensor cores convolutions run channels-last, their filters KRSC constants (folded).
  for (const ir::Node* n : (*cm)->optimizedGraph().nodes())
    if (n->op() == ir::OpKind::kConv2d) {
      CHECK(n->output()->type().layout == ir::Layout::kNHWC);
      CHECK(n->input(1)->type().layout == ir::Layout::kNHWC);
      CHECK(n->input(1)->isParameter());
    }
  const double tol = bf16 ? 2e-2 : 2e-3;
  checkClose((*cm)->run(ins), want, tol);
  checkClose((*cm)->run(ins), cpuEager(*g, ins), bf16 ? 6e-2 : 6e-3);
  // Eager under the same precision: one kernel or library call per op on the device.
  runtime::EagerExecutor eager(*autocast, testing::testDevice());
  compiler::CompileOptions ko;
  ko.cacheDir = cache.path;
  ko.precision = precision;
  REQUIRE(compiler::useDeviceKernels(eager, testing::testDevice(), ko).isOk());
  checkClose(eager.run(ins), want, tol);
}

TEST_CASE("emu: eager keeps the weights on the device, and device runs are timed by events") {
  auto g = models::buildModel("mlp", {2, 5});
  REQUIRE(g.hasValue());
  const std::vector<Tensor> ins = testing::randomInputs(*g, 4);
  runtime::EagerExecutor eager(*g, testing::testDevice());
  // Counted by the backend's allocator (its cache may serve them without a device malloc).
  const int64_t bytesBefore = testing::testDevice()->memoryStats().bytesInUse;
  const auto first = eager.run(ins);
  checkClose(first, cpuEager(*g, ins));
  // The weights stay on the device between runs (a model moved to a GPU), like a plan's.
  CHECK(testing::testDevice()->memoryStats().bytesInUse - bytesBefore >= g->parameterBytes());
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

namespace {

// One random batch (inputs in [-1, 1], class targets < 10) through every step: their losses.
// One training step of model `name` per options, each from the same initial weights.
std::vector<std::unique_ptr<compiler::TrainingStep>> makeSteps(
    const std::string& name, const models::ModelOptions& mo,
    std::initializer_list<const compiler::TrainOptions*> options) {
  std::vector<std::unique_ptr<compiler::TrainingStep>> steps;
  for (const compiler::TrainOptions* o : options) {
    auto model = models::buildModel(name, mo);
    REQUIRE(model.hasValue());
    auto s = compiler::TrainingStep::create(std::move(model).value(), *o);
    INFO(s.status().message());
    REQUIRE(s.hasValue());
    steps.push_back(std::move(*s));
  }
  return steps;
}

std::vector<double> stepAll(std::vector<std::unique_ptr<compiler::TrainingStep>>& steps,
                            std::mt19937& rng) {
  Tensor x = *Tensor::empty(ir::DType::kF32, steps[0]->graph().inputs()[0]->type().shape);
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
  return losses;
}

}  // namespace

TEST_CASE("emu: a compiled training step on the emu device matches the CPU's") {
  // Every trainable zoo model (bert_layer has no classifier head).
  const std::string name = GENERATE(as<std::string>{}, "mlp", "mnist_cnn", "resnet18", "resnet50");
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
  onEmu.compile.backend = testing::testDevice();
  // resnet50's step is far less well-conditioned: at batch 4 and 64x64 its layer4 BatchNorms
  // see 16 values per channel, and its first-step gradients move by up to 3% (max over a
  // tensor) when the input is scaled by 1 + 1e-6 on the CPU alone; a second step at slightly
  // different weights diverges further (measured: 59% L2). So resnet50 takes one step, and its
  // updates are compared in L2 (measured: at most 1.3% apart; a wrong gradient is O(1)).
  // resnet18's two steps are compared in L2 too: on a real GPU (KILN_TEST_DEVICE=cuda) cuDNN's
  // algorithms sum in other orders than the CPU's, and after the second step the largest
  // difference in layer1.1.conv1.weight was 1.07% of its largest update (H100, cuDNN 9). On an
  // H200 (another cuDNN 9 from the machine's Python packages, the same bits run to run) the
  // second step's loss was 1.9e-4 apart (relative) and the updates up to 7.6% apart in L2
  // (layer1.1.bn1.weight), so after the first step the resnets are held to 1e-3 and 10%.
  const bool chaotic = name == "resnet50";
  const bool l2 = name.starts_with("resnet");
  const models::ModelOptions mo{
      .batch = 4, .seed = 7, .imageSize = name.starts_with("resnet") ? 64 : 0};
  auto steps = makeSteps(name, mo, {&cpu, &onEmu});
  std::mt19937 rng(3);
  for (int step = 0; step < (chaotic ? 1 : 2); ++step) {
    const std::vector<double> losses = stepAll(steps, rng);
    INFO("losses " << losses[0] << " " << losses[1]);
    const double tolerance = step > 0 && l2 ? 1e-3 : 1e-4;
    CHECK(std::fabs(losses[1] - losses[0]) <= tolerance * std::max(1.0, std::fabs(losses[0])));
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
    double diff = 0, moved = 0, diff2 = 0, moved2 = 0;
    for (int64_t k = 0; k < p0[i]->data().numElements(); ++k) {
      const double d = static_cast<double>(a[k]) - c[k], m = static_cast<double>(a[k]) - w[k];
      diff = std::max(diff, std::fabs(d));
      moved = std::max(moved, std::fabs(m));
      diff2 += d * d;
      moved2 += m * m;
    }
    CHECK(moved > 0);
    if (l2)
      CHECK(std::sqrt(diff2) <= 1e-1 * std::sqrt(moved2) + 1e-6);
    else
      CHECK(diff <= 1e-2 * moved + 1e-6);
  }
}

TEST_CASE("emu: a bf16 training step computes as its eager run, near fp32; fp16 scales its loss") {
  // Autocast applies to the whole step (forward and backward products, conv gradients included);
  // the optimizer updates f32 master weights. The compiled step and the eager one run the same
  // autocast graph, so they agree up to bf16 flips; fp32 is the precision given up.
  const std::string name = GENERATE(as<std::string>{}, "mlp", "mnist_cnn");
  INFO(name);
  TempCache cache;
  compiler::TrainOptions base;
  base.compile.cacheDir = cache.path;
  base.compile.backend = testing::testDevice();
  compiler::TrainOptions compiled = base, eager = base, fp32 = base;
  compiled.compile.precision = eager.compile.precision = compiler::Precision::kBf16;
  eager.eager = true;
  const models::ModelOptions mo{.batch = 4, .seed = 7};
  auto steps = makeSteps(name, mo, {&compiled, &eager, &fp32});
  int lowProducts = 0;  // The step's products, gradients included, are bf16.
  for (const ir::Node* n : steps[0]->compiled()->optimizedGraph().nodes())
    lowProducts += n->info().has(ir::kAutocast) && n->output()->type().dtype == ir::DType::kBF16;
  CHECK(lowProducts >= 3);
  std::mt19937 rng(3);
  for (int step = 0; step < 2; ++step) {
    const std::vector<double> losses = stepAll(steps, rng);
    INFO("losses: compiled bf16 " << losses[0] << ", eager bf16 " << losses[1] << ", fp32 "
                                  << losses[2]);
    CHECK(std::fabs(losses[0] - losses[1]) <= 2e-3 * std::max(1.0, std::fabs(losses[1])));
    CHECK(std::fabs(losses[0] - losses[2]) <= 2e-2 * std::max(1.0, std::fabs(losses[2])));
  }
  // The master weights stay f32.
  for (const ir::Value* p : steps[0]->graph().parameters())
    if (p->trainable()) CHECK(p->data().dtype() == ir::DType::kF32);

  // fp16 trains with dynamic loss scaling (compiler/train.h): its steps give fp32's loss,
  // within fp16's rounding, whether or not the first ones are skipped for overflow.
  compiler::TrainOptions fp16 = base;
  fp16.compile.precision = compiler::Precision::kFp16;
  auto halfSteps = makeSteps(name, mo, {&fp16, &fp32});
  CHECK(halfSteps[0]->lossScale() == 65536);
  const std::vector<double> losses = stepAll(halfSteps, rng);
  CHECK(std::fabs(losses[0] - losses[1]) <= 2e-2 * std::max(1.0, std::fabs(losses[1])));
}

// Contiguous slices of intermediates are views at an offset into the device's arena: each step
// of an unrolled h' = sqrt(abs(h R + p[t])) adds row t of p in place, read through the device's
// bound-checked pointers, and the steps' kernels share one function.
TEST_CASE("emu: slices read in place at an offset into the arena, by shared kernels") {
  std::string ir = R"(graph g(%x : f32[3,4,8], %h0 : f32[4,8]) {
  param %w : f32[8,8]
  param %r : f32[8,8]
  %xw : f32[3,4,8] = matmul(%x, %w)
  %p : f32[3,4,8] = abs(%xw)
)";
  for (int t = 0; t < 3; ++t) {
    const std::string s = std::to_string(t), n = std::to_string(t + 1);
    ir += "  %s" + s + " : f32[1,4,8] = slice(%p) {starts=[" + s + "], ends=[" + n +
          "], axes=[0]}\n  %x" + s + " : f32[4,8] = reshape(%s" + s + ") {shape=[4,8]}\n  %m" + s +
          " : f32[4,8] = matmul(%h" + s + ", %r)\n  %a" + s + " : f32[4,8] = add(%m" + s + ", %x" +
          s + ")\n  %b" + s + " : f32[4,8] = abs(%a" + s + ")\n  %h" + n + " : f32[4,8] = sqrt(%b" +
          s + ")\n";
  }
  ir += "  return %h3\n}";
  auto g = ir::parseGraph(ir);
  INFO(g.status().message());
  REQUIRE(g.hasValue());
  testing::randomParameters(*g, 9, 0.5f);
  const std::vector<Tensor> ins = testing::randomInputs(*g, 5);
  auto cm = compileForDevice(*g);
  CHECK(cm->report().aliases >= 6);  // Three slices and their reshapes.
  CHECK(cm->report().compiledKernels < cm->report().generatedKernels);
  checkClose(cm->run(ins), cpuEager(*g, ins));
}

TEST_CASE("emu: the committed ONNX test models run on the emu device, matching the CPU") {
  for (const auto& entry :
       std::filesystem::directory_iterator(std::string(KILN_TEST_DATA_DIR) + "/onnx")) {
    if (entry.path().extension() != ".onnx") continue;
    INFO(entry.path().string());
    frontends::OnnxImportOptions options;
    options.defaultBatch = 2;  // Symbolic first dims.
    auto g = frontends::loadOnnx(entry.path().string(), options);
    INFO(g.status().message());
    if (!g && frontends::needsStages(g.status())) {
      // A model in stages (masked_select.onnx): each stage compiled for the device, and eager
      // there, against the CPU's eager stages; inputs of both signs.
      auto staged = frontends::onnxStages(entry.path().string(), options);
      REQUIRE(staged.hasValue());
      std::vector<Tensor> ins;
      for (const ir::TensorType& t : staged->inputTypes) {
        REQUIRE(t.dtype == ir::DType::kF32);
        auto x = Tensor::empty(t.dtype, t.shape);
        REQUIRE(x.hasValue());
        for (int64_t i = 0; i < x->numElements(); ++i)
          x->data<float>()[i] = static_cast<float>(i % 5) * 0.5f - 1.0f;
        ins.push_back(*x);
      }
      compiler::StagedModule cpu(*staged, {}, true);
      auto want = cpu(ins);
      REQUIRE(want.hasValue());
      compiler::CompileOptions co;
      co.backend = testing::testDevice();
      compiler::StagedModule compiled(*staged, co, false), eager(*staged, co, true);
      checkClose(compiled(ins), *want);
      checkClose(eager(ins), *want);
      continue;
    }
    REQUIRE(g.hasValue());
    const std::vector<Tensor> ins = testing::randomInputs(*g, 4);
    const std::vector<Tensor> want = cpuEager(*g, ins);
    checkClose(compileForDevice(*g)->run(ins), want);
    runtime::EagerExecutor eager(*g, testing::testDevice());
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
    {"bf16 storage", R"(graph g(%x : bf16[{R},{C}], %y : f32[{R},{C}]) {
  %xf : f32[{R},{C}] = cast(%x) {to="f32"}
  %a : f32[{R},{C}] = mul(%xf, %y)
  %h : bf16[{R},{C}] = cast(%a) {to="bf16"}
  %g : bf16[{R},{C}] = gelu(%h)
  %o : f32[{R},{C}] = cast(%g) {to="f32"}
  return %h, %o
})"},
    {"f16 storage", R"(graph g(%x : f16[{R},{C}], %k : f16[{R},{C}]) {
  %a : f16[{R},{C}] = mul(%x, %k)
  %p : f16[{R},{C}] = softmax(%a) {axis=1}
  %s : f16[{R},1] = reduce_sum(%x) {axes=[1]}
  return %p, %s
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

TEST_CASE(
    "half conversions: generated kernels round f32 to f16/bf16 bit for bit as the reference") {
  // Every f16 bit pattern widened, and f32 values at the edges of both formats: signed zeros,
  // f32 subnormals, f16 subnormals and their halfway points, the f16 overflow boundary (65504,
  // 65520), infinities, NaN, bf16 ties, and random values over the whole exponent range.
  std::vector<float> xs;
  for (uint32_t h = 0; h < 65536; ++h)
    xs.push_back(static_cast<float>(runtime::ref::f16BitsToDouble(static_cast<uint16_t>(h))));
  for (float v : {0.0f,
                  -0.0f,
                  1e-45f,
                  -1e-40f,
                  0x1p-24f,
                  0x1p-25f,
                  0x1.8p-25f,
                  0x1.8p-24f,
                  0x1.ffcp-15f,
                  0x1p-14f,
                  65504.0f,
                  65519.99f,
                  65520.0f,
                  -65520.0f,
                  1e30f,
                  1.0f + 0x1p-8f,
                  1.0f + 0x1p-8f + 0x1p-23f,
                  1.0f + 0x3p-8f,
                  3.4e38f,
                  std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()})
    xs.push_back(v);
  std::mt19937 rng(5);
  for (int i = 0; i < 20000; ++i) {
    const uint32_t bits = rng();
    xs.push_back(std::bit_cast<float>(bits));
  }
  const int64_t n = static_cast<int64_t>(xs.size());
  const std::string N = std::to_string(n);
  auto g = ir::parseGraph("graph g(%x : f32[" + N + "]) {\n  %b : bf16[" + N +
                          "] = cast(%x) {to=\"bf16\"}\n  %h : f16[" + N +
                          "] = cast(%x) {to=\"f16\"}\n  return %b, %h\n}");
  REQUIRE(g.hasValue());
  auto x = Tensor::empty(ir::DType::kF32, {n});
  REQUIRE(x.hasValue());
  std::copy(xs.begin(), xs.end(), x->data<float>());
  const std::vector<Tensor> ins{*x};
  const std::vector<Tensor> want = cpuEager(*g, ins);
  std::vector<std::unique_ptr<compiler::CompiledModel>> models;
  models.push_back(compileForDevice(*g));
  compiler::CompileOptions cpu;
  auto onCpu = compiler::compile(*g, cpu);
  REQUIRE(onCpu.hasValue());
  models.push_back(std::move(*onCpu));
  for (const auto& cm : models) {
    INFO((cm->plan().backend ? cm->plan().backend->name() : "cpu"));
    for (const runtime::PlanStep& st : cm->plan().steps)  // No reference step: kernels only.
      REQUIRE(st.kind == runtime::PlanStep::Kind::kKernel);
    auto got = cm->run(ins);
    REQUIRE(got.hasValue());
    for (size_t o = 0; o < 2; ++o) {
      const uint16_t* a = (*got)[o].data<uint16_t>();
      const uint16_t* b = want[o].data<uint16_t>();
      int64_t wrong = 0, first = -1;
      for (int64_t i = 0; i < n; ++i) {
        const bool nanA = std::isnan((*got)[o].elementAsDouble(i));
        const bool nanB = std::isnan(want[o].elementAsDouble(i));
        if (nanA != nanB || (!nanA && a[i] != b[i])) {
          if (first < 0) first = i;
          ++wrong;
        }
      }
      INFO("output " << o << ": " << wrong << " differ, first x = " << (first < 0 ? 0.f : xs[first])
                     << " got " << (first < 0 ? 0 : a[first]) << " want "
                     << (first < 0 ? 0 : b[first]));
      CHECK(wrong == 0);
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

TEST_CASE("emu: a run on device tensors reads them after the stream that wrote them") {
  // runOnDevice (DLPack's CUDA tensors from Python): inputs read where they lie in device
  // memory, after the work their producer's stream had enqueued (here NaNs overwritten by the
  // input, behind a 300 ms host function), outputs left in device buffers of the caller's; with
  // and without CUDA graphs, the same values as a host run.
  auto g = models::buildModel("mnist_cnn", {2, 5});
  REQUIRE(g.hasValue());
  const std::vector<Tensor> ins = testing::randomInputs(*g, 12);
  const auto cm = compileForDevice(*g);
  auto want = cm->run(ins);
  REQUIRE(want.hasValue());
  std::shared_ptr<runtime::Backend> backend = testing::testDevice();
  runtime::gpu::DeviceApi& dev = *runtime::gpu::gpuDevice(*backend);
  auto devPtr = [](const runtime::DeviceBuffer& b) {
    return reinterpret_cast<runtime::gpu::DevicePtr>(b.address().handle);
  };
  auto producer = dev.createStream();
  REQUIRE(producer.hasValue());
  const Tensor& x = ins[0];
  Tensor nans = *Tensor::empty(x.dtype(), x.shape());
  for (int64_t i = 0; i < nans.numElements(); ++i)
    nans.data<float>()[i] = std::numeric_limits<float>::quiet_NaN();
  for (const bool graphs : {true, true, false}) {  // Captured, replayed, enqueued step by step.
    INFO("graphs " << graphs);
    cm->setGraphs(graphs);
    auto buf = backend->allocate(x.byteSize());
    REQUIRE(buf.hasValue());
    REQUIRE(dev.copyToDevice(devPtr(*buf), nans.rawData(), x.byteSize(), *producer).isOk());
    REQUIRE(dev.synchronize(*producer).isOk());
    REQUIRE(dev.launchHostFunc(
                   *producer,
                   [](void*) { std::this_thread::sleep_for(std::chrono::milliseconds(300)); },
                   nullptr)
                .isOk());
    REQUIRE(dev.copyToDevice(devPtr(*buf), x.rawData(), x.byteSize(), *producer).isOk());
    const runtime::DeviceTensor in{buf->address(), x.type()};
    auto outs = cm->runOnDevice(std::span(&in, 1), reinterpret_cast<uintptr_t>(*producer));
    INFO(outs.status().message());
    REQUIRE(outs.hasValue());
    REQUIRE(outs->size() == want->size());
    std::vector<Tensor> got;
    for (size_t i = 0; i < outs->size(); ++i) {
      Tensor t = *Tensor::empty((*want)[i].dtype(), (*want)[i].shape());
      REQUIRE(dev.copyToHost(t.rawData(), devPtr((*outs)[i]), t.byteSize(), *producer).isOk());
      got.push_back(std::move(t));
    }
    REQUIRE(dev.synchronize(*producer).isOk());
    checkClose(Expected<std::vector<Tensor>>(std::move(got)), *want, 0);
  }
  dev.destroyStream(*producer);

  // A device input of the wrong shape: the error names it, as a host run's.
  auto small = backend->allocate(64);
  REQUIRE(small.hasValue());
  const runtime::DeviceTensor bad{small->address(), {ir::DType::kF32, ir::Shape{4, 4}}};
  auto refused = cm->runOnDevice(std::span(&bad, 1));
  REQUIRE_FALSE(refused.hasValue());
  CHECK(refused.status().isUserError());
  CHECK_THAT(refused.status().message(), Catch::Contains("expected f32[2,1,28,28], got f32[4,4]"));
}

TEST_CASE("emu: host ops take pooled pinned buffers after their first run") {
  // An op without a device kernel (a product reduction) runs on the host, each operand copied
  // through a pinned buffer. Those come from the backend's pool: later runs allocate none (on a
  // GPU each allocation pins pages and each free unpins them).
  auto backend = runtime::gpu::backendForDevice("emu");
  REQUIRE(backend.hasValue());
  const runtime::gpu::DeviceApi& device = *runtime::gpu::gpuDevice(**backend);
  ir::Graph g("prod");
  ir::Value* x = *g.addInput("x", ir::TensorType(ir::DType::kF32, {64, 32}));
  ir::Value* y = *g.addInput("y", ir::TensorType(ir::DType::kF32, {64, 32}));
  ir::Value* sum = (*g.addNode(ir::OpKind::kAdd, {x, y}))->output();
  g.setOutputs({(*g.addNode(ir::OpKind::kReduceProd, {sum},
                            {{"axes", std::vector<int64_t>{1}}, {"keepdims", int64_t{0}}}))
                    ->output()});
  compiler::CompileOptions o;
  o.backend = *backend;
  auto cm = compiler::compile(g, o);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  REQUIRE((*cm)->report().hostSteps == 1);
  const std::vector<Tensor> ins = testing::randomInputs(g, 3);
  std::vector<runtime::gpu::EmuCounters> after;
  for (int s = 0; s < 3; ++s) {
    auto r = (*cm)->run(ins);
    INFO(r.status().message());
    REQUIRE(r.hasValue());
    after.push_back(*runtime::gpu::emuCounters(device));
  }
  CHECK(after[2].hostFunctions > after[1].hostFunctions);  // The product ran on the host.
  CHECK(after[2].hostAllocations == after[0].hostAllocations);
}
