#include "runtime/gpu/gpu_backend.h"

#include <algorithm>
#include <cstring>

#include "runtime/cpu/cpu_backend.h"
#include "runtime/gpu/emu_device.h"
#include "runtime/reference/kernels.h"

namespace kiln::runtime::gpu {

// ---- The caching allocator ------------------------------------------------------------------

namespace {
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeThreshold = size_t{1} << 20;
constexpr size_t kLargeRound = size_t{2} << 20;
}  // namespace

DeviceCachingAllocator::~DeviceCachingAllocator() {
  std::lock_guard lock(mu_);
  for (const Pending& p : pending_) {
    (void)dev_->synchronizeEvent(p.event);
    dev_->destroyEvent(p.event);
    free_.emplace(p.size, p.p);
  }
  pending_.clear();
  (void)emptyCacheLocked();
  // Live blocks outlive the allocator only when their owner leaked them; the device frees them.
}

size_t DeviceCachingAllocator::roundSize(size_t bytes) {
  if (bytes < kLargeThreshold)
    return std::max(kSmallRound, (bytes + kSmallRound - 1) / kSmallRound * kSmallRound);
  return (bytes + kLargeRound - 1) / kLargeRound * kLargeRound;
}

void DeviceCachingAllocator::collectPendingLocked() {
  for (size_t i = 0; i < pending_.size();) {
    Expected<bool> done = dev_->eventDone(pending_[i].event);
    if (done.hasValue() && !*done) {
      ++i;
      continue;
    }
    dev_->destroyEvent(pending_[i].event);
    free_.emplace(pending_[i].size, pending_[i].p);
    pending_[i] = pending_.back();
    pending_.pop_back();
  }
}

Status DeviceCachingAllocator::emptyCacheLocked() {
  Status first;
  for (const auto& [size, p] : free_) {
    Status s = dev_->free(p);
    if (!s.isOk() && first.isOk()) first = s;
    stats_.bytesCached -= static_cast<int64_t>(size);
    --stats_.blocksCached;
  }
  free_.clear();
  return first;
}

Status DeviceCachingAllocator::emptyCache() {
  std::lock_guard lock(mu_);
  collectPendingLocked();
  return emptyCacheLocked();
}

Expected<DevicePtr> DeviceCachingAllocator::allocate(size_t bytes) {
  const size_t size = roundSize(bytes);
  std::lock_guard lock(mu_);
  ++stats_.allocations;
  collectPendingLocked();
  auto it = free_.lower_bound(size);
  DevicePtr p = 0;
  size_t got = size;
  if (it != free_.end() && it->first <= size + size / 8) {
    p = it->second;
    got = it->first;
    free_.erase(it);
    stats_.bytesCached -= static_cast<int64_t>(got);
    --stats_.blocksCached;
    ++stats_.cacheHits;
  } else {
    Expected<DevicePtr> fresh = dev_->malloc(size);
    if (!fresh && fresh.status().code() == ErrorCode::kResourceExhausted &&
        (!free_.empty() || !pending_.empty())) {
      // Out of memory with blocks cached: wait for pending frees, give the cache back, retry.
      for (const Pending& q : pending_) (void)dev_->synchronizeEvent(q.event);
      collectPendingLocked();
      KILN_TRY(emptyCacheLocked());
      ++stats_.cacheFlushes;
      fresh = dev_->malloc(size);
    }
    if (!fresh) return fresh.status();
    p = *fresh;
    ++stats_.deviceMallocs;
  }
  live_[p] = {got, bytes};
  stats_.bytesInUse += static_cast<int64_t>(got);
  stats_.bytesWasted += static_cast<int64_t>(got - bytes);
  stats_.peakBytesInUse = std::max(stats_.peakBytesInUse, stats_.bytesInUse);
  return p;
}

void DeviceCachingAllocator::free(DevicePtr p, EventHandle after) {
  std::lock_guard lock(mu_);
  auto it = live_.find(p);
  if (it == live_.end()) return;  // Not ours: a bug of the caller; never free twice.
  const Live l = it->second;
  live_.erase(it);
  stats_.bytesInUse -= static_cast<int64_t>(l.size);
  stats_.bytesWasted -= static_cast<int64_t>(l.size - l.asked);
  stats_.bytesCached += static_cast<int64_t>(l.size);
  ++stats_.blocksCached;
  if (after)
    pending_.push_back({p, l.size, after});
  else
    free_.emplace(l.size, p);
}

DeviceAllocatorStats DeviceCachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  DeviceAllocatorStats s = stats_;
  s.blocksPending = static_cast<int64_t>(pending_.size());
  return s;
}

void DeviceCachingAllocator::resetPeak() {
  std::lock_guard lock(mu_);
  stats_.peakBytesInUse = stats_.bytesInUse;
}

// ---- The backend ------------------------------------------------------------------------------

namespace {

DevicePtr ptr(DeviceAddress a) {
  return reinterpret_cast<DevicePtr>(a.handle) + static_cast<DevicePtr>(a.offset);
}

class GpuBackend;

// Pinned host buffers are pooled by size (GpuBackend::takePinned): a power of two, at least
// `least` bytes.
size_t pinnedPoolSize(size_t bytes, size_t least) {
  size_t size = least;
  while (size < bytes) size *= 2;
  return size;
}
constexpr size_t kHostOpPinnedBytes = 4096;  // An operand of an op run on the host: a page.

// An op run on the host in stream order: its inputs are copied into pinned buffers, a host
// function runs the CPU's kernel, and the outputs are copied back.
struct HostOp {
  std::string name;
  ir::OpKind op;
  ir::AttrMap attrs;
  bool library = false;
  std::vector<PostOp> postOps;
  int numExtra = 0;
  LibraryOptions options;
  std::vector<ir::TensorType> inTypes, outTypes;
  // Pinned host buffers from the backend's pool (sized pinnedPoolSize(type's bytes,
  // kHostOpPinnedBytes)).
  std::vector<void*> in, out;
  Status status;

  static void run(void* data) {
    auto* h = static_cast<HostOp*>(data);
    h->status = h->runPlain().withContext(h->name + " (on the host)");
  }

  // The CPU's kernels read channels-last activations only beside plain filters (oneDNN), the
  // reference kernels plain memory; a device's NHWC convolution has KRSC filters. So every
  // channels-last operand is relayouted to plain here, and channels-last outputs back.
  Status runPlain() {
    const ir::AttrMap toPlain = {{"from", std::string(ir::layoutName(ir::Layout::kNHWC))},
                                 {"to", std::string(ir::layoutName(ir::Layout::kPlain))}};
    const ir::AttrMap toNhwc = {{"from", std::string(ir::layoutName(ir::Layout::kPlain))},
                                {"to", std::string(ir::layoutName(ir::Layout::kNHWC))}};
    auto wrap = [](void* p, const ir::TensorType& t) {
      return Tensor::wrap(static_cast<std::byte*>(p), t.dtype, t.shape);
    };
    // The reference relayout into `to` (host tensors carry no layout: the attributes say it).
    auto relayout = [](const Tensor& from, Tensor to, const ir::AttrMap& a) {
      return referenceKernel(ir::OpKind::kRelayout)(
          ir::AttrView(ir::opInfo(ir::OpKind::kRelayout), a), std::span(&from, 1),
          std::span(&to, 1));
    };
    bool relayouted = false;
    std::vector<Tensor> ti, to;
    for (size_t i = 0; i < in.size(); ++i) {
      Tensor t = wrap(in[i], inTypes[i]);
      if (inTypes[i].layout == ir::Layout::kNHWC) {
        KILN_ASSIGN_OR_RETURN(Tensor plain, Tensor::empty(inTypes[i].dtype, inTypes[i].shape));
        KILN_TRY(relayout(t, plain, toPlain));
        t = plain;
        relayouted = true;
      }
      ti.push_back(t);
    }
    for (size_t i = 0; i < out.size(); ++i) {
      if (outTypes[i].layout != ir::Layout::kNHWC) {
        to.push_back(wrap(out[i], outTypes[i]));
        continue;
      }
      KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(outTypes[i].dtype, outTypes[i].shape));
      to.push_back(t);
      relayouted = true;
    }
    OpCall c;
    c.name = name;
    c.op = op;
    c.attrs = &attrs;
    c.library = library;
    c.postOps = postOps;
    c.numExtra = numExtra;
    c.options = options;
    c.options.channelsLast = c.options.channelsLast && !relayouted;
    KILN_TRY(runOnHost(c, ti, to));
    for (size_t i = 0; i < out.size(); ++i)
      if (outTypes[i].layout == ir::Layout::kNHWC)
        KILN_TRY(relayout(to[i], wrap(out[i], outTypes[i]), toNhwc));
    return Status::ok();
  }
  void release(GpuBackend& backend);  // The buffers back to the pool.
};

// A captured graph and the host ops it runs (their pinned buffers stay theirs while it lives: the
// graph's copies name them).
struct Graph final : CapturedWork, std::enable_shared_from_this<Graph> {
  Graph(GpuBackend& b, DeviceApi& d) : backend(b), dev(d) {}
  ~Graph() override;
  GpuBackend& backend;
  DeviceApi& dev;
  GraphHandle graph = nullptr;
  std::vector<std::unique_ptr<HostOp>> hostOps;
};

class GpuStream final : public Stream {
 public:
  GpuStream(GpuBackend& b, StreamHandle s);
  ~GpuStream() override;

  // Copies of more than kStageBytes go through pinned buffers (truly asynchronous, and at the
  // link's full speed): an upload copies the caller's bytes into one at once (so they may change
  // right after), a download lands in one and reaches the caller's memory in synchronize().
  static constexpr size_t kStageBytes = 64 * 1024;
  Status upload(DeviceAddress dst, const std::byte* src, size_t bytes) override {
    if (bytes < kStageBytes) return dev_.copyToDevice(ptr(dst), src, bytes, s_);
    KILN_ASSIGN_OR_RETURN(Staged st, stage(bytes));
    std::memcpy(st.host, src, bytes);
    staged_.push_back(st);
    return dev_.copyToDevice(ptr(dst), st.host, bytes, s_);
  }
  Status download(std::byte* dst, DeviceAddress src, size_t bytes) override {
    if (bytes < kStageBytes) return dev_.copyToHost(dst, ptr(src), bytes, s_);
    KILN_ASSIGN_OR_RETURN(Staged st, stage(bytes));
    st.target = dst;
    staged_.push_back(st);
    return dev_.copyToHost(st.host, ptr(src), bytes, s_);
  }
  Status copy(DeviceAddress dst, DeviceAddress src, size_t bytes) override {
    if (ptr(dst) == ptr(src)) return Status::ok();
    return dev_.copyOnDevice(ptr(dst), ptr(src), bytes, s_);
  }

  Status launch(const KernelLaunch& k, std::span<const DeviceAddress> args) override {
    if (k.block <= 0 || k.grid <= 0)
      return internalError("kernel '" + std::string(k.name) + "' has no launch geometry");
    if (k.scratchBytes > 0)
      return internalError("kernel '" + std::string(k.name) +
                           "' is CPU code split in chunks of rows (codegen::cpuRowSplit)");
    if (k.argBytes.size() != args.size())
      return internalError("kernel '" + std::string(k.name) + "': " + std::to_string(args.size()) +
                           " arguments, " + std::to_string(k.argBytes.size()) + " extents");
    if (k.grid > 0x7fffffff)
      return invalidArgument("kernel '" + std::string(k.name) + "': a grid of " +
                             std::to_string(k.grid) + " blocks is past CUDA's limit");
    values_.clear();
    params_.clear();
    for (const DeviceAddress& a : args) values_.push_back(ptr(a));
    for (DevicePtr& v : values_) params_.push_back(&v);
    return dev_.launch(reinterpret_cast<FunctionHandle>(const_cast<void*>(k.entry)),
                       {static_cast<uint32_t>(k.grid), 1, 1},
                       {static_cast<uint32_t>(k.block), 1, 1}, 0, s_, params_.data(), k.argBytes);
  }

  Status run(const OpCall& c, std::span<const DeviceTensor> inputs,
             std::span<const DeviceTensor> outputs) override {
    // Nothing is prepared ahead on a GPU yet: cuDNN's and cuBLASLt's plans are made at the
    // first call of each shape (and a CUDA graph records the steps at the first run).
    if (c.options.prepare) return Status::ok();
    // A library op (a plan's library step, or an eager op call) goes to the device's library
    // where a descriptor takes it.
    if (outputs.size() == 1 && dev_.hasLibraryCalls() &&
        describesLibraryOp(c.op, outputs[0].type.dtype, outputs[0].type.layout)) {
      types_.clear();
      for (const DeviceTensor& t : inputs) types_.push_back(t.type);
      Expected<LibraryCall> call = describeLibraryCall(c, types_, outputs[0].type);
      if (call) {
        operands_.clear();
        for (const DeviceTensor& t : inputs) operands_.push_back(ptr(t.address));
        operands_.push_back(ptr(outputs[0].address));
        Status st = dev_.libraryCall(*call, operands_, s_);
        if (st.code() != ErrorCode::kUnimplemented) return st;
        // The device's library refused these shapes (e.g. cuDNN and asymmetric padding).
      }
      // Shapes the device's library does not take: on the host, below.
    }
    auto h = std::make_unique<HostOp>();
    h->name = std::string(c.name);
    h->op = c.op;
    if (c.attrs) h->attrs = *c.attrs;
    h->library = c.library;
    h->postOps.assign(c.postOps.begin(), c.postOps.end());
    h->numExtra = c.numExtra;
    h->options = c.options;
    h->options.validated = false;  // The device's prepare validated nothing on the host.
    // The operands are copies in pinned buffers, pooled and handed out again after synchronize():
    // the plan's library cache, keyed by the weights' address, would give another op's weights.
    h->options.cache = nullptr;
    // Pinned buffers from the backend's pool, so that a step's host ops allocate none after its
    // first run (cuMemHostAlloc and cuMemFreeHost pin and unpin pages at every call). Held in
    // hostOps_ or the captured graph from the start: given back on every path.
    HostOp* raw = h.get();
    (capturing_ ? captureOps_ : hostOps_).push_back(std::move(h));
    for (const DeviceTensor& t : inputs) {
      KILN_ASSIGN_OR_RETURN(void* p,
                            takePinned(pinnedPoolSize(t.type.byteSize(), kHostOpPinnedBytes)));
      raw->in.push_back(p);
      raw->inTypes.push_back(t.type);
    }
    for (const DeviceTensor& t : outputs) {
      KILN_ASSIGN_OR_RETURN(void* p,
                            takePinned(pinnedPoolSize(t.type.byteSize(), kHostOpPinnedBytes)));
      raw->out.push_back(p);
      raw->outTypes.push_back(t.type);
    }
    for (size_t i = 0; i < inputs.size(); ++i)
      KILN_TRY(dev_.copyToHost(raw->in[i], ptr(inputs[i].address), inputs[i].type.byteSize(), s_));
    KILN_TRY(dev_.launchHostFunc(s_, &HostOp::run, raw));
    for (size_t i = 0; i < outputs.size(); ++i)
      KILN_TRY(
          dev_.copyToDevice(ptr(outputs[i].address), raw->out[i], outputs[i].type.byteSize(), s_));
    return Status::ok();
  }

  void free(DeviceBuffer buffer) override;

  Status waitForExternal(uintptr_t external) override {
    KILN_ASSIGN_OR_RETURN(EventHandle e, dev_.createEvent());
    waits_.push_back(e);  // Destroyed once this stream's work (its wait among it) is done.
    KILN_TRY(dev_.recordEvent(e, reinterpret_cast<StreamHandle>(external)));
    return dev_.waitEvent(s_, e);
  }

  Status synchronize() override {
    Status s = dev_.synchronize(s_);
    for (EventHandle e : waits_) dev_.destroyEvent(e);
    waits_.clear();
    for (const Staged& st : staged_) {
      if (st.target && s.isOk()) std::memcpy(st.target, st.host, st.bytes);
      unstage(st);
    }
    staged_.clear();
    for (auto& h : hostOps_) {
      if (s.isOk() && !h->status.isOk()) s = h->status;
      h->release(b_);
    }
    hostOps_.clear();
    for (const auto& g : replayed_)
      for (auto& h : g->hostOps) {
        if (s.isOk() && !h->status.isOk()) s = h->status;
        h->status = Status::ok();
      }
    replayed_.clear();
    return s;
  }

  // CUDA graphs: the device records what this stream enqueues; ops run on the host keep their
  // pinned buffers as long as the graph lives, and report their errors at each replay's
  // synchronize().
  bool canCapture() const override { return true; }
  Status beginCapture() override {
    KILN_TRY(dev_.beginCapture(s_));
    capturing_ = true;
    return Status::ok();
  }
  Expected<std::shared_ptr<CapturedWork>> endCapture() override {
    capturing_ = false;
    auto g = std::make_shared<Graph>(b_, dev_);
    g->hostOps = std::move(captureOps_);
    captureOps_.clear();
    KILN_ASSIGN_OR_RETURN(g->graph, dev_.endCapture(s_));
    return std::shared_ptr<CapturedWork>(std::move(g));
  }
  Status replay(CapturedWork& work) override {
    auto* g = dynamic_cast<Graph*>(&work);
    if (!g) return internalError("replay of work another backend captured");
    KILN_TRY(dev_.launchGraph(g->graph, s_));
    replayed_.push_back(std::static_pointer_cast<Graph>(g->shared_from_this()));
    return Status::ok();
  }

  // CUDA events around the work (on emu: the worker thread's clock as each event completes).
  bool canTime() const override { return true; }
  Status markStart() override { return mark(start_); }
  Status markEnd() override { return mark(end_); }
  Expected<double> markedMs() override {
    if (!start_ || !end_) return internalError("markedMs without markStart and markEnd");
    KILN_ASSIGN_OR_RETURN(float ms, dev_.elapsedMs(start_, end_));
    return static_cast<double>(ms);
  }

 private:
  Status mark(EventHandle& e) {
    if (!e) {
      KILN_ASSIGN_OR_RETURN(e, dev_.createEvent());
    }
    return dev_.recordEvent(e, s_);
  }
  EventHandle start_ = nullptr, end_ = nullptr;
  GpuBackend& b_;
  DeviceApi& dev_;
  StreamHandle s_;
  std::vector<DevicePtr> values_;
  std::vector<void*> params_;
  std::vector<ir::TensorType> types_;
  std::vector<DevicePtr> operands_;
  std::vector<std::unique_ptr<HostOp>> hostOps_;
  struct Staged {
    void* host = nullptr;         // Pinned, from the backend's pool.
    size_t capacity = 0;          // Its size in the pool.
    size_t bytes = 0;             // What the copy moves.
    std::byte* target = nullptr;  // A download's destination.
  };
  Expected<Staged> stage(size_t bytes);
  void unstage(const Staged& st);
  Expected<void*> takePinned(size_t capacity);  // From the backend's pool.
  std::vector<Staged> staged_;
  std::vector<EventHandle> waits_;  // waitForExternal's events, until synchronize().
  bool capturing_ = false;
  std::vector<std::unique_ptr<HostOp>> captureOps_;
  std::vector<std::shared_ptr<Graph>> replayed_;  // Since the last synchronize().
};

class GpuModule final : public KernelModule {
 public:
  GpuModule(std::shared_ptr<DeviceApi> dev) : dev_(std::move(dev)) {}
  ~GpuModule() override {
    for (ModuleHandle m : modules_) dev_->unloadModule(m);
  }
  Expected<const void*> entry(std::string_view kernel) override {
    Status last = notFound("kernel '" + std::string(kernel) + "': no module is loaded");
    for (ModuleHandle m : modules_) {
      Expected<FunctionHandle> f = dev_->function(m, kernel);
      if (f) return static_cast<const void*>(*f);
      last = f.status();
    }
    return last;
  }
  std::vector<ModuleHandle> modules_;

 private:
  std::shared_ptr<DeviceApi> dev_;
};

class GpuBackend final : public Backend {
 public:
  GpuBackend(std::string name, std::shared_ptr<DeviceApi> dev)
      : name_(std::move(name)), dev_(std::move(dev)), alloc_(dev_) {
    const DeviceProps& p = dev_->props();
    caps_.kernelCode = std::string(dev_->codeFormat());
    caps_.libraryEpilogues = dev_->hasLibraryCalls();  // The chains libraryEpilogueFor takes.
    caps_.tf32 = dev_->hasLibraryCalls();
    caps_.lowPrecision = true;  // Halves in kernels; products in the libraries (or on the host).
    caps_.channelsLast = BackendCaps::ChannelsLast::kTensorCores;
    caps_.channelsLastFilters = true;
    caps_.device = p.name + " sm_" + std::to_string(p.smArch) + " (" + p.libraries + ")";
    caps_.cuda.smArch = p.smArch;
    caps_.cuda.multiProcessors = p.multiProcessors;
    caps_.cuda.maxThreadsPerBlock = p.maxThreadsPerBlock;
    if (caps_.kernelCode == "cuda-emu-object") {
      caps_.cuda.sourcePrefix = std::string(emuKernelPrelude());
      caps_.cuda.entryLine = "KILN_EMU_ENTRY({name})";
    }
  }
  ~GpuBackend() override {
    std::lock_guard lock(streamsMu_);
    for (StreamHandle s : idleStreams_) dev_->destroyStream(s);
    std::lock_guard pinnedLock(pinnedMu_);
    for (const auto& [bytes, p] : pinned_) dev_->freeHost(p);
  }

  std::string_view name() const override { return name_; }
  const BackendCaps& caps() const override { return caps_; }

  Expected<DeviceBuffer> allocate(size_t bytes) override {
    KILN_ASSIGN_OR_RETURN(DevicePtr p, alloc_.allocate(bytes));
    return DeviceBuffer(this, reinterpret_cast<void*>(p), bytes);
  }
  Expected<DeviceBuffer> mapHost(std::byte*, size_t bytes) override { return allocate(bytes); }
  Allocator& hostAllocator() override { return cpuAllocator(); }
  AllocatorStats memoryStats() const override {
    const DeviceAllocatorStats d = alloc_.stats();
    AllocatorStats s;
    s.bytesInUse = d.bytesInUse;
    s.peakBytesInUse = d.peakBytesInUse;
    s.bytesReserved = d.bytesInUse + d.bytesCached;
    s.numAllocations = d.allocations;
    s.numSystemAllocations = d.deviceMallocs;
    return s;
  }
  void resetPeakMemory() override { alloc_.resetPeak(); }

  Expected<std::unique_ptr<Stream>> openStream(int) override {
    StreamHandle s = nullptr;
    {
      std::lock_guard lock(streamsMu_);
      if (!idleStreams_.empty()) {
        s = idleStreams_.back();
        idleStreams_.pop_back();
      }
    }
    if (!s) {
      KILN_ASSIGN_OR_RETURN(s, dev_->createStream());
    }
    return std::unique_ptr<Stream>(std::make_unique<GpuStream>(*this, s));
  }

  Expected<std::shared_ptr<KernelModule>> loadKernels(
      std::span<const KernelObject> objects) override {
    auto m = std::make_shared<GpuModule>(dev_);
    for (const KernelObject& o : objects) {
      KILN_ASSIGN_OR_RETURN(ModuleHandle h, dev_->loadModule(o.bytes, o.name));
      m->modules_.push_back(h);
    }
    return std::shared_ptr<KernelModule>(std::move(m));
  }

  // Convolutions, matrix products and pooling as device library calls (library_call.h) where
  // the device has them, with a residual add and a ReLU as their epilogue; other post-ops run as
  // generated kernels.
  bool hasLibraryKernel(ir::OpKind op, ir::DType dtype, ir::Layout layout) const override {
    return dev_->hasLibraryCalls() && describesLibraryOp(op, dtype, layout);
  }
  bool runsPostOps(ir::OpKind op, std::span<const PostOp> post) const override {
    const std::optional<LibraryEpilogue> e = libraryEpilogueFor(op, post);
    return e && dev_->takesEpilogue(*e);
  }

  // A convolution's or its gradient's algorithms on the device's library (cuDNN's, or on emu
  // the CPU library's: forward only): compile-time autotuning times them through a stream of
  // this backend.
  std::vector<ConvAlgo> libraryAlgorithms(ir::OpKind op, const ir::AttrView& attrs,
                                          std::span<const ir::TensorType> inputs) const override {
    // conv2d (x, w) and its gradients (three operands), the ops with an algorithm attribute.
    const size_t operands = op == ir::OpKind::kConv2d ? 2 : 3;
    if (!ir::opInfo(op).findAttr("algo") || inputs.size() < operands || !dev_->hasLibraryCalls())
      return {};
    const std::vector<ir::TensorType> types(inputs.begin(), inputs.begin() + operands);
    Expected<std::vector<ir::TensorType>> out = ir::inferTypes(op, types, attrs.raw());
    if (!out) return {};
    (*out)[0].layout = types[0].layout;  // Layout selection gives a conv's output x's layout.
    OpCall call;
    call.name = ir::opName(op);
    call.op = op;
    call.attrs = &attrs.raw();
    call.library = true;
    Expected<LibraryCall> d = describeLibraryCall(call, types, (*out)[0]);
    if (!d) return {};
    return dev_->convAlgorithms(std::get<ConvDescriptor>(d->desc));
  }

  // Pinned host buffers for staged copies, kept by size (2^k bytes) and reused.
  Expected<void*> takePinned(size_t bytes) {
    {
      std::lock_guard lock(pinnedMu_);
      auto it = pinned_.find(bytes);
      if (it != pinned_.end()) {
        void* p = it->second;
        pinned_.erase(it);
        return p;
      }
    }
    return dev_->mallocHost(bytes);
  }
  void givePinned(void* p, size_t bytes) {
    std::lock_guard lock(pinnedMu_);
    pinned_.emplace(bytes, p);
  }

  void giveBack(StreamHandle s) {
    std::lock_guard lock(streamsMu_);
    idleStreams_.push_back(s);
  }

  DeviceApi& device() { return *dev_; }
  DeviceCachingAllocator& allocator() { return alloc_; }

 protected:
  void release(void* handle, size_t) noexcept override {
    alloc_.free(reinterpret_cast<DevicePtr>(handle));
  }

 private:
  std::string name_;
  std::shared_ptr<DeviceApi> dev_;
  DeviceCachingAllocator alloc_;
  BackendCaps caps_;
  std::mutex streamsMu_;
  std::vector<StreamHandle> idleStreams_;
  std::mutex pinnedMu_;
  std::multimap<size_t, void*> pinned_;
};

void HostOp::release(GpuBackend& backend) {
  for (size_t i = 0; i < in.size(); ++i)
    backend.givePinned(in[i], pinnedPoolSize(inTypes[i].byteSize(), kHostOpPinnedBytes));
  for (size_t i = 0; i < out.size(); ++i)
    backend.givePinned(out[i], pinnedPoolSize(outTypes[i].byteSize(), kHostOpPinnedBytes));
  in.clear();
  out.clear();
}

Graph::~Graph() {
  if (graph) dev.destroyGraph(graph);
  for (auto& h : hostOps) h->release(backend);
}

GpuStream::GpuStream(GpuBackend& b, StreamHandle s) : b_(b), dev_(b.device()), s_(s) {}

GpuStream::~GpuStream() {
  (void)synchronize();
  for (EventHandle e : {start_, end_})
    if (e) dev_.destroyEvent(e);
  b_.giveBack(s_);
}

Expected<GpuStream::Staged> GpuStream::stage(size_t bytes) {
  const size_t size = pinnedPoolSize(bytes, kStageBytes);
  KILN_ASSIGN_OR_RETURN(void* p, b_.takePinned(size));
  return Staged{p, size, bytes, nullptr};
}

void GpuStream::unstage(const Staged& st) {
  b_.givePinned(st.host, st.capacity);
}

Expected<void*> GpuStream::takePinned(size_t capacity) {
  return b_.takePinned(capacity);
}

void GpuStream::free(DeviceBuffer buffer) {
  if (!buffer.defined() || !buffer.owned()) return;  // A view frees nothing.
  // Reusable once the work enqueued so far (its last reader) is done.
  Expected<EventHandle> e = dev_.createEvent();
  if (e && dev_.recordEvent(*e, s_).isOk()) {
    b_.allocator().free(reinterpret_cast<DevicePtr>(buffer.detach()), *e);
    return;
  }
  if (e) dev_.destroyEvent(*e);
  (void)dev_.synchronize(s_);  // No event: wait, then free at once.
  buffer.reset();
}

}  // namespace

std::shared_ptr<Backend> makeGpuBackend(std::string name, std::shared_ptr<DeviceApi> device) {
  return std::make_shared<GpuBackend>(std::move(name), std::move(device));
}

DeviceApi* gpuDevice(Backend& backend) {
  auto* g = dynamic_cast<GpuBackend*>(&backend);
  return g ? &g->device() : nullptr;
}

DeviceCachingAllocator* gpuAllocator(Backend& backend) {
  auto* g = dynamic_cast<GpuBackend*>(&backend);
  return g ? &g->allocator() : nullptr;
}

Expected<std::shared_ptr<Backend>> backendForDevice(std::string_view name) {
  if (name == "cpu") return defaultBackend();
  if (name != "emu" && name != "cuda")
    return invalidArgument("unknown device '" + std::string(name) + "' (devices: cpu, cuda, emu)");
  static std::mutex mu;
  std::lock_guard lock(mu);
  if (Expected<std::shared_ptr<Backend>> b = findBackend(name)) return b;
  std::shared_ptr<DeviceApi> dev;
  if (name == "emu") {
    dev = makeEmuDevice();
  } else {
    KILN_ASSIGN_OR_RETURN(dev, openCudaDevice());
  }
  std::shared_ptr<Backend> b = makeGpuBackend(std::string(name), std::move(dev));
  KILN_TRY(registerBackend(b));
  return b;
}

}  // namespace kiln::runtime::gpu
