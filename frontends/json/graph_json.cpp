#include "frontends/json/graph_json.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "frontends/file_io.h"
#include "ir/verifier.h"

namespace kiln::frontends {

namespace fs = std::filesystem;
// Insertion-ordered, so that saved files list keys in the documented order.
using Json = nlohmann::ordered_json;

namespace {

constexpr std::string_view kFormatTag = "kiln-graph";

// ---- Small JSON helpers.

// A JSON value as error messages show it: scalars as written, containers by kind.
std::string shown(const Json& j) {
  if (j.is_object()) return "an object";
  if (j.is_array()) return "an array";
  std::string s = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

std::string inQuotes(std::string_view s) {
  return "'" + std::string(s) + "'";
}

std::string joined(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += (s.empty() ? "" : ", ") + i;
  return s;
}

// In a graph file a duplicate key (two "strides" attributes, two "nodes" arrays) is a mistake
// the user should hear about, not one for nlohmann to resolve by keeping the last.
Expected<Json> parseJson(const std::string& text, const std::string& where) {
  StrictJson<Json> parsed = parseStrictJson<Json>(text);
  if (parsed.parseError) return invalidArgument(where + ": invalid JSON: " + *parsed.parseError);
  if (parsed.duplicateKey)
    return invalidArgument(where + ": the key " + inQuotes(*parsed.duplicateKey) +
                           " appears twice in one object");
  return std::move(parsed.value);
}

// ---- Attribute encoding, shared by save, load and the public encode/decode.

// JSON has no infinities or NaN; they are written as the strings "inf", "-inf" and "nan".
Json floatToJson(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return v;
}

Expected<double> floatFromJson(const Json& j, const std::string& what) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const auto& s = j.get_ref<const std::string&>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
  }
  return invalidArgument(what + " must be a number (or \"inf\", \"-inf\", \"nan\"), got " +
                         shown(j));
}

Expected<int64_t> intFromJson(const Json& j, const std::string& what) {
  if (j.is_number_unsigned() &&
      j.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    return invalidArgument(what + " does not fit in a 64-bit integer: " + shown(j));
  if (!j.is_number_integer()) return invalidArgument(what + " must be an integer, got " + shown(j));
  return j.get<int64_t>();
}

Expected<Json> attrToJson(const ir::AttrValue& value, const std::string& tensorKey,
                          TensorMap& weights) {
  const ir::AttrKind kind = ir::kindOf(value);
  Json encoded;
  switch (kind) {
    case ir::AttrKind::kInt:
      encoded = std::get<int64_t>(value);
      break;
    case ir::AttrKind::kFloat:
      encoded = floatToJson(std::get<double>(value));
      break;
    case ir::AttrKind::kString:
      encoded = std::get<std::string>(value);
      break;
    case ir::AttrKind::kInts:
      encoded = std::get<std::vector<int64_t>>(value);
      break;
    case ir::AttrKind::kFloats:
      encoded = Json::array();
      for (double d : std::get<std::vector<double>>(value)) encoded.push_back(floatToJson(d));
      break;
    case ir::AttrKind::kTensor: {
      const auto& t = std::get<ir::TensorData>(value);
      if (t.empty()) return invalidArgument("the tensor attribute has no data");
      if (!tensorKey.starts_with(kTensorAttrPrefix))
        return internalError("tensor attribute key " + inQuotes(tensorKey) + " must start with " +
                             inQuotes(kTensorAttrPrefix));
      weights[tensorKey] = t;
      encoded = tensorKey;
      break;
    }
  }
  Json j = Json::object();
  j[std::string(ir::attrKindName(kind))] = std::move(encoded);
  return j;
}

// Decodes {"<kind>": value}. `expected` is the op's schema kind when known. `what` names the
// attribute in messages; `used` collects the weights keys that tensor attributes read.
Expected<ir::AttrValue> attrFromJson(const Json& j, std::optional<ir::AttrKind> expected,
                                     const TensorMap& weights, std::set<std::string>* used,
                                     const std::string& what) {
  if (!j.is_object() || j.size() != 1)
    return invalidArgument(what + " must be an object with one key naming its kind, e.g. " +
                           "{\"ints\": [1, 1]}, got " + shown(j));
  const std::string& kindName = j.begin().key();
  const Json& v = j.begin().value();
  auto kind = ir::parseAttrKind(kindName);
  if (!kind)
    return invalidArgument(what + " has unknown kind " + inQuotes(kindName) +
                           " (expected int, float, string, ints, floats or tensor)");
  if (expected && *kind != *expected)
    return invalidArgument(what + " must be " + std::string(ir::attrKindName(*expected)) +
                           ", got " + kindName);
  const std::string typed = what + " (" + kindName + ")";
  switch (*kind) {
    case ir::AttrKind::kInt: {
      KILN_ASSIGN_OR_RETURN(int64_t i, intFromJson(v, typed));
      return ir::AttrValue(i);
    }
    case ir::AttrKind::kFloat: {
      KILN_ASSIGN_OR_RETURN(double d, floatFromJson(v, typed));
      return ir::AttrValue(d);
    }
    case ir::AttrKind::kString:
      if (!v.is_string()) return invalidArgument(typed + " must be a string, got " + shown(v));
      return ir::AttrValue(v.get<std::string>());
    case ir::AttrKind::kInts: {
      if (!v.is_array())
        return invalidArgument(typed + " must be an array of integers, got " + shown(v));
      std::vector<int64_t> out;
      for (const Json& e : v) {
        KILN_ASSIGN_OR_RETURN(int64_t i, intFromJson(e, typed + " element"));
        out.push_back(i);
      }
      return ir::AttrValue(std::move(out));
    }
    case ir::AttrKind::kFloats: {
      if (!v.is_array())
        return invalidArgument(typed + " must be an array of numbers, got " + shown(v));
      std::vector<double> out;
      for (const Json& e : v) {
        KILN_ASSIGN_OR_RETURN(double d, floatFromJson(e, typed + " element"));
        out.push_back(d);
      }
      return ir::AttrValue(std::move(out));
    }
    case ir::AttrKind::kTensor: {
      if (!v.is_string() || !v.get_ref<const std::string&>().starts_with(kTensorAttrPrefix))
        return invalidArgument(typed + " must be the weights-file key of the tensor, a string " +
                               "starting with " + inQuotes(kTensorAttrPrefix) + ", got " +
                               shown(v));
      const auto& key = v.get_ref<const std::string&>();
      auto it = weights.find(key);
      if (it == weights.end())
        return invalidArgument(typed + ": the weights file has no tensor " + inQuotes(key));
      if (used) used->insert(key);
      return ir::AttrValue(it->second);
    }
  }
  return internalError(what + ": unhandled attribute kind");
}

// ---- Saving.

Json typeToJson(const std::string& name, const ir::TensorType& t) {
  Json j = Json::object();
  j["name"] = name;
  j["dtype"] = std::string(ir::dtypeName(t.dtype));
  j["shape"] = t.shape;
  j["layout"] = std::string(ir::layoutName(t.layout));
  return j;
}

// One JSON array of the document, one element per line, so that files diff well.
void appendArray(std::string& out, const char* key, const std::vector<Json>& items, bool last) {
  out += "  \"" + std::string(key) + "\": [";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ",\n    " : "\n    ") + items[i].dump();
  out += items.empty() ? "]" : "\n  ]";
  out += last ? "\n" : ",\n";
}

Expected<std::string> graphToText(const ir::Graph& g, const std::string& weightsName,
                                  TensorMap& weights) {
  std::vector<Json> inputs, parameters, nodes;
  for (const ir::Value* v : g.inputs()) {
    Json j = typeToJson(v->name(), v->type());
    if (v->hasDimNames()) j["dim_names"] = v->dimNames();
    inputs.push_back(std::move(j));
  }
  for (const ir::Value* p : g.parameters()) {
    if (p->data().empty())
      return invalidArgument("parameter " + inQuotes(p->name()) +
                             " has no data; attach its weights before saving");
    Json j = typeToJson(p->name(), p->type());
    j["trainable"] = p->trainable();
    if (p->isState()) j["state"] = true;
    parameters.push_back(std::move(j));
    weights[p->name()] = p->data();
  }
  const std::vector<ir::Node*> graphNodes = g.nodes();
  for (size_t i = 0; i < graphNodes.size(); ++i) {
    const ir::Node* n = graphNodes[i];
    Json j = Json::object();
    j["op"] = std::string(ir::opName(n->op()));
    if (!n->name().empty()) j["name"] = n->name();
    j["inputs"] = Json::array();
    for (const ir::Value* in : n->inputs()) j["inputs"].push_back(in->name());
    j["outputs"] = Json::array();
    for (const ir::Value* out : n->outputs())
      j["outputs"].push_back(typeToJson(out->name(), out->type()));
    if (!n->attrs().empty()) {
      Json attrs = Json::object();
      for (const auto& [name, value] : n->attrs()) {
        const std::string key = std::string(kTensorAttrPrefix) + std::to_string(i) + "/" + name;
        auto encoded = attrToJson(value, key, weights);
        if (!encoded)
          return encoded.status().withContext("node " + std::to_string(i) + " (" + n->describe() +
                                              "): attribute " + inQuotes(name));
        attrs[name] = std::move(*encoded);
      }
      j["attributes"] = std::move(attrs);
    }
    nodes.push_back(std::move(j));
  }
  std::vector<Json> outputs;
  for (const ir::Value* v : g.outputs()) outputs.push_back(v->name());

  std::string text = "{\n";
  text += "  \"format\": \"" + std::string(kFormatTag) + "\",\n";
  text += "  \"version\": " + std::to_string(kGraphJsonVersion) + ",\n";
  text += "  \"name\": " + Json(g.name()).dump() + ",\n";
  text += "  \"weights\": " + Json(weightsName).dump() + ",\n";
  appendArray(text, "inputs", inputs, false);
  appendArray(text, "parameters", parameters, false);
  appendArray(text, "nodes", nodes, false);
  appendArray(text, "outputs", outputs, true);
  return text + "}\n";
}

// ---- Loading.

// The few known op names closest to `name`, for "did you mean" messages.
std::string closestOps(std::string_view name) {
  std::vector<std::pair<size_t, std::string>> ranked;
  for (int k = 0; k < ir::kNumOps; ++k) {
    const std::string_view op = ir::opName(static_cast<ir::OpKind>(k));
    ranked.emplace_back(ir::nameDistance(name, op), std::string(op));
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> best;
  for (size_t i = 0; i < ranked.size() && i < 4; ++i) best.push_back(ranked[i].second);
  return joined(best);
}

std::string describeDefinition(const ir::Value* v) {
  if (v->isInput()) return "graph input " + inQuotes(v->name());
  if (v->isParameter()) return "parameter " + inQuotes(v->name());
  return v->producer() ? "an output of " + v->producer()->describe() : "another value";
}

class GraphLoader {
 public:
  explicit GraphLoader(std::string path) : path_(std::move(path)) {}

  Expected<ir::Graph> load(const Json& doc) {
    if (!doc.is_object())
      return fail("", "a kiln graph file must be a JSON object, got " + shown(doc));
    const auto format = doc.find("format");
    if (format == doc.end() || !format->is_string() || *format != kFormatTag)
      return fail("", "not a kiln graph: \"format\" must be \"" + std::string(kFormatTag) +
                          "\", got " + (format == doc.end() ? "nothing" : shown(*format)));
    const auto version = doc.find("version");
    if (version == doc.end() || !version->is_number_integer())
      return fail("", "\"version\" must be an integer, got " +
                          (version == doc.end() ? "nothing" : shown(*version)));
    if (*version != kGraphJsonVersion)
      return fail("",
                  "unsupported kiln-graph version " + shown(*version) + " (this kiln reads " +
                      "version " + std::to_string(kGraphJsonVersion) + ")",
                  ErrorCode::kUnimplemented);
    KILN_TRY(checkKeys(
        doc, "",
        {"format", "version", "name", "weights", "inputs", "parameters", "nodes", "outputs"}, {}));
    KILN_ASSIGN_OR_RETURN(std::string name, getString(doc, "name", ""));
    graph_.setName(std::move(name));
    KILN_TRY(loadWeights(doc.at("weights")));
    KILN_TRY(loadInputs(doc.at("inputs")));
    KILN_TRY(loadParameters(doc.at("parameters")));
    KILN_TRY(loadNodes(doc.at("nodes")));
    KILN_TRY(loadOutputs(doc.at("outputs")));
    for (const auto& [key, tensor] : weights_)
      if (!usedWeights_.count(key))
        return fail("", "the weights file '" + weightsPath_ + "' holds tensor " + inQuotes(key) +
                            ", which is neither a parameter nor a tensor attribute of the " +
                            "graph (is it another model's weights file?)");
    KILN_TRY(ir::verify(graph_).withContext(path_));
    return std::move(graph_);
  }

 private:
  Status fail(const std::string& where, const std::string& msg,
              ErrorCode code = ErrorCode::kInvalidArgument) const {
    return Status(code, path_ + ": " + (where.empty() ? "" : where + ": ") + msg);
  }

  Status checkKeys(const Json& obj, const std::string& where,
                   std::initializer_list<std::string_view> required,
                   std::initializer_list<std::string_view> optional) const {
    if (!obj.is_object()) return fail(where, "must be a JSON object, got " + shown(obj));
    std::vector<std::string> allowed;
    for (auto k : required) allowed.emplace_back(k);
    for (auto k : optional) allowed.emplace_back(k);
    for (const auto& [key, value] : obj.items())
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end())
        return fail(where, "unknown key " + inQuotes(key) + " (expected " + joined(allowed) + ")");
    for (auto k : required)
      if (!obj.contains(std::string(k))) return fail(where, "missing key " + inQuotes(k));
    return Status::ok();
  }

  Expected<std::string> getString(const Json& obj, const char* key,
                                  const std::string& where) const {
    const Json& v = obj.at(key);
    if (!v.is_string())
      return fail(where, "\"" + std::string(key) + "\" must be a string, got " + shown(v));
    return v.get<std::string>();
  }

  // dtype, shape and the optional layout of an input, parameter or node output.
  Expected<ir::TensorType> getType(const Json& obj, const std::string& where) const {
    ir::TensorType t;
    const Json& dtype = obj.at("dtype");
    std::vector<std::string> dtypes;
    for (int i = 0; i < ir::kNumDTypes; ++i)
      dtypes.emplace_back(ir::dtypeName(static_cast<ir::DType>(i)));
    auto parsed =
        dtype.is_string() ? ir::parseDType(dtype.get_ref<const std::string&>()) : std::nullopt;
    if (!parsed)
      return fail(where,
                  "unknown dtype " + shown(dtype) + " (expected one of " + joined(dtypes) + ")");
    t.dtype = *parsed;
    const Json& shape = obj.at("shape");
    const std::string shapeRule = "\"shape\" must be an array of non-negative integers, got ";
    if (!shape.is_array()) return fail(where, shapeRule + shown(shape));
    std::vector<uint64_t> dims;
    for (size_t k = 0; k < shape.size(); ++k) {
      if (!shape[k].is_number_unsigned())
        return fail(where, shapeRule + shown(shape[k]) + " at position " + std::to_string(k));
      dims.push_back(shape[k].get<uint64_t>());
    }
    if (!checkedByteSize(dims, ir::dtypeSize(t.dtype)))
      return fail(where, "\"shape\" " + shape.dump().substr(0, 80) +
                             " is too large (its byte size overflows 64 bits)");
    t.shape.assign(dims.begin(), dims.end());
    if (obj.contains("layout")) {
      const Json& layout = obj.at("layout");
      auto l =
          layout.is_string() ? ir::parseLayout(layout.get_ref<const std::string&>()) : std::nullopt;
      if (!l)
        return fail(where, "unknown layout " + shown(layout) + " (expected plain, nchw or nhwc)");
      t.layout = *l;
    }
    return t;
  }

  // A new value's name: valid and not yet defined.
  Status checkNewName(const std::string& name, const std::string& where) const {
    if (!ir::Graph::isValidName(name))
      return fail(where, "invalid value name " + inQuotes(name) +
                             " (use letters, digits and _ . - / :, at most 256 characters)");
    if (const ir::Value* v = graph_.findValue(name))
      return fail(where, "value name " + inQuotes(name) + " is already defined by " +
                             describeDefinition(v));
    return Status::ok();
  }

  Status loadWeights(const Json& weights) {
    if (!weights.is_string() || weights.get_ref<const std::string&>().empty())
      return fail("", "\"weights\" must be the weights file's name, got " + shown(weights));
    // Inside the JSON file's directory, symlinks resolved, as for ONNX external data: a model
    // file never names files elsewhere on the machine.
    auto resolved =
        resolveInsideDirectory(fs::path(path_).parent_path().string(), weights.get<std::string>(),
                               "\"weights\"", "the JSON file's directory");
    if (!resolved) {
      if (resolved.status().code() == ErrorCode::kNotFound)
        return fail("",
                    "the weights file '" +
                        (fs::path(path_).parent_path() / weights.get<std::string>()).string() +
                        "' does not exist (\"weights\": " + shown(weights) +
                        ", relative to the JSON file's directory)",
                    ErrorCode::kNotFound);
      return fail("", resolved.status().message());
    }
    weightsPath_ = *resolved;
    auto contents = readSafetensorsFile(weightsPath_);
    if (!contents) {
      if (contents.status().code() == ErrorCode::kNotFound)
        return fail("",
                    "the weights file '" + weightsPath_ + "' does not exist (\"weights\": " +
                        shown(weights) + ", relative to the JSON file's directory)",
                    ErrorCode::kNotFound);
      return contents.status().withContext(path_ + ": reading its weights");
    }
    weights_ = std::move(contents->tensors);
    return Status::ok();
  }

  Status loadInputs(const Json& inputs) {
    if (!inputs.is_array()) return fail("", "\"inputs\" must be an array, got " + shown(inputs));
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::string where = "input " + std::to_string(i);
      KILN_TRY(checkKeys(inputs[i], where, {"name", "dtype", "shape"}, {"layout", "dim_names"}));
      KILN_ASSIGN_OR_RETURN(std::string name, getString(inputs[i], "name", where));
      const std::string named = where + " (" + inQuotes(name) + ")";
      KILN_TRY(checkNewName(name, named));
      KILN_ASSIGN_OR_RETURN(ir::TensorType type, getType(inputs[i], named));
      auto v = graph_.addInput(name, std::move(type));
      if (!v) return fail(named, v.status().message());
      if (inputs[i].contains("dim_names")) {
        const Json& names = inputs[i].at("dim_names");
        std::vector<std::string> dimNames;
        if (names.is_array())
          for (const Json& n : names) {
            if (!n.is_string()) break;
            dimNames.push_back(n.get<std::string>());
          }
        if (!names.is_array() || dimNames.size() != names.size())
          return fail(named, "\"dim_names\" must be an array of strings, got " + shown(names));
        if (Status st = graph_.setDimNames(*v, std::move(dimNames)); !st)
          return fail(named, st.message());
      }
    }
    return Status::ok();
  }

  Status loadParameters(const Json& params) {
    if (!params.is_array())
      return fail("", "\"parameters\" must be an array, got " + shown(params));
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string where = "parameter " + std::to_string(i);
      KILN_TRY(checkKeys(params[i], where, {"name", "dtype", "shape"},
                         {"layout", "trainable", "state"}));
      KILN_ASSIGN_OR_RETURN(std::string name, getString(params[i], "name", where));
      const std::string named = where + " (" + inQuotes(name) + ")";
      KILN_TRY(checkNewName(name, named));
      KILN_ASSIGN_OR_RETURN(ir::TensorType type, getType(params[i], named));
      bool trainable = true;
      if (params[i].contains("trainable")) {
        const Json& t = params[i].at("trainable");
        if (!t.is_boolean())
          return fail(named, "\"trainable\" must be true or false, got " + shown(t));
        trainable = t.get<bool>();
      }
      bool state = false;
      if (params[i].contains("state")) {
        const Json& t = params[i].at("state");
        if (!t.is_boolean()) return fail(named, "\"state\" must be true or false, got " + shown(t));
        state = t.get<bool>();
      }
      auto it = weights_.find(name);
      if (it == weights_.end())
        return fail(named,
                    "the weights file '" + weightsPath_ + "' has no tensor " + inQuotes(name));
      const ir::TensorData& data = it->second;
      if (data.dtype() != type.dtype || data.shape() != type.shape)
        return fail(named, "declared " + ir::TensorType{type.dtype, type.shape}.toString() +
                               " but the weights file '" + weightsPath_ + "' holds " +
                               data.type().toString());
      usedWeights_.insert(name);
      auto v = graph_.addParameter(name, std::move(type), trainable);
      if (!v) return fail(named, v.status().message());
      (*v)->setData(data);
      if (state)
        if (Status st = graph_.markState(*v); !st) return fail(named, st.message());
    }
    return Status::ok();
  }

  Status loadNodes(const Json& nodes) {
    if (!nodes.is_array()) return fail("", "\"nodes\" must be an array, got " + shown(nodes));
    for (size_t i = 0; i < nodes.size(); ++i) KILN_TRY(loadNode(nodes[i], i));
    return Status::ok();
  }

  Status loadNode(const Json& j, size_t index) {
    std::string where = "node " + std::to_string(index);
    if (!j.is_object()) return fail(where, "must be a JSON object, got " + shown(j));
    if (!j.contains("op")) return fail(where, "missing key 'op'");
    KILN_ASSIGN_OR_RETURN(std::string opName, getString(j, "op", where));
    const ir::OpInfo* op = ir::findOp(opName);
    if (!op)
      return fail(where, "unknown op " + inQuotes(opName) + " (closest known ops: " +
                             closestOps(opName) + "; ir/ops.def lists them all)");
    std::string nodeName;
    if (j.contains("name")) {
      KILN_ASSIGN_OR_RETURN(nodeName, getString(j, "name", where + " (" + opName + ")"));
    }
    where += " (" + opName + (nodeName.empty() ? "" : " " + inQuotes(nodeName)) + ")";
    KILN_TRY(checkKeys(j, where, {"op", "inputs", "outputs"}, {"name", "attributes"}));

    // Inputs: names of values defined earlier.
    const Json& inputs = j.at("inputs");
    if (!inputs.is_array())
      return fail(where, "\"inputs\" must be an array of value names, got " + shown(inputs));
    std::vector<ir::Value*> inputValues;
    std::vector<ir::TensorType> inputTypes;
    for (size_t k = 0; k < inputs.size(); ++k) {
      if (!inputs[k].is_string())
        return fail(
            where, "input " + std::to_string(k) + " must be a value name, got " + shown(inputs[k]));
      const auto& name = inputs[k].get_ref<const std::string&>();
      ir::Value* v = graph_.findValue(name);
      if (!v)
        return fail(where, "input " + std::to_string(k) + " " + inQuotes(name) +
                               " is not defined (a value must be a graph input, a parameter, " +
                               "or an output of an earlier node)");
      inputValues.push_back(v);
      inputTypes.push_back(v->type());
    }
    const int n = static_cast<int>(inputs.size());
    if (n < op->minInputs || (op->maxInputs >= 0 && n > op->maxInputs)) {
      const std::string expected = op->minInputs == op->maxInputs ? std::to_string(op->minInputs)
                                   : op->maxInputs < 0 ? "at least " + std::to_string(op->minInputs)
                                                       : std::to_string(op->minInputs) + " to " +
                                                             std::to_string(op->maxInputs);
      return fail(where, opName + " takes " + expected + (expected == "1" ? " input" : " inputs") +
                             ", got " + std::to_string(n));
    }

    // Attributes: names and kinds checked against the op's schema.
    ir::AttrMap attrs;
    if (j.contains("attributes")) {
      const Json& a = j.at("attributes");
      if (!a.is_object()) return fail(where, "\"attributes\" must be an object, got " + shown(a));
      for (const auto& [name, value] : a.items()) {
        const ir::AttrSpec* spec = op->findAttr(name);
        if (!spec) {
          std::vector<std::string> known;
          for (const auto& s : op->attrs) known.push_back(s.name);
          return fail(where, opName + " has no attribute " + inQuotes(name) +
                                 " (it takes: " + (known.empty() ? "none" : joined(known)) + ")");
        }
        auto decoded =
            attrFromJson(value, spec->kind, weights_, &usedWeights_, "attribute " + inQuotes(name));
        if (!decoded) return fail(where, decoded.status().message());
        attrs.emplace(name, std::move(*decoded));
      }
    }
    for (const auto& spec : op->attrs)
      if (!spec.defaultValue && !attrs.count(spec.name))
        return fail(where, "missing required attribute " + inQuotes(spec.name) + " (" +
                               std::string(ir::attrKindName(spec.kind)) + ")");

    // Outputs: declared names and types, checked against shape inference.
    const Json& outputs = j.at("outputs");
    if (!outputs.is_array())
      return fail(where, "\"outputs\" must be an array, got " + shown(outputs));
    if (static_cast<int>(outputs.size()) != op->numOutputs)
      return fail(where, "declares " + std::to_string(outputs.size()) + " outputs but " + opName +
                             " produces " + std::to_string(op->numOutputs));
    auto inferred = ir::inferTypes(op->kind, inputTypes, attrs);
    if (!inferred) return fail(where, inferred.status().message(), inferred.status().code());
    std::vector<std::pair<std::string, ir::TensorType>> outs;
    for (size_t k = 0; k < outputs.size(); ++k) {
      const std::string outWhere = where + ": output " + std::to_string(k);
      KILN_TRY(checkKeys(outputs[k], outWhere, {"name", "dtype", "shape"}, {"layout"}));
      KILN_ASSIGN_OR_RETURN(std::string name, getString(outputs[k], "name", outWhere));
      KILN_TRY(checkNewName(name, outWhere));
      for (const auto& o : outs)
        if (o.first == name) return fail(outWhere, "value name " + inQuotes(name) + " is repeated");
      KILN_ASSIGN_OR_RETURN(ir::TensorType type, getType(outputs[k], outWhere));
      const ir::TensorType& want = (*inferred)[k];
      if (type.dtype != want.dtype || type.shape != want.shape) {
        std::vector<std::string> ins;
        for (size_t m = 0; m < inputValues.size(); ++m)
          ins.push_back(inputValues[m]->name() + ": " + inputTypes[m].toString());
        return fail(outWhere, inQuotes(name) + " is declared " +
                                  ir::TensorType{type.dtype, type.shape}.toString() + " but " +
                                  opName + " produces " + want.toString() + " from inputs " +
                                  joined(ins));
      }
      outs.emplace_back(std::move(name), std::move(type));
    }
    auto node = graph_.addNodeWithTypes(op->kind, std::move(inputValues), std::move(attrs),
                                        std::move(outs));
    if (!node) return fail(where, node.status().message(), node.status().code());
    (*node)->setName(std::move(nodeName));
    return Status::ok();
  }

  Status loadOutputs(const Json& outputs) {
    if (!outputs.is_array())
      return fail("", "\"outputs\" must be an array of value names, got " + shown(outputs));
    if (outputs.empty()) return fail("", "\"outputs\" is empty; a graph needs an output");
    std::vector<ir::Value*> values;
    for (size_t i = 0; i < outputs.size(); ++i) {
      const std::string where = "graph output " + std::to_string(i);
      if (!outputs[i].is_string())
        return fail(where, "must be a value name, got " + shown(outputs[i]));
      const auto& name = outputs[i].get_ref<const std::string&>();
      ir::Value* v = graph_.findValue(name);
      if (!v) return fail(where, inQuotes(name) + " is not defined in the graph");
      values.push_back(v);
    }
    graph_.setOutputs(std::move(values));
    return Status::ok();
  }

  std::string path_;
  ir::Graph graph_;
  std::string weightsPath_;
  TensorMap weights_;
  std::set<std::string> usedWeights_;
};

}  // namespace

std::string weightsPathFor(const std::string& jsonPath) {
  return fs::path(jsonPath).replace_extension(".safetensors").string();
}

Status saveGraphJson(const ir::Graph& graph, const std::string& jsonPath) {
  const std::string where =
      "cannot save graph " + inQuotes(graph.name()) + " to '" + jsonPath + "'";
  if (fs::path(jsonPath).extension() != ".json")
    return invalidArgument(where + ": the file name must end in .json (the weights go beside " +
                           "it, in <name>.safetensors)");
  KILN_TRY(ir::verify(graph).withContext(where));
  const std::string weightsPath = weightsPathFor(jsonPath);
  TensorMap weights;
  std::string text;
  try {
    KILN_ASSIGN_OR_RETURN(text,
                          graphToText(graph, fs::path(weightsPath).filename().string(), weights));
  } catch (const Json::type_error&) {
    return invalidArgument(where + ": the graph name, a node name or a string attribute is " +
                           "not valid UTF-8");
  }
  KILN_ASSIGN_OR_RETURN(OutputFile weightsFile, safetensorsOutput(weightsPath, weights));
  OutputFile jsonFile{jsonPath, [text = std::move(text)](std::ostream& out) -> Status {
                        out << text;
                        return Status::ok();
                      }};
  // Weights first: renamed in this order, a crash between the renames leaves the new weights
  // with the old JSON, which the loader rejects when they disagree, rather than the reverse.
  return writeFilesAtomically({std::move(weightsFile), std::move(jsonFile)}).withContext(where);
}

Expected<ir::Graph> loadGraphJson(const std::string& jsonPath) {
  KILN_ASSIGN_OR_RETURN(InputFile file, openInputFile(jsonPath, "graph file"));
  std::string text(file.size, '\0');
  if (file.size && !file.stream.read(text.data(), static_cast<std::streamsize>(file.size)))
    return ioError("graph file '" + jsonPath + "': reading failed");
  KILN_ASSIGN_OR_RETURN(Json doc, parseJson(text, jsonPath));
  try {
    return GraphLoader(jsonPath).load(doc);
  } catch (const Json::exception& e) {
    // Every access above is checked first; reaching this is a kiln bug, not bad input.
    return internalError(jsonPath + ": unexpected JSON error: " + e.what());
  }
}

Expected<std::string> encodeAttribute(const ir::AttrValue& value, const std::string& tensorKey,
                                      TensorMap& weights) {
  KILN_ASSIGN_OR_RETURN(Json j, attrToJson(value, tensorKey, weights));
  try {
    return j.dump();
  } catch (const Json::type_error&) {
    return invalidArgument("the string attribute is not valid UTF-8");
  }
}

Expected<ir::AttrValue> decodeAttribute(std::string_view json, const TensorMap& weights) {
  KILN_ASSIGN_OR_RETURN(Json j, parseJson(std::string(json), "attribute"));
  return attrFromJson(j, std::nullopt, weights, nullptr, "the attribute");
}

}  // namespace kiln::frontends
