// BatchNorm folding (inference): conv2d -> batch_norm, and linear -> batch_norm on 2-D
// activations, become one conv2d / linear whose weights and bias absorb the normalization:
//   s = scale / sqrt(var + eps);  W'[o] = W[o] * s[o];  b'[o] = (b[o] - mean[o]) * s[o] + bias[o]
// Applies only when the weights and statistics are constants of this compile and the producer
// feeds nothing else.
#include <cmath>
#include <unordered_set>

#include "passes/pass.h"

namespace kiln::passes {

namespace {

bool isConstant(const ir::Value* v, const PassContext& ctx) {
  return v->isConstant(ctx.inference) &&
         (v->type().dtype == ir::DType::kF32 || v->type().dtype == ir::DType::kF64);
}

double get(const ir::TensorData& d, int64_t i) {
  return d.dtype() == ir::DType::kF64 ? d.as<double>()[i] : d.as<float>()[i];
}
void set(ir::TensorData& d, int64_t i, double v) {
  if (d.dtype() == ir::DType::kF64)
    d.as<double>()[i] = v;
  else
    d.as<float>()[i] = static_cast<float>(v);
}

std::string freshParamName(ir::Graph& g, const std::string& base) {
  if (!g.findValue(base)) return base;
  return base + "." + g.freshName();
}

bool foldOne(ir::Graph& g, ir::Node* bn, const PassContext& ctx) {
  ir::Node* prod = bn->input(0)->producer();
  if (!prod || prod->outputs().size() != 1 || prod->output()->users().size() != 1) return false;
  const bool conv = prod->op() == ir::OpKind::kConv2d;
  const bool linear = prod->op() == ir::OpKind::kLinear && prod->output()->type().rank() == 2;
  if (!conv && !linear) return false;
  for (size_t i = 1; i < 5; ++i)
    if (!isConstant(bn->input(i), ctx)) return false;
  if (!isConstant(prod->input(1), ctx) ||
      (prod->numInputs() > 2 && !isConstant(prod->input(2), ctx)))
    return false;
  for (const ir::Value* o : g.outputs())
    if (o == prod->output()) return false;

  const ir::TensorData& w = prod->input(1)->data();
  const int64_t outC = w.shape()[0];
  const int64_t perOut = w.numElements() / std::max<int64_t>(outC, 1);
  const double eps = bn->attr().getFloat("epsilon");
  const auto& scale = bn->input(1)->data();
  const auto& shift = bn->input(2)->data();
  const auto& mean = bn->input(3)->data();
  const auto& var = bn->input(4)->data();
  ir::TensorData nw(w.dtype(), w.shape());
  ir::TensorData nb(w.dtype(), {outC});
  for (int64_t o = 0; o < outC; ++o) {
    const double s = get(scale, o) / std::sqrt(get(var, o) + eps);
    for (int64_t k = 0; k < perOut; ++k) set(nw, o * perOut + k, get(w, o * perOut + k) * s);
    const double b = prod->numInputs() > 2 ? get(prod->input(2)->data(), o) : 0.0;
    set(nb, o, (b - get(mean, o)) * s + get(shift, o));
  }
  auto wv = g.addParameter(freshParamName(g, prod->input(1)->name() + ".bn_folded"), nw, false);
  auto bv = g.addParameter(freshParamName(g, bn->output()->name() + ".bn_folded_bias"), nb, false);
  if (!wv || !bv) return false;
  auto folded = g.insertNode(bn, prod->op(), {prod->input(0), *wv, *bv}, prod->attrs());
  if (!folded) return false;
  (*folded)->setName(prod->name());
  g.replaceAllUsesWith(bn->output(), (*folded)->output());
  return true;
}

}  // namespace

bool BatchNormFolding::run(ir::Graph& g, PassContext& ctx) {
  std::unordered_set<const ir::Node*> dead;
  for (ir::Node* n : g.nodes()) {
    if (n->op() != ir::OpKind::kBatchNorm || !foldOne(g, n, ctx)) continue;
    dead.insert(n);
    dead.insert(n->input(0)->producer());
  }
  if (dead.empty()) return false;
  g.removeNodesIf([&](const ir::Node& n) { return dead.count(&n) > 0; });
  g.removeUnusedParameters();
  return true;
}

}  // namespace kiln::passes
