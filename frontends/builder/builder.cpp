#include "frontends/builder/builder.h"

#include <algorithm>
#include <cmath>

#include "ir/verifier.h"

namespace kiln::frontends::nn {

using ir::AttrMap;
using ir::OpKind;
using ir::Shape;

namespace {

constexpr std::string_view kOutputName = "output";

const Shape& emptyShape() {
  static const Shape kEmpty;
  return kEmpty;
}

// The builder of the first tensor that has one: functions take it from their inputs.
Builder* builderOf(std::initializer_list<const Tensor*> xs) {
  for (const Tensor* x : xs)
    if (x->builder()) return x->builder();
  return nullptr;
}

// A function's node, named after the running module. Inputs without a builder (default
// tensors) leave nothing to record an error in, so the result is a default tensor too.
Tensor apply(OpKind kind, const std::vector<Tensor>& inputs, AttrMap attrs = {}) {
  for (const Tensor& t : inputs)
    if (t.builder()) return t.builder()->op(kind, inputs, std::move(attrs));
  return {};
}

std::string str(const Size2& s) {
  return "(" + std::to_string(s.h) + ", " + std::to_string(s.w) + ")";
}

std::vector<int64_t> pads(const Size2& p) {
  return {p.h, p.w, p.h, p.w};
}

AttrMap maxPoolAttrs(Size2 kernel, const MaxPool2dOptions& o) {
  const Size2 stride = o.stride.value_or(kernel);
  return {{"kernel", std::vector<int64_t>{kernel.h, kernel.w}},
          {"strides", std::vector<int64_t>{stride.h, stride.w}},
          {"pads", pads(o.padding)},
          {"dilations", std::vector<int64_t>{o.dilation.h, o.dilation.w}},
          {"ceil_mode", int64_t{o.ceilMode}}};
}

AttrMap avgPoolAttrs(Size2 kernel, const AvgPool2dOptions& o) {
  const Size2 stride = o.stride.value_or(kernel);
  return {{"kernel", std::vector<int64_t>{kernel.h, kernel.w}},
          {"strides", std::vector<int64_t>{stride.h, stride.w}},
          {"pads", pads(o.padding)},
          {"ceil_mode", int64_t{o.ceilMode}},
          {"count_include_pad", int64_t{o.countIncludePad}}};
}

// An op and its attributes, chosen from the input's shape by a function that a module and
// its functional form share (so the module can name the node after itself).
struct OpSpec {
  OpKind kind;
  AttrMap attrs;
};

// torch.flatten(x, startDim, endDim). The flatten op is ONNX's (always 2-D); it equals
// torch.flatten for start_dim 1 through the last dim, and a reshape does the rest.
Expected<OpSpec> flattenSpec(const Shape& shape, int64_t startDim, int64_t endDim) {
  const auto r = static_cast<int64_t>(shape.size());
  if (r == 0) return OpSpec{OpKind::kReshape, {{"shape", std::vector<int64_t>{1}}}};
  const int64_t start = startDim < 0 ? startDim + r : startDim;
  const int64_t end = endDim < 0 ? endDim + r : endDim;
  if (start < 0 || end >= r || start > end)
    return invalidArgument("flatten(start_dim=" + std::to_string(startDim) +
                           ", end_dim=" + std::to_string(endDim) + ") is out of range for " +
                           ir::shapeToString(shape));
  if (start == 1 && end == r - 1) return OpSpec{OpKind::kFlatten, {{"axis", int64_t{1}}}};
  Shape out(shape.begin(), shape.begin() + start);
  int64_t merged = 1;
  for (int64_t i = start; i <= end; ++i) merged *= shape[i];
  out.push_back(merged);
  out.insert(out.end(), shape.begin() + end + 1, shape.end());
  return OpSpec{OpKind::kReshape, {{"shape", std::move(out)}}};
}

// nn.AdaptiveAvgPool2d: 1x1 is global_avg_pool; sizes that divide the input evenly are an
// avg_pool2d with equal windows. Other sizes need unequal windows, which no kiln op has.
Expected<OpSpec> adaptiveAvgPoolSpec(const ir::TensorType& x, Size2 out) {
  if (x.rank() != 4)
    return invalidArgument("adaptive_avg_pool2d expects [N,C,H,W], got " + x.toString());
  if (out.h == 1 && out.w == 1) return OpSpec{OpKind::kGlobalAvgPool, {}};
  const int64_t h = x.shape[2], w = x.shape[3];
  if (out.h < 1 || out.w < 1 || h % out.h != 0 || w % out.w != 0)
    return unimplemented("adaptive_avg_pool2d to " + str(out) +
                         " needs an output size that divides the input " + x.toString() +
                         " (windows of unequal size)");
  const Size2 k(h / out.h, w / out.w);
  return OpSpec{OpKind::kAvgPool2d, avgPoolAttrs(k, {.stride = k})};
}

// Applies a spec through `emit` (a module) or the builder's default naming (a function),
// or records the spec's error against the running module.
template <class Emit>
Tensor applySpec(const Tensor& x, Expected<OpSpec> spec, Emit emit) {
  if (!x.valid()) return x;
  if (!spec) {
    x.builder()->failInModule(spec.status());
    return {x.builder(), nullptr};
  }
  return emit(spec->kind, std::move(spec->attrs));
}

}  // namespace

// ---- Tensor

const Shape& Tensor::shape() const {
  return v_ ? v_->type().shape : emptyShape();
}

int64_t Tensor::size(int64_t d) const {
  const int64_t r = dim();
  if (d < 0) d += r;
  return d >= 0 && d < r ? shape()[d] : 0;
}

Tensor Tensor::reshape(Shape s) const {
  return apply(OpKind::kReshape, {*this}, {{"shape", std::move(s)}});
}

Tensor Tensor::permute(std::vector<int64_t> dims) const {
  for (int64_t& d : dims)
    if (d < 0) d += dim();
  return apply(OpKind::kTranspose, {*this}, {{"perm", std::move(dims)}});
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  const int64_t r = dim();
  if (dim0 < 0) dim0 += r;
  if (dim1 < 0) dim1 += r;
  if (valid() && (dim0 < 0 || dim0 >= r || dim1 < 0 || dim1 >= r)) {
    b_->failInModule(invalidArgument("transpose(" + std::to_string(dim0) + ", " +
                                     std::to_string(dim1) + ") is out of range for " +
                                     v_->type().toString()));
    return {b_, nullptr};
  }
  std::vector<int64_t> perm(r);
  for (int64_t i = 0; i < r; ++i) perm[i] = i;
  if (r > 0) std::swap(perm[dim0], perm[dim1]);
  return apply(OpKind::kTranspose, {*this}, {{"perm", std::move(perm)}});
}

Tensor Tensor::flatten(int64_t startDim, int64_t endDim) const {
  return applySpec(*this, flattenSpec(shape(), startDim, endDim),
                   [&](OpKind k, AttrMap attrs) { return apply(k, {*this}, std::move(attrs)); });
}

// ---- Scope and Builder

std::string Scope::qualify(std::string_view leaf) const {
  return path_.empty() ? std::string(leaf) : path_ + "." + std::string(leaf);
}

Builder::Builder(std::string graphName, uint64_t seed)
    : graph_(std::move(graphName)), seed_(seed) {}

void Builder::fail(Status error) {
  if (status_.isOk() && !error.isOk()) status_ = std::move(error);
}

void Builder::failInModule(const Status& error) {
  const std::string where = currentModule();
  fail(where.empty() ? error : error.withContext(where));
}

std::string Builder::currentModule() const {
  if (stack_.empty()) return "";
  const Frame& f = stack_.back();
  return f.path.empty() ? std::string(f.type) : f.path + " (" + std::string(f.type) + ")";
}

Builder::ModuleGuard::ModuleGuard(Builder& b, std::string path, std::string_view type) : b_(b) {
  b_.stack_.push_back({std::move(path), type});
}

Builder::ModuleGuard::~ModuleGuard() {
  b_.stack_.pop_back();
}

std::string Builder::uniqueName(const std::string& base) {
  // "output" is kept for finish(), so a module named "output" (BERT has one) that is not the
  // last op cannot take it.
  if (base != kOutputName && !graph_.findValue(base)) return base;
  int64_t& n = nameCounters_[base];
  for (;;) {
    std::string candidate = base + "_" + std::to_string(++n);
    if (!graph_.findValue(candidate)) return candidate;
  }
}

Tensor Builder::input(const std::string& name, Shape shape, ir::DType dtype) {
  if (!ok() || finished_) return invalid();
  auto v = graph_.addInput(name, {dtype, std::move(shape), ir::Layout::kPlain});
  if (!v) {
    fail(v.status().withContext("graph input"));
    return invalid();
  }
  return {this, *v};
}

Tensor Builder::parameter(const std::string& name, Shape shape, const Init& init, bool trainable) {
  if (!ok() || finished_) return invalid();
  ir::TensorData data(ir::DType::kF32, std::move(shape));
  init.fill({data.as<float>(), static_cast<size_t>(data.numElements())}, seed_, name);
  auto v = graph_.addParameter(name, std::move(data), trainable);
  if (!v) {
    fail(v.status().withContext("parameter '" + name + "'"));
    return invalid();
  }
  return {this, *v};
}

Tensor Builder::constant(std::string_view leaf, double value) {
  const std::string path = currentPath();
  const std::string base =
      std::string(kConstantPrefix) + (path.empty() ? "" : path + ".") + std::string(leaf);
  return parameter(uniqueName(base), {}, Init::constant(value), /*trainable=*/false);
}

Tensor Builder::op(OpKind kind, const std::vector<Tensor>& inputs, AttrMap attrs,
                   const std::string& outputName) {
  if (!ok() || finished_) return invalid();
  std::vector<ir::Value*> values;
  values.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    if (!t.valid() || t.builder() != this) {
      failInModule(invalidArgument(std::string(ir::opName(kind)) +
                                   " got a tensor that does not belong to graph '" + graph_.name() +
                                   "'"));
      return invalid();
    }
    values.push_back(t.value());
  }
  std::string base = outputName;
  if (base.empty()) {
    const std::string path = currentPath();
    base = (path.empty() ? "" : path + ".") + std::string(ir::opName(kind));
  }
  const std::string name = uniqueName(base);
  auto node = graph_.addNode(kind, std::move(values), std::move(attrs), {name});
  if (!node) {
    failInModule(node.status());
    return invalid();
  }
  (*node)->setName(name);
  return {this, (*node)->output()};
}

Expected<ir::Graph> Builder::finish(Tensor output) {
  if (finished_) return internalError("Builder::finish called twice");
  if (!ok()) return status_;
  if (!output.valid() || output.builder() != this)
    return invalidArgument("the model output is not a tensor of graph '" + graph_.name() + "'");
  finished_ = true;
  ir::Value* out = output.value();
  if (out->name() != kOutputName) {
    // Value names are fixed when a node is added, so the last node is emitted again with
    // its output named "output" (it has no users yet, so nothing else changes).
    ir::Node* last = graph_.numNodes() ? graph_.nodes().back() : nullptr;
    if (!last || out->producer() != last || !out->users().empty())
      return invalidArgument("the model output '" + out->name() +
                             "' must be the result of the last op added to graph '" +
                             graph_.name() + "'");
    if (graph_.findValue(std::string(kOutputName)))
      return invalidArgument("graph '" + graph_.name() +
                             "' already has a value named 'output' that is not its output");
    const OpKind kind = last->op();
    std::vector<ir::Value*> inputs = last->inputs();
    AttrMap attrs = last->attrs();
    std::string nodeName = last->name();
    graph_.removeNodesIf([last](const ir::Node& n) { return &n == last; });
    auto node =
        graph_.addNode(kind, std::move(inputs), std::move(attrs), {std::string(kOutputName)});
    if (!node) return node.status();
    (*node)->setName(std::move(nodeName));
    out = (*node)->output();
  }
  graph_.setOutputs({out});
  KILN_TRY(ir::verify(graph_).withContext("graph '" + graph_.name() + "'"));
  return std::move(graph_);
}

// ---- Functions

Tensor relu(Tensor x) {
  return apply(OpKind::kRelu, {x});
}
Tensor leakyRelu(Tensor x, double negativeSlope) {
  return apply(OpKind::kLeakyRelu, {x}, {{"alpha", negativeSlope}});
}
Tensor gelu(Tensor x, std::string approximate) {
  return apply(OpKind::kGelu, {x}, {{"approximate", std::move(approximate)}});
}
Tensor sigmoid(Tensor x) {
  return apply(OpKind::kSigmoid, {x});
}
Tensor tanh(Tensor x) {
  return apply(OpKind::kTanh, {x});
}
Tensor silu(Tensor x) {
  return apply(OpKind::kSilu, {x});
}
Tensor exp(Tensor x) {
  return apply(OpKind::kExp, {x});
}
Tensor log(Tensor x) {
  return apply(OpKind::kLog, {x});
}
Tensor sqrt(Tensor x) {
  return apply(OpKind::kSqrt, {x});
}
Tensor softmax(Tensor x, int64_t dim) {
  return apply(OpKind::kSoftmax, {x}, {{"axis", dim}});
}
Tensor logSoftmax(Tensor x, int64_t dim) {
  return apply(OpKind::kLogSoftmax, {x}, {{"axis", dim}});
}
Tensor dropout(Tensor x, double p) {
  return apply(OpKind::kDropout, {x}, {{"ratio", p}});
}
Tensor matmul(Tensor a, Tensor b) {
  return apply(OpKind::kMatMul, {a, b});
}
Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  return apply(OpKind::kConcat, xs, {{"axis", dim}});
}
Tensor operator+(Tensor a, Tensor b) {
  return apply(OpKind::kAdd, {a, b});
}
Tensor operator-(Tensor a, Tensor b) {
  return apply(OpKind::kSub, {a, b});
}
Tensor operator*(Tensor a, Tensor b) {
  return apply(OpKind::kMul, {a, b});
}
Tensor operator/(Tensor a, Tensor b) {
  return apply(OpKind::kDiv, {a, b});
}
Tensor operator*(Tensor a, double s) {
  Builder* b = builderOf({&a});
  return b ? a * b->constant("scalar", s) : Tensor();
}
Tensor operator/(Tensor a, double s) {
  Builder* b = builderOf({&a});
  return b ? a / b->constant("scalar", s) : Tensor();
}

Tensor maxPool2d(Tensor x, Size2 kernelSize, const MaxPool2dOptions& o) {
  return apply(OpKind::kMaxPool2d, {x}, maxPoolAttrs(kernelSize, o));
}

Tensor avgPool2d(Tensor x, Size2 kernelSize, const AvgPool2dOptions& o) {
  return apply(OpKind::kAvgPool2d, {x}, avgPoolAttrs(kernelSize, o));
}

Tensor adaptiveAvgPool2d(Tensor x, Size2 outputSize) {
  if (!x.valid()) return x;
  return applySpec(x, adaptiveAvgPoolSpec(x.value()->type(), outputSize),
                   [&](OpKind k, AttrMap attrs) { return apply(k, {x}, std::move(attrs)); });
}

Tensor scaledDotProductAttention(Tensor q, Tensor k, Tensor v, int64_t numHeads, double dropoutP) {
  Builder* b = builderOf({&q, &k, &v});
  if (!b || !q.valid() || !k.valid() || !v.valid()) return {b, nullptr};
  const int64_t n = q.size(0), lq = q.size(1), e = q.size(2), lk = k.size(1);
  if (q.dim() != 3 || k.dim() != 3 || v.dim() != 3 || numHeads < 1 || e % numHeads != 0 ||
      k.shape() != v.shape() || k.size(0) != n || k.size(2) != e) {
    b->failInModule(invalidArgument(
        "attention expects q [N,Lq,E], k and v [N,Lk,E] with E divisible by " +
        std::to_string(numHeads) + " heads, got q " + q.value()->type().toString() + ", k " +
        k.value()->type().toString() + ", v " + v.value()->type().toString()));
    return {b, nullptr};
  }
  const int64_t d = e / numHeads;
  // [N,L,E] -> [N,H,L,d]; keys go straight to [N,H,d,L] for q k^T.
  Tensor qh = q.reshape({n, lq, numHeads, d}).permute({0, 2, 1, 3});
  Tensor kt = k.reshape({n, lk, numHeads, d}).permute({0, 2, 3, 1});
  Tensor vh = v.reshape({n, lk, numHeads, d}).permute({0, 2, 1, 3});
  Tensor scale = b->constant("scale", 1.0 / std::sqrt(static_cast<double>(d)));
  Tensor scores = matmul(qh, kt) * scale;
  Tensor probs = softmax(scores, -1);
  if (dropoutP > 0) probs = dropout(probs, dropoutP);
  return matmul(probs, vh).permute({0, 2, 1, 3}).reshape({n, lq, e});
}

// ---- Module

Tensor Module::addParameter(std::string_view leaf, Shape shape, const Init& init,
                            bool trainable) const {
  const std::string full = scope_.qualify(leaf);
  if (builder().ok() && builder().graph().findValue(full)) {
    fail("parameter '" + full + "' already exists; give each module a unique name");
    return {&builder(), nullptr};
  }
  return builder().parameter(full, std::move(shape), init, trainable);
}

void Module::fail(const std::string& message) const {
  const std::string who =
      name().empty() ? std::string(type_) : name() + " (" + std::string(type_) + ")";
  builder().fail(invalidArgument(who + ": " + message));
}

Tensor Module::emit(OpKind kind, const std::vector<Tensor>& inputs, AttrMap attrs) const {
  return builder().op(kind, inputs, std::move(attrs), name());
}

// ---- Linear

Linear::Linear(Scope s, int64_t in, int64_t out, bool hasBias)
    : Module(std::move(s), "Linear"), inFeatures(in), outFeatures(out) {
  if (in < 1 || out < 1) {
    fail("in_features and out_features must be positive, got " + std::to_string(in) + " and " +
         std::to_string(out));
    return;
  }
  weight = addParameter("weight", {out, in}, Init::kaimingUniform(in));
  if (hasBias) bias = addParameter("bias", {out}, Init::kaimingUniform(in));
}

Tensor Linear::operator()(Tensor x) const {
  auto scope = enter();
  if (!x.valid()) return x;
  if (x.dim() < 1 || x.size(-1) != inFeatures) {
    fail("expected input [..., " + std::to_string(inFeatures) + "], got " +
         x.value()->type().toString());
    return {&builder(), nullptr};
  }
  if (bias.valid()) return emit(OpKind::kLinear, {x, weight, bias});
  return emit(OpKind::kLinear, {x, weight});
}

// ---- Conv2d

Conv2d::Conv2d(Scope s, int64_t in, int64_t out, Size2 kernel, Conv2dOptions o)
    : Module(std::move(s), "Conv2d"),
      inChannels(in),
      outChannels(out),
      kernelSize(kernel),
      options(o) {
  if (in < 1 || out < 1 || kernel.h < 1 || kernel.w < 1) {
    fail("channels and kernel_size must be positive, got in_channels " + std::to_string(in) +
         ", out_channels " + std::to_string(out) + ", kernel_size " + str(kernel));
    return;
  }
  if (o.groups < 1 || in % o.groups != 0 || out % o.groups != 0) {
    fail("groups " + std::to_string(o.groups) + " must divide in_channels " + std::to_string(in) +
         " and out_channels " + std::to_string(out));
    return;
  }
  if (o.stride.h < 1 || o.stride.w < 1 || o.dilation.h < 1 || o.dilation.w < 1 || o.padding.h < 0 ||
      o.padding.w < 0) {
    fail("stride " + str(o.stride) + " and dilation " + str(o.dilation) +
         " must be positive and padding " + str(o.padding) + " non-negative");
    return;
  }
  const int64_t fanIn = in / o.groups * kernel.h * kernel.w;
  weight =
      addParameter("weight", {out, in / o.groups, kernel.h, kernel.w}, Init::kaimingUniform(fanIn));
  if (o.bias) bias = addParameter("bias", {out}, Init::kaimingUniform(fanIn));
}

Tensor Conv2d::operator()(Tensor x) const {
  auto scope = enter();
  if (!x.valid()) return x;
  if (x.dim() != 4 || x.size(1) != inChannels) {
    fail("expected input [N, " + std::to_string(inChannels) + ", H, W], got " +
         x.value()->type().toString());
    return {&builder(), nullptr};
  }
  AttrMap attrs = {{"strides", std::vector<int64_t>{options.stride.h, options.stride.w}},
                   {"pads", pads(options.padding)},
                   {"dilations", std::vector<int64_t>{options.dilation.h, options.dilation.w}},
                   {"group", options.groups}};
  if (bias.valid()) return emit(OpKind::kConv2d, {x, weight, bias}, std::move(attrs));
  return emit(OpKind::kConv2d, {x, weight}, std::move(attrs));
}

// ---- BatchNorm2d

BatchNorm2d::BatchNorm2d(Scope s, int64_t n, double epsilon)
    : Module(std::move(s), "BatchNorm2d"), numFeatures(n), eps(epsilon) {
  if (n < 1) {
    fail("num_features must be positive, got " + std::to_string(n));
    return;
  }
  weight = addParameter("weight", {n}, Init::constant(1));
  bias = addParameter("bias", {n}, Init::constant(0));
  runningMean = addParameter("running_mean", {n}, Init::constant(0), /*trainable=*/false);
  runningVar = addParameter("running_var", {n}, Init::constant(1), /*trainable=*/false);
}

Tensor BatchNorm2d::operator()(Tensor x) const {
  auto scope = enter();
  if (!x.valid()) return x;
  if (x.dim() != 4 || x.size(1) != numFeatures) {
    fail("expected input [N, " + std::to_string(numFeatures) + ", H, W], got " +
         x.value()->type().toString());
    return {&builder(), nullptr};
  }
  return emit(OpKind::kBatchNorm, {x, weight, bias, runningMean, runningVar}, {{"epsilon", eps}});
}

// ---- LayerNorm

LayerNorm::LayerNorm(Scope s, std::vector<int64_t> shape, double epsilon, bool affine)
    : Module(std::move(s), "LayerNorm"), normalizedShape(std::move(shape)), eps(epsilon) {
  if (normalizedShape.empty() || std::any_of(normalizedShape.begin(), normalizedShape.end(),
                                             [](int64_t d) { return d < 1; })) {
    fail("normalized_shape " + ir::shapeToString(normalizedShape) +
         " must be non-empty with positive dims");
    return;
  }
  if (affine) {
    weight = addParameter("weight", normalizedShape, Init::constant(1));
    bias = addParameter("bias", normalizedShape, Init::constant(0));
  }
}

Tensor LayerNorm::operator()(Tensor x) const {
  auto scope = enter();
  if (!x.valid()) return x;
  const auto k = static_cast<int64_t>(normalizedShape.size());
  if (x.dim() < k ||
      !std::equal(normalizedShape.begin(), normalizedShape.end(), x.shape().end() - k)) {
    fail("expected input [..., " + ir::shapeToString(normalizedShape).substr(1) + ", got " +
         x.value()->type().toString());
    return {&builder(), nullptr};
  }
  AttrMap attrs = {{"axis", x.dim() - k}, {"epsilon", eps}};
  if (weight.valid()) return emit(OpKind::kLayerNorm, {x, weight, bias}, std::move(attrs));
  return emit(OpKind::kLayerNorm, {x}, std::move(attrs));
}

// ---- Parameterless modules

Dropout::Dropout(Scope s, double prob) : Module(std::move(s), "Dropout"), p(prob) {
  if (!(p >= 0 && p <= 1)) fail("p must be in [0, 1], got " + std::to_string(p));
}

Tensor Dropout::operator()(Tensor x) const {
  auto scope = enter();
  return emit(OpKind::kDropout, {x}, {{"ratio", p}});
}

Tensor Activation::operator()(Tensor x) const {
  auto scope = enter();
  return emit(op_, {x}, attrs_);
}

MaxPool2d::MaxPool2d(Scope s, Size2 kernel, MaxPool2dOptions o)
    : Module(std::move(s), "MaxPool2d"), kernelSize(kernel), options(o) {}

Tensor MaxPool2d::operator()(Tensor x) const {
  auto scope = enter();
  return emit(OpKind::kMaxPool2d, {x}, maxPoolAttrs(kernelSize, options));
}

AvgPool2d::AvgPool2d(Scope s, Size2 kernel, AvgPool2dOptions o)
    : Module(std::move(s), "AvgPool2d"), kernelSize(kernel), options(o) {}

Tensor AvgPool2d::operator()(Tensor x) const {
  auto scope = enter();
  return emit(OpKind::kAvgPool2d, {x}, avgPoolAttrs(kernelSize, options));
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Scope s, Size2 size)
    : Module(std::move(s), "AdaptiveAvgPool2d"), outputSize(size) {}

Tensor AdaptiveAvgPool2d::operator()(Tensor x) const {
  auto scope = enter();
  if (!x.valid()) return x;
  return applySpec(x, adaptiveAvgPoolSpec(x.value()->type(), outputSize),
                   [&](OpKind k, AttrMap attrs) { return emit(k, {x}, std::move(attrs)); });
}

Flatten::Flatten(Scope s, int64_t start, int64_t end)
    : Module(std::move(s), "Flatten"), startDim(start), endDim(end) {}

Tensor Flatten::operator()(Tensor x) const {
  auto scope = enter();
  return applySpec(x, flattenSpec(x.shape(), startDim, endDim),
                   [&](OpKind k, AttrMap attrs) { return emit(k, {x}, std::move(attrs)); });
}

Tensor Sequential::operator()(Tensor x) const {
  auto scope = enter();
  for (const auto& layer : layers_) x = layer(x);
  return x;
}

// ---- MultiheadAttention

MultiheadAttention::MultiheadAttention(Scope s, int64_t e, int64_t heads, double p, bool bias)
    : Module(std::move(s), "MultiheadAttention"),
      embedDim(e),
      numHeads(heads),
      dropout(p),
      qProj(child("q_proj"), e, e, bias),
      kProj(child("k_proj"), e, e, bias),
      vProj(child("v_proj"), e, e, bias),
      outProj(child("out_proj"), e, e, bias) {
  if (heads < 1 || e % heads != 0)
    fail("embed_dim " + std::to_string(e) + " must be divisible by num_heads " +
         std::to_string(heads));
}

Tensor MultiheadAttention::operator()(Tensor query, Tensor key, Tensor value) const {
  auto scope = enter();
  // One statement per projection: argument evaluation order is unspecified in C++, and the
  // node order must not depend on the compiler.
  Tensor q = qProj(query);
  Tensor k = kProj(key);
  Tensor v = vProj(value);
  return outProj(scaledDotProductAttention(q, k, v, numHeads, dropout));
}

// ---- Residual blocks

namespace {

Conv2dOptions conv3x3(int64_t stride, int64_t groups = 1) {
  return {.stride = stride, .padding = 1, .groups = groups, .bias = false};
}

Conv2dOptions conv1x1(int64_t stride = 1) {
  return {.stride = stride, .bias = false};
}

std::optional<Sequential> makeDownsample(Scope s, int64_t inplanes, int64_t outplanes,
                                         int64_t stride) {
  if (stride == 1 && inplanes == outplanes) return std::nullopt;
  Sequential seq(std::move(s));
  seq.add<Conv2d>(inplanes, outplanes, 1, conv1x1(stride));
  seq.add<BatchNorm2d>(outplanes);
  return seq;
}

}  // namespace

BasicBlock::BasicBlock(Scope s, int64_t inplanes, int64_t planes, int64_t stride)
    : Module(std::move(s), "BasicBlock"),
      conv1(child("conv1"), inplanes, planes, 3, conv3x3(stride)),
      bn1(child("bn1"), planes),
      conv2(child("conv2"), planes, planes, 3, conv3x3(1)),
      bn2(child("bn2"), planes),
      downsample(makeDownsample(child("downsample"), inplanes, planes * kExpansion, stride)) {}

Tensor BasicBlock::operator()(Tensor x) const {
  auto scope = enter();
  Tensor identity = x;
  Tensor out = relu(bn1(conv1(x)));
  out = bn2(conv2(out));
  if (downsample) identity = (*downsample)(x);
  return relu(out + identity);
}

Bottleneck::Bottleneck(Scope s, int64_t inplanes, int64_t planes, int64_t stride, int64_t groups,
                       int64_t baseWidth)
    : Module(std::move(s), "Bottleneck"),
      conv1(child("conv1"), inplanes, planes * baseWidth / 64 * groups, 1, conv1x1()),
      bn1(child("bn1"), planes * baseWidth / 64 * groups),
      conv2(child("conv2"), conv1.outChannels, conv1.outChannels, 3, conv3x3(stride, groups)),
      bn2(child("bn2"), conv1.outChannels),
      conv3(child("conv3"), conv1.outChannels, planes * kExpansion, 1, conv1x1()),
      bn3(child("bn3"), planes * kExpansion),
      downsample(makeDownsample(child("downsample"), inplanes, planes * kExpansion, stride)) {}

Tensor Bottleneck::operator()(Tensor x) const {
  auto scope = enter();
  Tensor identity = x;
  Tensor out = relu(bn1(conv1(x)));
  out = relu(bn2(conv2(out)));
  out = bn3(conv3(out));
  if (downsample) identity = (*downsample)(x);
  return relu(out + identity);
}

}  // namespace kiln::frontends::nn
