// The static memory planner (in-place chains, then the best of a skyline and two greedy best-fit
// placements) and its independent checker. The two halves share no helpers, so that a bug in one
// cannot hide in the other.
#include "compiler/memory_plan.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
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
// (see BufferRequest::inplaceOf) and links each honoured pair: succ[a] = b when b is written over
// a. Chains are therefore paths, and along a path the sizes never grow.
int linkInplaceChains(std::span<const BufferRequest> requests, const std::vector<Interval>& iv,
                      std::vector<int>& pred, std::vector<int>& succ) {
  const int n = static_cast<int>(requests.size());
  UnionFind chains(n);  // Guards against cycles of hints.
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
    ++reuses;
  }
  return reuses;
}

// A chain of in-place buffers (or a single buffer) is placed as one block at one offset. Its
// memory is a staircase of pieces: each member from the step after its hand-off (its first step
// for the head) to its last step. Pieces tile [first, last] and never grow, so a chain that
// shrinks gives back the rest of its input's memory at the hand-off.
struct Piece {
  int first;
  int last;
  int64_t size;
};

struct Block {
  int first;
  int last;
  int64_t size;  // Of the first piece, the largest.
  int pieceBegin;
  int pieceEnd;
};

struct Layout {
  std::vector<Block> blocks;
  std::vector<Piece> pieces;
  std::vector<int> blockOf;  // Per buffer.
};

Layout buildLayout(const std::vector<Interval>& iv, const std::vector<int>& pred,
                   const std::vector<int>& succ) {
  const int n = static_cast<int>(iv.size());
  Layout layout;
  layout.blockOf.assign(n, -1);
  for (int head = 0; head < n; ++head) {
    if (pred[head] != -1) continue;
    const int b = static_cast<int>(layout.blocks.size());
    Block block{iv[head].first, iv[head].last, iv[head].size,
                static_cast<int>(layout.pieces.size()), 0};
    for (int m = head; m != -1; m = succ[m]) {
      layout.blockOf[m] = b;
      // A member written in place owns memory from the step after its hand-off.
      if (m == head) {
        layout.pieces.push_back({iv[m].first, iv[m].last, iv[m].size});
      } else if (iv[m].first < iv[m].last) {
        layout.pieces.push_back({iv[m].first + 1, iv[m].last, iv[m].size});
      }
      block.last = std::max(block.last, iv[m].last);
    }
    block.pieceEnd = static_cast<int>(layout.pieces.size());
    layout.blocks.push_back(block);
  }
  return layout;
}

// Max over steps of the bytes the pieces live at that step hold: what any plan needs.
int64_t liveBytesLowerBound(const std::vector<Piece>& pieces) {
  std::vector<std::pair<int64_t, int64_t>> events;  // (step, change in live bytes)
  events.reserve(pieces.size() * 2);
  for (const Piece& p : pieces) {
    events.emplace_back(p.first, p.size);
    events.emplace_back(int64_t{p.last} + 1, -p.size);
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

struct Placement {
  std::vector<int64_t> offsets;  // Per block.
  int64_t arena = 0;
};

// Finds the best-fit offset for a block: fed, in increasing order of lo, the ranges of offsets
// (lo, hi) the block cannot start at, it keeps the tightest usable range [cur, lo] between them;
// the open range above them all is the answer only when no bounded one exists.
class BestFit {
 public:
  void forbid(int64_t lo, int64_t hi) {
    if (lo >= cur_ && lo - cur_ < bestSlack_) {
      best_ = cur_;
      bestSlack_ = lo - cur_;
    }
    cur_ = std::max(cur_, hi);
  }
  int64_t offset() const { return best_ >= 0 ? best_ : cur_; }

 private:
  int64_t cur_ = 0;
  int64_t best_ = -1;
  int64_t bestSlack_ = kMaxBytes;
};

// The pieces placed so far, sorted by offset, answering the question the greedy placement asks:
// which of them are live during steps [first, last], in offset order? That scan over all placed
// pieces is the O(n^2) part of planning, so it is kept cheap: the steps sit in flat arrays and
// are tested into a flag per piece, a loop the compiler vectorizes, before the hits are visited.
class PlacedPieces {
 public:
  explicit PlacedPieces(size_t capacity) {
    for (auto* v : {&offset_, &end_}) v->reserve(capacity);
    for (auto* v : {&first_, &last_}) v->reserve(capacity);
  }

  void insert(int64_t offset, int64_t end, int first, int last) {
    const auto at = std::upper_bound(offset_.begin(), offset_.end(), offset) - offset_.begin();
    offset_.insert(offset_.begin() + at, offset);
    end_.insert(end_.begin() + at, end);
    first_.insert(first_.begin() + at, first);
    last_.insert(last_.begin() + at, last);
  }

  // Calls visit(offset, end, first) in offset order for every piece live at a step of
  // [first, last].
  template <class Visit>
  void forEachLive(int first, int last, Visit&& visit) {
    const size_t count = offset_.size();
    live_.assign((count + 7) / 8 * 8, 0);
    for (size_t j = 0; j < count; ++j) {
      // `&` on ints rather than `&&`: no branch, so the loop vectorizes.
      live_[j] = static_cast<uint8_t>(int{first_[j] <= last} & int{last_[j] >= first});
    }
    for (size_t base = 0; base < count; base += 8) {
      uint64_t word;  // Eight flags (0 or 1) at a time: most are clear.
      std::memcpy(&word, &live_[base], sizeof word);
      for (; word != 0; word &= word - 1) {
        const size_t j = base + static_cast<size_t>(std::countr_zero(word)) / 8;
        visit(offset_[j], end_[j], first_[j]);
      }
    }
  }

 private:
  std::vector<int64_t> offset_, end_;
  std::vector<int> first_, last_;
  std::vector<uint8_t> live_;  // Scratch for forEachLive.
};

// Greedy best fit (TFLite's "greedy by size" when `order` is by size): blocks in the given order,
// each at the tightest free range among the placed pieces live at the same time, or above them
// all when none fits. A staircase needs as much room next to a placed piece as its own piece
// that meets it.
Placement placeGreedy(const Layout& layout, const std::vector<int>& order) {
  Placement result;
  result.offsets.assign(layout.blocks.size(), 0);
  PlacedPieces placed(layout.pieces.size());
  std::vector<std::pair<int64_t, int64_t>> forbidden;  // For staircases: (lo, hi).
  for (int b : order) {
    const Block& block = layout.blocks[b];
    BestFit fit;
    if (block.pieceEnd - block.pieceBegin == 1) {
      placed.forEachLive(block.first, block.last, [&](int64_t offset, int64_t end, int) {
        fit.forbid(offset - block.size, end);
      });
    } else {
      forbidden.clear();
      placed.forEachLive(block.first, block.last, [&](int64_t offset, int64_t end, int first) {
        int k = block.pieceBegin;
        while (layout.pieces[k].last < first) ++k;  // The first piece met is the largest.
        if (layout.pieces[k].size > 0) forbidden.emplace_back(offset - layout.pieces[k].size, end);
      });
      std::sort(forbidden.begin(), forbidden.end());
      for (const auto& [lo, hi] : forbidden) fit.forbid(lo, hi);
    }
    const int64_t at = fit.offset();
    result.offsets[b] = at;
    for (int k = block.pieceBegin; k < block.pieceEnd; ++k) {
      const Piece& piece = layout.pieces[k];
      if (piece.size == 0) continue;
      const int64_t end = saturatingAdd(at, piece.size);
      placed.insert(at, end, piece.first, piece.last);
      result.arena = std::max(result.arena, end);
    }
  }
  return result;
}

// The unplaced blocks, queried for the best one that fits a span of steps: the longest-lived,
// then the largest. Blocks are grouped by first step; a group is sorted by (last, size), so the
// best of a group within [l, r] is its last unplaced block at or before the ones ending after r.
// Placed positions are skipped with a union-find that points each one to its left neighbour.
class UnplacedBlocks {
 public:
  UnplacedBlocks(const Layout& layout, const std::vector<int>& ids) : blocks_(layout.blocks) {
    flat_ = ids;
    std::sort(flat_.begin(), flat_.end(), [&](int x, int y) {
      const Block& a = blocks_[x];
      const Block& b = blocks_[y];
      if (a.first != b.first) return a.first < b.first;
      if (a.last != b.last) return a.last < b.last;
      if (a.size != b.size) return a.size < b.size;
      return x > y;
    });
    position_.assign(blocks_.size(), -1);
    for (int k = 0; k < static_cast<int>(flat_.size()); ++k) {
      position_[flat_[k]] = k;
      if (k == 0 || blocks_[flat_[k]].first != blocks_[flat_[k - 1]].first) {
        starts_.push_back(blocks_[flat_[k]].first);
        groupBegin_.push_back(k);
      }
    }
    groupBegin_.push_back(static_cast<int>(flat_.size()));
    left_.resize(flat_.size() + 1);
    std::iota(left_.begin(), left_.end(), 0);
  }

  // The best unplaced block with l <= first and last <= r, or -1.
  int best(int l, int r) {
    int found = -1;
    auto g = std::lower_bound(starts_.begin(), starts_.end(), l) - starts_.begin();
    for (; g < static_cast<int>(starts_.size()) && starts_[g] <= r; ++g) {
      const auto begin = flat_.begin() + groupBegin_[g];
      const auto end = flat_.begin() + groupBegin_[g + 1];
      const auto after = std::upper_bound(
          begin, end, r, [&](int step, int id) { return step < blocks_[id].last; });
      const int k = lastUnplacedAtOrBefore(static_cast<int>(after - flat_.begin()) - 1);
      if (k < groupBegin_[g]) continue;
      if (found < 0 || better(flat_[k], found)) found = flat_[k];
    }
    return found;
  }

  void remove(int block) {
    const int k = position_[block];
    left_[k + 1] = k;
  }

 private:
  bool better(int x, int y) const {
    const Block& a = blocks_[x];
    const Block& b = blocks_[y];
    const int64_t lenA = int64_t{a.last} - a.first, lenB = int64_t{b.last} - b.first;
    if (lenA != lenB) return lenA > lenB;
    return a.size > b.size;  // Ties go to the earlier start, as groups are visited in order.
  }
  int lastUnplacedAtOrBefore(int k) {
    int x = k + 1;  // left_ is shifted by one so that 0 means "none".
    while (left_[x] != x) {
      left_[x] = left_[left_[x]];
      x = left_[x];
    }
    return x - 1;
  }

  const std::vector<Block>& blocks_;
  std::vector<int> flat_;
  std::vector<int> position_;
  std::vector<int> starts_;
  std::vector<int> groupBegin_;
  std::vector<int> left_;
};

// Skyline best fit (Sekiyama et al., "Profile-guided memory optimization for deep neural
// networks", 2018): keep the height of used memory over the steps as segments; repeatedly take
// the lowest segment and put on it the longest-lived block that fits within its steps, or, when
// none fits, raise it to its lower neighbour (the memory below is lost). Unlike the greedy
// placements it never leaves holes under a block, and it packs long-lived blocks first.
Placement placeSkyline(const Layout& layout, const std::vector<int>& ids) {
  struct Segment {
    int first;
    int last;
    int64_t height;
  };
  Placement result;
  result.offsets.assign(layout.blocks.size(), 0);
  if (ids.empty()) return result;
  int lo = std::numeric_limits<int>::max(), hi = std::numeric_limits<int>::min();
  for (int b : ids) {
    lo = std::min(lo, layout.blocks[b].first);
    hi = std::max(hi, layout.blocks[b].last);
  }
  std::vector<Segment> sky = {{lo, hi, 0}};
  std::vector<Segment> replacement;
  UnplacedBlocks unplaced(layout, ids);
  for (size_t left = ids.size(); left > 0;) {
    size_t s = 0;
    for (size_t k = 1; k < sky.size(); ++k) {
      if (sky[k].height < sky[s].height) s = k;
    }
    const Segment seg = sky[s];
    const int b = unplaced.best(seg.first, seg.last);
    replacement.clear();
    if (b < 0) {
      // The segment spanning all steps fits every block, so a lowest one that fits none has a
      // neighbour.
      int64_t raised = kMaxBytes;
      if (s > 0) raised = std::min(raised, sky[s - 1].height);
      if (s + 1 < sky.size()) raised = std::min(raised, sky[s + 1].height);
      replacement.push_back({seg.first, seg.last, raised});
    } else {
      const Block& block = layout.blocks[b];
      result.offsets[b] = seg.height;
      unplaced.remove(b);
      --left;
      if (block.first > seg.first) replacement.push_back({seg.first, block.first - 1, seg.height});
      for (int k = block.pieceBegin; k < block.pieceEnd; ++k) {
        const Piece& piece = layout.pieces[k];
        const int64_t top = saturatingAdd(seg.height, piece.size);
        replacement.push_back({piece.first, piece.last, top});
        result.arena = std::max(result.arena, top);
      }
      if (block.last < seg.last) replacement.push_back({block.last + 1, seg.last, seg.height});
    }
    // Splice in the new segments, merging equal heights with each other and the neighbours.
    size_t from = s, to = s + 1;
    if (from > 0 && sky[from - 1].height == replacement.front().height) {
      replacement.front().first = sky[--from].first;
    }
    if (to < sky.size() && sky[to].height == replacement.back().height) {
      replacement.back().last = sky[to++].last;
    }
    size_t w = 0;
    for (size_t k = 1; k < replacement.size(); ++k) {
      if (replacement[k].height == replacement[w].height) {
        replacement[w].last = replacement[k].last;
      } else {
        replacement[++w] = replacement[k];
      }
    }
    replacement.resize(w + 1);
    sky.erase(sky.begin() + from, sky.begin() + to);
    sky.insert(sky.begin() + from, replacement.begin(), replacement.end());
  }
  return result;
}

// The greedy placements' orders: by size (TFLite's "greedy by size"), or by size times the square
// root of the lifetime, which puts big long-lived blocks at the bottom; ties go to the earlier
// start, then the lower index.
std::vector<int> greedyOrder(const Layout& layout, const std::vector<int>& ids, bool weighted) {
  std::vector<double> key(layout.blocks.size());
  for (int b : ids) {
    const Block& block = layout.blocks[b];
    const double life = 1.0 + static_cast<double>(int64_t{block.last} - block.first);
    key[b] = static_cast<double>(block.size) * (weighted ? std::sqrt(life) : 1.0);
  }
  std::vector<int> order = ids;
  std::sort(order.begin(), order.end(), [&](int x, int y) {
    const Block& a = layout.blocks[x];
    const Block& b = layout.blocks[y];
    if (key[x] != key[y]) return key[x] > key[y];
    if (a.size != b.size) return a.size > b.size;
    if (a.first != b.first) return a.first < b.first;
    return x < y;
  });
  return order;
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
  std::vector<int> pred(n, -1), succ(n, -1);
  plan.inplaceReuses = linkInplaceChains(requests, iv, pred, succ);
  const Layout layout = buildLayout(iv, pred, succ);
  plan.lowerBound = liveBytesLowerBound(layout.pieces);

  // Blocks that hold no bytes keep offset 0 and take no part in placement.
  std::vector<int> ids;
  for (int b = 0; b < static_cast<int>(layout.blocks.size()); ++b) {
    const Block& block = layout.blocks[b];
    if (block.size == 0) continue;
    ids.push_back(b);
  }
  // No heuristic wins everywhere (optimal placement is NP-hard), so up to three with different
  // blind spots run and the smallest arena wins. One that reaches the lower bound is optimal and
  // ends the search; on training-like schedules the first usually does.
  Placement best = placeSkyline(layout, ids);
  if (best.arena > plan.lowerBound) {
    for (bool weighted : {false, true}) {
      Placement candidate = placeGreedy(layout, greedyOrder(layout, ids, weighted));
      if (candidate.arena < best.arena) best = std::move(candidate);
      if (best.arena == plan.lowerBound) break;
    }
  }

  plan.arenaBytes = best.arena;
  plan.offsets.resize(n);
  for (int i = 0; i < n; ++i) plan.offsets[i] = best.offsets[layout.blockOf[i]];
  return plan;
}

// ---------------------------------------------------------------------------------------------
// Checker. Written from the contract in memory_plan.h alone: 128-bit byte arithmetic and a sweep
// over the schedule in step order, unlike the planner's chains, skyline and greedy placements.
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
