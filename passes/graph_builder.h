// Adds nodes to a graph on behalf of a pass (autodiff, training mode, optimizers): at the end,
// or before a given node; each node named `<origin>.<suffix>` when the origin has a name, and
// errors prefixed with what was being built. Constants are fresh non-trainable scalars.
#pragma once

#include <string>
#include <vector>

#include "ir/graph.h"

namespace kiln::passes {

class GraphBuilder {
 public:
  // `before`: insert there instead of at the end. `origin` and `suffix` name the new nodes;
  // `context` prefixes errors ("building the gradient of ...").
  GraphBuilder(ir::Graph& g, ir::Node* before = nullptr, const ir::Node* origin = nullptr,
               std::string suffix = "", std::string context = "")
      : g_(g),
        before_(before),
        origin_(origin),
        suffix_(std::move(suffix)),
        context_(std::move(context)) {}

  ir::Graph& graph() const { return g_; }

  Expected<ir::Value*> op(ir::OpKind k, std::vector<ir::Value*> ins, ir::AttrMap a = {});
  Expected<ir::Value*> scalar(ir::DType dtype, double v);
  Expected<ir::Value*> mulScalar(ir::Value* v, double s);
  // a + s b
  Expected<ir::Value*> axpy(ir::Value* a, double s, ir::Value* b);
  // `v` itself when it already has `shape`.
  Expected<ir::Value*> reshape(ir::Value* v, const ir::Shape& shape);
  // Row r of a [2, C] tensor (batch_norm_stats, batch_norm_backward_reduce), as [C].
  Expected<ir::Value*> row(ir::Value* pair, int64_t r);

 private:
  ir::Graph& g_;
  ir::Node* before_;
  const ir::Node* origin_;
  std::string suffix_, context_;
};

}  // namespace kiln::passes
