// Convolution algorithm choice (the conv-algorithm-selection pass's chooser): each candidate
// algorithm of one conv2d is timed on the target backend, through its stream, on data of the
// conv's real shape and layout, and the fastest is cached on disk by shape, attributes, layout,
// backend, CPU and library version.
#pragma once

#include <functional>

#include "codegen/kernel_cache.h"
#include "passes/pass.h"
#include "runtime/backend.h"

namespace kiln::compiler {

struct ConvTuning {
  runtime::Backend& backend;
  bool autotune = false;  // Off: the library's default ("auto") without timing.
  codegen::KernelCache& cache;
  std::function<void(const Status&)> stored;  // Told of every cache store (failures matter).
  bool tf32 = false;                          // Timed as the plan will run them.
};

Expected<passes::AlgorithmChoice> chooseConvAlgorithm(const ir::Node& conv, const ConvTuning& t);

}  // namespace kiln::compiler
