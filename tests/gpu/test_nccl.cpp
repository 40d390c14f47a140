// NCCL collectives (runtime/gpu/nccl_collectives.h): without a GPU, a clear error; with one (the
// device machine, scripts/gpu-check.sh), a world of one rank sums device memory in place. And the
// data-parallel step's device buckets (TrainOptions::deviceCollectives): a one-rank step equals
// the plain step, on the emu device here (device buffers behind handles) and over NCCL on a GPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "compiler/train.h"
#include "models/zoo.h"
#include "runtime/gpu/gpu_backend.h"
#include "runtime/gpu/nccl_collectives.h"

using namespace kiln;

namespace {

// One process, no MPI: what NCCL's bootstrap needs of it (rank 0 of 1).
// `device`: it claims to sum device memory (as NCCL) and counts the bytes it was handed.
class Solo final : public runtime::Collectives {
 public:
  explicit Solo(bool device = false) : device_(device) {}
  std::string_view name() const override { return device_ ? "solo-device" : "solo"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  bool hostMemory() const override { return !device_; }
  Status broadcast(void*, size_t, int) override { return Status::ok(); }
  Status allReduceSum(void*, size_t, ir::DType) override { return Status::ok(); }
  Expected<int> startAllReduceSum(void*, size_t count, ir::DType) override {
    started += static_cast<int64_t>(count);
    return 0;
  }
  Expected<bool> test(int) override { return true; }
  Status wait(int) override { return Status::ok(); }
  [[noreturn]] void abort(const std::string&, int code) override { std::_Exit(code); }
  int64_t started = 0;  // Elements.

 private:
  bool device_;
};

// Three SGD steps of mnist_cnn on `backend` (batch 4, fixed data), the data-parallel step with
// `deviceSum` as its device collectives when given; the final parameters.
std::vector<ir::TensorData> trainThree(std::shared_ptr<runtime::Backend> backend,
                                       std::shared_ptr<runtime::Collectives> deviceSum, bool ddp) {
  compiler::TrainOptions o;
  o.sgd = {.lr = 0.05, .momentum = 0.9};
  o.mode.dropout = false;
  o.compile.backend = std::move(backend);
  o.compile.runThreads = 1;
  o.bucketBytes = 64 << 10;  // Several buckets, started during the backward.
  if (ddp) {
    o.collectives = std::make_shared<Solo>();
    o.deviceCollectives = std::move(deviceSum);
  }
  auto model = models::buildModel("mnist_cnn", {.batch = 4, .seed = 5});
  REQUIRE(model.hasValue());
  auto step = compiler::TrainingStep::create(std::move(*model), o);
  INFO(step.status().message());
  REQUIRE(step.hasValue());
  auto x = runtime::Tensor::zeros(ir::DType::kF32, {4, 1, 28, 28});
  auto t = runtime::Tensor::zeros(ir::DType::kI64, {4});
  for (int64_t i = 0; i < x->numElements(); ++i) x->data<float>()[i] = float(i % 17) / 17 - 0.5f;
  for (int64_t i = 0; i < 4; ++i) t->data<int64_t>()[i] = i * 3;
  for (int s = 0; s < 3; ++s) {
    auto r = (**step)(*x, *t);
    INFO(r.status().message());
    REQUIRE(r.hasValue());
  }
  std::vector<ir::TensorData> out;
  for (const ir::Value* p : (*step)->graph().parameters())
    if (p->trainable()) out.push_back(p->data().clone());
  return out;
}

}  // namespace

TEST_CASE("nccl collectives: a clear error without a GPU, in-place sums with one") {
  auto nccl = runtime::gpu::ncclCollectives(std::make_shared<Solo>());
  auto cuda = runtime::gpu::backendForDevice("cuda");
  if (!cuda.hasValue()) {
    REQUIRE_FALSE(nccl.hasValue());
    CHECK(nccl.status().code() == ErrorCode::kNotFound);
    CHECK_THAT(nccl.status().message(), Catch::StartsWith("NCCL collectives"));
    return;
  }
  INFO(nccl.status().message());
  REQUIRE(nccl.hasValue());
  CHECK((*nccl)->name() == "nccl");
  CHECK((*nccl)->size() == 1);
  CHECK_FALSE((*nccl)->hostMemory());
  std::vector<float> host{1, 2, 3, 4}, back(4, 0);
  auto buf = (*cuda)->allocate(host.size() * sizeof(float));
  REQUIRE(buf.hasValue());
  auto stream = (*cuda)->openStream(0);
  REQUIRE(stream.hasValue());
  REQUIRE((*stream)
              ->upload(buf->address(), reinterpret_cast<const std::byte*>(host.data()), 16)
              .isOk());
  REQUIRE((*stream)->synchronize().isOk());
  void* device = buf->address().handle;  // The CUDA backend's handle is the device address.
  auto r = (*nccl)->startAllReduceSum(device, host.size(), ir::DType::kF32);
  REQUIRE(r.hasValue());
  REQUIRE((*nccl)->wait(*r).isOk());
  REQUIRE((*nccl)->allReduceSum(device, host.size(), ir::DType::kF32).isOk());
  REQUIRE(
      (*stream)->download(reinterpret_cast<std::byte*>(back.data()), buf->address(), 16).isOk());
  REQUIRE((*stream)->synchronize().isOk());
  CHECK(back == host);  // The sum over one rank.
}

TEST_CASE("data-parallel step: gradients summed in device buckets") {
  // One rank, so that every sum is the identity: the step with device buckets (gradients copied
  // within the device on the step's stream, summed there, copied to the host for the update) must
  // equal the plain step bit for bit. The emu device's memory stands behind device handles as a
  // GPU's does; on a GPU (scripts/gpu-check.sh) NCCL sums them.
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  auto sum = std::make_shared<Solo>(true);
  const auto plain = trainThree(*emu, nullptr, false);
  const auto buckets = trainThree(*emu, sum, true);
  CHECK(sum->started > 100000);  // mnist_cnn's 1.2M gradient elements, three times.
  REQUIRE(plain.size() == buckets.size());
  for (size_t i = 0; i < plain.size(); ++i) CHECK(plain[i] == buckets[i]);

  // Device collectives need host collectives beside them, device memory and the same ranks.
  compiler::TrainOptions alone;
  alone.deviceCollectives = std::make_shared<Solo>(true);
  alone.compile.backend = *emu;
  auto lone = compiler::TrainingStep::create(
      std::move(models::buildModel("mlp", {.batch = 2}).value()), alone);
  REQUIRE_FALSE(lone.hasValue());
  CHECK_THAT(lone.status().message(), Catch::Contains("needs TrainOptions::collectives"));
  compiler::TrainOptions o;
  o.collectives = std::make_shared<Solo>();
  o.deviceCollectives = std::make_shared<Solo>(true);
  auto cpu =
      compiler::TrainingStep::create(std::move(models::buildModel("mlp", {.batch = 2}).value()), o);
  REQUIRE_FALSE(cpu.hasValue());
  CHECK_THAT(cpu.status().message(), Catch::Contains("keeps tensors in host memory"));
  o.compile.backend = *emu;
  o.deviceCollectives = std::make_shared<Solo>(false);
  auto host =
      compiler::TrainingStep::create(std::move(models::buildModel("mlp", {.batch = 2}).value()), o);
  REQUIRE_FALSE(host.hasValue());
  CHECK_THAT(host.status().message(), Catch::Contains("sum host memory"));

  auto cuda = runtime::gpu::backendForDevice("cuda");
  if (!cuda.hasValue()) return;
  auto nccl = runtime::gpu::ncclCollectives(std::make_shared<Solo>());
  INFO(nccl.status().message());
  REQUIRE(nccl.hasValue());
  // The plain step is one plan, the data-parallel step two (the update after the sums), so their
  // kernels fuse differently, and NVRTC contracts multiply-adds into FMAs (its default): on a GPU
  // the two differ in their last bits (H200: at most 7.5e-9 on weights of 0.06-0.33, under one
  // ulp of the largest), where a bucket summed or copied wrongly moves a weight by a gradient
  // step (about 1e-3). On emu they are equal (above). The plain step gives the same bits twice.
  const auto onGpu = trainThree(*cuda, nullptr, false);
  const auto again = trainThree(*cuda, nullptr, false);
  const auto overNccl = trainThree(*cuda, *nccl, true);
  REQUIRE(onGpu.size() == overNccl.size());
  REQUIRE(onGpu.size() == again.size());
  // The largest difference between two runs' parameters, and the largest parameter.
  auto apart = [](const ir::TensorData& a, const ir::TensorData& b) {
    double d = 0, m = 0;
    for (int64_t k = 0; k < a.numElements(); ++k) {
      d = std::max(d, std::fabs(double(a.as<float>()[k]) - b.as<float>()[k]));
      m = std::max(m, std::fabs(double(a.as<float>()[k])));
    }
    return std::pair{d, m};
  };
  for (size_t i = 0; i < onGpu.size(); ++i) {
    const auto [d, m] = apart(onGpu[i], overNccl[i]);
    INFO("parameter " << i << ": over NCCL " << d << " apart, largest " << m);
    CHECK(onGpu[i] == again[i]);
    CHECK(d <= 1e-6 * m);
  }
}
