// The schedule of a compile: each fusion group becomes steps in order — a generated kernel
// (lowered to kernel IR), a library call with its post-ops, reference op calls, or nothing (a
// reshape that is a view of its input). What the target backend runs decides which: kernels
// only where it loads generated code, library calls only where its registry has the op.
#pragma once

#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "codegen/kernel_ir.h"
#include "ir/fusion_group.h"
#include "ir/graph.h"
#include "runtime/backend.h"
#include "runtime/plan.h"

namespace kiln::compiler {

// One step of the schedule before buffers are assigned.
struct StepDraft {
  StepDraft(runtime::PlanStep::Kind k, std::string n, const ir::Node* nd = nullptr)
      : kind(k), name(std::move(n)), node(nd) {}
  runtime::PlanStep::Kind kind;
  std::string name;
  std::vector<const ir::Value*> inputs;  // For a library call: its inputs, then `extra`.
  std::vector<const ir::Value*> outputs;
  int kernel = -1;  // Index into kernels.
  const ir::Node* node = nullptr;
  std::vector<const ir::Node*> nodes;  // Every node the step computes (profiles count their work).
  // Library calls:
  bool library = false;
  std::vector<runtime::PostOp> postOps;
  std::vector<const ir::Value*> extra;
  int numExtra = 0;
  bool channelsLast = false;
  runtime::ConvAlgo algo = runtime::ConvAlgo::kAuto;
  // An op kernel checking its indices itself (codegen::Kernel::indexWord): its word's number in
  // Schedule::deviceIndexChecks, passed as its last argument; else -1.
  int indexWord = -1;
  // An op kernel's workspace (codegen::Kernel::workspaceBytes), passed after its output.
  int64_t workspace = 0;
};

struct Schedule {
  std::vector<StepDraft> steps;
  std::vector<codegen::Kernel> kernels;  // StepDraft::kernel indexes them.
  std::vector<std::string> kernelGroup;  // Per kernel: its group kind's name.
  // Views of their input that need no step: value -> the value it views. Reshapes, and slices
  // that are one contiguous run of their input's bytes, at aliasOffset's byte offset into it
  // (only where that input's bytes are the arena's: BufferRef::offset).
  std::unordered_map<const ir::Value*, const ir::Value*> aliasOf;
  std::unordered_map<const ir::Value*, int64_t> aliasOffset;
  // The value whose bytes `v` is (`v` itself unless it is an alias, through chains of them).
  const ir::Value* root(const ir::Value* v) const {
    for (auto it = aliasOf.find(v); it != aliasOf.end(); it = aliasOf.find(v)) v = it->second;
    return v;
  }
  // Where `v`'s bytes start in root(v)'s, in bytes.
  int64_t rootOffset(const ir::Value* v) const {
    int64_t bytes = 0;
    for (auto it = aliasOf.find(v); it != aliasOf.end(); it = aliasOf.find(v)) {
      if (auto o = aliasOffset.find(v); o != aliasOffset.end()) bytes += o->second;
      v = it->second;
    }
    return bytes;
  }
  int aliases = 0;
  std::vector<std::string> remarks;  // Groups that run op by op, and why.
  // The graph inputs op kernels read as indices unchecked, and the indices op kernels check
  // on the device (runtime::Plan's).
  std::vector<runtime::IndexCheck> indexChecks;
  std::vector<runtime::IndexCheck> deviceIndexChecks;
};

// Schedules `groups` (ir::FusionPlan's, in order) of `graph` for `backend`.
// The library post-op node `n` of an epilogue group applies (a kAdd's `input` is left to the
// caller); kInternal when n is no post-op.
Expected<runtime::PostOp> postOpOf(const ir::Node& n);
// The post-ops of an epilogue chain in order, kAdds numbering their extra inputs from 0.
Expected<std::vector<runtime::PostOp>> postOpsOf(std::span<const ir::Node* const> nodes);

// `horizontal`: consecutive independent pointwise kernels join into one (the rule:
// schedule.cpp's joinsHorizontally), where the backend runs host code.
Expected<Schedule> scheduleGroups(const ir::Graph& graph,
                                  const std::vector<ir::FusionGroup>& groups,
                                  runtime::Backend& backend, bool horizontal = true);

}  // namespace kiln::compiler
