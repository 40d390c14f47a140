// The version of the math library the runtime calls (oneDNN, and how lib::sgemm uses it), for
// keys of decisions that depend on it (autotuned convolution algorithms).
#pragma once

#include <string>

namespace kiln::runtime {

std::string libraryIdentity();  // "onednn 2.6.3 (hash) sgemm-blocks"

}  // namespace kiln::runtime
