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
#include "runtime/gpu/nvjitlink.h"

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

TEST_CASE("nvjitlink: PTX for an older architecture links into a cubin for this GPU's") {
  if (!codegen::cudaCompilerAvailable()) {
    WARN("skipped: kiln was built without the CUDA toolkit (NVRTC)");
    return;
  }
  // The fallback of an artifact whose cubins are for another GPU: its sm_80 PTX, linked for an
  // sm_90 device by the toolkit's linker (runtime/gpu/nvjitlink.h), which needs no GPU.
  const std::string src = std::string(codegen::kernelPrelude()) +
                          "extern \"C\" __global__ void twice(const float* x, float* y, long n) {\n"
                          "  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;\n"
                          "  if (i < n) y[i] = 2.f * x[i];\n}\n";
  auto ptx = codegen::compileCuda(src, "twice.cu", 80);
  INFO(ptx.status().message());
  REQUIRE(ptx.hasValue());
  const auto text = std::as_bytes(std::span(ptx->ptx.data(), ptx->ptx.size() + 1));  // With NUL.
  CHECK(runtime::gpu::isPtx(text));
  auto cubin = runtime::gpu::linkPtxToCubin(text, 90, "twice");
  if (cubin.status().code() == ErrorCode::kNotFound) {
    WARN("skipped: " << cubin.status().message());
    return;
  }
  INFO(cubin.status().message());
  REQUIRE(cubin.hasValue());
  CHECK_FALSE(runtime::gpu::isPtx(*cubin));  // An ELF image the driver loads as is.
  CHECK(cubin->size() > 256);
  // PTX that does not link is an error with nvJitLink's log, naming the module.
  const std::string broken =
      ".version 9.0\n.target sm_80\n.address_size 64\n.visible .entry f( {\n";
  auto bad = runtime::gpu::linkPtxToCubin(std::as_bytes(std::span(broken.data(), broken.size())),
                                          90, "broken");
  CHECK(bad.status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Catch::Contains("module 'broken'"));
  CHECK_THAT(bad.status().message(), Catch::Contains("sm_90"));
}
