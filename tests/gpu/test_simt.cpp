// The emu device's SIMT engine (runtime/gpu/simt.h) running hand-written CUDA C: block
// reductions and shuffles over every block size of whole warps, __shared__ memory with real
// barriers, and the checks a GPU does not make (out-of-bounds accesses, misaligned arguments,
// divergent barriers, shuffles with exited lanes), each naming the kernel, block and thread.
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>

#include "gpu_test_util.h"

using namespace kiln;
using namespace kiln::runtime::gpu;
using kiln::testing::EmuModule;

namespace {

const char* kKernels = R"(
// Each block reduces its rows with kiln's block reduction (the prelude's, as generated kernels do).
extern "C" __global__ void row_sum(kiln_gptr<const float> x, kiln_gptr<float> y, long long rows, long long cols) {
  KILN_SHARED(float, smem, 32);
  for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
    float acc = 0.0f;
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) acc += x[r * cols + c];
    acc = kiln_block_reduce(acc, 0.0f, kiln_sum_op(), smem);
    if (threadIdx.x == 0) y[r] = acc;
    __syncthreads();
  }
}
// Reverses each block's slice through shared memory: wrong without a real barrier.
extern "C" __global__ void reverse(kiln_gptr<const int> x, kiln_gptr<int> y) {
  KILN_SHARED(int, s, 1024);
  const unsigned t = threadIdx.x, n = blockDim.x;
  s[t] = x[blockIdx.x * n + t];
  __syncthreads();
  y[blockIdx.x * n + t] = s[n - 1 - t];
}
// Every shuffle kind: out[4 * i + k] for lane i.
extern "C" __global__ void shuffles(kiln_gptr<int> out) {
  const int lane = threadIdx.x;
  out[4 * lane + 0] = __shfl_down_sync(0xffffffffu, lane * 10, 3);
  out[4 * lane + 1] = __shfl_up_sync(0xffffffffu, lane * 10, 5, 16);
  out[4 * lane + 2] = __shfl_xor_sync(0xffffffffu, lane * 10, 6);
  out[4 * lane + 3] = __shfl_sync(0xffffffffu, lane * 10, 7, 8);
}
extern "C" __global__ void divergent_barrier(kiln_gptr<float> y) {
  if (threadIdx.x < 16) __syncthreads();
  y[threadIdx.x] = 1.0f;
}
extern "C" __global__ void early_exit_shuffle(kiln_gptr<float> y) {
  if (threadIdx.x == 5) return;
  y[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.0f, 1);
}
extern "C" __global__ void write_past_end(kiln_gptr<float> y, long long n) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i <= n; i += (long long)gridDim.x * blockDim.x)
    y[i] = 2.0f;
}
extern "C" __global__ void read_before_start(kiln_gptr<const float> x, kiln_gptr<float> y) {
  y[threadIdx.x] = x[(long long)threadIdx.x - 1];
}
extern "C" __global__ void copy_f64(kiln_gptr<const double> x, kiln_gptr<double> y) {
  y[threadIdx.x] = x[threadIdx.x];
}
// Generated pointwise kernels' vector accesses: float4 where both buffers are 16-byte aligned,
// else the scalar loop (which negates here, to tell the paths apart).
extern "C" __global__ void scale4(kiln_gptr<const float> x, kiln_gptr<float> y, long long n) {
  if (kiln_aligned16(x) && kiln_aligned16(y)) {
    for (long long v = threadIdx.x; v < n / 4; v += blockDim.x) {
      const float4 a = kiln_ld4(x, 4 * v);
      kiln_st4(y, 4 * v, make_float4(2 * a.x, 2 * a.y, 2 * a.z, 2 * a.w));
    }
    return;
  }
  for (long long i = threadIdx.x; i < n; i += blockDim.x) y[i] = -2 * x[i];
}
extern "C" __global__ void load4_at(kiln_gptr<const float> x, kiln_gptr<float> y, long long at) {
  y[threadIdx.x] = kiln_ld4(x, at).w;
}
)";

const EmuModule& module() {
  static const EmuModule m(
      kKernels, {"row_sum", "reverse", "shuffles", "divergent_barrier", "early_exit_shuffle",
                 "write_past_end", "read_before_start", "copy_f64", "scale4", "load4_at"});
  return m;
}

}  // namespace

TEST_CASE("simt: block reductions over every block size of whole warps and tail blocks") {
  const EmuModule& m = module();
  std::mt19937 rng(5);
  for (int trial = 0; trial < 12; ++trial) {
    const uint32_t block = 32 * std::uniform_int_distribution<uint32_t>(1, 32)(rng);
    const long long rows = std::uniform_int_distribution<long long>(1, 9)(rng);
    const long long cols = std::uniform_int_distribution<long long>(1, 3000)(rng);
    const uint32_t grid = std::uniform_int_distribution<uint32_t>(1, 5)(rng);  // Often < rows.
    INFO("block " << block << " grid " << grid << " rows " << rows << " cols " << cols);
    std::vector<float> x(static_cast<size_t>(rows * cols));
    std::uniform_real_distribution<float> u(-1, 1);
    for (float& v : x) v = u(rng);
    std::vector<float> y(static_cast<size_t>(rows), -1.0f);
    auto dx = m.upload(x);
    auto dy = m.upload(y);
    long long r = rows, c = cols;
    REQUIRE(m.launch("row_sum", grid, block, {m.arg(dx), m.arg(dy), &r, &c},
                     {m.bytes(dx), m.bytes(dy), -1, -1})
                .isOk());
    m.download(dy, y);
    for (long long i = 0; i < rows; ++i) {
      double want = 0;
      for (long long j = 0; j < cols; ++j) want += x[static_cast<size_t>(i * cols + j)];
      CHECK(y[static_cast<size_t>(i)] == Approx(want).margin(1e-4));
    }
  }
}

TEST_CASE("simt: __shared__ memory is per block and __syncthreads is a real barrier") {
  const EmuModule& m = module();
  for (uint32_t block : {32u, 96u, 1024u}) {
    const uint32_t grid = 3;
    std::vector<int> x(grid * block), y(grid * block, 0);
    std::iota(x.begin(), x.end(), 0);
    auto dx = m.upload(x);
    auto dy = m.upload(y);
    REQUIRE(m.launch("reverse", grid, block, {m.arg(dx), m.arg(dy)}, {m.bytes(dx), m.bytes(dy)})
                .isOk());
    m.download(dy, y);
    for (uint32_t b = 0; b < grid; ++b)
      for (uint32_t t = 0; t < block; ++t)
        CHECK(y[b * block + t] == int(b * block + block - 1 - t));
  }
}

TEST_CASE("simt: warp shuffles follow CUDA's lane rules") {
  const EmuModule& m = module();
  std::vector<int> out(32 * 4, -1);
  auto d = m.upload(out);
  REQUIRE(m.launch("shuffles", 1, 32, {m.arg(d)}, {m.bytes(d)}).isOk());
  m.download(d, out);
  for (int lane = 0; lane < 32; ++lane) {
    INFO("lane " << lane);
    CHECK(out[4 * lane + 0] == (lane + 3 < 32 ? lane + 3 : lane) * 10);
    const int seg16 = lane / 16 * 16;
    CHECK(out[4 * lane + 1] == (lane - 5 >= seg16 ? lane - 5 : lane) * 10);
    CHECK(out[4 * lane + 2] == (lane ^ 6) * 10);
    CHECK(out[4 * lane + 3] == (lane / 8 * 8 + 7) * 10);
  }
}

TEST_CASE("simt: a barrier reached by part of a block is an error naming the kernel and block") {
  const EmuModule& m = module();
  std::vector<float> y(64, 0);
  auto d = m.upload(y);
  const Status s = m.launch("divergent_barrier", 2, 64, {m.arg(d)}, {m.bytes(d)});
  INFO(s.message());
  CHECK_FALSE(s.isOk());
  CHECK_THAT(s.message(), Catch::Contains("kernel 'divergent_barrier' block (0,0,0)") &&
                              Catch::Contains("__syncthreads reached by 16 of 64 threads") &&
                              Catch::Contains("had exited"));
}

TEST_CASE("simt: a shuffle whose lanes exited is an error") {
  const EmuModule& m = module();
  std::vector<float> y(32, 0);
  auto d = m.upload(y);
  const Status s = m.launch("early_exit_shuffle", 1, 32, {m.arg(d)}, {m.bytes(d)});
  INFO(s.message());
  CHECK_THAT(s.message(), Catch::Contains("warp shuffle waits for lanes that exited") &&
                              Catch::Contains("thread (5,0,0) had exited"));
}

TEST_CASE("simt: out-of-bounds and misaligned accesses are errors naming block and thread") {
  const EmuModule& m = module();
  SECTION("a write one past the end, found in the tail block") {
    std::vector<float> y(100, 0);
    auto d = m.upload(y);
    long long n = 100;
    // 100 elements over blocks of 32: the element past the end is thread 4 of block 3.
    const Status s = m.launch("write_past_end", 4, 32, {m.arg(d), &n}, {m.bytes(d), -1});
    INFO(s.message());
    CHECK_THAT(s.message(),
               Catch::Contains("kernel 'write_past_end' block (3,0,0) thread (4,0,0)") &&
                   Catch::Contains("out-of-bounds access of 4 bytes at byte offset "
                                   "400 of argument 0 (its buffer has 400 bytes)"));
    // The stray write went to scratch memory, not past the buffer: the stream keeps working.
    m.download(d, y);
    CHECK(y[99] == 2.0f);
  }
  SECTION("a read before the start") {
    std::vector<float> x(32, 1), y(32, 0);
    auto dx = m.upload(x);
    auto dy = m.upload(y);
    const Status s =
        m.launch("read_before_start", 1, 32, {m.arg(dx), m.arg(dy)}, {m.bytes(dx), m.bytes(dy)});
    CHECK_THAT(s.message(), Catch::Contains("thread (0,0,0): out-of-bounds read of 4 bytes at "
                                            "byte offset -4 of argument 0"));
  }
  SECTION("an argument the launch covers with fewer bytes than the kernel reads") {
    std::vector<double> x(32, 1), y(32, 0);
    auto dx = m.upload(x);
    auto dy = m.upload(y);
    const Status s =
        m.launch("copy_f64", 1, 32, {m.arg(dx), m.arg(dy)}, {m.bytes(dx) - 8, m.bytes(dy)});
    CHECK_THAT(s.message(), Catch::Contains("thread (31,0,0): out-of-bounds read of 8 bytes"));
  }
  SECTION("a misaligned argument") {
    std::vector<double> x(33, 1), y(32, 0);
    auto dx = m.upload(x);
    auto dy = m.upload(y);
    const Status s =
        m.launch("copy_f64", 1, 32, {m.argAt(dx, 4), m.arg(dy)}, {m.bytes(dx) - 4, m.bytes(dy)});
    CHECK_THAT(s.message(), Catch::Contains("argument 0 is not aligned to 8 bytes"));
  }
}

TEST_CASE("simt: float4 accesses run on aligned buffers and are checked like scalar ones") {
  const EmuModule& m = module();
  std::vector<float> x(65), y(64, 0);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i);
  auto dx = m.upload(x);
  auto dy = m.upload(y);
  long long n = 64;
  // Aligned: the vector loop.
  REQUIRE(
      m.launch("scale4", 1, 32, {m.arg(dx), m.arg(dy), &n}, {m.bytes(dx), m.bytes(dy), -1}).isOk());
  m.download(dy, y);
  for (int i = 0; i < 64; ++i) CHECK(y[i] == 2.f * i);
  // x four bytes in: not 16-byte aligned, so the scalar loop, with the same elements.
  REQUIRE(
      m.launch("scale4", 1, 32, {m.argAt(dx, 4), m.arg(dy), &n}, {m.bytes(dx) - 4, m.bytes(dy), -1})
          .isOk());
  m.download(dy, y);
  for (int i = 0; i < 64; ++i) CHECK(y[i] == -2.f * (i + 1));
  // A float4 access off a 16-byte boundary, and one past the end, are errors (a GPU faults).
  long long at = 1;
  Status s =
      m.launch("load4_at", 1, 32, {m.arg(dx), m.arg(dy), &at}, {m.bytes(dx), m.bytes(dy), -1});
  CHECK_THAT(s.message(),
             Catch::Contains("argument 0 at byte offset 4 is not aligned to 16 bytes"));
  at = 62;
  s = m.launch("load4_at", 1, 32, {m.arg(dx), m.arg(dy), &at}, {m.bytes(dx), m.bytes(dy), -1});
  CHECK_THAT(s.message(), Catch::Contains("out-of-bounds read of 16 bytes at byte offset 248"));
}

TEST_CASE("simt: launches the device cannot run are refused before running") {
  const EmuModule& m = module();
  std::vector<float> y(32, 0);
  auto d = m.upload(y);
  CHECK_THAT(m.launch("divergent_barrier", 1, 2048, {m.arg(d)}, {m.bytes(d)}).message(),
             Catch::Contains("2048 threads per block; the device allows 1024"));
  CHECK_THAT(m.launch("divergent_barrier", 0, 32, {m.arg(d)}, {m.bytes(d)}).message(),
             Catch::Contains("empty launch"));
}
