// ONNX's sampling ops: GridSample (16, 20, 22) and DeformConv (19, 22) through
// frontends/sampling.h's compositions (f32 and f64; GridSample 2-D and 3-D, cubic 2-D only, as
// ONNX), AffineGrid (20) as a matmul of constant coordinates, RoiAlign (10, 16, 22) as kiln's
// roi_align.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_map_util.h"
#include "frontends/onnx/onnx_tensor.h"
#include "frontends/sampling.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::OpKind;
using ir::Shape;
using ir::Value;

Status mapGridSample(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, floatInput(ctx));
  KILN_ASSIGN_OR_RETURN(ir::TensorType gt, ctx.inputType(1));
  const int spatial = xt.rank() - 2;
  if (spatial < 1 || gt.rank() != xt.rank() || gt.shape.back() != spatial ||
      gt.shape[0] != xt.shape[0] || gt.dtype != xt.dtype)
    return ctx.invalid("X " + xt.toString() + " and grid " + gt.toString() +
                       " must be [N, C, spatial...] and [N, out spatial..., " +
                       std::to_string(spatial) + "] of one float type");
  if (spatial < 2 || spatial > 3)
    return ctx.unsupported("GridSample over " + std::to_string(spatial) +
                           " spatial dims (kiln composes 2 and 3)");
  KILN_ASSIGN_OR_RETURN(std::string modeName,
                        ctx.attrString("mode", ctx.version() >= 20 ? "linear" : "bilinear"));
  SampleOptions o;
  if (modeName == "nearest") {
    o.mode = SampleMode::kNearest;
  } else if (modeName == (ctx.version() >= 20 ? "linear" : "bilinear")) {
    o.mode = SampleMode::kLinear;
  } else if (modeName == (ctx.version() >= 20 ? "cubic" : "bicubic")) {
    o.mode = SampleMode::kCubic;
  } else {
    return ctx.invalid("mode '" + modeName + "' is not one of GridSample " +
                       std::to_string(ctx.version()) + "'s");
  }
  if (o.mode == SampleMode::kCubic && spatial != 2)
    return ctx.unsupported("cubic GridSample over " + std::to_string(spatial) +
                           " spatial dims (ONNX defines it for 2)");
  KILN_ASSIGN_OR_RETURN(std::string padName, ctx.attrString("padding_mode", "zeros"));
  if (padName == "zeros")
    o.padding = SamplePadding::kZeros;
  else if (padName == "border")
    o.padding = SamplePadding::kBorder;
  else if (padName == "reflection")
    o.padding = SamplePadding::kReflection;
  else
    return ctx.invalid("padding_mode must be zeros, border or reflection, got '" + padName + "'");
  KILN_ASSIGN_OR_RETURN(o.alignCorners, ctx.attrBool("align_corners", false));
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * grid, ctx.value(1));
  KILN_ASSIGN_OR_RETURN(Value * y, emitGridSample(emitterOf(ctx), x, grid, o));
  ctx.setOutput(0, y);
  return Status::ok();
}

// DeformConv (19, 22): frontends/sampling.h's deform_conv2d, 2-D (ONNX's reference implements
// no other rank); kernel_shape, when given, must be the weight's.
Status mapDeformConv(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, floatInput(ctx));
  KILN_ASSIGN_OR_RETURN(ir::TensorType wt, ctx.inputType(1));
  if (xt.rank() != 4)
    return ctx.unsupported("DeformConv of a rank-" + std::to_string(xt.rank()) + " input " +
                           xt.toString() + " (kiln composes the 2-D one)");
  if (wt.rank() != 4) return ctx.invalid("W " + wt.toString() + " must be 4-D as X");
  KILN_ASSIGN_OR_RETURN(
      std::vector<int64_t> kernel,
      ctx.attrInts("kernel_shape", std::vector<int64_t>{wt.shape[2], wt.shape[3]}));
  if (kernel != std::vector<int64_t>{wt.shape[2], wt.shape[3]})
    return ctx.invalid("kernel_shape " + ir::shapeToString(kernel) + " is not W's " +
                       wt.toString());
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> strides,
                        ctx.attrInts("strides", std::vector<int64_t>{1, 1}));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> dilations,
                        ctx.attrInts("dilations", std::vector<int64_t>{1, 1}));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> pads,
                        ctx.attrInts("pads", std::vector<int64_t>{0, 0, 0, 0}));
  if (strides.size() != 2 || dilations.size() != 2 || pads.size() != 4)
    return ctx.invalid("strides " + ir::shapeToString(strides) + ", dilations " +
                       ir::shapeToString(dilations) + " and pads " + ir::shapeToString(pads) +
                       " must have 2, 2 and 4 values");
  KILN_ASSIGN_OR_RETURN(int64_t group, ctx.attrInt("group", 1));
  KILN_ASSIGN_OR_RETURN(int64_t offsetGroup, ctx.attrInt("offset_group", 1));
  DeformWindow window;
  std::copy(strides.begin(), strides.end(), window.strides.begin());
  std::copy(dilations.begin(), dilations.end(), window.dilations.begin());
  std::copy(pads.begin(), pads.end(), window.pads.begin());
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * w, ctx.value(1));
  KILN_ASSIGN_OR_RETURN(Value * offset, ctx.value(2));
  Value* bias = nullptr;
  Value* mask = nullptr;
  if (ctx.hasInput(3)) {
    KILN_ASSIGN_OR_RETURN(bias, ctx.value(3));
  }
  if (ctx.hasInput(4)) {
    KILN_ASSIGN_OR_RETURN(mask, ctx.value(4));
  }
  KILN_ASSIGN_OR_RETURN(Value * y, emitDeformConv2d(emitterOf(ctx), x, w, offset, mask, bias,
                                                    window, group, offsetGroup));
  ctx.setOutput(0, y);
  return Status::ok();
}

// AffineGrid (20): the normalized coordinates of every output pixel, (x, y[, z], 1) with x along
// the last dim (align_corners: -1 .. 1 through the corner pixels' centres; else through the
// pixels' edges), times theta^T: [H*W, 3] x [N, 3, 2] -> [N, H, W, 2] (3-D: 4 and 3). The size
// must be known at import.
Status mapAffineGrid(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType tt, floatInput(ctx));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> size, ctx.constInts(1, "size"));
  KILN_ASSIGN_OR_RETURN(bool align, ctx.attrBool("align_corners", false));
  const int64_t spatial = static_cast<int64_t>(size.size()) - 2;
  if ((spatial != 2 && spatial != 3) || tt.rank() != 3 || tt.shape[0] != size[0] ||
      tt.shape[1] != spatial || tt.shape[2] != spatial + 1)
    return ctx.invalid("theta " + tt.toString() + " and size " + ir::shapeToString(size) +
                       " must be [N, 2, 3] and [N, C, H, W], or [N, 3, 4] and [N, C, D, H, W]");
  for (int64_t d : size)
    if (d < 1) return ctx.invalid("size " + ir::shapeToString(size) + " must be positive");
  const Shape dims(size.begin() + 2, size.end());
  int64_t points = 1;
  for (int64_t d : dims)
    if (!ir::accumulateElements(points, d) || points > kMaxFoldElements)
      return ctx.unsupported("an AffineGrid of " + ir::shapeToString(dims) + " (too large)");
  if (points * (spatial + 1) > kMaxFoldElements)
    return ctx.unsupported("an AffineGrid of " + ir::shapeToString(dims) + " (too large)");
  // Row p of the base: the coordinates of point p, x (the last dim) first, then 1.
  ir::TensorData base = filledTensor(tt.dtype, {points, spatial + 1}, 1);
  auto coord = [&](int64_t i, int64_t n) {
    if (align) return n == 1 ? -1.0 : -1.0 + 2.0 * static_cast<double>(i) / (n - 1);
    return (2.0 * static_cast<double>(i) + 1.0) / n - 1.0;
  };
  for (int64_t p = 0; p < points; ++p) {
    int64_t rest = p;
    for (int64_t d = spatial - 1; d >= 0; --d) {  // Dim d's index; x is the last dim.
      const int64_t n = dims[static_cast<size_t>(d)], i = rest % n;
      rest /= n;
      const double c = coord(i, n);
      const size_t at = static_cast<size_t>(p * (spatial + 1) + (spatial - 1 - d));
      if (tt.dtype == ir::DType::kF32)
        base.as<float>()[at] = static_cast<float>(c);
      else
        base.as<double>()[at] = c;
    }
  }
  KILN_ASSIGN_OR_RETURN(Value * b, ctx.constantValue(std::move(base)));
  KILN_ASSIGN_OR_RETURN(Value * theta, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * thetaT, ctx.emit(OpKind::kTranspose, {theta},
                                                 {{"perm", std::vector<int64_t>{0, 2, 1}}}));
  KILN_ASSIGN_OR_RETURN(Value * g, ctx.emit(OpKind::kMatMul, {b, thetaT}));
  Shape out{size[0]};
  out.insert(out.end(), dims.begin(), dims.end());
  out.push_back(spatial);
  return ctx.emit(OpKind::kReshape, {g}, {{"shape", out}}, 0).status();
}

// RoiAlign (10, 16, 22): kiln's roi_align. Version 10 has no coordinate_transformation_mode
// (its rois are output_half_pixel's); 16 adds it, half_pixel by default. f16 and bf16 run in f32
// (exact widening) and round once at the end.
Status mapRoiAlign(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  std::string coords = "output_half_pixel";
  if (ctx.version() >= 16) {
    KILN_ASSIGN_OR_RETURN(coords, ctx.attrString("coordinate_transformation_mode", "half_pixel"));
  }
  if (coords != "half_pixel" && coords != "output_half_pixel")
    return ctx.invalid(
        "coordinate_transformation_mode must be half_pixel or output_half_pixel, "
        "got '" +
        coords + "'");
  KILN_ASSIGN_OR_RETURN(std::string mode, ctx.attrString("mode", "avg"));
  KILN_ASSIGN_OR_RETURN(int64_t oh, ctx.attrInt("output_height", 1));
  KILN_ASSIGN_OR_RETURN(int64_t ow, ctx.attrInt("output_width", 1));
  KILN_ASSIGN_OR_RETURN(int64_t ratio, ctx.attrInt("sampling_ratio", 0));
  KILN_ASSIGN_OR_RETURN(double scale, ctx.attrFloat("spatial_scale", 1.0));
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * rois, ctx.value(1));
  KILN_ASSIGN_OR_RETURN(Value * index, ctx.value(2));
  const bool half = xt.dtype == ir::DType::kF16 || xt.dtype == ir::DType::kBF16;
  if (half) {
    KILN_ASSIGN_OR_RETURN(x, ctx.emit(OpKind::kCast, {x}, {{"to", std::string("f32")}}));
    KILN_ASSIGN_OR_RETURN(rois, ctx.emit(OpKind::kCast, {rois}, {{"to", std::string("f32")}}));
  }
  const ir::AttrMap attrs{{"mode", mode},           {"output_height", oh},
                          {"output_width", ow},     {"sampling_ratio", ratio},
                          {"spatial_scale", scale}, {"aligned", int64_t{coords == "half_pixel"}}};
  if (!half) return ctx.emit(OpKind::kRoiAlign, {x, rois, index}, attrs, 0).status();
  KILN_ASSIGN_OR_RETURN(Value * y, ctx.emit(OpKind::kRoiAlign, {x, rois, index}, attrs));
  return ctx.emit(OpKind::kCast, {y}, {{"to", std::string(ir::dtypeName(xt.dtype))}}, 0).status();
}

}  // namespace

// GridSample 16: 4-D, modes bilinear / bicubic / nearest; 20: N-D, modes linear / cubic /
// nearest; 22 adds bfloat16 (refused: f32 and f64 only). DeformConv 22 adds bfloat16 (refused
// too); RoiAlign 22 adds bfloat16 (through f32, as f16).
std::vector<MapperEntry> samplingMappers() {
  return {{"GridSample", {16, 20, 22}, mapGridSample},
          {"AffineGrid", {20}, mapAffineGrid},
          {"RoiAlign", {10, 16, 22}, mapRoiAlign},
          {"DeformConv", {19, 22}, mapDeformConv}};
}

}  // namespace kiln::frontends::onnx_import
