// Every CUDA kernel the CUDA backend generates for the zoo — forward and training steps —
// compiles with NVRTC for sm_80 and sm_90, and ptxas reports no spill stores. Prints one line per
// model and architecture (kernels, most registers, kernels above 128 registers) for the notes:
//   build/tests/test_gpu "nvrtc*" 2>&1 | grep "^nvrtc"
#include <catch2/catch.hpp>
#include <iostream>

#include "codegen/nvrtc_compiler.h"
#include "codegen/prelude.h"
#include "compiler/compile.h"
#include "compiler/train.h"
#include "models/zoo.h"
#include "runtime/gpu/gpu_backend.h"

using namespace kiln;

namespace {

void checkModule(const std::string& label, const std::vector<compiler::KernelSource>& kernels) {
  if (kernels.empty()) {  // Every op a library call with its epilogue (the mlp forward).
    std::cerr << "nvrtc " << label << ": no generated kernels\n";
    return;
  }
  std::string src(codegen::kernelPrelude());
  for (const auto& k : kernels) {
    REQUIRE_FALSE(k.cuda.empty());
    src += "\n" + k.cuda;
  }
  for (int arch : {80, 90}) {
    codegen::CudaCompileOptions o;
    o.resourceUsage = true;
    auto ptx = codegen::compileCuda(src, label + ".cu", arch, o);
    INFO(label << " sm_" << arch << ": " << ptx.status().message());
    REQUIRE(ptx.hasValue());
    CHECK(ptx->resources.size() == kernels.size());
    int maxRegs = 0, above128 = 0;
    std::string heaviest;
    for (const auto& r : ptx->resources) {
      INFO(r.name);
      CHECK(r.spillStoreBytes == 0);
      CHECK(r.spillLoadBytes == 0);
      if (r.registers > maxRegs) {
        maxRegs = r.registers;
        heaviest = r.name;
      }
      above128 += r.registers > 128;
    }
    std::cerr << "nvrtc sm_" << arch << " " << label << ": " << kernels.size()
              << " kernels, no spills, most registers " << maxRegs << " (" << heaviest << "), "
              << above128 << " above 128\n";
  }
}

}  // namespace

TEST_CASE(
    "nvrtc: every zoo kernel, forward and training, compiles for sm_80/sm_90 without spills") {
  if (!codegen::cudaCompilerAvailable()) {
    WARN("skipped: kiln was built without the CUDA toolkit (NVRTC)");
    return;
  }
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  for (const auto& info : models::listModels()) {
    INFO(info.name);
    auto g = models::buildModel(info.name, {1, 1});
    REQUIRE(g.hasValue());
    compiler::CompileOptions o;
    o.backend = *emu;
    auto cm = compiler::compile(*g, o);
    INFO(cm.status().message());
    REQUIRE(cm.hasValue());
    checkModule(info.name + " forward", (*cm)->report().kernels);

    if (info.name == "bert_layer") continue;  // Not a classifier: trained through its own tests.
    compiler::TrainOptions t;
    t.compile.backend = *emu;
    auto model = models::buildModel(
        info.name,
        {.batch = 2, .seed = 1, .imageSize = info.name.rfind("resnet", 0) == 0 ? 32 : 0});
    REQUIRE(model.hasValue());
    auto step = compiler::TrainingStep::create(std::move(model).value(), t);
    INFO(step.status().message());
    REQUIRE(step.hasValue());
    REQUIRE((*step)->compiled());
    checkModule(info.name + " training", (*step)->compiled()->report().kernels);
    for (const auto& r : (*step)->compiled()->report().remarks)
      if (r.find("on the host") != std::string::npos || r.find("op by op") != std::string::npos)
        std::cerr << "nvrtc note: " << info.name << " training: " << r << "\n";
  }
}
