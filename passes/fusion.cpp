#include "passes/fusion.h"

#include <algorithm>
#include <set>
#include <sstream>
#include <unordered_set>

namespace kiln::passes {

int FusionPlan::numKernels(GroupKind k) const {
  return static_cast<int>(std::count_if(groups.begin(), groups.end(),
                                        [&](const FusionGroup& g) { return g.kind == k; }));
}

namespace {

bool isReshapeLike(ir::OpKind k) {
  return ir::hasTrait(k, ir::kReshapeLike);
}

bool isStridedView(ir::OpKind k) {
  return ir::hasTrait(k, ir::kStridedView);
}

bool isFusableReductionOp(ir::OpKind k) {
  return ir::hasTrait(k, ir::kReduction);
}

}  // namespace

std::string notFusableReason(const ir::Node& n) {
  auto badType = [](const ir::Value* v) { return !ir::isKernelDType(v->type().dtype); };
  for (const ir::Value* v : n.inputs())
    if (badType(v))
      return "dtype " + std::string(ir::dtypeName(v->type().dtype)) +
             " is not supported by generated kernels";
  for (const ir::Value* v : n.outputs())
    if (badType(v))
      return "dtype " + std::string(ir::dtypeName(v->type().dtype)) +
             " is not supported by generated kernels";
  // Generated kernels compute in f32/f64. Integer arithmetic must wrap and integer division
  // must report division by zero, and float-to-integer casts saturate: the reference kernels
  // do that, generated C++ would hit undefined behaviour. Bool and integers may still enter a
  // kernel as where's condition or a cast's input.
  const bool floatOut = ir::isFloat(n.output()->type().dtype);
  if (n.op() == ir::OpKind::kWhere) {
    if (!floatOut) return "where on non-float values runs on the reference kernel";
  } else if (n.op() == ir::OpKind::kCast) {
    if (!floatOut) return "casts to integer types saturate; they run on the reference kernel";
  } else if (isElementwise(n) || isFusableReductionOp(n.op())) {
    for (const ir::Value* v : n.inputs())
      if (!ir::isFloat(v->type().dtype))
        return "integer arithmetic runs on the reference kernel (it must wrap)";
  }
  return "";
}

bool isElementwise(const ir::Node& n) {
  return n.info().has(ir::kPointwise) || n.info().has(ir::kChannelwise);
}

bool isFusableReduction(const ir::Node& n) {
  return isFusableReductionOp(n.op()) && reducedRange(n).first >= 0 &&
         ir::isFloat(n.input(0)->type().dtype);
}

bool isPostOpCandidate(const ir::Node& n) {
  return n.info().has(ir::kEpilogue) && ir::isFloat(n.output()->type().dtype) &&
         n.output()->type().dtype != ir::DType::kF64;
}

bool acceptsLibraryEpilogue(ir::OpKind head) {
  return ir::hasTrait(head, ir::kEpilogueHead);
}

namespace {

enum class Level : uint8_t { kElement, kRow, kView };

struct GroupState {
  FusionGroup group;
  ir::Shape domain;    // Element domain (the anchor's input shape for reductions).
  ir::Shape rowShape;  // A reduce-type anchor's output shape; empty otherwise.
  bool hasRowAnchor = false;
  bool dead = false;    // Merged into another group.
  std::set<int> deps;   // Groups whose values this group reads.
  std::set<int> users;  // Groups that read this group's values (ids may be merged away).
  // Above every dependency's level: a group can depend only on groups of a lower level, which
  // bounds the cycle checks' searches (reachesThroughOutside).
  int level = 0;
  std::set<const ir::Value*> externalInputs;
};

class Planner {
 public:
  Planner(const ir::Graph& g, const FusionOptions& o) : graph_(g), opts_(o) {
    for (const ir::Value* v : g.outputs()) graphOutputs_.insert(v);
    int i = 0;
    for (const ir::Node* n : g.nodes()) order_[n] = i++;
  }

  FusionPlan run() {
    for (ir::Node* n : graph_.nodes()) place(n);
    return finish();
  }

 private:
  int groupOf(const ir::Node* n) const {
    int id = nodeGroup_.at(n);
    while (groups_[id].dead) id = forward_.at(id);
    return id;
  }

  int newGroup(ir::Node* n, GroupKind kind) {
    GroupState s;
    s.group.id = static_cast<int>(groups_.size());
    s.group.kind = kind;
    s.group.nodes.push_back(n);
    s.domain = n->output()->type().shape;
    for (const ir::Value* in : n->inputs()) addInput(s, in);
    groups_.push_back(std::move(s));
    nodeGroup_[n] = groups_.back().group.id;
    level_[n] = Level::kElement;
    return groups_.back().group.id;
  }

  // `s` may be a group not yet in groups_ (newGroup), which has no users to update.
  void addInput(GroupState& s, const ir::Value* in) {
    if (in->producer()) {
      const int pg = groupOf(in->producer());
      if (pg != s.group.id) {
        s.deps.insert(pg);
        s.externalInputs.insert(in);
        groups_[pg].users.insert(s.group.id);
        if (groups_[pg].level >= s.level) {
          s.level = groups_[pg].level + 1;
          if (s.group.id < static_cast<int>(groups_.size())) raiseUsers(s.group.id);
        }
      }
    } else {
      s.externalInputs.insert(in);
    }
  }

  // Restores "a user's level is above its dependency's" after group `id`'s level rose.
  void raiseUsers(int id) {
    std::vector<int> work{id};
    while (!work.empty()) {
      const int g = work.back();
      work.pop_back();
      for (int u : groups_[g].users) {
        u = resolve(u);
        if (u == g || groups_[u].level > groups_[g].level) continue;
        groups_[u].level = groups_[g].level + 1;
        work.push_back(u);
      }
    }
  }

  // True when some group in `from`'s dependencies (transitively) is `target`, passing only
  // through groups not in `inside`: merging would then need `target` before and after itself.
  // Groups at or below target's level cannot depend on it and are not searched (a long chain
  // of earlier steps, such as an unrolled recurrence's, costs nothing).
  bool reachesThroughOutside(int from, int target, const std::set<int>& inside) {
    std::vector<int> stack;
    std::unordered_set<int> seen;
    for (int d : groups_[from].deps) stack.push_back(resolve(d));
    const int floor = groups_[target].level;
    int budget = 256;  // Keeps the check near-linear on big graphs; exhausting it rejects.
    while (!stack.empty()) {
      const int g = stack.back();
      stack.pop_back();
      if (!seen.insert(g).second) continue;
      if (g == target) return true;
      if (inside.count(g) || groups_[g].level <= floor) continue;
      if (--budget < 0) return true;
      for (int d : groups_[g].deps) stack.push_back(resolve(d));
    }
    return false;
  }

  int resolve(int id) const {
    while (groups_[id].dead) id = forward_.at(id);
    return id;
  }

  void reject(const ir::Node* producer, const ir::Node* consumer, FusionDecision d) {
    std::string why = d.explain();
    rejections_.push_back({producer, consumer, std::move(d), std::move(why)});
  }

  // How a consumer would join a producer's group.
  enum class Role : uint8_t {
    kElementwise,  // An elementwise node into a pointwise or reduction kernel.
    kReduction,    // A reduction anchoring a kernel whose pointwise producer is its prologue.
    kEpilogue,     // A post-op of a library call (conv2d, linear, gemm, matmul).
    kViewLoad,     // A view group (`other`) read as strided loads of kernel `pg`.
  };

  // The one fusion decision: may `n` join group `pg`, which produces its input `via`, as
  // `role`? Legality (correctness) first, then profit. kElementwise: `merged` are the groups n
  // joins already and `target` the one they merge into; kViewLoad: `other` is the view group.
  FusionDecision decide(int pg, const ir::Node& n, const ir::Value* via, Role role,
                        const std::set<int>& merged = {}, int target = -1, int other = -1) {
    const GroupState& p = groups_[pg];
    std::string why;
    switch (role) {
      case Role::kElementwise: {
        if (!canFuse(p, n, &why)) return FusionDecision::illegal(why);
        if (target >= 0) {  // Both groups must be mergeable with each other too.
          const GroupState& t = groups_[target];
          if (t.group.anchor && p.group.anchor)
            return FusionDecision::illegal("both producers already hold a reduction");
          if (t.domain != p.domain)
            return FusionDecision::illegal("the producers have different domains");
        }
        std::set<int> inside = merged;
        inside.insert(pg);
        for (int g : inside)
          for (int h : inside)
            if (g != h && reachesThroughOutside(g, h, inside))
              return FusionDecision::illegal("fusing would create a cycle through another kernel");
        if (!worthFusing(p, n, &why)) return FusionDecision::unprofitable(why);
        return FusionDecision::fuse();
      }
      case Role::kReduction: {
        if (p.group.kind != GroupKind::kPointwise)
          return FusionDecision::illegal("the producer is a " +
                                         std::string(groupKindName(p.group.kind)) + " step");
        if (p.domain != via->type().shape)
          return FusionDecision::illegal("the producer's domain " + ir::shapeToString(p.domain) +
                                         " is not the input shape");
        for (size_t i = 1; i < n.inputs().size(); ++i) {
          const ir::Value* in = n.input(i);
          if (in->producer() && groupOfConst(in->producer()) != pg &&
              reachesThroughOutside(groupOfConst(in->producer()), pg, {pg}))
            return FusionDecision::illegal("fusing would create a cycle");
        }
        if (!worthFusing(p, n, &why)) return FusionDecision::unprofitable(why);
        return FusionDecision::fuse();
      }
      case Role::kEpilogue: {
        if (via->users().size() != 1 || graphOutputs_.count(via))
          return FusionDecision::illegal("the library result is also read elsewhere");
        if (n.output()->type().shape != via->type().shape)
          return FusionDecision::illegal("the epilogue would broadcast the library result");
        if (n.op() == ir::OpKind::kAdd) {
          const ir::Value* added = n.input(n.input(0) == via ? 1 : 0);
          if (added->type().shape != via->type().shape)
            return FusionDecision::illegal("the added operand " + added->type().toString() +
                                           " has another shape");
          if (added->producer() && groupOfConst(added->producer()) == pg)
            return FusionDecision::illegal("the added operand is computed by the library call");
          if (added->producer() && reachesThroughOutside(groupOfConst(added->producer()), pg, {}))
            return FusionDecision::illegal("the added operand depends on the library call");
        }
        return FusionDecision::fuse();
      }
      case Role::kViewLoad: {
        if (via->producer() && groupOfConst(via->producer()) == pg)
          return FusionDecision::illegal("a view of a value computed in the same kernel");
        if (reachesThroughOutside(other, pg, {pg, other}))
          return FusionDecision::illegal("fusing would create a cycle");
        return FusionDecision::fuse();
      }
    }
    return FusionDecision::illegal("unknown fusion role");
  }

  // The level at which `n` would sit in group `s`, or an error reason.
  std::string levelIn(const GroupState& s, const ir::Node& n, Level* level) const {
    const ir::Shape& shape = n.output()->type().shape;
    if (shape == s.domain) {
      *level = Level::kElement;
      return "";
    }
    if (s.hasRowAnchor && shape == s.rowShape) {
      *level = Level::kRow;
      return "";
    }
    return "shape " + ir::shapeToString(shape) + " differs from the kernel's domain " +
           ir::shapeToString(s.domain);
  }

  // Legality only: can elementwise node `n` join group `s` (which produces `v`, an input of n)?
  bool canFuse(const GroupState& s, const ir::Node& n, std::string* whyNot) const {
    if (s.group.kind != GroupKind::kPointwise && s.group.kind != GroupKind::kReduction) {
      *whyNot = "the producer is a " + std::string(groupKindName(s.group.kind)) + " step";
      return false;
    }
    Level lv;
    if (auto why = levelIn(s, n, &lv); !why.empty()) {
      *whyNot = why;
      return false;
    }
    // Row-level nodes (after a reduce) may only read row-level values of the group.
    for (const ir::Value* in : n.inputs()) {
      if (!in->producer() || groupOfConst(in->producer()) != s.group.id) continue;
      const Level inLevel = level_.at(in->producer());
      if (lv == Level::kRow && inLevel != Level::kRow) {
        *whyNot = "a value after the reduction would read an unreduced value";
        return false;
      }
      if (lv == Level::kElement && inLevel == Level::kRow) {
        // A reduced value broadcast back over the reduced dims: only with keepdims shapes.
        ir::Shape keep = s.domain;
        const auto [a, b] = reducedRange(*s.group.anchor);
        for (int d = a; d < b; ++d) keep[d] = 1;
        if (in->type().shape != keep) {
          *whyNot = "the reduced value " + ir::shapeToString(in->type().shape) +
                    " does not broadcast back along the reduced dims";
          return false;
        }
      }
    }
    return true;
  }

  int groupOfConst(const ir::Node* n) const {
    auto it = nodeGroup_.find(n);
    if (it == nodeGroup_.end()) return -1;
    return resolve(it->second);
  }

  // Performance only: is fusing worth it? Bounded group sizes keep kernels small enough to
  // compile fast and keep register pressure sane.
  bool worthFusing(const GroupState& s, const ir::Node& n, std::string* whyNot) const {
    if (static_cast<int>(s.group.nodes.size()) >= opts_.maxNodesPerGroup) {
      *whyNot = "the kernel already has " + std::to_string(s.group.nodes.size()) + " nodes";
      return false;
    }
    size_t inputs = s.externalInputs.size();
    for (const ir::Value* in : n.inputs())
      if (!in->producer() || groupOfConst(in->producer()) != s.group.id) ++inputs;
    if (static_cast<int>(inputs) > opts_.maxInputsPerGroup) {
      *whyNot = "the kernel would read " + std::to_string(inputs) + " buffers";
      return false;
    }
    return true;
  }

  // A view group whose chain ends in `v` and whose values nobody else reads.
  int absorbableView(const ir::Value* v) const {
    if (!v->producer()) return -1;
    const int vg = groupOfConst(v->producer());
    if (vg < 0 || groups_[vg].group.kind != GroupKind::kView) return -1;
    const GroupState& s = groups_[vg];
    if (s.group.nodes.back()->output() != v || graphOutputs_.count(v)) return -1;
    for (const ir::Node* vn : s.group.nodes) {
      if (graphOutputs_.count(vn->output())) return -1;
      for (const ir::Node* u : vn->output()->users())
        if (groupOfConst(u) != vg && !(vn->output() == v && u == consumer_)) return -1;
    }
    return vg;
  }

  void merge(int into, int from) {
    GroupState& a = groups_[into];
    GroupState& b = groups_[from];
    for (ir::Node* n : b.group.nodes) a.group.nodes.push_back(n);
    if (b.group.anchor) {
      a.group.anchor = b.group.anchor;
      a.group.kind = GroupKind::kReduction;
      a.domain = b.domain;
      a.rowShape = b.rowShape;
      a.hasRowAnchor = b.hasRowAnchor;
    }
    for (int d : b.deps) a.deps.insert(d);
    for (int u : b.users) a.users.insert(u);
    for (const ir::Value* v : b.externalInputs) a.externalInputs.insert(v);
    b.dead = true;
    forward_[from] = into;
    a.deps.erase(into);
    a.deps.erase(from);
    a.users.erase(into);
    a.users.erase(from);
    // Above both groups' dependencies; their users may now sit too low.
    a.level = std::max(a.level, b.level);
    raiseUsers(into);
    // Values that flowed between the two are internal now.
    for (auto it = a.externalInputs.begin(); it != a.externalInputs.end();) {
      const ir::Value* v = *it;
      if (v->producer() && groupOfConst(v->producer()) == into)
        it = a.externalInputs.erase(it);
      else
        ++it;
    }
  }

  void joinElementwise(ir::Node* n) {
    consumer_ = n;
    // Candidate producer groups, biggest input first (the most bytes saved).
    std::vector<const ir::Value*> ins(n->inputs().begin(), n->inputs().end());
    std::stable_sort(ins.begin(), ins.end(), [](const ir::Value* a, const ir::Value* b) {
      return a->type().byteSize() > b->type().byteSize();
    });
    std::vector<int> views;
    int target = -1;
    std::set<int> merged;
    for (const ir::Value* in : ins) {
      if (!in->producer()) continue;
      if (int vg = absorbableView(in); vg >= 0) {
        views.push_back(vg);
        continue;
      }
      const int pg = groupOfConst(in->producer());
      if (merged.count(pg)) continue;
      if (FusionDecision d = decide(pg, *n, in, Role::kElementwise, merged, target); !d) {
        reject(in->producer(), n, std::move(d));
        continue;
      }
      merged.insert(pg);
      if (target < 0 || groups_[pg].group.anchor) target = pg;
    }
    // n's other producers must not depend on a group n joins, or that group would have to
    // run both before and after them.
    for (bool dropped = true; dropped && !merged.empty();) {
      dropped = false;
      for (const ir::Value* in : n->inputs()) {
        if (!in->producer()) continue;
        const int h = groupOfConst(in->producer());
        if (merged.count(h)) continue;
        for (int g : merged) {
          if (!reachesThroughOutside(h, g, {})) continue;
          reject(in->producer(), n,
                 FusionDecision::illegal("fusing would create a cycle through another kernel"));
          merged.erase(g);
          if (g == target) target = merged.empty() ? -1 : *merged.begin();
          dropped = true;
          break;
        }
        if (dropped) break;
      }
    }
    if (target >= 0)
      for (int g : merged)
        if (groups_[g].group.anchor) target = g;
    if (target < 0) {
      const int id = newGroup(n, GroupKind::kPointwise);
      for (int vg : views) absorbView(id, vg);
      return;
    }
    for (int g : merged)
      if (g != target) merge(target, g);
    GroupState& s = groups_[target];
    Level lv = Level::kElement;
    levelIn(s, *n, &lv);
    s.group.nodes.push_back(n);
    nodeGroup_[n] = target;
    level_[n] = lv;
    for (const ir::Value* in : n->inputs()) addInput(s, in);
    for (int vg : views) absorbView(target, vg);
  }

  // Views become the loads of `target` unless they read a value `target` computes itself
  // (that would need the value at another index) or the merge would create a cycle.
  void absorbView(int target, int vg) {
    const ir::Node* first = groups_[vg].group.nodes.front();
    const ir::Value* source = first->input(0);
    if (FusionDecision d = decide(target, *first, source, Role::kViewLoad, {}, -1, vg); !d) {
      if (source->producer() && groupOfConst(source->producer()) == target)
        reject(source->producer(), first, std::move(d));
      else
        reject(groups_[vg].group.nodes.back(), consumer_, std::move(d));
      return;
    }
    for (ir::Node* vn : groups_[vg].group.nodes) level_[vn] = Level::kView;
    merge(target, vg);
  }

  void placeReduction(ir::Node* n) {
    consumer_ = n;
    const ir::Value* data = n->input(0);
    auto make = [&]() {
      const int id = newGroup(n, GroupKind::kReduction);
      GroupState& s = groups_[id];
      s.group.anchor = n;
      s.domain = data->type().shape;
      const bool rowAnchor = !n->info().has(ir::kRowBroadcast);
      s.hasRowAnchor = rowAnchor;
      if (rowAnchor) s.rowShape = n->output()->type().shape;
      level_[n] = rowAnchor ? Level::kRow : Level::kElement;
      return id;
    };
    if (data->producer()) {
      if (int vg = absorbableView(data); vg >= 0) {
        absorbView(make(), vg);
        return;
      }
      const int pg = groupOfConst(data->producer());
      FusionDecision d = decide(pg, *n, data, Role::kReduction);
      if (d) {
        const int id = make();
        merge(pg, id);
        nodeGroup_[n] = pg;
        return;
      }
      reject(data->producer(), n, std::move(d));
    }
    make();
  }

  void place(ir::Node* n) {
    if (std::string why = notFusableReason(*n); !why.empty()) {
      newGroup(n, n->info().has(ir::kLibrary) ? GroupKind::kLibrary : GroupKind::kOther);
      if (n->info().has(ir::kPointwise) || isFusableReduction(*n))
        reject(nullptr, n, FusionDecision::illegal(why));
      return;
    }
    if (n->info().has(ir::kLibrary)) {
      newGroup(n, GroupKind::kLibrary);
      return;
    }
    if (isViewOp(*n)) {
      placeView(n);
      return;
    }
    if (isElementwise(*n)) {
      if (opts_.libraryEpilogues && joinLibraryEpilogue(n)) return;
      joinElementwise(n);
      return;
    }
    if (isFusableReduction(*n)) {
      placeReduction(n);
      return;
    }
    newGroup(n, GroupKind::kOther);
  }

  // An activation or residual add right after a conv2d/linear/gemm/matmul (whose only reader
  // it is) of its dtype becomes a post-op of the library call. f32 calls only, but for a
  // backend's low-precision calls (bf16/f16 under autocast: the epilogue computes in f32 and
  // rounds the result once, where op by op each op rounds — one ulp apart at most).
  bool joinLibraryEpilogue(ir::Node* n) {
    if (!isPostOpCandidate(*n)) return false;
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      const ir::Value* in = n->input(i);
      const ir::Node* p = in->producer();
      if (!p) continue;
      const int pg = groupOfConst(p);
      GroupState& s = groups_[pg];
      if (s.group.kind != GroupKind::kLibrary || s.group.nodes.back() != p) continue;
      if (!acceptsLibraryEpilogue(s.group.nodes.front()->op())) continue;
      if (s.group.nodes.front()->output()->type().dtype != n->output()->type().dtype) continue;
      if (FusionDecision d = decide(pg, *n, in, Role::kEpilogue); !d) {
        reject(p, n, std::move(d));
        continue;
      }
      if (opts_.acceptsEpilogue) {
        std::vector<const ir::Node*> chain(s.group.nodes.begin() + 1, s.group.nodes.end());
        chain.push_back(n);
        if (!opts_.acceptsEpilogue(*s.group.nodes.front(), chain)) {
          reject(p, n,
                 FusionDecision::illegal("the backend's " +
                                         std::string(ir::opName(s.group.nodes.front()->op())) +
                                         " library call takes no such post-op chain"));
          continue;
        }
      }
      s.group.nodes.push_back(n);
      nodeGroup_[n] = pg;
      level_[n] = Level::kElement;
      for (const ir::Value* v : n->inputs()) addInput(s, v);
      return true;
    }
    return false;
  }

  // A view joins the view group of its input when the chain stays a strided view.
  void placeView(ir::Node* n) {
    const ir::Value* in = n->input(0);
    if (in->producer()) {
      const int pg = groupOfConst(in->producer());
      GroupState& p = groups_[pg];
      const bool chainEnd =
          p.group.kind == GroupKind::kView && p.group.nodes.back()->output() == in;
      const bool onlyUser = in->users().size() == 1 && !graphOutputs_.count(in);
      // Reshapes need contiguous input, which a chain containing a strided view is not.
      bool contiguous = true;
      for (const ir::Node* vn : p.group.nodes) contiguous = contiguous && !isStridedView(vn->op());
      if (chainEnd && onlyUser && (!isReshapeLike(n->op()) || contiguous)) {
        p.group.nodes.push_back(n);
        nodeGroup_[n] = pg;
        level_[n] = Level::kView;
        return;
      }
    }
    newGroup(n, GroupKind::kView);
    level_[n] = Level::kView;
  }

  FusionPlan finish() {
    FusionPlan plan;
    std::vector<int> live;
    for (auto& s : groups_)
      if (!s.dead) live.push_back(s.group.id);
    // Order groups by their first node; sort each group's nodes topologically.
    for (int id : live) {
      auto& nodes = groups_[id].group.nodes;
      std::sort(nodes.begin(), nodes.end(),
                [&](const ir::Node* a, const ir::Node* b) { return order_.at(a) < order_.at(b); });
    }
    // Groups in a topological order of their data dependencies (ties: first node first).
    std::unordered_map<int, int> pending;
    std::unordered_map<int, std::vector<int>> users;
    for (int id : live) {
      std::set<int> deps;
      for (const ir::Node* n : groups_[id].group.nodes)
        for (const ir::Value* in : n->inputs())
          if (in->producer() && resolve(nodeGroup_.at(in->producer())) != id)
            deps.insert(resolve(nodeGroup_.at(in->producer())));
      pending[id] = static_cast<int>(deps.size());
      for (int d : deps) users[d].push_back(id);
    }
    auto first = [&](int id) { return order_.at(groups_[id].group.nodes.front()); };
    auto later = [&](int a, int b) { return first(a) > first(b); };
    std::vector<int> ready, sorted;
    for (int id : live)
      if (pending[id] == 0) ready.push_back(id);
    std::make_heap(ready.begin(), ready.end(), later);
    while (!ready.empty()) {
      std::pop_heap(ready.begin(), ready.end(), later);
      const int id = ready.back();
      ready.pop_back();
      sorted.push_back(id);
      for (int u : users[id])
        if (--pending[u] == 0) {
          ready.push_back(u);
          std::push_heap(ready.begin(), ready.end(), later);
        }
    }
    live = std::move(sorted);  // Fusion never creates cycles, so every group is here.
    for (int id : live) {
      FusionGroup g = groups_[id].group;
      g.id = static_cast<int>(plan.groups.size());
      for (const ir::Node* n : g.nodes) plan.groupOf[n] = g.id;
      plan.groups.push_back(std::move(g));
    }
    plan.rejections = std::move(rejections_);
    return plan;
  }

  const ir::Graph& graph_;
  FusionOptions opts_;
  std::vector<GroupState> groups_;
  std::unordered_map<const ir::Node*, int> nodeGroup_;
  std::unordered_map<int, int> forward_;
  std::unordered_map<const ir::Node*, Level> level_;
  std::unordered_map<const ir::Node*, int> order_;
  std::unordered_set<const ir::Value*> graphOutputs_;
  std::vector<FusionRejection> rejections_;
  const ir::Node* consumer_ = nullptr;
};

}  // namespace

FusionPlan planFusion(const ir::Graph& g, const FusionOptions& options) {
  return Planner(g, options).run();
}

std::string explainFusion(const FusionPlan& plan) {
  std::ostringstream os;
  os << plan.groups.size() << " groups\n";
  for (const auto& g : plan.groups) {
    os << "group " << g.id << " (" << groupKindName(g.kind) << ", " << g.nodes.size()
       << (g.nodes.size() == 1 ? " node" : " nodes") << "):";
    for (const ir::Node* n : g.nodes)
      os << " " << ir::opName(n->op()) << "->%" << n->output()->name();
    os << "\n";
  }
  os << plan.rejections.size() << " rejected fusions\n";
  for (const auto& r : plan.rejections) {
    os << "  ";
    if (r.producer)
      os << ir::opName(r.producer->op()) << "->%" << r.producer->output()->name() << " into ";
    os << ir::opName(r.consumer->op()) << "->%" << r.consumer->output()->name() << ": " << r.reason
       << "\n";
  }
  return os.str();
}

}  // namespace kiln::passes
