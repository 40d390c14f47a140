#include "compiler/train.h"

#include <cmath>
#include <cstring>

#include "compiler/eager_kernels.h"
#include "passes/autodiff.h"
#include "passes/graph_builder.h"

namespace kiln::compiler {

Expected<std::unique_ptr<TrainingStep>> TrainingStep::create(ir::Graph model,
                                                             const TrainOptions& options) {
  // fp16 has 5 exponent bits: small gradients flush to zero unless the loss is scaled up, and a
  // scale too large overflows; dynamic loss scaling (TrainOptions::lossScale) handles both. bf16
  // has f32's range and needs none.
  const bool scaleLoss = options.compile.precision == Precision::kFp16;
  if (scaleLoss && !(options.lossScale >= 1))
    return invalidArgument("the initial loss scale must be at least 1, got " +
                           std::to_string(options.lossScale));
  if (scaleLoss && options.lossScaleGrowthInterval < 1)
    return invalidArgument("the loss scale's growth interval must be at least 1 step");
  auto step = std::unique_ptr<TrainingStep>(new TrainingStep());
  step->allowNonFinite_ = options.allowNonFinite;
  step->graph_ = std::make_unique<ir::Graph>(std::move(model));
  ir::Graph& g = *step->graph_;
  if (g.inputs().size() != 1 || g.outputs().size() != 1)
    return invalidArgument("training needs a model with one input and one output, got " +
                           std::to_string(g.inputs().size()) + " inputs and " +
                           std::to_string(g.outputs().size()) + " outputs");
  ir::Value* logits = g.outputs()[0];
  using Loss = TrainOptions::Loss;
  const bool classes = logits->type().rank() == 2 && ir::isFloat(logits->type().dtype);
  if (options.loss == Loss::kCrossEntropy && !classes)
    return invalidArgument("cross-entropy training needs an output of logits [N, C], got " +
                           logits->type().toString() + " (use the MSE loss)");
  step->crossEntropy_ =
      options.loss == Loss::kCrossEntropy || (options.loss == Loss::kAuto && classes);
  KILN_ASSIGN_OR_RETURN(passes::TrainingMode mode, passes::toTrainingMode(g, options.mode));
  logits = g.outputs()[0];  // Training mode may have replaced it.
  ir::Value* target;
  ir::Node* lossNode;
  if (step->crossEntropy_) {
    KILN_ASSIGN_OR_RETURN(target,
                          g.addInput("target", {ir::DType::kI64, {logits->type().shape[0]}}));
    KILN_ASSIGN_OR_RETURN(lossNode, g.addNode(ir::OpKind::kCrossEntropyLoss, {logits, target}));
  } else {
    KILN_ASSIGN_OR_RETURN(target,
                          g.addInput("target", {logits->type().dtype, logits->type().shape}));
    KILN_ASSIGN_OR_RETURN(lossNode, g.addNode(ir::OpKind::kMseLoss, {logits, target}));
  }
  lossNode->setName("loss");
  ir::Value* loss = lossNode->output(0);
  std::vector<ir::Value*> params;
  for (ir::Value* p : g.parameters())
    if (p->trainable()) params.push_back(p);
  passes::GraphBuilder b(g);
  ir::Value* lossForGrads = loss;
  ir::Value* scale = nullptr;
  ir::Value* good = nullptr;
  const ir::DType ldt = loss->type().dtype;
  if (scaleLoss) {
    auto state = [&](const std::string& name, double v) -> Expected<ir::Value*> {
      KILN_ASSIGN_OR_RETURN(ir::Value * s,
                            g.addParameter(name, ir::TensorData::scalar(ldt, v), false));
      KILN_TRY(g.markState(s));
      return s;
    };
    KILN_ASSIGN_OR_RETURN(scale, state("loss_scale", options.lossScale));
    KILN_ASSIGN_OR_RETURN(good, state("loss_scale.good_steps", 0));
    KILN_ASSIGN_OR_RETURN(lossForGrads, b.op(ir::OpKind::kMul, {loss, scale}));
  }
  KILN_ASSIGN_OR_RETURN(auto grads, passes::appendBackward(g, lossForGrads, params));
  ir::Value* ok = nullptr;  // fp16: every gradient finite.
  ir::Value *zero = nullptr, *one = nullptr;
  if (scaleLoss) {
    // sum(g * 0) over every gradient is 0 when all are finite and NaN when one holds an inf or
    // a NaN; the gradients are then unscaled.
    KILN_ASSIGN_OR_RETURN(zero, b.scalar(ldt, 0));
    KILN_ASSIGN_OR_RETURN(one, b.scalar(ldt, 1));
    KILN_ASSIGN_OR_RETURN(ir::Value * inv, b.op(ir::OpKind::kDiv, {one, scale}));
    ir::Value* probe = nullptr;
    for (ir::Value*& gr : grads) {
      KILN_ASSIGN_OR_RETURN(ir::Value * z, b.mulScalar(gr, 0));
      std::vector<int64_t> axes(static_cast<size_t>(z->type().rank()));
      for (size_t a = 0; a < axes.size(); ++a) axes[a] = static_cast<int64_t>(a);
      KILN_ASSIGN_OR_RETURN(ir::Value * sum, b.op(ir::OpKind::kReduceSum, {z},
                                                  {{"axes", axes}, {"keepdims", int64_t{0}}}));
      if (sum->type().dtype != ldt) {
        KILN_ASSIGN_OR_RETURN(
            sum, b.op(ir::OpKind::kCast, {sum}, {{"to", std::string(ir::dtypeName(ldt))}}));
      }
      if (probe) {
        KILN_ASSIGN_OR_RETURN(probe, b.op(ir::OpKind::kAdd, {probe, sum}));
      } else {
        probe = sum;
      }
      KILN_ASSIGN_OR_RETURN(gr, b.op(ir::OpKind::kMul, {gr, inv}));
    }
    KILN_ASSIGN_OR_RETURN(ok, b.op(ir::OpKind::kEqual, {probe, zero}));
  }
  const size_t forwardAndBackward = g.numNodes();
  if (options.optimizer == TrainOptions::Optimizer::kSgd) {
    KILN_ASSIGN_OR_RETURN(step->writes_, passes::appendSgd(g, params, grads, options.sgd));
  } else {
    KILN_ASSIGN_OR_RETURN(step->writes_, passes::appendAdam(g, params, grads, options.adam));
  }
  // Node names tell the step's phases apart (phaseOf): the gradient's nodes end in ".backward"
  // (autodiff), the loss is "loss", the optimizer's are named here.
  if (scaleLoss) {
    // An overflowing step keeps every parameter and optimizer state; the scale halves, or
    // doubles after lossScaleGrowthInterval good steps.
    for (passes::StateWrite& w : step->writes_) {
      KILN_ASSIGN_OR_RETURN(w.value, b.op(ir::OpKind::kWhere, {ok, w.value, w.target}));
    }
    KILN_ASSIGN_OR_RETURN(ir::Value * interval,
                          b.scalar(ldt, static_cast<double>(options.lossScaleGrowthInterval)));
    KILN_ASSIGN_OR_RETURN(ir::Value * goodNext, b.op(ir::OpKind::kAdd, {good, one}));
    KILN_ASSIGN_OR_RETURN(ir::Value * grow, b.op(ir::OpKind::kGreaterEqual, {goodNext, interval}));
    KILN_ASSIGN_OR_RETURN(ir::Value * doubled, b.mulScalar(scale, 2));
    KILN_ASSIGN_OR_RETURN(ir::Value * halved, b.mulScalar(scale, 0.5));
    KILN_ASSIGN_OR_RETURN(ir::Value * kept, b.op(ir::OpKind::kWhere, {grow, doubled, scale}));
    KILN_ASSIGN_OR_RETURN(ir::Value * scaleNext, b.op(ir::OpKind::kWhere, {ok, kept, halved}));
    KILN_ASSIGN_OR_RETURN(ir::Value * count, b.op(ir::OpKind::kWhere, {grow, zero, goodNext}));
    KILN_ASSIGN_OR_RETURN(ir::Value * goodState, b.op(ir::OpKind::kWhere, {ok, count, zero}));
    step->writes_.push_back({scale, scaleNext});
    step->writes_.push_back({good, goodState});
    step->lossScale_ = scale;
  }
  const std::vector<ir::Node*> nodes = g.nodes();
  for (size_t i = forwardAndBackward; i < nodes.size(); ++i)
    if (nodes[i]->name().empty()) nodes[i]->setName("optimizer");
  step->writes_.insert(step->writes_.end(), mode.writes.begin(), mode.writes.end());
  std::vector<ir::Value*> outs{loss, logits};
  for (const auto& w : step->writes_) outs.push_back(w.value);
  if (ok) {
    step->okOutput_ = outs.size();
    outs.push_back(ok);
  }
  g.setOutputs(outs);

  if (options.eager) {
    auto backend = options.compile.backend ? options.compile.backend : runtime::defaultBackend();
    KILN_TRY(checkPrecision(options.compile.precision, *backend));
    KILN_TRY(applyPrecision(g, options.compile.precision));  // As the compiled step computes.
    step->eager_ = std::make_unique<runtime::EagerExecutor>(g, backend);
    KILN_TRY(useDeviceKernels(*step->eager_, backend, options.compile));
  } else {
    CompileOptions co = options.compile;
    for (size_t i = 0; i < step->writes_.size(); ++i)
      co.inPlaceOutputs.emplace_back(2 + i, step->writes_[i].target->name());
    co.inference = false;
    // The backward kernels (conv2d_backward_*, the pooling backward ops, BatchNorm training)
    // are NCHW-only: channels-last forward convolutions would put a relayout around every one
    // of them. Measured on resnet18 at batch 32: 3.78 s per step with layout selection, 2.69 s
    // without.
    co.disabledPasses.insert("layout-selection");
    KILN_ASSIGN_OR_RETURN(step->compiled_, compile(g, co));
  }
  return step;
}

Expected<TrainingStep::Result> TrainingStep::operator()(const runtime::Tensor& x,
                                                        const runtime::Tensor& target) {
  std::lock_guard lock(mu_);
  const std::vector<runtime::Tensor> inputs{x, target};
  auto outs = compiled_ ? compiled_->run(inputs) : eager_->run(inputs);
  if (!outs) return outs.status();
  // Write back: the parameters' bytes are shared with the plan (and the eager executor's
  // views), so the next step reads the new values.
  for (size_t i = 0; i < writes_.size(); ++i) {
    ir::TensorData dst = writes_[i].target->data();  // Shares the bytes.
    const runtime::Tensor& src = (*outs)[2 + i];
    if (src.byteSize() != dst.byteSize())
      return internalError("training step: the update of '%" + writes_[i].target->name() +
                           "' has " + std::to_string(src.byteSize()) + " bytes, expected " +
                           std::to_string(dst.byteSize()));
    // Compiled steps write most of them in place already (CompileOptions::inPlaceOutputs).
    if (src.rawData() != dst.data()) std::memcpy(dst.data(), src.rawData(), dst.byteSize());
  }
  if (compiled_) compiled_->parametersChanged();
  if (eager_) eager_->parametersChanged();
  Result r;
  if (okOutput_ > 0 && !(*outs)[okOutput_].data<bool>()[0]) {
    r.skipped = true;
    ++skipped_;
  }
  const runtime::Tensor& l = (*outs)[0];
  r.loss =
      l.dtype() == ir::DType::kF64 ? l.data<double>()[0] : static_cast<double>(l.data<float>()[0]);
  ++steps_;
  if (!std::isfinite(r.loss) && !allowNonFinite_)
    return invalidArgument(
        "training step " + std::to_string(steps_) + ": the loss is " + std::to_string(r.loss) +
        ": the batch holds NaN or infinite values, or training diverged (try a lower learning "
        "rate). This step's update has been applied, so the parameters may now hold NaN too. "
        "Allow it with TrainOptions::allowNonFinite (kiln train --allow-nonfinite)");
  const runtime::Tensor& logits = (*outs)[1];
  if (!crossEntropy_ || logits.dtype() != ir::DType::kF32) return r;
  const int64_t n = logits.shape()[0], c = logits.shape()[1];
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits.data<float>() + i * c;
    int64_t best = 0;
    for (int64_t k = 1; k < c; ++k)
      if (row[k] > row[best]) best = k;
    r.correct += best == target.data<int64_t>()[i];
  }
  return r;
}

std::map<std::string, ir::TensorData> TrainingStep::state() const {
  std::map<std::string, ir::TensorData> out;
  for (const ir::Value* p : graph_->parameters()) out.emplace(p->name(), p->data());
  return out;
}

Status TrainingStep::restore(const std::map<std::string, ir::TensorData>& state, int64_t stepsRun) {
  std::lock_guard lock(mu_);
  // Check everything before changing anything: a bad checkpoint leaves the step as it was.
  for (const ir::Value* p : graph_->parameters()) {
    auto it = state.find(p->name());
    if (it == state.end())
      return invalidArgument("the checkpoint has no tensor '" + p->name() + "' (" +
                             p->type().toString() + ")");
    if (it->second.dtype() != p->data().dtype() || it->second.shape() != p->data().shape())
      return invalidArgument("the checkpoint's '" + p->name() + "' is " +
                             it->second.type().toString() + ", the step's is " +
                             p->data().type().toString());
  }
  for (ir::Value* p : graph_->parameters()) {
    ir::TensorData dst = p->data();  // Shares the bytes the plan reads.
    std::memcpy(dst.data(), state.at(p->name()).data(), dst.byteSize());
  }
  if (compiled_) compiled_->parametersChanged();
  if (eager_) eager_->parametersChanged();
  steps_ = stepsRun;
  return Status::ok();
}

std::string_view phaseOf(std::string_view nodeName) {
  if (nodeName.starts_with("optimizer")) return "optimizer";
  if (nodeName.find(".backward") != std::string_view::npos) return "backward";
  return "forward";
}

double TrainingStep::lossScale() const {
  if (!lossScale_) return 0;
  const ir::TensorData& d = lossScale_->data();
  return d.dtype() == ir::DType::kF64 ? d.as<double>()[0] : static_cast<double>(d.as<float>()[0]);
}

}  // namespace kiln::compiler
