// The eager interpreter: results, freeing intermediates after their last use, input checks.
#include <catch2/catch.hpp>
#include <cstring>

#include "ir/graph.h"
#include "runtime/eager.h"

using namespace kiln;
using ir::DType;
using ir::OpKind;
using runtime::Tensor;

namespace {
Tensor filled(std::vector<float> v, ir::Shape shape) {
  Tensor t = *Tensor::empty(DType::kF32, std::move(shape));
  std::memcpy(t.data<float>(), v.data(), v.size() * sizeof(float));
  return t;
}
}  // namespace

TEST_CASE("eager runs a small graph with a parameter and matches hand-computed values") {
  ir::Graph g("small");
  ir::Value* x = *g.addInput("x", {DType::kF32, {2, 2}});
  ir::TensorData bias(DType::kF32, {2});
  bias.as<float>()[0] = 10;
  bias.as<float>()[1] = 20;
  ir::Value* b = *g.addParameter("b", bias, true);
  ir::Value* r = (*g.addNode(OpKind::kRelu, {x}))->output();
  ir::Value* y = (*g.addNode(OpKind::kAdd, {r, b}))->output();
  g.setOutputs({y});

  runtime::EagerExecutor exec(g);
  std::vector<Tensor> in{filled({-1, 2, 3, -4}, {2, 2})};
  auto out = exec.run(in);
  REQUIRE(out.hasValue());
  REQUIRE(out->size() == 1);
  const float* o = (*out)[0].data<float>();
  CHECK(o[0] == 10);
  CHECK(o[1] == 22);
  CHECK(o[2] == 13);
  CHECK(o[3] == 20);
  CHECK(exec.lastStats().nodes.size() == 2);
  CHECK(exec.lastStats().ops.at("relu").count == 1);
}

TEST_CASE("eager frees each intermediate right after its last use") {
  // A chain of 6 unary ops on 1 MiB tensors: at most two buffers (the op's input and output)
  // are live at once, plus the graph output kept at the end.
  ir::Graph g("chain");
  ir::Value* v = *g.addInput("x", {DType::kF32, {256, 1024}});
  for (int i = 0; i < 6; ++i) v = (*g.addNode(i % 2 ? OpKind::kNeg : OpKind::kRelu, {v}))->output();
  g.setOutputs({v});
  runtime::CachingAllocator alloc;
  runtime::EagerExecutor exec(g, &alloc);
  Tensor x = *Tensor::zeros(DType::kF32, {256, 1024});
  const int64_t oneBuffer = 256 * 1024 * 4;
  {
    auto out = exec.run(std::vector<Tensor>{x});
    REQUIRE(out.hasValue());
    CHECK(exec.lastStats().peakActivationBytes == 2 * oneBuffer);
    CHECK(exec.lastStats().numAllocations == 6);
  }
  // Once the first result is gone, a second run reuses the cached blocks instead of asking
  // the system again.
  const auto sysBefore = alloc.stats().numSystemAllocations;
  auto out = exec.run(std::vector<Tensor>{x});
  REQUIRE(out.hasValue());
  CHECK(alloc.stats().numSystemAllocations == sysBefore);
}

TEST_CASE("eager rejects inputs of the wrong count, dtype or shape, naming the input") {
  ir::Graph g("g");
  ir::Value* x = *g.addInput("pixels", {DType::kF32, {1, 3}});
  g.setOutputs({(*g.addNode(OpKind::kRelu, {x}))->output()});
  runtime::EagerExecutor exec(g);

  auto none = exec.run({});
  REQUIRE_FALSE(none.hasValue());
  CHECK_THAT(none.status().message(), Catch::Contains("takes 1 inputs (pixels), got 0"));

  std::vector<Tensor> wrongShape{*Tensor::zeros(DType::kF32, {1, 4})};
  auto s = exec.run(wrongShape);
  REQUIRE_FALSE(s.hasValue());
  CHECK(s.status().isUserError());
  CHECK_THAT(s.status().message(), Catch::Contains("input 'pixels'") &&
                                       Catch::Contains("expected f32[1,3], got f32[1,4]"));

  std::vector<Tensor> wrongType{*Tensor::zeros(DType::kF64, {1, 3})};
  auto d = exec.run(wrongType);
  REQUIRE_FALSE(d.hasValue());
  CHECK_THAT(d.status().message(), Catch::Contains("expected f32[1,3], got f64[1,3]"));
}

TEST_CASE("eager refuses a parameter without data") {
  ir::Graph g("g");
  ir::Value* x = *g.addInput("x", {DType::kF32, {2}});
  ir::Value* w = *g.addParameter("w", ir::TensorType{DType::kF32, {2}}, true);
  g.setOutputs({(*g.addNode(OpKind::kMul, {x, w}))->output()});
  runtime::EagerExecutor exec(g);
  auto r = exec.run(std::vector<Tensor>{*Tensor::zeros(DType::kF32, {2})});
  REQUIRE_FALSE(r.hasValue());
  CHECK_THAT(r.status().message(), Catch::Contains("parameter 'w' has no data"));
}
