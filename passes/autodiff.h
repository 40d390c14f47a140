// Reverse-mode automatic differentiation as a graph-to-graph transformation: the backward graph
// is appended to the forward one, so that forward and backward are fused and memory-planned as
// one graph. Each differentiable op has a gradient builder that emits IR (autodiff.cpp); an op
// has the kDifferentiable trait exactly when it has one (a test holds the two together).
#pragma once

#include <span>
#include <vector>

#include "ir/graph.h"

namespace kiln::passes {

// Appends to `g` the nodes computing d(loss)/d(v) for each v in `wrt` (parameters or graph
// inputs of `g`), and returns those gradient values, in order, each of its v's type. `loss`
// must be a floating-point scalar (f32[] or f64[]) computed in `g`. A `wrt` value the loss does
// not depend on gets a zero gradient. Errors: a node on the path from `wrt` to `loss` whose op
// has no gradient builder or whose operands the builder does not handle (naming the node).
// The graph's outputs are unchanged; the caller decides which gradients to output.
Expected<std::vector<ir::Value*>> appendBackward(ir::Graph& g, ir::Value* loss,
                                                 std::span<ir::Value* const> wrt);

// Whether appendBackward can differentiate through `op`.
bool hasGradientBuilder(ir::OpKind op);

}  // namespace kiln::passes
