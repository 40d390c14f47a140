#include "ir/graph.h"

#include <algorithm>
#include <cctype>
#include <unordered_set>

namespace kiln::ir {

void Node::replaceInput(size_t i, Value* v) {
  Value* old = inputs_[i];
  auto it = std::find(old->users_.begin(), old->users_.end(), this);
  if (it != old->users_.end()) old->users_.erase(it);
  inputs_[i] = v;
  v->users_.push_back(this);
}

std::string Node::describe() const {
  std::string s = "node ";
  if (!name_.empty()) s += "'" + name_ + "' ";
  s += "(" + std::string(opName(op_));
  if (!outputs_.empty()) s += " -> %" + outputs_[0]->name();
  return s + ")";
}

bool Graph::isValidName(const std::string& name) {
  if (name.empty() || name.size() > 256) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-' ||
          c == '/' || c == ':'))
      return false;
  return true;
}

std::string Graph::freshName() {
  for (;;) {
    std::string n = std::to_string(nextId_++);
    if (!byName_.count(n)) return n;
  }
}

namespace {

// Every value's type: dims >= 0 and at most kMaxElements elements (what the text IR reads back).
Status checkType(const std::string& name, const TensorType& type) {
  for (int64_t d : type.shape)
    if (d < 0)
      return invalidArgument("value '%" + name + "' has a negative dimension in " +
                             type.toString());
  if (!withinElementBound(type.shape))
    return invalidArgument("value '%" + name + "' of type " + type.toString() +
                           " has more than 2^48 elements (its dims other than 0 multiplied)");
  return Status::ok();
}

}  // namespace

Expected<Value*> Graph::newValue(const std::string& name, TensorType type, ValueKind kind) {
  if (!isValidName(name))
    return invalidArgument("invalid value name '" + name +
                           "' (use letters, digits and _ . - / :, at most 256 characters)");
  if (byName_.count(name)) return invalidArgument("duplicate value name '%" + name + "'");
  KILN_TRY(checkType(name, type));
  auto v = std::make_unique<Value>();
  v->name_ = name;
  v->type_ = std::move(type);
  v->kind_ = kind;
  Value* raw = v.get();
  values_.push_back(std::move(v));
  byName_[name] = raw;
  return raw;
}

Expected<Value*> Graph::addInput(const std::string& name, TensorType type) {
  KILN_ASSIGN_OR_RETURN(Value * v, newValue(name, std::move(type), ValueKind::kInput));
  inputs_.push_back(v);
  return v;
}

bool Graph::isValidDimName(const std::string& name) {
  if (name.empty() || name.size() > 64 || std::isdigit(static_cast<unsigned char>(name[0])))
    return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

Status Graph::markState(Value* parameter) {
  if (!parameter || !parameter->isParameter() || parameter->trainable())
    return invalidArgument("only a non-trainable parameter can be persistent state" +
                           (parameter ? ", not '%" + parameter->name() + "'" : std::string()));
  parameter->state_ = true;
  return Status::ok();
}

Status Graph::setDimNames(Value* input, std::vector<std::string> names) {
  if (!input || !input->isInput()) return invalidArgument("dim names belong to graph inputs only");
  const std::string where = "input '%" + input->name() + "'";
  if (names.size() != input->type().shape.size())
    return invalidArgument(where + " has rank " + std::to_string(input->type().shape.size()) +
                           " but " + std::to_string(names.size()) + " dim names");
  bool any = false;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty()) continue;
    if (!isValidDimName(names[i]))
      return invalidArgument(where + ": dim " + std::to_string(i) + " name '" + names[i] +
                             "' is not an identifier (letters, digits and _, at most 64, " +
                             "not starting with a digit)");
    any = true;
  }
  if (!any) names.clear();
  input->dimNames_ = std::move(names);
  return Status::ok();
}

Expected<std::map<std::string, int64_t>> Graph::dimValues() const {
  std::map<std::string, int64_t> values;
  for (const Value* in : inputs_)
    for (size_t i = 0; i < in->dimNames_.size(); ++i) {
      const std::string& name = in->dimNames_[i];
      if (name.empty()) continue;
      const int64_t size = in->type_.shape[i];
      auto [it, fresh] = values.emplace(name, size);
      if (!fresh && it->second != size)
        return invalidArgument("symbolic dim '" + name + "' is " + std::to_string(it->second) +
                               " in one input but " + std::to_string(size) + " in input '%" +
                               in->name() + "' (dim " + std::to_string(i) + ")");
    }
  return values;
}

Expected<Value*> Graph::addParameter(const std::string& name, TensorData data, bool trainable) {
  KILN_ASSIGN_OR_RETURN(Value * v, addParameter(name, data.type(), trainable));
  v->data_ = std::move(data);
  return v;
}

Expected<Value*> Graph::addParameter(const std::string& name, TensorType type, bool trainable) {
  KILN_ASSIGN_OR_RETURN(Value * v, newValue(name, std::move(type), ValueKind::kParameter));
  v->trainable_ = trainable;
  parameters_.push_back(v);
  return v;
}

Expected<Node*> Graph::addNode(OpKind op, std::vector<Value*> inputs, AttrMap attrs,
                               std::vector<std::string> outputNames) {
  std::vector<TensorType> inTypes;
  inTypes.reserve(inputs.size());
  for (Value* v : inputs) inTypes.push_back(v->type());
  auto types = inferTypes(op, inTypes, attrs);
  if (!types) return types.status();
  std::vector<std::pair<std::string, TensorType>> outs;
  for (size_t i = 0; i < types->size(); ++i) {
    std::string n =
        i < outputNames.size() && !outputNames[i].empty() ? outputNames[i] : freshName();
    outs.emplace_back(std::move(n), std::move((*types)[i]));
  }
  return addNodeWithTypes(op, std::move(inputs), std::move(attrs), std::move(outs));
}

Expected<Node*> Graph::addNodeWithTypes(OpKind op, std::vector<Value*> inputs, AttrMap attrs,
                                        std::vector<std::pair<std::string, TensorType>> outputs) {
  // Check every output name first, so that a bad one leaves the graph unchanged.
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string& name = outputs[i].first;
    if (!isValidName(name))
      return invalidArgument("invalid value name '" + name +
                             "' (use letters, digits and _ . - / :, at most 256 characters)");
    if (byName_.count(name)) return invalidArgument("duplicate value name '%" + name + "'");
    for (size_t j = 0; j < i; ++j)
      if (outputs[j].first == name) return invalidArgument("duplicate value name '%" + name + "'");
    KILN_TRY(checkType(name, outputs[i].second));
  }
  auto node = std::make_unique<Node>();
  node->op_ = op;
  node->attrs_ = std::move(attrs);
  for (auto& [name, type] : outputs) {
    KILN_ASSIGN_OR_RETURN(Value * v, newValue(name, std::move(type), ValueKind::kNodeOutput));
    v->producer_ = node.get();
    v->outputIndex_ = static_cast<int>(node->outputs_.size());
    node->outputs_.push_back(v);
  }
  node->inputs_ = std::move(inputs);
  for (Value* v : node->inputs_) v->users_.push_back(node.get());
  Node* raw = node.get();
  nodes_.push_back(std::move(node));
  return raw;
}

Expected<Node*> Graph::insertNode(Node* before, OpKind op, std::vector<Value*> inputs,
                                  AttrMap attrs, std::vector<std::string> outputNames) {
  KILN_ASSIGN_OR_RETURN(Node * n,
                        addNode(op, std::move(inputs), std::move(attrs), std::move(outputNames)));
  if (!before) return n;
  auto pos = std::find_if(nodes_.begin(), nodes_.end(),
                          [&](const std::unique_ptr<Node>& p) { return p.get() == before; });
  if (pos == nodes_.end()) return internalError("insertNode: `before` is not in the graph");
  std::unique_ptr<Node> owned = std::move(nodes_.back());
  nodes_.pop_back();
  nodes_.insert(pos, std::move(owned));
  return n;
}

Graph Graph::clone() const {
  Graph g(name_);
  std::unordered_map<const Value*, Value*> map;
  // Names were unique here, so re-adding them cannot fail.
  for (const Value* v : inputs_) {
    map[v] = *g.addInput(v->name_, v->type_);
    map[v]->dimNames_ = v->dimNames_;
  }
  for (const Value* p : parameters_) {
    Value* q = *g.addParameter(p->name_, p->type_, p->trainable_);
    q->data_ = p->data_;
    q->state_ = p->state_;
    map[p] = q;
  }
  for (const auto& n : nodes_) {
    std::vector<Value*> ins;
    for (const Value* v : n->inputs_) ins.push_back(map.at(v));
    std::vector<std::pair<std::string, TensorType>> outs;
    for (const Value* o : n->outputs_) outs.emplace_back(o->name_, o->type_);
    Node* c = *g.addNodeWithTypes(n->op_, std::move(ins), n->attrs_, std::move(outs));
    c->name_ = n->name_;
    for (size_t i = 0; i < c->outputs_.size(); ++i) map[n->outputs_[i]] = c->outputs_[i];
  }
  for (const Value* o : outputs_) g.outputs_.push_back(map.at(o));
  g.nextId_ = nextId_;
  return g;
}

std::vector<Node*> Graph::nodes() const {
  std::vector<Node*> out;
  out.reserve(nodes_.size());
  for (const auto& n : nodes_) out.push_back(n.get());
  return out;
}

Value* Graph::findValue(const std::string& name) const {
  auto it = byName_.find(name);
  return it == byName_.end() ? nullptr : it->second;
}

void Graph::replaceAllUsesWith(Value* from, Value* to) {
  const std::vector<Node*> users = from->users_;
  for (Node* n : users)
    for (size_t i = 0; i < n->inputs_.size(); ++i)
      if (n->inputs_[i] == from) n->replaceInput(i, to);
  for (Value*& o : outputs_)
    if (o == from) o = to;
}

void Graph::eraseNode(Node* n) {
  for (Value* in : n->inputs_) {
    auto it = std::find(in->users_.begin(), in->users_.end(), n);
    if (it != in->users_.end()) in->users_.erase(it);
  }
  for (Value* out : n->outputs_) {
    byName_.erase(out->name_);
    out->producer_ = nullptr;
  }
}

bool Graph::isOutput(const Value* v) const {
  return std::find(outputs_.begin(), outputs_.end(), v) != outputs_.end();
}

size_t Graph::removeUnusedNodes() {
  const std::unordered_set<const Value*> outputs(outputs_.begin(), outputs_.end());
  size_t total = 0;
  for (size_t removed = 1; removed > 0; total += removed)
    removed = removeNodesIf([&](const Node& n) {
      for (const Value* o : n.outputs())
        if (!o->users().empty() || outputs.count(o)) return false;
      return true;
    });
  return total;
}

size_t Graph::removeUnusedParameters() {
  std::vector<Value*> kept;
  size_t removed = 0;
  for (Value* p : parameters_) {
    const bool isOutput = std::find(outputs_.begin(), outputs_.end(), p) != outputs_.end();
    if (p->users_.empty() && !isOutput) {
      byName_.erase(p->name_);
      ++removed;
    } else {
      kept.push_back(p);
    }
  }
  parameters_ = std::move(kept);
  return removed;
}

int64_t Graph::numTrainableParameters() const {
  int64_t n = 0;
  for (const Value* p : parameters_)
    if (p->trainable_) n += p->type_.numElements();
  return n;
}

int64_t Graph::parameterBytes() const {
  int64_t n = 0;
  for (const Value* p : parameters_) n += static_cast<int64_t>(p->type_.byteSize());
  return n;
}

}  // namespace kiln::ir
