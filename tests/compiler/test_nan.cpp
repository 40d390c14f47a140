// NaN and infinity: compiled execution must produce NaN, +inf and -inf exactly where eager
// execution (the reference kernels' semantics, as PyTorch's) produces them. The fused patterns
// are enumerated from the fusion code itself (every op isPostOpCandidate accepts after every
// head acceptsLibraryEpilogue accepts, and every pointwise op of the op table as a generated
// kernel), then every zoo model runs on inputs holding NaN and infinities.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>

#include "compiler/compile.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "models/zoo.h"
#include "passes/fusion.h"
#include "runtime/eager.h"
#include "runtime/gpu/gpu_backend.h"

using namespace kiln;
using runtime::Tensor;

namespace {

std::string describeAttrs(const ir::AttrMap& attrs) {
  std::string s;
  for (const auto& [k, v] : attrs) s += (s.empty() ? "" : ",") + k + "=" + ir::printAttrValue(v);
  return s;
}

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

struct CacheDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("kiln_test_nan_" + std::to_string(::getpid()));
  ~CacheDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Random values in [-2, 2] with NaN, +inf and -inf at a few positions (`specials` of each).
Tensor withSpecials(const ir::TensorType& t, uint32_t seed, int specials) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2, 2);
  Tensor x = *Tensor::empty(t.dtype, t.shape);
  float* p = x.data<float>();
  const int64_t n = x.numElements();
  for (int64_t i = 0; i < n; ++i) p[i] = dist(rng);
  for (int s = 0; s < specials; ++s)
    for (float v : {kNaN, kInf, -kInf}) p[rng() % static_cast<uint64_t>(n)] = v;
  return x;
}

// Counts of what the comparison saw, to show that specials reached the outputs.
struct Seen {
  int64_t nan = 0, inf = 0, finite = 0;
};

// NaN where eager has NaN and nowhere else, the same infinities, finite values within `tol`
// of the largest finite magnitude.
void checkSameSpecials(const Tensor& compiled, const Tensor& eager, double tol, Seen* seen) {
  REQUIRE(compiled.shape() == eager.shape());
  REQUIRE(compiled.dtype() == ir::DType::kF32);
  const float* a = compiled.data<float>();
  const float* b = eager.data<float>();
  const int64_t n = eager.numElements();
  double scale = 1e-30;
  for (int64_t i = 0; i < n; ++i)
    if (std::isfinite(b[i])) scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  int64_t bad = 0, firstBad = -1;
  for (int64_t i = 0; i < n; ++i) {
    bool ok;
    if (std::isnan(b[i])) {
      ok = std::isnan(a[i]);
      if (seen) ++seen->nan;
    } else if (std::isinf(b[i])) {
      ok = a[i] == b[i];
      if (seen) ++seen->inf;
    } else {
      ok = std::isfinite(a[i]) && std::fabs(static_cast<double>(a[i]) - b[i]) <= tol * scale;
      if (seen) ++seen->finite;
    }
    if (!ok && bad++ == 0) firstBad = i;
  }
  INFO("first difference at " << firstBad << ": compiled " << (firstBad >= 0 ? a[firstBad] : 0.f)
                              << ", eager " << (firstBad >= 0 ? b[firstBad] : 0.f));
  CHECK(bad == 0);
}

struct Outputs {
  std::vector<Tensor> compiled, eager;
  std::unique_ptr<compiler::CompiledModel> model;
};

// Compiled on `device` (cpu, or emu: the CUDA backend's kernels) against eager on the CPU.
Outputs runBoth(const ir::Graph& g, const std::vector<Tensor>& inputs, const CacheDir& cache,
                const std::string& device = "cpu") {
  compiler::CompileOptions o;
  o.cacheDir = cache.path.string();
  auto backend = runtime::gpu::backendForDevice(device);
  REQUIRE(backend.hasValue());
  o.backend = *backend;
  auto cm = compiler::compile(g, o);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  auto got = (*cm)->run(inputs);
  INFO(got.status().message());
  REQUIRE(got.hasValue());
  runtime::EagerExecutor eager(g);
  auto want = eager.run(inputs);
  INFO(want.status().message());
  REQUIRE(want.hasValue());
  return {std::move(*got), std::move(*want), std::move(*cm)};
}

// The number of post-ops of each library step that has any.
std::vector<size_t> postOpSteps(const compiler::CompiledModel& m) {
  std::vector<size_t> counts;
  for (const auto& s : m.plan().steps)
    if (!s.postOps.empty()) counts.push_back(s.postOps.size());
  return counts;
}

ir::TensorData randomData(const ir::Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-0.5f, 0.5f);
  ir::TensorData d(ir::DType::kF32, shape);
  for (int64_t i = 0; i < d.numElements(); ++i) d.as<float>()[i] = dist(rng);
  return d;
}

// A graph `head(x, params...)` for one library op that takes epilogues, with f32 operands.
struct Head {
  ir::Graph graph{"nan_pattern"};
  ir::Value* out = nullptr;
  std::vector<ir::TensorType> inputTypes;
};

std::optional<Head> makeHead(ir::OpKind op) {
  Head h;
  ir::Graph& g = h.graph;
  auto input = [&](ir::Shape shape) {
    ir::TensorType t{ir::DType::kF32, std::move(shape)};
    h.inputTypes.push_back(t);
    return *g.addInput("x" + std::to_string(h.inputTypes.size()), t);
  };
  auto param = [&](const std::string& name, ir::Shape shape, uint32_t seed) {
    return *g.addParameter(name, randomData(shape, seed), false);
  };
  Expected<ir::Node*> node = internalError("unset");
  switch (op) {
    case ir::OpKind::kConv2d:
      node = g.addNode(op, {input({2, 3, 6, 6}), param("w", {4, 3, 3, 3}, 1), param("b", {4}, 2)},
                       {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
      break;
    case ir::OpKind::kLinear:
      node = g.addNode(op, {input({5, 16}), param("w", {7, 16}, 1), param("b", {7}, 2)});
      break;
    case ir::OpKind::kGemm:
      node = g.addNode(op, {input({5, 16}), param("w", {16, 7}, 1), param("c", {7}, 2)});
      break;
    case ir::OpKind::kMatMul:
      node = g.addNode(op, {input({5, 16}), param("w", {16, 7}, 1)});
      break;
    default:
      return std::nullopt;
  }
  INFO(node.status().message());
  REQUIRE(node.hasValue());
  h.out = (*node)->output();
  return h;
}

// Attribute variants worth running for an epilogue op (defaults plus bounds that bite).
std::vector<ir::AttrMap> attrVariants(ir::OpKind op) {
  if (op == ir::OpKind::kClip) return {{}, {{"min", 0.0}, {"max", 6.0}}, {{"min", -1.0}}};
  if (op == ir::OpKind::kGelu) return {{}, {{"approximate", std::string("tanh")}}};
  if (op == ir::OpKind::kLeakyRelu) return {{}, {{"alpha", 0.2}}};
  return {{}};
}

}  // namespace

TEST_CASE("nan: every library epilogue the fusion code allows keeps NaN and infinities") {
  CacheDir cache;
  int patterns = 0;
  Seen seen;
  for (int h = 0; h < ir::kNumOps; ++h) {
    const auto headOp = static_cast<ir::OpKind>(h);
    if (!passes::acceptsLibraryEpilogue(headOp)) continue;
    for (int e = 0; e < ir::kNumOps; ++e) {
      const auto epOp = static_cast<ir::OpKind>(e);
      const ir::OpInfo& info = ir::opInfo(epOp);
      for (const ir::AttrMap& attrs : attrVariants(epOp)) {
        auto head = makeHead(headOp);
        REQUIRE(head.has_value());
        ir::Graph& g = head->graph;
        // Unary epilogues take the head's output; binary ones a second input of its shape.
        std::vector<ir::Value*> ins{head->out};
        if (info.minInputs == 2) {
          head->inputTypes.push_back(head->out->type());
          ins.push_back(*g.addInput("other", head->out->type()));
        } else if (info.minInputs != 1) {
          continue;
        }
        auto node = g.addNode(epOp, ins, attrs);
        if (!node || !passes::isPostOpCandidate(**node)) continue;
        g.setOutputs({(*node)->output()});
        {
          INFO(ir::opName(headOp) << " -> " << info.name << " " << describeAttrs(attrs));
          ++patterns;
          std::vector<Tensor> inputs;
          for (size_t i = 0; i < head->inputTypes.size(); ++i)
            inputs.push_back(withSpecials(head->inputTypes[i], 10 + static_cast<uint32_t>(i), 2));
          Outputs out = runBoth(g, inputs, cache);
          // The pattern was fused: one library step carries the epilogue.
          CHECK(postOpSteps(*out.model) == std::vector<size_t>{1});
          checkSameSpecials(out.compiled[0], out.eager[0], 1e-5, &seen);
        }
      }
    }
  }
  // conv2d, linear, gemm and matmul, each with relu, leaky_relu (2), clip (3), sigmoid, tanh,
  // gelu (2) and add: 4 x 11.
  CHECK(patterns >= 44);
  // The inputs put NaN and infinities into the library results themselves.
  CHECK(seen.nan > 0);
  CHECK(seen.inf > 0);
}

TEST_CASE("nan: chains of epilogues (residual add then activation, and the reverse)") {
  CacheDir cache;
  for (const char* text : {
           R"(graph add_relu(%x : f32[1,4,6,6], %r : f32[1,8,6,6]) {
  param %w : f32[8,4,3,3]
  %c : f32[1,8,6,6] = conv2d(%x, %w) {pads=[1,1,1,1]}
  %a : f32[1,8,6,6] = add(%c, %r)
  %y : f32[1,8,6,6] = relu(%a)
  return %y
})",
           R"(graph relu_add(%x : f32[1,4,6,6], %r : f32[1,8,6,6]) {
  param %w : f32[8,4,3,3]
  %c : f32[1,8,6,6] = conv2d(%x, %w) {pads=[1,1,1,1]}
  %a : f32[1,8,6,6] = relu(%c)
  %y : f32[1,8,6,6] = add(%a, %r)
  return %y
})",
           R"(graph mm_add_gelu(%x : f32[6,32], %r : f32[6,16]) {
  param %w : f32[32,16]
  %c : f32[6,16] = matmul(%x, %w)
  %a : f32[6,16] = add(%c, %r)
  %y : f32[6,16] = gelu(%a)
  return %y
})"}) {
    auto g = ir::parseGraph(text);
    INFO(g.status().message());
    REQUIRE(g.hasValue());
    DYNAMIC_SECTION(g->name()) {
      for (ir::Value* p : g->parameters()) p->setData(randomData(p->type().shape, 3));
      std::vector<Tensor> inputs;
      for (const ir::Value* in : g->inputs()) inputs.push_back(withSpecials(in->type(), 20, 2));
      Outputs out = runBoth(*g, inputs, cache);
      CHECK(postOpSteps(*out.model) == std::vector<size_t>{2});
      checkSameSpecials(out.compiled[0], out.eager[0], 1e-5, nullptr);
    }
  }
}

TEST_CASE("nan: every pointwise op as a generated kernel keeps NaN and infinities") {
  // On the CPU, and as CUDA C on the emu device (the GPU's kernels obey the same rule).
  const std::string device = GENERATE(as<std::string>{}, "cpu", "emu");
  INFO(device);
  CacheDir cache;
  // Every pair of these values is an input (binary ops see each special against each other).
  const std::vector<float> values = {kNaN,  kInf, -kInf, 0.f,   -0.f,   1.f,    -1.f, 0.5f,
                                     -0.5f, 3.f,  -3.f,  1e30f, -1e30f, 1e-30f, 88.f, -88.f};
  const int64_t k = static_cast<int64_t>(values.size());
  int ops = 0, kernels = 0;
  for (int e = 0; e < ir::kNumOps; ++e) {
    const auto op = static_cast<ir::OpKind>(e);
    const ir::OpInfo& info = ir::opInfo(op);
    if (!info.has(ir::kPointwise) || info.numOutputs != 1) continue;
    for (int arity : {1, 2}) {
      if (arity < info.minInputs || (info.maxInputs >= 0 && arity > info.maxInputs)) continue;
      ir::Graph g("pointwise");
      const ir::TensorType t{ir::DType::kF32, {k, k}};
      std::vector<ir::Value*> ins;
      for (int i = 0; i < arity; ++i) ins.push_back(*g.addInput("x" + std::to_string(i), t));
      auto node = g.addNode(op, ins);
      if (!node || (*node)->output()->type().dtype != ir::DType::kF32) continue;
      if (!passes::notFusableReason(**node).empty()) continue;
      g.setOutputs({(*node)->output()});
      {
        INFO(info.name << "/" << arity);
        ++ops;
        std::vector<Tensor> inputs;
        for (int i = 0; i < arity; ++i) {
          Tensor x = *Tensor::empty(t.dtype, t.shape);
          for (int64_t r = 0; r < k; ++r)
            for (int64_t c = 0; c < k; ++c)
              x.data<float>()[r * k + c] = values[static_cast<size_t>(i == 0 ? r : c)];
          inputs.push_back(x);
        }
        Outputs out = runBoth(g, inputs, cache, device);
        // Ops that compile to no work (dropout in inference) are still compared.
        CHECK(out.model->report().generatedKernels <= 1);
        kernels += out.model->report().generatedKernels;
        checkSameSpecials(out.compiled[0], out.eager[0], 1e-5, nullptr);
      }
    }
  }
  CHECK(kernels >= 25);
}

TEST_CASE("nan: every zoo model, compiled and eager, puts NaN in the same places") {
  const std::string device = GENERATE(as<std::string>{}, "cpu", "emu");
  INFO(device);
  CacheDir cache;
  for (const std::string name : {"mlp", "mnist_cnn", "resnet18", "resnet50", "bert_layer"}) {
    DYNAMIC_SECTION(name) {
      auto g = models::buildModel(name, {name == "resnet50" ? 1 : 2, 11});
      REQUIRE(g.hasValue());
      for (int specials : {1, 0}) {
        // One NaN, +inf and -inf per input; then a clean input with one NaN row.
        std::vector<Tensor> inputs;
        for (const ir::Value* in : g->inputs()) {
          Tensor x = withSpecials(in->type(), 30, specials);
          if (specials == 0) x.data<float>()[0] = kNaN;
          inputs.push_back(x);
        }
        Outputs out = runBoth(*g, inputs, cache, device);
        Seen seen;
        for (size_t i = 0; i < out.eager.size(); ++i)
          checkSameSpecials(out.compiled[i], out.eager[i], 1e-4, &seen);
        CHECK(seen.nan > 0);  // NaN reached the output: the check compared something.
      }
    }
  }
}

TEST_CASE("nan: relu and clip fused into oneDNN's calls, and a NaN runs the plan again exactly") {
  // A compiled run fuses relu and clip into the library calls (no pass of their own), where
  // oneDNN turns NaN into a number; the invalid flag those max/min instructions raise on NaN
  // makes the run go again with kiln's exact epilogue (PlanExecutor::run). Without the rerun the
  // NaN below would come out 0 (conv -> relu) or 6 (conv -> clip).
  if (!runtime::fusedActivationsFlagNaN()) {
    WARN("this CPU's oneDNN does not flag NaN at fused activations: nothing fused to check");
    return;
  }
  CacheDir cache;
  for (const char* text : {
           R"(graph conv_add_relu(%x : f32[1,8,10,10], %r : f32[1,16,10,10]) {
  param %w : f32[16,8,3,3]
  %c : f32[1,16,10,10] = conv2d(%x, %w) {pads=[1,1,1,1]}
  %a : f32[1,16,10,10] = add(%c, %r)
  %y : f32[1,16,10,10] = relu(%a)
  return %y
})",
           R"(graph conv_clip(%x : f32[1,8,10,10], %r : f32[1,16,10,10]) {
  param %w : f32[16,8,3,3]
  %c : f32[1,16,10,10] = conv2d(%x, %w) {pads=[1,1,1,1]}
  %y : f32[1,16,10,10] = clip(%c) {min=0.0, max=6.0}
  %z : f32[1,16,10,10] = add(%y, %r)
  return %z
})"}) {
    auto g = ir::parseGraph(text);
    INFO(g.status().message());
    REQUIRE(g.hasValue());
    DYNAMIC_SECTION(g->name()) {
      for (ir::Value* p : g->parameters()) p->setData(randomData(p->type().shape, 5));
      std::vector<Tensor> finite;
      for (const ir::Value* in : g->inputs()) finite.push_back(withSpecials(in->type(), 30, 0));
      Outputs out = runBoth(*g, finite, cache);
      checkSameSpecials(out.compiled[0], out.eager[0], 1e-5, nullptr);
      compiler::CompiledModel& m = *out.model;
      CHECK(m.lastStats().fusedActivations);
      CHECK_FALSE(m.lastStats().exactRerun);
      CHECK(m.exactReruns() == 0);
      // One NaN in the convolution's input: it reaches the fused activation. (A copy: tensors
      // share their storage.)
      std::vector<Tensor> nan = finite;
      nan[0] = withSpecials(g->inputs()[0]->type(), 30, 0);
      nan[0].data<float>()[17] = kNaN;
      auto got = m.run(nan);
      REQUIRE(got.hasValue());
      runtime::EagerExecutor eager(*g);
      auto want = eager.run(nan);
      REQUIRE(want.hasValue());
      checkSameSpecials((*got)[0], (*want)[0], 1e-5, nullptr);
      int64_t nans = 0;
      for (int64_t i = 0; i < (*want)[0].numElements(); ++i)
        nans += std::isnan((*want)[0].data<float>()[i]);
      CHECK(nans > 0);
      CHECK(m.lastStats().exactRerun);
      CHECK(m.exactReruns() == 1);
      // And the next finite run fuses again.
      REQUIRE(m.run(finite).hasValue());
      CHECK_FALSE(m.lastStats().exactRerun);
      CHECK(m.exactReruns() == 1);
      // Four runs in a row that ran again: the plan stops fusing (inputs that always raise the
      // flag would otherwise cost two runs each), and its results stay right.
      for (int i = 0; i < 4; ++i) {
        REQUIRE(m.run(nan).hasValue());
        CHECK(m.lastStats().exactRerun);
      }
      auto after = m.run(nan);
      REQUIRE(after.hasValue());
      CHECK_FALSE(m.lastStats().fusedActivations);
      CHECK_FALSE(m.lastStats().exactRerun);
      CHECK(m.exactReruns() == 5);
      checkSameSpecials((*after)[0], (*want)[0], 1e-5, nullptr);
    }
  }
}
