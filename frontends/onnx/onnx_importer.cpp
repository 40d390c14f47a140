#include "frontends/onnx/onnx_importer.h"

#include <algorithm>
#include <cctype>

#include "frontends/file_io.h"
#include "frontends/onnx/onnx_tensor.h"
#include "ir/verifier.h"

namespace kiln::frontends::onnx_import {

namespace {

std::string domainOf(const ::onnx::NodeProto& node) {
  return node.domain() == "ai.onnx" ? std::string() : node.domain();
}

const std::vector<const ::onnx::NodeProto*> kNoNodes;

}  // namespace

std::string describeNode(const ::onnx::NodeProto& node, int opset) {
  const std::string domain = domainOf(node);
  std::string s = (domain.empty() ? "" : domain + ".") + node.op_type() + " (opset " +
                  std::to_string(opset) + ") node ";
  if (!node.name().empty()) return s + "'" + node.name() + "'";
  for (const auto& out : node.output())
    if (!out.empty()) return s + "with output '" + out + "'";
  return s + "(unnamed)";
}

Importer::Importer(::onnx::ModelProto& model, std::string displayName, InputDimNames dimNames,
                   bool onnxInferred, std::map<std::string, ir::TensorData> bound)
    : model_(model),
      displayName_(std::move(displayName)),
      dimNames_(std::move(dimNames)),
      onnxInferred_(onnxInferred),
      bound_(std::move(bound)) {
  for (const auto& imp : model_.opset_import())
    opsets_[imp.domain() == "ai.onnx" ? "" : imp.domain()] = static_cast<int>(imp.version());
  const auto& g = model_.graph();
  countConsumers(g, true);
  for (const auto* list : {&g.input(), &g.output(), &g.value_info()})
    for (const auto& vi : *list) onnxTypes_[vi.name()] = &vi.type();
  for (const auto& init : g.initializer()) {
    OnnxValue& v = values_[init.name()];
    v.initializer = &init;
    v.trainable = init.data_type() == ::onnx::TensorProto::FLOAT ||
                  init.data_type() == ::onnx::TensorProto::DOUBLE ||
                  init.data_type() == ::onnx::TensorProto::FLOAT16 ||
                  init.data_type() == ::onnx::TensorProto::BFLOAT16;
  }
}

OnnxValue* Importer::find(const std::string& name) {
  auto it = values_.find(name);
  return it == values_.end() ? nullptr : &it->second;
}

OnnxValue& Importer::define(const std::string& name) {
  return values_[name];
}

std::string Importer::uniqueName(std::string_view want) {
  std::string base(want.substr(0, 200));
  for (char& c : base)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' ||
          c == '/' || c == ':'))
      c = '_';
  if (base.empty()) base = "v";
  if (!graph_.findValue(base)) return base;
  for (int i = 1;; ++i) {
    std::string n = base + "." + std::to_string(i);
    if (!graph_.findValue(n)) return n;
  }
}

Expected<const ir::TensorData*> Importer::constantOf(const std::string& name, OnnxValue& v) {
  if (!v.constant && v.initializer) {
    KILN_ASSIGN_OR_RETURN(ir::TensorData data,
                          tensorFromProto(*v.initializer, "initializer '" + name + "'"));
    v.constant = std::move(data);
  }
  return v.constant ? &*v.constant : nullptr;
}

Expected<ir::Value*> Importer::valueOf(const std::string& name, OnnxValue& v, bool trainable) {
  if (v.value) return v.value;
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* data, constantOf(name, v));
  if (!data) return internalError("value '" + name + "' has neither a kiln value nor data");
  KILN_ASSIGN_OR_RETURN(v.value,
                        graph_.addParameter(uniqueName(name), *data, trainable && v.trainable));
  return v.value;
}

int Importer::numConsumers(const std::string& name) const {
  auto it = numConsumers_.find(name);
  return it == numConsumers_.end() ? 0 : it->second;
}

const std::vector<const ::onnx::NodeProto*>& Importer::consumerNodes(
    const std::string& name) const {
  auto it = consumerNodes_.find(name);
  return it == consumerNodes_.end() ? kNoNodes : it->second;
}

const ::onnx::TypeProto* Importer::onnxType(const std::string& name) const {
  auto it = onnxTypes_.find(name);
  return it == onnxTypes_.end() ? nullptr : it->second;
}

void nodeReads(const ::onnx::NodeProto& p, bool valuesOnly, std::vector<std::string>& out) {
  if (valuesOnly && (p.op_type() == "Shape" || p.op_type() == "Size")) return;
  const int read =
      valuesOnly && p.op_type() == "CastLike" ? std::min(p.input_size(), 1) : p.input_size();
  out.insert(out.end(), p.input().begin(), p.input().begin() + read);
  for (const auto& a : p.attribute())
    if (a.has_g())
      for (const auto& node : a.g().node()) nodeReads(node, valuesOnly, out);
}

std::optional<int64_t> Importer::runtimeSize(const std::string& key) const {
  auto it = runtimeSizes_.find(key);
  if (it == runtimeSizes_.end()) return std::nullopt;
  return it->second;
}

Status Importer::requestSize(SizeRequest request, const std::string& reason) {
  const bool allBranches = !enclosing_.empty() && std::all_of(enclosing_.begin(), enclosing_.end(),
                                                              [](const std::optional<Branch>& b) {
                                                                return b.has_value();
                                                              });
  if (allBranches) {
    // Inside If branches only: the outermost, at the top level, is spliced into the graph, and
    // the node asks again from there.
    const Branch& outer = *enclosing_.front();
    if (!sizeRequest_)
      sizeRequest_ = SizeRequest{{},
                                 {},
                                 {},
                                 std::string(kBranchOf) + outer.key,
                                 outer.node,
                                 "its branch",
                                 outer.taken ? 1 : 0};
    return unimplemented(reason + ", inside the branch of " + outer.node +
                         " that the import took: " + std::string(kRunsInStages));
  }
  if (!enclosing_.empty())
    return unimplemented(reason +
                         ", inside a Loop or Scan body: kiln runs such a model in stages, which "
                         "cannot end inside a subgraph that is not an If's branch");
  if (!sizeRequest_) sizeRequest_ = std::move(request);
  return unimplemented(reason + ": " + std::string(kRunsInStages));
}

void Importer::noteNeededConstant(const std::string& name) {
  // The graph inputs `name` is computed from, through every node but those that read only their
  // inputs' shapes (Shape, Size) or types (CastLike's second): with them bound, the importer folds
  // `name` (a window's size cast and scaled into Range's limit, CenterCropPad's pads from its shape
  // input).
  std::vector<std::string> stack{name};
  std::set<std::string> seen;
  while (!stack.empty()) {
    const std::string n = std::move(stack.back());
    stack.pop_back();
    if (n.empty() || !seen.insert(n).second) continue;
    if (graphInputs_.count(n)) {
      neededInputs_.insert(n);
      continue;
    }
    if (auto it = producers_.find(n); it != producers_.end())
      nodeReads(*it->second, /*valuesOnly=*/true, stack);
  }
}

const std::string* Importer::geluInput(const ::onnx::NodeProto& node) const {
  auto it = geluOf_.find(&node);
  return it == geluOf_.end() ? nullptr : &it->second;
}

Status Importer::addGraphInputs() {
  for (const auto& in : model_.graph().input()) {
    if (values_.count(in.name())) continue;  // An initializer: a parameter, not an input.
    const auto& tt = in.type().tensor_type();
    auto dtype = dtypeFromOnnx(tt.elem_type());
    if (!dtype)
      return unimplemented("graph input '" + in.name() + "' has element type " +
                           onnxTypeName(tt.elem_type()) + ", which kiln does not support");
    ir::Shape shape;
    std::vector<uint64_t> dims;
    for (const auto& d : tt.shape().dim()) {
      shape.push_back(d.dim_value());
      dims.push_back(static_cast<uint64_t>(d.dim_value()));
    }
    if (!checkedByteSize(dims, ir::dtypeSize(*dtype)))
      return invalidArgument("graph input '" + in.name() + "' has dims " +
                             ir::shapeToString(shape) + " whose size does not fit in 64 bits");
    if (auto b = bound_.find(in.name()); b != bound_.end()) {
      // Specialized on its value (OnnxImportOptions::inputValues): a constant, not an input.
      const ir::TensorType declared{*dtype, shape};
      if (b->second.dtype() != *dtype || b->second.shape() != shape)
        return invalidArgument("the value given for graph input '" + in.name() + "' is " +
                               b->second.type().toString() + ", the model declares " +
                               declared.toString());
      values_[in.name()].constant = std::move(b->second);
      continue;
    }
    graphInputs_.insert(in.name());
    inputNames_.push_back(in.name());
    KILN_ASSIGN_OR_RETURN(
        ir::Value * v, graph_.addInput(uniqueName(in.name()), {*dtype, shape, ir::Layout::kPlain}));
    if (auto it = dimNames_.find(in.name()); it != dimNames_.end())
      KILN_TRY(graph_.setDimNames(v, it->second));
    values_[in.name()].value = v;
  }
  return Status::ok();
}

Status Importer::checkAgainstOnnx(const ::onnx::NodeProto& node, const std::string& describe) {
  // What is computed from a diverged value (its shape included) has libonnx's types computed
  // from its stale shape. A matched GELU's last node reads the gelu's input.
  std::vector<std::string> reads;
  if (const std::string* g = geluInput(node))
    reads.push_back(*g);
  else
    nodeReads(node, /*valuesOnly=*/false, reads);
  const bool fromDiverged = std::any_of(reads.begin(), reads.end(),
                                        [&](const std::string& in) { return diverged_.count(in); });
  for (const auto& name : node.output()) {
    if (name.empty()) continue;
    const OnnxValue* v = find(name);
    if (!v || v->poisoned) {
      // Outputs nothing reads (a Dropout mask, BatchNormalization statistics) stay undefined, and
      // an If's whose branch is to be spliced (poisoned: the node is imported again).
      if (numConsumers(name) == 0 || (v && splicePending())) continue;
      return internalError(describe + ": the mapping left output '" + name + "' undefined");
    }
    if (fromDiverged) diverged_.insert(name);
    if (!v->pendingPads.empty() || diverged_.count(name)) continue;
    const ::onnx::TypeProto* t = onnxType(name);
    if (!t || !t->has_tensor_type() || !t->tensor_type().has_shape()) continue;
    const ir::TensorType got = v->value ? v->value->type() : v->constant->type();
    ir::Shape want;
    bool known = true;
    for (const auto& d : t->tensor_type().shape().dim()) {
      known &= d.has_dim_value();
      want.push_back(d.dim_value());
    }
    if (!known) continue;
    auto dtype = dtypeFromOnnx(t->tensor_type().elem_type());
    if (got.shape == want && (!dtype || *dtype == got.dtype)) continue;
    const std::string onnx =
        (dtype ? std::string(ir::dtypeName(*dtype)) : "?") + ir::shapeToString(want);
    // Where ONNX shape inference ran, a difference is kiln's bug; otherwise the type is only
    // what the file declares, and the model may be wrong. libonnx 1.12 infers the outputs of
    // If, Loop and Scan from what their subgraphs declare, which a malformed model can get
    // wrong (fuzz_onnx found a Scan whose declared scan output disagreed with its steps).
    const bool subgraphOp =
        node.op_type() == "If" || node.op_type() == "Loop" || node.op_type() == "Scan";
    if (onnxInferred_ && !subgraphOp)
      return internalError(describe + ": kiln computes " + got.toString() + " for output '" + name +
                           "', but ONNX shape inference gives " + onnx +
                           " (a kiln bug; please report it)");
    return invalidArgument(describe + ": the model declares " + onnx + " for output '" + name +
                           "', but the node computes " + got.toString() +
                           " (fix the model's value_info or output type)");
  }
  return Status::ok();
}

int Importer::opsetOf(const std::string& domain) const {
  const auto it = opsets_.find(domain);
  return it == opsets_.end() ? 0 : it->second;
}

Status Importer::importNode(const ::onnx::NodeProto& node) {
  if (absorbed_.count(&node)) return Status::ok();
  const std::string domain = domainOf(node);
  const int opset = opsetOf(domain);
  const std::string describe = describeNode(node, opset);
  auto poison = [&] {
    for (const auto& out : node.output())
      if (!out.empty()) {
        values_[out] = OnnxValue{};
        values_[out].poisoned = true;
      }
  };

  const auto gelu = geluOf_.find(&node);
  MapperLookup found = findMapper(domain, node.op_type(), opset);
  if (gelu != geluOf_.end()) found = {mapGelu, found.version, "", false};
  if (!found.map) {
    problems_.push_back({describe, found.problem, found.code()});
    poison();
    return Status::ok();
  }
  // A GELU pattern's last node reads nodes the gelu replaces; the gelu reads only x.
  const auto inputs = gelu != geluOf_.end()
                          ? std::vector<std::string>{gelu->second}
                          : std::vector<std::string>(node.input().begin(), node.input().end());
  for (const auto& in : inputs) {
    if (in.empty()) continue;
    const OnnxValue* v = find(in);
    // The ONNX checker catches this where it runs; a newer model is validated here.
    if (!v)
      return invalidArgument(describe + ": input '" + in + "' is not a graph input, an " +
                             "initializer or the output of an earlier node (ONNX nodes must be " +
                             "in topological order)");
    if (v->poisoned) {
      poison();  // The producer's problem is listed already.
      return Status::ok();
    }
  }
  NodeContext ctx(*this, node, opset, found.version);
  Status s = found.map(ctx);
  if (s.isOk()) s = checkAgainstOnnx(node, describe);
  if (!s.isOk()) {
    // A message from checkAgainstOnnx names the node already.
    const std::string prefix = describe + ": ";
    std::string reason = s.message();
    if (reason.rfind(prefix, 0) == 0) reason = reason.substr(prefix.size());
    problems_.push_back({describe, reason, s.code()});
    poison();
  }
  return Status::ok();
}

void Importer::countConsumers(const ::onnx::GraphProto& g, bool outputs) {
  for (const auto& node : g.node()) {
    for (const auto& in : node.input()) {
      if (in.empty()) continue;
      ++numConsumers_[in];
      consumerNodes_[in].push_back(&node);
    }
    for (const auto& a : node.attribute()) {
      if (a.has_g()) countConsumers(a.g(), true);
      for (const auto& sub : a.graphs()) countConsumers(sub, true);
    }
  }
  if (outputs)
    for (const auto& out : g.output()) ++numConsumers_[out.name()];
}

void definedNames(const ::onnx::GraphProto& g, std::unordered_set<std::string>& names) {
  for (const auto& in : g.input()) names.insert(in.name());
  for (const auto& init : g.initializer()) names.insert(init.name());
  for (const auto& node : g.node()) {
    for (const auto& out : node.output())
      if (!out.empty()) names.insert(out);
    for (const auto& a : node.attribute()) {
      if (a.has_g()) definedNames(a.g(), names);
      for (const auto& sub : a.graphs()) definedNames(sub, names);
    }
  }
}

void renameIn(::onnx::GraphProto& g, const std::unordered_set<std::string>& names,
              const std::string& scope) {
  auto rename = [&](std::string* n) {
    if (!n->empty() && names.count(*n)) *n = scope + *n;
  };
  for (auto& vi : *g.mutable_input()) rename(vi.mutable_name());
  for (auto& vi : *g.mutable_output()) rename(vi.mutable_name());
  for (auto& vi : *g.mutable_value_info()) rename(vi.mutable_name());
  for (auto& init : *g.mutable_initializer()) rename(init.mutable_name());
  for (auto& node : *g.mutable_node()) {
    for (auto& in : *node.mutable_input()) rename(&in);
    for (auto& out : *node.mutable_output()) rename(&out);
    if (!node.name().empty()) node.set_name(scope + node.name());
    for (auto& a : *node.mutable_attribute()) {
      if (a.has_g()) renameIn(*a.mutable_g(), names, scope);
      for (auto& sub : *a.mutable_graphs()) renameIn(sub, names, scope);
    }
  }
}

Status spliceDecidedBranches(::onnx::GraphProto& g, const std::map<std::string, int64_t>& sizes) {
  std::set<std::string> left;
  for (const auto& [key, value] : sizes)
    if (isBranchKey(key)) left.insert(key.substr(kBranchOf.size()));
  while (!left.empty()) {
    int at = -1;
    for (int i = 0; i < g.node_size() && at < 0; ++i)
      if (g.node(i).op_type() == "If" && g.node(i).output_size() > 0 &&
          left.count(g.node(i).output(0)))
        at = i;
    if (at < 0) return internalError("no If to splice has the output '" + *left.begin() + "'");
    const ::onnx::NodeProto node = g.node(at);
    const std::string& out0 = node.output(0);
    left.erase(out0);
    const bool taken = sizes.at(std::string(kBranchOf) + out0) != 0;
    const char* name = taken ? "then_branch" : "else_branch";
    const ::onnx::AttributeProto* attr = nullptr;
    for (const auto& a : node.attribute())
      if (a.name() == name && a.has_g()) attr = &a;
    if (!attr) return invalidArgument("If node '" + node.name() + "' has no " + name);
    ::onnx::GraphProto branch = attr->g();
    if (branch.output_size() != node.output_size())
      return invalidArgument(std::string(name) + " of If node '" + node.name() + "' has " +
                             std::to_string(branch.output_size()) + " outputs, the node " +
                             std::to_string(node.output_size()));
    std::unordered_set<std::string> names;
    definedNames(branch, names);
    renameIn(branch, names, out0 + (taken ? "/then/" : "/else/"));
    google::protobuf::RepeatedPtrField<::onnx::NodeProto> nodes;
    for (int i = 0; i < at; ++i) *nodes.Add() = g.node(i);
    // The branch's initializers as Constant nodes: moved to the graph's initializers, float ones
    // would become weights (trainable, not folded), which inlined they are not.
    for (auto& init : *branch.mutable_initializer()) {
      ::onnx::NodeProto* c = nodes.Add();
      c->set_op_type("Constant");
      c->add_output(init.name());
      ::onnx::AttributeProto* value = c->add_attribute();
      value->set_name("value");
      value->set_type(::onnx::AttributeProto::TENSOR);
      *value->mutable_t() = std::move(init);
    }
    for (const auto& n : branch.node()) *nodes.Add() = n;
    for (int k = 0; k < node.output_size(); ++k) {
      if (node.output(k).empty()) continue;
      ::onnx::NodeProto* id = nodes.Add();
      id->set_op_type("Identity");
      id->set_name(node.name() + "/" + name + "/output" + std::to_string(k));
      id->add_input(branch.output(k).name());
      id->add_output(node.output(k));
    }
    for (int i = at + 1; i < g.node_size(); ++i) *nodes.Add() = g.node(i);
    g.mutable_node()->Swap(&nodes);
    // What the file declares for the If's outputs may span both branches: Identity's are one's.
    std::set<std::string> outs(node.output().begin(), node.output().end());
    for (int i = g.value_info_size(); i-- > 0;)
      if (outs.count(g.value_info(i).name())) g.mutable_value_info()->DeleteSubrange(i, 1);
  }
  return Status::ok();
}

Expected<std::vector<OnnxValue>> Importer::inlineGraph(const ::onnx::GraphProto& body,
                                                       const std::vector<OnnxValue>& inputs,
                                                       const std::string& scope,
                                                       std::optional<Branch> branch) {
  if (static_cast<size_t>(body.input_size()) != inputs.size())
    return invalidArgument("the subgraph '" + body.name() + "' takes " +
                           std::to_string(body.input_size()) + " inputs, given " +
                           std::to_string(inputs.size()));
  // Each inlining is a fresh scope even where two nodes' readable prefixes meet.
  const std::string unique = scope + std::to_string(inlined_.size()) + "/";
  inlinedNodes_ += body.node_size();
  inlinedBytes_ += static_cast<int64_t>(body.ByteSizeLong());
  if (inlinedNodes_ > kMaxInlinedNodes || inlinedBytes_ > kMaxInlinedBytes)
    return unimplemented("unrolling control flow would import more than " +
                         std::to_string(kMaxInlinedNodes) + " nodes or copy more than " +
                         std::to_string(kMaxInlinedBytes >> 20) +
                         " MiB of subgraphs (kiln's graphs have no loops; a loop this long is "
                         "not unrolled)");
  std::unordered_set<std::string> names;
  definedNames(body, names);
  inlined_.push_back(body);
  ::onnx::GraphProto& g = inlined_.back();
  renameIn(g, names, unique);
  countConsumers(g, true);
  for (const auto& vi : g.value_info()) onnxTypes_[vi.name()] = &vi.type();
  std::unordered_set<std::string> bound;
  for (int i = 0; i < g.input_size(); ++i) {
    values_[g.input(i).name()] = inputs[static_cast<size_t>(i)];
    bound.insert(g.input(i).name());
  }
  for (const auto& init : g.initializer()) {
    if (bound.count(init.name())) continue;  // A default of a bound input: the input wins.
    OnnxValue& v = values_[init.name()];
    v = OnnxValue{};
    v.initializer = &init;
  }
  for (const auto& node : g.node())
    for (const auto& out : node.output()) producers_.emplace(out, &node);
  enclosing_.push_back(std::move(branch));
  for (const auto& node : g.node()) {
    Status st = importNode(node);
    if (!st.isOk()) {
      enclosing_.pop_back();
      return st;
    }
    if (splicePending()) {
      // The branch is spliced and imported again: nothing after the node is imported (another
      // node needing a value would be a second problem), and every output is poisoned.
      enclosing_.pop_back();
      OnnxValue poisoned;
      poisoned.poisoned = true;
      return std::vector<OnnxValue>(static_cast<size_t>(g.output_size()), poisoned);
    }
  }
  enclosing_.pop_back();
  std::vector<OnnxValue> outs;
  for (const auto& out : g.output()) {
    const OnnxValue* v = find(out.name());
    if (!v) {
      // Its own name, without the scope (a name it does not define carries none).
      const std::string shown =
          out.name().rfind(unique, 0) == 0 ? out.name().substr(unique.size()) : out.name();
      return invalidArgument("the subgraph '" + body.name() + "' output '" + shown +
                             "' is not defined in it or before it");
    }
    outs.push_back(*v);
  }
  return outs;
}

Status Importer::setGraphOutputs() {
  std::vector<ir::Value*> outs;
  for (const auto& out : model_.graph().output()) {
    OnnxValue* v = find(out.name());
    if (!v)
      return invalidArgument("graph output '" + out.name() + "' is not a graph input, an " +
                             "initializer or the output of a node");
    KILN_ASSIGN_OR_RETURN(ir::Value * value, valueOf(out.name(), *v, true));
    outs.push_back(value);
  }
  if (outs.empty()) return invalidArgument("the model's graph has no outputs");
  graph_.setOutputs(std::move(outs));
  return Status::ok();
}

void Importer::removeDeadNodes() {
  std::unordered_set<const ir::Value*> live(graph_.outputs().begin(), graph_.outputs().end());
  std::unordered_set<const ir::Node*> liveNodes;
  const std::vector<ir::Node*> nodes = graph_.nodes();
  for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
    const ir::Node* n = *it;
    const bool used = std::any_of(n->outputs().begin(), n->outputs().end(),
                                  [&](const ir::Value* o) { return live.count(o) > 0; });
    if (!used) continue;
    liveNodes.insert(n);
    live.insert(n->inputs().begin(), n->inputs().end());
  }
  graph_.removeNodesIf([&](const ir::Node& n) { return !liveNodes.count(&n); });
  graph_.removeUnusedParameters();
}

Expected<ir::Graph> Importer::run() {
  graph_.setName(model_.graph().name());
  KILN_TRY(addGraphInputs().withContext(displayName_));
  for (const GeluMatch& m : findGeluPatterns(model_.graph())) {
    geluOf_[m.final] = m.x;
    absorbed_.insert(m.absorbed.begin(), m.absorbed.end());
  }
  for (const auto& node : model_.graph().node())
    for (const auto& out : node.output()) producers_.emplace(out, &node);
  for (int i = 0; i < model_.graph().node_size(); ++i) {
    KILN_TRY(importNode(model_.graph().node(i)).withContext(displayName_));
    if (sizeRequest_ && sizeRequestNode_ < 0) {
      sizeRequestNode_ = i;
      break;  // What comes after needs the size: a stage ends here.
    }
  }
  // The nodes after a stage's end are imported with the size; an op kiln cannot map at all is
  // listed now, before any stage runs, with the rest of the problems. (Not inside an If branch,
  // which may be one that the import drops: its ops are found when a later stage imports it.)
  if (sizeRequestNode_ >= 0) {
    for (int i = sizeRequestNode_ + 1; i < model_.graph().node_size(); ++i) {
      const ::onnx::NodeProto& node = model_.graph().node(i);
      if (absorbed_.count(&node) || geluOf_.count(&node)) continue;
      const std::string domain = domainOf(node);
      const int opset = opsetOf(domain);
      const MapperLookup found = findMapper(domain, node.op_type(), opset);
      if (!found.map) problems_.push_back({describeNode(node, opset), found.problem, found.code()});
    }
  }
  if (!problems_.empty()) {
    bool anyUnimplemented = false, anyInvalid = false;
    std::string list;
    for (const auto& p : problems_) {
      anyUnimplemented |= p.code == ErrorCode::kUnimplemented;
      anyInvalid |= p.code == ErrorCode::kInvalidArgument;
      list += "\n  " + p.node + ": " + p.reason;
    }
    const ErrorCode code = anyUnimplemented ? ErrorCode::kUnimplemented
                           : anyInvalid     ? ErrorCode::kInvalidArgument
                                            : ErrorCode::kInternal;
    const size_t n = problems_.size();
    return Status(code, displayName_ + ": cannot import " + std::to_string(n) +
                            (n == 1 ? " node" : " nodes") + " of " +
                            std::to_string(model_.graph().node_size()) +
                            " (kiln imports all of a model or nothing):" + list);
  }
  KILN_TRY(setGraphOutputs().withContext(displayName_));
  removeDeadNodes();
  KILN_TRY(ir::verify(graph_).withContext(displayName_ + ": the imported graph"));
  return std::move(graph_);
}

}  // namespace kiln::frontends::onnx_import
