// The Backend seam (runtime/backend.h), proven before the CUDA backend is built on it: a second
// backend whose memory is not host-addressable (host memory behind opaque handles, with
// explicit copies in and out, and a queue run on a worker thread that executes ops with the
// reference kernels) runs zoo models through the same plan builder, plan executor and eager
// interpreter as the CPU, and matches the CPU backend.
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "compiler/compile.h"
#include "compiler/train.h"
#include "models/zoo.h"
#include "random_inputs.h"
#include "runtime/backend.h"
#include "runtime/eager.h"
#include "runtime/reference/kernels.h"

using namespace kiln;
using runtime::DeviceAddress;
using runtime::DeviceBuffer;
using runtime::DeviceTensor;
using runtime::Tensor;

namespace {

// Memory behind opaque handles: a handle is a block number shifted into an unmapped page of the
// address space, so that a caller dereferencing it as a host pointer crashes instead of
// silently working. Only the worker thread of a stream turns handles into bytes.
class OpaqueMemory {
 public:
  void* allocate(size_t bytes) {
    std::lock_guard lock(mu_);
    const uintptr_t id = ++next_;
    blocks_[id].resize(std::max<size_t>(bytes, 1));
    inUse_ += static_cast<int64_t>(bytes);
    peak_ = std::max(peak_, inUse_);
    ++allocations_;
    return reinterpret_cast<void*>(id << 4);  // 16, 32, 48...: never a valid host address.
  }
  void release(void* handle, size_t bytes) {
    std::lock_guard lock(mu_);
    blocks_.erase(reinterpret_cast<uintptr_t>(handle) >> 4);
    inUse_ -= static_cast<int64_t>(bytes);
  }
  // The bytes behind an address; std::out_of_range (an error of the queue) for an unknown
  // handle or an access outside its block.
  std::byte* resolve(DeviceAddress a, size_t bytes) {
    std::lock_guard lock(mu_);
    auto it = blocks_.find(reinterpret_cast<uintptr_t>(a.handle) >> 4);
    if (it == blocks_.end() || a.offset < 0 ||
        static_cast<size_t>(a.offset) + bytes > it->second.size())
      throw std::out_of_range(
          "opaque backend: bad address (handle " +
          std::to_string(reinterpret_cast<uintptr_t>(a.handle)) + ", offset " +
          std::to_string(a.offset) + ", " + std::to_string(bytes) + " bytes, block of " +
          (it == blocks_.end() ? std::string("none") : std::to_string(it->second.size())) + ")");
    return it->second.data() + a.offset;
  }
  runtime::AllocatorStats stats() const {
    std::lock_guard lock(mu_);
    runtime::AllocatorStats s;
    s.bytesInUse = inUse_;
    s.peakBytesInUse = peak_;
    s.numAllocations = allocations_;
    return s;
  }
  void resetPeak() {
    std::lock_guard lock(mu_);
    peak_ = inUse_;
  }

 private:
  mutable std::mutex mu_;
  uintptr_t next_ = 0;
  std::map<uintptr_t, std::vector<std::byte>> blocks_;
  int64_t inUse_ = 0, peak_ = 0, allocations_ = 0;
};

struct Counters {
  std::atomic<int64_t> uploads{0}, downloads{0}, launches{0}, ops{0};
};

// A queue run by a worker thread; errors are reported at synchronize(), as CUDA streams do.
class OpaqueStream final : public runtime::Stream {
 public:
  OpaqueStream(OpaqueMemory& mem, Counters& counters) : mem_(mem), n_(counters) {
    worker_ = std::thread([this] { work(); });
  }
  ~OpaqueStream() override {
    (void)synchronize();
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  Status upload(DeviceAddress dst, const std::byte* src, size_t bytes) override {
    ++n_.uploads;
    std::vector<std::byte> copy(src, src + bytes);  // The host may reuse its bytes at once.
    return enqueue([this, dst, copy = std::move(copy)] {
      std::memcpy(mem_.resolve(dst, copy.size()), copy.data(), copy.size());
      return Status::ok();
    });
  }
  Status download(std::byte* dst, DeviceAddress src, size_t bytes) override {
    ++n_.downloads;
    return enqueue([this, dst, src, bytes] {
      std::memcpy(dst, mem_.resolve(src, bytes), bytes);
      return Status::ok();
    });
  }
  Status copy(DeviceAddress dst, DeviceAddress src, size_t bytes) override {
    return enqueue([this, dst, src, bytes] {
      std::memmove(mem_.resolve(dst, bytes), mem_.resolve(src, bytes), bytes);
      return Status::ok();
    });
  }
  Status launch(const runtime::KernelLaunch& k, std::span<const DeviceAddress> args) override {
    ++n_.launches;
    std::vector<DeviceAddress> a(args.begin(), args.end());
    return enqueue([this, k, a = std::move(a)] {
      std::vector<void*> ptrs;
      for (const DeviceAddress& x : a) ptrs.push_back(mem_.resolve(x, 0));
      // The kernel ABI of host-object code (codegen/render.h): all units, one thread.
      using Fn = void (*)(void* const*, long long, long long);
      reinterpret_cast<Fn>(const_cast<void*>(k.entry))(ptrs.data(), 0, k.units);
      return Status::ok();
    });
  }
  Status run(const runtime::OpCall& call, std::span<const DeviceTensor> inputs,
             std::span<const DeviceTensor> outputs) override {
    ++n_.ops;
    if (call.library)
      return internalError(std::string(call.name) + ": a library call on a backend without any");
    std::vector<DeviceTensor> in(inputs.begin(), inputs.end()), out(outputs.begin(), outputs.end());
    const ir::AttrMap attrs = call.attrs ? *call.attrs : ir::AttrMap{};
    return enqueue([this, op = call.op, name = std::string(call.name), attrs, in, out] {
      auto wrap = [&](const DeviceTensor& t) {
        return Tensor::wrap(mem_.resolve(t.address, t.type.byteSize()), t.type.dtype, t.type.shape);
      };
      std::vector<Tensor> ti, to;
      for (const auto& t : in) ti.push_back(wrap(t));
      for (const auto& t : out) to.push_back(wrap(t));
      runtime::RefKernel k = runtime::referenceKernel(op);
      if (!k) return unimplemented(name + ": no reference kernel");
      return k(ir::AttrView(ir::opInfo(op), attrs), ti, to).withContext(name);
    });
  }
  void free(DeviceBuffer buffer) override {
    auto owned = std::make_shared<DeviceBuffer>(std::move(buffer));
    (void)enqueue([owned] {
      owned->reset();
      return Status::ok();
    });
  }
  Status synchronize() override {
    std::unique_lock lock(mu_);
    idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
    Status s = error_;
    error_ = Status::ok();
    return s;
  }

 private:
  Status enqueue(std::function<Status()> job) {
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(job));
    }
    cv_.notify_all();
    return Status::ok();
  }
  void work() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
      const bool failed = !error_.isOk();
      lock.unlock();
      Status s;
      if (!failed) {  // After an error, the rest is skipped.
        try {
          s = job();
        } catch (const std::exception& e) {
          s = internalError(e.what());
        }
      }
      lock.lock();
      if (!s.isOk() && error_.isOk()) error_ = s;
      busy_ = false;
      idle_.notify_all();
    }
  }

  OpaqueMemory& mem_;
  Counters& n_;
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<std::function<Status()>> queue_;
  bool busy_ = false, stop_ = false;
  Status error_;
  std::thread worker_;
};

class OpaqueBackend final : public runtime::Backend {
 public:
  // `kernels`: runs kiln's generated host-object kernels on its worker (loaded by the CPU
  // backend's loader), else the plan builder sends every group op by op.
  OpaqueBackend(std::string name, bool kernels) : name_(std::move(name)) {
    if (kernels) caps_.kernelCode = "host-object";
  }
  std::string_view name() const override { return name_; }
  const runtime::BackendCaps& caps() const override { return caps_; }
  Expected<DeviceBuffer> allocate(size_t bytes) override {
    return DeviceBuffer(this, mem_.allocate(bytes), bytes);
  }
  Expected<DeviceBuffer> mapHost(std::byte*, size_t bytes) override { return allocate(bytes); }
  runtime::Allocator& hostAllocator() override { return runtime::cpuAllocator(); }
  runtime::AllocatorStats memoryStats() const override { return mem_.stats(); }
  void resetPeakMemory() override { mem_.resetPeak(); }
  Expected<std::unique_ptr<runtime::Stream>> openStream(int) override {
    return std::unique_ptr<runtime::Stream>(std::make_unique<OpaqueStream>(mem_, counters));
  }
  Expected<std::shared_ptr<runtime::KernelModule>> loadKernels(
      std::span<const runtime::KernelObject> objects) override {
    if (caps_.kernelCode.empty()) return unimplemented(name_ + " runs no generated kernels");
    return (*runtime::findBackend("cpu"))->loadKernels(objects);
  }
  bool hasLibraryKernel(ir::OpKind, ir::DType, ir::Layout) const override { return false; }

  Counters counters;

 protected:
  void release(void* handle, size_t bytes) noexcept override { mem_.release(handle, bytes); }

 private:
  std::string name_;
  runtime::BackendCaps caps_;
  OpaqueMemory mem_;
};

// The two test backends, registered once for the process.
std::shared_ptr<OpaqueBackend> backend(bool kernels) {
  static const auto make = [](const char* name, bool k) {
    auto b = std::make_shared<OpaqueBackend>(name, k);
    REQUIRE(runtime::registerBackend(b).isOk());
    return b;
  };
  static const std::shared_ptr<OpaqueBackend> withKernels = make("opaque", true);
  static const std::shared_ptr<OpaqueBackend> opsOnly = make("opaque-ops", false);
  return kernels ? withKernels : opsOnly;
}

// max |a - b| / max |b|.
double relError(const Tensor& a, const Tensor& b) {
  REQUIRE(a.shape() == b.shape());
  double maxRef = 0, maxDiff = 0;
  for (int64_t i = 0; i < b.numElements(); ++i) {
    maxRef = std::max(maxRef, std::fabs(static_cast<double>(b.data<float>()[i])));
    const double d = std::fabs(static_cast<double>(a.data<float>()[i]) -
                               static_cast<double>(b.data<float>()[i]));
    if (std::isnan(d)) return INFINITY;  // std::max would drop it.
    maxDiff = std::max(maxDiff, d);
  }
  return maxDiff / std::max(maxRef, 1e-30);
}

void checkClose(const Expected<std::vector<Tensor>>& got, const std::vector<Tensor>& want) {
  INFO(got.status().message());
  REQUIRE(got.hasValue());
  REQUIRE(got->size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) CHECK(relError((*got)[i], want[i]) <= 1e-4);
}

struct TempCache {
  std::string path =
      (std::filesystem::temp_directory_path() / ("kiln_test_backend_" + std::to_string(::getpid())))
          .string();
  ~TempCache() { std::filesystem::remove_all(path); }
};

}  // namespace

TEST_CASE(
    "backend: a zoo model runs compiled and eager on an opaque-handle backend, matching the CPU") {
  const std::string name = GENERATE(as<std::string>{}, "mnist_cnn", "bert_layer", "resnet18");
  const bool kernels = GENERATE(true, false);
  INFO(name << (kernels ? " (generated kernels)" : " (op by op)"));
  auto g = models::buildModel(name, {1, 5});
  REQUIRE(g.hasValue());
  const std::vector<Tensor> ins = testing::randomInputs(*g, 9);
  auto want = runtime::EagerExecutor(*g).run(ins);  // The CPU backend: library kernels.
  REQUIRE(want.hasValue());

  const std::shared_ptr<OpaqueBackend> b = backend(kernels);
  TempCache cache;
  compiler::CompileOptions o;
  o.cacheDir = cache.path;
  o.backend = b;
  const int64_t up = b->counters.uploads, down = b->counters.downloads;
  auto cm = compiler::compile(*g, o);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  // compile() prepared the plan: the weights are on the backend before the first call.
  CHECK(b->counters.uploads - up == static_cast<int64_t>((*cm)->plan().parameters.size()));
  const auto& r = (*cm)->report();
  // The plan builder asked the backend: no library calls, no channels-last, and generated
  // kernels only where the backend loads them.
  for (const auto& s : (*cm)->plan().steps) CHECK_FALSE(s.library);
  CHECK(r.layoutConversions == 0);
  CHECK((r.generatedKernels > 0) == kernels);

  checkClose((*cm)->run(ins), *want);
  // Inputs and weights went in and the outputs came back by explicit copies.
  CHECK(b->counters.uploads - up ==
        static_cast<int64_t>(ins.size() + (*cm)->plan().parameters.size()));
  CHECK(b->counters.downloads - down == static_cast<int64_t>(want->size()));
  checkClose((*cm)->run(ins), *want);  // The weights stay on the backend: a second call.

  runtime::EagerExecutor eager(*g, b);
  checkClose(eager.run(ins), *want);
  CHECK(eager.lastStats().peakActivationBytes > 0);  // Counted in the backend's memory.
}

TEST_CASE("backend: compiled training writes its parameters on the backend and back to the host") {
  // Parameters written in place live in the backend's memory during the step and return to
  // the plan's bytes after it: three SGD steps on the opaque backend match the CPU's.
  TempCache cache;
  compiler::TrainOptions cpu;
  cpu.compile.cacheDir = cache.path;
  cpu.sgd = {.lr = 0.05, .momentum = 0.9, .weightDecay = 1e-4, .nesterov = true};
  compiler::TrainOptions opaque = cpu;
  opaque.compile.backend = backend(true);
  compiler::TrainOptions opaqueEager = opaque;
  opaqueEager.eager = true;
  std::vector<std::unique_ptr<compiler::TrainingStep>> steps;
  for (const auto* o : {&cpu, &opaque, &opaqueEager}) {
    auto model = models::buildModel("mlp", {4, 7});
    REQUIRE(model.hasValue());
    auto s = compiler::TrainingStep::create(std::move(model).value(), *o);
    INFO(s.status().message());
    REQUIRE(s.hasValue());
    steps.push_back(std::move(*s));
  }
  const ir::Shape shape = steps[0]->graph().inputs()[0]->type().shape;
  std::mt19937 rng(3);
  for (int step = 0; step < 3; ++step) {
    Tensor x = *Tensor::empty(ir::DType::kF32, shape);
    for (int64_t i = 0; i < x.numElements(); ++i)
      x.data<float>()[i] = std::uniform_real_distribution<float>(-1, 1)(rng);
    Tensor t = *Tensor::zeros(ir::DType::kI64, {shape[0]});
    for (int64_t i = 0; i < shape[0]; ++i) t.data<int64_t>()[i] = static_cast<int64_t>(rng() % 10);
    std::vector<double> losses;
    for (auto& s : steps) {
      auto r = (*s)(x, t);
      INFO(r.status().message());
      REQUIRE(r.hasValue());
      losses.push_back(r->loss);
    }
    CHECK(std::fabs(losses[1] - losses[0]) <= 1e-4 * std::fabs(losses[0]));
    CHECK(std::fabs(losses[2] - losses[0]) <= 1e-4 * std::fabs(losses[0]));
  }
  const auto& p0 = steps[0]->graph().parameters();
  const auto& p1 = steps[1]->graph().parameters();
  for (size_t i = 0; i < p0.size(); ++i) {
    if (!p0[i]->trainable() || p0[i]->data().dtype() != ir::DType::kF32) continue;
    INFO(p0[i]->name());
    const float* a = p0[i]->data().as<float>();
    const float* c = p1[i]->data().as<float>();
    double diff = 0;
    for (int64_t k = 0; k < p0[i]->data().numElements(); ++k)
      diff = std::max(diff, std::fabs(static_cast<double>(a[k]) - c[k]));
    CHECK(diff <= 1e-4);
  }
}

TEST_CASE("backend: an op error on an asynchronous queue surfaces at the end of the run, named") {
  // gather with an out-of-range index fails inside the reference kernel on the worker thread.
  ir::Graph g("bad_gather");
  ir::Value* x = *g.addInput("x", {ir::DType::kF32, {4, 3}});
  ir::Value* idx = *g.addInput("idx", {ir::DType::kI64, {2}});
  ir::AttrMap attrs;
  attrs["axis"] = int64_t{0};
  g.setOutputs({(*g.addNode(ir::OpKind::kGather, {x, idx}, attrs))->output()});
  Tensor xs = *Tensor::zeros(ir::DType::kF32, {4, 3});
  Tensor is = *Tensor::zeros(ir::DType::kI64, {2});
  is.data<int64_t>()[1] = 99;
  runtime::EagerExecutor eager(g, backend(false));
  auto r = eager.run(std::vector<Tensor>{xs, is});
  REQUIRE_FALSE(r.hasValue());
  CHECK_THAT(r.status().message(), Catch::Contains("gather"));
  // The backend is usable again after the error.
  is.data<int64_t>()[1] = 3;
  CHECK(eager.run(std::vector<Tensor>{xs, is}).hasValue());
}

TEST_CASE("backend: the registry names its backends; a taken name and an unknown one are errors") {
  backend(true);
  const auto names = runtime::backendNames();
  CHECK(std::find(names.begin(), names.end(), "cpu") != names.end());
  CHECK(std::find(names.begin(), names.end(), "opaque") != names.end());
  auto again = runtime::registerBackend(std::make_shared<OpaqueBackend>("opaque", true));
  CHECK_FALSE(again.isOk());
  CHECK_THAT(again.message(), Catch::Contains("already registered"));
  auto none = runtime::findBackend("tpu");
  REQUIRE_FALSE(none.hasValue());
  CHECK_THAT(none.status().message(), Catch::Contains("no backend named 'tpu'") &&
                                          Catch::Contains("cpu") && Catch::Contains("opaque"));
  CHECK((*runtime::findBackend("cpu"))->caps().hostAddressable);
}
