// cuBLASLt and cuDNN for the real device (cuda_driver.cpp), both loaded with dlopen: kiln's library
// descriptors (library_call.h) become cublasLtMatmul and cudnnConvolution*Forward calls on the
// caller's stream, epilogues included. fp32 stays fp32 (CUBLAS_COMPUTE_32F, CUDNN_FMA_MATH) unless
// a descriptor asks for TF32 (--precision tf32). A call the libraries cannot express (asymmetric
// padding, a scaled bias row) is kUnimplemented before it writes anything, and the backend runs
// that op on the host instead.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>

#include "runtime/gpu/device_api.h"

namespace kiln::runtime::gpu {

class CudaLibraries {
 public:
  virtual ~CudaLibraries() = default;
  // `stream` is the CUstream.
  virtual Status run(const LibraryCall& call, std::span<const DevicePtr> operands,
                     void* stream) = 0;
  // Runs tiny convolutions and products with a ReLU epilogue on `dev` over NaN, once per process:
  // neither library documents whether its fused ReLU keeps NaN (kiln's rule), so a fused path
  // that does not is replaced by cuDNN's NaN-propagating activation after the call. Returns one
  // line saying what it found (for KILN_LOG and `kiln info`).
  virtual std::string checkFusedRelu(DeviceApi& dev) = 0;
  // cuDNN's forward algorithms for `c` that fit the workspace, in its heuristic's order, FFT and
  // non-fused Winograd left out (ConvAlgo).
  virtual std::vector<ConvAlgo> convAlgorithms(const ConvDescriptor& c) = 0;
  // After checkFusedRelu: false for a GELU epilogue that did not match kiln's formula in every
  // dtype (DeviceApi::takesEpilogue).
  virtual bool takesEpilogue(const LibraryEpilogue& e) const = 0;
};

// dlopen's a CUDA library by soname, then from the toolkit's library directory (not always on the
// loader's path); null with the reasons appended to `tried`.
void* openCudaLibrary(const char* soname, std::string& tried);

// Loads libcublasLt.so.13 and libcudnn.so.9 and creates their handles in the current CUDA
// context; `workspace(stream, bytes)` returns device scratch memory of at least that size for
// work on that stream (kept by the caller; streams never share one). kNotFound naming what is
// missing.
using WorkspaceFn = std::function<Expected<DevicePtr>(void* stream, size_t bytes)>;
Expected<std::unique_ptr<CudaLibraries>> openCudaLibraries(WorkspaceFn workspace);

}  // namespace kiln::runtime::gpu
