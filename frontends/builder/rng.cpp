#include "frontends/builder/rng.h"

#include <algorithm>
#include <cmath>

namespace kiln::frontends::nn {

namespace {

// The splitmix64 output function: a bijection on 64-bit integers with good avalanche.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// FNV-1a over the bytes of the name: cheap, stable across platforms and standard libraries
// (unlike std::hash).
uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace

Rng Rng::forStream(uint64_t seed, std::string_view name) {
  // Mixing the seed and the name hash separately keeps nearby seeds and similar names from
  // producing correlated starting states.
  return Rng(mix64(mix64(seed + kGolden) ^ fnv1a(name)));
}

uint64_t Rng::nextU64() {
  state_ += kGolden;
  return mix64(state_);
}

double Rng::nextSymmetric() {
  const auto k = static_cast<int64_t>(nextU64() >> 40);  // 24 bits.
  return static_cast<double>(2 * k + 1 - (int64_t{1} << 24)) / static_cast<double>(1 << 24);
}

Init Init::kaimingUniform(int64_t fanIn) {
  const double bound = fanIn > 0 ? 1.0 / std::sqrt(static_cast<double>(fanIn)) : 0.0;
  return uniform(-bound, bound);
}

void Init::fill(std::span<float> out, uint64_t seed, std::string_view name) const {
  if (kind == Kind::kConstant) {
    std::fill(out.begin(), out.end(), static_cast<float>(low));
    return;
  }
  Rng rng = Rng::forStream(seed, name);
  const double mid = 0.5 * (low + high);
  const double half = 0.5 * (high - low);
  // One correctly rounded operation per value keeps results independent of whether the
  // compiler contracts a multiply-add: a plain multiply for the usual symmetric bounds, an
  // explicit fma otherwise.
  if (mid == 0.0) {
    for (float& v : out) v = static_cast<float>(half * rng.nextSymmetric());
  } else {
    for (float& v : out) v = static_cast<float>(std::fma(half, rng.nextSymmetric(), mid));
  }
}

}  // namespace kiln::frontends::nn
