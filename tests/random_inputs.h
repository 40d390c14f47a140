// Random inputs for a graph's float inputs (f32, f64, f16, bf16), uniform in [-1, 1], seeded:
// the zoo tests' inputs.
#pragma once

#include <random>
#include <vector>

#include "ir/graph.h"
#include "runtime/reference/helpers.h"
#include "runtime/tensor.h"

namespace kiln::testing {

inline std::vector<runtime::Tensor> randomInputs(const ir::Graph& g, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<runtime::Tensor> ins;
  for (const ir::Value* v : g.inputs()) {
    runtime::Tensor t = *runtime::Tensor::empty(v->type().dtype, v->type().shape);
    // Integer inputs (token ids, indices) take 0..3, valid for any axis of four or more.
    for (int64_t i = 0; i < t.numElements(); ++i) {
      if (v->type().dtype == ir::DType::kF32)
        t.data<float>()[i] = dist(rng);
      else if (v->type().dtype == ir::DType::kI64)
        t.data<int64_t>()[i] = static_cast<int64_t>(rng() % 4);
      else if (v->type().dtype == ir::DType::kI32)
        t.data<int32_t>()[i] = static_cast<int32_t>(rng() % 4);
      else if (v->type().dtype == ir::DType::kBool)
        t.data<bool>()[i] = (rng() & 1) != 0;
      else if (v->type().dtype == ir::DType::kBF16)
        t.data<uint16_t>()[i] = runtime::ref::doubleToBf16Bits(dist(rng));
      else if (v->type().dtype == ir::DType::kF16)
        t.data<uint16_t>()[i] = runtime::ref::doubleToF16Bits(dist(rng));
      else if (v->type().dtype == ir::DType::kF64)
        t.data<double>()[i] = dist(rng);
      // Other dtypes stay as Tensor::empty made them.
    }
    ins.push_back(t);
  }
  return ins;
}

// Gives every f32 parameter of `g` (a parsed text graph's, which hold no bytes) seeded values,
// uniform in [-scale, scale).
inline void randomParameters(ir::Graph& g, uint64_t seed, float scale = 1.f) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> dist(-scale, scale);
  for (ir::Value* p : g.parameters()) {
    if (p->type().dtype != ir::DType::kF32) continue;
    ir::TensorData d(ir::DType::kF32, p->type().shape);
    for (int64_t i = 0; i < d.numElements(); ++i) d.as<float>()[i] = dist(rng);
    p->setData(d);
  }
}

}  // namespace kiln::testing
