// Value, Node and Graph: kiln's SSA dataflow IR. A Graph owns its values and nodes; nodes are
// kept in topological order; every value has one producer (a node, or the graph as an input
// or parameter) and a unique name.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/attributes.h"
#include "ir/op_table.h"
#include "ir/tensor_data.h"
#include "ir/types.h"

namespace kiln::ir {

class Node;
class Graph;

enum class ValueKind : uint8_t { kInput, kParameter, kNodeOutput };

class Value {
 public:
  const std::string& name() const { return name_; }
  const TensorType& type() const { return type_; }
  void setType(TensorType t) { type_ = std::move(t); }
  ValueKind kind() const { return kind_; }
  bool isInput() const { return kind_ == ValueKind::kInput; }
  bool isParameter() const { return kind_ == ValueKind::kParameter; }
  Node* producer() const { return producer_; }  // nullptr for inputs and parameters.
  int outputIndex() const { return outputIndex_; }

  // Parameters: their data, and whether training updates them (weights, biases) or not
  // (BatchNorm running statistics, constants).
  const TensorData& data() const { return data_; }
  void setData(TensorData d) { data_ = std::move(d); }
  bool trainable() const { return trainable_; }
  // Persistent state: a non-trainable parameter that a training step rewrites (optimizer
  // moments, BatchNorm running statistics). Passes never treat it as a constant.
  bool isState() const { return state_; }
  // Whether passes may take this value's data as fixed: a parameter with data that is neither
  // state nor, unless `inference`, trainable.
  bool isConstant(bool inference) const {
    return kind_ == ValueKind::kParameter && !data_.empty() && !state_ &&
           (inference || !trainable_);
  }

  // Graph inputs: a name per symbolic dim ("batch"), empty for a static dim; either empty or
  // one entry per dim. The type holds the size the graph is specialized for; at JIT time a
  // named dim may take another size (the graph is specialized again), a static one may not.
  const std::vector<std::string>& dimNames() const { return dimNames_; }
  bool hasDimNames() const { return !dimNames_.empty(); }

  // Nodes that read this value, once per input slot (a node reading it twice appears twice).
  const std::vector<Node*>& users() const { return users_; }

 private:
  friend class Graph;
  friend class Node;
  std::string name_;
  TensorType type_;
  ValueKind kind_ = ValueKind::kNodeOutput;
  Node* producer_ = nullptr;
  int outputIndex_ = 0;
  TensorData data_;
  bool trainable_ = false;
  bool state_ = false;
  std::vector<std::string> dimNames_;
  std::vector<Node*> users_;
};

class Node {
 public:
  OpKind op() const { return op_; }
  const OpInfo& info() const { return opInfo(op_); }
  // An optional name (e.g. the ONNX node name); values carry the SSA names.
  const std::string& name() const { return name_; }
  void setName(std::string n) { name_ = std::move(n); }
  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  Value* input(size_t i) const { return inputs_[i]; }
  Value* output(size_t i = 0) const { return outputs_[i]; }
  size_t numInputs() const { return inputs_.size(); }
  const AttrMap& attrs() const { return attrs_; }
  AttrView attr() const { return AttrView(info(), attrs_); }
  void setAttr(const std::string& name, AttrValue v) { attrs_[name] = std::move(v); }
  void replaceInput(size_t i, Value* v);
  // "node 'conv1' (conv2d -> %12)": how error messages name a node.
  std::string describe() const;

 private:
  friend class Graph;
  OpKind op_ = OpKind::kAdd;
  std::string name_;
  std::vector<Value*> inputs_;
  std::vector<Value*> outputs_;
  AttrMap attrs_;
};

class Graph {
 public:
  explicit Graph(std::string name = "main") : name_(std::move(name)) {}
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  Graph(Graph&&) = default;
  Graph& operator=(Graph&&) = default;

  const std::string& name() const { return name_; }
  void setName(std::string n) { name_ = std::move(n); }
  // A deep copy of the structure; parameter data is shared (TensorData copies share bytes).
  Graph clone() const;

  // Adds a graph input. Errors when the name is taken or not a valid identifier.
  Expected<Value*> addInput(const std::string& name, TensorType type);
  // Names the symbolic dims of graph input `input` (see Value::dimNames): one entry per dim,
  // "" for a static dim, each name an identifier (letters, digits, _; not starting with a
  // digit). All-empty clears them. Errors name the input and the offending entry.
  Status setDimNames(Value* input, std::vector<std::string> names);
  // Marks a non-trainable parameter as persistent state (Value::isState).
  Status markState(Value* parameter);
  // The size of every named dim of the inputs, by name. Errors when one name has two sizes.
  Expected<std::map<std::string, int64_t>> dimValues() const;
  Expected<Value*> addParameter(const std::string& name, TensorData data, bool trainable);
  // A parameter whose data is attached later (the text IR carries no weights).
  Expected<Value*> addParameter(const std::string& name, TensorType type, bool trainable);
  // Appends a node; infers output types; names outputs from `outputNames` or fresh numbers.
  Expected<Node*> addNode(OpKind op, std::vector<Value*> inputs, AttrMap attrs = {},
                          std::vector<std::string> outputNames = {});
  // Appends a node whose output types are given (the text parser); the verifier checks them.
  Expected<Node*> addNodeWithTypes(OpKind op, std::vector<Value*> inputs, AttrMap attrs,
                                   std::vector<std::pair<std::string, TensorType>> outputs);
  // Like addNode, but places the node right before `before` (at the end when nullptr), so
  // that passes can rewrite in place and keep the topological order.
  Expected<Node*> insertNode(Node* before, OpKind op, std::vector<Value*> inputs,
                             AttrMap attrs = {}, std::vector<std::string> outputNames = {});
  void setOutputs(std::vector<Value*> outs) { outputs_ = std::move(outs); }

  const std::vector<Value*>& inputs() const { return inputs_; }
  const std::vector<Value*>& parameters() const { return parameters_; }
  const std::vector<Value*>& outputs() const { return outputs_; }
  std::vector<Node*> nodes() const;
  size_t numNodes() const { return nodes_.size(); }
  Value* findValue(const std::string& name) const;

  // Replaces every use of `from` (node inputs and graph outputs) by `to`.
  void replaceAllUsesWith(Value* from, Value* to);
  // Removes the nodes for which `pred` holds; their outputs must be unused. Returns how
  // many were removed.
  template <class Pred>
  size_t removeNodesIf(Pred pred);
  // Removes parameters that no node reads and that are not graph outputs.
  size_t removeUnusedParameters();
  // Removes nodes none of whose outputs is read or a graph output, until none is left (a
  // rewrite's replaced nodes and the producers they orphaned). Returns how many.
  size_t removeUnusedNodes();
  bool isOutput(const Value* v) const;  // One of the graph's outputs.

  // Sum of trainable parameter elements (what PyTorch's parameters() counts).
  int64_t numTrainableParameters() const;
  int64_t parameterBytes() const;

  // A fresh value name, "%<n>" style without the '%'.
  std::string freshName();
  static bool isValidName(const std::string& name);
  static bool isValidDimName(const std::string& name);

 private:
  Expected<Value*> newValue(const std::string& name, TensorType type, ValueKind kind);
  void eraseNode(Node* n);

  std::string name_;
  std::vector<std::unique_ptr<Value>> values_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<Value*> inputs_;
  std::vector<Value*> parameters_;
  std::vector<Value*> outputs_;
  std::unordered_map<std::string, Value*> byName_;
  int64_t nextId_ = 0;
};

template <class Pred>
size_t Graph::removeNodesIf(Pred pred) {
  size_t removed = 0;
  std::vector<std::unique_ptr<Node>> kept;
  kept.reserve(nodes_.size());
  for (auto& n : nodes_) {
    if (pred(static_cast<const Node&>(*n))) {
      eraseNode(n.get());
      ++removed;
    } else {
      kept.push_back(std::move(n));
    }
  }
  nodes_ = std::move(kept);
  return removed;
}

// Makes the graph again for new input types (dtypes and shapes, in input order): how a
// frontend that folded shape arithmetic at import (ONNX) re-imports for kiln::jit.
using GraphSpecializer = std::function<Expected<Graph>(std::span<const TensorType> inputTypes)>;

}  // namespace kiln::ir
