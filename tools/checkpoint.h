// Training checkpoints (`kiln train --checkpoint DIR`): the training step's whole state
// (compiler::TrainingStep::state) in DIR/ckpt-<step>.safetensors with a small JSON beside it
// (DIR/ckpt-<step>.json: the step, and the run's settings a resume must repeat), and
// DIR/latest.json naming the newest complete one. Each file is written to a temporary file and
// renamed (frontends::writeFilesAtomically), and latest.json moves only after both files of a
// checkpoint are in place, so a kill at any moment leaves the previous checkpoint readable.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "frontends/json/safetensors.h"
#include "ir/graph.h"
#include "ir/status.h"

namespace kiln::cli {

struct CheckpointInfo {
  int64_t step = 0;  // Steps done; the resumed run's next step is this one.
  // The run's settings: a resume checks them against its own (they decide the batches and the
  // update rule, so a mismatch would not continue the same run).
  std::map<std::string, std::string> settings;
};

// Writes checkpoint `info.step` of `state` into `dir` (created if needed), then points
// latest.json at it and removes checkpoints older than the previous one.
Status saveCheckpoint(const std::string& dir, const CheckpointInfo& info,
                      const frontends::TensorMap& state);

// The checkpoint latest.json names in `dir`, or the file `path` (ckpt-<step>.safetensors).
struct Checkpoint {
  CheckpointInfo info;
  frontends::TensorMap tensors;
  std::string path;  // The .safetensors file read.
};
Expected<Checkpoint> loadCheckpoint(const std::string& path);

// --weights PATH of the model-taking commands: sets every parameter of `g` (but the builder's
// "const:" constants) from a checkpoint (its directory or ckpt-*.safetensors: the optimizer's
// state in it is ignored) or any safetensors file of state_dict names, so that a trained model
// is one command from an artifact or a JSON graph. Every parameter must be present with its
// dtype and shape; errors list the missing ones.
Status applyWeights(ir::Graph& g, const std::string& path);

}  // namespace kiln::cli
