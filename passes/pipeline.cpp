#include "passes/pipeline.h"

#include <chrono>

#include "ir/printer.h"
#include "ir/verifier.h"

namespace kiln::passes {

Pipeline Pipeline::standard() {
  return Pipeline({
      "dce",                       // Drop work no output needs, so later passes see less.
      "device-lowering",           // GPU backends: BatchNorm training ops and split reductions
                                   // as kernel-IR ops, before the rewrites that simplify them.
      "algebraic-simplification",  // Remove identities (x*1, dropout, double transposes) early;
                                   // this exposes constants and duplicates.
      "constant-folding",          // Fold weight-only subgraphs (e.g. a transposed weight).
      "attention-fusion",          // Inference: matmul-softmax-matmul as one attention op,
                                   // after folding made its scale a constant.
      "batchnorm-folding",         // Inference: BatchNorm disappears into conv/linear weights,
                                   // so the conv's epilogue can take the following ReLU.
      "autocast",                  // --precision bf16|fp16: products in the low precision and
                                   // the ops after them that PyTorch runs so, after BN folding
                                   // so that folded weights are cast.
      "constant-folding",          // Inference: the weights' casts become bf16/f16 constants.
      "cse",                       // Merge duplicates that the rewrites revealed.
      "layout-selection",          // After BN folding: conv chains channels-last, with
                                   // conversions only at the region's edges.
      "rematerialize",             // Training: the image's relayout recomputed for the
                                   // backward, not kept through the step (after CSE, which
                                   // would merge the copies back).
      "constant-folding",          // Inference on a GPU: NHWC filters become KRSC constants.
      "conv-algorithm-selection",  // Last: it times convs in their final layout and shape.
      "dce",                       // Remove nodes and constants the rewrites left unused.
  });
}

Status checkPassNames(const std::set<std::string>& names, bool allowAll) {
  for (const auto& n : names) {
    if (allowAll && n == "all") continue;
    if (createPass(n)) continue;
    std::string known;
    for (const auto& p : allPasses()) known += (known.empty() ? "" : ", ") + std::string(p.name);
    return invalidArgument("unknown pass '" + n + "' (passes: " + known + ")");
  }
  return Status::ok();
}

Status Pipeline::run(ir::Graph& g, PassContext& ctx) const {
  KILN_TRY(checkPassNames(ctx.disabled, false));
  KILN_TRY(checkPassNames(ctx.dumpAfter, true));
  for (const auto& name : names_) {
    if (ctx.disabled.count(name)) continue;
    auto pass = createPass(name);
    if (!pass) return internalError("pipeline names unknown pass '" + name + "'");
    const auto t0 = std::chrono::steady_clock::now();
    const bool changed = pass->run(g, ctx);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ctx.timings.push_back({name, ms, changed});
    if (ctx.timePasses && ctx.log)
      *ctx.log << "pass " << name << ": " << ms << " ms" << (changed ? " (changed)" : "") << "\n";
    if (ctx.verifyAfterEach) {
      Status st = ir::verify(g);
      if (!st.isOk())
        return internalError("the graph is invalid after pass '" + name + "': " + st.message());
    }
    if (ctx.log && (ctx.dumpAfter.count("all") || ctx.dumpAfter.count(name)))
      *ctx.log << "// after " << name << (changed ? "" : " (unchanged)") << "\n"
               << ir::printGraph(g);
  }
  return Status::ok();
}

}  // namespace kiln::passes
