// Rematerialization (training): a large value computed by pointwise ops and read again much
// later is recomputed right before those later readers instead of being kept alive in between,
// when everything it is computed from is alive there anyway. The recomputation costs a pass over
// its inputs and no memory; keeping the value would hold it from the forward pass to the
// backward pass that reads it.
//
// Always: values of the graph's inputs alone (which live through the whole step), such as a
// channels-last step's image (resnet18 at batch 32: 19 MB, read by the first convolution and,
// last of all, by its weight gradient); and widening ops (one input, a larger output: autocast's
// bf16 -> f32 casts of convolution outputs, read by BatchNorm in both passes), recomputed from
// their input, which is kept until the later readers instead (its bytes for the output's). With
// PassContext::recompute (kiln train --recompute): every pointwise or channelwise value, through
// chains of up to kMaxChain such ops, from values live at its later readers (parameters included:
// an optimizer's in-place update runs after every read of its parameter), such as a ReLU of a
// training BatchNorm, recomputed in the backward pass from the convolution output the BatchNorm
// gradient keeps anyway.
#include <algorithm>
#include <limits>
#include <unordered_map>
#include <unordered_set>

#include "passes/pass.h"

namespace kiln::passes {

namespace {

constexpr int64_t kMinBytes = int64_t{1} << 20;  // Smaller values are not worth a second pass.
constexpr size_t kGap = 8;    // Readers this many nodes apart share a value; farther, recompute.
constexpr int kMaxChain = 4;  // Ops recomputed for one value at most.
constexpr size_t kForever = std::numeric_limits<size_t>::max();

bool pointwise(const ir::Node& n) {
  return (n.info().has(ir::kPointwise) || n.info().has(ir::kChannelwise)) &&
         n.outputs().size() == 1;
}

// A pointwise op of one computed input whose output takes more bytes than it (a widening cast).
bool widening(const ir::Node& n) {
  return n.inputs().size() == 1 && n.input(0)->producer() &&
         n.output()->type().byteSize() > n.input(0)->type().byteSize();
}

class Rematerializer {
 public:
  Rematerializer(ir::Graph& g, bool recompute) : g_(g), recompute_(recompute) {
    const std::vector<ir::Node*> nodes = g.nodes();
    for (size_t i = 0; i < nodes.size(); ++i) position_[nodes[i]] = i;
    for (const ir::Value* v : g.inputs()) inputs_.insert(v);
    for (const ir::Value* v : g.outputs()) lastUse_[v] = kForever;
    for (ir::Node* n : nodes)
      for (const ir::Value* v : n->inputs())
        if (lastUse_[v] != kForever) lastUse_[v] = std::max(lastUse_[v], position_[n]);
  }

  int run() {
    int copies = 0;
    for (ir::Node* n : g_.nodes()) {
      if (!pointwise(*n) || n->output()->type().byteSize() < static_cast<size_t>(kMinBytes) ||
          lastUse_[n->output()] == kForever)
        continue;
      std::vector<ir::Node*> readers = n->output()->users();
      std::sort(readers.begin(), readers.end(),
                [&](const ir::Node* a, const ir::Node* b) { return position_[a] < position_[b]; });
      readers.erase(std::unique(readers.begin(), readers.end()), readers.end());
      // Readers in clusters (no more than kGap nodes apart): the first keeps the original, each
      // later one gets a copy placed before its first reader.
      ir::Value* copy = nullptr;
      size_t lastUse = readers.empty() ? 0 : position_[readers[0]];
      for (size_t r = 1; r < readers.size(); ++r) {
        ir::Node* reader = readers[r];
        if (position_[reader] - position_[readers[r - 1]] > kGap) {
          if (widening(*n)) {  // Its input kept until this reader, in the output's place.
            ir::Value* source = n->input(0);
            lastUse_[source] = std::max(lastUse_[source], position_[reader]);
            kept_.insert(source);
          }
          int budget = kMaxChain;
          copy = available(n, position_[reader], budget) ? clone(n, reader) : nullptr;
          copies += copy != nullptr;
        }
        if (!copy) {
          lastUse = std::max(lastUse, position_[reader]);
          continue;
        }
        for (size_t i = 0; i < reader->inputs().size(); ++i)
          if (reader->input(i) == n->output()) reader->replaceInput(i, copy);
      }
      // The original now dies at its last reader that kept it: later values' recomputations
      // see it gone (nodes are visited in order, so every decision after this one sees it).
      lastUse_[n->output()] = lastUse;
    }
    return copies;
  }

 private:
  // Whether `v` is alive at `at` anyway: a graph input, or a widening op's input kept for its
  // recomputation; with recompute, also a parameter or a value read at or after `at`.
  bool alive(const ir::Value* v, size_t at) {
    return inputs_.count(v) || (kept_.count(v) && lastUse_[v] >= at) ||
           (recompute_ && (!v->producer() || lastUse_[v] >= at));
  }

  // Whether `v` can be read at `at`: alive there, or (with recompute) computed again there.
  bool availableValue(const ir::Value* v, size_t at, int& budget) {
    if (alive(v, at)) return true;
    return recompute_ && pointwise(*v->producer()) && available(v->producer(), at, budget);
  }

  bool available(const ir::Node* n, size_t at, int& budget) {
    if (--budget < 0) return false;
    return std::all_of(n->inputs().begin(), n->inputs().end(),
                       [&](const ir::Value* v) { return availableValue(v, at, budget); });
  }

  // n computed again right before `before` (its inputs that are not alive there first).
  ir::Value* clone(const ir::Node* n, ir::Node* before) {
    const size_t at = position_[before];
    std::vector<ir::Value*> in;
    for (ir::Value* v : n->inputs()) {
      in.push_back(alive(v, at) ? v : clone(v->producer(), before));
      if (!in.back()) return nullptr;
    }
    auto copy = g_.insertNode(before, n->op(), in, n->attrs());
    if (!copy) return nullptr;         // Cannot happen (the original's types inferred).
    (*copy)->setName(before->name());  // Its reader's phase (compiler::phaseOf).
    position_[*copy] = at;             // It runs right before its reader.
    return (*copy)->output();
  }

  ir::Graph& g_;
  const bool recompute_;
  std::unordered_map<const ir::Node*, size_t> position_;  // A copy: its reader's.
  std::unordered_map<const ir::Value*, size_t> lastUse_;
  std::unordered_set<const ir::Value*> inputs_;
  std::unordered_set<const ir::Value*> kept_;  // Widening ops' inputs kept to recompute them.
};

}  // namespace

bool Rematerialization::run(ir::Graph& g, PassContext& ctx) {
  if (ctx.inference) return false;
  const int copies = Rematerializer(g, ctx.recompute).run();
  if (copies > 0)
    ctx.remarks.push_back("rematerialize: " + std::to_string(copies) +
                          " values recomputed where they are read again" +
                          (ctx.recompute ? " (--recompute)" : ""));
  return copies > 0;
}

}  // namespace kiln::passes
