// NodeContext: what an op mapper sees of the import for one node.
#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_importer.h"
#include "frontends/onnx/onnx_tensor.h"
#include "ir/op_table.h"

namespace kiln::frontends::onnx_import {

NodeContext::NodeContext(Importer& importer, const ::onnx::NodeProto& node, int opset, int version)
    : imp_(importer), node_(node), opset_(opset), version_(version) {}

namespace {
const ::onnx::AttributeProto* findAttr(const ::onnx::NodeProto& node, std::string_view name) {
  for (const auto& a : node.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

Status wrongKind(std::string_view name, const char* kind) {
  return invalidArgument("attribute '" + std::string(name) + "' must be " + kind);
}

Status missingValue(std::string_view name) {
  return invalidArgument("attribute '" + std::string(name) +
                         "' declares its type but holds no value");
}
}  // namespace

bool NodeContext::hasAttr(std::string_view name) const {
  return findAttr(node_, name) != nullptr;
}

Expected<int64_t> NodeContext::attrInt(std::string_view name, std::optional<int64_t> def) const {
  const auto* a = findAttr(node_, name);
  if (!a) {
    if (def) return *def;
    return invalidArgument("missing required attribute '" + std::string(name) + "'");
  }
  if (a->type() != ::onnx::AttributeProto::INT) return wrongKind(name, "an int");
  // ONNX's own readers fall back to the default when the value field is absent; kiln does not
  // guess which one the producer meant.
  if (!a->has_i()) return missingValue(name);
  return a->i();
}

Expected<bool> NodeContext::attrBool(std::string_view name, bool def) const {
  KILN_ASSIGN_OR_RETURN(int64_t v, attrInt(name, def ? 1 : 0));
  if (v != 0 && v != 1)
    return invalidArgument("attribute '" + std::string(name) +
                           "' is a flag and must be 0 or 1, not " + std::to_string(v));
  return v == 1;
}

Expected<double> NodeContext::attrFloat(std::string_view name, std::optional<double> def) const {
  const auto* a = findAttr(node_, name);
  if (!a) {
    if (def) return *def;
    return invalidArgument("missing required attribute '" + std::string(name) + "'");
  }
  if (a->type() != ::onnx::AttributeProto::FLOAT) return wrongKind(name, "a float");
  if (!a->has_f()) return missingValue(name);
  return static_cast<double>(a->f());
}

Expected<std::string> NodeContext::attrString(std::string_view name,
                                              std::optional<std::string> def) const {
  const auto* a = findAttr(node_, name);
  if (!a) {
    if (def) return *def;
    return invalidArgument("missing required attribute '" + std::string(name) + "'");
  }
  if (a->type() != ::onnx::AttributeProto::STRING) return wrongKind(name, "a string");
  if (!a->has_s()) return missingValue(name);
  return a->s();
}

Expected<std::vector<int64_t>> NodeContext::attrInts(
    std::string_view name, std::optional<std::vector<int64_t>> def) const {
  const auto* a = findAttr(node_, name);
  if (!a) {
    if (def) return *def;
    return invalidArgument("missing required attribute '" + std::string(name) + "'");
  }
  if (a->type() != ::onnx::AttributeProto::INTS) return wrongKind(name, "a list of ints");
  return std::vector<int64_t>(a->ints().begin(), a->ints().end());
}

Expected<std::vector<double>> NodeContext::attrFloats(std::string_view name) const {
  const auto* a = findAttr(node_, name);
  if (!a) return invalidArgument("missing required attribute '" + std::string(name) + "'");
  if (a->type() != ::onnx::AttributeProto::FLOATS) return wrongKind(name, "a list of floats");
  return std::vector<double>(a->floats().begin(), a->floats().end());
}

Expected<std::vector<std::string>> NodeContext::attrStrings(
    std::string_view name, std::optional<std::vector<std::string>> def) const {
  const auto* a = findAttr(node_, name);
  if (!a) {
    if (def) return *def;
    return invalidArgument("missing required attribute '" + std::string(name) + "'");
  }
  if (a->type() != ::onnx::AttributeProto::STRINGS) return wrongKind(name, "a list of strings");
  return std::vector<std::string>(a->strings().begin(), a->strings().end());
}

Expected<ir::TensorData> NodeContext::attrTensor(std::string_view name) const {
  const auto* a = findAttr(node_, name);
  if (!a) return invalidArgument("missing required attribute '" + std::string(name) + "'");
  if (a->type() != ::onnx::AttributeProto::TENSOR) return wrongKind(name, "a tensor");
  if (!a->has_t()) return missingValue(name);
  return tensorFromProto(a->t(), "attribute '" + std::string(name) + "'");
}

OnnxValue& NodeContext::input(size_t i) {
  // importNode checked that every named input is defined.
  return *imp_.find(node_.input(static_cast<int>(i)));
}

Expected<ir::TensorType> NodeContext::inputType(size_t i) {
  if (!hasInput(i)) return invalidArgument("input " + std::to_string(i) + " is absent");
  OnnxValue& v = input(i);
  if (v.value) return v.value->type();
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* data,
                        imp_.constantOf(node_.input(static_cast<int>(i)), v));
  if (!data) return internalError("input " + std::to_string(i) + " has no type");
  return data->type();
}

Expected<const ir::TensorData*> NodeContext::constant(size_t i) {
  if (!hasInput(i)) return nullptr;
  return imp_.constantOf(node_.input(static_cast<int>(i)), input(i));
}

Expected<const ir::TensorData*> NodeContext::requireConstant(size_t i) {
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* c, constant(i));
  if (!c && hasInput(i)) imp_.noteNeededConstant(node_.input(static_cast<int>(i)));
  return c;
}

Expected<int64_t> NodeContext::runtimeSize(ir::OpKind op, ir::AttrMap attrs,
                                           std::vector<size_t> inputs) {
  for (size_t i : inputs)
    if (!hasInput(i))
      return invalidArgument("input " + std::to_string(i) +
                             " is required (its size is computed "
                             "from it)");
  const std::string key = std::string(kSizeOf) + node_.output(0);
  if (std::optional<int64_t> size = imp_.runtimeSize(key)) return *size;
  // The op must take these inputs at some size before a stage ends for it: an input's dtype or an
  // attribute it rejects is the import's error, not one after the stages before it ran.
  std::vector<ir::TensorType> types;
  for (size_t i : inputs) {
    KILN_ASSIGN_OR_RETURN(ir::TensorType t, inputType(i));
    types.push_back(std::move(t));
  }
  ir::AttrMap probe = attrs;
  probe["count"] = int64_t{0};
  if (Expected<std::vector<ir::TensorType>> none = ir::inferTypes(op, types, probe); !none) {
    probe["count"] = int64_t{1};
    if (!ir::inferTypes(op, types, probe)) return none.status();
  }
  SizeRequest request{op, std::move(attrs), {}, key, describeNode(node_, opset_), "its size"};
  for (size_t i : inputs) request.inputs.push_back(node_.input(static_cast<int>(i)));
  return imp_.requestSize(std::move(request),
                          "the size of its output depends on the values of its input, known only "
                          "at run time");
}

Expected<int64_t> NodeContext::runtimeValue(size_t i, const std::string& what) {
  if (!hasInput(i)) return invalidArgument("input " + std::to_string(i) + " is required");
  const std::string& name = node_.input(static_cast<int>(i));
  const std::string key = std::string(kValueOf) + name;
  if (std::optional<int64_t> v = imp_.runtimeSize(key)) return *v;
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, inputType(i));
  if (t.numElements() != 1 || !(ir::isInteger(t.dtype) || t.dtype == ir::DType::kBool))
    return invalidArgument(what + " (input " + std::to_string(i) +
                           ") must be one integer or bool value, got " + t.toString());
  SizeRequest request{ir::OpKind::kCast,           {{"to", std::string("i64")}}, {name}, key,
                      describeNode(node_, opset_), what + " '" + name + "'"};
  return imp_.requestSize(std::move(request), what + " is computed at run time");
}

bool NodeContext::inputTrainable(size_t i) {
  return hasInput(i) && input(i).trainable;
}

bool NodeContext::allInputsConstant() {
  for (size_t i = 0; i < numInputs(); ++i) {
    if (!hasInput(i)) continue;
    auto c = constant(i);
    if (!c || !*c) return false;
  }
  return true;
}

Expected<ir::Value*> NodeContext::value(size_t i, bool trainable) {
  if (!hasInput(i))
    return invalidArgument("input " + std::to_string(i) + " is required but absent");
  if (!input(i).pendingPads.empty())
    return internalError("input " + std::to_string(i) + " carries a folded Pad");
  return imp_.valueOf(node_.input(static_cast<int>(i)), input(i), trainable);
}

Expected<std::vector<int64_t>> NodeContext::constInts(size_t i, const std::string& what) {
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* c, requireConstant(i));
  if (!c)
    return unimplemented(what + " (input " + std::to_string(i) + ") must be known at import " +
                         "(a constant, an initializer, or computed from static shapes)");
  return toInts(*c, what);
}

Expected<double> NodeContext::constScalar(size_t i, const std::string& what) {
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* c, requireConstant(i));
  if (!c)
    return unimplemented(what + " (input " + std::to_string(i) + ") must be known at import " +
                         "(a constant or an initializer)");
  return toScalar(*c, what);
}

const std::vector<int64_t>& NodeContext::pendingPads(size_t i) {
  static const std::vector<int64_t> kNone;
  return hasInput(i) ? input(i).pendingPads : kNone;
}

Expected<ir::Value*> NodeContext::valueNamed(const std::string& onnxName) {
  OnnxValue* v = imp_.find(onnxName);
  if (!v) return internalError("value '" + onnxName + "' is not defined");
  return imp_.valueOf(onnxName, *v, true);
}

bool NodeContext::outputUsed(size_t k) const {
  return k < numOutputs() && !node_.output(static_cast<int>(k)).empty() &&
         imp_.numConsumers(node_.output(static_cast<int>(k))) > 0;
}

const std::vector<const ::onnx::NodeProto*>& NodeContext::outputConsumers(size_t k) const {
  return imp_.consumerNodes(node_.output(static_cast<int>(k)));
}

int NodeContext::outputConsumerCount(size_t k) const {
  return imp_.numConsumers(node_.output(static_cast<int>(k)));
}

Expected<ir::Value*> NodeContext::emit(ir::OpKind op, std::vector<ir::Value*> inputs,
                                       ir::AttrMap attrs, int output) {
  // importNode refuses nodes without outputs; a mapper naming an output the node lacks is a
  // malformed node (no checker may have run).
  if (output >= node_.output_size())
    return invalidArgument("the node has " + std::to_string(node_.output_size()) +
                           " outputs; output " + std::to_string(output) + " is missing");
  const std::string want =
      output >= 0 ? node_.output(output) : node_.output(0) + "/" + std::string(ir::opName(op));
  auto node =
      imp_.graph().addNode(op, std::move(inputs), std::move(attrs), {imp_.uniqueName(want)});
  // The node passed ONNX's checker or kiln's schema checks, so kiln rejecting it means kiln
  // cannot express it.
  if (!node)
    return unimplemented("kiln's " + std::string(ir::opName(op)) +
                         " cannot express it: " + node.status().message());
  (*node)->setName(node_.name());
  if (output >= 0) setOutput(static_cast<size_t>(output), (*node)->output());
  return (*node)->output();
}

Expected<ir::Value*> NodeContext::constantValue(ir::TensorData data) {
  return imp_.graph().addParameter(imp_.uniqueName(node_.output(0) + "/const"), std::move(data),
                                   false);
}

void NodeContext::setOutput(size_t k, ir::Value* v) {
  if (k >= numOutputs()) return;  // Not an output of this node: nothing reads it.
  const std::string& name = node_.output(static_cast<int>(k));
  if (name.empty()) return;
  OnnxValue& out = imp_.define(name);
  out = OnnxValue{};
  out.value = v;
}

void NodeContext::setConstantOutput(size_t k, ir::TensorData data, bool trainable) {
  if (k >= numOutputs()) return;
  const std::string& name = node_.output(static_cast<int>(k));
  if (name.empty()) return;
  OnnxValue& out = imp_.define(name);
  out = OnnxValue{};
  out.trainable = trainable && ir::isFloat(data.dtype());
  out.constant = std::move(data);
}

void NodeContext::setOutputValue(size_t k, const OnnxValue& v) {
  if (k >= numOutputs()) return;
  const std::string& name = node_.output(static_cast<int>(k));
  if (name.empty()) return;
  imp_.define(name) = v;
}

Expected<const ::onnx::GraphProto*> NodeContext::attrGraph(std::string_view name) const {
  const auto* a = findAttr(node_, name);
  if (!a) return invalidArgument("missing required attribute '" + std::string(name) + "'");
  if (a->type() != ::onnx::AttributeProto::GRAPH || !a->has_g()) return wrongKind(name, "a graph");
  return &a->g();
}

Expected<ir::Value*> NodeContext::valueOf(const OnnxValue& v) {
  if (v.value) return v.value;
  if (v.constant) return constantValue(*v.constant);
  return internalError(opType() + ": a subgraph value has neither data nor a value");
}

void NodeContext::setPaddedOutput(size_t k, ir::Value* unpadded, std::vector<int64_t> pads) {
  if (k >= numOutputs()) return;
  const std::string& name = node_.output(static_cast<int>(k));
  OnnxValue& out = imp_.define(name);
  out = OnnxValue{};
  out.value = unpadded;
  out.pendingPads = std::move(pads);
}

}  // namespace kiln::frontends::onnx_import
