// Training's BatchNorm and max-pooling gradients as library calls, so that a training step keeps
// its convolution chains channels-last through the backward pass (layout selection, ir's
// kChannelsLast): batch_norm_stats, batch_norm_backward_reduce, batch_norm_backward,
// max_pool2d_backward and conv2d_backward_bias (the bias's gradient: a per-channel sum). Plain
// (NCHW) memory runs kiln's reference kernels; channels-last (NHWC) memory runs the kernels here,
// which read it as a [rows = N*H*W, C] matrix.
//
// Numerics as the reference's: the BatchNorm sums accumulate in double (as PyTorch's CPU kernels)
// over chunks of rows fixed by the shape alone, added in order, so a result does not depend on
// the thread count; the gradient's formula is the reference's, term for term; a max-pooling
// gradient goes to each window's first maximum, NaN first.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "runtime/cpu/cpu_clones.h"
#include "runtime/library/families.h"
#include "runtime/reference/kernels.h"

namespace kiln::runtime::lib {

namespace {

using ir::OpKind;

// Rows per partial sum: about 16K elements, and at most kMaxChunks chunks (the partial sums are
// added up on one thread), whatever the thread count.
constexpr int64_t kMaxChunks = 64;
int64_t chunkRows(int64_t rows, int64_t c) {
  return std::max({int64_t{1}, (int64_t{1} << 14) / std::max<int64_t>(c, 1),
                   (rows + kMaxChunks - 1) / kMaxChunks});
}

// acc[k] = sum over rows of x[r][k].
KILN_CPU_CLONES void sumColumns(const float* x, int64_t rows, int64_t c, double* acc) {
  std::fill(acc, acc + c, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * c;
    for (int64_t k = 0; k < c; ++k) acc[k] += static_cast<double>(row[k]);
  }
}

// s1[k] = sum over rows of d, s2[k] = sum of d^2, d = x[r][k] - shift[k]: the statistics in one
// pass, shifted by a value of the channel so that the variance's subtraction cancels nothing
// that matters in double.
KILN_CPU_CLONES void sumShiftedMoments(const float* x, int64_t rows, int64_t c, const double* shift,
                                       double* s1, double* s2) {
  std::fill(s1, s1 + c, 0.0);
  std::fill(s2, s2 + c, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * c;
    for (int64_t k = 0; k < c; ++k) {
      const double d = static_cast<double>(row[k]) - shift[k];
      s1[k] += d;
      s2[k] += d * d;
    }
  }
}

// sg[k] = sum of g[r][k]; sgx[k] = sum of g[r][k] (x[r][k] - mean[k]).
KILN_CPU_CLONES void sumGradients(const float* g, const float* x, int64_t rows, int64_t c,
                                  const double* mean, double* sg, double* sgx) {
  std::fill(sg, sg + c, 0.0);
  std::fill(sgx, sgx + c, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const float* gr = g + r * c;
    const float* xr = x + r * c;
    for (int64_t k = 0; k < c; ++k) {
      const double gi = static_cast<double>(gr[k]);
      sg[k] += gi;
      sgx[k] += gi * (static_cast<double>(xr[k]) - mean[k]);
    }
  }
}

// Per-chunk partial sums of `columns` column vectors each, added up in chunk order.
template <class Partial>
std::vector<double> chunkedSums(int64_t rows, int64_t c, int columns, Partial partial) {
  const int64_t per = chunkRows(rows, c), chunks = (rows + per - 1) / per;
  std::vector<double> parts(static_cast<size_t>(chunks * columns * c));
#pragma omp parallel for schedule(static)
  for (int64_t ch = 0; ch < chunks; ++ch)
    partial(ch * per, std::min(per, rows - ch * per), parts.data() + ch * columns * c);
  std::vector<double> total(static_cast<size_t>(columns * c), 0.0);
  for (int64_t ch = 0; ch < chunks; ++ch)
    for (int64_t i = 0; i < columns * c; ++i) total[i] += parts[ch * columns * c + i];
  return total;
}

// NHWC x as [rows, C].
struct Rows {
  int64_t rows, c;
  static Rows of(const Tensor& t) {
    const ir::Shape& s = t.shape();
    return {s[0] * s[2] * s[3], s[1]};
  }
};

Status statsNhwc(const Call& call) {
  const Rows shape = Rows::of(call.in[0]);
  const int64_t rows = shape.rows, c = shape.c;  // Plain locals: OpenMP cannot capture a binding.
  const float* x = call.in[0].data<float>();
  float* stats = call.out.data<float>();
  if (rows == 0) {  // 0 / 0, as the reference.
    std::fill_n(stats, 2 * c, std::numeric_limits<float>::quiet_NaN());
    return Status::ok();
  }
  // One pass over x (the two-pass form read resnet18's 318 MB of BatchNorm inputs twice).
  // The shift: the channel's first value when finite (an infinite one would make every
  // difference inf - inf), else 0; non-finite data then gives what the reference gives.
  std::vector<double> shift(x, x + c);
  for (double& v : shift)
    if (!std::isfinite(v)) v = 0;
  const std::vector<double> m = chunkedSums(rows, c, 2, [&](int64_t r0, int64_t n, double* acc) {
    sumShiftedMoments(x + r0 * c, n, c, shift.data(), acc, acc + c);
  });
  const double count = static_cast<double>(rows);
  for (int64_t k = 0; k < c; ++k) {
    const double mean = m[k] / count;
    stats[k] = static_cast<float>(shift[k] + mean);
    const double var = m[c + k] / count - mean * mean;
    stats[c + k] = static_cast<float>(var < 0 ? 0.0 : var);  // Rounding below 0; NaN stays.
  }
  return Status::ok();
}

Status biasGradientNhwc(const Call& call) {
  const Rows shape = Rows::of(call.in[0]);
  const int64_t rows = shape.rows, c = shape.c;  // Plain locals: OpenMP cannot capture a binding.
  const float* g = call.in[0].data<float>();
  const std::vector<double> sums = chunkedSums(
      rows, c, 1, [&](int64_t r0, int64_t n, double* acc) { sumColumns(g + r0 * c, n, c, acc); });
  float* out = call.out.data<float>();
  for (int64_t k = 0; k < c; ++k) out[k] = static_cast<float>(sums[k]);
  return Status::ok();
}

Status backwardReduceNhwc(const Call& call) {
  const Rows shape = Rows::of(call.in[1]);
  const int64_t rows = shape.rows, c = shape.c;  // Plain locals: OpenMP cannot capture a binding.
  const float* g = call.in[0].data<float>();
  const float* x = call.in[1].data<float>();
  const float* meanOf = call.in[2].data<float>();
  const float* varOf = call.in[3].data<float>();
  const double eps = call.attrs.getFloat("epsilon");
  std::vector<double> mean(meanOf, meanOf + c);
  const std::vector<double> sums = chunkedSums(rows, c, 2, [&](int64_t r0, int64_t n, double* acc) {
    sumGradients(g + r0 * c, x + r0 * c, n, c, mean.data(), acc, acc + c);
  });
  float* out = call.out.data<float>();
  for (int64_t k = 0; k < c; ++k) {
    const double inv = 1 / std::sqrt(static_cast<double>(varOf[k]) + eps);
    out[k] = static_cast<float>(sums[c + k] * inv);
    out[c + k] = static_cast<float>(sums[k]);
  }
  return Status::ok();
}

struct BackwardCoefficients {
  std::vector<float> a, inv, mean, meanG, meanGx;
};

KILN_CPU_CLONES void batchNormBackwardRows(const float* g, const float* x, float* dx, int64_t rows,
                                           int64_t c, const BackwardCoefficients& k) {
  const float* a = k.a.data();
  const float* inv = k.inv.data();
  const float* mean = k.mean.data();
  const float* meanG = k.meanG.data();
  const float* meanGx = k.meanGx.data();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < c; ++j) {
      const int64_t i = r * c + j;
      dx[i] = a[j] * (g[i] - meanG[j] - (x[i] - mean[j]) * inv[j] * meanGx[j]);
    }
}

Status backwardNhwc(const Call& call) {
  const Rows shape = Rows::of(call.in[1]);
  const int64_t rows = shape.rows, c = shape.c;  // Plain locals: OpenMP cannot capture a binding.
  const float eps = static_cast<float>(call.attrs.getFloat("epsilon"));
  const float* meanOf = call.in[2].data<float>();
  const float* varOf = call.in[3].data<float>();
  const float* scale = call.in[4].data<float>();
  const float* sums = call.in[5].data<float>();
  const float count = static_cast<float>(rows);
  BackwardCoefficients k;
  for (int64_t j = 0; j < c; ++j) {  // As the reference computes them, in float.
    const float inv = 1.0f / std::sqrt(varOf[j] + eps);
    k.inv.push_back(inv);
    k.a.push_back(scale[j] * inv);
    k.mean.push_back(meanOf[j]);
    k.meanGx.push_back(sums[j] / count);
    k.meanG.push_back(sums[c + j] / count);
  }
  const float* g = call.in[0].data<float>();
  const float* x = call.in[1].data<float>();
  float* dx = call.out.data<float>();
  const int64_t per = chunkRows(rows, c), chunks = (rows + per - 1) / per;
#pragma omp parallel for schedule(static)
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int64_t r0 = ch * per;
    batchNormBackwardRows(g + r0 * c, x + r0 * c, dx + r0 * c, std::min(per, rows - r0), c, k);
  }
  return Status::ok();
}

// One pooling dimension: input and output sizes, the window and its placement.
struct Axis {
  int64_t in, out, kernel, stride, pad, dilation;
  int64_t start(int64_t o) const { return o * stride - pad; }
};

constexpr int64_t kPoolChannels = 64;  // Channels per task and per window scan.

// One output's window over channels [0, NC) (NC a constant: the loops vectorize without masks
// or tails): best[k] and arg[k] become the window's first maximum of channel k and its pixel,
// NaN first (a NaN is kept once seen). False when every tap is padding.
template <int64_t NC>
[[gnu::always_inline]] inline bool windowMax(const float* x, int64_t c, const Axis& ah,
                                             const Axis& aw, int64_t oh, int64_t ow, int64_t nc,
                                             float* best, int32_t* arg) {
  bool first = true;
  for (int64_t kh = 0; kh < ah.kernel; ++kh) {
    const int64_t ih = ah.start(oh) + kh * ah.dilation;
    if (ih < 0 || ih >= ah.in) continue;
    for (int64_t kw = 0; kw < aw.kernel; ++kw) {
      const int64_t iw = aw.start(ow) + kw * aw.dilation;
      if (iw < 0 || iw >= aw.in) continue;
      const int32_t pixel = static_cast<int32_t>(ih * aw.in + iw);
      const float* v = x + pixel * c;
      const int64_t n = NC > 0 ? NC : nc;
      if (first) {
        for (int64_t k = 0; k < n; ++k) {
          best[k] = v[k];
          arg[k] = pixel;
        }
        first = false;
        continue;
      }
      for (int64_t k = 0; k < n; ++k) {
        const bool take = (best[k] == best[k]) & ((v[k] > best[k]) | (v[k] != v[k]));
        best[k] = take ? v[k] : best[k];
        arg[k] = take ? pixel : arg[k];
      }
    }
  }
  return !first;
}

// max_pool2d_backward over channels [c0, c0 + nc) of one image, NHWC: dx gets each output's
// gradient at its window's first maximum. dx's rows are zeroed just before the first window that
// reaches them, so they are still in cache when the gradients land (zeroing the whole image
// first cost resnet18's stem a second pass over 100 MB).
KILN_CPU_CLONES void maxPoolBackwardImage(const float* x, const float* g, float* dx, int64_t c,
                                          int64_t c0, int64_t nc, const Axis& ah, const Axis& aw) {
  alignas(64) float best[kPoolChannels];
  alignas(64) int32_t arg[kPoolChannels];  // Winners' pixels, ih * W + iw (below 2^31).
  int64_t zeroed = 0;                      // dx's rows below this one are zeroed.
  auto zeroRowsBelow = [&](int64_t end) {
    for (; zeroed < std::min(end, ah.in); ++zeroed)
      for (int64_t iw = 0; iw < aw.in; ++iw)
        std::fill_n(dx + (zeroed * aw.in + iw) * c + c0, nc, 0.0f);
  };
  for (int64_t oh = 0; oh < ah.out; ++oh) {
    zeroRowsBelow(ah.start(oh) + (ah.kernel - 1) * ah.dilation + 1);
    for (int64_t ow = 0; ow < aw.out; ++ow) {
      const bool any = nc == kPoolChannels
                           ? windowMax<kPoolChannels>(x + c0, c, ah, aw, oh, ow, nc, best, arg)
                           : windowMax<0>(x + c0, c, ah, aw, oh, ow, nc, best, arg);
      if (!any) continue;  // A window of padding only (ceil_mode, dilation): no gradient.
      const float* go = g + (oh * aw.out + ow) * c + c0;
      for (int64_t k = 0; k < nc; ++k) dx[static_cast<int64_t>(arg[k]) * c + c0 + k] += go[k];
    }
  }
  zeroRowsBelow(ah.in);  // Rows no window reaches.
}

Status maxPoolBackwardNhwc(const Call& call) {
  const Tensor& dy = call.in[0];
  const Tensor& x = call.in[1];
  const auto& k = call.attrs.getInts("kernel");
  const auto& st = call.attrs.getInts("strides");
  const auto& pads = call.attrs.getInts("pads");
  const auto& dil = call.attrs.getInts("dilations");
  const int64_t n = x.shape()[0], c = x.shape()[1];
  if (x.shape()[2] * x.shape()[3] >= (int64_t{1} << 31))
    return unimplemented("max_pool2d_backward: a plane of 2^31 pixels or more");
  const Axis ah{x.shape()[2], dy.shape()[2], k[0], st[0], pads[0], dil[0]};
  const Axis aw{x.shape()[3], dy.shape()[3], k[1], st[1], pads[1], dil[1]};
  const int64_t blocks = (c + kPoolChannels - 1) / kPoolChannels;
  const float* xp = x.data<float>();
  const float* gp = dy.data<float>();
  float* dxp = call.out.data<float>();
  const int64_t inImage = ah.in * aw.in * c, outImage = ah.out * aw.out * c;
  // Channel blocks are independent: no two tasks write the same element.
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n * blocks; ++t) {
    const int64_t img = t / blocks, c0 = (t % blocks) * kPoolChannels;
    maxPoolBackwardImage(xp + img * inImage, gp + img * outImage, dxp + img * inImage, c, c0,
                         std::min(kPoolChannels, c - c0), ah, aw);
  }
  return Status::ok();
}

// `from` in layout `to` (the reference relayout kernel: any dtype).
Status relayout(const Tensor& from, Tensor& out, ir::Layout fromLayout, ir::Layout to) {
  const ir::AttrMap attrs{{"from", std::string(ir::layoutName(fromLayout))},
                          {"to", std::string(ir::layoutName(to))}};
  return referenceKernel(OpKind::kRelayout)(ir::AttrView(ir::opInfo(OpKind::kRelayout), attrs),
                                            {&from, 1}, {&out, 1});
}

}  // namespace

Status runReferenceThroughPlain(OpKind op, const Call& call) {
  const RefKernel kernel = referenceKernel(op);
  if (!kernel) return unimplemented("no reference kernel for " + std::string(ir::opName(op)));
  if (!call.options.channelsLast) return kernel(call.attrs, call.in, {&call.out, 1});
  const ir::OpInfo& info = ir::opInfo(op);
  std::vector<Tensor> in(call.in.begin(), call.in.end());
  for (size_t i = 0; i < in.size(); ++i) {
    if (!ir::isChannelsLastActivation(info, static_cast<int>(i), in[i].shape().size())) continue;
    KILN_ASSIGN_OR_RETURN(Tensor plain, Tensor::empty(in[i].dtype(), in[i].shape()));
    KILN_TRY(relayout(call.in[i], plain, ir::Layout::kNHWC, ir::Layout::kPlain));
    in[i] = std::move(plain);
  }
  if (!ir::isChannelsLastActivation(info, -1, call.out.shape().size()))
    return kernel(call.attrs, in, {&call.out, 1});
  KILN_ASSIGN_OR_RETURN(Tensor plainOut, Tensor::empty(call.out.dtype(), call.out.shape()));
  KILN_TRY(kernel(call.attrs, in, {&plainOut, 1}));
  KILN_TRY(relayout(plainOut, call.out, ir::Layout::kPlain, ir::Layout::kNHWC));
  return Status::ok();
}

Status runTrainingKernel(OpKind op, const Call& call) {
  if (call.options.prepare) return Status::ok();                              // Nothing to set up.
  if (!call.options.channelsLast) return runReferenceThroughPlain(op, call);  // Plain: reference.
  switch (op) {
    case OpKind::kBatchNormStats:
      return statsNhwc(call);
    case OpKind::kBatchNormBackwardReduce:
      return backwardReduceNhwc(call);
    case OpKind::kBatchNormBackward:
      return backwardNhwc(call);
    case OpKind::kConv2dBackwardBias:
      return biasGradientNhwc(call);
    case OpKind::kMaxPool2dBackward:
      return maxPoolBackwardNhwc(call);
    default:
      return runReferenceThroughPlain(op, call);
  }
}

}  // namespace kiln::runtime::lib
