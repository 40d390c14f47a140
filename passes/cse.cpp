// Common-subexpression elimination: a node with the same op, inputs and attributes as an
// earlier node is replaced by it. Nodes are visited in order, so the earlier one dominates.
#include <unordered_map>
#include <unordered_set>

#include "passes/pass.h"

namespace kiln::passes {

namespace {
size_t hashNode(const ir::Node& n) {
  size_t h = std::hash<int>()(static_cast<int>(n.op()));
  for (const ir::Value* v : n.inputs()) h = h * 31 + std::hash<const void*>()(v);
  for (const auto& [name, value] : n.attrs())
    h = h * 131 + std::hash<std::string>()(name) + value.index();
  return h;
}

bool sameNode(const ir::Node& a, const ir::Node& b) {
  return a.op() == b.op() && a.inputs() == b.inputs() && a.attrs() == b.attrs() &&
         a.outputs().size() == b.outputs().size();
}
}  // namespace

bool CommonSubexpressionElimination::run(ir::Graph& g, PassContext&) {
  std::unordered_multimap<size_t, ir::Node*> seen;
  std::vector<ir::Node*> duplicates;
  for (ir::Node* n : g.nodes()) {
    const size_t h = hashNode(*n);
    ir::Node* match = nullptr;
    auto [lo, hi] = seen.equal_range(h);
    for (auto it = lo; it != hi && !match; ++it)
      if (sameNode(*it->second, *n)) match = it->second;
    if (!match) {
      seen.emplace(h, n);
      continue;
    }
    for (size_t i = 0; i < n->outputs().size(); ++i)
      g.replaceAllUsesWith(n->output(i), match->output(i));
    duplicates.push_back(n);
  }
  if (duplicates.empty()) return false;
  std::unordered_set<const ir::Node*> dead(duplicates.begin(), duplicates.end());
  g.removeNodesIf([&](const ir::Node& n) { return dead.count(&n) > 0; });
  return true;
}

}  // namespace kiln::passes
