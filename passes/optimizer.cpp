#include "passes/optimizer.h"

#include <cmath>
#include <string>

#include "passes/graph_builder.h"

namespace kiln::passes {

namespace {

using ir::OpKind;
using ir::Value;

class Updater : public GraphBuilder {
 public:
  explicit Updater(ir::Graph& g) : GraphBuilder(g) {}

  // Zero-initialized persistent state of `type`, named `name` (made unique).
  Expected<Value*> state(const ir::TensorType& type, const std::string& name) {
    ir::Graph& g = graph();
    std::string n = name;
    while (g.findValue(n)) n = name + "." + g.freshName();
    KILN_ASSIGN_OR_RETURN(Value * v,
                          g.addParameter(n, ir::TensorData(type.dtype, type.shape), false));
    KILN_TRY(g.markState(v));
    return v;
  }
};

Status checkPairs(std::span<Value* const> params, std::span<Value* const> grads) {
  if (params.size() != grads.size())
    return invalidArgument("optimizer: " + std::to_string(params.size()) + " parameters but " +
                           std::to_string(grads.size()) + " gradients");
  for (size_t i = 0; i < params.size(); ++i) {
    if (!params[i]->isParameter() || !params[i]->trainable() ||
        !ir::isFloat(params[i]->type().dtype))
      return invalidArgument("optimizer: '%" + params[i]->name() +
                             "' is not a trainable floating-point parameter");
    if (grads[i]->type().dtype != params[i]->type().dtype ||
        grads[i]->type().shape != params[i]->type().shape)
      return invalidArgument("optimizer: the gradient of '%" + params[i]->name() + "' is " +
                             grads[i]->type().toString() + ", expected " +
                             params[i]->type().toString());
  }
  return Status::ok();
}

}  // namespace

Expected<std::vector<StateWrite>> appendSgd(ir::Graph& g, std::span<Value* const> params,
                                            std::span<Value* const> grads, const SgdOptions& o) {
  KILN_TRY(checkPairs(params, grads));
  Updater u(g);
  std::vector<StateWrite> newParams, newState;
  for (size_t i = 0; i < params.size(); ++i) {
    Value* p = params[i];
    Value* d = grads[i];
    if (o.weightDecay != 0) {
      KILN_ASSIGN_OR_RETURN(d, u.axpy(d, o.weightDecay, p));
    }
    Value* update = d;
    if (o.momentum != 0) {
      // v = momentum v + d; PyTorch's first step sets v = d, which this equals from v = 0.
      KILN_ASSIGN_OR_RETURN(Value * v, u.state(p->type(), p->name() + ".momentum"));
      KILN_ASSIGN_OR_RETURN(Value * mv, u.mulScalar(v, o.momentum));
      KILN_ASSIGN_OR_RETURN(Value * v2, u.op(OpKind::kAdd, {mv, d}));
      newState.push_back({v, v2});
      update = v2;
      if (o.nesterov) {
        KILN_ASSIGN_OR_RETURN(update, u.axpy(d, o.momentum, v2));
      }
    }
    KILN_ASSIGN_OR_RETURN(Value * p2, u.axpy(p, -o.lr, update));
    newParams.push_back({p, p2});
  }
  newParams.insert(newParams.end(), newState.begin(), newState.end());
  return newParams;
}

Expected<std::vector<StateWrite>> appendAdam(ir::Graph& g, std::span<Value* const> params,
                                             std::span<Value* const> grads, const AdamOptions& o) {
  KILN_TRY(checkPairs(params, grads));
  if (params.empty()) return std::vector<StateWrite>{};
  Updater u(g);
  std::vector<StateWrite> newParams, newState;
  // The step count t (f32 scalar state) and the bias corrections 1 - beta^t, in the graph, so
  // that one compiled step serves every step.
  const ir::DType dt = params[0]->type().dtype;
  KILN_ASSIGN_OR_RETURN(Value * t, u.state({dt, {}}, "adam.step"));
  KILN_ASSIGN_OR_RETURN(Value * one, u.scalar(dt, 1.0));
  KILN_ASSIGN_OR_RETURN(Value * t2, u.op(OpKind::kAdd, {t, one}));
  newState.push_back({t, t2});
  auto correction = [&](double beta) -> Expected<Value*> {  // 1 - beta^t = 1 - exp(t ln beta)
    KILN_ASSIGN_OR_RETURN(Value * tl, u.mulScalar(t2, std::log(beta)));
    KILN_ASSIGN_OR_RETURN(Value * e, u.op(OpKind::kExp, {tl}));
    return u.op(OpKind::kSub, {one, e});
  };
  KILN_ASSIGN_OR_RETURN(Value * c1, correction(o.beta1));
  KILN_ASSIGN_OR_RETURN(Value * c2, correction(o.beta2));
  for (size_t i = 0; i < params.size(); ++i) {
    Value* p = params[i];
    Value* d = grads[i];
    if (o.weightDecay != 0 && !o.decoupled) {
      KILN_ASSIGN_OR_RETURN(d, u.axpy(d, o.weightDecay, p));
    }
    KILN_ASSIGN_OR_RETURN(Value * m, u.state(p->type(), p->name() + ".adam_m"));
    KILN_ASSIGN_OR_RETURN(Value * v, u.state(p->type(), p->name() + ".adam_v"));
    // m = b1 m + (1 - b1) d; v = b2 v + (1 - b2) d^2
    KILN_ASSIGN_OR_RETURN(Value * bm, u.mulScalar(m, o.beta1));
    KILN_ASSIGN_OR_RETURN(Value * m2, u.axpy(bm, 1 - o.beta1, d));
    KILN_ASSIGN_OR_RETURN(Value * d2, u.op(OpKind::kMul, {d, d}));
    KILN_ASSIGN_OR_RETURN(Value * bv, u.mulScalar(v, o.beta2));
    KILN_ASSIGN_OR_RETURN(Value * v2, u.axpy(bv, 1 - o.beta2, d2));
    newState.push_back({m, m2});
    newState.push_back({v, v2});
    // p -= lr (m / c1) / (sqrt(v / c2) + eps)   [+ lr wd p for AdamW]
    KILN_ASSIGN_OR_RETURN(Value * mh, u.op(OpKind::kDiv, {m2, c1}));
    KILN_ASSIGN_OR_RETURN(Value * vh, u.op(OpKind::kDiv, {v2, c2}));
    KILN_ASSIGN_OR_RETURN(Value * sv, u.op(OpKind::kSqrt, {vh}));
    KILN_ASSIGN_OR_RETURN(Value * eps, u.scalar(dt, o.eps));
    KILN_ASSIGN_OR_RETURN(Value * den, u.op(OpKind::kAdd, {sv, eps}));
    KILN_ASSIGN_OR_RETURN(Value * step, u.op(OpKind::kDiv, {mh, den}));
    Value* base = p;
    if (o.weightDecay != 0 && o.decoupled) {
      KILN_ASSIGN_OR_RETURN(base, u.mulScalar(p, 1 - o.lr * o.weightDecay));
    }
    KILN_ASSIGN_OR_RETURN(Value * p2, u.axpy(base, -o.lr, step));
    newParams.push_back({p, p2});
  }
  newParams.insert(newParams.end(), newState.begin(), newState.end());
  return newParams;
}

}  // namespace kiln::passes
