// Pass tests: textual IR in, run one pass, assert `changed` and the structure out.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include "ir/fusion_group.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/pipeline.h"
#include "runtime/eager.h"
#include "runtime/reference/kernels.h"

using namespace kiln;

namespace {

ir::Graph parse(const std::string& text) {
  auto g = ir::parseGraph(text);
  INFO(text);
  REQUIRE(g.hasValue());
  return std::move(g).value();
}

// The op names of the graph's nodes, in order: "relu add".
std::string ops(const ir::Graph& g) {
  std::string s;
  for (const ir::Node* n : g.nodes())
    s += (s.empty() ? "" : " ") + std::string(ir::opName(n->op()));
  return s;
}

bool runPass(const std::string& name, ir::Graph& g, passes::PassContext& ctx) {
  auto pass = passes::createPass(name);
  REQUIRE(pass);
  const bool changed = pass->run(g, ctx);
  Status st = ir::verify(g);
  INFO(st.message() << "\n" << ir::printGraph(g));
  REQUIRE(st.isOk());
  return changed;
}

void fill(ir::Graph& g, const std::string& param, float value) {
  ir::Value* p = g.findValue(param);
  REQUIRE(p);
  ir::TensorData d(p->type().dtype, p->type().shape);
  for (int64_t i = 0; i < d.numElements(); ++i) d.as<float>()[i] = value;
  p->setData(d);
}

// Constant evaluation through the runtime's reference kernels, as the compiler injects it.
passes::ConstantEvaluator referenceEvaluator() {
  return runtime::evaluateNode;
}

}  // namespace

TEST_CASE("dce removes nodes and parameters no output needs, and then reports no change") {
  ir::Graph g = parse(R"(
graph g(%x : f32[4]) {
  param %unused : f32[4]
  param %w : f32[4]
  %a : f32[4] = relu(%x)
  %dead1 : f32[4] = mul(%x, %unused)
  %dead2 : f32[4] = exp(%dead1)
  %y : f32[4] = add(%a, %w)
  return %y
})");
  passes::PassContext ctx;
  CHECK(runPass("dce", g, ctx));
  CHECK(ops(g) == "relu add");
  CHECK(g.parameters().size() == 1);
  CHECK(g.findValue("unused") == nullptr);
  CHECK_FALSE(runPass("dce", g, ctx));
}

TEST_CASE("cse merges identical nodes but not ones with different attributes") {
  ir::Graph g = parse(R"(
graph g(%x : f32[2,3]) {
  %a : f32[2,3] = relu(%x)
  %b : f32[2,3] = relu(%x)
  %s1 : f32[2,3] = softmax(%a) {axis=1}
  %s2 : f32[2,3] = softmax(%b) {axis=0}
  %s3 : f32[2,3] = softmax(%b) {axis=1}
  %c : f32[2,3] = add(%s1, %s2)
  %d : f32[2,3] = add(%c, %s3)
  return %d
})");
  passes::PassContext ctx;
  CHECK(runPass("cse", g, ctx));
  CHECK(ops(g) == "relu softmax softmax add add");
  // s3 became s1: the last add reads the first softmax.
  const auto nodes = g.nodes();
  CHECK(nodes[4]->input(1) == nodes[1]->output());
  CHECK_FALSE(runPass("cse", g, ctx));
}

TEST_CASE("constant folding evaluates weight-only subgraphs in inference mode only") {
  const std::string text = R"(
graph g(%x : f32[2,3]) {
  param %w : f32[4,3]
  %wt : f32[3,4] = transpose(%w) {perm=[1,0]}
  %y : f32[2,4] = matmul(%x, %wt)
  return %y
})";
  SECTION("inference: the transpose becomes a constant with the right values") {
    ir::Graph g = parse(text);
    ir::TensorData w(ir::DType::kF32, {4, 3});
    for (int i = 0; i < 12; ++i) w.as<float>()[i] = static_cast<float>(i);
    g.findValue("w")->setData(w);
    passes::PassContext ctx;
    ctx.evaluate = referenceEvaluator();
    CHECK(runPass("constant-folding", g, ctx));
    CHECK(ops(g) == "matmul");
    const ir::Value* c = g.nodes()[0]->input(1);
    REQUIRE(c->isParameter());
    CHECK_FALSE(c->trainable());
    CHECK(c->type().shape == ir::Shape{3, 4});
    CHECK(c->data().as<float>()[1] == 3.0f);  // wt[0][1] = w[1][0]
    CHECK(c->data().as<float>()[4] == 1.0f);  // wt[1][0] = w[0][1]
  }
  SECTION("training: trainable weights stay live") {
    ir::Graph g = parse(text);
    fill(g, "w", 1.0f);
    passes::PassContext ctx;
    ctx.inference = false;
    ctx.evaluate = referenceEvaluator();
    CHECK_FALSE(runPass("constant-folding", g, ctx));
    CHECK(ops(g) == "transpose matmul");
  }
  SECTION("without an evaluator nothing is folded") {
    ir::Graph g = parse(text);
    fill(g, "w", 1.0f);
    passes::PassContext ctx;
    CHECK_FALSE(runPass("constant-folding", g, ctx));
  }
}

TEST_CASE("algebraic simplification removes identities that keep the type") {
  ir::Graph g = parse(R"(
graph g(%x : f32[2,3]) {
  param %one : f32[1] buffer
  param %zero : f32[3] buffer
  param %ones_big : f32[4,2,3] buffer
  %a : f32[2,3] = mul(%x, %one)
  %b : f32[2,3] = add(%zero, %a)
  %c : f32[2,3] = dropout(%b)
  %d : f32[2,3] = cast(%c) {to="f32"}
  %e : f32[4,2,3] = mul(%d, %ones_big)
  return %e
})");
  fill(g, "one", 1.0f);
  fill(g, "zero", 0.0f);
  fill(g, "ones_big", 1.0f);
  passes::PassContext ctx;
  CHECK(runPass("algebraic-simplification", g, ctx));
  // Only the broadcasting multiply survives: removing it would change the output shape.
  CHECK(ops(g) == "mul");
  CHECK(g.nodes()[0]->input(0) == g.inputs()[0]);
  CHECK_FALSE(runPass("algebraic-simplification", g, ctx));
}

TEST_CASE("algebraic simplification merges transpose and reshape chains") {
  SECTION("two transposes that cancel disappear") {
    ir::Graph g = parse(R"(
graph g(%x : f32[2,3,4]) {
  %a : f32[4,2,3] = transpose(%x) {perm=[2,0,1]}
  %b : f32[2,3,4] = transpose(%a) {perm=[1,2,0]}
  %y : f32[2,3,4] = relu(%b)
  return %y
})");
    passes::PassContext ctx;
    CHECK(runPass("algebraic-simplification", g, ctx));
    CHECK(ops(g) == "relu");
  }
  SECTION("two transposes become one with the composed permutation") {
    ir::Graph g = parse(R"(
graph g(%x : f32[2,3,4]) {
  %a : f32[3,2,4] = transpose(%x) {perm=[1,0,2]}
  %b : f32[4,3,2] = transpose(%a) {perm=[2,0,1]}
  return %b
})");
    passes::PassContext ctx;
    CHECK(runPass("algebraic-simplification", g, ctx));
    REQUIRE(ops(g) == "transpose");
    CHECK(g.nodes()[0]->attr().getInts("perm") == std::vector<int64_t>{2, 1, 0});
    CHECK(g.outputs()[0]->type().shape == ir::Shape{4, 3, 2});
  }
  SECTION("a chain of shape ops becomes one reshape") {
    ir::Graph g = parse(R"(
graph g(%x : f32[2,3,4]) {
  %a : f32[6,4] = reshape(%x) {shape=[6,4]}
  %b : f32[1,6,4] = unsqueeze(%a) {axes=[0]}
  %c : f32[1,24] = flatten(%b) {axis=1}
  return %c
})");
    passes::PassContext ctx;
    CHECK(runPass("algebraic-simplification", g, ctx));
    REQUIRE(ops(g) == "reshape");
    CHECK(g.nodes()[0]->input(0) == g.inputs()[0]);
    CHECK(g.nodes()[0]->attr().getInts("shape") == std::vector<int64_t>{1, 24});
  }
}

TEST_CASE("algebraic simplification: a product with a transposed 2-D weight is a linear") {
  SECTION("matmul(x, transpose(w)) plus a bias row: one linear, the weight as stored") {
    ir::Graph g = parse(R"(
graph g(%x : f32[2,5,4], %w : f32[3,4], %b : f32[3]) {
  %t : f32[4,3] = transpose(%w) {perm=[1,0]}
  %m : f32[2,5,3] = matmul(%x, %t)
  %y : f32[2,5,3] = add(%m, %b)
  %e : f32[3,4] = relu(%w)
  return %y, %e
})");
    // The values before and after, on the reference kernels.
    const auto inputs = [] {
      std::vector<runtime::Tensor> in;
      for (ir::Shape s : {ir::Shape{2, 5, 4}, ir::Shape{3, 4}, ir::Shape{3}}) {
        runtime::Tensor t = *runtime::Tensor::empty(ir::DType::kF32, s);
        for (int64_t i = 0; i < t.numElements(); ++i)
          t.data<float>()[i] = static_cast<float>((i * 7) % 11) * 0.25f - 1.f;
        in.push_back(std::move(t));
      }
      return in;
    }();
    auto before = runtime::EagerExecutor(g).run(inputs);
    REQUIRE(before.hasValue());
    passes::PassContext ctx;
    CHECK(runPass("algebraic-simplification", g, ctx));
    CHECK(ops(g) == "linear relu");  // The transpose had no other use and is gone.
    CHECK(g.nodes()[0]->inputs().size() == 3);
    CHECK(g.nodes()[0]->input(1) == g.inputs()[1]);
    auto after = runtime::EagerExecutor(g).run(inputs);
    REQUIRE(after.hasValue());
    for (int64_t i = 0; i < (*before)[0].numElements(); ++i)
      CHECK((*after)[0].data<float>()[i] == Approx((*before)[0].data<float>()[i]).margin(1e-6));
  }
  SECTION("not for a permutation of more dims, nor a bias of another shape") {
    ir::Graph g = parse(R"(
graph g(%x : f32[2,5,4], %w : f32[3,4], %b : f32[5,3]) {
  %t : f32[4,3] = transpose(%w) {perm=[1,0]}
  %m : f32[2,5,3] = matmul(%x, %t)
  %y : f32[2,5,3] = add(%m, %b)
  %u : f32[4,5,2] = transpose(%x) {perm=[2,1,0]}
  return %y, %u
})");
    passes::PassContext ctx;
    CHECK(runPass("algebraic-simplification", g, ctx));
    CHECK(ops(g) == "linear add transpose");
  }
}

TEST_CASE("algebraic simplification: x * sigmoid(x) is a silu") {
  SECTION("either order, the value unchanged (NaN and infinities included)") {
    ir::Graph g = parse(R"(
graph g(%x : f32[12]) {
  %s : f32[12] = sigmoid(%x)
  %y : f32[12] = mul(%x, %s)
  %t : f32[12] = sigmoid(%y)
  %z : f32[12] = mul(%t, %y)
  return %z
})");
    runtime::Tensor x = *runtime::Tensor::empty(ir::DType::kF32, {12});
    const float values[12] = {-100.f,
                              -20.f,
                              -3.f,
                              -0.5f,
                              -0.f,
                              0.f,
                              1e-8f,
                              0.75f,
                              4.f,
                              95.f,
                              std::numeric_limits<float>::infinity(),
                              std::nanf("")};
    std::copy(std::begin(values), std::end(values), x.data<float>());
    auto before = runtime::EagerExecutor(g).run(std::vector<runtime::Tensor>{x});
    REQUIRE(before.hasValue());
    passes::PassContext ctx;
    CHECK(runPass("algebraic-simplification", g, ctx));
    CHECK(ops(g) == "silu silu");
    auto after = runtime::EagerExecutor(g).run(std::vector<runtime::Tensor>{x});
    REQUIRE(after.hasValue());
    for (int i = 0; i < 12; ++i) {
      const float b = (*before)[0].data<float>()[i], a = (*after)[0].data<float>()[i];
      INFO("x = " << values[i] << ": " << b << " before, " << a << " after");
      if (std::isnan(b)) {
        CHECK(std::isnan(a));
      } else {
        CHECK(a == Approx(b).epsilon(1e-6).margin(1e-30));
      }
    }
  }
  SECTION("not where the sigmoid has another use or another operand") {
    ir::Graph g = parse(R"(
graph g(%x : f32[4], %w : f32[4]) {
  %s : f32[4] = sigmoid(%x)
  %y : f32[4] = mul(%x, %s)
  %t : f32[4] = sigmoid(%x)
  %z : f32[4] = mul(%w, %t)
  return %y, %s, %z
})");
    passes::PassContext ctx;
    CHECK_FALSE(runPass("algebraic-simplification", g, ctx));
    CHECK(ops(g) == "sigmoid mul sigmoid mul");
  }
}

TEST_CASE("the pipeline disables passes, dumps, times and verifies") {
  const std::string text = R"(
graph g(%x : f32[4]) {
  %a : f32[4] = relu(%x)
  %b : f32[4] = relu(%x)
  %dead : f32[4] = exp(%x)
  %y : f32[4] = add(%a, %b)
  return %y
})";
  SECTION("standard pipeline") {
    ir::Graph g = parse(text);
    std::ostringstream log;
    passes::PassContext ctx;
    ctx.verifyAfterEach = true;
    ctx.dumpAfter = {"cse"};
    ctx.timePasses = true;
    ctx.log = &log;
    REQUIRE(passes::Pipeline::standard().run(g, ctx).isOk());
    CHECK(ops(g) == "relu add");
    CHECK(ctx.timings.size() == passes::Pipeline::standard().passNames().size());
    CHECK_THAT(log.str(), Catch::Contains("// after cse") && Catch::Contains("pass dce:"));
  }
  SECTION("--disable-pass=cse keeps the duplicate") {
    ir::Graph g = parse(text);
    passes::PassContext ctx;
    ctx.disabled = {"cse"};
    REQUIRE(passes::Pipeline::standard().run(g, ctx).isOk());
    CHECK(ops(g) == "relu relu add");
  }
  SECTION("unknown pass names are user errors listing the passes") {
    ir::Graph g = parse(text);
    passes::PassContext ctx;
    ctx.disabled = {"fuse-everything"};
    Status st = passes::Pipeline::standard().run(g, ctx);
    REQUIRE_FALSE(st.isOk());
    CHECK(st.isUserError());
    CHECK_THAT(st.message(), Catch::Contains("unknown pass 'fuse-everything'") &&
                                 Catch::Contains("constant-folding"));
  }
}

TEST_CASE("every registered pass has a unique kebab-case name") {
  std::set<std::string> names;
  for (const auto& p : passes::allPasses()) {
    CHECK(names.insert(std::string(p.name)).second);
    for (char c : p.name) CHECK((std::islower(static_cast<unsigned char>(c)) || c == '-'));
  }
}

TEST_CASE("persistent state is never folded, simplified or treated as a constant") {
  // %m is optimizer state: zero now, rewritten by every training step.
  const std::string text = R"(
graph g(%x : f32[3]) {
  param %m : f32[3] state
  param %one : f32[3] buffer
  %s : f32[3] = mul(%m, %one)
  %t : f32[3] = add(%s, %m)
  %y : f32[3] = add(%x, %t)
  return %y
})";
  for (bool inference : {true, false}) {
    INFO("inference " << inference);
    ir::Graph g = parse(text);
    fill(g, "m", 0.0f);
    fill(g, "one", 1.0f);
    REQUIRE(g.findValue("m")->isState());
    passes::PassContext ctx;
    ctx.inference = inference;
    ctx.evaluate = referenceEvaluator();
    runPass("constant-folding", g, ctx);
    runPass("algebraic-simplification", g, ctx);
    // x*1 may go, but nothing that reads %m becomes a constant.
    CHECK(g.findValue("m")->users().size() >= 1);
    CHECK_THAT(ir::printGraph(g), Catch::Contains("param %m : f32[3] state"));
    for (const ir::Node* n : g.nodes())
      for (const ir::Value* in : n->inputs())
        if (in->isParameter()) CHECK((in->name() == "m" || in->name() == "one"));
  }
  // Only non-trainable parameters can be state.
  ir::Graph g = parse(text);
  ir::Value* w = *g.addParameter("w", ir::TensorType{ir::DType::kF32, {3}}, true);
  CHECK_THAT(g.markState(w).message(), Catch::Contains("only a non-trainable parameter"));
}

TEST_CASE("device lowering: BatchNorm training ops and split reductions keep their values") {
  const std::string text =
      R"(graph g(%x : f32[3,4,5,6], %g : f32[3,4,5,6], %m : f32[4], %v : f32[4], %s : f32[4], %h : f32[6,4]) {
  %stats : f32[2,4] = batch_norm_stats(%x)
  %sums : f32[2,4] = batch_norm_backward_reduce(%g, %x, %m, %v) {epsilon=0.001}
  %dx : f32[3,4,5,6] = batch_norm_backward(%g, %x, %m, %v, %s, %sums) {epsilon=0.001}
  %r : f32[4] = reduce_sum(%g) {axes=[0,2,3], keepdims=0}
  %q : f32[1,4,5,1] = reduce_mean(%x) {axes=[0,3], keepdims=1}
  %w : f32[6,4] = batch_norm_backward(%h, %h, %m, %v, %s, %sums)
  return %stats, %sums, %dx, %r, %q, %w
})";
  ir::Graph g = parse(text);
  std::vector<runtime::Tensor> ins;
  uint32_t seed = 5;
  for (const ir::Value* v : g.inputs()) {
    runtime::Tensor t = *runtime::Tensor::empty(v->type().dtype, v->type().shape);
    for (int64_t i = 0; i < t.numElements(); ++i) {
      seed = seed * 1664525u + 1013904223u;
      const float u = static_cast<float>(seed >> 8) / static_cast<float>(1 << 24);
      t.data<float>()[i] = v->name() == "v" ? 0.5f + u : 2.f * u - 1.f;  // Variances > 0.
    }
    ins.push_back(t);
  }
  auto before = runtime::EagerExecutor(g).run(ins);
  REQUIRE(before.hasValue());

  passes::PassContext off;
  CHECK_FALSE(runPass("device-lowering", g, off));  // Only for device backends.
  passes::PassContext ctx;
  ctx.lowerForDevice = true;
  CHECK(runPass("device-lowering", g, ctx));
  for (const ir::Node* n : g.nodes()) {
    INFO(n->describe());
    CHECK(n->op() != ir::OpKind::kBatchNormStats);
    CHECK(n->op() != ir::OpKind::kBatchNormBackwardReduce);
    CHECK(n->op() != ir::OpKind::kBatchNormBackward);
    if (n->op() == ir::OpKind::kReduceSum || n->op() == ir::OpKind::kReduceMean)
      CHECK(ir::reducedRange(*n).first >= 0);  // Adjacent dims: one kernel each.
  }
  CHECK(ctx.remarks.empty());
  auto after = runtime::EagerExecutor(g).run(ins);
  REQUIRE(after.hasValue());
  for (size_t k = 0; k < before->size(); ++k)
    for (int64_t i = 0; i < (*before)[k].numElements(); ++i) {
      const double a = (*after)[k].elementAsDouble(i), b = (*before)[k].elementAsDouble(i);
      INFO("output " << k << " element " << i);
      CHECK(std::fabs(a - b) <= 1e-4 * std::max(1.0, std::fabs(b)));
    }
}

TEST_CASE("autocast: products in bf16, their results flowing on through kLowPrecision ops") {
  // conv -> relu -> conv -> + relu's output -> exp: the convolutions run in bf16, the ReLU and
  // the residual add stay bf16 (their inputs are), exp computes in f32 (it has no
  // kLowPrecision), and no value goes bf16 -> f32 -> bf16.
  const std::string text = R"(graph g(%x : f32[1,2,4,4], %w : f32[2,2,3,3], %v : f32[2,2,3,3]) {
  %c : f32[1,2,4,4] = conv2d(%x, %w) {pads=[1,1,1,1]}
  %r : f32[1,2,4,4] = relu(%c)
  %d : f32[1,2,4,4] = conv2d(%r, %v) {pads=[1,1,1,1]}
  %a : f32[1,2,4,4] = add(%d, %r)
  %e : f32[1,2,4,4] = exp(%a)
  return %e, %r
})";
  ir::Graph g = parse(text);
  const ir::Graph fp32 = g.clone();
  passes::PassContext off;
  CHECK_FALSE(runPass("autocast", g, off));  // f32: nothing to do.
  passes::PassContext ctx;
  ctx.autocast = ir::DType::kBF16;
  CHECK(runPass("autocast", g, ctx));
  int casts = 0;
  for (const ir::Node* n : g.nodes()) {
    INFO(n->describe());
    const ir::DType t = n->output()->type().dtype;
    switch (n->op()) {
      case ir::OpKind::kConv2d:
      case ir::OpKind::kRelu:
      case ir::OpKind::kAdd:
        CHECK(t == ir::DType::kBF16);
        break;
      case ir::OpKind::kExp:
        CHECK(t == ir::DType::kF32);
        break;
      case ir::OpKind::kCast:
        ++casts;
        if (t == ir::DType::kBF16) CHECK_FALSE(n->input(0)->producer());  // Only x, w, v.
        break;
      default:
        FAIL("unexpected op");
    }
  }
  CHECK(casts == 5);  // x, w, v to bf16; the add and the relu (an output) back to f32.
  for (const ir::Value* o : g.outputs()) CHECK(o->type().dtype == ir::DType::kF32);
  CHECK_FALSE(runPass("autocast", g, ctx));  // Nothing f32 left to autocast.

  // The values: the reference kernels on the autocast graph stay within bf16 of fp32's.
  std::vector<runtime::Tensor> ins;
  for (const ir::Value* v : fp32.inputs()) {
    runtime::Tensor t = *runtime::Tensor::empty(v->type().dtype, v->type().shape);
    for (int64_t i = 0; i < t.numElements(); ++i)
      t.data<float>()[i] = std::sin(static_cast<float>(i) * 0.37f) * 0.5f;
    ins.push_back(t);
  }
  auto want = runtime::EagerExecutor(fp32).run(ins);
  auto got = runtime::EagerExecutor(g).run(ins);
  REQUIRE(want.hasValue());
  REQUIRE(got.hasValue());
  for (size_t o = 0; o < want->size(); ++o)
    for (int64_t i = 0; i < (*want)[o].numElements(); ++i) {
      const double a = (*got)[o].elementAsDouble(i), b = (*want)[o].elementAsDouble(i);
      INFO("output " << o << " element " << i);
      CHECK(std::fabs(a - b) <= 3e-2 * std::max(1.0, std::fabs(b)));
    }
}

TEST_CASE("attention fusion: matmul, scale, mask add, softmax and matmul become one attention") {
  const std::string text = R"(
graph g(%q : f32[2,3,5,8], %kt : f32[2,3,8,7], %v : f32[2,3,7,4], %mask : f32[2,1,1,7]) {
  param %c : f32[] buffer
  %s : f32[2,3,5,7] = matmul(%q, %kt)
  %d : f32[2,3,5,7] = div(%s, %c)
  %m : f32[2,3,5,7] = add(%d, %mask)
  %p : f32[2,3,5,7] = softmax(%m) {axis=3}
  %y : f32[2,3,5,4] = matmul(%p, %v)
  return %y
})";
  auto library = [](ir::OpKind op, ir::DType, ir::Layout) { return op == ir::OpKind::kAttention; };
  SECTION("fused, with the divisor as a scale, matching the unfused ops") {
    ir::Graph g = parse(text);
    ir::Graph unfused = parse(text);
    fill(g, "c", 2.0f);
    fill(unfused, "c", 2.0f);
    passes::PassContext ctx;
    ctx.hasLibraryKernel = library;
    CHECK(runPass("attention-fusion", g, ctx));
    CHECK(ops(g) == "attention");
    const ir::Node* a = g.nodes()[0];
    CHECK(a->attr().getFloat("scale") == 0.5);
    CHECK(a->input(3)->name() == "mask");
    // Eager runs the reference kernels: the fused op against the ops it replaced.
    std::mt19937 rng(7);
    std::normal_distribution<float> dist;
    std::vector<runtime::Tensor> ins;
    for (const ir::Value* v : g.inputs()) {
      runtime::Tensor t = *runtime::Tensor::empty(v->type().dtype, v->type().shape);
      for (int64_t i = 0; i < t.numElements(); ++i) t.data<float>()[i] = dist(rng);
      ins.push_back(t);
    }
    ins[3].data<float>()[6] = -std::numeric_limits<float>::infinity();  // A masked key.
    auto got = runtime::EagerExecutor(g).run(ins);
    auto want = runtime::EagerExecutor(unfused).run(ins);
    REQUIRE(got.hasValue());
    REQUIRE(want.hasValue());
    for (int64_t i = 0; i < (*want)[0].numElements(); ++i)
      CHECK((*got)[0].data<float>()[i] == Approx((*want)[0].data<float>()[i]).margin(1e-6));
  }
  SECTION("not where the backend's library lacks it, for training, or with another reader") {
    ir::Graph g = parse(text);
    fill(g, "c", 2.0f);
    passes::PassContext ctx;
    ctx.hasLibraryKernel = [](ir::OpKind, ir::DType, ir::Layout) { return false; };
    CHECK_FALSE(runPass("attention-fusion", g, ctx));
    ctx.hasLibraryKernel = library;
    ctx.inference = false;
    CHECK_FALSE(runPass("attention-fusion", g, ctx));
    ir::Graph shared = parse(R"(
graph g(%q : f32[3,5,8], %kt : f32[3,8,7], %v : f32[3,7,4]) {
  %s : f32[3,5,7] = matmul(%q, %kt)
  %p : f32[3,5,7] = softmax(%s) {axis=2}
  %y : f32[3,5,4] = matmul(%p, %v)
  return %y, %p
})");
    passes::PassContext inference;
    inference.hasLibraryKernel = library;
    CHECK_FALSE(runPass("attention-fusion", shared, inference));  // The scores are an output.
    ir::Graph otherAxis = parse(R"(
graph g(%q : f32[3,5,8], %kt : f32[3,8,7], %v : f32[3,7,4]) {
  %s : f32[3,5,7] = matmul(%q, %kt)
  %p : f32[3,5,7] = softmax(%s) {axis=1}
  %y : f32[3,5,4] = matmul(%p, %v)
  return %y
})");
    CHECK_FALSE(runPass("attention-fusion", otherAxis, inference));
  }
}

TEST_CASE("rematerialize recomputes a large pointwise value of the inputs for each later reader") {
  // %r (2 MB, from the input alone) is read by the first node and, more than kGap (8) nodes
  // later, by %c: %c gets a copy of its own, so %r need not live in between. %small (below 1 MB),
  // %p (reads a parameter, which an optimizer may overwrite) and %y (a graph output) are kept.
  const std::string text = R"(
graph g(%x : f32[8,16,64,64], %s : f32[4]) {
  param %w : f32[8,16,64,64]
  %r : f32[8,16,64,64]@nhwc = relayout(%x) {from="plain", to="nhwc"}
  %a : f32[8,16,64,64]@nhwc = relu(%r)
  %small : f32[4] = neg(%s)
  %p : f32[8,16,64,64] = mul(%x, %w)
  %b : f32[8,16,64,64]@nhwc = exp(%a)
  %b1 : f32[8,16,64,64]@nhwc = exp(%b)
  %b2 : f32[8,16,64,64]@nhwc = exp(%b1)
  %b3 : f32[8,16,64,64]@nhwc = exp(%b2)
  %b4 : f32[8,16,64,64]@nhwc = exp(%b3)
  %b5 : f32[8,16,64,64]@nhwc = exp(%b4)
  %b6 : f32[8,16,64,64]@nhwc = exp(%b5)
  %b7 : f32[8,16,64,64]@nhwc = exp(%b6)
  %c : f32[8,16,64,64]@nhwc = add(%b7, %r)
  %t : f32[4] = add(%small, %small)
  %u : f32[4] = mul(%t, %small)
  %q : f32[8,16,64,64] = add(%p, %p)
  %v : f32[8,16,64,64] = mul(%q, %p)
  return %c, %u, %v
})";
  ir::Graph g = parse(text);
  passes::PassContext ctx;
  ctx.inference = false;
  CHECK(runPass("rematerialize", g, ctx));
  CHECK(ops(g) ==
        "relayout relu neg mul exp exp exp exp exp exp exp exp relayout add add mul add mul");
  const auto nodes = g.nodes();
  CHECK(nodes[13]->input(1) == nodes[12]->output());  // The last reader's own copy.
  CHECK(nodes[12]->input(0) == g.inputs()[0]);
  CHECK(nodes[1]->input(0) == nodes[0]->output());  // The first keeps the original.
  CHECK_FALSE(runPass("rematerialize", g, ctx));    // One reader each now.
  ir::Graph inference = parse(text);
  passes::PassContext inferenceCtx;  // Inference keeps nothing beyond a call.
  CHECK_FALSE(runPass("rematerialize", inference, inferenceCtx));
}

TEST_CASE("rematerialize with recompute recomputes a pointwise chain from values alive later") {
  // %y = relu(%n), %n = mul(%c, %s): %y is read by %u early and by %back late, when %c (read by
  // %late) and the parameter %s are alive anyway: %back gets relu(mul(%c, %s)) of its own, %y
  // dies after %u. %k (read late by %back2) is computed from %tmp, which dies early: kept as is
  // without recompute, recomputed with it only because its chain reaches alive values.
  const std::string text = R"(
graph g(%c : f32[8,16,64,64]) {
  param %s : f32[8,16,64,64]
  %n : f32[8,16,64,64] = mul(%c, %s)
  %y : f32[8,16,64,64] = relu(%n)
  %u : f32[8,16,64,64] = exp(%y)
  %e1 : f32[8,16,64,64] = exp(%u)
  %e2 : f32[8,16,64,64] = exp(%e1)
  %e3 : f32[8,16,64,64] = exp(%e2)
  %e4 : f32[8,16,64,64] = exp(%e3)
  %e5 : f32[8,16,64,64] = exp(%e4)
  %e6 : f32[8,16,64,64] = exp(%e5)
  %e7 : f32[8,16,64,64] = exp(%e6)
  %e8 : f32[8,16,64,64] = exp(%e7)
  %e9 : f32[8,16,64,64] = exp(%e8)
  %back : f32[8,16,64,64] = add(%e9, %y)
  %late : f32[8,16,64,64] = add(%back, %c)
  return %late
})";
  ir::Graph g = parse(text);
  passes::PassContext ctx;
  ctx.inference = false;
  CHECK_FALSE(runPass("rematerialize", g, ctx));  // %y is not a value of the inputs alone.
  ctx.recompute = true;
  CHECK(runPass("rematerialize", g, ctx));
  CHECK(ops(g) == "mul relu exp exp exp exp exp exp exp exp exp exp mul relu add add");
  const auto nodes = g.nodes();
  CHECK(nodes[14]->input(1) == nodes[13]->output());  // %back reads the recomputed relu,
  CHECK(nodes[13]->input(0) == nodes[12]->output());  // of a recomputed mul,
  CHECK(nodes[12]->input(0) == g.inputs()[0]);        // of values alive there.
  CHECK(nodes[2]->input(0) == nodes[1]->output());    // %u keeps the original.
}
