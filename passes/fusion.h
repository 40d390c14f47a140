// Fusion planning: partitions a graph's nodes into groups that each become one kernel.
// Chains and DAGs of pointwise ops (with broadcasting, casts, where) fuse with each other and
// with one reduction-like op (softmax, log_softmax, layer_norm, reduce_*, global_avg_pool) as
// its prologue and epilogue; strided views (transpose, expand, slice, squeeze, unsqueeze, and
// reshape of contiguous data) fuse as the loads of a group. Every join is one FusionDecision
// made by one function (the planner's decide()): legality (correctness) before profit
// (performance), each refusal kept with its reason for `kiln compile --explain-fusion`.
#pragma once

#include <functional>
#include <span>

#include <string>
#include <unordered_map>
#include <vector>

#include "ir/fusion_group.h"
#include "ir/graph.h"

namespace kiln::passes {

// The group type is ir's (ir/fusion_group.h), so that codegen does not depend on passes/.
using ir::FusionGroup;
using ir::GroupKind;
using ir::groupKindName;

// One fusion decision: fuse, or not and why (XLA's FusionDecision, Inductor's WhyNoFuse).
// The planner makes every decision in one function (legality first: correctness; then profit)
// and acts on it; `kiln compile --explain-fusion` prints the reasons of the refusals.
struct FusionDecision {
  enum class Verdict : uint8_t { kFuse, kIllegal, kUnprofitable };
  Verdict verdict = Verdict::kFuse;
  std::string reason;  // Empty when it fuses.

  static FusionDecision fuse() { return {}; }
  static FusionDecision illegal(std::string why) { return {Verdict::kIllegal, std::move(why)}; }
  static FusionDecision unprofitable(std::string why) {
    return {Verdict::kUnprofitable, std::move(why)};
  }
  explicit operator bool() const { return verdict == Verdict::kFuse; }
  // The reason as --explain-fusion prints it ("not profitable: ..." for unprofitable ones).
  std::string explain() const {
    return verdict == Verdict::kUnprofitable ? "not profitable: " + reason : reason;
  }
};

struct FusionRejection {
  const ir::Node* producer;  // Null: the consumer can never be part of a generated kernel.
  const ir::Node* consumer;
  FusionDecision decision;
  std::string reason;  // decision.explain().
};

struct FusionOptions {
  int maxNodesPerGroup = 64;
  int maxInputsPerGroup = 16;
  // Consecutive independent pointwise kernels run as one horizontal kernel (the scheduler's
  // rule: compiler/schedule.cpp; codegen::Kernel::parts) where the backend takes them.
  bool horizontal = true;
  // The backend runs f32 conv2d/linear/gemm/matmul with epilogues (activations and a
  // same-shape add), so those consumers fuse into the library call as post-ops.
  bool libraryEpilogues = false;
  // Whether the backend's library call of `head` takes these post-op nodes (in order) fused;
  // unset: every chain of post-op candidates (the CPU's oneDNN and kiln's epilogue pass).
  std::function<bool(const ir::Node& head, std::span<const ir::Node* const> post)> acceptsEpilogue;
};

// The pointwise ops a library call can apply as a post-op (the add needs a same-shape
// operand, checked by the planner).
bool isPostOpCandidate(const ir::Node& n);
// The library ops that take post-ops (in f32): the heads of epilogue groups.
bool acceptsLibraryEpilogue(ir::OpKind head);

struct FusionPlan {
  std::vector<FusionGroup> groups;  // Topological order of groups.
  std::vector<FusionRejection> rejections;
  std::unordered_map<const ir::Node*, int> groupOf;

  int numKernels(GroupKind k) const;
};

// Why a node can never be part of a generated kernel ("" when it can): dtypes the kernels do
// not support (f16, bf16) or ops that have no scalar form.
std::string notFusableReason(const ir::Node& n);
// True for ops that are a strided view of their input (transpose, expand, slice, squeeze,
// unsqueeze, reshape, flatten); reshape and flatten only when their input is contiguous.
using ir::isViewOp;
// True for the reduction-like ops a kernel can anchor on, with the reduced dims contiguous.
bool isFusableReduction(const ir::Node& n);
// True for elementwise-like ops: the Pointwise trait, plus inference batch_norm.
bool isElementwise(const ir::Node& n);
using ir::reducedRange;

FusionPlan planFusion(const ir::Graph& g, const FusionOptions& options = {});

// Human-readable report: each group with its nodes, then each rejected pair with its reason.
std::string explainFusion(const FusionPlan& plan);

}  // namespace kiln::passes
