// The model zoo: reference models built with the C++ builder API (frontends/builder), with
// PyTorch's architectures, parameter names and parameter counts, looked up by name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace kiln::models {

struct ModelOptions {
  int64_t batch = 1;
  uint64_t seed = 0;  // Parameter initialization; the same seed gives bitwise-equal weights.
  // Image height and width for the models that take any (the ResNets); 0: the default (224).
  int64_t imageSize = 0;
};

struct ModelInfo {
  std::string name;         // "resnet50"
  std::string description;  // One line.
  std::string input;        // The graph input "input", e.g. "f32[N,3,224,224]".
};

// Every model's graph has one input named "input" and one output named "output", and passes
// ir::verify. An unknown name is a notFound error that lists the valid names.
Expected<ir::Graph> buildModel(std::string_view name, const ModelOptions& options = {});
std::vector<ModelInfo> listModels();

// What the `kiln` tool and the Python package take as MODEL: a zoo name ("resnet50", built at
// `batch` with weights from `seed`), a kiln JSON graph (".json") or an ONNX model (".onnx", an
// unnamed symbolic first dim taking `batch`). Errors name the file or list the zoo's names.
Expected<ir::Graph> loadModel(const std::string& model, int64_t batch = 1, uint64_t seed = 0);

// Checks options shared by every model (batch >= 1, an image size only where the model takes
// one); each family calls it first.
Status checkOptions(std::string_view model, const ModelOptions& options, bool anyImageSize = false);

// The families, one file each.
Expected<ir::Graph> buildMlp(const ModelOptions& options);        // mlp.cpp
Expected<ir::Graph> buildMnistCnn(const ModelOptions& options);   // mnist_cnn.cpp
Expected<ir::Graph> buildResNet18(const ModelOptions& options);   // resnet.cpp
Expected<ir::Graph> buildResNet50(const ModelOptions& options);   // resnet.cpp
Expected<ir::Graph> buildBertLayer(const ModelOptions& options);  // bert.cpp

}  // namespace kiln::models
