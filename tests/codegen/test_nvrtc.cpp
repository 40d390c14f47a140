// CUDA C -> PTX through NVRTC for sm_80 and sm_90 (no GPU needed), ptxas resource reports,
// and compile errors carrying NVRTC's log.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "codegen/nvrtc_compiler.h"

using kiln::ErrorCode;
using kiln::codegen::compileCuda;
using kiln::codegen::CudaCompileOptions;
using kiln::codegen::cudaCompilerAvailable;
using kiln::codegen::KernelResources;

namespace {

const char* kElementwise = R"(
extern "C" __global__ void add_relu(const float* a, const float* b, float* out, long n) {
  long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
  if (i < n) out[i] = fmaxf(a[i] + b[i], 0.0f);
}
)";

const char* kBlockReduce = R"(
extern "C" __global__ void block_sum(const float* in, float* out, int n) {
  __shared__ float partial[256];
  int t = threadIdx.x;
  float v = 0.0f;
  for (int i = blockIdx.x * blockDim.x + t; i < n; i += gridDim.x * blockDim.x) v += in[i];
  partial[t] = v;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (t < s) partial[t] += partial[t + s];
    __syncthreads();
  }
  if (t == 0) atomicAdd(out, partial[0]);
}
)";

bool skipWithoutNvrtc() {
  if (cudaCompilerAvailable()) return false;
  WARN(
      "SKIPPED: kiln was built without the CUDA toolkit, so NVRTC tests cannot run; install "
      "CUDA (nvrtc) and reconfigure to run them");
  return true;
}

const KernelResources* findKernel(const std::vector<KernelResources>& ks, const std::string& n) {
  for (const auto& k : ks) {
    if (k.name == n) return &k;
  }
  return nullptr;
}

}  // namespace

TEST_CASE("nvrtc: without the toolkit compiling is a clear unimplemented error") {
  if (cudaCompilerAvailable()) {
    CHECK(kiln::codegen::cudaCompilerIdentity().rfind("nvrtc ", 0) == 0);
    return;
  }
  auto ptx = compileCuda(kElementwise, "add_relu.cu", 80);
  REQUIRE_FALSE(ptx.hasValue());
  CHECK(ptx.status().code() == ErrorCode::kUnimplemented);
  CHECK(ptx.status().message().find("built without the CUDA toolkit") != std::string::npos);
}

TEST_CASE("nvrtc: elementwise and block-reduction kernels compile to PTX for sm_80 and sm_90") {
  if (skipWithoutNvrtc()) return;
  for (int arch : {80, 90}) {
    for (const auto& [name, source] :
         {std::pair{"add_relu", kElementwise}, std::pair{"block_sum", kBlockReduce}}) {
      auto ptx = compileCuda(source, std::string(name) + ".cu", arch);
      INFO(ptx.status().message());
      REQUIRE(ptx.hasValue());
      CHECK(ptx->smArch == arch);
      CHECK(ptx->ptx.find(".target sm_" + std::to_string(arch)) != std::string::npos);
      CHECK(ptx->ptx.find(".entry " + std::string(name)) != std::string::npos);
      CHECK(ptx->ptx.back() != '\0');
      CHECK(ptx->resources.empty());
      CHECK(ptx->cubin.empty());
      std::printf("[codegen] NVRTC %s -> PTX sm_%d: %.1f ms\n", name, arch, ptx->compileMs);
    }
  }
}

TEST_CASE("nvrtc: resource usage comes from ptxas") {
  if (skipWithoutNvrtc()) return;
  CudaCompileOptions options;
  options.resourceUsage = true;
  auto out = compileCuda(std::string(kElementwise) + kBlockReduce, "both.cu", 90, options);
  INFO(out.status().message());
  REQUIRE(out.hasValue());
  CHECK(!out->cubin.empty());
  CHECK(out->ptx.find(".entry block_sum") != std::string::npos);
  REQUIRE(out->resources.size() == 2);
  const KernelResources* reduce = findKernel(out->resources, "block_sum");
  const KernelResources* add = findKernel(out->resources, "add_relu");
  REQUIRE(reduce != nullptr);
  REQUIRE(add != nullptr);
  CHECK(reduce->registers > 0);
  CHECK(reduce->sharedBytes == 256 * 4);
  CHECK(reduce->barriers == 1);
  CHECK(add->registers > 0);
  CHECK(add->sharedBytes == 0);
  CHECK(add->spillStoreBytes == 0);
  std::printf(
      "[codegen] NVRTC -> PTX + cubin sm_90 with ptxas -v: %.1f ms; block_sum uses %d "
      "registers, add_relu %d\n",
      out->compileMs, reduce->registers, add->registers);
}

TEST_CASE("nvrtc: a syntax error returns NVRTC's log with the line") {
  if (skipWithoutNvrtc()) return;
  const char* bad = "extern \"C\" __global__ void f(float* a) {\n  a[0] = ;\n}\n";
  auto ptx = compileCuda(bad, "bad_kernel.cu", 80);
  REQUIRE_FALSE(ptx.hasValue());
  CHECK(ptx.status().code() == ErrorCode::kInvalidArgument);
  INFO(ptx.status().message());
  CHECK(ptx.status().message().find("bad_kernel.cu(2): error") != std::string::npos);
  CHECK(ptx.status().message().find("expected an expression") != std::string::npos);
}

TEST_CASE("nvrtc: an architecture NVRTC does not support is rejected with the list") {
  if (skipWithoutNvrtc()) return;
  auto ptx = compileCuda(kElementwise, "add_relu.cu", 70);
  REQUIRE_FALSE(ptx.hasValue());
  CHECK(ptx.status().code() == ErrorCode::kInvalidArgument);
  CHECK(ptx.status().message().find("sm_70") != std::string::npos);
  CHECK(ptx.status().message().find("90") != std::string::npos);
}

TEST_CASE("nvrtc: toolkit headers such as cuda_fp16.h are found") {
  if (skipWithoutNvrtc()) return;
  const char* half =
      "#include <cuda_fp16.h>\n"
      "extern \"C\" __global__ void h(__half* a) {\n"
      "  a[threadIdx.x] = __hadd(a[threadIdx.x], a[0]);\n}\n";
  auto ptx = compileCuda(half, "half.cu", 80);
  INFO(ptx.status().message());
  CHECK(ptx.hasValue());
}

TEST_CASE("nvrtc: ptxas -v output parses into per-kernel resources") {
  const char* log = R"(ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'red' for 'sm_80'
ptxas info    : Function properties for red
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 10 registers, used 1 barriers, 1024 bytes smem, 372 bytes cmem[0]
ptxas info    : Compile time = 6.975 ms
ptxas info    : Function properties for helper
ptxas         .     16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'add' for 'sm_80'
ptxas info    : Function properties for add
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 7 registers, used 0 barriers, 376 bytes cmem[0]
)";
  auto ks = kiln::codegen::parsePtxasInfo(log);
  REQUIRE(ks.size() == 2);  // "helper" is a device function, not a kernel.
  CHECK(ks[0].name == "red");
  CHECK(ks[0].registers == 10);
  CHECK(ks[0].barriers == 1);
  CHECK(ks[0].sharedBytes == 1024);
  CHECK(ks[0].stackBytes == 8);
  CHECK(ks[0].spillStoreBytes == 4);
  CHECK(ks[0].spillLoadBytes == 12);
  CHECK(ks[1].name == "add");
  CHECK(ks[1].registers == 7);
  CHECK(ks[1].sharedBytes == 0);
  CHECK(kiln::codegen::parsePtxasInfo("").empty());
}
