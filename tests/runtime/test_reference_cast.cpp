// The reference cast kernel (pointwise family) between all nine dtypes, with hand-checked
// f16/bf16 bit patterns: round to nearest even, subnormals, overflow, NaN and inf.
#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>
#include "runtime/reference/helpers.h"

#include "runtime/reference_test_util.h"

using namespace kiln;
using namespace kiln::reftest;

namespace {

Tensor castTo(const Tensor& x, const char* to) {
  return run(OpKind::kCast, {x}, {{"to", attrStr(to)}});
}

std::vector<uint16_t> bitsOf(const Tensor& t) {
  return values<uint16_t>(t);
}

const float kFInf = std::numeric_limits<float>::infinity();
const float kFNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace

TEST_CASE("reference cast float to integer truncates toward zero and saturates",
          "[reference][cast]") {
  const Tensor x = make<float>({6}, std::vector<float>{1.9f, -1.9f, 0.5f, -0.5f, 3e9f, kFNaN});
  checkExact<int32_t>(castTo(x, "i32"), {6}, {1, -1, 0, 0, std::numeric_limits<int32_t>::max(), 0});
  checkExact<int64_t>(castTo(x, "i64"), {6}, {1, -1, 0, 0, 3000000000, 0});
  const Tensor d = make<double>({4}, std::vector<double>{-1, 255.9, 300, -1e300});
  checkExact<uint8_t>(castTo(d, "u8"), {4}, std::vector<int>{0, 255, 255, 0});
  checkExact<int8_t>(castTo(d, "i8"), {4}, std::vector<int>{-1, 127, 127, -128});
  checkExact<int64_t>(castTo(make<double>({2}, std::vector<double>{1e19, -1e19}), "i64"), {2},
                      {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()});
}

TEST_CASE("reference cast between integers wraps and to floats rounds once", "[reference][cast]") {
  checkExact<int8_t>(castTo(make<int32_t>({3}, std::vector<int32_t>{300, -129, 5}), "i8"), {3},
                     std::vector<int>{44, 127, 5});
  checkExact<uint8_t>(castTo(make<int64_t>({2}, std::vector<int64_t>{-1, 256}), "u8"), {2},
                      std::vector<int>{255, 0});
  checkExact<int64_t>(castTo(make<uint8_t>({2}, std::vector<int>{255, 7}), "i64"), {2}, {255, 7});
  // 2^24 + 1 and 2^24 + 3 are ties in f32: round to even.
  checkExact<float>(castTo(make<int64_t>({2}, std::vector<int64_t>{16777217, 16777219}), "f32"),
                    {2}, std::vector<float>{16777216.0f, 16777220.0f});
  checkExact<double>(castTo(make<int32_t>({2}, std::vector<int32_t>{-3, 7}), "f64"), {2},
                     std::vector<double>{-3, 7});
  checkExact<float>(castTo(make<double>({2}, std::vector<double>{0.1, 1e40}), "f32"), {2},
                    std::vector<float>{0.1f, kFInf});
  checkExact<double>(castTo(make<float>({1}, std::vector<float>{0.1f}), "f64"), {1},
                     std::vector<double>{static_cast<double>(0.1f)});
}

TEST_CASE("reference cast to and from bool", "[reference][cast]") {
  const Tensor x = make<float>({4}, std::vector<float>{0.0f, -0.0f, 0.5f, kFNaN});
  const Tensor b = castTo(x, "bool");
  CHECK(b.dtype() == DType::kBool);
  CHECK(values<uint8_t>(b) == std::vector<uint8_t>{0, 0, 1, 1});
  CHECK(values<uint8_t>(castTo(make<int32_t>({3}, std::vector<int32_t>{0, -2, 256}), "bool")) ==
        std::vector<uint8_t>{0, 1, 1});
  const Tensor t = makeBool({2}, {1, 0});
  checkExact<float>(castTo(t, "f32"), {2}, std::vector<float>{1, 0});
  checkExact<int64_t>(castTo(t, "i64"), {2}, {1, 0});
  CHECK(bitsOf(castTo(t, "f16")) == std::vector<uint16_t>{0x3C00, 0x0000});
  CHECK(bitsOf(castTo(t, "bf16")) == std::vector<uint16_t>{0x3F80, 0x0000});
  CHECK(values<uint8_t>(castTo(makeBits(DType::kF16, {3}, {0x8000, 0x0001, 0x7E00}), "bool")) ==
        std::vector<uint8_t>{0, 1, 1});
  CHECK(values<uint8_t>(castTo(t, "bool")) == std::vector<uint8_t>{1, 0});
}

TEST_CASE("reference cast to f16 rounds to nearest even", "[reference][cast]") {
  const float p = std::ldexp(1.0f, -11);  // Half an f16 ulp at 1.0.
  const Tensor x = make<float>(
      {16}, std::vector<float>{
                1.0f, 65504.0f, 65519.99f, 65520.0f, 1 + p, 1 + 3 * p,
                1 + p + std::ldexp(1.0f, -20), std::ldexp(1.0f, -24), std::ldexp(1.0f, -25),
                std::ldexp(1.0f, -25) + std::ldexp(1.0f, -35), 3 * std::ldexp(1.0f, -25),
                std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25), -2.0f, -0.0f, 0.1f, -kFInf});
  CHECK(bitsOf(castTo(x, "f16")) ==
        std::vector<uint16_t>{0x3C00,  // 1
                              0x7BFF,  // The largest finite f16.
                              0x7BFF,  // Below the halfway point to 65536.
                              0x7C00,  // The halfway point rounds to even: inf.
                              0x3C00,  // Tie between 1 and 1+2^-10: even (down).
                              0x3C02,  // Tie between 1+2^-10 and 1+2^-9: even (up).
                              0x3C01,  // Just above the tie: up.
                              0x0001,  // The smallest subnormal.
                              0x0000,  // Half the smallest subnormal: tie to even zero.
                              0x0001,  // Just above it.
                              0x0002,  // 1.5 subnormal ulps: tie to even 2.
                              0x0400,  // Rounds out of the subnormals into the smallest normal.
                              0xC000, 0x8000, 0x2E66, 0xFC00});
  const uint16_t nan = bitsOf(castTo(make<float>({1}, std::vector<float>{kFNaN}), "f16"))[0];
  CHECK((nan & 0x7C00) == 0x7C00);
  CHECK((nan & 0x03FF) != 0);
}

TEST_CASE("reference cast from f64 and integers to f16 rounds once", "[reference][cast]") {
  // 1 + 2^-11 + 2^-40 is just above an f16 tie; through f32 it would become the tie itself and
  // round down.
  const double v = 1 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  CHECK(bitsOf(castTo(make<double>({2}, std::vector<double>{v, 1e10}), "f16")) ==
        std::vector<uint16_t>{0x3C01, 0x7C00});
  // 2049 and 2051 are ties at f16's 2-wide spacing there.
  CHECK(bitsOf(castTo(make<int64_t>({5}, std::vector<int64_t>{2049, 2051, 70000, -3, 0}), "f16")) ==
        std::vector<uint16_t>{0x6800, 0x6802, 0x7C00, 0xC200, 0x0000});
  CHECK(bitsOf(castTo(make<uint8_t>({1}, std::vector<int>{255}), "f16")) ==
        std::vector<uint16_t>{0x5BF8});
}

TEST_CASE("reference cast to bf16 rounds to nearest even", "[reference][cast]") {
  const float p = std::ldexp(1.0f, -8);  // Half a bf16 ulp at 1.0.
  const Tensor x =
      make<float>({8}, std::vector<float>{1.0f, 1 + p, 1 + 3 * p, 1 + p + std::ldexp(1.0f, -20),
                                          std::numeric_limits<float>::max(), -kFInf,
                                          std::ldexp(1.0f, -133), std::ldexp(1.0f, -149)});
  CHECK(bitsOf(castTo(x, "bf16")) ==
        std::vector<uint16_t>{0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x7F80, 0xFF80, 0x0001, 0x0000});
  CHECK(bitsOf(castTo(make<float>({1}, std::vector<float>{-kFNaN}), "bf16"))[0] == 0xFFC0);
  // 2^60 + 2^52 + 1 is just above a bf16 tie; through f64 it would round to the tie and then
  // down to even.
  const int64_t big = (int64_t{1} << 60) + (int64_t{1} << 52) + 1;
  CHECK(bitsOf(castTo(make<int64_t>({3}, std::vector<int64_t>{257, big, -2}), "bf16")) ==
        std::vector<uint16_t>{0x4380, 0x5D81, 0xC000});
}

TEST_CASE("reference cast from f16 and bf16 is exact", "[reference][cast]") {
  const Tensor h =
      makeBits(DType::kF16, {7}, {0x3555, 0x0001, 0x7BFF, 0xC500, 0x3E00, 0xFC00, 0x7E00});
  const std::vector<float> hf = values<float>(castTo(h, "f32"));
  CHECK(std::vector<float>(hf.begin(), hf.end() - 1) ==
        std::vector<float>{0.333251953125f, std::ldexp(1.0f, -24), 65504.0f, -5.0f, 1.5f, -kFInf});
  CHECK(std::isnan(hf.back()));
  checkExact<int32_t>(castTo(makeBits(DType::kF16, {2}, {0xC500, 0x3E00}), "i32"), {2}, {-5, 1});
  const Tensor b = makeBits(DType::kBF16, {3}, {0x4049, 0xC2F7, 0x0001});
  checkExact<double>(castTo(b, "f64"), {3},
                     std::vector<double>{3.140625, -123.5, std::ldexp(1.0, -133)});
  // f16 <-> bf16 goes through the exact value: one rounding.
  CHECK(bitsOf(castTo(makeBits(DType::kF16, {3}, {0x3C01, 0x7BFF, 0xFC00}), "bf16")) ==
        std::vector<uint16_t>{0x3F80, 0x4780, 0xFF80});
  CHECK(bitsOf(castTo(makeBits(DType::kBF16, {2}, {0x4780, 0x3F80}), "f16")) ==
        std::vector<uint16_t>{0x7C00, 0x3C00});
  CHECK(bitsOf(castTo(h, "f16")) == values<uint16_t>(h));  // Identity cast keeps the bits.
}

TEST_CASE("f16 array conversions equal the scalar rounding on every f16 and their neighbours") {
  // halfBitsToFloat / floatToHalfBits (f16) run a branch-free vectorized conversion; the scalar
  // routine (via double) is the definition. Every f16 value converts exactly to f32 and back;
  // f32 values around each f16 (the halfway points, one f32 ulp either side) and around the
  // subnormal, overflow and NaN boundaries round as the scalar routine rounds them.
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> wide(all.size());
  runtime::ref::halfBitsToFloat(DType::kF16, all.data(), wide.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    const float want = static_cast<float>(runtime::ref::f16BitsToDouble(all[i]));
    INFO("f16 0x" << std::hex << i);
    REQUIRE(std::bit_cast<uint32_t>(wide[i]) == std::bit_cast<uint32_t>(want));
  }
  std::vector<float> probes;
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint32_t b = std::bit_cast<uint32_t>(wide[i]);
    for (int64_t d : {-4097, -4096, -4095, -1, 0, 1, 4095, 4096, 4097})
      probes.push_back(std::bit_cast<float>(static_cast<uint32_t>(static_cast<int64_t>(b) + d)));
  }
  std::mt19937 gen(9);
  for (int i = 0; i < 200000; ++i)
    probes.push_back(std::bit_cast<float>(static_cast<uint32_t>(gen())));
  for (float v : {65504.f, 65519.996f, 65520.f, 65536.f, 1e-8f, 2.98e-8f, 2.9802322e-8f, 5.96e-8f})
    for (float s : {1.f, -1.f}) probes.push_back(v * s);
  std::vector<uint16_t> narrow(probes.size());
  runtime::ref::floatToHalfBits(DType::kF16, probes.data(), narrow.data(),
                                static_cast<int64_t>(probes.size()));
  for (size_t i = 0; i < probes.size(); ++i) {
    const uint16_t want = runtime::ref::doubleToF16Bits(static_cast<double>(probes[i]));
    INFO("f32 0x" << std::hex << std::bit_cast<uint32_t>(probes[i]));
    REQUIRE(narrow[i] == want);
  }
}
