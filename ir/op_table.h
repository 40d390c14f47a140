// OpKind and the op table built from ops.def: names, arity, traits, attribute schemas and
// shape inference. Passes query traits here instead of listing op names.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "ir/attributes.h"
#include "ir/types.h"

namespace kiln::ir {

enum class OpKind : uint16_t {
#define KILN_OP(E, name, minIn, maxIn, nOut, traits, attrs, infer) E,
#include "ir/ops.def"
#undef KILN_OP
};

inline constexpr int kNumOps = 0
#define KILN_OP(E, name, minIn, maxIn, nOut, traits, attrs, infer) +1
#include "ir/ops.def"
#undef KILN_OP
    ;

enum OpTrait : uint32_t {
  kPointwise = 1u << 0,       // Each output element depends on the same-index input elements.
  kReduction = 1u << 1,       // Reduces over one or more dims (fusable with its neighbours).
  kLibrary = 1u << 2,         // Runs as a library call (oneDNN, BLAS, cuDNN, cuBLAS).
  kMovement = 1u << 3,        // Rearranges data, no arithmetic.
  kDifferentiable = 1u << 5,  // Has a gradient builder (autodiff).
  // The output is the input's bytes under another shape: a view, never a copy (reshape,
  // flatten, squeeze, unsqueeze). Implies kMovement.
  kReshapeLike = 1u << 6,
  // A strided view of the input (transpose, expand, slice): generated kernels read it through
  // strides instead of copying it. Implies kMovement.
  kStridedView = 1u << 7,
  // A library op that applies epilogues (post-ops) to its f32 output before storing it.
  kEpilogueHead = 1u << 8,
  // A pointwise op an epilogue can apply after a kEpilogueHead op of its dtype (computing in
  // f32; an add needs a same-shape operand): the compile driver maps each to a runtime::PostOp.
  kEpilogue = 1u << 9,
  // A 4-D NCHW library op whose library kernel also reads and writes channels-last (NHWC)
  // activations: layout selection may keep them NHWC. Its activations are its rank-4 operands
  // but for convolution filters (kFilterInput1, kFilterGradient): isChannelsLastActivation.
  kChannelsLast = 1u << 10,
  // Elementwise over input 0 [N,C,...] with per-channel [C] operands broadcast along dim 1
  // (batch_norm): fuses as a pointwise op; its other inputs are read as [C,1,...].
  kChannelwise = 1u << 11,
  // A kReduction whose output has its input's shape: it reduces each row and applies the
  // result back to every element of the row (softmax, layer_norm). Other reductions output the
  // reduced row.
  kRowBroadcast = 1u << 12,
  // A product (matmul, convolution and their gradients) that autocast (--precision bf16|fp16)
  // runs in the low-precision type: its float inputs are cast to it, the library accumulates in
  // f32 and rounds the result once, and the result is cast back to f32 for the ops after it.
  kAutocast = 1u << 13,
  // Under autocast, an op that runs in bf16/f16 when its float inputs are all that type (result
  // rounded once, as PyTorch's autocast runs every op off its fp32 list in its inputs' type):
  // movement, activations, arithmetic and pooling. Ops without it (exp, log, pow, reductions,
  // normalization, losses) read low-precision inputs widened and compute in f32.
  kLowPrecision = 1u << 14,
  // A convolution op whose input 1 is its filter [M, C/group, kh, kw] (conv2d,
  // conv2d_backward_data).
  kFilterInput1 = 1u << 15,
  // A convolution's filter gradient: its output and input 2 (the filter it is shaped like) are
  // filters (conv2d_backward_weight).
  kFilterGradient = 1u << 16,
};

class AttrView;
using InferFn = Expected<std::vector<TensorType>> (*)(std::span<const TensorType> inputs,
                                                      const AttrView& attrs);

struct OpInfo {
  OpKind kind;
  std::string_view name;
  int minInputs;
  int maxInputs;  // -1: variadic.
  int numOutputs;
  uint32_t traits;
  std::vector<AttrSpec> attrs;
  InferFn infer;

  bool has(OpTrait t) const { return (traits & t) != 0; }
  const AttrSpec* findAttr(std::string_view attrName) const;
};

const OpInfo& opInfo(OpKind k);
std::string_view opName(OpKind k);
const OpInfo* findOp(std::string_view name);  // nullptr when unknown.
// Case-insensitive edit distance between two names, for "did you mean" hints on op names.
size_t nameDistance(std::string_view a, std::string_view b);
inline bool hasTrait(OpKind k, OpTrait t) {
  return opInfo(k).has(t);
}

// Whether input `input` (the output when `input` < 0) of rank `rank` of a kChannelsLast op is an
// activation that layout selection may keep channels-last: rank 4 and not a filter.
bool isChannelsLastActivation(const OpInfo& op, int input, size_t rank);

// Reads attributes with the op's schema defaults applied. Callers read attributes that the
// verifier has checked, so a missing or mistyped attribute here is a kiln bug.
class AttrView {
 public:
  AttrView(const OpInfo& op, const AttrMap& attrs) : op_(op), attrs_(attrs) {}

  int64_t getInt(std::string_view name) const;
  double getFloat(std::string_view name) const;
  const std::string& getString(std::string_view name) const;
  const std::vector<int64_t>& getInts(std::string_view name) const;
  const std::vector<double>& getFloats(std::string_view name) const;
  const TensorData& getTensor(std::string_view name) const;
  const OpInfo& op() const { return op_; }
  const AttrMap& raw() const { return attrs_; }

 private:
  const AttrValue& lookup(std::string_view name) const;
  const OpInfo& op_;
  const AttrMap& attrs_;
};

// Checks attribute names and kinds against the op's schema and that required ones are set.
Status checkAttributes(const OpInfo& op, const AttrMap& attrs);

// Runs the op's shape/dtype inference after checking arity and attributes. Errors name the op.
Expected<std::vector<TensorType>> inferTypes(OpKind op, std::span<const TensorType> inputs,
                                             const AttrMap& attrs);

}  // namespace kiln::ir
