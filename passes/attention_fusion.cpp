// Attention fusion (inference): the scaled dot-product attention that exporters write as
//   matmul(q, kt) -> mul or div by a constant scalar (optional) -> add(mask) (optional)
//   -> softmax over the last axis -> matmul(., v)
// becomes one attention(q, kt, v[, mask]) {scale} (ops.def), which the backend's library runs
// without holding the [S, T] scores (runtime/library/attention.cpp on the CPU). HF BERT's and
// PyTorch's exports of nn.MultiheadAttention take this form, kt being a transpose of K.
// Each intermediate must have no other reader. Only where the backend's library runs attention
// at f32 (not under autocast, whose products would change precision), and not for training
// graphs (attention has no gradient op yet).
#include <optional>

#include "passes/pass.h"

namespace kiln::passes {

namespace {

using ir::Node;
using ir::OpKind;
using ir::Value;

bool soleUse(const ir::Graph& g, const Value* v) {
  return v->users().size() == 1 && !g.isOutput(v);
}

// The value of a constant one-element f32 parameter.
std::optional<double> constantScalar(const Value* v, bool inference) {
  if (!v->isConstant(inference)) return std::nullopt;
  const ir::TensorData& d = v->data();
  if (d.dtype() != ir::DType::kF32 || d.numElements() != 1) return std::nullopt;
  return d.as<float>()[0];
}

bool isMatrixStack(const Value* v) {
  return v->type().rank() >= 2 && v->type().dtype == ir::DType::kF32 &&
         v->type().layout == ir::Layout::kPlain;
}

ir::Shape batchOf(const Value* v) {
  const ir::Shape& s = v->type().shape;
  return ir::Shape(s.begin(), s.end() - 2);
}

struct Match {
  Value *q = nullptr, *kt = nullptr, *v = nullptr, *mask = nullptr;
  double scale = 1;
};

// The pattern ending at `out` (the product with v), or nothing.
std::optional<Match> matchAt(const ir::Graph& g, const Node& out, bool inference) {
  if (out.op() != OpKind::kMatMul) return std::nullopt;
  const Node* sm = out.input(0)->producer();
  if (!sm || sm->op() != OpKind::kSoftmax || !soleUse(g, sm->output())) return std::nullopt;
  const int rank = sm->output()->type().rank();
  const int64_t axis = sm->attr().getInt("axis");
  if (axis != -1 && axis != rank - 1) return std::nullopt;
  Match m;
  m.v = out.input(1);
  const Value* x = sm->input(0);
  const Node* p = x->producer();
  // The mask: the other operand of an add whose output has the scores' shape.
  if (p && p->op() == OpKind::kAdd && soleUse(g, p->output())) {
    for (int side = 0; side < 2; ++side) {
      const Node* s = p->input(side)->producer();
      if (!s || p->input(side)->type() != p->output()->type()) continue;
      if (s->op() != OpKind::kMatMul && s->op() != OpKind::kMul && s->op() != OpKind::kDiv)
        continue;
      m.mask = p->input(1 - side);
      x = p->input(side);
      p = s;
      break;
    }
    if (!m.mask) return std::nullopt;
  }
  // The scale: mul by a constant scalar (either side) or div by one.
  if (p && (p->op() == OpKind::kMul || p->op() == OpKind::kDiv) && soleUse(g, p->output())) {
    const int first = p->op() == OpKind::kDiv ? 1 : 0;
    bool found = false;
    for (int side = first; side < 2 && !found; ++side) {
      const std::optional<double> c = constantScalar(p->input(side), inference);
      if (!c || p->input(1 - side)->type() != p->output()->type()) continue;
      m.scale = p->op() == OpKind::kDiv ? 1.0 / *c : *c;
      x = p->input(1 - side);
      p = x->producer();
      found = true;
    }
    if (!found) return std::nullopt;
  }
  if (!p || p->op() != OpKind::kMatMul || !soleUse(g, x)) return std::nullopt;
  m.q = p->input(0);
  m.kt = p->input(1);
  if (!isMatrixStack(m.q) || !isMatrixStack(m.kt) || !isMatrixStack(m.v)) return std::nullopt;
  if (batchOf(m.kt) != batchOf(m.q) || batchOf(m.v) != batchOf(m.q)) return std::nullopt;
  if (m.mask && m.mask->type().dtype != ir::DType::kF32) return std::nullopt;
  return m;
}

}  // namespace

bool AttentionFusion::run(ir::Graph& g, PassContext& ctx) {
  if (!ctx.inference || ctx.autocast != ir::DType::kF32 || !ctx.hasLibraryKernel ||
      !ctx.hasLibraryKernel(OpKind::kAttention, ir::DType::kF32, ir::Layout::kPlain))
    return false;
  bool changed = false;
  for (Node* n : g.nodes()) {
    if (n->outputs().size() != 1 || (n->output()->users().empty() && !g.isOutput(n->output())))
      continue;  // Dead: a pattern rewritten already.
    const std::optional<Match> m = matchAt(g, *n, ctx.inference);
    if (!m) continue;
    std::vector<Value*> ins{m->q, m->kt, m->v};
    if (m->mask) ins.push_back(m->mask);
    auto a = g.insertNode(n, OpKind::kAttention, ins, {{"scale", m->scale}});
    if (!a) continue;
    if ((*a)->output()->type() != n->output()->type()) continue;  // Left unused: removed below.
    g.replaceAllUsesWith(n->output(), (*a)->output());
    changed = true;
  }
  if (changed) g.removeUnusedNodes();  // The replaced products, softmaxes, scales and adds.
  return changed;
}

}  // namespace kiln::passes
