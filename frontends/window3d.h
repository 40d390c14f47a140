// 3-D convolution and pooling (video and volumetric models: Conv3d, ConvTranspose3d, MaxPool3d,
// AvgPool3d) as kiln's 2-D ops, shared by the frontends that meet them (ONNX Conv,
// ConvTranspose, MaxPool, AveragePool and LpPool on rank-5 inputs; torch.export's
// aten.convolution, max_pool3d, avg_pool3d and their gradients).
//
// A 3-D convolution is one conv2d over the depth taps stacked into the channels: the input
// [N,C,D,H,W] is gathered to [N,D',C,kd,H,W] (output depth od, tap k reads input depth
// od*sd - pd + k*dd; zero where that lies in the padding) and run as [N*D', C*kd, H, W] through
// conv2d with the filter [M, C/g*kd, kh, kw] (the 5-D filter's own bytes), whose output
// [N*D', M, H', W'] is transposed back to [N,M,D',H',W']. The FLOPs are the 3-D convolution's;
// the extra bytes are the stacked input (kd times the input, an im2col along depth only) and one
// transposition of the output. A convolution over depth alone (a 1x1 window over (H, W), stride
// 1 and no padding there: the temporal half of R(2+1)D's factored convolutions, and a 1x1x1
// pointwise one) is instead the conv2d of [N, C, D, H*W] with the filter [M, C/g, kd, 1], on the
// input's and output's own bytes. Every backend, the autodiff and the algorithm choice see conv2d.
//
// A 3-D pooling is separable, its window the product of a window over (H, W) and one over D:
// max (and PyTorch's average, whose divisor is a product of per-dim counts, with or without the
// padding) over a box is the max (mean) over D of the max (mean) over (H, W). So it is the 2-D
// pool over [N, C*D, H, W] and then the 2-D pool with a kernel [kd, 1] over [N, C, D, H'*W']:
// no copy beyond the two pools. In f16/bf16 the intermediate is rounded once more than a fused
// 3-D pool would round it (the mean; the max is exact).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "frontends/emitter.h"
#include "ir/attributes.h"
#include "ir/graph.h"
#include "ir/status.h"
#include "ir/tensor_data.h"

namespace kiln::frontends {

// A window over the spatial dims D, H, W. pads: the three begins, then the three ends (ONNX's
// order); PyTorch's symmetric padding p is {p, p}.
struct Window3d {
  std::array<int64_t, 3> kernel{1, 1, 1}, strides{1, 1, 1}, dilations{1, 1, 1};
  std::array<int64_t, 6> pads{0, 0, 0, 0, 0, 0};
};

// conv3d(x [N,C,D,H,W], w [M,C/group,kd,kh,kw], bias [M] or null) -> [N,M,D',H',W'] (the
// window's kernel is w's). Errors name the 3-D convolution's shapes.
Expected<ir::Value*> emitConv3d(const Emitter& e, ir::Value* x, ir::Value* w, ir::Value* bias,
                                const Window3d& window, int64_t group);

// The gradients of emitConv3d's output with respect to x, w and the bias, each where `wanted`
// (else null): conv2d_backward_data and conv2d_backward_weight of the same conv2d, the input's
// taken back through the stacking (gather_backward, which adds the taps that read one depth).
struct Conv3dGradients {
  ir::Value* input = nullptr;
  ir::Value* weight = nullptr;
  ir::Value* bias = nullptr;
};
Expected<Conv3dGradients> emitConv3dBackward(const Emitter& e, ir::Value* grad, ir::Value* x,
                                             ir::Value* w, const Window3d& window, int64_t group,
                                             std::array<bool, 3> wanted);

// conv_transpose3d(x [N,C,D,H,W], w [C,M/group,kd,kh,kw]) -> [N,M,D',H',W']
// (torch.nn.ConvTranspose3d and ONNX ConvTranspose without their bias): each input depth through
// one conv_transpose2d whose output channels are the depth taps ([C, M/group*kd, kh, kw], the
// filter's own bytes), each tap then added at its output depth (i*sd - pads + k*dd;
// gather_backward, the gradient of the gather a 3-D convolution reads its taps with), the ones in
// the cropped padding dropped. The output_padding of each dim is below its stride, as
// conv_transpose2d's.
Expected<ir::Value*> emitConvTranspose3d(const Emitter& e, ir::Value* x, ir::Value* w,
                                         const Window3d& window,
                                         std::array<int64_t, 3> outputPadding, int64_t group);

// max_pool2d or avg_pool2d over the three spatial dims of x [N,C,D,H,W]. `extra`: the 2-D op's
// ceil_mode and (avg_pool2d) count_include_pad, which apply per dim; dilations only for
// max_pool2d.
Expected<ir::Value*> emitPool3d(const Emitter& e, ir::OpKind pool2d, ir::Value* x,
                                const Window3d& window, const ir::AttrMap& extra);

// The gradient of emitPool3d's output (`grad`) with respect to x: the two steps' 2-D gradient
// ops (max_pool2d_backward, avg_pool2d_backward) in reverse order, the intermediate recomputed.
// A max pooling's gradient goes to each window's first maximum in (D, H, W) order, as PyTorch's
// (the D step takes the first slice holding the maximum, the (H, W) step its first position).
Expected<ir::Value*> emitPool3dBackward(const Emitter& e, ir::OpKind pool2d, ir::Value* grad,
                                        ir::Value* x, const Window3d& window,
                                        const ir::AttrMap& extra);

// PyTorch's max_pool3d indices of emitPool3d's max pooling: i64 [N,C,D',H',W'], each window's
// maximum as the offset d*H*W + h*W + w in its [D,H,W] volume (from the two steps'
// max_pool2d_indices).
Expected<ir::Value*> emitMaxPool3dIndices(const Emitter& e, ir::Value* x, const Window3d& window,
                                          const ir::AttrMap& extra);

}  // namespace kiln::frontends
