// The model zoo against PyTorch: parameter counts, state_dict names and order, output shapes,
// architecture details (v1.5 strides, BERT's epsilon and GELU), initialization, work counts.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <set>

#include "frontends/builder/builder.h"
#include "ir/flops.h"
#include "ir/verifier.h"
#include "models/zoo.h"

using namespace kiln;

namespace {

ir::Graph build(const std::string& name, int64_t batch = 1, uint64_t seed = 0) {
  auto g = models::buildModel(name, {batch, seed});
  INFO(name << ": " << g.status().message());
  REQUIRE(g.hasValue());
  return std::move(g).value();
}

const ir::Value& param(const ir::Graph& g, const std::string& name) {
  const ir::Value* v = g.findValue(name);
  INFO(name);
  REQUIRE(v != nullptr);
  REQUIRE(v->isParameter());
  return *v;
}

// The graph's parameter names minus builder constants: the state_dict keys it covers.
std::vector<std::string> stateDictNames(const ir::Graph& g) {
  std::vector<std::string> names;
  for (const ir::Value* p : g.parameters())
    if (!p->name().starts_with(frontends::nn::kConstantPrefix)) names.push_back(p->name());
  return names;
}

std::vector<ir::OpKind> opSequence(const ir::Graph& g) {
  std::vector<ir::OpKind> ops;
  for (const ir::Node* n : g.nodes()) ops.push_back(n->op());
  return ops;
}

int countOps(const ir::Graph& g, ir::OpKind op) {
  int n = 0;
  for (const ir::Node* node : g.nodes()) n += node->op() == op;
  return n;
}

// torchvision.models.resnet's state_dict keys in registration order, without the
// num_batches_tracked counters (which the graph leaves out, see BatchNorm2d).
std::vector<std::string> torchvisionResNetKeys(bool bottleneck, std::vector<int> layers) {
  std::vector<std::string> keys;
  auto bn = [&](const std::string& p) {
    for (const char* leaf : {"weight", "bias", "running_mean", "running_var"})
      keys.push_back(p + "." + leaf);
  };
  keys.push_back("conv1.weight");
  bn("bn1");
  const int expansion = bottleneck ? 4 : 1;
  int inplanes = 64;
  for (int l = 0; l < 4; ++l) {
    const int planes = 64 << l;
    for (int i = 0; i < layers[l]; ++i) {
      const std::string p = "layer" + std::to_string(l + 1) + "." + std::to_string(i) + ".";
      for (int c = 1; c <= (bottleneck ? 3 : 2); ++c) {
        keys.push_back(p + "conv" + std::to_string(c) + ".weight");
        bn(p + "bn" + std::to_string(c));
      }
      const int stride = (l > 0 && i == 0) ? 2 : 1;
      if (i == 0 && (stride != 1 || inplanes != planes * expansion)) {
        keys.push_back(p + "downsample.0.weight");
        bn(p + "downsample.1");
      }
      inplanes = planes * expansion;
    }
  }
  keys.push_back("fc.weight");
  keys.push_back("fc.bias");
  return keys;
}

}  // namespace

TEST_CASE("trainable parameter counts equal PyTorch's exactly") {
  // Computed by hand for BERT: 4 (768x768 + 768) projections, 2 LayerNorms of 2x768,
  // 768x3072 + 3072 and 3072x768 + 768 for the FFN.
  const int64_t bert = 4 * (768 * 768 + 768) + 2 * 2 * 768 + 768 * 3072 + 3072 + 3072 * 768 + 768;
  CHECK(bert == 7087872);
  const std::map<std::string, int64_t> expected = {{"resnet18", 11689512},
                                                   {"resnet50", 25557032},
                                                   {"mnist_cnn", 1199882},
                                                   {"mlp", 535818},
                                                   {"bert_layer", bert}};
  for (const auto& [name, count] : expected) {
    INFO(name);
    CHECK(build(name).numTrainableParameters() == count);
  }
}

TEST_CASE("every model verifies, with one input 'input' and one output 'output' per batch") {
  const std::map<std::string, std::pair<ir::Shape, ir::Shape>> shapes = {
      {"mlp", {{784}, {10}}},
      {"mnist_cnn", {{1, 28, 28}, {10}}},
      {"resnet18", {{3, 224, 224}, {1000}}},
      {"resnet50", {{3, 224, 224}, {1000}}},
      {"bert_layer", {{128, 768}, {128, 768}}}};
  REQUIRE(models::listModels().size() == shapes.size());
  for (const auto& info : models::listModels()) {
    REQUIRE(shapes.count(info.name));
    for (int64_t batch : {1, 4}) {
      INFO(info.name << " batch " << batch);
      ir::Graph g = build(info.name, batch);
      CHECK(ir::verify(g).isOk());
      CHECK(g.name() == info.name);
      REQUIRE(g.inputs().size() == 1);
      REQUIRE(g.outputs().size() == 1);
      ir::Shape in = shapes.at(info.name).first, out = shapes.at(info.name).second;
      in.insert(in.begin(), batch);
      out.insert(out.begin(), batch);
      CHECK(g.inputs()[0]->name() == "input");
      CHECK(g.inputs()[0]->type() == ir::TensorType{ir::DType::kF32, in});
      CHECK(g.outputs()[0]->name() == "output");
      CHECK(g.outputs()[0]->type() == ir::TensorType{ir::DType::kF32, out});
      // The description's input shape matches the graph's.
      CHECK(info.input == "f32" + ir::shapeToString(shapes.at(info.name).first).insert(1, "N,"));
      CHECK_FALSE(info.description.empty());
      // Every parameter is read by some node.
      for (const ir::Value* p : g.parameters()) CHECK_FALSE(p->users().empty());
    }
  }
}

TEST_CASE("resnet parameter names and order equal torchvision's state_dict") {
  ir::Graph r18 = build("resnet18");
  ir::Graph r50 = build("resnet50");
  CHECK(stateDictNames(r18) == torchvisionResNetKeys(false, {2, 2, 2, 2}));
  CHECK(stateDictNames(r50) == torchvisionResNetKeys(true, {3, 4, 6, 3}));
  // torchvision's state_dicts have 122 and 320 keys, one num_batches_tracked per BatchNorm.
  CHECK(stateDictNames(r18).size() + 20 == 122);
  CHECK(stateDictNames(r50).size() + 53 == 320);
  CHECK(r18.parameters().size() == stateDictNames(r18).size());  // No constants in ResNets.

  CHECK(param(r50, "layer4.1.bn2.running_var").type().shape == ir::Shape{512});
  CHECK_FALSE(param(r50, "layer4.1.bn2.running_var").trainable());
  CHECK(param(r50, "layer2.0.downsample.0.weight").type().shape == ir::Shape{512, 256, 1, 1});
  CHECK(param(r50, "layer1.0.downsample.1.running_mean").type().shape == ir::Shape{256});
  CHECK(param(r50, "layer3.5.conv3.weight").type().shape == ir::Shape{1024, 256, 1, 1});
  CHECK(param(r50, "fc.weight").type().shape == ir::Shape{1000, 2048});
  CHECK(param(r18, "layer4.1.bn2.running_var").type().shape == ir::Shape{512});
  CHECK(param(r18, "layer2.0.downsample.0.weight").type().shape == ir::Shape{128, 64, 1, 1});
  CHECK(param(r18, "layer3.1.conv2.weight").type().shape == ir::Shape{256, 256, 3, 3});
  CHECK(param(r18, "fc.weight").type().shape == ir::Shape{1000, 512});
  CHECK(r18.findValue("layer1.0.downsample.0.weight") == nullptr);
  CHECK(r18.findValue("conv1.bias") == nullptr);
}

TEST_CASE("resnet follows torchvision's architecture (v1.5 strides, stem, head)") {
  ir::Graph g = build("resnet50");
  auto attrs = [&](const std::string& value) { return g.findValue(value)->producer()->attr(); };
  using V = std::vector<int64_t>;
  CHECK(attrs("conv1").getInts("strides") == V{2, 2});
  CHECK(attrs("conv1").getInts("pads") == V{3, 3, 3, 3});
  CHECK(attrs("maxpool").getInts("kernel") == V{3, 3});
  CHECK(attrs("maxpool").getInts("strides") == V{2, 2});
  CHECK(attrs("maxpool").getInts("pads") == V{1, 1, 1, 1});
  // v1.5: the 3x3 conv strides, the 1x1 convs do not.
  CHECK(attrs("layer2.0.conv1").getInts("strides") == V{1, 1});
  CHECK(attrs("layer2.0.conv2").getInts("strides") == V{2, 2});
  CHECK(attrs("layer2.0.downsample.0").getInts("strides") == V{2, 2});
  CHECK(g.findValue("layer2.0.conv2")->type().shape == ir::Shape{1, 128, 28, 28});
  CHECK(g.findValue("layer4.2.relu_2")->type().shape == ir::Shape{1, 2048, 7, 7});
  CHECK(g.findValue("avgpool")->producer()->op() == ir::OpKind::kGlobalAvgPool);
  CHECK(countOps(g, ir::OpKind::kConv2d) == 53);
  CHECK(countOps(g, ir::OpKind::kBatchNorm) == 53);
  CHECK(countOps(g, ir::OpKind::kAdd) == 16);
  CHECK(countOps(g, ir::OpKind::kRelu) == 1 + 16 * 3);
  CHECK(countOps(g, ir::OpKind::kLinear) == 1);
  CHECK(g.outputs()[0]->producer()->name() == "fc");
  ir::Graph r18 = build("resnet18");
  CHECK(countOps(r18, ir::OpKind::kConv2d) == 20);
  CHECK(countOps(r18, ir::OpKind::kAdd) == 8);
}

TEST_CASE("multiply-accumulates match torchvision's published GFLOPs") {
  const double r50 = static_cast<double>(ir::countWork(build("resnet50")).macs);
  const double r18 = static_cast<double>(ir::countWork(build("resnet18")).macs);
  CHECK(r50 >= 4.0e9);
  CHECK(r50 <= 4.2e9);  // torchvision: 4.09
  CHECK(r18 >= 1.75e9);
  CHECK(r18 <= 1.9e9);  // torchvision: 1.81
  CHECK(ir::countWork(build("resnet18", 4)).macs == 4 * static_cast<int64_t>(r18));
}

TEST_CASE("mnist_cnn is pytorch/examples' Net, op for op") {
  ir::Graph g = build("mnist_cnn");
  using K = ir::OpKind;
  CHECK(opSequence(g) == std::vector<K>{K::kConv2d, K::kRelu, K::kConv2d, K::kRelu, K::kMaxPool2d,
                                        K::kDropout, K::kFlatten, K::kLinear, K::kRelu, K::kDropout,
                                        K::kLinear, K::kLogSoftmax});
  CHECK(stateDictNames(g) == std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight",
                                                      "conv2.bias", "fc1.weight", "fc1.bias",
                                                      "fc2.weight", "fc2.bias"});
  CHECK(param(g, "conv2.weight").type().shape == ir::Shape{64, 32, 3, 3});
  CHECK(param(g, "fc1.weight").type().shape == ir::Shape{128, 9216});
  CHECK(g.findValue("dropout1")->producer()->attr().getFloat("ratio") == 0.25);
  CHECK(g.findValue("dropout2")->producer()->attr().getFloat("ratio") == 0.5);
  CHECK(g.findValue("max_pool2d")->type().shape == ir::Shape{1, 64, 12, 12});
  CHECK(g.outputs()[0]->producer()->attr().getInt("axis") == 1);
}

TEST_CASE("mlp is 784-512-256-10 with ReLU") {
  ir::Graph g = build("mlp");
  using K = ir::OpKind;
  CHECK(opSequence(g) == std::vector<K>{K::kLinear, K::kRelu, K::kLinear, K::kRelu, K::kLinear});
  CHECK(param(g, "fc1.weight").type().shape == ir::Shape{512, 784});
  CHECK(param(g, "fc2.weight").type().shape == ir::Shape{256, 512});
  CHECK(param(g, "fc3.weight").type().shape == ir::Shape{10, 256});
}

TEST_CASE("bert_layer is HuggingFace's BertLayer for bert-base") {
  ir::Graph g = build("bert_layer", 2);
  CHECK(stateDictNames(g) ==
        std::vector<std::string>{
            "attention.self.query.weight", "attention.self.query.bias", "attention.self.key.weight",
            "attention.self.key.bias", "attention.self.value.weight", "attention.self.value.bias",
            "attention.output.dense.weight", "attention.output.dense.bias",
            "attention.output.LayerNorm.weight", "attention.output.LayerNorm.bias",
            "intermediate.dense.weight", "intermediate.dense.bias", "output.dense.weight",
            "output.dense.bias", "output.LayerNorm.weight", "output.LayerNorm.bias"});
  // Nodes follow the forward's statement order (query, key, value), whatever order a compiler
  // evaluates function arguments in.
  const auto nodes = g.nodes();
  REQUIRE(nodes.size() > 3);
  CHECK(nodes[0]->name() == "attention.self.query");
  CHECK(nodes[1]->name() == "attention.self.key");
  CHECK(nodes[2]->name() == "attention.self.value");
  CHECK(param(g, "intermediate.dense.weight").type().shape == ir::Shape{3072, 768});
  CHECK(param(g, "output.dense.weight").type().shape == ir::Shape{768, 3072});
  CHECK(param(g, "const:attention.self.scale").data().as<float>()[0] == 0.125f);
  CHECK(countOps(g, ir::OpKind::kLinear) == 6);
  CHECK(countOps(g, ir::OpKind::kMatMul) == 2);
  CHECK(countOps(g, ir::OpKind::kSoftmax) == 1);
  CHECK(countOps(g, ir::OpKind::kLayerNorm) == 2);
  CHECK(countOps(g, ir::OpKind::kAdd) == 2);
  for (const ir::Node* n : g.nodes()) {
    if (n->op() == ir::OpKind::kLayerNorm) {
      CHECK(n->attr().getFloat("epsilon") == 1e-12);
      CHECK(n->attr().getInt("axis") == 2);
    }
    if (n->op() == ir::OpKind::kGelu) CHECK(n->attr().getString("approximate") == "none");
    if (n->op() == ir::OpKind::kDropout) CHECK(n->attr().getFloat("ratio") == 0.1);
  }
  CHECK(countOps(g, ir::OpKind::kGelu) == 1);
  CHECK(g.findValue("attention.self.softmax")->type().shape == ir::Shape{2, 12, 128, 128});
  // Post-LayerNorm: the output is the second LayerNorm, fed by the residual sum.
  const ir::Node* out = g.outputs()[0]->producer();
  CHECK(out->op() == ir::OpKind::kLayerNorm);
  CHECK(out->name() == "output.LayerNorm");
  CHECK(out->input(0)->producer()->op() == ir::OpKind::kAdd);
}

TEST_CASE("initialization is deterministic per seed and differs across seeds") {
  ir::Graph a = build("resnet18", 1, 11);
  ir::Graph b = build("resnet18", 4, 11);  // The batch does not change the weights.
  ir::Graph c = build("resnet18", 1, 12);
  REQUIRE(a.parameters().size() == b.parameters().size());
  REQUIRE(a.parameters().size() == c.parameters().size());
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    const ir::Value* pa = a.parameters()[i];
    INFO(pa->name());
    CHECK(pa->data().bitwiseEqual(b.parameters()[i]->data()));
    const bool random = pa->name().ends_with("conv1.weight") ||
                        pa->name().ends_with("conv2.weight") || pa->name().starts_with("fc.");
    if (random) CHECK_FALSE(pa->data().bitwiseEqual(c.parameters()[i]->data()));
  }
  for (const char* name : {"mlp", "mnist_cnn", "bert_layer"}) {
    ir::Graph x = build(name, 1, 3), y = build(name, 1, 3), z = build(name, 1, 4);
    for (size_t i = 0; i < x.parameters().size(); ++i)
      CHECK(x.parameters()[i]->data().bitwiseEqual(y.parameters()[i]->data()));
    CHECK_FALSE(x.parameters()[0]->data().bitwiseEqual(z.parameters()[0]->data()));
  }
}

TEST_CASE("weights and biases lie within +-1/sqrt(fan_in); norms start at PyTorch's defaults") {
  for (const char* name : {"resnet18", "resnet50", "mnist_cnn", "mlp", "bert_layer"}) {
    INFO(name);
    ir::Graph g = build(name);
    int checked = 0;
    for (const ir::Node* n : g.nodes()) {
      if (n->op() == ir::OpKind::kConv2d || n->op() == ir::OpKind::kLinear) {
        const ir::TensorData& w = n->input(1)->data();
        const int64_t fanIn = w.numElements() / w.shape()[0];
        const float bound = static_cast<float>(1.0 / std::sqrt(static_cast<double>(fanIn)));
        for (size_t i = 1; i < n->numInputs(); ++i) {
          const ir::TensorData& t = n->input(i)->data();
          float maxAbs = 0;
          double sum = 0;
          for (int64_t j = 0; j < t.numElements(); ++j) {
            maxAbs = std::max(maxAbs, std::fabs(t.as<float>()[j]));
            sum += t.as<float>()[j];
          }
          INFO(n->input(i)->name());
          CHECK(maxAbs <= bound);
          if (t.numElements() >= 1000) {
            CHECK(maxAbs > 0.99f * bound);  // Uniform over the whole range, not narrower.
            CHECK(std::fabs(sum / static_cast<double>(t.numElements())) < 0.05 * bound);
          }
          ++checked;
        }
      }
      auto all = [&](size_t i, float v) {
        const ir::TensorData& t = n->input(i)->data();
        for (int64_t j = 0; j < t.numElements(); ++j)
          if (t.as<float>()[j] != v) return false;
        return true;
      };
      if (n->op() == ir::OpKind::kBatchNorm) {
        CHECK(all(1, 1.0f));
        CHECK(all(2, 0.0f));
        CHECK(all(3, 0.0f));
        CHECK(all(4, 1.0f));
        CHECK(n->input(1)->trainable());
        CHECK_FALSE(n->input(3)->trainable());
        CHECK(n->attr().getFloat("epsilon") == 1e-5);
      }
      if (n->op() == ir::OpKind::kLayerNorm) {
        CHECK(all(1, 1.0f));
        CHECK(all(2, 0.0f));
      }
    }
    CHECK(checked > 0);
  }
}

TEST_CASE("an unknown model name is notFound and lists the valid names") {
  auto g = models::buildModel("resnet34", {});
  REQUIRE_FALSE(g.hasValue());
  CHECK(g.status().code() == ErrorCode::kNotFound);
  CHECK_THAT(g.status().message(), Catch::Contains("resnet34"));
  for (const auto& info : models::listModels())
    CHECK_THAT(g.status().message(), Catch::Contains(info.name));
  auto bad = models::buildModel("mlp", {.batch = 0});
  REQUIRE_FALSE(bad.hasValue());
  CHECK(bad.status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(bad.status().message(), Catch::Contains("batch"));
  std::set<std::string> names;
  for (const auto& info : models::listModels()) names.insert(info.name);
  CHECK(names == std::set<std::string>{"mlp", "mnist_cnn", "resnet18", "resnet50", "bert_layer"});
}
