// The library kernel families behind kernels.h: conv2d (oneDNN direct / winograd, kiln's
// im2col + sgemm), pooling (oneDNN), and matmul / gemm / linear (lib::sgemm or oneDNN's matmul).
// The dispatcher (kernels.cpp) validates a call before it reaches a family.
#pragma once

#include <cstdint>
#include <span>

#include "runtime/library/kernels.h"

namespace kiln::runtime::lib {

// One validated call: f32, contiguous, output shaped by shape inference, every kAdd's extra
// tensor shaped like the output (and laid out like it).
struct Call {
  const ir::AttrView& attrs;
  std::span<const Tensor> in;
  std::span<const PostOp> post;
  std::span<const Tensor> extra;
  Tensor& out;
  const LibraryOptions& options;
};

// conv2d's sizes and attributes, with output sizes as shape inference computes them.
struct ConvGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;  // Input [N,C,H,W].
  int64_t m = 0, kh = 0, kw = 0;       // Weights [M,C/group,kh,kw].
  int64_t oh = 0, ow = 0;              // Output [N,M,oh,ow].
  int64_t group = 1;
  int64_t strideH = 1, strideW = 1;
  int64_t padTop = 0, padLeft = 0, padBottom = 0, padRight = 0;
  int64_t dilH = 1, dilW = 1;  // kiln's (and ONNX's) dilation: 1 means dense.

  static ConvGeometry of(const ir::AttrView& attrs, const ir::Shape& x, const ir::Shape& w);
  int64_t cPerGroup() const { return c / group; }
  int64_t mPerGroup() const { return m / group; }
  bool isPointwise() const {  // 1x1, stride 1, unpadded: the input planes are the GEMM operand.
    return kh == 1 && kw == 1 && strideH == 1 && strideW == 1 && padTop == 0 && padLeft == 0 &&
           padBottom == 0 && padRight == 0;
  }
};

// conv2d with oneDNN (kDirect or kWinograd).
Status runConvDnnl(const Call& call, const ConvGeometry& g, ConvAlgo algo);
// Whether oneDNN 2.6 implements winograd for this geometry on this CPU (probed, cached).
bool winogradAvailable(const ConvGeometry& g);
// Whether kAuto means winograd for this f32 convolution or its gradients: where oneDNN has it
// and it was measured faster (conv_dnnl.cpp), with the weights' transform kept across calls
// (a LibraryCache) or made in each (training; the gradients).
bool prefersWinograd(const ConvGeometry& g, bool weightsCached);
// Whether winograd gives this shape the same bits at every thread count a call can be granted
// (probed once per shape and budget; conv_dnnl.cpp): kAuto and autotuning take it only then.
bool winogradThreadInvariant(const ConvGeometry& g, bool weightsCached);
// conv2d_backward_data (weights false) and conv2d_backward_weight (true) with oneDNN, NCHW or
// channels-last (Call::options); kUnimplemented where oneDNN would use its reference
// implementation.
Status runConvBackwardDnnl(const Call& call, bool weights);
// conv2d as im2col + lib::sgemm, for every group count and both layouts.
Status runConvIm2col(const Call& call, const ConvGeometry& g);

Status runPool2d(const Call& call);  // max_pool2d and avg_pool2d.
// batch_norm_stats, batch_norm_backward_reduce, batch_norm_backward, max_pool2d_backward and
// conv2d_backward_bias (training_kernels.cpp): plain memory on the reference kernels, channels-last
// on kiln's own.
Status runTrainingKernel(ir::OpKind op, const Call& call);
// `op`'s reference kernel; for a channels-last call, on plain copies of its activations (the
// output copied back channels-last): what no library kernel runs channels-last.
Status runReferenceThroughPlain(ir::OpKind op, const Call& call);
// concat: plain layout of any rank, and 4-D channels-last (LibraryOptions::channelsLast).
Status runConcat(const Call& call);

Status runMatMul(const Call& call);
// attention: tiled, with an online softmax, on lib::sgemm (attention.cpp).
Status runAttention(const Call& call);
Status runGemm(const Call& call);
Status runLinear(const Call& call);

}  // namespace kiln::runtime::lib
