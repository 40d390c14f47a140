// CUDA C source -> PTX through NVRTC, with ptxas's per-kernel resource report on request.
// Needs no GPU and no driver; without the CUDA toolkit at build time every call is an error.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ir/status.h"

namespace kiln::codegen {

// True when kiln was built with NVRTC (the CUDA toolkit was found).
bool cudaCompilerAvailable();

// NVRTC's version ("13.0"), or the reason it is unavailable.
std::string cudaCompilerIdentity();

// What ptxas reports for one __global__ function.
struct KernelResources {
  std::string name;  // As in the PTX (mangled unless the kernel is extern "C").
  int registers = 0;
  int barriers = 0;
  long sharedBytes = 0;  // Static shared memory.
  long stackBytes = 0;
  long spillStoreBytes = 0;
  long spillLoadBytes = 0;
};

struct CudaCompileOptions {
  // Also run ptxas (compile for sm_XX, not only compute_XX) to fill CudaPtx::resources and
  // CudaPtx::cubin. Costs about twice the time of PTX alone.
  bool resourceUsage = false;
  // More NVRTC options (e.g. "-lineinfo", "--use_fast_math" for a kernel that opts in).
  std::vector<std::string> extraOptions;
};

struct CudaPtx {
  std::string ptx;
  std::string name;
  int smArch = 0;
  std::string log;                         // NVRTC's log (warnings; ptxas -v when requested).
  std::vector<KernelResources> resources;  // Empty unless resourceUsage.
  std::string cubin;                       // The sm_XX binary, only with resourceUsage.
  double compileMs = 0;
};

// Compiles `source` (CUDA C++17; kernels should be extern "C" __global__) for the virtual
// architecture compute_<smArch>. `name` is the file name NVRTC's messages use. The toolkit's
// include directory is on the include path when it exists, for cuda_fp16.h and friends.
// Errors: kInvalidArgument with NVRTC's log for a compile error or an architecture NVRTC does
// not support; kUnimplemented when kiln was built without the CUDA toolkit.
Expected<CudaPtx> compileCuda(std::string_view source, std::string_view name, int smArch,
                              const CudaCompileOptions& options = {});

// Parses ptxas -v output ("ptxas info : Used 10 registers, ...") into one entry per kernel.
std::vector<KernelResources> parsePtxasInfo(std::string_view log);

}  // namespace kiln::codegen
