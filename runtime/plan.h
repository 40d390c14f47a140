// An execution plan and its executor: the linear schedule a compiled model runs. Each step
// is a generated kernel, a reference/library kernel call or a copy; every intermediate lives
// at a fixed offset of one arena allocated once. Plans are built by the compiler (JIT) and,
// later, loaded from artifacts; executing one needs only the runtime.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/index_word.h"
#include "runtime/backend.h"
#include "runtime/library/kernels.h"
#include "runtime/tensor.h"

namespace kiln::runtime {

// Where a value lives while a plan runs.
struct BufferRef {
  enum class Kind : uint8_t { kInput, kParameter, kArena, kOutput };
  Kind kind = Kind::kArena;
  int index = 0;       // Input, parameter or output number.
  int64_t offset = 0;  // Byte offset into the arena.
  ir::TensorType type;
};

struct PlanStep {
  enum class Kind : uint8_t { kKernel, kOp, kCopy };
  Kind kind = Kind::kOp;
  std::string name;  // Kernel symbol, or the node's description.
  std::vector<BufferRef> inputs;
  std::vector<BufferRef> outputs;
  // kKernel: an entry point of the plan's KernelModule (on the CPU, the kernel ABI of
  // codegen/render.h: work units [begin, end) of `units`).
  const void* kernel = nullptr;
  int64_t units = 0;
  int64_t elements = 0;  // Work size, to decide whether threads pay off.
  // A CPU reduction split in chunks of rows (codegen::cpuRowSplit): the bytes of partial
  // results passed after the arguments, combined by a last call with begin = units; else 0.
  int64_t scratchBytes = 0;
  // CUDA code: threads per block and blocks (codegen::cudaLaunchGeometry); 0 elsewhere.
  int block = 0;
  int64_t grid = 0;
  // kOp: one op on its library kernel (with post-ops and options) or its reference kernel.
  ir::OpKind op = ir::OpKind::kAdd;
  ir::AttrMap attrs;
  bool library = false;         // Through runLibraryWithPostOps; else libraryKernel/reference.
  std::vector<PostOp> postOps;  // kAdd post-ops read the last `numExtra` inputs.
  int numExtra = 0;
  LibraryOptions libraryOptions;  // Its cache is the executor's.
};

// Indices that a step reads without checking them itself (a GPU's op kernel):
//   kClass     a loss's targets, each in [0, limit) or equal to `ignore`;
//   kPosition  positions along dim `axis` (of size `limit`) of a gather's data, whose type is
//              `data`: each in [-limit, limit), negatives counting from the end;
//   kResolved  a scatter's indices, resolved as its reference kernel reads them: index i is
//              component c = i % limits.size() of a tuple, in [-limits[c], limits[c]) along
//              dim dims[c] (checkResolvedIndices);
//   kNonZero   an integer div's or mod's divisor, whose type is `data`: every element non-zero
//              (checkNonZeroDivisor; `limit` 1).
// Plan::indexChecks holds graph inputs (`input`): run() checks host inputs before any step, with
// the reference kernels' error (checkIndices); runOnDevice() cannot read device inputs, so there
// an index out of range gives NaN (a loss) or a filler (a gather: NaN, -1 for integers, false),
// never a read outside the data.
// Plan::deviceIndexChecks holds indices the graph computes: the step's kernel checks them itself
// and reports the first one out of range (the lowest flat position) in the run's index word of
// the check (IndexWord), which the run reads after its steps and turns into the reference
// kernel's error (deviceIndexError); what the steps wrote is then discarded.
struct IndexCheck {
  enum class Kind : uint8_t { kClass, kPosition, kResolved, kNonZero };
  Kind kind = Kind::kClass;
  int input = 0;  // indexChecks: the plan's input.
  int64_t limit = 0;
  int64_t ignore = 0;  // kClass.
  int axis = 0;        // kPosition.
  std::string op;      // The op that reads them ("cross_entropy_loss"), for the error.
  // The type, for the error: kPosition the data's ("f32[30522,768]"); kClass, in
  // deviceIndexChecks, the target's ("i64[32]").
  std::string data;
  std::string where;            // deviceIndexChecks: the node that reads them, the error's context.
  std::vector<int64_t> limits;  // kResolved.
  std::vector<int> dims;        // kResolved.
};

// The reference kernels' check of `indices` (an input of the plan) against `c`.
Status checkIndices(const IndexCheck& c, const Tensor& indices);

// A device index check's word (its layout: ir/index_word.h, which the kernels' kiln_report_index
// is printed from).
struct IndexWord {
  static constexpr uint64_t kClear = ir::index_word::kClear;
  static constexpr int64_t kMaxPosition = ir::index_word::kMaxPosition;
  static constexpr uint64_t encode(int64_t position, int64_t value) {
    return ir::index_word::encode(position, value);
  }
  struct Report {
    int64_t position = 0, value = 0;
    bool positionSaturated = false;  // At kMaxPosition or beyond.
    bool valueSaturated = false;     // `value` is int32's bound, the index beyond it.
  };
  static Report decode(uint64_t word);
};
// The error of device check `c` whose word is `word` (kClear: ok): the reference kernel's words,
// in the context of `c.where`.
Status deviceIndexError(const IndexCheck& c, uint64_t word);

struct Plan {
  // Whether a step writes a parameter (a training step's in-place updates): such a plan runs
  // one call at a time.
  bool writesParameters() const;
  // Bytes of the weights (shared by every call), and what each call allocates: its arena and
  // its output tensors (outputs written over parameters excluded).
  int64_t parameterBytes() const;
  int64_t bytesPerCall() const;

  std::vector<ir::TensorType> inputs;
  std::vector<std::string> inputNames;
  std::vector<ir::TensorType> outputs;
  // Per output: the parameter it is written over in place (run() returns a view of it), or -1.
  std::vector<int> outputParameter;
  std::vector<ir::TensorData> parameters;
  // The parameters change between runs (a training step's, updated in place or by the caller):
  // no library call keeps a transform of them across runs (LibraryOptions::cache), which would
  // be made again at every run; calls that take weights in a transformed form transform them
  // within the call instead where that is cheaper (winograd convolutions).
  bool parametersVary = false;
  std::vector<PlanStep> steps;
  std::vector<IndexCheck> indexChecks;
  // Checked by the steps on the device, each into its u64 word (IndexWord) of the arena at
  // indexWordsOffset + 8 * its position here: the run sets them to kClear first and reads them
  // after its steps.
  std::vector<IndexCheck> deviceIndexChecks;
  int64_t indexWordsOffset = 0;
  int64_t arenaBytes = 0;
  // The backend the plan runs on (its kernels are loaded there); null: defaultBackend().
  std::shared_ptr<Backend> backend;
  std::shared_ptr<KernelModule> code;  // Keeps the kernels' code loaded.
};

struct PlanRunStats {
  double totalMs = 0;          // The run itself, after its threads were granted.
  double waitMs = 0;           // Waiting for compute threads (or for a serialized plan).
  int threads = 0;             // Compute threads the run was granted.
  int64_t kernelSteps = 0;     // Generated kernels.
  int64_t opSteps = 0;         // Library and reference calls.
  std::vector<double> stepMs;  // Per step, when profiling.
  // Per step, when profiling: when it started, from the start of the first step.
  std::vector<double> stepStartMs;
  bool graphCaptured = false;  // This call recorded the plan's steps into a graph.
  bool graphReplayed = false;  // The steps ran as a replayed graph.
  // The steps ran with relu and clip fused into library calls (LibraryOptions::fuseActivations),
  // and, where a NaN met one of them (the invalid flag), a second time without.
  bool fusedActivations = false;
  bool exactRerun = false;
  // Device time of the call's enqueued work (copies in, steps, copies out) by the stream's
  // timer (Stream::canTime: CUDA events); negative where the stream has none.
  double deviceMs = -1;
};

// Called after each step of a run was enqueued (on the CPU: has run) with the step's number, the
// run's stream and the addresses of the run's outputs (Plan::outputs' order), so that the caller
// can start work on outputs that are final while the later steps run: data-parallel training
// starts its gradient all-reduces this way (compiler/train.h). A run with a hook enqueues its
// steps one by one, never as a captured graph.
using StepHook =
    std::function<Status(size_t step, Stream& stream, std::span<const DeviceAddress> outputs)>;

// Runs a plan. Thread safety: run() may be called from many threads at once on one executor.
// Each call takes a scratch arena of its own from a pool (arenas are reused: the pool holds
// as many as calls ever ran at once), reads the weights shared and read-only, shares the
// reordered-weight cache (thread-safe), draws its threads through the backend's stream (the CPU's
// ComputeThreads) and returns its statistics through its own `stats`. A plan that writes its
// parameters in place (Plan::writesParameters, a training step) serializes its callers: one call at
// a time, the others wait. Outputs are new tensors per call, except outputs written over a
// parameter, which are views of it (such plans are serialized).
class PlanExecutor {
 public:
  // `threads` <= 0: the backend's default (the CPU: up to the whole ComputeThreads budget);
  // else at most that many per call.
  explicit PlanExecutor(std::shared_ptr<const Plan> plan, int threads = 0);
  ~PlanExecutor();

  // Does ahead what the first run would otherwise do on its way: maps the parameters to the
  // backend (and reads their pages), and creates every library step's primitive and reorders its
  // constant weights (LibraryOptions::prepare), validating each step's operands once, for the
  // thread count a run is granted now and for one thread (a run among others, or on a loaded
  // machine, gets one). Computes nothing and allocates nothing of the plan's size
  // (the first run takes its arena). compile() and load() call it, so that a model's first run
  // costs about what its later runs do. Thread-safe; a later call finds the primitives and
  // weights made.
  Status prepare();
  // Checks inputs against the plan (count, dtype, shape; errors name the input) and runs it.
  // `stats`, when given, receives this call's statistics; `afterStep`, when given, is called
  // after each step.
  Expected<std::vector<Tensor>> run(std::span<const Tensor> inputs, PlanRunStats* stats = nullptr,
                                    const StepHook* afterStep = nullptr);
  // run() on tensors in the backend's memory (a GPU's: another library's CUDA tensors, read
  // where they lie): checks them as run() does and returns each output in a buffer of its own
  // on the backend, the caller's. `waitFor`, when not 0, is a native stream of the backend's
  // device (CUDA: a CUstream, 1 the legacy default stream, 2 the per-thread default one, as
  // DLPack's `stream` argument) whose work enqueued so far this run waits for: where the inputs'
  // producer wrote them. Returns when the outputs are written (as run()), so a consumer on any
  // stream may read them. A plan that writes its parameters (a training step) is refused.
  Expected<std::vector<DeviceBuffer>> runOnDevice(std::span<const DeviceTensor> inputs,
                                                  uintptr_t waitFor = 0,
                                                  PlanRunStats* stats = nullptr);
  // A copy of the statistics of the call that finished last (any thread's).
  PlanRunStats lastStats() const;
  const Plan& plan() const { return *plan_; }
  // Records each step's wall time in the stats' stepMs (the profiler). Thread-safe. Profiled
  // calls run step by step, never as a graph.
  void setProfiling(bool on) { profiling_.store(on, std::memory_order_relaxed); }
  // On a backend whose streams capture (CUDA graphs; on by default): each slot (arena) records
  // the plan's steps once and replays them at every later call (TorchInductor's
  // "reduce-overhead"), the inputs and outputs copied through device buffers of its own. Off:
  // every call enqueues every step. Thread-safe.
  void setGraphs(bool on) { graphs_.store(on, std::memory_order_relaxed); }
  // Graphs recorded so far (one per slot, again after the parameters are mapped anew).
  int64_t graphsCaptured() const { return graphsCaptured_.load(std::memory_order_relaxed); }
  // Runs that fused relu and clip into library calls, met a NaN (the invalid flag) and ran again
  // without (PlanRunStats::exactRerun).
  int64_t exactReruns() const { return exactReruns_.load(std::memory_order_relaxed); }
  // Drops the weights reordered for library kernels, and the backend's copy of the parameters
  // where its memory is not the host's: call it after changing parameters in place (a training
  // step's write-back). Waits for calls in progress to finish.
  void clearLibraryCache();
  // Scratch arenas the pool holds (the most calls that ever ran at once), for tests and memory
  // reports: each is plan().arenaBytes.
  size_t arenasAllocated() const;
  // Weights reordered for library calls (a copy of each in its library's format, beside the
  // plan's own): what prepare() made and runs share.
  size_t reorderedWeightBytes() const;
  // Bounds the memory of this model to `limitBytes` (0: no bound): kResourceExhausted, naming
  // the amounts, when the weights and one call do not fit; otherwise at most as many calls run
  // at once as fit, and the others wait for a free arena. Call it before the first run.
  Status limitMemory(int64_t limitBytes);

 private:
  struct Slot;
  struct Arenas;
  class Occupancy;
  std::shared_ptr<const Plan> plan_;
  // A run's inputs and outputs: host tensors (run) or the backend's (runOnDevice).
  struct Io {
    std::span<const Tensor> hostIn;
    std::span<const DeviceTensor> deviceIn;
    uintptr_t waitFor = 0;
    std::vector<Tensor>* hostOut = nullptr;
    std::vector<DeviceBuffer>* deviceOut = nullptr;
  };
  Status execute(const Io& io, std::chrono::steady_clock::time_point waitStart, PlanRunStats* stats,
                 const StepHook* afterStep);
  Status mapParameters(Stream& stream);
  Status enqueueSteps(Stream& stream, const std::function<DeviceAddress(const BufferRef&)>& address,
                      bool profiling, PlanRunStats& stats, const StepHook* afterStep = nullptr,
                      bool fuseActivations = false);
  // A library or reference step's call, its weight cache set where its weights are constant.
  OpCall opCall(const PlanStep& s, bool fuseActivations = false) const;

  std::shared_ptr<Backend> backend_;
  int threads_;
  bool serialized_;
  std::vector<int> writtenParameters_;  // Parameters steps write: copied back after each run.
  std::vector<std::vector<int64_t>> argBytes_;  // Per step: its kernel arguments' bytes.
  // The parameters in the backend's memory (views of the plan's bytes where it is the host's),
  // mapped by the first run and again after clearLibraryCache().
  std::mutex paramsMu_;
  bool paramsMapped_ = false;
  uint64_t paramsGeneration_ = 0;  // Bumped at every mapping: captured graphs read the mapping.
  std::vector<DeviceBuffer> params_;
  DeviceBuffer indexWordsClear_;  // Plan::deviceIndexChecks' words, clear: copied in at each run.
  std::unique_ptr<LibraryCache> cache_;  // Reordered constant weights, for this plan only.
  std::unique_ptr<Arenas> arenas_;
  // run() holds it shared (exclusively for a serialized plan); clearLibraryCache exclusively.
  mutable std::shared_mutex runMu_;
  mutable std::mutex statsMu_;
  PlanRunStats lastStats_;
  std::atomic<bool> profiling_{false};
  std::atomic<bool> graphs_{true};
  std::atomic<int64_t> graphsCaptured_{0};
  // prepare() succeeded: every library step was validated with the plan's types once, and its
  // calls skip the checks (LibraryOptions::validated).
  std::atomic<bool> prepared_{false};
  // Runs fuse relu and clip into oneDNN's primitives and check for NaN after (see run()): the
  // plan has a library step with such a post-op, writes no parameters, and KILN_FUSED_ACTIVATIONS
  // is not 0.
  bool fusesActivations_ = false;
  std::atomic<int64_t> exactReruns_{0};
  static constexpr int kMaxRerunsInARow = 4;
  std::atomic<int> rerunsInARow_{0};  // Runs in a row that ran again: at kMaxRerunsInARow, stop.
};

}  // namespace kiln::runtime
