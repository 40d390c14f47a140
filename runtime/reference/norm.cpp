// Reference kernels for inference and training batch_norm (and a convolution bias's gradient,
// the same per-channel sum), layer_norm, and softmax / log_softmax on any axis (numerically stable:
// the maximum is subtracted before exponentiating).
#include <cmath>
#include <limits>
#include <type_traits>

#include "runtime/cpu/cpu_clones.h"
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

// ---- Training-mode BatchNorm: x [N, C, inner...] NCHW; the per-channel loops run in parallel
// over channels (reductions, accumulated in double) or over the N x C planes (pointwise).

// stats [2, C]: mean, biased variance (two passes).
// A sum in kLanes independent double accumulators, so that it vectorizes (one accumulator is
// one dependent add per element: resnet18's BatchNorm statistics took 48 ms a training step at
// batch 32), added up in a fixed order at the end: deterministic, and within rounding of a plain
// loop's sum. Double, as PyTorch's CPU kernels accumulate these: float lanes were twice as fast
// but moved resnet18's training off PyTorch's from its second step (peer: train resnet18).
struct Lanes {
  static constexpr int kLanes = 16;
  double lane[kLanes] = {};
  double tail = 0;
  // Adds term(i) for i in [0, n).
  template <class Term>
  void add(int64_t n, Term term) {
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int l = 0; l < kLanes; ++l) lane[l] += term(i + l);
    for (; i < n; ++i) tail += term(i);
  }
  // Adds into two sums at once: term(i, a, b) adds element i's terms to a and b.
  template <class Term>
  static void add2(int64_t n, Lanes& x, Lanes& y, Term term) {
    int64_t i = 0;
    for (; i + kLanes <= n; i += kLanes)
      for (int l = 0; l < kLanes; ++l) term(i + l, x.lane[l], y.lane[l]);
    for (; i < n; ++i) term(i, x.tail, y.tail);
  }
  double total() const {
    double t = tail;
    for (int l = 0; l < kLanes; ++l) t += lane[l];
    return t;
  }
};

// The f32 planes' sums compiled per ISA (the runtime itself targets every x86-64, where the
// widening to double is 2 floats an instruction; AVX-512 takes 8): the same lanes in the same
// order as the generic code, so the same results.
KILN_CPU_CLONES void addPlaneF32(Lanes& sum, const float* p, int64_t n) {
  sum.add(n, [&](int64_t i) { return static_cast<double>(p[i]); });
}
KILN_CPU_CLONES void addPlaneSquaresF32(Lanes& sq, const float* p, int64_t n, double mean) {
  sq.add(n, [&](int64_t i) {
    const double d = static_cast<double>(p[i]) - mean;
    return d * d;
  });
}
KILN_CPU_CLONES void addPlaneGradF32(Lanes& sg, Lanes& sgx, const float* gp, const float* xp,
                                     int64_t n, double mean) {
  Lanes a = sg, b = sgx;  // Locals: the two references could alias, which keeps them in memory.
  Lanes::add2(n, a, b, [&](int64_t i, double& sa, double& sb) {
    const double gi = static_cast<double>(gp[i]);
    sa += gi;
    sb += gi * (static_cast<double>(xp[i]) - mean);
  });
  sg = a;
  sgx = b;
}

// The sum of channel k of x [N, C, inner...], in double.
template <class T>
double channelSum(const T* x, const ref::AxisSplit& split, int64_t k) {
  Lanes sum;
  for (int64_t n = 0; n < split.outer; ++n) {
    const T* p = x + (n * split.dim + k) * split.inner;
    if constexpr (std::is_same_v<T, float>)
      addPlaneF32(sum, p, split.inner);
    else
      sum.add(split.inner, [&](int64_t i) { return static_cast<double>(p[i]); });
  }
  return sum.total();
}

Status batchNormStatsKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                            std::span<Tensor> out) {
  const ref::AxisSplit split = ref::splitAt(in[0].shape(), 1);
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    const T* x = in[0].data<T>();
    T* stats = out[0].data<T>();
    const int64_t c = split.dim, inner = split.inner, count = split.outer * inner;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < c; ++k) {
      const double mean = channelSum(x, split, k) / static_cast<double>(count);
      Lanes sq;
      for (int64_t n = 0; n < split.outer; ++n) {
        const T* p = x + (n * c + k) * inner;
        if constexpr (std::is_same_v<T, float>)
          addPlaneSquaresF32(sq, p, inner, mean);
        else
          sq.add(inner, [&](int64_t i) {
            const double d = static_cast<double>(p[i]) - mean;
            return d * d;
          });
      }
      stats[k] = static_cast<T>(mean);
      stats[c + k] = static_cast<T>(sq.total() / static_cast<double>(count));
    }
    return Status::ok();
  });
}

// grad [N, C, H, W] -> [C]: the sums over N, H and W (a convolution bias's gradient).
Status conv2dBackwardBiasKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                                std::span<Tensor> out) {
  const ref::AxisSplit split = ref::splitAt(in[0].shape(), 1);
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    const T* g = in[0].data<T>();
    T* sums = out[0].data<T>();
    const int64_t c = split.dim;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < c; ++k) sums[k] = static_cast<T>(channelSum(g, split, k));
    return Status::ok();
  });
}

// grad, x, mean, var -> [2, C]: sum(grad xhat), sum(grad).
Status batchNormBackwardReduceKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                                     std::span<Tensor> out) {
  const ref::AxisSplit split = ref::splitAt(in[1].shape(), 1);
  const double eps = attrs.getFloat("epsilon");
  return ref::dispatchFloat(ref::opNameOf(attrs), in[1].dtype(), [&]<class T>(Tag<T>) {
    const T* g = in[0].data<T>();
    const T* x = in[1].data<T>();
    const T* meanOf = in[2].data<T>();
    const T* varOf = in[3].data<T>();
    T* sums = out[0].data<T>();
    const int64_t c = split.dim, inner = split.inner;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < c; ++k) {
      const double mean = static_cast<double>(meanOf[k]);
      const double inv = 1 / std::sqrt(static_cast<double>(varOf[k]) + eps);
      Lanes sg, sgx;
      for (int64_t n = 0; n < split.outer; ++n) {
        const T* gp = g + (n * c + k) * inner;
        const T* xp = x + (n * c + k) * inner;
        // Both sums in one pass over grad and x.
        if constexpr (std::is_same_v<T, float>) {
          addPlaneGradF32(sg, sgx, gp, xp, inner, mean);
          continue;
        }
        Lanes::add2(inner, sg, sgx, [&](int64_t i, double& a, double& b) {
          const double gi = static_cast<double>(gp[i]);
          a += gi;
          b += gi * (static_cast<double>(xp[i]) - mean);
        });
      }
      sums[k] = static_cast<T>(sgx.total() * inv);
      sums[c + k] = static_cast<T>(sg.total());
    }
    return Status::ok();
  });
}

// grad, x, mean, var, scale, sums -> scale inv (grad - (sum(grad) + xhat sum(grad xhat)) /
// count).
Status batchNormBackwardKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                               std::span<Tensor> out) {
  const ref::AxisSplit split = ref::splitAt(in[1].shape(), 1);
  const double eps = attrs.getFloat("epsilon");
  return ref::dispatchFloat(ref::opNameOf(attrs), in[1].dtype(), [&]<class T>(Tag<T>) {
    const T* g = in[0].data<T>();
    const T* x = in[1].data<T>();
    const T* meanOf = in[2].data<T>();
    const T* varOf = in[3].data<T>();
    const T* scale = in[4].data<T>();
    const T* sums = in[5].data<T>();
    T* dx = out[0].data<T>();
    const int64_t c = split.dim, inner = split.inner, planes = split.outer * c;
    const T count = static_cast<T>(split.outer * inner);
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < planes; ++p) {
      const int64_t k = p % c;
      const T mean = meanOf[k];
      const T inv = T(1) / std::sqrt(varOf[k] + static_cast<T>(eps));
      const T a = scale[k] * inv;
      const T meanGx = sums[k] / count, meanG = sums[c + k] / count;
      const T* gp = g + p * inner;
      const T* xp = x + p * inner;
      T* dp = dx + p * inner;
      for (int64_t i = 0; i < inner; ++i)
        dp[i] = a * (gp[i] - meanG - (xp[i] - mean) * inv * meanGx);
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
  ref::setKernel(t, ir::OpKind::kBatchNormStats, batchNormStatsKernel);
  ref::setKernel(t, ir::OpKind::kConv2dBackwardBias, conv2dBackwardBiasKernel);
  ref::setKernel(t, ir::OpKind::kBatchNormTrain, batchNormKernel);  // The same formula.
  ref::setKernel(t, ir::OpKind::kBatchNormBackwardReduce, batchNormBackwardReduceKernel);
  ref::setKernel(t, ir::OpKind::kBatchNormBackward, batchNormBackwardKernel);
  ref::setKernel(t, ir::OpKind::kSoftmax, softmaxKernel);
  ref::setKernel(t, ir::OpKind::kLogSoftmax, logSoftmaxKernel);
}

}  // namespace kiln::runtime
