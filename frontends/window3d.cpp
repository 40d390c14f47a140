#include "frontends/window3d.h"

#include <string>

#include "ir/infer.h"

namespace kiln::frontends {

namespace {

using ir::OpKind;
using ir::Value;

std::string list(const auto& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

std::string describe(const Window3d& w) {
  return "kernel " + list(w.kernel) + ", strides " + list(w.strides) + ", pads " + list(w.pads) +
         ", dilations " + list(w.dilations);
}

Expected<Value*> reshape(const Emitter& e, Value* v, std::vector<int64_t> shape) {
  return e.node(OpKind::kReshape, {v}, {{"shape", std::move(shape)}});
}

Expected<Value*> transpose(const Emitter& e, Value* v, std::vector<int64_t> perm) {
  return e.node(OpKind::kTranspose, {v}, {{"perm", std::move(perm)}});
}

// The 2-D window attributes of dims (a, b) of `w` (0 = D, 1 = H, 2 = W); a dim -1 is a window
// of 1 there.
ir::AttrMap window2d(const Window3d& w, int a, int b, bool dilations) {
  auto pick = [](const auto& v, int d, int64_t none) { return d < 0 ? none : v[d]; };
  ir::AttrMap m;
  m["kernel"] = std::vector<int64_t>{pick(w.kernel, a, 1), pick(w.kernel, b, 1)};
  m["strides"] = std::vector<int64_t>{pick(w.strides, a, 1), pick(w.strides, b, 1)};
  m["pads"] = std::vector<int64_t>{a < 0 ? 0 : w.pads[a], b < 0 ? 0 : w.pads[b],
                                   a < 0 ? 0 : w.pads[a + 3], b < 0 ? 0 : w.pads[b + 3]};
  if (dilations)
    m["dilations"] = std::vector<int64_t>{pick(w.dilations, a, 1), pick(w.dilations, b, 1)};
  return m;
}

// Each window attribute >= 1 (pads >= 0), and the output sizes of the window (ceil mode for
// pools) over the input's D, H and W.
Expected<std::array<int64_t, 3>> outputSizes(const ir::Shape& x, const Window3d& w, bool ceil,
                                             const std::string& what) {
  static const char* names[] = {"depth", "height", "width"};
  std::array<int64_t, 3> out{};
  for (int d = 0; d < 3; ++d) {
    Expected<int64_t> o = ir::windowOutputSize(x[d + 2], w.kernel[d], w.strides[d], w.pads[d],
                                               w.pads[d + 3], w.dilations[d], ceil, names[d]);
    if (!o) return invalidArgument(what + ": " + o.status().message());
    out[d] = *o;
  }
  return out;
}

// A 3-D convolution's shapes, checked: the window (its kernel w's), the output sizes.
struct Conv3d {
  Window3d win;
  std::array<int64_t, 3> out{};
  int64_t c = 0, m = 0, kd = 1, depth = 0, h = 0, w = 0;
  // Depth kernel 1, stride 1, no depth padding: the stacking is a transposition.
  bool plain() const {
    return kd == 1 && win.strides[0] == 1 && win.pads[0] == 0 && win.pads[3] == 0;
  }
  // A 1x1 window over (H, W), stride 1, no padding there (a temporal convolution, as R(2+1)D's
  // (3,1,1)): the 3-D convolution is the 2-D one over (D, H*W) with the kernel [kd, 1], on the
  // input's own bytes. No stacking, no transposition.
  bool depthOnly() const {
    return win.kernel[1] == 1 && win.kernel[2] == 1 && win.strides[1] == 1 && win.strides[2] == 1 &&
           win.pads[1] == 0 && win.pads[2] == 0 && win.pads[4] == 0 && win.pads[5] == 0;
  }
};

Expected<Conv3d> conv3dShapes(const ir::TensorType& xt, const ir::TensorType& wt,
                              const Window3d& window, int64_t group) {
  const std::string what = "conv3d of " + xt.toString() + " and " + wt.toString();
  if (xt.rank() != 5 || wt.rank() != 5)
    return invalidArgument(what + ": the input must be [N,C,D,H,W] and the weight [M,C/group," +
                           "kd,kh,kw]");
  Conv3d s;
  s.c = xt.shape[1];
  s.m = wt.shape[0];
  if (group < 1 || s.c % group != 0 || s.m % group != 0 || wt.shape[1] * group != s.c)
    return invalidArgument(
        what + ": with group " + std::to_string(group) + " the weight must be [" +
        "M,C/group,kd,kh,kw] for C = " + std::to_string(s.c) + " (C and M divisible by group)");
  s.win = window;
  for (int d = 0; d < 3; ++d) s.win.kernel[d] = wt.shape[static_cast<size_t>(d) + 2];
  KILN_ASSIGN_OR_RETURN(s.out, outputSizes(xt.shape, s.win, false, what));
  s.kd = s.win.kernel[0];
  // The stacking's index constant holds D' x kd entries (padding from a file is unbounded).
  if (s.out[0] > (int64_t{1} << 24) / s.kd)
    return invalidArgument(what + ": " + std::to_string(s.out[0]) + " output depths of " +
                           std::to_string(s.kd) + " taps each are too many to stack (at most " +
                           "2^24 taps)");
  s.depth = xt.shape[2];
  s.h = xt.shape[3];
  s.w = xt.shape[4];
  return s;
}

// The depth each (output depth, tap) reads, [D', kd] (0 where it lies in the padding), and
// whether it does, [1,1,D',kd,1,1]; `padded` when some tap does not.
struct DepthTaps {
  ir::TensorData index, inside;
  bool padded = false;
};

// Row r, tap k reads (or, transposed, writes) depth r*stride - pad + k*dilation of `limit`.
DepthTaps depthTaps(int64_t rows, int64_t kd, int64_t stride, int64_t pad, int64_t dilation,
                    int64_t limit) {
  DepthTaps t{ir::TensorData(ir::DType::kI64, {rows, kd}),
              ir::TensorData(ir::DType::kBool, {1, 1, rows, kd, 1, 1})};
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < kd; ++k) {
      const int64_t at = r * stride - pad + k * dilation;
      const bool in = at >= 0 && at < limit;
      t.index.as<int64_t>()[r * kd + k] = in ? at : 0;
      t.inside.as<bool>()[r * kd + k] = in;
      t.padded |= !in;
    }
  return t;
}

DepthTaps depthTaps(const Conv3d& s) {
  return depthTaps(s.out[0], s.kd, s.win.strides[0], s.win.pads[0], s.win.dilations[0], s.depth);
}

// v [N,C,D',kd,H,W] with the taps in the padding zeroed.
Expected<Value*> maskPadding(const Emitter& e, Value* v, DepthTaps& taps) {
  if (!taps.padded) return v;
  KILN_ASSIGN_OR_RETURN(Value * mask, e.constant(taps.inside));
  KILN_ASSIGN_OR_RETURN(Value * zero, e.constant(ir::TensorData(v->type().dtype, {})));
  return e.node(OpKind::kWhere, {mask, v, zero}, {});
}

// x [N,C,D,H,W] as the conv2d's input: its depth taps stacked into the channels,
// [N*D', C*kd, H, W]; or, depthOnly, [N, C, D, H*W].
Expected<Value*> stackDepthTaps(const Emitter& e, Value* x, const Conv3d& s) {
  if (s.depthOnly()) return reshape(e, x, {0, s.c, s.depth, s.h * s.w});
  if (s.plain()) {
    KILN_ASSIGN_OR_RETURN(Value * t, transpose(e, x, {0, 2, 1, 3, 4}));
    return reshape(e, t, {-1, s.c, s.h, s.w});
  }
  DepthTaps taps = depthTaps(s);
  KILN_ASSIGN_OR_RETURN(Value * index, e.constant(taps.index));
  KILN_ASSIGN_OR_RETURN(Value * g, e.node(OpKind::kGather, {x, index}, {{"axis", int64_t{2}}}));
  KILN_ASSIGN_OR_RETURN(g, maskPadding(e, g, taps));
  KILN_ASSIGN_OR_RETURN(Value * t, transpose(e, g, {0, 2, 1, 3, 4, 5}));
  return reshape(e, t, {-1, s.c * s.kd, s.h, s.w});
}

// The gradient of stackDepthTaps: d stacked [N*D', C*kd, H, W] -> d x [N,C,D,H,W].
Expected<Value*> unstackDepthTaps(const Emitter& e, Value* grad, Value* x, const Conv3d& s) {
  if (s.depthOnly()) return reshape(e, grad, {0, s.c, s.depth, s.h, s.w});
  if (s.plain()) {
    KILN_ASSIGN_OR_RETURN(Value * r, reshape(e, grad, {-1, s.depth, s.c, s.h, s.w}));
    return transpose(e, r, {0, 2, 1, 3, 4});
  }
  DepthTaps taps = depthTaps(s);
  KILN_ASSIGN_OR_RETURN(Value * r, reshape(e, grad, {-1, s.out[0], s.c, s.kd, s.h, s.w}));
  KILN_ASSIGN_OR_RETURN(Value * t, transpose(e, r, {0, 2, 1, 3, 4, 5}));
  KILN_ASSIGN_OR_RETURN(t, maskPadding(e, t, taps));
  KILN_ASSIGN_OR_RETURN(Value * index, e.constant(taps.index));
  return e.node(OpKind::kGatherBackward, {t, index, x}, {{"axis", int64_t{2}}});
}

// The conv2d's attributes (H and W of the window; depthOnly, D and none) and its filter
// [M, C/g*kd, kh, kw] (depthOnly, [M, C/g, kd, 1]).
ir::AttrMap conv2dAttrs(const Conv3d& s, int64_t group) {
  ir::AttrMap attrs = s.depthOnly() ? window2d(s.win, 0, -1, true) : window2d(s.win, 1, 2, true);
  attrs.erase("kernel");
  attrs["group"] = group;
  return attrs;
}

Expected<Value*> filter2d(const Emitter& e, Value* w, const Conv3d& s) {
  if (s.depthOnly()) return reshape(e, w, {s.m, w->type().shape[1], s.kd, 1});
  return reshape(e, w, {s.m, w->type().shape[1] * s.kd, s.win.kernel[1], s.win.kernel[2]});
}

// The conv2d's output [N*D', M, H', W'] (depthOnly, [N, M, D', H*W]) as the 3-D convolution's
// [N,M,D',H',W'].
Expected<Value*> outputOf2d(const Emitter& e, Value* y, const Conv3d& s) {
  if (s.depthOnly()) return reshape(e, y, {0, s.m, s.out[0], s.out[1], s.out[2]});
  KILN_ASSIGN_OR_RETURN(y, reshape(e, y, {-1, s.out[0], s.m, s.out[1], s.out[2]}));
  return transpose(e, y, {0, 2, 1, 3, 4});
}

// The other way: the 3-D output's gradient as the conv2d's output's.
Expected<Value*> outputAs2d(const Emitter& e, Value* grad, const Conv3d& s) {
  if (s.depthOnly()) return reshape(e, grad, {0, s.m, s.out[0], s.out[1] * s.out[2]});
  KILN_ASSIGN_OR_RETURN(Value * t, transpose(e, grad, {0, 2, 1, 3, 4}));
  return reshape(e, t, {-1, s.m, s.out[1], s.out[2]});
}

// A 3-D pooling's two steps: the pools over (H, W) and over D, each skipped where its window
// is one element.
struct Pool3d {
  Window3d win;
  bool isMax;
  ir::AttrMap extra;
  std::array<int64_t, 3> out{};
  int64_t c = 0, depth = 0, h = 0, w = 0;

  bool trivial(int d) const {
    return win.kernel[d] == 1 && win.strides[d] == 1 && win.pads[d] == 0 && win.pads[d + 3] == 0;
  }
  bool planeStep() const { return !trivial(1) || !trivial(2); }
  bool depthStep() const { return !trivial(0); }
  // The attributes of the (H, W) step (plane) or the D step, for op (the pool or its gradient).
  ir::AttrMap attrs(bool plane) const {
    ir::AttrMap a = plane ? window2d(win, 1, 2, isMax) : window2d(win, 0, -1, isMax);
    for (const auto& [k, v] : extra) a[k] = v;
    return a;
  }
  // x as the (H, W) step's input [N, C*D, H, W], and the D step's [N, C, D, H'*W'].
  std::vector<int64_t> planeShape() const { return {0, c * depth, h, w}; }
  std::vector<int64_t> depthShape() const { return {0, c, depth, out[1] * out[2]}; }
};

Expected<Pool3d> pool3dShapes(const ir::TensorType& xt, OpKind pool2d, const Window3d& window,
                              const ir::AttrMap& extra) {
  const bool isMax = pool2d == OpKind::kMaxPool2d;
  const std::string what =
      std::string(isMax ? "max" : "average") + " pooling over D, H and W of " + xt.toString();
  if (xt.rank() != 5) return invalidArgument(what + ": the input must be [N,C,D,H,W]");
  if (!isMax && window.dilations != std::array<int64_t, 3>{1, 1, 1})
    return invalidArgument(what + ": average pooling has no dilations, got " +
                           list(window.dilations));
  auto ceil = extra.find("ceil_mode");
  const int64_t* ceilValue = ceil == extra.end() ? nullptr : std::get_if<int64_t>(&ceil->second);
  Pool3d p{window, isMax, extra};
  KILN_ASSIGN_OR_RETURN(p.out, outputSizes(xt.shape, window, ceilValue && *ceilValue != 0, what));
  // As the 2-D pools (and PyTorch): no window may lie wholly in the padding.
  for (int d = 0; d < 3; ++d) {
    const int64_t maxPad = ir::maxPoolPad(window.kernel[d], window.dilations[d]);
    if (window.pads[d] > maxPad || window.pads[d + 3] > maxPad)
      return invalidArgument(what + ": pads must be at most half the window, got " +
                             describe(window));
  }
  p.c = xt.shape[1];
  p.depth = xt.shape[2];
  p.h = xt.shape[3];
  p.w = xt.shape[4];
  return p;
}

}  // namespace

Expected<Value*> emitConv3d(const Emitter& e, Value* x, Value* w, Value* bias,
                            const Window3d& window, int64_t group) {
  KILN_ASSIGN_OR_RETURN(Conv3d s, conv3dShapes(x->type(), w->type(), window, group));
  KILN_ASSIGN_OR_RETURN(Value * stacked, stackDepthTaps(e, x, s));
  KILN_ASSIGN_OR_RETURN(Value * filter, filter2d(e, w, s));
  std::vector<Value*> ins{stacked, filter};
  if (bias) ins.push_back(bias);
  KILN_ASSIGN_OR_RETURN(Value * y, e.node(OpKind::kConv2d, std::move(ins), conv2dAttrs(s, group)));
  return outputOf2d(e, y, s);
}

Expected<Conv3dGradients> emitConv3dBackward(const Emitter& e, Value* grad, Value* x, Value* w,
                                             const Window3d& window, int64_t group,
                                             std::array<bool, 3> wanted) {
  KILN_ASSIGN_OR_RETURN(Conv3d s, conv3dShapes(x->type(), w->type(), window, group));
  const ir::Shape want{x->type().shape[0], s.m, s.out[0], s.out[1], s.out[2]};
  if (grad->type().shape != want || grad->type().dtype != x->type().dtype)
    return invalidArgument("conv3d's gradient must be " +
                           ir::TensorType{x->type().dtype, want, ir::Layout::kPlain}.toString() +
                           ", got " + grad->type().toString());
  Conv3dGradients out;
  if (wanted[0] || wanted[1]) {
    KILN_ASSIGN_OR_RETURN(Value * g2, outputAs2d(e, grad, s));
    KILN_ASSIGN_OR_RETURN(Value * stacked, stackDepthTaps(e, x, s));
    KILN_ASSIGN_OR_RETURN(Value * filter, filter2d(e, w, s));
    if (wanted[0]) {
      KILN_ASSIGN_OR_RETURN(Value * ds, e.node(OpKind::kConv2dBackwardData, {g2, filter, stacked},
                                               conv2dAttrs(s, group)));
      KILN_ASSIGN_OR_RETURN(out.input, unstackDepthTaps(e, ds, x, s));
    }
    if (wanted[1]) {
      KILN_ASSIGN_OR_RETURN(Value * dw, e.node(OpKind::kConv2dBackwardWeight, {g2, stacked, filter},
                                               conv2dAttrs(s, group)));
      const ir::Shape& ws = w->type().shape;
      KILN_ASSIGN_OR_RETURN(out.weight, reshape(e, dw, std::vector<int64_t>(ws.begin(), ws.end())));
    }
  }
  if (wanted[2]) {
    KILN_ASSIGN_OR_RETURN(
        out.bias, e.node(OpKind::kReduceSum, {grad},
                         {{"axes", std::vector<int64_t>{0, 2, 3, 4}}, {"keepdims", int64_t{0}}}));
  }
  return out;
}

Expected<Value*> emitConvTranspose3d(const Emitter& e, Value* x, Value* w, const Window3d& window,
                                     std::array<int64_t, 3> outputPadding, int64_t group) {
  const ir::TensorType& xt = x->type();
  const ir::TensorType& wt = w->type();
  const std::string what = "conv_transpose3d of " + xt.toString() + " and " + wt.toString();
  if (xt.rank() != 5 || wt.rank() != 5)
    return invalidArgument(what + ": the input must be [N,C,D,H,W] and the weight [C,M/group," +
                           "kd,kh,kw]");
  const int64_t c = xt.shape[1];
  if (group < 1 || c % group != 0 || wt.shape[0] != c)
    return invalidArgument(
        what + ": the weight must be [C,M/group,kd,kh,kw] for C = " + std::to_string(c) +
        ", with group " + std::to_string(group) + " dividing C");
  const int64_t m = wt.shape[1] * group, kd = wt.shape[2];
  const int64_t depth = xt.shape[2], sd = window.strides[0], pd = window.pads[0];
  const int64_t dd = window.dilations[0], opd = outputPadding[0];
  if (sd < 1 || dd < 1 || pd < 0 || window.pads[3] < 0 || opd < 0 || opd >= sd)
    return invalidArgument(what + ": the depth's stride and dilation must be >= 1, its pads >= 0 " +
                           "and its output_padding below the stride, got " + describe(window) +
                           ", output_padding " + list(outputPadding));
  // (D - 1) sd - pads + dd (kd - 1) + opd + 1 (the sizes are a model's: bounded first).
  if (depth > (int64_t{1} << 24) / kd || sd > (int64_t{1} << 24) || dd > (int64_t{1} << 24) ||
      pd > (int64_t{1} << 40) || window.pads[3] > (int64_t{1} << 40))
    return invalidArgument(what + ": the depth's sizes are too large (" + describe(window) + ")");
  const int64_t outDepth = (depth - 1) * sd - pd - window.pads[3] + dd * (kd - 1) + opd + 1;
  if (outDepth < 1)
    return invalidArgument(what + ": the pads leave no output depth (" + describe(window) + ")");
  // Each input depth as a 2-D image: [N*D, C, H, W] through conv_transpose2d with the depth taps
  // as output channels, [C, M/g*kd, kh, kw] -> [N*D, M*kd, H', W'] (channel m*kd + k).
  KILN_ASSIGN_OR_RETURN(Value * t, transpose(e, x, {0, 2, 1, 3, 4}));
  KILN_ASSIGN_OR_RETURN(t, reshape(e, t, {-1, c, xt.shape[3], xt.shape[4]}));
  KILN_ASSIGN_OR_RETURN(Value * filter,
                        reshape(e, w, {c, wt.shape[1] * kd, wt.shape[3], wt.shape[4]}));
  ir::AttrMap attrs = window2d(window, 1, 2, true);
  attrs.erase("kernel");
  attrs["group"] = group;
  attrs["output_padding"] = std::vector<int64_t>{outputPadding[1], outputPadding[2]};
  KILN_ASSIGN_OR_RETURN(Value * y, e.node(OpKind::kConvTranspose2d, {t, filter}, attrs));
  const int64_t h = y->type().shape[2], wd = y->type().shape[3];
  // Input depth i's tap k lands on output depth i*sd - pd + k*dd: added there (gather_backward
  // of the gather a 3-D convolution reads its taps with), those in the cropped padding dropped.
  KILN_ASSIGN_OR_RETURN(y, reshape(e, y, {-1, depth, m, kd, h, wd}));
  KILN_ASSIGN_OR_RETURN(y, transpose(e, y, {0, 2, 1, 3, 4, 5}));
  DepthTaps taps = depthTaps(depth, kd, sd, pd, dd, outDepth);
  KILN_ASSIGN_OR_RETURN(y, maskPadding(e, y, taps));
  KILN_ASSIGN_OR_RETURN(Value * index, e.constant(taps.index));
  KILN_ASSIGN_OR_RETURN(Value * zero, e.constant(ir::TensorData(xt.dtype, {})));
  KILN_ASSIGN_OR_RETURN(Value * shape,
                        e.node(OpKind::kExpand, {zero},
                               {{"shape", std::vector<int64_t>{xt.shape[0], m, outDepth, h, wd}}}));
  return e.node(OpKind::kGatherBackward, {y, index, shape}, {{"axis", int64_t{2}}});
}

Expected<Value*> emitPool3d(const Emitter& e, OpKind pool2d, Value* x, const Window3d& window,
                            const ir::AttrMap& extra) {
  KILN_ASSIGN_OR_RETURN(Pool3d p, pool3dShapes(x->type(), pool2d, window, extra));
  Value* v = x;
  if (p.planeStep()) {
    KILN_ASSIGN_OR_RETURN(v, reshape(e, v, p.planeShape()));
    KILN_ASSIGN_OR_RETURN(v, e.node(pool2d, {v}, p.attrs(true)));
  }
  if (p.depthStep()) {
    KILN_ASSIGN_OR_RETURN(v, reshape(e, v, p.depthShape()));
    KILN_ASSIGN_OR_RETURN(v, e.node(pool2d, {v}, p.attrs(false)));
  }
  if (v == x) return x;
  return reshape(e, v, {0, p.c, p.out[0], p.out[1], p.out[2]});
}

Expected<Value*> emitPool3dBackward(const Emitter& e, OpKind pool2d, Value* grad, Value* x,
                                    const Window3d& window, const ir::AttrMap& extra) {
  KILN_ASSIGN_OR_RETURN(Pool3d p, pool3dShapes(x->type(), pool2d, window, extra));
  const ir::Shape want{x->type().shape[0], p.c, p.out[0], p.out[1], p.out[2]};
  if (grad->type().shape != want || grad->type().dtype != x->type().dtype)
    return invalidArgument("the 3-D pooling's gradient must be " +
                           ir::TensorType{x->type().dtype, want, ir::Layout::kPlain}.toString() +
                           ", got " + grad->type().toString());
  const OpKind backward = p.isMax ? OpKind::kMaxPool2dBackward : OpKind::kAvgPool2dBackward;
  Value* g = grad;
  Value* plane = nullptr;  // x as the (H, W) step's input.
  if (p.planeStep()) {
    KILN_ASSIGN_OR_RETURN(plane, reshape(e, x, p.planeShape()));
  }
  if (p.depthStep()) {
    Value* mid = x;  // The D step's input: the (H, W) step's output, recomputed.
    if (plane) {
      KILN_ASSIGN_OR_RETURN(mid, e.node(pool2d, {plane}, p.attrs(true)));
    }
    KILN_ASSIGN_OR_RETURN(mid, reshape(e, mid, p.depthShape()));
    KILN_ASSIGN_OR_RETURN(g, reshape(e, g, {0, p.c, p.out[0], p.out[1] * p.out[2]}));
    KILN_ASSIGN_OR_RETURN(g, e.node(backward, {g, mid}, p.attrs(false)));
  }
  if (plane) {
    KILN_ASSIGN_OR_RETURN(g, reshape(e, g, {0, p.c * p.depth, p.out[1], p.out[2]}));
    KILN_ASSIGN_OR_RETURN(g, e.node(backward, {g, plane}, p.attrs(true)));
  }
  if (g == grad) return grad;
  return reshape(e, g, {0, p.c, p.depth, p.h, p.w});
}

Expected<Value*> emitMaxPool3dIndices(const Emitter& e, Value* x, const Window3d& window,
                                      const ir::AttrMap& extra) {
  KILN_ASSIGN_OR_RETURN(Pool3d p, pool3dShapes(x->type(), OpKind::kMaxPool2d, window, extra));
  auto scalar = [&](int64_t v) { return e.constant(ir::TensorData::scalar(ir::DType::kI64, v)); };
  // The (H, W) step's maxima and their offsets h*W + w in each plane (a window of one element
  // is its own position).
  KILN_ASSIGN_OR_RETURN(Value * plane, reshape(e, x, p.planeShape()));
  KILN_ASSIGN_OR_RETURN(Value * planeIndex,
                        e.node(OpKind::kMaxPool2dIndices, {plane}, p.attrs(true)));
  const int64_t outPlane = p.out[1] * p.out[2];
  Value* index = nullptr;  // d*H*W + h*W + w, [N, C, D'*H'*W'].
  if (p.depthStep()) {
    Value* mid = x;
    if (p.planeStep()) {
      KILN_ASSIGN_OR_RETURN(mid, e.node(OpKind::kMaxPool2d, {plane}, p.attrs(true)));
    }
    KILN_ASSIGN_OR_RETURN(mid, reshape(e, mid, p.depthShape()));
    // The D step's choice in each [D, H'*W'] plane: d*H'*W' + j, the flat position of the
    // (H, W) step's output whose offset it takes.
    KILN_ASSIGN_OR_RETURN(Value * pick, e.node(OpKind::kMaxPool2dIndices, {mid}, p.attrs(false)));
    KILN_ASSIGN_OR_RETURN(pick, reshape(e, pick, {0, p.c, p.out[0] * outPlane}));
    KILN_ASSIGN_OR_RETURN(Value * offsets, reshape(e, planeIndex, {0, p.c, p.depth * outPlane}));
    KILN_ASSIGN_OR_RETURN(Value * offset,
                          e.node(OpKind::kGatherElements, {offsets, pick}, {{"axis", int64_t{2}}}));
    KILN_ASSIGN_OR_RETURN(Value * op, scalar(outPlane));
    KILN_ASSIGN_OR_RETURN(Value * hw, scalar(p.h * p.w));
    KILN_ASSIGN_OR_RETURN(Value * d, e.node(OpKind::kDiv, {pick, op}, {}));
    KILN_ASSIGN_OR_RETURN(d, e.node(OpKind::kMul, {d, hw}, {}));
    KILN_ASSIGN_OR_RETURN(index, e.node(OpKind::kAdd, {d, offset}, {}));
  } else {
    // Output depth d is input depth d.
    ir::TensorData depths(ir::DType::kI64, {p.depth, 1});
    for (int64_t d = 0; d < p.depth; ++d) depths.as<int64_t>()[d] = d * p.h * p.w;
    KILN_ASSIGN_OR_RETURN(Value * dv, e.constant(std::move(depths)));
    KILN_ASSIGN_OR_RETURN(Value * r, reshape(e, planeIndex, {0, p.c, p.depth, outPlane}));
    KILN_ASSIGN_OR_RETURN(index, e.node(OpKind::kAdd, {r, dv}, {}));
  }
  return reshape(e, index, {0, p.c, p.out[0], p.out[1], p.out[2]});
}

}  // namespace kiln::frontends
