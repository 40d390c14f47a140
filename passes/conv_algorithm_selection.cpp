// Convolution algorithm selection: asks the injected chooser (the compiler times the
// candidates on the real shape, or uses a heuristic, and caches the answer on disk) for each
// conv2d and records it in the node's algo attribute, which the library call follows.
#include "passes/pass.h"

namespace kiln::passes {

bool ConvAlgorithmSelection::run(ir::Graph& g, PassContext& ctx) {
  if (!ctx.chooseConvAlgorithm) return false;
  bool changed = false;
  for (ir::Node* n : g.nodes()) {
    if (n->op() != ir::OpKind::kConv2d || n->attr().getString("algo") != "auto") continue;
    auto choice = ctx.chooseConvAlgorithm(*n);
    if (!choice) {
      ctx.remarks.push_back("conv-algorithm-selection: " + n->describe() + ": " +
                            choice.status().message());
      continue;
    }
    ctx.algorithmChoices.push_back(n->describe() + ": " + choice->algo + " (" +
                                   choice->explanation + ")");
    if (choice->algo == "auto") continue;
    n->setAttr("algo", choice->algo);
    changed = true;
  }
  return changed;
}

}  // namespace kiln::passes
