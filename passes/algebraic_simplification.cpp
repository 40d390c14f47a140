// Algebraic simplification: removes identities (x*1, x+0, x-0, x/1, inference dropout, casts
// to the same dtype, shape ops that keep the shape), merges chains of transposes or of
// reshapes into one op, turns a product with a transposed 2-D operand, plus a bias row, into a
// linear, and x * sigmoid(x) into silu(x). A rewrite applies only when the result keeps the
// value's exact type.
#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "passes/pass.h"

namespace kiln::passes {

namespace {

double elementAt(const ir::TensorData& d, int64_t i) {
  switch (d.dtype()) {
    case ir::DType::kF32:
      return d.as<float>()[i];
    case ir::DType::kF64:
      return d.as<double>()[i];
    case ir::DType::kI64:
      return static_cast<double>(d.as<int64_t>()[i]);
    case ir::DType::kI32:
      return d.as<int32_t>()[i];
    case ir::DType::kI8:
      return d.as<int8_t>()[i];
    case ir::DType::kU8:
    case ir::DType::kBool:
      return d.as<uint8_t>()[i];
    default:
      return std::nan("");  // f16/bf16 constants are never treated as identities.
  }
}

// True when `v` is a constant this compile may rely on whose every element equals `x`.
bool isConstantEqualTo(const ir::Value* v, double x, const PassContext& ctx) {
  if (!v->isConstant(ctx.inference)) return false;
  const ir::TensorData& d = v->data();
  for (int64_t i = 0; i < d.numElements(); ++i)
    if (elementAt(d, i) != x) return false;
  return true;
}

bool isShapeOnly(ir::OpKind k) {
  return ir::hasTrait(k, ir::kReshapeLike);
}

// The value `n`'s output can be replaced by, or nullptr when no identity rule applies.
ir::Value* identityOperand(const ir::Node& n, const PassContext& ctx) {
  const ir::TensorType& out = n.output()->type();
  auto same = [&](ir::Value* v) {
    return v->type().dtype == out.dtype && v->type().shape == out.shape ? v : nullptr;
  };
  switch (n.op()) {
    case ir::OpKind::kMul:
      if (isConstantEqualTo(n.input(1), 1, ctx)) return same(n.input(0));
      if (isConstantEqualTo(n.input(0), 1, ctx)) return same(n.input(1));
      return nullptr;
    case ir::OpKind::kAdd:
      if (isConstantEqualTo(n.input(1), 0, ctx)) return same(n.input(0));
      if (isConstantEqualTo(n.input(0), 0, ctx)) return same(n.input(1));
      return nullptr;
    case ir::OpKind::kSub:
      return isConstantEqualTo(n.input(1), 0, ctx) ? same(n.input(0)) : nullptr;
    case ir::OpKind::kDiv:
      return isConstantEqualTo(n.input(1), 1, ctx) ? same(n.input(0)) : nullptr;
    case ir::OpKind::kDropout:
      return ctx.inference ? same(n.input(0)) : nullptr;
    case ir::OpKind::kCast:
    case ir::OpKind::kReshape:
    case ir::OpKind::kFlatten:
    case ir::OpKind::kSqueeze:
    case ir::OpKind::kUnsqueeze:
    case ir::OpKind::kExpand:
      return same(n.input(0));
    case ir::OpKind::kTranspose: {
      const auto& perm = n.attr().getInts("perm");
      if (perm.empty()) return n.input(0)->type().rank() <= 1 ? same(n.input(0)) : nullptr;
      for (size_t i = 0; i < perm.size(); ++i)
        if (perm[i] != static_cast<int64_t>(i)) return nullptr;
      return same(n.input(0));
    }
    default:
      return nullptr;
  }
}

std::vector<int64_t> explicitPerm(const ir::Node& t) {
  std::vector<int64_t> p = t.attr().getInts("perm");
  if (p.empty())
    for (int i = t.input(0)->type().rank(); i-- > 0;) p.push_back(i);
  return p;
}

// transpose(transpose(x, p1), p2) -> transpose(x, q) with q[i] = p1[p2[i]];
// reshape-like(reshape-like(x)) -> reshape(x, final shape).
bool mergeWithProducer(ir::Graph& g, ir::Node* n) {
  ir::Node* inner = n->input(0)->producer();
  if (!inner) return false;
  ir::Value* x = inner->input(0);
  ir::Node* merged = nullptr;
  if (n->op() == ir::OpKind::kTranspose && inner->op() == ir::OpKind::kTranspose) {
    const auto p1 = explicitPerm(*inner), p2 = explicitPerm(*n);
    std::vector<int64_t> q(p2.size());
    for (size_t i = 0; i < p2.size(); ++i) q[i] = p1[p2[i]];
    auto r = g.insertNode(n, ir::OpKind::kTranspose, {x}, {{"perm", q}});
    if (!r) return false;
    merged = *r;
  } else if (isShapeOnly(n->op()) && isShapeOnly(inner->op())) {
    auto r = g.insertNode(n, ir::OpKind::kReshape, {x}, {{"shape", n->output()->type().shape}});
    if (!r) return false;
    merged = *r;
  } else {
    return false;
  }
  g.replaceAllUsesWith(n->output(), merged->output());
  return true;
}

// matmul(a, transpose(w)) with w 2-D -> linear(a, w): the library reads w as it is stored
// instead of a transposed copy made at every run. PyTorch's exporter writes F.linear with a
// weight shared by another op (a language-model head tied to the token embedding) this way: on
// GPT-2's 32,000 x 768 head, two transposes were two thirds of the run.
// add(linear(a, w), b), b of shape [out], the linear's only use -> linear(a, w, b) (the bias
// then rides in the library call).
bool toLinear(ir::Graph& g, ir::Node* n) {
  const ir::TensorType& out = n->output()->type();
  if (n->op() == ir::OpKind::kMatMul) {
    ir::Node* t = n->input(1)->producer();
    if (!t || t->op() != ir::OpKind::kTranspose) return false;
    ir::Value *a = n->input(0), *w = t->input(0);
    if (w->type().rank() != 2 || a->type().rank() < 2 ||
        explicitPerm(*t) != std::vector<int64_t>{1, 0})
      return false;
    std::vector<int64_t> shape = a->type().shape;
    shape.back() = w->type().shape[0];
    if (shape != out.shape || out.layout != ir::Layout::kPlain) return false;
    auto r = g.insertNode(n, ir::OpKind::kLinear, {a, w}, {});
    if (!r) return false;
    g.replaceAllUsesWith(n->output(), (*r)->output());
    return true;
  }
  if (n->op() != ir::OpKind::kAdd) return false;
  for (int side = 0; side < 2; ++side) {
    ir::Node* l = n->input(side)->producer();
    ir::Value* b = n->input(1 - side);
    if (!l || l->op() != ir::OpKind::kLinear || l->inputs().size() != 2 ||
        l->output()->users().size() != 1 || g.isOutput(l->output()))
      continue;
    const ir::TensorType& lt = l->output()->type();
    if (lt != out || b->type().dtype != out.dtype ||
        b->type().shape != std::vector<int64_t>{out.shape.back()})
      continue;
    auto r = g.insertNode(n, ir::OpKind::kLinear, {l->input(0), l->input(1), b}, {});
    if (!r) return false;
    g.replaceAllUsesWith(n->output(), (*r)->output());
    return true;
  }
  return false;
}

// mul(x, sigmoid(x)) (either order), the sigmoid's only use -> silu(x): PyTorch's exporter
// writes nn.SiLU as the two ops (ONNX has no SiLU before opset 24's Swish). One division
// instead of a division and a product, and an op the backends know by name (efficientnet_b0:
// 49 of them, a quarter of its run).
bool toSilu(ir::Graph& g, ir::Node* n) {
  if (n->op() != ir::OpKind::kMul) return false;
  for (int side = 0; side < 2; ++side) {
    ir::Node* s = n->input(side)->producer();
    ir::Value* x = n->input(1 - side);
    if (!s || s->op() != ir::OpKind::kSigmoid || s->input(0) != x ||
        s->output()->users().size() != 1 || g.isOutput(s->output()) ||
        x->type() != n->output()->type())
      continue;
    auto r = g.insertNode(n, ir::OpKind::kSilu, {x}, {});
    if (!r) return false;
    g.replaceAllUsesWith(n->output(), (*r)->output());
    return true;
  }
  return false;
}

}  // namespace

bool AlgebraicSimplification::run(ir::Graph& g, PassContext& ctx) {
  bool changed = false;
  // Each round removes or merges at least one node, so the rounds are bounded by the size.
  for (bool progress = true; progress;) {
    progress = false;
    for (ir::Node* n : g.nodes()) {
      // Skip multi-output nodes and dead ones (already rewritten in this round).
      if (n->outputs().size() != 1 || (n->output()->users().empty() && !g.isOutput(n->output())))
        continue;
      if (ir::Value* v = identityOperand(*n, ctx)) {
        g.replaceAllUsesWith(n->output(), v);
        progress = true;
      } else if (mergeWithProducer(g, n) || toLinear(g, n) || toSilu(g, n)) {
        progress = true;
      }
    }
    if (progress) {
      g.removeUnusedNodes();  // The rewritten nodes and any producer they orphaned.
      changed = true;
    }
  }
  return changed;
}

}  // namespace kiln::passes
