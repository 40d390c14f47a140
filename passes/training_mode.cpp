#include "passes/training_mode.h"

#include <algorithm>
#include <unordered_set>

#include "passes/graph_builder.h"

namespace kiln::passes {

namespace {

using ir::OpKind;
using ir::Value;

// y = (x - mean) / sqrt(var + eps) scale + bias with the batch's mean and (biased) variance
// over every dim but 1; the running statistics move towards the batch's.
Status rewriteBatchNorm(ir::Graph& g, ir::Node* n, double momentum,
                        std::vector<StateWrite>& writes) {
  Value* x = n->input(0);
  Value* runMean = n->input(3);
  Value* runVar = n->input(4);
  for (Value* s : {runMean, runVar}) {
    if (!s->isParameter() || s->trainable())
      return invalidArgument("training mode: " + n->describe() + " takes its statistics from '%" +
                             s->name() + "', " +
                             (s->isParameter() ? "a trainable parameter" : "a computed value") +
                             "; training needs them as non-trainable parameters (running "
                             "buffers: `buffer` in the text IR, \"trainable\": false in JSON)");
  }
  const ir::Shape& xs = x->type().shape;
  const int64_t c = xs[1];
  const int64_t count = x->type().numElements() / std::max<int64_t>(c, 1);
  if (count < 2)
    return invalidArgument("training mode: " + n->describe() + " normalizes " +
                           std::to_string(count) +
                           " value per channel; batch statistics need at least 2 (use a batch "
                           "of 2 or more)");
  GraphBuilder e(g, n, n, ".train", "training mode of " + n->describe());
  // The statistics in one op, the normalization in another (pointwise: it fuses with the relu
  // or residual add after it); their gradient ops, batch_norm_backward_reduce and
  // batch_norm_backward, read x twice and write dx once.
  KILN_ASSIGN_OR_RETURN(Value * stats, e.op(OpKind::kBatchNormStats, {x}));
  KILN_ASSIGN_OR_RETURN(Value * mean, e.row(stats, 0));
  KILN_ASSIGN_OR_RETURN(Value * var, e.row(stats, 1));
  KILN_ASSIGN_OR_RETURN(Value * y,
                        e.op(OpKind::kBatchNormTrain, {x, n->input(1), n->input(2), mean, var},
                             {{"epsilon", n->attr().getFloat("epsilon")}}));

  // running = (1 - m) running + m batch; the variance is the unbiased one, as in PyTorch.
  auto update = [&](Value* running, Value* batch, double factor) -> Status {
    KILN_ASSIGN_OR_RETURN(Value * mb, e.mulScalar(batch, momentum * factor));
    KILN_ASSIGN_OR_RETURN(Value * kr, e.mulScalar(running, 1 - momentum));
    KILN_ASSIGN_OR_RETURN(Value * next, e.op(OpKind::kAdd, {kr, mb}));
    if (!running->isState()) KILN_TRY(g.markState(running));
    writes.push_back({running, next});
    return Status::ok();
  };
  KILN_TRY(update(runMean, mean, 1.0));
  KILN_TRY(update(runVar, var, static_cast<double>(count) / static_cast<double>(count - 1)));
  g.replaceAllUsesWith(n->output(), y);
  return Status::ok();
}

}  // namespace

Expected<TrainingMode> toTrainingMode(ir::Graph& g, const TrainingModeOptions& options) {
  TrainingMode out;
  Value* step = nullptr;
  std::vector<ir::Node*> rewritten;
  for (ir::Node* n : g.nodes()) {
    if (n->op() == OpKind::kBatchNorm) {
      KILN_TRY(rewriteBatchNorm(g, n, options.batchNormMomentum, out.writes));
      rewritten.push_back(n);
      ++out.batchNorms;
    } else if (n->op() == OpKind::kDropout && options.dropout && n->attr().getFloat("ratio") > 0) {
      if (!step) {
        KILN_ASSIGN_OR_RETURN(
            step, g.addParameter("dropout.step", ir::TensorData::scalar(ir::DType::kI64, 0),
                                 /*trainable=*/false));
        KILN_TRY(g.markState(step));
      }
      const int64_t seed = static_cast<int64_t>(options.seed) + out.dropouts;
      // Element offset of the first sample: elements per sample (the batch is dim 0).
      const ir::TensorType& xt = n->input(0)->type();
      const int64_t perSample =
          xt.rank() > 0 && xt.shape[0] > 0 ? xt.numElements() / xt.shape[0] : 0;
      auto d = g.insertNode(n, OpKind::kDropoutTrain, {n->input(0), step},
                            {{"ratio", n->attr().getFloat("ratio")},
                             {"seed", seed},
                             {"offset", options.firstSample * perSample}});
      if (!d) return d.status().withContext("training mode of " + n->describe());
      if (!n->name().empty()) (*d)->setName(n->name());
      g.replaceAllUsesWith(n->output(), (*d)->output());
      rewritten.push_back(n);
      ++out.dropouts;
    }
  }
  if (step) {
    KILN_ASSIGN_OR_RETURN(
        Value * one,
        g.addParameter(g.freshName(), ir::TensorData::scalar(ir::DType::kI64, 1), false));
    KILN_ASSIGN_OR_RETURN(ir::Node * next, g.addNode(OpKind::kAdd, {step, one}));
    out.writes.push_back({step, next->output()});
  }
  const std::unordered_set<const ir::Node*> dead(rewritten.begin(), rewritten.end());
  g.removeNodesIf([&](const ir::Node& n) { return dead.count(&n) > 0; });
  return out;
}

}  // namespace kiln::passes
