// Constant folding: a node whose inputs are all constants (parameters with data that the
// compile may treat as fixed) is evaluated once at compile time and becomes a constant.
#include <unordered_set>

#include "passes/pass.h"

namespace kiln::passes {

namespace {
bool isFoldableConstant(const ir::Value* v, const PassContext& ctx) {
  return v->isConstant(ctx.inference);
}

std::string constantName(ir::Graph& g, const ir::Value* out) {
  std::string base = out->name() + ".folded";
  if (!g.findValue(base)) return base;
  return base + "." + g.freshName();
}
}  // namespace

bool ConstantFolding::run(ir::Graph& g, PassContext& ctx) {
  if (!ctx.evaluate) return false;
  std::unordered_set<const ir::Node*> folded;
  for (ir::Node* n : g.nodes()) {
    if (n->inputs().empty()) continue;
    bool allConst = true;
    for (const ir::Value* in : n->inputs()) allConst = allConst && isFoldableConstant(in, ctx);
    if (!allConst) continue;
    // The reference kernels read and write plain memory; relayout alone reads its attributes'
    // layouts (a constant in another layout is the result of folding one).
    bool plain = true;
    for (const ir::Value* in : n->inputs())
      plain = plain && in->type().layout == ir::Layout::kPlain;
    if (!plain && n->op() != ir::OpKind::kRelayout) continue;
    int64_t bytes = 0;
    for (const ir::Value* o : n->outputs()) bytes += static_cast<int64_t>(o->type().byteSize());
    if (bytes > ctx.maxFoldedBytes) {
      ctx.remarks.push_back("constant-folding: kept " + n->describe() + " (" +
                            std::to_string(bytes) + " bytes is over the fold limit)");
      continue;
    }
    std::vector<ir::TensorData> inputs;
    for (const ir::Value* in : n->inputs()) inputs.push_back(in->data());
    auto results = ctx.evaluate(*n, inputs);
    if (!results) {
      // The node will fail the same way at run time, where the error reaches the user.
      ctx.remarks.push_back("constant-folding: could not evaluate " + n->describe() + ": " +
                            results.status().message());
      continue;
    }
    for (size_t i = 0; i < n->outputs().size(); ++i) {
      ir::Value* out = n->output(i);
      auto c = g.addParameter(constantName(g, out), std::move((*results)[i]), false);
      if (!c) return !folded.empty();  // Only a name clash could fail here; stop folding.
      (*c)->setType(out->type());      // The bytes are in the output's layout.
      g.replaceAllUsesWith(out, *c);
    }
    folded.insert(n);
  }
  if (folded.empty()) return false;
  g.removeNodesIf([&](const ir::Node& n) { return folded.count(&n) > 0; });
  return true;
}

}  // namespace kiln::passes
