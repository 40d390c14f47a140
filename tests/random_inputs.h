// Random inputs for a graph's f32 inputs, uniform in [-1, 1], seeded: the zoo tests' inputs.
#pragma once

#include <random>
#include <vector>

#include "ir/graph.h"
#include "runtime/tensor.h"

namespace kiln::testing {

inline std::vector<runtime::Tensor> randomInputs(const ir::Graph& g, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<runtime::Tensor> ins;
  for (const ir::Value* v : g.inputs()) {
    runtime::Tensor t = *runtime::Tensor::empty(v->type().dtype, v->type().shape);
    for (int64_t i = 0; i < t.numElements(); ++i) t.data<float>()[i] = dist(rng);
    ins.push_back(t);
  }
  return ins;
}

}  // namespace kiln::testing
