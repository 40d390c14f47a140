// A model run in stages (ir/staging.h): where an op's output size depends on values (ONNX
// NonZero), or its control flow does (an If's condition, a Loop's trip count), the frontend ends
// a stage; StagedModule runs each stage compiled (or eagerly), takes the size or value from the
// values the stage produced (runtime::valueSizedCount) and has the frontend make the next stage
// for it. Each stage is made and compiled once per input types and sizes
// and cached: a new count of non-zeros is a new compile of the stages after it (as a new input
// shape is for kiln::jit), up to `cacheLimit` stages kept (the least recently used evicted).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "ir/staging.h"
#include "runtime/eager.h"

namespace kiln::compiler {

// Thread-safe: calls may come from many threads at once (a stage is made and compiled once,
// outside the module's lock, while its other callers wait on it; compiled stages run
// concurrently, eager ones each on the call's own executor).
class StagedModule {
 public:
  // `eager`: each stage runs op by op on options.backend (the CPU when null), with the
  // backend's own kernels where it has them (useDeviceKernels), instead of compiled.
  StagedModule(ir::StagedModel model, CompileOptions options = {}, bool eager = false,
               size_t cacheLimit = 64);
  ~StagedModule();

  Expected<std::vector<runtime::Tensor>> operator()(std::span<const runtime::Tensor> inputs);

  int stagesMade() const;  // Stages imported (and compiled) so far, over every call.
  // One line per stage made: where it begins, its sizes, and what it computes.
  std::vector<std::string> log() const;

 private:
  struct Entry;
  Expected<std::shared_ptr<Entry>> stageFor(int64_t begin,
                                            const std::map<std::string, runtime::Tensor>& env,
                                            const std::map<std::string, int64_t>& sizes,
                                            const std::map<std::string, ir::TensorData>& known);
  ir::StagedModel model_;
  CompileOptions options_;
  bool eager_;
  size_t limit_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> cache_;
  std::vector<std::string> order_;  // Cache keys, least recently used first.
  int made_ = 0;
  std::vector<std::string> log_;
};

}  // namespace kiln::compiler
