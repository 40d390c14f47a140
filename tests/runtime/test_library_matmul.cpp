// Library matmul (batched, broadcast batch dims, 1-D operands), gemm (transposes, alpha,
// beta, broadcast C) and linear against the reference kernels, on both backends (lib::sgemm
// and oneDNN's matmul) and kAuto, with every post-op kind and through the RefKernel ABI.
// Tolerance: 1e-5 of max |reference|.
#include <limits>

#include "runtime/test_library_util.h"

using namespace kiln;
using namespace kiln::libtest;

namespace {

const std::vector<GemmBackend> kBackends = {GemmBackend::kAuto, GemmBackend::kBlas,
                                            GemmBackend::kOneDnn};

const char* backendName(GemmBackend b) {
  switch (b) {
    case GemmBackend::kAuto:
      return "auto";
    case GemmBackend::kBlas:
      return "blas";
    case GemmBackend::kOneDnn:
      return "onednn";
  }
  return "?";
}

LibraryOptions withBackend(GemmBackend b) {
  LibraryOptions options;
  options.gemm = b;
  return options;
}

struct MatMulCase {
  Shape a, b;
};

const std::vector<MatMulCase>& matmulCases() {
  static const std::vector<MatMulCase> cases = {
      {{3, 4}, {4, 5}},
      {{17, 33}, {33, 9}},
      {{1, 64}, {64, 33}},
      {{2, 3, 4}, {4, 5}},         // B shared: the batch folds into rows.
      {{7, 1, 16}, {16, 12}},      // ... also with one row per batch (ViT's exported in_proj).
      {{2, 9, 16}, {2, 16, 10}},   // Batched.
      {{12, 16, 8}, {12, 8, 16}},  // Attention-like.
      {{2, 1, 3, 4}, {5, 4, 6}},   // Both sides broadcast: [2,5,3,6].
      {{1, 3, 4}, {2, 4, 5}},      // A broadcast.
      {{3, 1, 10, 7}, {1, 2, 7, 9}},
      {{4}, {4, 5}},  // 1-D A.
      {{3, 4}, {4}},  // 1-D B.
      {{4}, {4}},     // Dot product: a scalar.
      {{2, 3, 4}, {4}},
      {{4}, {2, 4, 5}},
      {{3, 0}, {0, 4}},  // K = 0: zeros.
  };
  return cases;
}

}  // namespace

TEST_CASE("library matmul matches the reference on both backends", "[library][matmul]") {
  uint32_t seed = 1;
  for (const MatMulCase& c : matmulCases()) {
    const std::vector<Tensor> in{randomTensor(c.a, seed), randomTensor(c.b, seed + 1)};
    seed += 2;
    const Tensor want = runRef(OpKind::kMatMul, in, {});
    for (GemmBackend b : kBackends) {
      INFO(ir::shapeToString(c.a) << " x " << ir::shapeToString(c.b) << ", " << backendName(b));
      checkRelClose(runLib(OpKind::kMatMul, in, {}, {}, {}, withBackend(b)), want, 1e-5);
    }
  }
}

TEST_CASE("library gemm matches the reference: transposes, alpha, beta, broadcast C",
          "[library][matmul]") {
  // m = 1: one row, a matrix-vector product (transposes included).
  const int64_t m = GENERATE(9, 1), k = 7, n = 11;
  INFO("m " << m);
  const std::vector<Shape> cShapes = {{}, {n}, {m, 1}, {1, n}, {m, n}, {1}};
  uint32_t seed = 100;
  for (int64_t transA : {0, 1}) {
    for (int64_t transB : {0, 1}) {
      const Tensor a = randomTensor(transA ? Shape{k, m} : Shape{m, k}, seed++);
      const Tensor b = randomTensor(transB ? Shape{n, k} : Shape{k, n}, seed++);
      for (double alpha : {1.0, 0.5}) {
        for (double beta : {1.0, 0.0, 2.5}) {
          const ir::AttrMap attrs = {
              {"transA", transA}, {"transB", transB}, {"alpha", alpha}, {"beta", beta}};
          std::vector<std::vector<Tensor>> inputs{{a, b}};
          for (const Shape& cs : cShapes) inputs.push_back({a, b, randomTensor(cs, seed++)});
          for (const auto& in : inputs) {
            const Tensor want = runRef(OpKind::kGemm, in, attrs);
            for (GemmBackend be : kBackends) {
              INFO("transA " << transA << " transB " << transB << " alpha " << alpha << " beta "
                             << beta << " C "
                             << (in.size() == 3 ? ir::shapeToString(in[2].shape()) : "none") << ", "
                             << backendName(be));
              checkRelClose(runLib(OpKind::kGemm, in, attrs, {}, {}, withBackend(be)), want, 1e-5);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("library gemm with beta = 0 still adds 0 * C, as the reference", "[library][matmul]") {
  // 0 * inf is NaN: the reference computes alpha*AB + beta*C literally.
  const Tensor a = randomTensor({2, 3}, 1), b = randomTensor({3, 4}, 2);
  Tensor c = randomTensor({4}, 3);
  c.data<float>()[1] = std::numeric_limits<float>::infinity();
  const ir::AttrMap attrs = {{"beta", 0.0}};
  const Tensor want = runRef(OpKind::kGemm, {a, b, c}, attrs);
  REQUIRE(std::isnan(want.data<float>()[1]));
  for (GemmBackend be : kBackends) {
    INFO(backendName(be));
    checkRelClose(runLib(OpKind::kGemm, {a, b, c}, attrs, {}, {}, withBackend(be)), want, 1e-5);
  }
}

TEST_CASE("library linear matches the reference on both backends", "[library][matmul]") {
  struct LinearCase {
    Shape x;
    int64_t out;
    bool bias;
  };
  const std::vector<LinearCase> cases = {
      {{5, 7}, 3, true},     {{2, 3, 7}, 4, true}, {{7}, 6, true},
      {{16, 64}, 32, false}, {{1, 50}, 20, true},  {{2, 2, 2, 9}, 5, true},
  };
  uint32_t seed = 300;
  for (const LinearCase& c : cases) {
    std::vector<Tensor> in{randomTensor(c.x, seed), randomTensor({c.out, c.x.back()}, seed + 1)};
    if (c.bias) in.push_back(randomTensor({c.out}, seed + 2));
    seed += 3;
    const Tensor want = runRef(OpKind::kLinear, in, {});
    for (GemmBackend be : kBackends) {
      INFO(ir::shapeToString(c.x) << " -> " << c.out << (c.bias ? " + bias" : "") << ", "
                                  << backendName(be));
      checkRelClose(runLib(OpKind::kLinear, in, {}, {}, {}, withBackend(be)), want, 1e-5);
    }
  }
}

TEST_CASE("library matmul, gemm and linear fuse every post-op kind", "[library][matmul][postops]") {
  struct Problem {
    OpKind op;
    std::vector<Tensor> in;
    ir::AttrMap attrs;
  };
  const std::vector<Problem> problems = {
      {OpKind::kMatMul, {randomTensor({16, 24}, 1), randomTensor({24, 40}, 2)}, {}},
      {OpKind::kMatMul, {randomTensor({3, 8, 16}, 3), randomTensor({3, 16, 12}, 4)}, {}},
      {OpKind::kMatMul, {randomTensor({2, 16}, 13), randomTensor({16, 12}, 14)}, {}},
      {OpKind::kLinear,
       {randomTensor({2, 10, 24}, 5), randomTensor({32, 24}, 6), randomTensor({32}, 7)},
       {}},
      {OpKind::kLinear, {randomTensor({3, 24}, 15), randomTensor({32, 24}, 16)}, {}},
      {OpKind::kGemm,
       {randomTensor({24, 16}, 8), randomTensor({20, 24}, 9), randomTensor({20}, 10)},
       {{"transA", int64_t{1}}, {"transB", int64_t{1}}, {"alpha", 0.75}}},
      {OpKind::kGemm,
       {randomTensor({16, 24}, 11), randomTensor({24, 20}, 12), randomTensor({16, 1}, 17)},
       {{"beta", 0.5}}},
  };
  for (const Problem& p : problems) {
    const Shape yShape = inferredShape(p.op, p.in, p.attrs);
    const std::vector<Tensor> extra{randomTensor(yShape, 20), randomTensor(yShape, 21)};
    for (const auto& [chainName, chain] : postOpChains()) {
      const Tensor want = referenceWithPostOps(p.op, p.in, p.attrs, chain, extra);
      for (GemmBackend be : kBackends) {
        INFO(ir::opName(p.op) << " " << ir::shapeToString(yShape) << " + " << chainName << ", "
                              << backendName(be));
        checkRelClose(runLib(p.op, p.in, p.attrs, chain, extra, withBackend(be)), want, 1e-5);
      }
    }
  }
}

TEST_CASE("library matmul-family RefKernel-ABI kernels equal the reference", "[library][matmul]") {
  const runtime::RefKernel mm = runtime::libraryKernel(OpKind::kMatMul, DType::kF32);
  REQUIRE(mm != nullptr);
  const ir::AttrMap none;
  uint32_t seed = 400;
  for (const MatMulCase& c : matmulCases()) {
    INFO(ir::shapeToString(c.a) << " x " << ir::shapeToString(c.b));
    const std::vector<Tensor> in{randomTensor(c.a, seed), randomTensor(c.b, seed + 1)};
    seed += 2;
    const Tensor want = runRef(OpKind::kMatMul, in, none);
    std::vector<Tensor> outs{emptyLike(want.shape())};
    REQUIRE(mm(ir::AttrView(ir::opInfo(OpKind::kMatMul), none), in, outs).isOk());
    checkRelClose(outs[0], want, 1e-5);
  }

  const ir::AttrMap gemmAttrs = {{"transB", int64_t{1}}, {"alpha", 2.0}, {"beta", 0.5}};
  const std::vector<Tensor> gin{randomTensor({10, 6}, 1), randomTensor({12, 6}, 2),
                                randomTensor({10, 12}, 3)};
  const Tensor gwant = runRef(OpKind::kGemm, gin, gemmAttrs);
  std::vector<Tensor> gout{emptyLike(gwant.shape())};
  REQUIRE(runtime::libraryKernel(OpKind::kGemm, DType::kF32)(
              ir::AttrView(ir::opInfo(OpKind::kGemm), gemmAttrs), gin, gout)
              .isOk());
  checkRelClose(gout[0], gwant, 1e-5);

  const std::vector<Tensor> lin{randomTensor({4, 3, 8}, 4), randomTensor({5, 8}, 5),
                                randomTensor({5}, 6)};
  const Tensor lwant = runRef(OpKind::kLinear, lin, none);
  std::vector<Tensor> lout{emptyLike(lwant.shape())};
  REQUIRE(runtime::libraryKernel(OpKind::kLinear, DType::kF32)(
              ir::AttrView(ir::opInfo(OpKind::kLinear), none), lin, lout)
              .isOk());
  checkRelClose(lout[0], lwant, 1e-5);
}

TEST_CASE("library linear with an in-place residual and NaN through kiln's epilogue",
          "[library][matmul][postops]") {
  const std::vector<Tensor> in{randomTensor({12, 40}, 1), randomTensor({30, 40}, 2),
                               randomTensor({30}, 3)};
  const Tensor residual = randomTensor({12, 30}, 4);
  const std::vector<PostOp> post{postOp(Kind::kAdd, 0, 0, 0), postOp(Kind::kRelu)};
  const Tensor want = referenceWithPostOps(OpKind::kLinear, in, {}, post, {residual});
  const ir::AttrMap none;
  for (GemmBackend be : kBackends) {
    INFO(backendName(be));
    Tensor out = emptyLike({12, 30});
    REQUIRE(out.copyFrom(residual).isOk());
    const std::vector<Tensor> extra{out};  // The output is its own residual.
    REQUIRE(runtime::runLibraryWithPostOps(OpKind::kLinear,
                                           ir::AttrView(ir::opInfo(OpKind::kLinear), none), in,
                                           post, extra, out, withBackend(be))
                .isOk());
    checkRelClose(out, want, 1e-5);
  }

  // The BLAS path's epilogue lets NaN through relu and clip, as the reference does.
  Tensor x = randomTensor({2, 40}, 5);
  x.data<float>()[3] = std::nanf("");
  for (const PostOp& p : {postOp(Kind::kRelu), postOp(Kind::kClip, -0.5, 0.5)}) {
    const Tensor got =
        runLib(OpKind::kLinear, {x, in[1]}, none, {p}, {}, withBackend(GemmBackend::kBlas));
    const Tensor ref = referenceWithPostOps(OpKind::kLinear, {x, in[1]}, none, {p}, {});
    REQUIRE(std::isnan(ref.data<float>()[0]));
    checkRelClose(got, ref, 1e-5);  // NaN must match NaN.
  }
}

TEST_CASE("a prepared matmul, gemm or linear call computes nothing", "[library][matmul]") {
  // LibraryOptions::prepare creates oneDNN's primitive and returns: the output keeps its bytes.
  struct Case {
    OpKind op;
    std::vector<Tensor> in;
    ir::AttrMap attrs;
  };
  const std::vector<Case> cases = {
      {OpKind::kMatMul, {randomTensor({17, 33}, 1), randomTensor({33, 9}, 2)}, {}},
      {OpKind::kMatMul, {randomTensor({3, 0}, 1), randomTensor({0, 4}, 2)}, {}},  // K = 0.
      {OpKind::kGemm, {randomTensor({5, 7}, 3), randomTensor({7, 4}, 4)}, {}},
      {OpKind::kLinear, {randomTensor({16, 64}, 5), randomTensor({32, 64}, 6)}, {}},
  };
  for (const Case& c : cases) {
    for (GemmBackend be : kBackends) {
      INFO(ir::opName(c.op) << " " << ir::shapeToString(c.in[0].shape()) << ", "
                            << backendName(be));
      Tensor out = emptyLike(inferredShape(c.op, c.in, c.attrs));
      for (int64_t i = 0; i < out.numElements(); ++i) out.data<float>()[i] = 12345.f;
      LibraryOptions options = withBackend(be);
      options.prepare = true;
      const ir::AttrView view(ir::opInfo(c.op), c.attrs);
      REQUIRE(runtime::runLibraryWithPostOps(c.op, view, c.in, {}, {}, out, options).isOk());
      for (int64_t i = 0; i < out.numElements(); ++i) REQUIRE(out.data<float>()[i] == 12345.f);
      // The call itself after its preparation.
      checkRelClose(runLib(c.op, c.in, c.attrs, {}, {}, withBackend(be)),
                    runRef(c.op, c.in, c.attrs), 1e-5);
    }
  }
}

TEST_CASE("library matmul, gemm and linear keep prepacked weights in the caller's cache",
          "[library][matmul]") {
  // With a LibraryCache (B is a parameter), oneDNN's matmul takes B in its preferred blocked
  // format (AVX-512), or as plain rows padded to a longer stride (AVX2's gemm-based matmul, which
  // runs products of at least 128 columns), reordered once (when prepared) and reused by every
  // call after it.
  struct Case {
    OpKind op;
    std::vector<Tensor> in;
    ir::AttrMap attrs;
    bool wide = false;  // At least 128 columns.
  };
  const ir::AttrMap transB = {
      {"transA", int64_t{0}}, {"transB", int64_t{1}}, {"alpha", 1.0}, {"beta", 1.0}};
  const std::vector<Case> cases = {
      {OpKind::kMatMul, {randomTensor({2, 48, 96}, 1), randomTensor({96, 80}, 2)}, {}},
      {OpKind::kGemm, {randomTensor({40, 96}, 3), randomTensor({64, 96}, 4)}, transB},
      {OpKind::kLinear, {randomTensor({64, 128}, 5), randomTensor({96, 128}, 6)}, {}},
      // Rows 1 KiB apart, which AVX2's gemm-based matmul gets padded.
      {OpKind::kMatMul, {randomTensor({2, 24, 64}, 7), randomTensor({64, 256}, 8)}, {}, true},
      {OpKind::kLinear, {randomTensor({40, 64}, 9), randomTensor({256, 64}, 10)}, {}, true},
      {OpKind::kGemm, {randomTensor({40, 64}, 11), randomTensor({144, 64}, 12)}, transB, true},
  };
  // oneDNN 2.6's brgemm matmul (AVX-512) packs B; its AVX2 gemm-based one refuses narrower
  // products than 128 columns, which then run on lib::sgemm without a cache entry.
  const bool packs = __builtin_cpu_supports("avx512f");
  for (const Case& c : cases) {
    INFO(ir::opName(c.op) << " " << ir::shapeToString(c.in[0].shape()));
    const Tensor want = runRef(c.op, c.in, c.attrs);
    runtime::LibraryCache cache;
    LibraryOptions options = withBackend(GemmBackend::kOneDnn);
    options.cache = &cache;
    options.prepare = true;
    Tensor out = emptyLike(want.shape());
    const ir::AttrView view(ir::opInfo(c.op), c.attrs);
    REQUIRE(runtime::runLibraryWithPostOps(c.op, view, c.in, {}, {}, out, options).isOk());
    const size_t entries = cache.numEntries();
    if (packs || c.wide) CHECK(entries == 1);
    options.prepare = false;
    const size_t hits = cache.hits();
    checkRelClose(runLib(c.op, c.in, c.attrs, {}, {}, options), want, 1e-5);
    CHECK(cache.numEntries() == entries);
    if (entries > 0) CHECK(cache.hits() > hits);
    // Other weights at another address get their own entry, never the packed ones.
    std::vector<Tensor> other = c.in;
    other[1] = randomTensor(c.in[1].shape(), 77);
    checkRelClose(runLib(c.op, other, c.attrs, {}, {}, options), runRef(c.op, other, c.attrs),
                  1e-5);
    CHECK(cache.numEntries() == 2 * entries);
  }
}
