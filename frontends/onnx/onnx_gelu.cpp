// Finds the Erf-based GELU subgraphs exporters write for torch.nn.GELU (kiln has gelu but no
// erf op): x * 0.5 * (1 + Erf(x / sqrt(2))) with the multiplications in any of the orders
// torch.onnx and transformer exporters use, and x / sqrt(2) also as x * (1 / sqrt(2)).
#include <cmath>
#include <unordered_map>

#include "frontends/onnx/onnx_importer.h"
#include "frontends/onnx/onnx_tensor.h"

namespace kiln::frontends::onnx_import {

namespace {

using ::onnx::NodeProto;

bool isOp(const NodeProto* n, const char* op) {
  return n && n->op_type() == op && (n->domain().empty() || n->domain() == "ai.onnx");
}

bool near(double v, double want) {
  return std::fabs(v - want) <= 1e-4 * std::fabs(want);
}

class GraphIndex {
 public:
  explicit GraphIndex(const ::onnx::GraphProto& g) {
    for (const auto& init : g.initializer()) initializers_[init.name()] = &init;
    for (const auto& n : g.node()) {
      for (const auto& out : n.output()) producer_[out] = &n;
      for (const auto& in : n.input()) {
        ++uses_[in];
        consumers_[in].push_back(&n);
      }
    }
    for (const auto& out : g.output()) ++uses_[out.name()];
  }

  const NodeProto* producer(const std::string& name) const {
    auto it = producer_.find(name);
    return it == producer_.end() ? nullptr : it->second;
  }

  // The one node that reads `name`, when nothing else (no other node, no graph output) does.
  const NodeProto* soleConsumer(const std::string& name) const {
    auto it = uses_.find(name);
    if (it == uses_.end() || it->second != 1) return nullptr;
    return consumers_.at(name).front();
  }

  bool hasSoleConsumer(const std::string& name) const { return soleConsumer(name) != nullptr; }

  // The value of a one-element float constant (an initializer or a Constant node's output).
  std::optional<double> scalar(const std::string& name) const {
    const ::onnx::TensorProto* t = nullptr;
    if (auto it = initializers_.find(name); it != initializers_.end()) t = it->second;
    if (const NodeProto* p = producer(name); isOp(p, "Constant"))
      for (const auto& a : p->attribute()) {
        if (a.name() == "value_float") return a.f();
        if (a.name() == "value" && a.has_t()) t = &a.t();
      }
    if (!t) return std::nullopt;
    for (int64_t d : t->dims())
      if (d != 1) return std::nullopt;
    if (t->data_type() != ::onnx::TensorProto::FLOAT &&
        t->data_type() != ::onnx::TensorProto::DOUBLE)
      return std::nullopt;
    auto data = tensorFromProto(*t, "constant '" + name + "'");
    if (!data) return std::nullopt;
    return data->dtype() == ir::DType::kF32 ? static_cast<double>(data->as<float>()[0])
                                            : data->as<double>()[0];
  }

  // For a binary node reading `name`, its other operand.
  static const std::string* other(const NodeProto* n, const std::string& name) {
    if (!n || n->input_size() != 2) return nullptr;
    if (n->input(0) == name) return &n->input(1);
    if (n->input(1) == name) return &n->input(0);
    return nullptr;
  }

  // Whether n is Mul(name, c) or Mul(c, name) with the constant c close to `value`.
  bool mulByConstant(const NodeProto* n, const std::string& name, double value) const {
    const std::string* o = isOp(n, "Mul") ? other(n, name) : nullptr;
    if (!o) return false;
    auto c = scalar(*o);
    return c && near(*c, value);
  }

 private:
  std::unordered_map<std::string, const ::onnx::TensorProto*> initializers_;
  std::unordered_map<std::string, const NodeProto*> producer_;
  std::unordered_map<std::string, int> uses_;
  std::unordered_map<std::string, std::vector<const NodeProto*>> consumers_;
};

std::optional<GeluMatch> matchAt(const GraphIndex& g, const NodeProto& erf) {
  const double kSqrt2 = std::sqrt(2.0);
  // x / sqrt(2), or x * (1 / sqrt(2)).
  const NodeProto* scale = g.producer(erf.input(0));
  std::string x;
  if (isOp(scale, "Div") && scale->input_size() == 2) {
    auto c = g.scalar(scale->input(1));
    if (!c || !near(*c, kSqrt2)) return std::nullopt;
    x = scale->input(0);
  } else if (isOp(scale, "Mul") && scale->input_size() == 2) {
    for (int i = 0; i < 2 && x.empty(); ++i) {
      auto c = g.scalar(scale->input(1 - i));
      if (c && near(*c, 1 / kSqrt2)) x = scale->input(i);
    }
    if (x.empty()) return std::nullopt;
  } else {
    return std::nullopt;
  }
  // 1 + Erf(...)
  const NodeProto* add = g.soleConsumer(erf.output(0));
  const std::string* one = isOp(add, "Add") ? GraphIndex::other(add, erf.output(0)) : nullptr;
  auto oneValue = one ? g.scalar(*one) : std::nullopt;
  if (!oneValue || !near(*oneValue, 1.0)) return std::nullopt;
  const NodeProto* m = g.soleConsumer(add->output(0));
  const std::string* mOther = isOp(m, "Mul") ? GraphIndex::other(m, add->output(0)) : nullptr;
  if (!mOther) return std::nullopt;

  GeluMatch match{nullptr, x, {&erf, add}};
  if (g.hasSoleConsumer(erf.input(0))) match.absorbed.push_back(scale);
  if (*mOther == x) {
    // (x * (1 + erf)) * 0.5
    const NodeProto* half = g.soleConsumer(m->output(0));
    if (!g.mulByConstant(half, m->output(0), 0.5)) return std::nullopt;
    match.final = half;
    match.absorbed.push_back(m);
  } else if (const NodeProto* h = g.producer(*mOther); g.mulByConstant(h, x, 0.5)) {
    // (x * 0.5) * (1 + erf)
    match.final = m;
    if (g.hasSoleConsumer(h->output(0))) match.absorbed.push_back(h);
  } else if (auto c = g.scalar(*mOther); c && near(*c, 0.5)) {
    // x * ((1 + erf) * 0.5)
    const NodeProto* last = g.soleConsumer(m->output(0));
    const std::string* lastOther =
        isOp(last, "Mul") ? GraphIndex::other(last, m->output(0)) : nullptr;
    if (!lastOther || *lastOther != x) return std::nullopt;
    match.final = last;
    match.absorbed.push_back(m);
  } else {
    return std::nullopt;
  }
  return match;
}

}  // namespace

std::vector<GeluMatch> findGeluPatterns(const ::onnx::GraphProto& graph) {
  const GraphIndex index(graph);
  std::vector<GeluMatch> matches;
  for (const auto& node : graph.node())
    if (isOp(&node, "Erf") && node.input_size() == 1 && node.output_size() == 1)
      if (auto m = matchAt(index, node)) matches.push_back(std::move(*m));
  return matches;
}

}  // namespace kiln::frontends::onnx_import
