// Layout selection: convolution chains run channels-last (NHWC), the layout the library's
// fastest convolutions use. A convolution whose output some op keeps channels-last starts a
// region (a lone one, read only by plain readers, stays plain: keptChannelsLast). Convolutions,
// pooling and elementwise ops between them keep NHWC
// (and in training the gradients of convolution, pooling and BatchNorm: ir::kChannelsLast);
// a relayout op is inserted only where a value crosses into or out of that region (the graph
// input before the first convolution, a flatten or matmul after the last), and graph outputs
// keep the user's layout. Reductions read NHWC and write plain.
#include <algorithm>
#include <unordered_map>

#include "ir/fusion_group.h"
#include "passes/fusion.h"
#include "passes/pass.h"

namespace kiln::passes {

namespace {

// Pointwise ops and channelwise ones (batch_norm: elementwise over input 0, per-channel
// operands broadcast), which generated kernels run in any layout.
bool isElementwiseOp(const ir::Node& n) {
  return (n.info().has(ir::kPointwise) || n.info().has(ir::kChannelwise)) &&
         n.op() != ir::OpKind::kRelayout;
}

bool isNhwc(const ir::Value* v) {
  return v->type().layout == ir::Layout::kNHWC;
}

class Selector {
 public:
  Selector(ir::Graph& g, PassContext& ctx) : g_(g), ctx_(ctx) {}

  bool run() {
    for (ir::Node* n : g_.nodes()) visit(n);
    // Graph outputs keep the user's (plain) layout.
    std::vector<ir::Value*> outs = g_.outputs();
    for (auto& o : outs)
      if (isNhwc(o)) o = converted(o, ir::Layout::kPlain, nullptr);
    g_.setOutputs(outs);
    if (conversions_ > 0 || changed_)
      ctx_.remarks.push_back(
          "layout-selection: " + std::to_string(nhwcValues_) + " values channels-last, " +
          std::to_string(conversions_) + " layout conversions inserted" +
          (filterConversions_ > 0 ? ", " + std::to_string(filterConversions_) + " filters KRSC"
                                  : ""));
    ctx_.layoutConversions += conversions_;
    return changed_;
  }

 private:
  // `v` in layout `to`, through one relayout node per (value, layout), placed before `before`
  // (at the end when null). Filters' relayouts are counted apart: constant folding removes
  // them from inference graphs.
  ir::Value* converted(ir::Value* v, ir::Layout to, ir::Node* before, bool filter = false) {
    auto key = std::make_pair(v, to);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    auto r = g_.insertNode(before, ir::OpKind::kRelayout, {v},
                           {{"from", std::string(ir::layoutName(v->type().layout))},
                            {"to", std::string(ir::layoutName(to))}});
    if (!r) return v;  // Cannot happen for rank-4 f32 values; keep the graph valid regardless.
    ++(filter ? filterConversions_ : conversions_);
    changed_ = true;
    cache_[key] = (*r)->output();
    return (*r)->output();
  }

  void setLayout(ir::Value* v, ir::Layout l) {
    if (v->type().layout == l) return;
    ir::TensorType t = v->type();
    t.layout = l;
    v->setType(t);
    changed_ = true;
    if (l == ir::Layout::kNHWC) ++nhwcValues_;
  }

  // Whether some op reading `v` keeps it channels-last (a convolution, pooling or another
  // channels-last library op, or an elementwise op of its shape): a convolution whose output
  // only plain readers take would be a region of its own, which buys nothing but its two
  // conversions (the 3-D convolutions' conv2d between its stacking and its transposition:
  // oneDNN's NHWC kernels for [16,192,56,56] took 73 GFLOP/s where the plain call, blocked
  // inside oneDNN, takes 127 on an AVX2 Zen 3).
  bool keptChannelsLast(const ir::Value* v) const {
    for (const ir::Node* u : v->users())
      if (u->op() != ir::OpKind::kRelayout &&
          (channelsLastLibraryOp(*u) ||
           (elementwiseImage(*u) && u->output()->type().shape == v->type().shape)))
        return true;
    return false;
  }

  // A library op with a channels-last kernel for its output's dtype (convolution, pooling,
  // concat, and in training their gradients and BatchNorm's).
  bool channelsLastLibraryOp(const ir::Node& n) const {
    return n.info().has(ir::kChannelsLast) && n.outputs().size() == 1 &&
           ctx_.hasLibraryKernel(n.op(), n.output()->type().dtype, ir::Layout::kNHWC);
  }

  // An elementwise op with a float [N,C,H,W] output, which generated kernels run in any layout.
  static bool elementwiseImage(const ir::Node& n) {
    return isElementwiseOp(n) && n.output()->type().rank() == 4 &&
           ir::isFloat(n.output()->type().dtype);
  }

  void visit(ir::Node* n) {
    if (n->op() == ir::OpKind::kRelayout) return;
    const ir::OpInfo& info = n->info();
    auto activation = [&](int i) {  // Input i (the output when i < 0) is an activation.
      const ir::Value* v = i < 0 ? n->output() : n->input(static_cast<size_t>(i));
      return ir::isChannelsLastActivation(info, i, v->type().rank());
    };
    if (channelsLastLibraryOp(*n)) {
      // A convolution starts a region; the other ops (pooling, concat, the gradients of
      // convolution, pooling and BatchNorm) join one when one of their activations is in it.
      const bool conv = n->op() == ir::OpKind::kConv2d;
      bool anyNhwc = false;
      for (size_t i = 0; i < n->inputs().size(); ++i)
        anyNhwc = anyNhwc || (activation(static_cast<int>(i)) && isNhwc(n->input(i)));
      if ((conv && keptChannelsLast(n->output())) || anyNhwc) {
        for (size_t i = 0; i < n->inputs().size(); ++i)
          if (activation(static_cast<int>(i)) && !isNhwc(n->input(i)))
            n->replaceInput(i, converted(n->input(i), ir::Layout::kNHWC, n));
        // cuDNN's NHWC convolutions read KRSC filters: the weight [K,C,R,S] channels-last.
        if (conv && ctx_.channelsLastFilters && !isNhwc(n->input(1)))
          n->replaceInput(1, converted(n->input(1), ir::Layout::kNHWC, n, true));
        setLayout(n->output(), activation(-1) ? ir::Layout::kNHWC : ir::Layout::kPlain);
        return;
      }
    } else if (elementwiseImage(*n)) {
      const ir::Shape& outShape = n->output()->type().shape;
      bool anyNhwc = false;
      for (const ir::Value* in : n->inputs())
        anyNhwc = anyNhwc || (isNhwc(in) && in->type().shape == outShape);
      if (anyNhwc) {
        // Same-shape operands join the region; broadcast ones (and a channelwise op's
        // per-channel operands) are read through their strides.
        for (size_t i = 0; i < n->inputs().size(); ++i) {
          ir::Value* in = n->input(i);
          if (in->type().shape == outShape && !isNhwc(in) && ir::isFloat(in->type().dtype))
            n->replaceInput(i, converted(in, ir::Layout::kNHWC, n));
        }
        setLayout(n->output(), ir::Layout::kNHWC);
        return;
      }
    }
    // Everything else reads plain memory (reductions read any layout through their strides
    // and write plain, when their reduced dims are one contiguous run that a generated kernel
    // can walk; others run on reference kernels, which read plain memory).
    // An elementwise op that generated kernels do not take (a cast to an integer type,
    // integer arithmetic) runs on a reference kernel, which reads plain memory too.
    const bool stridedReader =
        notFusableReason(*n).empty() &&
        ((n->info().has(ir::kReduction) && ir::reducedRange(*n).first >= 0) || isElementwiseOp(*n));
    for (size_t i = 0; i < n->inputs().size(); ++i)
      if (isNhwc(n->input(i)) && !stridedReader)
        n->replaceInput(i, converted(n->input(i), ir::Layout::kPlain, n));
    for (ir::Value* o : n->outputs()) setLayout(o, ir::Layout::kPlain);
  }

  ir::Graph& g_;
  PassContext& ctx_;
  std::map<std::pair<ir::Value*, ir::Layout>, ir::Value*> cache_;
  int conversions_ = 0;
  int filterConversions_ = 0;
  int nhwcValues_ = 0;
  bool changed_ = false;
};

}  // namespace

bool LayoutSelection::run(ir::Graph& g, PassContext& ctx) {
  if (!ctx.channelsLast || !ctx.hasLibraryKernel) return false;
  return Selector(g, ctx).run();
}

}  // namespace kiln::passes
