// The compiler end to end: compiled == eager on every zoo model, kernel counts, the memory
// plan's bound, the kernel cache, and NVRTC acceptance of every generated kernel.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "compiler/artifact.h"
#include "compiler/compile.h"
#include "compiler/jit.h"
#include "frontends/onnx/onnx_import.h"
#include "frontends/onnx_model_builder.h"
#include "ir/parser.h"
#include "models/zoo.h"
#include "passes/autodiff.h"
#include "random_inputs.h"
#include "runtime/artifact.h"
#include "runtime/eager.h"

using namespace kiln;
using runtime::Tensor;

namespace {

std::string tempCacheDir(const std::string& tag) {
  auto d = std::filesystem::temp_directory_path() /
           ("kiln_test_cache_" + tag + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d.string();
}

Tensor randomTensor(const ir::TensorType& t, std::mt19937& rng) {
  Tensor x = *Tensor::empty(t.dtype, t.shape);
  std::uniform_real_distribution<double> dist(-2.0, 2.0);
  for (int64_t i = 0; i < x.numElements(); ++i) {
    if (t.dtype == ir::DType::kF32)
      x.data<float>()[i] = static_cast<float>(dist(rng));
    else if (t.dtype == ir::DType::kF64)
      x.data<double>()[i] = dist(rng);
    else if (t.dtype == ir::DType::kBool)
      x.data<uint8_t>()[i] = dist(rng) > 0;
    else if (t.dtype == ir::DType::kI64)  // Small indices: valid class labels.
      x.data<int64_t>()[i] = static_cast<int64_t>(rng() % 2);
  }
  return x;
}

double at(const Tensor& t, int64_t i) {
  return t.dtype() == ir::DType::kF64 ? t.data<double>()[i] : t.data<float>()[i];
}

// max |a - b| / max |b|, with NaN and inf required to agree exactly.
double relError(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  double maxRef = 0, maxDiff = 0;
  for (int64_t i = 0; i < b.numElements(); ++i) {
    const double x = at(a, i), y = at(b, i);
    if (std::isnan(y) || std::isinf(y)) {
      if (!(std::isnan(x) && std::isnan(y)) && x != y) return INFINITY;
      continue;
    }
    if (!std::isfinite(x)) return INFINITY;  // std::max below would drop a NaN.
    maxRef = std::max(maxRef, std::fabs(y));
    maxDiff = std::max(maxDiff, std::fabs(x - y));
  }
  return maxDiff / std::max(maxRef, 1e-30);
}

compiler::CompileOptions testOptions(const std::string& cache) {
  compiler::CompileOptions o;
  o.cacheDir = cache;
  o.verifyEachPass = true;
  return o;
}

// Compiles `g`, checks it against eager on seeded inputs, and returns the compiled model.
std::unique_ptr<compiler::CompiledModel> checkCompiledMatchesEager(
    const ir::Graph& g, const compiler::CompileOptions& opts, double tol, uint32_t seed) {
  auto cm = compiler::compile(g, opts);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  std::mt19937 rng(seed);
  std::vector<Tensor> ins;
  for (const ir::Value* v : g.inputs()) ins.push_back(randomTensor(v->type(), rng));
  runtime::EagerExecutor eager(g);
  auto want = eager.run(ins);
  INFO(want.status().message());
  REQUIRE(want.hasValue());
  // compile() prepared every library call: the first run reorders no weights of its own.
  const size_t prepared = (*cm)->reorderedWeightBytes();
  auto got = (*cm)->run(ins);
  INFO(got.status().message());
  REQUIRE(got.hasValue());
  CHECK((*cm)->reorderedWeightBytes() == prepared);
  REQUIRE(got->size() == want->size());
  for (size_t i = 0; i < got->size(); ++i) {
    INFO("output " << i << "\n" << (*cm)->report().fusionExplanation);
    CHECK(relError((*got)[i], (*want)[i]) <= tol);
  }
  const auto& r = (*cm)->report();
  CHECK(r.arenaBytes <= static_cast<int64_t>(1.15 * static_cast<double>(r.arenaLowerBound)) + 64);
  return std::move(*cm);
}

// `cm` saved to `path` and loaded computes `g`'s outputs bit for bit as `cm` does.
void checkArtifactComputesTheSame(compiler::CompiledModel& cm, const ir::Graph& g,
                                  const std::string& path) {
  REQUIRE(compiler::saveArtifact(cm, path, g.name()).isOk());
  auto loaded = runtime::loadArtifact(path);
  INFO(loaded.status().message());
  REQUIRE(loaded.hasValue());
  const std::vector<Tensor> ins = testing::randomInputs(g, 11);
  auto want = cm.run(ins);
  auto got = (*loaded)->run(ins);
  REQUIRE(want.hasValue());
  REQUIRE(got.hasValue());
  REQUIRE(got->size() == want->size());
  for (size_t i = 0; i < want->size(); ++i)
    CHECK(std::memcmp((*want)[i].rawData(), (*got)[i].rawData(), (*want)[i].byteSize()) == 0);
}

}  // namespace

TEST_CASE("compiled == eager on every zoo model") {
  const std::string cache = tempCacheDir("zoo");
  for (const std::string name : {"mlp", "mnist_cnn", "resnet18", "resnet50", "bert_layer"}) {
    DYNAMIC_SECTION(name) {
      auto g = models::buildModel(name, {name == "resnet50" ? 1 : 2, 11});
      REQUIRE(g.hasValue());
      checkCompiledMatchesEager(*g, testOptions(cache), 1e-4, 3);
    }
  }
  std::filesystem::remove_all(cache);
}

TEST_CASE("a chain of 10 pointwise ops is one kernel") {
  auto g = ir::parseGraph(R"(
graph chain(%x : f32[3,1000]) {
  param %b : f32[1000] buffer
  %1 : f32[3,1000] = relu(%x)
  %2 : f32[3,1000] = add(%1, %b)
  %3 : f32[3,1000] = sigmoid(%2)
  %4 : f32[3,1000] = mul(%3, %x)
  %5 : f32[3,1000] = tanh(%4)
  %6 : f32[3,1000] = exp(%5)
  %7 : f32[3,1000] = neg(%6)
  %8 : f32[3,1000] = abs(%7)
  %9 : f32[3,1000] = sqrt(%8)
  %10 : f32[3,1000] = gelu(%9) {approximate="tanh"}
  return %10
})");
  REQUIRE(g.hasValue());
  ir::TensorData b(ir::DType::kF32, {1000});
  for (int i = 0; i < 1000; ++i) b.as<float>()[i] = 0.001f * static_cast<float>(i);
  g->findValue("b")->setData(b);
  const std::string cache = tempCacheDir("chain");
  auto cm = compiler::compile(*g, testOptions(cache));
  REQUIRE(cm.hasValue());
  CHECK((*cm)->report().generatedKernels == 1);
  CHECK((*cm)->plan().steps.size() == 1);
  checkCompiledMatchesEager(*g, testOptions(cache), 1e-5, 1);
  std::filesystem::remove_all(cache);
}

// Kernels that differ only in their names (a repeated layer, an unrolled recurrence) share one
// compiled function: each step calls it on its own buffers, and an artifact keeps one copy.
TEST_CASE("kernels equal but for their names are compiled once and called by every step") {
  // sqrt(abs(.)) before and after a matmul (neither op is a library post-op): two kernels on
  // f32[16,64], equal but for their names, and a third on f32[16,32], which differs.
  auto g = ir::parseGraph(R"(graph g(%x : f32[16,64]) {
  param %w : f32[64,64]
  param %v : f32[64,32]
  %1 : f32[16,64] = abs(%x)
  %2 : f32[16,64] = sqrt(%1)
  %3 : f32[16,64] = matmul(%2, %w)
  %4 : f32[16,64] = abs(%3)
  %5 : f32[16,64] = sqrt(%4)
  %6 : f32[16,32] = matmul(%5, %v)
  %7 : f32[16,32] = abs(%6)
  %8 : f32[16,32] = sqrt(%7)
  return %8
})");
  REQUIRE(g.hasValue());
  testing::randomParameters(*g, 3);
  const std::string cache = tempCacheDir("shared");
  auto cm = checkCompiledMatchesEager(*g, testOptions(cache), 1e-5, 4);
  const compiler::CompileReport& r = cm->report();
  CHECK(r.generatedKernels == 3);
  CHECK(r.compiledKernels == 2);
  REQUIRE(r.kernels.size() == 2);
  CHECK(r.kernels[0].steps == 2);
  CHECK(r.kernels[1].steps == 1);
  std::vector<const runtime::PlanStep*> kernelSteps;
  for (const runtime::PlanStep& s : cm->plan().steps)
    if (s.kind == runtime::PlanStep::Kind::kKernel) kernelSteps.push_back(&s);
  REQUIRE(kernelSteps.size() == 3);
  CHECK(kernelSteps[0]->name == kernelSteps[1]->name);
  CHECK(kernelSteps[0]->kernel == kernelSteps[1]->kernel);
  CHECK(kernelSteps[0]->kernel != kernelSteps[2]->kernel);
  CHECK(kernelSteps[0]->outputs[0].offset != kernelSteps[1]->outputs[0].offset);
  // Saved and loaded: the steps find their shared function by name.
  checkArtifactComputesTheSame(*cm, *g, cache + "/shared.kiln");
  std::filesystem::remove_all(cache);
}

// A slice that is one contiguous run of an intermediate's bytes (a step of an unrolled
// recurrence) is a view at an offset into them, not a copy; one of a graph input, one that is not
// contiguous, and one whose offset would break 16-byte alignment stay copies.
TEST_CASE("contiguous slices of intermediates are views at an offset, others copies") {
  auto g = ir::parseGraph(R"(graph g(%x : f32[6,4,8], %y : f32[5,3]) {
  param %w : f32[8,8]
  param %v : f32[3,2]
  %1 : f32[6,4,8] = relu(%x)
  %2 : f32[1,4,8] = slice(%1) {starts=[2], ends=[3], axes=[0]}
  %3 : f32[4,8] = reshape(%2) {shape=[4,8]}
  %4 : f32[4,8] = matmul(%3, %w)
  %5 : f32[6,4,1] = slice(%1) {starts=[1], ends=[2], axes=[2]}
  %6 : f32[6,4,1] = exp(%5)
  %7 : f32[1,4,8] = slice(%x) {starts=[3], ends=[4], axes=[0]}
  %8 : f32[4,8] = reshape(%7) {shape=[4,8]}
  %9 : f32[4,8] = matmul(%8, %w)
  %10 : f32[5,3] = relu(%y)
  %11 : f32[1,3] = slice(%10) {starts=[1], ends=[2], axes=[0]}
  %12 : f32[1,2] = matmul(%11, %v)
  return %4, %6, %9, %12
})");
  INFO(g.status().message());
  REQUIRE(g.hasValue());
  testing::randomParameters(*g, 3);
  const std::string cache = tempCacheDir("slices");
  auto cm = checkCompiledMatchesEager(*g, testOptions(cache), 1e-5, 6);
  // The first step whose name holds `name`.
  const runtime::Plan& plan = cm->plan();
  auto step = [&](const std::string& name) -> const runtime::PlanStep& {
    for (const runtime::PlanStep& s : plan.steps)
      if (s.name.find(name) != std::string::npos) return s;
    FAIL("no step " << name);
    return plan.steps[0];
  };
  const runtime::PlanStep& relu = plan.steps[0];
  REQUIRE(relu.kind == runtime::PlanStep::Kind::kKernel);
  const runtime::BufferRef& viewed = step("matmul -> %4").inputs[0];
  CHECK(viewed.kind == runtime::BufferRef::Kind::kArena);
  CHECK(viewed.offset == relu.outputs[0].offset + 2 * 4 * 8 * 4);  // Row 2 of f32[6,4,8].
  CHECK(viewed.type == ir::TensorType(ir::DType::kF32, {4, 8}));
  // A graph input's slice is copied into the arena; so is row 1 of f32[5,3], 12 bytes in.
  CHECK(step("matmul -> %9").inputs[0].kind == runtime::BufferRef::Kind::kArena);
  const runtime::BufferRef& copied = step("matmul -> %12").inputs[0];
  for (const runtime::PlanStep& s : plan.steps)
    if (s.kind == runtime::PlanStep::Kind::kKernel && s.outputs[0].type.shape == ir::Shape{5, 3})
      CHECK(copied.offset != s.outputs[0].offset + 12);
  CHECK(cm->report().copySteps == 0);
  // Saved and loaded: the offsets come back with the plan.
  checkArtifactComputesTheSame(*cm, *g, cache + "/slices.kiln");
  std::filesystem::remove_all(cache);
}

TEST_CASE("softmax, log_softmax and layer_norm are one kernel each") {
  const std::string cache = tempCacheDir("norm");
  for (const std::string op :
       {"softmax(%x) {axis=1}", "log_softmax(%x) {axis=0}", "layer_norm(%x, %s, %b) {axis=1}"}) {
    DYNAMIC_SECTION(op) {
      auto g = ir::parseGraph(
          "graph g(%x : f32[7,33]) {\n param %s : f32[33]\n param %b : f32[33]\n"
          " %y : f32[7,33] = " +
          op + "\n return %y\n}");
      REQUIRE(g.hasValue());
      std::mt19937 rng(5);
      for (const char* p : {"s", "b"}) {
        ir::TensorData d(ir::DType::kF32, {33});
        for (int i = 0; i < 33; ++i) d.as<float>()[i] = static_cast<float>(rng() % 100) / 50.f;
        g->findValue(p)->setData(d);
      }
      g->removeUnusedParameters();
      auto cm = compiler::compile(*g, testOptions(cache));
      REQUIRE(cm.hasValue());
      CHECK((*cm)->report().generatedKernels == 1);
      CHECK((*cm)->plan().steps.size() == 1);
      checkCompiledMatchesEager(*g, testOptions(cache), 1e-5, 2);
    }
  }
  std::filesystem::remove_all(cache);
}

// Squeeze-excite's SiLU and mean over channels-last pixels: a column-wise reduction split in
// chunks of rows (codegen::cpuRowSplit), each thread reading whole rows, the partial sums
// combined in chunk order: the same bits with 1, 2 and 3 threads, and eager's values.
TEST_CASE("a column-wise reduction split in chunks of rows: the same bits on any thread count") {
  auto g = ir::parseGraph(R"(graph g(%x : f32[3136,96]) {
  %s : f32[3136,96] = silu(%x)
  %m : f32[96] = reduce_mean(%s) {axes=[0], keepdims=0}
  return %s, %m
})");
  REQUIRE(g.hasValue());
  const std::string cache = tempCacheDir("rowsplit");
  std::vector<std::vector<Tensor>> results;
  std::mt19937 rng(3);
  const std::vector<Tensor> ins{randomTensor(g->inputs()[0]->type(), rng)};
  for (int threads : {1, 2, 3}) {
    compiler::CompileOptions o = testOptions(cache);
    o.runThreads = threads;
    auto cm = checkCompiledMatchesEager(*g, o, 1e-5, 3);
    REQUIRE((*cm).plan().steps.size() == 1);
    const runtime::PlanStep& step = (*cm).plan().steps[0];
    CHECK(step.units == 32);  // 32 chunks of 98 rows.
    CHECK(step.scratchBytes == 32 * 96 * 4);
    auto out = (*cm).run(ins);
    REQUIRE(out.hasValue());
    results.push_back(std::move(*out));
  }
  for (size_t t = 1; t < results.size(); ++t)
    for (size_t o = 0; o < 2; ++o)
      CHECK(std::memcmp(results[t][o].rawData(), results[0][o].rawData(),
                        results[0][o].byteSize()) == 0);
  // A maximum, or fewer than 128 rows, stays split by columns.
  for (const char* text : {R"(graph g(%x : f32[3136,96]) {
  %m : f32[96] = reduce_max(%x) {axes=[0], keepdims=0}
  return %m
})",
                           R"(graph g(%x : f32[100,96]) {
  %s : f32[100,96] = silu(%x)
  %m : f32[96] = reduce_mean(%s) {axes=[0], keepdims=0}
  return %s, %m
})"}) {
    auto small = ir::parseGraph(text);
    REQUIRE(small.hasValue());
    auto cm = checkCompiledMatchesEager(*small, testOptions(cache), 1e-5, 4);
    REQUIRE((*cm).plan().steps.size() == 1);
    CHECK((*cm).plan().steps[0].scratchBytes == 0);
    CHECK((*cm).plan().steps[0].units == 96);
  }
  std::filesystem::remove_all(cache);
}

TEST_CASE("bert_layer's non-matmul work is at most 8 kernels") {
  auto g = models::buildModel("bert_layer", {1, 0});
  REQUIRE(g.hasValue());
  const std::string cache = tempCacheDir("bert");
  auto cm = compiler::compile(*g, testOptions(cache));
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  INFO((*cm)->report().fusionExplanation);
  int nonMatmul = 0;
  for (const auto& s : (*cm)->plan().steps)
    if (s.kind != runtime::PlanStep::Kind::kOp ||
        (s.op != ir::OpKind::kMatMul && s.op != ir::OpKind::kLinear && s.op != ir::OpKind::kGemm))
      ++nonMatmul;
  CHECK(nonMatmul <= 8);
  std::filesystem::remove_all(cache);
}

TEST_CASE("a second compile hits the kernel cache; a corrupt entry is rebuilt") {
  auto g = models::buildModel("mnist_cnn", {1, 0});
  REQUIRE(g.hasValue());
  const std::string cache = tempCacheDir("hit");
  auto first = compiler::compile(*g, testOptions(cache));
  REQUIRE(first.hasValue());
  CHECK((*first)->report().cacheMisses > 0);
  CHECK((*first)->report().cacheHits == 0);
  auto second = compiler::compile(*g, testOptions(cache));
  REQUIRE(second.hasValue());
  CHECK((*second)->report().cacheMisses == 0);
  CHECK((*second)->report().cacheHits == (*first)->report().modules);
  // Flip a byte in every entry: each is detected, rebuilt, and the model still runs right.
  for (const auto& e : std::filesystem::recursive_directory_iterator(cache)) {
    if (!e.is_regular_file()) continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(std::filesystem::file_size(e.path()) - 3));
    f.put('\x5a');
  }
  auto third = compiler::compile(*g, testOptions(cache));
  REQUIRE(third.hasValue());
  CHECK((*third)->report().cacheHits == 0);
  CHECK((*third)->report().cacheExplanations.front().find("checksum") != std::string::npos);
  checkCompiledMatchesEager(*g, testOptions(cache), 1e-4, 9);
  std::filesystem::remove_all(cache);
}

TEST_CASE("every generated kernel of every zoo model compiles with NVRTC for sm_80 and sm_90") {
  const std::string cache = tempCacheDir("cuda");
  for (const std::string name : {"mlp", "mnist_cnn", "resnet18", "resnet50", "bert_layer"}) {
    DYNAMIC_SECTION(name) {
      auto g = models::buildModel(name, {1, 0});
      REQUIRE(g.hasValue());
      auto opts = testOptions(cache);
      opts.cudaCheck = true;
      auto cm = compiler::compile(*g, opts);
      REQUIRE(cm.hasValue());
      const auto& r = (*cm)->report();
      if (r.cudaKernelsChecked == 0 && r.generatedKernels > 0) {
        WARN("NVRTC unavailable: CUDA check skipped");
        continue;
      }
      for (const auto& e : r.cudaErrors) FAIL_CHECK(e);
      CHECK(r.cudaKernelsChecked == r.compiledKernels);
    }
  }
  std::filesystem::remove_all(cache);
}

TEST_CASE("jit compiles once per input signature, logs the failed guard, and stops at the limit") {
  auto g = models::buildModel("mlp", {2, 0});
  REQUIRE(g.hasValue());
  compiler::CompileOptions opts;
  opts.cacheDir = tempCacheDir("jit");
  compiler::JitModule m(*g, opts, /*recompileLimit=*/2);
  std::mt19937 rng(1);
  auto input = [&](int64_t batch) {
    return std::vector<Tensor>{randomTensor({ir::DType::kF32, {batch, 784}}, rng)};
  };
  auto a = input(2);
  REQUIRE(m(a).hasValue());
  REQUIRE(m(a).hasValue());
  CHECK(m.compiles() == 1);
  // A new batch size recompiles, and the result matches eager on the respecialized graph.
  auto b = input(5);
  auto yb = m(b);
  REQUIRE(yb.hasValue());
  CHECK((*yb)[0].shape() == ir::Shape{5, 10});
  CHECK(m.compiles() == 2);
  CHECK_THAT(m.log().back(),
             Catch::Contains("guard failed: input 'input' is f32[5,784], compiled for f32[2,784]"));
  auto spec = compiler::respecialize(*g, std::vector<ir::TensorType>{{ir::DType::kF32, {5, 784}}});
  REQUIRE(spec.hasValue());
  runtime::EagerExecutor eager(*spec);
  auto want = eager.run(b);
  REQUIRE(want.hasValue());
  CHECK(relError((*yb)[0], (*want)[0]) < 1e-5);
  // Back to the first signature: no compile.
  REQUIRE(m(a).hasValue());
  CHECK(m.compiles() == 2);
  REQUIRE(m(input(3)).hasValue());
  auto over = m(input(4));
  REQUIRE_FALSE(over.hasValue());
  CHECK_THAT(over.status().message(), Catch::Contains("recompile limit (2) reached"));
  // A dtype the graph cannot take is a clear error naming the node.
  auto bad = m(std::vector<Tensor>{*Tensor::zeros(ir::DType::kF64, {2, 784})});
  REQUIRE_FALSE(bad.hasValue());
  std::filesystem::remove_all(opts.cacheDir);
}

TEST_CASE("compiled resnet50: no standalone batch_norm or relu, at most 2 layout conversions") {
  auto g = models::buildModel("resnet50", {1, 0});
  REQUIRE(g.hasValue());
  const std::string cache = tempCacheDir("r50");
  auto cm = compiler::compile(*g, testOptions(cache));
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  const auto& r = (*cm)->report();
  INFO(r.fusionExplanation);
  CHECK(r.layoutConversions <= 2);
  int convs = 0, relayouts = 0;
  for (const auto& s : (*cm)->plan().steps) {
    if (s.kind != runtime::PlanStep::Kind::kOp) continue;
    CHECK(s.op != ir::OpKind::kBatchNorm);
    CHECK(s.op != ir::OpKind::kRelu);
    if (s.op == ir::OpKind::kConv2d) {
      ++convs;
      CHECK(s.library);
      CHECK(s.libraryOptions.channelsLast);
    }
    if (s.op == ir::OpKind::kRelayout) ++relayouts;
  }
  CHECK(convs == 53);
  // Every relu became a conv post-op or joined a generated kernel: none runs alone.
  for (const auto& k : r.kernels) CHECK(k.group != "library");
  std::filesystem::remove_all(cache);
}

TEST_CASE("every conv algorithm and both layouts give the compiled result eager gives") {
  auto g = models::buildModel("resnet18", {1, 4});
  REQUIRE(g.hasValue());
  const std::string cache = tempCacheDir("algos");
  auto opts = testOptions(cache);
  opts.autotune = true;
  checkCompiledMatchesEager(*g, opts, 1e-4, 21);
  auto tuned = compiler::compile(*g, opts);
  REQUIRE(tuned.hasValue());
  CHECK((*tuned)->report().algorithmChoices.size() == 20);
  for (const auto& line : (*tuned)->report().algorithmChoices)
    CHECK_THAT(line, Catch::Contains("cached") || Catch::Contains("heuristic"));
  // Without library fusion: plain NCHW everywhere, BN unfused into kernels.
  auto plain = testOptions(cache);
  plain.libraryFusion = false;
  checkCompiledMatchesEager(*g, plain, 1e-4, 22);
  std::filesystem::remove_all(cache);
}

TEST_CASE("jit of an ONNX model: symbolic dims re-import, static dims and dtypes are checked") {
  // y = relu(reshape(x @ w, [N, 32])) with the target shape computed from Shape(x): the
  // importer folds it to a constant, so a new batch needs the model imported again.
  onnxtest::Model m(17);
  m.input("x", {std::string("N"), int64_t{4}, int64_t{8}});
  std::vector<float> w(64);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 7) / 7.0f - 0.4f;
  m.init("w", {8, 8}, w)
      .initI64("zero", {1}, {0})
      .initI64("cols", {1}, {32})
      .node("MatMul", {"x", "w"}, {"h"})
      .node("Shape", {"x"}, {"s"})
      .node("Gather", {"s", "zero"}, {"n"}, {onnxtest::attrInt("axis", 0)})
      .node("Concat", {"n", "cols"}, {"shape"}, {onnxtest::attrInt("axis", 0)})
      .node("Reshape", {"h", "shape"}, {"r"})
      .node("Relu", {"r"}, {"y"})
      .output("y");
  const auto dir = std::filesystem::path(tempCacheDir("jit_onnx"));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model.onnx").string();
  {
    std::ofstream out(path, std::ios::binary);
    out << m.bytes();
  }
  frontends::OnnxImportOptions options;
  options.defaultBatch = 2;
  auto g = frontends::loadOnnx(path, options);
  REQUIRE(g.hasValue());
  REQUIRE(g->inputs()[0]->dimNames() == std::vector<std::string>{"N", "", ""});
  auto specializer = frontends::onnxSpecializer(path);
  REQUIRE(specializer.hasValue());

  compiler::CompileOptions opts;
  opts.cacheDir = (dir / "cache").string();
  auto jitted = kiln::jit(*g, opts, *specializer);
  std::mt19937 rng(3);
  for (int64_t batch : {2, 3, 5}) {
    INFO("batch " << batch);
    const std::vector<Tensor> x{randomTensor({ir::DType::kF32, {batch, 4, 8}}, rng)};
    auto y = jitted(x);
    REQUIRE(y.hasValue());
    CHECK((*y)[0].shape() == ir::Shape{batch, 32});
    // Eager on the model imported for this batch is the reference.
    frontends::OnnxImportOptions exact;
    exact.dimValues["N"] = batch;
    auto ref = frontends::loadOnnx(path, exact);
    REQUIRE(ref.hasValue());
    runtime::EagerExecutor eager(*ref);
    auto want = eager.run(x);
    REQUIRE(want.hasValue());
    CHECK(relError((*y)[0], (*want)[0]) < 1e-5);
  }
  CHECK(jitted.compiles() == 3);

  // A static dim or the dtype may not change: clear errors, nothing compiled.
  auto wide = jitted(std::vector<Tensor>{randomTensor({ir::DType::kF32, {2, 5, 8}}, rng)});
  REQUIRE_FALSE(wide.hasValue());
  CHECK_THAT(wide.status().message(),
             Catch::Contains("input 'x' dim 1 is fixed at 4 by the model, got 5"));
  auto f64 = jitted(std::vector<Tensor>{randomTensor({ir::DType::kF64, {2, 4, 8}}, rng)});
  REQUIRE_FALSE(f64.hasValue());
  CHECK_THAT(f64.status().message(), Catch::Contains("input 'x' has dtype f32, got f64[2,4,8]"));
  CHECK(jitted.compiles() == 3);

  // Without the re-import, the folded reshape pins the batch: the error names the node.
  auto plain = kiln::jit(*g, opts);
  auto pinned = plain(std::vector<Tensor>{randomTensor({ir::DType::kF32, {3, 4, 8}}, rng)});
  REQUIRE_FALSE(pinned.hasValue());
  CHECK_THAT(pinned.status().message(), Catch::Contains("cannot specialize for the new input"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("a training graph (forward, loss, autodiff backward) compiles and matches eager") {
  // A zoo model with a cross-entropy loss; gradients of every trainable parameter are outputs.
  // The backward graph has relu_backward kernels, matmuls with transposes, reductions for the
  // biases, and (mnist_cnn) conv and max-pool backward steps and nll_loss_backward.
  const std::string name = GENERATE(as<std::string>{}, "mlp", "mnist_cnn");
  INFO(name);
  auto g = models::buildModel(name, {4, 3});
  REQUIRE(g.hasValue());
  ir::Value* target = *g->addInput("target", {ir::DType::kI64, {4}});
  ir::Value* logits = g->outputs()[0];
  ir::Value* loss = (*g->addNode(ir::OpKind::kCrossEntropyLoss, {logits, target}))->output(0);
  std::vector<ir::Value*> params;
  for (ir::Value* p : g->parameters())
    if (p->trainable()) params.push_back(p);
  auto grads = passes::appendBackward(*g, loss, params);
  INFO(grads.status().message());
  REQUIRE(grads.hasValue());
  std::vector<ir::Value*> outs{loss};
  outs.insert(outs.end(), grads->begin(), grads->end());
  g->setOutputs(outs);
  const std::string cache = tempCacheDir("train");
  auto opts = testOptions(cache);
  opts.inference = false;  // Parameters stay parameters: they are what training updates.
  checkCompiledMatchesEager(*g, opts, 1e-4, 5);
  std::filesystem::remove_all(cache);
}

TEST_CASE("the pointwise gradient ops and batch_norm_train compile into kernels that match eager") {
  // Generated-kernel forms (codegen/prelude.cpp) of the backward ops against their reference
  // kernels, with broadcasting, plus training-mode BatchNorm fused with a relu.
  const std::string text =
      "graph t(%g : f32[4,3,5,5], %x : f32[4,3,5,5], %b : f32[3,1,1], %s : f32[3], %c : f32[3]) {\n"
      "  %a0 = abs_backward(%g, %x)\n"
      "  %a1 = leaky_relu_backward(%a0, %x) {alpha = 0.1}\n"
      "  %a2 = clip_backward(%a1, %x) {min = -0.5, max = 0.5}\n"
      "  %a3 = gelu_backward(%a2, %x)\n"
      "  %a4 = gelu_backward(%a3, %x) {approximate = \"tanh\"}\n"
      "  %a5 = maximum_backward(%a4, %x, %b)\n"
      "  %a6 = minimum_backward(%a5, %b, %x)\n"
      "  %st = batch_norm_stats(%x)\n"
      "  %m0 = slice(%st) {starts = [0], ends = [1], axes = [0]}\n"
      "  %v0 = slice(%st) {starts = [1], ends = [2], axes = [0]}\n"
      "  %m = reshape(%m0) {shape = [3]}\n"
      "  %v = reshape(%v0) {shape = [3]}\n"
      "  %n = batch_norm_train(%x, %s, %c, %m, %v)\n"
      "  %r = relu(%n)\n"
      "  %y = add(%r, %a6)\n"
      "  return %y, %a6\n"
      "}";
  auto g = ir::parseGraph(text);
  INFO(g.status().message());
  REQUIRE(g.hasValue());
  const std::string cache = tempCacheDir("backward_ops");
  auto opts = testOptions(cache);
  opts.inference = false;
  auto cm = compiler::compile(*g, opts);
  REQUIRE(cm.hasValue());
  // The pointwise chain and the normalization with its relu are generated code, not op calls.
  for (const auto& s : (*cm)->plan().steps)
    if (s.kind == runtime::PlanStep::Kind::kOp)
      CHECK_THAT(s.name, Catch::Contains("batch_norm_stats"));
  checkCompiledMatchesEager(*g, opts, 1e-6, 11);
  std::filesystem::remove_all(cache);
}
TEST_CASE("a convolution whose weights are a graph input follows new weights at every call") {
  // The reordered-weight cache is keyed by address: the plan uses it only for parameters (a
  // weight input at the same address with new values once gave the first call's result).
  auto g = ir::parseGraph(R"(graph g(%x : f32[1,4,8,8], %w : f32[4,4,3,3]) {
  %y : f32[1,4,8,8] = conv2d(%x, %w) {pads=[1,1,1,1]}
  return %y
})");
  REQUIRE(g.hasValue());
  compiler::CompileOptions o;
  o.cacheDir = tempCacheDir("weight_input");
  auto cm = compiler::compile(*g, o);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  auto x = *runtime::Tensor::empty(ir::DType::kF32, {1, 4, 8, 8});
  auto w = *runtime::Tensor::empty(ir::DType::kF32, {4, 4, 3, 3});
  for (int64_t i = 0; i < x.numElements(); ++i)
    x.data<float>()[i] = 0.01f * static_cast<float>(i % 17);
  const std::vector<runtime::Tensor> in{x, w};
  for (float v : {0.1f, -0.3f, 0.7f}) {
    for (int64_t i = 0; i < w.numElements(); ++i)
      w.data<float>()[i] = v * static_cast<float>(i % 5);
    auto got = (*cm)->run(in);
    auto want = runtime::EagerExecutor(*g).run(in);
    REQUIRE(got.hasValue());
    REQUIRE(want.hasValue());
    double d = 0;
    for (int64_t i = 0; i < (*want)[0].numElements(); ++i)
      d = std::max(d, std::fabs((*got)[0].elementAsDouble(i) - (*want)[0].elementAsDouble(i)));
    INFO("weights " << v);
    CHECK(d <= 1e-4);
  }
}

namespace {
// How many of the plan's steps run `op` on a library kernel, and how many of those channels-last.
std::pair<int, int> libraryStepLayouts(const compiler::CompiledModel& cm, ir::OpKind op) {
  std::pair<int, int> n{0, 0};
  for (const auto& s : cm.plan().steps)
    if (s.kind == runtime::PlanStep::Kind::kOp && s.op == op && s.library) {
      ++n.first;
      n.second += s.libraryOptions.channelsLast;
    }
  return n;
}
}  // namespace

TEST_CASE("a concat between convolutions stays channels-last and matches eager") {
  // A SqueezeNet fire module: squeeze, two expands concatenated along channels, then a conv.
  auto g = ir::parseGraph(R"(
graph fire(%x : f32[2,8,9,9], %ws : f32[4,8,1,1], %we1 : f32[6,4,1,1], %we3 : f32[5,4,3,3],
           %wn : f32[3,11,1,1]) {
  %s : f32[2,4,9,9] = conv2d(%x, %ws)
  %sr : f32[2,4,9,9] = relu(%s)
  %e1 : f32[2,6,9,9] = conv2d(%sr, %we1)
  %e3 : f32[2,5,9,9] = conv2d(%sr, %we3) {pads=[1,1,1,1]}
  %c : f32[2,11,9,9] = concat(%e1, %e3) {axis=1}
  %cr : f32[2,11,9,9] = relu(%c)
  %y : f32[2,3,9,9] = conv2d(%cr, %wn)
  return %y
})");
  INFO(g.status().message());
  REQUIRE(g.hasValue());
  const std::string cache = tempCacheDir("concat_nhwc");
  auto cm = checkCompiledMatchesEager(*g, testOptions(cache), 1e-5, 5);
  // One conversion in (the input), one out (the output): none around the concat.
  CHECK(cm->report().layoutConversions == 2);
  CHECK(libraryStepLayouts(*cm, ir::OpKind::kConcat) == std::pair{1, 1});
  std::filesystem::remove_all(cache);
}

TEST_CASE("a lone convolution read only by plain readers stays plain; a chain goes channels-last") {
  // A 3-D convolution's conv2d sits between its input's stacking and its output's transposition:
  // channels-last it would be a region of its own, two conversions for oneDNN's NHWC kernels,
  // which on an AVX2 Zen 3 ran R3D-18 in 1.09 s against 0.72 s plain.
  auto g = ir::parseGraph(R"(
graph lone(%x : f32[4,6,5,7], %w : f32[8,6,3,3], %w2 : f32[8,8,1,1]) {
  %c : f32[4,8,5,7] = conv2d(%x, %w) {pads=[1,1,1,1]}
  %t : f32[4,5,8,7] = transpose(%c) {perm=[0,2,1,3]}
  %r : f32[4,8,5,7] = relu(%c)
  %c2 : f32[4,8,5,7] = conv2d(%r, %w2)
  return %t, %c2
})");
  INFO(g.status().message());
  REQUIRE(g.hasValue());
  const std::string cache = tempCacheDir("lone_conv");
  auto cm = checkCompiledMatchesEager(*g, testOptions(cache), 1e-5, 5);
  // The first conv feeds relu (elementwise, kept NHWC) as well: both convs are one region, the
  // input converted in, the transpose's and the output's values out.
  CHECK(cm->report().layoutConversions == 3);
  CHECK(libraryStepLayouts(*cm, ir::OpKind::kConv2d) == std::pair{2, 2});
  auto lone = ir::parseGraph(R"(
graph lone(%x : f32[4,6,5,7], %w : f32[8,6,3,3]) {
  %c : f32[4,8,5,7] = conv2d(%x, %w) {pads=[1,1,1,1]}
  %t : f32[4,5,8,7] = transpose(%c) {perm=[0,2,1,3]}
  return %t
})");
  REQUIRE(lone.hasValue());
  auto cl = checkCompiledMatchesEager(*lone, testOptions(cache), 1e-5, 5);
  CHECK(cl->report().layoutConversions == 0);
  CHECK(libraryStepLayouts(*cl, ir::OpKind::kConv2d) == std::pair{1, 0});
  std::filesystem::remove_all(cache);
}

TEST_CASE("a quantize-dequantize between convolutions compiles: its integer cast reads plain") {
  // ONNX Runtime's QDQ format: each activation rounded to uint8 and back between convolutions.
  // The cast to u8 runs on a reference kernel (generated kernels do not take it): the layout
  // pass must give it plain memory rather than the channels-last convolution output.
  auto g = ir::parseGraph(R"(
graph qdq(%x : f32[2,3,8,8], %w1 : f32[4,3,3,3], %w2 : f32[5,4,1,1], %s : f32[]) {
  %c : f32[2,4,8,8] = conv2d(%x, %w1) {pads=[1,1,1,1]}
  %r : f32[2,4,8,8] = relu(%c)
  %d : f32[2,4,8,8] = div(%r, %s)
  %q : f32[2,4,8,8] = round(%d)
  %k : f32[2,4,8,8] = clip(%q) {min=0.0, max=255.0}
  %u : u8[2,4,8,8] = cast(%k) {to="u8"}
  %f : f32[2,4,8,8] = cast(%u) {to="f32"}
  %dq : f32[2,4,8,8] = mul(%f, %s)
  %y : f32[2,5,8,8] = conv2d(%dq, %w2)
  return %y
})");
  INFO(g.status().message());
  REQUIRE(g.hasValue());
  const std::string cache = tempCacheDir("qdq_layout");
  checkCompiledMatchesEager(*g, testOptions(cache), 1e-5, 6);
  std::filesystem::remove_all(cache);
}

TEST_CASE("a convolution's residual that nothing reads later is overwritten in place, right") {
  const std::string algo = GENERATE(as<std::string>{}, "auto", "im2col_gemm");
  INFO(algo);
  auto g = ir::parseGraph(R"(
graph res(%x : f32[2,8,10,10], %w1 : f32[8,8,3,3], %w2 : f32[8,8,1,1]) {
  %a : f32[2,8,10,10] = conv2d(%x, %w1) {pads=[1,1,1,1]}
  %r : f32[2,8,10,10] = relu(%a)
  %b : f32[2,8,10,10] = conv2d(%r, %w2) {algo=")" +
                          algo + R"("}
  %s : f32[2,8,10,10] = add(%b, %a)
  %y : f32[2,8,10,10] = relu(%s)
  return %y
})");
  INFO(g.status().message());
  REQUIRE(g.hasValue());
  const std::string cache = tempCacheDir("residual_inplace");
  compiler::CompileOptions o = testOptions(cache);
  o.autotune = false;
  auto cm = checkCompiledMatchesEager(*g, o, 1e-5, 9);
  // The second convolution writes where its residual (the first's output) is.
  const runtime::PlanStep* conv = nullptr;
  for (const auto& s : cm->plan().steps)
    if (s.kind == runtime::PlanStep::Kind::kOp && s.op == ir::OpKind::kConv2d && !s.postOps.empty())
      conv = &s;
  REQUIRE(conv);
  const runtime::BufferRef& residual = conv->inputs.back();
  CHECK(residual.kind == runtime::BufferRef::Kind::kArena);
  CHECK(conv->outputs[0].kind == runtime::BufferRef::Kind::kArena);
  CHECK(conv->outputs[0].offset == residual.offset);
  std::filesystem::remove_all(cache);
}

// Squeeze-excite after hardswish (as PyTorch exports it: x * clip(x / 6 + 1 / 2, 0, 1)): the
// activation is stored by the kernel that averages it (an element output and a row output). The
// activation goes over the convolution's output, which nothing reads later, as a pointwise
// kernel's would (written elsewhere, those writes cost mobilenet_v3_small's kernels 3-8x their
// time on 2 threads); the mean is its own buffer.
TEST_CASE("a reduction's element output goes over its input in place beside its row output") {
  auto g = ir::parseGraph(R"(
graph se(%x : f32[1,32,7,7], %w : f32[32,32,1,1], %w2 : f32[32,32,1,1], %c : f32[], %d : f32[]) {
  %a : f32[1,32,7,7] = conv2d(%x, %w)
  %t : f32[1,32,7,7] = mul(%a, %c)
  %u : f32[1,32,7,7] = add(%t, %d)
  %v : f32[1,32,7,7] = clip(%u) {min=0, max=1}
  %h : f32[1,32,7,7] = mul(%a, %v)
  %m : f32[1,32,1,1] = reduce_mean(%h) {axes=[2,3], keepdims=1}
  %s : f32[1,32,1,1] = conv2d(%m, %w2)
  %y : f32[1,32,7,7] = mul(%h, %s)
  return %y
})");
  INFO(g.status().message());
  REQUIRE(g.hasValue());
  const std::string cache = tempCacheDir("reduction_inplace");
  compiler::CompileOptions o = testOptions(cache);
  o.autotune = false;
  auto cm = checkCompiledMatchesEager(*g, o, 1e-5, 11);
  const runtime::PlanStep* reduction = nullptr;
  for (const auto& s : cm->plan().steps)
    if (s.kind == runtime::PlanStep::Kind::kKernel && s.outputs.size() == 2) reduction = &s;
  REQUIRE(reduction);
  const runtime::BufferRef& in = reduction->inputs[0];
  CHECK(in.kind == runtime::BufferRef::Kind::kArena);
  int over = 0;
  for (const runtime::BufferRef& out : reduction->outputs)
    over += out.kind == runtime::BufferRef::Kind::kArena && out.offset == in.offset &&
            out.type.byteSize() == in.type.byteSize();
  CHECK(over == 1);
  std::filesystem::remove_all(cache);
}

TEST_CASE("exported attention compiles to one attention step and matches eager") {
  // As PyTorch's exporter writes HF BERT's self-attention: K transposed, the scores divided by
  // sqrt(d), a padding mask added, softmax, the product with V.
  auto g = ir::parseGraph(
      R"(graph g(%q : f32[2,4,70,16], %k : f32[2,70,4,16], %v : f32[2,4,70,16], %mask : f32[2,1,1,70]) {
  param %c : f32[] buffer
  %kt : f32[2,4,16,70] = transpose(%k) {perm=[0,2,3,1]}
  %s : f32[2,4,70,70] = matmul(%q, %kt)
  %d : f32[2,4,70,70] = div(%s, %c)
  %m : f32[2,4,70,70] = add(%d, %mask)
  %p : f32[2,4,70,70] = softmax(%m) {axis=-1}
  %y : f32[2,4,70,16] = matmul(%p, %v)
  return %y
})");
  REQUIRE(g.hasValue());
  ir::TensorData c(ir::DType::kF32, {});
  c.as<float>()[0] = 4.0f;
  g->findValue("c")->setData(c);
  const std::string cache = tempCacheDir("attention");
  auto cm = checkCompiledMatchesEager(*g, testOptions(cache), 1e-5, 5);
  int attention = 0, softmax = 0;
  for (const ir::Node* n : cm->optimizedGraph().nodes()) {
    attention += n->op() == ir::OpKind::kAttention;
    softmax += n->op() == ir::OpKind::kSoftmax;
  }
  CHECK(attention == 1);
  CHECK(softmax == 0);
  std::filesystem::remove_all(cache);
}
