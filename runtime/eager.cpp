#include "runtime/eager.h"

#include <chrono>

#include "ir/timing.h"
#include "runtime/library/kernels.h"
#include "runtime/reference/kernels.h"

namespace kiln::runtime {

Status checkInputs(const ir::Graph& graph, std::span<const Tensor> inputs) {
  const auto& want = graph.inputs();
  if (inputs.size() != want.size()) {
    std::string names;
    for (const ir::Value* v : want) names += (names.empty() ? "" : ", ") + v->name();
    return invalidArgument("graph '" + graph.name() + "' takes " + std::to_string(want.size()) +
                           " inputs (" + names + "), got " + std::to_string(inputs.size()));
  }
  for (size_t i = 0; i < want.size(); ++i) {
    const ir::TensorType& t = want[i]->type();
    if (inputs[i].dtype() != t.dtype || inputs[i].shape() != t.shape)
      return invalidArgument("input '" + want[i]->name() + "' (#" + std::to_string(i) +
                             "): expected " + ir::TensorType{t.dtype, t.shape}.toString() +
                             ", got " + inputs[i].describe());
  }
  return Status::ok();
}

EagerExecutor::EagerExecutor(const ir::Graph& graph, CachingAllocator* alloc)
    : graph_(graph), alloc_(alloc) {
  for (const ir::Value* v : graph.inputs()) slot_.emplace(v, slot_.size());
  for (const ir::Value* p : graph.parameters()) {
    slot_.emplace(p, slot_.size());
    params_.push_back(Tensor::fromData(p->data()));
  }
  const auto nodes = graph.nodes();
  for (const ir::Node* n : nodes)
    for (const ir::Value* o : n->outputs()) slot_.emplace(o, slot_.size());

  // A node-output value dies after its last reader unless it is a graph output; inputs and
  // parameters belong to the caller and the graph.
  std::unordered_map<const ir::Value*, size_t> lastUse;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const ir::Value* in : nodes[i]->inputs()) lastUse[in] = i;
  for (size_t i = 0; i < nodes.size(); ++i)
    for (const ir::Value* o : nodes[i]->outputs())
      if (!lastUse.count(o)) lastUse[o] = i;  // Never read: free right after it is made.
  for (const ir::Value* o : graph.outputs()) lastUse.erase(o);
  freeAfter_.resize(nodes.size());
  for (const auto& [v, i] : lastUse)
    if (v->producer()) freeAfter_[i].push_back(slot_.at(v));
}

Expected<std::vector<Tensor>> EagerExecutor::run(std::span<const Tensor> inputs) {
  KILN_TRY(checkInputs(graph_, inputs));
  for (const ir::Value* p : graph_.parameters())
    if (p->data().empty())
      return invalidArgument("parameter '" + p->name() + "' has no data (load its weights)");

  stats_ = EagerStats{};
  const AllocatorStats before = alloc_->stats();
  alloc_->resetPeak();
  const auto t0 = std::chrono::steady_clock::now();

  std::vector<Tensor> env(slot_.size());
  size_t s = 0;
  for (const Tensor& t : inputs) {
    KILN_ASSIGN_OR_RETURN(env[s], t.contiguous(alloc_));
    ++s;
  }
  for (const Tensor& p : params_) env[s++] = p;

  const auto nodes = graph_.nodes();
  std::vector<Tensor> ins, outs;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node* n = nodes[i];
    const auto tn = std::chrono::steady_clock::now();
    // Library kernels (oneDNN, OpenBLAS) where they exist, as PyTorch eager does; the
    // reference kernel otherwise.
    RefKernel kernel = libraryKernel(n->op(), n->output()->type().dtype);
    if (!kernel) kernel = referenceKernel(n->op());
    if (!kernel)
      return unimplemented(n->describe() + ": op '" + std::string(ir::opName(n->op())) +
                           "' has no CPU kernel");
    ins.clear();
    outs.clear();
    for (const ir::Value* v : n->inputs()) ins.push_back(env[slot_.at(v)]);
    for (const ir::Value* o : n->outputs()) {
      auto t = Tensor::empty(o->type().dtype, o->type().shape, alloc_);
      if (!t) return t.status().withContext(n->describe());
      outs.push_back(std::move(*t));
    }
    Status st = kernel(n->attr(), ins, outs);
    if (!st.isOk()) return st.withContext(n->describe());
    for (size_t k = 0; k < outs.size(); ++k) env[slot_.at(n->output(k))] = std::move(outs[k]);
    ins.clear();
    for (size_t dead : freeAfter_[i]) env[dead] = Tensor();
    const double ms = msSince(tn);
    stats_.nodes.push_back({n, ms});
    auto& agg = stats_.ops[std::string(ir::opName(n->op()))];
    ++agg.count;
    agg.ms += ms;
  }

  std::vector<Tensor> results;
  for (const ir::Value* o : graph_.outputs()) results.push_back(env[slot_.at(o)]);
  stats_.totalMs = msSince(t0);
  const AllocatorStats after = alloc_->stats();
  stats_.peakActivationBytes = after.peakBytesInUse - before.bytesInUse;
  stats_.numAllocations = after.numAllocations - before.numAllocations;
  return results;
}

}  // namespace kiln::runtime
