// The builder API: module shapes and parameter names, PyTorch-default initialization from a
// deterministic per-parameter stream, sticky errors that name the module.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>

#include "frontends/builder/builder.h"
#include "ir/verifier.h"

using namespace kiln;
namespace nn = kiln::frontends::nn;

namespace {

const ir::Value& param(const ir::Graph& g, const std::string& name) {
  const ir::Value* v = g.findValue(name);
  REQUIRE(v != nullptr);
  REQUIRE(v->isParameter());
  return *v;
}

std::vector<float> values(const ir::Value& v) {
  const float* p = v.data().as<float>();
  return {p, p + v.data().numElements()};
}

std::vector<std::string> parameterNames(const ir::Graph& g) {
  std::vector<std::string> names;
  for (const ir::Value* p : g.parameters()) names.push_back(p->name());
  return names;
}

int countOps(const ir::Graph& g, ir::OpKind op) {
  int n = 0;
  for (const ir::Node* node : g.nodes()) n += node->op() == op;
  return n;
}

// A PyTorch-like two-layer module used by several tests.
struct TwoLayer : nn::Module {
  explicit TwoLayer(nn::Scope s, bool extraLayer = false)
      : Module(std::move(s), "TwoLayer"), fc1(child("fc1"), 8, 16), fc2(child("fc2"), 16, 4) {
    if (extraLayer) extra.emplace(child("extra"), 4, 4);
  }
  nn::Tensor operator()(nn::Tensor x) const {
    auto scope = enter();
    x = fc2(nn::relu(fc1(x)));
    return extra ? (*extra)(x) : x;
  }
  nn::Linear fc1, fc2;
  std::optional<nn::Linear> extra;
};

ir::Graph buildTwoLayer(uint64_t seed, bool extraLayer = false) {
  nn::Builder b("two_layer", seed);
  TwoLayer m(b.root(), extraLayer);
  auto g = b.finish(m(b.input("input", {2, 8})));
  REQUIRE(g.hasValue());
  return std::move(g).value();
}

}  // namespace

TEST_CASE("Rng streams are pinned, bit for bit") {
  // Golden values: a change here changes every model's weights on every machine.
  nn::Rng rng = nn::Rng::forStream(0, "fc1.weight");
  const uint64_t first = rng.nextU64();
  nn::Rng again = nn::Rng::forStream(0, "fc1.weight");
  CHECK(again.nextU64() == first);
  CHECK(nn::Rng::forStream(1, "fc1.weight").nextU64() != first);
  CHECK(nn::Rng::forStream(0, "fc1.bias").nextU64() != first);
  CHECK(nn::Rng(0).nextU64() == 0xe220a8397b1dcdafULL);  // splitmix64's reference output.

  std::vector<float> v(4);
  nn::Init::uniform(-1, 1).fill(v, 42, "w");
  uint32_t bits[4];
  std::memcpy(bits, v.data(), sizeof(bits));
  CHECK(bits[0] == 0xbeea6862u);  // -0.457827628
  CHECK(bits[1] == 0x3e00fe7cu);  // 0.125970781
  CHECK(bits[2] == 0x3f3304f1u);  // 0.69929415
  CHECK(bits[3] == 0xbe8488eeu);  // -0.258857191
  // A range not centred on 0 (the fma path): the same draws, mapped to [0, 1].
  std::vector<float> u(2);
  nn::Init::uniform(0, 1).fill(u, 42, "w");
  std::memcpy(bits, u.data(), 2 * sizeof(float));
  CHECK(bits[0] == 0x3e8acbcfu);  // 0.271086186
  CHECK(bits[1] == 0x3f101fd0u);  // 0.56298542
}

TEST_CASE("Rng symmetric draws lie strictly inside (-1, 1) with the uniform moments") {
  nn::Rng rng = nn::Rng::forStream(7, "stats");
  const int n = 200000;
  double sum = 0, sumSq = 0, lo = 1, hi = -1;
  for (int i = 0; i < n; ++i) {
    const double x = rng.nextSymmetric();
    sum += x;
    sumSq += x * x;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  CHECK(lo > -1.0);
  CHECK(hi < 1.0);
  CHECK(lo < -0.999);
  CHECK(hi > 0.999);
  CHECK(std::fabs(sum / n) < 0.01);
  CHECK(sumSq / n == Approx(1.0 / 3.0).epsilon(0.01));
}

TEST_CASE("Init fills constants and non-symmetric uniform ranges") {
  std::vector<float> v(1000);
  nn::Init::constant(0.25).fill(v, 0, "c");
  for (float x : v) REQUIRE(x == 0.25f);
  nn::Init::uniform(2.0, 3.0).fill(v, 0, "u");
  for (float x : v) {
    REQUIRE(x >= 2.0f);
    REQUIRE(x <= 3.0f);
  }
  const auto k = nn::Init::kaimingUniform(64);
  CHECK(k.low == -0.125);
  CHECK(k.high == 0.125);
}

TEST_CASE("Linear: PyTorch names, shapes, fan-in bounds and an output named 'output'") {
  ir::Graph g = buildTwoLayer(0);
  CHECK(ir::verify(g).isOk());
  CHECK(parameterNames(g) ==
        std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
  CHECK(g.numTrainableParameters() == 8 * 16 + 16 + 16 * 4 + 4);
  CHECK(param(g, "fc1.weight").type().shape == ir::Shape{16, 8});
  CHECK(param(g, "fc2.bias").type().shape == ir::Shape{4});
  REQUIRE(g.inputs().size() == 1);
  CHECK(g.inputs()[0]->name() == "input");
  REQUIRE(g.outputs().size() == 1);
  CHECK(g.outputs()[0]->name() == "output");
  CHECK(g.outputs()[0]->type().shape == ir::Shape{2, 4});
  // The output node keeps its module name; inner nodes are named after their module path.
  CHECK(g.outputs()[0]->producer()->name() == "fc2");
  CHECK(g.findValue("fc1") != nullptr);
  CHECK(g.findValue("relu") != nullptr);
  for (const char* name : {"fc1.weight", "fc1.bias"})
    for (float x : values(param(g, name))) REQUIRE(std::fabs(x) <= 1 / std::sqrt(8.0f));
  for (const char* name : {"fc2.weight", "fc2.bias"})
    for (float x : values(param(g, name))) REQUIRE(std::fabs(x) <= 1 / std::sqrt(16.0f));
}

TEST_CASE("a module named 'output' leaves the name to the graph output") {
  nn::Builder b("named_output", 0);
  nn::Linear output(b.root().child("output"), 3, 3);
  auto g = b.finish(nn::relu(output(b.input("input", {1, 3}))));
  REQUIRE(g.hasValue());
  CHECK(g->outputs()[0]->name() == "output");
  CHECK(g->outputs()[0]->producer()->op() == ir::OpKind::kRelu);
  CHECK(g->findValue("output_1")->producer()->name() == "output_1");
  CHECK(g->findValue("output.weight") != nullptr);
}

TEST_CASE("initialization is per (seed, name): deterministic and independent of other layers") {
  ir::Graph a = buildTwoLayer(5);
  ir::Graph b = buildTwoLayer(5);
  ir::Graph c = buildTwoLayer(6);
  ir::Graph withExtra = buildTwoLayer(5, /*extraLayer=*/true);
  for (const char* name : {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}) {
    CHECK(param(a, name).data().bitwiseEqual(param(b, name).data()));
    CHECK_FALSE(param(a, name).data().bitwiseEqual(param(c, name).data()));
    CHECK(param(a, name).data().bitwiseEqual(param(withExtra, name).data()));
  }
  // Same shape, different names: different values.
  CHECK_FALSE(values(param(a, "fc1.bias")) == values(param(a, "fc1.weight")));
}

TEST_CASE("Conv2d: stride, padding, dilation, groups and bias as in PyTorch") {
  nn::Builder b("conv", 0);
  nn::Conv2d conv(b.root().child("conv"), 8, 16, {3, 5},
                  {.stride = 2, .padding = {1, 2}, .dilation = {1, 2}, .groups = 4});
  nn::Conv2d noBias(b.root().child("pw"), 16, 4, 1, {.bias = false});
  nn::Tensor x = b.input("input", {2, 8, 17, 20});
  nn::Tensor y = conv(x);
  // PyTorch: out = floor((in + 2p - d(k-1) - 1) / s) + 1.
  CHECK(y.shape() == ir::Shape{2, 16, (17 + 2 - 2 - 1) / 2 + 1, (20 + 4 - 8 - 1) / 2 + 1});
  auto g = b.finish(noBias(y));
  REQUIRE(g.hasValue());
  CHECK(param(*g, "conv.weight").type().shape == ir::Shape{16, 2, 3, 5});
  CHECK(g->findValue("pw.bias") == nullptr);
  CHECK(g->numTrainableParameters() == 16 * 2 * 3 * 5 + 16 + 4 * 16);
  const float bound = 1 / std::sqrt(2.0f * 3 * 5);  // fan_in = in/groups * kh * kw
  float maxAbs = 0;
  for (float v : values(param(*g, "conv.weight"))) maxAbs = std::max(maxAbs, std::fabs(v));
  CHECK(maxAbs <= bound);
  CHECK(maxAbs > 0.9f * bound);
  const ir::Node* node = g->findValue("conv")->producer();
  CHECK(node->attr().getInts("strides") == std::vector<int64_t>{2, 2});
  CHECK(node->attr().getInts("pads") == std::vector<int64_t>{1, 2, 1, 2});
  CHECK(node->attr().getInts("dilations") == std::vector<int64_t>{1, 2});
  CHECK(node->attr().getInt("group") == 4);
}

TEST_CASE("BatchNorm2d and LayerNorm: defaults, buffers and epsilon") {
  nn::Builder b("norms", 3);
  nn::BatchNorm2d bn(b.root().child("bn1"), 4);
  nn::LayerNorm ln(b.root().child("ln"), {5}, 1e-12);
  auto g = b.finish(ln(bn(b.input("input", {1, 4, 3, 5}))));
  REQUIRE(g.hasValue());
  CHECK(parameterNames(*g) == std::vector<std::string>{"bn1.weight", "bn1.bias", "bn1.running_mean",
                                                       "bn1.running_var", "ln.weight", "ln.bias"});
  CHECK(param(*g, "bn1.weight").trainable());
  CHECK(param(*g, "bn1.bias").trainable());
  CHECK_FALSE(param(*g, "bn1.running_mean").trainable());
  CHECK_FALSE(param(*g, "bn1.running_var").trainable());
  CHECK(g->numTrainableParameters() == 4 + 4 + 5 + 5);
  CHECK(values(param(*g, "bn1.weight")) == std::vector<float>(4, 1.0f));
  CHECK(values(param(*g, "bn1.bias")) == std::vector<float>(4, 0.0f));
  CHECK(values(param(*g, "bn1.running_mean")) == std::vector<float>(4, 0.0f));
  CHECK(values(param(*g, "bn1.running_var")) == std::vector<float>(4, 1.0f));
  CHECK(values(param(*g, "ln.weight")) == std::vector<float>(5, 1.0f));
  CHECK(values(param(*g, "ln.bias")) == std::vector<float>(5, 0.0f));
  const ir::Node* lnNode = g->outputs()[0]->producer();
  CHECK(lnNode->op() == ir::OpKind::kLayerNorm);
  CHECK(lnNode->attr().getFloat("epsilon") == 1e-12);
  CHECK(lnNode->attr().getInt("axis") == 3);
  CHECK(g->findValue("bn1")->producer()->attr().getFloat("epsilon") == 1e-5);
}

TEST_CASE("Sequential names children by index, counting parameterless modules") {
  nn::Builder b("seq", 0);
  nn::Sequential seq(b.root());
  seq.add<nn::Linear>(4, 8);
  seq.add<nn::ReLU>();
  seq.add<nn::Dropout>(0.1);
  seq.add<nn::Linear>(8, 2, /*bias=*/false);
  CHECK(seq.size() == 4);
  auto g = b.finish(seq(b.input("input", {3, 4})));
  REQUIRE(g.hasValue());
  CHECK(parameterNames(*g) == std::vector<std::string>{"0.weight", "0.bias", "3.weight"});
  CHECK(g->findValue("1")->producer()->op() == ir::OpKind::kRelu);
  CHECK(g->findValue("2")->producer()->attr().getFloat("ratio") == 0.1);
  CHECK(g->outputs()[0]->type().shape == ir::Shape{3, 2});
}

TEST_CASE("pooling, flatten and the functional ops follow PyTorch's shapes") {
  nn::Builder b("pools", 0);
  nn::Tensor x = b.input("input", {2, 3, 112, 112});
  nn::MaxPool2d maxpool(b.root().child("maxpool"), 3, {.stride = 2, .padding = 1});
  nn::Tensor m = maxpool(x);
  CHECK(m.shape() == ir::Shape{2, 3, 56, 56});
  CHECK(nn::maxPool2d(x, 2).shape() == ir::Shape{2, 3, 56, 56});
  CHECK(nn::maxPool2d(x, 3, {.stride = 2, .ceilMode = true}).shape() == ir::Shape{2, 3, 56, 56});
  CHECK(nn::avgPool2d(x, 4).shape() == ir::Shape{2, 3, 28, 28});
  nn::AdaptiveAvgPool2d global(b.root().child("avgpool"), 1);
  nn::Tensor gp = global(m);
  CHECK(gp.shape() == ir::Shape{2, 3, 1, 1});
  CHECK(gp.value()->producer()->op() == ir::OpKind::kGlobalAvgPool);
  nn::Tensor a7 = nn::adaptiveAvgPool2d(m, 7);
  CHECK(a7.shape() == ir::Shape{2, 3, 7, 7});
  CHECK(a7.value()->producer()->attr().getInts("kernel") == std::vector<int64_t>{8, 8});
  CHECK(m.flatten(1).shape() == ir::Shape{2, 3 * 56 * 56});
  CHECK(m.flatten().shape() == ir::Shape{2 * 3 * 56 * 56});
  CHECK(m.flatten(2).shape() == ir::Shape{2, 3, 56 * 56});
  CHECK(m.flatten(1, 2).shape() == ir::Shape{2, 3 * 56, 56});
  CHECK(m.transpose(1, -1).shape() == ir::Shape{2, 56, 56, 3});
  CHECK(m.permute({0, 2, 3, 1}).shape() == ir::Shape{2, 56, 56, 3});
  CHECK(m.reshape({2, -1}).shape() == ir::Shape{2, 3 * 56 * 56});
  nn::Tensor s = nn::softmax(nn::gelu(m, "tanh") * 2.0, -1);
  CHECK(s.shape() == m.shape());
  CHECK(b.ok());
  auto g = b.finish(nn::logSoftmax(gp.flatten(1), 1));
  REQUIRE(g.hasValue());
  CHECK(g->outputs()[0]->type().shape == ir::Shape{2, 3});
  // Scalars become non-trainable constants that no state_dict key can collide with.
  const ir::Value* scalar = g->findValue("const:scalar");
  REQUIRE(scalar != nullptr);
  CHECK_FALSE(scalar->trainable());
  CHECK(scalar->data().as<float>()[0] == 2.0f);
}

TEST_CASE("MultiheadAttention: q/k/v/out projections and a scaled softmax attention") {
  nn::Builder b("mha", 0);
  nn::MultiheadAttention attn(b.root().child("attn"), 64, 4);
  nn::Tensor q = b.input("q", {2, 5, 64});
  nn::Tensor kv = b.input("kv", {2, 7, 64});
  nn::Tensor y = attn(q, kv, kv);
  CHECK(y.shape() == ir::Shape{2, 5, 64});
  auto g = b.finish(y);
  REQUIRE(g.hasValue());
  CHECK(parameterNames(*g) ==
        std::vector<std::string>{"attn.q_proj.weight", "attn.q_proj.bias", "attn.k_proj.weight",
                                 "attn.k_proj.bias", "attn.v_proj.weight", "attn.v_proj.bias",
                                 "attn.out_proj.weight", "attn.out_proj.bias", "const:attn.scale"});
  CHECK(g->numTrainableParameters() == 4 * (64 * 64 + 64));
  const auto nodes = g->nodes();
  CHECK(nodes[0]->name() == "attn.q_proj");
  CHECK(nodes[1]->name() == "attn.k_proj");
  CHECK(nodes[2]->name() == "attn.v_proj");
  CHECK(nodes.back()->name() == "attn.out_proj");
  CHECK(countOps(*g, ir::OpKind::kLinear) == 4);
  CHECK(countOps(*g, ir::OpKind::kMatMul) == 2);
  CHECK(countOps(*g, ir::OpKind::kSoftmax) == 1);
  CHECK(countOps(*g, ir::OpKind::kMul) == 1);
  CHECK(param(*g, "const:attn.scale").data().as<float>()[0] == 0.25f);  // 1/sqrt(64/4)
  CHECK(g->findValue("attn.softmax")->type().shape == ir::Shape{2, 4, 5, 7});
}

TEST_CASE("BasicBlock and Bottleneck build their downsample exactly when torchvision does") {
  nn::Builder b("blocks", 0);
  nn::BasicBlock same(b.root().child("a"), 64, 64);
  nn::BasicBlock strided(b.root().child("b"), 64, 128, 2);
  nn::Bottleneck widen(b.root().child("c"), 64, 64);
  nn::Bottleneck keep(b.root().child("d"), 256, 64);
  CHECK_FALSE(same.downsample.has_value());
  CHECK(strided.downsample.has_value());
  CHECK(widen.downsample.has_value());
  CHECK_FALSE(keep.downsample.has_value());
  nn::Tensor x = b.input("input", {1, 64, 16, 16});
  nn::Tensor y = keep(widen(same(x)));
  CHECK(y.shape() == ir::Shape{1, 256, 16, 16});
  CHECK(strided(same(x)).shape() == ir::Shape{1, 128, 8, 8});
  CHECK(b.ok());
  const ir::Graph& g = b.graph();
  CHECK(param(g, "b.downsample.0.weight").type().shape == ir::Shape{128, 64, 1, 1});
  CHECK(param(g, "b.downsample.1.running_var").type().shape == ir::Shape{128});
  CHECK(param(g, "c.conv3.weight").type().shape == ir::Shape{256, 64, 1, 1});
  CHECK(g.findValue("b.conv1.bias") == nullptr);
}

TEST_CASE("errors are sticky, name the module and surface from finish()") {
  SECTION("a Linear whose input has the wrong feature count") {
    nn::Builder b("bad", 0);
    TwoLayer m(b.root());
    nn::Tensor y = m(b.input("input", {2, 9}));
    CHECK_FALSE(y.valid());
    CHECK_FALSE(b.ok());
    auto g = b.finish(y);
    REQUIRE_FALSE(g.hasValue());
    CHECK(g.status().code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(g.status().message(), Catch::Contains("fc1 (Linear)"));
    CHECK_THAT(g.status().message(), Catch::Contains("[..., 8]"));
    CHECK_THAT(g.status().message(), Catch::Contains("f32[2,9]"));
  }
  SECTION("a Conv2d deep in the tree gets its full path") {
    nn::Builder b("bad", 0);
    nn::Sequential layer(b.root().child("layer1"));
    layer.add<nn::BasicBlock>(64, 64);
    nn::Tensor y = layer(b.input("input", {1, 32, 8, 8}));
    auto g = b.finish(y);
    REQUIRE_FALSE(g.hasValue());
    CHECK_THAT(g.status().message(), Catch::Contains("layer1.0.conv1 (Conv2d)"));
    CHECK_THAT(g.status().message(), Catch::Contains("[N, 64, H, W]"));
  }
  SECTION("an op failing inside a module names that module") {
    nn::Builder b("bad", 0);
    nn::Sequential seq(b.root().child("head"));
    seq.add<nn::MaxPool2d>(5);
    auto g = b.finish(seq(b.input("input", {1, 3, 4, 4})));
    REQUIRE_FALSE(g.hasValue());
    CHECK_THAT(g.status().message(), Catch::Contains("head.0 (MaxPool2d)"));
    CHECK_THAT(g.status().message(), Catch::Contains("max_pool2d"));
  }
  SECTION("a module option that does not fit") {
    nn::Builder b("bad", 0);
    nn::Conv2d conv(b.root().child("conv"), 6, 8, 3, {.groups = 4});
    CHECK_FALSE(conv.weight.valid());
    auto g = b.finish(conv(b.input("input", {1, 6, 8, 8})));
    REQUIRE_FALSE(g.hasValue());
    CHECK_THAT(g.status().message(), Catch::Contains("conv (Conv2d): groups 4 must divide"));
  }
  SECTION("the first error wins") {
    nn::Builder b("bad", 0);
    nn::Linear fc(b.root().child("fc"), 0, 3);
    nn::MultiheadAttention attn(b.root().child("attn"), 10, 3);
    auto g = b.finish(attn(b.input("input", {1, 2, 10})));
    REQUIRE_FALSE(g.hasValue());
    CHECK_THAT(g.status().message(), Catch::StartsWith("fc (Linear): in_features"));
  }
  SECTION("two parameters with one name") {
    nn::Builder b("bad", 0);
    nn::Linear a(b.root().child("fc"), 2, 3);
    nn::Linear again(b.root().child("fc"), 2, 3);
    auto g = b.finish(again(a(b.input("input", {1, 2}))));
    REQUIRE_FALSE(g.hasValue());
    CHECK_THAT(g.status().message(),
               Catch::StartsWith("fc (Linear): parameter 'fc.weight' already exists"));
  }
  SECTION("an output that is not the last op") {
    nn::Builder b("bad", 0);
    nn::Tensor x = b.input("input", {1, 2});
    nn::Tensor y = nn::relu(x);
    (void)nn::sigmoid(x);
    auto g = b.finish(y);
    REQUIRE_FALSE(g.hasValue());
    CHECK_THAT(g.status().message(), Catch::Contains("last op"));
  }
}
