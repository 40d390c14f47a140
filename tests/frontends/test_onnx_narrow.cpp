// ONNX's narrow element types (ir/narrow.h): 4-bit weights packed two to a byte and 8-bit float
// tensors read from raw_data and int32_data, a blockwise int4 DequantizeLinear feeding a MatMul
// (the weight-only quantized form of LLM exports), QuantizeLinear to FLOAT8E4M3FN, and a packed
// tensor of the wrong size as a clear error.
#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

#include "frontends/onnx/onnx_tensor.h"
#include "ir/narrow.h"
#include "test_onnx_model.h"

using namespace kiln;
using namespace kiln::onnxtest;
using ir::DType;

namespace {

constexpr int32_t kInt4 = 22, kUint4 = 21, kFloat8E4M3FN = 17, kInt2 = 26;

// A tensor of 4-bit values packed low nibble first (ONNX's layout), in raw_data.
::onnx::TensorProto packed4(const std::string& name, int32_t type, const Shape& dims,
                            const std::vector<int>& values) {
  ::onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(type);
  for (int64_t d : dims) t.add_dims(d);
  std::string raw((values.size() + 1) / 2, '\0');
  for (size_t i = 0; i < values.size(); ++i)
    raw[i / 2] = static_cast<char>(raw[i / 2] | ((values[i] & 0xF) << (4 * (i % 2))));
  t.set_raw_data(raw);
  return t;
}

}  // namespace

TEST_CASE("onnx: 4- and 2-bit tensors unpack from raw_data and int32_data; 8-bit floats read") {
  // An odd count: the last byte's high nibble is padding.
  const std::vector<int> v{-8, 7, -1, 0, 5};
  auto i4 = frontends::onnx_import::tensorFromProto(packed4("w", kInt4, {5}, v), "w");
  INFO(i4.status().message());
  REQUIRE(i4.hasValue());
  CHECK(i4->dtype() == DType::kI4);
  for (size_t i = 0; i < v.size(); ++i)
    CHECK(ir::narrowToDouble(DType::kI4, i4->as<uint8_t>()[i]) == v[i]);

  // uint4 in int32_data: one packed byte a value.
  ::onnx::TensorProto u;
  u.set_data_type(kUint4);
  u.add_dims(3);
  u.add_int32_data(0xF3);  // 3, 15
  u.add_int32_data(0x09);  // 9
  auto u4 = frontends::onnx_import::tensorFromProto(u, "u");
  REQUIRE(u4.hasValue());
  CHECK(std::vector<uint8_t>(u4->as<uint8_t>(), u4->as<uint8_t>() + 3) ==
        std::vector<uint8_t>{3, 15, 9});

  // int2: four to a byte.
  ::onnx::TensorProto t2;
  t2.set_data_type(kInt2);
  t2.add_dims(4);
  t2.set_raw_data(std::string(1, static_cast<char>(0b10'01'11'00)));  // 0, -1, 1, -2
  auto i2 = frontends::onnx_import::tensorFromProto(t2, "t2");
  REQUIRE(i2.hasValue());
  for (int i = 0; i < 4; ++i)
    CHECK(ir::narrowToDouble(DType::kI2, i2->as<uint8_t>()[i]) == std::vector{0, -1, 1, -2}[i]);

  // FLOAT8E4M3FN in int32_data: a code a value.
  ::onnx::TensorProto f8;
  f8.set_data_type(kFloat8E4M3FN);
  f8.add_dims(3);
  for (int c : {0x38, 0x7E, 0xFF}) f8.add_int32_data(c);  // 1, 448, -NaN
  auto f = frontends::onnx_import::tensorFromProto(f8, "f8");
  REQUIRE(f.hasValue());
  CHECK(ir::narrowToDouble(DType::kF8E4M3FN, f->as<uint8_t>()[0]) == 1.0);
  CHECK(ir::narrowToDouble(DType::kF8E4M3FN, f->as<uint8_t>()[1]) == 448.0);
  CHECK(std::isnan(ir::narrowToDouble(DType::kF8E4M3FN, f->as<uint8_t>()[2])));

  // Five int4 values need three bytes, not five (nor two).
  ::onnx::TensorProto bad = packed4("w", kInt4, {5}, v);
  bad.set_raw_data(std::string(5, '\0'));
  auto st = frontends::onnx_import::tensorFromProto(bad, "initializer 'w'");
  REQUIRE_FALSE(st.hasValue());
  CHECK_THAT(st.status().message(),
             Catch::Contains("initializer 'w' has 5 bytes of raw_data, but its dims [5] and "
                             "element type INT4 need 3"));
}

TEST_CASE("onnx: a blockwise int4 DequantizeLinear feeding MatMul (weight-only quantization)") {
  // W [K=6, N=2] in int4 with a zero point, one scale per block of 3 rows and column.
  const std::vector<int> w{-8, 7, 3, -2, 0, 1, 5, -5, -1, 6, 2, 4};
  const std::vector<int> z{1, -1, 0, 2};
  const std::vector<float> s{0.5f, 0.25f, 2.0f, 0.125f};
  Model m(21);
  m.input("x", {2, 6})
      .initializer(packed4("w", kInt4, {6, 2}, w))
      .init("s", {2, 2}, s)
      .initializer(packed4("z", kInt4, {2, 2}, z))
      .node("DequantizeLinear", {"w", "s", "z"}, {"wf"},
            {attrInt("axis", 0), attrInt("block_size", 3)})
      .node("MatMul", {"x", "wf"}, {"y"})
      .output("y");
  std::vector<float> x(12);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f * static_cast<float>(i) - 1.0f;
  std::vector<float> want(4, 0.0f);
  for (int r = 0; r < 2; ++r)
    for (int n = 0; n < 2; ++n)
      for (int k = 0; k < 6; ++k) {
        const int b = k / 3;
        want[r * 2 + n] +=
            x[r * 6 + k] * static_cast<float>(w[k * 2 + n] - z[b * 2 + n]) * s[b * 2 + n];
      }
  const ir::Graph g = import(m);
  checkClose(runGraph(g, {makeF32({2, 6}, x)})[0], {2, 2}, want);
}

TEST_CASE("onnx: QuantizeLinear to FLOAT8E4M3FN rounds to its precision and saturates") {
  Model m(21);
  ::onnx::TensorProto zp;
  zp.set_name("zp");
  zp.set_data_type(kFloat8E4M3FN);
  zp.add_int32_data(0);
  m.input("x", {5})
      .init("s", {}, {2.0f})
      .initializer(zp)
      .node("QuantizeLinear", {"x", "s", "zp"}, {"q"})
      .node("DequantizeLinear", {"q", "s", "zp"}, {"y"})
      .output("y");
  // x / 2: 0.3 (to 0.3125 in e4m3fn), 1.0, 1e4 (saturates to 448), -3.3 (-3.25), 0.
  const auto out = runGraph(import(m), {makeF32({5}, {0.6f, 2.0f, 2e4f, -6.6f, 0.0f})});
  checkClose(out[0], {5}, {0.625f, 2.0f, 896.0f, -6.5f, 0.0f});
}
