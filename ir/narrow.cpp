#include "ir/narrow.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

namespace kiln::ir {

namespace {

// An 8- or 4-bit float: sign, exponent and mantissa bits, and how it spells NaN and infinity.
struct MiniFloat {
  enum class Special : uint8_t {
    kIeee,  // E5M2: the top exponent is infinity (mantissa 0) and NaN.
    kFn,    // E4M3FN: no infinity; S.1111.111 is NaN.
    kFnuz,  // No infinity, no negative zero; 0x80 is NaN.
    kNone,  // E2M1: neither.
  };
  int exponentBits, mantissaBits, bias;
  double maxFinite;
  Special special;

  int signShift() const { return exponentBits + mantissaBits; }
  uint8_t maxCode(bool negative) const {
    // The largest finite value's code: the top exponent (E5M2: the one below it) and the top
    // mantissa (E4M3FN: the one below it).
    const int topExp = (1 << exponentBits) - 1 - (special == Special::kIeee ? 1 : 0);
    const int topMan = (1 << mantissaBits) - 1 - (special == Special::kFn ? 1 : 0);
    return static_cast<uint8_t>((negative ? 1 << signShift() : 0) | topExp << mantissaBits |
                                topMan);
  }
  uint8_t nanCode(bool negative) const {
    switch (special) {
      case Special::kIeee:
        return static_cast<uint8_t>((negative ? 0x80 : 0) | 0x7E);
      case Special::kFn:
        return static_cast<uint8_t>((negative ? 0x80 : 0) | 0x7F);
      case Special::kFnuz:
        return 0x80;
      case Special::kNone:
        break;
    }
    return 0x8;  // E2M1 has no NaN: the reference gives -0.
  }

  double decode(uint8_t code) const {
    const bool negative = (code >> signShift()) & 1;
    const int exp = (code >> mantissaBits) & ((1 << exponentBits) - 1);
    const int man = code & ((1 << mantissaBits) - 1);
    if (special == Special::kFnuz && code == 0x80) return NAN;
    if (special == Special::kFn && (code & 0x7F) == 0x7F) return negative ? -NAN : NAN;
    if (special == Special::kIeee && exp == (1 << exponentBits) - 1)
      return man == 0 ? (negative ? -INFINITY : INFINITY) : (negative ? -NAN : NAN);
    const double magnitude = exp == 0
                                 ? std::ldexp(man, 1 - bias - mantissaBits)
                                 : std::ldexp((1 << mantissaBits) + man, exp - bias - mantissaBits);
    return negative ? -magnitude : magnitude;
  }

  uint8_t encode(double v, bool saturate) const {
    const bool negative = std::signbit(v);
    if (std::isnan(v)) return nanCode(negative);
    const bool saturates = saturate || special == Special::kNone;
    const uint8_t sign = static_cast<uint8_t>(negative ? 1 << signShift() : 0);
    const double a = std::fabs(v);
    auto overflow = [&]() -> uint8_t {
      if (saturates) return maxCode(negative);
      if (special == Special::kIeee) return sign | static_cast<uint8_t>(0x7C);
      return nanCode(negative);
    };
    if (std::isinf(a)) return overflow();
    const int minExp = 1 - bias;  // Of the normals; the subnormals share its quantum.
    double r = 0;
    if (a > 0) {
      const int e = std::max(std::ilogb(a), minExp);
      const double quantum = std::ldexp(1.0, e - mantissaBits);
      r = std::nearbyint(a / quantum) * quantum;  // Half to even (the default rounding mode).
    }
    if (r > maxFinite) return overflow();
    if (r == 0) return special == Special::kFnuz ? 0 : sign;
    const int e = std::ilogb(r);
    if (e < minExp) return sign | static_cast<uint8_t>(std::ldexp(r, mantissaBits - minExp));
    const int man = static_cast<int>(std::ldexp(r, mantissaBits - e)) - (1 << mantissaBits);
    return sign | static_cast<uint8_t>((e + bias) << mantissaBits | man);
  }
};

constexpr MiniFloat kE4M3Fn{4, 3, 7, 448, MiniFloat::Special::kFn};
constexpr MiniFloat kE4M3Fnuz{4, 3, 8, 240, MiniFloat::Special::kFnuz};
constexpr MiniFloat kE5M2{5, 2, 15, 57344, MiniFloat::Special::kIeee};
constexpr MiniFloat kE5M2Fnuz{5, 2, 16, 57344, MiniFloat::Special::kFnuz};
constexpr MiniFloat kE2M1{2, 1, 1, 6, MiniFloat::Special::kNone};

const MiniFloat* miniFloat(DType t) {
  switch (t) {
    case DType::kF8E4M3FN:
      return &kE4M3Fn;
    case DType::kF8E4M3FNUZ:
      return &kE4M3Fnuz;
    case DType::kF8E5M2:
      return &kE5M2;
    case DType::kF8E5M2FNUZ:
      return &kE5M2Fnuz;
    case DType::kF4E2M1:
      return &kE2M1;
    default:
      return nullptr;
  }
}

// The 4- and 2-bit integers: their width and whether they are signed.
struct SmallInt {
  int bits;
  bool isSigned;
  int64_t lo() const { return isSigned ? -(int64_t{1} << (bits - 1)) : 0; }
  int64_t hi() const {
    return isSigned ? (int64_t{1} << (bits - 1)) - 1 : (int64_t{1} << bits) - 1;
  }
  // The low `bits` of v, sign-extended for the signed ones, as kiln's byte.
  uint8_t wrap(int64_t v) const {
    const uint64_t low = static_cast<uint64_t>(v) & ((uint64_t{1} << bits) - 1);
    if (isSigned && (low >> (bits - 1)) != 0)
      return static_cast<uint8_t>(
          static_cast<int8_t>(static_cast<int64_t>(low) - (int64_t{1} << bits)));
    return static_cast<uint8_t>(low);
  }
  double value(uint8_t code) const {
    return isSigned ? static_cast<double>(static_cast<int8_t>(code)) : static_cast<double>(code);
  }
};

std::optional<SmallInt> smallInt(DType t) {
  switch (t) {
    case DType::kI4:
      return SmallInt{4, true};
    case DType::kU4:
      return SmallInt{4, false};
    case DType::kI2:
      return SmallInt{2, true};
    case DType::kU2:
      return SmallInt{2, false};
    default:
      return std::nullopt;
  }
}

// FLOAT8E8M0 from float32 bits, as ONNX's reference (numpy_helper.to_float8e8m0).
uint8_t e8m0FromFloat(float f, bool saturate, E8M0Round round) {
  uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof bits);
  uint32_t exponent = (bits >> 23) & 0xFF;
  if (exponent == 0xFF) return 0xFF;  // NaN and infinities.
  bool up = false;
  switch (round) {
    case E8M0Round::kUp:
      up = (bits & 0x7FFFFF) != 0;
      break;
    case E8M0Round::kDown:
      break;
    case E8M0Round::kNearest: {
      const bool guard = bits & 0x400000, rnd = bits & 0x200000, sticky = bits & 0x1FFFFF;
      up = guard && (rnd || sticky || exponent > 0);
      break;
    }
  }
  if (up && !(saturate && exponent == 0xFE)) ++exponent;
  return static_cast<uint8_t>(exponent);  // 0xFE + 1 without saturation: 0xFF, NaN.
}

}  // namespace

bool isNarrowFloat(DType t) {
  return miniFloat(t) != nullptr || t == DType::kF8E8M0;
}

bool isNarrow(DType t) {
  return isNarrowFloat(t) || smallInt(t).has_value();
}

std::optional<E8M0Round> parseE8M0Round(std::string_view name) {
  if (name == "up") return E8M0Round::kUp;
  if (name == "down") return E8M0Round::kDown;
  if (name == "nearest") return E8M0Round::kNearest;
  return std::nullopt;
}

int narrowFileBits(DType t) {
  if (t == DType::kF4E2M1) return 4;
  if (auto s = smallInt(t)) return s->bits;
  return isNarrowFloat(t) ? 8 : 0;
}

double narrowToDouble(DType t, uint8_t code) {
  if (t == DType::kF8E8M0) return code == 0xFF ? NAN : std::ldexp(1.0, code - 127);
  if (const MiniFloat* f = miniFloat(t)) return f->decode(code);
  if (auto s = smallInt(t)) return s->value(code);
  return NAN;
}

uint8_t narrowFromFloat(DType t, double v, bool saturate, E8M0Round round) {
  if (t == DType::kF8E8M0) return e8m0FromFloat(static_cast<float>(v), saturate, round);
  if (const MiniFloat* f = miniFloat(t)) return f->encode(v, saturate);
  if (auto s = smallInt(t)) {
    if (std::isnan(v)) return 0;
    const double r = std::trunc(v);
    if (r < static_cast<double>(s->lo()) || r > static_cast<double>(s->hi())) return 0;
    return s->wrap(static_cast<int64_t>(r));
  }
  return 0;
}

uint8_t narrowFromInteger(DType t, int64_t v) {
  if (auto s = smallInt(t)) return s->wrap(v);
  return narrowFromFloat(t, static_cast<double>(v), true);
}

uint8_t narrowFromFileBits(DType t, uint8_t bits) {
  if (auto s = smallInt(t)) return s->wrap(bits);
  return bits;
}

}  // namespace kiln::ir
