// Non-template helpers of the reference kernels: broadcast strides, strided copies and the
// f16/bf16 conversions (one rounding routine shared by both formats).
#include "runtime/reference/helpers.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "runtime/cpu/cpu_clones.h"

namespace kiln::runtime::ref {

Status unsupportedDType(std::string_view op, ir::DType t) {
  return unimplemented(std::string(op) + ": dtype " + std::string(ir::dtypeName(t)) +
                       " is not supported by the reference kernel");
}

Status identityKernel(const ir::AttrView&, std::span<const Tensor> in, std::span<Tensor> out) {
  if (in[0].byteSize()) std::memcpy(out[0].rawData(), in[0].rawData(), in[0].byteSize());
  return Status::ok();
}

std::vector<int64_t> broadcastStrides(const ir::Shape& in, const ir::Shape& out) {
  const std::vector<int64_t> inStrides = ir::contiguousStrides(in);
  std::vector<int64_t> s(out.size(), 0);
  const size_t lead = out.size() - in.size();
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i] != 1) s[lead + i] = inStrides[i];
  return s;
}

AxisSplit splitAt(const ir::Shape& shape, int axis) {
  AxisSplit s;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    if (d < axis) s.outer *= shape[d];
    if (d == axis) s.dim = shape[d];
    if (d > axis) s.inner *= shape[d];
  }
  return s;
}

namespace {
template <class U>
void copyStridedTyped(const U* src, int64_t srcOffset, const std::vector<int64_t>& srcStrides,
                      U* dst, const ir::Shape& dstShape) {
  forEachStrided<1>(dstShape, {srcStrides}, {srcOffset},
                    [&](int64_t i, const std::array<int64_t, 1>& off) { dst[i] = src[off[0]]; });
}
}  // namespace

void copyStrided(const std::byte* src, int64_t srcOffset, const std::vector<int64_t>& srcStrides,
                 std::byte* dst, const ir::Shape& dstShape, size_t elemSize) {
  // Copy through unsigned integers of the element size: no float may be touched as a value
  // (that could quiet a signalling NaN), and the loops stay simple.
  switch (elemSize) {
    case 1:
      return copyStridedTyped(reinterpret_cast<const uint8_t*>(src), srcOffset, srcStrides,
                              reinterpret_cast<uint8_t*>(dst), dstShape);
    case 2:
      return copyStridedTyped(reinterpret_cast<const uint16_t*>(src), srcOffset, srcStrides,
                              reinterpret_cast<uint16_t*>(dst), dstShape);
    case 4:
      return copyStridedTyped(reinterpret_cast<const uint32_t*>(src), srcOffset, srcStrides,
                              reinterpret_cast<uint32_t*>(dst), dstShape);
    default:
      return copyStridedTyped(reinterpret_cast<const uint64_t*>(src), srcOffset, srcStrides,
                              reinterpret_cast<uint64_t*>(dst), dstShape);
  }
}

namespace {

// A binary floating-point format with `expBits` exponent bits and `mantBits` stored mantissa
// bits, packed in 16 bits (f16: 5/10, bf16: 8/7).
struct SmallFloat {
  int expBits;
  int mantBits;

  int bias() const { return (1 << (expBits - 1)) - 1; }
  int maxField() const { return (1 << expBits) - 1; }  // The exponent field of inf and NaN.
  uint16_t signBit() const { return static_cast<uint16_t>(1u << (expBits + mantBits)); }
  uint16_t inf() const { return static_cast<uint16_t>(maxField() << mantBits); }
  uint16_t quietNaN() const { return static_cast<uint16_t>(inf() | (1u << (mantBits - 1))); }
};

constexpr SmallFloat kF16{5, 10};
constexpr SmallFloat kBF16{8, 7};

// Rounds the exact value mag * 2^exp2 (mag > 0) to nearest, ties to even, and returns its
// bit pattern with the sign bit set when `negative`.
uint16_t roundToSmallFloat(const SmallFloat& f, bool negative, uint64_t mag, int exp2) {
  const uint16_t sign = negative ? f.signBit() : 0;
  const int msb = 63 - std::countl_zero(mag);
  const int e = msb + exp2;  // The value lies in [2^e, 2^(e+1)).
  if (e + f.bias() >= f.maxField()) return sign | f.inf();
  // Subnormals share the exponent of the smallest normal (biased exponent 1).
  const int biased = std::max(e + f.bias(), 1);
  const int quantumExp = biased - f.bias() - f.mantBits;  // The weight of the last mantissa bit.
  const int shift = quantumExp - exp2;
  uint64_t q;  // The value in units of the quantum, rounded.
  if (shift <= 0) {
    q = mag << -shift;  // Exact; at most mantBits + 1 bits.
  } else if (shift >= 64) {
    // Everything is below one quantum; only shift == 64 can reach past the halfway point.
    const uint64_t halfway = uint64_t{1} << 63;
    q = (shift == 64 && mag > halfway) ? 1 : 0;
  } else {
    q = mag >> shift;
    const uint64_t rem = mag & ((uint64_t{1} << shift) - 1);
    const uint64_t halfway = uint64_t{1} << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1))) ++q;
  }
  // For normals q holds the implicit leading bit, so (biased - 1) << mantBits plus q is the
  // encoding; a carry out of the mantissa bumps the exponent (up to inf) as IEEE requires.
  // For subnormals biased == 1 and q is the stored mantissa.
  return static_cast<uint16_t>(sign | ((static_cast<uint32_t>(biased - 1) << f.mantBits) + q));
}

uint16_t fromDouble(const SmallFloat& f, double v) {
  const bool negative = std::signbit(v);
  const uint16_t sign = negative ? f.signBit() : 0;
  if (std::isnan(v)) return sign | f.quietNaN();
  if (std::isinf(v)) return sign | f.inf();
  if (v == 0) return sign;
  const auto bits = std::bit_cast<uint64_t>(v);
  const int field = static_cast<int>((bits >> 52) & 0x7FF);
  const uint64_t frac = bits & ((uint64_t{1} << 52) - 1);
  const uint64_t mag = field ? (frac | (uint64_t{1} << 52)) : frac;
  const int exp2 = (field ? field : 1) - 1075;
  return roundToSmallFloat(f, negative, mag, exp2);
}

uint16_t fromInt64(const SmallFloat& f, int64_t v) {
  if (v == 0) return 0;
  const bool negative = v < 0;
  const uint64_t mag = negative ? uint64_t{0} - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  return roundToSmallFloat(f, negative, mag, 0);
}

double toDouble(const SmallFloat& f, uint16_t bits) {
  const bool negative = (bits & f.signBit()) != 0;
  const int field = (bits >> f.mantBits) & f.maxField();
  const int mant = bits & ((1 << f.mantBits) - 1);
  double v;
  if (field == f.maxField())
    v = mant ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (field == 0)
    v = std::ldexp(static_cast<double>(mant), 1 - f.bias() - f.mantBits);
  else
    v = std::ldexp(static_cast<double>(mant + (1 << f.mantBits)), field - f.bias() - f.mantBits);
  return negative ? -v : v;
}

}  // namespace

uint16_t doubleToF16Bits(double v) {
  return fromDouble(kF16, v);
}
uint16_t doubleToBf16Bits(double v) {
  return fromDouble(kBF16, v);
}
namespace {

// f16 <-> f32 of whole arrays, branch-free so that they vectorize (per-ISA clones): exactly
// toDouble/fromDouble's results (round to nearest even, subnormals, inf; a NaN becomes the quiet
// NaN of its sign), 10x faster than going through double one element at a time.
KILN_CPU_CLONES void f16ToFloatBits(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t h = src[i];
    const uint32_t sign = (h & 0x8000u) << 16, field = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    const uint32_t normal = sign | ((field + 112u) << 23) | (mant << 13);
    const uint32_t special = sign | (mant ? 0x7fc00000u : 0x7f800000u);
    // A subnormal (or zero) is mant * 2^-24, exact in f32.
    const uint32_t small = sign | std::bit_cast<uint32_t>(static_cast<float>(mant) * 0x1p-24f);
    const uint32_t bits = field == 0 ? small : field == 31 ? special : normal;
    dst[i] = std::bit_cast<float>(bits);
  }
}

KILN_CPU_CLONES void floatToF16Bits(const float* src, uint16_t* dst, int64_t n) {
  // F. Giesen's round-to-nearest-even conversion (float_to_half_fast3_rtne): subnormal results
  // by an f32 addition that rounds the mantissa into place, normal ones by integer rounding.
  constexpr uint32_t kDenormMagic = ((127 - 15) + (23 - 10) + 1) << 23;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t x = std::bit_cast<uint32_t>(src[i]);
    const uint32_t sign = x & 0x80000000u;
    x ^= sign;
    const uint32_t big = x > 0x7f800000u ? 0x7e00u : 0x7c00u;  // NaN, or inf and overflow.
    const float sum = std::bit_cast<float>(x) + std::bit_cast<float>(kDenormMagic);
    const uint32_t tiny = std::bit_cast<uint32_t>(sum) - kDenormMagic;
    const uint32_t odd = (x >> 13) & 1u;
    const uint32_t normal = (x + ((15u - 127u) << 23) + 0xfffu + odd) >> 13;
    const uint32_t h = x >= 0x47800000u ? big : x < 0x38800000u ? tiny : normal;
    dst[i] = static_cast<uint16_t>(h | (sign >> 16));
  }
}

}  // namespace

void halfBitsToFloat(ir::DType t, const uint16_t* src, float* dst, int64_t n) {
  if (t == ir::DType::kBF16) {  // The top half of an f32: a shift the compiler vectorizes.
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t u = static_cast<uint32_t>(src[i]) << 16;
      std::memcpy(&dst[i], &u, 4);
    }
    return;
  }
  f16ToFloatBits(src, dst, n);
}

void floatToHalfBits(ir::DType t, const float* src, uint16_t* dst, int64_t n) {
  if (t == ir::DType::kBF16) {  // Nearest even on the dropped 16 bits; NaN stays a quiet NaN.
    for (int64_t i = 0; i < n; ++i) {
      uint32_t u;
      std::memcpy(&u, &src[i], 4);
      dst[i] = (u & 0x7fffffffu) > 0x7f800000u
                   ? static_cast<uint16_t>((u >> 16) | 0x40u)
                   : static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return;
  }
  floatToF16Bits(src, dst, n);
}

uint16_t int64ToF16Bits(int64_t v) {
  return fromInt64(kF16, v);
}
uint16_t int64ToBf16Bits(int64_t v) {
  return fromInt64(kBF16, v);
}
double f16BitsToDouble(uint16_t bits) {
  return toDouble(kF16, bits);
}
double bf16BitsToDouble(uint16_t bits) {
  return toDouble(kBF16, bits);
}

}  // namespace kiln::runtime::ref
