// Shape inference for movement ops: reshape, flatten, transpose, concat, slice, squeeze,
// unsqueeze, expand, gather.
#include <algorithm>
#include <limits>
#include <set>

#include "ir/infer.h"

namespace kiln::ir {

Expected<std::vector<TensorType>> inferReshape(std::span<const TensorType> in, const AttrView& a) {
  const Shape& x = in[0].shape;
  Shape out = a.getInts("shape");
  const bool allowZero = a.getInt("allowzero") != 0;
  int inferred = -1;
  int64_t known = 1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == 0 && !allowZero) {
      if (i >= x.size())
        return invalidArgument("shape " + shapeToString(a.getInts("shape")) + ": 0 at position " +
                               std::to_string(i) + " copies a dim the input " + shapeToString(x) +
                               " does not have");
      out[i] = x[i];
    }
    if (out[i] == -1) {
      if (inferred >= 0) return invalidArgument("shape may contain at most one -1");
      inferred = static_cast<int>(i);
    } else if (out[i] < 0) {
      return invalidArgument("shape " + shapeToString(a.getInts("shape")) + " has a negative dim");
    } else if (__builtin_mul_overflow(known, out[i], &known)) {
      // Attribute values come from user files; no real input has this many elements.
      return invalidArgument("cannot reshape " + shapeToString(x) + " into " +
                             shapeToString(a.getInts("shape")) + " (the element count overflows)");
    }
  }
  const int64_t total = numElements(x);
  if (inferred >= 0) {
    if (known == 0 || total % known != 0)
      return invalidArgument("cannot reshape " + shapeToString(x) + " (" + std::to_string(total) +
                             " elements) into " + shapeToString(a.getInts("shape")));
    out[inferred] = total / known;
  } else if (known != total) {
    return invalidArgument("cannot reshape " + shapeToString(x) + " (" + std::to_string(total) +
                           " elements) into " + shapeToString(out) + " (" + std::to_string(known) +
                           " elements)");
  }
  return one({in[0].dtype, out, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferFlatten(std::span<const TensorType> in, const AttrView& a) {
  const Shape& x = in[0].shape;
  const int64_t axis = a.getInt("axis");
  const auto r = static_cast<int64_t>(x.size());
  if (axis < -r || axis > r)
    return invalidArgument("axis " + std::to_string(axis) + " out of range for rank " +
                           std::to_string(r));
  const int64_t ax = axis < 0 ? axis + r : axis;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < r; ++i) (i < ax ? outer : inner) *= x[i];
  return one({in[0].dtype, {outer, inner}, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferTranspose(std::span<const TensorType> in,
                                                 const AttrView& a) {
  const Shape& x = in[0].shape;
  std::vector<int64_t> perm = a.getInts("perm");
  if (perm.empty())
    for (size_t i = x.size(); i-- > 0;) perm.push_back(static_cast<int64_t>(i));
  if (perm.size() != x.size())
    return invalidArgument("perm " + shapeToString(perm) + " must have " +
                           std::to_string(x.size()) + " entries for input " + shapeToString(x));
  std::vector<bool> seen(x.size(), false);
  Shape out;
  for (int64_t p : perm) {
    if (p < 0 || p >= static_cast<int64_t>(x.size()) || seen[p])
      return invalidArgument("perm " + shapeToString(perm) + " is not a permutation of 0.." +
                             std::to_string(x.size() - 1));
    seen[p] = true;
    out.push_back(x[p]);
  }
  return one({in[0].dtype, out, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferConcat(std::span<const TensorType> in, const AttrView& a) {
  KILN_ASSIGN_OR_RETURN(int axis, normalizeAxis(a.getInt("axis"), in[0].shape.size(), "axis"));
  Shape out = in[0].shape;
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i].dtype != in[0].dtype || in[i].rank() != in[0].rank())
      return invalidArgument("input " + std::to_string(i) + " is " + in[i].toString() +
                             ", expected dtype and rank of " + in[0].toString());
    for (int d = 0; d < in[0].rank(); ++d)
      if (d != axis && in[i].shape[d] != in[0].shape[d])
        return invalidArgument("input " + std::to_string(i) + " " + in[i].toString() +
                               " differs from " + in[0].toString() + " outside axis " +
                               std::to_string(axis));
    if (__builtin_add_overflow(out[axis], in[i].shape[axis], &out[axis]))
      return invalidArgument("the concatenated size along axis " + std::to_string(axis) +
                             " overflows");
  }
  return one({in[0].dtype, out, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferSlice(std::span<const TensorType> in, const AttrView& a) {
  const Shape& x = in[0].shape;
  const auto& starts = a.getInts("starts");
  const auto& ends = a.getInts("ends");
  std::vector<int64_t> axes = a.getInts("axes");
  std::vector<int64_t> steps = a.getInts("steps");
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
    return invalidArgument("starts, ends, axes and steps must have the same length");
  Shape out = x;
  std::set<int> seen;
  for (size_t i = 0; i < starts.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(int ax, normalizeAxis(axes[i], x.size(), "axes"));
    if (!seen.insert(ax).second) return invalidArgument("axes repeats axis " + std::to_string(ax));
    if (steps[i] == 0) return invalidArgument("steps must not be 0");
    const int64_t dim = x[ax];
    int64_t s = starts[i] < 0 ? starts[i] + dim : starts[i];
    int64_t e = ends[i] < 0 ? ends[i] + dim : ends[i];
    // ceil(span / |step|) written so that neither a huge step nor INT64_MIN overflows.
    const uint64_t stride = steps[i] > 0 ? static_cast<uint64_t>(steps[i])
                                         : uint64_t{0} - static_cast<uint64_t>(steps[i]);
    auto count = [&](int64_t from, int64_t to) {
      return to > from ? static_cast<int64_t>((static_cast<uint64_t>(to - from) - 1) / stride + 1)
                       : int64_t{0};
    };
    if (steps[i] > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      out[ax] = count(s, e);
    } else {
      // As ONNX: a backward slice starts inside [0, dim-1] and ends in [-1, dim-1].
      if (dim == 0) {
        out[ax] = 0;
        continue;
      }
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      out[ax] = count(e, s);
    }
  }
  return one({in[0].dtype, out, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferSqueeze(std::span<const TensorType> in, const AttrView& a) {
  const Shape& x = in[0].shape;
  std::set<int> drop;
  for (int64_t ax : a.getInts("axes")) {
    KILN_ASSIGN_OR_RETURN(int n, normalizeAxis(ax, x.size(), "axes"));
    if (x[n] != 1)
      return invalidArgument("cannot squeeze axis " + std::to_string(ax) + " of size " +
                             std::to_string(x[n]) + " in " + shapeToString(x));
    drop.insert(n);
  }
  Shape out;
  for (int i = 0; i < static_cast<int>(x.size()); ++i) {
    const bool squeeze = a.getInts("axes").empty() ? x[i] == 1 : drop.count(i) > 0;
    if (!squeeze) out.push_back(x[i]);
  }
  return one({in[0].dtype, out, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferUnsqueeze(std::span<const TensorType> in,
                                                 const AttrView& a) {
  const Shape& x = in[0].shape;
  const auto& axes = a.getInts("axes");
  const size_t rank = x.size() + axes.size();
  std::set<int> ins;
  for (int64_t ax : axes) {
    KILN_ASSIGN_OR_RETURN(int n, normalizeAxis(ax, rank, "axes"));
    if (!ins.insert(n).second) return invalidArgument("axes repeats axis " + std::to_string(ax));
  }
  Shape out;
  size_t src = 0;
  for (size_t i = 0; i < rank; ++i) out.push_back(ins.count(static_cast<int>(i)) ? 1 : x[src++]);
  return one({in[0].dtype, out, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferExpand(std::span<const TensorType> in, const AttrView& a) {
  for (int64_t d : a.getInts("shape"))
    if (d < 0)
      return invalidArgument("shape " + shapeToString(a.getInts("shape")) + " has a negative dim");
  KILN_ASSIGN_OR_RETURN(Shape out, broadcastShapes(in[0].shape, a.getInts("shape")));
  return one({in[0].dtype, out, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferGather(std::span<const TensorType> in, const AttrView& a) {
  if (in[1].dtype != DType::kI64 && in[1].dtype != DType::kI32)
    return invalidArgument("indices must be i64 or i32, got " + in[1].toString());
  if (in[0].rank() < 1) return invalidArgument("data must have rank >= 1");
  KILN_ASSIGN_OR_RETURN(int axis, normalizeAxis(a.getInt("axis"), in[0].shape.size(), "axis"));
  const Shape& x = in[0].shape;
  Shape out(x.begin(), x.begin() + axis);
  out.insert(out.end(), in[1].shape.begin(), in[1].shape.end());
  out.insert(out.end(), x.begin() + axis + 1, x.end());
  return one({in[0].dtype, out, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferGatherElements(std::span<const TensorType> in,
                                                      const AttrView& a) {
  if (in[1].dtype != DType::kI64 && in[1].dtype != DType::kI32)
    return invalidArgument("indices must be i64 or i32, got " + in[1].toString());
  if (in[0].rank() < 1 || in[1].rank() != in[0].rank())
    return invalidArgument("indices " + in[1].toString() + " must have the rank of data " +
                           in[0].toString() + " (at least 1)");
  KILN_ASSIGN_OR_RETURN(int axis, normalizeAxis(a.getInt("axis"), in[0].shape.size(), "axis"));
  for (int d = 0; d < in[0].rank(); ++d)
    if (d != axis && in[1].shape[static_cast<size_t>(d)] > in[0].shape[static_cast<size_t>(d)])
      return invalidArgument("indices " + in[1].toString() + " exceed data " + in[0].toString() +
                             " in dim " + std::to_string(d));
  return one({in[0].dtype, in[1].shape, Layout::kPlain});
}

namespace {
Status requireIndices(const TensorType& t) {
  if (t.dtype != DType::kI64 && t.dtype != DType::kI32)
    return invalidArgument("indices must be i64 or i32, got " + t.toString());
  return Status::ok();
}
// indices i64/i32, a valid reduction, and updates of data's dtype: what both scatters need.
Status requireScatterInputs(std::span<const TensorType> in, const AttrView& a) {
  KILN_TRY(requireIndices(in[1]));
  const std::string& r = a.getString("reduction");
  if (r != "none" && r != "add" && r != "mul" && r != "max" && r != "min")
    return invalidArgument("reduction must be none, add, mul, max or min, got '" + r + "'");
  if (in[2].dtype != in[0].dtype)
    return invalidArgument("updates " + in[2].toString() + " must have data's dtype " +
                           std::string(dtypeName(in[0].dtype)));
  return Status::ok();
}
}  // namespace

Expected<std::vector<TensorType>> inferScatterElements(std::span<const TensorType> in,
                                                       const AttrView& a) {
  KILN_TRY(requireScatterInputs(in, a));
  if (in[0].rank() < 1 || in[1].rank() != in[0].rank() || in[2].shape != in[1].shape)
    return invalidArgument("indices " + in[1].toString() + " and updates " + in[2].toString() +
                           " must have one shape, of data " + in[0].toString() + "'s rank");
  KILN_ASSIGN_OR_RETURN(int axis, normalizeAxis(a.getInt("axis"), in[0].shape.size(), "axis"));
  for (int d = 0; d < in[0].rank(); ++d)
    if (d != axis && in[1].shape[static_cast<size_t>(d)] > in[0].shape[static_cast<size_t>(d)])
      return invalidArgument("indices " + in[1].toString() + " exceed data " + in[0].toString() +
                             " in dim " + std::to_string(d));
  return one({in[0].dtype, in[0].shape, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferScatterNd(std::span<const TensorType> in,
                                                 const AttrView& a) {
  KILN_TRY(requireScatterInputs(in, a));
  if (in[1].rank() < 1 || in[1].shape.back() > in[0].rank() || in[1].shape.back() < 1)
    return invalidArgument("indices " + in[1].toString() + " must end in a dim of 1 to data " +
                           in[0].toString() + "'s rank");
  Shape want(in[1].shape.begin(), in[1].shape.end() - 1);
  want.insert(want.end(), in[0].shape.begin() + in[1].shape.back(), in[0].shape.end());
  if (in[2].shape != want)
    return invalidArgument("updates " + in[2].toString() + " must have shape " +
                           shapeToString(want));
  return one({in[0].dtype, in[0].shape, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferGatherBackward(std::span<const TensorType> in,
                                                      const AttrView& a) {
  const TensorType forward[] = {in[2], in[1]};
  KILN_ASSIGN_OR_RETURN(auto y, inferGather(forward, a));
  if (in[0].dtype != y[0].dtype || in[0].shape != y[0].shape)
    return invalidArgument("grad must be " + y[0].toString() + " (the gather's output), got " +
                           in[0].toString());
  KILN_TRY(requireFloat(in[2], "data"));
  return one({in[2].dtype, in[2].shape, Layout::kPlain});
}

namespace {

// What nonzero and the unique ops read by value: a plain float, integer or bool tensor.
Status requireValueTest(const TensorType& x) {
  if (x.layout == Layout::kNHWC) return invalidArgument("x must be plain, got " + x.toString());
  if (!isFloat(x.dtype) && !isInteger(x.dtype) && x.dtype != DType::kBool)
    return invalidArgument(
        "x must be a float, integer or bool tensor (not an 8-, 4- or 2-bit one), got " +
        x.toString());
  return Status::ok();
}

// What unique_indices and unique_inverse count: x's elements (has_axis 0) or its slices along
// `axis`.
Expected<int64_t> uniqueItems(const TensorType& x, const AttrView& a) {
  KILN_TRY(requireValueTest(x));
  if (a.getInt("sorted") != 0 && a.getInt("sorted") != 1)
    return invalidArgument("sorted must be 0 or 1, got " + std::to_string(a.getInt("sorted")));
  if (a.getInt("has_axis") == 0) return numElements(x.shape);
  const int64_t axis = a.getInt("axis");
  if (axis < 0 || axis >= static_cast<int64_t>(x.rank()))
    return invalidArgument("axis = " + std::to_string(axis) + " must be a dim of " + x.toString() +
                           " (0 to rank - 1)");
  return x.shape[static_cast<size_t>(axis)];
}

}  // namespace

Expected<std::vector<TensorType>> inferNonZero(std::span<const TensorType> in, const AttrView& a) {
  const TensorType& x = in[0];
  KILN_TRY(requireValueTest(x));
  const int64_t elements = numElements(x.shape);
  const int64_t count = a.getInt("count");
  if (count < 0 || count > elements)
    return invalidArgument("count = " + std::to_string(count) + " must be 0 to the " +
                           std::to_string(elements) + " elements of " + x.toString());
  return one({DType::kI64, Shape{std::max<int64_t>(x.rank(), 1), count}, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferUniqueIndices(std::span<const TensorType> in,
                                                     const AttrView& a) {
  KILN_ASSIGN_OR_RETURN(const int64_t n, uniqueItems(in[0], a));
  const int64_t count = a.getInt("count");
  if (count < (n > 0 ? 1 : 0) || count > n)
    return invalidArgument("count = " + std::to_string(count) + " must be " + (n > 0 ? "1" : "0") +
                           " to the " + std::to_string(n) +
                           (a.getInt("has_axis") ? " slices" : " elements") + " of " +
                           in[0].toString());
  return one({DType::kI64, Shape{count}, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferUniqueInverse(std::span<const TensorType> in,
                                                     const AttrView& a) {
  KILN_ASSIGN_OR_RETURN(const int64_t n, uniqueItems(in[0], a));
  return one({DType::kI64, Shape{n}, Layout::kPlain});
}

Expected<std::vector<TensorType>> inferNonMaxSuppression(std::span<const TensorType> in,
                                                         const AttrView& a) {
  const TensorType &boxes = in[0], &scores = in[1];
  if (boxes.dtype != DType::kF32 || boxes.rank() != 3 || boxes.shape[2] != 4)
    return invalidArgument("boxes must be f32 [B, N, 4], got " + boxes.toString());
  if (scores.dtype != DType::kF32 || scores.rank() != 3 || scores.shape[0] != boxes.shape[0] ||
      scores.shape[2] != boxes.shape[1])
    return invalidArgument("scores must be f32 [B, C, N] = [" + std::to_string(boxes.shape[0]) +
                           ", C, " + std::to_string(boxes.shape[1]) + "], got " +
                           scores.toString());
  const int64_t cpb = a.getInt("center_point_box");
  if (cpb != 0 && cpb != 1)
    return invalidArgument("center_point_box must be 0 or 1, got " + std::to_string(cpb));
  const std::pair<const char*, DType> optional[] = {{"has_max_output", DType::kI64},
                                                    {"has_iou_threshold", DType::kF32},
                                                    {"has_score_threshold", DType::kF32}};
  size_t next = 2;
  for (const auto& [flag, dtype] : optional) {
    if (a.getInt(flag) == 0) continue;
    if (next >= in.size())
      return invalidArgument(std::string(flag) + " is set but the input is not given");
    if (in[next].dtype != dtype || numElements(in[next].shape) != 1)
      return invalidArgument(std::string(flag).substr(4) + " must be one " +
                             std::string(dtypeName(dtype)) + " value, got " + in[next].toString());
    ++next;
  }
  if (next != in.size())
    return invalidArgument(std::to_string(in.size()) + " inputs for " + std::to_string(next) +
                           " that the has_* attributes give");
  // B x C x N triples at most; with no boxes (a 0-byte input of huge B x C) none.
  const int64_t most = scores.shape[2] == 0 || scores.shape[0] == 0 || scores.shape[1] == 0
                           ? 0
                           : (scores.shape[0] > std::numeric_limits<int64_t>::max() /
                                                    scores.shape[1] / scores.shape[2]
                                  ? std::numeric_limits<int64_t>::max()
                                  : scores.shape[0] * scores.shape[1] * scores.shape[2]);
  const int64_t count = a.getInt("count");
  if (count < 0 || count > most)
    return invalidArgument("count = " + std::to_string(count) + " must be 0 to the " +
                           std::to_string(most) + " (batch, class, box) triples");
  return one({DType::kI64, Shape{count, 3}, Layout::kPlain});
}

}  // namespace kiln::ir
