// AOT artifacts: compile -> save -> load -> run is bitwise the in-process compiled model for
// every zoo model, and every kind of damage (a flipped byte in each section, truncation, another
// format version, a CPU lacking a feature, wrong inputs) is a clear error, never a crash.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "artifact_tamper.h"
#include "compiler/artifact.h"
#include "ir/parser.h"
#include "models/zoo.h"
#include "runtime/library/dnnl_support.h"
#include "x86_levels.h"

using namespace kiln;
using Catch::Contains;
using runtime::Tensor;

namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("kiln_test_artifact_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

std::vector<Tensor> randomInputs(const runtime::Plan& plan, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<Tensor> inputs;
  for (const auto& t : plan.inputs) {
    Tensor x = *Tensor::empty(t.dtype, t.shape);
    for (int64_t i = 0; i < x.numElements(); ++i) x.data<float>()[i] = dist(rng);
    inputs.push_back(x);
  }
  return inputs;
}

bool bitwiseEqual(const Tensor& a, const Tensor& b) {
  return a.toData().bitwiseEqual(b.toData());
}

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void writeFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::string loadError(const std::string& path) {
  auto m = kiln::load(path);
  REQUIRE_FALSE(m.hasValue());
  CHECK(m.status().isUserError());
  return m.status().message();
}

// A zoo model compiled with `o`.
std::unique_ptr<compiler::CompiledModel> compileZoo(const std::string& name, int64_t batch,
                                                    const compiler::CompileOptions& o) {
  auto g = models::buildModel(name, {batch, 0});
  REQUIRE(g.hasValue());
  auto cm = compiler::compile(*g, o);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  return std::move(cm).value();
}

// Both run the same seeded inputs; every output must be bitwise equal.
void checkSameOutputs(compiler::CompiledModel& cm, runtime::LoadedModel& loaded, uint32_t seed) {
  const auto inputs = randomInputs(cm.plan(), seed);
  auto want = cm.run(inputs);
  auto got = loaded.run(inputs);
  REQUIRE(want.hasValue());
  REQUIRE(got.hasValue());
  REQUIRE(got->size() == want->size());
  for (size_t i = 0; i < got->size(); ++i) CHECK(bitwiseEqual((*got)[i], (*want)[i]));
}

compiler::CompileOptions options(const TempDir& dir) {
  compiler::CompileOptions o;
  o.cacheDir = dir.file("cache");
  return o;
}

}  // namespace

// Format version 2: a step's scratch bytes (a column-wise reduction split in chunks of rows,
// codegen::cpuRowSplit) survive the round trip; version 1 artifacts (the fuzz corpus's
// tiny_x86-64_v1.kiln) still load.
TEST_CASE("artifact: a reduction split in chunks of rows runs bitwise the same after loading") {
  TempDir dir;
  auto g = ir::parseGraph(R"(graph se(%x : f32[3136,96]) {
  %s : f32[3136,96] = silu(%x)
  %m : f32[96] = reduce_mean(%s) {axes=[0], keepdims=0}
  return %s, %m
})");
  REQUIRE(g.hasValue());
  auto cm = compiler::compile(*g, options(dir));
  REQUIRE(cm.hasValue());
  REQUIRE((*cm)->plan().steps.size() == 1);
  CHECK((*cm)->plan().steps[0].scratchBytes > 0);
  const std::string path = dir.file("se.kiln");
  REQUIRE(compiler::saveArtifact(**cm, path, "se").isOk());
  auto loaded = kiln::load(path);
  INFO(loaded.status().message());
  REQUIRE(loaded.hasValue());
  CHECK((*loaded)->info().version == runtime::kArtifactVersion);
  checkSameOutputs(**cm, **loaded, 5);
}

// load() prepares every library call on its thread, the scratch its runs will use included
// (written a byte a page): a first run that allocated and page-faulted it took 1.0-1.3 ms
// instead of 0.2 on mnist_cnn's artifact (235 page faults; 11 after). Loaded and run on a fresh
// thread, whose scratch starts empty (compile's autotuning ran the calls on this one), without
// load's warm-up run (which would make the scratch itself).
TEST_CASE("artifact: the first run after loading finds its library scratch made") {
  TempDir dir;
  auto cm = compileZoo("mnist_cnn", 2, options(dir));
  const std::string path = dir.file("mnist.kiln");
  REQUIRE(compiler::saveArtifact(*cm, path, "mnist_cnn").isOk());
  uint64_t before = 0, after = 0;
  std::string error;  // Catch's macros stay on the test's thread.
  std::thread([&] {
    runtime::LoadOptions noWarmup;
    noWarmup.warmup = false;
    auto loaded = kiln::load(path, noWarmup);
    if (!loaded) return void(error = loaded.status().message());
    const auto inputs = randomInputs(cm->plan(), 3);
    before = runtime::lib::scratchBuffersMade.load();
    auto out = (*loaded)->run(inputs);
    if (!out) return void(error = out.status().message());
    after = runtime::lib::scratchBuffersMade.load();
  }).join();
  INFO(error);
  REQUIRE(error.empty());
  CHECK(before > 0);
  CHECK(after == before);
}

// load() runs the model once on zero inputs (LoadOptions::warmup), every step on the compute
// threads, so that the first real run finds the code, pages and caches a run touches warm
// (mnist_cnn's first run: 0.5-0.6 ms against 0.17 steady without it, 0.21-0.30 with it; a
// benchmark figure, not asserted here). The first run's outputs are still its inputs' alone.
TEST_CASE("artifact: load warms the model up with one run on zero inputs") {
  TempDir dir;
  auto cm = compileZoo("mnist_cnn", 2, options(dir));
  const std::string path = dir.file("mnist.kiln");
  REQUIRE(compiler::saveArtifact(*cm, path, "mnist_cnn").isOk());
  const auto inputs = randomInputs(cm->plan(), 5);
  auto want = cm->run(inputs);
  REQUIRE(want.hasValue());
  for (const bool warmup : {true, false}) {
    DYNAMIC_SECTION("warmup " << warmup) {
      runtime::LoadOptions o;
      o.warmup = warmup;
      auto loaded = kiln::load(path, o);
      INFO(loaded.status().message());
      REQUIRE(loaded.hasValue());
      CHECK(((*loaded)->warmupMs() > 0) == warmup);
      // The warm-up ran every step (kernels and library calls), with the compute threads.
      const runtime::PlanRunStats st = (*loaded)->lastStats();
      int64_t kernels = 0, ops = 0;
      for (const auto& step : cm->plan().steps) {
        kernels += step.kind == runtime::PlanStep::Kind::kKernel;
        ops += step.kind == runtime::PlanStep::Kind::kOp;
      }
      CHECK(st.kernelSteps == (warmup ? kernels : 0));
      CHECK(st.opSteps == (warmup ? ops : 0));
      CHECK((st.threads > 0) == warmup);
      auto got = (*loaded)->run(inputs);
      REQUIRE(got.hasValue());
      for (size_t i = 0; i < got->size(); ++i) CHECK(bitwiseEqual((*got)[i], (*want)[i]));
    }
  }
}

TEST_CASE("artifact: save, load and run is bitwise the compiled model for every zoo model") {
  TempDir dir;
  for (const std::string name : {"mlp", "mnist_cnn", "resnet18", "resnet50", "bert_layer"}) {
    DYNAMIC_SECTION(name) {
      auto cm = compileZoo(name, 2, options(dir));
      const std::string path = dir.file(name + ".kiln");
      REQUIRE(compiler::saveArtifact(*cm, path, name).isOk());

      auto loaded = kiln::load(path);
      INFO(loaded.status().message());
      REQUIRE(loaded.hasValue());
      CHECK_FALSE((*loaded)->recompiled());
      const auto& info = (*loaded)->info();
      CHECK(info.modelName == name);
      CHECK(info.inputs == cm->plan().inputs);
      CHECK(info.outputs == cm->plan().outputs);
      CHECK(info.arenaBytes == cm->plan().arenaBytes);
      CHECK(static_cast<int>(info.kernels.size()) == cm->report().generatedKernels);

      // load() prepared the library calls: their weights are reordered before the first run,
      // which reorders nothing more (the same formats for the same thread count).
      const size_t prepared = (*loaded)->reorderedWeightBytes();
      if (name != "mlp" && name != "bert_layer") CHECK(prepared > 0);  // oneDNN's convolutions.
      CHECK((*loaded)->prepareMs() > 0);
      checkSameOutputs(*cm, **loaded, 7);
      CHECK((*loaded)->reorderedWeightBytes() == prepared);
      // A second run reuses the loaded code and weights.
      checkSameOutputs(*cm, **loaded, 8);
    }
  }
}

TEST_CASE("artifact: damage of every kind is a clear error") {
  TempDir dir;
  auto cm = compileZoo("mnist_cnn", 1, options(dir));
  const std::string good = dir.file("good.kiln");
  REQUIRE(compiler::saveArtifact(*cm, good, "mnist_cnn").isOk());
  const std::string bytes = readFile(good);
  auto info = runtime::inspectArtifact(good);
  REQUIRE(info.hasValue());
  const std::string bad = dir.file("bad.kiln");

  SECTION("a flipped byte in each section names the section") {
    for (const auto& s : info->sections) {
      INFO(s.name);
      if (s.size == 0) continue;
      for (uint64_t at : {s.offset, s.offset + s.size / 2, s.offset + s.size - 1}) {
        std::string damaged = bytes;
        damaged[at] = static_cast<char>(damaged[at] ^ 0x10);
        writeFile(bad, damaged);
        CHECK_THAT(loadError(bad), Contains("section '" + s.name + "' checksum mismatch"));
      }
    }
  }
  SECTION("a flipped byte in the header or the section table") {
    for (size_t at : {size_t{13}, size_t{20}, size_t{40}, size_t{60}}) {
      std::string damaged = bytes;
      damaged[at] = static_cast<char>(damaged[at] ^ 0x01);
      writeFile(bad, damaged);
      CHECK_THAT(loadError(bad), Contains("header checksum mismatch"));
    }
    std::string damaged = bytes;
    damaged[70] = static_cast<char>(damaged[70] ^ 0x01);
    writeFile(bad, damaged);
    CHECK_THAT(loadError(bad), Contains("section table checksum mismatch"));
  }
  SECTION("truncation at several offsets") {
    for (size_t n : {size_t{0}, size_t{7}, size_t{63}, size_t{64}, size_t{200}, bytes.size() / 2,
                     bytes.size() - 1}) {
      INFO(n);
      writeFile(bad, bytes.substr(0, n));
      const std::string e = loadError(bad);
      CHECK((e.find("truncated") != std::string::npos ||
             e.find("not a kiln artifact") != std::string::npos ||
             e.find("header checksum") != std::string::npos));
    }
    writeFile(bad, bytes + "extra");
    CHECK_THAT(loadError(bad), Contains("extra bytes"));
  }
  SECTION("another format version is refused before anything else is read") {
    for (uint32_t version : {uint32_t{0}, runtime::kArtifactVersion + 1}) {
      std::string other = bytes;
      std::memcpy(other.data() + 8, &version, 4);
      writeFile(bad, other);
      CHECK_THAT(loadError(bad), Contains("format version " + std::to_string(version) +
                                          ", but this kiln reads versions 1 to 2") &&
                                     Contains("compile the model again"));
    }
  }
  SECTION("not an artifact at all") {
    writeFile(bad, "{\"format\": \"kiln-graph\"}");
    CHECK_THAT(loadError(bad), Contains("not a kiln artifact"));
    auto missing = kiln::load(dir.file("none.kiln"));
    REQUIRE_FALSE(missing.hasValue());
    CHECK(missing.status().code() == ErrorCode::kNotFound);
  }
  SECTION("wrong inputs name the input, expected vs actual") {
    auto loaded = kiln::load(good);
    REQUIRE(loaded.hasValue());
    auto wrongShape =
        (*loaded)->run(std::vector<Tensor>{*Tensor::zeros(ir::DType::kF32, {2, 1, 28, 28})});
    REQUIRE_FALSE(wrongShape.hasValue());
    CHECK_THAT(wrongShape.status().message(), Contains("input 'input'") &&
                                                  Contains("f32[1,1,28,28]") &&
                                                  Contains("f32[2,1,28,28]"));
    auto wrongCount = (*loaded)->run(std::vector<Tensor>{});
    REQUIRE_FALSE(wrongCount.hasValue());
    CHECK_THAT(wrongCount.status().message(), Contains("takes 1 inputs, got 0"));
    auto wrongDtype =
        (*loaded)->run(std::vector<Tensor>{*Tensor::zeros(ir::DType::kF64, {1, 1, 28, 28})});
    REQUIRE_FALSE(wrongDtype.hasValue());
  }
  // Nothing the loader read was left behind or changed.
  CHECK(readFile(good) == bytes);
}

TEST_CASE("artifact: code for a CPU feature this one lacks is refused, or rebuilt from sources") {
  TempDir dir;
  auto cm = compileZoo("mnist_cnn", 1, options(dir));
  REQUIRE(cm->report().generatedKernels > 0);
  runtime::ArtifactContents c = compiler::artifactContents(*cm, "mnist_cnn");
  c.features += ",+kiln-test-feature";  // No CPU has it.
  const std::string path = dir.file("future.kiln");
  REQUIRE(runtime::writeArtifact(path, c).isOk());

  CHECK_THAT(loadError(path), Contains("lacks: kiln-test-feature") && Contains("--no-recompile"));

  std::ostringstream log;
  runtime::LoadOptions o;
  o.recompile = compiler::recompileForHost;
  o.log = &log;
  auto loaded = kiln::load(path, o);
  INFO(loaded.status().message());
  REQUIRE(loaded.hasValue());
  CHECK((*loaded)->recompiled());
  CHECK_THAT(log.str(), Contains("recompiling its kernels from the embedded sources"));
  checkSameOutputs(*cm, **loaded, 3);
}

TEST_CASE("artifact: a malformed object in a resealed artifact is an error, not a crash") {
  TempDir dir;
  auto cm = compileZoo("mnist_cnn", 1, options(dir));
  const std::string path = dir.file("m.kiln");
  REQUIRE(compiler::saveArtifact(*cm, path, "mnist_cnn").isOk());
  const std::string bytes = readFile(path);
  std::vector<std::byte> image(bytes.size());
  std::memcpy(image.data(), bytes.data(), bytes.size());
  REQUIRE(kiln::test::corruptFirstRelocation(image));
  // Unsealed, the checksum catches the change; resealed, the object check does.
  writeFile(path, std::string(reinterpret_cast<const char*>(image.data()), image.size()));
  CHECK_THAT(loadError(path), Contains("checksum"));
  REQUIRE(runtime::resealArtifact(image).isOk());
  writeFile(path, std::string(reinterpret_cast<const char*>(image.data()), image.size()));
  REQUIRE(runtime::inspectArtifact(path).hasValue());
  CHECK_THAT(loadError(path), Contains("object 'kiln_module0' is malformed") &&
                                  Contains("not one of the types kiln's kernels use"));
  // A header cut short is reported as such (12 to 63 bytes once said "no KILNAOT header").
  for (size_t cut : {size_t{8}, size_t{12}, size_t{40}, size_t{63}}) {
    writeFile(path, bytes.substr(0, cut));
    CHECK_THAT(loadError(path), Contains("truncated: " + std::to_string(cut) + " bytes"));
  }
}

TEST_CASE("artifact: an x86-64-v3 artifact records only x86-64-v3's features and loads as is") {
  TempDir dir;
  auto opts = options(dir);
  opts.targetCpu = "x86-64-v3";
  auto cm = compileZoo("mnist_cnn", 2, opts);
  REQUIRE(cm->report().generatedKernels > 0);
  const std::string path = dir.file("portable.kiln");
  REQUIRE(compiler::saveArtifact(*cm, path, "mnist_cnn").isOk());
  auto info = runtime::inspectArtifact(path);
  REQUIRE(info.hasValue());
  CHECK(info->cpu == "x86-64-v3");
  INFO(info->features);
  CHECK(kiln::test::beyondX86_64V3(info->features).empty());
  CHECK_THAT(info->features, Contains("+avx2"));
  // No recompiler given: the load must take the object code as it is.
  auto loaded = kiln::load(path);
  INFO(loaded.status().message());
  REQUIRE(loaded.hasValue());
  CHECK_FALSE((*loaded)->recompiled());
  checkSameOutputs(*cm, **loaded, 5);
  // The same model for this machine's own CPU agrees (no FMA contraction in either; a
  // reduction's vector width may change the order of its sums).
  auto nativeOpts = options(dir);
  nativeOpts.targetCpu = "native";
  auto native = compileZoo("mnist_cnn", 2, nativeOpts);
  const auto inputs = randomInputs(cm->plan(), 9);
  auto a = cm->run(inputs);
  auto b = native->run(inputs);
  REQUIRE(a.hasValue());
  REQUIRE(b.hasValue());
  const float* x = (*a)[0].data<float>();
  const float* y = (*b)[0].data<float>();
  for (int64_t i = 0; i < (*a)[0].numElements(); ++i) CHECK(std::fabs(x[i] - y[i]) <= 1e-5f);
}

TEST_CASE("artifact: inspect lists version, target, signature, kernels and sections") {
  TempDir dir;
  auto opts = options(dir);
  opts.cudaCheck = true;
  auto cm = compileZoo("mnist_cnn", 4, opts);
  const std::string path = dir.file("m.kiln");
  REQUIRE(compiler::saveArtifact(*cm, path, "mnist_cnn").isOk());
  auto info = runtime::inspectArtifact(path);
  REQUIRE(info.hasValue());
  CHECK(info->version == runtime::kArtifactVersion);
  CHECK_FALSE(info->triple.empty());
  CHECK(info->inputNames == std::vector<std::string>{"input"});
  CHECK(info->inputs[0].shape == ir::Shape{4, 1, 28, 28});
  CHECK(info->outputs[0].shape == ir::Shape{4, 10});
  CHECK(info->parameterBytes > 4'000'000);
  CHECK_THAT(info->optimizedGraph, Contains("graph mnist_cnn"));
  std::vector<std::string> names;
  for (const auto& s : info->sections) names.push_back(s.name);
  CHECK(names ==
        std::vector<std::string>{"meta", "graph", "plan", "objects", "sources", "ptx", "weights"});
  if (cm->report().cudaKernelsChecked > 0)
    CHECK(info->ptxArchs == std::vector<std::string>{"sm_80", "sm_90"});
  // The weights start on a page, so that they can be mapped.
  CHECK(info->sections.back().offset % 4096 == 0);
}

// Zeros are not every model's valid input: one dividing by an input rejects them as the user's
// error, and then loads cold (the warm-up skipped) instead of failing to load.
TEST_CASE("artifact: a model that rejects zero inputs loads without its warm-up") {
  TempDir dir;
  ir::Graph g("divide");
  ir::Value* a = *g.addInput("a", ir::TensorType(ir::DType::kI32, {4}));
  ir::Value* b = *g.addInput("b", ir::TensorType(ir::DType::kI32, {4}));
  g.setOutputs({(*g.addNode(ir::OpKind::kDiv, {a, b}))->output()});
  auto cm = compiler::compile(g, options(dir));
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  const std::string path = dir.file("divide.kiln");
  REQUIRE(compiler::saveArtifact(**cm, path, "divide").isOk());
  auto loaded = kiln::load(path);
  INFO(loaded.status().message());
  REQUIRE(loaded.hasValue());
  CHECK((*loaded)->warmupMs() == 0);
  Tensor as = *Tensor::zeros(ir::DType::kI32, {4});
  Tensor bs = *Tensor::zeros(ir::DType::kI32, {4});
  for (int64_t i = 0; i < 4; ++i) as.data<int32_t>()[i] = 7, bs.data<int32_t>()[i] = 2;
  auto out = (*loaded)->run(std::vector<Tensor>{as, bs});
  INFO(out.status().message());
  REQUIRE(out.hasValue());
  CHECK((*out)[0].data<int32_t>()[3] == 3);
}
