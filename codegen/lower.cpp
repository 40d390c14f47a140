#include "codegen/lower.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <unordered_map>

namespace kiln::codegen {

namespace {

using ir::OpKind;

// A strided view of a buffer: element (i0..ik) of the view is buffer[offset + sum(i*strides)].
struct View {
  int arg = 0;
  int64_t offset = 0;
  ir::Shape shape;
  std::vector<int64_t> strides;
};

bool isContiguous(const View& v) {
  return v.strides == ir::contiguousStrides(v.shape);
}

class Lowerer {
 public:
  Lowerer(const ir::FusionGroup& g, const std::unordered_set<const ir::Value*>& outs,
          std::string name)
      : group_(g), graphOutputs_(outs) {
    kernel_.name = std::move(name);
    for (const ir::Node* n : g.nodes) inGroup_.insert(n);
  }

  Expected<Kernel> run() {
    KILN_TRY(setUpDomain());
    for (const ir::Node* n : group_.nodes) {
      if (ir::isViewOp(*n) && group_.kind != ir::GroupKind::kView) continue;
      if (group_.kind == ir::GroupKind::kView) break;
      KILN_TRY(lowerNode(*n));
    }
    if (group_.kind == ir::GroupKind::kView) {
      // A copy kernel: load the chain's end through its strides, store it contiguously.
      const ir::Value* out = group_.nodes.back()->output();
      KILN_ASSIGN_OR_RETURN(View v, viewOf(out));
      KILN_ASSIGN_OR_RETURN(int e, load(v, false, out->type().dtype));
      KILN_TRY(addStore(out, e, false));
    } else {
      for (const ir::Node* n : group_.nodes) {
        if (ir::isViewOp(*n)) continue;
        const ir::Value* v = n->output();
        bool needed = graphOutputs_.count(v) > 0;
        for (const ir::Node* u : v->users()) needed = needed || !inGroup_.count(u);
        if (needed) KILN_TRY(addStore(v, exprOf_.at(v), rowLevel_.count(n) > 0));
      }
    }
    KILN_TRY(coalesce());
    return std::move(kernel_);
  }

 private:
  Status setUpDomain() {
    if (group_.anchor) {
      domain_ = group_.anchor->input(0)->type().shape;
      std::tie(ra_, rb_) = ir::reducedRange(*group_.anchor);
      rowAnchor_ = !group_.anchor->info().has(ir::kRowBroadcast);
      if (rowAnchor_) rowShape_ = group_.anchor->output()->type().shape;
      int64_t r = 1;
      for (int d = ra_; d < rb_; ++d) r *= domain_[d];
      if (r == 0) return unimplemented("a reduction over an empty dim");
      reduceCount_ = r;
    } else {
      domain_ = group_.nodes.back()->output()->type().shape;
    }
    if (domain_.empty()) domain_ = {1};  // A scalar kernel runs one element.
    return Status::ok();
  }

  int argFor(const ir::Value* v, ir::DType dtype, bool output) {
    auto key = std::make_pair(v, output);
    if (auto it = argIndex_.find(key); it != argIndex_.end()) return it->second;
    KernelArg a;
    a.value = v->name();
    a.type = *scalarTypeOf(dtype);
    a.output = output;
    kernel_.args.push_back(a);
    argIndex_[key] = static_cast<int>(kernel_.args.size() - 1);
    return argIndex_[key];
  }

  // The view through which the group reads `v`: a chain of in-group views over a buffer.
  Expected<View> viewOf(const ir::Value* v) {
    const ir::Node* p = v->producer();
    if (!p || !inGroup_.count(p) || !ir::isViewOp(*p)) {
      View b;
      KILN_TRY(scalarTypeOf(v->type().dtype).status());
      b.arg = argFor(v, v->type().dtype, false);
      b.shape = v->type().shape;
      b.strides = v->type().memoryStrides();
      return b;
    }
    KILN_ASSIGN_OR_RETURN(View in, viewOf(p->input(0)));
    View out = in;
    out.shape = v->type().shape;
    const auto a = p->attr();
    switch (p->op()) {
      case OpKind::kReshape:
      case OpKind::kFlatten:
      case OpKind::kSqueeze:
      case OpKind::kUnsqueeze:
        if (!isContiguous(in)) return unimplemented("reshape of a strided view");
        out.strides = ir::contiguousStrides(out.shape);
        break;
      case OpKind::kTranspose: {
        std::vector<int64_t> perm = a.getInts("perm");
        if (perm.empty())
          for (int i = static_cast<int>(in.shape.size()); i-- > 0;) perm.push_back(i);
        out.strides.clear();
        for (int64_t p2 : perm) out.strides.push_back(in.strides[p2]);
        break;
      }
      case OpKind::kExpand:
        out.strides = broadcastStrides(in, out.shape);
        break;
      case OpKind::kSlice: {
        std::vector<int64_t> axes = a.getInts("axes"), steps = a.getInts("steps");
        const auto& starts = a.getInts("starts");
        if (axes.empty())
          for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
        if (steps.empty()) steps.assign(starts.size(), 1);
        for (size_t i = 0; i < starts.size(); ++i) {
          const int rank = static_cast<int>(in.shape.size());
          const int ax = static_cast<int>(axes[i] < 0 ? axes[i] + rank : axes[i]);
          const int64_t dim = in.shape[ax];
          int64_t s = starts[i] < 0 ? starts[i] + dim : starts[i];
          s = steps[i] > 0 ? std::clamp<int64_t>(s, 0, dim)
                           : std::clamp<int64_t>(s, 0, std::max<int64_t>(dim - 1, 0));
          if (out.shape[ax] > 0) out.offset += s * in.strides[ax];
          out.strides[ax] = in.strides[ax] * steps[i];
        }
        break;
      }
      default:
        return internalError("not a view op: " + std::string(ir::opName(p->op())));
    }
    return out;
  }

  // Strides that read `v` broadcast (NumPy, right-aligned) to `target`.
  static std::vector<int64_t> broadcastStrides(const View& v, const ir::Shape& target) {
    std::vector<int64_t> st(target.size(), 0);
    const size_t off = target.size() - v.shape.size();
    for (size_t i = 0; i < v.shape.size(); ++i)
      st[off + i] = v.shape[i] == 1 && target[off + i] != 1 ? 0 : v.strides[i];
    return st;
  }

  // Maps strides over the row shape (a reduce's output) to strides over the domain.
  std::vector<int64_t> rowToDomain(const std::vector<int64_t>& rowStrides) const {
    std::vector<int64_t> st(domain_.size(), 0);
    const bool keepdims = rowShape_.size() == domain_.size();
    size_t src = 0;
    for (int d = 0; d < static_cast<int>(domain_.size()); ++d) {
      const bool reduced = d >= ra_ && d < rb_;
      if (reduced) {
        if (keepdims) ++src;
        continue;
      }
      st[d] = rowStrides[src++];
    }
    return st;
  }

  Expected<int> load(const View& v, bool row, ir::DType dtype) {
    Access acc;
    acc.arg = v.arg;
    acc.offset = v.offset;
    const ir::Shape& target = row ? rowShape_ : domain_;
    if (v.shape.size() > target.size())
      return internalError("load of " + ir::shapeToString(v.shape) + " into " +
                           ir::shapeToString(target));
    acc.strides = broadcastStrides(v, target);
    if (row) acc.strides = rowToDomain(acc.strides);
    for (size_t i = 0; i < kernel_.loads.size(); ++i)
      if (kernel_.loads[i] == acc) return loadValue_[i];
    kernel_.loads.push_back(acc);
    Expr e;
    e.kind = ExprKind::kLoad;
    KILN_ASSIGN_OR_RETURN(e.type, scalarTypeOf(dtype));
    e.load = static_cast<int>(kernel_.loads.size() - 1);
    e.row = invariantAlongReduction(acc.strides);
    const ScalarType stored = e.type;
    int value = push(e);
    // f16/bf16 are computed on as f32 (widening is exact).
    if (isHalf(stored)) value = call(widenFn(stored), {value}, ScalarType::kF32);
    loadValue_.push_back(value);
    return value;
  }

  static const char* widenFn(ScalarType t) {
    return t == ScalarType::kF16 ? "kiln_f16_to_f32" : "kiln_bf16_to_f32";
  }

  bool invariantAlongReduction(const std::vector<int64_t>& strides) const {
    if (ra_ < 0) return false;
    for (int d = ra_; d < rb_; ++d)
      if (strides[d] != 0 && domain_[d] != 1) return false;
    return true;
  }

  int push(Expr e) {
    kernel_.exprs.push_back(std::move(e));
    return static_cast<int>(kernel_.exprs.size() - 1);
  }

  int constant(double v, ScalarType t) {
    Expr e;
    e.kind = ExprKind::kConst;
    e.type = t;
    e.value = v;
    e.row = true;
    return push(e);
  }

  int call(std::string fn, std::vector<int> args, ScalarType t) {
    Expr e;
    e.kind = ExprKind::kCall;
    e.fn = std::move(fn);
    e.type = t;
    e.row = true;
    for (int a : args) e.row = e.row && kernel_.exprs[a].row;
    e.args = std::move(args);
    return push(e);
  }

  int stage(int value, ReduceOp op) {
    kernel_.stages.push_back({value, op});
    Expr e;
    e.kind = ExprKind::kStage;
    e.type = kernel_.exprs[value].type;
    e.stage = static_cast<int>(kernel_.stages.size() - 1);
    e.row = true;
    return push(e);
  }

  // The expression for input `i` of node `n` (row: n is computed once per row).
  Expected<int> operand(const ir::Node& n, size_t i, bool row) {
    const ir::Value* v = n.input(i);
    const ir::Node* p = v->producer();
    if (p && inGroup_.count(p) && !ir::isViewOp(*p)) return exprOf_.at(v);
    KILN_ASSIGN_OR_RETURN(View view, viewOf(v));
    if (n.info().has(ir::kChannelwise) && i > 0) {
      // Per-channel parameters [C] broadcast along dim 1 of [N,C,...]: view them as [C,1,..].
      const size_t trailing = n.input(0)->type().shape.size() - 2;
      for (size_t t = 0; t < trailing; ++t) {
        view.shape.push_back(1);
        view.strides.push_back(0);
      }
    }
    return load(view, row, v->type().dtype);
  }

  Status lowerNode(const ir::Node& n) {
    const bool row = isRowLevel(n);
    if (row) rowLevel_.insert(&n);
    std::vector<int> in;
    // A row-level anchor reads its data element by element; everything else reads at its
    // own level.
    for (size_t i = 0; i < n.inputs().size(); ++i) {
      KILN_ASSIGN_OR_RETURN(int e, operand(n, i, row && &n != group_.anchor));
      in.push_back(e);
    }
    KILN_ASSIGN_OR_RETURN(ScalarType stored, scalarTypeOf(n.output()->type().dtype));
    const ScalarType t = computeType(stored);
    KILN_ASSIGN_OR_RETURN(int out, buildOp(n, in, t));
    // An op with an f16/bf16 result rounds it once, as the reference kernels do; later ops in
    // the kernel read the rounded value.
    if (isHalf(stored))
      out = call(stored == ScalarType::kF16 ? "kiln_round_f16" : "kiln_round_bf16", {out}, t);
    exprOf_[n.output()] = out;
    return Status::ok();
  }

  bool isRowLevel(const ir::Node& n) const {
    if (!rowAnchor_) return false;
    if (&n == group_.anchor) return true;
    if (n.output()->type().shape != rowShape_) return false;
    bool anyRow = false;
    for (const ir::Value* v : n.inputs()) {
      const ir::Node* p = v->producer();
      if (!p || !inGroup_.count(p) || ir::isViewOp(*p)) continue;
      if (!rowLevel_.count(p)) return false;
      anyRow = true;
    }
    return anyRow;
  }

  Expected<int> buildOp(const ir::Node& n, const std::vector<int>& in, ScalarType t) {
    const auto a = n.attr();
    auto unary = [&](const char* fn) { return call(fn, {in[0]}, t); };
    auto binary = [&](const char* fn) { return call(fn, {in[0], in[1]}, t); };
    switch (n.op()) {
      case OpKind::kDropout:
      case OpKind::kRelayout:  // Layouts live in the accesses' strides.
        return in[0];
      case OpKind::kGelu:
        return unary(a.getString("approximate") == "tanh" ? "kiln_gelu_tanh" : "kiln_gelu");
      case OpKind::kCast: {
        // To f16/bf16 the kernel converts through f32: exact only from types f32 holds exactly
        // (the reference rounds f64 and wide integers once, directly).
        const ScalarType from = kernel_.exprs[in[0]].type;
        if (isHalf(*scalarTypeOf(n.output()->type().dtype)) && from != ScalarType::kF32 &&
            from != ScalarType::kI8 && from != ScalarType::kU8 && from != ScalarType::kBool)
          return unimplemented("cast from " + std::string(scalarTypeName(from)) + " to " +
                               std::string(ir::dtypeName(n.output()->type().dtype)) +
                               " (rounded twice through f32)");
        Expr e;
        e.kind = ExprKind::kCast;
        e.type = t;
        e.args = {in[0]};
        e.row = kernel_.exprs[in[0]].row;
        return push(e);
      }
      case OpKind::kGeluBackward:
        return binary(a.getString("approximate") == "tanh" ? "kiln_gelu_tanh_backward"
                                                           : "kiln_gelu_backward");
      case OpKind::kWhere: {
        Expr e;
        e.kind = ExprKind::kSelect;
        e.type = t;
        e.args = in;
        e.row = kernel_.exprs[in[0]].row && kernel_.exprs[in[1]].row && kernel_.exprs[in[2]].row;
        return push(e);
      }
      case OpKind::kBatchNorm:
      case OpKind::kBatchNormTrain:
        return call("kiln_batch_norm",
                    {in[0], in[1], in[2], in[3], in[4], constant(a.getFloat("epsilon"), t)}, t);
      case OpKind::kSoftmax:
      case OpKind::kLogSoftmax: {
        const int m = stage(in[0], ReduceOp::kMax);
        const int shifted = call("kiln_sub", {in[0], m}, t);
        // One expression for the exponential that the sum and the output both read: the CPU
        // renderer then stores it during the sum and reads it back (Printer::spillOf).
        // The argument is at most 0 (or NaN): the cheaper exponential.
        const int ex = call("kiln_exp_nonpos", {shifted}, t);
        const int s = stage(ex, ReduceOp::kSum);
        // Each element times the row's reciprocal (computed once a row), as PyTorch's CPU
        // softmax: a division an element held the 4096-wide rows of `kiln bench-kernels` at
        // 43% of copy bandwidth.
        if (n.op() == OpKind::kSoftmax)
          return call("kiln_mul", {ex, call("kiln_div", {constant(1.0, t), s}, t)}, t);
        return call("kiln_sub", {shifted, call("kiln_log", {s}, t)}, t);
      }
      case OpKind::kLayerNorm: {
        const int count = constant(static_cast<double>(reduceCount_), t);
        const int mean = call("kiln_div", {stage(in[0], ReduceOp::kSum), count}, t);
        const int centered = call("kiln_sub", {in[0], mean}, t);
        const int var =
            call("kiln_div",
                 {stage(call("kiln_mul", {centered, centered}, t), ReduceOp::kSum), count}, t);
        const int sd =
            call("kiln_sqrt", {call("kiln_add", {var, constant(a.getFloat("epsilon"), t)}, t)}, t);
        int y = call("kiln_div", {centered, sd}, t);
        if (in.size() > 1) y = call("kiln_mul", {y, in[1]}, t);
        if (in.size() > 2) y = call("kiln_add", {y, in[2]}, t);
        return y;
      }
      case OpKind::kReduceSum:
        return stage(in[0], ReduceOp::kSum);
      case OpKind::kReduceMax:
        return stage(in[0], ReduceOp::kMax);
      case OpKind::kReduceMean:
      case OpKind::kGlobalAvgPool:
        return call("kiln_div",
                    {stage(in[0], ReduceOp::kSum), constant(static_cast<double>(reduceCount_), t)},
                    t);
      default:
        break;
    }
    if (!n.info().has(ir::kPointwise))
      return unimplemented("op '" + std::string(ir::opName(n.op())) + "' has no kernel form");
    // Every other pointwise op is the prelude's function named after it (codegen/prelude.cpp:
    // kiln_<op name>), called with the op's inputs and then its float attributes in schema
    // order: relu -> kiln_relu(x), clip -> kiln_clip(x, min, max).
    std::vector<int> args = in;
    for (const ir::AttrSpec& spec : n.info().attrs) {
      if (spec.kind != ir::AttrKind::kFloat)
        return internalError("op '" + std::string(ir::opName(n.op())) + "': attribute '" +
                             spec.name + "' is not a float; lower it in buildOp");
      args.push_back(constant(a.getFloat(spec.name), t));
    }
    return call("kiln_" + std::string(ir::opName(n.op())), std::move(args), t);
  }

  Status addStore(const ir::Value* v, int expr, bool row) {
    Store s;
    s.value = expr;
    s.row = row;
    s.access.arg = argFor(v, v->type().dtype, true);
    if (row) {
      s.access.strides =
          rowToDomain(ir::TensorType{v->type().dtype, rowShape_, v->type().layout}.memoryStrides());
    } else if (v->type().shape == domain_) {
      s.access.strides = v->type().memoryStrides();
    } else if (v->type().shape.empty() && domain_ == ir::Shape{1}) {
      s.access.strides = {1};
    } else {
      return internalError("store of " + v->type().toString() + " in domain " +
                           ir::shapeToString(domain_));
    }
    kernel_.stores.push_back(s);
    return Status::ok();
  }

  // Drops size-1 dims and merges adjacent dims that every access walks contiguously.
  Status coalesce() {
    std::vector<std::vector<int64_t>*> strides;
    for (auto& l : kernel_.loads) strides.push_back(&l.strides);
    for (auto& s : kernel_.stores) strides.push_back(&s.access.strides);
    auto reducedDim = [&](int d) { return d >= ra_ && d < rb_; };
    // Keep one reduced dim even when all reduced dims have size 1.
    int keepReduced = -1;
    if (ra_ >= 0) {
      keepReduced = ra_;
      for (int d = ra_; d < rb_; ++d)
        if (domain_[d] != 1) keepReduced = d;
    }
    // Without a reduction every element is independent: walk the domain in the memory order of
    // the first store (outermost = largest stride), so that a channels-last tensor is one
    // contiguous loop rather than a loop over channels with a strided inner loop.
    std::vector<int> order(domain_.size());
    std::iota(order.begin(), order.end(), 0);
    if (ra_ < 0 && !kernel_.stores.empty()) {
      const std::vector<int64_t>& out = kernel_.stores.front().access.strides;
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return out[a] > out[b]; });
    }
    std::vector<int64_t> dims;
    std::vector<bool> reduced;
    std::vector<std::vector<int64_t>> st(strides.size());
    for (int d : order) {
      if (domain_[d] == 1 && d != keepReduced) continue;
      const bool r = reducedDim(d);
      bool merge = !dims.empty() && reduced.back() == r && !(r && domain_[d] == 1);
      for (size_t k = 0; merge && k < strides.size(); ++k)
        merge = st[k].back() == (*strides[k])[d] * domain_[d];
      if (merge) {
        dims.back() *= domain_[d];
        for (size_t k = 0; k < strides.size(); ++k) st[k].back() = (*strides[k])[d];
      } else {
        dims.push_back(domain_[d]);
        reduced.push_back(r);
        for (size_t k = 0; k < strides.size(); ++k) st[k].push_back((*strides[k])[d]);
      }
    }
    if (dims.empty()) {
      dims.push_back(1);
      reduced.push_back(false);
      for (size_t k = 0; k < strides.size(); ++k) st[k].push_back(0);
    }
    for (size_t k = 0; k < strides.size(); ++k) *strides[k] = st[k];
    kernel_.domain = dims;
    kernel_.reduceDim = -1;
    if (ra_ >= 0) {
      const auto n = std::count(reduced.begin(), reduced.end(), true);
      if (n != 1) return unimplemented("the reduced dims do not coalesce into one");
      kernel_.reduceDim =
          static_cast<int>(std::find(reduced.begin(), reduced.end(), true) - reduced.begin());
    }
    return Status::ok();
  }

  const ir::FusionGroup& group_;
  const std::unordered_set<const ir::Value*>& graphOutputs_;
  Kernel kernel_;
  ir::Shape domain_, rowShape_;
  int ra_ = -1, rb_ = -1;
  bool rowAnchor_ = false;
  int64_t reduceCount_ = 1;
  std::unordered_set<const ir::Node*> inGroup_;
  std::unordered_set<const ir::Node*> rowLevel_;
  std::unordered_map<const ir::Value*, int> exprOf_;
  std::vector<int> loadValue_;  // Per load: the expression that reads it (widened for halves).
  std::map<std::pair<const ir::Value*, bool>, int> argIndex_;
};

}  // namespace

Expected<Kernel> lowerGroup(const ir::FusionGroup& group,
                            const std::unordered_set<const ir::Value*>& graphOutputs,
                            std::string name) {
  if (group.kind != ir::GroupKind::kPointwise && group.kind != ir::GroupKind::kReduction &&
      group.kind != ir::GroupKind::kView)
    return internalError("lowerGroup: group " + std::to_string(group.id) + " is a " +
                         std::string(ir::groupKindName(group.kind)) + " group");
  return Lowerer(group, graphOutputs, std::move(name)).run();
}

}  // namespace kiln::codegen
