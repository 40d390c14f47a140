// Reference kernels for nll_loss and cross_entropy_loss: input [N,C,d1..], class-index target
// [N,d1..] (i64 or i32), ignore_index, reduction mean | sum | none.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "runtime/reference/helpers.h"
#include "runtime/reference/kernels.h"

namespace kiln::runtime {

namespace {

using ref::Tag;

// Checks that each target is a class index or ignore_index and, given `out`, reads them as int64.
template <class I>
Status readTargets(std::string_view op, const Tensor& target, int64_t classes, int64_t ignore,
                   std::vector<int64_t>* out) {
  const I* t = target.data<I>();
  const int64_t n = target.numElements();
  if (out) out->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const auto c = static_cast<int64_t>(t[i]);
    if (c != ignore && (c < 0 || c >= classes))
      return invalidArgument(classIndexError(op, std::to_string(c), std::to_string(i),
                                             target.describe(), classes, ignore));
    if (out) (*out)[i] = c;
  }
  return Status::ok();
}

}  // namespace

std::string classIndexError(std::string_view op, std::string_view value, std::string_view position,
                            std::string_view target, int64_t classes, int64_t ignore) {
  return std::string(op) + ": target class " + std::string(value) + " at flat position " +
         std::string(position) + " of target " + std::string(target) + " is out of range for " +
         std::to_string(classes) + " classes (valid: 0.." + std::to_string(classes - 1) +
         ", ignore_index " + std::to_string(ignore) + ")";
}

Status checkClassIndices(std::string_view op, const Tensor& target, int64_t classes,
                         int64_t ignore) {
  if (target.dtype() == ir::DType::kI64)
    return readTargets<int64_t>(op, target, classes, ignore, nullptr);
  if (target.dtype() == ir::DType::kI32)
    return readTargets<int32_t>(op, target, classes, ignore, nullptr);
  return ref::unsupportedDType(std::string(op) + " (target)", target.dtype());
}

namespace {

// Per-target loss -log p(target), where logProb(n, k, c) is the log-probability of class c at
// sample n and spatial position k. Ignored targets contribute 0 and are not counted.
template <class T, class LogProb>
Status lossImpl(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out,
                LogProb logProb) {
  const ref::AxisSplit split = ref::splitAt(in[0].shape(), 1);  // N, C, spatial
  const int64_t ignore = attrs.getInt("ignore_index");
  std::vector<int64_t> targets;
  if (in[1].dtype() == ir::DType::kI64)
    KILN_TRY(readTargets<int64_t>(ref::opNameOf(attrs), in[1], split.dim, ignore, &targets));
  else if (in[1].dtype() == ir::DType::kI32)
    KILN_TRY(readTargets<int32_t>(ref::opNameOf(attrs), in[1], split.dim, ignore, &targets));
  else
    return ref::unsupportedDType(std::string(ref::opNameOf(attrs)) + " (target)", in[1].dtype());

  const std::string& reduction = attrs.getString("reduction");
  T* y = out[0].data<T>();
  T sum = T(0);
  int64_t count = 0;
  for (int64_t n = 0; n < split.outer; ++n) {
    for (int64_t k = 0; k < split.inner; ++k) {
      const int64_t c = targets[n * split.inner + k];
      T loss = T(0);
      if (c != ignore) {
        loss = -logProb(n, k, c);
        sum += loss;
        ++count;
      }
      if (reduction == "none") y[n * split.inner + k] = loss;
    }
  }
  // With every target ignored, mean is 0/0 = NaN, as in PyTorch.
  if (reduction == "sum") y[0] = sum;
  if (reduction == "mean") y[0] = sum / static_cast<T>(count);
  return Status::ok();
}

Status nllLossKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  const ref::AxisSplit split = ref::splitAt(in[0].shape(), 1);
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    const T* x = in[0].data<T>();  // Already log-probabilities.
    return lossImpl<T>(attrs, in, out, [&](int64_t n, int64_t k, int64_t c) {
      return x[(n * split.dim + c) * split.inner + k];
    });
  });
}

Status crossEntropyLossKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                              std::span<Tensor> out) {
  const ref::AxisSplit split = ref::splitAt(in[0].shape(), 1);
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    const T* x = in[0].data<T>();
    // log_softmax over the classes (dim 1, elements `inner` apart), stabilized by the max.
    return lossImpl<T>(attrs, in, out, [&](int64_t n, int64_t k, int64_t c) {
      const T* row = x + n * split.dim * split.inner + k;
      T mx = -std::numeric_limits<T>::infinity();
      for (int64_t j = 0; j < split.dim; ++j)
        if (row[j * split.inner] > mx || ref::isNaN(row[j * split.inner]))
          mx = row[j * split.inner];
      T sum = T(0);
      for (int64_t j = 0; j < split.dim; ++j) sum += std::exp(row[j * split.inner] - mx);
      return row[c * split.inner] - mx - std::log(sum);
    });
  });
}

// The targets of a loss gradient (in: grad, input, target) as int64, checked.
Status readBackwardTargets(const ir::AttrView& attrs, std::span<const Tensor> in, int64_t classes,
                           std::vector<int64_t>& targets) {
  const int64_t ignore = attrs.getInt("ignore_index");
  if (in[2].dtype() == ir::DType::kI64)
    return readTargets<int64_t>(ref::opNameOf(attrs), in[2], classes, ignore, &targets);
  if (in[2].dtype() == ir::DType::kI32)
    return readTargets<int32_t>(ref::opNameOf(attrs), in[2], classes, ignore, &targets);
  return ref::unsupportedDType(std::string(ref::opNameOf(attrs)) + " (target)", in[2].dtype());
}

// The factor each target's row of a loss gradient takes: grad (per target with reduction none),
// divided by the counted targets with mean (with every target ignored the loss is NaN; its
// rows are all ignored, so the gradient is 0, as PyTorch's); 0 at ignored targets.
template <class T>
struct RowScale {
  const T* g;
  bool none;
  int64_t ignore;
  T scale;
  RowScale(const ir::AttrView& attrs, const Tensor& grad, const std::vector<int64_t>& targets)
      : g(grad.data<T>()),
        none(attrs.getString("reduction") == "none"),
        ignore(attrs.getInt("ignore_index")) {
    int64_t count = 0;
    for (int64_t t : targets) count += t != ignore;
    scale = attrs.getString("reduction") == "mean" ? T(1) / static_cast<T>(count) : T(1);
  }
  T operator()(int64_t target, int64_t c) const {
    if (c == ignore) return T(0);
    return (none ? g[target] : g[0]) * scale;
  }
};

// in: grad (the loss's shape), input [N,C,d..] (shape only), target [N,d..].
Status nllLossBackwardKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                             std::span<Tensor> out) {
  const ref::AxisSplit split = ref::splitAt(in[1].shape(), 1);
  std::vector<int64_t> targets;
  KILN_TRY(readBackwardTargets(attrs, in, split.dim, targets));
  const int64_t ignore = attrs.getInt("ignore_index");
  return ref::dispatchFloat(ref::opNameOf(attrs), in[1].dtype(), [&]<class T>(Tag<T>) {
    T* dx = out[0].data<T>();
    std::fill(dx, dx + out[0].numElements(), T(0));
    const RowScale<T> scale(attrs, in[0], targets);
    for (int64_t n = 0; n < split.outer; ++n)
      for (int64_t k = 0; k < split.inner; ++k) {
        const int64_t c = targets[n * split.inner + k];
        if (c == ignore) continue;
        dx[(n * split.dim + c) * split.inner + k] = -scale(n * split.inner + k, c);
      }
    return Status::ok();
  });
}

// in: grad (the loss's shape), logits [N,C,d..], target [N,d..]. Per row (sample and spatial
// position): the softmax over the classes, stabilized by the row's maximum, times the row's
// factor, minus the factor at the target: what log_softmax's gradient of nll_loss's gives, in
// one pass over the row (and p * 0, NaN for a row holding a NaN, at ignored targets, as there).
Status crossEntropyLossBackwardKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                                      std::span<Tensor> out) {
  const ref::AxisSplit split = ref::splitAt(in[1].shape(), 1);
  std::vector<int64_t> targets;
  KILN_TRY(readBackwardTargets(attrs, in, split.dim, targets));
  return ref::dispatchFloat(ref::opNameOf(attrs), in[1].dtype(), [&]<class T>(Tag<T>) {
    const T* x = in[1].data<T>();
    T* dx = out[0].data<T>();
    const RowScale<T> scale(attrs, in[0], targets);
    const int64_t step = split.inner;
    for (int64_t n = 0; n < split.outer; ++n)
      for (int64_t k = 0; k < split.inner; ++k) {
        const int64_t base = n * split.dim * split.inner + k;
        const T* row = x + base;
        T* drow = dx + base;
        const int64_t c = targets[n * split.inner + k];
        const T s = scale(n * split.inner + k, c);
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t j = 0; j < split.dim; ++j)
          if (row[j * step] > mx || ref::isNaN(row[j * step])) mx = row[j * step];
        T sum = T(0);
        for (int64_t j = 0; j < split.dim; ++j) {
          const T e = std::exp(row[j * step] - mx);
          drow[j * step] = e;
          sum += e;
        }
        const T factor = s / sum;
        for (int64_t j = 0; j < split.dim; ++j) drow[j * step] *= factor;
        if (c != scale.ignore) drow[c * step] -= s;
      }
    return Status::ok();
  });
}

// in: input, target (same type); sums in double.
Status mseLossKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  const std::string& reduction = attrs.getString("reduction");
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    const T* x = in[0].data<T>();
    const T* t = in[1].data<T>();
    T* y = out[0].data<T>();
    const int64_t n = in[0].numElements();
    if (reduction == "none") {
      for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - t[i]) * (x[i] - t[i]);
      return Status::ok();
    }
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double d = static_cast<double>(x[i]) - static_cast<double>(t[i]);
      sum += d * d;
    }
    // The mean of nothing is NaN, as in PyTorch.
    y[0] = static_cast<T>(reduction == "mean" ? sum / static_cast<double>(n) : sum);
    return Status::ok();
  });
}

}  // namespace

void registerLossKernels(RefKernelTable& t) {
  ref::setKernel(t, ir::OpKind::kNllLoss, nllLossKernel);
  ref::setKernel(t, ir::OpKind::kCrossEntropyLoss, crossEntropyLossKernel);
  ref::setKernel(t, ir::OpKind::kNllLossBackward, nllLossBackwardKernel);
  ref::setKernel(t, ir::OpKind::kCrossEntropyLossBackward, crossEntropyLossBackwardKernel);
  ref::setKernel(t, ir::OpKind::kMseLoss, mseLossKernel);
}

}  // namespace kiln::runtime
