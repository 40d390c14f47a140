#include "models/synthetic.h"

#include <map>
#include <random>
#include <vector>

namespace kiln::models {

SyntheticBatch syntheticBatch(const ir::Shape& inputShape, int64_t classes, uint64_t seed,
                              uint64_t index, double noise) {
  const int64_t batch = inputShape.empty() ? 1 : inputShape[0];
  const int64_t features = batch > 0 ? ir::numElements(inputShape) / batch : 0;
  // Each class's pattern depends on the seed and the class only, and is drawn for the classes
  // in the batch alone (all of them for 1,000 classes of 3x224x224 were 600 MB a batch).
  std::map<int64_t, std::vector<float>> patterns;
  auto pattern = [&](int64_t c) -> const std::vector<float>& {
    auto [it, fresh] = patterns.try_emplace(c);
    if (fresh) {
      std::mt19937_64 patternRng(seed * 0x9E3779B97F4A7C15ull + 1 +
                                 static_cast<uint64_t>(c) * 0x94D049BB133111EBull);
      std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
      it->second.resize(static_cast<size_t>(features));
      for (float& v : it->second) v = uniform(patternRng);
    }
    return it->second;
  };

  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 2 + index * 0xBF58476D1CE4E5B9ull);
  std::normal_distribution<float> gauss(0.0f, static_cast<float>(noise));
  SyntheticBatch b{ir::TensorData(ir::DType::kF32, inputShape),
                   ir::TensorData(ir::DType::kI64, {batch})};
  for (int64_t n = 0; n < batch; ++n) {
    const int64_t c = static_cast<int64_t>(rng() % static_cast<uint64_t>(classes));
    b.labels.as<int64_t>()[n] = c;
    float* x = b.x.as<float>() + n * features;
    const float* p = pattern(c).data();
    for (int64_t f = 0; f < features; ++f) x[f] = p[f] + gauss(rng);
  }
  return b;
}

}  // namespace kiln::models
