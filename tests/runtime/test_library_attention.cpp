// The CPU's tiled attention (runtime/library/attention.cpp) against the reference kernel: key
// counts below, at and across its 128-key tiles, query counts across its 64-row blocks, masks of
// every broadcast shape, and the NaN/Inf rule (a fully masked row is NaN; a row masked only in
// its first tile is not; NaN and +inf scores make their row NaN). Tolerance: 1e-5 of max
// |reference|.
#include <omp.h>
#include <cmath>

#include <limits>

#include "runtime/cpu/compute_threads.h"
#include "runtime/test_library_util.h"

using namespace kiln;
using namespace kiln::libtest;

namespace {

struct AttentionCase {
  Shape q;        // [..., S, D]
  int64_t t, dv;  // Keys and value width.
  Shape mask;     // Empty: none.
};

std::vector<Tensor> inputsOf(const AttentionCase& c, uint32_t seed) {
  const Shape batch(c.q.begin(), c.q.end() - 2);
  Shape kt = batch, v = batch;
  kt.push_back(c.q.back());
  kt.push_back(c.t);
  v.push_back(c.t);
  v.push_back(c.dv);
  std::vector<Tensor> in{randomTensor(c.q, seed, -2.f, 2.f), randomTensor(kt, seed + 1, -2.f, 2.f),
                         randomTensor(v, seed + 2)};
  if (!c.mask.empty()) in.push_back(randomTensor(c.mask, seed + 3, -3.f, 0.f));
  return in;
}

ir::AttrMap scaleOf(double s) {
  return {{"scale", s}};
}

}  // namespace

TEST_CASE("library attention matches the reference across tiles, blocks and masks",
          "[library][attention]") {
  const std::vector<AttentionCase> cases = {
      {{1, 1, 4}, 1, 3, {}},
      {{2, 5, 8}, 7, 4, {}},
      {{1, 12, 128, 64}, 128, 64, {1, 1, 1, 128}},  // BERT's shape and padding mask.
      {{2, 3, 70, 16}, 300, 8, {2, 1, 1, 300}},     // Three key tiles, two row blocks.
      {{3, 65, 8}, 129, 5, {65, 129}},              // A mask per query and key.
      {{2, 2, 9, 4}, 200, 3, {2, 2, 9, 200}},       // A full mask.
      {{4, 6, 0}, 5, 3, {5}},                       // D = 0: every score is the mask.
      {{2, 6, 4}, 0, 3, {}},                        // No keys: zeros.
  };
  uint32_t seed = 1;
  for (const AttentionCase& c : cases) {
    INFO("q " << ir::shapeToString(c.q) << ", T " << c.t << ", Dv " << c.dv << ", mask "
              << ir::shapeToString(c.mask));
    const std::vector<Tensor> in = inputsOf(c, seed += 10);
    const ir::AttrMap attrs = scaleOf(0.125);
    checkRelClose(runLib(OpKind::kAttention, in, attrs), runRef(OpKind::kAttention, in, attrs),
                  1e-5);
  }
}

TEST_CASE("library attention follows the unfused ops on -inf, +inf and NaN scores",
          "[library][attention][nan]") {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  // 3 query rows, 300 keys (three tiles): row 0 masked throughout, row 1 masked in its first
  // tile only, row 2 plain.
  AttentionCase c{{1, 3, 8}, 300, 4, {1, 3, 300}};
  std::vector<Tensor> in = inputsOf(c, 5);
  float* mask = in[3].data<float>();
  for (int64_t j = 0; j < 300; ++j) mask[j] = -kInf;
  for (int64_t j = 0; j < 128; ++j) mask[300 + j] = -kInf;
  const ir::AttrMap attrs = scaleOf(0.5);
  const Tensor want = runRef(OpKind::kAttention, in, attrs);
  const Tensor got = runLib(OpKind::kAttention, in, attrs);
  for (int64_t k = 0; k < 4; ++k) {
    CHECK(std::isnan(want.data<float>()[k]));
    CHECK(std::isnan(got.data<float>()[k]));
    CHECK(std::isfinite(got.data<float>()[4 + k]));
  }
  checkRelClose(got, want, 1e-5);

  // A NaN query element, and a +inf one (its scores become +-inf: +inf - +inf is NaN): their
  // rows are NaN, the others untouched.
  in = inputsOf({{1, 4, 8}, 130, 4, {}}, 9);
  in[0].data<float>()[1 * 8 + 2] = std::numeric_limits<float>::quiet_NaN();
  in[0].data<float>()[2 * 8 + 5] = kInf;
  const Tensor want2 = runRef(OpKind::kAttention, in, attrs);
  const Tensor got2 = runLib(OpKind::kAttention, in, attrs);
  for (int64_t row : {1, 2})
    for (int64_t k = 0; k < 4; ++k) {
      CHECK(std::isnan(want2.data<float>()[row * 4 + k]));
      CHECK(std::isnan(got2.data<float>()[row * 4 + k]));
    }
  checkRelClose(got2, want2, 1e-5);
}

TEST_CASE("library attention and matmul give the same bits at every thread count",
          "[library][attention][matmul]") {
  // A call is granted 1 to numThreads() threads, and kiln's results do not depend on it: the
  // attention's tile products run on one thread each (also when the whole call is one task),
  // and no product splits its sum over threads.
  struct Case {
    OpKind op;
    std::vector<Tensor> in;
    ir::AttrMap attrs;
  };
  const std::vector<Case> cases = {
      {OpKind::kAttention, inputsOf({{1, 6, 197, 64}, 197, 64, {}}, 5), scaleOf(0.125)},
      {OpKind::kAttention, inputsOf({{1, 40, 32}, 300, 16, {}}, 9), scaleOf(0.25)},  // One task.
      {OpKind::kLinear, {randomTensor({128, 768}, 1), randomTensor({256, 768}, 2)}, {}},
      {OpKind::kMatMul, {randomTensor({4, 4096}, 3), randomTensor({4096, 32}, 4)}, {}},
      {OpKind::kMatMul, {randomTensor({12, 128, 64}, 5), randomTensor({12, 64, 128}, 6)}, {}},
  };
  // Narrow and wide products over short and long sums: oneDNN's gemm-based matmul (AVX2) splits
  // the narrow ones' sums between threads, so the BLAS path runs them (matmul.cpp).
  std::vector<Case> more;
  for (int64_t m : {2, 8, 64, 200})
    for (int64_t n : {16, 64, 128, 256})
      for (int64_t k : {64, 1024, 4096})
        more.push_back({OpKind::kMatMul, {randomTensor({m, k}, 7), randomTensor({k, n}, 8)}, {}});
  // matmul, gemm and linear on kAuto, the BLAS path and oneDNN's matmul (attention ignores it).
  const auto gemm = static_cast<GemmBackend>(GENERATE(0, 1, 2));
  INFO("gemm backend " << static_cast<int>(gemm));
  const int budget = runtime::numThreads();
  runtime::setNumThreads(2);
  const int before = omp_get_max_threads();
  std::vector<Case> all = cases;
  all.insert(all.end(), more.begin(), more.end());
  for (const Case& c : all) {
    for (const bool cached : {false, true}) {
      INFO(ir::opName(c.op) << " " << ir::shapeToString(c.in[0].shape()) << " x "
                            << ir::shapeToString(c.in[1].shape())
                            << (cached ? ", weights cached" : ""));
      runtime::LibraryCache cache;
      LibraryOptions options;
      options.gemm = gemm;
      options.cache = cached ? &cache : nullptr;
      omp_set_num_threads(1);
      const Tensor one = runLib(c.op, c.in, c.attrs, {}, {}, options);
      omp_set_num_threads(2);
      const Tensor two = runLib(c.op, c.in, c.attrs, {}, {}, options);
      CHECK(one.toData().bitwiseEqual(two.toData()));
    }
  }
  omp_set_num_threads(before);
  runtime::setNumThreads(budget);
}
