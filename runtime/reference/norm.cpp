// Reference kernels for inference batch_norm, layer_norm, and softmax / log_softmax on any
// axis (numerically stable: the maximum is subtracted before exponentiating).
#include <cmath>
#include <limits>

#include "runtime/reference/helpers.h"

namespace kiln::runtime {

namespace {

using ref::Tag;

Status batchNormKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                       std::span<Tensor> out) {
  const ir::Shape& s = in[0].shape();
  const ref::AxisSplit split = ref::splitAt(s, 1);  // [N, C, spatial...]
  const double eps = attrs.getFloat("epsilon");
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    const T* x = in[0].data<T>();
    const T* scale = in[1].data<T>();
    const T* bias = in[2].data<T>();
    const T* mean = in[3].data<T>();
    const T* var = in[4].data<T>();
    T* y = out[0].data<T>();
    for (int64_t n = 0; n < split.outer; ++n) {
      for (int64_t c = 0; c < split.dim; ++c) {
        // y = (x - mean) / sqrt(var + eps) * scale + bias
        const T sd = std::sqrt(var[c] + static_cast<T>(eps));
        const int64_t base = (n * split.dim + c) * split.inner;
        for (int64_t i = 0; i < split.inner; ++i)
          y[base + i] = (x[base + i] - mean[c]) / sd * scale[c] + bias[c];
      }
    }
    return Status::ok();
  });
}

Status layerNormKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                       std::span<Tensor> out) {
  const ir::Shape& s = in[0].shape();
  KILN_ASSIGN_OR_RETURN(const int axis, ir::normalizeAxis(attrs.getInt("axis"), s.size(), "axis"));
  const int64_t size = ir::numElements(ir::Shape(s.begin() + axis, s.end()));
  const int64_t rows = size ? in[0].numElements() / size : 0;
  const double eps = attrs.getFloat("epsilon");
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    const T* scale = in.size() > 1 ? in[1].data<T>() : nullptr;
    const T* bias = in.size() > 2 ? in[2].data<T>() : nullptr;
    for (int64_t r = 0; r < rows; ++r) {
      const T* x = in[0].data<T>() + r * size;
      T* y = out[0].data<T>() + r * size;
      // Two passes (mean, then the biased variance of x - mean) for accuracy.
      T sum = T(0);
      for (int64_t i = 0; i < size; ++i) sum += x[i];
      const T mean = sum / static_cast<T>(size);
      T sq = T(0);
      for (int64_t i = 0; i < size; ++i) sq += (x[i] - mean) * (x[i] - mean);
      const T sd = std::sqrt(sq / static_cast<T>(size) + static_cast<T>(eps));
      for (int64_t i = 0; i < size; ++i) {
        T v = (x[i] - mean) / sd;
        if (scale) v *= scale[i];
        if (bias) v += bias[i];
        y[i] = v;
      }
    }
    return Status::ok();
  });
}

// softmax (log = false) or log_softmax (log = true) along `axis`.
Status softmaxImpl(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out,
                   bool log) {
  const ir::Shape& s = in[0].shape();
  KILN_ASSIGN_OR_RETURN(const int axis, ir::normalizeAxis(attrs.getInt("axis"), s.size(), "axis"));
  const ref::AxisSplit split = ref::splitAt(s, axis);
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    for (int64_t o = 0; o < split.outer; ++o) {
      for (int64_t i = 0; i < split.inner; ++i) {
        // Elements of one softmax row are `inner` apart.
        const int64_t base = o * split.dim * split.inner + i, step = split.inner;
        const T* x = in[0].data<T>() + base;
        T* y = out[0].data<T>() + base;
        T mx = -std::numeric_limits<T>::infinity();
        for (int64_t d = 0; d < split.dim; ++d)
          if (x[d * step] > mx || ref::isNaN(x[d * step])) mx = x[d * step];
        // Subtracting the maximum keeps exp() <= 1, so large inputs stay finite. (A row of
        // all -inf gives NaN, as in PyTorch.)
        const T shift = mx;
        T sum = T(0);
        for (int64_t d = 0; d < split.dim; ++d) sum += std::exp(x[d * step] - shift);
        if (log) {
          const T logSum = std::log(sum);
          for (int64_t d = 0; d < split.dim; ++d) y[d * step] = x[d * step] - shift - logSum;
        } else {
          for (int64_t d = 0; d < split.dim; ++d) y[d * step] = std::exp(x[d * step] - shift) / sum;
        }
      }
    }
    return Status::ok();
  });
}

Status softmaxKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  return softmaxImpl(attrs, in, out, false);
}
Status logSoftmaxKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                        std::span<Tensor> out) {
  return softmaxImpl(attrs, in, out, true);
}

}  // namespace

void registerNormKernels(RefKernelTable& t) {
  ref::setKernel(t, ir::OpKind::kBatchNorm, batchNormKernel);
  ref::setKernel(t, ir::OpKind::kLayerNorm, layerNormKernel);
  ref::setKernel(t, ir::OpKind::kSoftmax, softmaxKernel);
  ref::setKernel(t, ir::OpKind::kLogSoftmax, logSoftmaxKernel);
}

}  // namespace kiln::runtime
