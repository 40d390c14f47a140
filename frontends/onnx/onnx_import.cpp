// Loading an ONNX model: parsing, opset and external-data checks, specializing symbolic dims,
// the ONNX checker and shape inference; then Importer (onnx_importer.cpp) maps the nodes.
#include "frontends/onnx/onnx_import.h"

#include <onnx/checker.h>
#include <onnx/shape_inference/implementation.h>

#include <cctype>
#include <climits>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>

#include "frontends/file_io.h"
#include "frontends/onnx/onnx_importer.h"
#include "frontends/onnx/onnx_tensor.h"

namespace kiln::frontends {

namespace fs = std::filesystem;
using onnx_import::Importer;
using onnx_import::InputDimNames;

namespace {

std::string joinLines(const std::vector<std::string>& items) {
  std::string s;
  for (const auto& i : items) s += "\n  " + i;
  return s;
}

// The IR versions kiln reads: 3 (the first with opset imports) to 14 (onnx 1.23); newer
// fields that kiln does not read are skipped by the protobuf parser.
constexpr int64_t kMinIrVersion = 3;
constexpr int64_t kMaxIrVersion = 14;

// The model's opset of the default domain, checked against the range kiln reads.
Expected<int> checkOpsets(const ::onnx::ModelProto& model) {
  if (model.ir_version() < kMinIrVersion)
    return unimplemented("the model's IR version is " + std::to_string(model.ir_version()) +
                         "; kiln reads IR versions " + std::to_string(kMinIrVersion) + " to " +
                         std::to_string(kMaxIrVersion) + " (re-export it with a current exporter)");
  if (model.ir_version() > kMaxIrVersion)
    return unimplemented("the model's IR version is " + std::to_string(model.ir_version()) +
                         ", newer than the " + std::to_string(kMaxIrVersion) +
                         " kiln knows (onnx " + "1.23); re-export it for IR version " +
                         std::to_string(kMaxIrVersion) + " or older");
  int opset = -1;
  for (const auto& imp : model.opset_import()) {
    if (!imp.domain().empty() && imp.domain() != "ai.onnx") continue;
    if (opset >= 0) return invalidArgument("the model imports the default ONNX domain twice");
    const int64_t v = imp.version();
    if (v < kMinOnnxOpset)
      return unimplemented("the model uses ONNX opset " + std::to_string(v) + "; kiln imports " +
                           "opsets " + std::to_string(kMinOnnxOpset) + " to " +
                           std::to_string(kMaxOnnxOpset) + " (convert it with " +
                           "onnx.version_converter.convert_version(model, " +
                           std::to_string(kMinOnnxOpset) + ") or re-export with a newer opset)");
    if (v > kMaxOnnxOpset)
      return unimplemented("the model uses ONNX opset " + std::to_string(v) + ", newer than the " +
                           std::to_string(kMaxOnnxOpset) +
                           " kiln knows (re-export with opset_version=" +
                           std::to_string(kMaxOnnxOpset) + " or lower)");
    opset = static_cast<int>(v);
  }
  if (opset < 0) return invalidArgument("the model imports no opset of the default ONNX domain");
  return opset;
}

// What the ONNX checker would catch and the importer relies on, for models outside libonnx
// 1.12's range: every value is defined once (SSA), by a graph input, an initializer or one
// node output; nodes name their op and have outputs; a default-domain node has the inputs,
// outputs and attributes its op's version defines (pattern matching reads them before any
// mapper runs). Inputs defined later or never are caught per node.
Status checkGraphStructure(const ::onnx::GraphProto& g, int opset) {
  std::unordered_map<std::string, std::string> definedBy;
  auto define = [&](const std::string& name, const std::string& by) -> Status {
    if (name.empty()) return Status::ok();
    auto [it, fresh] = definedBy.emplace(name, by);
    // An initializer may also be listed as a graph input (its default value), as IR < 4 requires.
    if (!fresh && !(it->second == "a graph input" && by == "an initializer"))
      return invalidArgument("value '" + name + "' is defined twice: by " + it->second +
                             " and by " + by + " (ONNX values are assigned once)");
    return Status::ok();
  };
  for (const auto& in : g.input()) KILN_TRY(define(in.name(), "a graph input"));
  for (const auto& init : g.initializer()) KILN_TRY(define(init.name(), "an initializer"));
  for (int i = 0; i < g.node_size(); ++i) {
    const auto& node = g.node(i);
    const std::string by = "node " + std::to_string(i) +
                           (node.name().empty() ? "" : " '" + node.name() + "'") + " (" +
                           (node.op_type().empty() ? "no op type" : node.op_type()) + ")";
    if (node.op_type().empty()) return invalidArgument(by + " has no op type");
    if (node.output_size() == 0) return invalidArgument(by + " has no outputs");
    if (node.domain().empty() || node.domain() == "ai.onnx") {
      if (const int v = onnx_import::onnxOpVersion(node.op_type(), opset); v > 0)
        KILN_TRY(onnx_import::checkNodeSchema(node, v).withContext(by));
    }
    for (const auto& out : node.output()) KILN_TRY(define(out, by));
    // Subgraphs (If branches, Loop and Scan bodies) are held to the same rules: their nodes are
    // imported too (inlined).
    for (const auto& a : node.attribute()) {
      if (a.has_g())
        KILN_TRY(
            checkGraphStructure(a.g(), opset).withContext(by + ", subgraph '" + a.name() + "'"));
      for (const auto& sub : a.graphs())
        KILN_TRY(checkGraphStructure(sub, opset).withContext(by + ", subgraph '" + a.name() + "'"));
    }
  }
  return Status::ok();
}

// Reads every external-data tensor's location, offset and length against its file before the
// checker runs (see resolveExternalData).
// Resolves external data and checks the size of every tensor's data, before libonnx reads any.
Status checkAllTensorData(::onnx::ModelProto& model, const std::string& modelDir) {
  auto check = [&](::onnx::TensorProto& t, const std::string& what) -> Status {
    KILN_TRY(onnx_import::checkTensorData(t, what));
    if (t.data_location() == ::onnx::TensorProto::EXTERNAL)
      KILN_TRY(onnx_import::resolveExternalData(t, modelDir, what));
    return Status::ok();
  };
  auto* graph = model.mutable_graph();
  for (auto& init : *graph->mutable_initializer())
    KILN_TRY(check(init, "initializer '" + init.name() + "'"));
  for (auto& node : *graph->mutable_node())
    for (auto& attr : *node.mutable_attribute()) {
      const std::string what = "attribute '" + attr.name() + "' of node '" + node.name() + "'";
      if (attr.has_t()) KILN_TRY(check(*attr.mutable_t(), what));
      for (auto& t : *attr.mutable_tensors()) KILN_TRY(check(t, what));
    }
  return Status::ok();
}

// Gives every symbolic dim of the graph inputs a value (kiln shapes are static), and the same
// value to dims of that name in outputs and value_info, so that ONNX shape inference works
// with the static shapes. Every dim without a value is listed in one error.
// kiln's name for an ONNX dim_param: an identifier (ir::Graph::isValidDimName).
std::string dimName(const std::string& param) {
  std::string out;
  for (char c : param.substr(0, 64)) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0]))) out = "_" + out;
  return out.substr(0, 64);
}

// Returns kiln's dim names per graph input (Value::dimNames): the dim_params, and "batch" for
// an unnamed unknown first dim that took OnnxImportOptions::defaultBatch.
Expected<InputDimNames> specializeInputDims(::onnx::GraphProto& graph,
                                            const OnnxImportOptions& options) {
  for (const auto& [name, v] : options.dimValues)
    if (v < 0)
      return invalidArgument("OnnxImportOptions::dimValues[\"" + name + "\"] is " +
                             std::to_string(v) + "; dim values must be >= 0");
  if (options.defaultBatch && *options.defaultBatch < 0)
    return invalidArgument("OnnxImportOptions::defaultBatch is " +
                           std::to_string(*options.defaultBatch) + "; it must be >= 0");
  std::set<std::string> initializers;
  for (const auto& init : graph.initializer()) initializers.insert(init.name());

  std::map<std::string, int64_t> values = options.dimValues;
  for (const auto& in : graph.input()) {
    if (initializers.count(in.name()) || !in.type().has_tensor_type()) continue;
    const auto& shape = in.type().tensor_type().shape();
    if (options.defaultBatch && shape.dim_size() > 0 && shape.dim(0).has_dim_param())
      values.emplace(shape.dim(0).dim_param(), *options.defaultBatch);
  }

  std::vector<std::string> missing;
  InputDimNames names;
  for (auto& in : *graph.mutable_input()) {
    if (initializers.count(in.name())) continue;
    if (!in.type().has_tensor_type())
      return unimplemented("graph input '" + in.name() + "' is not a tensor (kiln imports " +
                           "tensor inputs only)");
    auto* tt = in.mutable_type()->mutable_tensor_type();
    if (!tt->has_shape())
      return invalidArgument("graph input '" + in.name() + "' has no shape (unknown rank); " +
                             "kiln needs every input's rank and dims");
    for (int d = 0; d < tt->shape().dim_size(); ++d) {
      auto* dim = tt->mutable_shape()->mutable_dim(d);
      if (dim->has_dim_value()) {
        if (dim->dim_value() < 0)
          return invalidArgument("graph input '" + in.name() + "' has a negative dim " +
                                 std::to_string(dim->dim_value()) + " at position " +
                                 std::to_string(d));
        continue;
      }
      auto& inputNames = names[in.name()];
      inputNames.resize(static_cast<size_t>(tt->shape().dim_size()));
      if (dim->has_dim_param() && values.count(dim->dim_param())) {
        inputNames[static_cast<size_t>(d)] = dimName(dim->dim_param());
        dim->set_dim_value(values.at(dim->dim_param()));
      } else if (!dim->has_dim_param() && d == 0 && options.defaultBatch) {
        inputNames[0] = "batch";
        dim->set_dim_value(*options.defaultBatch);
      } else {
        missing.push_back("input '" + in.name() + "' dim " + std::to_string(d) +
                          (dim->has_dim_param() ? " ('" + dim->dim_param() + "')" : " (unnamed)"));
      }
    }
  }
  if (!missing.empty())
    return invalidArgument(
        "kiln graphs have static shapes, and these input dims have no value:" + joinLines(missing) +
        "\nSet them with OnnxImportOptions::dimValues (by dim_param name); a symbolic first "
        "dim takes OnnxImportOptions::defaultBatch (the CLI's --batch)");

  auto specialize = [&](::onnx::ValueInfoProto& vi) {
    if (!vi.type().has_tensor_type() || !vi.type().tensor_type().has_shape()) return;
    for (auto& dim : *vi.mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim())
      if (dim.has_dim_param() && values.count(dim.dim_param()))
        dim.set_dim_value(values.at(dim.dim_param()));
  };
  for (auto& vi : *graph.mutable_output()) specialize(vi);
  for (auto& vi : *graph.mutable_value_info()) specialize(vi);
  return names;
}

// libonnx 1.12's shape inference trusts what its checker does not look at: a zero stride
// divides by zero (SIGFPE), and a Conv weight of higher rank than the input, without a
// kernel_shape attribute, reads past the end of a vector (convPoolShapeInference). So windows
// are checked here first, and a Conv, ConvTranspose, ConvInteger or QLinearConv without
// kernel_shape gets the one its weight implies, which shape inference does check against the
// input's rank (fuzz_onnx found the QLinearConv crash).
Status prepareWindowAttributes(::onnx::GraphProto& graph) {
  // Dims known before shape inference: initializers, Constant nodes and graph inputs.
  std::unordered_map<std::string, std::vector<int64_t>> dims;
  for (const auto& init : graph.initializer())
    dims[init.name()].assign(init.dims().begin(), init.dims().end());
  for (const auto& node : graph.node())
    if (node.op_type() == "Constant" && node.output_size() == 1)
      for (const auto& a : node.attribute())
        if (a.name() == "value" && a.has_t())
          dims[node.output(0)].assign(a.t().dims().begin(), a.t().dims().end());
  for (const auto& in : graph.input()) {
    if (dims.count(in.name()) || !in.type().tensor_type().has_shape()) continue;
    auto& d = dims[in.name()];
    for (const auto& dim : in.type().tensor_type().shape().dim()) d.push_back(dim.dim_value());
  }
  for (auto& node : *graph.mutable_node()) {
    const std::string where = node.op_type() + " node '" + node.name() + "'";
    bool hasKernel = false;
    for (const auto& a : node.attribute()) {
      const std::string& n = a.name();
      hasKernel |= n == "kernel_shape";
      const bool positive = n == "strides" || n == "dilations" || n == "kernel_shape";
      if (!positive && n != "pads") continue;
      for (int64_t v : a.ints())
        if (positive ? v < 1 : v < 0)
          return invalidArgument(where + ": attribute '" + n + "' must be " +
                                 (positive ? ">= 1" : ">= 0") + ", got " + std::to_string(v));
    }
    // The weight's input: 1 (Conv, ConvTranspose, ConvInteger) or 3 (QLinearConv).
    const std::string& op = node.op_type();
    const int weight = op == "QLinearConv" ? 3 : 1;
    const bool conv =
        (op == "Conv" || op == "ConvTranspose" || op == "ConvInteger" || op == "QLinearConv") &&
        (node.domain().empty() || node.domain() == "ai.onnx");
    if (!conv || hasKernel || node.input_size() <= weight) continue;
    auto it = dims.find(node.input(weight));
    if (it == dims.end())
      return unimplemented(where + ": a weight computed by other nodes needs a kernel_shape " +
                           "attribute (libonnx 1.12 cannot check it before shape inference)");
    if (it->second.size() < 3)
      return invalidArgument(where + ": the weight must have rank >= 3, got rank " +
                             std::to_string(it->second.size()));
    auto* attr = node.add_attribute();
    attr->set_name("kernel_shape");
    attr->set_type(::onnx::AttributeProto::INTS);
    for (size_t i = 2; i < it->second.size(); ++i) attr->add_ints(it->second[i]);
  }
  return Status::ok();
}

// libonnx 1.12's shape inference of LayerNormalization reads the input's dim at axis + rank
// without a range check when Mean or InvStdDev is asked for: an axis below -rank reads outside
// the shape (a crash fuzz_onnx found). Those outputs come off (`saved`: the top graph's, to
// put back) for a first inference; inside subgraphs (If, Loop: kiln imports none) they stay off.
void detachLayerNormStats(
    ::onnx::GraphProto& graph,
    std::vector<std::pair<::onnx::NodeProto*, std::vector<std::string>>>* saved) {
  for (auto& node : *graph.mutable_node()) {
    for (auto& a : *node.mutable_attribute()) {
      if (a.has_g()) detachLayerNormStats(*a.mutable_g(), nullptr);
      for (auto& g : *a.mutable_graphs()) detachLayerNormStats(g, nullptr);
    }
    if (node.op_type() != "LayerNormalization" || node.output_size() < 2) continue;
    if (saved) saved->push_back({&node, {node.output().begin() + 1, node.output().end()}});
    node.mutable_output()->DeleteSubrange(1, node.output_size() - 1);
  }
}

// The rank shape inference (or the model) gives `name` in `graph`, if any.
std::optional<int> inferredRank(const ::onnx::GraphProto& graph, const std::string& name) {
  for (const auto* infos : {&graph.value_info(), &graph.input(), &graph.output()})
    for (const auto& vi : *infos)
      if (vi.name() == name && vi.type().tensor_type().has_shape())
        return vi.type().tensor_type().shape().dim_size();
  for (const auto& init : graph.initializer())
    if (init.name() == name) return init.dims_size();
  return std::nullopt;
}

Status inferShapes(::onnx::ModelProto& model) {
  // Without data propagation: libonnx 1.12's propagation through Shape dereferences the type
  // of an input whose inference failed (a crash on malformed models), and the importer folds
  // shape arithmetic itself.
  try {
    ::onnx::shape_inference::InferShapes(
        model, ::onnx::OpSchemaRegistry::Instance(),
        ::onnx::ShapeInferenceOptions(/*check_type=*/true, /*strict_mode=*/1,
                                      /*data_prop=*/false));
  } catch (const std::exception& e) {
    return invalidArgument(std::string("ONNX shape inference fails on the model: ") + e.what());
  }
  return Status::ok();
}

// The ONNX checker and shape inference, their exceptions turned into errors. libonnx 1.12's
// checker requires a shape on graph outputs, which newer exporters may leave out: those get
// one for the checker and lose it again for shape inference to fill in.
Status checkAndInferShapes(::onnx::ModelProto& model) {
  std::vector<int> unshaped;
  auto* graph = model.mutable_graph();
  for (int i = 0; i < graph->output_size(); ++i) {
    auto* type = graph->mutable_output(i)->mutable_type();
    if (type->has_tensor_type() && !type->tensor_type().has_shape()) {
      unshaped.push_back(i);
      type->mutable_tensor_type()->mutable_shape();
    }
  }
  try {
    ::onnx::checker::check_model(model);
  } catch (const std::exception& e) {
    return invalidArgument(std::string("the ONNX checker rejects the model: ") + e.what());
  }
  for (int i : unshaped)
    graph->mutable_output(i)->mutable_type()->mutable_tensor_type()->clear_shape();
  KILN_TRY(prepareWindowAttributes(*graph));
  std::vector<std::pair<::onnx::NodeProto*, std::vector<std::string>>> stats;
  detachLayerNormStats(*graph, &stats);
  if (stats.empty()) return inferShapes(model);
  KILN_TRY(inferShapes(model));
  for (auto& [node, outputs] : stats) {
    int64_t axis = -1;
    for (const auto& a : node->attribute())
      if (a.name() == "axis") axis = a.i();
    const std::optional<int> rank =
        node->input_size() > 0 ? inferredRank(*graph, node->input(0)) : std::nullopt;
    if (rank && (axis < -*rank || axis >= *rank))
      return invalidArgument(
          "LayerNormalization node '" + node->name() + "': axis " + std::to_string(axis) +
          " is out of range for input '" + node->input(0) + "' of rank " + std::to_string(*rank) +
          " (valid: " + std::to_string(-*rank) + ".." + std::to_string(*rank - 1) + ")");
    if (!rank && axis < 0)
      return invalidArgument("LayerNormalization node '" + node->name() +
                             "': ONNX shape inference gives no rank for input '" +
                             (node->input_size() > 0 ? node->input(0) : std::string()) +
                             "', so its negative axis cannot be checked");
    for (std::string& o : outputs) node->add_output(std::move(o));
  }
  return inferShapes(model);
}

Expected<::onnx::ModelProto> parseModel(std::string_view bytes, const std::string& modelDir,
                                        const std::string& name) {
  if (bytes.size() > static_cast<size_t>(INT_MAX))
    return invalidArgument(name + " is " + std::to_string(bytes.size()) + " bytes; protobuf " +
                           "reads at most 2 GiB (store the weights as external data)");
  ::onnx::ModelProto model;
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return invalidArgument(name + " is not an ONNX model (the protobuf does not parse; is the " +
                           "file truncated or of another format?)");
  if (!model.has_graph())
    return invalidArgument(name + " has no graph (an empty or non-ONNX protobuf?)");
  auto opset = checkOpsets(model);
  if (!opset) return opset.status().withContext(name);
  KILN_TRY(checkAllTensorData(model, modelDir).withContext(name));
  return model;
}

// What importing a parsed model gave: the graph, or the error and, when the import stopped at
// a node that needs a value known only at run time (its output's size, an If's condition), that
// node's request (its index among the graph's nodes); and the ONNX names of the graph's inputs.
struct Imported {
  Expected<ir::Graph> graph = internalError("not imported");
  std::optional<onnx_import::SizeRequest> request;
  int requestNode = -1;
  std::vector<std::string> inputNames;
};

Imported importParsed(::onnx::ModelProto& model, const OnnxImportOptions& options,
                      const std::string& name) {
  Imported result;
  const int opset = *checkOpsets(model);  // Checked by parseModel.
  auto dimNames = specializeInputDims(*model.mutable_graph(), options);
  if (!dimNames) {
    result.graph = dimNames.status().withContext(name);
    return result;
  }
  // libonnx 1.12's checker and shape inference know opsets up to 17 and IR versions up to 8;
  // newer models are validated by kiln alone: the structure here, each node by its mapper and
  // kiln's shape inference, and the types the model declares against kiln's.
  const bool libonnxKnows = opset <= kLibOnnxMaxOpset && model.ir_version() <= kLibOnnxMaxIrVersion;
  Status checked =
      libonnxKnows ? checkAndInferShapes(model) : checkGraphStructure(model.graph(), opset);
  if (checked.isOk() && !libonnxKnows) checked = prepareWindowAttributes(*model.mutable_graph());
  if (!checked.isOk()) {
    result.graph = checked.withContext(name);
    return result;
  }
  // Nodes may need the values of graph inputs (shape, axes, pads ... given as inputs): import
  // again with those bound when the caller gave them. A node after a failed one is not
  // mapped, so each pass can reveal more; each adds at least one input.
  std::map<std::string, ir::TensorData> bound;
  for (;;) {
    Importer importer(model, name, *dimNames, libonnxKnows, bound);
    importer.setRuntimeSizes(options.runtimeSizes);
    result.graph = importer.run();
    result.inputNames = importer.inputNames();
    result.request.reset();
    result.requestNode = -1;
    if (importer.stoppedForSize()) {
      result.request = importer.sizeRequest();
      result.requestNode = importer.sizeRequestNode();
    }
    if (result.graph) return result;
    bool added = false;
    for (const std::string& in : importer.neededInputs()) {
      auto it = options.inputValues.find(in);
      if (it == options.inputValues.end()) return result;
      added |= bound.emplace(in, it->second).second;
    }
    if (!added) return result;
  }
}

// Runs an import step, its exceptions turned into errors named after `name`: libonnx and protobuf
// report some errors by throwing; every call that may is wrapped, so anything but running out of
// memory reaching this is a kiln bug.
template <class F>
auto guarded(const std::string& name, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return invalidArgument(name + ": out of memory while importing the model");
  } catch (const std::exception& e) {
    return internalError(name + ": unexpected error while importing: " + e.what());
  }
}

Expected<ir::Graph> importModel(std::string_view bytes, const OnnxImportOptions& options,
                                const std::string& modelDir, const std::string& name) {
  KILN_ASSIGN_OR_RETURN(::onnx::ModelProto model, parseModel(bytes, modelDir, name));
  return std::move(importParsed(model, options, name).graph);
}

}  // namespace

Expected<ir::Graph> loadOnnxFromBytes(std::string_view bytes, const OnnxImportOptions& options,
                                      const std::string& modelDir, const std::string& displayName) {
  return guarded(displayName, [&] { return importModel(bytes, options, modelDir, displayName); });
}

namespace {

Expected<std::string> readModelFile(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(InputFile file, openInputFile(path, "ONNX model"));
  if (file.size > static_cast<uint64_t>(INT_MAX))
    return invalidArgument("ONNX model '" + path + "' is " + std::to_string(file.size) +
                           " bytes; protobuf reads at most 2 GiB (store the weights as " +
                           "external data)");
  std::string bytes(file.size, '\0');
  if (file.size && !file.stream.read(bytes.data(), static_cast<std::streamsize>(file.size)))
    return ioError("ONNX model '" + path + "': reading failed");
  return bytes;
}

std::string modelDirOf(const std::string& path) {
  std::string dir = fs::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

}  // namespace

Expected<ir::Graph> loadOnnx(const std::string& path, const OnnxImportOptions& options) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, readModelFile(path));
  return loadOnnxFromBytes(bytes, options, modelDirOf(path), path);
}

Expected<ir::GraphSpecializer> onnxSpecializer(const std::string& path,
                                               const OnnxImportOptions& options) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, readModelFile(path));
  ::onnx::ModelProto model;
  if (!model.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())) || !model.has_graph())
    return invalidArgument(path + " is not an ONNX model (the protobuf does not parse)");
  // Per kiln input (the graph inputs that are not initializers, in order): each dim's
  // dim_param, "" for a fixed dim, and nullopt for an unknown one.
  std::set<std::string> initializers;
  for (const auto& init : model.graph().initializer()) initializers.insert(init.name());
  std::vector<std::vector<std::optional<std::string>>> dims;
  for (const auto& in : model.graph().input()) {
    if (initializers.count(in.name())) continue;
    auto& d = dims.emplace_back();
    for (const auto& dim : in.type().tensor_type().shape().dim())
      d.push_back(dim.has_dim_value()   ? std::optional<std::string>("")
                  : dim.has_dim_param() ? std::optional<std::string>(dim.dim_param())
                                        : std::nullopt);
  }
  auto shared = std::make_shared<const std::string>(std::move(bytes));
  return ir::GraphSpecializer(
      [shared, dims, options, path](std::span<const ir::TensorType> types) -> Expected<ir::Graph> {
        if (types.size() != dims.size())
          return invalidArgument(path + " takes " + std::to_string(dims.size()) + " inputs, got " +
                                 std::to_string(types.size()));
        OnnxImportOptions specialized = options;
        for (size_t i = 0; i < dims.size(); ++i) {
          if (types[i].shape.size() != dims[i].size())
            return invalidArgument(path + ": input " + std::to_string(i) + " has rank " +
                                   std::to_string(dims[i].size()) + ", got " + types[i].toString());
          for (size_t d = 0; d < dims[i].size(); ++d) {
            if (!dims[i][d] && d == 0)
              specialized.defaultBatch = types[i].shape[d];
            else if (!dims[i][d]->empty())
              specialized.dimValues[*dims[i][d]] = types[i].shape[d];
          }
        }
        return loadOnnxFromBytes(*shared, specialized, modelDirOf(path), path);
      });
}

namespace {

void declareType(::onnx::ValueInfoProto& vi, const ir::TensorType& t) {
  auto* tt = vi.mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx_import::onnxElemTypeOf(t.dtype));
  auto* shape = tt->mutable_shape();
  shape->clear_dim();
  for (int64_t d : t.shape) shape->add_dim()->set_dim_value(d);
}

// Forgets the shapes a stage's sub-model inherits from the whole model: values after a cut have
// sizes the file cannot know (ONNX shape inference infers them again where it runs), and the
// model's outputs keep only their element types.
void forgetShapes(::onnx::GraphProto& g) {
  g.clear_value_info();
  for (auto& out : *g.mutable_output())
    if (out.type().has_tensor_type()) out.mutable_type()->mutable_tensor_type()->clear_shape();
}

// The type ONNX shape inference (or the file) gave `name` in `g`, if any.
const ::onnx::TypeProto* typeIn(const ::onnx::GraphProto& g, const std::string& name) {
  for (const auto* infos : {&g.value_info(), &g.output()})
    for (const auto& vi : *infos)
      if (vi.name() == name && vi.type().has_tensor_type()) return &vi.type();
  return nullptr;
}

class OnnxStager {
 public:
  OnnxStager(std::shared_ptr<const ::onnx::ModelProto> model, OnnxImportOptions options,
             std::string name)
      : model_(std::move(model)), options_(std::move(options)), name_(std::move(name)) {
    for (const auto& init : model_->graph().initializer()) initializers_.insert(init.name());
  }

  Expected<ir::Stage> operator()(int64_t begin, const std::map<std::string, ir::TensorType>& env,
                                 const std::map<std::string, int64_t>& sizes,
                                 const std::map<std::string, ir::TensorData>& known) const {
    // The model with the If branches spliced that earlier stages' imports decided on.
    bool splices = false;
    for (const auto& [key, value] : sizes) splices |= onnx_import::isBranchKey(key);
    if (!splices) return make(*model_, initializers_, begin, env, sizes, known);
    ::onnx::ModelProto model = *model_;
    KILN_TRY(onnx_import::spliceDecidedBranches(*model.mutable_graph(), sizes).withContext(name_));
    std::set<std::string> initializers;
    for (const auto& init : model.graph().initializer()) initializers.insert(init.name());
    return make(model, initializers, begin, env, sizes, known);
  }

 private:
  Expected<ir::Stage> make(const ::onnx::ModelProto& model,
                           const std::set<std::string>& initializers, int64_t begin,
                           const std::map<std::string, ir::TensorType>& env,
                           const std::map<std::string, int64_t>& sizes,
                           const std::map<std::string, ir::TensorData>& known) const {
    const ::onnx::GraphProto& g = model.graph();
    const int n = g.node_size();
    if (begin < 0 || begin > n)
      return internalError(name_ + ": no stage begins at node " + std::to_string(begin));
    ::onnx::ModelProto sub = model;
    ::onnx::GraphProto& sg = *sub.mutable_graph();
    OnnxImportOptions options = options_;
    options.runtimeSizes = sizes;
    for (const auto& [name, data] : known) options.inputValues.insert_or_assign(name, data);
    if (begin == 0) {
      // The model's inputs take the call's types (its dims static now).
      for (auto& in : *sg.mutable_input()) {
        if (initializers.count(in.name())) continue;
        auto it = env.find(in.name());
        if (it == env.end()) continue;
        const auto declared = onnx_import::dtypeFromOnnx(in.type().tensor_type().elem_type());
        const auto& dims = in.type().tensor_type().shape().dim();
        const int rank = dims.size();
        if (declared != it->second.dtype || rank != it->second.rank())
          return invalidArgument(name_ + ": input '" + in.name() + "' is declared " +
                                 (declared ? std::string(ir::dtypeName(*declared)) : "?") +
                                 " of rank " + std::to_string(rank) + ", the call gives " +
                                 it->second.toString());
        // A fixed dim is the model's: only symbolic (or unknown) dims take the call's sizes.
        for (int d = 0; d < rank; ++d)
          if (dims[d].has_dim_value() && dims[d].dim_value() != it->second.shape[d])
            return invalidArgument(
                name_ + ": input '" + in.name() + "' has dim " + std::to_string(d) + " fixed at " +
                std::to_string(dims[d].dim_value()) + ", the call gives " + it->second.toString());
        declareType(in, it->second);
      }
      options.dimValues.clear();
      options.defaultBatch.reset();
    } else {
      sg.mutable_node()->DeleteSubrange(0, static_cast<int>(begin));
      // Inputs: the environment's values that the nodes left and the outputs read.
      std::vector<std::string> reads;
      for (const auto& node : sg.node()) onnx_import::nodeReads(node, false, reads);
      for (const auto& out : sg.output()) reads.push_back(out.name());
      sg.clear_input();
      std::set<std::string> added;
      for (const std::string& r : reads)
        if (!initializers.count(r) && env.count(r) && added.insert(r).second) {
          auto* vi = sg.add_input();
          vi->set_name(r);
          declareType(*vi, env.at(r));
        }
      forgetShapes(sg);
    }
    // The model's outputs computed by earlier stages are not this one's.
    for (int i = sg.output_size(); i-- > 0;)
      if (begin > 0 && env.count(sg.output(i).name())) sg.mutable_output()->DeleteSubrange(i, 1);
    if (sg.output_size() == 0) return ir::Stage{std::nullopt, {}, {}, std::nullopt, n, {}};

    ::onnx::ModelProto whole = sub;  // The import prepares (and infers shapes in) its model.
    Imported first = importParsed(whole, options, name_);
    if (first.graph) {
      ir::Stage stage{std::move(*first.graph), first.inputNames, {}, std::nullopt, n, {}};
      for (const auto& out : sg.output()) stage.outputs.push_back(out.name());
      return stage;
    }
    if (!first.request) return first.graph.status();
    const onnx_import::SizeRequest& request = *first.request;
    if (request.decided) {
      // A stage ends inside the branch an If takes: made again with that branch spliced in.
      if (sizes.count(request.key))
        return internalError(name_ + ": " + request.node + " asks again for its branch spliced");
      std::map<std::string, int64_t> more = sizes;
      more[request.key] = *request.decided;
      KILN_ASSIGN_OR_RETURN(ir::Stage stage, (*this)(begin, env, more, known));
      stage.decided.emplace(request.key, *request.decided);
      return stage;
    }
    const int before = first.requestNode;  // Nodes of this stage before the cut.
    const int64_t cutAt = begin + before;
    std::set<std::string> defined;
    for (int i = 0; i < before; ++i)
      for (const auto& out : sg.node(i).output())
        if (!out.empty()) defined.insert(out);  // An omitted optional output is no value.
    ir::StageCut cut{
        request.op, request.attrs, request.inputs, request.key, request.node, request.need, {}};
    for (const std::string& in : request.inputs) {
      if (env.count(in) || defined.count(in)) continue;
      const ::onnx::TensorProto* init = nullptr;
      for (const auto& t : g.initializer())
        if (t.name() == in) init = &t;
      if (!init)
        return internalError(name_ + ": " + request.node + ": " + request.need + " reads '" + in +
                             "', which is neither computed nor an initializer");
      KILN_ASSIGN_OR_RETURN(ir::TensorData data,
                            onnx_import::tensorFromProto(*init, "initializer '" + in + "'"));
      cut.constants.emplace(in, std::move(data));
    }
    if (before == 0) return ir::Stage{std::nullopt, {}, {}, std::move(cut), cutAt, {}};
    // The nodes before the cut, with every value they define that a later node, a model output or
    // the size reads as an output.
    std::vector<std::string> later;
    for (int i = before; i < sg.node_size(); ++i) onnx_import::nodeReads(sg.node(i), false, later);
    for (const auto& out : g.output()) later.push_back(out.name());
    later.insert(later.end(), request.inputs.begin(), request.inputs.end());
    std::vector<std::string> outputs;
    std::set<std::string> seen;
    for (const std::string& name : later)
      if (!name.empty() && defined.count(name) && seen.insert(name).second) outputs.push_back(name);
    // Nothing later reads what the nodes before the cut compute (they are dead): no graph.
    if (outputs.empty()) return ir::Stage{std::nullopt, {}, {}, std::move(cut), cutAt, {}};
    sg.mutable_node()->DeleteSubrange(before, sg.node_size() - before);
    sg.clear_output();
    for (const std::string& name : outputs) {
      auto* vi = sg.add_output();
      vi->set_name(name);
      if (const ::onnx::TypeProto* t = typeIn(whole.graph(), name)) {
        *vi->mutable_type() = *t;
        vi->mutable_type()->mutable_tensor_type()->clear_shape();
      }
    }
    forgetShapes(sg);
    Imported prefix = importParsed(sub, options, name_);
    if (!prefix.graph) {
      if (prefix.request)
        return internalError(name_ + ": the stage before " + request.node +
                             " asks for a size or value");
      return prefix.graph.status();
    }
    ir::Stage stage{
        std::move(*prefix.graph), prefix.inputNames, outputs, std::move(cut), cutAt, {}};
    // Outputs the import folded to constants (shape arithmetic), small ones: later stages may
    // need them at import.
    for (size_t i = 0; i < outputs.size(); ++i) {
      const ir::Value* v = stage.graph->outputs()[i];
      if (v->isParameter() && !v->trainable() && !v->data().empty() &&
          v->data().numElements() <= (int64_t{1} << 16))
        stage.known.emplace(outputs[i], v->data());
    }
    return stage;
  }

  std::shared_ptr<const ::onnx::ModelProto> model_;
  OnnxImportOptions options_;
  std::string name_;
  std::set<std::string> initializers_;
};

}  // namespace

Expected<ir::StagedModel> onnxStagesFromBytes(std::string_view bytes,
                                              const OnnxImportOptions& options,
                                              const std::string& modelDir,
                                              const std::string& displayName) {
  return guarded(displayName, [&]() -> Expected<ir::StagedModel> {
    KILN_ASSIGN_OR_RETURN(::onnx::ModelProto model, parseModel(bytes, modelDir, displayName));
    ir::StagedModel staged;
    std::set<std::string> initializers;
    for (const auto& init : model.graph().initializer()) initializers.insert(init.name());
    for (const auto& in : model.graph().input()) {
      if (initializers.count(in.name())) continue;
      staged.inputs.push_back(in.name());
      const auto& tt = in.type().tensor_type();
      const auto dtype = onnx_import::dtypeFromOnnx(tt.elem_type());
      if (!dtype)
        return unimplemented(displayName + ": graph input '" + in.name() + "' has element type " +
                             onnx_import::onnxTypeName(tt.elem_type()) +
                             ", which kiln does not support");
      ir::TensorType t{*dtype, {}};
      for (int d = 0; d < tt.shape().dim_size(); ++d) {
        const auto& dim = tt.shape().dim(d);
        int64_t size = 1;
        if (dim.has_dim_value()) {
          size = dim.dim_value();
        } else if (dim.has_dim_param() && options.dimValues.count(dim.dim_param())) {
          size = options.dimValues.at(dim.dim_param());
        } else if (d == 0 && options.defaultBatch) {
          size = *options.defaultBatch;
        }
        t.shape.push_back(size);
      }
      staged.inputTypes.push_back(std::move(t));
    }
    for (const auto& out : model.graph().output()) staged.outputs.push_back(out.name());
    auto shared = std::make_shared<const ::onnx::ModelProto>(std::move(model));
    OnnxStager stager(shared, options, displayName);
    staged.stage = [stager, displayName](
                       int64_t begin, const std::map<std::string, ir::TensorType>& env,
                       const std::map<std::string, int64_t>& sizes,
                       const std::map<std::string, ir::TensorData>& known) -> Expected<ir::Stage> {
      return guarded(displayName, [&] { return stager(begin, env, sizes, known); });
    };
    return staged;
  });
}

bool needsStages(const Status& status) {
  const std::string& m = status.message();
  return status.code() == ErrorCode::kUnimplemented &&
         m.find("cannot import 1 node of") != std::string::npos &&
         m.find(onnx_import::kRunsInStages) != std::string::npos;
}

Expected<ir::StagedModel> onnxStages(const std::string& path, const OnnxImportOptions& options) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, readModelFile(path));
  return onnxStagesFromBytes(bytes, options, modelDirOf(path), path);
}

}  // namespace kiln::frontends
