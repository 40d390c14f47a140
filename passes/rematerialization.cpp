// Rematerialization (training): a large value computed by a pointwise op (a relayout included)
// from graph inputs alone is recomputed right before each later reader instead of being kept
// alive between them. The inputs live through the whole step anyway, so the copy
// costs one more pass over them and no memory, while keeping it would hold the value from the
// forward pass to the end of the backward: a channels-last step's image (resnet18 at batch 32:
// 19 MB, read by the first convolution and, last of all, by its weight gradient). Parameters
// do not count as inputs here: an optimizer may overwrite them in place within the step.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "passes/pass.h"

namespace kiln::passes {

namespace {

constexpr int64_t kMinBytes = int64_t{1} << 20;  // Smaller values are not worth a second pass.

bool recomputable(const ir::Node& n, const std::unordered_set<const ir::Value*>& inputs,
                  const std::unordered_set<const ir::Value*>& outputs) {
  if (!n.info().has(ir::kPointwise) || n.outputs().size() != 1) return false;
  if (outputs.count(n.output()) || n.output()->users().size() < 2) return false;
  if (n.output()->type().byteSize() < static_cast<size_t>(kMinBytes)) return false;
  return std::all_of(n.inputs().begin(), n.inputs().end(),
                     [&](const ir::Value* v) { return inputs.count(v) > 0; });
}

}  // namespace

bool Rematerialization::run(ir::Graph& g, PassContext& ctx) {
  if (ctx.inference) return false;
  const std::vector<ir::Node*> nodes = g.nodes();
  std::unordered_map<const ir::Node*, size_t> position;
  for (size_t i = 0; i < nodes.size(); ++i) position[nodes[i]] = i;
  const std::unordered_set<const ir::Value*> inputs(g.inputs().begin(), g.inputs().end());
  const std::unordered_set<const ir::Value*> outputs(g.outputs().begin(), g.outputs().end());
  int clones = 0;
  for (ir::Node* n : nodes) {
    if (!recomputable(*n, inputs, outputs)) continue;
    std::vector<ir::Node*> readers = n->output()->users();
    std::sort(readers.begin(), readers.end(),
              [&](const ir::Node* a, const ir::Node* b) { return position[a] < position[b]; });
    readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
    // The first reader keeps the original; each later one gets its own copy right before it.
    for (size_t r = 1; r < readers.size(); ++r) {
      ir::Node* reader = readers[r];
      auto copy = g.insertNode(reader, n->op(), n->inputs(), n->attrs());
      if (!copy) continue;  // Cannot happen (the original's types inferred); keep the original.
      (*copy)->setName(reader->name());  // Its reader's phase (compiler::phaseOf).
      for (size_t i = 0; i < reader->inputs().size(); ++i)
        if (reader->input(i) == n->output()) reader->replaceInput(i, (*copy)->output());
      ++clones;
    }
  }
  if (clones > 0)
    ctx.remarks.push_back("rematerialize: " + std::to_string(clones) +
                          " values recomputed from the step's inputs where they are read again");
  return clones > 0;
}

}  // namespace kiln::passes
