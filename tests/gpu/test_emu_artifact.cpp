// Ahead-of-time artifacts of the CUDA backend: compiled for the emu device, saved with their
// CUDA kernels and launch geometry (the `device` section), loaded by the runtime alone on the
// same device, matching the CPU; refused with the device to use on another backend, and
// refused when the geometry is damaged.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "codegen/nvrtc_compiler.h"
#include "compiler/artifact.h"
#include "compiler/compile.h"
#include "models/zoo.h"
#include "random_inputs.h"
#include "runtime/artifact.h"
#include "runtime/eager.h"
#include "runtime/gpu/gpu_backend.h"

using namespace kiln;
using runtime::Tensor;

namespace {

struct TempDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("kiln_test_emu_aot_" + std::to_string(::getpid()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
};

std::vector<std::byte> readAll(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  std::memcpy(b.data(), c.data(), c.size());
  return b;
}

}  // namespace

TEST_CASE("emu artifacts: saved with CUDA kernels and geometry, loaded on emu, refused elsewhere") {
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  auto g = models::buildModel("mnist_cnn", {2, 4});
  REQUIRE(g.hasValue());
  const std::vector<Tensor> ins = testing::randomInputs(*g, 12);
  auto want = runtime::EagerExecutor(*g).run(ins);
  REQUIRE(want.hasValue());
  TempDir dir;
  compiler::CompileOptions o;
  o.cacheDir = (dir.path / "cache").string();
  o.backend = *emu;
  auto cm = compiler::compile(*g, o);
  REQUIRE(cm.hasValue());
  const std::string file = (dir.path / "m.kiln").string();
  REQUIRE(compiler::saveArtifact(**cm, file, "mnist_cnn").isOk());

  auto info = runtime::inspectArtifact(file);
  REQUIRE(info.hasValue());
  CHECK(info->kernelCode == "cuda-emu-object");

  runtime::LoadOptions lo;
  lo.backend = *emu;
  auto loaded = runtime::loadArtifact(file, lo);
  INFO(loaded.status().message());
  REQUIRE(loaded.hasValue());
  int kernels = 0;
  for (const auto& s : (*loaded)->plan().steps)
    if (s.kind == runtime::PlanStep::Kind::kKernel) {
      ++kernels;
      CHECK(s.block >= 32);  // The geometry came back from the device section.
      CHECK(s.grid >= 1);
    }
  CHECK(kernels == (*cm)->report().generatedKernels);
  auto got = (*loaded)->run(ins);
  REQUIRE(got.hasValue());
  for (int64_t i = 0; i < (*want)[0].numElements(); ++i)
    REQUIRE(std::fabs((*got)[0].elementAsDouble(i) - (*want)[0].elementAsDouble(i)) <= 1e-4);

  // On the CPU: refused, naming the device to use.
  auto onCpu = runtime::loadArtifact(file, {});
  REQUIRE_FALSE(onCpu.hasValue());
  CHECK_THAT(onCpu.status().message(), Catch::Contains("holds CUDA kernels (cuda-emu-object)") &&
                                           Catch::Contains("--device emu"));

  // A damaged launch geometry (a block of 33 threads), resealed: refused at load.
  std::vector<std::byte> image = readAll(file);
  const auto& sections = info->sections;
  auto device = std::find_if(sections.begin(), sections.end(),
                             [](const auto& s) { return s.name == "device"; });
  REQUIRE(device != sections.end());
  // str "cuda-emu-object", str "" (arch), u64 count, then i64 block of the first kernel.
  const size_t at = device->offset + 8 + 15 + 8 + 8;
  int64_t block = 33;
  std::memcpy(image.data() + at, &block, 8);
  REQUIRE(runtime::resealArtifact(image).isOk());
  const std::string bad = (dir.path / "bad.kiln").string();
  {
    std::ofstream f(bad, std::ios::binary);
    f.write(reinterpret_cast<const char*>(image.data()),
            static_cast<std::streamsize>(image.size()));
  }
  auto damaged = runtime::loadArtifact(bad, lo);
  REQUIRE_FALSE(damaged.hasValue());
  CHECK_THAT(damaged.status().message(), Catch::Contains("launch geometry of kernel 0"));
}

TEST_CASE("emu artifacts: --precision tf32 is kept by the artifact") {
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  auto g = models::buildModel("mnist_cnn", {1, 4});
  REQUIRE(g.hasValue());
  TempDir dir;
  compiler::CompileOptions o;
  o.cacheDir = (dir.path / "cache").string();
  o.backend = *emu;
  o.precision = compiler::Precision::kTf32;
  auto cm = compiler::compile(*g, o);
  REQUIRE(cm.hasValue());
  const std::string file = (dir.path / "tf32.kiln").string();
  REQUIRE(compiler::saveArtifact(**cm, file, "mnist_cnn").isOk());
  auto info = runtime::inspectArtifact(file);
  REQUIRE(info.hasValue());
  CHECK(info->precision == "tf32");
  runtime::LoadOptions lo;
  lo.backend = *emu;
  auto loaded = runtime::loadArtifact(file, lo);
  INFO(loaded.status().message());
  REQUIRE(loaded.hasValue());
  int compiledTf32 = 0, loadedTf32 = 0;
  for (const auto& s : (*cm)->plan().steps) compiledTf32 += s.libraryOptions.tf32;
  for (const auto& s : (*loaded)->plan().steps) loadedTf32 += s.libraryOptions.tf32;
  CHECK(compiledTf32 > 0);
  CHECK(loadedTf32 == compiledTf32);
  const std::vector<Tensor> ins = testing::randomInputs(*g, 3);
  auto a = (*cm)->run(ins);
  auto b = (*loaded)->run(ins);
  REQUIRE(a.hasValue());
  REQUIRE(b.hasValue());
  for (int64_t i = 0; i < (*a)[0].numElements(); ++i)
    CHECK((*a)[0].elementAsDouble(i) == (*b)[0].elementAsDouble(i));
}

TEST_CASE("cubin artifacts: a GPU loads its cubins, a cubin of its major architecture, or PTX") {
  using Kind = runtime::CudaCodeChoice::Kind;
  const std::vector<std::string> cubins = {"sm_80", "sm_90"}, ptx = {"sm_80", "sm_90"};
  auto pick = [&](int sm, const std::string& own) {
    return runtime::chooseCudaCode(sm, own, cubins, ptx);
  };
  CHECK(pick(90, "sm_90")->kind == Kind::kObjects);  // The compiling GPU's own.
  CHECK(pick(80, "sm_90")->kind == Kind::kCubin);
  CHECK(pick(80, "sm_90")->arch == "sm_80");
  CHECK(pick(86, "sm_90")->arch == "sm_80");  // sm_80 code runs on sm_86 and sm_89.
  CHECK(pick(89, "sm_89")->kind == Kind::kObjects);
  CHECK(pick(90, "sm_89")->arch == "sm_90");
  CHECK(pick(100, "sm_90")->kind == Kind::kPtx);  // Another major: the newest PTX below it.
  CHECK(pick(100, "sm_90")->arch == "sm_90");
  CHECK(pick(120, "sm_100")->arch == "sm_90");
  CHECK_FALSE(pick(75, "sm_90").has_value());  // Older than every code in the artifact.
  CHECK(runtime::chooseCudaCode(86, "sm_90", {}, std::vector<std::string>{"sm_80"})->kind ==
        Kind::kPtx);

  // A cubin artifact keeps each architecture's cubin in its `cubins` section (written here
  // from an emu compile's plan with NVRTC's cubins, as `kiln compile --device cuda` writes it).
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  auto g = models::buildModel("mlp", {2, 4});
  REQUIRE(g.hasValue());
  TempDir dir;
  compiler::CompileOptions o;
  o.cacheDir = (dir.path / "cache").string();
  o.backend = *emu;
  auto cm = compiler::compile(*g, o);
  REQUIRE(cm.hasValue());
  runtime::ArtifactContents c = compiler::artifactContents(**cm, "mlp");
  CHECK(c.cubins.empty());  // Emu's artifacts hold emu objects only.
  c.kernelCode = "cubin";
  c.deviceArch = "sm_90";
  for (auto& m : c.modules) m.object = {std::byte{0x7f}, std::byte{'E'}};  // Not run here.
  codegen::CudaCompileOptions nopts;
  nopts.resourceUsage = true;
  auto sm80 = codegen::compileCuda(
      "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] *= 2.f; }", "k.cu", 80, nopts);
  INFO(sm80.status().message());
  REQUIRE(sm80.hasValue());
  REQUIRE(sm80->cubin.size() > 4);
  CHECK(sm80->cubin.compare(0, 4,
                            "\x7f"
                            "ELF") == 0);
  const auto* b = reinterpret_cast<const std::byte*>(sm80->cubin.data());
  c.cubins.emplace_back("sm_80", std::vector<std::byte>(b, b + sm80->cubin.size()));
  const std::string file = (dir.path / "cubin.kiln").string();
  REQUIRE(runtime::writeArtifact(file, c).isOk());
  auto info = runtime::inspectArtifact(file);
  INFO(info.status().message());
  REQUIRE(info.hasValue());
  CHECK(info->cubinArchs == std::vector<std::string>{"sm_80"});
  CHECK(info->deviceArch == "sm_90");
  // A name that is no architecture is a damaged artifact.
  c.cubins.front().first = "sm_8x";
  REQUIRE(runtime::writeArtifact(file, c).isOk());
  auto damaged = runtime::inspectArtifact(file);
  REQUIRE_FALSE(damaged.hasValue());
  CHECK_THAT(damaged.status().message(), Catch::Contains("architecture 'sm_8x'"));
}

TEST_CASE("emu artifacts: the index checks of op kernels come back with the plan") {
  // The loss's op kernels read the labels unchecked, the gather's its positions; the plan checks
  // them on the host, so a loaded artifact must check them too (the device section carries them:
  // class indices, then positions).
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  ir::Graph g("loss");
  ir::Value* x = *g.addInput("logits", ir::TensorType(ir::DType::kF32, {3, 4}));
  ir::Value* t = *g.addInput("labels", ir::TensorType(ir::DType::kI32, {3}));
  ir::Value* table = *g.addInput("table", ir::TensorType(ir::DType::kF32, {6, 2}));
  ir::Value* ids = *g.addInput("ids", ir::TensorType(ir::DType::kI64, {2}));
  // The gather first: the plan checks its positions first, and so must the loaded one.
  ir::Value* rows =
      (*g.addNode(ir::OpKind::kGather, {table, ids}, {{"axis", int64_t{0}}}))->output();
  g.setOutputs({(*g.addNode(ir::OpKind::kCrossEntropyLoss, {x, t},
                            {{"reduction", std::string("sum")}, {"ignore_index", int64_t{-100}}}))
                    ->output(),
                rows});
  TempDir dir;
  compiler::CompileOptions o;
  o.cacheDir = (dir.path / "cache").string();
  o.backend = *emu;
  auto cm = compiler::compile(g, o);
  REQUIRE(cm.hasValue());
  CHECK((*cm)->report().hostSteps == 0);
  REQUIRE((*cm)->plan().indexChecks.size() == 2);
  const std::string file = (dir.path / "loss.kiln").string();
  REQUIRE(compiler::saveArtifact(**cm, file, "loss").isOk());
  runtime::LoadOptions lo;
  lo.backend = *emu;
  auto loaded = runtime::loadArtifact(file, lo);
  INFO(loaded.status().message());
  REQUIRE(loaded.hasValue());
  const auto& checks = (*loaded)->plan().indexChecks;
  REQUIRE(checks.size() == 2);
  CHECK(checks[0].kind == runtime::IndexCheck::Kind::kPosition);
  CHECK(checks[0].input == 3);
  CHECK(checks[0].limit == 6);
  CHECK(checks[0].axis == 0);
  CHECK(checks[0].op == "gather");
  CHECK(checks[0].data == "f32[6,2]");
  CHECK(checks[1].kind == runtime::IndexCheck::Kind::kClass);
  CHECK(checks[1].input == 1);
  CHECK(checks[1].limit == 4);
  CHECK(checks[1].ignore == -100);
  CHECK(checks[1].op == "cross_entropy_loss");
  Tensor logits = *Tensor::zeros(ir::DType::kF32, {3, 4});
  Tensor labels = *Tensor::zeros(ir::DType::kI32, {3});
  Tensor tableIn = *Tensor::zeros(ir::DType::kF32, {6, 2});
  Tensor at = *Tensor::zeros(ir::DType::kI64, {2});
  // Both bad: the gather's error, as the compiled model's (and the reference's, which runs the
  // gather first).
  labels.data<int32_t>()[1] = 4;
  at.data<int64_t>()[1] = -7;
  for (auto p : {(*loaded)->run(std::vector<Tensor>{logits, labels, tableIn, at}),
                 (*cm)->run(std::vector<Tensor>{logits, labels, tableIn, at})}) {
    REQUIRE_FALSE(p.hasValue());
    CHECK_THAT(p.status().message(),
               Catch::Contains("input 'ids': gather: index -7 (at flat position 1)"));
  }
  at.data<int64_t>()[1] = -6;
  auto r = (*loaded)->run(std::vector<Tensor>{logits, labels, tableIn, at});
  REQUIRE_FALSE(r.hasValue());
  CHECK_THAT(r.status().message(), Catch::Contains("target class 4 at flat position 1"));
  labels.data<int32_t>()[1] = 3;
  auto ok = (*loaded)->run(std::vector<Tensor>{logits, labels, tableIn, at});
  REQUIRE(ok.hasValue());
  CHECK(std::fabs((*ok)[0].elementAsDouble(0) - 3 * std::log(4.0)) < 1e-5);
}

namespace {

// `g` compiled for emu (nothing on the host) and saved to DIR/NAME.kiln, and that artifact
// loaded for emu.
struct SavedAndLoaded {
  std::unique_ptr<compiler::CompiledModel> compiled;
  std::unique_ptr<runtime::LoadedModel> loaded;
  std::string file;
};
SavedAndLoaded compileSaveLoad(const ir::Graph& g, const TempDir& dir, const std::string& name) {
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  compiler::CompileOptions o;
  o.cacheDir = (dir.path / "cache").string();
  o.backend = *emu;
  auto cm = compiler::compile(g, o);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  CHECK((*cm)->report().hostSteps == 0);
  SavedAndLoaded r;
  r.file = (dir.path / (name + ".kiln")).string();
  REQUIRE(compiler::saveArtifact(**cm, r.file, name).isOk());
  runtime::LoadOptions lo;
  lo.backend = *emu;
  auto loaded = runtime::loadArtifact(r.file, lo);
  INFO(loaded.status().message());
  REQUIRE(loaded.hasValue());
  r.compiled = std::move(*cm);
  r.loaded = std::move(*loaded);
  return r;
}

}  // namespace

TEST_CASE("emu artifacts: the device index checks come back with the plan") {
  // Indices the graph computes are checked by the op kernels themselves, each into its word of
  // the arena: the artifact carries where the words are and what each check's error says, and
  // beside them a host check of an input (both lists are written).
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  ir::Graph g("computed");
  ir::Value* x = *g.addInput("logits", ir::TensorType(ir::DType::kF32, {3, 4}));
  ir::Value* t = *g.addInput("labels", ir::TensorType(ir::DType::kI32, {3}));
  ir::Value* table = *g.addInput("table", ir::TensorType(ir::DType::kF32, {6, 2}));
  ir::Value* ids = *g.addInput("ids", ir::TensorType(ir::DType::kI64, {2}));
  ir::Value* plain =
      (*g.addNode(ir::OpKind::kGather, {table, ids}, {{"axis", int64_t{0}}}))->output();
  ir::Value* shifted = (*g.addNode(ir::OpKind::kAdd, {ids, ids}))->output();
  ir::Value* rows =
      (*g.addNode(ir::OpKind::kGather, {table, shifted}, {{"axis", int64_t{0}}}))->output();
  ir::Value* labels2 = (*g.addNode(ir::OpKind::kAdd, {t, t}))->output();
  ir::Value* loss = (*g.addNode(ir::OpKind::kCrossEntropyLoss, {x, labels2},
                                {{"reduction", std::string("sum")}, {"ignore_index", int64_t{-1}}}))
                        ->output();
  g.setOutputs({loss, rows, plain});
  TempDir dir;
  SavedAndLoaded m = compileSaveLoad(g, dir, "computed");
  const std::unique_ptr<compiler::CompiledModel>& cm = m.compiled;
  const std::unique_ptr<runtime::LoadedModel>& loaded = m.loaded;
  const std::string& file = m.file;
  REQUIRE(cm->plan().indexChecks.size() == 1);
  REQUIRE(cm->plan().deviceIndexChecks.size() == 2);
  const runtime::Plan& a = cm->plan();
  const runtime::Plan& b = loaded->plan();
  CHECK(b.indexChecks.size() == 1);
  CHECK(b.indexWordsOffset == a.indexWordsOffset);
  CHECK(b.arenaBytes == a.arenaBytes);
  REQUIRE(b.deviceIndexChecks.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    const runtime::IndexCheck &p = a.deviceIndexChecks[i], &q = b.deviceIndexChecks[i];
    CHECK(p.kind == q.kind);
    CHECK(p.limit == q.limit);
    CHECK(p.ignore == q.ignore);
    CHECK(p.axis == q.axis);
    CHECK(p.op == q.op);
    CHECK(p.data == q.data);
    CHECK(p.where == q.where);
  }
  Tensor logits = *Tensor::zeros(ir::DType::kF32, {3, 4});
  Tensor labels = *Tensor::zeros(ir::DType::kI32, {3});
  Tensor tableIn = *Tensor::zeros(ir::DType::kF32, {6, 2});
  Tensor at = *Tensor::zeros(ir::DType::kI64, {2});
  at.data<int64_t>()[1] = 3;  // 6 after the add.
  for (auto p : {loaded->run(std::vector<Tensor>{logits, labels, tableIn, at}),
                 cm->run(std::vector<Tensor>{logits, labels, tableIn, at})}) {
    REQUIRE_FALSE(p.hasValue());
    CHECK_THAT(p.status().message(),
               Catch::Contains("gather: index 6 (at flat position 1) is out of range for dim 0 "
                               "of size 6 in data f32[6,2]"));
  }
  at.data<int64_t>()[1] = 1;
  labels.data<int32_t>()[2] = 2;  // 4 after the add.
  auto r = loaded->run(std::vector<Tensor>{logits, labels, tableIn, at});
  REQUIRE_FALSE(r.hasValue());
  CHECK_THAT(r.status().message(),
             Catch::Contains("cross_entropy_loss: target class 4 at flat position 2 of target "
                             "i32[3] is out of range for 4 classes"));
  labels.data<int32_t>()[2] = 1;
  auto ok = loaded->run(std::vector<Tensor>{logits, labels, tableIn, at});
  INFO(ok.status().message());
  REQUIRE(ok.hasValue());
  CHECK(std::fabs((*ok)[0].elementAsDouble(0) - 3 * std::log(4.0)) < 1e-5);

  // The words' offset moved past the arena (checksums made again) is refused by name.
  std::ifstream in(file, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const int64_t field[2] = {a.indexWordsOffset, 2};  // The offset, then the count of checks.
  const auto found = std::search(bytes.begin(), bytes.end(), reinterpret_cast<const char*>(field),
                                 reinterpret_cast<const char*>(field) + sizeof(field));
  REQUIRE(found != bytes.end());
  const int64_t past = (a.arenaBytes + 8) / 8 * 8;
  std::memcpy(&*found, &past, sizeof(past));
  REQUIRE(runtime::resealArtifact(std::as_writable_bytes(std::span(bytes))).isOk());
  const std::string damaged = (dir.path / "damaged.kiln").string();
  std::ofstream(damaged, std::ios::binary)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  runtime::LoadOptions lo;
  lo.backend = *emu;
  auto bad = runtime::loadArtifact(damaged, lo);
  REQUIRE_FALSE(bad.hasValue());
  CHECK_THAT(bad.status().message(),
             Catch::Contains("device index words at " + std::to_string(past)));
}

TEST_CASE("emu artifacts: a scatter's index checks come back with the plan") {
  // A scatter's indices are resolved per component (kind 2 of the tagged checks, with its limits
  // and dims): an input's checked before the run, computed ones on the device.
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  ir::Graph g("scatter");
  ir::Value* d = *g.addInput("data", ir::TensorType(ir::DType::kF32, {3, 4, 2}));
  ir::Value* ids = *g.addInput("ids", ir::TensorType(ir::DType::kI32, {2, 2}));
  ir::Value* u = *g.addInput("updates", ir::TensorType(ir::DType::kF32, {2, 2}));
  ir::Value* twice = (*g.addNode(ir::OpKind::kAdd, {ids, ids}))->output();
  const ir::AttrMap none = {{"reduction", std::string("none")}};
  g.setOutputs({(*g.addNode(ir::OpKind::kScatterNd, {d, ids, u}, none))->output(),
                (*g.addNode(ir::OpKind::kScatterNd, {d, twice, u}, none))->output()});
  TempDir dir;
  SavedAndLoaded m = compileSaveLoad(g, dir, "scatter");
  const std::unique_ptr<compiler::CompiledModel>& cm = m.compiled;
  const std::unique_ptr<runtime::LoadedModel>& loaded = m.loaded;
  for (const runtime::Plan* p : {&cm->plan(), &loaded->plan()}) {
    REQUIRE(p->indexChecks.size() == 1);
    REQUIRE(p->deviceIndexChecks.size() == 1);
    for (const runtime::IndexCheck* c : {&p->indexChecks[0], &p->deviceIndexChecks[0]}) {
      CHECK(c->kind == runtime::IndexCheck::Kind::kResolved);
      CHECK(c->limits == std::vector<int64_t>{3, 4});
      CHECK(c->dims == std::vector<int>{0, 1});
      CHECK(c->op == "scatter_nd");
    }
  }
  Tensor data = *Tensor::zeros(ir::DType::kF32, {3, 4, 2});
  Tensor at = *Tensor::zeros(ir::DType::kI32, {2, 2});
  Tensor upd = *Tensor::zeros(ir::DType::kF32, {2, 2});
  at.data<int32_t>()[3] = 2;  // 4 once doubled: out of range for dim 1.
  for (auto r : {loaded->run(std::vector<Tensor>{data, at, upd}),
                 cm->run(std::vector<Tensor>{data, at, upd})}) {
    REQUIRE_FALSE(r.hasValue());
    CHECK_THAT(r.status().message(),
               Catch::Contains("scatter_nd: index 4 is out of range for dim 1 of size 4"));
  }
  at.data<int32_t>()[3] = 4;  // The input itself.
  auto r = loaded->run(std::vector<Tensor>{data, at, upd});
  REQUIRE_FALSE(r.hasValue());
  CHECK_THAT(r.status().message(),
             Catch::Contains("input 'ids': scatter_nd: index 4 is out of range for dim 1"));
  at.data<int32_t>()[3] = -2;
  auto ok = loaded->run(std::vector<Tensor>{data, at, upd});
  INFO(ok.status().message());
  CHECK(ok.hasValue());
}

TEST_CASE("emu artifacts: a divisor's checks come back with the plan") {
  // Integer div by an input divisor (any integer dtype: here i8) is checked before the run, by a
  // computed one on the device (kind 3 of the tagged checks).
  ir::Graph g("divide");
  ir::Value* a = *g.addInput("a", ir::TensorType(ir::DType::kI8, {2, 3}));
  ir::Value* b = *g.addInput("b", ir::TensorType(ir::DType::kI8, {3}));
  ir::Value* twice = (*g.addNode(ir::OpKind::kAdd, {b, b}))->output();
  g.setOutputs({(*g.addNode(ir::OpKind::kDiv, {a, b}))->output(),
                (*g.addNode(ir::OpKind::kMod, {a, twice}, {{"fmod", int64_t{1}}}))->output()});
  TempDir dir;
  SavedAndLoaded m = compileSaveLoad(g, dir, "divide");
  for (const runtime::Plan* p : {&m.compiled->plan(), &m.loaded->plan()}) {
    REQUIRE(p->indexChecks.size() == 1);
    REQUIRE(p->deviceIndexChecks.size() == 1);
    CHECK(p->indexChecks[0].kind == runtime::IndexCheck::Kind::kNonZero);
    CHECK(p->deviceIndexChecks[0].kind == runtime::IndexCheck::Kind::kNonZero);
    CHECK(p->deviceIndexChecks[0].data == "i8[3]");
  }
  Tensor as = *Tensor::zeros(ir::DType::kI8, {2, 3});
  Tensor bs = *Tensor::zeros(ir::DType::kI8, {3});
  const int8_t v[] = {1, -128, 2};  // -128 doubled wraps to 0.
  std::memcpy(bs.rawData(), v, sizeof(v));
  auto r = m.loaded->run(std::vector<Tensor>{as, bs});
  REQUIRE_FALSE(r.hasValue());
  CHECK_THAT(r.status().message(),
             Catch::Contains("mod: integer division by zero (divisor i8[3] is 0 at flat index 1)"));
  bs.data<int8_t>()[1] = 0;
  r = m.loaded->run(std::vector<Tensor>{as, bs});
  REQUIRE_FALSE(r.hasValue());
  CHECK_THAT(r.status().message(),
             Catch::Contains("input 'b': div: integer division by zero (divisor i8[3] is 0"));
  bs.data<int8_t>()[1] = 3;
  auto ok = m.loaded->run(std::vector<Tensor>{as, bs});
  INFO(ok.status().message());
  CHECK(ok.hasValue());
}
