// Reference kernels for reduce_sum, reduce_mean and reduce_max over a set of axes (empty:
// all), with or without keepdims.
#include <algorithm>
#include <limits>
#include <vector>

#include "runtime/reference/helpers.h"

namespace kiln::runtime {

namespace {

using ref::Tag;

// For each input dim, the stride of the output element it maps to (0 for reduced dims), so
// that output offset = sum_d index_d * stride_d.
Expected<std::vector<int64_t>> reducedStrides(const ir::AttrView& attrs, const ir::Shape& in) {
  std::vector<bool> reduced(in.size(), attrs.getInts("axes").empty());
  for (int64_t ax : attrs.getInts("axes")) {
    KILN_ASSIGN_OR_RETURN(const int a, ir::normalizeAxis(ax, in.size(), "axes"));
    reduced[a] = true;
  }
  ir::Shape kept = in;  // The keepdims output shape; its memory order is that of the output.
  for (size_t d = 0; d < in.size(); ++d)
    if (reduced[d]) kept[d] = 1;
  std::vector<int64_t> strides = ir::contiguousStrides(kept);
  for (size_t d = 0; d < in.size(); ++d)
    if (reduced[d]) strides[d] = 0;
  return strides;
}

// Folds every input element into its output element: acc = f(acc, x), starting from `init`.
template <class T, class F>
Status reduceInto(const ir::AttrView& attrs, const Tensor& in, Tensor& out, T init, F f) {
  KILN_ASSIGN_OR_RETURN(const std::vector<int64_t> strides, reducedStrides(attrs, in.shape()));
  const T* x = in.data<T>();
  T* y = out.data<T>();
  const int64_t n = out.numElements();
  // The kept dims one contiguous run [a, b), the reduced ones around it (a conv bias gradient:
  // every dim but the channels): x is [outer, n, inner], and each output element folds its
  // outer x inner inputs in lanes (below), in parallel over outputs. A float sum's rounding
  // differs from the general loop's single accumulator (deterministic either way).
  const ir::Shape& shape = in.shape();
  size_t a = 0, b = shape.size();
  while (a < b && strides[a] == 0) ++a;
  while (b > a && strides[b - 1] == 0) --b;
  bool run = a < b;
  for (size_t d = a; d < b; ++d) run = run && strides[d] != 0;
  if (run && n > 1) {
    int64_t outer = 1, inner = 1;
    for (size_t d = 0; d < a; ++d) outer *= shape[d];
    for (size_t d = b; d < shape.size(); ++d) inner *= shape[d];
    // kLanes partial results over each contiguous inner run (vector lanes, and independent
    // dependency chains: one accumulator waits an add's latency per element), folded at the end.
    // The order differs from one accumulator's; f must be associative (sum, product, max).
    constexpr int64_t kLanes = 16;
#pragma omp parallel for schedule(static)
    for (int64_t m = 0; m < n; ++m) {
      T lanes[kLanes];
      for (T& l : lanes) l = init;
      for (int64_t o = 0; o < outer; ++o) {
        const T* p = x + (o * n + m) * inner;
        int64_t i = 0;
        for (; i + kLanes <= inner; i += kLanes)
          for (int64_t l = 0; l < kLanes; ++l) lanes[l] = f(lanes[l], p[i + l]);
        for (; i < inner; ++i) lanes[i % kLanes] = f(lanes[i % kLanes], p[i]);
      }
      for (int64_t width = kLanes / 2; width > 0; width /= 2)
        for (int64_t l = 0; l < width; ++l) lanes[l] = f(lanes[l], lanes[l + width]);
      y[m] = lanes[0];
    }
    return Status::ok();
  }
  for (int64_t i = 0; i < n; ++i) y[i] = init;
  ref::forEachStrided<1>(
      in.shape(), {strides}, {0},
      [&](int64_t i, const std::array<int64_t, 1>& off) { y[off[0]] = f(y[off[0]], x[i]); });
  return Status::ok();
}

Status reduceSumKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                       std::span<Tensor> out) {
  return ref::dispatchNumeric(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    return reduceInto<T>(attrs, in[0], out[0], T(0), [](T a, T b) { return ref::addWrap(a, b); });
  });
}

Status reduceProdKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                        std::span<Tensor> out) {
  return ref::dispatchNumeric(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    return reduceInto<T>(attrs, in[0], out[0], T(1), [](T a, T b) { return ref::mulWrap(a, b); });
  });
}

Status reduceMeanKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                        std::span<Tensor> out) {
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    KILN_TRY(reduceInto<T>(attrs, in[0], out[0], T(0), [](T a, T b) { return a + b; }));
    // Every output element sums the same number of inputs (NaN for an empty reduction).
    const int64_t n = out[0].numElements();
    const T count = n ? static_cast<T>(in[0].numElements() / n) : T(1);
    T* y = out[0].data<T>();
    for (int64_t i = 0; i < n; ++i) y[i] /= count;
    return Status::ok();
  });
}

Status reduceMaxKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                       std::span<Tensor> out) {
  return ref::dispatchNumeric(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    // An empty reduction gives -inf (the lowest value for integers), as ONNX specifies; NaN
    // propagates.
    T init = std::numeric_limits<T>::lowest();
    if constexpr (std::numeric_limits<T>::has_infinity) init = -std::numeric_limits<T>::infinity();
    return reduceInto<T>(attrs, in[0], out[0], init, [](T acc, T v) {
      return (v > acc || ref::isNaN(v)) && !ref::isNaN(acc) ? v : acc;
    });
  });
}

// reduce_max_backward(grad, x, y): grad[o] / ties[o] at every x equal to y[o], 0 elsewhere.
Status reduceMaxBackwardKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                               std::span<Tensor> out) {
  return ref::dispatchFloat(ref::opNameOf(attrs), in[1].dtype(), [&]<class T>(Tag<T>) {
    KILN_ASSIGN_OR_RETURN(const std::vector<int64_t> strides, reducedStrides(attrs, in[1].shape()));
    const T* g = in[0].data<T>();
    const T* x = in[1].data<T>();
    const T* y = in[2].data<T>();
    T* dx = out[0].data<T>();
    std::vector<int64_t> ties(static_cast<size_t>(in[2].numElements()), 0);
    ref::forEachStrided<1>(in[1].shape(), {strides}, {0},
                           [&](int64_t i, const std::array<int64_t, 1>& off) {
                             ties[static_cast<size_t>(off[0])] += x[i] == y[off[0]];
                           });
    ref::forEachStrided<1>(
        in[1].shape(), {strides}, {0}, [&](int64_t i, const std::array<int64_t, 1>& off) {
          dx[i] = x[i] == y[off[0]] ? g[off[0]] / static_cast<T>(ties[static_cast<size_t>(off[0])])
                                    : T(0);
        });
    return Status::ok();
  });
}

}  // namespace

// topk_indices: a stable sort of each row's indices by value (largest or smallest first; ties
// keep the lower index first), the first k kept. NaN is larger than every number and equal to
// NaN (PyTorch's topk): first when largest, last when smallest (a comparison that left NaN
// unordered would not be a strict weak order, and the sort's result undefined).
static Status topKIndicesKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                                std::span<Tensor> out) {
  KILN_ASSIGN_OR_RETURN(const int axis,
                        ir::normalizeAxis(attrs.getInt("axis"), in[0].shape().size(), "axis"));
  const bool largest = attrs.getInt("largest") != 0;
  const int64_t k = attrs.getInt("k");
  const ref::AxisSplit s = ref::splitAt(in[0].shape(), axis);
  return ref::dispatchNumeric(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    const T* x = in[0].data<T>();
    int64_t* y = out[0].data<int64_t>();
    std::vector<int64_t> order(static_cast<size_t>(s.dim));
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t i = 0; i < s.inner; ++i) {
        const T* row = x + o * s.dim * s.inner + i;
        for (int64_t j = 0; j < s.dim; ++j) order[static_cast<size_t>(j)] = j;
        // a > b with NaN the largest.
        auto greater = [](T a, T b) {
          const bool an = ref::isNaN(a), bn = ref::isNaN(b);
          return an ? !bn : (!bn && a > b);
        };
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
          const T va = row[a * s.inner], vb = row[b * s.inner];
          return largest ? greater(va, vb) : greater(vb, va);
        });
        for (int64_t j = 0; j < k; ++j)
          y[(o * k + j) * s.inner + i] = order[static_cast<size_t>(j)];
      }
    return Status::ok();
  });
}

// argmax / argmin along one axis: i64 indices, NaN winning over every number.
template <bool kMax>
Status argReduceKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                       std::span<Tensor> out) {
  const int axis =
      static_cast<int>(attrs.getInt("axis") < 0 ? attrs.getInt("axis") + in[0].shape().size()
                                                : attrs.getInt("axis"));
  const bool last = attrs.getInt("select_last_index") != 0;
  const ref::AxisSplit s = ref::splitAt(in[0].shape(), axis);
  return ref::dispatchNumeric(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    const T* x = in[0].data<T>();
    int64_t* y = out[0].data<int64_t>();
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t i = 0; i < s.inner; ++i) {
        const T* row = x + o * s.dim * s.inner + i;
        int64_t best = 0;
        for (int64_t k = 1; k < s.dim; ++k) {
          const T v = row[k * s.inner], b = row[best * s.inner];
          const bool vn = ref::isNaN(v), bn = ref::isNaN(b);
          const bool better = !bn && (vn || (kMax ? v > b : v < b));
          const bool tie = (vn && bn) || (!vn && !bn && v == b);
          if (better || (last && tie)) best = k;
        }
        y[o * s.inner + i] = best;
      }
    return Status::ok();
  });
}

void registerReduceKernels(RefKernelTable& t) {
  ref::setKernel(t, ir::OpKind::kArgMax, argReduceKernel<true>);
  ref::setKernel(t, ir::OpKind::kArgMin, argReduceKernel<false>);
  ref::setKernel(t, ir::OpKind::kReduceSum, reduceSumKernel);
  ref::setKernel(t, ir::OpKind::kReduceProd, reduceProdKernel);
  ref::setKernel(t, ir::OpKind::kTopKIndices, topKIndicesKernel);
  ref::setKernel(t, ir::OpKind::kReduceMaxBackward, reduceMaxBackwardKernel);
  ref::setKernel(t, ir::OpKind::kReduceMean, reduceMeanKernel);
  ref::setKernel(t, ir::OpKind::kReduceMax, reduceMaxKernel);
}

}  // namespace kiln::runtime
