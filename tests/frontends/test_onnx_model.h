// Helpers for the ONNX importer tests: small ModelProtos built through the protobuf API, tensors
// with literal or seeded values, running an imported graph eagerly, and comparisons.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "frontends/onnx/onnx_import.h"
#include "frontends/onnx/onnx_proto.h"
#include "runtime/eager.h"
#include "runtime/reference/kernels.h"

namespace kiln::onnxtest {

using ir::DType;
using ir::Shape;
using runtime::Tensor;
using Dim = std::variant<int64_t, std::string>;  // A size or a dim_param name.

inline constexpr int32_t kFloat = ::onnx::TensorProto::FLOAT;
inline constexpr int32_t kInt64 = ::onnx::TensorProto::INT64;
inline constexpr int32_t kBool = ::onnx::TensorProto::BOOL;

// ---- Attributes.
inline ::onnx::AttributeProto attrInt(const std::string& name, int64_t v) {
  ::onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(::onnx::AttributeProto::INT);
  a.set_i(v);
  return a;
}
inline ::onnx::AttributeProto attrFloat(const std::string& name, float v) {
  ::onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(::onnx::AttributeProto::FLOAT);
  a.set_f(v);
  return a;
}
inline ::onnx::AttributeProto attrString(const std::string& name, const std::string& v) {
  ::onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(::onnx::AttributeProto::STRING);
  a.set_s(v);
  return a;
}
inline ::onnx::AttributeProto attrInts(const std::string& name, const std::vector<int64_t>& v) {
  ::onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(::onnx::AttributeProto::INTS);
  for (int64_t x : v) a.add_ints(x);
  return a;
}
inline ::onnx::AttributeProto attrFloats(const std::string& name, const std::vector<float>& v) {
  ::onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(::onnx::AttributeProto::FLOATS);
  for (float x : v) a.add_floats(x);
  return a;
}

// ---- Tensor protos.
inline ::onnx::TensorProto floatTensor(const std::string& name, const Shape& dims,
                                       const std::vector<float>& v, bool raw = true) {
  ::onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(kFloat);
  for (int64_t d : dims) t.add_dims(d);
  if (raw)
    t.set_raw_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
  else
    for (float x : v) t.add_float_data(x);
  return t;
}
inline ::onnx::TensorProto int64Tensor(const std::string& name, const Shape& dims,
                                       const std::vector<int64_t>& v, bool raw = false) {
  ::onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(kInt64);
  for (int64_t d : dims) t.add_dims(d);
  if (raw)
    t.set_raw_data(
        std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(int64_t)));
  else
    for (int64_t x : v) t.add_int64_data(x);
  return t;
}
inline ::onnx::AttributeProto attrTensor(const std::string& name, ::onnx::TensorProto t) {
  ::onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(::onnx::AttributeProto::TENSOR);
  *a.mutable_t() = std::move(t);
  return a;
}

// A model under construction. Outputs may leave their shape out: the importer lets ONNX shape
// inference fill it in (newer exporters do the same).
class Model {
 public:
  explicit Model(int opset = 17) {
    proto_.set_ir_version(8);
    proto_.set_producer_name("kiln-test");
    auto* imp = proto_.add_opset_import();
    imp->set_domain("");
    imp->set_version(opset);
    proto_.mutable_graph()->set_name("test");
  }

  Model& input(const std::string& name, const std::vector<Dim>& dims, int32_t type = kFloat) {
    addValueInfo(proto_.mutable_graph()->add_input(), name, type, &dims);
    return *this;
  }
  Model& output(const std::string& name, int32_t type = kFloat) {
    addValueInfo(proto_.mutable_graph()->add_output(), name, type, nullptr);
    return *this;
  }
  Model& output(const std::string& name, const std::vector<Dim>& dims, int32_t type = kFloat) {
    addValueInfo(proto_.mutable_graph()->add_output(), name, type, &dims);
    return *this;
  }
  Model& initializer(::onnx::TensorProto t) {
    *proto_.mutable_graph()->add_initializer() = std::move(t);
    return *this;
  }
  Model& init(const std::string& name, const Shape& dims, const std::vector<float>& v) {
    return initializer(floatTensor(name, dims, v));
  }
  Model& initI64(const std::string& name, const Shape& dims, const std::vector<int64_t>& v) {
    return initializer(int64Tensor(name, dims, v));
  }
  Model& node(const std::string& op, const std::vector<std::string>& inputs,
              const std::vector<std::string>& outputs,
              const std::vector<::onnx::AttributeProto>& attrs = {}, const std::string& name = "",
              const std::string& domain = "") {
    auto* n = proto_.mutable_graph()->add_node();
    n->set_op_type(op);
    n->set_name(name);
    n->set_domain(domain);
    for (const auto& i : inputs) n->add_input(i);
    for (const auto& o : outputs) n->add_output(o);
    for (const auto& a : attrs) *n->add_attribute() = a;
    return *this;
  }
  Model& opsetImport(const std::string& domain, int version) {
    auto* imp = proto_.add_opset_import();
    imp->set_domain(domain);
    imp->set_version(version);
    return *this;
  }

  ::onnx::ModelProto& proto() { return proto_; }
  std::string bytes() const { return proto_.SerializeAsString(); }

 private:
  static void addValueInfo(::onnx::ValueInfoProto* vi, const std::string& name, int32_t type,
                           const std::vector<Dim>* dims) {
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(type);
    if (!dims) return;
    auto* shape = tt->mutable_shape();
    for (const Dim& d : *dims) {
      auto* dim = shape->add_dim();
      if (std::holds_alternative<int64_t>(d))
        dim->set_dim_value(std::get<int64_t>(d));
      else
        dim->set_dim_param(std::get<std::string>(d));
    }
  }

  ::onnx::ModelProto proto_;
};

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
