// Fusion planning and BatchNorm folding: textual IR in, groups and rejections out.
#include <catch2/catch.hpp>
#include <cmath>

#include "ir/parser.h"
#include "ir/verifier.h"
#include "passes/fusion.h"
#include "passes/pass.h"

using namespace kiln;

namespace {
ir::Graph parse(const std::string& text) {
  auto g = ir::parseGraph(text);
  INFO(g.status().message());
  REQUIRE(g.hasValue());
  return std::move(g).value();
}

// "pointwise:relu,add | library:linear": each group's kind and ops.
std::string groups(const passes::FusionPlan& p) {
  std::string s;
  for (const auto& g : p.groups) {
    s += (s.empty() ? "" : " | ") + std::string(passes::groupKindName(g.kind)) + ":";
    for (size_t i = 0; i < g.nodes.size(); ++i)
      s += (i ? "," : "") + std::string(ir::opName(g.nodes[i]->op()));
  }
  return s;
}
}  // namespace

TEST_CASE("fusion: a pointwise DAG with broadcasting is one group") {
  ir::Graph g = parse(R"(
graph g(%x : f32[4,8], %b : f32[8]) {
  %a : f32[4,8] = relu(%x)
  %c : f32[4,8] = exp(%x)
  %d : f32[4,8] = add(%a, %b)
  %e : f32[4,8] = mul(%d, %c)
  return %e
})");
  auto plan = passes::planFusion(g);
  CHECK(groups(plan) == "pointwise:relu,exp,add,mul");
}

TEST_CASE("fusion: softmax takes its pointwise prologue and epilogue") {
  ir::Graph g = parse(R"(
graph g(%x : f32[4,8], %s : f32[4,8]) {
  %a : f32[4,8] = mul(%x, %s)
  %p : f32[4,8] = softmax(%a) {axis=1}
  %q : f32[4,8] = log(%p)
  return %q
})");
  auto plan = passes::planFusion(g);
  CHECK(groups(plan) == "reduction:mul,softmax,log");
  CHECK(plan.groups[0].anchor == g.nodes()[1]);
}

TEST_CASE("fusion: a reduce takes a row-level epilogue but not a second reduction") {
  ir::Graph g = parse(R"(
graph g(%x : f32[4,8]) {
  %m : f32[4,1] = reduce_mean(%x) {axes=[1]}
  %d : f32[4,8] = sub(%x, %m)
  %v : f32[4,1] = reduce_mean(%d) {axes=[1]}
  %r : f32[4,1] = relu(%v)
  return %r
})");
  auto plan = passes::planFusion(g);
  CHECK(groups(plan) == "reduction:reduce_mean,sub | reduction:reduce_mean,relu");
  CHECK_THAT(passes::explainFusion(plan), Catch::Contains("the producer is a reduction step"));
  REQUIRE(plan.rejections.size() == 1);
  CHECK(plan.rejections[0].decision.verdict == passes::FusionDecision::Verdict::kIllegal);
}

TEST_CASE("fusion: a join that would create a cycle through a library call is rejected") {
  ir::Graph g = parse(R"(
graph g(%x : f32[4,8], %w : f32[8,8]) {
  %a : f32[4,8] = relu(%x)
  %b : f32[4,8] = linear(%a, %w)
  %c : f32[4,8] = add(%a, %b)
  return %c
})");
  auto plan = passes::planFusion(g);
  CHECK(groups(plan) == "pointwise:relu | library:linear | pointwise:add");
  CHECK_THAT(passes::explainFusion(plan), Catch::Contains("cycle"));
}

TEST_CASE("fusion: views become loads of their consumer; a lone transpose stays a copy") {
  ir::Graph g = parse(R"(
graph g(%x : f32[4,8], %y : f32[8,4], %w : f32[4,4]) {
  %t : f32[4,8] = transpose(%y) {perm=[1,0]}
  %a : f32[4,8] = add(%x, %t)
  %u : f32[8,4] = transpose(%a) {perm=[1,0]}
  %m : f32[8,4] = matmul(%u, %w)
  return %m
})");
  auto plan = passes::planFusion(g);
  CHECK(groups(plan) == "pointwise:transpose,add | view:transpose | library:matmul");
}

TEST_CASE("fusion: activations and a residual add become post-ops of a conv") {
  ir::Graph g = parse(R"(
graph g(%x : f32[1,4,6,6], %w : f32[4,4,3,3], %r : f32[1,4,6,6]) {
  %c : f32[1,4,6,6] = conv2d(%x, %w) {pads=[1,1,1,1]}
  %s : f32[1,4,6,6] = add(%c, %r)
  %y : f32[1,4,6,6] = relu(%s)
  return %y
})");
  passes::FusionOptions withEpilogues;
  withEpilogues.libraryEpilogues = true;
  CHECK(groups(passes::planFusion(g, withEpilogues)) == "library:conv2d,add,relu");
  CHECK(groups(passes::planFusion(g)) == "library:conv2d | pointwise:add,relu");
}

TEST_CASE("batchnorm-folding: conv2d + batch_norm become one conv2d with folded weights") {
  ir::Graph g = parse(R"(
graph g(%x : f32[1,2,3,3]) {
  param %w : f32[2,1,1,1]
  param %scale : f32[2] buffer
  param %shift : f32[2] buffer
  param %mean : f32[2] buffer
  param %var : f32[2] buffer
  %c : f32[1,2,3,3] = conv2d(%x, %w) {group=2}
  %b : f32[1,2,3,3] = batch_norm(%c, %scale, %shift, %mean, %var) {epsilon=0.0}
  %y : f32[1,2,3,3] = relu(%b)
  return %y
})");
  auto set = [&](const char* name, std::vector<float> v) {
    ir::TensorData d(ir::DType::kF32, {static_cast<int64_t>(v.size()), 1, 1, 1});
    if (std::string(name) != "w")
      d = ir::TensorData(ir::DType::kF32, {static_cast<int64_t>(v.size())});
    for (size_t i = 0; i < v.size(); ++i) d.as<float>()[i] = v[i];
    g.findValue(name)->setData(d);
  };
  set("w", {2, 3});
  set("scale", {1, 2});
  set("shift", {0.5, -1});
  set("mean", {1, 0});
  set("var", {4, 16});
  passes::PassContext ctx;
  auto pass = passes::createPass("batchnorm-folding");
  REQUIRE(pass);
  CHECK(pass->run(g, ctx));
  REQUIRE(ir::verify(g).isOk());
  const auto nodes = g.nodes();
  REQUIRE(nodes.size() == 2);
  CHECK(nodes[0]->op() == ir::OpKind::kConv2d);
  CHECK(nodes[1]->op() == ir::OpKind::kRelu);
  // Channel 0: s = 1/2 -> w' = 1, b' = (0 - 1) * 0.5 + 0.5 = 0. Channel 1: s = 2/4 -> w' = 1.5,
  // b' = 0 * 0.5 - 1 = -1.
  const ir::TensorData& w = nodes[0]->input(1)->data();
  const ir::TensorData& b = nodes[0]->input(2)->data();
  CHECK(w.as<float>()[0] == Approx(1.0));
  CHECK(w.as<float>()[1] == Approx(1.5));
  CHECK(b.as<float>()[0] == Approx(0.0).margin(1e-7));
  CHECK(b.as<float>()[1] == Approx(-1.0));
  CHECK_FALSE(pass->run(g, ctx));
}

TEST_CASE("batchnorm-folding keeps a batch_norm whose conv output is read elsewhere") {
  ir::Graph g = parse(R"(
graph g(%x : f32[1,2,3,3]) {
  param %w : f32[2,2,1,1]
  param %s : f32[2] buffer
  %c : f32[1,2,3,3] = conv2d(%x, %w)
  %b : f32[1,2,3,3] = batch_norm(%c, %s, %s, %s, %s)
  %y : f32[1,2,3,3] = add(%b, %c)
  return %y
})");
  for (const char* n : {"w", "s"}) {
    ir::Value* v = g.findValue(n);
    g.findValue(n)->setData(ir::TensorData(v->type().dtype, v->type().shape));
  }
  passes::PassContext ctx;
  CHECK_FALSE(passes::createPass("batchnorm-folding")->run(g, ctx));
}

TEST_CASE("fusion: every refusal is a decision that says illegal or unprofitable, and why") {
  ir::Graph g = parse(R"(
graph g(%x : f32[4,8], %w : f32[8,8]) {
  %a : f32[4,8] = relu(%x)
  %b : f32[4,8] = exp(%a)
  %c : f32[4,8] = neg(%b)
  %m : f32[4,1] = reduce_sum(%c) {axes=[1]}
  %y : f32[4,8] = linear(%c, %w)
  %z : f32[4,8] = add(%y, %x)
  return %m, %z
})");
  passes::FusionOptions small;
  small.maxNodesPerGroup = 2;  // relu and exp fill the kernel: neg is not worth it.
  small.libraryEpilogues = true;
  auto plan = passes::planFusion(g, small);
  int unprofitable = 0;
  for (const auto& r : plan.rejections) {
    INFO(r.reason);
    CHECK_FALSE(static_cast<bool>(r.decision));
    CHECK(r.reason == r.decision.explain());
    if (r.decision.verdict == passes::FusionDecision::Verdict::kUnprofitable) {
      ++unprofitable;
      CHECK_THAT(r.reason, Catch::StartsWith("not profitable: the kernel already has 2 nodes"));
    }
  }
  CHECK(unprofitable >= 1);
  CHECK_THAT(passes::explainFusion(plan), Catch::Contains("not profitable"));
}

TEST_CASE("fusion: a long recurrence fuses each step alike (the cycle checks skip earlier steps)") {
  // An unrolled recurrence (ONNX's LSTM is imported so): each step's state feeds the next
  // step's matmul. Every step's pointwise ops must be one kernel, the 300th as the 1st; the cycle
  // check of each step's join with the previous state must not search (and run out of its budget
  // on) the whole chain of earlier steps.
  const int steps = 300;
  std::string text =
      "graph g(%x : f32[4,8], %w : f32[8,8], %c0 : f32[4,8]) {\n"
      "  %h0 : f32[4,8] = relu(%x)\n";
  for (int s = 1; s <= steps; ++s) {
    const std::string k = std::to_string(s), p = std::to_string(s - 1);
    text += "  %m" + k + " : f32[4,8] = matmul(%h" + p + ", %w)\n";
    text += "  %i" + k + " : f32[4,8] = sigmoid(%m" + k + ")\n";
    text += "  %t" + k + " : f32[4,8] = tanh(%m" + k + ")\n";
    text += "  %c" + k + " : f32[4,8] = mul(%i" + k + ", %c" + p + ")\n";
    text += "  %k" + k + " : f32[4,8] = add(%c" + k + ", %t" + k + ")\n";
    text += "  %h" + k + " : f32[4,8] = mul(%k" + k + ", %i" + k + ")\n";
  }
  text += "  return %h" + std::to_string(steps) + ", %c" + std::to_string(steps) + "\n}\n";
  ir::Graph g = parse(text);
  auto plan = passes::planFusion(g);
  int pointwise = 0;
  for (const auto& group : plan.groups) {
    if (group.kind != passes::GroupKind::kPointwise ||
        group.nodes.front()->op() == ir::OpKind::kRelu)
      continue;
    ++pointwise;
    INFO("group " << group.id << " of " << plan.groups.size());
    CHECK(group.nodes.size() == 5);
  }
  CHECK(pointwise == steps);
}
