// Deterministic parameter initialization: a small splitmix64 generator and the initializers
// (constant, uniform, PyTorch's kaiming-uniform default) the builder fills parameters with.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace kiln::frontends::nn {

// splitmix64 (Steele, Lea, Flood 2014): 64 bits of state, one add and a bijective mixer per
// draw. Only integer arithmetic and exact float conversions are used, so a stream is
// bit-identical on every compiler and machine.
class Rng {
 public:
  explicit Rng(uint64_t state) : state_(state) {}

  // The stream of one named parameter. Each (seed, name) pair gets its own stream, so adding,
  // removing or reordering other parameters never changes this one's values.
  static Rng forStream(uint64_t seed, std::string_view name);

  uint64_t nextU64();
  // Uniform on the open interval (-1, 1): (2k + 1 - 2^24) / 2^24 for a uniform 24-bit k.
  // Symmetric around 0 and exact in both float and double.
  double nextSymmetric();

 private:
  uint64_t state_;
};

// How a parameter's values are chosen.
struct Init {
  enum class Kind { kConstant, kUniform };
  Kind kind = Kind::kConstant;
  double low = 0;   // kConstant: the value.
  double high = 0;  // kUniform: values lie in [low, high].

  static Init constant(double value) { return {Kind::kConstant, value, value}; }
  static Init uniform(double low, double high) { return {Kind::kUniform, low, high}; }
  // PyTorch's default for nn.Linear / nn.Conv2d weights (kaiming_uniform_ with a = sqrt(5))
  // and biases: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  static Init kaimingUniform(int64_t fanIn);

  // Fills `out` from the stream of (seed, name).
  void fill(std::span<float> out, uint64_t seed, std::string_view name) const;
};

}  // namespace kiln::frontends::nn
