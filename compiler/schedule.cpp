#include "compiler/schedule.h"

#include <algorithm>

#include "codegen/lower.h"
#include "codegen/op_kernels.h"

namespace kiln::compiler {

Expected<runtime::PostOp> postOpOf(const ir::Node& n) {
  runtime::PostOp p;
  switch (n.op()) {
    case ir::OpKind::kRelu:
      p.kind = runtime::PostOp::Kind::kRelu;
      break;
    case ir::OpKind::kLeakyRelu:
      p.kind = runtime::PostOp::Kind::kLeakyRelu;
      p.alpha = n.attr().getFloat("alpha");
      break;
    case ir::OpKind::kClip:
      p.kind = runtime::PostOp::Kind::kClip;
      p.alpha = n.attr().getFloat("min");
      p.beta = n.attr().getFloat("max");
      break;
    case ir::OpKind::kSigmoid:
      p.kind = runtime::PostOp::Kind::kSigmoid;
      break;
    case ir::OpKind::kTanh:
      p.kind = runtime::PostOp::Kind::kTanh;
      break;
    case ir::OpKind::kGelu:
      p.kind = n.attr().getString("approximate") == "tanh" ? runtime::PostOp::Kind::kGeluTanh
                                                           : runtime::PostOp::Kind::kGeluErf;
      break;
    case ir::OpKind::kAdd:
      p.kind = runtime::PostOp::Kind::kAdd;
      break;
    default:
      return internalError(n.describe() + " is not a post-op");
  }
  return p;
}

Expected<std::vector<runtime::PostOp>> postOpsOf(std::span<const ir::Node* const> nodes) {
  std::vector<runtime::PostOp> post;
  int extra = 0;
  for (const ir::Node* n : nodes) {
    KILN_ASSIGN_OR_RETURN(runtime::PostOp p, postOpOf(*n));
    if (p.kind == runtime::PostOp::Kind::kAdd) p.input = extra++;
    post.push_back(p);
  }
  return post;
}

namespace {

bool isAliasGroup(const ir::FusionGroup& g) {
  for (const ir::Node* n : g.nodes)
    if (!n->info().has(ir::kReshapeLike)) return false;
  return true;
}

class Scheduler {
 public:
  Scheduler(const ir::Graph& graph, const std::vector<ir::FusionGroup>& groups,
            runtime::Backend& backend, bool horizontal)
      : graph_(graph), groups_(groups), backend_(backend), horizontal_(horizontal) {}

  // A lone slice whose output is one contiguous run of its input's bytes (a step of an unrolled
  // recurrence, a batch's rows) becomes a view at a byte offset into them instead of its copy
  // kernel `k`: where that input's bytes are the arena's (not a graph input's, a parameter's or
  // a graph output's, whose buffers the caller passes), the output is no graph output, and the
  // offset keeps the 16-byte alignment vector accesses and libraries look for. The run is
  // contiguous where the copy loads one access with the strides it stores with.
  bool aliasesContiguousRun(const ir::FusionGroup& g, const codegen::Kernel& k) {
    if (g.kind != ir::GroupKind::kView || g.nodes.size() != 1) return false;
    const ir::Value* in = g.nodes[0]->input(0);
    const ir::Value* out = g.nodes[0]->output();
    const ir::Value* root = s_.root(in);
    if (graphOutputs_.count(out) || graphOutputs_.count(root) || root->isInput() ||
        root->isParameter() || k.loads.size() != 1 || k.stores.size() != 1 || k.exprs.size() != 1 ||
        k.exprs[0].kind != codegen::ExprKind::kLoad)
      return false;
    const codegen::Access& load = k.loads[0];
    const codegen::Access& store = k.stores[0].access;
    const int64_t bytes = load.offset * static_cast<int64_t>(ir::dtypeSize(out->type().dtype));
    if (store.offset != 0 || load.strides != store.strides || bytes % 16 != 0) return false;
    s_.aliasOf[out] = in;
    s_.aliasOffset[out] = bytes;
    ++s_.aliases;
    return true;
  }

  Expected<Schedule> run() {
    KILN_TRY(buildSteps());
    return std::move(s_);
  }

 private:
  // One library call: the group's first node, with the rest of the group as post-ops.
  Status addLibraryStep(const ir::FusionGroup& g) {
    const ir::Node* head = g.nodes.front();
    const ir::OpKind op = head->op();
    StepDraft s(runtime::PlanStep::Kind::kOp, head->describe(), head);
    s.nodes.assign(g.nodes.begin(), g.nodes.end());
    s.inputs.assign(head->inputs().begin(), head->inputs().end());
    const ir::TensorType& yt = head->output()->type();
    s.library = backend_.hasLibraryKernel(op, yt.dtype, yt.layout);
    const ir::Value* current = head->output();
    for (size_t i = 1; i < g.nodes.size(); ++i) {
      const ir::Node* n = g.nodes[i];
      KILN_ASSIGN_OR_RETURN(runtime::PostOp p, postOpOf(*n));
      if (p.kind == runtime::PostOp::Kind::kAdd) {
        p.input = s.numExtra++;
        s.extra.push_back(n->input(0) == current ? n->input(1) : n->input(0));
      }
      s.postOps.push_back(p);
      current = n->output();
    }
    if (!s.library && !s.postOps.empty())
      return internalError(head->describe() + " has post-ops but no library kernel");
    for (const ir::Value* e : s.extra) s.inputs.push_back(e);
    s.outputs.push_back(current);
    // Its activations are channels-last: the output, or the inputs of an op whose output is not
    // an activation (batch_norm_stats, conv2d_backward_weight).
    s.channelsLast = head->output()->type().layout == ir::Layout::kNHWC;
    for (size_t i = 0; i < head->inputs().size(); ++i)
      s.channelsLast =
          s.channelsLast || (ir::isChannelsLastActivation(head->info(), static_cast<int>(i),
                                                          head->input(i)->type().rank()) &&
                             head->input(i)->type().layout == ir::Layout::kNHWC);
    if (s.channelsLast && !s.library)
      return internalError(head->describe() + " is channels-last but has no library kernel");
    if (head->info().findAttr("algo")) {  // A library op with a choice of algorithms.
      if (auto a = runtime::parseConvAlgo(head->attr().getString("algo"))) s.algo = *a;
    }
    s_.steps.push_back(std::move(s));
    return Status::ok();
  }

  // A lone op that a backend running CUDA kernels would otherwise run on the host (no library
  // kernel for it) becomes its op kernel where codegen has one (codegen/op_kernels.h).
  Expected<bool> addOpKernelStep(const ir::FusionGroup& g) {
    if (g.nodes.size() != 1 || !backend_.caps().runsCudaKernels()) return false;
    const ir::Node& n = *g.nodes.front();
    if (n.outputs().size() != 1) return false;
    const ir::TensorType& t = n.output()->type();
    if (backend_.hasLibraryKernel(n.op(), t.dtype, t.layout)) return false;
    const std::string name = "kiln_k" + std::to_string(s_.kernels.size());
    Expected<codegen::Kernel> k = codegen::opKernel(n, name);
    if (!k) {
      if (k.status().code() == ErrorCode::kUnimplemented) return false;  // On the host.
      return k.status();
    }
    // The indices it reads: graph inputs are checked by the plan on the host before the run,
    // constants here; the kernel checks the others (computed, or state: a step counter
    // indexing a table) itself, into a word of the plan's deviceIndexChecks.
    std::vector<runtime::IndexCheck> checks, onDevice;
    for (const codegen::IndexArg& a : k->indexArgs) {
      const ir::Value* v = n.input(static_cast<size_t>(a.arg));
      runtime::IndexCheck c{.kind = a.nonZero           ? runtime::IndexCheck::Kind::kNonZero
                                    : !a.limits.empty() ? runtime::IndexCheck::Kind::kResolved
                                    : a.position        ? runtime::IndexCheck::Kind::kPosition
                                                        : runtime::IndexCheck::Kind::kClass,
                            .limit = a.limit,
                            .ignore = a.ignore,
                            .axis = a.axis,
                            .op = std::string(ir::opName(n.op())),
                            .data = a.position
                                        ? n.input(static_cast<size_t>(a.data))->type().toString()
                                        : std::string(),
                            .limits = a.limits,
                            .dims = a.dims};
      // A constant (not state a step rewrites, nor trainable) is checked once; out of range,
      // the host's kernel reports it at the run.
      if (v->isConstant(/*inference=*/false)) {
        if (!runtime::checkIndices(c, runtime::Tensor::fromData(v->data())).isOk()) return false;
        continue;
      }
      const auto& ins = graph_.inputs();
      const auto at = std::find(ins.begin(), ins.end(), v);
      if (at != ins.end()) {
        c.input = static_cast<int>(at - ins.begin());
        checks.push_back(std::move(c));
        continue;
      }
      if (c.kind == runtime::IndexCheck::Kind::kClass ||
          c.kind == runtime::IndexCheck::Kind::kNonZero)
        c.data = v->type().toString();  // The target's or divisor's, as the reference's error.
      c.where = n.describe();
      onDevice.push_back(std::move(c));
    }
    if (onDevice.size() > 1) return false;  // One word a kernel.
    if (!onDevice.empty()) {
      k = codegen::opKernel(n, name, /*indexWord=*/true);
      KILN_TRY(k.status());
    }
    // Each input checked once per run for each range: the loss and its gradient read the same
    // labels (the error names the first op).
    for (runtime::IndexCheck& c : checks) {
      auto same = [&](const runtime::IndexCheck& d) {
        return d.kind == c.kind && d.input == c.input && d.limit == c.limit &&
               d.ignore == c.ignore && d.limits == c.limits && d.dims == c.dims;
      };
      if (std::none_of(s_.indexChecks.begin(), s_.indexChecks.end(), same))
        s_.indexChecks.push_back(std::move(c));
    }
    const int word = onDevice.empty() ? -1 : static_cast<int>(s_.deviceIndexChecks.size());
    if (!onDevice.empty()) s_.deviceIndexChecks.push_back(std::move(onDevice.front()));
    // A step for each of its launches, in order.
    std::vector<codegen::Kernel> launches = std::move(k->then);
    k->then.clear();
    launches.insert(launches.begin(), std::move(*k));
    for (codegen::Kernel& launch : launches) {
      StepDraft s(runtime::PlanStep::Kind::kKernel, launch.name);
      s.nodes = {g.nodes.front()};
      s.kernel = static_cast<int>(s_.kernels.size());
      s.indexWord = word;
      s.workspace = launch.workspaceBytes;
      KILN_TRY(setKernelValues(s, launch));
      s_.kernelGroup.push_back("op");
      s_.kernels.push_back(std::move(launch));
      s_.steps.push_back(std::move(s));
    }
    return true;
  }

  Status addReferenceSteps(const ir::FusionGroup& g) {
    for (const ir::Node* n : g.nodes) {
      for (const ir::Value* v : n->inputs())
        if (v->type().layout == ir::Layout::kNHWC)
          return internalError(n->describe() +
                               " would run on a reference kernel with a channels-last input");
      for (const ir::Value* v : n->outputs())
        if (v->type().layout == ir::Layout::kNHWC)
          return internalError(n->describe() +
                               " would run on a reference kernel with a channels-last output");
      StepDraft s(runtime::PlanStep::Kind::kOp, n->describe(), n);
      s.nodes = {n};
      s.inputs.assign(n->inputs().begin(), n->inputs().end());
      s.outputs.assign(n->outputs().begin(), n->outputs().end());
      // An op outside the library groups that the backend's library still runs (the GPU's
      // convolution gradients).
      if (n->outputs().size() == 1) {
        const ir::TensorType& t = n->output()->type();
        s.library = backend_.hasLibraryKernel(n->op(), t.dtype, t.layout);
      }
      if (s.library && n->info().findAttr("algo"))  // A gradient's timed algorithm.
        if (auto a = runtime::parseConvAlgo(n->attr().getString("algo"))) s.algo = *a;
      s_.steps.push_back(std::move(s));
    }
    return Status::ok();
  }

  // The step's inputs and outputs: the values the kernel's arguments name.
  Status setKernelValues(StepDraft& s, const codegen::Kernel& k) const {
    s.inputs.clear();
    s.outputs.clear();
    bool sawOutput = false;
    for (const codegen::KernelArg& a : k.args) {
      if (a.value.empty()) break;  // The workspace and the index word: no values (StepDraft's).
      const ir::Value* v = graph_.findValue(a.value);
      if (!v) return internalError("kernel " + k.name + " names unknown value " + a.value);
      if (a.output) {
        s.outputs.push_back(v);
        sawOutput = true;
      } else {
        if (sawOutput) return internalError("kernel " + k.name + ": inputs after outputs");
        s.inputs.push_back(v);
      }
    }
    return Status::ok();
  }

  // Horizontal fusion (the rule of codegen::Kernel::parts): a pointwise kernel joins the kernel
  // step just before it when it reads nothing that step writes, so that consecutive independent
  // kernels, the optimizer's update of every parameter above all, run as one parallel region
  // instead of one each (a fork and join apiece). Only on the CPU (a GPU replays the step's
  // launches from a CUDA graph). Memory decides the rest: the joining kernel's outputs now live
  // from the joint step on, so each must be a graph output (a parameter's update written in
  // place, or a result: no arena bytes) or small.
  bool joinsHorizontally(const StepDraft& s, const codegen::Kernel& k) const {
    static constexpr int64_t kSmallOutput = int64_t{1} << 16;  // Elements.
    static constexpr size_t kMaxParts = 128, kMaxArgs = 512;
    if (!horizontal_ || backend_.caps().runsCudaKernels() || k.isReduction() || s_.steps.empty())
      return false;
    const StepDraft& prev = s_.steps.back();
    if (prev.kind != runtime::PlanStep::Kind::kKernel) return false;
    const codegen::Kernel& pk = s_.kernels[static_cast<size_t>(prev.kernel)];
    if (pk.isReduction() || (pk.isHorizontal() && pk.parts.size() >= kMaxParts) ||
        pk.args.size() + k.args.size() > kMaxArgs)
      return false;
    for (const ir::Value* in : s.inputs)
      for (const ir::Value* out : prev.outputs)
        if (s_.root(in) == s_.root(out)) return false;
    for (const ir::Value* out : s.outputs)
      if (!graphOutputs_.count(out) && out->type().numElements() > kSmallOutput) return false;
    return true;
  }

  Status joinPrevious(StepDraft s, codegen::Kernel k) {
    StepDraft& prev = s_.steps.back();
    codegen::Kernel& pk = s_.kernels[static_cast<size_t>(prev.kernel)];
    std::string name = pk.name;
    std::vector<codegen::Kernel> parts;
    parts.push_back(std::move(pk));
    parts.push_back(std::move(k));
    KILN_ASSIGN_OR_RETURN(pk, codegen::horizontalKernel(std::move(name), std::move(parts)));
    KILN_TRY(setKernelValues(prev, pk));
    prev.nodes.insert(prev.nodes.end(), s.nodes.begin(), s.nodes.end());
    s_.kernelGroup[static_cast<size_t>(prev.kernel)] = "horizontal";
    return Status::ok();
  }

  Status buildSteps() {
    for (const ir::Value* v : graph_.outputs()) graphOutputs_.insert(v);
    for (const auto& g : groups_) {
      if (g.kind == ir::GroupKind::kLibrary || g.kind == ir::GroupKind::kOther) {
        KILN_ASSIGN_OR_RETURN(const bool added, addOpKernelStep(g));
        if (added) continue;
      }
      switch (g.kind) {
        case ir::GroupKind::kLibrary:
          KILN_TRY(addLibraryStep(g));
          break;
        case ir::GroupKind::kOther:
          KILN_TRY(addReferenceSteps(g));
          break;
        case ir::GroupKind::kView:
          if (isAliasGroup(g)) {
            for (const ir::Node* n : g.nodes) s_.aliasOf[n->output()] = n->input(0);
            s_.aliases += static_cast<int>(g.nodes.size());
            break;
          }
          [[fallthrough]];
        case ir::GroupKind::kPointwise:
        case ir::GroupKind::kReduction: {
          if (backend_.caps().kernelCode.empty()) {
            KILN_TRY(addReferenceSteps(g));  // The backend runs no generated code.
            break;
          }
          const std::string name = "kiln_k" + std::to_string(s_.kernels.size());
          auto k = codegen::lowerGroup(g, graphOutputs_, name);
          if (!k) {
            // A lone op the kernel IR cannot express (a cast it would round twice) may still
            // have an op kernel (an error other than "none" is a bug and fails the compile: it
            // may have left part of its steps).
            KILN_ASSIGN_OR_RETURN(const bool added, addOpKernelStep(g));
            if (added) break;
            s_.remarks.push_back("group " + std::to_string(g.id) +
                                 " runs op by op: " + k.status().message());
            KILN_TRY(addReferenceSteps(g));
            break;
          }
          if (aliasesContiguousRun(g, *k)) break;
          StepDraft s(runtime::PlanStep::Kind::kKernel, name);
          s.nodes.assign(g.nodes.begin(), g.nodes.end());
          s.kernel = static_cast<int>(s_.kernels.size());
          KILN_TRY(setKernelValues(s, *k));
          if (joinsHorizontally(s, *k)) {
            KILN_TRY(joinPrevious(std::move(s), std::move(*k)));
            break;
          }
          s_.kernelGroup.push_back(std::string(ir::groupKindName(g.kind)));
          s_.kernels.push_back(std::move(*k));
          s_.steps.push_back(std::move(s));
          break;
        }
      }
    }
    return Status::ok();
  }

  const ir::Graph& graph_;
  const std::vector<ir::FusionGroup>& groups_;
  runtime::Backend& backend_;
  bool horizontal_;
  std::unordered_set<const ir::Value*> graphOutputs_;
  Schedule s_;
};

}  // namespace

Expected<Schedule> scheduleGroups(const ir::Graph& graph,
                                  const std::vector<ir::FusionGroup>& groups,
                                  runtime::Backend& backend, bool horizontal) {
  return Scheduler(graph, groups, backend, horizontal).run();
}

}  // namespace kiln::compiler
