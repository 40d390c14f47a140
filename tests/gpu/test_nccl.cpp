// NCCL collectives (runtime/gpu/nccl_collectives.h): without a GPU, a clear error; with one (the
// device machine, scripts/gpu-check.sh), a world of one rank sums device memory in place.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "runtime/gpu/gpu_backend.h"
#include "runtime/gpu/nccl_collectives.h"

using namespace kiln;

namespace {

// One process, no MPI: what NCCL's bootstrap needs of it (rank 0 of 1).
class Solo final : public runtime::Collectives {
 public:
  std::string_view name() const override { return "solo"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  bool hostMemory() const override { return true; }
  Status broadcast(void*, size_t, int) override { return Status::ok(); }
  Status allReduceSum(void*, size_t, ir::DType) override { return Status::ok(); }
  Expected<int> startAllReduceSum(void*, size_t, ir::DType) override { return 0; }
  Expected<bool> test(int) override { return true; }
  Status wait(int) override { return Status::ok(); }
  [[noreturn]] void abort(const std::string&, int code) override { std::_Exit(code); }
};

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
