// The C++ builder API: nn-style modules (Linear, Conv2d, BatchNorm2d, ..., residual blocks)
// that build a kiln ir::Graph with PyTorch state_dict parameter names and PyTorch's default
// initialization, drawn deterministically from a seed.
//
// A model reads like its PyTorch module. Modules take a Scope (their place in the module tree)
// and create their parameters when constructed, as in `__init__`; calling a module emits its
// ops, as in `forward`:
//
//   struct Net : nn::Module {
//     nn::Conv2d conv1;
//     nn::Linear fc;
//     explicit Net(nn::Scope s)
//         : Module(s, "Net"), conv1(child("conv1"), 1, 32, 3), fc(child("fc"), 21632, 10) {}
//     nn::Tensor operator()(nn::Tensor x) const {
//       auto scope = enter();
//       return fc(nn::relu(conv1(x)).flatten(1));
//     }
//   };
//   nn::Builder b("net", /*seed=*/0);
//   Net net(b.root());
//   Expected<ir::Graph> g = b.finish(net(b.input("input", {1, 1, 28, 28})));
//
// Errors are sticky (as in XLA's XlaBuilder): the first failure (a shape that does not fit, a
// bad module option) is recorded with the module's name and type, later calls return invalid
// tensors, and finish() returns that first error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "frontends/builder/rng.h"
#include "ir/graph.h"

namespace kiln::frontends::nn {

class Builder;

// Constants the builder creates (e.g. attention's 1/sqrt(head_dim)) are non-trainable
// parameters whose names start with this prefix, which no PyTorch state_dict key contains.
inline constexpr std::string_view kConstantPrefix = "const:";

// A handle to one value of the graph under construction. An invalid tensor (after an error)
// flows through every op and module without further effect.
class Tensor {
 public:
  Tensor() = default;
  Tensor(Builder* b, ir::Value* v) : b_(b), v_(v) {}

  bool valid() const { return v_ != nullptr; }
  ir::Value* value() const { return v_; }
  Builder* builder() const { return b_; }
  // The shape; empty for an invalid tensor.
  const ir::Shape& shape() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  // torch.Tensor.size(d); negative d counts from the end. 0 when invalid or out of range.
  int64_t size(int64_t d) const;

  // torch.Tensor.reshape / permute / transpose / flatten.
  Tensor reshape(ir::Shape shape) const;
  Tensor permute(std::vector<int64_t> dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor flatten(int64_t startDim = 0, int64_t endDim = -1) const;

 private:
  Builder* b_ = nullptr;
  ir::Value* v_ = nullptr;
};

// A place in the module tree: the dotted path that prefixes parameter names ("layer1.0.conv1").
class Scope {
 public:
  Scope(Builder& b, std::string path) : b_(&b), path_(std::move(path)) {}
  Builder& builder() const { return *b_; }
  const std::string& path() const { return path_; }
  Scope child(std::string_view name) const { return {*b_, qualify(name)}; }
  // "layer1.0" + "weight" -> "layer1.0.weight"; at the root, just the leaf.
  std::string qualify(std::string_view leaf) const;

 private:
  Builder* b_;
  std::string path_;
};

// Builds one graph. Owns the graph until finish(); not copyable or movable because tensors
// point at it.
class Builder {
 public:
  explicit Builder(std::string graphName = "main", uint64_t seed = 0);
  Builder(const Builder&) = delete;
  Builder& operator=(const Builder&) = delete;

  Scope root() { return {*this, ""}; }
  uint64_t seed() const { return seed_; }
  const ir::Graph& graph() const { return graph_; }
  bool ok() const { return status_.isOk(); }
  const Status& status() const { return status_; }

  Tensor input(const std::string& name, ir::Shape shape, ir::DType dtype = ir::DType::kF32);
  // An f32 parameter named `name` (a full state_dict key) filled from the stream (seed, name).
  Tensor parameter(const std::string& name, ir::Shape shape, const Init& init, bool trainable);
  // A scalar f32 constant named kConstantPrefix + "<current module>.<leaf>".
  Tensor constant(std::string_view leaf, double value);

  // Appends one node. Its output is named `outputName` when given, else
  // "<current module>.<op name>"; either is made unique with a "_<n>" suffix. Shape errors are
  // recorded with the current module's name.
  Tensor op(ir::OpKind kind, const std::vector<Tensor>& inputs, ir::AttrMap attrs = {},
            const std::string& outputName = "");

  // Records `error` unless an earlier error is recorded (the first one is the cause).
  void fail(Status error);
  // Records `error` prefixed with the running module ("layer1.0 (BasicBlock): ...").
  void failInModule(const Status& error);

  // Marks `output` as the graph's only output, named "output", verifies the graph and hands
  // it over. Returns the first recorded error instead, if any. The builder is spent after.
  Expected<ir::Graph> finish(Tensor output);

  // The stack of modules whose forward is running: it names nodes and error messages.
  class ModuleGuard {
   public:
    ModuleGuard(Builder& b, std::string path, std::string_view type);
    ~ModuleGuard();
    ModuleGuard(const ModuleGuard&) = delete;
    ModuleGuard& operator=(const ModuleGuard&) = delete;

   private:
    Builder& b_;
  };
  // "layer1.0 (BasicBlock)", or "" outside any module.
  std::string currentModule() const;

 private:
  struct Frame {
    std::string path;
    std::string_view type;
  };
  Tensor invalid() { return {this, nullptr}; }
  std::string uniqueName(const std::string& base);
  std::string currentPath() const { return stack_.empty() ? "" : stack_.back().path; }

  ir::Graph graph_;
  uint64_t seed_;
  Status status_;
  bool finished_ = false;
  std::vector<Frame> stack_;
  std::unordered_map<std::string, int64_t> nameCounters_;
};

// A pair of spatial sizes (height, width), built from one int like PyTorch's `int or tuple`.
struct Size2 {
  Size2(int64_t v) : h(v), w(v) {}  // NOLINT(google-explicit-constructor): as in PyTorch.
  Size2(int64_t height, int64_t width) : h(height), w(width) {}
  int64_t h;
  int64_t w;
};

// ---- Functions (torch.nn.functional). They name their nodes after the running module.
Tensor relu(Tensor x);
Tensor leakyRelu(Tensor x, double negativeSlope = 0.01);
// approximate: "none" (erf form) or "tanh".
Tensor gelu(Tensor x, std::string approximate = "none");
Tensor sigmoid(Tensor x);
Tensor tanh(Tensor x);
Tensor silu(Tensor x);
Tensor exp(Tensor x);
Tensor log(Tensor x);
Tensor sqrt(Tensor x);
Tensor softmax(Tensor x, int64_t dim);
Tensor logSoftmax(Tensor x, int64_t dim);
// Inference identity; p is kept on the node for training.
Tensor dropout(Tensor x, double p = 0.5);
Tensor matmul(Tensor a, Tensor b);
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
Tensor operator+(Tensor a, Tensor b);
Tensor operator-(Tensor a, Tensor b);
Tensor operator*(Tensor a, Tensor b);
Tensor operator/(Tensor a, Tensor b);
Tensor operator*(Tensor a, double s);
Tensor operator/(Tensor a, double s);

struct MaxPool2dOptions {
  std::optional<Size2> stride;  // Defaults to the kernel size, as in PyTorch.
  Size2 padding = 0;
  Size2 dilation = 1;
  bool ceilMode = false;
};
Tensor maxPool2d(Tensor x, Size2 kernelSize, const MaxPool2dOptions& options = {});

struct AvgPool2dOptions {
  std::optional<Size2> stride;  // Defaults to the kernel size.
  Size2 padding = 0;
  bool ceilMode = false;
  bool countIncludePad = true;
};
Tensor avgPool2d(Tensor x, Size2 kernelSize, const AvgPool2dOptions& options = {});
// Output 1x1 is global_avg_pool; other sizes must divide the input evenly.
Tensor adaptiveAvgPool2d(Tensor x, Size2 outputSize);

// softmax(q k^T / sqrt(head_dim)) v over `numHeads` heads, as in PyTorch's
// MultiheadAttention and HuggingFace's BertSelfAttention. q [N,Lq,E], k and v [N,Lk,E]
// (already projected); returns [N,Lq,E]. dropoutP applies to the attention probabilities.
Tensor scaledDotProductAttention(Tensor q, Tensor k, Tensor v, int64_t numHeads,
                                 double dropoutP = 0.0);

// ---- Modules (torch.nn). Every module is constructed from a Scope plus PyTorch's arguments.
class Module {
 public:
  // The dotted path ("layer1.0.conv1"; "" for the root model) and type name ("Conv2d").
  const std::string& name() const { return scope_.path(); }
  std::string_view typeName() const { return type_; }
  Builder& builder() const { return scope_.builder(); }
  const Scope& scope() const { return scope_; }

 protected:
  Module(Scope scope, std::string_view typeName) : scope_(std::move(scope)), type_(typeName) {}
  Scope child(std::string_view name) const { return scope_.child(name); }
  // A parameter named "<path>.<leaf>".
  Tensor addParameter(std::string_view leaf, ir::Shape shape, const Init& init,
                      bool trainable = true) const;
  // Call first in forward: ops and errors inside are then attributed to this module.
  [[nodiscard]] Builder::ModuleGuard enter() const {
    return Builder::ModuleGuard(builder(), name(), type_);
  }
  // Records an error naming this module: "layer1.0.conv1 (Conv2d): <message>".
  void fail(const std::string& message) const;
  // Emits the module's own op, its output named after the module (the root module, whose
  // name is empty, gets the default "<op name>").
  Tensor emit(ir::OpKind kind, const std::vector<Tensor>& inputs, ir::AttrMap attrs = {}) const;

 private:
  Scope scope_;
  std::string_view type_;
};

class Linear : public Module {
 public:
  Linear(Scope s, int64_t inFeatures, int64_t outFeatures, bool bias = true);
  Tensor operator()(Tensor x) const;

  int64_t inFeatures;
  int64_t outFeatures;
  Tensor weight;  // [out, in]
  Tensor bias;    // [out]; invalid without bias.
};

struct Conv2dOptions {
  Size2 stride = 1;
  Size2 padding = 0;
  Size2 dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

class Conv2d : public Module {
 public:
  Conv2d(Scope s, int64_t inChannels, int64_t outChannels, Size2 kernelSize,
         Conv2dOptions options = {});
  Tensor operator()(Tensor x) const;

  int64_t inChannels;
  int64_t outChannels;
  Size2 kernelSize;
  Conv2dOptions options;
  Tensor weight;  // [out, in/groups, kh, kw]
  Tensor bias;    // [out]; invalid without bias.
};

// Inference BatchNorm2d: weight and bias are trainable, running_mean and running_var are
// buffers (non-trainable parameters). PyTorch's num_batches_tracked counter is training
// bookkeeping that no op reads, so the graph leaves it out.
class BatchNorm2d : public Module {
 public:
  BatchNorm2d(Scope s, int64_t numFeatures, double eps = 1e-5);
  Tensor operator()(Tensor x) const;

  int64_t numFeatures;
  double eps;
  Tensor weight, bias, runningMean, runningVar;
};

class LayerNorm : public Module {
 public:
  LayerNorm(Scope s, std::vector<int64_t> normalizedShape, double eps = 1e-5,
            bool elementwiseAffine = true);
  Tensor operator()(Tensor x) const;

  std::vector<int64_t> normalizedShape;
  double eps;
  Tensor weight, bias;  // Invalid without elementwise affine.
};

class Dropout : public Module {
 public:
  explicit Dropout(Scope s, double p = 0.5);
  Tensor operator()(Tensor x) const;
  double p;
};

// Activation modules (nn.ReLU(), nn.GELU(), ...): one op each.
class Activation : public Module {
 public:
  Tensor operator()(Tensor x) const;

 protected:
  Activation(Scope s, std::string_view type, ir::OpKind op, ir::AttrMap attrs = {})
      : Module(std::move(s), type), op_(op), attrs_(std::move(attrs)) {}

 private:
  ir::OpKind op_;
  ir::AttrMap attrs_;
};
struct ReLU : Activation {
  explicit ReLU(Scope s) : Activation(std::move(s), "ReLU", ir::OpKind::kRelu) {}
};
struct GELU : Activation {
  explicit GELU(Scope s, std::string approximate = "none")
      : Activation(std::move(s), "GELU", ir::OpKind::kGelu, {{"approximate", approximate}}) {}
};
struct Sigmoid : Activation {
  explicit Sigmoid(Scope s) : Activation(std::move(s), "Sigmoid", ir::OpKind::kSigmoid) {}
};
struct Tanh : Activation {
  explicit Tanh(Scope s) : Activation(std::move(s), "Tanh", ir::OpKind::kTanh) {}
};
struct SiLU : Activation {
  explicit SiLU(Scope s) : Activation(std::move(s), "SiLU", ir::OpKind::kSilu) {}
};
struct Softmax : Activation {
  Softmax(Scope s, int64_t dim)
      : Activation(std::move(s), "Softmax", ir::OpKind::kSoftmax, {{"axis", dim}}) {}
};
struct LogSoftmax : Activation {
  LogSoftmax(Scope s, int64_t dim)
      : Activation(std::move(s), "LogSoftmax", ir::OpKind::kLogSoftmax, {{"axis", dim}}) {}
};

class MaxPool2d : public Module {
 public:
  MaxPool2d(Scope s, Size2 kernelSize, MaxPool2dOptions options = {});
  Tensor operator()(Tensor x) const;
  Size2 kernelSize;
  MaxPool2dOptions options;
};

class AvgPool2d : public Module {
 public:
  AvgPool2d(Scope s, Size2 kernelSize, AvgPool2dOptions options = {});
  Tensor operator()(Tensor x) const;
  Size2 kernelSize;
  AvgPool2dOptions options;
};

class AdaptiveAvgPool2d : public Module {
 public:
  AdaptiveAvgPool2d(Scope s, Size2 outputSize);
  Tensor operator()(Tensor x) const;
  Size2 outputSize;
};

class Flatten : public Module {
 public:
  explicit Flatten(Scope s, int64_t startDim = 1, int64_t endDim = -1);
  Tensor operator()(Tensor x) const;
  int64_t startDim;
  int64_t endDim;
};

// nn.Sequential: children are named "0", "1", ... in the order they are added.
class Sequential : public Module {
 public:
  explicit Sequential(Scope s) : Module(std::move(s), "Sequential") {}

  // Constructs M(child("<index>"), args...) and appends it.
  template <class M, class... Args>
  M& add(Args&&... args) {
    auto m =
        std::make_shared<M>(child(std::to_string(layers_.size())), std::forward<Args>(args)...);
    layers_.push_back([m](Tensor x) { return (*m)(x); });
    return *m;
  }
  Tensor operator()(Tensor x) const;
  size_t size() const { return layers_.size(); }

 private:
  std::vector<std::function<Tensor(Tensor)>> layers_;
};

// nn.MultiheadAttention (batch_first) with separate q_proj, k_proj, v_proj and out_proj
// Linear layers (the names HuggingFace's BART/Whisper/LLaMA use).
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(Scope s, int64_t embedDim, int64_t numHeads, double dropout = 0.0,
                     bool bias = true);
  // query [N,Lq,E], key and value [N,Lk,E] -> [N,Lq,E].
  Tensor operator()(Tensor query, Tensor key, Tensor value) const;
  Tensor operator()(Tensor x) const { return (*this)(x, x, x); }  // Self-attention.

  int64_t embedDim;
  int64_t numHeads;
  double dropout;
  Linear qProj, kProj, vProj, outProj;
};

// ---- torchvision's residual blocks (v1.5: the stride sits on the 3x3 conv). Each block
// creates its own downsample (conv1x1 + BatchNorm2d, named downsample.0 / downsample.1) when
// the stride or the channel count changes, exactly when torchvision's _make_layer does.
class BasicBlock : public Module {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(Scope s, int64_t inplanes, int64_t planes, int64_t stride = 1);
  Tensor operator()(Tensor x) const;

  Conv2d conv1;
  BatchNorm2d bn1;
  Conv2d conv2;
  BatchNorm2d bn2;
  std::optional<Sequential> downsample;
};

class Bottleneck : public Module {
 public:
  static constexpr int64_t kExpansion = 4;
  // groups and baseWidth give ResNeXt / wide ResNet widths, as in torchvision.
  Bottleneck(Scope s, int64_t inplanes, int64_t planes, int64_t stride = 1, int64_t groups = 1,
             int64_t baseWidth = 64);
  Tensor operator()(Tensor x) const;

  Conv2d conv1;
  BatchNorm2d bn1;
  Conv2d conv2;
  BatchNorm2d bn2;
  Conv2d conv3;
  BatchNorm2d bn3;
  std::optional<Sequential> downsample;
};

}  // namespace kiln::frontends::nn
