// Autocast (--precision bf16|fp16), as torch.autocast runs a CUDA model: every product (an op
// with ir::kAutocast: matmul, gemm, linear, conv2d and conv2d's gradients) whose operands and
// result are f32 reads its float operands cast to the low-precision type, so that the library
// runs it on tensor cores, accumulating in f32 and rounding the result once. The low-precision
// results then flow on as PyTorch's do: an op with ir::kLowPrecision (activations, arithmetic,
// movement) whose float inputs are all low-precision runs in that type too (computing in f32,
// rounding its result once), so a ResNet's activations stay bf16 from convolution to
// convolution and its residual add and ReLU become the convolution's epilogue. Every other op —
// exp, log, pow, reductions, softmax, normalization, losses, and anything with an f32 operand
// such as the optimizer's master weights — computes in f32, reading low-precision values
// widened. A cast back to f32 follows each low-precision result that an f32 op reads; round
// trips (low -> f32 -> low) cancel. Constant folding, after this pass, turns the casts of
// inference weights into low-precision constants (half the bytes).
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

// The low-precision value `v` is a widening cast of, or null.
Value* lowSource(Value* v, ir::DType low) {
  const ir::Node* p = v->producer();
  if (!p || p->op() != ir::OpKind::kCast || v->type().dtype != ir::DType::kF32) return nullptr;
  Value* src = p->input(0);
  return src->type().dtype == low ? src : nullptr;
}

// kLowPrecision ops whose float inputs are all widened low-precision values run in that type,
// in topological order, so that each rewrite exposes the next.
void propagate(ir::Graph& g, ir::DType low, const std::string& lowName,
               std::vector<ir::Node*>& replaced) {
  for (ir::Node* n : g.nodes()) {  // A copy: the rewrites insert nodes.
    if (!n->info().has(ir::kLowPrecision) || n->outputs().size() != 1 ||
        n->output()->type().dtype != ir::DType::kF32)
      continue;
    std::vector<Value*> ins;
    bool lowInputs = true, anyFloat = false;
    for (Value* v : n->inputs()) {
      Value* src = ir::isFloat(v->type().dtype) ? lowSource(v, low) : v;
      anyFloat = anyFloat || ir::isFloat(v->type().dtype);
      lowInputs = lowInputs && src;
      ins.push_back(src);
    }
    if (!anyFloat || !lowInputs) continue;
    GraphBuilder e(g, n, n, "." + lowName, "autocasting " + n->describe() + " to " + lowName);
    Expected<Value*> out = e.op(n->op(), ins, n->attrs());
    if (out) out = e.op(ir::OpKind::kCast, {*out}, {{"to", std::string("f32")}});
    if (!out) continue;  // Stays f32: correct, only not narrower.
    g.replaceAllUsesWith(n->output(), *out);
    replaced.push_back(n);
  }
}

// cast(to low)(cast(to f32)(x)) is x for a low-precision x (f32 holds it exactly); casts left
// without users go.
void cancelRoundTrips(ir::Graph& g, ir::DType low) {
  for (ir::Node* n : g.nodes())
    if (n->op() == ir::OpKind::kCast && n->output()->type().dtype == low)
      if (Value* x = lowSource(n->input(0), low)) g.replaceAllUsesWith(n->output(), x);
  std::set<const Value*> outputs(g.outputs().begin(), g.outputs().end());
  for (bool removed = true; removed;) {
    removed = false;
    g.removeNodesIf([&](const ir::Node& n) {
      const bool dead =
          n.op() == ir::OpKind::kCast && n.output()->users().empty() && !outputs.count(n.output());
      removed = removed || dead;
      return dead;
    });
  }
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
  propagate(g, low, lowName, replaced);
  std::set<const ir::Node*> gone(replaced.begin(), replaced.end());
  g.removeNodesIf([&](const ir::Node& n) { return gone.count(&n) > 0; });
  cancelRoundTrips(g, low);
  return true;
}

}  // namespace kiln::passes
