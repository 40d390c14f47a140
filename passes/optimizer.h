// Optimizer updates as graph nodes, appended after the backward graph (autodiff.h): the new
// value of every parameter and of every piece of optimizer state (persistent-state parameters,
// ir::Value::isState) is computed in the same graph, so forward, backward and update are fused
// and memory-planned as one step. A training step writes each new value back over its target.
#pragma once

#include <span>
#include <vector>

#include "ir/graph.h"

namespace kiln::passes {

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0;     // PyTorch's SGD: v = momentum v + g (dampening 0).
  double weightDecay = 0;  // g += weightDecay p.
  bool nesterov = false;   // update = g + momentum v instead of v.
};

struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weightDecay = 0;
  bool decoupled = false;  // AdamW: p -= lr weightDecay p, instead of g += weightDecay p.
};

// What a step writes: `target` (a parameter) takes `value` after every run.
struct StateWrite {
  ir::Value* target;
  ir::Value* value;
};

// Appends the update of `params` from their `grads` (same order and types). Optimizer state
// (momentum buffers, Adam's moments and step count) is added as persistent-state parameters
// initialized to zero. Returns the writes: new parameters first, then new state.
Expected<std::vector<StateWrite>> appendSgd(ir::Graph& g, std::span<ir::Value* const> params,
                                            std::span<ir::Value* const> grads,
                                            const SgdOptions& options);
Expected<std::vector<StateWrite>> appendAdam(ir::Graph& g, std::span<ir::Value* const> params,
                                             std::span<ir::Value* const> grads,
                                             const AdamOptions& options);

}  // namespace kiln::passes
