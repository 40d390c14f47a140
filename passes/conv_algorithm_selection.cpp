// Convolution algorithm selection: asks the injected chooser (the compiler times the
// candidates on the real shape, or uses a heuristic, and caches the answer on disk) for each
// conv2d and each of its gradients (the ops with an `algo` attribute) and records it in the
// node's algo attribute, which the library call follows.
#include "passes/pass.h"

namespace kiln::passes {

bool ConvAlgorithmSelection::run(ir::Graph& g, PassContext& ctx) {
  if (!ctx.chooseConvAlgorithm) return false;
  bool changed = false;
  for (ir::Node* n : g.nodes()) {
    if (!n->info().findAttr("algo") || n->attr().getString("algo") != "auto") continue;
    // Only where the backend's library runs it (the CPU runs the gradients as op kernels).
    const ir::TensorType& t = n->output()->type();
    if (ctx.hasLibraryKernel && !ctx.hasLibraryKernel(n->op(), t.dtype, t.layout)) continue;
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
