// The algorithms the `algo` attribute of conv2d and its gradients names: the CPU library's and
// cuDNN's. Every one gives the reference's result within f32 rounding (winograd within 1e-4 of
// max |y|, the others 1e-5); they differ in speed only. The compiler's algorithm choice picks among
// those a backend offers (Backend::libraryAlgorithms) and the library call follows the attribute.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace kiln::ir {

enum class ConvAlgo : uint8_t {
  kAuto,        // oneDNN direct (brgconv); the algorithm-choice pass may pick better.
  kDirect,      // oneDNN convolution_direct.
  kWinograd,    // oneDNN convolution_winograd, where oneDNN implements the shape.
  kIm2colGemm,  // kiln's im2col (skipped for 1x1 stride-1 unpadded convs) + sgemm.
  // cuDNN's forward algorithms (the CUDA backend; runtime/gpu/cuda_libraries.cpp). FFT and
  // non-fused Winograd are left out: their error exceeds the 1e-4 kiln allows an algorithm.
  kCudnnImplicitGemm,
  kCudnnImplicitPrecompGemm,
  kCudnnGemm,
  kCudnnDirect,
  kCudnnWinograd,
  // cuDNN's deterministic gradient algorithms (the same step gives the same update):
  // CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 and _WINOGRAD, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1.
  kCudnnBwdData1,
  kCudnnBwdDataWinograd,
  kCudnnBwdFilter1,
  kLast = kCudnnBwdFilter1,
};
// "auto", "direct", "winograd", "im2col_gemm", "cudnn_implicit_gemm", ...
std::string_view convAlgoName(ConvAlgo algo);
std::optional<ConvAlgo> parseConvAlgo(std::string_view name);  // nullopt: unknown
inline bool isCudnnConvAlgo(ConvAlgo a) {
  return a >= ConvAlgo::kCudnnImplicitGemm;
}

}  // namespace kiln::ir
