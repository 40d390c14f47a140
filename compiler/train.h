// A training step: forward, cross-entropy loss, backward (passes/autodiff.h) and optimizer
// update (passes/optimizer.h) as one graph, compiled once (or run eagerly, op by op, as the
// baseline); each call runs it on a batch and writes the new parameters and optimizer state
// back over the old ones, in place.
#pragma once

#include <map>

#include <memory>
#include <mutex>

#include "compiler/compile.h"
#include "passes/optimizer.h"
#include "passes/training_mode.h"
#include "runtime/collectives.h"
#include "runtime/eager.h"

namespace kiln::compiler {

struct TrainOptions {
  enum class Optimizer { kSgd, kAdam };
  Optimizer optimizer = Optimizer::kSgd;
  // kAuto: cross-entropy for an output of logits [N, C], MSE for any other output.
  enum class Loss { kAuto, kCrossEntropy, kMse };
  Loss loss = Loss::kAuto;
  passes::TrainingModeOptions mode;  // BatchNorm statistics, dropout.
  passes::SgdOptions sgd;
  passes::AdamOptions adam;
  bool eager = false;  // Run the step op by op instead of compiled.
  // A NaN or infinite loss is an error (the step is not counted) unless this is set: training
  // on data holding NaN, or a diverged run, must not look healthy.
  bool allowNonFinite = false;
  // fp16 training (compile.precision kFp16): dynamic loss scaling as PyTorch's GradScaler does
  // it. The loss is multiplied by a scale before the backward pass and the gradients divided by
  // it; a step whose gradients hold an inf or NaN updates nothing (parameters and optimizer
  // state keep their values; it is counted, not an error) and halves the scale; after
  // `lossScaleGrowthInterval` good steps in a row the scale doubles. The scale and the count
  // are state (checkpointed with the rest).
  double lossScale = 65536;
  int64_t lossScaleGrowthInterval = 2000;
  CompileOptions compile;  // `inference` is forced off.

  // Data-parallel training (PyTorch's DistributedDataParallel): one process per rank, each
  // running the step on its shard of every batch. Before the first step every parameter and
  // optimizer state is broadcast from rank 0. The step runs as two plans: forward and backward,
  // then the update. The gradients are summed over the ranks in buckets of about `bucketBytes`
  // (DDP's 25 MB), in the order the backward finishes them; each bucket's all-reduce starts as
  // soon as the backward has written its last gradient (the plan's step hook) and progresses
  // between the backward's steps, and all have finished before the update reads them. The sums
  // are divided by the number of ranks, so that with the loss a mean over each shard the update
  // is the one of the mean over the global batch. BatchNorm normalizes with the statistics of its
  // rank's shard (DDP without SyncBatchNorm) and its running statistics become rank 0's after
  // every step (DDP's broadcast_buffers). Dropout masks are keyed by the global sample index:
  // set mode.firstSample to the rank's first sample. The reported loss and correct count are the
  // global batch's. A step whose forward or backward fails on some ranks (a bad input, an index
  // out of range in a shard) fails on every rank and changes nothing on any: each rank still
  // takes part in every collective, one all-reduce (the loss's) tells all of them, the update is
  // not run and training mode's state is put back, so the ranks stay in step and the next step
  // may go on. The failing ranks return their own error, the others one naming those ranks. A
  // failing collective or update leaves its rank out of step: it refuses later steps, and the
  // caller should stop every rank (runtime::Collectives::abort).
  std::shared_ptr<runtime::Collectives> collectives;
  // Where the backend's memory is not the host's (a GPU): collectives that sum device memory
  // (NCCL, runtime/gpu/nccl_collectives.h) for the gradients, over the same ranks as
  // `collectives`. The buckets are then device buffers, filled by device copies on the step's
  // stream (synchronized before each all-reduce starts) and copied to the host for the update
  // once summed; `collectives` still broadcasts the parameters and sums the loss. Null: the
  // gradients come to the host and `collectives` sums them there.
  std::shared_ptr<runtime::Collectives> deviceCollectives;
  int64_t bucketBytes = 25 << 20;
  bool overlap = true;  // false: every all-reduce starts after the backward (to measure overlap).
};

// Data-parallel communication of the last step (TrainOptions::collectives).
struct CommunicationStats {
  int buckets = 0;
  int64_t bytes = 0;       // Summed per rank.
  int startedEarly = 0;    // Buckets started while the backward was still running.
  double backwardMs = 0;   // The forward and backward plan, hook included.
  double exposedMs = 0;    // Waiting for the all-reduces after it (the communication not hidden).
  double optimizerMs = 0;  // The update plan.
};

// The phase of a training step's node, by its name: "optimizer", "backward" (autodiff's
// ".backward" nodes) or "forward" (the model, training mode's statistics, the loss). A fused
// plan step is counted by its first node (StepWork::firstNode).
std::string_view phaseOf(std::string_view nodeName);

class TrainingStep {
 public:
  // `model` maps its one input to one output; the step adds a target input (cross-entropy:
  // class indices i64 [N]; MSE: the output's type) and trains every trainable parameter, with
  // BatchNorm and dropout in training mode (passes/training_mode.h).
  static Expected<std::unique_ptr<TrainingStep>> create(ir::Graph model,
                                                        const TrainOptions& options);
  ~TrainingStep();

  struct Result {
    double loss = 0;       // Before the update.
    int64_t correct = 0;   // Cross-entropy: examples whose largest logit is their label, before
                           // the update.
    bool skipped = false;  // fp16: the gradients overflowed, nothing was updated.
  };
  // One step on a batch (x, target). Calls from several threads are serialized: each step
  // updates the parameters in place, so steps run one at a time, in the order they get the
  // step's lock.
  Expected<Result> operator()(const runtime::Tensor& x, const runtime::Tensor& target);

  // The step's graph: its parameters hold the current weights and optimizer state.
  const ir::Graph& graph() const { return *graph_; }
  bool crossEntropy() const { return crossEntropy_; }
  // The target's type, for a batch of the model's batch size.
  ir::TensorType targetType() const { return graph_->inputs()[1]->type(); }
  const CompiledModel* compiled() const { return compiled_.get(); }
  // Data-parallel steps: the update's plan (compiled() runs the forward and backward); else null.
  const CompiledModel* compiledUpdate() const;
  // Per-step times of the compiled plans in their lastStats() (eager always records per-op
  // times).
  void setProfiling(bool on);
  // Data-parallel steps: the last step's communication.
  const CommunicationStats& communication() const { return comm_; }
  size_t allReduceBuckets() const;
  const runtime::EagerExecutor* eager() const { return eager_.get(); }

  // Everything a checkpoint holds, by name: every parameter of the step graph (the model's
  // weights, the optimizer's momenta, moments and step count, BatchNorm's running statistics,
  // dropout's step counter). The tensors share the step's bytes.
  std::map<std::string, ir::TensorData> state() const;  // Every rank's, data-parallel.
  // Copies `state` over the step's parameters (every one present, with its dtype and shape;
  // errors name the first that is not) and sets the count of steps run to `stepsRun`, so that
  // the next step continues a checkpointed run exactly.
  Status restore(const std::map<std::string, ir::TensorData>& state, int64_t stepsRun);
  int64_t stepsRun() const { return steps_; }
  // fp16: steps skipped for overflowing gradients, and the loss scale now (0 without scaling).
  int64_t skippedSteps() const { return skipped_; }
  double lossScale() const;

 private:
  struct DataParallel;
  // The update (optimizer and fp16's loss scaling) of `params` from `grads`, appended to `g`
  // (the step's graph, or the data-parallel update graph) with `scale` (fp16: the loss scale's
  // state in `g`, else null); sets writes_ (after those already there), lossScale_ and returns
  // fp16's "every gradient finite" flag (else null).
  Expected<ir::Value*> appendUpdate(ir::Graph& g, std::span<ir::Value* const> params,
                                    std::span<ir::Value* const> grads, ir::Value* scale,
                                    const TrainOptions& options);
  // Data-parallel: builds the update graph (ddp_) from the step's graph `g`, its trainable
  // `params` and their `grads`; writes_ becomes training mode's writes.
  Status buildDataParallel(std::span<ir::Value* const> params, std::span<ir::Value* const> grads,
                           ir::Value* scale, const passes::TrainingMode& mode,
                           const TrainOptions& options);
  Expected<Result> runDataParallel(const runtime::Tensor& x, const runtime::Tensor& target);
  // Copies each write's value (outs[firstOutput + i]) over its target, unless written in place.
  static Status writeBack(std::span<const passes::StateWrite> writes,
                          std::span<const runtime::Tensor> outs, size_t firstOutput);
  // The loss and the correct count of a batch's outputs.
  Result measure(const runtime::Tensor& loss, const runtime::Tensor& logits,
                 const runtime::Tensor& target) const;
  // Counts the step; a non-finite loss is an error unless allowed.
  Expected<Result> counted(Result r);
  // The parameters of the step's graph, then those only the data-parallel update graph has.
  std::vector<ir::Value*> parameters() const;
  void parametersChanged();

  std::mutex mu_;  // One step at a time.
  bool allowNonFinite_ = false;
  int64_t steps_ = 0;  // Steps run.
  int64_t skipped_ = 0;
  ir::Value* lossScale_ = nullptr;  // fp16's scale (state), and the output saying a step was
  size_t okOutput_ = 0;             // applied (its index; 0 without scaling).
  std::unique_ptr<ir::Graph> graph_;
  std::vector<passes::StateWrite> writes_;
  bool crossEntropy_ = true;
  std::unique_ptr<CompiledModel> compiled_;
  std::unique_ptr<runtime::EagerExecutor> eager_;
  std::unique_ptr<DataParallel> ddp_;
  CommunicationStats comm_;
};

}  // namespace kiln::compiler
