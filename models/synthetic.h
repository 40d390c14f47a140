// A learnable synthetic classification dataset for training without a download: every class
// has a fixed random pattern (from the seed) and an example is its class's pattern plus
// Gaussian noise of the same scale, so the classes are separable but not trivially.
#pragma once

#include <cstdint>

#include "ir/tensor_data.h"

namespace kiln::models {

struct SyntheticBatch {
  ir::TensorData x;       // f32, `inputShape` (the first dim is the batch).
  ir::TensorData labels;  // i64 [batch], uniform over the classes.
};

// Batch number `index` of the dataset `seed`: deterministic, and different for each index.
SyntheticBatch syntheticBatch(const ir::Shape& inputShape, int64_t classes, uint64_t seed,
                              uint64_t index, double noise = 1.0);

}  // namespace kiln::models
