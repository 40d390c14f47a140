// More ONNX ops that kiln composes exactly from its own ops at import, each from the
// definition in the ONNX specification: Hardmax and OneHot (compare with an index table),
// LpNormalization, CumSum (a product with a triangular 0/1 matrix, so each output is the same
// sum of the same terms), SpaceToDepth and DepthToSpace (reshape, transpose, reshape), IsNaN,
// IsInf, EyeLike (a constant), Tile (expand between reshapes), Shrink, and the normalizations
// InstanceNormalization, GroupNormalization and MeanVarianceNormalization (on layer_norm and
// reductions) and LRN (shifted slices of the squares).
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_map_util.h"
#include "frontends/onnx/onnx_tensor.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::DType;
using ir::OpKind;
using ir::Shape;
using ir::Value;

Expected<Value*> scalarOf(NodeContext& ctx, DType dtype, double v) {
  return ctx.constantValue(filledTensor(dtype, {}, v));
}

// An int64 tensor of `rank` dims, all 1 but dim `axis` (n): 0, 1, ..., n-1 along it.
Expected<Value*> iotaAlong(NodeContext& ctx, int rank, int axis, int64_t n) {
  Shape s(static_cast<size_t>(rank), 1);
  s[static_cast<size_t>(axis)] = n;
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return ctx.constantValue(intTensor(v, s));
}

// Input 0's type; f32 or f64 where the composition needs float constants.
Expected<ir::TensorType> floatOnly(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  if (t.dtype != DType::kF32 && t.dtype != DType::kF64)
    return ctx.unsupported(ctx.opType() + " of " + t.toString() +
                           " (kiln composes it for f32 and f64)");
  return t;
}

Status mapHardmax(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  if (!ir::isFloat(t.dtype))
    return ctx.invalid("input must be a float tensor, got " + t.toString());
  KILN_ASSIGN_OR_RETURN(int64_t axisAttr, ctx.attrInt("axis", ctx.version() >= 13 ? -1 : 1));
  KILN_ASSIGN_OR_RETURN(int axis, ir::normalizeAxis(axisAttr, t.shape.size(), "axis"));
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  Value* in = x;
  if (ctx.version() < 13) {
    // Versions 1 and 11 coerce the input to 2-D at `axis` and take the hardmax of each row.
    int64_t rows = 1, cols = 1;
    for (int d = 0; d < t.rank(); ++d) (d < axis ? rows : cols) *= t.shape[d];
    KILN_ASSIGN_OR_RETURN(in, ctx.emit(OpKind::kReshape, {x}, {{"shape", Shape{rows, cols}}}));
    axis = 1;
  }
  const Shape s = in->type().shape;
  // The first maximum of each row, as argmax picks it, against an index table.
  KILN_ASSIGN_OR_RETURN(Value * am, ctx.emit(OpKind::kArgMax, {in},
                                             {{"axis", int64_t{axis}}, {"keepdims", int64_t{1}}}));
  KILN_ASSIGN_OR_RETURN(
      Value * iota, iotaAlong(ctx, static_cast<int>(s.size()), axis, s[static_cast<size_t>(axis)]));
  KILN_ASSIGN_OR_RETURN(Value * hit, ctx.emit(OpKind::kEqual, {iota, am}));
  const ir::AttrMap to{{"to", std::string(ir::dtypeName(t.dtype))}};
  if (ctx.version() >= 13) return ctx.emit(OpKind::kCast, {hit}, to, 0).status();
  KILN_ASSIGN_OR_RETURN(Value * y, ctx.emit(OpKind::kCast, {hit}, to));
  return ctx.emit(OpKind::kReshape, {y}, {{"shape", t.shape}}, 0).status();
}

Status mapOneHot(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType it, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(double depthValue, ctx.constScalar(1, "depth"));
  if (!(depthValue >= 1) || depthValue > double(int64_t{1} << 30))
    return ctx.invalid("depth must be at least 1, got " + std::to_string(depthValue));
  const auto depth = static_cast<int64_t>(depthValue);
  KILN_ASSIGN_OR_RETURN(ir::TensorType vt, ctx.inputType(2));
  if (vt.numElements() != 2) return ctx.invalid("values must hold [off, on], got " + vt.toString());
  KILN_ASSIGN_OR_RETURN(int64_t axisAttr, ctx.attrInt("axis", -1));
  KILN_ASSIGN_OR_RETURN(int axis, ir::normalizeAxis(axisAttr, it.shape.size() + 1, "axis"));
  KILN_ASSIGN_OR_RETURN(Value * idx, ctx.value(0));
  if (idx->type().dtype != DType::kI64) {
    KILN_ASSIGN_OR_RETURN(idx, ctx.emit(OpKind::kCast, {idx}, {{"to", std::string("i64")}}));
  }
  // Negative indices count from the end; any other index out of range selects no position.
  KILN_ASSIGN_OR_RETURN(Value * zero, scalarOf(ctx, DType::kI64, 0));
  KILN_ASSIGN_OR_RETURN(Value * d, scalarOf(ctx, DType::kI64, static_cast<double>(depth)));
  KILN_ASSIGN_OR_RETURN(Value * neg, ctx.emit(OpKind::kLess, {idx, zero}));
  KILN_ASSIGN_OR_RETURN(Value * wrapped, ctx.emit(OpKind::kAdd, {idx, d}));
  KILN_ASSIGN_OR_RETURN(idx, ctx.emit(OpKind::kWhere, {neg, wrapped, idx}));
  KILN_ASSIGN_OR_RETURN(
      idx, ctx.emit(OpKind::kUnsqueeze, {idx}, {{"axes", std::vector<int64_t>{axis}}}));
  KILN_ASSIGN_OR_RETURN(Value * iota, iotaAlong(ctx, it.rank() + 1, axis, depth));
  KILN_ASSIGN_OR_RETURN(Value * hit, ctx.emit(OpKind::kEqual, {idx, iota}));
  KILN_ASSIGN_OR_RETURN(Value * values, ctx.value(2));
  KILN_ASSIGN_OR_RETURN(values, ctx.emit(OpKind::kReshape, {values}, {{"shape", Shape{2}}}));
  KILN_ASSIGN_OR_RETURN(Value * offIndex, ctx.constantValue(intTensor({0}, {})));
  KILN_ASSIGN_OR_RETURN(Value * onIndex, ctx.constantValue(intTensor({1}, {})));
  KILN_ASSIGN_OR_RETURN(Value * off, ctx.emit(OpKind::kGather, {values, offIndex}));
  KILN_ASSIGN_OR_RETURN(Value * on, ctx.emit(OpKind::kGather, {values, onIndex}));
  return ctx.emit(OpKind::kWhere, {hit, on, off}, {}, 0).status();
}

Status mapLpNormalization(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatOnly(ctx));
  KILN_ASSIGN_OR_RETURN(int64_t axisAttr, ctx.attrInt("axis", -1));
  KILN_ASSIGN_OR_RETURN(int axis, ir::normalizeAxis(axisAttr, t.shape.size(), "axis"));
  KILN_ASSIGN_OR_RETURN(int64_t p, ctx.attrInt("p", 2));
  if (p != 1 && p != 2) return ctx.invalid("p must be 1 or 2, got " + std::to_string(p));
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  const ir::AttrMap reduce{{"axes", std::vector<int64_t>{axis}}, {"keepdims", int64_t{1}}};
  Value* norm = nullptr;
  if (p == 1) {
    KILN_ASSIGN_OR_RETURN(Value * a, ctx.emit(OpKind::kAbs, {x}));
    KILN_ASSIGN_OR_RETURN(norm, ctx.emit(OpKind::kReduceSum, {a}, reduce));
  } else {
    KILN_ASSIGN_OR_RETURN(Value * sq, ctx.emit(OpKind::kMul, {x, x}));
    KILN_ASSIGN_OR_RETURN(Value * s, ctx.emit(OpKind::kReduceSum, {sq}, reduce));
    KILN_ASSIGN_OR_RETURN(norm, ctx.emit(OpKind::kSqrt, {s}));
  }
  // A zero norm gives 0, not 0/0 (ONNX's reference).
  KILN_ASSIGN_OR_RETURN(Value * zero, scalarOf(ctx, t.dtype, 0));
  KILN_ASSIGN_OR_RETURN(Value * isZero, ctx.emit(OpKind::kEqual, {norm, zero}));
  KILN_ASSIGN_OR_RETURN(Value * q, ctx.emit(OpKind::kDiv, {x, norm}));
  return ctx.emit(OpKind::kWhere, {isZero, zero, q}, {}, 0).status();
}

// CumSum: y[..., j, ...] = sum over k of x[..., k, ...] T[k, j] along `axis`, with T the 0/1
// triangle that selects k <= j (k < j exclusive; k >= j, k > j reversed).
Status mapCumSum(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  if (t.dtype != DType::kF32 && t.dtype != DType::kF64 && t.dtype != DType::kI64 &&
      t.dtype != DType::kI32)
    return ctx.unsupported("CumSum of " + t.toString() + " (kiln composes f32, f64, i32, i64)");
  if (t.rank() < 1) return ctx.invalid("input must have rank 1 or more");
  KILN_ASSIGN_OR_RETURN(double axisValue, ctx.constScalar(1, "axis"));
  KILN_ASSIGN_OR_RETURN(int axis,
                        ir::normalizeAxis(static_cast<int64_t>(axisValue), t.shape.size(), "axis"));
  KILN_ASSIGN_OR_RETURN(bool exclusive, ctx.attrBool("exclusive", false));
  KILN_ASSIGN_OR_RETURN(bool reverse, ctx.attrBool("reverse", false));
  const int64_t n = t.shape[static_cast<size_t>(axis)];
  if (n > 4096)
    return ctx.unsupported("CumSum along a dim of " + std::to_string(n) + " (at most 4096)");
  ir::TensorData tri = filledTensor(t.dtype, {n, n}, 0);
  ir::TensorData one = filledTensor(t.dtype, {}, 1);
  const size_t es = ir::dtypeSize(t.dtype);
  for (int64_t k = 0; k < n; ++k)
    for (int64_t j = 0; j < n; ++j) {
      const bool take = reverse ? (exclusive ? k > j : k >= j) : (exclusive ? k < j : k <= j);
      if (take) std::memcpy(tri.data() + static_cast<size_t>(k * n + j) * es, one.data(), es);
    }
  KILN_ASSIGN_OR_RETURN(Value * m, ctx.constantValue(std::move(tri)));
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  const int r = t.rank();
  if (axis == r - 1) return ctx.emit(OpKind::kMatMul, {x, m}, {}, 0).status();
  std::vector<int64_t> perm;
  for (int d = 0; d < r; ++d)
    if (d != axis) perm.push_back(d);
  perm.push_back(axis);
  std::vector<int64_t> back(static_cast<size_t>(r));
  for (int d = 0; d < r; ++d) back[static_cast<size_t>(perm[static_cast<size_t>(d)])] = d;
  KILN_ASSIGN_OR_RETURN(Value * xt, ctx.emit(OpKind::kTranspose, {x}, {{"perm", perm}}));
  KILN_ASSIGN_OR_RETURN(Value * y, ctx.emit(OpKind::kMatMul, {xt, m}));
  return ctx.emit(OpKind::kTranspose, {y}, {{"perm", back}}, 0).status();
}

Status mapSpaceToDepth(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(int64_t b, ctx.attrInt("blocksize"));
  KILN_ASSIGN_OR_RETURN(std::string mode, ctx.attrString("mode", "DCR"));  // Version 28.
  if (mode != "DCR" && mode != "CRD") return ctx.invalid("mode '" + mode + "'");
  if (t.rank() != 4) return ctx.invalid("input must be 4-D, got " + t.toString());
  const Shape& s = t.shape;
  if (b < 1 || s[2] % b || s[3] % b)
    return ctx.invalid("blocksize " + std::to_string(b) + " must divide the height and width of " +
                       t.toString());
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(
      Value * r,
      ctx.emit(OpKind::kReshape, {x}, {{"shape", Shape{s[0], s[1], s[2] / b, b, s[3] / b, b}}}));
  KILN_ASSIGN_OR_RETURN(
      Value * p, ctx.emit(OpKind::kTranspose, {r},
                          {{"perm", mode == "DCR" ? std::vector<int64_t>{0, 3, 5, 1, 2, 4}
                                                  : std::vector<int64_t>{0, 1, 3, 5, 2, 4}}}));
  return ctx
      .emit(OpKind::kReshape, {p}, {{"shape", Shape{s[0], s[1] * b * b, s[2] / b, s[3] / b}}}, 0)
      .status();
}

Status mapDepthToSpace(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(int64_t b, ctx.attrInt("blocksize"));
  KILN_ASSIGN_OR_RETURN(std::string mode, ctx.attrString("mode", "DCR"));
  if (t.rank() != 4) return ctx.invalid("input must be 4-D, got " + t.toString());
  const Shape& s = t.shape;
  if (b < 1 || s[1] % (b * b))
    return ctx.invalid("blocksize^2 = " + std::to_string(b * b) + " must divide the channels of " +
                       t.toString());
  if (mode != "DCR" && mode != "CRD") return ctx.invalid("mode '" + mode + "'");
  const int64_t c = s[1] / (b * b);
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  const bool dcr = mode == "DCR";
  KILN_ASSIGN_OR_RETURN(Value * r, ctx.emit(OpKind::kReshape, {x},
                                            {{"shape", dcr ? Shape{s[0], b, b, c, s[2], s[3]}
                                                           : Shape{s[0], c, b, b, s[2], s[3]}}}));
  KILN_ASSIGN_OR_RETURN(Value * p,
                        ctx.emit(OpKind::kTranspose, {r},
                                 {{"perm", dcr ? std::vector<int64_t>{0, 3, 4, 1, 5, 2}
                                               : std::vector<int64_t>{0, 1, 4, 2, 5, 3}}}));
  return ctx.emit(OpKind::kReshape, {p}, {{"shape", Shape{s[0], c, s[2] * b, s[3] * b}}}, 0)
      .status();
}

Status mapIsNaN(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  if (!ir::isFloat(t.dtype))
    return ctx.invalid("input must be a float tensor, got " + t.toString());
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * same, ctx.emit(OpKind::kEqual, {x, x}));  // False only for NaN.
  return ctx.emit(OpKind::kLogicalNot, {same}, {}, 0).status();
}

Status mapIsInf(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatOnly(ctx));
  KILN_ASSIGN_OR_RETURN(bool pos, ctx.attrBool("detect_positive", true));
  KILN_ASSIGN_OR_RETURN(bool neg, ctx.attrBool("detect_negative", true));
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  const double inf = std::numeric_limits<double>::infinity();
  if (!pos && !neg) {
    ir::TensorData none(DType::kBool, t.shape);
    if (none.byteSize()) std::memset(none.data(), 0, none.byteSize());
    KILN_ASSIGN_OR_RETURN(Value * c, ctx.constantValue(std::move(none)));
    ctx.setOutput(0, c);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(Value * pinf, scalarOf(ctx, t.dtype, inf));
  KILN_ASSIGN_OR_RETURN(Value * ninf, scalarOf(ctx, t.dtype, -inf));
  if (!neg) return ctx.emit(OpKind::kEqual, {x, pinf}, {}, 0).status();
  if (!pos) return ctx.emit(OpKind::kEqual, {x, ninf}, {}, 0).status();
  KILN_ASSIGN_OR_RETURN(Value * a, ctx.emit(OpKind::kEqual, {x, pinf}));
  KILN_ASSIGN_OR_RETURN(Value * b, ctx.emit(OpKind::kEqual, {x, ninf}));
  return ctx.emit(OpKind::kLogicalOr, {a, b}, {}, 0).status();
}

Status mapEyeLike(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  if (t.rank() != 2) return ctx.invalid("input must be 2-D, got " + t.toString());
  DType dtype = t.dtype;
  if (ctx.hasAttr("dtype")) {
    KILN_ASSIGN_OR_RETURN(int64_t code, ctx.attrInt("dtype"));
    auto d = dtypeFromOnnx(static_cast<int32_t>(code));
    if (!d) return ctx.unsupported("dtype " + onnxTypeName(static_cast<int32_t>(code)));
    dtype = *d;
  }
  if (!foldableDType(dtype))
    return ctx.unsupported("EyeLike of " + std::string(ir::dtypeName(dtype)));
  KILN_ASSIGN_OR_RETURN(int64_t k, ctx.attrInt("k", 0));
  const int64_t rows = t.shape[0], cols = t.shape[1];
  if (rows * cols > kMaxFoldElements)
    return ctx.unsupported("EyeLike of " + t.toString() + " (too large)");
  ir::TensorData eye = filledTensor(dtype, {rows, cols}, 0);
  const ir::TensorData one = filledTensor(dtype, {}, 1);
  const size_t es = ir::dtypeSize(dtype);
  for (int64_t i = 0; i < rows; ++i)
    if (const int64_t j = i + k; j >= 0 && j < cols)
      std::memcpy(eye.data() + static_cast<size_t>(i * cols + j) * es, one.data(), es);
  ctx.setConstantOutput(0, std::move(eye));
  return Status::ok();
}

// Tile: [d0, d1, ...] -> [1, d0, 1, d1, ...] -> expand to [r0, d0, r1, d1, ...] -> merge pairs.
Status mapTile(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(auto reps, ctx.constInts(1, "repeats"));
  if (reps.size() != t.shape.size())
    return ctx.invalid("repeats " + ir::shapeToString(reps) + " must have one value per dim of " +
                       t.toString());
  Shape pairs, expanded, out;
  for (size_t d = 0; d < reps.size(); ++d) {
    if (reps[d] < 0) return ctx.invalid("repeats must not be negative");
    pairs.insert(pairs.end(), {1, t.shape[d]});
    expanded.insert(expanded.end(), {reps[d], t.shape[d]});
    out.push_back(reps[d] * t.shape[d]);
  }
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * p, ctx.emit(OpKind::kReshape, {x}, {{"shape", pairs}}));
  KILN_ASSIGN_OR_RETURN(Value * e, ctx.emit(OpKind::kExpand, {p}, {{"shape", expanded}}));
  return ctx.emit(OpKind::kReshape, {e}, {{"shape", out}}, 0).status();
}

Status mapShrink(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatOnly(ctx));
  KILN_ASSIGN_OR_RETURN(double bias, ctx.attrFloat("bias", 0.0));
  KILN_ASSIGN_OR_RETURN(double lambd, ctx.attrFloat("lambd", 0.5));
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * lo, scalarOf(ctx, t.dtype, -lambd));
  KILN_ASSIGN_OR_RETURN(Value * hi, scalarOf(ctx, t.dtype, lambd));
  KILN_ASSIGN_OR_RETURN(Value * b, scalarOf(ctx, t.dtype, bias));
  KILN_ASSIGN_OR_RETURN(Value * zero, scalarOf(ctx, t.dtype, 0));
  KILN_ASSIGN_OR_RETURN(Value * below, ctx.emit(OpKind::kLess, {x, lo}));
  KILN_ASSIGN_OR_RETURN(Value * above, ctx.emit(OpKind::kGreater, {x, hi}));
  KILN_ASSIGN_OR_RETURN(Value * plus, ctx.emit(OpKind::kAdd, {x, b}));
  KILN_ASSIGN_OR_RETURN(Value * minus, ctx.emit(OpKind::kSub, {x, b}));
  KILN_ASSIGN_OR_RETURN(Value * inner, ctx.emit(OpKind::kWhere, {above, minus, zero}));
  return ctx.emit(OpKind::kWhere, {below, plus, inner}, {}, 0).status();
}

// y * scale + bias with scale and bias per channel (dim 1) of an N-D `y`.
Expected<Value*> channelAffine(NodeContext& ctx, Value* y, Value* scale, Value* bias) {
  const Shape& s = y->type().shape;
  Shape per(s.size() - 1, 1);
  per[0] = s[1];
  KILN_ASSIGN_OR_RETURN(Value * sc, ctx.emit(OpKind::kReshape, {scale}, {{"shape", per}}));
  KILN_ASSIGN_OR_RETURN(Value * bi, ctx.emit(OpKind::kReshape, {bias}, {{"shape", per}}));
  KILN_ASSIGN_OR_RETURN(Value * m, ctx.emit(OpKind::kMul, {y, sc}));
  return ctx.emit(OpKind::kAdd, {m, bi}, {}, 0);
}

// InstanceNormalization: each (n, c) plane normalized over its spatial dims, then per-channel
// scale and bias; GroupNormalization: each group of channels of each sample.
Status mapGroupedNorm(NodeContext& ctx, int64_t groups) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatOnly(ctx));
  if (t.rank() < 3) return ctx.invalid("input must have rank 3 or more, got " + t.toString());
  KILN_ASSIGN_OR_RETURN(double eps, ctx.attrFloat("epsilon", 1e-5));
  const Shape& s = t.shape;
  if (groups < 1 || s[1] % groups)
    return ctx.invalid(std::to_string(groups) + " groups do not divide " + std::to_string(s[1]) +
                       " channels");
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * g,
                        ctx.emit(OpKind::kReshape, {x}, {{"shape", Shape{s[0], groups, -1}}}));
  KILN_ASSIGN_OR_RETURN(
      Value * n, ctx.emit(OpKind::kLayerNorm, {g}, {{"axis", int64_t{-1}}, {"epsilon", eps}}));
  KILN_ASSIGN_OR_RETURN(Value * y, ctx.emit(OpKind::kReshape, {n}, {{"shape", s}}));
  KILN_ASSIGN_OR_RETURN(Value * scale, ctx.value(1));
  KILN_ASSIGN_OR_RETURN(Value * bias, ctx.value(2));
  if (scale->type().numElements() != s[1] || bias->type().numElements() != s[1])
    return ctx.invalid("scale and bias must have one value per channel (" + std::to_string(s[1]) +
                       "), got " + scale->type().toString() + " and " + bias->type().toString());
  return channelAffine(ctx, y, scale, bias).status();
}

Status mapInstanceNorm(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  return mapGroupedNorm(ctx, t.rank() >= 2 ? t.shape[1] : 1);
}

Status mapGroupNorm(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatOnly(ctx));
  KILN_TRY(requireStashType(ctx, t.dtype));
  KILN_ASSIGN_OR_RETURN(int64_t groups, ctx.attrInt("num_groups"));
  return mapGroupedNorm(ctx, groups);
}

Status mapMeanVarianceNorm(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatOnly(ctx));
  KILN_ASSIGN_OR_RETURN(auto axes, ctx.attrInts("axes", std::vector<int64_t>{0, 2, 3}));
  const ir::AttrMap reduce{{"axes", axes}, {"keepdims", int64_t{1}}};
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * mean, ctx.emit(OpKind::kReduceMean, {x}, reduce));
  KILN_ASSIGN_OR_RETURN(Value * c, ctx.emit(OpKind::kSub, {x, mean}));
  KILN_ASSIGN_OR_RETURN(Value * sq, ctx.emit(OpKind::kMul, {c, c}));
  KILN_ASSIGN_OR_RETURN(Value * var, ctx.emit(OpKind::kReduceMean, {sq}, reduce));
  KILN_ASSIGN_OR_RETURN(Value * eps, scalarOf(ctx, t.dtype, 1e-9));
  KILN_ASSIGN_OR_RETURN(Value * ve, ctx.emit(OpKind::kAdd, {var, eps}));
  KILN_ASSIGN_OR_RETURN(Value * sd, ctx.emit(OpKind::kSqrt, {ve}));
  return ctx.emit(OpKind::kDiv, {c, sd}, {}, 0).status();
}

// LRN: x / (bias + alpha / size * sum of x^2 over the channels c - floor((size - 1) / 2) to
// c + ceil((size - 1) / 2))^beta.
Status mapLrn(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatOnly(ctx));
  if (t.rank() < 3) return ctx.invalid("input must have rank 3 or more, got " + t.toString());
  KILN_ASSIGN_OR_RETURN(int64_t size, ctx.attrInt("size"));
  KILN_ASSIGN_OR_RETURN(double alpha, ctx.attrFloat("alpha", 1e-4));
  KILN_ASSIGN_OR_RETURN(double beta, ctx.attrFloat("beta", 0.75));
  KILN_ASSIGN_OR_RETURN(double bias, ctx.attrFloat("bias", 1.0));
  if (size < 1 || size > 64)
    return ctx.invalid("size must be 1 to 64, got " + std::to_string(size));
  const int64_t before = (size - 1) / 2, after = size - 1 - before, c = t.shape[1];
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * sq, ctx.emit(OpKind::kMul, {x, x}));
  // The squares with zero channels before and after, then `size` shifted slices summed.
  Value* padded = sq;
  std::vector<Value*> parts;
  for (int64_t n : {before, after})
    if (n > 0) {
      Shape zs = t.shape;
      zs[1] = n;
      KILN_ASSIGN_OR_RETURN(Value * z, ctx.constantValue(filledTensor(t.dtype, zs, 0)));
      parts.push_back(z);
    }
  if (before > 0 || after > 0) {
    std::vector<Value*> all;
    size_t k = 0;
    if (before > 0) all.push_back(parts[k++]);
    all.push_back(sq);
    if (after > 0) all.push_back(parts[k]);
    KILN_ASSIGN_OR_RETURN(padded, ctx.emit(OpKind::kConcat, all, {{"axis", int64_t{1}}}));
  }
  Value* sum = nullptr;
  for (int64_t o = 0; o < size; ++o) {
    KILN_ASSIGN_OR_RETURN(Value * s, ctx.emit(OpKind::kSlice, {padded},
                                              {{"starts", std::vector<int64_t>{o}},
                                               {"ends", std::vector<int64_t>{o + c}},
                                               {"axes", std::vector<int64_t>{1}}}));
    if (!sum) {
      sum = s;
      continue;
    }
    KILN_ASSIGN_OR_RETURN(sum, ctx.emit(OpKind::kAdd, {sum, s}));
  }
  KILN_ASSIGN_OR_RETURN(Value * k, scalarOf(ctx, t.dtype, alpha / static_cast<double>(size)));
  KILN_ASSIGN_OR_RETURN(Value * b, scalarOf(ctx, t.dtype, bias));
  KILN_ASSIGN_OR_RETURN(Value * e, scalarOf(ctx, t.dtype, beta));
  KILN_ASSIGN_OR_RETURN(Value * scaled, ctx.emit(OpKind::kMul, {sum, k}));
  KILN_ASSIGN_OR_RETURN(Value * base, ctx.emit(OpKind::kAdd, {scaled, b}));
  KILN_ASSIGN_OR_RETURN(Value * den, ctx.emit(OpKind::kPow, {base, e}));
  return ctx.emit(OpKind::kDiv, {x, den}, {}, 0).status();
}

}  // namespace

std::vector<MapperEntry> derivedMappers() {
  return {
      {"Hardmax", {1, 11, 13}, mapHardmax},
      {"OneHot", {9, 11, 28}, mapOneHot},
      {"LpNormalization", {1, 22}, mapLpNormalization},
      {"CumSum", {11, 14}, mapCumSum},
      {"SpaceToDepth", {1, 13, 28}, mapSpaceToDepth},
      {"DepthToSpace", {1, 11, 13, 28}, mapDepthToSpace},
      {"IsNaN", {9, 13, 20}, mapIsNaN},
      {"IsInf", {10, 20}, mapIsInf},
      {"EyeLike", {9, 22}, mapEyeLike},
      {"Tile", {6, 13}, mapTile},
      {"Shrink", {9}, mapShrink},
      {"InstanceNormalization", {6, 22}, mapInstanceNorm},
      {"GroupNormalization", {21}, mapGroupNorm},
      {"MeanVarianceNormalization", {9, 13}, mapMeanVarianceNorm},
      {"LRN", {1, 13}, mapLrn},
  };
}

}  // namespace kiln::frontends::onnx_import
