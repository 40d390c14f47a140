#include "compiler/train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>

#include "compiler/eager_kernels.h"
#include "passes/autodiff.h"
#include "passes/graph_builder.h"

namespace kiln::compiler {

namespace {

// Whether `backend` runs every op that layout selection may keep channels-last in NHWC
// (ir::kChannelsLast: the forward convolutions and pooling and their gradients).
bool runsGradientsChannelsLast(const runtime::Backend& backend) {
  for (int i = 0; i < ir::kNumOps; ++i) {
    const auto op = static_cast<ir::OpKind>(i);
    if (ir::hasTrait(op, ir::kChannelsLast) &&
        !backend.hasLibraryKernel(op, ir::DType::kF32, ir::Layout::kNHWC))
      return false;
  }
  return true;
}

}  // namespace

struct TrainingStep::DataParallel {
  static constexpr size_t kAfterRun = SIZE_MAX;
  struct Bucket {
    ir::DType dtype = ir::DType::kF32;
    std::vector<size_t> grads;     // Gradient numbers (the order of the trainable parameters).
    std::vector<size_t> offsets;   // Their byte offsets in `data`.
    size_t count = 0;              // Elements.
    size_t readyStep = kAfterRun;  // Every gradient is written once this plan step ran.
    runtime::Tensor data;          // Host memory: the update's gradients (views of it).
    runtime::DeviceBuffer device;  // With device collectives: the bucket summed on the device.
    int request = -1;
    bool done = true;
  };

  std::shared_ptr<runtime::Collectives> comm;
  // What sums the gradients: `comm` on host buckets, or device collectives on device buckets of
  // `backend` (TrainOptions::deviceCollectives).
  std::shared_ptr<runtime::Collectives> gradComm;
  std::shared_ptr<runtime::Backend> backend;
  std::unique_ptr<ir::Graph> graph;        // The update: gradients in, writes out.
  std::vector<passes::StateWrite> writes;  // Its outputs, in order.
  std::optional<size_t> okOutput;          // fp16: its "every gradient finite" output.
  std::unique_ptr<CompiledModel> compiled;
  std::unique_ptr<runtime::EagerExecutor> eager;
  size_t firstGrad = 0;  // The step plan's first gradient output.
  std::vector<ir::TensorType> gradTypes;
  std::vector<Bucket> buckets;
  std::vector<runtime::Tensor> gradViews;   // The update's inputs: views of the buckets.
  std::vector<ir::Value*> fromRankZero;     // Training mode's state, rank 0's after each step.
  std::vector<ir::TensorData> stateBefore;  // Its bytes before the step running (a copy).
  bool synced = false;                      // The parameters were broadcast.
  bool failed = false;                      // A step failed part way: the ranks are out of step.

  // Buckets of about `bucketBytes` in the order the step plan (null: eager) finishes the
  // gradients; rank 0's layout is every rank's (plans compiled apart could order steps apart).
  Status planBuckets(const CompiledModel* step, const TrainOptions& options);
  bool onDevice() const { return !gradComm->hostMemory(); }
  // The bucket's bytes as the gradient collectives take them.
  void* sumAddress(Bucket& bk) const {
    return onDevice() ? bk.device.address().handle : bk.data.rawData();
  }
};

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
  ir::Value* scale = nullptr;  // fp16: the loss scale (state).
  if (scaleLoss) {
    KILN_ASSIGN_OR_RETURN(
        scale,
        g.addParameter("loss_scale", ir::TensorData::scalar(loss->type().dtype, options.lossScale),
                       false));
    KILN_TRY(g.markState(scale));
    KILN_ASSIGN_OR_RETURN(lossForGrads, b.op(ir::OpKind::kMul, {loss, scale}));
  }
  KILN_ASSIGN_OR_RETURN(auto grads, passes::appendBackward(g, lossForGrads, params));
  const std::shared_ptr<runtime::Collectives>& comm = options.collectives;
  if (options.deviceCollectives && !comm)
    return invalidArgument(
        "TrainOptions::deviceCollectives sum the gradients of a data-parallel step, which also "
        "needs TrainOptions::collectives (host memory: MPI) for the parameters and the loss");
  std::vector<ir::Value*> outs{loss, logits};
  CompileOptions co = options.compile;
  co.inference = false;
  // Channels-last training where the backend runs every channels-last op's NHWC form, the
  // gradients of convolution, pooling and BatchNorm included (the CPU); elsewhere forward
  // convolutions alone would be NHWC, with a relayout around every gradient (measured on
  // resnet18 at batch 32, before the gradients ran NHWC: 3.78 s per step, 2.69 s without).
  {
    const auto backend =
        options.compile.backend ? options.compile.backend : runtime::defaultBackend();
    if (!runsGradientsChannelsLast(*backend)) co.disabledPasses.insert("layout-selection");
  }
  if (!comm) {
    const size_t forwardAndBackward = g.numNodes();
    KILN_ASSIGN_OR_RETURN(ir::Value * ok, step->appendUpdate(g, params, grads, scale, options));
    // Node names tell the step's phases apart (phaseOf): the gradient's nodes end in ".backward"
    // (autodiff), the loss is "loss", the optimizer's are named here.
    const std::vector<ir::Node*> nodes = g.nodes();
    for (size_t i = forwardAndBackward; i < nodes.size(); ++i)
      if (nodes[i]->name().empty()) nodes[i]->setName("optimizer");
    step->writes_.insert(step->writes_.end(), mode.writes.begin(), mode.writes.end());
    for (const auto& w : step->writes_) outs.push_back(w.value);
    if (ok) {
      step->okOutput_ = outs.size();
      outs.push_back(ok);
    }
    g.setOutputs(outs);
  } else {
    KILN_TRY(step->buildDataParallel(params, grads, scale, mode, options));
    // The step's graph outputs the loss, the logits, training mode's writes, then the gradients.
    for (const auto& w : step->writes_) outs.push_back(w.value);
    outs.insert(outs.end(), grads.begin(), grads.end());
    g.setOutputs(outs);
  }
  for (size_t i = 0; i < step->writes_.size(); ++i)
    co.inPlaceOutputs.emplace_back(2 + i, step->writes_[i].target->name());

  if (options.eager) {
    auto backend = options.compile.backend ? options.compile.backend : runtime::defaultBackend();
    KILN_TRY(checkPrecision(options.compile.precision, *backend));
    auto executor = [&](ir::Graph& graph) -> Expected<std::unique_ptr<runtime::EagerExecutor>> {
      KILN_TRY(applyPrecision(graph, options.compile.precision));  // As the compiled step computes.
      auto e = std::make_unique<runtime::EagerExecutor>(graph, backend);
      KILN_TRY(useDeviceKernels(*e, backend, options.compile));
      return e;
    };
    KILN_ASSIGN_OR_RETURN(step->eager_, executor(g));
    if (step->ddp_) {
      KILN_ASSIGN_OR_RETURN(step->ddp_->eager, executor(*step->ddp_->graph));
      KILN_TRY(step->ddp_->planBuckets(nullptr, options));
    }
  } else {
    KILN_ASSIGN_OR_RETURN(step->compiled_, compile(g, co));
    if (step->ddp_) {
      CompileOptions uo = co;
      uo.inPlaceOutputs.clear();
      for (size_t i = 0; i < step->ddp_->writes.size(); ++i)
        uo.inPlaceOutputs.emplace_back(i, step->ddp_->writes[i].target->name());
      KILN_ASSIGN_OR_RETURN(step->ddp_->compiled, compile(*step->ddp_->graph, uo));
      KILN_TRY(step->ddp_->planBuckets(step->compiled_.get(), options));
    }
  }
  return step;
}

Expected<ir::Value*> TrainingStep::appendUpdate(ir::Graph& g, std::span<ir::Value* const> params,
                                                std::span<ir::Value* const> gradsIn,
                                                ir::Value* scale, const TrainOptions& options) {
  passes::GraphBuilder b(g);
  std::vector<ir::Value*> grads(gradsIn.begin(), gradsIn.end());
  ir::Value* ok = nullptr;  // fp16: every gradient finite.
  ir::Value *zero = nullptr, *one = nullptr, *good = nullptr;
  const size_t first = writes_.size();
  if (scale) {
    const ir::DType ldt = scale->type().dtype;
    KILN_ASSIGN_OR_RETURN(
        good, g.addParameter("loss_scale.good_steps", ir::TensorData::scalar(ldt, 0), false));
    KILN_TRY(g.markState(good));
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
  std::vector<passes::StateWrite> update;
  if (options.optimizer == TrainOptions::Optimizer::kSgd) {
    KILN_ASSIGN_OR_RETURN(update, passes::appendSgd(g, params, grads, options.sgd));
  } else {
    KILN_ASSIGN_OR_RETURN(update, passes::appendAdam(g, params, grads, options.adam));
  }
  writes_.insert(writes_.end(), update.begin(), update.end());
  if (scale) {
    // An overflowing step keeps every parameter and optimizer state; the scale halves, or
    // doubles after lossScaleGrowthInterval good steps.
    for (size_t i = first; i < writes_.size(); ++i) {
      passes::StateWrite& w = writes_[i];
      KILN_ASSIGN_OR_RETURN(w.value, b.op(ir::OpKind::kWhere, {ok, w.value, w.target}));
    }
    const ir::DType ldt = scale->type().dtype;
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
    writes_.push_back({scale, scaleNext});
    writes_.push_back({good, goodState});
    lossScale_ = scale;
  }
  return ok;
}

TrainingStep::~TrainingStep() = default;

Status TrainingStep::buildDataParallel(std::span<ir::Value* const> params,
                                       std::span<ir::Value* const> grads, ir::Value* scale,
                                       const passes::TrainingMode& mode,
                                       const TrainOptions& options) {
  auto d = std::make_unique<DataParallel>();
  d->comm = options.collectives;
  d->backend = options.compile.backend ? options.compile.backend : runtime::defaultBackend();
  if (!d->comm->hostMemory())
    return invalidArgument(std::string(d->comm->name()) +
                           " collectives sum device memory; TrainOptions::collectives must sum "
                           "host memory (MPI: runtime/mpi), with device collectives as "
                           "TrainOptions::deviceCollectives");
  d->gradComm = options.deviceCollectives ? options.deviceCollectives : d->comm;
  if (options.deviceCollectives) {
    const runtime::Collectives& dc = *options.deviceCollectives;
    if (dc.hostMemory())
      return invalidArgument(std::string(dc.name()) +
                             " collectives sum host memory: pass them as "
                             "TrainOptions::collectives, not as deviceCollectives");
    if (d->backend->caps().hostAddressable)
      return invalidArgument(std::string(dc.name()) +
                             " collectives sum device memory, but backend '" +
                             std::string(d->backend->name()) +
                             "' keeps tensors in host memory: train on a GPU (--device cuda), or "
                             "sum the gradients with the host collectives alone");
    if (dc.rank() != d->comm->rank() || dc.size() != d->comm->size())
      return invalidArgument("the device collectives are rank " + std::to_string(dc.rank()) +
                             " of " + std::to_string(dc.size()) + ", the host collectives rank " +
                             std::to_string(d->comm->rank()) + " of " +
                             std::to_string(d->comm->size()) + ": they must be the same ranks");
  }
  if (options.bucketBytes < 1)
    return invalidArgument("the all-reduce bucket size must be positive, got " +
                           std::to_string(options.bucketBytes) + " bytes");
  d->graph = std::make_unique<ir::Graph>();
  ir::Graph& u = *d->graph;
  passes::GraphBuilder b(u);
  std::vector<ir::Value*> uParams, uGrads;
  const int ranks = d->comm->size();
  for (size_t i = 0; i < params.size(); ++i) {
    // The same bytes as the step graph's parameter: the update writes what the forward reads.
    KILN_ASSIGN_OR_RETURN(ir::Value * p,
                          u.addParameter(params[i]->name(), params[i]->data(), true));
    KILN_ASSIGN_OR_RETURN(ir::Value * gi,
                          u.addInput("grad." + params[i]->name(), grads[i]->type()));
    if (ranks > 1) {
      KILN_ASSIGN_OR_RETURN(gi, b.mulScalar(gi, 1.0 / ranks));  // The sum's mean.
    }
    uParams.push_back(p);
    uGrads.push_back(gi);
    d->gradTypes.push_back(grads[i]->type());
  }
  ir::Value* uScale = nullptr;
  if (scale) {
    KILN_ASSIGN_OR_RETURN(uScale, u.addParameter(scale->name(), scale->data(), false));
    KILN_TRY(u.markState(uScale));
  }
  writes_.clear();
  KILN_ASSIGN_OR_RETURN(ir::Value * ok, appendUpdate(u, uParams, uGrads, uScale, options));
  for (ir::Node* n : u.nodes())
    if (n->name().empty()) n->setName("optimizer");
  d->writes = std::move(writes_);
  writes_ = mode.writes;
  std::vector<ir::Value*> outs;
  for (const auto& w : d->writes) outs.push_back(w.value);
  if (ok) {
    d->okOutput = outs.size();
    outs.push_back(ok);
  }
  u.setOutputs(outs);
  d->firstGrad = 2 + writes_.size();
  for (const auto& w : mode.writes) {
    d->fromRankZero.push_back(w.target);
    d->stateBefore.push_back(w.target->data().clone());
  }
  ddp_ = std::move(d);
  return Status::ok();
}

Status TrainingStep::DataParallel::planBuckets(const CompiledModel* step,
                                               const TrainOptions& options) {
  const size_t n = gradTypes.size();
  std::vector<size_t> ready(n, kAfterRun);
  if (step) {
    const auto& steps = step->plan().steps;
    for (size_t si = 0; si < steps.size(); ++si)
      for (const runtime::BufferRef& o : steps[si].outputs) {
        const auto k = static_cast<size_t>(o.index);
        if (o.kind == runtime::BufferRef::Kind::kOutput && k >= firstGrad && k < firstGrad + n)
          ready[k - firstGrad] = si;
      }
  }
  // Rank 0 groups the gradients in the order its plan finishes them; every rank takes its layout:
  // [buckets, then per bucket its gradient count and numbers].
  std::vector<int64_t> layout;
  if (comm->rank() == 0) {
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    // Unwritten gradients (kAfterRun) last; ties in reverse parameter order, as the backward runs.
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return ready[a] != ready[b] ? ready[a] < ready[b] : a > b;
    });
    std::vector<std::vector<size_t>> groups;
    int64_t bytes = 0;
    // The first bucket holds at most 1 MB (DDP's first_bucket_bytes), so that communication
    // starts early in the backward.
    const int64_t firstCap = std::min<int64_t>(options.bucketBytes, int64_t{1} << 20);
    for (size_t k : order) {
      const int64_t size = static_cast<int64_t>(gradTypes[k].byteSize());
      if (groups.empty() || gradTypes[groups.back().front()].dtype != gradTypes[k].dtype ||
          bytes + size > (groups.size() == 1 ? firstCap : options.bucketBytes)) {
        groups.emplace_back();
        bytes = 0;
      }
      groups.back().push_back(k);
      bytes += size;
    }
    layout.push_back(static_cast<int64_t>(groups.size()));
    for (const auto& grp : groups) {
      layout.push_back(static_cast<int64_t>(grp.size()));
      for (size_t k : grp) layout.push_back(static_cast<int64_t>(k));
    }
  }
  int64_t words = static_cast<int64_t>(layout.size());
  KILN_TRY(comm->broadcast(&words, sizeof words, 0));
  layout.resize(static_cast<size_t>(words));
  KILN_TRY(comm->broadcast(layout.data(), layout.size() * sizeof(int64_t), 0));
  size_t at = 0;
  auto word = [&]() -> Expected<size_t> {
    if (at >= layout.size() || layout[at] < 0)
      return internalError("data-parallel: rank 0's bucket layout does not fit this rank's step");
    return static_cast<size_t>(layout[at++]);
  };
  KILN_ASSIGN_OR_RETURN(const size_t count, word());
  buckets.clear();
  buckets.resize(count);
  gradViews.assign(n, {});
  std::vector<bool> seen(n, false);
  for (Bucket& bk : buckets) {
    KILN_ASSIGN_OR_RETURN(const size_t grads, word());
    size_t offset = 0;
    bk.readyStep = 0;
    for (size_t j = 0; j < grads; ++j) {
      KILN_ASSIGN_OR_RETURN(const size_t k, word());
      if (k >= n || seen[k] || (j > 0 && gradTypes[k].dtype != bk.dtype))
        return internalError("data-parallel: rank 0's bucket layout does not fit this rank's step");
      seen[k] = true;
      bk.dtype = gradTypes[k].dtype;
      bk.grads.push_back(k);
      bk.offsets.push_back(offset);
      offset += gradTypes[k].byteSize();
      bk.count += static_cast<size_t>(gradTypes[k].numElements());
      bk.readyStep = options.overlap ? std::max(bk.readyStep, ready[k]) : kAfterRun;
    }
    KILN_ASSIGN_OR_RETURN(bk.data,
                          runtime::Tensor::empty(bk.dtype, {static_cast<int64_t>(bk.count)}));
    if (onDevice()) {
      KILN_ASSIGN_OR_RETURN(bk.device, backend->allocate(bk.data.byteSize()));
    }
    for (size_t j = 0; j < bk.grads.size(); ++j) {
      const size_t k = bk.grads[j];
      gradViews[k] = runtime::Tensor::wrap(bk.data.rawData() + bk.offsets[j], gradTypes[k].dtype,
                                           gradTypes[k].shape);
    }
  }
  for (size_t k = 0; k < n; ++k)
    if (!seen[k])
      return internalError("data-parallel: rank 0's bucket layout leaves out gradient " +
                           std::to_string(k));
  return Status::ok();
}

Expected<TrainingStep::Result> TrainingStep::operator()(const runtime::Tensor& x,
                                                        const runtime::Tensor& target) {
  std::lock_guard lock(mu_);
  if (ddp_) return runDataParallel(x, target);
  const std::vector<runtime::Tensor> inputs{x, target};
  auto outs = compiled_ ? compiled_->run(inputs) : eager_->run(inputs);
  if (!outs) return outs.status();
  // Write back: the parameters' bytes are shared with the plan (and the eager executor's
  // views), so the next step reads the new values.
  KILN_TRY(writeBack(writes_, *outs, 2));
  parametersChanged();
  Result r = measure((*outs)[0], (*outs)[1], target);
  if (okOutput_ > 0 && !(*outs)[okOutput_].data<bool>()[0]) r.skipped = true;
  return counted(r);
}

Expected<TrainingStep::Result> TrainingStep::runDataParallel(const runtime::Tensor& x,
                                                             const runtime::Tensor& target) {
  DataParallel& d = *ddp_;
  runtime::Collectives& c = *d.comm;
  if (d.failed)
    return invalidArgument(
        "an earlier data-parallel step failed on this rank in its communication or its update, so "
        "the ranks are out of step: stop every rank (runtime::Collectives::abort) instead of "
        "going on");
  // A step that fails in its communication or its update leaves this rank out of step with the
  // others: later calls are refused, and no all-reduce still running may keep writing a bucket.
  // A forward or backward that fails on some ranks does not: every rank still takes part in every
  // collective, and all of them learn of the failure and drop the step (below).
  struct OnFailure {
    DataParallel& d;
    runtime::Collectives& c;
    bool armed = true;
    ~OnFailure() {
      if (!armed) return;
      d.failed = true;
      for (DataParallel::Bucket& bk : d.buckets)
        if (!bk.done) {
          (void)c.wait(bk.request);
          bk.done = true;
        }
    }
  } onFailure{d, *d.gradComm};
  if (!d.synced) {
    // Every rank starts from rank 0's parameters and optimizer state (as DDP's constructor).
    for (ir::Value* p : parameters()) {
      ir::TensorData t = p->data();  // Shares the bytes.
      KILN_TRY(c.broadcast(t.data(), t.byteSize(), 0));
    }
    parametersChanged();
    d.synced = true;
  }
  // Training mode's state (BatchNorm's running statistics, dropout's step count: small), which a
  // compiled step writes in place while it runs: a step that fails on any rank puts it back.
  for (size_t i = 0; i < d.fromRankZero.size(); ++i) {
    const ir::TensorData t = d.fromRankZero[i]->data();  // Shares the bytes.
    std::memcpy(d.stateBefore[i].data(), t.data(), t.byteSize());
  }
  comm_ = {};
  comm_.buckets = static_cast<int>(d.buckets.size());
  size_t next = 0;  // The next bucket to start: every rank starts them in the same order.
  runtime::Collectives& gc = *d.gradComm;
  bool commFailed = false;  // A collective failed: the ranks are out of step.
  auto start = [&](DataParallel::Bucket& bk) -> Status {
    auto request = gc.startAllReduceSum(d.sumAddress(bk), bk.count, bk.dtype);
    if (!request) {
      commFailed = true;
      return request.status();
    }
    bk.request = *request;
    bk.done = false;
    comm_.bytes += static_cast<int64_t>(bk.data.byteSize());
    return Status::ok();
  };
  // After each step of the forward and backward: start the buckets whose gradients are all
  // written, and let the oldest one in flight progress.
  const runtime::StepHook hook = [&](size_t si, runtime::Stream& stream,
                                     std::span<const runtime::DeviceAddress> outs) -> Status {
    // Let the oldest all-reduce in flight progress.
    for (size_t i = 0; i < next; ++i)
      if (!d.buckets[i].done) {
        auto done = gc.test(d.buckets[i].request);
        if (!done) {
          commFailed = true;
          return done.status();
        }
        d.buckets[i].done = *done;
        break;
      }
    // Every ready bucket's copies first (to the host, or within the device), one synchronize (a
    // GPU stream's copies land only then; device collectives run on a stream of their own), then
    // their all-reduces.
    size_t ready = next;
    for (; ready < d.buckets.size() && d.buckets[ready].readyStep <= si; ++ready) {
      DataParallel::Bucket& bk = d.buckets[ready];
      for (size_t j = 0; j < bk.grads.size(); ++j) {
        const runtime::DeviceAddress grad = outs[d.firstGrad + bk.grads[j]];
        const size_t bytes = d.gradTypes[bk.grads[j]].byteSize();
        KILN_TRY(d.onDevice() ? stream.copy(bk.device.address(static_cast<int64_t>(bk.offsets[j])),
                                            grad, bytes)
                              : stream.download(bk.data.rawData() + bk.offsets[j], grad, bytes));
      }
    }
    if (ready == next) return Status::ok();
    KILN_TRY(stream.synchronize());
    for (; next < ready; ++next) {
      KILN_TRY(start(d.buckets[next]));
      ++comm_.startedEarly;
    }
    return Status::ok();
  };
  const std::vector<runtime::Tensor> inputs{x, target};
  const auto t0 = std::chrono::steady_clock::now();
  auto outs = compiled_ ? compiled_->run(inputs, nullptr, &hook) : eager_->run(inputs);
  const auto t1 = std::chrono::steady_clock::now();
  if (!outs && commFailed) return outs.status();
  // This rank's forward or backward failed (a bad input, an index out of range in its shard):
  // its remaining buckets are summed all the same (what they hold does not matter, no rank uses
  // the sums), so that no rank waits for it.
  const Status local = outs ? Status::ok() : outs.status();
  // The buckets the hook did not start (eager runs, --no-overlap): from the run's outputs.
  std::unique_ptr<runtime::Stream> copies;
  if (d.onDevice()) {
    KILN_ASSIGN_OR_RETURN(copies, d.backend->openStream(1));
  }
  for (; next < d.buckets.size(); ++next) {
    DataParallel::Bucket& bk = d.buckets[next];
    for (size_t j = 0; outs && j < bk.grads.size(); ++j) {
      const runtime::Tensor& gr = (*outs)[d.firstGrad + bk.grads[j]];
      if (d.onDevice())
        KILN_TRY(copies->upload(bk.device.address(static_cast<int64_t>(bk.offsets[j])),
                                gr.rawData(), gr.byteSize()));
      else
        std::memcpy(bk.data.rawData() + bk.offsets[j], gr.rawData(), gr.byteSize());
    }
    if (d.onDevice()) KILN_TRY(copies->synchronize());
    KILN_TRY(start(bk));
  }
  for (DataParallel::Bucket& bk : d.buckets)
    if (!bk.done) {
      KILN_TRY(gc.wait(bk.request));
      bk.done = true;
    }
  if (d.onDevice() && outs) {  // The sums, to the update's host inputs.
    for (DataParallel::Bucket& bk : d.buckets)
      KILN_TRY(copies->download(bk.data.rawData(), bk.device.address(), bk.data.byteSize()));
    KILN_TRY(copies->synchronize());
  }
  const auto t2 = std::chrono::steady_clock::now();
  // One all-reduce sums the global loss and correct count and says whether any rank failed.
  Result r;
  if (outs) r = measure((*outs)[0], (*outs)[1], target);
  double global[5] = {r.loss, static_cast<double>(r.correct), outs ? 0.0 : 1.0,
                      outs ? 0.0 : static_cast<double>(c.rank()),
                      !outs && local.isUserError() ? 1.0 : 0.0};
  KILN_TRY(c.allReduceSum(global, 5, ir::DType::kF64));
  if (const auto failedRanks = static_cast<int>(global[2]); failedRanks > 0) {
    // No rank takes the step: the parameters and optimizer state are untouched, training mode's
    // state is put back, and the ranks stay in step.
    for (size_t i = 0; i < d.fromRankZero.size(); ++i) {
      ir::TensorData t = d.fromRankZero[i]->data();  // Shares the bytes.
      std::memcpy(t.data(), d.stateBefore[i].data(), t.byteSize());
    }
    parametersChanged();
    onFailure.armed = false;
    const std::string who = failedRanks == 1 ? "rank " + std::to_string(static_cast<int>(global[3]))
                                             : std::to_string(failedRanks) + " of " +
                                                   std::to_string(c.size()) + " ranks";
    const std::string dropped =
        "no rank applied this data-parallel step or changed its state, and the ranks are still in "
        "step: the next step may go on";
    if (!outs)
      return local.withContext("data-parallel step on rank " + std::to_string(c.rank()) + " of " +
                               std::to_string(c.size()) + " (" + dropped + ")");
    const std::string message =
        "data-parallel step: " + who + " failed (the error is on that rank's side); " + dropped;
    return static_cast<int>(global[4]) == failedRanks ? invalidArgument(message)
                                                      : internalError(message);
  }
  r.loss = global[0] / c.size();
  r.correct = static_cast<int64_t>(global[1]);
  KILN_TRY(writeBack(writes_, *outs, 2));
  for (ir::Value* v : d.fromRankZero) {
    ir::TensorData t = v->data();
    KILN_TRY(c.broadcast(t.data(), t.byteSize(), 0));
  }
  // The update comes last: no collective follows it, so a rank whose update fails (it is out of
  // step from then on and refuses later steps) leaves no other rank waiting in this step.
  const auto t3 = std::chrono::steady_clock::now();
  auto updated = d.compiled ? d.compiled->run(d.gradViews) : d.eager->run(d.gradViews);
  if (!updated) return updated.status();
  KILN_TRY(writeBack(d.writes, *updated, 0));
  parametersChanged();
  const auto ms = [](auto a, auto b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
  };
  comm_.backwardMs = ms(t0, t1);
  comm_.exposedMs = ms(t1, t2);
  comm_.optimizerMs = ms(t3, std::chrono::steady_clock::now());
  if (d.okOutput && !(*updated)[*d.okOutput].data<bool>()[0]) r.skipped = true;
  onFailure.armed = false;
  return counted(r);
}

Status TrainingStep::writeBack(std::span<const passes::StateWrite> writes,
                               std::span<const runtime::Tensor> outs, size_t firstOutput) {
  for (size_t i = 0; i < writes.size(); ++i) {
    ir::TensorData dst = writes[i].target->data();  // Shares the bytes.
    const runtime::Tensor& src = outs[firstOutput + i];
    if (src.byteSize() != dst.byteSize())
      return internalError("training step: the update of '%" + writes[i].target->name() + "' has " +
                           std::to_string(src.byteSize()) + " bytes, expected " +
                           std::to_string(dst.byteSize()));
    // Compiled steps write most of them in place already (CompileOptions::inPlaceOutputs).
    if (src.rawData() != dst.data()) std::memcpy(dst.data(), src.rawData(), dst.byteSize());
  }
  return Status::ok();
}

TrainingStep::Result TrainingStep::measure(const runtime::Tensor& l, const runtime::Tensor& logits,
                                           const runtime::Tensor& target) const {
  Result r;
  r.loss =
      l.dtype() == ir::DType::kF64 ? l.data<double>()[0] : static_cast<double>(l.data<float>()[0]);
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

Expected<TrainingStep::Result> TrainingStep::counted(Result r) {
  skipped_ += r.skipped;
  ++steps_;
  if (!std::isfinite(r.loss) && !allowNonFinite_)
    return invalidArgument(
        "training step " + std::to_string(steps_) + ": the loss is " + std::to_string(r.loss) +
        ": the batch holds NaN or infinite values, or training diverged (try a lower learning "
        "rate). This step's update has been applied, so the parameters may now hold NaN too. "
        "Allow it with TrainOptions::allowNonFinite (kiln train --allow-nonfinite)");
  return r;
}

std::vector<ir::Value*> TrainingStep::parameters() const {
  std::vector<ir::Value*> out = graph_->parameters();
  // The update graph's own state (momenta, moments, fp16's good-step count); its weights and loss
  // scale are the step graph's (the same bytes and names), its constants are made again.
  if (ddp_)
    for (ir::Value* p : ddp_->graph->parameters())
      if (p->isState() && !graph_->findValue(p->name())) out.push_back(p);
  return out;
}

void TrainingStep::parametersChanged() {
  if (compiled_) compiled_->parametersChanged();
  if (eager_) eager_->parametersChanged();
  if (ddp_ && ddp_->compiled) ddp_->compiled->parametersChanged();
  if (ddp_ && ddp_->eager) ddp_->eager->parametersChanged();
}

size_t TrainingStep::allReduceBuckets() const {
  return ddp_ ? ddp_->buckets.size() : 0;
}

const CompiledModel* TrainingStep::compiledUpdate() const {
  return ddp_ ? ddp_->compiled.get() : nullptr;
}

void TrainingStep::setProfiling(bool on) {
  if (compiled_) compiled_->setProfiling(on);
  if (ddp_ && ddp_->compiled) ddp_->compiled->setProfiling(on);
}

std::map<std::string, ir::TensorData> TrainingStep::state() const {
  std::map<std::string, ir::TensorData> out;
  for (const ir::Value* p : parameters()) out.emplace(p->name(), p->data());
  return out;
}

Status TrainingStep::restore(const std::map<std::string, ir::TensorData>& state, int64_t stepsRun) {
  std::lock_guard lock(mu_);
  const std::vector<ir::Value*> params = parameters();
  // Check everything before changing anything: a bad checkpoint leaves the step as it was.
  for (const ir::Value* p : params) {
    auto it = state.find(p->name());
    if (it == state.end())
      return invalidArgument("the checkpoint has no tensor '" + p->name() + "' (" +
                             p->type().toString() + ")");
    if (it->second.dtype() != p->data().dtype() || it->second.shape() != p->data().shape())
      return invalidArgument("the checkpoint's '" + p->name() + "' is " +
                             it->second.type().toString() + ", the step's is " +
                             p->data().type().toString());
  }
  for (ir::Value* p : params) {
    ir::TensorData dst = p->data();  // Shares the bytes the plan reads.
    std::memcpy(dst.data(), state.at(p->name()).data(), dst.byteSize());
  }
  parametersChanged();
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
