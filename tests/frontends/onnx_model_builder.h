// Small ONNX ModelProtos built through the protobuf API: attributes, tensors with literal values,
// and a Model builder. Shared by the ONNX importer tests and the fuzz seed writer
// (tests/fuzz/make_seeds.cpp), so it needs neither Catch2 nor the runtime.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "frontends/onnx/onnx_proto.h"
#include "ir/types.h"

namespace kiln::onnxtest {

using ir::Shape;
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

inline ::onnx::AttributeProto attrStrings(const std::string& name,
                                          const std::vector<std::string>& v) {
  ::onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(::onnx::AttributeProto::STRINGS);
  for (const auto& x : v) a.add_strings(x);
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

inline ::onnx::AttributeProto attrGraph(const std::string& name, const ::onnx::GraphProto& g) {
  ::onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(::onnx::AttributeProto::GRAPH);
  *a.mutable_g() = g;
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

  Model& irVersion(int64_t v) {
    proto_.set_ir_version(v);
    return *this;
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

}  // namespace kiln::onnxtest
