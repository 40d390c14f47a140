// Whole-model checks across layers: every zoo model runs eagerly to finite outputs of the
// right shape, round-trips through the text IR exactly and through JSON + safetensors bitwise.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>

#include "frontends/json/graph_json.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "models/zoo.h"
#include "random_inputs.h"
#include "runtime/eager.h"

using namespace kiln;
using runtime::Tensor;

namespace {
const std::vector<std::string> kZoo = {"mlp", "mnist_cnn", "resnet18", "resnet50", "bert_layer"};

using testing::randomInputs;
}  // namespace

TEST_CASE("every zoo model runs eagerly to finite outputs of the right shape") {
  const std::map<std::string, ir::Shape> expected = {{"mlp", {2, 10}},
                                                     {"mnist_cnn", {2, 10}},
                                                     {"resnet18", {2, 1000}},
                                                     {"resnet50", {1, 1000}},
                                                     {"bert_layer", {1, 128, 768}}};
  for (const auto& name : kZoo) {
    DYNAMIC_SECTION(name) {
      const int64_t batch = expected.at(name)[0];
      auto g = models::buildModel(name, {batch, 7});
      REQUIRE(g.hasValue());
      runtime::EagerExecutor exec(*g);
      auto out = exec.run(randomInputs(*g, 1));
      REQUIRE(out.hasValue());
      REQUIRE(out->size() == 1);
      const Tensor& y = (*out)[0];
      CHECK(y.shape() == expected.at(name));
      bool finite = true;
      double sumAbs = 0;
      for (int64_t i = 0; i < y.numElements(); ++i) {
        finite = finite && std::isfinite(y.data<float>()[i]);
        sumAbs += std::fabs(y.data<float>()[i]);
      }
      CHECK(finite);
      CHECK(sumAbs > 0);  // Not an all-zero output.
      CHECK(exec.lastStats().peakActivationBytes > 0);
    }
  }
}

TEST_CASE("mnist_cnn's log_softmax output is a normalized distribution per sample") {
  auto g = models::buildModel("mnist_cnn", {3, 0});
  REQUIRE(g.hasValue());
  runtime::EagerExecutor exec(*g);
  auto out = exec.run(randomInputs(*g, 2));
  REQUIRE(out.hasValue());
  const float* p = (*out)[0].data<float>();
  for (int n = 0; n < 3; ++n) {
    double s = 0;
    for (int c = 0; c < 10; ++c) s += std::exp(static_cast<double>(p[n * 10 + c]));
    CHECK(s == Approx(1.0).epsilon(1e-5));
  }
}

TEST_CASE("every zoo model round-trips through the text IR exactly") {
  for (const auto& name : kZoo) {
    DYNAMIC_SECTION(name) {
      auto g = models::buildModel(name, {2, 0});
      REQUIRE(g.hasValue());
      const std::string text = ir::printGraph(*g);
      auto parsed = ir::parseGraph(text);
      REQUIRE(parsed.hasValue());
      CHECK(ir::verify(*parsed).isOk());
      CHECK(ir::printGraph(*parsed) == text);
      CHECK(parsed->numNodes() == g->numNodes());
      CHECK(parsed->numTrainableParameters() == g->numTrainableParameters());
    }
  }
}

TEST_CASE("zoo models round-trip through JSON + safetensors bitwise and run the same") {
  const auto dir = std::filesystem::temp_directory_path() / "kiln_zoo_json_roundtrip";
  std::filesystem::create_directories(dir);
  for (const std::string name : {"mlp", "mnist_cnn", "bert_layer"}) {
    DYNAMIC_SECTION(name) {
      auto g = models::buildModel(name, {1, 3});
      REQUIRE(g.hasValue());
      const std::string path = (dir / (name + ".json")).string();
      REQUIRE(frontends::saveGraphJson(*g, path).isOk());
      auto back = frontends::loadGraphJson(path);
      REQUIRE(back.hasValue());
      CHECK(ir::printGraph(*back) == ir::printGraph(*g));
      REQUIRE(back->parameters().size() == g->parameters().size());
      for (size_t i = 0; i < g->parameters().size(); ++i)
        CHECK(back->parameters()[i]->data().bitwiseEqual(g->parameters()[i]->data()));
      auto inputs = randomInputs(*g, 5);
      runtime::EagerExecutor a(*g), b(*back);
      auto ya = a.run(inputs);
      auto yb = b.run(inputs);
      REQUIRE(ya.hasValue());
      REQUIRE(yb.hasValue());
      CHECK(std::memcmp((*ya)[0].rawData(), (*yb)[0].rawData(), (*ya)[0].byteSize()) == 0);
    }
  }
  std::filesystem::remove_all(dir);
}
