// Autocast (--precision bf16|fp16), as torch.autocast runs a CUDA model: every product (an op
// with ir::kAutocast: matmul, gemm, linear, conv2d and conv2d's gradients) whose operands and
// result are f32 reads its float operands cast to the low-precision type, so that the library
// runs it on tensor cores, accumulating in f32 and rounding the result once; the result is cast
// back to f32, and every other op — pointwise, reductions, softmax, normalization, losses —
// computes in f32 as before. Constant folding, after this pass, turns the casts of inference
// weights into low-precision constants (half the bytes); fusion merges the other casts into the
// generated kernels around the products (a kernel that feeds a product stores its result in the
// low-precision type; one that reads a product's result widens it as it loads).
#include <map>
#include <set>

#include "passes/graph_builder.h"
#include "passes/pass.h"

namespace kiln::passes {

namespace {

using ir::Value;

bool autocasts(const ir::Node& n) {
  if (!n.info().has(ir::kAutocast) || n.outputs().size() != 1 ||
      n.output()->type().dtype != ir::DType::kF32)
    return false;
  for (const Value* v : n.inputs())
    if (ir::isFloat(v->type().dtype) && v->type().dtype != ir::DType::kF32) return false;
  return true;
}

}  // namespace

bool Autocast::run(ir::Graph& g, PassContext& ctx) {
  const ir::DType low = ctx.autocast;
  if (low == ir::DType::kF32) return false;
  const std::string lowName(ir::dtypeName(low));
  std::vector<ir::Node*> todo;
  for (ir::Node* n : g.nodes())
    if (autocasts(*n)) todo.push_back(n);
  std::map<Value*, Value*> castOf;  // One cast per value, shared by every product that reads it.
  std::vector<ir::Node*> replaced;
  for (ir::Node* n : todo) {
    GraphBuilder e(g, n, n, "." + lowName, "autocasting " + n->describe() + " to " + lowName);
    auto rewrite = [&]() -> Expected<Value*> {
      std::vector<Value*> ins;
      for (Value* v : n->inputs()) {
        if (v->type().dtype != ir::DType::kF32) {
          ins.push_back(v);
          continue;
        }
        auto [it, fresh] = castOf.try_emplace(v, nullptr);
        if (fresh) {
          Expected<Value*> c = e.op(ir::OpKind::kCast, {v}, {{"to", lowName}});
          if (!c) {
            castOf.erase(it);
            return c.status();
          }
          it->second = *c;
        }
        ins.push_back(it->second);
      }
      KILN_ASSIGN_OR_RETURN(Value * product, e.op(n->op(), ins, n->attrs()));
      return e.op(ir::OpKind::kCast, {product}, {{"to", std::string("f32")}});
    };
    Expected<Value*> back = rewrite();
    if (!back) {  // Left in f32 (correct, only not faster); the user sees why.
      ctx.remarks.push_back("autocast: " + n->describe() +
                            " stays f32: " + back.status().message());
      continue;
    }
    g.replaceAllUsesWith(n->output(), *back);
    replaced.push_back(n);
  }
  if (replaced.empty()) return false;
  std::set<const ir::Node*> gone(replaced.begin(), replaced.end());
  g.removeNodesIf([&](const ir::Node& n) { return gone.count(&n) > 0; });
  return true;
}

}  // namespace kiln::passes
