// ir::TensorData::scalar, the constants passes add (a step counter's increment, a gradient's
// seed, a zero): every dtype holds the value itself, not an f32's bits.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "ir/tensor_data.h"

using namespace kiln;

namespace {

template <class T>
T held(const ir::TensorData& d) {
  REQUIRE(d.byteSize() == sizeof(T));
  T v;
  std::memcpy(&v, d.data(), sizeof(T));
  return v;
}

}  // namespace

TEST_CASE("tensor data: scalar holds its value in every dtype") {
  using ir::DType;
  using ir::TensorData;
  CHECK(held<float>(TensorData::scalar(DType::kF32, 0.25)) == 0.25f);
  CHECK(held<double>(TensorData::scalar(DType::kF64, 0.1)) == 0.1);
  // A training step's counter adds this every step (it once added 1.0f's bits, 1065353216).
  CHECK(held<int64_t>(TensorData::scalar(DType::kI64, 1)) == 1);
  CHECK(held<int64_t>(TensorData::scalar(DType::kI64, -3)) == -3);
  CHECK(held<int32_t>(TensorData::scalar(DType::kI32, 7)) == 7);
  CHECK(held<int8_t>(TensorData::scalar(DType::kI8, -2)) == -2);
  CHECK(held<uint8_t>(TensorData::scalar(DType::kU8, 200)) == 200);
  CHECK(held<uint8_t>(TensorData::scalar(DType::kBool, 2)) == 1);
  // f16/bf16: exactly representable values (a gradient's seed of 1 was bf16 0: the low half of
  // 1.0f), NaN for the rest, which only a cast rounds.
  CHECK(held<uint16_t>(TensorData::scalar(DType::kBF16, 1.0)) == 0x3F80);
  CHECK(held<uint16_t>(TensorData::scalar(DType::kBF16, -0.5)) == 0xBF00);
  CHECK(held<uint16_t>(TensorData::scalar(DType::kF16, 1.0)) == 0x3C00);
  CHECK(held<uint16_t>(TensorData::scalar(DType::kF16, -2.0)) == 0xC000);
  CHECK(held<uint16_t>(TensorData::scalar(DType::kF16, 65504.0)) == 0x7BFF);
  CHECK(held<uint16_t>(TensorData::scalar(DType::kF16, 0x1p-24)) == 0x0001);  // Subnormal.
  CHECK(held<uint16_t>(TensorData::scalar(DType::kF16, 0.0)) == 0);
  CHECK(held<uint16_t>(TensorData::scalar(DType::kF16, 0.1)) == 0x7E00);      // Inexact: NaN.
  CHECK(held<uint16_t>(TensorData::scalar(DType::kF16, 65536.0)) == 0x7E00);  // Past the max.
  CHECK(held<uint16_t>(TensorData::scalar(DType::kBF16, 0.1)) == 0x7FC0);
  CHECK(held<uint16_t>(TensorData::scalar(DType::kBF16, -INFINITY)) == 0xFF80);
  CHECK(held<uint16_t>(TensorData::scalar(DType::kF16, INFINITY)) == 0x7C00);
  // Integers saturate (a static_cast past the range is undefined).
  CHECK(held<int32_t>(TensorData::scalar(DType::kI32, 1e20)) == INT32_MAX);
  CHECK(held<uint8_t>(TensorData::scalar(DType::kU8, -5)) == 0);
  CHECK(held<int64_t>(TensorData::scalar(DType::kI64, NAN)) == 0);
}
