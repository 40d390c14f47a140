// The static memory planner (in-place chains + greedy-by-size best fit) and its independent
// checker. The two halves deliberately share no helpers, so a bug in one cannot hide in the other.
#include "compiler/memory_plan.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>
#include <utility>

namespace kiln::compiler {

// ---------------------------------------------------------------------------------------------
// Planner.
// ---------------------------------------------------------------------------------------------
namespace {

constexpr int64_t kMaxBytes = std::numeric_limits<int64_t>::max();

// Rounds up to a multiple of `alignment`, saturating at the largest multiple that fits: such a
// buffer cannot be planned anyway, and checkMemoryPlan reports it as lying outside the arena.
int64_t alignUp(int64_t bytes, int64_t alignment) {
  int64_t rem = bytes % alignment;
  if (rem == 0) return bytes;
  if (bytes > kMaxBytes - (alignment - rem)) return kMaxBytes - kMaxBytes % alignment;
  return bytes + (alignment - rem);
}

int64_t saturatingAdd(int64_t a, int64_t b) {
  return a > kMaxBytes - b ? kMaxBytes : a + b;
}

// A request as the planner sees it: clamped to something plannable.
struct Interval {
  int64_t size;  // Aligned bytes; 0 for negative requests.
  int first;
  int last;    // >= first.
  bool valid;  // False when the request had to be clamped.
};

class UnionFind {
 public:
  explicit UnionFind(size_t n) : parent_(n) { std::iota(parent_.begin(), parent_.end(), 0); }
  int find(int x) {
    while (parent_[x] != x) {
      parent_[x] = parent_[parent_[x]];  // Path halving.
      x = parent_[x];
    }
    return x;
  }
  void join(int a, int b) { parent_[find(b)] = find(a); }

 private:
  std::vector<int> parent_;
};

// Honours the legal in-place hints that keep every pair of simultaneously live buffers apart
// (see BufferRequest::inplaceOf), merging each honoured pair into one chain. Chains are paths:
// every buffer takes over at most one buffer and is taken over by at most one.
int mergeInplaceChains(std::span<const BufferRequest> requests, const std::vector<Interval>& iv,
                       UnionFind& chains, std::vector<char>& takenOverAtHandoff) {
  const int n = static_cast<int>(requests.size());
  std::vector<int> pred(n, -1), succ(n, -1);
  int reuses = 0;
  for (int i = 0; i < n; ++i) {
    const int a = requests[i].inplaceOf;
    if (a < 0 || a >= n || a == i || !iv[i].valid || !iv[a].valid) continue;
    if (requests[a].lastStep != requests[i].firstStep) continue;
    if (requests[i].bytes > requests[a].bytes) continue;
    // Two buffers writing over the same dying input would both be live at the hand-off step.
    if (succ[a] != -1) continue;
    // Through a one-step middle link, the chain's ends would be live together at that step.
    if (iv[a].first == iv[a].last && pred[a] != -1) continue;
    if (iv[i].first == iv[i].last && succ[i] != -1) continue;
    if (chains.find(a) == chains.find(i)) continue;
    chains.join(a, i);
    pred[i] = a;
    succ[a] = i;
    takenOverAtHandoff[i] = 1;
    ++reuses;
  }
  return reuses;
}

// Max over steps of the aligned bytes live at that step; a buffer written in place over another
// is not counted at its first step (the hand-off), where it lives inside its source's memory.
int64_t liveBytesLowerBound(const std::vector<Interval>& iv,
                            const std::vector<char>& takenOverAtHandoff) {
  std::vector<std::pair<int64_t, int64_t>> events;  // (step, change in live bytes)
  events.reserve(iv.size() * 2);
  for (size_t i = 0; i < iv.size(); ++i) {
    if (iv[i].size == 0) continue;
    int64_t start = int64_t{iv[i].first} + (takenOverAtHandoff[i] ? 1 : 0);
    int64_t end = int64_t{iv[i].last} + 1;
    if (start >= end) continue;
    events.emplace_back(start, iv[i].size);
    events.emplace_back(end, -iv[i].size);
  }
  std::sort(events.begin(), events.end());
  int64_t live = 0, peak = 0;
  for (size_t k = 0; k < events.size();) {
    const int64_t step = events[k].first;
    for (; k < events.size() && events[k].first == step; ++k) live += events[k].second;
    peak = std::max(peak, live);
  }
  return peak;
}

// A chain of in-place buffers (or a single buffer), placed as one unit at one offset. The members
// keep their own sizes, so a chain that shrinks (a smaller output written over its input) frees
// the rest of its input's memory at the hand-off.
struct Block {
  int64_t size = 0;  // The largest member; the sort key.
  int first = std::numeric_limits<int>::max();
  int last = std::numeric_limits<int>::min();
  int64_t offset = 0;
  std::vector<int> members;  // Buffer indices.
};

// One placed buffer: bytes [offset, end) during steps [first, last].
struct Placed {
  int64_t offset;
  int64_t end;
  int first;
  int last;
};

// Offsets o with lo < o < hi are unusable for the block being placed.
struct Forbidden {
  int64_t lo;
  int64_t hi;
};

// Greedy by size with best fit (as TFLite's memory planner): the largest blocks go first, so the
// small ones fill the gaps between them. `placed` stays sorted by offset, so for a one-buffer
// block one scan yields its forbidden offset ranges in order; a chain needs a sort, since the
// room it needs next to a placed buffer depends on which of its members that buffer meets.
int64_t placeBlocks(std::vector<Block>& blocks, const std::vector<Interval>& iv) {
  std::vector<int> order;
  for (int b = 0; b < static_cast<int>(blocks.size()); ++b) {
    if (blocks[b].size > 0) order.push_back(b);  // Empty blocks keep offset 0.
  }
  std::sort(order.begin(), order.end(), [&](int x, int y) {
    if (blocks[x].size != blocks[y].size) return blocks[x].size > blocks[y].size;
    if (blocks[x].first != blocks[y].first) return blocks[x].first < blocks[y].first;
    return x < y;
  });
  std::vector<Placed> placed;
  placed.reserve(iv.size());
  std::vector<Forbidden> forbidden;
  int64_t arena = 0;
  for (int b : order) {
    Block& block = blocks[b];
    const bool chain = block.members.size() > 1;
    forbidden.clear();
    for (const Placed& p : placed) {
      if (p.last < block.first || p.first > block.last) continue;
      int64_t need = block.size;
      if (chain) {
        need = 0;
        for (int m : block.members) {
          if (iv[m].first <= p.last && p.first <= iv[m].last) need = std::max(need, iv[m].size);
        }
        if (need == 0) continue;
      }
      forbidden.push_back({p.offset - need, p.end});
    }
    if (chain) {
      std::sort(forbidden.begin(), forbidden.end(),
                [](const Forbidden& x, const Forbidden& y) { return x.lo < y.lo; });
    }
    // Sweep the usable ranges [cur, f.lo] between forbidden ones; the tightest wins, and the
    // open range above everything only when none is bounded.
    int64_t cur = 0;
    int64_t best = -1;
    int64_t bestSlack = kMaxBytes;
    for (const Forbidden& f : forbidden) {
      if (f.lo >= cur && f.lo - cur < bestSlack) {
        best = cur;
        bestSlack = f.lo - cur;
      }
      cur = std::max(cur, f.hi);
    }
    block.offset = best >= 0 ? best : cur;
    for (int m : block.members) {
      if (iv[m].size == 0) continue;
      const Placed entry{block.offset, saturatingAdd(block.offset, iv[m].size), iv[m].first,
                         iv[m].last};
      auto at = std::upper_bound(placed.begin(), placed.end(), entry.offset,
                                 [](int64_t off, const Placed& p) { return off < p.offset; });
      placed.insert(at, entry);
      arena = std::max(arena, entry.end);
    }
  }
  return arena;
}

}  // namespace

MemoryPlan planMemory(std::span<const BufferRequest> requests, int64_t alignment) {
  const int64_t align = std::max<int64_t>(alignment, 1);
  const int n = static_cast<int>(requests.size());
  std::vector<Interval> iv(n);
  for (int i = 0; i < n; ++i) {
    const BufferRequest& r = requests[i];
    const bool valid = r.bytes >= 0 && r.lastStep >= r.firstStep;
    iv[i] = {alignUp(std::max<int64_t>(r.bytes, 0), align), r.firstStep,
             std::max(r.lastStep, r.firstStep), valid};
  }

  MemoryPlan plan;
  UnionFind chains(n);
  std::vector<char> takenOverAtHandoff(n, 0);
  plan.inplaceReuses = mergeInplaceChains(requests, iv, chains, takenOverAtHandoff);
  plan.lowerBound = liveBytesLowerBound(iv, takenOverAtHandoff);

  // One block per chain: its whole span, sorted by its largest member.
  std::vector<int> blockOf(n, -1);
  std::vector<Block> blocks;
  for (int i = 0; i < n; ++i) {
    const int root = chains.find(i);
    if (blockOf[root] < 0) {
      blockOf[root] = static_cast<int>(blocks.size());
      blocks.emplace_back();
    }
    Block& block = blocks[blockOf[root]];
    block.size = std::max(block.size, iv[i].size);
    block.first = std::min(block.first, iv[i].first);
    block.last = std::max(block.last, iv[i].last);
    block.members.push_back(i);
  }
  plan.arenaBytes = placeBlocks(blocks, iv);
  plan.offsets.resize(n);
  for (int i = 0; i < n; ++i) plan.offsets[i] = blocks[blockOf[chains.find(i)]].offset;
  return plan;
}

// ---------------------------------------------------------------------------------------------
// Checker. Written from the contract in memory_plan.h alone: 128-bit byte arithmetic and a sweep
// over the schedule in step order, unlike the planner's chains and size-ordered placement.
// ---------------------------------------------------------------------------------------------
namespace {

std::string describeBuffer(std::span<const BufferRequest> requests, const MemoryPlan& plan,
                           size_t i) {
  const BufferRequest& r = requests[i];
  const __int128 end = static_cast<__int128>(plan.offsets[i]) + r.bytes;
  const std::string endText = end > std::numeric_limits<int64_t>::max()
                                  ? std::string("overflow")
                                  : std::to_string(static_cast<int64_t>(end));
  return "buffer " + std::to_string(i) + " (steps [" + std::to_string(r.firstStep) + ", " +
         std::to_string(r.lastStep) + "], bytes [" + std::to_string(plan.offsets[i]) + ", " +
         endText + "))";
}

// The hint of `user` onto `source` meets the legality rules of BufferRequest::inplaceOf.
bool isLegalInplacePair(std::span<const BufferRequest> requests, size_t user, size_t source) {
  const BufferRequest& u = requests[user];
  if (u.inplaceOf < 0 || static_cast<size_t>(u.inplaceOf) != source || user == source) return false;
  return requests[source].lastStep == u.firstStep && u.bytes <= requests[source].bytes;
}

}  // namespace

Status validateBufferRequests(std::span<const BufferRequest> requests) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const BufferRequest& r = requests[i];
    if (r.bytes < 0) {
      return invalidArgument("buffer " + std::to_string(i) + " requests " +
                             std::to_string(r.bytes) + " bytes; a buffer size must be >= 0");
    }
    if (r.lastStep < r.firstStep) {
      return invalidArgument("buffer " + std::to_string(i) + " is last read at step " +
                             std::to_string(r.lastStep) + ", before it is written at step " +
                             std::to_string(r.firstStep) + "; lastStep must be >= firstStep");
    }
  }
  return Status::ok();
}

Status checkMemoryPlan(std::span<const BufferRequest> requests, const MemoryPlan& plan,
                       int64_t alignment) {
  KILN_TRY(validateBufferRequests(requests));
  const int64_t align = alignment < 1 ? 1 : alignment;
  const size_t n = requests.size();
  if (plan.offsets.size() != n) {
    return internalError("memory plan has " + std::to_string(plan.offsets.size()) +
                         " offsets for " + std::to_string(n) + " buffers");
  }
  for (size_t i = 0; i < n; ++i) {
    const int64_t off = plan.offsets[i];
    if (off < 0 || off % align != 0) {
      return internalError(describeBuffer(requests, plan, i) +
                           " has an offset that is not a non-negative multiple of the alignment " +
                           std::to_string(align));
    }
    if (static_cast<__int128>(off) + requests[i].bytes > plan.arenaBytes) {
      return internalError(describeBuffer(requests, plan, i) + " ends past the arena of " +
                           std::to_string(plan.arenaBytes) + " bytes");
    }
  }

  // Sweep the buffers in order of their first step, keeping those still live.
  std::vector<size_t> byStart(n);
  std::iota(byStart.begin(), byStart.end(), size_t{0});
  std::stable_sort(byStart.begin(), byStart.end(), [&](size_t x, size_t y) {
    return requests[x].firstStep < requests[y].firstStep;
  });
  std::vector<size_t> live;
  for (size_t i : byStart) {
    const BufferRequest& r = requests[i];
    std::erase_if(live, [&](size_t j) { return requests[j].lastStep < r.firstStep; });
    const __int128 lo = plan.offsets[i];
    const __int128 hi = lo + r.bytes;
    for (size_t j : live) {
      const __int128 otherLo = plan.offsets[j];
      const __int128 otherHi = otherLo + requests[j].bytes;
      if (r.bytes == 0 || requests[j].bytes == 0 || hi <= otherLo || otherHi <= lo) continue;
      const bool inplacePair =
          isLegalInplacePair(requests, i, j) || isLegalInplacePair(requests, j, i);
      if (inplacePair && lo == otherLo) continue;
      const std::string both =
          describeBuffer(requests, plan, j) + " and " + describeBuffer(requests, plan, i);
      if (inplacePair) {
        return internalError("in-place pair " + both +
                             " overlap but do not start at the same offset");
      }
      return internalError(both + " are both live at step " + std::to_string(r.firstStep) +
                           " and share bytes");
    }
    live.push_back(i);
  }

  int sharedPairs = 0;
  for (size_t i = 0; i < n; ++i) {
    const int source = requests[i].inplaceOf;
    if (source >= 0 && static_cast<size_t>(source) < n && isLegalInplacePair(requests, i, source) &&
        plan.offsets[i] == plan.offsets[source]) {
      ++sharedPairs;
    }
  }
  if (plan.inplaceReuses < 0 || plan.inplaceReuses > sharedPairs) {
    return internalError("memory plan claims " + std::to_string(plan.inplaceReuses) +
                         " in-place reuses, but only " + std::to_string(sharedPairs) +
                         " legal in-place pairs share an offset");
  }
  return Status::ok();
}

}  // namespace kiln::compiler
