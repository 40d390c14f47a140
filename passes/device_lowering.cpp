// Device lowering: on a backend that runs only generated kernels and library calls (a GPU), the
// ops the kernel IR cannot express as one kernel are rewritten into ops it can, so that they run
// on the device instead of on the host (with a copy each way):
//   - reductions over dims that are not adjacent (sum over N, H and W) become one reduction per
//     run of adjacent dims, innermost first (sum, mean and max nest exactly: the mean's groups
//     have equal sizes), and a convolution bias's gradient (conv2d_backward_bias) such sums;
//   - BatchNorm's training ops (batch_norm_stats, batch_norm_backward_reduce,
//     batch_norm_backward), whose per-channel reductions run over N and the spatial dims, become
//     two-level channel sums and pointwise formulas with per-channel broadcasts, the reference
//     kernels' formulas (runtime/reference/norm.cpp) in the graph's dtype.
// The CPU keeps the single ops: its reference kernels do each in one pass, accumulating in f64.
#include <algorithm>
#include <set>

#include "ir/fusion_group.h"
#include "passes/graph_builder.h"
#include "passes/pass.h"

namespace kiln::passes {

namespace {

using ir::OpKind;
using ir::Value;

// The runs of adjacent dims in `axes` (sorted), innermost run first.
std::vector<std::vector<int64_t>> adjacentRuns(const std::set<int64_t>& axes) {
  std::vector<std::vector<int64_t>> runs;
  for (int64_t a : axes) {
    if (runs.empty() || runs.back().back() + 1 != a) runs.emplace_back();
    runs.back().push_back(a);
  }
  std::reverse(runs.begin(), runs.end());
  return runs;
}

// reduce(x, axes) with `axes` not adjacent, as one reduction per adjacent run (keepdims, so the
// dims keep their numbers), then the reshape keepdims = 0 asks for.
Status splitReduction(ir::Graph& g, ir::Node* n) {
  const int rank = n->input(0)->type().rank();
  std::set<int64_t> axes;
  for (int64_t a : n->attr().getInts("axes")) axes.insert(a < 0 ? a + rank : a);
  GraphBuilder e(g, n, n, "split", "splitting " + n->describe());
  Value* v = n->input(0);
  for (const auto& run : adjacentRuns(axes)) {
    KILN_ASSIGN_OR_RETURN(v, e.op(n->op(), {v}, {{"axes", run}, {"keepdims", int64_t{1}}}));
  }
  KILN_ASSIGN_OR_RETURN(v, e.reshape(v, n->output()->type().shape));
  g.replaceAllUsesWith(n->output(), v);
  return Status::ok();
}

// Per-channel helpers for x [N, C, ...].
struct Channels {
  GraphBuilder& e;
  const ir::Shape& shape;  // x's.
  int64_t count() const { return ir::numElements(shape) / shape[1]; }

  // sum over every dim but 1: [N, C, ...] -> [C], the spatial dims first, then N.
  Expected<Value*> sum(Value* v) {
    const int rank = static_cast<int>(shape.size());
    if (rank > 2) {
      std::vector<int64_t> inner;
      for (int d = 2; d < rank; ++d) inner.push_back(d);
      KILN_ASSIGN_OR_RETURN(
          v, e.op(OpKind::kReduceSum, {v}, {{"axes", inner}, {"keepdims", int64_t{0}}}));
    }
    return e.op(OpKind::kReduceSum, {v},
                {{"axes", std::vector<int64_t>{0}}, {"keepdims", int64_t{0}}});
  }
  // [C] as [C, 1, ...], broadcasting against x.
  Expected<Value*> spread(Value* c) {
    ir::Shape s = {shape[1]};
    for (size_t d = 2; d < shape.size(); ++d) s.push_back(1);
    return e.reshape(c, s);
  }
  // 1 / sqrt(var + eps), [C].
  Expected<Value*> invStd(Value* var, double eps) {
    KILN_ASSIGN_OR_RETURN(Value * epsV, e.scalar(var->type().dtype, eps));
    KILN_ASSIGN_OR_RETURN(Value * shifted, e.op(OpKind::kAdd, {var, epsV}));
    return e.op(OpKind::kRsqrt, {shifted});
  }
  // (x - mean) * inv, [N, C, ...].
  Expected<Value*> normalized(Value* x, Value* mean, Value* inv) {
    KILN_ASSIGN_OR_RETURN(Value * m, spread(mean));
    KILN_ASSIGN_OR_RETURN(Value * i, spread(inv));
    KILN_ASSIGN_OR_RETURN(Value * d, e.op(OpKind::kSub, {x, m}));
    return e.op(OpKind::kMul, {d, i});
  }
  // [2, C] from two [C] rows.
  Expected<Value*> rows(Value* a, Value* b) {
    const ir::AttrMap first = {{"axes", std::vector<int64_t>{0}}};
    KILN_ASSIGN_OR_RETURN(Value * ra, e.op(OpKind::kUnsqueeze, {a}, first));
    KILN_ASSIGN_OR_RETURN(Value * rb, e.op(OpKind::kUnsqueeze, {b}, first));
    return e.op(OpKind::kConcat, {ra, rb}, {{"axis", int64_t{0}}});
  }
};

// batch_norm_stats(x) -> [mean; biased variance], the variance of x - mean (two passes).
Expected<Value*> lowerStats(GraphBuilder& e, ir::Node* n) {
  Value* x = n->input(0);
  Channels c{e, x->type().shape};
  const double inv = 1.0 / static_cast<double>(c.count());
  KILN_ASSIGN_OR_RETURN(Value * s, c.sum(x));
  KILN_ASSIGN_OR_RETURN(Value * mean, e.mulScalar(s, inv));
  KILN_ASSIGN_OR_RETURN(Value * m, c.spread(mean));
  KILN_ASSIGN_OR_RETURN(Value * d, e.op(OpKind::kSub, {x, m}));
  KILN_ASSIGN_OR_RETURN(Value * d2, e.op(OpKind::kMul, {d, d}));
  KILN_ASSIGN_OR_RETURN(Value * s2, c.sum(d2));
  KILN_ASSIGN_OR_RETURN(Value * var, e.mulScalar(s2, inv));
  return c.rows(mean, var);
}

// batch_norm_backward_reduce(grad, x, mean, var) -> [sum(grad xhat); sum(grad)].
Expected<Value*> lowerBackwardReduce(GraphBuilder& e, ir::Node* n) {
  Value* grad = n->input(0);
  Channels c{e, n->input(1)->type().shape};
  KILN_ASSIGN_OR_RETURN(Value * inv, c.invStd(n->input(3), n->attr().getFloat("epsilon")));
  KILN_ASSIGN_OR_RETURN(Value * xhat, c.normalized(n->input(1), n->input(2), inv));
  KILN_ASSIGN_OR_RETURN(Value * gx, e.op(OpKind::kMul, {grad, xhat}));
  KILN_ASSIGN_OR_RETURN(Value * sgx, c.sum(gx));
  KILN_ASSIGN_OR_RETURN(Value * sg, c.sum(grad));
  return c.rows(sgx, sg);
}

// batch_norm_backward(grad, x, mean, var, scale, sums) -> scale inv (grad - sums[1] / count -
// xhat sums[0] / count).
Expected<Value*> lowerBackward(GraphBuilder& e, ir::Node* n) {
  Value* grad = n->input(0);
  Channels c{e, n->input(1)->type().shape};
  const double inv = 1.0 / static_cast<double>(c.count());
  KILN_ASSIGN_OR_RETURN(Value * istd, c.invStd(n->input(3), n->attr().getFloat("epsilon")));
  KILN_ASSIGN_OR_RETURN(Value * xhat, c.normalized(n->input(1), n->input(2), istd));
  KILN_ASSIGN_OR_RETURN(Value * a, e.op(OpKind::kMul, {n->input(4), istd}));
  KILN_ASSIGN_OR_RETURN(Value * sgx, e.row(n->input(5), 0));
  KILN_ASSIGN_OR_RETURN(Value * sg, e.row(n->input(5), 1));
  KILN_ASSIGN_OR_RETURN(Value * meanGx, e.mulScalar(sgx, inv));
  KILN_ASSIGN_OR_RETURN(Value * meanG, e.mulScalar(sg, inv));
  KILN_ASSIGN_OR_RETURN(Value * mg, c.spread(meanG));
  KILN_ASSIGN_OR_RETURN(Value * mgx, c.spread(meanGx));
  KILN_ASSIGN_OR_RETURN(Value * t, e.op(OpKind::kMul, {xhat, mgx}));
  KILN_ASSIGN_OR_RETURN(Value * g1, e.op(OpKind::kSub, {grad, mg}));
  KILN_ASSIGN_OR_RETURN(Value * g2, e.op(OpKind::kSub, {g1, t}));
  KILN_ASSIGN_OR_RETURN(Value * as, c.spread(a));
  return e.op(OpKind::kMul, {as, g2});
}

bool lowersReduction(const ir::Node& n) {
  if (n.op() != OpKind::kReduceSum && n.op() != OpKind::kReduceMean && n.op() != OpKind::kReduceMax)
    return false;
  if (n.attr().getInts("axes").empty() || ir::reducedRange(n).first >= 0) return false;
  return ir::isFloat(n.input(0)->type().dtype);
}

// conv2d_backward_bias: its sum over N, H and W as two channel sums (Channels::sum).
bool lowersBiasGradient(const ir::Node& n) {
  return n.op() == OpKind::kConv2dBackwardBias && ir::isFloat(n.input(0)->type().dtype) &&
         n.input(0)->type().layout == ir::Layout::kPlain;
}

bool lowersBatchNorm(const ir::Node& n) {
  if (n.op() != OpKind::kBatchNormStats && n.op() != OpKind::kBatchNormBackwardReduce &&
      n.op() != OpKind::kBatchNormBackward)
    return false;
  const Value* x = n.input(n.op() == OpKind::kBatchNormStats ? 0 : 1);
  return x->type().rank() >= 2 && ir::isFloat(x->type().dtype) &&
         x->type().layout == ir::Layout::kPlain;
}

}  // namespace

bool DeviceLowering::run(ir::Graph& g, PassContext& ctx) {
  if (!ctx.lowerForDevice) return false;
  std::vector<ir::Node*> todo;
  for (ir::Node* n : g.nodes())
    if (lowersReduction(*n) || lowersBatchNorm(*n) || lowersBiasGradient(*n)) todo.push_back(n);
  std::set<const ir::Node*> lowered;
  for (ir::Node* n : todo) {
    Status st;
    if (lowersReduction(*n)) {
      st = splitReduction(g, n);
    } else if (lowersBiasGradient(*n)) {
      GraphBuilder e(g, n, n, "lowered", "lowering " + n->describe() + " for the device");
      Expected<Value*> v = Channels{e, n->input(0)->type().shape}.sum(n->input(0));
      st = v.status();
      if (v) g.replaceAllUsesWith(n->output(), *v);
    } else {
      GraphBuilder e(g, n, n, "lowered", "lowering " + n->describe() + " for the device");
      Expected<Value*> v = n->op() == OpKind::kBatchNormStats            ? lowerStats(e, n)
                           : n->op() == OpKind::kBatchNormBackwardReduce ? lowerBackwardReduce(e, n)
                                                                         : lowerBackward(e, n);
      st = v.status();
      if (v) g.replaceAllUsesWith(n->output(), *v);
    }
    if (!st) {
      ctx.remarks.push_back("device-lowering: " + st.message());
      continue;
    }
    lowered.insert(n);
  }
  g.removeNodesIf([&](const ir::Node& n) { return lowered.count(&n) > 0; });
  if (lowered.empty()) return false;
  // A row read back from the [2, C] pair (GraphBuilder::row's slice) is the row itself: the
  // concat (which no kernel runs) then has no reader left, and dce removes it.
  std::set<const ir::Node*> bypassed;
  for (ir::Node* n : g.nodes()) {
    if (n->op() != OpKind::kSlice) continue;
    const ir::Node* c = n->input(0)->producer();
    if (!c || c->op() != OpKind::kConcat || c->attr().getInt("axis") != 0 ||
        n->attr().getInts("axes") != std::vector<int64_t>{0} || !n->attr().getInts("steps").empty())
      continue;
    const int64_t r = n->attr().getInts("starts")[0];
    if (r < 0 || r >= static_cast<int64_t>(c->inputs().size()) ||
        n->attr().getInts("ends")[0] != r + 1 || c->input(r)->type() != n->output()->type())
      continue;
    g.replaceAllUsesWith(n->output(), c->input(r));
    bypassed.insert(n);
  }
  g.removeNodesIf([&](const ir::Node& n) { return bypassed.count(&n) > 0; });
  return true;
}

}  // namespace kiln::passes
