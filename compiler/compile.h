// The compiler driver: pass pipeline -> fusion -> lowering of each group to a generated
// kernel (or a library/reference call) -> linear schedule -> memory planning -> a runtime
// Plan, wrapped as a CompiledModel. Kernels are compiled in-process (Clang + ORC) on worker
// threads and cached on disk.
#pragma once

#include <memory>
#include <ostream>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ir/flops.h"
#include "ir/graph.h"
#include "passes/fusion.h"
#include "runtime/artifact.h"
#include "runtime/plan.h"

namespace kiln::compiler {

// The arithmetic of convolutions and matrix products (--precision): fp32, the default (fp32
// products, no TF32 anywhere); tf32 (multiplicands rounded to TF32 on a GPU's tensor cores, fp32
// accumulation: PyTorch's allow_tf32); bf16 or fp16, autocast as torch.autocast does it:
// matmuls and convolutions (ops with ir::kAutocast) read their operands in the low-precision
// type and accumulate in f32, their results are rounded to it once and read back as f32, and
// every other op (pointwise, reductions, softmax, normalization) computes in f32.
enum class Precision : uint8_t { kFp32, kTf32, kBf16, kFp16 };
std::string_view precisionName(Precision p);
// "fp32", "tf32", "bf16" or "fp16"; kInvalidArgument naming the choices otherwise.
Expected<Precision> parsePrecision(std::string_view name);
// kInvalidArgument where `backend` cannot compute in `p` (tf32 without BackendCaps::tf32,
// bf16/fp16 without BackendCaps::lowPrecision).
Status checkPrecision(Precision p, const runtime::Backend& backend);
// Whether a GPU's products run on tensor cores under `p` (tf32, bf16, fp16; not fp32).
bool usesTensorCores(Precision p);
// The dtype autocast runs kAutocast ops in: bf16 or f16, or f32 where `p` is no autocast.
ir::DType autocastDType(Precision p);
// `g` as it runs under `p`: autocast applied for bf16/fp16 (in place, or to a copy). What an
// eager run under --precision executes, so that eager and compiled compute the same products.
Status applyPrecision(ir::Graph& g, Precision p);
Expected<ir::Graph> withPrecision(const ir::Graph& g, Precision p);

struct CompileOptions {
  bool inference = true;  // Fold weights into constants; dropout is the identity.
  // Graph outputs written over a parameter instead of into a result tensor: (output index,
  // parameter name). A training step's parameter and optimizer-state updates, in place. Honoured
  // where the step that produces the output runs after every other read of the parameter
  // (otherwise the output gets a result tensor of its own); run() then returns a view of the
  // parameter for it.
  std::vector<std::pair<size_t, std::string>> inPlaceOutputs;
  // Pipeline instrumentation (--disable-pass, --dump-after, --time-passes).
  std::set<std::string> disabledPasses;
  std::set<std::string> dumpAfter;
  bool timePasses = false;
  bool verifyEachPass = false;
  std::ostream* log = nullptr;  // Dumps, pass timings and progress go here.
  passes::FusionOptions fusion;
  // Library calls (oneDNN) take post-ops and channels-last activations: BN folding
  // then epilogue fusion and layout selection.
  bool libraryFusion = true;
  // Time each convolution's candidate algorithms on its real shape (cached on disk by shape,
  // attributes, CPU and library version); otherwise a heuristic picks.
  bool autotune = false;
  // Training: recompute pointwise values (a BatchNorm's ReLU) in the backward pass from values
  // it keeps anyway instead of keeping them from the forward pass: less memory, one more pass
  // over each (the rematerialize pass; kiln train --recompute).
  bool recompute = false;
  bool useCache = true;       // --no-cache turns it off.
  std::string cacheDir;       // Empty: $KILN_CACHE_DIR or ~/.cache/kiln.
  int kernelsPerModule = 12;  // Kernels per translation unit (compiled in parallel).
  int compileThreads = 0;     // 0: one per core.
  int runThreads = 0;         // 0: OpenMP's default.
  // The CPU generated kernels are compiled for (codegen::resolveCpuTarget): empty takes
  // $KILN_TARGET_CPU, else "native"; a named CPU ("x86-64-v3") makes code that runs on every
  // machine with its features (portable artifacts).
  std::string targetCpu;
  // Bound on the model's memory (weights, and per call its arena and outputs), 0 for none:
  // compile fails before any arena is allocated when one call does not fit, naming the
  // amounts; concurrent calls beyond what fits wait (runtime::PlanExecutor::limitMemory).
  int64_t maxMemoryBytes = 0;
  // The backend the plan runs on (runtime::findBackend); null: runtime::defaultBackend(), the
  // CPU. Its capabilities decide what the plan builder emits: generated kernels where it
  // loads their code, library calls (with post-ops and channels-last activations) where its
  // library registry has them, reference op calls otherwise.
  std::shared_ptr<runtime::Backend> backend;
  // On a backend whose streams capture (cuda, emu): replay each call's steps as a CUDA graph
  // recorded at the first call (runtime::PlanExecutor::setGraphs); --no-cuda-graph turns it off.
  bool cudaGraphs = true;
  // Library calls' arithmetic; tf32 needs a backend with BackendCaps::tf32 (cuda, emu).
  Precision precision = Precision::kFp32;
  // Also render every kernel as CUDA C and compile it with NVRTC for sm_80 and sm_90 (a
  // check on machines without a GPU; the PTX is kept in the report).
  bool cudaCheck = false;
};

struct KernelSource {
  std::string name;
  std::string module;
  // "pointwise", "reduction", "view", "horizontal" (codegen::Kernel::parts) or "op" (an op
  // kernel: codegen/op_kernels.h).
  std::string group;
  std::string cpp;   // The kernel alone (without the prelude).
  std::string cuda;  // When cudaCheck.
  // The plan steps calling it: more than one where kernels that differ only in their names
  // share it (a repeated layer, an unrolled recurrence).
  int steps = 1;
};

// What one plan step computes, for profiles: its ops in order, each once ("conv2d+add+relu"),
// and their work.
struct StepWork {
  std::string ops;
  ir::WorkCount work;
  std::string firstNode;  // The name of its first node (a training step's phase: train.h).
};

struct CompileReport {
  double totalMs = 0, passesMs = 0, fusionMs = 0, codegenMs = 0, compileMs = 0, planMs = 0;
  // Library primitives created and weights reordered ahead of the first run
  // (runtime::PlanExecutor::prepare).
  double prepareMs = 0;
  int nodesIn = 0;           // Nodes of the graph handed to compile.
  int nodesOptimized = 0;    // After the pass pipeline.
  int generatedKernels = 0;  // Kernel steps of the plan.
  int compiledKernels = 0;   // The functions they call: kernels equal but for names share one.
  int referenceSteps = 0;    // Library and reference calls.
  int hostSteps = 0;         // Of those, on a GPU backend: ops run on the host (no device kernel).
  std::string precision = "fp32";  // CompileOptions::precision.
  int copySteps = 0;
  int aliases = 0;  // Reshapes and contiguous slices that became views of their input (no step).
  int modules = 0;
  int cacheHits = 0;
  int cacheMisses = 0;
  std::vector<std::string> cacheExplanations;  // One line per module.
  std::string fusionExplanation;
  std::vector<std::string> remarks;           // Passes' and lowering's notes.
  std::vector<std::string> algorithmChoices;  // One line per conv2d (--explain-algos).
  int layoutConversions = 0;
  std::vector<KernelSource> kernels;  // One per compiled function.
  int64_t arenaBytes = 0;
  int64_t arenaLowerBound = 0;
  int inplaceReuses = 0;
  int64_t parameterBytes = 0;
  int cudaKernelsChecked = 0;
  std::vector<StepWork> stepWork;       // Per plan step (empty for a loaded artifact's plan).
  std::vector<std::string> cudaErrors;  // NVRTC failures (should be empty).
};

// The generated code as compiled: what an AOT artifact keeps besides the plan.
struct CompiledCode {
  std::vector<runtime::ArtifactModule> modules;          // Source and object of each kernel module.
  std::string triple, cpu, features;                     // What the objects were compiled for.
  std::vector<std::pair<std::string, std::string>> ptx;  // ("sm_80", PTX) when cudaCheck.
  // For a GPU: every kernel in one cubin per architecture of sm_80 and sm_90 other than the
  // device's, so that an artifact runs on those GPUs without a JIT (when cudaCheck).
  std::vector<std::pair<std::string, std::vector<std::byte>>> cubins;
};

// A compiled model. Thread-safe: run() may be called from many threads at once (each call
// has its own scratch arena and statistics; see runtime::PlanExecutor), except that a model
// whose plan writes its parameters in place (a training step) runs one call at a time.
class CompiledModel {
 public:
  CompiledModel(std::shared_ptr<const runtime::Plan> plan, CompileReport report, int threads,
                std::shared_ptr<const CompiledCode> code = {},
                std::shared_ptr<const ir::Graph> optimized = {});
  // `stats`, when given, receives this call's statistics; `afterStep` (runtime::StepHook), when
  // given, is called after each step.
  Expected<std::vector<runtime::Tensor>> run(std::span<const runtime::Tensor> inputs,
                                             runtime::PlanRunStats* stats = nullptr,
                                             const runtime::StepHook* afterStep = nullptr);
  // runtime::PlanExecutor::runOnDevice: inputs and outputs in the backend's memory.
  Expected<std::vector<runtime::DeviceBuffer>> runOnDevice(
      std::span<const runtime::DeviceTensor> inputs, uintptr_t waitFor = 0) {
    return exec_.runOnDevice(inputs, waitFor);
  }
  const CompileReport& report() const { return report_; }
  // runtime::PlanExecutor::prepare, timed into the report (compile() calls it).
  Status prepare();
  const runtime::Plan& plan() const { return *plan_; }
  // The statistics of the call that finished last (a copy; any thread's call).
  runtime::PlanRunStats lastStats() const { return exec_.lastStats(); }
  void setProfiling(bool on) { exec_.setProfiling(on); }
  void setGraphs(bool on) { exec_.setGraphs(on); }
  int64_t graphsCaptured() const { return exec_.graphsCaptured(); }
  int64_t exactReruns() const { return exec_.exactReruns(); }
  // After the parameters' bytes changed in place (training): forget reordered weights. Waits
  // for calls in progress.
  void parametersChanged() { exec_.clearLibraryCache(); }
  // Scratch arenas held: the most calls that ever ran at once (each plan().arenaBytes).
  size_t arenasAllocated() const { return exec_.arenasAllocated(); }
  size_t reorderedWeightBytes() const { return exec_.reorderedWeightBytes(); }
  Status limitMemory(int64_t limitBytes) { return exec_.limitMemory(limitBytes); }
  const CompiledCode& code() const { return *code_; }
  // The graph after the pass pipeline, as the plan runs it.
  const ir::Graph& optimizedGraph() const { return *optimized_; }

 private:
  std::shared_ptr<const runtime::Plan> plan_;
  CompileReport report_;
  std::shared_ptr<const CompiledCode> code_;
  std::shared_ptr<const ir::Graph> optimized_;
  runtime::PlanExecutor exec_;
};

Expected<std::unique_ptr<CompiledModel>> compile(const ir::Graph& graph,
                                                 const CompileOptions& options = {});

// Whether CompileOptions::targetCpu names a target (see codegen::resolveCpuTarget); the error
// lists the accepted names.
Status checkTargetCpu(std::string_view name);

}  // namespace kiln::compiler
