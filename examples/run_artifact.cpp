// Embedding kiln: load an ahead-of-time artifact and run it. Links kiln's runtime library only
// (no Clang, no NVRTC, no ONNX or JSON frontends): everything the model needs is in the file.
//   kiln compile resnet18 -o resnet18.kiln
//   run_artifact resnet18.kiln [input.npy-free: seeded inputs]
#include <cstdio>
#include <random>
#include <vector>

#include "runtime/artifact.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: run_artifact MODEL.kiln\n");
    return 2;
  }
  auto model = kiln::load(argv[1]);
  if (!model) {
    std::fprintf(stderr, "run_artifact: %s\n", model.status().message().c_str());
    return model.status().isUserError() ? 2 : 1;
  }
  const kiln::runtime::ArtifactInfo& info = (*model)->info();

  // Inputs of the compiled signature, seeded.
  std::vector<kiln::runtime::Tensor> inputs;
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (const auto& type : info.inputs) {
    auto x = kiln::runtime::Tensor::zeros(type.dtype, type.shape);
    if (!x) return 1;
    if (type.dtype == kiln::ir::DType::kF32)
      for (int64_t i = 0; i < x->numElements(); ++i) x->data<float>()[i] = dist(rng);
    inputs.push_back(std::move(*x));
  }

  auto outputs = (*model)->run(inputs);
  if (!outputs) {
    std::fprintf(stderr, "run_artifact: %s\n", outputs.status().message().c_str());
    return 1;
  }
  std::printf("%s: loaded in %.2f ms, ran in %.2f ms\n", info.modelName.c_str(), (*model)->loadMs(),
              (*model)->lastStats().totalMs);
  for (size_t i = 0; i < outputs->size(); ++i) {
    const auto& y = (*outputs)[i];
    double sum = 0;
    if (y.dtype() == kiln::ir::DType::kF32)
      for (int64_t k = 0; k < y.numElements(); ++k) sum += y.data<float>()[k];
    std::printf("%%%s : %s  sum %.6g\n", info.outputNames[i].c_str(), y.type().toString().c_str(),
                sum);
  }
  return 0;
}
