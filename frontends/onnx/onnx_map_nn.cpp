// ONNX neural-network ops onto kiln's: MatMul, Gemm, Conv and pooling (1-D through kiln's 2-D
// ops, 3-D through frontends/window3d.h's lowerings onto them, auto_pad resolved to explicit pads),
// BatchNormalization and LayerNormalization (inference), Softmax/LogSoftmax (opset < 13
// flatten-to-2-D semantics), reductions.
#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>

#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_map_util.h"
#include "frontends/onnx/onnx_tensor.h"
#include "frontends/window3d.h"
#include "ir/infer.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::OpKind;

std::string list(const std::vector<int64_t>& v) {
  return ir::shapeToString(v);
}

// Det (11, 22): kiln's det (f32, f64). A non-square input is an invalid model, checked here: the
// op's own check would report it as kiln's limit (kUnimplemented).
Status mapDet(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  if (t.rank() < 2 || t.shape[t.shape.size() - 1] != t.shape[t.shape.size() - 2])
    return ctx.invalid("input " + t.toString() + " must be square matrices [..., M, M]");
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  return ctx.emit(OpKind::kDet, {x}, {}, 0).status();
}

Status mapMatMul(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::Value * a, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(ir::Value * b, ctx.value(1));
  return ctx.emit(OpKind::kMatMul, {a, b}, {}, 0).status();
}

Status mapGemm(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(double alpha, ctx.attrFloat("alpha", 1.0));
  KILN_ASSIGN_OR_RETURN(double beta, ctx.attrFloat("beta", 1.0));
  KILN_ASSIGN_OR_RETURN(bool transA, ctx.attrBool("transA", false));
  KILN_ASSIGN_OR_RETURN(bool transB, ctx.attrBool("transB", false));
  std::vector<ir::Value*> ins;
  for (size_t i = 0; i < 3; ++i) {
    if (!ctx.hasInput(i)) continue;
    KILN_ASSIGN_OR_RETURN(ir::Value * v, ctx.value(i));
    ins.push_back(v);
  }
  return ctx
      .emit(OpKind::kGemm, std::move(ins),
            {{"alpha", alpha},
             {"beta", beta},
             {"transA", int64_t{transA}},
             {"transB", int64_t{transB}}},
            0)
      .status();
}

// The window attributes of Conv and the pools, for `spatial` dims, with auto_pad resolved.
struct Window {
  std::vector<int64_t> kernel, strides, dilations;
  std::vector<int64_t> pads;  // All begins, then all ends (ONNX and kiln order).
};

Expected<Window> readWindow(NodeContext& ctx, const ir::Shape& x, std::vector<int64_t> kernel) {
  const size_t spatial = x.size() - 2;
  Window w;
  w.kernel = std::move(kernel);
  KILN_ASSIGN_OR_RETURN(w.strides, ctx.attrInts("strides", std::vector<int64_t>(spatial, 1)));
  KILN_ASSIGN_OR_RETURN(w.dilations, ctx.attrInts("dilations", std::vector<int64_t>(spatial, 1)));
  KILN_ASSIGN_OR_RETURN(w.pads, ctx.attrInts("pads", std::vector<int64_t>(2 * spatial, 0)));
  KILN_ASSIGN_OR_RETURN(std::string autoPad, ctx.attrString("auto_pad", "NOTSET"));
  if (w.kernel.size() != spatial || w.strides.size() != spatial || w.dilations.size() != spatial ||
      w.pads.size() != 2 * spatial)
    return ctx.invalid("kernel " + list(w.kernel) + ", strides " + list(w.strides) +
                       ", dilations " + list(w.dilations) + " and pads " + list(w.pads) +
                       " do not match " + std::to_string(spatial) + " spatial dims");
  for (size_t i = 0; i < spatial; ++i) {
    if (w.kernel[i] < 1 || w.strides[i] < 1 || w.dilations[i] < 1 || w.pads[i] < 0 ||
        w.pads[i + spatial] < 0)
      return ctx.invalid("kernel, strides and dilations must be >= 1 and pads >= 0, got " +
                         list(w.kernel) + ", " + list(w.strides) + ", " + list(w.dilations) + ", " +
                         list(w.pads));
    // The dilated window and the padded input, which the window sizes are computed from.
    int64_t span = 0, padded = 0;
    if (__builtin_mul_overflow(w.dilations[i], w.kernel[i] - 1, &span) ||
        __builtin_add_overflow(x[i + 2], w.pads[i], &padded) ||
        __builtin_add_overflow(padded, w.pads[i + spatial], &padded) ||
        span > std::numeric_limits<int64_t>::max() - 1)
      return ctx.invalid("kernel " + list(w.kernel) + ", dilations " + list(w.dilations) +
                         " and pads " + list(w.pads) + " overflow int64");
  }
  if (autoPad == "NOTSET") return w;
  // ONNX shape inference applies explicit pads even with auto_pad set, ONNX Runtime ignores
  // them: a model with both is ambiguous.
  if (std::any_of(w.pads.begin(), w.pads.end(), [](int64_t p) { return p != 0; }))
    return ctx.invalid("auto_pad " + autoPad + " and explicit pads " + list(w.pads) +
                       " are both given; keep one");
  if (autoPad == "VALID") {
    w.pads.assign(2 * spatial, 0);
    return w;
  }
  if (autoPad != "SAME_UPPER" && autoPad != "SAME_LOWER")
    return ctx.invalid("auto_pad must be NOTSET, VALID, SAME_UPPER or SAME_LOWER, got '" + autoPad +
                       "'");
  // SAME: output = ceil(input / stride); the total padding splits evenly, the odd one at
  // the end (SAME_UPPER) or the beginning (SAME_LOWER).
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t in = x[i + 2], s = w.strides[i];
    // ONNX gives an empty output for an empty input; no padding makes a window fit there.
    if (in == 0)
      return ctx.unsupported("auto_pad " + autoPad + " over an empty spatial dim (found by " +
                             "fuzzing; the output would be empty)");
    const int64_t out = in / s + (in % s != 0);
    int64_t span = 0, need = 0;
    if (__builtin_mul_overflow(w.dilations[i], w.kernel[i] - 1, &span) ||
        __builtin_mul_overflow(out > 0 ? out - 1 : 0, s, &need) ||
        __builtin_add_overflow(need, span + 1, &need))
      return ctx.invalid("kernel, strides and dilations are too large");
    const int64_t total = std::max<int64_t>(0, need - in);
    const int64_t small = total / 2, large = total - small;
    w.pads[i] = autoPad == "SAME_UPPER" ? small : large;
    w.pads[i + spatial] = autoPad == "SAME_UPPER" ? large : small;
  }
  return w;
}

// kiln's 2-D window attributes for a window over 1 or 2 spatial dims (1-D runs as [1, L]).
ir::AttrMap windowAttrs2d(const Window& w, bool kernel, bool dilations) {
  const bool oneD = w.strides.size() == 1;
  auto two = [&](const std::vector<int64_t>& v, int64_t pad) {
    return oneD ? std::vector<int64_t>{pad, v[0]} : v;
  };
  ir::AttrMap a;
  if (kernel) a["kernel"] = two(w.kernel, 1);
  a["strides"] = two(w.strides, 1);
  a["pads"] = oneD ? std::vector<int64_t>{0, w.pads[0], 0, w.pads[1]} : w.pads;
  if (dilations) a["dilations"] = two(w.dilations, 1);
  return a;
}

Expected<ir::Value*> unsqueeze2(NodeContext& ctx, ir::Value* v) {
  return ctx.emit(OpKind::kUnsqueeze, {v}, {{"axes", std::vector<int64_t>{2}}});
}

// Runs a 2-D kiln window op on a 1-D (rank 3) or 2-D (rank 4) input; returns the output, which
// is the node's output `output` (NodeContext::emit's; -1: an intermediate).
Expected<ir::Value*> emitWindowOp(NodeContext& ctx, OpKind op, ir::Value* x,
                                  std::vector<ir::Value*> rest, ir::AttrMap attrs, bool oneD,
                                  int output = 0) {
  if (!oneD) {
    rest.insert(rest.begin(), x);
    return ctx.emit(op, std::move(rest), std::move(attrs), output);
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * x4, unsqueeze2(ctx, x));
  rest.insert(rest.begin(), x4);
  KILN_ASSIGN_OR_RETURN(ir::Value * y4, ctx.emit(op, std::move(rest), std::move(attrs)));
  return ctx.emit(OpKind::kSqueeze, {y4}, {{"axes", std::vector<int64_t>{2}}}, output);
}

// The input of a window op over 1 or 2 spatial dims, or 3 where `threeD` (the ops
// frontends/window3d.h lowers).
Expected<ir::TensorType> windowInput(NodeContext& ctx, bool threeD = false) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType x, ctx.inputType(0));
  if (x.rank() != 3 && x.rank() != 4 && (!threeD || x.rank() != 5))
    return ctx.unsupported(ctx.opType() + " on a rank-" + std::to_string(x.rank()) + " input " +
                           x.toString() + ": kiln has " +
                           (threeD ? "1-D, 2-D and 3-D " : "1-D and 2-D ") + ctx.opType());
  return x;
}

Window3d window3dOf(const Window& w) {
  Window3d out;
  for (size_t d = 0; d < 3; ++d) {
    out.kernel[d] = w.kernel[d];
    out.strides[d] = w.strides[d];
    out.dilations[d] = w.dilations[d];
    out.pads[d] = w.pads[d];
    out.pads[d + 3] = w.pads[d + 3];
  }
  return out;
}

Status mapConv(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, windowInput(ctx, /*threeD=*/true));
  KILN_ASSIGN_OR_RETURN(ir::TensorType wt, ctx.inputType(1));
  if (wt.rank() != xt.rank())
    return ctx.invalid("weight " + wt.toString() + " must have the input's rank " +
                       std::to_string(xt.rank()));
  std::vector<int64_t> kernel(wt.shape.begin() + 2, wt.shape.end());
  if (ctx.hasAttr("kernel_shape")) {
    KILN_ASSIGN_OR_RETURN(auto ks, ctx.attrInts("kernel_shape"));
    if (ks != kernel)
      return ctx.invalid("kernel_shape " + list(ks) + " differs from the weight's " + list(kernel));
  }
  // A folded Pad left its zero padding for this Conv: the input is the unpadded tensor.
  const std::vector<int64_t> folded = ctx.pendingPads(0);
  ir::Shape paddedX = xt.shape;
  const size_t spatial = xt.shape.size() - 2;
  if (!folded.empty())
    for (size_t i = 0; i < spatial; ++i) paddedX[i + 2] += folded[i] + folded[i + spatial];
  KILN_ASSIGN_OR_RETURN(Window w, readWindow(ctx, paddedX, kernel));
  if (!folded.empty())
    for (size_t i = 0; i < w.pads.size(); ++i) w.pads[i] += folded[i];
  KILN_ASSIGN_OR_RETURN(int64_t group, ctx.attrInt("group", 1));
  ir::AttrMap attrs = windowAttrs2d(w, false, true);
  attrs["group"] = group;

  ir::Value* x = nullptr;
  if (!folded.empty()) {
    // The input's kiln value is the unpadded tensor.
    KILN_ASSIGN_OR_RETURN(x, ctx.valueNamed(ctx.proto().input(0)));
  } else {
    KILN_ASSIGN_OR_RETURN(x, ctx.value(0));
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * weight, ctx.value(1));
  ir::Value* bias = nullptr;
  if (ctx.hasInput(2)) {
    KILN_ASSIGN_OR_RETURN(bias, ctx.value(2));
  }
  if (spatial == 3) {
    KILN_ASSIGN_OR_RETURN(ir::Value * y,
                          emitConv3d(emitterOf(ctx), x, weight, bias, window3dOf(w), group));
    ctx.setOutput(0, y);
    return Status::ok();
  }
  const bool oneD = xt.rank() == 3;
  if (oneD) {
    KILN_ASSIGN_OR_RETURN(weight, unsqueeze2(ctx, weight));
  }
  std::vector<ir::Value*> rest{weight};
  if (bias) rest.push_back(bias);
  return emitWindowOp(ctx, OpKind::kConv2d, x, std::move(rest), std::move(attrs), oneD).status();
}

// y [N,M,...] plus ConvTranspose's bias B [M] (input 2), broadcast over the spatial dims; `output`
// as NodeContext::emit's.
Expected<ir::Value*> addBias(NodeContext& ctx, ir::Value* y, int output) {
  KILN_ASSIGN_OR_RETURN(ir::Value * b, ctx.value(2));
  const int64_t m = y->type().shape[1];
  if (b->type().shape != ir::Shape{m})
    return ctx.invalid("bias " + b->type().toString() + " must have the output's " +
                       std::to_string(m) + " channels");
  ir::Shape perChannel(static_cast<size_t>(y->type().rank() - 1), 1);
  perChannel[0] = m;
  KILN_ASSIGN_OR_RETURN(b, ctx.emit(OpKind::kReshape, {b}, {{"shape", perChannel}}));
  return ctx.emit(OpKind::kAdd, {y, b}, {}, output);
}

// Python's floor division (ONNX's reference splits a negative total padding with it).
int64_t floorDiv(int64_t a, int64_t b) {
  return a / b - (a % b != 0 && (a < 0) != (b < 0));
}

// ConvTranspose: kiln's conv_transpose2d (1-D as [1, L]) with the bias added after it. The pads
// are given, or come from output_shape (auto_pad SAME: the input times the stride) as ONNX's
// reference computes them: the total padding split in two, the odd one at the end (SAME_UPPER)
// or the start (otherwise). An output that ends past the unpadded one grows at the end
// (output_padding) where kiln's rule allows it (below the stride).
Status mapConvTranspose(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, windowInput(ctx, /*threeD=*/true));
  KILN_ASSIGN_OR_RETURN(ir::TensorType wt, ctx.inputType(1));
  if (wt.rank() != xt.rank())
    return ctx.invalid("weight " + wt.toString() + " must have the input's rank " +
                       std::to_string(xt.rank()));
  const size_t spatial = xt.shape.size() - 2;
  std::vector<int64_t> kernel(wt.shape.begin() + 2, wt.shape.end());
  if (ctx.hasAttr("kernel_shape")) {
    KILN_ASSIGN_OR_RETURN(auto ks, ctx.attrInts("kernel_shape"));
    if (ks != kernel)
      return ctx.invalid("kernel_shape " + list(ks) + " differs from the weight's " + list(kernel));
  }
  const std::vector<int64_t> ones(spatial, 1), zeros(spatial, 0);
  KILN_ASSIGN_OR_RETURN(auto strides, ctx.attrInts("strides", ones));
  KILN_ASSIGN_OR_RETURN(auto dilations, ctx.attrInts("dilations", ones));
  KILN_ASSIGN_OR_RETURN(auto outPad, ctx.attrInts("output_padding", zeros));
  KILN_ASSIGN_OR_RETURN(auto pads, ctx.attrInts("pads", std::vector<int64_t>(2 * spatial, 0)));
  KILN_ASSIGN_OR_RETURN(std::string autoPad, ctx.attrString("auto_pad", "NOTSET"));
  KILN_ASSIGN_OR_RETURN(int64_t group, ctx.attrInt("group", 1));
  std::vector<int64_t> outShape;
  if (ctx.hasAttr("output_shape")) {
    KILN_ASSIGN_OR_RETURN(outShape, ctx.attrInts("output_shape"));
    if (outShape.size() == spatial + 2) outShape.erase(outShape.begin(), outShape.begin() + 2);
  }
  if (strides.size() != spatial || dilations.size() != spatial || outPad.size() != spatial ||
      pads.size() != 2 * spatial || (!outShape.empty() && outShape.size() != spatial))
    return ctx.invalid("strides " + list(strides) + ", dilations " + list(dilations) +
                       ", output_padding " + list(outPad) + ", pads " + list(pads) +
                       " and output_shape " + list(outShape) + " do not match " +
                       std::to_string(spatial) + " spatial dims");
  if (autoPad != "NOTSET" && autoPad != "VALID" && autoPad != "SAME_UPPER" &&
      autoPad != "SAME_LOWER")
    return ctx.invalid("auto_pad must be NOTSET, VALID, SAME_UPPER or SAME_LOWER, got '" + autoPad +
                       "'");
  const bool same = autoPad == "SAME_UPPER" || autoPad == "SAME_LOWER";
  if (autoPad == "VALID") pads.assign(2 * spatial, 0);
  for (size_t i = 0; i < spatial; ++i) {
    if (strides[i] < 1 || dilations[i] < 1 || kernel[i] < 1 || outPad[i] < 0)
      return ctx.invalid(
          "strides, dilations and kernel must be >= 1 and output_padding >= 0, got " +
          list(strides) + ", " + list(dilations) + ", " + list(kernel) + ", " + list(outPad));
    const int64_t natural =
        strides[i] * (xt.shape[i + 2] - 1) + outPad[i] + (kernel[i] - 1) * dilations[i] + 1;
    int64_t& begin = pads[i];
    int64_t& end = pads[i + spatial];
    if (!ctx.hasAttr("pads") && (same || !outShape.empty())) {
      const int64_t target = outShape.empty() ? xt.shape[i + 2] * strides[i] : outShape[i];
      const int64_t total = natural - target;
      begin = autoPad == "SAME_UPPER" ? floorDiv(total, 2) : total - floorDiv(total, 2);
      end = total - begin;
    } else if (!outShape.empty()) {
      end = natural - begin - outShape[i];  // Given pads, and the output's size: its end.
    }
    if (begin < 0)
      return ctx.unsupported("pads " + list(pads) + " (from output_shape " + list(outShape) +
                             ") start before the output: kiln's pads are >= 0");
    if (end < 0) {  // The output ends past the unpadded one: more output_padding.
      outPad[i] -= end;
      end = 0;
    }
  }
  const bool bias = ctx.hasInput(2);
  if (spatial == 3) {
    KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
    KILN_ASSIGN_OR_RETURN(ir::Value * weight, ctx.value(1));
    KILN_ASSIGN_OR_RETURN(ir::Value * y,
                          emitConvTranspose3d(emitterOf(ctx), x, weight,
                                              window3dOf(Window{kernel, strides, dilations, pads}),
                                              {outPad[0], outPad[1], outPad[2]}, group));
    if (bias) return addBias(ctx, y, 0).status();
    ctx.setOutput(0, y);
    return Status::ok();
  }
  const bool oneD = spatial == 1;
  auto two = [&](const std::vector<int64_t>& v, int64_t pad) {
    return oneD ? std::vector<int64_t>{pad, v[0]} : v;
  };
  ir::AttrMap attrs = {{"strides", two(strides, 1)},
                       {"pads", oneD ? std::vector<int64_t>{0, pads[0], 0, pads[1]} : pads},
                       {"dilations", two(dilations, 1)},
                       {"group", group},
                       {"output_padding", two(outPad, 0)}};
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(ir::Value * weight, ctx.value(1));
  if (oneD) {
    KILN_ASSIGN_OR_RETURN(x, unsqueeze2(ctx, x));
    KILN_ASSIGN_OR_RETURN(weight, unsqueeze2(ctx, weight));
  }
  const int last = bias || oneD ? -1 : 0;
  KILN_ASSIGN_OR_RETURN(ir::Value * y,
                        ctx.emit(OpKind::kConvTranspose2d, {x, weight}, std::move(attrs), last));
  if (bias) {
    KILN_ASSIGN_OR_RETURN(y, addBias(ctx, y, oneD ? -1 : 0));
  }
  if (oneD) {
    KILN_ASSIGN_OR_RETURN(y,
                          ctx.emit(OpKind::kSqueeze, {y}, {{"axes", std::vector<int64_t>{2}}}, 0));
  }
  return Status::ok();
}

// CausalConvWithState (27): the past state (zeros without one) before the input along the length,
// a depthwise conv2d over [B, C, 1, L + k - 1] with the optional bias, an optional SiLU, and the
// last k - 1 positions of the padded sequence as the present state.
Status mapCausalConvWithState(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(ir::TensorType wt, ctx.inputType(1));
  if (xt.rank() != 3 || wt.rank() != 3 || wt.shape[0] != xt.shape[1] || wt.shape[1] != 1 ||
      wt.shape[2] < 1 || wt.dtype != xt.dtype)
    return ctx.invalid("input " + xt.toString() + " and weight " + wt.toString() +
                       " must be [batch, channels, length] and [channels, 1, k]");
  KILN_ASSIGN_OR_RETURN(std::string activation, ctx.attrString("activation", "none"));
  if (activation != "none" && activation != "silu" && activation != "swish")
    return ctx.invalid("activation must be none, silu or swish, got '" + activation + "'");
  const int64_t b = xt.shape[0], c = xt.shape[1], len = xt.shape[2], k = wt.shape[2];
  const ir::Shape stateShape{b, c, k - 1};
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  ir::Value* padded = x;
  if (k > 1) {
    ir::Value* past = nullptr;
    if (ctx.hasInput(3)) {
      KILN_ASSIGN_OR_RETURN(ir::TensorType pt, ctx.inputType(3));
      if (pt != ir::TensorType{xt.dtype, stateShape})
        return ctx.invalid("past_state " + pt.toString() + " must be " +
                           ir::TensorType{xt.dtype, stateShape}.toString());
      KILN_ASSIGN_OR_RETURN(past, ctx.value(3, /*trainable=*/false));
    } else {
      KILN_ASSIGN_OR_RETURN(ir::Value * zero, scalarConstant(ctx, xt.dtype, 0));
      KILN_ASSIGN_OR_RETURN(past, ctx.emit(OpKind::kExpand, {zero}, {{"shape", stateShape}}));
    }
    KILN_ASSIGN_OR_RETURN(padded, ctx.emit(OpKind::kConcat, {past, x}, {{"axis", int64_t{2}}}));
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * w, ctx.value(1));
  KILN_ASSIGN_OR_RETURN(ir::Value * p4, unsqueeze2(ctx, padded));
  KILN_ASSIGN_OR_RETURN(ir::Value * w4, unsqueeze2(ctx, w));
  std::vector<ir::Value*> ins{p4, w4};
  if (ctx.hasInput(2)) {
    KILN_ASSIGN_OR_RETURN(ir::Value * bias, ctx.value(2));
    ins.push_back(bias);
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * y4, ctx.emit(OpKind::kConv2d, std::move(ins),
                                                 {{"strides", std::vector<int64_t>{1, 1}},
                                                  {"pads", std::vector<int64_t>{0, 0, 0, 0}},
                                                  {"dilations", std::vector<int64_t>{1, 1}},
                                                  {"group", c}}));
  const bool silu = activation != "none";
  KILN_ASSIGN_OR_RETURN(
      ir::Value * y,
      ctx.emit(OpKind::kSqueeze, {y4}, {{"axes", std::vector<int64_t>{2}}}, silu ? -1 : 0));
  if (silu) {
    KILN_TRY(ctx.emit(OpKind::kSilu, {y}, {}, 0).status());
  }
  if (!ctx.outputUsed(1)) return Status::ok();
  if (k == 1) {
    ctx.setConstantOutput(1, filledTensor(xt.dtype, stateShape, 0));
    return Status::ok();
  }
  return ctx
      .emit(OpKind::kSlice, {padded},
            {{"starts", std::vector<int64_t>{len}},
             {"ends", std::vector<int64_t>{len + k - 1}},
             {"axes", std::vector<int64_t>{2}}},
            1)
      .status();
}

// ---- Integer and quantized products (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv).
// The integer products are computed exactly in f64 (|a - za| |b - zb| summed stays far below
// 2^53 for any size kiln runs) and cast to int32; the quantized ones requantize that sum as ONNX's
// reference does: times (a_scale b_scale / y_scale), that factor computed in the scales' type,
// plus the output zero point, rounded half to even and saturated to int8 / uint8.

// Input i (int8 / uint8), minus zero point input `zp` when given, as f64. A zero point with
// more than one value is reshaped to `perShape` (per row, column or output channel).
Expected<ir::Value*> shiftedF64(NodeContext& ctx, size_t i, size_t zp, const ir::Shape& perShape) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(i));
  if (t.dtype != ir::DType::kI8 && t.dtype != ir::DType::kU8)
    return ctx.unsupported(ctx.opType() + " of " + t.toString() + " (kiln takes int8 and uint8)");
  const ir::AttrMap f64{{"to", std::string("f64")}};
  KILN_ASSIGN_OR_RETURN(ir::Value * v, ctx.value(i, /*trainable=*/false));
  KILN_ASSIGN_OR_RETURN(v, ctx.emit(OpKind::kCast, {v}, f64));
  if (!ctx.hasInput(zp)) return v;
  KILN_ASSIGN_OR_RETURN(ir::TensorType zt, ctx.inputType(zp));
  if (zt.dtype != t.dtype)
    return ctx.invalid("zero point " + zt.toString() + " must have its input's type " +
                       std::string(ir::dtypeName(t.dtype)));
  KILN_ASSIGN_OR_RETURN(ir::Value * z, ctx.value(zp, /*trainable=*/false));
  KILN_ASSIGN_OR_RETURN(z, ctx.emit(OpKind::kCast, {z}, f64));
  const ir::Shape zs = zt.numElements() == 1 ? ir::Shape{} : perShape;
  if (zt.numElements() != 1 && zt.numElements() != ir::numElements(perShape))
    return ctx.invalid("zero point " + zt.toString() + " must hold 1 or " +
                       std::to_string(ir::numElements(perShape)) + " values");
  KILN_ASSIGN_OR_RETURN(z, ctx.emit(OpKind::kReshape, {z}, {{"shape", zs}}));
  return ctx.emit(OpKind::kSub, {v, z});
}

// A scale input (one value, or `perShape`'s count reshaped to it).
Expected<ir::Value*> scaleInput(NodeContext& ctx, size_t i, const ir::Shape& perShape) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(i));
  if (!ir::isFloat(t.dtype) ||
      (t.numElements() != 1 && t.numElements() != ir::numElements(perShape)))
    return ctx.invalid("scale " + t.toString() + " must be a float with 1 or " +
                       std::to_string(ir::numElements(perShape)) + " values");
  KILN_ASSIGN_OR_RETURN(ir::Value * v, ctx.value(i, /*trainable=*/false));
  return ctx.emit(OpKind::kReshape, {v},
                  {{"shape", t.numElements() == 1 ? ir::Shape{} : perShape}});
}

// saturate(round_half_even(acc * (sa sb / sy)) + zy), to zy's type (else `fallback`).
Status requantize(NodeContext& ctx, ir::Value* acc, ir::Value* sa, ir::Value* sb, ir::Value* sy,
                  size_t zyInput, ir::DType fallback, const ir::Shape& zyShape) {
  if (sa->type().dtype != sb->type().dtype || sa->type().dtype != sy->type().dtype)
    return ctx.invalid("the scales must have one type");
  KILN_ASSIGN_OR_RETURN(ir::Value * m, ctx.emit(OpKind::kMul, {sa, sb}));
  KILN_ASSIGN_OR_RETURN(m, ctx.emit(OpKind::kDiv, {m, sy}));
  KILN_ASSIGN_OR_RETURN(m, ctx.emit(OpKind::kCast, {m}, {{"to", std::string("f64")}}));
  KILN_ASSIGN_OR_RETURN(ir::Value * y, ctx.emit(OpKind::kMul, {acc, m}));
  ir::DType out = fallback;
  if (ctx.hasInput(zyInput)) {
    KILN_ASSIGN_OR_RETURN(ir::TensorType zt, ctx.inputType(zyInput));
    out = zt.dtype;
    if (zt.numElements() != 1 && zt.numElements() != ir::numElements(zyShape))
      return ctx.invalid("y_zero_point " + zt.toString() + " must hold 1 or " +
                         std::to_string(ir::numElements(zyShape)) + " values");
    KILN_ASSIGN_OR_RETURN(ir::Value * z, ctx.value(zyInput, /*trainable=*/false));
    KILN_ASSIGN_OR_RETURN(z, ctx.emit(OpKind::kCast, {z}, {{"to", std::string("f64")}}));
    KILN_ASSIGN_OR_RETURN(z, ctx.emit(OpKind::kReshape, {z},
                                      {{"shape", zt.numElements() == 1 ? ir::Shape{} : zyShape}}));
    KILN_ASSIGN_OR_RETURN(y, ctx.emit(OpKind::kAdd, {y, z}));
  }
  if (out != ir::DType::kI8 && out != ir::DType::kU8)
    return ctx.unsupported("a quantized output of " + std::string(ir::dtypeName(out)) +
                           " (kiln quantizes to int8 and uint8)");
  KILN_ASSIGN_OR_RETURN(y, ctx.emit(OpKind::kRound, {y}));
  const bool u8 = out == ir::DType::kU8;
  KILN_ASSIGN_OR_RETURN(
      y, ctx.emit(OpKind::kClip, {y}, {{"min", u8 ? 0.0 : -128.0}, {"max", u8 ? 255.0 : 127.0}}));
  return ctx.emit(OpKind::kCast, {y}, {{"to", std::string(ir::dtypeName(out))}}, 0).status();
}

// The rows and columns of a matrix product's operands [..., M, K] x [..., K, N].
Expected<std::pair<int64_t, int64_t>> productRowsCols(NodeContext& ctx, size_t a, size_t b) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType at, ctx.inputType(a));
  KILN_ASSIGN_OR_RETURN(ir::TensorType bt, ctx.inputType(b));
  if (at.rank() < 2 || bt.rank() < 2)
    return ctx.unsupported(ctx.opType() + " of " + at.toString() + " and " + bt.toString() +
                           " (kiln takes matrices and batches of them)");
  return std::pair<int64_t, int64_t>{at.shape[at.shape.size() - 2], bt.shape.back()};
}

Status mapMatMulInteger(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(auto mn, productRowsCols(ctx, 0, 1));
  KILN_ASSIGN_OR_RETURN(ir::Value * a, shiftedF64(ctx, 0, 2, {mn.first, 1}));
  KILN_ASSIGN_OR_RETURN(ir::Value * b, shiftedF64(ctx, 1, 3, {mn.second}));
  KILN_ASSIGN_OR_RETURN(ir::Value * c, ctx.emit(OpKind::kMatMul, {a, b}));
  return ctx.emit(OpKind::kCast, {c}, {{"to", std::string("i32")}}, 0).status();
}

// QLinearMatMul (10, 21): a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
// y_zero_point; a's parameters per tensor or per row, b's and y's per tensor or per column.
Status mapQLinearMatMul(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(auto mn, productRowsCols(ctx, 0, 3));
  const ir::Shape row{mn.first, 1}, col{mn.second};
  KILN_ASSIGN_OR_RETURN(ir::Value * a, shiftedF64(ctx, 0, 2, row));
  KILN_ASSIGN_OR_RETURN(ir::Value * b, shiftedF64(ctx, 3, 5, col));
  KILN_ASSIGN_OR_RETURN(ir::Value * c, ctx.emit(OpKind::kMatMul, {a, b}));
  KILN_ASSIGN_OR_RETURN(ir::Value * sa, scaleInput(ctx, 1, row));
  KILN_ASSIGN_OR_RETURN(ir::Value * sb, scaleInput(ctx, 4, col));
  KILN_ASSIGN_OR_RETURN(ir::Value * sy, scaleInput(ctx, 6, col));
  KILN_ASSIGN_OR_RETURN(ir::TensorType at, ctx.inputType(0));
  return requantize(ctx, c, sa, sb, sy, 7, at.dtype, col);
}

// The integer convolution of ConvInteger and QLinearConv: x - x_zp (per tensor) and w - w_zp
// (per tensor or per output channel) in f64 through kiln's conv2d with the node's window
// attributes (1-D as [1, L]), plus an int32 bias (QLinearConv's B).
Expected<ir::Value*> integerConv(NodeContext& ctx, size_t x, size_t xzp, size_t w, size_t wzp,
                                 std::optional<size_t> bias) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(x));
  KILN_ASSIGN_OR_RETURN(ir::TensorType wt, ctx.inputType(w));
  if ((xt.rank() != 3 && xt.rank() != 4) || wt.rank() != xt.rank())
    return ctx.unsupported(ctx.opType() + " of " + xt.toString() + " and " + wt.toString() +
                           " (kiln has 1-D and 2-D convolutions)");
  ir::Shape perChannel(wt.shape.size(), 1);
  perChannel[0] = wt.shape[0];
  KILN_ASSIGN_OR_RETURN(ir::Value * xv, shiftedF64(ctx, x, xzp, {}));
  KILN_ASSIGN_OR_RETURN(ir::Value * wv, shiftedF64(ctx, w, wzp, perChannel));
  std::vector<int64_t> kernel(wt.shape.begin() + 2, wt.shape.end());
  KILN_ASSIGN_OR_RETURN(Window win, readWindow(ctx, xt.shape, kernel));
  KILN_ASSIGN_OR_RETURN(int64_t group, ctx.attrInt("group", 1));
  ir::AttrMap attrs = windowAttrs2d(win, false, true);
  attrs["group"] = group;
  const bool oneD = xt.rank() == 3;
  if (oneD) {
    KILN_ASSIGN_OR_RETURN(xv, unsqueeze2(ctx, xv));
    KILN_ASSIGN_OR_RETURN(wv, unsqueeze2(ctx, wv));
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * y, ctx.emit(OpKind::kConv2d, {xv, wv}, std::move(attrs)));
  if (bias && ctx.hasInput(*bias)) {
    KILN_ASSIGN_OR_RETURN(ir::TensorType bt, ctx.inputType(*bias));
    if (bt.dtype != ir::DType::kI32 || bt.shape != ir::Shape{wt.shape[0]})
      return ctx.invalid("B " + bt.toString() + " must be i32[" + std::to_string(wt.shape[0]) +
                         "]");
    KILN_ASSIGN_OR_RETURN(ir::Value * b, ctx.value(*bias, /*trainable=*/false));
    KILN_ASSIGN_OR_RETURN(b, ctx.emit(OpKind::kCast, {b}, {{"to", std::string("f64")}}));
    KILN_ASSIGN_OR_RETURN(
        b, ctx.emit(OpKind::kReshape, {b}, {{"shape", ir::Shape{wt.shape[0], 1, 1}}}));
    KILN_ASSIGN_OR_RETURN(y, ctx.emit(OpKind::kAdd, {y, b}));
  }
  if (oneD) return ctx.emit(OpKind::kSqueeze, {y}, {{"axes", std::vector<int64_t>{2}}});
  return y;
}

Status mapConvInteger(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::Value * y, integerConv(ctx, 0, 2, 1, 3, std::nullopt));
  return ctx.emit(OpKind::kCast, {y}, {{"to", std::string("i32")}}, 0).status();
}

// QLinearConv (10): x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
// B; w's parameters per tensor or per output channel.
Status mapQLinearConv(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(ir::TensorType wt, ctx.inputType(3));
  KILN_ASSIGN_OR_RETURN(ir::Value * acc, integerConv(ctx, 0, 2, 3, 5, 8));
  ir::Shape perOut(xt.shape.size(), 1);
  perOut[1] = wt.shape[0];
  KILN_ASSIGN_OR_RETURN(ir::Value * sx, scaleInput(ctx, 1, {}));
  KILN_ASSIGN_OR_RETURN(ir::Value * sw, scaleInput(ctx, 4, perOut));
  KILN_ASSIGN_OR_RETURN(ir::Value * sy, scaleInput(ctx, 6, {}));
  return requantize(ctx, acc, sx, sw, sy, 7, xt.dtype, {});
}

// DynamicQuantizeLinear (11): uint8 with scale (max(0, max x) - min(0, min x)) / 255 (1 where
// the two are equal) and zero point saturate(round(-min / scale)), as ONNX's reference.
Status mapDynamicQuantizeLinear(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  if (xt.dtype != ir::DType::kF32)
    return ctx.unsupported("DynamicQuantizeLinear of " + xt.toString() + " (kiln takes f32)");
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  const ir::AttrMap all{{"axes", std::vector<int64_t>{}}, {"keepdims", int64_t{0}}};
  KILN_ASSIGN_OR_RETURN(ir::Value * zero, scalarConstant(ctx, ir::DType::kF32, 0));
  KILN_ASSIGN_OR_RETURN(ir::Value * mx, ctx.emit(OpKind::kReduceMax, {x}, all));
  KILN_ASSIGN_OR_RETURN(mx, ctx.emit(OpKind::kMaximum, {mx, zero}));
  KILN_ASSIGN_OR_RETURN(ir::Value * nx, ctx.emit(OpKind::kNeg, {x}));
  KILN_ASSIGN_OR_RETURN(ir::Value * mn, ctx.emit(OpKind::kReduceMax, {nx}, all));
  KILN_ASSIGN_OR_RETURN(mn, ctx.emit(OpKind::kNeg, {mn}));
  KILN_ASSIGN_OR_RETURN(mn, ctx.emit(OpKind::kMinimum, {mn, zero}));
  KILN_ASSIGN_OR_RETURN(ir::Value * range, ctx.emit(OpKind::kSub, {mx, mn}));
  KILN_ASSIGN_OR_RETURN(ir::Value * same, ctx.emit(OpKind::kEqual, {mx, mn}));
  KILN_ASSIGN_OR_RETURN(ir::Value * one, scalarConstant(ctx, ir::DType::kF32, 1));
  KILN_ASSIGN_OR_RETURN(range, ctx.emit(OpKind::kWhere, {same, one, range}));
  KILN_ASSIGN_OR_RETURN(ir::Value * q, scalarConstant(ctx, ir::DType::kF32, 255));
  KILN_ASSIGN_OR_RETURN(ir::Value * scale, ctx.emit(OpKind::kDiv, {range, q}, {}, 1));
  KILN_ASSIGN_OR_RETURN(ir::Value * zp, ctx.emit(OpKind::kDiv, {mn, scale}));
  KILN_ASSIGN_OR_RETURN(zp, ctx.emit(OpKind::kNeg, {zp}));
  KILN_ASSIGN_OR_RETURN(zp, ctx.emit(OpKind::kClip, {zp}, {{"min", 0.0}, {"max", 255.0}}));
  KILN_ASSIGN_OR_RETURN(zp, ctx.emit(OpKind::kRound, {zp}));
  KILN_ASSIGN_OR_RETURN(ir::Value * y, ctx.emit(OpKind::kDiv, {x, scale}));
  KILN_ASSIGN_OR_RETURN(y, ctx.emit(OpKind::kRound, {y}));
  KILN_ASSIGN_OR_RETURN(y, ctx.emit(OpKind::kAdd, {y, zp}));
  KILN_ASSIGN_OR_RETURN(y, ctx.emit(OpKind::kClip, {y}, {{"min", 0.0}, {"max", 255.0}}));
  KILN_TRY(ctx.emit(OpKind::kCast, {y}, {{"to", std::string("u8")}}, 0).status());
  return ctx.emit(OpKind::kCast, {zp}, {{"to", std::string("u8")}}, 2).status();
}

// ONNX's pooled size: ceil mode adds a last partial window unless it would start in the right
// padding (ONNX's spec and reference since 1.16, ONNX Runtime 1.31, PyTorch and kiln; libonnx
// 1.12's shape inference, which kiln links, still counted such a window).
int64_t onnxPooledSize(int64_t in, int64_t k, int64_t s, int64_t d, int64_t pb, int64_t pe,
                       bool ceil) {
  const int64_t avail = in + pb + pe - ((k - 1) * d + 1);
  if (avail < 0) return 0;
  const int64_t out = avail / s + (ceil && avail % s != 0) + 1;
  return ceil && (out - 1) * s >= in + pb ? out - 1 : out;
}
// Whether libonnx 1.12's shape inference counts one window more than onnxPooledSize along some
// dim (a ceil-mode window starting in the right padding): the output is then marked diverged
// (NodeContext::divergesFromLibonnx).
bool libonnxCountsMore(const std::vector<int64_t>& x, const Window& w, bool ceil) {
  const size_t spatial = x.size() - 2;
  for (size_t i = 0; ceil && i < spatial; ++i) {
    const int64_t avail =
        x[i + 2] + w.pads[i] + w.pads[i + spatial] - ((w.kernel[i] - 1) * w.dilations[i] + 1);
    const int64_t old = avail < 0 ? 0 : avail / w.strides[i] + (avail % w.strides[i] != 0) + 1;
    if (old != onnxPooledSize(x[i + 2], w.kernel[i], w.strides[i], w.dilations[i], w.pads[i],
                              w.pads[i + spatial], ceil))
      return true;
  }
  return false;
}

// MaxPool's Indices: kiln's max_pool2d_indices (the offset in each [H,W] plane) made ONNX's flat
// position in the input, n*C*H*W + c*H*W + h*W + w, or with storage_order=1 (column-major planes)
// n*C*H*W + c*H*W + h + w*H; a 1-D input's is its position in the row. `attrs`: the pooling's.
Status emitMaxPoolIndices(NodeContext& ctx, ir::Value* x, const ir::TensorType& xt,
                          const ir::AttrMap& attrs) {
  KILN_ASSIGN_OR_RETURN(int64_t order, ctx.attrInt("storage_order", 0));
  if (order != 0 && order != 1)
    return ctx.invalid("storage_order must be 0 or 1, got " + std::to_string(order));
  const bool oneD = xt.rank() == 3;
  ir::Value* x4 = x;
  if (oneD) {
    KILN_ASSIGN_OR_RETURN(x4, unsqueeze2(ctx, x));
  }
  const int64_t h = x4->type().shape[2], w = x4->type().shape[3];
  KILN_ASSIGN_OR_RETURN(ir::Value * idx, ctx.emit(OpKind::kMaxPool2dIndices, {x4}, attrs));
  auto scalar = [&](int64_t v) {
    ir::TensorData d(ir::DType::kI64, {});
    *d.as<int64_t>() = v;
    return ctx.constantValue(std::move(d));
  };
  if (order == 1 && !oneD) {
    // idx = r*W + c -> r + c*H.
    KILN_ASSIGN_OR_RETURN(ir::Value * wv, scalar(w));
    KILN_ASSIGN_OR_RETURN(ir::Value * hv, scalar(h));
    KILN_ASSIGN_OR_RETURN(ir::Value * row, ctx.emit(OpKind::kDiv, {idx, wv}));
    KILN_ASSIGN_OR_RETURN(ir::Value * col,
                          ctx.emit(OpKind::kMod, {idx, wv}, {{"fmod", int64_t{1}}}));
    KILN_ASSIGN_OR_RETURN(ir::Value * colH, ctx.emit(OpKind::kMul, {col, hv}));
    KILN_ASSIGN_OR_RETURN(idx, ctx.emit(OpKind::kAdd, {row, colH}));
  }
  if (oneD) {
    KILN_ASSIGN_OR_RETURN(idx,
                          ctx.emit(OpKind::kSqueeze, {idx}, {{"axes", std::vector<int64_t>{2}}}));
  }
  // Each (n, c) plane's first position, broadcast over its outputs.
  const int64_t planes = xt.shape[0] * xt.shape[1];
  ir::Shape offShape = {xt.shape[0], xt.shape[1], 1};
  if (!oneD) offShape.push_back(1);
  ir::TensorData offsets(ir::DType::kI64, offShape);
  for (int64_t p = 0; p < planes; ++p) offsets.as<int64_t>()[p] = p * h * w;
  KILN_ASSIGN_OR_RETURN(ir::Value * off, ctx.constantValue(std::move(offsets)));
  return ctx.emit(OpKind::kAdd, {idx, off}, {}, 1).status();
}

// The sum over each window of x (f32 or f64) as a depthwise convolution with a kernel of ones,
// which takes the pads, strides and dilations (the padding adds zeros, as ONNX's), with more zero
// padding at the end for a ceil-mode last partial window where ONNX keeps it (onnxPooledSize).
Expected<ir::Value*> windowSum(NodeContext& ctx, ir::Value* x, const ir::TensorType& xt, Window w,
                               bool ceil) {
  const size_t spatial = xt.shape.size() - 2;
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t avail = xt.shape[i + 2] + w.pads[i] + w.pads[i + spatial] -
                          ((w.kernel[i] - 1) * w.dilations[i] + 1);
    if (avail < 0)
      return ctx.invalid("kernel " + list(w.kernel) + " with dilations " + list(w.dilations) +
                         " does not fit the padded input " + xt.toString());
    const int64_t out = onnxPooledSize(xt.shape[i + 2], w.kernel[i], w.strides[i], w.dilations[i],
                                       w.pads[i], w.pads[i + spatial], ceil);
    w.pads[i + spatial] += std::max<int64_t>(0, (out - 1) * w.strides[i] - avail);
  }
  const int64_t c = xt.shape[1];
  ir::Shape wshape{c, 1};
  for (int64_t k : w.kernel) wshape.push_back(k);
  int64_t weights = 1;
  for (int64_t d : wshape)
    if (!ir::accumulateElements(weights, d) || weights > kMaxFoldElements)
      return ctx.unsupported("a kernel of " + list(w.kernel) + " over " + std::to_string(c) +
                             " channels (kiln sums it with a constant kernel of ones; too large)");
  if (spatial == 1) wshape.insert(wshape.begin() + 2, 1);
  KILN_ASSIGN_OR_RETURN(ir::Value * ones, ctx.constantValue(filledTensor(xt.dtype, wshape, 1.0)));
  if (spatial == 3) return emitConv3d(emitterOf(ctx), x, ones, nullptr, window3dOf(w), c);
  ir::AttrMap attrs = windowAttrs2d(w, false, true);
  attrs["group"] = c;
  return emitWindowOp(ctx, OpKind::kConv2d, x, {ones}, std::move(attrs), spatial == 1, -1);
}

// How many of each window's positions along one dim are counted in its mean, at import: those
// inside the input and, with count_include_pad, its pads (not ceil mode's extra end).
std::vector<int64_t> windowCounts(int64_t in, int64_t k, int64_t s, int64_t d, int64_t pb,
                                  int64_t pe, int64_t out, bool include) {
  std::vector<int64_t> counts(static_cast<size_t>(out), 0);
  for (int64_t o = 0; o < out; ++o)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t p = o * s + j * d;  // In padded coordinates.
      counts[static_cast<size_t>(o)] += include ? p < in + pb + pe : p >= pb && p < pb + in;
    }
  return counts;
}

// AveragePool where kiln's avg_pool2d cannot express it (dilations; pads beyond half the window):
// windowSum divided by each window's count (windowCounts, a constant [1, 1, out...]). A window
// wholly in the padding without count_include_pad counts 0 and gives NaN, as ONNX's reference (the
// mean of nothing).
Expected<ir::Value*> averageBySum(NodeContext& ctx, ir::Value* x, const ir::TensorType& xt,
                                  const Window& w, bool ceil, bool include) {
  if (xt.dtype != ir::DType::kF32 && xt.dtype != ir::DType::kF64)
    return ctx.unsupported("AveragePool of " + xt.toString() + " with dilations " +
                           list(w.dilations) + " and pads " + list(w.pads) +
                           " (kiln's avg_pool2d has no dilations and pads of at most half the "
                           "window; the sums kiln computes instead are f32 and f64)");
  const size_t spatial = xt.shape.size() - 2;
  ir::Shape countShape{1, 1};
  int64_t total = 1;
  for (size_t i = 0; i < spatial; ++i) {
    countShape.push_back(onnxPooledSize(xt.shape[i + 2], w.kernel[i], w.strides[i], w.dilations[i],
                                        w.pads[i], w.pads[i + spatial], ceil));
    if (!ir::accumulateElements(total, countShape.back()) || total > kMaxFoldElements)
      return ctx.unsupported("AveragePool to " + list(countShape) +
                             " (kiln divides by a constant of each window's count, computed at "
                             "import: too large)");
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * sum, windowSum(ctx, x, xt, w, ceil));
  std::vector<std::vector<int64_t>> perDim;
  for (size_t i = 0; i < spatial; ++i) {
    const int64_t in = xt.shape[i + 2];
    const int64_t out = countShape[i + 2];
    perDim.push_back(windowCounts(in, w.kernel[i], w.strides[i], w.dilations[i], w.pads[i],
                                  w.pads[i + spatial], out, include));
  }
  ir::TensorData counts = filledTensor(xt.dtype, countShape, 0);
  for (int64_t e = 0; e < total; ++e) {
    double v = 1;
    for (int64_t r = e, i = static_cast<int64_t>(spatial) - 1; i >= 0; --i) {
      const auto& dim = perDim[static_cast<size_t>(i)];
      v *= static_cast<double>(dim[static_cast<size_t>(r % static_cast<int64_t>(dim.size()))]);
      r /= static_cast<int64_t>(dim.size());
    }
    if (xt.dtype == ir::DType::kF32)
      counts.as<float>()[e] = static_cast<float>(v);
    else
      counts.as<double>()[e] = v;
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * n, ctx.constantValue(std::move(counts)));
  return ctx.emit(OpKind::kDiv, {sum, n});
}

// x padded with `value` along every spatial dim by `pads` (begins, then ends), by concats.
Expected<ir::Value*> padSpatial(NodeContext& ctx, ir::Value* x, const std::vector<int64_t>& pads,
                                double value) {
  const size_t spatial = x->type().shape.size() - 2;
  KILN_ASSIGN_OR_RETURN(ir::Value * fill, scalarConstant(ctx, x->type().dtype, value));
  for (size_t i = 0; i < spatial; ++i) {
    auto band = [&](int64_t n) {
      ir::Shape shape = x->type().shape;
      shape[i + 2] = n;
      return ctx.emit(OpKind::kExpand, {fill}, {{"shape", shape}});
    };
    std::vector<ir::Value*> parts;
    if (pads[i] > 0) {
      KILN_ASSIGN_OR_RETURN(ir::Value * b, band(pads[i]));
      parts.push_back(b);
    }
    parts.push_back(x);
    if (pads[i + spatial] > 0) {
      KILN_ASSIGN_OR_RETURN(ir::Value * b, band(pads[i + spatial]));
      parts.push_back(b);
    }
    if (parts.size() == 1) continue;
    KILN_ASSIGN_OR_RETURN(
        x, ctx.emit(OpKind::kConcat, parts, {{"axis", static_cast<int64_t>(i + 2)}}));
  }
  return x;
}

// MaxPool and AveragePool. Where kiln's pools cannot express the window, ONNX's result is
// composed: a max pool with pads beyond half the window pools the input padded with -inf
// explicitly (pads then 0), cut to ONNX's output size (a ceil-mode window in what was the right
// padding is ONNX's to drop); an average pool with dilations or such pads is averageBySum. An
// 8-bit integer max pool, and an f16/bf16 one padded explicitly, runs on f32 (exact: every value
// is one) and is cast back.
template <OpKind kOp>
Status mapPool(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, windowInput(ctx, /*threeD=*/true));
  const bool isMax = kOp == OpKind::kMaxPool2d;
  KILN_ASSIGN_OR_RETURN(auto kernel, ctx.attrInts("kernel_shape"));
  KILN_ASSIGN_OR_RETURN(Window w, readWindow(ctx, xt.shape, kernel));
  KILN_ASSIGN_OR_RETURN(bool ceil, ctx.attrBool("ceil_mode", false));
  bool include = false;
  if (!isMax) {
    KILN_ASSIGN_OR_RETURN(include, ctx.attrBool("count_include_pad", false));
  }
  const size_t spatial = xt.shape.size() - 2;
  std::vector<int64_t> onnxOut;
  bool padsFit = true;
  for (size_t i = 0; i < spatial; ++i) {
    onnxOut.push_back(onnxPooledSize(xt.shape[i + 2], w.kernel[i], w.strides[i], w.dilations[i],
                                     w.pads[i], w.pads[i + spatial], ceil));
    const int64_t maxPad = ir::maxPoolPad(w.kernel[i], w.dilations[i]);  // readWindow: >= 1.
    padsFit = padsFit && w.pads[i] <= maxPad && w.pads[i + spatial] <= maxPad;
  }
  const bool dilated =
      std::any_of(w.dilations.begin(), w.dilations.end(), [](int64_t d) { return d != 1; });
  if (isMax && spatial == 3 && ctx.outputUsed(1))
    return ctx.unsupported("MaxPool's Indices of a 3-D pooling (kiln has them for 1-D and 2-D)");
  if (libonnxCountsMore(xt.shape, w, ceil)) {
    ctx.divergesFromLibonnx(0);
    if (isMax && ctx.outputUsed(1)) ctx.divergesFromLibonnx(1);
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  if (!isMax && (dilated || !padsFit)) {
    KILN_ASSIGN_OR_RETURN(ir::Value * y, averageBySum(ctx, x, xt, w, ceil, include));
    ctx.setOutput(0, y);
    return Status::ok();
  }
  // 8-bit integers, and f16/bf16 to be padded with -inf (which kiln's f16/bf16 constants cannot
  // hold), pool in f32: exact, every value is one.
  const bool half = xt.dtype == ir::DType::kF16 || xt.dtype == ir::DType::kBF16;
  const bool viaF32 =
      isMax && (xt.dtype == ir::DType::kU8 || xt.dtype == ir::DType::kI8 || (half && !padsFit));
  if (viaF32) {
    KILN_ASSIGN_OR_RETURN(x, ctx.emit(OpKind::kCast, {x}, {{"to", std::string("f32")}}));
  }
  const bool padExplicitly = isMax && !padsFit;
  if (padExplicitly) {
    if (ctx.outputUsed(1))
      return ctx.unsupported("MaxPool's Indices with pads " + list(w.pads) +
                             " beyond half the window (kernel " + list(w.kernel) + ")");
    KILN_ASSIGN_OR_RETURN(x, padSpatial(ctx, x, w.pads, -std::numeric_limits<double>::infinity()));
    std::fill(w.pads.begin(), w.pads.end(), 0);
  }
  ir::AttrMap attrs = windowAttrs2d(w, true, isMax);
  attrs["ceil_mode"] = int64_t{ceil};
  if (!isMax) attrs["count_include_pad"] = int64_t{include};
  ir::Value* y = nullptr;
  if (spatial == 3) {
    ir::AttrMap extra{{"ceil_mode", attrs["ceil_mode"]}};
    if (!isMax) extra["count_include_pad"] = attrs["count_include_pad"];
    KILN_ASSIGN_OR_RETURN(y, emitPool3d(emitterOf(ctx), kOp, x, window3dOf(w), extra));
  } else {
    KILN_ASSIGN_OR_RETURN(y, emitWindowOp(ctx, kOp, x, {}, attrs, spatial == 1, -1));
  }
  for (size_t i = 0; padExplicitly && i < spatial; ++i) {
    if (y->type().shape[i + 2] == onnxOut[i]) continue;
    KILN_ASSIGN_OR_RETURN(y, ctx.emit(OpKind::kSlice, {y},
                                      {{"starts", std::vector<int64_t>{0}},
                                       {"ends", std::vector<int64_t>{onnxOut[i]}},
                                       {"axes", std::vector<int64_t>{static_cast<int64_t>(i + 2)}},
                                       {"steps", std::vector<int64_t>{1}}}));
  }
  const std::vector<int64_t> kilnOut(y->type().shape.begin() + 2, y->type().shape.end());
  if (kilnOut != onnxOut)
    return internalError("kiln's pooled size " + list(kilnOut) + " is not ONNX's " + list(onnxOut));
  if (viaF32) {
    KILN_ASSIGN_OR_RETURN(
        y, ctx.emit(OpKind::kCast, {y}, {{"to", std::string(ir::dtypeName(xt.dtype))}}));
  }
  ctx.setOutput(0, y);
  if (isMax && ctx.outputUsed(1)) return emitMaxPoolIndices(ctx, x, xt, attrs);
  return Status::ok();
}

// |x|^p and its root s^(1/p), the two ends of LpPool and GlobalLpPool (abs, a square and sqrt
// for p 1 and 2).
Expected<ir::Value*> absPower(NodeContext& ctx, ir::Value* x, int64_t p) {
  KILN_ASSIGN_OR_RETURN(ir::Value * a, ctx.emit(OpKind::kAbs, {x}));
  if (p == 1) return a;
  if (p == 2) return ctx.emit(OpKind::kMul, {a, a});
  KILN_ASSIGN_OR_RETURN(ir::Value * e,
                        scalarConstant(ctx, x->type().dtype, static_cast<double>(p)));
  return ctx.emit(OpKind::kPow, {a, e});
}

Status emitRoot(NodeContext& ctx, ir::Value* s, int64_t p) {
  if (p == 1) {
    ctx.setOutput(0, s);
    return Status::ok();
  }
  if (p == 2) return ctx.emit(OpKind::kSqrt, {s}, {}, 0).status();
  KILN_ASSIGN_OR_RETURN(ir::Value * e, scalarConstant(ctx, s->type().dtype, 1.0 / p));
  return ctx.emit(OpKind::kPow, {s, e}, {}, 0).status();
}

Expected<int64_t> lpOrder(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t p, ctx.attrInt("p", 2));
  if (p < 1) return ctx.invalid("p must be 1 or more, got " + std::to_string(p));
  return p;
}

// LpPool: (sum over each window of |x|^p)^(1/p), the sum windowSum's.
Status mapLpPool(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, windowInput(ctx, /*threeD=*/true));
  KILN_TRY(floatInput(ctx).status());
  KILN_ASSIGN_OR_RETURN(int64_t p, lpOrder(ctx));
  KILN_ASSIGN_OR_RETURN(auto kernel, ctx.attrInts("kernel_shape"));
  KILN_ASSIGN_OR_RETURN(Window w, readWindow(ctx, xt.shape, kernel));
  KILN_ASSIGN_OR_RETURN(bool ceil, ctx.attrBool("ceil_mode", false));
  if (libonnxCountsMore(xt.shape, w, ceil)) ctx.divergesFromLibonnx(0);
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(ir::Value * powered, absPower(ctx, x, p));
  KILN_ASSIGN_OR_RETURN(ir::Value * sum, windowSum(ctx, powered, xt, w, ceil));
  return emitRoot(ctx, sum, p);
}

// GlobalLpPool: the same over all spatial dims, kept as 1.
Status mapGlobalLpPool(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, floatInput(ctx));
  if (xt.rank() < 3) return ctx.invalid("input " + xt.toString() + " must be [N,C,spatial...]");
  KILN_ASSIGN_OR_RETURN(int64_t p, lpOrder(ctx));
  std::vector<int64_t> axes(static_cast<size_t>(xt.rank() - 2));
  std::iota(axes.begin(), axes.end(), 2);
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(ir::Value * powered, absPower(ctx, x, p));
  KILN_ASSIGN_OR_RETURN(ir::Value * sum, ctx.emit(OpKind::kReduceSum, {powered},
                                                  {{"axes", axes}, {"keepdims", int64_t{1}}}));
  return emitRoot(ctx, sum, p);
}

Status mapGlobalPool(NodeContext& ctx, OpKind reduce) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  if (xt.rank() < 3) return ctx.invalid("input " + xt.toString() + " must be [N,C,spatial...]");
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  if (reduce == OpKind::kReduceMean && xt.rank() == 4)
    return ctx.emit(OpKind::kGlobalAvgPool, {x}, {}, 0).status();
  std::vector<int64_t> axes(static_cast<size_t>(xt.rank() - 2));
  std::iota(axes.begin(), axes.end(), 2);
  return ctx.emit(reduce, {x}, {{"axes", axes}, {"keepdims", int64_t{1}}}, 0).status();
}

// BatchNormalization 14+ in training mode, as ONNX's reference computes it: normalized by the
// batch's mean and (population) variance per channel, and, where read, the running mean and
// variance moved toward them by `momentum` (input * momentum + batch * (1 - momentum)).
Status batchNormTraining(NodeContext& ctx, double eps) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  if (xt.rank() < 2 || !ir::isFloat(xt.dtype))
    return ctx.invalid("input " + xt.toString() + " must be floating point [N,C,...]");
  for (size_t i = 1; i < 5; ++i) {
    KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(i));
    if (t.dtype != xt.dtype)
      return ctx.unsupported("training mode with input " + std::to_string(i) + " of " +
                             t.toString() + " for X of " + xt.toString() +
                             " (kiln takes one dtype for all five)");
  }
  KILN_ASSIGN_OR_RETURN(double momentum, ctx.attrFloat("momentum", 0.9));
  std::vector<int64_t> axes{0};
  for (int d = 2; d < xt.rank(); ++d) axes.push_back(d);
  const ir::Shape channels{xt.shape[1]};
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(ir::Value * kept, ctx.emit(OpKind::kReduceMean, {x},
                                                   {{"axes", axes}, {"keepdims", int64_t{1}}}));
  KILN_ASSIGN_OR_RETURN(ir::Value * d, ctx.emit(OpKind::kSub, {x, kept}));
  KILN_ASSIGN_OR_RETURN(ir::Value * d2, ctx.emit(OpKind::kMul, {d, d}));
  KILN_ASSIGN_OR_RETURN(ir::Value * var, ctx.emit(OpKind::kReduceMean, {d2},
                                                  {{"axes", axes}, {"keepdims", int64_t{0}}}));
  KILN_ASSIGN_OR_RETURN(ir::Value * mean,
                        ctx.emit(OpKind::kReshape, {kept}, {{"shape", channels}}));
  std::vector<ir::Value*> ins{x};
  for (size_t i = 1; i < 3; ++i) {
    KILN_ASSIGN_OR_RETURN(ir::Value * v, ctx.value(i));
    ins.push_back(v);
  }
  ins.push_back(mean);
  ins.push_back(var);
  KILN_TRY(ctx.emit(OpKind::kBatchNorm, std::move(ins), {{"epsilon", eps}}, 0).status());
  for (size_t k = 1; k < 3 && k < ctx.numOutputs(); ++k) {
    if (!ctx.outputUsed(k)) continue;
    KILN_ASSIGN_OR_RETURN(ir::Value * running, ctx.value(k + 2, /*trainable=*/false));
    KILN_ASSIGN_OR_RETURN(ir::Value * keep,
                          ctx.constantValue(filledTensor(xt.dtype, {}, momentum)));
    KILN_ASSIGN_OR_RETURN(ir::Value * move,
                          ctx.constantValue(filledTensor(xt.dtype, {}, 1.0 - momentum)));
    KILN_ASSIGN_OR_RETURN(ir::Value * a, ctx.emit(OpKind::kMul, {running, keep}));
    KILN_ASSIGN_OR_RETURN(ir::Value * b, ctx.emit(OpKind::kMul, {k == 1 ? mean : var, move}));
    KILN_TRY(ctx.emit(OpKind::kAdd, {a, b}, {}, static_cast<int>(k)).status());
  }
  return Status::ok();
}

Status mapBatchNorm(NodeContext& ctx) {
  if (ctx.version() < 9) {
    // Version 7: spatial=0 normalizes per element of [C, spatial...], not per channel.
    KILN_ASSIGN_OR_RETURN(bool spatial, ctx.attrBool("spatial", true));
    if (!spatial) return ctx.unsupported("spatial=0 (kiln normalizes per channel)");
  }
  KILN_ASSIGN_OR_RETURN(double eps, ctx.attrFloat("epsilon", 1e-5));
  if (ctx.version() >= 14) {
    KILN_ASSIGN_OR_RETURN(bool training, ctx.attrBool("training_mode", false));
    if (training) return batchNormTraining(ctx, eps);
  }
  for (size_t k = 1; k < ctx.numOutputs(); ++k)
    KILN_TRY(requireUnused(ctx, k, "a training statistic"));
  std::vector<ir::Value*> ins;
  for (size_t i = 0; i < 5; ++i) {
    // Running mean and variance are statistics, not weights.
    KILN_ASSIGN_OR_RETURN(ir::Value * v, ctx.value(i, /*trainable=*/i < 3));
    ins.push_back(v);
  }
  return ctx.emit(OpKind::kBatchNorm, std::move(ins), {{"epsilon", eps}}, 0).status();
}

// LayerNormalization's Mean and InvStdDev outputs (when read): the statistics over [axis, rank)
// with those dims kept as 1, composed from kiln's reductions (the output itself is layer_norm).
Status layerNormStatistics(NodeContext& ctx, int axis, double eps) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  if (xt.dtype != ir::DType::kF32 && xt.dtype != ir::DType::kF64)
    return ctx.unsupported("the Mean and InvStdDev outputs of " + xt.toString() +
                           " (kiln composes them for f32 and f64)");
  KILN_TRY(requireStashType(ctx, xt.dtype));  // Mean and InvStdDev have stash_type's dtype.
  std::vector<int64_t> axes;
  for (int d = axis; d < xt.rank(); ++d) axes.push_back(d);
  const ir::AttrMap keep{{"axes", axes}, {"keepdims", int64_t{1}}};
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(ir::Value * mean,
                        ctx.emit(OpKind::kReduceMean, {x}, keep, ctx.outputUsed(1) ? 1 : -1));
  if (!ctx.outputUsed(2)) return Status::ok();
  KILN_ASSIGN_OR_RETURN(ir::Value * c, ctx.emit(OpKind::kSub, {x, mean}));
  KILN_ASSIGN_OR_RETURN(ir::Value * c2, ctx.emit(OpKind::kMul, {c, c}));
  KILN_ASSIGN_OR_RETURN(ir::Value * var, ctx.emit(OpKind::kReduceMean, {c2}, keep));
  KILN_ASSIGN_OR_RETURN(ir::Value * e, ctx.constantValue(filledTensor(xt.dtype, {}, eps)));
  KILN_ASSIGN_OR_RETURN(ir::Value * ve, ctx.emit(OpKind::kAdd, {var, e}));
  return ctx.emit(OpKind::kRsqrt, {ve}, {}, 2).status();
}

Status mapLayerNorm(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.attrInt("axis", -1));
  KILN_ASSIGN_OR_RETURN(double eps, ctx.attrFloat("epsilon", 1e-5));
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(int a, ir::normalizeAxis(axis, xt.shape.size(), "axis"));
  const ir::Shape normShape(xt.shape.begin() + a, xt.shape.end());
  std::vector<ir::Value*> ins;
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  ins.push_back(x);
  for (size_t i = 1; i < 3; ++i) {
    if (!ctx.hasInput(i)) continue;
    KILN_ASSIGN_OR_RETURN(ir::Value * v, ctx.value(i));
    // ONNX lets scale and bias broadcast to the normalized shape; kiln takes it exactly.
    if (v->type().shape != normShape) {
      KILN_ASSIGN_OR_RETURN(v, ctx.emit(OpKind::kExpand, {v}, {{"shape", normShape}}));
    }
    ins.push_back(v);
  }
  KILN_TRY(ctx.emit(OpKind::kLayerNorm, std::move(ins), {{"axis", int64_t{a}}, {"epsilon", eps}}, 0)
               .status());
  if (ctx.outputUsed(1) || ctx.outputUsed(2)) return layerNormStatistics(ctx, a, eps);
  return Status::ok();
}

template <OpKind kOp>
Status mapSoftmax(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.attrInt("axis", ctx.version() < 13 ? 1 : -1));
  KILN_ASSIGN_OR_RETURN(int a, ir::normalizeAxis(axis, xt.shape.size(), "axis"));
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(a) + 1; d < xt.shape.size(); ++d) inner *= xt.shape[d];
  if (ctx.version() >= 13 || inner == 1)
    return ctx.emit(kOp, {x}, {{"axis", int64_t{a}}}, 0).status();
  // Versions 1 and 11 normalize over all dims from `axis` on together, as one row of the input
  // flattened to 2-D at `axis`.
  KILN_ASSIGN_OR_RETURN(ir::Value * flat, ctx.emit(OpKind::kFlatten, {x}, {{"axis", int64_t{a}}}));
  KILN_ASSIGN_OR_RETURN(ir::Value * y, ctx.emit(kOp, {flat}, {{"axis", int64_t{1}}}));
  return ctx.emit(OpKind::kReshape, {y}, {{"shape", xt.shape}}, 0).status();
}

template <OpKind kOp>
Status mapArgReduce(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.attrInt("axis", 0));
  KILN_ASSIGN_OR_RETURN(bool keepdims, ctx.attrBool("keepdims", true));
  KILN_ASSIGN_OR_RETURN(bool last, ctx.attrBool("select_last_index", false));
  return foldOrEmit(
      ctx, kOp, {0},
      {{"axis", axis}, {"keepdims", int64_t{keepdims}}, {"select_last_index", int64_t{last}}});
}

template <OpKind kOp, bool kNegate = false>
Status mapReduce(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(bool keepdims, ctx.attrBool("keepdims", true));
  // Axes are an input from version 13 of ReduceSum and version 18 of the others.
  KILN_ASSIGN_OR_RETURN(auto maybeAxes, reduceAxes(ctx, ctx.opType() == "ReduceSum" ? 13 : 18));
  if (!maybeAxes) return alias(ctx, 0);
  const std::vector<int64_t>& axes = *maybeAxes;
  const ir::AttrMap attrs{{"axes", axes}, {"keepdims", int64_t{keepdims}}};
  // Known at import (shape arithmetic: the smaller side of an image): evaluated there.
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* known, ctx.constant(0));
  if (known && !ctx.inputTrainable(0)) {
    constexpr Reduce kReduce = kNegate                      ? Reduce::kMin
                               : kOp == OpKind::kReduceSum  ? Reduce::kSum
                               : kOp == OpKind::kReduceMean ? Reduce::kMean
                               : kOp == OpKind::kReduceProd ? Reduce::kProd
                                                            : Reduce::kMax;
    Expected<ir::TensorData> r = evaluateReduce(kReduce, *known, axes, keepdims);
    if (r) {
      ctx.setConstantOutput(0, std::move(*r));
      return Status::ok();
    }
    if (r.status().code() != ErrorCode::kUnimplemented) return r.status();
  }
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  const ir::DType dt = x->type().dtype;
  if (dt == ir::DType::kBool && kOp == OpKind::kReduceMax) {
    // Bool max is any (u8's max, an empty one false); min is all, not(any(not x)).
    ir::Value* v = x;
    if (kNegate) {
      KILN_ASSIGN_OR_RETURN(v, ctx.emit(OpKind::kLogicalNot, {v}));
    }
    KILN_ASSIGN_OR_RETURN(v, ctx.emit(OpKind::kCast, {v}, {{"to", std::string("u8")}}));
    KILN_ASSIGN_OR_RETURN(v, ctx.emit(kOp, {v}, attrs));
    const ir::AttrMap toBool{{"to", std::string("bool")}};
    if (!kNegate) return ctx.emit(OpKind::kCast, {v}, toBool, 0).status();
    KILN_ASSIGN_OR_RETURN(v, ctx.emit(OpKind::kCast, {v}, toBool));
    return ctx.emit(OpKind::kLogicalNot, {v}, {}, 0).status();
  }
  if (!kNegate) return ctx.emit(kOp, {x}, attrs, 0).status();
  // ReduceMin(x) = -ReduceMax(-x) for floats; for integers ~ReduceMax(~x): bitwise not reverses
  // the order of signed and unsigned values alike and maps an empty reduction's lowest value to
  // the type's largest, as ONNX specifies (negation would overflow at INT_MIN).
  const OpKind flip = ir::isInteger(dt) ? OpKind::kBitwiseNot : OpKind::kNeg;
  if (!ir::isFloat(dt) && !ir::isInteger(dt))
    return ctx.unsupported("ReduceMin of " + x->type().toString());
  KILN_ASSIGN_OR_RETURN(ir::Value * neg, ctx.emit(flip, {x}));
  KILN_ASSIGN_OR_RETURN(ir::Value * m, ctx.emit(kOp, {neg}, attrs));
  return ctx.emit(flip, {m}, {}, 0).status();
}

}  // namespace

// Versions, checked against the specification (later versions that only add element types
// are listed without comment): MaxPool 8 adds the Indices output (and storage_order), 10
// dilations and ceil_mode; AveragePool 19 adds dilations (refused unless 1: kiln's avg_pool2d
// has none); BatchNormalization 7's `spatial` must be 1; Softmax before 13 normalizes over
// the input flattened at `axis`; the Reduce ops take their axes as an input from 13 (ReduceSum)
// or 18 (the others).
std::vector<MapperEntry> nnMappers() {
  return {
      {"MatMul", {1, 9, 13}, mapMatMul},
      {"Det", {11, 22}, mapDet},
      {"Gemm", {7, 9, 11, 13}, mapGemm},
      {"Conv", {1, 11, 22}, mapConv},
      {"ConvTranspose", {1, 11, 22}, mapConvTranspose},
      {"CausalConvWithState", {27}, mapCausalConvWithState},
      {"MatMulInteger", {10}, mapMatMulInteger},
      {"QLinearMatMul", {10, 21}, mapQLinearMatMul},
      {"ConvInteger", {10}, mapConvInteger},
      {"QLinearConv", {10}, mapQLinearConv},
      {"DynamicQuantizeLinear", {11}, mapDynamicQuantizeLinear},
      {"MaxPool", {1, 8, 10, 11, 12, 22}, mapPool<OpKind::kMaxPool2d>},
      {"AveragePool", {7, 10, 11, 19, 22}, mapPool<OpKind::kAvgPool2d>},
      {"GlobalAveragePool",
       {1, 22},
       [](NodeContext& c) { return mapGlobalPool(c, OpKind::kReduceMean); }},
      {"GlobalMaxPool",
       {1, 22},
       [](NodeContext& c) { return mapGlobalPool(c, OpKind::kReduceMax); }},
      // LpPool and GlobalLpPool 2 made p an int; LpPool 18 adds ceil_mode and dilations.
      {"LpPool", {2, 11, 18, 22}, mapLpPool},
      {"GlobalLpPool", {2, 22}, mapGlobalLpPool},
      {"BatchNormalization", {7, 9, 14, 15}, mapBatchNorm},
      {"LayerNormalization", {17}, mapLayerNorm},
      {"Softmax", {1, 11, 13}, mapSoftmax<OpKind::kSoftmax>},
      {"LogSoftmax", {1, 11, 13}, mapSoftmax<OpKind::kLogSoftmax>},
      {"ReduceSum", {1, 11, 13}, mapReduce<OpKind::kReduceSum>},
      {"ReduceMean", {1, 11, 13, 18}, mapReduce<OpKind::kReduceMean>},
      {"ReduceProd", {1, 11, 13, 18}, mapReduce<OpKind::kReduceProd>},
      {"ReduceMax", {1, 11, 12, 13, 18, 20}, mapReduce<OpKind::kReduceMax>},
      {"ReduceMin", {1, 11, 12, 13, 18, 20}, mapReduce<OpKind::kReduceMax, true>},
      // ArgMax/ArgMin 12 add select_last_index; 11 negative axes; 13 bfloat16.
      {"ArgMax", {1, 11, 12, 13}, mapArgReduce<OpKind::kArgMax>},
      {"ArgMin", {1, 11, 12, 13}, mapArgReduce<OpKind::kArgMin>},
  };
}

}  // namespace kiln::frontends::onnx_import
