// Ops whose output size is given by their inputs' values (ops.def, "Outputs sized by their
// inputs' values"): their reference kernels, and valueSizedCount, the size a run in stages
// takes from the values before it imports the op.
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "runtime/reference/helpers.h"
#include "runtime/reference/kernels.h"

namespace kiln::runtime {

namespace {

// Calls f(isNonZero) with isNonZero(i) telling whether element i of `x` is not zero, by value:
// NaN is not zero, -0 is (the sign bit of a float ignored).
template <class F>
Status withNonZeroTest(const Tensor& x, F&& f) {
  const ir::DType t = x.dtype();
  const bool isFloat = ir::isFloat(t);
  if (!isFloat && !ir::isInteger(t) && t != ir::DType::kBool)
    return ref::unsupportedDType("nonzero", t);
  return ref::dispatchBySize(t, [&]<class U>(ref::Tag<U>) {
    const U mask = isFloat ? static_cast<U>(~(U{1} << (8 * sizeof(U) - 1))) : static_cast<U>(~U{0});
    const U* bits = reinterpret_cast<const U*>(x.rawData());
    return f([bits, mask](int64_t i) { return (bits[i] & mask) != 0; });
  });
}

Expected<int64_t> countNonZero(const Tensor& x) {
  int64_t count = 0;
  KILN_TRY(withNonZeroTest(x, [&](auto nonZero) {
    const int64_t n = x.numElements();
    for (int64_t i = 0; i < n; ++i) count += nonZero(i) ? 1 : 0;
    return Status::ok();
  }));
  return count;
}

// nonzero: the coordinates of each non-zero element, in row-major order, as the columns of
// [rank, count] (a scalar's coordinate 0).
Status nonZeroKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  const Tensor& x = in[0];
  const int64_t count = attrs.getInt("count");
  KILN_ASSIGN_OR_RETURN(const int64_t actual, countNonZero(x));
  if (actual != count)
    return internalError("nonzero: the graph was made for " + std::to_string(count) +
                         " non-zero elements, its input " + x.describe() + " has " +
                         std::to_string(actual) + " (the stage was not imported for this input)");
  const ir::Shape& shape = x.shape();
  const size_t rank = shape.size();
  int64_t* y = out[0].data<int64_t>();
  return withNonZeroTest(x, [&](auto nonZero) {
    std::vector<int64_t> coord(rank, 0);
    const int64_t n = x.numElements();
    int64_t column = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (nonZero(i)) {
        if (rank == 0) y[column] = 0;
        for (size_t d = 0; d < rank; ++d) y[static_cast<int64_t>(d) * count + column] = coord[d];
        ++column;
      }
      for (size_t d = rank; d-- > 0;) {  // The next coordinate, the last dim fastest.
        if (++coord[d] < shape[d]) break;
        coord[d] = 0;
      }
    }
    return Status::ok();
  });
}

// ---- non_max_suppression, as ONNX's reference computes it (in f32).

// Whether box b suppresses box a (IoU above `threshold`); each box's 4 coordinates.
bool suppresses(const float* a, const float* b, bool centerPoint, float threshold) {
  float ax0, ax1, ay0, ay1, bx0, bx1, by0, by1;
  if (!centerPoint) {  // [y1, x1, y2, x2], any diagonal pair of corners.
    ax0 = std::min(a[1], a[3]), ax1 = std::max(a[1], a[3]);
    ay0 = std::min(a[0], a[2]), ay1 = std::max(a[0], a[2]);
    bx0 = std::min(b[1], b[3]), bx1 = std::max(b[1], b[3]);
    by0 = std::min(b[0], b[2]), by1 = std::max(b[0], b[2]);
  } else {  // [x_center, y_center, width, height].
    ax0 = a[0] - a[2] / 2, ax1 = a[0] + a[2] / 2, ay0 = a[1] - a[3] / 2, ay1 = a[1] + a[3] / 2;
    bx0 = b[0] - b[2] / 2, bx1 = b[0] + b[2] / 2, by0 = b[1] - b[3] / 2, by1 = b[1] + b[3] / 2;
  }
  const float ix0 = std::max(ax0, bx0), ix1 = std::min(ax1, bx1);
  if (!(ix1 > ix0)) return false;
  const float iy0 = std::max(ay0, by0), iy1 = std::min(ay1, by1);
  if (!(iy1 > iy0)) return false;
  const float inter = (ix1 - ix0) * (iy1 - iy0);
  const float areaA = (ax1 - ax0) * (ay1 - ay0), areaB = (bx1 - bx0) * (by1 - by0);
  const float uni = areaA + areaB - inter;
  if (!(inter > 0) || !(areaA > 0) || !(areaB > 0) || !(uni > 0)) return false;
  return inter / uni > threshold;
}

// The selected (batch, class, box) triples, in order.
Expected<std::vector<std::array<int64_t, 3>>> selectBoxes(const ir::AttrMap& attrs,
                                                          std::span<const Tensor> in) {
  const ir::AttrView a(ir::opInfo(ir::OpKind::kNonMaxSuppression), attrs);
  const Tensor &boxes = in[0], &scores = in[1];
  const ir::Shape& bs = boxes.shape();
  const ir::Shape& ss = scores.shape();
  if (boxes.dtype() != ir::DType::kF32 || scores.dtype() != ir::DType::kF32 || bs.size() != 3 ||
      ss.size() != 3 || bs[2] != 4 || ss[0] != bs[0] || ss[2] != bs[1])
    return invalidArgument("non_max_suppression: boxes " + boxes.describe() + " and scores " +
                           scores.describe() + " must be f32 [B, N, 4] and [B, C, N]");
  // The optional inputs the attributes say are given, in order, each one value.
  size_t next = 2;
  auto scalar = [&](const char* flag, ir::DType dtype) -> Expected<const Tensor*> {
    if (a.getInt(flag) == 0) return nullptr;
    if (next >= in.size() || in[next].dtype() != dtype || in[next].numElements() != 1)
      return invalidArgument("non_max_suppression: " + std::string(flag + 4) + " must be one " +
                             std::string(ir::dtypeName(dtype)) + " value" +
                             (next < in.size() ? ", got " + in[next].describe() : ""));
    return &in[next++];
  };
  KILN_ASSIGN_OR_RETURN(const Tensor* maxOut, scalar("has_max_output", ir::DType::kI64));
  KILN_ASSIGN_OR_RETURN(const Tensor* iouIn, scalar("has_iou_threshold", ir::DType::kF32));
  KILN_ASSIGN_OR_RETURN(const Tensor* scoreIn, scalar("has_score_threshold", ir::DType::kF32));
  const int64_t maxPerClass = maxOut ? std::max<int64_t>(maxOut->data<int64_t>()[0], 0) : 0;
  const float iou = iouIn ? iouIn->data<float>()[0] : 0.0f;
  const bool byScore = scoreIn != nullptr;
  const float scoreThreshold = scoreIn ? scoreIn->data<float>()[0] : 0.0f;
  const bool centerPoint = a.getInt("center_point_box") != 0;
  const int64_t batches = bs[0], classes = ss[1], n = bs[1];
  const float* box = boxes.data<float>();
  const float* score = scores.data<float>();
  std::vector<std::array<int64_t, 3>> selected;
  if (n == 0 || maxPerClass == 0) return selected;  // Nothing to select (B x C may be huge).
  std::vector<int64_t> order, kept;
  for (int64_t b = 0; b < batches; ++b)
    for (int64_t c = 0; c < classes; ++c) {
      const float* s = score + (b * classes + c) * n;
      order.clear();
      for (int64_t i = 0; i < n; ++i)
        if (!byScore || s[i] > scoreThreshold) order.push_back(i);
      // Highest score first, ties to the lower index; NaN below every number.
      std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
        const bool xn = std::isnan(s[x]), yn = std::isnan(s[y]);
        return xn != yn ? yn : (!xn && s[x] > s[y]);
      });
      kept.clear();
      for (int64_t i : order) {
        if (static_cast<int64_t>(kept.size()) >= maxPerClass) break;
        const float* bi = box + (b * n + i) * 4;
        bool keep = true;
        for (int64_t k : kept)
          if (suppresses(bi, box + (b * n + k) * 4, centerPoint, iou)) {
            keep = false;
            break;
          }
        if (!keep) continue;
        kept.push_back(i);
        selected.push_back({b, c, i});
      }
    }
  return selected;
}

Status nonMaxSuppressionKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                               std::span<Tensor> out) {
  KILN_ASSIGN_OR_RETURN(auto selected, selectBoxes(attrs.raw(), in));
  const int64_t count = attrs.getInt("count");
  if (static_cast<int64_t>(selected.size()) != count)
    return internalError("non_max_suppression: the graph was made for " + std::to_string(count) +
                         " selected boxes, its inputs select " + std::to_string(selected.size()) +
                         " (the stage was not imported for these inputs)");
  int64_t* y = out[0].data<int64_t>();
  for (size_t i = 0; i < selected.size(); ++i)
    for (size_t k = 0; k < 3; ++k) y[i * 3 + k] = selected[i][k];
  return Status::ok();
}

// ---- unique_indices and unique_inverse.

// Three-way comparison of two elements by value (ref::numericValue: f16 and bf16 exactly, bools
// as 0 and 1): -0 equals 0; NaN is above every number and compares equal to NaN (the order;
// whether NaNs are one value is uniqueGroups' choice).
template <class T>
int compareValues(T a, T b) {
  const auto x = ref::numericValue(a), y = ref::numericValue(b);
  const bool xn = ref::isNaN(x), yn = ref::isNaN(y);
  if (xn || yn) return xn == yn ? 0 : (xn ? 1 : -1);
  return x < y ? -1 : (y < x ? 1 : 0);
}

// x's distinct elements (has_axis 0) or slices along `axis`, as groups in output order: each
// group's first member is its first occurrence; inverse[i] is item i's group.
struct UniqueGroups {
  std::vector<int64_t> first;    // Per group, the position of its first occurrence.
  std::vector<int64_t> inverse;  // Per item, its group.
};

Expected<UniqueGroups> uniqueGroups(const ir::AttrMap& attrs, const Tensor& x) {
  const ir::AttrView a(ir::opInfo(ir::OpKind::kUniqueInverse), attrs);
  // x as [outer, n, inner]: item i is x[:, i, :] (the flattened x's elements: outer = inner = 1).
  int64_t outer = 1, n = x.numElements(), inner = 1;
  const bool hasAxis = a.getInt("has_axis") != 0;
  if (hasAxis) {
    const int64_t axis = a.getInt("axis");
    if (axis < 0 || axis >= static_cast<int64_t>(x.shape().size()))
      return invalidArgument("unique: axis " + std::to_string(axis) + " is not a dim of " +
                             x.describe());
    const ref::AxisSplit s = ref::splitAt(x.shape(), static_cast<int>(axis));
    outer = s.outer, n = s.dim, inner = s.inner;
  }
  UniqueGroups g;
  g.inverse.assign(static_cast<size_t>(n), 0);
  if (!ir::isFloat(x.dtype()) && !ir::isInteger(x.dtype()) && x.dtype() != ir::DType::kBool)
    return ref::unsupportedDType("unique", x.dtype());
  Status st = ref::dispatchAll(x.dtype(), [&]<class T>(ref::Tag<T>) -> Status {
    const T* v = x.data<T>();
    // Items compared element by element, in row-major order of the slice.
    auto compare = [&](int64_t i, int64_t j) {
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t k = 0; k < inner; ++k) {
          const int64_t base = o * n * inner + k;
          if (int c = compareValues(v[base + i * inner], v[base + j * inner]); c != 0) return c;
        }
      return 0;
    };
    std::vector<int64_t> order(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
    // Stable: equal items stay in index order, so each run of equals starts at its first.
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t i, int64_t j) { return compare(i, j) < 0; });
    // As NumPy's unique (ONNX's reference): the flattened x's NaNs are one value; slices are
    // compared field by field, so a slice with a NaN equals no other.
    auto hasNaN = [&](int64_t i) {
      if (!hasAxis) return false;
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t k = 0; k < inner; ++k)
          if (ref::isNaN(ref::numericValue(v[o * n * inner + i * inner + k]))) return true;
      return false;
    };
    for (size_t r = 0; r < order.size(); ++r) {
      if (r == 0 || compare(order[r - 1], order[r]) != 0 || hasNaN(order[r]))
        g.first.push_back(order[r]);
      g.inverse[static_cast<size_t>(order[r])] = static_cast<int64_t>(g.first.size()) - 1;
    }
    return Status::ok();
  });
  KILN_TRY(st);
  if (a.getInt("sorted") == 0) {  // Groups in order of first occurrence.
    std::vector<int64_t> byFirst(g.first.size());
    for (size_t k = 0; k < byFirst.size(); ++k) byFirst[k] = static_cast<int64_t>(k);
    std::sort(byFirst.begin(), byFirst.end(),
              [&](int64_t p, int64_t q) { return g.first[p] < g.first[q]; });
    std::vector<int64_t> rank(byFirst.size()), first(byFirst.size());
    for (size_t k = 0; k < byFirst.size(); ++k) {
      rank[static_cast<size_t>(byFirst[k])] = static_cast<int64_t>(k);
      first[k] = g.first[static_cast<size_t>(byFirst[k])];
    }
    for (int64_t& group : g.inverse) group = rank[static_cast<size_t>(group)];
    g.first = std::move(first);
  }
  return g;
}

Status uniqueIndicesKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                           std::span<Tensor> out) {
  KILN_ASSIGN_OR_RETURN(UniqueGroups g, uniqueGroups(attrs.raw(), in[0]));
  const int64_t count = attrs.getInt("count");
  if (static_cast<int64_t>(g.first.size()) != count)
    return internalError("unique_indices: the graph was made for " + std::to_string(count) +
                         " distinct values, its input " + in[0].describe() + " has " +
                         std::to_string(g.first.size()) +
                         " (the stage was not imported for this input)");
  std::copy(g.first.begin(), g.first.end(), out[0].data<int64_t>());
  return Status::ok();
}

Status uniqueInverseKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                           std::span<Tensor> out) {
  KILN_ASSIGN_OR_RETURN(UniqueGroups g, uniqueGroups(attrs.raw(), in[0]));
  std::copy(g.inverse.begin(), g.inverse.end(), out[0].data<int64_t>());
  return Status::ok();
}

}  // namespace

Expected<int64_t> valueSizedCount(ir::OpKind op, const ir::AttrMap& attrs,
                                  std::span<const Tensor> inputs) {
  switch (op) {
    case ir::OpKind::kNonZero:
      if (inputs.size() != 1) return invalidArgument("nonzero takes 1 input");
      return countNonZero(inputs[0]);
    case ir::OpKind::kNonMaxSuppression: {
      if (inputs.size() < 2) return invalidArgument("non_max_suppression takes 2 to 5 inputs");
      KILN_ASSIGN_OR_RETURN(auto selected, selectBoxes(attrs, inputs));
      return static_cast<int64_t>(selected.size());
    }
    case ir::OpKind::kUniqueIndices: {
      if (inputs.size() != 1) return invalidArgument("unique_indices takes 1 input");
      KILN_ASSIGN_OR_RETURN(UniqueGroups g, uniqueGroups(attrs, inputs[0]));
      return static_cast<int64_t>(g.first.size());
    }
    case ir::OpKind::kCast: {  // A value the import needs (an If's condition, a trip count), as
                               // i64.
      if (inputs.size() != 1 || inputs[0].numElements() != 1)
        return invalidArgument("a value read at run time must be one element");
      const ir::DType t = inputs[0].dtype();
      if (!ir::isInteger(t) && t != ir::DType::kBool)
        return invalidArgument("a value read at run time must be an integer or bool, got " +
                               inputs[0].describe());
      int64_t value = 0;
      KILN_TRY(ref::dispatchAll(t, [&]<class T>(ref::Tag<T>) -> Status {
        const auto v = ref::numericValue(inputs[0].data<T>()[0]);
        if constexpr (std::is_same_v<T, uint64_t>) {
          if (v > static_cast<uint64_t>(INT64_MAX))
            return invalidArgument("the value " + std::to_string(v) + " is beyond int64");
        }
        if constexpr (std::is_integral_v<decltype(v)>) value = static_cast<int64_t>(v);
        return Status::ok();
      }));
      return value;
    }
    default:
      break;
  }
  return invalidArgument(std::string(ir::opName(op)) + " has no output sized by its values");
}

void registerValueSizedKernels(RefKernelTable& t) {
  ref::setKernel(t, ir::OpKind::kNonZero, nonZeroKernel);
  ref::setKernel(t, ir::OpKind::kNonMaxSuppression, nonMaxSuppressionKernel);
  ref::setKernel(t, ir::OpKind::kUniqueIndices, uniqueIndicesKernel);
  ref::setKernel(t, ir::OpKind::kUniqueInverse, uniqueInverseKernel);
}

}  // namespace kiln::runtime
