// Reference kernels for conv2d (stride, asymmetric pads, dilation, groups, optional bias),
// max_pool2d, avg_pool2d, global_avg_pool and roi_align, all on NCHW tensors.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "runtime/cpu/cpu_clones.h"
#include "runtime/reference/helpers.h"

namespace kiln::runtime {

namespace {

using ref::Tag;

// Sliding-window geometry of one spatial dim: output o reads input o*stride - padBegin +
// t*dilation for kernel tap t.
struct Window {
  int64_t in, out, kernel, stride, padBegin, padEnd, dilation;

  int64_t start(int64_t o) const { return o * stride - padBegin; }
  // The outputs [lo, hi) whose tap t lands inside the input (empty when lo >= hi).
  std::pair<int64_t, int64_t> validOutputs(int64_t t) const {
    const int64_t shift = padBegin - t * dilation;  // o*stride >= shift and o*stride < in + shift
    const int64_t lo = shift > 0 ? (shift + stride - 1) / stride : 0;
    const int64_t last = in + shift - 1;  // Largest allowed o*stride.
    const int64_t hi = last < 0 ? 0 : std::min(out, last / stride + 1);
    return {lo, std::max(lo, hi)};
  }
};

Window heightWindow(const ir::AttrView& attrs, const Tensor& x, const Tensor& y, int64_t kernel,
                    int64_t dilation) {
  const auto& st = attrs.getInts("strides");
  const auto& pads = attrs.getInts("pads");
  return {x.shape()[2], y.shape()[2], kernel, st[0], pads[0], pads[2], dilation};
}
Window widthWindow(const ir::AttrView& attrs, const Tensor& x, const Tensor& y, int64_t kernel,
                   int64_t dilation) {
  const auto& st = attrs.getInts("strides");
  const auto& pads = attrs.getInts("pads");
  return {x.shape()[3], y.shape()[3], kernel, st[1], pads[1], pads[3], dilation};
}

// ---- conv2d.

// Direct convolution. For each output channel and each (input channel, kh, kw) tap, one
// weight scales whole input rows into output rows, so the inner loop runs along the output
// width over contiguous memory (strided by the stride in the input) and vectorizes.
template <class T>
void conv2d(const T* __restrict x, const T* __restrict w, const T* bias, T* __restrict y,
            int64_t batch, int64_t channels, int64_t outChannels, int64_t group, const Window& wh,
            const Window& ww) {
  const int64_t cPerGroup = channels / group, mPerGroup = outChannels / group;
  const int64_t inPlane = wh.in * ww.in, outPlane = wh.out * ww.out;
  const int64_t taps = wh.kernel * ww.kernel;
  // A 1x1, stride-1, unpadded conv maps whole input planes onto output planes.
  const bool pointwise = taps == 1 && wh.stride == 1 && ww.stride == 1 && wh.padBegin == 0 &&
                         ww.padBegin == 0 && wh.out == wh.in && ww.out == ww.in;
  std::vector<std::pair<int64_t, int64_t>> rowsFor(wh.kernel), colsFor(ww.kernel);
  for (int64_t t = 0; t < wh.kernel; ++t) rowsFor[t] = wh.validOutputs(t);
  for (int64_t t = 0; t < ww.kernel; ++t) colsFor[t] = ww.validOutputs(t);

  for (int64_t n = 0; n < batch; ++n) {
    for (int64_t g = 0; g < group; ++g) {
      for (int64_t mg = 0; mg < mPerGroup; ++mg) {
        const int64_t m = g * mPerGroup + mg;
        T* yPlane = y + (n * outChannels + m) * outPlane;
        const T b = bias ? bias[m] : T(0);
        for (int64_t i = 0; i < outPlane; ++i) yPlane[i] = b;
        for (int64_t c = 0; c < cPerGroup; ++c) {
          const T* xPlane = x + (n * channels + g * cPerGroup + c) * inPlane;
          const T* wTaps = w + (m * cPerGroup + c) * taps;
          if (pointwise) {
            const T wv = wTaps[0];
            for (int64_t i = 0; i < outPlane; ++i) yPlane[i] += wv * xPlane[i];
            continue;
          }
          for (int64_t kh = 0; kh < wh.kernel; ++kh) {
            const auto [ohLo, ohHi] = rowsFor[kh];
            for (int64_t kw = 0; kw < ww.kernel; ++kw) {
              const auto [owLo, owHi] = colsFor[kw];
              const T wv = wTaps[kh * ww.kernel + kw];
              for (int64_t oh = ohLo; oh < ohHi; ++oh) {
                const int64_t ih = wh.start(oh) + kh * wh.dilation;
                const T* xRow = xPlane + ih * ww.in + ww.start(owLo) + kw * ww.dilation;
                T* yRow = yPlane + oh * ww.out + owLo;
                const int64_t len = owHi - owLo;
                if (ww.stride == 1) {
                  for (int64_t j = 0; j < len; ++j) yRow[j] += wv * xRow[j];
                } else {
                  for (int64_t j = 0; j < len; ++j) yRow[j] += wv * xRow[j * ww.stride];
                }
              }
            }
          }
        }
      }
    }
  }
}

Status conv2dKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  const Tensor& x = in[0];
  const Tensor& w = in[1];
  const auto& dil = attrs.getInts("dilations");
  const Window wh = heightWindow(attrs, x, out[0], w.shape()[2], dil[0]);
  const Window ww = widthWindow(attrs, x, out[0], w.shape()[3], dil[1]);
  return ref::dispatchFloat(ref::opNameOf(attrs), x.dtype(), [&]<class T>(Tag<T>) {
    conv2d(x.data<T>(), w.data<T>(), in.size() == 3 ? in[2].data<T>() : nullptr, out[0].data<T>(),
           x.shape()[0], x.shape()[1], w.shape()[0], attrs.getInt("group"), wh, ww);
    return Status::ok();
  });
}

// ---- Pooling.

// Sets every output element of every (n, c) plane to f(inputPlane, oh, ow).
template <class T, class F>
void forEachPoolWindow(const Tensor& x, Tensor& y, const Window& wh, const Window& ww, F f) {
  const int64_t planes = x.shape()[0] * x.shape()[1];
  const T* xp = x.data<T>();
  T* yp = y.data<T>();
  for (int64_t p = 0; p < planes; ++p) {
    const T* xPlane = xp + p * wh.in * ww.in;
    T* yPlane = yp + p * wh.out * ww.out;
    for (int64_t oh = 0; oh < wh.out; ++oh)
      for (int64_t ow = 0; ow < ww.out; ++ow) yPlane[oh * ww.out + ow] = f(xPlane, oh, ow);
  }
}

Status maxPool2dKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                       std::span<Tensor> out) {
  const auto& k = attrs.getInts("kernel");
  const auto& dil = attrs.getInts("dilations");
  const Window wh = heightWindow(attrs, in[0], out[0], k[0], dil[0]);
  const Window ww = widthWindow(attrs, in[0], out[0], k[1], dil[1]);
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    forEachPoolWindow<T>(in[0], out[0], wh, ww, [&](const T* xPlane, int64_t oh, int64_t ow) {
      // Padded cells are skipped, so they never win; NaN wins, as in PyTorch.
      T best = -std::numeric_limits<T>::infinity();
      for (int64_t kh = 0; kh < wh.kernel; ++kh) {
        const int64_t ih = wh.start(oh) + kh * wh.dilation;
        if (ih < 0 || ih >= wh.in) continue;
        for (int64_t kw = 0; kw < ww.kernel; ++kw) {
          const int64_t iw = ww.start(ow) + kw * ww.dilation;
          if (iw < 0 || iw >= ww.in) continue;
          const T v = xPlane[ih * ww.in + iw];
          if (v > best || ref::isNaN(v)) best = v;
          if (ref::isNaN(best)) return best;
        }
      }
      return best;
    });
    return Status::ok();
  });
}

Status avgPool2dKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                       std::span<Tensor> out) {
  const auto& k = attrs.getInts("kernel");
  const bool includePad = attrs.getInt("count_include_pad") != 0;
  const Window wh = heightWindow(attrs, in[0], out[0], k[0], 1);
  const Window ww = widthWindow(attrs, in[0], out[0], k[1], 1);
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    forEachPoolWindow<T>(in[0], out[0], wh, ww, [&](const T* xPlane, int64_t oh, int64_t ow) {
      // As PyTorch: the window is first clipped to the padded input (a ceil_mode window can
      // run past it), which is the count_include_pad divisor; then clipped to the input.
      const int64_t h0 = wh.start(oh), w0 = ww.start(ow);
      const int64_t h1 = std::min(h0 + wh.kernel, wh.in + wh.padEnd);
      const int64_t w1 = std::min(w0 + ww.kernel, ww.in + ww.padEnd);
      const int64_t padded = (h1 - h0) * (w1 - w0);
      const int64_t hs = std::max<int64_t>(h0, 0), he = std::min(h1, wh.in);
      const int64_t ws = std::max<int64_t>(w0, 0), we = std::min(w1, ww.in);
      T sum = T(0);
      for (int64_t ih = hs; ih < he; ++ih)
        for (int64_t iw = ws; iw < we; ++iw) sum += xPlane[ih * ww.in + iw];
      const int64_t count = includePad ? padded : (he - hs) * (we - ws);
      return sum / static_cast<T>(count);
    });
    return Status::ok();
  });
}

Status globalAvgPoolKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                           std::span<Tensor> out) {
  const int64_t planes = in[0].shape()[0] * in[0].shape()[1];
  const int64_t size = in[0].shape()[2] * in[0].shape()[3];
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    const T* x = in[0].data<T>();
    T* y = out[0].data<T>();
    for (int64_t p = 0; p < planes; ++p) {
      T sum = T(0);
      for (int64_t i = 0; i < size; ++i) sum += x[p * size + i];
      y[p] = sum / static_cast<T>(size);
    }
    return Status::ok();
  });
}

// ---- Gradients. Each loop nest is the forward's, with the multiply-add turned around.

// dx[n, c, ih, iw] += w[m, c, kh, kw] * dy[n, m, oh, ow] over every tap that read x there.
// Samples are independent (each writes its own dx planes): they run in parallel.
template <class T>
void conv2dBackwardData(const T* __restrict dy, const T* __restrict w, T* __restrict dx,
                        int64_t batch, int64_t channels, int64_t outChannels, int64_t group,
                        const Window& wh, const Window& ww) {
  const int64_t cPerGroup = channels / group, mPerGroup = outChannels / group;
  const int64_t inPlane = wh.in * ww.in, outPlane = wh.out * ww.out;
  const int64_t taps = wh.kernel * ww.kernel;
  std::fill(dx, dx + batch * channels * inPlane, T(0));
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < batch; ++n)
    for (int64_t g = 0; g < group; ++g)
      for (int64_t mg = 0; mg < mPerGroup; ++mg) {
        const int64_t m = g * mPerGroup + mg;
        const T* dyPlane = dy + (n * outChannels + m) * outPlane;
        for (int64_t c = 0; c < cPerGroup; ++c) {
          T* dxPlane = dx + (n * channels + g * cPerGroup + c) * inPlane;
          const T* wTaps = w + (m * cPerGroup + c) * taps;
          for (int64_t kh = 0; kh < wh.kernel; ++kh) {
            const auto [ohLo, ohHi] = wh.validOutputs(kh);
            for (int64_t kw = 0; kw < ww.kernel; ++kw) {
              const auto [owLo, owHi] = ww.validOutputs(kw);
              const T wv = wTaps[kh * ww.kernel + kw];
              const int64_t len = owHi - owLo;
              for (int64_t oh = ohLo; oh < ohHi; ++oh) {
                const int64_t ih = wh.start(oh) + kh * wh.dilation;
                T* dxRow = dxPlane + ih * ww.in + ww.start(owLo) + kw * ww.dilation;
                const T* dyRow = dyPlane + oh * ww.out + owLo;
                if (ww.stride == 1) {
                  for (int64_t j = 0; j < len; ++j) dxRow[j] += wv * dyRow[j];
                } else {
                  for (int64_t j = 0; j < len; ++j) dxRow[j * ww.stride] += wv * dyRow[j];
                }
              }
            }
          }
        }
      }
}

// dw[m, c, kh, kw] = sum over n, oh, ow of dy[n, m, oh, ow] * x[n, c, ih, iw]. Output channels
// are independent: they run in parallel; each dot product keeps kLanes partial sums so that it
// vectorizes (the order of the additions differs from a plain loop, within rounding).
template <class T>
void conv2dBackwardWeight(const T* __restrict dy, const T* __restrict x, T* __restrict dw,
                          int64_t batch, int64_t channels, int64_t outChannels, int64_t group,
                          const Window& wh, const Window& ww) {
  constexpr int kLanes = 8;
  const int64_t cPerGroup = channels / group, mPerGroup = outChannels / group;
  const int64_t inPlane = wh.in * ww.in, outPlane = wh.out * ww.out;
  const int64_t taps = wh.kernel * ww.kernel;
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < outChannels; ++m) {
    const int64_t g = m / mPerGroup;
    for (int64_t c = 0; c < cPerGroup; ++c) {
      T* dwTaps = dw + (m * cPerGroup + c) * taps;
      for (int64_t kh = 0; kh < wh.kernel; ++kh) {
        const auto [ohLo, ohHi] = wh.validOutputs(kh);
        for (int64_t kw = 0; kw < ww.kernel; ++kw) {
          const auto [owLo, owHi] = ww.validOutputs(kw);
          const int64_t len = owHi - owLo;
          T lanes[kLanes] = {};
          T tail = T(0);
          for (int64_t n = 0; n < batch; ++n) {
            const T* dyPlane = dy + (n * outChannels + m) * outPlane;
            const T* xPlane = x + (n * channels + g * cPerGroup + c) * inPlane;
            for (int64_t oh = ohLo; oh < ohHi; ++oh) {
              const int64_t ih = wh.start(oh) + kh * wh.dilation;
              const T* xRow = xPlane + ih * ww.in + ww.start(owLo) + kw * ww.dilation;
              const T* dyRow = dyPlane + oh * ww.out + owLo;
              if (ww.stride == 1) {
                int64_t j = 0;
                for (; j + kLanes <= len; j += kLanes)
                  for (int l = 0; l < kLanes; ++l) lanes[l] += dyRow[j + l] * xRow[j + l];
                for (; j < len; ++j) tail += dyRow[j] * xRow[j];
              } else {
                for (int64_t j = 0; j < len; ++j) tail += dyRow[j] * xRow[j * ww.stride];
              }
            }
          }
          for (int l = 0; l < kLanes; ++l) tail += lanes[l];
          dwTaps[kh * ww.kernel + kw] = tail;
        }
      }
    }
  }
}

// conv2d_backward_data(grad, weight, input) and conv2d_backward_weight(grad, input, weight).
template <bool kWeight>
Status conv2dBackwardKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                            std::span<Tensor> out) {
  const Tensor& dy = in[0];
  const Tensor& x = kWeight ? in[1] : in[2];
  const Tensor& w = kWeight ? in[2] : in[1];
  const auto& dil = attrs.getInts("dilations");
  const Window wh = heightWindow(attrs, x, dy, w.shape()[2], dil[0]);
  const Window ww = widthWindow(attrs, x, dy, w.shape()[3], dil[1]);
  const int64_t group = attrs.getInt("group");
  return ref::dispatchFloat(ref::opNameOf(attrs), x.dtype(), [&]<class T>(Tag<T>) {
    if constexpr (kWeight)
      conv2dBackwardWeight(dy.data<T>(), x.data<T>(), out[0].data<T>(), x.shape()[0], x.shape()[1],
                           w.shape()[0], group, wh, ww);
    else
      conv2dBackwardData(dy.data<T>(), w.data<T>(), out[0].data<T>(), x.shape()[0], x.shape()[1],
                         w.shape()[0], group, wh, ww);
    return Status::ok();
  });
}

// conv_transpose2d(x, w) is conv2d_backward_data(x, w, y) (ops.def), which reads y's shape only.
Status convTranspose2dKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                             std::span<Tensor> out) {
  return ref::asConvBackwardData(attrs, in, out[0],
                                 [&](const ir::AttrView& data, std::span<const Tensor> operands) {
                                   return conv2dBackwardKernel<false>(data, operands, out);
                                 });
}

// max_pool2d_backward of the most common pooling, 2x2 windows with stride 2, no padding, every
// window inside the input (CNNs' downsampling): the windows tile the input without overlap, so
// each input element is written once (its window's gradient or 0) in one pass, with no zeroing
// pass and no window arithmetic. The choice is the general kernel's, in its scan order: the
// first NaN, else the first strictly larger element.
//
// Branch-free: the choice is data-dependent (an unpredictable branch per element took 4.4 ns a
// window on mnist_cnn's 64x64x24x24 pooling); the largest first, then a NaN overriding it, which
// is the same choice: without NaN the first strictly larger element, else the first NaN.
template <class T>
inline void maxPool2x2BackwardRow(const T* __restrict r0, const T* __restrict r1,
                                  const T* __restrict g, T* __restrict d0, T* __restrict d1,
                                  int64_t wout) {
  for (int64_t ow = 0; ow < wout; ++ow) {
    const T a = r0[2 * ow], b = r0[2 * ow + 1], c = r1[2 * ow], d = r1[2 * ow + 1];
    const T m1 = b > a ? b : a;
    const T i1 = b > a ? T(1) : T(0);
    const T m2 = c > m1 ? c : m1;
    const T i2 = c > m1 ? T(2) : i1;
    T arg = d > m2 ? T(3) : i2;
    arg = d != d ? T(3) : arg;  // The first NaN wins: applied last to first.
    arg = c != c ? T(2) : arg;
    arg = b != b ? T(1) : arg;
    arg = a != a ? T(0) : arg;
    const T v = g[ow];
    d0[2 * ow] = arg == T(0) ? v : T(0);
    d0[2 * ow + 1] = arg == T(1) ? v : T(0);
    d1[2 * ow] = arg == T(2) ? v : T(0);
    d1[2 * ow + 1] = arg == T(3) ? v : T(0);
  }
}
// f32, the training hot path: vectorized per ISA.
KILN_CPU_CLONES void maxPool2x2BackwardRowF32(const float* r0, const float* r1, const float* g,
                                              float* d0, float* d1, int64_t wout) {
  maxPool2x2BackwardRow(r0, r1, g, d0, d1, wout);
}

template <class T>
void maxPool2x2Backward(const T* __restrict x, const T* __restrict dy, T* __restrict dx,
                        int64_t planes, const Window& wh, const Window& ww) {
  const int64_t win = ww.in, hout = wh.out, wout = ww.out;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < planes; ++p) {
    const T* xp = x + p * wh.in * win;
    const T* gp = dy + p * hout * wout;
    T* dp = dx + p * wh.in * win;
    for (int64_t oh = 0; oh < hout; ++oh) {
      const T* r0 = xp + 2 * oh * win;
      const T* r1 = r0 + win;
      T* d0 = dp + 2 * oh * win;
      T* d1 = d0 + win;
      const T* g = gp + oh * wout;
      if constexpr (std::is_same_v<T, float>)
        maxPool2x2BackwardRowF32(r0, r1, g, d0, d1, wout);
      else
        maxPool2x2BackwardRow(r0, r1, g, d0, d1, wout);
      std::fill(d0 + 2 * wout, d0 + win, T(0));  // An odd width's last column: in no window.
      std::fill(d1 + 2 * wout, d1 + win, T(0));
    }
    std::fill(dp + 2 * hout * win, dp + wh.in * win, T(0));  // An odd height's last row.
  }
}

// The choice of each window [lo, hi) of one output row whose windows lie inside the input (the
// row at plane offset `rowStart`, taps dilH/dilW apart, windows strideW apart starting at column
// `w0` for window 0): in arg, its offset in the plane. Branch-free, so that it vectorizes across
// windows (resnet18's 3x3 stride-2 stem pooling took 66 ms a training step at batch 32 with a
// branch per tap): the first strictly larger element in scan order, a NaN overriding it — the
// first NaN with kFirstNaN (the gradient's choice, as the general loop of max_pool2d_backward
// makes it; `nan` tracks it), else each NaN taking over, so the last (max_pool2d_indices, as
// PyTorch's kernels; `nan` unused).
// kStride: the window stride when it is known at compile time (1 or 2: strided loads the compiler
// can vectorize), else 0 (strideW).
template <class T, bool kFirstNaN, int64_t kStride = 0>
inline void maxWindowArgs(const T* __restrict plane, int64_t win, int64_t rowStart, int64_t kh,
                          int64_t kw, int64_t dilH, int64_t dilW, int64_t stride, int64_t w0,
                          int64_t lo, int64_t hi, T* __restrict best, int32_t* __restrict arg,
                          uint8_t* __restrict nan) {
  const int64_t strideW = kStride ? kStride : stride;
  const int64_t n = hi - lo;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t idx = rowStart + w0 + (lo + i) * strideW;
    best[i] = plane[idx];
    arg[i] = static_cast<int32_t>(idx);
    if constexpr (kFirstNaN) nan[i] = plane[idx] != plane[idx];
  }
  for (int64_t a = 0; a < kh; ++a)
    for (int64_t b = 0; b < kw; ++b) {
      if (a == 0 && b == 0) continue;
      const int64_t off = rowStart + a * dilH * win + w0 + b * dilW + lo * strideW;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t idx = off + i * strideW;
        const T v = plane[idx];
        bool take = (v > best[i]) | (v != v);  // No branches.
        if constexpr (kFirstNaN) take = take & (nan[i] == 0);
        best[i] = take ? v : best[i];
        arg[i] = take ? static_cast<int32_t>(idx) : arg[i];
        if constexpr (kFirstNaN) nan[i] = nan[i] | static_cast<uint8_t>(v != v);
      }
    }
}
template <bool kFirstNaN>
[[gnu::always_inline]] inline void maxWindowArgsByStride(const float* plane, int64_t win,
                                                         int64_t rowStart, int64_t kh, int64_t kw,
                                                         int64_t dilH, int64_t dilW,
                                                         int64_t strideW, int64_t w0, int64_t lo,
                                                         int64_t hi, float* best, int32_t* arg,
                                                         uint8_t* nan) {
  if (strideW == 2)
    maxWindowArgs<float, kFirstNaN, 2>(plane, win, rowStart, kh, kw, dilH, dilW, 2, w0, lo, hi,
                                       best, arg, nan);
  else if (strideW == 1)
    maxWindowArgs<float, kFirstNaN, 1>(plane, win, rowStart, kh, kw, dilH, dilW, 1, w0, lo, hi,
                                       best, arg, nan);
  else
    maxWindowArgs<float, kFirstNaN>(plane, win, rowStart, kh, kw, dilH, dilW, strideW, w0, lo, hi,
                                    best, arg, nan);
}
// f32, the training hot path: vectorized per ISA.
KILN_CPU_CLONES void maxWindowArgsF32(const float* plane, int64_t win, int64_t rowStart, int64_t kh,
                                      int64_t kw, int64_t dilH, int64_t dilW, int64_t strideW,
                                      int64_t w0, int64_t lo, int64_t hi, float* best, int32_t* arg,
                                      uint8_t* nan) {
  maxWindowArgsByStride<true>(plane, win, rowStart, kh, kw, dilH, dilW, strideW, w0, lo, hi, best,
                              arg, nan);
}
KILN_CPU_CLONES void maxWindowLastNaNArgsF32(const float* plane, int64_t win, int64_t rowStart,
                                             int64_t kh, int64_t kw, int64_t dilH, int64_t dilW,
                                             int64_t strideW, int64_t w0, int64_t lo, int64_t hi,
                                             float* best, int32_t* arg) {
  maxWindowArgsByStride<false>(plane, win, rowStart, kh, kw, dilH, dilW, strideW, w0, lo, hi, best,
                               arg, nullptr);
}

// The output columns [lo, hi) whose windows lie inside the input horizontally (every tap's
// valid range holds them), for the branch-free scan above; none for planes of 2^31 elements or
// more, whose offsets an int32 does not hold.
std::pair<int64_t, int64_t> interiorColumns(const Window& wh, const Window& ww) {
  const auto [lo0, hi0] = ww.validOutputs(0);
  const auto [loK, hiK] = ww.validOutputs(ww.kernel - 1);
  const int64_t lo = std::max(lo0, loK);
  if (wh.in * ww.in >= (int64_t{1} << 31)) return {lo, lo};
  return {lo, std::max(lo, std::min(hi0, hiK))};
}

// Whether output row oh's windows lie inside the input vertically.
bool rowInside(const Window& wh, int64_t oh) {
  const int64_t top = wh.start(oh);
  return top >= 0 && top + (wh.kernel - 1) * wh.dilation < wh.in;
}

// Output o's first tap at or past 0 (it may lie past the input, for a dilated window wholly in
// the padding).
int64_t firstTap(const Window& w, int64_t o) {
  const int64_t s = w.start(o);
  return s >= 0 ? s : s + (-s + w.dilation - 1) / w.dilation * w.dilation;
}

Status maxPool2dBackwardKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                               std::span<Tensor> out) {
  const Tensor& dy = in[0];
  const Tensor& x = in[1];
  const auto& k = attrs.getInts("kernel");
  const auto& dil = attrs.getInts("dilations");
  const Window wh = heightWindow(attrs, x, dy, k[0], dil[0]);
  const Window ww = widthWindow(attrs, x, dy, k[1], dil[1]);
  return ref::dispatchFloat(ref::opNameOf(attrs), x.dtype(), [&]<class T>(Tag<T>) {
    const int64_t planes = x.shape()[0] * x.shape()[1];
    T* dx = out[0].data<T>();
    if (k[0] == 2 && k[1] == 2 && wh.stride == 2 && ww.stride == 2 && wh.dilation == 1 &&
        ww.dilation == 1 && wh.padBegin == 0 && ww.padBegin == 0 && 2 * wh.out <= wh.in &&
        2 * ww.out <= ww.in) {
      maxPool2x2Backward(x.data<T>(), dy.data<T>(), dx, planes, wh, ww);
      return Status::ok();
    }
    // Not a structured binding: clang 16 crashes on one used in an OpenMP region in a lambda.
    const std::pair<int64_t, int64_t> inner = interiorColumns(wh, ww);
    const int64_t innerLo = inner.first, innerHi = inner.second;
    // Planes are independent: each thread zeroes and fills its own.
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < planes; ++p) {
      const T* xPlane = x.data<T>() + p * wh.in * ww.in;
      const T* dyPlane = dy.data<T>() + p * wh.out * ww.out;
      T* dxPlane = dx + p * wh.in * ww.in;
      std::fill(dxPlane, dxPlane + wh.in * ww.in, T(0));
      std::vector<T> rowBest(static_cast<size_t>(innerHi - innerLo));
      std::vector<int32_t> rowArg(rowBest.size());  // Plane offsets (planes below 2^31).
      std::vector<uint8_t> rowNan(rowBest.size());
      for (int64_t oh = 0; oh < wh.out; ++oh) {
        const int64_t top = wh.start(oh);
        const bool inside = rowInside(wh, oh);
        if (inside && innerLo < innerHi) {
          // The interior windows at once; the scatter-add after (windows may overlap).
          const int64_t rowStart = top * ww.in, w0 = ww.start(0);
          if constexpr (std::is_same_v<T, float>)
            maxWindowArgsF32(xPlane, ww.in, rowStart, wh.kernel, ww.kernel, wh.dilation,
                             ww.dilation, ww.stride, w0, innerLo, innerHi, rowBest.data(),
                             rowArg.data(), rowNan.data());
          else
            maxWindowArgs<T, true>(xPlane, ww.in, rowStart, wh.kernel, ww.kernel, wh.dilation,
                                   ww.dilation, ww.stride, w0, innerLo, innerHi, rowBest.data(),
                                   rowArg.data(), rowNan.data());
          const T* g = dyPlane + oh * ww.out + innerLo;
          for (int64_t i = 0; i < innerHi - innerLo; ++i) dxPlane[rowArg[i]] += g[i];
        }
        for (int64_t ow = 0; ow < ww.out; ++ow) {
          if (inside && ow >= innerLo && ow < innerHi) continue;  // Done above.
          const int64_t h0 = wh.start(oh), w0 = ww.start(ow);
          if (h0 >= 0 && w0 >= 0 && h0 + (wh.kernel - 1) * wh.dilation < wh.in &&
              w0 + (ww.kernel - 1) * ww.dilation < ww.in) {
            // A window inside the input: the same choice without bounds checks.
            int64_t arg = h0 * ww.in + w0;
            T best = xPlane[arg];
            for (int64_t kh = 0; kh < wh.kernel && best == best; ++kh) {
              const T* row = xPlane + (h0 + kh * wh.dilation) * ww.in + w0;
              for (int64_t kw = 0; kw < ww.kernel; ++kw) {
                const T v = row[kw * ww.dilation];
                if (v > best || v != v) {
                  best = v;
                  arg = (h0 + kh * wh.dilation) * ww.in + w0 + kw * ww.dilation;
                  if (v != v) break;
                }
              }
            }
            dxPlane[arg] += dyPlane[oh * ww.out + ow];
            continue;
          }
          // The forward's choice: the first strictly larger element, NaN first.
          T best = -std::numeric_limits<T>::infinity();
          int64_t arg = -1;
          for (int64_t kh = 0; kh < wh.kernel && !(arg >= 0 && ref::isNaN(best)); ++kh) {
            const int64_t ih = wh.start(oh) + kh * wh.dilation;
            if (ih < 0 || ih >= wh.in) continue;
            for (int64_t kw = 0; kw < ww.kernel; ++kw) {
              const int64_t iw = ww.start(ow) + kw * ww.dilation;
              if (iw < 0 || iw >= ww.in) continue;
              const T v = xPlane[ih * ww.in + iw];
              if (arg < 0 || v > best || ref::isNaN(v)) {
                best = v;
                arg = ih * ww.in + iw;
              }
              if (ref::isNaN(best)) break;
            }
          }
          if (arg >= 0) dxPlane[arg] += dyPlane[oh * ww.out + ow];
        }
      }
    }
    return Status::ok();
  });
}

// max_pool2d_indices: each window's choice as ops.def says (PyTorch's): a row's windows inside
// the input at once (maxWindowArgs, branch-free), the others tap by tap.
Status maxPool2dIndicesKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                              std::span<Tensor> out) {
  const Tensor& x = in[0];
  const auto& k = attrs.getInts("kernel");
  const auto& dil = attrs.getInts("dilations");
  const Window wh = heightWindow(attrs, x, out[0], k[0], dil[0]);
  const Window ww = widthWindow(attrs, x, out[0], k[1], dil[1]);
  return ref::dispatchFloat(ref::opNameOf(attrs), x.dtype(), [&]<class T>(Tag<T>) {
    const int64_t planes = x.shape()[0] * x.shape()[1];
    // Not a structured binding: clang 16 crashes on one used in an OpenMP region in a lambda.
    const std::pair<int64_t, int64_t> inner = interiorColumns(wh, ww);
    const int64_t innerLo = inner.first, innerHi = inner.second;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < planes; ++p) {
      const T* xPlane = x.data<T>() + p * wh.in * ww.in;
      int64_t* args = out[0].data<int64_t>() + p * wh.out * ww.out;
      std::vector<T> rowBest(static_cast<size_t>(innerHi - innerLo));
      std::vector<int32_t> rowArg(rowBest.size());
      for (int64_t oh = 0; oh < wh.out; ++oh) {
        int64_t* row = args + oh * ww.out;
        const bool inside = rowInside(wh, oh);
        if (inside && innerLo < innerHi) {
          const int64_t rowStart = wh.start(oh) * ww.in, w0 = ww.start(0);
          if constexpr (std::is_same_v<T, float>)
            maxWindowLastNaNArgsF32(xPlane, ww.in, rowStart, wh.kernel, ww.kernel, wh.dilation,
                                    ww.dilation, ww.stride, w0, innerLo, innerHi, rowBest.data(),
                                    rowArg.data());
          else
            maxWindowArgs<T, false>(xPlane, ww.in, rowStart, wh.kernel, ww.kernel, wh.dilation,
                                    ww.dilation, ww.stride, w0, innerLo, innerHi, rowBest.data(),
                                    rowArg.data(), nullptr);
          std::copy(rowArg.begin(), rowArg.end(), row + innerLo);
        }
        for (int64_t ow = 0; ow < ww.out; ++ow) {
          if (inside && ow >= innerLo && ow < innerHi) continue;  // Done above.
          // PyTorch's start: the first tap at or past row and column 0, where the index of a
          // window of -inf stays (of a dilated window wholly in the padding too, past the input).
          T best = -std::numeric_limits<T>::infinity();
          int64_t arg = firstTap(wh, oh) * ww.in + firstTap(ww, ow);
          for (int64_t kh = 0; kh < wh.kernel; ++kh) {
            const int64_t ih = wh.start(oh) + kh * wh.dilation;
            if (ih < 0 || ih >= wh.in) continue;
            for (int64_t kw = 0; kw < ww.kernel; ++kw) {
              const int64_t iw = ww.start(ow) + kw * ww.dilation;
              if (iw < 0 || iw >= ww.in) continue;
              const T v = xPlane[ih * ww.in + iw];
              if (v > best || v != v) {
                best = v;
                arg = ih * ww.in + iw;
              }
            }
          }
          row[ow] = arg;
        }
      }
    }
    return Status::ok();
  });
}

Status avgPool2dBackwardKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                               std::span<Tensor> out) {
  const Tensor& dy = in[0];
  const Tensor& x = in[1];
  const auto& k = attrs.getInts("kernel");
  const bool includePad = attrs.getInt("count_include_pad") != 0;
  const Window wh = heightWindow(attrs, x, dy, k[0], 1);
  const Window ww = widthWindow(attrs, x, dy, k[1], 1);
  return ref::dispatchFloat(ref::opNameOf(attrs), x.dtype(), [&]<class T>(Tag<T>) {
    const int64_t planes = x.shape()[0] * x.shape()[1];
    T* dx = out[0].data<T>();
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < planes; ++p) {
      const T* dyPlane = dy.data<T>() + p * wh.out * ww.out;
      T* dxPlane = dx + p * wh.in * ww.in;
      std::fill(dxPlane, dxPlane + wh.in * ww.in, T(0));
      for (int64_t oh = 0; oh < wh.out; ++oh)
        for (int64_t ow = 0; ow < ww.out; ++ow) {
          // The forward's window and divisor (avgPool2dKernel).
          const int64_t h0 = wh.start(oh), w0 = ww.start(ow);
          const int64_t h1 = std::min(h0 + wh.kernel, wh.in + wh.padEnd);
          const int64_t w1 = std::min(w0 + ww.kernel, ww.in + ww.padEnd);
          const int64_t hs = std::max<int64_t>(h0, 0), he = std::min(h1, wh.in);
          const int64_t ws = std::max<int64_t>(w0, 0), we = std::min(w1, ww.in);
          const int64_t count = includePad ? (h1 - h0) * (w1 - w0) : (he - hs) * (we - ws);
          const T share = dyPlane[oh * ww.out + ow] / static_cast<T>(count);
          for (int64_t ih = hs; ih < he; ++ih)
            for (int64_t iw = ws; iw < we; ++iw) dxPlane[ih * ww.in + iw] += share;
        }
    }
    return Status::ok();
  });
}

// ---- roi_align.

// ONNX's reference loops (ONNX Runtime's too): per roi, each sample's four bilinear taps, shared
// by the channels; positions and sums in f64.
Status roiAlignKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                      std::span<Tensor> out) {
  const std::string_view op = ref::opNameOf(attrs);
  const ir::Shape& xs = in[0].shape();
  const int64_t n = xs[0], channels = xs[1], height = xs[2], width = xs[3];
  const int64_t rois = in[1].shape()[0];
  const int64_t oh = attrs.getInt("output_height"), ow = attrs.getInt("output_width");
  const int64_t ratio = attrs.getInt("sampling_ratio");
  const double scale = attrs.getFloat("spatial_scale");
  const bool aligned = attrs.getInt("aligned") != 0, avg = attrs.getString("mode") == "avg";
  // One roi's samples at most (a roi far larger than its image with sampling_ratio 0): their
  // taps take 64 bytes each, 256 MB.
  constexpr double kMaxSamples = 1 << 22;
  struct Tap {
    int64_t pos[4];
    double w[4];
  };
  std::vector<Tap> taps;
  return ref::dispatchFloat(op, in[0].dtype(), [&]<class T>(Tag<T>) -> Status {
    const T* x = in[0].data<T>();
    const T* box = in[1].data<T>();
    const int64_t* image = in[2].data<int64_t>();
    T* y = out[0].data<T>();
    for (int64_t r = 0; r < rois; ++r) {
      const int64_t b = image[r];
      if (b < 0 || b >= n)
        return invalidArgument(std::string(op) + ": roi " + std::to_string(r) + " names image " +
                               std::to_string(b) + " of a batch of " + std::to_string(n));
      const double shift = aligned ? 0.5 : 0.0;
      const double x0 = box[r * 4] * scale - shift, y0 = box[r * 4 + 1] * scale - shift;
      const double x1 = box[r * 4 + 2] * scale - shift, y1 = box[r * 4 + 3] * scale - shift;
      double rw = x1 - x0, rh = y1 - y0;
      if (!std::isfinite(rw) || !std::isfinite(rh) || !std::isfinite(x0) || !std::isfinite(y0))
        return invalidArgument(std::string(op) + ": roi " + std::to_string(r) +
                               " has a coordinate that is not finite");
      if (!aligned) rw = std::max(rw, 1.0), rh = std::max(rh, 1.0);
      const double binH = rh / static_cast<double>(oh), binW = rw / static_cast<double>(ow);
      const double gridH = ratio > 0 ? static_cast<double>(ratio) : std::max(std::ceil(binH), 0.0);
      const double gridW = ratio > 0 ? static_cast<double>(ratio) : std::max(std::ceil(binW), 0.0);
      if (gridH * gridW * static_cast<double>(oh * ow) > kMaxSamples)
        return invalidArgument(std::string(op) + ": roi " + std::to_string(r) + " of " +
                               std::to_string(rw) + " x " + std::to_string(rh) +
                               " takes more than 2^22 samples (set sampling_ratio)");
      const int64_t gh = static_cast<int64_t>(gridH), gw = static_cast<int64_t>(gridW);
      const double count = static_cast<double>(std::max<int64_t>(gh * gw, 1));
      taps.assign(static_cast<size_t>(oh * ow * gh * gw), Tap{});
      size_t t = 0;
      for (int64_t ph = 0; ph < oh; ++ph)
        for (int64_t pw = 0; pw < ow; ++pw)
          for (int64_t iy = 0; iy < gh; ++iy)
            for (int64_t ix = 0; ix < gw; ++ix, ++t) {
              double sy = y0 + ph * binH + (iy + 0.5) * binH / static_cast<double>(gh);
              double sx = x0 + pw * binW + (ix + 0.5) * binW / static_cast<double>(gw);
              if (sy < -1.0 || sy > height || sx < -1.0 || sx > width) continue;  // Reads 0.
              sy = std::max(sy, 0.0), sx = std::max(sx, 0.0);
              int64_t yl = static_cast<int64_t>(sy), xl = static_cast<int64_t>(sx), yh, xh;
              if (yl >= height - 1) {
                yh = yl = height - 1;
                sy = static_cast<double>(yl);
              } else {
                yh = yl + 1;
              }
              if (xl >= width - 1) {
                xh = xl = width - 1;
                sx = static_cast<double>(xl);
              } else {
                xh = xl + 1;
              }
              const double ly = sy - static_cast<double>(yl), lx = sx - static_cast<double>(xl);
              const double hy = 1 - ly, hx = 1 - lx;
              taps[t] = {{yl * width + xl, yl * width + xh, yh * width + xl, yh * width + xh},
                         {hy * hx, hy * lx, ly * hx, ly * lx}};
            }
      for (int64_t c = 0; c < channels; ++c) {
        const T* plane = x + (b * channels + c) * height * width;
        T* dst = y + (r * channels + c) * oh * ow;
        const Tap* tap = taps.data();
        for (int64_t bin = 0; bin < oh * ow; ++bin) {
          double v = 0;
          for (int64_t s = 0; s < gh * gw; ++s, ++tap) {
            double sample = tap->w[0] * plane[tap->pos[0]];
            if (avg) {
              for (int k = 1; k < 4; ++k) sample += tap->w[k] * plane[tap->pos[k]];
              v += sample;
            } else {  // ONNX's max: the largest weighted corner, then the largest sample.
              for (int k = 1; k < 4; ++k) sample = std::max(sample, tap->w[k] * plane[tap->pos[k]]);
              v = s == 0 ? sample : std::max(v, sample);
            }
          }
          dst[bin] = static_cast<T>(avg ? v / count : v);
        }
      }
    }
    return Status::ok();
  });
}

}  // namespace

void registerConvPoolKernels(RefKernelTable& t) {
  ref::setKernel(t, ir::OpKind::kConv2d, conv2dKernel);
  ref::setKernel(t, ir::OpKind::kMaxPool2d, maxPool2dKernel);
  ref::setKernel(t, ir::OpKind::kAvgPool2d, avgPool2dKernel);
  ref::setKernel(t, ir::OpKind::kGlobalAvgPool, globalAvgPoolKernel);
  ref::setKernel(t, ir::OpKind::kConv2dBackwardData, conv2dBackwardKernel<false>);
  ref::setKernel(t, ir::OpKind::kConv2dBackwardWeight, conv2dBackwardKernel<true>);
  ref::setKernel(t, ir::OpKind::kConvTranspose2d, convTranspose2dKernel);
  ref::setKernel(t, ir::OpKind::kRoiAlign, roiAlignKernel);
  ref::setKernel(t, ir::OpKind::kMaxPool2dBackward, maxPool2dBackwardKernel);
  ref::setKernel(t, ir::OpKind::kMaxPool2dIndices, maxPool2dIndicesKernel);
  ref::setKernel(t, ir::OpKind::kAvgPool2dBackward, avgPool2dBackwardKernel);
}

}  // namespace kiln::runtime
