#include "models/zoo.h"

#include <array>
#include <filesystem>

#include "frontends/json/graph_json.h"
#include "frontends/onnx/onnx_import.h"

namespace kiln::models {

namespace {

struct Entry {
  std::string_view name;
  std::string_view description;
  std::string_view input;
  Expected<ir::Graph> (*build)(const ModelOptions&);
};

// The registry: one line per model, in the order `kiln` lists them.
constexpr std::array<Entry, 5> kModels = {{
    {"mlp", "MLP 784-512-256-10 with ReLU (MNIST-sized)", "f32[N,784]", buildMlp},
    {"mnist_cnn", "pytorch/examples MNIST Net: 2 convs, max-pool, dropout, 2 linears",
     "f32[N,1,28,28]", buildMnistCnn},
    {"resnet18", "torchvision ResNet-18 (BasicBlock [2,2,2,2], 1000 classes)", "f32[N,3,224,224]",
     buildResNet18},
    {"resnet50", "torchvision ResNet-50 v1.5 (Bottleneck [3,4,6,3], 1000 classes)",
     "f32[N,3,224,224]", buildResNet50},
    {"bert_layer", "one BERT-base encoder layer (hidden 768, 12 heads, FFN 3072, GELU)",
     "f32[N,128,768]", buildBertLayer},
}};

std::string validNames() {
  std::string s;
  for (const Entry& e : kModels) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

}  // namespace

Status checkOptions(std::string_view model, const ModelOptions& options, bool anyImageSize) {
  if (options.batch < 1)
    return invalidArgument("model '" + std::string(model) + "': batch must be >= 1, got " +
                           std::to_string(options.batch));
  if (options.imageSize != 0 && !anyImageSize)
    return invalidArgument("model '" + std::string(model) +
                           "' has a fixed input size; an image size applies to the ResNets only");
  if (options.imageSize < 0 || (anyImageSize && options.imageSize != 0 && options.imageSize < 32))
    return invalidArgument("model '" + std::string(model) +
                           "': the image size must be >= 32, got " +
                           std::to_string(options.imageSize));
  return Status::ok();
}

Expected<ir::Graph> buildModel(std::string_view name, const ModelOptions& options) {
  for (const Entry& e : kModels) {
    if (e.name == name) return e.build(options);
  }
  return notFound("unknown model '" + std::string(name) + "'; valid models: " + validNames());
}

std::vector<ModelInfo> listModels() {
  std::vector<ModelInfo> out;
  out.reserve(kModels.size());
  for (const Entry& e : kModels)
    out.push_back({std::string(e.name), std::string(e.description), std::string(e.input)});
  return out;
}

Expected<ir::Graph> loadModel(const std::string& model, int64_t batch, uint64_t seed) {
  namespace fs = std::filesystem;
  const bool looksLikeFile = model.find('/') != std::string::npos ||
                             model.find('.') != std::string::npos || fs::exists(model);
  if (!looksLikeFile) return buildModel(model, {batch, seed});
  const std::string ext = fs::path(model).extension().string();
  if (ext == ".json") return frontends::loadGraphJson(model);
  if (ext == ".onnx")
    return frontends::loadOnnx(model, {.dimValues = {}, .defaultBatch = batch, .inputValues = {}});
  if (!fs::exists(model))
    return notFound("'" + model + "' is neither a zoo model nor an existing file");
  return invalidArgument(model + ": unknown model file type '" + ext +
                         "' (expected a zoo name, a .json kiln graph or an .onnx model)");
}

}  // namespace kiln::models
