// The kernel math prelude: one header of scalar functions (exp, erf, gelu, sigmoid, NaN-aware
// max, ...) that every generated kernel includes, compiled by both Clang (C++ for the CPU)
// and NVRTC (CUDA C). The dialects differ only in the few lines that map to their builtins.
#pragma once

#include <string_view>

namespace kiln::codegen {

std::string_view kernelPrelude();

}  // namespace kiln::codegen
