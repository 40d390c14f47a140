// An execution plan and its executor: the linear schedule a compiled model runs. Each step
// is a generated kernel, a reference/library kernel call or a copy; every intermediate lives
// at a fixed offset of one arena allocated once. Plans are built by the compiler (JIT) and,
// later, loaded from artifacts; executing one needs only the runtime.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "runtime/library/kernels.h"
#include "runtime/tensor.h"

namespace kiln::runtime {

class LoadedObjects;

// The process's one thread count: kiln's kernels, oneDNN and OpenBLAS share an OpenMP pool.
void setNumThreads(int threads);
int numThreads();

// Where a value lives while a plan runs.
struct BufferRef {
  enum class Kind : uint8_t { kInput, kParameter, kArena, kOutput };
  Kind kind = Kind::kArena;
  int index = 0;       // Input, parameter or output number.
  int64_t offset = 0;  // Byte offset into the arena.
  ir::TensorType type;
};

// The CPU kernel ABI (codegen/render.h): work units [begin, end) of `units`.
using KernelFn = void (*)(void* const* args, long long begin, long long end);

struct PlanStep {
  enum class Kind : uint8_t { kKernel, kOp, kCopy };
  Kind kind = Kind::kOp;
  std::string name;  // Kernel symbol, or the node's description.
  std::vector<BufferRef> inputs;
  std::vector<BufferRef> outputs;
  // kKernel:
  KernelFn fn = nullptr;
  int64_t units = 0;
  int64_t elements = 0;  // Work size, to decide whether threads pay off.
  // kOp: one op on its library kernel (with post-ops and options) or its reference kernel.
  ir::OpKind op = ir::OpKind::kAdd;
  ir::AttrMap attrs;
  bool library = false;         // Through runLibraryWithPostOps; else libraryKernel/reference.
  std::vector<PostOp> postOps;  // kAdd post-ops read the last `numExtra` inputs.
  int numExtra = 0;
  LibraryOptions libraryOptions;  // Its cache is the executor's.
};

struct Plan {
  std::vector<ir::TensorType> inputs;
  std::vector<std::string> inputNames;
  std::vector<ir::TensorType> outputs;
  // Per output: the parameter it is written over in place (run() returns a view of it), or -1.
  std::vector<int> outputParameter;
  std::vector<ir::TensorData> parameters;
  std::vector<PlanStep> steps;
  int64_t arenaBytes = 0;
  std::shared_ptr<LoadedObjects> code;  // Keeps the kernels' machine code alive.
};

struct PlanRunStats {
  double totalMs = 0;
  int64_t kernelSteps = 0;     // Generated kernels.
  int64_t opSteps = 0;         // Library and reference calls.
  std::vector<double> stepMs;  // Per step, when profiling.
};

class PlanExecutor {
 public:
  // `threads` <= 0: OpenMP's default (OMP_NUM_THREADS or all cores).
  explicit PlanExecutor(std::shared_ptr<const Plan> plan, int threads = 0);

  // Checks inputs against the plan (count, dtype, shape; errors name the input) and runs it.
  Expected<std::vector<Tensor>> run(std::span<const Tensor> inputs);
  const PlanRunStats& lastStats() const { return stats_; }
  const Plan& plan() const { return *plan_; }
  // Records each step's wall time in lastStats().stepMs (the profiler).
  void setProfiling(bool on) { profiling_ = on; }
  // Drops the weights reordered for library kernels: call it after changing parameters in
  // place (a training step's write-back).
  void clearLibraryCache() { cache_->clear(); }

 private:
  std::shared_ptr<const Plan> plan_;
  int threads_;
  std::unique_ptr<LibraryCache> cache_;  // Reordered constant weights, for this plan only.
  // Uninitialized: pages are committed when steps first write them, not at construction.
  std::unique_ptr<std::byte[]> arenaStorage_;
  std::byte* arena_ = nullptr;
  PlanRunStats stats_;
  bool profiling_ = false;
};

}  // namespace kiln::runtime
