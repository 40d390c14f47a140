// The IR verifier: checks types, arity, attributes, SSA form and topological order. Every
// message names the node (op and output value) and the expected vs actual fact.
#pragma once

#include "ir/graph.h"

namespace kiln::ir {

Status verify(const Graph& g);

}  // namespace kiln::ir
