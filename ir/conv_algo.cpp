#include "ir/conv_algo.h"

namespace kiln::ir {

std::string_view convAlgoName(ConvAlgo algo) {
  switch (algo) {
    case ConvAlgo::kAuto:
      return "auto";
    case ConvAlgo::kDirect:
      return "direct";
    case ConvAlgo::kWinograd:
      return "winograd";
    case ConvAlgo::kIm2colGemm:
      return "im2col_gemm";
    case ConvAlgo::kCudnnImplicitGemm:
      return "cudnn_implicit_gemm";
    case ConvAlgo::kCudnnImplicitPrecompGemm:
      return "cudnn_implicit_precomp_gemm";
    case ConvAlgo::kCudnnGemm:
      return "cudnn_gemm";
    case ConvAlgo::kCudnnDirect:
      return "cudnn_direct";
    case ConvAlgo::kCudnnWinograd:
      return "cudnn_winograd";
    case ConvAlgo::kCudnnBwdData1:
      return "cudnn_bwd_data_1";
    case ConvAlgo::kCudnnBwdDataWinograd:
      return "cudnn_bwd_data_winograd";
    case ConvAlgo::kCudnnBwdFilter1:
      return "cudnn_bwd_filter_1";
  }
  return "?";
}

std::optional<ConvAlgo> parseConvAlgo(std::string_view name) {
  for (int a = 0; a <= static_cast<int>(ConvAlgo::kLast); ++a)
    if (convAlgoName(static_cast<ConvAlgo>(a)) == name) return static_cast<ConvAlgo>(a);
  return std::nullopt;
}

}  // namespace kiln::ir
