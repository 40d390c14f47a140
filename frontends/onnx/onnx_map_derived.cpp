// More ONNX ops that kiln composes exactly from its own ops at import, each from the
// definition in the ONNX specification: Hardmax and OneHot (compare with an index table),
// LpNormalization, CumSum (a product with a triangular 0/1 matrix, so each output is the same
// sum of the same terms), SpaceToDepth and DepthToSpace (reshape, transpose, reshape), IsNaN,
// IsInf, EyeLike (a constant), Tile (expand between reshapes), Shrink, and the normalizations
// InstanceNormalization, GroupNormalization and MeanVarianceNormalization (on layer_norm and
// reductions) and LRN (shifted slices of the squares).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <string>

#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_map_util.h"
#include "frontends/onnx/onnx_tensor.h"
#include "ir/narrow.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::DType;
using ir::OpKind;
using ir::Shape;
using ir::Value;

// An int64 tensor of `rank` dims, all 1 but dim `axis` (n): 0, 1, ..., n-1 along it.
Expected<Value*> iotaAlong(NodeContext& ctx, int rank, int axis, int64_t n) {
  Shape s(static_cast<size_t>(rank), 1);
  s[static_cast<size_t>(axis)] = n;
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return ctx.constantValue(intTensor(v, s));
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
  KILN_ASSIGN_OR_RETURN(Value * zero, scalarConstant(ctx, DType::kI64, 0));
  KILN_ASSIGN_OR_RETURN(Value * d, scalarConstant(ctx, DType::kI64, static_cast<double>(depth)));
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
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatInput(ctx));
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
  KILN_ASSIGN_OR_RETURN(Value * zero, scalarConstant(ctx, t.dtype, 0));
  KILN_ASSIGN_OR_RETURN(Value * isZero, ctx.emit(OpKind::kEqual, {norm, zero}));
  KILN_ASSIGN_OR_RETURN(Value * q, ctx.emit(OpKind::kDiv, {x, norm}));
  return ctx.emit(OpKind::kWhere, {isZero, zero, q}, {}, 0).status();
}

// What CumSum and CumProd read: x (f32, f64, i32, i64, rank >= 1), the axis (input 1, known at
// import), exclusive and reverse.
struct ScanNode {
  ir::TensorType t;
  int axis = 0;
  bool exclusive = false, reverse = false;
};

Expected<ScanNode> readScanNode(NodeContext& ctx) {
  ScanNode s;
  KILN_ASSIGN_OR_RETURN(s.t, ctx.inputType(0));
  const DType d = s.t.dtype;
  if (d != DType::kF32 && d != DType::kF64 && d != DType::kI64 && d != DType::kI32)
    return ctx.unsupported(ctx.opType() + " of " + s.t.toString() +
                           " (kiln composes f32, f64, i32, i64)");
  if (s.t.rank() < 1) return ctx.invalid("input must have rank 1 or more");
  KILN_ASSIGN_OR_RETURN(double axisValue, ctx.constScalar(1, "axis"));
  KILN_ASSIGN_OR_RETURN(
      s.axis, ir::normalizeAxis(static_cast<int64_t>(axisValue), s.t.shape.size(), "axis"));
  KILN_ASSIGN_OR_RETURN(s.exclusive, ctx.attrBool("exclusive", false));
  KILN_ASSIGN_OR_RETURN(s.reverse, ctx.attrBool("reverse", false));
  return s;
}

// CumSum: y[..., j, ...] = sum over k of x[..., k, ...] T[k, j] along `axis`, with T the 0/1
// triangle that selects k <= j (k < j exclusive; k >= j, k > j reversed).
Status mapCumSum(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ScanNode sn, readScanNode(ctx));
  const ir::TensorType& t = sn.t;
  const int axis = sn.axis;
  const bool exclusive = sn.exclusive, reverse = sn.reverse;
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

// CumProd (26): a scan by doubling (Hillis and Steele), log2(n) steps of y *= y shifted by 2^k
// along the axis with ones shifted in. Exclusive shifts the input by one first; reverse flips the
// axis before and after. Integers multiply with wrapping, exactly as a running product; floats
// associate the products in another order than a running product (rounding within a few ulps).
Status mapCumProd(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ScanNode sn, readScanNode(ctx));
  const ir::TensorType& t = sn.t;
  const int axis = sn.axis;
  const bool exclusive = sn.exclusive, reverse = sn.reverse;
  const int64_t n = t.shape[static_cast<size_t>(axis)];
  const std::vector<int64_t> axes{axis};
  auto flip = [&](Value* v) {
    return ctx.emit(OpKind::kSlice, {v},
                    {{"starts", std::vector<int64_t>{n - 1}},
                     {"ends", std::vector<int64_t>{std::numeric_limits<int64_t>::min()}},
                     {"axes", axes},
                     {"steps", std::vector<int64_t>{-1}}});
  };
  // v shifted by k along the axis, ones coming in: [1 x k, v[0 : n-k]].
  auto shifted = [&](Value* v, int64_t k) -> Expected<Value*> {
    Shape onesShape = t.shape;
    onesShape[static_cast<size_t>(axis)] = k;
    KILN_ASSIGN_OR_RETURN(Value * one, ctx.constantValue(filledTensor(t.dtype, {}, 1)));
    KILN_ASSIGN_OR_RETURN(Value * ones, ctx.emit(OpKind::kExpand, {one}, {{"shape", onesShape}}));
    KILN_ASSIGN_OR_RETURN(Value * head, ctx.emit(OpKind::kSlice, {v},
                                                 {{"starts", std::vector<int64_t>{0}},
                                                  {"ends", std::vector<int64_t>{n - k}},
                                                  {"axes", axes}}));
    return ctx.emit(OpKind::kConcat, {ones, head}, {{"axis", int64_t{axis}}});
  };
  KILN_ASSIGN_OR_RETURN(Value * y, ctx.value(0));
  if (n == 0 || (n == 1 && !exclusive)) return alias(ctx, 0);
  if (n == 1) {  // Exclusive: all ones.
    KILN_ASSIGN_OR_RETURN(Value * one, ctx.constantValue(filledTensor(t.dtype, {}, 1)));
    return ctx.emit(OpKind::kExpand, {one}, {{"shape", t.shape}}, 0).status();
  }
  if (reverse) {
    KILN_ASSIGN_OR_RETURN(y, flip(y));
  }
  if (exclusive) {
    KILN_ASSIGN_OR_RETURN(y, shifted(y, 1));
  }
  for (int64_t k = 1; k < n; k *= 2) {
    KILN_ASSIGN_OR_RETURN(Value * prev, shifted(y, k));
    KILN_ASSIGN_OR_RETURN(y, ctx.emit(OpKind::kMul, {y, prev}));
  }
  if (reverse) {
    KILN_ASSIGN_OR_RETURN(y, flip(y));
  }
  ctx.setOutput(0, y);
  return Status::ok();
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
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  // f16 and bf16 compared in f32 (exact), the dtype the comparison's infinities are made in.
  const bool half = t.dtype == DType::kF16 || t.dtype == DType::kBF16;
  if (!half) {
    KILN_ASSIGN_OR_RETURN(t, floatInput(ctx));
  }
  KILN_ASSIGN_OR_RETURN(bool pos, ctx.attrBool("detect_positive", true));
  KILN_ASSIGN_OR_RETURN(bool neg, ctx.attrBool("detect_negative", true));
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  if (half) {
    KILN_ASSIGN_OR_RETURN(x, ctx.emit(OpKind::kCast, {x}, {{"to", std::string("f32")}}));
    t.dtype = DType::kF32;
  }
  const double inf = std::numeric_limits<double>::infinity();
  if (!pos && !neg) {
    ir::TensorData none(DType::kBool, t.shape);
    if (none.byteSize()) std::memset(none.data(), 0, none.byteSize());
    KILN_ASSIGN_OR_RETURN(Value * c, ctx.constantValue(std::move(none)));
    ctx.setOutput(0, c);
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(Value * pinf, scalarConstant(ctx, t.dtype, inf));
  KILN_ASSIGN_OR_RETURN(Value * ninf, scalarConstant(ctx, t.dtype, -inf));
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

enum class Window { kHann, kHamming, kBlackman };

// HannWindow, HammingWindow, BlackmanWindow (17): constants of the size (an input known at
// import), by ONNX's formulas with N the size (periodic) or the size - 1, computed in double and
// converted once to output_datatype. A window of size 1 is [1] (ONNX's reference divides 0 by 0
// for a symmetric one; PyTorch and NumPy give 1).
template <Window kWindow>
Status mapWindow(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* sizeData, ctx.requireConstant(0));
  if (!sizeData)
    return ctx.unsupported(
        "a window size computed at run time (kiln needs it at import; give "
        "the graph input's value with OnnxImportOptions::inputValues)");
  KILN_ASSIGN_OR_RETURN(double sizeValue, toScalar(*sizeData, "size"));
  const int64_t size = static_cast<int64_t>(sizeValue);
  if (size < 0) return ctx.invalid("size must be >= 0, got " + std::to_string(size));
  if (size > kMaxFoldElements)
    return ctx.unsupported("a window of " + std::to_string(size) + " elements (too large)");
  KILN_ASSIGN_OR_RETURN(int64_t code, ctx.attrInt("output_datatype", 1));
  auto dtype = dtypeFromOnnx(static_cast<int32_t>(code));
  if (!dtype || !foldableDType(*dtype))
    return ctx.unsupported("output_datatype " + onnxTypeName(static_cast<int32_t>(code)));
  KILN_ASSIGN_OR_RETURN(bool periodic, ctx.attrBool("periodic", true));
  const double n1 = static_cast<double>(periodic ? size : size - 1);
  ir::TensorData w = filledTensor(*dtype, {size}, 0);
  const size_t es = ir::dtypeSize(*dtype);
  for (int64_t i = 0; i < size; ++i) {
    const double x = 2 * M_PI * static_cast<double>(i) / n1;
    double v = 1;
    if (size > 1) {
      switch (kWindow) {
        case Window::kHann:
          v = 0.5 - 0.5 * std::cos(x);
          break;
        case Window::kHamming:
          v = 25.0 / 46.0 - 21.0 / 46.0 * std::cos(x);
          break;
        case Window::kBlackman:
          v = 0.42 - 0.5 * std::cos(x) + 0.08 * std::cos(2 * x);
          break;
      }
    }
    const ir::TensorData e = filledTensor(*dtype, {}, v);
    std::memcpy(w.data() + static_cast<size_t>(i) * es, e.data(), es);
  }
  ctx.setConstantOutput(0, std::move(w));
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
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatInput(ctx));
  KILN_ASSIGN_OR_RETURN(double bias, ctx.attrFloat("bias", 0.0));
  KILN_ASSIGN_OR_RETURN(double lambd, ctx.attrFloat("lambd", 0.5));
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * lo, scalarConstant(ctx, t.dtype, -lambd));
  KILN_ASSIGN_OR_RETURN(Value * hi, scalarConstant(ctx, t.dtype, lambd));
  KILN_ASSIGN_OR_RETURN(Value * b, scalarConstant(ctx, t.dtype, bias));
  KILN_ASSIGN_OR_RETURN(Value * zero, scalarConstant(ctx, t.dtype, 0));
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
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatInput(ctx));
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
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatInput(ctx));
  KILN_TRY(requireStashType(ctx, t.dtype));
  KILN_ASSIGN_OR_RETURN(int64_t groups, ctx.attrInt("num_groups"));
  return mapGroupedNorm(ctx, groups);
}

Status mapMeanVarianceNorm(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatInput(ctx));
  KILN_ASSIGN_OR_RETURN(auto axes, ctx.attrInts("axes", std::vector<int64_t>{0, 2, 3}));
  const ir::AttrMap reduce{{"axes", axes}, {"keepdims", int64_t{1}}};
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * mean, ctx.emit(OpKind::kReduceMean, {x}, reduce));
  KILN_ASSIGN_OR_RETURN(Value * c, ctx.emit(OpKind::kSub, {x, mean}));
  KILN_ASSIGN_OR_RETURN(Value * sq, ctx.emit(OpKind::kMul, {c, c}));
  KILN_ASSIGN_OR_RETURN(Value * var, ctx.emit(OpKind::kReduceMean, {sq}, reduce));
  KILN_ASSIGN_OR_RETURN(Value * eps, scalarConstant(ctx, t.dtype, 1e-9));
  KILN_ASSIGN_OR_RETURN(Value * ve, ctx.emit(OpKind::kAdd, {var, eps}));
  KILN_ASSIGN_OR_RETURN(Value * sd, ctx.emit(OpKind::kSqrt, {ve}));
  return ctx.emit(OpKind::kDiv, {c, sd}, {}, 0).status();
}

// LRN: x / (bias + alpha / size * sum of x^2 over the channels c - floor((size - 1) / 2) to
// c + ceil((size - 1) / 2))^beta.
Status mapLrn(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, floatInput(ctx));
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
  KILN_ASSIGN_OR_RETURN(Value * k, scalarConstant(ctx, t.dtype, alpha / static_cast<double>(size)));
  KILN_ASSIGN_OR_RETURN(Value * b, scalarConstant(ctx, t.dtype, bias));
  KILN_ASSIGN_OR_RETURN(Value * e, scalarConstant(ctx, t.dtype, beta));
  KILN_ASSIGN_OR_RETURN(Value * scaled, ctx.emit(OpKind::kMul, {sum, k}));
  KILN_ASSIGN_OR_RETURN(Value * base, ctx.emit(OpKind::kAdd, {scaled, b}));
  KILN_ASSIGN_OR_RETURN(Value * den, ctx.emit(OpKind::kPow, {base, e}));
  return ctx.emit(OpKind::kDiv, {x, den}, {}, 0).status();
}

// CenterCropPad: each named axis cropped to or zero-padded to its target length, centered
// (the extra element of an odd difference goes at the end).
Status mapCenterCropPad(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(auto target, ctx.constInts(1, "shape"));
  std::vector<int> axes;
  if (ctx.hasAttr("axes")) {
    KILN_ASSIGN_OR_RETURN(auto given, ctx.attrInts("axes"));
    for (int64_t a : given) {
      KILN_ASSIGN_OR_RETURN(int n, ir::normalizeAxis(a, t.shape.size(), "axes"));
      axes.push_back(n);
    }
  } else {
    for (int d = 0; d < t.rank(); ++d) axes.push_back(d);
  }
  if (target.size() != axes.size())
    return ctx.invalid("shape " + ir::shapeToString(target) + " must have one length per axis (" +
                       std::to_string(axes.size()) + ")");
  if (!foldableDType(t.dtype)) return ctx.unsupported("CenterCropPad of " + t.toString());
  KILN_ASSIGN_OR_RETURN(Value * y, ctx.value(0));
  for (size_t i = 0; i < axes.size(); ++i) {
    const int a = axes[i];
    const int64_t dim = y->type().shape[static_cast<size_t>(a)], want = target[i];
    if (want < 0) return ctx.invalid("shape must not be negative");
    if (want == dim) continue;
    if (want < dim) {
      const int64_t start = (dim - want) / 2;
      KILN_ASSIGN_OR_RETURN(y, ctx.emit(OpKind::kSlice, {y},
                                        {{"starts", std::vector<int64_t>{start}},
                                         {"ends", std::vector<int64_t>{start + want}},
                                         {"axes", std::vector<int64_t>{a}}}));
      continue;
    }
    const int64_t before = (want - dim) / 2, after = want - dim - before;
    std::vector<Value*> parts;
    for (int64_t n : {before, int64_t{-1}, after}) {
      if (n == -1) {
        parts.push_back(y);
        continue;
      }
      if (n == 0) continue;
      Shape zs = y->type().shape;
      zs[static_cast<size_t>(a)] = n;
      KILN_ASSIGN_OR_RETURN(Value * z, ctx.constantValue(filledTensor(t.dtype, zs, 0)));
      parts.push_back(z);
    }
    KILN_ASSIGN_OR_RETURN(y, ctx.emit(OpKind::kConcat, parts, {{"axis", int64_t{a}}}));
  }
  ctx.setOutput(0, y);
  return Status::ok();
}

// RotaryEmbedding (23): the first rotary_embedding_dim features of each head rotated by the
// cached angles of its position (halves, or even/odd pairs when interleaved).
Status mapRotaryEmbedding(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(0));
  if (!ir::isFloat(t.dtype))
    return ctx.invalid("input must be a float tensor, got " + t.toString());
  if (t.rank() != 3 && t.rank() != 4)
    return ctx.invalid("input must have rank 3 or 4, got " + t.toString());
  KILN_ASSIGN_OR_RETURN(bool interleaved, ctx.attrBool("interleaved", false));
  KILN_ASSIGN_OR_RETURN(int64_t rd, ctx.attrInt("rotary_embedding_dim", 0));
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  const Shape orig = t.shape;
  if (t.rank() == 4) {
    KILN_ASSIGN_OR_RETURN(
        x, ctx.emit(OpKind::kTranspose, {x}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}}));
  } else {
    KILN_ASSIGN_OR_RETURN(int64_t heads, ctx.attrInt("num_heads", 0));
    if (heads <= 0 || orig[2] % heads)
      return ctx.invalid("3-D input needs num_heads dividing its hidden size " +
                         std::to_string(orig[2]));
    KILN_ASSIGN_OR_RETURN(x,
                          ctx.emit(OpKind::kReshape, {x},
                                   {{"shape", Shape{orig[0], orig[1], heads, orig[2] / heads}}}));
  }
  const Shape xs = x->type().shape;  // [B, S, H, D]
  const int64_t hd = xs[3];
  if (rd == 0) rd = hd;
  if (rd < 2 || rd > hd || rd % 2)
    return ctx.invalid("rotary_embedding_dim " + std::to_string(rd) + " must be even and at most " +
                       "the head size " + std::to_string(hd));
  auto slice = [&](Value* v, int64_t start, int64_t end, int64_t step) {
    return ctx.emit(OpKind::kSlice, {v},
                    {{"starts", std::vector<int64_t>{start}},
                     {"ends", std::vector<int64_t>{end}},
                     {"axes", std::vector<int64_t>{3}},
                     {"steps", std::vector<int64_t>{step}}});
  };
  KILN_ASSIGN_OR_RETURN(Value * rot, rd == hd ? Expected<Value*>(x) : slice(x, 0, rd, 1));
  KILN_ASSIGN_OR_RETURN(Value * cosv, ctx.value(1));
  KILN_ASSIGN_OR_RETURN(Value * sinv, ctx.value(2));
  if (ctx.hasInput(3)) {
    KILN_ASSIGN_OR_RETURN(Value * pos, ctx.value(3));
    KILN_ASSIGN_OR_RETURN(cosv, ctx.emit(OpKind::kGather, {cosv, pos}));
    KILN_ASSIGN_OR_RETURN(sinv, ctx.emit(OpKind::kGather, {sinv, pos}));
  }
  if (cosv->type().shape.back() != rd / 2 || sinv->type().shape.back() != rd / 2)
    return ctx.invalid("the cos and sin caches' last dim must be rotary_embedding_dim / 2 = " +
                       std::to_string(rd / 2));
  const ir::AttrMap at2{{"axes", std::vector<int64_t>{2}}};
  KILN_ASSIGN_OR_RETURN(cosv, ctx.emit(OpKind::kUnsqueeze, {cosv}, at2));
  KILN_ASSIGN_OR_RETURN(sinv, ctx.emit(OpKind::kUnsqueeze, {sinv}, at2));
  KILN_ASSIGN_OR_RETURN(Value * x1, interleaved ? slice(rot, 0, rd, 2) : slice(rot, 0, rd / 2, 1));
  KILN_ASSIGN_OR_RETURN(Value * x2, interleaved ? slice(rot, 1, rd, 2) : slice(rot, rd / 2, rd, 1));
  KILN_ASSIGN_OR_RETURN(Value * c1, ctx.emit(OpKind::kMul, {cosv, x1}));
  KILN_ASSIGN_OR_RETURN(Value * s2, ctx.emit(OpKind::kMul, {sinv, x2}));
  KILN_ASSIGN_OR_RETURN(Value * s1, ctx.emit(OpKind::kMul, {sinv, x1}));
  KILN_ASSIGN_OR_RETURN(Value * c2, ctx.emit(OpKind::kMul, {cosv, x2}));
  KILN_ASSIGN_OR_RETURN(Value * re, ctx.emit(OpKind::kSub, {c1, s2}));
  KILN_ASSIGN_OR_RETURN(Value * im, ctx.emit(OpKind::kAdd, {s1, c2}));
  Value* rotated = nullptr;
  if (interleaved) {
    const ir::AttrMap last{{"axes", std::vector<int64_t>{4}}};
    KILN_ASSIGN_OR_RETURN(Value * r5, ctx.emit(OpKind::kUnsqueeze, {re}, last));
    KILN_ASSIGN_OR_RETURN(Value * i5, ctx.emit(OpKind::kUnsqueeze, {im}, last));
    KILN_ASSIGN_OR_RETURN(Value * pairs,
                          ctx.emit(OpKind::kConcat, {r5, i5}, {{"axis", int64_t{4}}}));
    KILN_ASSIGN_OR_RETURN(
        rotated, ctx.emit(OpKind::kReshape, {pairs}, {{"shape", Shape{xs[0], xs[1], xs[2], rd}}}));
  } else {
    KILN_ASSIGN_OR_RETURN(rotated, ctx.emit(OpKind::kConcat, {re, im}, {{"axis", int64_t{3}}}));
  }
  if (rd < hd) {
    KILN_ASSIGN_OR_RETURN(Value * rest, slice(x, rd, hd, 1));
    KILN_ASSIGN_OR_RETURN(rotated,
                          ctx.emit(OpKind::kConcat, {rotated, rest}, {{"axis", int64_t{3}}}));
  }
  if (t.rank() == 4)
    return ctx.emit(OpKind::kTranspose, {rotated}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}}, 0)
        .status();
  return ctx.emit(OpKind::kReshape, {rotated}, {{"shape", orig}}, 0).status();
}

// Einsum: every operand aligned to the equation's letters (transpose, then unit dims for the
// letters it lacks), multiplied with broadcasting, summed over the letters the output lacks,
// and transposed to the output's order. f16/bf16 are computed in f32. An ellipsis stands for
// the leading dims. A letter repeated within one operand takes that operand's diagonal first
// (its two dims moved last and merged, every (n + 1)-th element gathered; the letter then
// stands once, last), as NumPy's einsum: 'ii->i' the diagonal, 'ii' the trace.
Status mapEinsum(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::string eq, ctx.attrString("equation"));
  eq.erase(std::remove(eq.begin(), eq.end(), ' '), eq.end());
  // ONNX's letters are lower case; upper case stands for the ellipsis' dims below.
  for (char c : eq)
    if (std::isupper(static_cast<unsigned char>(c)))
      return ctx.invalid("equation '" + eq + "' has the upper-case letter '" + std::string(1, c) +
                         "' (ONNX's Einsum takes lower-case letters)");
  const size_t arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> terms;
  for (size_t start = 0;;) {
    const size_t comma = lhs.find(',', start);
    terms.push_back(lhs.substr(start, comma == std::string::npos ? comma : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (terms.size() != ctx.numInputs())
    return ctx.invalid("equation '" + eq + "' has " + std::to_string(terms.size()) +
                       " operands, the node " + std::to_string(ctx.numInputs()) + " inputs");
  // An ellipsis becomes capital letters, one per dim it covers (right-aligned, as broadcast).
  std::vector<ir::TensorType> types;
  size_t ellRank = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(ir::TensorType ti, ctx.inputType(i));
    types.push_back(ti);
    if (const size_t e = terms[i].find("..."); e != std::string::npos) {
      const size_t named = terms[i].size() - 3;
      if (static_cast<size_t>(ti.rank()) < named)
        return ctx.invalid("operand " + std::to_string(i) + " " + ti.toString() +
                           " has fewer dims " + "than '" + terms[i] + "' names");
      ellRank = std::max(ellRank, static_cast<size_t>(ti.rank()) - named);
    }
  }
  if (ellRank > 26) return ctx.unsupported("an ellipsis of more than 26 dims");
  auto expand = [&](const std::string& term, size_t rank) {
    const size_t e = term.find("...");
    if (e == std::string::npos) return term;
    std::string caps;
    for (size_t k = ellRank - rank; k < ellRank; ++k) caps += static_cast<char>('A' + k);
    return term.substr(0, e) + caps + term.substr(e + 3);
  };
  for (size_t i = 0; i < terms.size(); ++i) {
    const size_t named =
        terms[i].find("...") == std::string::npos ? terms[i].size() : terms[i].size() - 3;
    terms[i] = expand(
        terms[i], static_cast<size_t>(types[i].rank()) - std::min<size_t>(named, types[i].rank()));
    if (terms[i].size() != static_cast<size_t>(types[i].rank()))
      return ctx.invalid("operand " + std::to_string(i) + " " + types[i].toString() + " does not " +
                         "have one dim per letter of its term");
  }
  // Letters in order of first appearance; the output as written, or implicit (ellipsis dims,
  // then the letters that appear once, sorted).
  std::string letters;
  std::map<char, int> count;
  for (const std::string& term : terms)
    for (char c : term) {
      if (!std::isalpha(static_cast<unsigned char>(c)))
        return ctx.invalid("equation '" + eq + "' has a '" + std::string(1, c) + "'");
      if (letters.find(c) == std::string::npos) letters += c;
      ++count[c];
    }
  struct Diagonal {
    std::vector<int64_t> perm;  // The repeated letter's two dims moved last.
    Shape merged;               // The other dims, then n * n.
    int64_t n = 0;
  };
  std::vector<std::vector<Diagonal>> diagonals(terms.size());
  for (size_t i = 0; i < terms.size(); ++i)
    for (std::string& t = terms[i];;) {
      size_t k1 = 0, k2 = std::string::npos;
      for (; k1 < t.size() && k2 == std::string::npos; ++k1) k2 = t.find(t[k1], k1 + 1);
      if (k2 == std::string::npos) break;
      --k1;
      Shape& sh = types[i].shape;
      if (sh[k1] != sh[k2])
        return ctx.invalid("equation '" + eq + "': letter '" + std::string(1, t[k1]) +
                           "' repeats in operand " + std::to_string(i) + " " + types[i].toString() +
                           " over dims of sizes " + std::to_string(sh[k1]) + " and " +
                           std::to_string(sh[k2]) + " (a diagonal needs equal ones)");
      Diagonal d;
      d.n = sh[k1];
      std::string rest;
      Shape restShape;
      for (size_t k = 0; k < t.size(); ++k)
        if (k != k1 && k != k2) {
          d.perm.push_back(static_cast<int64_t>(k));
          rest += t[k];
          restShape.push_back(sh[k]);
        }
      d.perm.push_back(static_cast<int64_t>(k1));
      d.perm.push_back(static_cast<int64_t>(k2));
      d.merged = restShape;
      d.merged.push_back(d.n * d.n);
      diagonals[i].push_back(d);
      t = rest + t[k1];
      sh = restShape;
      sh.push_back(d.n);
    }
  std::string out;
  if (arrow != std::string::npos) {
    out = expand(eq.substr(arrow + 2), ellRank);
  } else {
    for (char c : letters)
      if (std::isupper(static_cast<unsigned char>(c))) out += c;
    std::string once;
    for (char c : letters)
      if (std::islower(static_cast<unsigned char>(c)) && count[c] == 1) once += c;
    std::sort(once.begin(), once.end());
    out += once;
  }
  for (char c : out)
    if (letters.find(c) == std::string::npos)
      return ctx.invalid("output letter '" + std::string(1, c) + "' is in no operand");
  // Each letter's size, from the operands (1 broadcasts).
  std::map<char, int64_t> size;
  for (size_t i = 0; i < terms.size(); ++i)
    for (size_t k = 0; k < terms[i].size(); ++k) {
      const int64_t n = types[i].shape[k];
      int64_t& s = size.try_emplace(terms[i][k], n).first->second;
      if (s == 1)
        s = n;
      else if (n != 1 && n != s)
        return ctx.invalid("letter '" + std::string(1, terms[i][k]) + "' has sizes " +
                           std::to_string(s) + " and " + std::to_string(n));
    }
  const DType outType = types[0].dtype;
  const bool half = outType == DType::kF16 || outType == DType::kBF16;
  Value* acc = nullptr;
  for (size_t i = 0; i < terms.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(Value * v, ctx.value(i));
    if (half) {
      KILN_ASSIGN_OR_RETURN(v, ctx.emit(OpKind::kCast, {v}, {{"to", std::string("f32")}}));
    }
    for (const Diagonal& d : diagonals[i]) {
      if (!std::is_sorted(d.perm.begin(), d.perm.end())) {
        KILN_ASSIGN_OR_RETURN(v, ctx.emit(OpKind::kTranspose, {v}, {{"perm", d.perm}}));
      }
      KILN_ASSIGN_OR_RETURN(v, ctx.emit(OpKind::kReshape, {v}, {{"shape", d.merged}}));
      std::vector<int64_t> at(static_cast<size_t>(d.n));
      for (int64_t k = 0; k < d.n; ++k) at[static_cast<size_t>(k)] = k * (d.n + 1);
      KILN_ASSIGN_OR_RETURN(Value * idx, ctx.constantValue(int1d(at)));
      KILN_ASSIGN_OR_RETURN(v, ctx.emit(OpKind::kGather, {v, idx},
                                        {{"axis", static_cast<int64_t>(d.merged.size() - 1)}}));
    }
    std::vector<int64_t> perm;
    Shape aligned;
    for (char c : letters)
      if (const size_t k = terms[i].find(c); k != std::string::npos) {
        perm.push_back(static_cast<int64_t>(k));
        aligned.push_back(types[i].shape[k]);
      } else {
        aligned.push_back(1);
      }
    bool identity = true;
    for (size_t k = 0; k < perm.size(); ++k) identity &= perm[k] == static_cast<int64_t>(k);
    if (!identity) {
      KILN_ASSIGN_OR_RETURN(v, ctx.emit(OpKind::kTranspose, {v}, {{"perm", perm}}));
    }
    if (aligned.size() != perm.size()) {
      KILN_ASSIGN_OR_RETURN(v, ctx.emit(OpKind::kReshape, {v}, {{"shape", aligned}}));
    }
    if (!acc) {
      acc = v;
      continue;
    }
    KILN_ASSIGN_OR_RETURN(acc, ctx.emit(OpKind::kMul, {acc, v}));
  }
  // Broadcast to every letter's size (a letter of size 1 everywhere stays 1), then reduce.
  Shape full;
  for (char c : letters) full.push_back(size[c]);
  if (acc->type().shape != full) {
    KILN_ASSIGN_OR_RETURN(acc, ctx.emit(OpKind::kExpand, {acc}, {{"shape", full}}));
  }
  std::vector<int64_t> reduced;
  std::string kept;
  for (size_t k = 0; k < letters.size(); ++k)
    if (out.find(letters[k]) == std::string::npos)
      reduced.push_back(static_cast<int64_t>(k));
    else
      kept += letters[k];
  if (!reduced.empty()) {
    KILN_ASSIGN_OR_RETURN(
        acc, ctx.emit(OpKind::kReduceSum, {acc}, {{"axes", reduced}, {"keepdims", int64_t{0}}}));
  }
  std::vector<int64_t> perm;
  for (char c : out) perm.push_back(static_cast<int64_t>(kept.find(c)));
  bool identity = true;
  for (size_t k = 0; k < perm.size(); ++k) identity &= perm[k] == static_cast<int64_t>(k);
  if (!identity) {
    KILN_ASSIGN_OR_RETURN(acc, ctx.emit(OpKind::kTranspose, {acc}, {{"perm", perm}}));
  }
  if (half) {
    KILN_ASSIGN_OR_RETURN(
        acc, ctx.emit(OpKind::kCast, {acc}, {{"to", std::string(ir::dtypeName(outType))}}));
  }
  ctx.setOutput(0, acc);
  return Status::ok();
}

// ScatterElements (and Scatter, its deprecated name) and ScatterND on kiln's scatter ops.
template <OpKind kOp>
Status mapScatter(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::string reduction, ctx.attrString("reduction", "none"));
  ir::AttrMap attrs{{"reduction", reduction}};
  if (kOp == OpKind::kScatterElements) {
    KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.attrInt("axis", 0));
    attrs["axis"] = axis;
  }
  std::vector<Value*> in;
  for (size_t i = 0; i < 3; ++i) {
    KILN_ASSIGN_OR_RETURN(Value * v, ctx.value(i));
    in.push_back(v);
  }
  return ctx.emit(kOp, std::move(in), std::move(attrs), 0).status();
}

// TopK: the indices of the k best along the axis (kiln's topk_indices), the values gathered at
// them. k is an attribute before version 10, an input (known at import) from it on.
Status mapTopK(NodeContext& ctx) {
  int64_t k = 0;
  if (ctx.version() < 10) {
    KILN_ASSIGN_OR_RETURN(k, ctx.attrInt("k"));
  } else {
    KILN_ASSIGN_OR_RETURN(auto ks, ctx.constInts(1, "k"));
    if (ks.size() != 1) return ctx.invalid("k must hold one value, got " + ir::shapeToString(ks));
    k = ks[0];
  }
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.attrInt("axis", -1));
  KILN_ASSIGN_OR_RETURN(bool largest, ctx.attrBool("largest", true));
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(
      Value * idx,
      ctx.emit(OpKind::kTopKIndices, {x}, {{"k", k}, {"axis", axis}, {"largest", int64_t{largest}}},
               ctx.outputUsed(1) ? 1 : -1));
  return ctx.emit(OpKind::kGatherElements, {x, idx}, {{"axis", axis}}, 0).status();
}

// A scale or zero point of (De)QuantizeLinear made broadcastable to x: a scalar as it is, a
// 1-D per-axis vector along `axis`, or a blocked tensor repeated block_size times along it.
Expected<Value*> quantParam(NodeContext& ctx, Value* v, const Shape& x, int64_t axisAttr,
                            int64_t block) {
  const Shape s = v->type().shape;
  if (v->type().numElements() == 1) return ctx.emit(OpKind::kReshape, {v}, {{"shape", Shape{}}});
  // The axis matters only for per-axis and blocked parameters.
  KILN_ASSIGN_OR_RETURN(const int axis, ir::normalizeAxis(axisAttr, x.size(), "axis"));
  const size_t a = static_cast<size_t>(axis);
  if (block <= 0) {
    if (s.size() != 1 || s[0] != x[a])
      return ctx.invalid("a per-axis scale or zero point must be 1-D with " + std::to_string(x[a]) +
                         " values, got " + v->type().toString());
    Shape per(x.size(), 1);
    per[a] = s[0];
    return ctx.emit(OpKind::kReshape, {v}, {{"shape", per}});
  }
  if (s.size() != x.size() || s[a] != (x[a] + block - 1) / block)
    return ctx.invalid("a blocked scale or zero point must be " + ir::shapeToString(x) +
                       " with dim " + std::to_string(axis) + " divided into blocks of " +
                       std::to_string(block) + ", got " + v->type().toString());
  Shape withRep = s, repeated = s;
  withRep.insert(withRep.begin() + axis + 1, 1);
  Shape expanded = withRep;
  expanded[a + 1] = block;
  repeated[a] = s[a] * block;
  KILN_ASSIGN_OR_RETURN(Value * u, ctx.emit(OpKind::kReshape, {v}, {{"shape", withRep}}));
  KILN_ASSIGN_OR_RETURN(Value * e, ctx.emit(OpKind::kExpand, {u}, {{"shape", expanded}}));
  KILN_ASSIGN_OR_RETURN(Value * r, ctx.emit(OpKind::kReshape, {e}, {{"shape", repeated}}));
  if (repeated[a] == x[a]) return r;
  return ctx.emit(OpKind::kSlice, {r},
                  {{"starts", std::vector<int64_t>{0}},
                   {"ends", std::vector<int64_t>{x[a]}},
                   {"axes", std::vector<int64_t>{axis}}});
}

struct QuantAttrs {
  int64_t axis = 1;
  int64_t block = 0;
};

Expected<QuantAttrs> quantAttrs(NodeContext& ctx) {
  QuantAttrs q;
  KILN_ASSIGN_OR_RETURN(q.axis, ctx.attrInt("axis", 1));
  if (ctx.version() >= 21) {
    KILN_ASSIGN_OR_RETURN(q.block, ctx.attrInt("block_size", 0));
  }
  return q;
}

// DequantizeLinear: (x - zero_point) * scale in f32, in the scale's dtype (or output_dtype).
Status mapDequantize(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  if (xt.dtype != DType::kI8 && xt.dtype != DType::kU8 && xt.dtype != DType::kI16 &&
      xt.dtype != DType::kU16 && xt.dtype != DType::kI32 && !ir::isNarrow(xt.dtype))
    return ctx.unsupported("DequantizeLinear of " + xt.toString() +
                           " (kiln dequantizes int32, int16, uint16, int8, uint8, int4, uint4, " +
                           "int2, uint2 and the 8- and 4-bit floats)");
  KILN_ASSIGN_OR_RETURN(QuantAttrs q, quantAttrs(ctx));
  KILN_ASSIGN_OR_RETURN(ir::TensorType st, ctx.inputType(1));
  DType outType = st.dtype;
  if (ctx.hasAttr("output_dtype")) {
    KILN_ASSIGN_OR_RETURN(int64_t code, ctx.attrInt("output_dtype"));
    if (code != 0) {
      auto d = dtypeFromOnnx(static_cast<int32_t>(code));
      if (!d || !ir::isFloat(*d)) return ctx.invalid("output_dtype must be a float type");
      outType = *d;
    }
  }
  const ir::AttrMap f32{{"to", std::string("f32")}};
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * y, ctx.emit(OpKind::kCast, {x}, f32));
  if (ctx.hasInput(2)) {
    KILN_ASSIGN_OR_RETURN(ir::TensorType zt, ctx.inputType(2));
    if (zt.dtype != xt.dtype)
      return ctx.invalid("zero point " + zt.toString() + " must have x's dtype");
    KILN_ASSIGN_OR_RETURN(Value * z, ctx.value(2));
    KILN_ASSIGN_OR_RETURN(z, ctx.emit(OpKind::kCast, {z}, f32));
    KILN_ASSIGN_OR_RETURN(z, quantParam(ctx, z, xt.shape, q.axis, q.block));
    KILN_ASSIGN_OR_RETURN(y, ctx.emit(OpKind::kSub, {y, z}));
  }
  KILN_ASSIGN_OR_RETURN(Value * s, ctx.value(1));
  if (st.dtype != DType::kF32) {
    KILN_ASSIGN_OR_RETURN(s, ctx.emit(OpKind::kCast, {s}, f32));
  }
  KILN_ASSIGN_OR_RETURN(s, quantParam(ctx, s, xt.shape, q.axis, q.block));
  if (outType == DType::kF32) return ctx.emit(OpKind::kMul, {y, s}, {}, 0).status();
  KILN_ASSIGN_OR_RETURN(y, ctx.emit(OpKind::kMul, {y, s}));
  return ctx.emit(OpKind::kCast, {y}, {{"to", std::string(ir::dtypeName(outType))}}, 0).status();
}

// QuantizeLinear: saturate(round_half_even(x / scale) + zero_point) to an integer type (int16,
// uint16, int8, uint8, int4, uint4, int2, uint2); cast(x / scale + zero_point) to an 8- or 4-bit
// float, which rounds to its own precision and saturates as its cast does (the saturate
// attribute).
Status mapQuantize(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  if (!ir::isFloat(xt.dtype)) return ctx.invalid("x must be a float tensor, got " + xt.toString());
  KILN_ASSIGN_OR_RETURN(QuantAttrs q, quantAttrs(ctx));
  DType outType = DType::kU8;
  if (ctx.hasInput(2)) {
    KILN_ASSIGN_OR_RETURN(ir::TensorType zt, ctx.inputType(2));
    outType = zt.dtype;
  } else if (ctx.hasAttr("output_dtype")) {
    KILN_ASSIGN_OR_RETURN(int64_t code, ctx.attrInt("output_dtype"));
    if (code != 0) {
      auto d = dtypeFromOnnx(static_cast<int32_t>(code));
      if (!d) return ctx.unsupported("output_dtype " + onnxTypeName(static_cast<int32_t>(code)));
      outType = *d;
    }
  }
  // The integer range each saturates to (ONNX's list: int32 and the 64-bit types are not
  // quantization types).
  struct Range {
    DType t;
    double lo, hi;
  };
  static constexpr Range kRanges[] = {{DType::kU8, 0, 255},    {DType::kI8, -128, 127},
                                      {DType::kU16, 0, 65535}, {DType::kI16, -32768, 32767},
                                      {DType::kU4, 0, 15},     {DType::kI4, -8, 7},
                                      {DType::kU2, 0, 3},      {DType::kI2, -2, 1}};
  const Range* range = nullptr;
  for (const Range& r : kRanges)
    if (r.t == outType) range = &r;
  const bool toFloat = ir::isNarrowFloat(outType);
  if (!range && !toFloat)
    return ctx.unsupported("QuantizeLinear to " + std::string(ir::dtypeName(outType)) +
                           " (kiln quantizes to int16, uint16, int8, uint8, int4, uint4, int2, "
                           "uint2 and the 8- and 4-bit floats)");
  if (ctx.hasAttr("precision")) {
    KILN_ASSIGN_OR_RETURN(int64_t p, ctx.attrInt("precision"));
    if (p != 0 && p != ::onnx::TensorProto::FLOAT)
      return ctx.unsupported("precision " + onnxTypeName(static_cast<int32_t>(p)) +
                             " (kiln divides in f32)");
  }
  const ir::AttrMap f32{{"to", std::string("f32")}};
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  if (xt.dtype != DType::kF32) {
    KILN_ASSIGN_OR_RETURN(x, ctx.emit(OpKind::kCast, {x}, f32));
  }
  KILN_ASSIGN_OR_RETURN(Value * s, ctx.value(1));
  if (s->type().dtype != DType::kF32) {
    KILN_ASSIGN_OR_RETURN(s, ctx.emit(OpKind::kCast, {s}, f32));
  }
  KILN_ASSIGN_OR_RETURN(s, quantParam(ctx, s, xt.shape, q.axis, q.block));
  KILN_ASSIGN_OR_RETURN(Value * y, ctx.emit(OpKind::kDiv, {x, s}));
  if (!toFloat) {
    KILN_ASSIGN_OR_RETURN(y, ctx.emit(OpKind::kRound, {y}));  // Half to even.
  }
  if (ctx.hasInput(2)) {
    KILN_ASSIGN_OR_RETURN(Value * z, ctx.value(2));
    KILN_ASSIGN_OR_RETURN(z, ctx.emit(OpKind::kCast, {z}, f32));
    KILN_ASSIGN_OR_RETURN(z, quantParam(ctx, z, xt.shape, q.axis, q.block));
    KILN_ASSIGN_OR_RETURN(y, ctx.emit(OpKind::kAdd, {y, z}));
  }
  ir::AttrMap cast{{"to", std::string(ir::dtypeName(outType))}};
  if (toFloat) {
    KILN_ASSIGN_OR_RETURN(bool saturate, ctx.attrBool("saturate", true));
    cast["saturate"] = int64_t{saturate};
  } else {
    KILN_ASSIGN_OR_RETURN(y,
                          ctx.emit(OpKind::kClip, {y}, {{"min", range->lo}, {"max", range->hi}}));
  }
  return ctx.emit(OpKind::kCast, {y}, std::move(cast), 0).status();
}

Status mapBitShift(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::string direction, ctx.attrString("direction"));
  if (direction != "LEFT" && direction != "RIGHT")
    return ctx.invalid("direction must be LEFT or RIGHT, got '" + direction + "'");
  KILN_ASSIGN_OR_RETURN(Value * a, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * b, ctx.value(1));
  return ctx.emit(OpKind::kBitShift, {a, b}, {{"direction", direction}}, 0).status();
}

template <OpKind kOp>
Status mapBitwise(NodeContext& ctx) {
  std::vector<Value*> in;
  for (size_t i = 0; i < ctx.numInputs(); ++i) {
    KILN_ASSIGN_OR_RETURN(Value * v, ctx.value(i));
    in.push_back(v);
  }
  return ctx.emit(kOp, std::move(in), {}, 0).status();
}

}  // namespace

std::vector<MapperEntry> derivedMappers() {
  return {
      {"Hardmax", {1, 11, 13}, mapHardmax},
      {"OneHot", {9, 11, 28}, mapOneHot},
      {"LpNormalization", {1, 22}, mapLpNormalization},
      {"CumSum", {11, 14}, mapCumSum},
      {"CumProd", {26}, mapCumProd},
      {"SpaceToDepth", {1, 13, 28}, mapSpaceToDepth},
      {"DepthToSpace", {1, 11, 13, 28}, mapDepthToSpace},
      {"IsNaN", {9, 13, 20}, mapIsNaN},
      {"IsInf", {10, 20}, mapIsInf},
      {"EyeLike", {9, 22}, mapEyeLike},
      {"HannWindow", {17}, mapWindow<Window::kHann>},
      {"HammingWindow", {17}, mapWindow<Window::kHamming>},
      {"BlackmanWindow", {17}, mapWindow<Window::kBlackman>},
      {"Tile", {6, 13}, mapTile},
      {"Shrink", {9}, mapShrink},
      {"InstanceNormalization", {6, 22}, mapInstanceNorm},
      {"GroupNormalization", {21}, mapGroupNorm},
      {"MeanVarianceNormalization", {9, 13}, mapMeanVarianceNorm},
      {"LRN", {1, 13}, mapLrn},
      {"CenterCropPad", {18}, mapCenterCropPad},
      {"RotaryEmbedding", {23}, mapRotaryEmbedding},
      {"Einsum", {12, 28}, mapEinsum},
      {"ScatterElements", {11, 13, 16, 18}, mapScatter<OpKind::kScatterElements>},
      {"Scatter", {9}, mapScatter<OpKind::kScatterElements>},
      {"ScatterND", {11, 13, 16, 18}, mapScatter<OpKind::kScatterNd>},
      {"TopK", {1, 10, 11, 24}, mapTopK},
      {"BitShift", {11, 28}, mapBitShift},
      {"BitwiseAnd", {18}, mapBitwise<OpKind::kBitwiseAnd>},
      {"BitwiseOr", {18}, mapBitwise<OpKind::kBitwiseOr>},
      {"BitwiseXor", {18}, mapBitwise<OpKind::kBitwiseXor>},
      {"BitwiseNot", {18}, mapBitwise<OpKind::kBitwiseNot>},
      {"DequantizeLinear", {10, 13, 19, 21, 23, 24, 25, 28}, mapDequantize},
      {"QuantizeLinear", {10, 13, 19, 21, 23, 24, 25, 28}, mapQuantize},
  };
}

}  // namespace kiln::frontends::onnx_import
