// A fusion group: nodes of a graph that become one kernel or one library call. The fusion pass
// (passes/fusion.h) makes them; codegen lowers them and the compile driver schedules them. The
// type lives here, below both, so that codegen needs nothing from passes/.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/graph.h"

namespace kiln::ir {

enum class GroupKind : uint8_t {
  kPointwise,  // Elementwise ops (and views feeding them) over one iteration domain.
  kReduction,  // One reduction-like anchor with its pointwise prologue and epilogue.
  kView,       // Only views: runs as a strided copy, or as an alias when it is contiguous.
  kLibrary,    // A library op (conv, matmul, gemm, linear, pooling), then its post-ops.
  kOther,      // Runs alone on its reference kernel (gather, concat, losses, ...).
};

// "pointwise", "reduction", "view", "library" or "other".
std::string_view groupKindName(GroupKind k);

struct FusionGroup {
  int id = 0;
  GroupKind kind = GroupKind::kOther;
  std::vector<Node*> nodes;  // Topological order.
  Node* anchor = nullptr;    // The reduction of a kReduction group.
};

// Whether an op is a view: its output is its input's bytes read another way (kReshapeLike or
// kStridedView).
inline bool isViewOp(const Node& n) {
  return n.info().has(kReshapeLike) || n.info().has(kStridedView);
}

// The dims [a, b) a reduction (kReduction) reduces over its data input (input 0), or {-1, -1}
// when they are not one contiguous run.
std::pair<int, int> reducedRange(const Node& n);

}  // namespace kiln::ir
