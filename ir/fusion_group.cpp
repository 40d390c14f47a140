#include "ir/fusion_group.h"

#include <set>

namespace kiln::ir {

std::string_view groupKindName(GroupKind k) {
  switch (k) {
    case GroupKind::kPointwise:
      return "pointwise";
    case GroupKind::kReduction:
      return "reduction";
    case GroupKind::kView:
      return "view";
    case GroupKind::kLibrary:
      return "library";
    case GroupKind::kOther:
      return "other";
  }
  return "?";
}

std::pair<int, int> reducedRange(const Node& n) {
  const int rank = n.input(0)->type().rank();
  auto norm = [&](int64_t ax) { return static_cast<int>(ax < 0 ? ax + rank : ax); };
  switch (n.op()) {
    case OpKind::kSoftmax:
    case OpKind::kLogSoftmax: {
      const int a = norm(n.attr().getInt("axis"));
      return {a, a + 1};
    }
    case OpKind::kLayerNorm:
      return {norm(n.attr().getInt("axis")), rank};
    case OpKind::kGlobalAvgPool:
      return {2, 4};
    case OpKind::kReduceSum:
    case OpKind::kReduceMean:
    case OpKind::kReduceMax: {
      std::set<int> axes;
      for (int64_t a : n.attr().getInts("axes")) axes.insert(norm(a));
      if (axes.empty())
        for (int i = 0; i < rank; ++i) axes.insert(i);
      if (axes.empty()) return {-1, -1};
      const int lo = *axes.begin(), hi = *axes.rbegin() + 1;
      if (hi - lo != static_cast<int>(axes.size())) return {-1, -1};  // Not contiguous.
      return {lo, hi};
    }
    default:
      return {-1, -1};
  }
}

}  // namespace kiln::ir
