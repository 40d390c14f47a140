#include "ir/verifier.h"

#include <algorithm>
#include <unordered_set>

namespace kiln::ir {

namespace {
// Element counts and byte sizes are int64 everywhere; a type whose size overflows (an
// expand or broadcast of huge attribute values) would make every later size computation UB.
// Zero dims count as one so that partial products are bounded too.
Status checkTypeSize(const Value* v) {
  int64_t bytes = static_cast<int64_t>(dtypeSize(v->type().dtype));
  for (int64_t d : v->type().shape)
    if (__builtin_mul_overflow(bytes, std::max<int64_t>(d, 1), &bytes))
      return invalidArgument("value '%" + v->name() + "' has type " + v->type().toString() +
                             ", whose size does not fit in 64 bits");
  return Status::ok();
}
}  // namespace

Status verify(const Graph& g) {
  std::unordered_set<const Value*> defined;
  std::unordered_set<std::string> names;
  auto define = [&](const Value* v, const std::string& where) -> Status {
    if (!names.insert(v->name()).second)
      return invalidArgument(where + ": value name '%" + v->name() + "' is defined twice");
    defined.insert(v);
    return checkTypeSize(v).withContext(where);
  };
  for (const Value* v : g.inputs()) {
    if (!v->isInput()) return internalError("graph input '%" + v->name() + "' is not an input");
    KILN_TRY(define(v, "graph input"));
    if (v->hasDimNames() && v->dimNames().size() != v->type().shape.size())
      return invalidArgument("graph input '%" + v->name() + "' has rank " +
                             std::to_string(v->type().shape.size()) + " but " +
                             std::to_string(v->dimNames().size()) + " dim names");
  }
  KILN_TRY(g.dimValues().status());
  for (const Value* v : g.parameters()) {
    KILN_TRY(define(v, "parameter"));
    if (!v->data().empty() && v->data().type() != TensorType{v->type().dtype, v->type().shape})
      return invalidArgument("parameter '%" + v->name() + "' is declared " + v->type().toString() +
                             " but its data is " + v->data().type().toString());
  }
  for (const Node* n : g.nodes()) {
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      const Value* in = n->inputs()[i];
      if (!in || !defined.count(in))
        return invalidArgument(n->describe() + ": input " + std::to_string(i) +
                               (in ? " '%" + in->name() + "'" : std::string()) +
                               " is not defined before the node (not SSA or not in order)");
    }
    std::vector<TensorType> inTypes;
    for (const Value* in : n->inputs()) inTypes.push_back(in->type());
    auto expected = inferTypes(n->op(), inTypes, n->attrs());
    if (!expected) return expected.status().withContext(n->describe());
    if (expected->size() != n->outputs().size())
      return invalidArgument(n->describe() + ": has " + std::to_string(n->outputs().size()) +
                             " outputs, op '" + std::string(opName(n->op())) + "' produces " +
                             std::to_string(expected->size()));
    for (size_t i = 0; i < expected->size(); ++i) {
      const Value* out = n->outputs()[i];
      const TensorType& want = (*expected)[i];
      const TensorType& got = out->type();
      // Layout is chosen by passes; dtype and shape are fixed by the op.
      if (want.dtype != got.dtype || want.shape != got.shape)
        return invalidArgument(n->describe() + ": output '%" + out->name() + "' is declared " +
                               got.toString() + " but the op produces " + want.toString());
      if (out->producer() != n)
        return internalError(n->describe() + ": output '%" + out->name() +
                             "' does not point back at its node");
      KILN_TRY(define(out, n->describe()));
    }
  }
  for (const Value* v : g.outputs())
    if (!defined.count(v))
      return invalidArgument("graph output '%" + (v ? v->name() : std::string("?")) +
                             "' is not defined in the graph");
  if (g.outputs().empty()) return invalidArgument("graph '" + g.name() + "' has no outputs");
  return Status::ok();
}

}  // namespace kiln::ir
