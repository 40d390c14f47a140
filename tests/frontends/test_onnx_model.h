// Helpers for the ONNX importer tests: small ModelProtos built through the protobuf API, tensors
// with literal or seeded values, running an imported graph eagerly, and comparisons.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "frontends/onnx/onnx_import.h"
#include "frontends/onnx_model_builder.h"
#include "runtime/eager.h"
#include "runtime/reference/kernels.h"

namespace kiln::onnxtest {

using ir::DType;
using ir::Shape;
using runtime::Tensor;

// ---- Tensors.
inline Tensor makeF32(Shape shape, const std::vector<float>& v) {
  auto t = Tensor::empty(DType::kF32, std::move(shape));
  REQUIRE(t.hasValue());
  REQUIRE(t->numElements() == static_cast<int64_t>(v.size()));
  if (!v.empty()) std::memcpy(t->rawData(), v.data(), v.size() * sizeof(float));
  return *t;
}
inline Tensor makeI64(Shape shape, const std::vector<int64_t>& v) {
  auto t = Tensor::empty(DType::kI64, std::move(shape));
  REQUIRE(t.hasValue());
  REQUIRE(t->numElements() == static_cast<int64_t>(v.size()));
  if (!v.empty()) std::memcpy(t->rawData(), v.data(), v.size() * sizeof(int64_t));
  return *t;
}
// Seeded values in [lo, hi).
inline std::vector<float> randomValues(size_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}
inline std::vector<float> floats(const Tensor& t) {
  REQUIRE(t.dtype() == DType::kF32);
  auto c = t.contiguous();
  REQUIRE(c.hasValue());
  std::vector<float> v(static_cast<size_t>(c->numElements()));
  if (!v.empty()) std::memcpy(v.data(), c->rawData(), v.size() * sizeof(float));
  return v;
}
inline std::vector<int64_t> int64s(const Tensor& t) {
  REQUIRE(t.dtype() == DType::kI64);
  std::vector<int64_t> v(static_cast<size_t>(t.numElements()));
  if (!v.empty()) std::memcpy(v.data(), t.rawData(), v.size() * sizeof(int64_t));
  return v;
}

// ---- Importing and running.
inline ir::Graph import(const Model& m, const frontends::OnnxImportOptions& options = {}) {
  auto g = frontends::loadOnnxFromBytes(m.bytes(), options, "", "test.onnx");
  INFO(g.status().message());
  REQUIRE(g.hasValue());
  return std::move(*g);
}

inline Status importError(const Model& m, const frontends::OnnxImportOptions& options = {}) {
  auto g = frontends::loadOnnxFromBytes(m.bytes(), options, "", "test.onnx");
  REQUIRE_FALSE(g.hasValue());
  return g.status();
}

inline std::vector<Tensor> runGraph(const ir::Graph& g, std::vector<Tensor> inputs) {
  runtime::EagerExecutor exec(g);
  auto out = exec.run(inputs);
  INFO(out.status().message());
  REQUIRE(out.hasValue());
  return std::move(*out);
}

// Imports `m`, runs it eagerly on `inputs` and returns its outputs.
inline std::vector<Tensor> run(const Model& m, std::vector<Tensor> inputs,
                               const frontends::OnnxImportOptions& options = {}) {
  const ir::Graph g = import(m, options);
  return runGraph(g, std::move(inputs));
}

// The one output of a kiln reference op (the independent expectation for a mapping).
inline Tensor reference(ir::OpKind op, std::vector<Tensor> inputs, const ir::AttrMap& attrs = {}) {
  auto out = runtime::runReferenceOp(op, std::move(inputs), attrs);
  INFO(out.status().message());
  REQUIRE(out.hasValue());
  return (*out)[0];
}

// Every element within 1e-5 relative error of the expectation (relative to the largest
// expected magnitude, so that elements near zero do not demand exactness).
inline void checkClose(const std::vector<float>& got, const std::vector<float>& want,
                       double rel = 1e-5) {
  REQUIRE(got.size() == want.size());
  double scale = 0;
  for (float w : want) scale = std::max(scale, std::fabs(static_cast<double>(w)));
  scale = std::max(scale, 1e-30);
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    CHECK(std::fabs(static_cast<double>(got[i]) - want[i]) <= rel * scale);
  }
}
inline void checkClose(const Tensor& got, const Shape& shape, const std::vector<float>& want) {
  REQUIRE(got.shape() == shape);
  checkClose(floats(got), want);
}
inline void checkClose(const Tensor& got, const Tensor& want) {
  REQUIRE(got.shape() == want.shape());
  checkClose(floats(got), floats(want));
}

// How many nodes of `op` the graph has.
inline int countOps(const ir::Graph& g, ir::OpKind op) {
  int n = 0;
  for (const ir::Node* node : g.nodes()) n += node->op() == op;
  return n;
}

}  // namespace kiln::onnxtest
