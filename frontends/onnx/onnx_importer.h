// The state of one ONNX import (the kiln graph being built, every ONNX value by name, the
// problems found so far) and NodeContext, the view of it that an op mapper gets for one node.
#pragma once

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "frontends/onnx/onnx_proto.h"
#include "ir/graph.h"

namespace kiln::frontends::onnx_import {

// What the importer knows about one ONNX value.
struct OnnxValue {
  ir::Value* value = nullptr;                        // The kiln value, once it exists.
  std::optional<ir::TensorData> constant;            // Data known at import.
  const ::onnx::TensorProto* initializer = nullptr;  // Data not yet read (initializers).
  bool trainable = false;  // A weight: a float initializer or a constant folded from one.
  bool poisoned = false;   // Produced by a node that could not be imported.
  // Zero padding of the spatial dims (all begins, then all ends) that a folded Pad leaves for
  // the Conv nodes reading this value; `value` is then the unpadded input.
  std::vector<int64_t> pendingPads;
};

// A node the importer could not map, reported together with all the others.
struct NodeProblem {
  std::string node;  // "Erf (opset 13) node 'erf_1'"
  std::string reason;
  ErrorCode code;
};

// How a node that needs a value known only at run time (SizeRequest) ends its reason when the
// import has none; frontends::needsStages recognizes it.
inline constexpr std::string_view kRunsInStages =
    "kiln runs such a model in stages (`kiln run`, frontends::onnxStages)";

// A value the import needs that only the values of the model's inputs give, for which it stopped
// (NodeContext::runtimeSize, runtimeValue): a node's output size (NonZero's count of non-zeros),
// an If's condition, a Loop's trip count or condition. A model imported in stages runs what comes
// before the node, computes the value (runtime::valueSizedCount of `op`: for kCast to i64, the
// value of a one-element tensor) and imports the rest with it (OnnxImportOptions::runtimeSizes).
struct SizeRequest {
  ir::OpKind op{};
  ir::AttrMap attrs;                // The op's attributes but the size.
  std::vector<std::string> inputs;  // The ONNX values the size is computed from.
  std::string key;                  // Its name in runtimeSizes (kSizeOf, kValueOf, kBranchOf).
  std::string node;                 // "NonZero (opset 13) node 'nz'", for messages.
  std::string need;                 // "its size", "its condition 'c'": what the node needs.
  // Set when the node is inside the branch of a top-level If that the import decided (by a
  // known or run-time condition): the branch taken (1: then). A stage cannot end inside a
  // subgraph, so the stager splices that branch into the graph in place of the If
  // (spliceDecidedBranches; key kBranchOf + the If's first output) and imports again.
  std::optional<int64_t> decided;
};

// The keys of OnnxImportOptions::runtimeSizes, each kind with its prefix (so that no ONNX name
// reads as another kind): kSizeOf + a node's first output (its output's size), kValueOf + a
// value's name (an If's condition, a Loop's trip count), kBranchOf + an If's first output (the
// branch spliced).
inline constexpr std::string_view kSizeOf = "size of ";
inline constexpr std::string_view kValueOf = "value of ";
inline constexpr std::string_view kBranchOf = "branch of ";
inline bool isBranchKey(const std::string& key) {
  return key.rfind(kBranchOf, 0) == 0;
}
// Replaces each top-level If of `g` named by a "branch of OUT" key of `sizes` with the branch
// it says (1: then_branch): the branch's nodes in the If's place, every name it defines
// prefixed with "OUT/then/" (or else), its initializers moved to `g`'s, and an Identity per
// output onto the If's. A branch may hold Ifs named by keys too: spliced until none is left.
Status spliceDecidedBranches(::onnx::GraphProto& g, const std::map<std::string, int64_t>& sizes);

// Every name `g` defines (inputs, initializers, node outputs), its subgraphs' too; and `g` with
// each of `names` prefixed by `scope` (node names too): a subgraph made into fresh values.
void definedNames(const ::onnx::GraphProto& g, std::unordered_set<std::string>& names);
void renameIn(::onnx::GraphProto& g, const std::unordered_set<std::string>& names,
              const std::string& scope);

// "Conv (opset 13) node 'conv1'": how the error list names a node.
std::string describeNode(const ::onnx::NodeProto& node, int opset);

// The values node `p` reads: its inputs and, for If, Loop and Scan, what their bodies' nodes read
// (of outer scopes; the names a body defines itself are in none). `valuesOnly`: not the inputs
// whose shape or type alone it reads (Shape's and Size's, CastLike's second).
void nodeReads(const ::onnx::NodeProto& p, bool valuesOnly, std::vector<std::string>& out);

// Per ONNX graph input name, kiln's names of its symbolic dims (ir::Value::dimNames).
using InputDimNames = std::map<std::string, std::vector<std::string>>;

class Importer {
 public:
  // `onnxInferred`: the model passed libonnx's checker and shape inference (opsets and IR
  // versions libonnx knows), so the value types it holds are ONNX's, not only the file's.
  // `bound`: graph inputs taken as constants (OnnxImportOptions::inputValues that a node needs).
  Importer(::onnx::ModelProto& model, std::string displayName, InputDimNames dimNames = {},
           bool onnxInferred = true, std::map<std::string, ir::TensorData> bound = {});

  // Builds the kiln graph from a model whose graph inputs have static shapes and that passed
  // the ONNX checker and shape inference, or kiln's structural checks (onnxInferred false).
  Expected<ir::Graph> run();

  // ---- Used by NodeContext.
  ir::Graph& graph() { return graph_; }
  OnnxValue* find(const std::string& name);
  OnnxValue& define(const std::string& name);
  // A kiln value name for `want`: invalid characters replaced, unique in the graph.
  std::string uniqueName(std::string_view want);
  // The data of a constant value (reading an initializer on first use), or nullptr.
  Expected<const ir::TensorData*> constantOf(const std::string& name, OnnxValue& v);
  // The kiln value, adding a parameter for a constant on first use.
  Expected<ir::Value*> valueOf(const std::string& name, OnnxValue& v, bool trainable);
  // How many node inputs and graph outputs read `name`, and the nodes among them.
  int numConsumers(const std::string& name) const;
  const std::vector<const ::onnx::NodeProto*>& consumerNodes(const std::string& name) const;
  // The ONNX type of a value after ONNX shape inference, or nullptr when unknown.
  const ::onnx::TypeProto* onnxType(const std::string& name) const;
  // `name`'s shape is ONNX's (its spec and reference) where libonnx 1.12's shape inference,
  // which kiln runs, is out of date (a ceil-mode pool's last window in the padding): it and
  // everything computed from it are not checked against libonnx's types.
  void markDiverged(const std::string& name) { diverged_.insert(name); }
  // For the last node of a matched GELU pattern, the ONNX name of the gelu's input.
  const std::string* geluInput(const ::onnx::NodeProto& node) const;
  // A node needs `name`'s value at import and it is not known: the graph inputs it is computed
  // from (itself, where it is one) are recorded (neededInputs) so that importing again with
  // their values can succeed.
  void noteNeededConstant(const std::string& name);
  const std::set<std::string>& neededInputs() const { return neededInputs_; }
  // Run-time sizes and values by key (OnnxImportOptions::runtimeSizes), and the request of the
  // node that stopped the import without one (then run() fails; sizeRequestNode() is its index
  // among the graph's nodes). `reason` says what is known only at run time ("the size of its
  // output depends on ..."). Inside If branches only, the request is to splice the outermost
  // (SizeRequest::decided); inside a Loop or Scan body no stage can end: an error.
  void setRuntimeSizes(std::map<std::string, int64_t> sizes) { runtimeSizes_ = std::move(sizes); }
  std::optional<int64_t> runtimeSize(const std::string& key) const;
  Status requestSize(SizeRequest request, const std::string& reason);
  const std::optional<SizeRequest>& sizeRequest() const { return sizeRequest_; }
  // The import failed only for the size request (no other node's problem).
  bool stoppedForSize() const { return sizeRequest_ && problems_.size() == 1; }
  int sizeRequestNode() const { return sizeRequestNode_; }
  // The ONNX names of the kiln graph's inputs, in order (graph inputs that are neither
  // initializers nor bound).
  const std::vector<std::string>& inputNames() const { return inputNames_; }
  // Imports `body` (an If branch, a Loop or Scan body) once more into this graph, its inputs
  // bound to `inputs` and every name it defines prefixed by `scope`, so that each inlining
  // makes fresh values; names it does not define are the outer scopes' (ONNX's subgraphs read
  // them directly). A node that cannot be imported is listed with the others and poisons what
  // reads it. Returns the values of its outputs.
  // `branch`: the body is the branch an If took (the If's first output, how messages name the
  // node, which branch): a node inside that needs a run-time value has the If spliced (see
  // SizeRequest::decided) where only If branches enclose it.
  struct Branch {
    std::string key, node;
    bool taken = false;
  };
  Expected<std::vector<OnnxValue>> inlineGraph(const ::onnx::GraphProto& body,
                                               const std::vector<OnnxValue>& inputs,
                                               const std::string& scope,
                                               std::optional<Branch> branch = std::nullopt);
  // A node inside an If branch asked for its branch to be spliced: the If (and every If around
  // it) gives poisoned outputs and no problem of its own.
  bool splicePending() const { return sizeRequest_ && sizeRequest_->decided.has_value(); }

 private:
  Status addGraphInputs();
  Status importNode(const ::onnx::NodeProto& node);
  Status checkAgainstOnnx(const ::onnx::NodeProto& node, const std::string& describe);
  Status setGraphOutputs();
  void removeDeadNodes();
  // Counts the readers of every value (node inputs and graph outputs), in subgraphs too: a value
  // read only inside a branch or a body is still read.
  void countConsumers(const ::onnx::GraphProto& g, bool outputs);
  int opsetOf(const std::string& domain) const;  // 0 for a domain the model does not import.

  ::onnx::ModelProto& model_;
  std::string displayName_;
  InputDimNames dimNames_;
  bool onnxInferred_;
  ir::Graph graph_;
  std::unordered_map<std::string, int> opsets_;  // Domain ("" for ai.onnx) -> version.
  std::unordered_map<std::string, OnnxValue> values_;
  std::unordered_map<std::string, int> numConsumers_;
  std::unordered_map<std::string, std::vector<const ::onnx::NodeProto*>> consumerNodes_;
  std::unordered_map<std::string, const ::onnx::TypeProto*> onnxTypes_;
  // GELU patterns: nodes folded into another node's gelu, and the node that emits the gelu
  // (by the ONNX name of the gelu's input).
  std::unordered_set<const ::onnx::NodeProto*> absorbed_;
  std::unordered_map<const ::onnx::NodeProto*, std::string> geluOf_;
  std::vector<NodeProblem> problems_;
  std::map<std::string, ir::TensorData> bound_;
  std::set<std::string> graphInputs_, neededInputs_;
  std::unordered_set<std::string> diverged_;  // markDiverged.
  // The node defining each value, in the graph and the subgraphs inlined (noteNeededConstant).
  std::unordered_map<std::string, const ::onnx::NodeProto*> producers_;
  std::deque<::onnx::GraphProto> inlined_;  // The renamed copies inlineGraph imported.
  // Nodes inlined so far, all loops together: unrolling stops with an error past the bound.
  static constexpr int64_t kMaxInlinedNodes = int64_t{1} << 20;
  static constexpr int64_t kMaxInlinedBytes = int64_t{1} << 30;
  int64_t inlinedNodes_ = 0, inlinedBytes_ = 0;
  // The subgraphs being inlined now, outermost first: an If's branch (a stage's end inside
  // splices the outermost) or a Loop or Scan body (no stage can end inside one).
  std::vector<std::optional<Branch>> enclosing_;
  std::map<std::string, int64_t> runtimeSizes_;
  std::optional<SizeRequest> sizeRequest_;
  int sizeRequestNode_ = -1;
  std::vector<std::string> inputNames_;
};

// One ONNX node as an op mapper sees it: attributes with ONNX defaults, inputs as kiln values or
// constants, and ways to emit kiln nodes and define the node's outputs.
class NodeContext {
 public:
  NodeContext(Importer& importer, const ::onnx::NodeProto& node, int opset, int version);

  const ::onnx::NodeProto& proto() const { return node_; }
  const std::string& opType() const { return node_.op_type(); }
  int opset() const { return opset_; }
  // The version of the op's definition at that opset (its ONNX since_version): what mappers
  // branch on when the definition changed (e.g. ReduceMean's axes became an input in 18).
  int version() const { return version_; }

  // ---- Attributes. `def` is the ONNX default; without one the attribute is required.
  bool hasAttr(std::string_view name) const;
  Expected<int64_t> attrInt(std::string_view name, std::optional<int64_t> def = {}) const;
  // An int attribute the spec defines as a flag: 0 or 1, anything else is an error (ONNX's own
  // shape inference reads some flags as `== 1` and others as `!= 0`).
  Expected<bool> attrBool(std::string_view name, bool def) const;
  Expected<double> attrFloat(std::string_view name, std::optional<double> def = {}) const;
  Expected<std::string> attrString(std::string_view name,
                                   std::optional<std::string> def = {}) const;
  Expected<std::vector<int64_t>> attrInts(std::string_view name,
                                          std::optional<std::vector<int64_t>> def = {}) const;
  Expected<std::vector<double>> attrFloats(std::string_view name) const;
  Expected<std::vector<std::string>> attrStrings(
      std::string_view name, std::optional<std::vector<std::string>> def = {}) const;
  Expected<ir::TensorData> attrTensor(std::string_view name) const;

  // ---- Inputs. ONNX leaves an optional input out by giving it an empty name.
  size_t numInputs() const { return static_cast<size_t>(node_.input_size()); }
  bool hasInput(size_t i) const { return i < numInputs() && !node_.input(i).empty(); }
  Expected<ir::TensorType> inputType(size_t i);
  // The data of input i when it is known at import, else nullptr.
  Expected<const ir::TensorData*> constant(size_t i);
  bool allInputsConstant();
  // Whether input i is a weight: a float initializer, or data folded from one.
  bool inputTrainable(size_t i);
  // Input i as a kiln value (a constant becomes a parameter; trainable only for float
  // initializers when `trainable`).
  Expected<ir::Value*> value(size_t i, bool trainable = true);
  // Input i's values, which must be known at import (shape, axes, pads ...).
  Expected<std::vector<int64_t>> constInts(size_t i, const std::string& what);
  // constant(i) where the mapper cannot go on without it: when absent and input i is a graph
  // input, the importer records that its value is needed (OnnxImportOptions::inputValues).
  Expected<const ir::TensorData*> requireConstant(size_t i);
  Expected<double> constScalar(size_t i, const std::string& what);
  // Zero padding a folded Pad left on input i (see OnnxValue::pendingPads).
  const std::vector<int64_t>& pendingPads(size_t i);
  // A value by ONNX name, for mappers that read past the node's own inputs (GELU patterns).
  Expected<ir::Value*> valueNamed(const std::string& onnxName);
  // Non-null for the last node of a matched GELU pattern: the ONNX name of x.
  const std::string* geluInput() const { return imp_.geluInput(node_); }

  // ---- Outputs.
  size_t numOutputs() const { return static_cast<size_t>(node_.output_size()); }
  // Whether output k exists and anything reads it.
  bool outputUsed(size_t k) const;
  const std::vector<const ::onnx::NodeProto*>& outputConsumers(size_t k) const;
  int outputConsumerCount(size_t k) const;

  // Emits a kiln node. `output` >= 0: its value is the node's ONNX output `output` (named after
  // it); -1: an intermediate named after the node's first output.
  Expected<ir::Value*> emit(ir::OpKind op, std::vector<ir::Value*> inputs, ir::AttrMap attrs = {},
                            int output = -1);
  // A non-trainable parameter holding `data`, for constants the mapping creates.
  Expected<ir::Value*> constantValue(ir::TensorData data);
  // Defines ONNX output k as `v` (an alias when v was emitted for another purpose).
  void setOutput(size_t k, ir::Value* v);
  // `trainable`: the data is a weight (a float initializer, reshaped or transposed at import).
  void setConstantOutput(size_t k, ir::TensorData data, bool trainable = false);
  void setPaddedOutput(size_t k, ir::Value* unpadded, std::vector<int64_t> pads);
  // Defines output k as `v` (a value or a constant; poisoned: the node fails).
  void setOutputValue(size_t k, const OnnxValue& v);

  // ---- Subgraphs (If, Loop, Scan).
  Expected<const ::onnx::GraphProto*> attrGraph(std::string_view name) const;
  // Input i as the importer holds it (a constant stays one, so that a body can fold it).
  OnnxValue inputValue(size_t i) { return input(i); }
  Expected<std::vector<OnnxValue>> inlineGraph(const ::onnx::GraphProto& body,
                                               const std::vector<OnnxValue>& inputs,
                                               const std::string& scope) {
    return imp_.inlineGraph(body, inputs, scope);
  }
  // This If's branch `taken` (1: then_branch), inlined (Importer::inlineGraph's `branch`).
  Expected<std::vector<OnnxValue>> inlineBranch(const ::onnx::GraphProto& body,
                                                const std::string& scope, bool taken) {
    return imp_.inlineGraph(body, {}, scope,
                            Importer::Branch{node_.output(0), describeNode(node_, opset_), taken});
  }
  bool splicePending() const { return imp_.splicePending(); }
  // An ir::Value for `v` (a parameter for a constant).
  Expected<ir::Value*> valueOf(const OnnxValue& v);

  // Output k's shape is ONNX's where libonnx 1.12's inference is out of date
  // (Importer::markDiverged).
  void divergesFromLibonnx(size_t k) { imp_.markDiverged(node_.output(static_cast<int>(k))); }

  // ---- Output sizes known at run time. The size of this node's output that op `op` (with
  // `attrs`) computes from the values of the node's inputs `inputs`: the run-time size given for
  // the node (OnnxImportOptions::runtimeSizes), else the import stops here asking for it (a model
  // imported in stages, onnxStages) and this returns an error the mapper returns.
  Expected<int64_t> runtimeSize(ir::OpKind op, ir::AttrMap attrs, std::vector<size_t> inputs);
  // The value of input `i`, one integer or bool element that the import needs (an If's
  // condition, a Loop's trip count) and the model computes: the value given for it
  // (OnnxImportOptions::runtimeSizes["value of NAME"]), else the import stops here asking for it,
  // as runtimeSize does. `what` names it for messages ("its condition").
  Expected<int64_t> runtimeValue(size_t i, const std::string& what);

  // ---- Errors. A mapper returns these to have the node listed in the import's one error.
  Status unsupported(const std::string& reason) const { return unimplemented(reason); }
  Status invalid(const std::string& reason) const { return invalidArgument(reason); }

 private:
  OnnxValue& input(size_t i);

  Importer& imp_;
  const ::onnx::NodeProto& node_;
  int opset_;
  int version_;
};

// An op mapper: defines every output of the node, or returns the reason it cannot.
using OpMapper = Status (*)(NodeContext& ctx);
struct MapperEntry {
  std::string_view opType;
  // The versions of the op's definition (ONNX since_version, onnx_op_versions.inc) the mapper
  // implements, each reviewed against the specification: a model whose opset selects another
  // version is refused by name rather than mapped by a guess.
  std::vector<int> versions;
  OpMapper map;
};

// The version of `opType` (default domain) in effect at `opset`: its newest since_version not
// above the opset; 0 when the op is not defined there (unknown, introduced later, deprecated).
int onnxOpVersion(std::string_view opType, int opset);
// Every since_version of the op in the specification (negative: deprecated from there).
std::vector<int> onnxOpHistory(std::string_view opType);

struct MapperLookup {
  OpMapper map = nullptr;  // Null: `problem` says why.
  int version = 0;         // The op's version at the model's opset (default domain).
  std::string problem;
  bool invalid = false;  // The node is not valid ONNX at its opset (else: kiln lacks it).
  ErrorCode code() const {
    return invalid ? ErrorCode::kInvalidArgument : ErrorCode::kUnimplemented;
  }
};
// The mapper for a node of `opType` in `domain` ("" is ai.onnx) at the domain's `opset`.
MapperLookup findMapper(std::string_view domain, std::string_view opType, int opset);

// Checks a default-domain node against the definition of its op's `version` in the ONNX
// specification (onnx_op_versions.inc): its attribute names and its input and output counts.
// This is what keeps a node written for another opset (ReduceMean 18 with an `axes` attribute)
// from being mapped by a guess where libonnx's checker does not run.
Status checkNodeSchema(const ::onnx::NodeProto& node, int version);

// Every mapped op of the default domain with the versions it handles, by name: the source of
// docs/onnx.md's op table.
struct MappedOp {
  std::string opType;
  std::vector<int> versions;
};
std::vector<MappedOp> mappedOps();

// The families (onnx_map_*.cpp).
std::vector<MapperEntry> pointwiseMappers();
std::vector<MapperEntry> nnMappers();
std::vector<MapperEntry> movementMappers();
std::vector<MapperEntry> constantMappers();
std::vector<MapperEntry> padResizeMappers();
std::vector<MapperEntry> compositeMappers();
std::vector<MapperEntry> attentionMappers();
std::vector<MapperEntry> derivedMappers();
std::vector<MapperEntry> recurrentMappers();
std::vector<MapperEntry> signalMappers();
std::vector<MapperEntry> samplingMappers();
std::vector<MapperEntry> indexingMappers();
std::vector<MapperEntry> valueSizedMappers();
std::vector<MapperEntry> controlFlowMappers();
Status mapGelu(NodeContext& ctx);  // com.microsoft Gelu, and matched Erf GELU patterns.

// Erf-based GELU subgraphs, x * 0.5 * (1 + Erf(x / sqrt(2))) in the orders exporters write it.
struct GeluMatch {
  const ::onnx::NodeProto* final;  // Its output is the gelu.
  std::string x;
  std::vector<const ::onnx::NodeProto*> absorbed;  // Nodes the gelu replaces.
};
std::vector<GeluMatch> findGeluPatterns(const ::onnx::GraphProto& graph);

}  // namespace kiln::frontends::onnx_import
