// The versions of the math libraries the runtime calls (oneDNN, OpenBLAS), for cache keys of
// decisions that depend on them (autotuned convolution algorithms).
#pragma once

#include <string>

namespace kiln::runtime {

std::string libraryIdentity();  // "onednn 2.6.3 (hash) openblas 0.3.21 ..."

}  // namespace kiln::runtime
