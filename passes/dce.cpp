// Dead-code elimination: removes nodes whose outputs no graph output depends on, then
// parameters nothing reads.
#include <unordered_set>

#include "passes/pass.h"

namespace kiln::passes {

bool DeadCodeElimination::run(ir::Graph& g, PassContext&) {
  std::unordered_set<const ir::Node*> live;
  std::vector<const ir::Node*> work;
  for (const ir::Value* v : g.outputs())
    if (v->producer() && live.insert(v->producer()).second) work.push_back(v->producer());
  while (!work.empty()) {
    const ir::Node* n = work.back();
    work.pop_back();
    for (const ir::Value* in : n->inputs())
      if (in->producer() && live.insert(in->producer()).second) work.push_back(in->producer());
  }
  size_t removed = g.removeNodesIf([&](const ir::Node& n) { return !live.count(&n); });
  removed += g.removeUnusedParameters();
  return removed > 0;
}

}  // namespace kiln::passes
