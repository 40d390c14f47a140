// Sampling an image at computed positions, composed from kiln's ops, shared by the frontends:
// ONNX GridSample, and deformable convolution (ONNX DeformConv, torchvision's deform_conv2d).
//
// Each position is brought back inside the image where it leaves it (border: clamped;
// reflection: reflected), rounded (nearest), then each interpolation tap (1 for nearest, 2 per
// dim for linear, 4 per dim for cubic with Keys' A = -0.75) reads the channels at its position
// by one gather of rows (the input channels-last, [N*S, C]: one index per position, not one per
// channel), weighted, and the taps summed, transposed back once. A tap outside the image reads 0
// (zeros), the edge (border) or its reflection. The rules are ONNX's reference implementation's,
// which are PyTorch's grid_sample's but for cubic with border padding (sampling.cpp). f32 and f64.
//
// A deformable convolution (Dai et al. 2017, v2 with the mask: Zhu et al. 2018) is an im2col
// whose taps are moved by the offsets: each tap of each output position sampled bilinearly with
// zeros outside (the offset group's channels at that group's offsets), times the mask, then a
// matmul with the filter: without groups the columns as sampled, [oh*ow, kh*kw*C] x the filter
// transposed [kh*kw*C, M], the output transposed; with groups the columns transposed once and
// [M/g, C/g*kh*kw] x [C/g*kh*kw, oh*ow] per group and image. The FLOPs are the convolution's plus
// 4 gathers and products per column element; the columns (C*kh*kw*oh*ow per image) are the extra
// bytes, as in torchvision's own kernel (docs/performance.md measures it).
//
// Errors name the shapes; the constants these lowerings build (an image index per batch entry,
// the base positions) are at most 2^24 elements, and every image dim must be at least 1.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "frontends/emitter.h"

namespace kiln::frontends {

enum class SampleMode { kNearest, kLinear, kCubic };
enum class SamplePadding { kZeros, kBorder, kReflection };

struct SampleOptions {
  SampleMode mode = SampleMode::kLinear;
  SamplePadding padding = SamplePadding::kZeros;
  // Pixel centres at -1 and 1 (true) or pixel edges (false): where reflection reflects.
  bool alignCorners = false;
};

// ONNX GridSample: x [N, C, S...] at grid [N, P..., rank(S)] (normalized to [-1, 1], the last
// spatial dim first: x, y[, z]) -> [N, C, P...]. Cubic only over 2 spatial dims. The caller checks
// the shapes.
Expected<ir::Value*> emitGridSample(const Emitter& e, ir::Value* x, ir::Value* grid,
                                    const SampleOptions& options);

// deform_conv2d(x [N, C, H, W], w [M, C/group, kh, kw], offset [N, offsetGroup*kh*kw*2, oh, ow]
// ((dy, dx) per tap, taps row-major), mask [N, offsetGroup*kh*kw, oh, ow] or null, bias [M] or
// null) -> [N, M, oh, ow]: output (i, j)'s tap (a, b) reads x at (i*sh - pt + a*dh + dy,
// j*sw - pl + b*dw + dx). pads: top, left, bottom, right. Errors name the shapes.
struct DeformWindow {
  std::array<int64_t, 2> strides{1, 1}, dilations{1, 1};
  std::array<int64_t, 4> pads{0, 0, 0, 0};
};
Expected<ir::Value*> emitDeformConv2d(const Emitter& e, ir::Value* x, ir::Value* w,
                                      ir::Value* offset, ir::Value* mask, ir::Value* bias,
                                      const DeformWindow& window, int64_t group,
                                      int64_t offsetGroup);

}  // namespace kiln::frontends
