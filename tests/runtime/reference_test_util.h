// Helpers for the reference-kernel tests: tensors from literal values, running one op through
// runReferenceOp, and comparisons with per-dtype tolerances (1e-6 for f32, 1e-12 for f64).
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "runtime/reference/kernels.h"

namespace kiln::reftest {

using ir::DType;
using ir::OpKind;
using ir::Shape;
using runtime::Tensor;

// The dtype a C++ element type stands for in tests (bool tensors use makeBool, f16 and bf16
// tensors use makeBits).
template <class T>
constexpr DType dtypeOf() {
  if constexpr (std::is_same_v<T, float>)
    return DType::kF32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::kF64;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::kI64;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::kI32;
  else if constexpr (std::is_same_v<T, int8_t>)
    return DType::kI8;
  else if constexpr (std::is_same_v<T, uint8_t>)
    return DType::kU8;
  else if constexpr (std::is_same_v<T, int16_t>)
    return DType::kI16;
  else if constexpr (std::is_same_v<T, uint16_t>)
    return DType::kU16;
  else if constexpr (std::is_same_v<T, uint32_t>)
    return DType::kU32;
  else if constexpr (std::is_same_v<T, uint64_t>)
    return DType::kU64;
  else
    static_assert(sizeof(T) == 0, "no dtype for this element type");
}

// A tensor of `dtype` holding `values` (raw elements of that dtype's size).
template <class T>
Tensor makeAs(DType dtype, Shape shape, const std::vector<T>& values) {
  REQUIRE(ir::dtypeSize(dtype) == sizeof(T));
  REQUIRE(ir::numElements(shape) == static_cast<int64_t>(values.size()));
  auto t = Tensor::empty(dtype, std::move(shape));
  REQUIRE(t.hasValue());
  if (!values.empty()) std::memcpy(t->rawData(), values.data(), values.size() * sizeof(T));
  return *t;
}

// A tensor whose dtype follows T; values are converted to T (so literals can be ints).
template <class T, class V = T>
Tensor make(Shape shape, const std::vector<V>& values) {
  std::vector<T> converted(values.begin(), values.end());
  return makeAs<T>(dtypeOf<T>(), std::move(shape), converted);
}

inline Tensor makeBool(Shape shape, const std::vector<uint8_t>& values) {
  return makeAs<uint8_t>(DType::kBool, std::move(shape), values);
}
// f16 or bf16 from bit patterns.
inline Tensor makeBits(DType dtype, Shape shape, const std::vector<uint16_t>& bits) {
  return makeAs<uint16_t>(dtype, std::move(shape), bits);
}

template <class T>
std::vector<T> values(const Tensor& t) {
  REQUIRE(ir::dtypeSize(t.dtype()) == sizeof(T));
  std::vector<T> v(static_cast<size_t>(t.numElements()));
  if (!v.empty()) std::memcpy(v.data(), t.rawData(), v.size() * sizeof(T));
  return v;
}

// Runs `op` with the reference kernel and returns its only output; fails the test on error.
inline Tensor run(OpKind op, std::vector<Tensor> inputs, const ir::AttrMap& attrs = {}) {
  auto out = runtime::runReferenceOp(op, std::move(inputs), attrs);
  INFO("op " << ir::opName(op) << ": " << out.status().message());
  REQUIRE(out.hasValue());
  REQUIRE(out->size() == 1);
  return (*out)[0];
}

// Runs `op` expecting an error and returns it.
inline Status runError(OpKind op, std::vector<Tensor> inputs, const ir::AttrMap& attrs = {}) {
  auto out = runtime::runReferenceOp(op, std::move(inputs), attrs);
  REQUIRE_FALSE(out.hasValue());
  return out.status();
}

template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, float> ? 1e-6 : 1e-12;
}

// Checks dtype, shape and every element against hand-computed values, with a relative and an
// absolute tolerance of tolerance<T>(). NaN expects NaN; infinities must match exactly.
template <class T>
void checkClose(const Tensor& t, const Shape& shape, const std::vector<double>& expected) {
  REQUIRE(t.dtype() == dtypeOf<T>());
  REQUIRE(t.shape() == shape);
  const std::vector<T> got = values<T>(t);
  REQUIRE(got.size() == expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << " of " << t.describe());
    const auto g = static_cast<double>(got[i]);
    if (std::isnan(expected[i])) {
      CHECK(std::isnan(g));
    } else if (std::isinf(expected[i])) {
      CHECK(g == expected[i]);
    } else {
      CHECK(g == Approx(expected[i]).epsilon(tolerance<T>()).margin(tolerance<T>()));
    }
  }
}

// Checks dtype, shape and exact values (integers, or floats that must be exact).
template <class T, class V = T>
void checkExact(const Tensor& t, const Shape& shape, const std::vector<V>& expected) {
  REQUIRE(t.dtype() == dtypeOf<T>());
  REQUIRE(t.shape() == shape);
  CHECK(values<T>(t) == std::vector<T>(expected.begin(), expected.end()));
}

// Attribute value helpers, so test tables read like the IR.
inline ir::AttrValue attrInts(std::vector<int64_t> v) {
  return v;
}
inline ir::AttrValue attrInt(int64_t v) {
  return v;
}
inline ir::AttrValue attrFloat(double v) {
  return v;
}
inline ir::AttrValue attrStr(std::string v) {
  return v;
}

}  // namespace kiln::reftest
