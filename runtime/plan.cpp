#include "runtime/plan.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>

#include "ir/timing.h"
#include "runtime/reference/kernels.h"

namespace kiln::runtime {

Status checkIndices(const IndexCheck& c, const Tensor& indices) {
  switch (c.kind) {
    case IndexCheck::Kind::kClass:
      return checkClassIndices(c.op, indices, c.limit, c.ignore);
    case IndexCheck::Kind::kPosition:
      return checkPositions(c.op, indices, c.limit, c.axis, c.data);
    case IndexCheck::Kind::kResolved:
      return checkResolvedIndices(c.op, indices, c.limits, c.dims);
    case IndexCheck::Kind::kNonZero:
      return checkNonZeroDivisor(c.op, indices);
  }
  return internalError("unknown index check");
}

IndexWord::Report IndexWord::decode(uint64_t word) {
  using namespace ir::index_word;
  Report r;
  r.position = static_cast<int64_t>(word >> kPositionShift);
  r.positionSaturated = r.position >= kMaxPosition;
  r.valueSaturated = (word >> kOutsideInt32Bit & 1) != 0;
  r.value = static_cast<int64_t>(word & ((uint64_t{1} << kOutsideInt32Bit) - 1)) - kValueBias;
  return r;
}

Status deviceIndexError(const IndexCheck& c, uint64_t word) {
  if (word == IndexWord::kClear) return Status::ok();
  const IndexWord::Report r = IndexWord::decode(word);
  const uint64_t p = static_cast<uint64_t>(r.position);
  // Saturated: the kernel saw this bound or beyond it.
  const std::string position =
      std::to_string(r.position) + (r.positionSaturated ? " or later" : "");
  const std::string value = std::to_string(r.value) + (!r.valueSaturated ? ""
                                                       : r.value > 0     ? " or more"
                                                                         : " or less");
  std::string message;
  switch (c.kind) {
    case IndexCheck::Kind::kClass:
      message = classIndexError(c.op, value, position, c.data, c.limit, c.ignore);
      break;
    case IndexCheck::Kind::kPosition:
      message = positionError(c.op, value, position, c.limit, c.axis, c.data);
      break;
    case IndexCheck::Kind::kResolved: {
      if (c.limits.empty() || c.limits.size() != c.dims.size())
        return internalError("a scatter's index check without its dims");
      // A saturated position names no component: the first one's dim is said.
      const size_t k = r.positionSaturated ? 0 : p % c.limits.size();
      message = resolvedIndexError(c.op, value, c.dims[k], c.limits[k]);
      break;
    }
    case IndexCheck::Kind::kNonZero:
      message = zeroDivisorError(c.op, c.data, position);
      break;
  }
  return invalidArgument(message).withContext(c.where);
}

bool Plan::writesParameters() const {
  for (int p : outputParameter)
    if (p >= 0) return true;
  for (const PlanStep& s : steps)
    for (const BufferRef& b : s.outputs)
      if (b.kind == BufferRef::Kind::kParameter) return true;
  return false;
}

int64_t Plan::parameterBytes() const {
  int64_t b = 0;
  for (const ir::TensorData& d : parameters) b += static_cast<int64_t>(d.byteSize());
  return b;
}

int64_t Plan::bytesPerCall() const {
  int64_t b = arenaBytes;
  for (size_t i = 0; i < outputs.size(); ++i)
    if (i >= outputParameter.size() || outputParameter[i] < 0)
      b += static_cast<int64_t>(outputs[i].byteSize());
  return b;
}

// What one call in progress holds: its scratch arena and, where the plan replays a captured
// graph, the device buffers of the inputs and outputs the graph reads and writes, and the graph.
struct PlanExecutor::Slot {
  DeviceBuffer arena;
  std::vector<DeviceBuffer> ins, outs;
  std::shared_ptr<CapturedWork> graph;
  uint64_t paramsGeneration = 0;  // The parameters' mapping the graph reads.
  // The stream the graph was captured on and is replayed on: the device's per-stream resources
  // it recorded (library workspaces) are then never shared with another call. Last, so that it
  // is destroyed (waiting for its work) before the buffers.
  std::unique_ptr<Stream> stream;
};

// Slots, one per call in progress, reused across calls.
struct PlanExecutor::Arenas {
  Arenas(Backend& backend, int64_t bytes) : backend(backend), bytes(bytes) {}

  Expected<std::unique_ptr<Slot>> take() {
    {
      std::unique_lock lock(mu);
      // Under a memory limit, a call waits for an arena once `max` exist.
      cv.wait(lock, [&] { return !free.empty() || max == 0 || allocated < max; });
      if (!free.empty()) {
        std::unique_ptr<Slot> a = std::move(free.back());
        free.pop_back();
        return a;
      }
      ++allocated;  // Reserved now, so that concurrent calls respect `max`.
    }
    Expected<DeviceBuffer> a = backend.allocate(static_cast<size_t>(bytes));
    if (!a) {
      {
        std::lock_guard lock(mu);
        --allocated;
      }
      cv.notify_one();
      return a.status().withContext("the plan's " + std::to_string(bytes) + "-byte scratch arena");
    }
    auto slot = std::make_unique<Slot>();
    slot->arena = std::move(*a);
    return slot;
  }
  void give(std::unique_ptr<Slot> a) {
    {
      std::lock_guard lock(mu);
      free.push_back(std::move(a));
    }
    cv.notify_one();
  }

  Backend& backend;
  const int64_t bytes;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<Slot>> free;
  size_t allocated = 0;
  size_t max = 0;  // 0: no bound.
};

// What a call holds while it runs: the run lock, shared (exclusive for a serialized plan: in-place
// parameter writes run alone; clearLibraryCache waits for every call), and then a slot, given
// back to the pool at the end.
class PlanExecutor::Occupancy {
 public:
  explicit Occupancy(PlanExecutor& e)
      : arenas_(*e.arenas_),
        shared_(e.runMu_, std::defer_lock),
        exclusive_(e.runMu_, std::defer_lock) {
    if (e.serialized_)
      exclusive_.lock();
    else
      shared_.lock();
  }
  ~Occupancy() {
    if (slot) arenas_.give(std::move(slot));
  }
  Status takeSlot() {
    KILN_ASSIGN_OR_RETURN(slot, arenas_.take());
    return Status::ok();
  }
  std::unique_ptr<Slot> slot;

 private:
  Arenas& arenas_;
  std::shared_lock<std::shared_mutex> shared_;
  std::unique_lock<std::shared_mutex> exclusive_;
};

PlanExecutor::PlanExecutor(std::shared_ptr<const Plan> plan, int threads)
    : plan_(std::move(plan)),
      backend_(plan_->backend ? plan_->backend : defaultBackend()),
      threads_(threads),
      serialized_(plan_->writesParameters()),
      cache_(std::make_unique<LibraryCache>()),
      arenas_(std::make_unique<Arenas>(*backend_, plan_->arenaBytes)) {
  std::vector<bool> written(plan_->parameters.size(), false);
  for (const PlanStep& s : plan_->steps)
    for (const BufferRef& b : s.outputs)
      if (b.kind == BufferRef::Kind::kParameter) written[static_cast<size_t>(b.index)] = true;
  for (size_t i = 0; i < written.size(); ++i)
    if (written[i]) writtenParameters_.push_back(static_cast<int>(i));
  // Speculation needs a plan that can run twice (no parameter written) and a step to gain from.
  const char* env = std::getenv("KILN_FUSED_ACTIVATIONS");
  if (writtenParameters_.empty() && !(env && std::string_view(env) == "0"))
    for (const PlanStep& s : plan_->steps)
      if (s.kind == PlanStep::Kind::kOp && s.library)
        for (const PostOp& op : s.postOps) fusesActivations_ |= fusesWhenChecked(op.kind);
  // Each kernel argument's bytes (KernelLaunch::argBytes), fixed by the plan.
  argBytes_.resize(plan_->steps.size());
  for (size_t i = 0; i < plan_->steps.size(); ++i) {
    const PlanStep& s = plan_->steps[i];
    if (s.kind != PlanStep::Kind::kKernel) continue;
    for (const auto& b : s.inputs) argBytes_[i].push_back(static_cast<int64_t>(b.type.byteSize()));
    for (const auto& b : s.outputs) argBytes_[i].push_back(static_cast<int64_t>(b.type.byteSize()));
  }
}

PlanExecutor::~PlanExecutor() = default;

PlanRunStats PlanExecutor::lastStats() const {
  std::lock_guard lock(statsMu_);
  return lastStats_;
}

void PlanExecutor::clearLibraryCache() {
  std::unique_lock lock(runMu_);
  cache_->clear();
  std::lock_guard params(paramsMu_);
  paramsMapped_ = false;
}

Status PlanExecutor::mapParameters(Stream& stream) {
  std::lock_guard lock(paramsMu_);
  if (paramsMapped_) return Status::ok();
  params_.clear();
  for (const ir::TensorData& d : plan_->parameters) {
    auto* bytes = const_cast<std::byte*>(d.data());
    Expected<DeviceBuffer> mapped = backend_->mapHost(bytes, d.byteSize());
    if (!mapped)
      return mapped.status().withContext("placing the model's weights (" +
                                         std::to_string(plan_->parameterBytes()) + " bytes) on " +
                                         std::string(backend_->name()));
    DeviceBuffer b = std::move(*mapped);
    KILN_TRY(stream.upload(b.address(), bytes, d.byteSize()));
    params_.push_back(std::move(b));
  }
  // What every run copies over its index words first (all clear), kept beside the parameters.
  const std::vector<uint64_t> clear(plan_->deviceIndexChecks.size(), IndexWord::kClear);
  if (!clear.empty()) {
    const size_t bytes = clear.size() * sizeof(uint64_t);
    KILN_ASSIGN_OR_RETURN(indexWordsClear_, backend_->allocate(bytes));
    KILN_TRY(stream.upload(indexWordsClear_.address(),
                           reinterpret_cast<const std::byte*>(clear.data()), bytes));
  }
  KILN_TRY(stream.synchronize().withContext("copying the parameters to " +
                                            std::string(backend_->name())));
  paramsMapped_ = true;
  ++paramsGeneration_;
  return Status::ok();
}

Status PlanExecutor::limitMemory(int64_t limitBytes) {
  if (limitBytes <= 0) return Status::ok();
  const Plan& p = *plan_;
  const int64_t weights = p.parameterBytes(), perCall = p.bytesPerCall();
  auto mb = [](int64_t b) {
    char s[32];
    std::snprintf(s, sizeof(s), "%.1f MB", static_cast<double>(b) / 1e6);
    return std::string(s);
  };
  if (weights + perCall > limitBytes)
    return resourceExhausted("the model needs " + mb(weights + perCall) + " (weights " +
                             mb(weights) + ", activations arena " + mb(p.arenaBytes) +
                             ", outputs " + mb(perCall - p.arenaBytes) +
                             "), more than the memory limit of " + mb(limitBytes) +
                             "; raise the limit (--max-memory), or use a smaller batch");
  std::lock_guard lock(arenas_->mu);
  arenas_->max = perCall > 0 ? static_cast<size_t>((limitBytes - weights) / perCall) : 0;
  return Status::ok();
}

size_t PlanExecutor::reorderedWeightBytes() const {
  return cache_->bytes();
}

size_t PlanExecutor::arenasAllocated() const {
  std::lock_guard lock(arenas_->mu);
  return arenas_->allocated;
}

namespace {

// The call's inputs against the plan's: their count, and each one's dtype and shape.
// `describe` reads an input's dtype() and shape(), and its text() for the error.
template <class T, class Describe>
Status checkInputs(const Plan& p, std::span<const T> inputs, Describe describe) {
  if (inputs.size() != p.inputs.size())
    return invalidArgument("the compiled model takes " + std::to_string(p.inputs.size()) +
                           " inputs, got " + std::to_string(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& want = p.inputs[i];
    if (describe.dtype(inputs[i]) != want.dtype || describe.shape(inputs[i]) != want.shape)
      return invalidArgument("input '" + p.inputNames[i] + "' (#" + std::to_string(i) +
                             "): expected " + ir::TensorType{want.dtype, want.shape}.toString() +
                             ", got " + describe.text(inputs[i]));
  }
  return Status::ok();
}

}  // namespace

Expected<std::vector<Tensor>> PlanExecutor::run(std::span<const Tensor> inputs,
                                                PlanRunStats* statsOut, const StepHook* afterStep) {
  const auto tWait = std::chrono::steady_clock::now();
  struct {
    ir::DType dtype(const Tensor& t) const { return t.dtype(); }
    const ir::Shape& shape(const Tensor& t) const { return t.shape(); }
    std::string text(const Tensor& t) const { return t.describe(); }
  } describe;
  KILN_TRY(checkInputs(*plan_, inputs, describe));
  std::vector<Tensor> ins;
  for (const Tensor& t : inputs) {
    KILN_ASSIGN_OR_RETURN(Tensor c, t.contiguous());
    ins.push_back(std::move(c));
  }
  for (const IndexCheck& c : plan_->indexChecks)
    KILN_TRY(checkIndices(c, ins[static_cast<size_t>(c.input)])
                 .withContext("input '" + plan_->inputNames[static_cast<size_t>(c.input)] + "'"));
  Io io;
  io.hostIn = ins;
  std::vector<Tensor> outs;
  io.hostOut = &outs;
  KILN_TRY(execute(io, tWait, statsOut, afterStep));
  return outs;
}

Expected<std::vector<DeviceBuffer>> PlanExecutor::runOnDevice(std::span<const DeviceTensor> inputs,
                                                              uintptr_t waitFor,
                                                              PlanRunStats* statsOut) {
  const auto tWait = std::chrono::steady_clock::now();
  struct {
    ir::DType dtype(const DeviceTensor& t) const { return t.type.dtype; }
    const ir::Shape& shape(const DeviceTensor& t) const { return t.type.shape; }
    std::string text(const DeviceTensor& t) const {
      return ir::TensorType{t.type.dtype, t.type.shape}.toString();
    }
  } describe;
  KILN_TRY(checkInputs(*plan_, inputs, describe));
  if (!writtenParameters_.empty())
    return invalidArgument(
        "this plan writes its parameters (a training step): run it with host tensors, whose "
        "results include the written parameters");
  Io io;
  io.deviceIn = inputs;
  io.waitFor = waitFor;
  std::vector<DeviceBuffer> outs;
  io.deviceOut = &outs;
  KILN_TRY(execute(io, tWait, statsOut, nullptr));
  return outs;
}

Status PlanExecutor::execute(const Io& io, std::chrono::steady_clock::time_point tWait,
                             PlanRunStats* statsOut, const StepHook* afterStep) {
  const Plan& p = *plan_;
  const bool onDevice = io.deviceOut != nullptr;
  // The arena first, then the threads: a call never holds compute threads while it waits for
  // memory (under limitMemory).
  Occupancy held(*this);
  KILN_TRY(held.takeSlot());
  std::unique_ptr<Slot>& slot = held.slot;
  const DeviceAddress arena = slot->arena.address();

  // The stream is declared after the buffers its work uses, so it is destroyed first: destroying
  // a stream waits for its work.
  std::vector<Tensor> outs;
  std::vector<DeviceBuffer> inBufs, outBufs, results;
  std::unique_ptr<Stream> opened;
  Stream* stream = slot->stream.get();
  if (!stream) {
    KILN_ASSIGN_OR_RETURN(opened, backend_->openStream(threads_));
    stream = opened.get();
  }
  // An early (error) exit waits for the stream before the buffers it uses go (a slot's stream
  // lives on); the normal exit synchronizes below.
  struct SyncOnError {
    Stream* s;
    ~SyncOnError() {
      if (s) (void)s->synchronize();
    }
  } syncOnError{stream};
  const bool profiling = profiling_.load(std::memory_order_relaxed);
  // A captured graph replays fixed addresses: the slot's own input and output buffers, and its
  // own stream.
  const bool graph =
      graphs_.load(std::memory_order_relaxed) && !profiling && !afterStep && stream->canCapture();
  if (graph && !slot->stream) slot->stream = std::move(opened);
  // Inputs: the host's mapped (or, for a graph, copied into the slot's buffers); on the device,
  // read where they lie (a graph: copied into the slot's).
  for (const Tensor& t : io.hostIn) {
    KILN_ASSIGN_OR_RETURN(DeviceBuffer b, graph ? backend_->allocate(t.byteSize())
                                                : backend_->mapHost(t.rawData(), t.byteSize()));
    inBufs.push_back(std::move(b));
  }
  if (graph && slot->ins.empty())
    for (const DeviceTensor& t : io.deviceIn) {
      KILN_ASSIGN_OR_RETURN(DeviceBuffer b, backend_->allocate(t.type.byteSize()));
      inBufs.push_back(std::move(b));
    }
  for (size_t i = 0; i < p.outputs.size(); ++i) {
    const auto& t = p.outputs[i];
    if (onDevice) {  // The caller's results: buffers of the backend (a graph writes the slot's).
      const size_t bytes = ir::TensorType{t.dtype, t.shape}.byteSize();
      KILN_ASSIGN_OR_RETURN(DeviceBuffer r, backend_->allocate(bytes));
      results.push_back(std::move(r));
      if (!graph || !slot->outs.empty()) continue;
      KILN_ASSIGN_OR_RETURN(DeviceBuffer b, backend_->allocate(bytes));
      outBufs.push_back(std::move(b));
      continue;
    }
    if (i < p.outputParameter.size() && p.outputParameter[i] >= 0) {
      // Written over its parameter in place: the result is a view of it.
      const ir::TensorData& d = p.parameters[static_cast<size_t>(p.outputParameter[i])];
      outs.push_back(Tensor::wrap(const_cast<std::byte*>(d.data()), t.dtype, t.shape));
      outBufs.emplace_back();
      continue;
    }
    KILN_ASSIGN_OR_RETURN(Tensor o, Tensor::empty(t.dtype, t.shape, &backend_->hostAllocator()));
    KILN_ASSIGN_OR_RETURN(DeviceBuffer b, graph ? backend_->allocate(o.byteSize())
                                                : backend_->mapHost(o.rawData(), o.byteSize()));
    outs.push_back(std::move(o));
    outBufs.push_back(std::move(b));
  }
  if (graph && slot->ins.empty() && slot->outs.empty()) {
    slot->ins = std::move(inBufs);
    slot->outs = std::move(outBufs);
  } else if (graph) {
    inBufs.clear();  // The slot has its own from an earlier call.
    outBufs.clear();
  }
  std::vector<DeviceBuffer>& inDev = graph ? slot->ins : inBufs;
  std::vector<DeviceBuffer>& outDev = graph ? slot->outs : outBufs;
  // The steps read device inputs and write device results where they lie, except through a
  // graph (its fixed buffers, copied from and to).
  const bool inPlace = onDevice && !graph;
  KILN_TRY(mapParameters(*stream));
  auto address = [&](const BufferRef& b) -> DeviceAddress {
    switch (b.kind) {
      case BufferRef::Kind::kInput:
        return inPlace ? io.deviceIn[b.index].address : inDev[b.index].address();
      case BufferRef::Kind::kParameter:
        return params_[b.index].address();
      case BufferRef::Kind::kArena:
        return arena.at(b.offset);
      case BufferRef::Kind::kOutput:
        return inPlace ? results[b.index].address() : outDev[b.index].address();
    }
    return {};
  };
  PlanRunStats stats;
  stats.threads = stream->threads();
  const auto t0 = std::chrono::steady_clock::now();
  stats.waitMs = msBetween(tWait, t0);
  const bool timed = stream->canTime();
  // Device inputs another library wrote on its own stream: this run's work waits for it.
  if (io.waitFor) KILN_TRY(stream->waitForExternal(io.waitFor));
  if (timed) KILN_TRY(stream->markStart());
  for (size_t i = 0; i < io.hostIn.size(); ++i)
    KILN_TRY(stream->upload(inDev[i].address(), io.hostIn[i].rawData(), io.hostIn[i].byteSize()));
  if (graph)
    for (size_t i = 0; i < io.deviceIn.size(); ++i)
      KILN_TRY(
          stream->copy(inDev[i].address(), io.deviceIn[i].address, io.deviceIn[i].type.byteSize()));
  if (graph) {
    uint64_t generation;
    {
      std::lock_guard lock(paramsMu_);
      generation = paramsGeneration_;
    }
    if (!slot->graph || slot->paramsGeneration != generation) {
      slot->graph.reset();
      KILN_TRY(stream->beginCapture());
      Status enqueued = enqueueSteps(*stream, address, profiling, stats);
      Expected<std::shared_ptr<CapturedWork>> captured = stream->endCapture();
      KILN_TRY(enqueued);
      KILN_TRY(captured.status());
      slot->graph = std::move(*captured);
      slot->paramsGeneration = generation;
      graphsCaptured_.fetch_add(1, std::memory_order_relaxed);
      stats.graphCaptured = true;
    }
    KILN_TRY(stream->replay(*slot->graph));
    stats.graphReplayed = true;
    stats.kernelSteps = stats.opSteps = 0;
    for (const PlanStep& s : p.steps) {
      stats.kernelSteps += s.kind == PlanStep::Kind::kKernel;
      stats.opSteps += s.kind == PlanStep::Kind::kOp;
    }
  } else if (fusesActivations_ && !afterStep && stream->canCheckInvalid() &&
             rerunsInARow_.load(std::memory_order_relaxed) < kMaxRerunsInARow) {
    // relu and clip run inside oneDNN's calls (no pass of their own over each output), where a
    // NaN becomes a number and raises the invalid flag; a run that raised it runs again exactly.
    // Inputs and parameters are not written by the steps, so the second run sees what the first
    // did. Invalid operations elsewhere (inf - inf, 0 * inf) also raise it and cost the rerun:
    // after kMaxRerunsInARow runs in a row that did, the plan stops fusing (a model whose
    // ordinary inputs raise it would otherwise run twice every time).
    stats.fusedActivations = true;
    stream->clearInvalid();
    KILN_TRY(enqueueSteps(*stream, address, profiling, stats, nullptr, /*fuseActivations=*/true));
    KILN_TRY(stream->synchronize());
    if (!stream->invalidRaised()) {
      rerunsInARow_.store(0, std::memory_order_relaxed);
    } else {
      stats.exactRerun = true;
      exactReruns_.fetch_add(1, std::memory_order_relaxed);
      rerunsInARow_.fetch_add(1, std::memory_order_relaxed);
      stats.kernelSteps = stats.opSteps = 0;
      stats.stepMs.clear();
      stats.stepStartMs.clear();
      KILN_TRY(enqueueSteps(*stream, address, profiling, stats));
    }
  } else {
    KILN_TRY(enqueueSteps(*stream, address, profiling, stats, afterStep));
  }
  // The device index checks' words: an index out of range fails the run (below).
  std::vector<uint64_t> words(p.deviceIndexChecks.size(), IndexWord::kClear);
  if (!words.empty())
    KILN_TRY(stream->download(reinterpret_cast<std::byte*>(words.data()),
                              arena.at(p.indexWordsOffset), words.size() * sizeof(uint64_t)));
  // The run's outcome once its work is done: an index out of range first (ops on the host
  // that read the same indices, or the filler written for them, fail as well, later), else the
  // stream's error.
  auto outcome = [&](Status synced) -> Status {
    for (size_t i = 0; i < words.size(); ++i)
      KILN_TRY(deviceIndexError(p.deviceIndexChecks[i], words[i]));
    return synced;
  };
  if (!writtenParameters_.empty() && !backend_->caps().hostAddressable) {
    // A failed run's parameter writes are not taken: the backend's copies are mapped again
    // from the plan's bytes (the last good step's) by the next run, as the host's kernels fail
    // before the update writes anything.
    if (Status bad = outcome(stream->synchronize()); !bad.isOk()) {
      std::lock_guard lock(paramsMu_);
      paramsMapped_ = false;
      return bad;
    }
  }
  for (size_t i = 0; i < outs.size(); ++i)
    if (outDev[i].defined())
      KILN_TRY(stream->download(outs[i].rawData(), outDev[i].address(), outs[i].byteSize()));
  if (onDevice && graph)
    for (size_t i = 0; i < results.size(); ++i)
      KILN_TRY(stream->copy(results[i].address(), outDev[i].address(), results[i].bytes()));
  // Parameters the steps wrote (a training step's updates) return to the plan's bytes, so that
  // the host sees them wherever the backend's memory is.
  for (int pi : writtenParameters_) {
    const ir::TensorData& d = p.parameters[static_cast<size_t>(pi)];
    KILN_TRY(
        stream->download(const_cast<std::byte*>(d.data()), params_[pi].address(), d.byteSize()));
  }
  if (timed) KILN_TRY(stream->markEnd());
  syncOnError.s = nullptr;
  KILN_TRY(outcome(stream->synchronize()));
  stats.totalMs = msBetween(t0, std::chrono::steady_clock::now());
  if (timed) {
    KILN_ASSIGN_OR_RETURN(stats.deviceMs, stream->markedMs());
  }
  {
    std::lock_guard lock(statsMu_);
    lastStats_ = stats;
  }
  if (statsOut) *statsOut = std::move(stats);
  if (io.hostOut) *io.hostOut = std::move(outs);
  if (io.deviceOut) *io.deviceOut = std::move(results);
  return Status::ok();
}

Status PlanExecutor::prepare() {
  const Plan& p = *plan_;
  Occupancy held(*this);  // The run lock only: no arena.
  // A prepared call reads only its weights (parameters) and its operands' types, never the
  // activations: inputs, outputs and arena buffers all stand on one small placeholder, so that
  // preparing the steps allocates nothing of the plan's size (a damaged artifact's arena could
  // ask for terabytes). The first run's arena is made at the end where it is small.
  KILN_ASSIGN_OR_RETURN(DeviceBuffer placeholder, backend_->allocate(64));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Stream> stream, backend_->openStream(threads_));
  const int granted = stream->threads();
  KILN_TRY(mapParameters(*stream));
  if (backend_->caps().hostAddressable) {
    // Page faults out of the first run: the parameters' pages (an artifact's are mapped from
    // its file) read once each.
    for (const ir::TensorData& d : p.parameters) {
      const auto* bytes = reinterpret_cast<const volatile unsigned char*>(d.data());
      for (size_t i = 0; i < d.byteSize(); i += 4096) (void)bytes[i];  // Volatile: kept.
    }
  }
  auto tensor = [&](const BufferRef& b) {
    return DeviceTensor{
        b.kind == BufferRef::Kind::kParameter ? params_[b.index].address() : placeholder.address(),
        b.type};
  };
  std::vector<DeviceTensor> tin, tout;
  auto prepareSteps = [&](Stream& on) -> Status {
    for (const PlanStep& s : p.steps) {
      if (s.kind != PlanStep::Kind::kOp || !s.library) continue;
      tin.clear();
      tout.clear();
      for (const auto& b : s.inputs) tin.push_back(tensor(b));
      for (const auto& b : s.outputs) tout.push_back(tensor(b));
      OpCall call = opCall(s, fusesActivations_ && on.canCheckInvalid());
      call.options.prepare = true;
      KILN_TRY(on.run(call, tin, tout).withContext(s.name));
    }
    return on.synchronize();
  };
  KILN_TRY(prepareSteps(*stream));
  // The library's primitives are made for a thread count (oneDNN's blocking depends on it), and
  // a run is granted fewer threads than now while other runs are in progress, or other
  // processes hold the cores (ComputeThreads' load awareness): one thread. Those primitives are
  // made now too, or such a run makes them on its way (mobilenet_v3_small: a first run of 9-13
  // ms instead of 1.7, 541 page faults instead of 24, in about one launch of six on a machine
  // where a transient load took a thread away). An intermediate count (more than two cores,
  // partly loaded) still makes its own at its first run.
  stream.reset();  // Its grant back first: the one-thread stream below takes from the budget.
  if (granted > 1) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Stream> one, backend_->openStream(1));
    KILN_TRY(prepareSteps(*one));
  }
  // The first run's arena, made and its pages written now where it is small (a run takes the
  // arena from the pool): page faults out of the first run. Larger arenas (and a damaged
  // artifact's claim) wait for the first run, which touches them anyway.
  constexpr int64_t kPrefaultBytes = int64_t{64} << 20;
  if (backend_->caps().hostAddressable && p.arenaBytes > 0 && p.arenaBytes <= kPrefaultBytes) {
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<Slot> slot, arenas_->take());
    const DeviceAddress a = slot->arena.address();  // A host pointer (hostAddressable).
    std::memset(static_cast<std::byte*>(a.handle) + a.offset, 0, static_cast<size_t>(p.arenaBytes));
    arenas_->give(std::move(slot));
  }
  prepared_.store(true, std::memory_order_release);
  return Status::ok();
}

OpCall PlanExecutor::opCall(const PlanStep& s, bool fuseActivations) const {
  OpCall call;
  call.name = s.name;
  call.op = s.op;
  call.attrs = &s.attrs;
  call.library = s.library;
  call.postOps = s.postOps;
  call.numExtra = s.numExtra;
  call.options = s.libraryOptions;
  // The library keeps reordered weights (a convolution's input 1) by address: only where
  // that operand is a parameter, constant between parametersChanged() calls. A weight
  // that is a graph input or an activation may hold other values at the same address.
  const bool constantWeights = !plan_->parametersVary && s.inputs.size() > 1 &&
                               s.inputs[1].kind == BufferRef::Kind::kParameter;
  call.options.cache = constantWeights ? cache_.get() : nullptr;
  call.options.validated = prepared_.load(std::memory_order_acquire);
  call.options.fuseActivations = fuseActivations;
  return call;
}

Status PlanExecutor::enqueueSteps(Stream& stream_,
                                  const std::function<DeviceAddress(const BufferRef&)>& address,
                                  bool profiling, PlanRunStats& stats, const StepHook* afterStep,
                                  bool fuseActivations) {
  const Plan& p = *plan_;
  std::vector<DeviceAddress> outputs;
  if (afterStep)
    for (size_t i = 0; i < p.outputs.size(); ++i) {
      BufferRef out;
      out.kind = BufferRef::Kind::kOutput;
      out.index = static_cast<int>(i);
      outputs.push_back(address(out));
    }
  Stream* stream = &stream_;
  auto tensor = [&](const BufferRef& b) { return DeviceTensor{address(b), b.type}; };
  std::vector<DeviceAddress> args;
  std::vector<DeviceTensor> tin, tout;
  const auto first =
      profiling ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  if (!p.deviceIndexChecks.empty()) {  // The index words cleared (inside a captured graph too).
    BufferRef words;
    words.offset = p.indexWordsOffset;
    KILN_TRY(stream->copy(address(words), indexWordsClear_.address(),
                          p.deviceIndexChecks.size() * sizeof(uint64_t)));
  }
  for (size_t si = 0; si < p.steps.size(); ++si) {
    const PlanStep& s = p.steps[si];
    const auto ts =
        profiling ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    switch (s.kind) {
      case PlanStep::Kind::kKernel: {
        args.clear();
        for (const auto& b : s.inputs) args.push_back(address(b));
        for (const auto& b : s.outputs) args.push_back(address(b));
        KILN_TRY(stream
                     ->launch({s.name, s.kernel, s.units, s.elements, s.block, s.grid,
                               argBytes_[si], s.scratchBytes},
                              args)
                     .withContext(s.name));
        ++stats.kernelSteps;
        break;
      }
      case PlanStep::Kind::kOp: {
        tin.clear();
        tout.clear();
        for (const auto& b : s.inputs) tin.push_back(tensor(b));
        for (const auto& b : s.outputs) tout.push_back(tensor(b));
        KILN_TRY(stream->run(opCall(s, fuseActivations), tin, tout).withContext(s.name));
        ++stats.opSteps;
        break;
      }
      case PlanStep::Kind::kCopy:
        KILN_TRY(stream->copy(address(s.outputs[0]), address(s.inputs[0]),
                              s.outputs[0].type.byteSize()));
        break;
    }
    if (profiling) {
      stats.stepMs.push_back(msBetween(ts, std::chrono::steady_clock::now()));
      stats.stepStartMs.push_back(msBetween(first, ts));
    }
    if (afterStep) KILN_TRY((*afterStep)(si, *stream, outputs));
  }
  return Status::ok();
}

}  // namespace kiln::runtime
