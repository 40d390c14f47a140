// Reverse-mode autodiff (passes/autodiff.h): every op with the kDifferentiable trait has a
// gradient builder and none without, and every builder's gradient matches central finite
// differences in f64 (relative error <= 1e-6) on random inputs, with broadcasting.
#include <catch2/catch.hpp>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ir/op_table.h"
#include "ir/parser.h"
#include "passes/autodiff.h"
#include "passes/training_mode.h"
#include "runtime/eager.h"

using namespace kiln;
using runtime::Tensor;

namespace {

// max(a, b) where a NaN b wins and stays (std::max(a, NaN) is a: a NaN difference would pass).
double maxKeepingNaN(double a, double b) {
  return std::isnan(b) || a < b ? b : a;
}

enum class Range { kAny, kPositive, kClasses, kIndices };

struct Case {
  std::string name;
  std::string ir;             // The forward graph; its first output is y.
  std::vector<Range> ranges;  // Per input.
  double eps = 1e-6;
  double tolerance = 1e-6;
  std::function<void(ir::Graph&)> prepare = {};  // Runs on the parsed graph before autodiff.
};

Tensor randomInput(const ir::TensorType& t, Range r, std::mt19937& rng) {
  Tensor x = *Tensor::zeros(t.dtype, t.shape);
  std::uniform_real_distribution<double> mag(0.1, 1.0), pos(0.5, 2.0);
  std::bernoulli_distribution sign(0.5);
  for (int64_t i = 0; i < x.numElements(); ++i) {
    switch (t.dtype) {
      case ir::DType::kF64:
        x.data<double>()[i] = r == Range::kPositive ? pos(rng) : (sign(rng) ? 1 : -1) * mag(rng);
        break;
      case ir::DType::kI64:
        if (r == Range::kIndices)  // Gather indices -1..2, repeated.
          x.data<int64_t>()[i] = static_cast<int64_t>(rng() % 4) - 1;
        else  // Class indices 0..4, and one ignored target.
          x.data<int64_t>()[i] = i == 1 ? -100 : static_cast<int64_t>(rng() % 5);
        break;
      case ir::DType::kBool:
        x.data<uint8_t>()[i] = sign(rng);
        break;
      default:
        FAIL("unexpected input dtype");
    }
  }
  return x;
}

double scalarOf(const Tensor& t) {
  return t.data<double>()[0];
}

void checkGradients(const Case& c) {
  INFO(c.name << "\n" << c.ir);
  auto parsed = ir::parseGraph(c.ir);
  INFO(parsed.status().message());
  REQUIRE(parsed.hasValue());
  ir::Graph& g = *parsed;
  if (c.prepare) c.prepare(g);
  std::mt19937 rng(42);

  // loss = sum(y * w) with random w, so that every element of dy differs.
  ir::Value* y = g.outputs()[0];
  ir::TensorData w(y->type().dtype, y->type().shape);
  std::uniform_real_distribution<double> wd(-1, 1);
  for (int64_t i = 0; i < w.numElements(); ++i) w.as<double>()[i] = wd(rng);
  ir::Value* wv = *g.addParameter("loss_weight", w, false);
  ir::Value* m = (*g.addNode(ir::OpKind::kMul, {y, wv}))->output(0);
  ir::Value* loss = (*g.addNode(ir::OpKind::kReduceSum, {m},
                                {{"axes", std::vector<int64_t>{}}, {"keepdims", int64_t{0}}}))
                        ->output(0);
  std::vector<ir::Value*> wrt;
  for (ir::Value* in : g.inputs())
    if (ir::isFloat(in->type().dtype)) wrt.push_back(in);
  auto grads = passes::appendBackward(g, loss, wrt);
  INFO(grads.status().message());
  REQUIRE(grads.hasValue());
  std::vector<ir::Value*> outs{loss};
  outs.insert(outs.end(), grads->begin(), grads->end());
  g.setOutputs(outs);

  std::vector<Tensor> inputs;
  for (size_t i = 0; i < g.inputs().size(); ++i)
    inputs.push_back(randomInput(g.inputs()[i]->type(), c.ranges.at(i), rng));
  runtime::EagerExecutor exec(g);
  auto base = exec.run(inputs);
  INFO(base.status().message());
  REQUIRE(base.hasValue());

  size_t gi = 0;
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    if (!ir::isFloat(g.inputs()[i]->type().dtype)) continue;
    const Tensor& analytic = (*base)[1 + gi++];
    double maxDiff = 0, maxRef = 0;
    for (int64_t k = 0; k < inputs[i].numElements(); ++k) {
      std::vector<Tensor> plus = inputs, minus = inputs;
      plus[i] = Tensor::fromData(inputs[i].toData().clone());
      minus[i] = Tensor::fromData(inputs[i].toData().clone());
      plus[i].data<double>()[k] += c.eps;
      minus[i].data<double>()[k] -= c.eps;
      auto lp = exec.run(plus);
      auto lm = exec.run(minus);
      REQUIRE(lp.hasValue());
      REQUIRE(lm.hasValue());
      const double numeric = (scalarOf((*lp)[0]) - scalarOf((*lm)[0])) / (2 * c.eps);
      maxDiff = maxKeepingNaN(maxDiff, std::fabs(analytic.data<double>()[k] - numeric));
      maxRef = std::max(maxRef, std::fabs(numeric));
    }
    INFO("input %" << g.inputs()[i]->name() << ": max |analytic - numeric| " << maxDiff
                   << ", max |numeric| " << maxRef);
    CHECK(maxDiff / std::max(maxRef, 1e-3) <= c.tolerance);
  }
}

std::string graph(const std::string& inputs, const std::string& body) {
  return "graph t(" + inputs + ") {\n" + body + "\n  return %y\n}";
}

}  // namespace

TEST_CASE("autodiff: the kDifferentiable trait is exactly the ops with a gradient builder") {
  for (int i = 0; i < ir::kNumOps; ++i) {
    const auto op = static_cast<ir::OpKind>(i);
    INFO(ir::opName(op));
    CHECK(ir::hasTrait(op, ir::kDifferentiable) == passes::hasGradientBuilder(op));
  }
}

TEST_CASE("autodiff: gradient check of every unary op, f64 central differences") {
  const std::string x = "%x : f64[2,3,4]";
  for (const char* op : {"neg", "relu", "sigmoid", "tanh", "silu", "mish", "exp", "dropout"})
    checkGradients({op, graph(x, std::string("  %y = ") + op + "(%x)"), {Range::kAny}});
  for (const char* op : {"log", "sqrt", "rsqrt"})
    checkGradients({op, graph(x, std::string("  %y = ") + op + "(%x)"), {Range::kPositive}});
  // Through f32 and back: rounding to f32 limits the check to a wide step and 1e-4.
  checkGradients({"cast",
                  graph(x, "  %h = cast(%x) {to = \"f32\"}\n  %y = cast(%h) {to = \"f64\"}"),
                  {Range::kAny},
                  1e-2,
                  1e-4});
  checkGradients({"relayout",
                  // To channels-last and back: the loss's mul then pairs elements in NCHW order, as
                  // eager requires of a binary op's operands.
                  graph("%x : f64[1,2,3,3]@nchw",
                        "  %h = relayout(%x) {from = \"nchw\", to = \"nhwc\"}\n"
                        "  %y = relayout(%h) {from = \"nhwc\", to = \"nchw\"}"),
                  {Range::kAny}});
}

TEST_CASE("autodiff: gradient check of the pointwise ops with a backward op of their own") {
  const std::string x = "%x : f64[2,3,4]";
  checkGradients({"abs", graph(x, "  %y = abs(%x)"), {Range::kAny}});
  checkGradients({"leaky_relu", graph(x, "  %y = leaky_relu(%x) {alpha = 0.2}"), {Range::kAny}});
  checkGradients({"clip", graph(x, "  %y = clip(%x) {min = -0.55, max = 0.45}"), {Range::kAny}});
  checkGradients({"gelu", graph(x, "  %y = gelu(%x)"), {Range::kAny}});
  checkGradients(
      {"gelu tanh", graph(x, "  %y = gelu(%x) {approximate = \"tanh\"}"), {Range::kAny}});
  checkGradients({"pow",
                  graph("%a : f64[2,3,4], %b : f64[3,1]", "  %y = pow(%a, %b)"),
                  {Range::kPositive, Range::kAny}});
  // dropout_train is linear in x for a fixed step: the check covers its mask and scale.
  checkGradients({"dropout_train",
                  graph("%x : f64[4,8], %step : i64[]",
                        "  %y = dropout_train(%x, %step) {ratio = 0.3, seed = 7}"),
                  {Range::kAny, Range::kAny}});
}

TEST_CASE("autodiff: gradient check of binary ops with broadcasting") {
  for (const char* op : {"add", "sub", "mul"}) {
    checkGradients(
        {op,
         graph("%a : f64[2,3,4], %b : f64[3,1]", std::string("  %y = ") + op + "(%a, %b)"),
         {Range::kAny, Range::kAny}});
    checkGradients(
        {op,
         graph("%a : f64[1,4], %b : f64[2,3,1]", std::string("  %y = ") + op + "(%a, %b)"),
         {Range::kAny, Range::kAny}});
  }
  checkGradients({"div",
                  graph("%a : f64[2,3,4], %b : f64[4]", "  %y = div(%a, %b)"),
                  {Range::kAny, Range::kPositive}});
  checkGradients(
      {"mul (same input twice)", graph("%a : f64[3,4]", "  %y = mul(%a, %a)"), {Range::kAny}});
  for (const char* op : {"maximum", "minimum"})
    checkGradients(
        {op,
         graph("%a : f64[2,3,4], %b : f64[3,1]", std::string("  %y = ") + op + "(%a, %b)"),
         {Range::kAny, Range::kAny}});
  checkGradients(
      {"where",
       graph("%c : bool[2,1,4], %a : f64[2,3,4], %b : f64[4]", "  %y = where(%c, %a, %b)"),
       {Range::kAny, Range::kAny, Range::kAny}});
}

TEST_CASE("autodiff: gradient check of matmul and linear") {
  checkGradients({"matmul",
                  graph("%a : f64[2,3,4], %b : f64[4,5]", "  %y = matmul(%a, %b)"),
                  {Range::kAny, Range::kAny}});
  checkGradients({"matmul batch broadcast",
                  graph("%a : f64[3,4], %b : f64[2,4,5]", "  %y = matmul(%a, %b)"),
                  {Range::kAny, Range::kAny}});
  checkGradients({"linear",
                  graph("%x : f64[2,3,4], %w : f64[5,4], %b : f64[5]", "  %y = linear(%x, %w, %b)"),
                  {Range::kAny, Range::kAny, Range::kAny}});
  checkGradients({"linear without bias",
                  graph("%x : f64[3,4], %w : f64[2,4]", "  %y = linear(%x, %w)"),
                  {Range::kAny, Range::kAny}});
}

TEST_CASE("autodiff: gradient check of gemm") {
  for (const char* ta : {"0", "1"})
    for (const char* tb : {"0", "1"}) {
      const std::string a = ta[0] == '1' ? "f64[4,3]" : "f64[3,4]";
      const std::string b = tb[0] == '1' ? "f64[5,4]" : "f64[4,5]";
      checkGradients({std::string("gemm transA=") + ta + " transB=" + tb,
                      graph("%a : " + a + ", %b : " + b + ", %c : f64[5]",
                            std::string("  %y = gemm(%a, %b, %c) {alpha = 0.7, beta = 1.3, "
                                        "transA = ") +
                                ta + ", transB = " + tb + "}"),
                      {Range::kAny, Range::kAny, Range::kAny}});
    }
  checkGradients({"gemm without C",
                  graph("%a : f64[3,4], %b : f64[4,2]", "  %y = gemm(%a, %b)"),
                  {Range::kAny, Range::kAny}});
}

TEST_CASE("autodiff: gradient check of the normalizations") {
  checkGradients({"layer_norm",
                  graph("%x : f64[2,3,4], %s : f64[4], %b : f64[4]",
                        "  %y = layer_norm(%x, %s, %b) {epsilon = 0.001}"),
                  {Range::kAny, Range::kAny, Range::kAny}});
  checkGradients({"layer_norm over two dims, no affine",
                  graph("%x : f64[2,3,4]", "  %y = layer_norm(%x) {axis = 1}"),
                  {Range::kAny}});
  checkGradients({"batch_norm (inference: fixed statistics)",
                  graph("%x : f64[2,3,2,2], %s : f64[3], %b : f64[3], %m : f64[3], %v : f64[3]",
                        "  %y = batch_norm(%x, %s, %b, %m, %v) {epsilon = 0.01}"),
                  {Range::kAny, Range::kAny, Range::kAny, Range::kAny, Range::kPositive}});
  checkGradients({"batch_norm_train with batch_norm_stats",
                  graph("%x : f64[2,3,2,3], %s : f64[3], %b : f64[3]",
                        "  %st = batch_norm_stats(%x)\n"
                        "  %m0 = slice(%st) {starts = [0], ends = [1], axes = [0]}\n"
                        "  %v0 = slice(%st) {starts = [1], ends = [2], axes = [0]}\n"
                        "  %m = reshape(%m0) {shape = [3]}\n"
                        "  %v = reshape(%v0) {shape = [3]}\n"
                        "  %y = batch_norm_train(%x, %s, %b, %m, %v) {epsilon = 0.001}"),
                  {Range::kAny, Range::kAny, Range::kAny}});
  // Training mode: batch_norm rewritten (passes/training_mode.h).
  auto toTraining = [](ir::Graph& g) {
    for (ir::Value* p : g.parameters()) {
      ir::TensorData d(p->type().dtype, p->type().shape);
      for (int64_t i = 0; i < d.numElements(); ++i) d.as<double>()[i] = 0.5 + 0.25 * i;
      p->setData(d);
    }
    auto mode = passes::toTrainingMode(g);
    INFO(mode.status().message());
    REQUIRE(mode.hasValue());
    CHECK(mode->batchNorms == 1);
    CHECK(mode->writes.size() == 2);
  };
  checkGradients({"batch_norm (training: batch statistics)",
                  "graph t(%x : f64[3,2,2,3], %s : f64[2], %b : f64[2]) {\n"
                  "  param %m : f64[2] buffer\n  param %v : f64[2] buffer\n"
                  "  %y = batch_norm(%x, %s, %b, %m, %v)\n  return %y\n}",
                  {Range::kAny, Range::kAny, Range::kAny},
                  1e-6,
                  1e-6,
                  toTraining});
}

TEST_CASE("autodiff: gradient check of reductions, softmax and pooling") {
  const std::string x = "%x : f64[2,3,4]";
  checkGradients(
      {"reduce_sum", graph(x, "  %y = reduce_sum(%x) {axes = [1], keepdims = 0}"), {Range::kAny}});
  checkGradients({"reduce_sum all", graph(x, "  %y = reduce_sum(%x)"), {Range::kAny}});
  checkGradients({"reduce_mean",
                  graph(x, "  %y = reduce_mean(%x) {axes = [0,-1], keepdims = 0}"),
                  {Range::kAny}});
  checkGradients(
      {"reduce_mean keep", graph(x, "  %y = reduce_mean(%x) {axes = [2]}"), {Range::kAny}});
  checkGradients(
      {"reduce_max", graph(x, "  %y = reduce_max(%x) {axes = [1], keepdims = 0}"), {Range::kAny}});
  checkGradients({"reduce_max all, keepdims", graph(x, "  %y = reduce_max(%x)"), {Range::kAny}});
  checkGradients({"softmax", graph(x, "  %y = softmax(%x) {axis = 1}"), {Range::kAny}});
  checkGradients({"log_softmax", graph(x, "  %y = log_softmax(%x) {axis = -1}"), {Range::kAny}});
  checkGradients(
      {"global_avg_pool", graph("%x : f64[2,3,4,5]", "  %y = global_avg_pool(%x)"), {Range::kAny}});
}

TEST_CASE("autodiff: gradient check of conv2d and the pools") {
  const std::vector<Range> xwb{Range::kAny, Range::kAny, Range::kAny};
  checkGradients({"conv2d",
                  graph("%x : f64[2,3,5,6], %w : f64[4,3,3,2], %b : f64[4]",
                        "  %y = conv2d(%x, %w, %b) {pads = [1,0,1,1]}"),
                  xwb});
  checkGradients({"conv2d strided dilated grouped",
                  graph("%x : f64[1,4,7,7], %w : f64[6,2,2,3]",
                        "  %y = conv2d(%x, %w) {strides = [2,1], pads = [0,2,1,0], "
                        "dilations = [2,1], group = 2}"),
                  {Range::kAny, Range::kAny}});
  checkGradients({"conv_transpose2d",
                  graph("%x : f64[2,3,4,3], %w : f64[3,2,3,2]",
                        "  %y = conv_transpose2d(%x, %w) {pads = [1,0,0,1]}"),
                  {Range::kAny, Range::kAny}});
  checkGradients({"conv_transpose2d strided dilated grouped output_padding",
                  graph("%x : f64[1,4,3,4], %w : f64[4,3,2,3]",
                        "  %y = conv_transpose2d(%x, %w) {strides = [2,3], pads = [0,1,1,0], "
                        "dilations = [2,1], group = 2, output_padding = [1,2]}"),
                  {Range::kAny, Range::kAny}});
  checkGradients({"max_pool2d",
                  graph("%x : f64[2,2,5,5]",
                        "  %y = max_pool2d(%x) {kernel = [3,2], strides = [2,2], "
                        "pads = [1,0,1,1], ceil_mode = 1}"),
                  {Range::kAny}});
  checkGradients(
      {"max_pool2d dilated",
       graph("%x : f64[1,2,6,6]", "  %y = max_pool2d(%x) {kernel = [2,2], dilations = [2,2]}"),
       {Range::kAny}});
  for (const char* include : {"0", "1"})
    checkGradients({std::string("avg_pool2d count_include_pad=") + include,
                    graph("%x : f64[2,2,5,6]",
                          std::string("  %y = avg_pool2d(%x) {kernel = [3,3], strides = [2,2], "
                                      "pads = [1,1,1,1], ceil_mode = 1, count_include_pad = ") +
                              include + "}"),
                    {Range::kAny}});
}

TEST_CASE("autodiff: gradient check of data movement") {
  const std::string x = "%x : f64[2,3,4]";
  checkGradients({"reshape", graph(x, "  %y = reshape(%x) {shape = [6,-1]}"), {Range::kAny}});
  checkGradients({"flatten", graph(x, "  %y = flatten(%x) {axis = 2}"), {Range::kAny}});
  checkGradients({"unsqueeze", graph(x, "  %y = unsqueeze(%x) {axes = [1]}"), {Range::kAny}});
  checkGradients(
      {"squeeze", graph("%x : f64[2,1,4]", "  %y = squeeze(%x) {axes = [1]}"), {Range::kAny}});
  checkGradients({"transpose", graph(x, "  %y = transpose(%x) {perm = [2,0,1]}"), {Range::kAny}});
  checkGradients({"transpose reversed", graph(x, "  %y = transpose(%x)"), {Range::kAny}});
  checkGradients(
      {"expand", graph("%x : f64[3,1]", "  %y = expand(%x) {shape = [2,3,4]}"), {Range::kAny}});
  checkGradients({"concat",
                  graph("%a : f64[2,3,4], %b : f64[2,2,4]", "  %y = concat(%a, %b) {axis = 1}"),
                  {Range::kAny, Range::kAny}});
  checkGradients({"gather (repeated and negative indices)",
                  graph("%x : f64[4,3], %i : i64[5]", "  %y = gather(%x, %i) {axis = 0}"),
                  {Range::kAny, Range::kIndices}});
  checkGradients({"gather axis 1, 2-D indices",
                  graph("%x : f64[2,5,3], %i : i64[2,2]", "  %y = gather(%x, %i) {axis = 1}"),
                  {Range::kAny, Range::kIndices}});
  checkGradients({"slice",
                  graph(x, "  %y = slice(%x) {starts = [1, -3], ends = [2, 100], axes = [0, 2]}"),
                  {Range::kAny}});
  checkGradients({"slice whole dims",
                  graph(x, "  %y = slice(%x) {starts = [0], ends = [3], axes = [1]}"),
                  {Range::kAny}});
}

TEST_CASE("autodiff: gradient check of the losses, with an ignored target") {
  for (const char* reduction : {"mean", "sum", "none"})
    for (const char* op : {"nll_loss", "cross_entropy_loss"}) {
      const std::string body =
          std::string("  %y = ") + op + "(%x, %t) {reduction = \"" + reduction + "\"}";
      checkGradients({std::string(op) + " " + reduction,
                      graph("%x : f64[4,5], %t : i64[4]", body),
                      {Range::kAny, Range::kClasses}});
      checkGradients({std::string(op) + " spatial " + reduction,
                      graph("%x : f64[2,5,3], %t : i64[2,3]", body),
                      {Range::kAny, Range::kClasses}});
    }
}

TEST_CASE("autodiff: gradient check of the MSE loss") {
  for (const char* reduction : {"mean", "sum", "none"})
    checkGradients(
        {std::string("mse_loss ") + reduction,
         graph("%x : f64[3,4], %t : f64[3,4]",
               std::string("  %y = mse_loss(%x, %t) {reduction = \"") + reduction + "\"}"),
         {Range::kAny, Range::kAny}});
}

TEST_CASE("autodiff: errors name the node; unused parameters get zero gradients") {
  auto g =
      ir::parseGraph(graph("%x : f64[2,3], %z : f64[2,3]",
                           "  %m = batch_norm_stats(%x)\n  %y = reduce_sum(%m) {keepdims = 0}"));
  REQUIRE(g.hasValue());
  ir::Value* wrt[] = {g->inputs()[0]};
  auto r = passes::appendBackward(*g, g->outputs()[0], wrt);
  REQUIRE_FALSE(r.hasValue());
  CHECK_THAT(r.status().message(),
             Catch::Contains("batch_norm_stats") && Catch::Contains("has no gradient builder yet"));
  ir::Value* other[] = {g->inputs()[1]};
  auto zero = passes::appendBackward(*g, g->outputs()[0], other);
  REQUIRE(zero.hasValue());
  CHECK((*zero)[0]->type() == g->inputs()[1]->type());
  auto notScalar = passes::appendBackward(*g, g->inputs()[0], other);
  REQUIRE_FALSE(notScalar.hasValue());
  CHECK_THAT(notScalar.status().message(), Catch::Contains("must be a floating-point scalar"));
}
