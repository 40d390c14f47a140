// Randomized differential test: random DAGs of pointwise ops, reductions and views (with
// broadcasting, odd sizes and size-1 dims) compiled and compared with the reference kernels.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <random>

#include "compiler/compile.h"
#include "ir/printer.h"
#include "runtime/eager.h"

using namespace kiln;
using ir::OpKind;
using runtime::Tensor;

namespace {

class RandomGraph {
 public:
  explicit RandomGraph(uint32_t seed) : rng_(seed), g_("fuzz" + std::to_string(seed)) {}

  ir::Graph build() {
    const ir::Shape base = randomShape();
    const int numInputs = 1 + pick(3);
    for (int i = 0; i < numInputs; ++i) {
      ir::Shape s = i == 0 ? base : broadcastable(base);
      pool_.push_back(*g_.addInput("x" + std::to_string(i), {ir::DType::kF32, s}));
    }
    cond_ = *g_.addInput("c", {ir::DType::kBool, base});
    const int numOps = 2 + pick(12);
    for (int i = 0; i < numOps; ++i) addRandomOp();
    // Outputs: the last value and, sometimes, an intermediate one (multiple stores).
    std::vector<ir::Value*> outs{pool_.back()};
    if (pool_.size() > 3 && pick(2)) outs.push_back(pool_[pool_.size() / 2]);
    g_.setOutputs(outs);
    return std::move(g_);
  }

 private:
  int pick(int n) { return static_cast<int>(rng_() % static_cast<uint32_t>(n)); }

  ir::Shape randomShape() {
    static const int64_t dims[] = {1, 2, 3, 5, 7, 16, 17, 33};
    ir::Shape s;
    const int rank = 1 + pick(4);
    for (int i = 0; i < rank; ++i) s.push_back(dims[pick(8)]);
    return s;
  }

  // A shape that broadcasts to `s`: some dims set to 1, some leading dims dropped.
  ir::Shape broadcastable(const ir::Shape& s) {
    ir::Shape out(s.begin() + pick(static_cast<int>(s.size())), s.end());
    for (auto& d : out)
      if (pick(3) == 0) d = 1;
    return out;
  }

  ir::Value* any() { return pool_[pick(static_cast<int>(pool_.size()))]; }

  void add(OpKind op, std::vector<ir::Value*> ins, ir::AttrMap attrs = {}) {
    auto n = g_.addNode(op, std::move(ins), std::move(attrs));
    if (n) pool_.push_back((*n)->output());  // Inference errors just skip the op.
  }

  void addRandomOp() {
    ir::Value* x = any();
    const int rank = x->type().rank();
    // Scalars (a full reduction without keepdims) only take elementwise ops.
    switch (rank == 0 ? pick(10) : pick(16)) {
      case 0:
        add(OpKind::kRelu, {x});
        break;
      case 1:
        add(OpKind::kSigmoid, {x});
        break;
      case 2:
        add(OpKind::kTanh, {x});
        break;
      case 3:
        add(OpKind::kGelu, {x}, {{"approximate", std::string(pick(2) ? "tanh" : "none")}});
        break;
      case 4:
        add(OpKind::kAdd, {x, any()});
        break;
      case 5:
        add(OpKind::kMul, {x, any()});
        break;
      case 6:
        add(OpKind::kSub, {any(), x});
        break;
      case 7:
        add(OpKind::kMaximum, {x, any()});
        break;
      case 8:
        add(OpKind::kClip, {x}, {{"min", -0.5}, {"max", 0.75}});
        break;
      case 9:
        add(OpKind::kWhere, {cond_, x, any()});
        break;
      case 10:
        add(OpKind::kSoftmax, {x}, {{"axis", int64_t{pick(rank)}}});
        break;
      case 11:
        add(OpKind::kLogSoftmax, {x}, {{"axis", int64_t{-1}}});
        break;
      case 12: {
        const OpKind r[] = {OpKind::kReduceSum, OpKind::kReduceMean, OpKind::kReduceMax};
        const int64_t a = pick(rank);
        std::vector<int64_t> axes{a};
        if (a + 1 < rank && pick(2)) axes.push_back(a + 1);
        add(r[pick(3)], {x}, {{"axes", axes}, {"keepdims", int64_t{pick(2)}}});
        break;
      }
      case 13:
        add(OpKind::kLayerNorm, {x}, {{"axis", int64_t{-1 - pick(std::min(rank, 2))}}});
        break;
      case 14: {
        std::vector<int64_t> perm(rank);
        for (int i = 0; i < rank; ++i) perm[i] = i;
        std::shuffle(perm.begin(), perm.end(), rng_);
        add(OpKind::kTranspose, {x}, {{"perm", perm}});
        break;
      }
      case 15:
        add(OpKind::kUnsqueeze, {x}, {{"axes", std::vector<int64_t>{0}}});
        break;
    }
  }

  std::mt19937 rng_;
  ir::Graph g_;
  std::vector<ir::Value*> pool_;
  ir::Value* cond_ = nullptr;
};

double at(const Tensor& t, int64_t i) {
  return t.data<float>()[i];
}

}  // namespace

TEST_CASE("200 random pointwise/reduction DAGs: compiled == reference") {
  const auto cache =
      std::filesystem::temp_directory_path() / ("kiln_fuzz_cache_" + std::to_string(::getpid()));
  compiler::CompileOptions opts;
  opts.cacheDir = cache.string();
  opts.verifyEachPass = true;
  int kernels = 0;
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    ir::Graph g = RandomGraph(seed).build();
    INFO("seed " << seed << "\n" << ir::printGraph(g));
    std::mt19937 rng(seed * 7919);
    std::uniform_real_distribution<float> dist(-3.f, 3.f);
    std::vector<Tensor> ins;
    for (const ir::Value* v : g.inputs()) {
      Tensor t = *Tensor::empty(v->type().dtype, v->type().shape);
      for (int64_t i = 0; i < t.numElements(); ++i) {
        if (v->type().dtype == ir::DType::kBool)
          t.data<uint8_t>()[i] = rng() % 2;
        else
          t.data<float>()[i] = dist(rng);
      }
      ins.push_back(t);
    }
    runtime::EagerExecutor eager(g);
    auto want = eager.run(ins);
    REQUIRE(want.hasValue());
    auto cm = compiler::compile(g, opts);
    INFO(cm.status().message());
    REQUIRE(cm.hasValue());
    INFO((*cm)->report().fusionExplanation);
    kernels += (*cm)->report().generatedKernels;
    auto got = (*cm)->run(ins);
    REQUIRE(got.hasValue());
    for (size_t o = 0; o < got->size(); ++o) {
      const Tensor& a = (*got)[o];
      const Tensor& b = (*want)[o];
      REQUIRE(a.shape() == b.shape());
      double maxRef = 0, maxDiff = 0;
      bool special = true;
      for (int64_t i = 0; i < b.numElements(); ++i) {
        const double x = at(a, i), y = at(b, i);
        if (!std::isfinite(y)) {
          special = special && (std::isnan(y) ? std::isnan(x) : x == y);
          continue;
        }
        special = special && std::isfinite(x);  // std::max below would drop a NaN.
        maxRef = std::max(maxRef, std::fabs(y));
        maxDiff = std::max(maxDiff, std::fabs(x - y));
      }
      CHECK(special);
      CHECK(maxDiff <= 1e-4 * std::max(maxRef, 1e-6));
    }
  }
  CHECK(kernels > 200);  // The graphs really went through generated kernels.
  std::filesystem::remove_all(cache);
}
