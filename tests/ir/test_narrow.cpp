// The narrow storage dtypes' conversions (ir/narrow.h): every code of each 8- and 4-bit float
// decoded and encoded back, every midpoint between neighbours rounded to the even one, the
// saturation and NaN rules of ONNX's Cast tables, and the 4- and 2-bit integers' truncation and
// wrapping.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "ir/narrow.h"

using kiln::ir::DType;
using namespace kiln::ir;

namespace {

struct Format {
  DType t;
  int codes;      // 256 or 16.
  double max;     // Largest finite value.
  double minSub;  // Smallest positive subnormal.
  bool negZero;   // Has -0.
};

const std::vector<Format> kFloats = {
    {DType::kF8E4M3FN, 256, 448, std::ldexp(1.0, -9), true},
    {DType::kF8E4M3FNUZ, 256, 240, std::ldexp(1.0, -10), false},
    {DType::kF8E5M2, 256, 57344, std::ldexp(1.0, -16), true},
    {DType::kF8E5M2FNUZ, 256, 57344, std::ldexp(1.0, -17), false},
    {DType::kF4E2M1, 16, 6, 0.5, true},
};

}  // namespace

TEST_CASE("narrow floats: every code decodes and encodes back; midpoints round to even") {
  for (const Format& f : kFloats) {
    INFO(dtypeName(f.t));
    CHECK(isNarrow(f.t));
    CHECK(isNarrowFloat(f.t));
    CHECK(dtypeSize(f.t) == 1);
    // The finite codes by value: each encodes back to itself.
    std::vector<std::pair<double, int>> finite;
    int nans = 0;
    for (int c = 0; c < f.codes; ++c) {
      const double v = narrowToDouble(f.t, static_cast<uint8_t>(c));
      if (std::isnan(v)) {
        ++nans;
        continue;
      }
      if (std::isinf(v)) continue;
      INFO("code " << c << " = " << v);
      CHECK(std::fabs(v) <= f.max);
      if (v == 0 && std::signbit(v) && !f.negZero) FAIL("a negative zero in a FNUZ format");
      CHECK(narrowFromFloat(f.t, v) == c);
      CHECK(narrowFromFloat(f.t, v, /*saturate=*/false) == c);
      if (!std::signbit(v)) finite.emplace_back(v, c);
    }
    CHECK(nans == (f.t == DType::kF8E4M3FN ? 2
                   : f.t == DType::kF8E5M2 ? 6
                   : f.t == DType::kF4E2M1 ? 0
                                           : 1));
    std::sort(finite.begin(), finite.end());
    CHECK(finite.back().first == f.max);
    CHECK(finite[1].first == f.minSub);
    // Halfway between neighbours: the one with the even mantissa (the even code).
    for (size_t i = 0; i + 1 < finite.size(); ++i) {
      const auto [a, ca] = finite[i];
      const auto [b, cb] = finite[i + 1];
      const double mid = (a + b) / 2;
      INFO("between " << a << " and " << b);
      CHECK(narrowFromFloat(f.t, mid) == ((ca & 1) == 0 ? ca : cb));
      CHECK(narrowFromFloat(f.t, std::nextafter(mid, 0.0)) == ca);
      CHECK(narrowFromFloat(f.t, std::nextafter(mid, INFINITY)) == cb);
      // And negated, with the sign bit.
      const int sign = f.codes == 256 ? 0x80 : 0x8;
      if (a > 0) CHECK(narrowFromFloat(f.t, -std::nextafter(mid, 0.0)) == (ca | sign));
    }
  }
}

TEST_CASE("narrow floats: ONNX Cast's saturation and NaN rules") {
  // E4M3FN: saturate to +-448; without, NaN (the sign kept).
  CHECK(narrowToDouble(DType::kF8E4M3FN, narrowFromFloat(DType::kF8E4M3FN, 1e6)) == 448);
  CHECK(narrowToDouble(DType::kF8E4M3FN, narrowFromFloat(DType::kF8E4M3FN, -INFINITY)) == -448);
  CHECK(
      std::isnan(narrowToDouble(DType::kF8E4M3FN, narrowFromFloat(DType::kF8E4M3FN, 1e6, false))));
  CHECK(std::isnan(
      narrowToDouble(DType::kF8E4M3FN, narrowFromFloat(DType::kF8E4M3FN, INFINITY, false))));
  // 464 is halfway between 448 (mantissa 110) and 480 (111, E4M3FN's NaN): to even, 448; just
  // above it rounds to 480, past the largest: NaN unless saturating (ml_dtypes: the same).
  CHECK(narrowToDouble(DType::kF8E4M3FN, narrowFromFloat(DType::kF8E4M3FN, 464, false)) == 448);
  CHECK(
      std::isnan(narrowToDouble(DType::kF8E4M3FN, narrowFromFloat(DType::kF8E4M3FN, 465, false))));
  CHECK(narrowToDouble(DType::kF8E4M3FN, narrowFromFloat(DType::kF8E4M3FN, 465)) == 448);
  CHECK(narrowFromFloat(DType::kF8E4M3FN, -NAN) == 0xFF);
  // E5M2 has infinities: overflow without saturation is one.
  CHECK(narrowToDouble(DType::kF8E5M2, narrowFromFloat(DType::kF8E5M2, 61440, false)) == INFINITY);
  CHECK(narrowToDouble(DType::kF8E5M2, narrowFromFloat(DType::kF8E5M2, -INFINITY, false)) ==
        -INFINITY);
  CHECK(narrowToDouble(DType::kF8E5M2, narrowFromFloat(DType::kF8E5M2, INFINITY)) == 57344);
  // FNUZ: one NaN (0x80), no negative zero.
  for (DType t : {DType::kF8E4M3FNUZ, DType::kF8E5M2FNUZ}) {
    INFO(dtypeName(t));
    CHECK(narrowFromFloat(t, NAN) == 0x80);
    CHECK(narrowFromFloat(t, -NAN) == 0x80);
    CHECK(narrowFromFloat(t, -0.0) == 0);
    CHECK(narrowFromFloat(t, -1e-30) == 0);  // Underflows to +0.
    CHECK(narrowFromFloat(t, INFINITY, false) == 0x80);
  }
  CHECK(narrowToDouble(DType::kF8E4M3FNUZ, narrowFromFloat(DType::kF8E4M3FNUZ, 1e6)) == 240);
  // E2M1 always saturates; NaN gives -0 (the code 0x8), as ONNX's reference.
  CHECK(narrowToDouble(DType::kF4E2M1, narrowFromFloat(DType::kF4E2M1, INFINITY, false)) == 6);
  CHECK(narrowToDouble(DType::kF4E2M1, narrowFromFloat(DType::kF4E2M1, -9)) == -6);
  CHECK(narrowFromFloat(DType::kF4E2M1, NAN) == 0x8);
  // Integers to floats round as the value does (the reference's cast of an int).
  CHECK(narrowToDouble(DType::kF8E4M3FN, narrowFromInteger(DType::kF8E4M3FN, 17)) == 16);
  CHECK(narrowToDouble(DType::kF8E4M3FN, narrowFromInteger(DType::kF8E4M3FN, 1000)) == 448);
}

TEST_CASE("narrow integers: floats truncate (0 outside the range), integers keep their low bits") {
  struct Case {
    DType t;
    int64_t lo, hi;
  };
  for (const Case& c : {Case{DType::kI4, -8, 7}, Case{DType::kU4, 0, 15}, Case{DType::kI2, -2, 1},
                        Case{DType::kU2, 0, 3}}) {
    INFO(dtypeName(c.t));
    CHECK(isNarrow(c.t));
    CHECK_FALSE(isNarrowFloat(c.t));
    CHECK_FALSE(isInteger(c.t));
    const int bits = narrowFileBits(c.t);
    CHECK(bits == (c.t == DType::kI4 || c.t == DType::kU4 ? 4 : 2));
    for (int64_t v = c.lo; v <= c.hi; ++v) {
      CHECK(narrowToDouble(c.t, narrowFromInteger(c.t, v)) == static_cast<double>(v));
      CHECK(narrowToDouble(
                c.t, narrowFromFloat(c.t, static_cast<double>(v) + 0.75 * (v < 0 ? -1 : 1))) ==
            static_cast<double>(v));
      // Wrapping: v plus a multiple of 2^bits is v.
      CHECK(narrowFromInteger(c.t, v + (int64_t{5} << bits)) == narrowFromInteger(c.t, v));
      // A file's bits, as stored (two's complement for the signed ones).
      CHECK(narrowFromFileBits(c.t, static_cast<uint8_t>(v & ((1 << bits) - 1))) ==
            narrowFromInteger(c.t, v));
    }
    CHECK(narrowFromFloat(c.t, static_cast<double>(c.hi) + 1) == 0);
    CHECK(narrowFromFloat(c.t, static_cast<double>(c.lo) - 1) == 0);
    CHECK(narrowFromFloat(c.t, NAN) == 0);
    CHECK(narrowFromFloat(c.t, INFINITY) == 0);
  }
  CHECK(narrowToDouble(DType::kI4, narrowFromInteger(DType::kI4, 9)) == -7);
  CHECK(narrowToDouble(DType::kI4, narrowFromFloat(DType::kI4, -7.9)) == -7);
}

TEST_CASE("FLOAT8E8M0: powers of two rounded up, down or to nearest as ONNX's reference") {
  const DType t = DType::kF8E8M0;
  CHECK(isNarrow(t));
  CHECK(isNarrowFloat(t));
  CHECK(narrowToDouble(t, 127) == 1.0);
  CHECK(narrowToDouble(t, 0) == std::ldexp(1.0, -127));
  CHECK(narrowToDouble(t, 254) == std::ldexp(1.0, 127));
  CHECK(std::isnan(narrowToDouble(t, 255)));
  for (int c = 1; c < 255; ++c) CHECK(narrowFromFloat(t, narrowToDouble(t, c)) == c);
  // 2^-127 is a float32 subnormal (exponent bits 0, a fraction): the reference rounds it up.
  CHECK(narrowFromFloat(t, narrowToDouble(t, 0)) == 1);
  // Up (the default): any fraction takes the next power.
  CHECK(narrowToDouble(t, narrowFromFloat(t, 1.1)) == 2.0);
  CHECK(narrowToDouble(t, narrowFromFloat(t, 0.124)) == 0.125);
  CHECK(narrowFromFloat(t, 0.0) == 0);  // No zero: the smallest, 2^-127.
  CHECK(narrowToDouble(t, narrowFromFloat(t, 1.9, true, E8M0Round::kDown)) == 1.0);
  CHECK(narrowToDouble(t, narrowFromFloat(t, 1.5, true, E8M0Round::kNearest)) == 2.0);
  CHECK(narrowToDouble(t, narrowFromFloat(t, 1.25, true, E8M0Round::kNearest)) == 1.0);
  // Past 2^127: saturated, or NaN.
  CHECK(narrowFromFloat(t, std::ldexp(1.5, 127)) == 254);
  CHECK(narrowFromFloat(t, std::ldexp(1.5, 127), false) == 255);
  CHECK(narrowFromFloat(t, INFINITY) == 255);
  CHECK(narrowFromFloat(t, NAN) == 255);
}
