// Training-mode dropout's mask (dropout_train, dropout_backward: ir/ops.def): element i of a run
// at `step` is kept when 24 bits of a counter-based hash of (seed, step, offset + i) reach the
// threshold of `ratio`, and kept elements are scaled by 1 / (1 - ratio). The definition every
// executor computes: the reference kernels (runtime/reference/pointwise.cpp) call these, and
// the CUDA op kernel (codegen/op_kernels.cpp) prints the same arithmetic, so that eager,
// compiled and device runs draw the same masks.
#pragma once

#include <cmath>
#include <cstdint>

namespace kiln::ir::dropout {

inline constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;    // Multiplies seeds and indices.
inline constexpr uint64_t kStepSalt = 0x632be59bd9b4e019ull;  // Added to the step.

inline constexpr uint64_t kMix1 = 0xbf58476d1ce4e5b9ull;  // splitmix64's finalizer's
inline constexpr uint64_t kMix2 = 0x94d049bb133111ebull;  // multipliers.

// splitmix64's finalizer.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * kMix1;
  z = (z ^ (z >> 27)) * kMix2;
  return z ^ (z >> 31);
}
// The hash base of one run.
constexpr uint64_t base(uint64_t seed, uint64_t step) {
  return mix64(seed * kGolden + mix64(step + kStepSalt));
}
// Element i's 24 random bits (offset: the element's place in the global batch).
constexpr uint64_t bits(uint64_t base, uint64_t offset, uint64_t i) {
  return mix64(base + (offset + i) * kGolden) >> 40;
}
// Kept where bits(...) >= threshold: 24 random bits against the ratio, as a float compares them.
inline uint64_t threshold(double ratio) {
  return static_cast<uint64_t>(std::ceil(ratio * double(1u << 24)));
}

}  // namespace kiln::ir::dropout
