// Shape inference for library ops (matmul, gemm, linear, conv, pooling), normalization,
// reductions and losses.
#include <algorithm>
#include <set>

#include "ir/conv_algo.h"
#include "ir/infer.h"

namespace kiln::ir {

namespace {
std::string dims(const Shape& s) {
  return shapeToString(s);
}

Status requireSameDType(const TensorType& a, const TensorType& b, const char* what) {
  if (a.dtype != b.dtype)
    return invalidArgument(std::string(what) + " must have dtype " +
                           std::string(dtypeName(a.dtype)) + ", got " + b.toString());
  return Status::ok();
}

Status requireShape(const TensorType& t, const Shape& expected, const char* what) {
  if (t.shape != expected)
    return invalidArgument(std::string(what) + " must have shape " + dims(expected) + ", got " +
                           dims(t.shape));
  return Status::ok();
}

// `t` (named `what`) laid out as `ref`: a gradient as the activation it belongs to.
Status requireSameLayout(const TensorType& t, const TensorType& ref, const char* what) {
  if (t.layout != ref.layout)
    return invalidArgument(std::string(what) + " must be " + std::string(layoutName(ref.layout)) +
                           " as the input " + ref.toString() + ", got " + t.toString());
  return Status::ok();
}

Status requireLen(const std::vector<int64_t>& v, size_t n, const char* what) {
  if (v.size() != n)
    return invalidArgument(std::string("attribute ") + what + " must have " + std::to_string(n) +
                           " values, got " + std::to_string(v.size()));
  return Status::ok();
}
}  // namespace

Expected<int64_t> windowOutputSize(int64_t in, int64_t kernel, int64_t stride, int64_t padBegin,
                                   int64_t padEnd, int64_t dilation, bool ceilMode,
                                   const char* dimName) {
  if (kernel < 1 || stride < 1 || dilation < 1 || padBegin < 0 || padEnd < 0)
    return invalidArgument(std::string(dimName) +
                           ": kernel, stride and dilation must be >= 1 and pads >= 0");
  // Attribute values come from user files: reject sizes whose arithmetic would overflow.
  int64_t span = 0, padded = 0;
  if (__builtin_mul_overflow(dilation, kernel - 1, &span) ||
      __builtin_add_overflow(span, 1, &span) || __builtin_add_overflow(in, padBegin, &padded) ||
      __builtin_add_overflow(padded, padEnd, &padded))
    return invalidArgument(std::string(dimName) + ": kernel " + std::to_string(kernel) +
                           ", stride " + std::to_string(stride) + ", pads " +
                           std::to_string(padBegin) + "+" + std::to_string(padEnd) +
                           " and dilation " + std::to_string(dilation) +
                           " are too large for input of " + std::to_string(in));
  const int64_t avail = padded - span;
  if (avail < 0)
    return invalidArgument(std::string(dimName) + ": window of " + std::to_string(span) +
                           " does not fit input of " + std::to_string(in) + " with pads " +
                           std::to_string(padBegin) + "+" + std::to_string(padEnd));
  int64_t out = avail / stride + (ceilMode && avail % stride != 0 ? 1 : 0) + 1;
  // As in PyTorch: the last window must start inside the input or the left padding.
  int64_t lastStart = 0;
  if (ceilMode &&
      (__builtin_mul_overflow(out - 1, stride, &lastStart) || lastStart >= in + padBegin))
    --out;
  return out;
}

Expected<std::vector<TensorType>> inferDet(std::span<const TensorType> in, const AttrView&) {
  if (in[0].dtype != DType::kF32 && in[0].dtype != DType::kF64)
    return invalidArgument("input must be f32 or f64, got " + in[0].toString());
  const Shape& x = in[0].shape;
  if (x.size() < 2 || x[x.size() - 1] != x[x.size() - 2])
    return invalidArgument("input must be square matrices [..., M, M], got " + in[0].toString());
  return one({in[0].dtype, Shape(x.begin(), x.end() - 2)});
}

Expected<std::vector<TensorType>> inferMatMul(std::span<const TensorType> in, const AttrView&) {
  KILN_TRY(requireNumeric(in[0], "A"));
  KILN_TRY(requireSameDType(in[0], in[1], "B"));
  Shape a = in[0].shape, b = in[1].shape;
  if (a.empty() || b.empty()) return invalidArgument("matmul operands must have rank >= 1");
  const bool aVec = a.size() == 1, bVec = b.size() == 1;
  if (aVec) a.insert(a.begin(), 1);
  if (bVec) b.push_back(1);
  const int64_t k1 = a.back(), k2 = b[b.size() - 2];
  if (k1 != k2)
    return invalidArgument("inner dimensions differ: A " + dims(in[0].shape) + " x B " +
                           dims(in[1].shape) + " (" + std::to_string(k1) + " vs " +
                           std::to_string(k2) + ")");
  KILN_ASSIGN_OR_RETURN(
      Shape batch, broadcastShapes(Shape(a.begin(), a.end() - 2), Shape(b.begin(), b.end() - 2)));
  Shape out = batch;
  if (!aVec) out.push_back(a[a.size() - 2]);
  if (!bVec) out.push_back(b.back());
  return one({in[0].dtype, out, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferGemm(std::span<const TensorType> in, const AttrView& a) {
  KILN_TRY(requireFloat(in[0], "A"));
  KILN_TRY(requireRank(in[0], 2, "A"));
  KILN_TRY(requireRank(in[1], 2, "B"));
  KILN_TRY(requireSameDType(in[0], in[1], "B"));
  const bool ta = a.getInt("transA") != 0, tb = a.getInt("transB") != 0;
  const int64_t m = ta ? in[0].shape[1] : in[0].shape[0];
  const int64_t k = ta ? in[0].shape[0] : in[0].shape[1];
  const int64_t kb = tb ? in[1].shape[1] : in[1].shape[0];
  const int64_t n = tb ? in[1].shape[0] : in[1].shape[1];
  if (k != kb)
    return invalidArgument("inner dimensions differ: op(A) is [" + std::to_string(m) + "," +
                           std::to_string(k) + "], op(B) is [" + std::to_string(kb) + "," +
                           std::to_string(n) + "]");
  if (in.size() == 3) {
    KILN_TRY(requireSameDType(in[0], in[2], "C"));
    KILN_ASSIGN_OR_RETURN(Shape s, broadcastShapes(in[2].shape, Shape{m, n}));
    if (s != Shape{m, n})
      return invalidArgument("C " + dims(in[2].shape) + " does not broadcast to [" +
                             std::to_string(m) + "," + std::to_string(n) + "]");
  }
  return one({in[0].dtype, {m, n}, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferLinear(std::span<const TensorType> in, const AttrView&) {
  KILN_TRY(requireFloat(in[0], "input"));
  if (in[0].rank() < 1) return invalidArgument("input must have rank >= 1");
  KILN_TRY(requireRank(in[1], 2, "weight"));
  KILN_TRY(requireSameDType(in[0], in[1], "weight"));
  const int64_t inF = in[0].shape.back(), outF = in[1].shape[0];
  if (in[1].shape[1] != inF)
    return invalidArgument("weight must have shape [out," + std::to_string(inF) + "], got " +
                           dims(in[1].shape));
  if (in.size() == 3) {
    KILN_TRY(requireSameDType(in[0], in[2], "bias"));
    KILN_TRY(requireShape(in[2], {outF}, "bias"));
  }
  TensorType t = in[0];
  t.shape.back() = outF;
  t.layout = Layout::kPlain;
  return one(t);
}

Expected<std::vector<TensorType>> inferConv2d(std::span<const TensorType> in, const AttrView& a) {
  KILN_TRY(requireFloat(in[0], "input"));
  KILN_TRY(requireRank(in[0], 4, "input [N,C,H,W]"));
  KILN_TRY(requireRank(in[1], 4, "weight [M,C/group,kh,kw]"));
  KILN_TRY(requireSameDType(in[0], in[1], "weight"));
  const auto& st = a.getInts("strides");
  const auto& pads = a.getInts("pads");
  const auto& dil = a.getInts("dilations");
  KILN_TRY(requireLen(st, 2, "strides"));
  KILN_TRY(requireLen(pads, 4, "pads"));
  KILN_TRY(requireLen(dil, 2, "dilations"));
  const std::string& algo = a.getString("algo");
  if (!parseConvAlgo(algo)) {
    std::string names;
    for (int k = 0; k <= static_cast<int>(ConvAlgo::kLast); ++k)
      names += (k ? ", " : "") + std::string(convAlgoName(static_cast<ConvAlgo>(k)));
    return invalidArgument("attribute algo must be one of " + names + "; got \"" + algo + "\"");
  }
  const int64_t group = a.getInt("group");
  const Shape& x = in[0].shape;
  const Shape& w = in[1].shape;
  if (group < 1 || x[1] % group != 0 || w[0] % group != 0)
    return invalidArgument("group " + std::to_string(group) + " must divide input channels " +
                           std::to_string(x[1]) + " and output channels " + std::to_string(w[0]));
  int64_t weightChannels = 0;
  if (__builtin_mul_overflow(w[1], group, &weightChannels))
    return invalidArgument("weight " + dims(w) + " with group " + std::to_string(group) +
                           " expects more input channels than int64 holds");
  if (weightChannels != x[1])
    return invalidArgument("weight " + dims(w) + " expects " + std::to_string(weightChannels) +
                           " input channels (group " + std::to_string(group) + "), input " +
                           dims(x) + " has " + std::to_string(x[1]));
  if (in.size() == 3) {
    KILN_TRY(requireSameDType(in[0], in[2], "bias"));
    KILN_TRY(requireShape(in[2], {w[0]}, "bias"));
  }
  KILN_ASSIGN_OR_RETURN(
      int64_t oh, windowOutputSize(x[2], w[2], st[0], pads[0], pads[2], dil[0], false, "height"));
  KILN_ASSIGN_OR_RETURN(
      int64_t ow, windowOutputSize(x[3], w[3], st[1], pads[1], pads[3], dil[1], false, "width"));
  return one({in[0].dtype, {x[0], w[0], oh, ow}, in[0].layout});
}

Expected<std::vector<TensorType>> inferPool2d(std::span<const TensorType> in, const AttrView& a) {
  KILN_TRY(requireFloat(in[0], "input"));
  KILN_TRY(requireRank(in[0], 4, "input [N,C,H,W]"));
  const auto& k = a.getInts("kernel");
  const auto& st = a.getInts("strides");
  const auto& pads = a.getInts("pads");
  KILN_TRY(requireLen(k, 2, "kernel"));
  KILN_TRY(requireLen(st, 2, "strides"));
  KILN_TRY(requireLen(pads, 4, "pads"));
  std::vector<int64_t> dil{1, 1};
  if (a.op().findAttr("dilations")) {
    dil = a.getInts("dilations");
    KILN_TRY(requireLen(dil, 2, "dilations"));
  }
  // As in PyTorch: each pad is at most half the dilated window, so that no window lies wholly
  // in the padding (those would have no valid element to take the max or mean of).
  for (int i = 0; i < 2; ++i) {
    int64_t span = 0;
    if (k[i] < 1 || dil[i] < 1 || __builtin_mul_overflow(dil[i], k[i] - 1, &span))
      return invalidArgument("kernel " + dims(k) + " and dilations " + dims(dil) +
                             " must be >= 1 and not overflow");
    const int64_t maxPad = maxPoolPad(k[i], dil[i]);
    if (pads[i] > maxPad || pads[i + 2] > maxPad)
      return invalidArgument("pads " + dims(pads) + " must be at most half the window (kernel " +
                             dims(k) + ", dilations " + dims(dil) + ")");
  }
  const bool ceil = a.getInt("ceil_mode") != 0;
  const Shape& x = in[0].shape;
  KILN_ASSIGN_OR_RETURN(
      int64_t oh, windowOutputSize(x[2], k[0], st[0], pads[0], pads[2], dil[0], ceil, "height"));
  KILN_ASSIGN_OR_RETURN(
      int64_t ow, windowOutputSize(x[3], k[1], st[1], pads[1], pads[3], dil[1], ceil, "width"));
  return one({in[0].dtype, {x[0], x[1], oh, ow}, in[0].layout});
}

Expected<std::vector<TensorType>> inferGlobalPool(std::span<const TensorType> in, const AttrView&) {
  KILN_TRY(requireFloat(in[0], "input"));
  KILN_TRY(requireRank(in[0], 4, "input [N,C,H,W]"));
  return one({in[0].dtype, {in[0].shape[0], in[0].shape[1], 1, 1}, in[0].layout});
}

Expected<std::vector<TensorType>> inferBatchNorm(std::span<const TensorType> in, const AttrView&) {
  KILN_TRY(requireFloat(in[0], "input"));
  if (in[0].rank() < 2)
    return invalidArgument("input must have rank >= 2, got " + in[0].toString());
  const char* names[] = {"", "scale", "bias", "mean", "var"};
  for (int i = 1; i < 5; ++i) {
    KILN_TRY(requireSameDType(in[0], in[i], names[i]));
    KILN_TRY(requireShape(in[i], {in[0].shape[1]}, names[i]));
  }
  return one(in[0]);
}

namespace {
// x [N,C,...] float, NCHW (or channels-last at rank 4); returns C.
Expected<int64_t> batchNormChannels(const TensorType& x) {
  KILN_TRY(requireFloat(x, "input"));
  if (x.rank() < 2) return invalidArgument("input must have rank >= 2, got " + x.toString());
  if (x.layout == Layout::kNHWC && x.rank() != 4)
    return invalidArgument("input must be NCHW, got " + x.toString());
  return x.shape[1];
}
Status requireStats(const TensorType& x, const TensorType& stats, int64_t c, const char* what) {
  KILN_TRY(requireSameDType(x, stats, what));
  return requireShape(stats, {2, c}, what);
}
}  // namespace

Expected<std::vector<TensorType>> inferBatchNormStats(std::span<const TensorType> in,
                                                      const AttrView&) {
  KILN_ASSIGN_OR_RETURN(int64_t c, batchNormChannels(in[0]));
  return one({in[0].dtype, {2, c}, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferBatchNormBackwardReduce(std::span<const TensorType> in,
                                                               const AttrView&) {
  KILN_ASSIGN_OR_RETURN(int64_t c, batchNormChannels(in[1]));
  KILN_TRY(requireSameDType(in[1], in[0], "grad"));
  KILN_TRY(requireShape(in[0], in[1].shape, "grad"));
  KILN_TRY(requireSameLayout(in[0], in[1], "grad"));
  const char* names[] = {"", "", "mean", "var"};
  for (int i = 2; i < 4; ++i) {
    KILN_TRY(requireSameDType(in[1], in[i], names[i]));
    KILN_TRY(requireShape(in[i], {c}, names[i]));
  }
  return one({in[1].dtype, {2, c}, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferBatchNormBackward(std::span<const TensorType> in,
                                                         const AttrView& a) {
  KILN_TRY(inferBatchNormBackwardReduce(in.first(4), a).status());
  const int64_t c = in[1].shape[1];
  KILN_TRY(requireSameDType(in[1], in[4], "scale"));
  KILN_TRY(requireShape(in[4], {c}, "scale"));
  KILN_TRY(requireStats(in[1], in[5], c, "sums"));
  return one({in[1].dtype, in[1].shape, in[1].layout});
}

Expected<std::vector<TensorType>> inferLayerNorm(std::span<const TensorType> in,
                                                 const AttrView& a) {
  KILN_TRY(requireFloat(in[0], "input"));
  KILN_ASSIGN_OR_RETURN(int axis, normalizeAxis(a.getInt("axis"), in[0].shape.size(), "axis"));
  const Shape normShape(in[0].shape.begin() + axis, in[0].shape.end());
  const char* names[] = {"", "scale", "bias"};
  for (size_t i = 1; i < in.size(); ++i) {
    KILN_TRY(requireSameDType(in[0], in[i], names[i]));
    KILN_TRY(requireShape(in[i], normShape, names[i]));
  }
  return one(in[0]);
}

Expected<std::vector<TensorType>> inferAttention(std::span<const TensorType> in, const AttrView&) {
  KILN_TRY(requireFloat(in[0], "q"));
  const char* names[] = {"q", "kt", "v", "mask"};
  for (size_t i = 1; i < in.size(); ++i) KILN_TRY(requireSameDType(in[0], in[i], names[i]));
  for (size_t i = 0; i < 3; ++i)
    if (in[i].rank() < 2)
      return invalidArgument(std::string(names[i]) + " must have rank >= 2, got " +
                             in[i].toString());
  const Shape &q = in[0].shape, &kt = in[1].shape, &v = in[2].shape;
  const Shape batch(q.begin(), q.end() - 2);
  if (Shape(kt.begin(), kt.end() - 2) != batch || Shape(v.begin(), v.end() - 2) != batch)
    return invalidArgument("q " + dims(q) + ", kt " + dims(kt) + " and v " + dims(v) +
                           " must share their batch dims");
  const int64_t s = q[q.size() - 2], d = q.back(), t = kt.back();
  if (kt[kt.size() - 2] != d || v[v.size() - 2] != t)
    return invalidArgument("q " + dims(q) + " @ kt " + dims(kt) + " @ v " + dims(v) +
                           ": expected kt [..., " + std::to_string(d) + ", T] and v [..., T, Dv]");
  Shape scores = batch;
  scores.push_back(s);
  scores.push_back(t);
  if (in.size() == 4) {
    const Expected<Shape> b = broadcastShapes(in[3].shape, scores);
    if (!b || *b != scores)
      return invalidArgument("mask " + dims(in[3].shape) + " does not broadcast to the scores " +
                             dims(scores));
  }
  Shape out = batch;
  out.push_back(s);
  out.push_back(v.back());
  return one({in[0].dtype, out, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferArgReduce(std::span<const TensorType> in,
                                                 const AttrView& a) {
  KILN_TRY(requireNumeric(in[0], "input"));
  if (in[0].rank() < 1)
    return invalidArgument("input must have rank >= 1, got " + in[0].toString());
  KILN_ASSIGN_OR_RETURN(int axis, normalizeAxis(a.getInt("axis"), in[0].shape.size(), "axis"));
  if (in[0].shape[static_cast<size_t>(axis)] == 0)
    return invalidArgument("axis " + std::to_string(axis) + " of " + in[0].toString() +
                           " is empty: there is no element to index");
  Shape out = in[0].shape;
  if (a.getInt("keepdims") != 0)
    out[static_cast<size_t>(axis)] = 1;
  else
    out.erase(out.begin() + axis);
  return one({DType::kI64, out, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferTopKIndices(std::span<const TensorType> in,
                                                   const AttrView& a) {
  KILN_TRY(requireNumeric(in[0], "input"));
  if (in[0].rank() < 1)
    return invalidArgument("input must have rank >= 1, got " + in[0].toString());
  KILN_ASSIGN_OR_RETURN(int axis, normalizeAxis(a.getInt("axis"), in[0].shape.size(), "axis"));
  const int64_t k = a.getInt("k");
  if (k < 0 || k > in[0].shape[static_cast<size_t>(axis)])
    return invalidArgument("k = " + std::to_string(k) + " must be 0 to the size of axis " +
                           std::to_string(axis) + " of " + in[0].toString());
  Shape out = in[0].shape;
  out[static_cast<size_t>(axis)] = k;
  return one({DType::kI64, out, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferReduce(std::span<const TensorType> in, const AttrView& a) {
  KILN_TRY(requireNumeric(in[0], "input"));
  const auto& axes = a.getInts("axes");
  std::set<int> reduced;
  for (int64_t ax : axes) {
    KILN_ASSIGN_OR_RETURN(int n, normalizeAxis(ax, in[0].shape.size(), "axes"));
    if (!reduced.insert(n).second)
      return invalidArgument("attribute axes " + dims(axes) + " repeats an axis");
  }
  if (axes.empty())
    for (int i = 0; i < in[0].rank(); ++i) reduced.insert(i);
  const bool keep = a.getInt("keepdims") != 0;
  TensorType t{in[0].dtype, {}, Layout::kPlain};
  for (int i = 0; i < in[0].rank(); ++i) {
    if (!reduced.count(i))
      t.shape.push_back(in[0].shape[i]);
    else if (keep)
      t.shape.push_back(1);
  }
  return one(t);
}

Expected<std::vector<TensorType>> inferReduceMaxBackward(std::span<const TensorType> in,
                                                         const AttrView& a) {
  KILN_TRY(requireFloat(in[1], "input"));
  const TensorType x[] = {in[1]};
  KILN_ASSIGN_OR_RETURN(auto y, inferReduce(x, a));
  for (int i : {0, 2})
    if (in[i].dtype != y[0].dtype || in[i].shape != y[0].shape)
      return invalidArgument(std::string(i == 0 ? "grad" : "y") + " must be " + y[0].toString() +
                             " (the reduction's output), got " + in[i].toString());
  return one({in[1].dtype, in[1].shape, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferLoss(std::span<const TensorType> in, const AttrView& a) {
  KILN_TRY(requireFloat(in[0], "input"));
  if (in[0].rank() < 2) return invalidArgument("input must be [N,C,...], got " + in[0].toString());
  if (in[1].dtype != DType::kI64 && in[1].dtype != DType::kI32)
    return invalidArgument("target must be i64 or i32 class indices, got " + in[1].toString());
  Shape expected = in[0].shape;
  expected.erase(expected.begin() + 1);
  KILN_TRY(requireShape(in[1], expected, "target"));
  const std::string& red = a.getString("reduction");
  if (red == "none") return one({in[0].dtype, expected, Layout::kPlain});
  if (red != "mean" && red != "sum")
    return invalidArgument("attribute reduction must be mean, sum or none, got \"" + red + "\"");
  return one({in[0].dtype, {}, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferNllLossBackward(std::span<const TensorType> in,
                                                       const AttrView& a) {
  // The loss's own checks, with the input and target; then grad must have the loss's type.
  const TensorType lossIn[] = {in[1], in[2]};
  KILN_ASSIGN_OR_RETURN(auto loss, inferLoss(lossIn, a));
  if (in[0].dtype != loss[0].dtype || in[0].shape != loss[0].shape)
    return invalidArgument("grad must be " + loss[0].toString() + " (the loss), got " +
                           in[0].toString());
  return one({in[1].dtype, in[1].shape, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferMseLoss(std::span<const TensorType> in, const AttrView& a) {
  KILN_TRY(requireFloat(in[0], "input"));
  if (in[1].dtype != in[0].dtype || in[1].shape != in[0].shape)
    return invalidArgument("target must be " + TensorType{in[0].dtype, in[0].shape}.toString() +
                           " (the input's type), got " + in[1].toString());
  const std::string& red = a.getString("reduction");
  if (red == "none") return one({in[0].dtype, in[0].shape, Layout::kPlain});
  if (red != "mean" && red != "sum")
    return invalidArgument("attribute reduction must be mean, sum or none, got \"" + red + "\"");
  return one({in[0].dtype, {}, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferDropoutTrain(std::span<const TensorType> in,
                                                    const AttrView& a) {
  KILN_TRY(requireFloat(in[0], "input"));
  if (in[1].dtype != DType::kI64 || !in[1].shape.empty())
    return invalidArgument("step must be an i64 scalar, got " + in[1].toString());
  const double p = a.getFloat("ratio");
  if (!(p >= 0 && p < 1))
    return invalidArgument("attribute ratio must be in [0, 1), got " + std::to_string(p));
  return one(in[0]);
}

namespace {
// The forward op's output type must be the gradient's.
Status requireGradOf(const TensorType& grad, const TensorType& forwardOut) {
  if (grad.dtype != forwardOut.dtype || grad.shape != forwardOut.shape)
    return invalidArgument("grad must be " +
                           TensorType{forwardOut.dtype, forwardOut.shape}.toString() +
                           " (the forward output), got " + grad.toString());
  return Status::ok();
}
Status requirePlain(const TensorType& t, const char* what) {
  if (t.layout == Layout::kNHWC)
    return invalidArgument(std::string(what) + " must be NCHW, got " + t.toString());
  return Status::ok();
}
}  // namespace

// grad, then (weight, input) for the data gradient or (input, weight) for the weight gradient;
// the result has the type of the last operand.
Expected<std::vector<TensorType>> inferConv2dBackward(std::span<const TensorType> in,
                                                      const AttrView& a, bool weight) {
  const TensorType fwd[] = {weight ? in[1] : in[2], weight ? in[2] : in[1]};
  KILN_ASSIGN_OR_RETURN(auto y, inferConv2d(fwd, a));
  KILN_TRY(requireGradOf(in[0], y[0]));
  // The activations (grad and input) share a layout, NCHW or channels-last; the filter is OIHW.
  const TensorType& x = weight ? in[1] : in[2];
  KILN_TRY(requireSameLayout(in[0], x, "grad"));
  KILN_TRY(requirePlain(weight ? in[2] : in[1], "weight"));
  return one({in[2].dtype, in[2].shape, weight ? Layout::kPlain : x.layout});
}

Expected<std::vector<TensorType>> inferConv2dBackwardData(std::span<const TensorType> in,
                                                          const AttrView& a) {
  return inferConv2dBackward(in, a, /*weight=*/false);
}

Expected<std::vector<TensorType>> inferConv2dBackwardWeight(std::span<const TensorType> in,
                                                            const AttrView& a) {
  return inferConv2dBackward(in, a, /*weight=*/true);
}

Expected<std::vector<TensorType>> inferConv2dBackwardBias(std::span<const TensorType> in,
                                                          const AttrView&) {
  KILN_TRY(requireFloat(in[0], "grad"));
  if (in[0].rank() != 4) return invalidArgument("grad must have rank 4, got " + in[0].toString());
  return one({in[0].dtype, {in[0].shape[1]}, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferConvTranspose2d(std::span<const TensorType> in,
                                                       const AttrView& a) {
  KILN_TRY(requireFloat(in[0], "input"));
  KILN_TRY(requireRank(in[0], 4, "input [N,C,H,W]"));
  KILN_TRY(requireRank(in[1], 4, "weight [C,M/group,kh,kw]"));
  KILN_TRY(requireSameDType(in[0], in[1], "weight"));
  KILN_TRY(requirePlain(in[1], "weight"));
  const auto& st = a.getInts("strides");
  const auto& pads = a.getInts("pads");
  const auto& dil = a.getInts("dilations");
  const auto& outPad = a.getInts("output_padding");
  KILN_TRY(requireLen(st, 2, "strides"));
  KILN_TRY(requireLen(pads, 4, "pads"));
  KILN_TRY(requireLen(dil, 2, "dilations"));
  KILN_TRY(requireLen(outPad, 2, "output_padding"));
  const int64_t group = a.getInt("group");
  const Shape& x = in[0].shape;
  const Shape& w = in[1].shape;
  if (group < 1 || x[1] % group != 0)
    return invalidArgument("group " + std::to_string(group) + " must divide input channels " +
                           std::to_string(x[1]));
  if (w[0] != x[1])
    return invalidArgument("weight " + dims(w) + " expects " + std::to_string(w[0]) +
                           " input channels, input " + dims(x) + " has " + std::to_string(x[1]));
  int64_t outChannels = 0;
  if (__builtin_mul_overflow(w[1], group, &outChannels))
    return invalidArgument("weight " + dims(w) + " with group " + std::to_string(group) +
                           " gives more output channels than int64 holds");
  Shape out = {x[0], outChannels, 0, 0};
  for (int i = 0; i < 2; ++i) {
    const char* dim = i == 0 ? "height" : "width";
    if (st[i] < 1 || dil[i] < 1 || pads[i] < 0 || pads[i + 2] < 0 || w[i + 2] < 1)
      return invalidArgument(std::string(dim) + ": strides " + dims(st) + ", dilations " +
                             dims(dil) + " and kernel " + dims(w) +
                             " must be >= 1, pads >= 0, got pads " + dims(pads));
    // PyTorch allows up to the dilation too, but such an output does not convolve back to the
    // input, which the kernels (conv2d_backward_data) need.
    if (outPad[i] < 0 || outPad[i] >= st[i])
      return invalidArgument("output_padding " + dims(outPad) + " must be >= 0 and below the " +
                             "strides " + dims(st));
    // (in - 1) stride - pads + dilation (k - 1) + output_padding + 1, without overflow.
    int64_t size = 0, span = 0;
    if (x[i + 2] < 1 || __builtin_mul_overflow(x[i + 2] - 1, st[i], &size) ||
        __builtin_mul_overflow(dil[i], w[i + 2] - 1, &span) ||
        __builtin_add_overflow(size, span + outPad[i] + 1, &size))
      return invalidArgument(std::string(dim) + ": input " + dims(x) + " is empty or too large");
    size -= pads[i] + pads[i + 2];
    if (size < 1)
      return invalidArgument(std::string(dim) + ": pads " + dims(pads) +
                             " leave no output for input " + dims(x) + " and kernel " + dims(w));
    // The convolution whose input gradient this is maps the output back onto the input.
    KILN_ASSIGN_OR_RETURN(int64_t back, windowOutputSize(size, w[i + 2], st[i], pads[i],
                                                         pads[i + 2], dil[i], false, dim));
    if (back != x[i + 2])
      return invalidArgument(std::string(dim) + ": output " + std::to_string(size) +
                             " does not convolve back to input " + std::to_string(x[i + 2]));
    out[static_cast<size_t>(i) + 2] = size;
  }
  return one({in[0].dtype, out, in[0].layout});
}

Expected<std::vector<TensorType>> inferPool2dIndices(std::span<const TensorType> in,
                                                     const AttrView& a) {
  if (in[0].layout == Layout::kNHWC)
    return invalidArgument("input must be NCHW, got " + in[0].toString());
  KILN_ASSIGN_OR_RETURN(auto y, inferPool2d(in, a));
  return one({DType::kI64, y[0].shape, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferRoiAlign(std::span<const TensorType> in, const AttrView& a) {
  const TensorType &x = in[0], &rois = in[1], &idx = in[2];
  if ((x.dtype != DType::kF32 && x.dtype != DType::kF64) || x.rank() != 4 ||
      x.layout == Layout::kNHWC || x.shape[2] < 1 || x.shape[3] < 1)
    return invalidArgument("x must be an NCHW f32 or f64 [N, C, H, W] with H, W >= 1, got " +
                           x.toString());
  if (rois.dtype != x.dtype || rois.rank() != 2 || rois.shape[1] != 4)
    return invalidArgument("rois must be [R, 4] of x's dtype, got " + rois.toString());
  if (idx.dtype != DType::kI64 || idx.rank() != 1 || idx.shape[0] != rois.shape[0])
    return invalidArgument("batch_indices must be i64 [R] with R = " +
                           std::to_string(rois.shape[0]) + ", got " + idx.toString());
  const std::string& mode = a.getString("mode");
  if (mode != "avg" && mode != "max")
    return invalidArgument("mode must be avg or max, got '" + mode + "'");
  const int64_t oh = a.getInt("output_height"), ow = a.getInt("output_width");
  if (oh < 1 || ow < 1 || a.getInt("sampling_ratio") < 0)
    return invalidArgument("output_height " + std::to_string(oh) + ", output_width " +
                           std::to_string(ow) + " must be >= 1 and sampling_ratio " +
                           std::to_string(a.getInt("sampling_ratio")) + " >= 0");
  return one({x.dtype, Shape{rois.shape[0], x.shape[1], oh, ow}});
}

Expected<std::vector<TensorType>> inferPool2dBackward(std::span<const TensorType> in,
                                                      const AttrView& a) {
  const TensorType fwd[] = {in[1]};
  KILN_ASSIGN_OR_RETURN(auto y, inferPool2d(fwd, a));
  KILN_TRY(requireGradOf(in[0], y[0]));
  KILN_TRY(requireSameLayout(in[0], in[1], "grad"));
  return one({in[1].dtype, in[1].shape, in[1].layout});
}

}  // namespace kiln::ir
