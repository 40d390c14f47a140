#include "runtime/eager.h"

#include <chrono>

#include "ir/timing.h"
#include "runtime/cpu/cpu_backend.h"

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
    : EagerExecutor(graph, makeCpuBackend(alloc)) {}

EagerExecutor::EagerExecutor(const ir::Graph& graph, std::shared_ptr<Backend> backend)
    : graph_(graph), backend_(std::move(backend)) {
  for (const ir::Value* v : graph.inputs()) slot_.emplace(v, slot_.size());
  for (const ir::Value* p : graph.parameters()) slot_.emplace(p, slot_.size());
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
  isOutput_.assign(slot_.size(), false);
  for (const ir::Value* o : graph.outputs()) isOutput_[slot_.at(o)] = true;
  for (const ir::Node* n : nodes) names_.push_back(n->describe());
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
  Backend& be = *backend_;
  Allocator& hostAlloc = be.hostAllocator();
  const auto params = graph_.parameters();
  const bool resident = !be.caps().hostAddressable;
  const bool uploadParams = resident && !residentValid_;
  if (uploadParams) {  // Before the statistics: weights are not activations.
    resident_.clear();
    for (const ir::Value* p : params) {
      KILN_ASSIGN_OR_RETURN(DeviceBuffer b, be.allocate(p->type().byteSize()));
      resident_.push_back(std::move(b));
    }
  }
  const AllocatorStats before = be.memoryStats();
  be.resetPeakMemory();
  const auto t0 = std::chrono::steady_clock::now();

  // Every value's bytes on the backend (owned, or a mapping of host bytes), by slot; graph
  // outputs are host tensors mapped onto the backend.
  std::vector<DeviceBuffer> env(slot_.size());
  std::vector<Tensor> host(slot_.size());
  auto mapped = [&](size_t slot, Tensor t) -> Status {
    KILN_ASSIGN_OR_RETURN(env[slot], be.mapHost(t.rawData(), t.byteSize()));
    host[slot] = std::move(t);
    return Status::ok();
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(Tensor c, inputs[i].contiguous(&hostAlloc));
    KILN_TRY(mapped(slot_.at(graph_.inputs()[i]), std::move(c)));
  }
  // Parameters: views of their host bytes where the backend addresses host memory; else device
  // copies made at the first run (and after parametersChanged) and kept, as a model moved to a
  // GPU keeps its weights there.
  for (size_t i = 0; i < params.size(); ++i) {
    const ir::Value* p = params[i];
    const size_t s = slot_.at(p);
    host[s] = Tensor::fromData(p->data());
    if (!resident) {
      KILN_TRY(
          mapped(s, host[s])
              .withContext("placing parameter '" + p->name() + "' on " + std::string(be.name())));
      continue;
    }
    env[s] = DeviceBuffer(nullptr, resident_[i].address().handle, resident_[i].bytes());
  }
  const auto nodes = graph_.nodes();
  // Declared after the buffers it uses: destroying a stream waits for its work.
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, be.openStream(0));
  const bool timed = stream->canTime();
  if (timed) KILN_TRY(stream->markStart());
  auto upload = [&](const ir::Value* v) {
    const size_t s = slot_.at(v);
    return stream->upload(env[s].address(), host[s].rawData(), host[s].byteSize());
  };
  for (const ir::Value* v : graph_.inputs()) KILN_TRY(upload(v));
  for (const ir::Value* v : params)
    if (!resident || uploadParams) KILN_TRY(upload(v));
  if (uploadParams) residentValid_ = true;

  std::vector<DeviceTensor> ins, outs;
  std::vector<DeviceAddress> args;
  std::vector<int64_t> argBytes;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const ir::Node* n = nodes[i];
    const auto tn = std::chrono::steady_clock::now();
    ins.clear();
    outs.clear();
    for (const ir::Value* v : n->inputs()) ins.push_back({env[slot_.at(v)].address(), v->type()});
    for (const ir::Value* o : n->outputs()) {
      const size_t s = slot_.at(o);
      if (isOutput_[s]) {
        auto t = Tensor::empty(o->type().dtype, o->type().shape, &hostAlloc);
        if (!t) return t.status().withContext(n->describe());
        KILN_TRY(mapped(s, std::move(*t)).withContext(n->describe()));
      } else {
        auto b = be.allocate(o->type().byteSize());
        if (!b) return b.status().withContext(n->describe());
        env[s] = std::move(*b);
      }
      outs.push_back({env[s].address(), o->type()});
    }
    std::optional<NodeKernel> kernel;
    if (nodeKernels_ && n->outputs().size() == 1 &&
        !be.hasLibraryKernel(n->op(), n->output()->type().dtype, n->output()->type().layout)) {
      KILN_ASSIGN_OR_RETURN(kernel, nodeKernels_(*n));
    }
    if (kernel && !kernel->entry) {
      KILN_TRY(stream->copy(outs[0].address, ins[0].address, outs[0].type.byteSize())
                   .withContext(names_[i]));
    } else if (kernel) {
      args.clear();
      argBytes.clear();
      for (int a : kernel->args) {
        const DeviceTensor& t =
            a >= 0 ? ins[static_cast<size_t>(a)] : outs[static_cast<size_t>(-1 - a)];
        args.push_back(t.address);
        argBytes.push_back(static_cast<int64_t>(t.type.byteSize()));
      }
      KILN_TRY(stream
                   ->launch({names_[i], kernel->entry, kernel->units, kernel->elements,
                             kernel->block, kernel->grid, argBytes, kernel->scratchBytes},
                            args)
                   .withContext(names_[i]));
    } else {
      OpCall call;
      call.name = names_[i];
      call.op = n->op();
      call.attrs = &n->attrs();
      call.options = callOptions_;
      KILN_TRY(stream->run(call, ins, outs).withContext(names_[i]));
    }
    for (size_t dead : freeAfter_[i]) stream->free(std::move(env[dead]));
    const double ms = msSince(tn);
    stats_.nodes.push_back({n, ms, msBetween(t0, tn)});
    auto& agg = stats_.ops[std::string(ir::opName(n->op()))];
    ++agg.count;
    agg.ms += ms;
  }

  std::vector<Tensor> results;
  for (const ir::Value* o : graph_.outputs()) {
    const size_t s = slot_.at(o);
    if (!o->producer()) {
      // An input or parameter returned as is: a copy of its host bytes.
      KILN_ASSIGN_OR_RETURN(Tensor c, Tensor::empty(o->type().dtype, o->type().shape, &hostAlloc));
      KILN_TRY(c.copyFrom(host[s]));
      results.push_back(std::move(c));
      continue;
    }
    KILN_TRY(stream->download(host[s].rawData(), env[s].address(), host[s].byteSize()));
    results.push_back(host[s]);
  }
  if (timed) KILN_TRY(stream->markEnd());
  KILN_TRY(stream->synchronize());
  stats_.totalMs = msSince(t0);
  if (timed) {
    KILN_ASSIGN_OR_RETURN(stats_.deviceMs, stream->markedMs());
  }
  const AllocatorStats after = be.memoryStats();
  stats_.peakActivationBytes = after.peakBytesInUse - before.bytesInUse;
  stats_.numAllocations = after.numAllocations - before.numAllocations;
  return results;
}

}  // namespace kiln::runtime
