// Training mode: rewrites a model graph as it behaves while training, before autodiff
// (autodiff.h) appends the backward graph. Inference-mode batch_norm (fixed statistics)
// becomes batch_norm_stats and batch_norm_train (the batch's statistics), whose gradient ops are
// batch_norm_backward_reduce and batch_norm_backward, and its running statistics become
// persistent state updated by the step, as PyTorch's BatchNorm in train() does; dropout becomes
// dropout_train, drawing a new seeded mask each step.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/graph.h"
#include "passes/optimizer.h"

namespace kiln::passes {

struct TrainingModeOptions {
  double batchNormMomentum = 0.1;  // running = (1 - m) running + m batch (unbiased variance).
  bool dropout = true;             // false: dropout stays the identity (a deterministic step).
  uint64_t seed = 0;               // Dropout masks; node i uses seed + i.
  // Data-parallel training: the index of this rank's first sample in the global batch. Dropout
  // masks are keyed by the global sample index, so that ranks draw the masks one process running
  // the global batch would.
  int64_t firstSample = 0;
};

struct TrainingMode {
  std::vector<StateWrite> writes;  // Running statistics and the dropout step counter.
  int batchNorms = 0, dropouts = 0;
};

// A batch_norm's statistics must be parameters (a model's running buffers), and its input
// must have a batch of at least 2 (the unbiased variance divides by count - 1).
Expected<TrainingMode> toTrainingMode(ir::Graph& g, const TrainingModeOptions& options = {});

}  // namespace kiln::passes
