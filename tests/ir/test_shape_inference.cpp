// Shape and dtype inference for every op in ops.def, from one table of cases: results,
// NumPy broadcasting, layouts, and the errors for bad dtypes, ranks, attributes and arity.
// A test fails when an op has no success case or no error case in the table.
#include <catch2/catch.hpp>
#include <limits>
#include <map>
#include <set>

#include "ir/attr_values.h"
#include "ir/op_table.h"
#include "ir/parser.h"

using namespace kiln;
using namespace kiln::ir;
using Catch::Matchers::Contains;
using namespace kiln::ir::testing;

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
constexpr int64_t kMin = std::numeric_limits<int64_t>::min();

struct InferCase {
  OpKind op;
  std::vector<std::string> inputs;  // Types in text IR syntax, e.g. "f32[1,3]@nhwc".
  AttrMap attrs;
  std::string expect;  // The output type, or "error: <a substring of the message>".
};

// clang-format off
const std::vector<InferCase>& cases() {
  static const std::vector<InferCase> table = {
    // ---- Unary, numeric: any dtype but bool; the type (layout included) passes through.
    {OpKind::kNeg, {"f32[2,3]@nhwc"}, {}, "f32[2,3]@nhwc"},
    {OpKind::kNeg, {"i64[4]"}, {}, "i64[4]"},
    {OpKind::kNeg, {"bool[4]"}, {}, "error: neg: input must be numeric, got bool[4]"},
    {OpKind::kAbs, {"i8[]"}, {}, "i8[]"},
    {OpKind::kAbs, {"bool[]"}, {}, "error: must be numeric"},
    {OpKind::kRelu, {"bf16[0,5]"}, {}, "bf16[0,5]"},
    {OpKind::kRelu, {"bool[1]"}, {}, "error: relu: input must be numeric"},
    {OpKind::kClip, {"i32[3]"}, {{"min", F(0)}, {"max", F(6)}}, "i32[3]"},
    {OpKind::kClip, {"f32[3]"}, {}, "f32[3]"},
    {OpKind::kClip, {"bool[3]"}, {}, "error: must be numeric"},
    {OpKind::kClip, {"f32[3]"}, {{"min", I(0)}}, "error: attribute 'min' of op 'clip' must be float, got int"},
    {OpKind::kDropout, {"f16[2,2]"}, {{"ratio", F(0.1)}}, "f16[2,2]"},
    {OpKind::kRelayout, {"f32[1,3,4,5]"}, {{"from", S("plain")}, {"to", S("nhwc")}}, "f32[1,3,4,5]@nhwc"},
    {OpKind::kRelayout, {"f32[1,3,4,5]@nhwc"}, {{"from", S("nhwc")}, {"to", S("plain")}}, "f32[1,3,4,5]"},
    {OpKind::kRelayout, {"f32[3,4,5]"}, {{"from", S("plain")}, {"to", S("nhwc")}}, "error: nhwc needs a rank-4 tensor"},
    {OpKind::kRelayout, {"f32[1,3,4,5]@nhwc"}, {{"from", S("plain")}, {"to", S("nhwc")}}, "error: but the input is"},
    {OpKind::kRelayout, {"f32[1,3,4,5]"}, {{"from", S("plain")}, {"to", S("nchwc")}}, "error: layouts must be plain, nchw or nhwc"},
    {OpKind::kDropout, {"bool[2,2]"}, {}, "error: must be numeric"},
    // ---- Unary, floating point only.
    {OpKind::kSigmoid, {"f64[3]"}, {}, "f64[3]"},
    {OpKind::kSigmoid, {"i32[3]"}, {}, "error: sigmoid: input must be a floating-point tensor, got i32[3]"},
    {OpKind::kMish, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kFloor, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kFloor, {"i64[3]"}, {}, "error: floor: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kCeil, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kCeil, {"i64[3]"}, {}, "error: ceil: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kRound, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kRound, {"i64[3]"}, {}, "error: round: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kSign, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kSign, {"i64[3]"}, {}, "error: sign: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kErf, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kErf, {"i64[3]"}, {}, "error: erf: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kSin, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kSin, {"i64[3]"}, {}, "error: sin: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kCos, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kCos, {"i64[3]"}, {}, "error: cos: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kTan, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kTan, {"i64[3]"}, {}, "error: tan: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kAsin, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kAsin, {"i64[3]"}, {}, "error: asin: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kAcos, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kAcos, {"i64[3]"}, {}, "error: acos: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kAtan, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kAtan, {"i64[3]"}, {}, "error: atan: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kSinh, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kSinh, {"i64[3]"}, {}, "error: sinh: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kCosh, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kCosh, {"i64[3]"}, {}, "error: cosh: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kAsinh, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kAsinh, {"i64[3]"}, {}, "error: asinh: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kAcosh, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kAcosh, {"i64[3]"}, {}, "error: acosh: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kAtanh, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kAtanh, {"i64[3]"}, {}, "error: atanh: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kSoftplus, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kSoftplus, {"i64[3]"}, {}, "error: softplus: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kElu, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kElu, {"i64[3]"}, {}, "error: elu: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kSelu, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kSelu, {"i64[3]"}, {}, "error: selu: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kCelu, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kCelu, {"i64[3]"}, {}, "error: celu: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kThresholdedRelu, {"f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kThresholdedRelu, {"i64[3]"}, {}, "error: thresholded_relu: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kArgMax, {"f32[2,3,4]"}, {{"axis", int64_t{1}}}, "i64[2,1,4]"},
    {OpKind::kArgMax, {"f32[2,0]"}, {{"axis", int64_t{-1}}}, "error: argmax: axis 1 of f32[2,0] is empty"},
    {OpKind::kArgMin, {"i32[2,3]"}, {{"axis", int64_t{-1}}, {"keepdims", int64_t{0}}}, "i64[2]"},
    {OpKind::kArgMin, {"bool[2]"}, {}, "error: argmin: input must be numeric"},
    {OpKind::kGatherElements, {"f32[3,4]", "i64[2,4]"}, {}, "f32[2,4]"},
    {OpKind::kGatherElements, {"f32[3,4]", "i64[3,5]"}, {}, "error: gather_elements: indices i64[3,5] exceed data f32[3,4] in dim 1"},
    {OpKind::kScatterElements, {"f32[3,4]", "i64[2,4]", "f32[2,4]"}, {{"reduction", std::string("add")}}, "f32[3,4]"},
    {OpKind::kScatterElements, {"f32[3,4]", "i64[2,4]", "f32[2,3]"}, {}, "error: scatter_elements: indices i64[2,4] and updates f32[2,3] must have one shape"},
    {OpKind::kScatterNd, {"f32[4,5,6]", "i64[3,2]", "f32[3,6]"}, {}, "f32[4,5,6]"},
    {OpKind::kScatterNd, {"f32[4,5,6]", "i64[3,2]", "f32[3,5]"}, {}, "error: scatter_nd: updates f32[3,5] must have shape [3,6]"},
    {OpKind::kMod, {"i64[2,3]", "i64[3]"}, {{"fmod", int64_t{0}}}, "i64[2,3]"},
    {OpKind::kMod, {"i64[2]", "i32[2]"}, {}, "error: mod: inputs must have the same dtype"},
    {OpKind::kBitShift, {"u16[2,3]", "u16[3]"}, {{"direction", std::string("LEFT")}}, "u16[2,3]"},
    {OpKind::kBitShift, {"f32[2]", "f32[2]"}, {{"direction", std::string("LEFT")}}, "error: bitshift: inputs must be integers, got f32[2]"},
    {OpKind::kBitwiseAnd, {"i32[4,1]", "i32[3]"}, {}, "i32[4,3]"},
    {OpKind::kBitwiseAnd, {"bool[2]", "bool[2]"}, {}, "error: bitwise_and: inputs must be integers"},
    {OpKind::kBitwiseOr, {"u64[2]", "u64[2]"}, {}, "u64[2]"},
    {OpKind::kBitwiseOr, {"u64[2]", "u32[2]"}, {}, "error: bitwise_or: inputs must have the same dtype"},
    {OpKind::kBitwiseXor, {"i16[2]", "i16[]"}, {}, "i16[2]"},
    {OpKind::kBitwiseXor, {"f64[2]", "f64[2]"}, {}, "error: bitwise_xor: inputs must be integers"},
    {OpKind::kBitwiseNot, {"u8[5]"}, {}, "u8[5]"},
    {OpKind::kBitwiseNot, {"f16[5]"}, {}, "error: bitwise_not: inputs must be integers"},
    {OpKind::kEqual, {"f32[2,3]", "f32[3]"}, {}, "bool[2,3]"},
    {OpKind::kEqual, {"bool[3]", "bool[3]"}, {}, "error: equal: first input must be numeric, got bool[3]"},
    {OpKind::kLess, {"i64[4,1]", "i64[3]"}, {}, "bool[4,3]"},
    {OpKind::kLess, {"f32[3]", "i64[3]"}, {}, "error: less: inputs must have the same dtype, got f32[3] and i64[3] (insert a cast)"},
    {OpKind::kLessEqual, {"f32[2]", "f32[2]"}, {}, "bool[2]"},
    {OpKind::kLessEqual, {"f32[2]", "f32[3]"}, {}, "error: less_equal: "},
    {OpKind::kGreater, {"i32[2]", "i32[]"}, {}, "bool[2]"},
    {OpKind::kGreater, {"bool[2]", "bool[2]"}, {}, "error: greater: "},
    {OpKind::kGreaterEqual, {"f64[1,2]", "f64[2,1]"}, {}, "bool[2,2]"},
    {OpKind::kGreaterEqual, {"f64[2]", "f32[2]"}, {}, "error: greater_equal: "},
    {OpKind::kLogicalAnd, {"bool[2,3]", "bool[3]"}, {}, "bool[2,3]"},
    {OpKind::kLogicalAnd, {"f32[3]", "bool[3]"}, {}, "error: logical_and: inputs must be bool, got f32[3]"},
    {OpKind::kLogicalOr, {"bool[2]", "bool[2]"}, {}, "bool[2]"},
    {OpKind::kLogicalOr, {"bool[2]", "bool[3]"}, {}, "error: logical_or: "},
    {OpKind::kLogicalXor, {"bool[]", "bool[4]"}, {}, "bool[4]"},
    {OpKind::kLogicalXor, {"u8[2]", "bool[2]"}, {}, "error: logical_xor: "},
    {OpKind::kLogicalNot, {"bool[5]"}, {}, "bool[5]"},
    {OpKind::kLogicalNot, {"f32[5]"}, {}, "error: logical_not: inputs must be bool, got f32[5]"},
    {OpKind::kMish, {"i64[3]"}, {}, "error: mish: input must be a floating-point tensor, got i64[3]"},
    {OpKind::kTanh, {"f16[1,2]@nchw"}, {}, "f16[1,2]@nchw"},
    {OpKind::kTanh, {"u8[1]"}, {}, "error: floating-point"},
    {OpKind::kSilu, {"bf16[8]"}, {}, "bf16[8]"},
    {OpKind::kSilu, {"i64[8]"}, {}, "error: floating-point"},
    {OpKind::kExp, {"f32[]"}, {}, "f32[]"},
    {OpKind::kExp, {"bool[]"}, {}, "error: floating-point"},
    {OpKind::kLog, {"f32[2]"}, {}, "f32[2]"},
    {OpKind::kLog, {"i8[2]"}, {}, "error: floating-point"},
    {OpKind::kSqrt, {"f64[2]"}, {}, "f64[2]"},
    {OpKind::kSqrt, {"i32[2]"}, {}, "error: floating-point"},
    {OpKind::kRsqrt, {"f32[2]"}, {}, "f32[2]"},
    {OpKind::kRsqrt, {"i32[2]"}, {}, "error: floating-point"},
    {OpKind::kLeakyRelu, {"f32[4]"}, {{"alpha", F(0.2)}}, "f32[4]"},
    {OpKind::kLeakyRelu, {"i32[4]"}, {}, "error: floating-point"},
    {OpKind::kLeakyRelu, {"f32[4]"}, {{"alpha", S("0.2")}}, "error: attribute 'alpha' of op 'leaky_relu' must be float, got string"},
    {OpKind::kGelu, {"f32[4]"}, {}, "f32[4]"},
    {OpKind::kGelu, {"f32[4]"}, {{"approximate", S("tanh")}}, "f32[4]"},
    {OpKind::kGelu, {"f32[4]"}, {{"approximate", S("erf")}}, "error: gelu: attribute approximate must be \"none\" or \"tanh\", got \"erf\""},
    {OpKind::kGelu, {"i32[4]"}, {}, "error: floating-point"},
    // ---- Cast: the dtype changes, shape and layout stay.
    {OpKind::kCast, {"f32[2,3]@nhwc"}, {{"to", S("i64")}}, "i64[2,3]@nhwc"},
    {OpKind::kCast, {"bool[2]"}, {{"to", S("bf16")}}, "bf16[2]"},
    {OpKind::kCast, {"f32[2]"}, {{"to", S("float")}}, "error: cast: attribute to: unknown dtype 'float'"},
    {OpKind::kCast, {"f32[2]"}, {}, "error: op 'cast' requires attribute 'to' (string)"},
    {OpKind::kDet, {"f32[2,3,3]"}, {}, "f32[2]"},
    {OpKind::kDet, {"f64[4,4]"}, {}, "f64[]"},
    {OpKind::kRoiAlign, {"f32[2,3,8,8]", "f32[5,4]", "i64[5]"}, {{"output_height", I(2)}, {"output_width", I(3)}}, "f32[5,3,2,3]"},
    {OpKind::kRoiAlign, {"f32[2,3,8,8]", "f32[5,5]", "i64[5]"}, {}, "error: roi_align: rois must be [R, 4] of x's dtype, got f32[5,5]"},
    {OpKind::kRoiAlign, {"f32[2,3,8,8]", "f32[5,4]", "i32[5]"}, {}, "error: roi_align: batch_indices must be i64 [R] with R = 5, got i32[5]"},
    {OpKind::kRoiAlign, {"f32[2,3,8,8]", "f32[5,4]", "i64[5]"}, {{"mode", S("min")}}, "error: roi_align: mode must be avg or max, got 'min'"},
    {OpKind::kRoiAlign, {"i32[2,3,8,8]", "i32[5,4]", "i64[5]"}, {}, "error: roi_align: x must be an NCHW f32 or f64 [N, C, H, W] with H, W >= 1, got i32[2,3,8,8]"},
    {OpKind::kRoiAlign, {"f32[2,3,0,8]", "f32[5,4]", "i64[5]"}, {}, "error: roi_align: x must be an NCHW f32 or f64 [N, C, H, W] with H, W >= 1, got f32[2,3,0,8]"},
    {OpKind::kDet, {"f32[2,3]"}, {}, "error: det: input must be square matrices [..., M, M], got f32[2,3]"},
    {OpKind::kDet, {"i32[2,2]"}, {}, "error: det: input must be f32 or f64, got i32[2,2]"},
    {OpKind::kBitcast, {"f32[2,3]"}, {{"to", S("i32")}}, "i32[2,3]"},
    {OpKind::kBitcast, {"bool[4]"}, {{"to", S("u8")}}, "u8[4]"},
    {OpKind::kBitcast, {"f32[2]"}, {{"to", S("i64")}}, "error: bitcast: cannot reinterpret f32[2] as i64: the element sizes must be equal (kiln holds 4- and 2-bit elements one a byte)"},
    {OpKind::kBitcast, {"u8[2]"}, {{"to", S("bool")}}, "error: bitcast: cannot reinterpret u8[2] as bool: bytes other than 0 and 1 are no bools (compare with 0 instead)"},
    {OpKind::kBitcast, {"i4[2]"}, {{"to", S("u4")}}, "error: the element sizes must be equal"},
    {OpKind::kCast, {"f32[2]"}, {{"to", I(1)}}, "error: attribute 'to' of op 'cast' must be string, got int"},
    // ---- Binary with NumPy broadcasting.
    {OpKind::kAdd, {"f32[2,3]", "f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kAdd, {"f32[3,1]", "f32[1,4]"}, {}, "f32[3,4]"},
    {OpKind::kAdd, {"f32[]", "f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kAdd, {"f32[5,1,4]", "f32[3,1]"}, {}, "f32[5,3,4]"},
    {OpKind::kAdd, {"f32[0,3]", "f32[1,3]"}, {}, "f32[0,3]"},
    {OpKind::kAdd, {"f32[1,8,4,4]@nhwc", "f32[1,8,4,4]@nhwc"}, {}, "f32[1,8,4,4]@nhwc"},
    {OpKind::kAdd, {"f32[1,8,4,4]@nhwc", "f32[1,8,4,4]"}, {}, "f32[1,8,4,4]"},
    {OpKind::kAdd, {"f32[1,8,1,1]@nhwc", "f32[1,8,4,4]@nhwc"}, {}, "f32[1,8,4,4]"},
    {OpKind::kAdd, {"f32[2,3]", "f32[3,2]"}, {}, "error: add: shapes [2,3] and [3,2] do not broadcast (dimension 0: 2 vs 3)"},
    {OpKind::kAdd, {"f32[0]", "f32[2]"}, {}, "error: shapes [0] and [2] do not broadcast"},
    {OpKind::kAdd, {"f32[2]", "f16[2]"}, {}, "error: add: inputs must have the same dtype, got f32[2] and f16[2] (insert a cast)"},
    {OpKind::kAdd, {"bool[2]", "bool[2]"}, {}, "error: first input must be numeric"},
    {OpKind::kSub, {"i64[4,1]", "i64[3]"}, {}, "i64[4,3]"},
    {OpKind::kSub, {"i64[4]", "i32[4]"}, {}, "error: same dtype"},
    {OpKind::kMul, {"f16[2,1,3]", "f16[4,1]"}, {}, "f16[2,4,3]"},
    {OpKind::kMul, {"f16[2,2]", "f16[3]"}, {}, "error: do not broadcast"},
    {OpKind::kDiv, {"i32[6]", "i32[]"}, {}, "i32[6]"},
    {OpKind::kDiv, {"u8[2]", "i8[2]"}, {}, "error: same dtype"},
    {OpKind::kMaximum, {"f32[1]", "f32[7]"}, {}, "f32[7]"},
    {OpKind::kMaximum, {"bool[1]", "bool[1]"}, {}, "error: must be numeric"},
    {OpKind::kMinimum, {"i8[2,1]", "i8[1,2]"}, {}, "i8[2,2]"},
    {OpKind::kMinimum, {"i8[2,3]", "i8[2]"}, {}, "error: do not broadcast"},
    {OpKind::kPow, {"f32[2,3]", "f32[]"}, {}, "f32[2,3]"},
    {OpKind::kPow, {"i32[2]", "i32[2]"}, {}, "error: pow: first input must be a floating-point tensor"},
    {OpKind::kWhere, {"bool[3,1]", "f32[4]", "f32[]"}, {}, "f32[3,4]"},
    {OpKind::kWhere, {"bool[2,1,1]", "i64[3,1]", "i64[1,5]"}, {}, "i64[2,3,5]"},
    {OpKind::kWhere, {"bool[2,2]@nhwc", "f32[2,2]@nhwc", "f32[2,2]@nhwc"}, {}, "f32[2,2]"},
    {OpKind::kWhere, {"f32[3]", "f32[3]", "f32[3]"}, {}, "error: where: condition must be bool, got f32[3]"},
    {OpKind::kWhere, {"bool[3]", "f32[3]", "i32[3]"}, {}, "error: same dtype"},
    {OpKind::kWhere, {"bool[2]", "f32[3]", "f32[3]"}, {}, "error: shapes [2] and [3] do not broadcast"},
    {OpKind::kReluBackward, {"f32[2,3]", "f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kReluBackward, {"i64[2]", "i64[2]"}, {}, "error: floating-point"},
    // ---- MatMul (NumPy rules), Gemm, Linear.
    {OpKind::kMatMul, {"f32[2,3]", "f32[3,4]"}, {}, "f32[2,4]"},
    {OpKind::kMatMul, {"f32[3]", "f32[3]"}, {}, "f32[]"},
    {OpKind::kMatMul, {"f32[3]", "f32[3,4]"}, {}, "f32[4]"},
    {OpKind::kMatMul, {"f32[2,3]", "f32[3]"}, {}, "f32[2]"},
    {OpKind::kMatMul, {"f32[5,1,2,3]", "f32[4,3,6]"}, {}, "f32[5,4,2,6]"},
    {OpKind::kMatMul, {"f32[3]", "f32[7,3,6]"}, {}, "f32[7,6]"},
    {OpKind::kMatMul, {"i64[2,3]@nhwc", "i64[3,2]"}, {}, "i64[2,2]"},
    {OpKind::kMatMul, {"f32[2,3]", "f32[4,5]"}, {}, "error: matmul: inner dimensions differ: A [2,3] x B [4,5] (3 vs 4)"},
    {OpKind::kMatMul, {"f32[]", "f32[3]"}, {}, "error: matmul operands must have rank >= 1"},
    {OpKind::kMatMul, {"f32[2,2,3]", "f32[3,3,4]"}, {}, "error: shapes [2] and [3] do not broadcast"},
    {OpKind::kMatMul, {"f32[2,3]", "f64[3,4]"}, {}, "error: B must have dtype f32, got f64[3,4]"},
    {OpKind::kMatMul, {"bool[2,3]", "bool[3,4]"}, {}, "error: A must be numeric"},
    {OpKind::kGemm, {"f32[2,3]", "f32[3,4]"}, {}, "f32[2,4]"},
    {OpKind::kGemm, {"f32[3,2]", "f32[4,3]"}, {{"transA", I(1)}, {"transB", I(1)}}, "f32[2,4]"},
    {OpKind::kGemm, {"f32[2,3]", "f32[3,4]", "f32[4]"}, {{"alpha", F(0.5)}, {"beta", F(2)}}, "f32[2,4]"},
    {OpKind::kGemm, {"f32[2,3]", "f32[3,4]", "f32[2,1]"}, {}, "f32[2,4]"},
    {OpKind::kGemm, {"f32[2,3]", "f32[3,4]", "f32[3]"}, {}, "error: shapes [3] and [2,4] do not broadcast"},
    {OpKind::kGemm, {"f32[2,3]", "f32[3,4]", "f32[1,2,4]"}, {}, "error: gemm: C [1,2,4] does not broadcast to [2,4]"},
    {OpKind::kGemm, {"f32[2,3]", "f32[4,3]"}, {}, "error: gemm: inner dimensions differ: op(A) is [2,3], op(B) is [4,3]"},
    {OpKind::kGemm, {"f32[1,2,3]", "f32[3,4]"}, {}, "error: A must have rank 2, got f32[1,2,3]"},
    {OpKind::kGemm, {"i32[2,3]", "i32[3,4]"}, {}, "error: A must be a floating-point tensor"},
    {OpKind::kGemm, {"f32[2,3]", "f32[3,4]", "f16[4]"}, {}, "error: C must have dtype f32"},
    {OpKind::kGemm, {"f32[2,3]", "f32[3,4]"}, {{"transA", F(1)}}, "error: attribute 'transA' of op 'gemm' must be int, got float"},
    {OpKind::kLinear, {"f32[2,3]", "f32[4,3]"}, {}, "f32[2,4]"},
    {OpKind::kLinear, {"f32[5,2,3]", "f32[4,3]", "f32[4]"}, {}, "f32[5,2,4]"},
    {OpKind::kLinear, {"f32[3]", "f32[4,3]"}, {}, "f32[4]"},
    {OpKind::kLinear, {"f32[2,3]@nhwc", "f32[4,3]"}, {}, "f32[2,4]"},
    {OpKind::kLinear, {"f32[2,3]", "f32[3,4]"}, {}, "error: linear: weight must have shape [out,3], got [3,4]"},
    {OpKind::kLinear, {"f32[2,3]", "f32[4,3]", "f32[3]"}, {}, "error: bias must have shape [4], got [3]"},
    {OpKind::kLinear, {"f32[]", "f32[4,3]"}, {}, "error: input must have rank >= 1"},
    {OpKind::kLinear, {"f32[2,3]", "f32[4,3,1]"}, {}, "error: weight must have rank 2"},
    {OpKind::kLinear, {"i64[2,3]", "i64[4,3]"}, {}, "error: floating-point"},
    {OpKind::kLinear, {"f32[2,3]", "f32[4,3]", "f64[4]"}, {}, "error: bias must have dtype f32"},
    // ---- Convolution and pooling.
    {OpKind::kConv2d, {"f32[1,3,224,224]", "f32[64,3,7,7]"}, {{"strides", Is({2, 2})}, {"pads", Is({3, 3, 3, 3})}}, "f32[1,64,112,112]"},
    {OpKind::kConv2d, {"f32[2,8,10,12]", "f32[16,8,3,3]", "f32[16]"}, {}, "f32[2,16,8,10]"},
    {OpKind::kConv2d, {"f32[1,4,9,9]", "f32[8,2,3,3]"}, {{"group", I(2)}, {"dilations", Is({2, 2})}}, "f32[1,8,5,5]"},
    {OpKind::kConv2d, {"f32[1,4,5,5]", "f32[4,1,3,3]"}, {{"group", I(4)}, {"pads", Is({1, 0, 1, 2})}}, "f32[1,4,5,5]"},
    {OpKind::kConv2d, {"f32[1,3,8,8]@nhwc", "f32[6,3,1,1]"}, {}, "f32[1,6,8,8]@nhwc"},
    {OpKind::kConv2d, {"f32[1,4,8,8]", "f32[6,2,3,3]"}, {{"group", I(3)}}, "error: conv2d: group 3 must divide input channels 4 and output channels 6"},
    {OpKind::kConv2d, {"f32[1,4,8,8]", "f32[6,3,3,3]"}, {}, "error: weight [6,3,3,3] expects 3 input channels (group 1), input [1,4,8,8] has 4"},
    {OpKind::kConv2d, {"f32[1,3,8,8]", "f32[6,3,3,3]", "f32[3]"}, {}, "error: bias must have shape [6], got [3]"},
    {OpKind::kConv2d, {"f32[1,3,8,8]", "f32[6,3,3,3]"}, {{"pads", Is({1, 1, 1})}}, "error: attribute pads must have 4 values, got 3"},
    {OpKind::kConv2d, {"f32[1,3,8,8]", "f32[6,3,3,3]"}, {{"strides", Is({1})}}, "error: attribute strides must have 2 values, got 1"},
    {OpKind::kConv2d, {"f32[1,3,8,8]", "f32[6,3,3,3]"}, {{"dilations", Is({1, 1, 1})}}, "error: attribute dilations must have 2 values, got 3"},
    {OpKind::kConv2d, {"f32[1,3,2,8]", "f32[6,3,3,3]"}, {}, "error: height: window of 3 does not fit input of 2 with pads 0+0"},
    {OpKind::kConv2d, {"f32[1,3,8,8]", "f32[6,3,3,3]"}, {{"strides", Is({1, 0})}}, "error: width: kernel, stride and dilation must be >= 1 and pads >= 0"},
    {OpKind::kConv2d, {"f32[1,3,8,8]", "f32[6,3,3,3]"}, {{"pads", Is({0, -1, 0, 0})}}, "error: pads >= 0"},
    {OpKind::kConv2d, {"f32[1,3,8,8]", "f32[6,3,3,3]"}, {{"dilations", Is({kMax, 1})}}, "error: height: kernel 3, stride 1, pads 0+0 and dilation 9223372036854775807 are too large"},
    {OpKind::kConv2d, {"f32[1,3,8,8]", "f32[6,3,3,3]"}, {{"pads", Is({kMax, 0, kMax, 0})}}, "error: are too large for input of 8"},
    {OpKind::kConv2d, {"f32[1,3,8,8]", "f32[6,3,3,3]"}, {{"strides", Is({kMax, kMax})}}, "f32[1,6,1,1]"},
    {OpKind::kConv2d, {"f32[1,0,8,8]", "f32[0,2,3,3]"}, {{"group", I(kMax)}}, "error: expects more input channels than int64 holds"},
    {OpKind::kConv2d, {"f32[3,8,8]", "f32[6,3,3,3]"}, {}, "error: input [N,C,H,W] must have rank 4, got f32[3,8,8]"},
    {OpKind::kConv2d, {"f32[1,3,8,8]", "f32[6,3,3]"}, {}, "error: weight [M,C/group,kh,kw] must have rank 4"},
    {OpKind::kConv2d, {"i8[1,3,8,8]", "i8[6,3,3,3]"}, {}, "error: floating-point"},
    {OpKind::kConv2d, {"f32[1,3,8,8]", "f16[6,3,3,3]"}, {}, "error: weight must have dtype f32"},
    {OpKind::kConv2d, {"f32[1,3,8,8]", "f32[6,3,3,3]"}, {{"group", Is({1})}}, "error: attribute 'group' of op 'conv2d' must be int, got ints"},
    {OpKind::kMaxPool2d, {"f32[1,3,8,8]"}, {{"kernel", Is({2, 2})}, {"strides", Is({2, 2})}}, "f32[1,3,4,4]"},
    {OpKind::kMaxPool2d, {"f32[1,3,112,112]@nhwc"}, {{"kernel", Is({3, 3})}, {"strides", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}}, "f32[1,3,56,56]@nhwc"},
    {OpKind::kMaxPool2d, {"f32[1,1,5,5]"}, {{"kernel", Is({2, 2})}, {"strides", Is({2, 2})}, {"ceil_mode", I(1)}}, "f32[1,1,3,3]"},
    {OpKind::kMaxPool2d, {"f32[1,1,5,5]"}, {{"kernel", Is({2, 2})}, {"strides", Is({2, 2})}}, "f32[1,1,2,2]"},
    // ceil_mode: a last window that would start in the right padding is dropped (PyTorch).
    {OpKind::kMaxPool2d, {"f32[1,1,5,5]"}, {{"kernel", Is({2, 2})}, {"strides", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}, {"ceil_mode", I(1)}}, "f32[1,1,3,3]"},
    {OpKind::kMaxPool2d, {"f32[1,1,5,5]"}, {{"kernel", Is({2, 2})}, {"strides", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}}, "f32[1,1,3,3]"},
    {OpKind::kMaxPool2d, {"f32[1,1,6,6]"}, {{"kernel", Is({2, 2})}, {"strides", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}, {"ceil_mode", I(1)}}, "f32[1,1,4,4]"},
    {OpKind::kMaxPool2d, {"f32[1,1,7,7]"}, {{"kernel", Is({3, 3})}, {"dilations", Is({2, 2})}, {"pads", Is({2, 2, 2, 2})}}, "f32[1,1,7,7]"},
    {OpKind::kMaxPool2d, {"f32[1,1,8,8]"}, {{"kernel", Is({2, 2})}, {"strides", Is({kMax, kMax})}, {"ceil_mode", I(1)}}, "f32[1,1,1,1]"},
    {OpKind::kMaxPool2d, {"f32[1,3,8,8]"}, {{"kernel", Is({3, 3})}, {"pads", Is({2, 0, 0, 0})}}, "error: max_pool2d: pads [2,0,0,0] must be at most half the window (kernel [3,3], dilations [1,1])"},
    // A 1-wide dilated window with padding would lie wholly in the padding.
    {OpKind::kMaxPool2d, {"f32[1,3,8,8]"}, {{"kernel", Is({1, 1})}, {"dilations", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}}, "error: must be at most half the window"},
    {OpKind::kMaxPool2d, {"f32[1,3,8,8]"}, {{"kernel", Is({3, 3})}, {"dilations", Is({2, 2})}, {"pads", Is({0, 0, 0, 3})}}, "error: must be at most half the window"},
    {OpKind::kMaxPool2d, {"f32[1,3,8,8]"}, {{"kernel", Is({0, 2})}}, "error: kernel [0,2] and dilations [1,1] must be >= 1"},
    {OpKind::kMaxPool2d, {"f32[1,3,8,8]"}, {{"kernel", Is({3, 3})}, {"dilations", Is({kMax, 1})}}, "error: must be >= 1 and not overflow"},
    {OpKind::kMaxPool2d, {"f32[1,3,8,8]"}, {{"kernel", Is({2, 2})}, {"dilations", Is({kMax, 1})}}, "error: height: kernel 2, stride 1, pads 0+0 and dilation 9223372036854775807 are too large"},
    {OpKind::kMaxPool2d, {"f32[1,3,8,8]"}, {{"kernel", Is({9, 2})}}, "error: height: window of 9 does not fit input of 8"},
    {OpKind::kMaxPool2d, {"f32[1,3,8,8]"}, {{"kernel", Is({2})}}, "error: attribute kernel must have 2 values, got 1"},
    {OpKind::kMaxPool2d, {"f32[1,3,8,8]"}, {}, "error: op 'max_pool2d' requires attribute 'kernel' (ints)"},
    {OpKind::kMaxPool2d, {"f32[3,8,8]"}, {{"kernel", Is({2, 2})}}, "error: input [N,C,H,W] must have rank 4"},
    {OpKind::kMaxPool2d, {"i32[1,3,8,8]"}, {{"kernel", Is({2, 2})}}, "error: floating-point"},
    {OpKind::kAvgPool2d, {"f32[2,4,6,6]"}, {{"kernel", Is({3, 3})}, {"strides", Is({3, 3})}, {"count_include_pad", I(1)}}, "f32[2,4,2,2]"},
    {OpKind::kAvgPool2d, {"f32[2,4,6,6]"}, {{"kernel", Is({3, 3})}, {"pads", Is({1, 1, 1, 1})}}, "f32[2,4,6,6]"},
    {OpKind::kAvgPool2d, {"f32[2,4,6,6]"}, {{"kernel", Is({2, 2})}, {"pads", Is({1, 1, 2, 1})}}, "error: must be at most half the window"},
    {OpKind::kAvgPool2d, {"f32[2,4,6,6]"}, {{"kernel", Is({2, 2})}, {"dilations", Is({1, 1})}}, "error: op 'avg_pool2d' has no attribute 'dilations' (it takes: kernel, strides, pads, ceil_mode, count_include_pad)"},
    {OpKind::kGlobalAvgPool, {"f32[2,3,7,7]"}, {}, "f32[2,3,1,1]"},
    {OpKind::kGlobalAvgPool, {"f16[1,8,1,5]@nhwc"}, {}, "f16[1,8,1,1]@nhwc"},
    {OpKind::kGlobalAvgPool, {"f32[2,3,7]"}, {}, "error: global_avg_pool: input [N,C,H,W] must have rank 4"},
    {OpKind::kGlobalAvgPool, {"i32[2,3,7,7]"}, {}, "error: floating-point"},
    // ---- Normalization and softmax.
    {OpKind::kBatchNorm, {"f32[2,3,4,4]", "f32[3]", "f32[3]", "f32[3]", "f32[3]"}, {{"epsilon", F(1e-3)}}, "f32[2,3,4,4]"},
    {OpKind::kBatchNorm, {"f32[2,3]@nhwc", "f32[3]", "f32[3]", "f32[3]", "f32[3]"}, {}, "f32[2,3]@nhwc"},
    {OpKind::kBatchNorm, {"f32[2,3,4,4]", "f32[3]", "f32[3]", "f32[4]", "f32[3]"}, {}, "error: batch_norm: mean must have shape [3], got [4]"},
    {OpKind::kBatchNorm, {"f32[2,3,4,4]", "f32[3]", "f32[3]", "f32[3]", "f64[3]"}, {}, "error: var must have dtype f32, got f64[3]"},
    {OpKind::kBatchNorm, {"f32[3]", "f32[3]", "f32[3]", "f32[3]", "f32[3]"}, {}, "error: input must have rank >= 2, got f32[3]"},
    {OpKind::kBatchNorm, {"i32[2,3]", "i32[3]", "i32[3]", "i32[3]", "i32[3]"}, {}, "error: floating-point"},
    {OpKind::kBatchNorm, {"f32[2,3,4,4]", "f32[3]", "f32[3]", "f32[3]"}, {}, "error: op 'batch_norm' takes 5 inputs, got 4"},
    {OpKind::kLayerNorm, {"f32[2,5,8]", "f32[8]", "f32[8]"}, {}, "f32[2,5,8]"},
    {OpKind::kAttention, {"f32[2,3,5,8]", "f32[2,3,8,7]", "f32[2,3,7,4]"}, {}, "f32[2,3,5,4]"},
    {OpKind::kAttention, {"f32[5,8]", "f32[8,7]", "f32[7,4]", "f32[7]"}, {{"scale", F(0.5)}}, "f32[5,4]"},
    {OpKind::kAttention, {"f32[2,5,8]", "f32[2,8,7]", "f32[2,7,4]", "f32[2,5,7]"}, {}, "f32[2,5,4]"},
    {OpKind::kAttention, {"f32[2,5,8]", "f32[3,8,7]", "f32[2,7,4]"}, {}, "error: must share their batch dims"},
    {OpKind::kAttention, {"f32[2,5,8]", "f32[2,7,8]", "f32[2,7,4]"}, {}, "error: expected kt [..., 8, T]"},
    {OpKind::kAttention, {"f32[2,5,8]", "f32[2,8,7]", "f32[2,7,4]", "f32[3,5,7]"}, {}, "error: mask [3,5,7] does not broadcast"},
    {OpKind::kAttention, {"f32[5]", "f32[5,7]", "f32[7,4]"}, {}, "error: q must have rank >= 2"},
    {OpKind::kAttention, {"f32[2,5,8]", "f64[2,8,7]", "f32[2,7,4]"}, {}, "error: kt must have dtype f32"},
    {OpKind::kLayerNorm, {"f32[2,5,8]", "f32[5,8]"}, {{"axis", I(1)}}, "f32[2,5,8]"},
    {OpKind::kLayerNorm, {"f32[2,5,8]"}, {{"axis", I(0)}, {"epsilon", F(1e-6)}}, "f32[2,5,8]"},
    {OpKind::kLayerNorm, {"f32[2,5,8]", "f32[5]"}, {}, "error: layer_norm: scale must have shape [8], got [5]"},
    {OpKind::kLayerNorm, {"f32[2,5,8]", "f32[8]", "f32[5,8]"}, {}, "error: bias must have shape [8], got [5,8]"},
    {OpKind::kLayerNorm, {"f32[2,5,8]"}, {{"axis", I(3)}}, "error: axis: axis 3 is out of range for rank 3 (expected -3..2)"},
    {OpKind::kLayerNorm, {"f32[2,5,8]", "f16[8]"}, {}, "error: scale must have dtype f32"},
    {OpKind::kLayerNorm, {"i64[2,5,8]"}, {}, "error: floating-point"},
    {OpKind::kSoftmax, {"f32[2,10]"}, {}, "f32[2,10]"},
    {OpKind::kSoftmax, {"f32[2,10]"}, {{"axis", I(-2)}}, "f32[2,10]"},
    {OpKind::kSoftmax, {"f32[2,10]"}, {{"axis", I(2)}}, "error: softmax: axis: axis 2 is out of range for rank 2"},
    {OpKind::kSoftmax, {"f32[]"}, {}, "error: axis -1 is out of range for rank 0"},
    {OpKind::kSoftmax, {"i32[2,10]"}, {}, "error: floating-point"},
    {OpKind::kLogSoftmax, {"f64[3,4,5]"}, {{"axis", I(1)}}, "f64[3,4,5]"},
    {OpKind::kLogSoftmax, {"f64[3,4,5]"}, {{"axis", I(-4)}}, "error: axis -4 is out of range"},
    {OpKind::kLogSoftmax, {"u8[3]"}, {}, "error: floating-point"},
    // ---- Reductions.
    {OpKind::kReduceSum, {"f32[2,3,4]"}, {{"axes", Is({1})}}, "f32[2,1,4]"},
    {OpKind::kReduceSum, {"f32[2,3,4]"}, {{"axes", Is({-1, 0})}, {"keepdims", I(0)}}, "f32[3]"},
    {OpKind::kReduceSum, {"i64[2,3,4]"}, {}, "i64[1,1,1]"},
    {OpKind::kReduceSum, {"f32[2,3,4]@nhwc"}, {{"axes", Is({})}, {"keepdims", I(0)}}, "f32[]"},
    {OpKind::kReduceSum, {"f32[2,3,4]"}, {{"axes", Is({1, -2})}}, "error: reduce_sum: attribute axes [1,-2] repeats an axis"},
    {OpKind::kReduceSum, {"f32[2,3,4]"}, {{"axes", Is({3})}}, "error: axes: axis 3 is out of range for rank 3"},
    {OpKind::kReduceSum, {"bool[2]"}, {}, "error: input must be numeric"},
    {OpKind::kReduceMean, {"f32[8,16,7,7]"}, {{"axes", Is({2, 3})}}, "f32[8,16,1,1]"},
    {OpKind::kReduceMean, {"f32[8,16]"}, {{"axes", I(1)}}, "error: attribute 'axes' of op 'reduce_mean' must be ints, got int"},
    {OpKind::kReduceMax, {"i32[5,6]"}, {{"axes", Is({0})}, {"keepdims", I(0)}}, "i32[6]"},
    {OpKind::kReduceMax, {"bool[5,6]"}, {}, "error: must be numeric"},
    {OpKind::kReduceProd, {"i64[5,6]"}, {{"axes", Is({1})}}, "i64[5,1]"},
    {OpKind::kReduceProd, {"bool[5,6]"}, {}, "error: must be numeric"},
    {OpKind::kTopKIndices, {"f32[3,5]"}, {{"k", I(2)}}, "i64[3,2]"},
    {OpKind::kTopKIndices, {"f32[3,5]"}, {{"k", I(6)}, {"axis", I(1)}}, "error: topk_indices: k = 6 must be 0 to the size of axis 1 of f32[3,5]"},
    {OpKind::kNonMaxSuppression, {"f32[2,6,4]", "f32[2,3,6]", "i64[1]", "f32[]"}, {{"count", I(5)}, {"has_max_output", I(1)}, {"has_iou_threshold", I(1)}}, "i64[5,3]"},
    {OpKind::kNonMaxSuppression, {"f32[2,6,4]", "f32[2,3,5]"}, {{"count", I(0)}}, "error: non_max_suppression: scores must be f32 [B, C, N] = [2, C, 6], got f32[2,3,5]"},
    {OpKind::kNonMaxSuppression, {"f32[1,2,4]", "f32[1,1,2]", "i64[2]"}, {{"count", I(1)}, {"has_max_output", I(1)}}, "error: non_max_suppression: max_output must be one i64 value, got i64[2]"},
    {OpKind::kNonMaxSuppression, {"f32[1,2,4]", "f32[1,1,2]"}, {{"count", I(3)}}, "error: non_max_suppression: count = 3 must be 0 to the 2 (batch, class, box) triples"},
    {OpKind::kNonZero, {"f32[3,5]"}, {{"count", I(4)}}, "i64[2,4]"},
    {OpKind::kNonZero, {"bool[]"}, {{"count", I(1)}}, "i64[1,1]"},
    {OpKind::kNonZero, {"f32[3,5]"}, {{"count", I(16)}}, "error: nonzero: count = 16 must be 0 to the 15 elements of f32[3,5]"},
    {OpKind::kNonZero, {"f8e4m3fn[3]"}, {{"count", I(1)}}, "error: nonzero: x must be a float, integer or bool tensor (not an 8-, 4- or 2-bit one), got f8e4m3fn[3]"},
    {OpKind::kUniqueIndices, {"f32[3,5]"}, {{"count", I(4)}}, "i64[4]"},
    {OpKind::kUniqueIndices, {"bf16[3,5]"}, {{"count", I(2)}, {"axis", I(1)}, {"has_axis", I(1)}}, "i64[2]"},
    {OpKind::kUniqueIndices, {"f32[0]"}, {{"count", I(0)}}, "i64[0]"},
    {OpKind::kUniqueIndices, {"f32[3,5]"}, {{"count", I(0)}}, "error: unique_indices: count = 0 must be 1 to the 15 elements of f32[3,5]"},
    {OpKind::kUniqueIndices, {"f32[3,5]"}, {{"count", I(4)}, {"axis", I(0)}, {"has_axis", I(1)}}, "error: unique_indices: count = 4 must be 1 to the 3 slices of f32[3,5]"},
    {OpKind::kUniqueIndices, {"f32[3,5]"}, {{"count", I(1)}, {"axis", I(2)}, {"has_axis", I(1)}}, "error: unique_indices: axis = 2 must be a dim of f32[3,5] (0 to rank - 1)"},
    {OpKind::kUniqueInverse, {"i64[3,5]"}, {{"axis", I(1)}, {"has_axis", I(1)}}, "i64[5]"},
    {OpKind::kUniqueInverse, {"bool[]"}, {}, "i64[1]"},
    {OpKind::kUniqueInverse, {"f32[3]"}, {{"sorted", I(2)}}, "error: unique_inverse: sorted must be 0 or 1, got 2"},
    // ---- Movement.
    {OpKind::kReshape, {"f32[2,3,4]"}, {{"shape", Is({4, -1})}}, "f32[4,6]"},
    {OpKind::kReshape, {"f32[2,3,4]@nhwc"}, {{"shape", Is({0, 12})}}, "f32[2,12]"},
    {OpKind::kReshape, {"f32[2,3,4]"}, {{"shape", Is({-1})}}, "f32[24]"},
    {OpKind::kReshape, {"f32[1]"}, {{"shape", Is({})}}, "f32[]"},
    {OpKind::kReshape, {"f32[0,3]"}, {{"shape", Is({3, 0})}, {"allowzero", I(1)}}, "f32[3,0]"},
    {OpKind::kReshape, {"f32[2,3,4]"}, {{"shape", Is({0, 0, 0, 0})}}, "error: reshape: shape [0,0,0,0]: 0 at position 3 copies a dim the input [2,3,4] does not have"},
    {OpKind::kReshape, {"f32[2,3,4]"}, {{"shape", Is({-1, -1})}}, "error: shape may contain at most one -1"},
    {OpKind::kReshape, {"f32[2,3,4]"}, {{"shape", Is({5, -1})}}, "error: cannot reshape [2,3,4] (24 elements) into [5,-1]"},
    {OpKind::kReshape, {"f32[2,3,4]"}, {{"shape", Is({5, 5})}}, "error: cannot reshape [2,3,4] (24 elements) into [5,5] (25 elements)"},
    {OpKind::kReshape, {"f32[2,3,4]"}, {{"shape", Is({-2, 12})}}, "error: shape [-2,12] has a negative dim"},
    {OpKind::kReshape, {"f32[2,3,4]"}, {{"shape", Is({kMax, kMax, -1})}}, "error: cannot reshape [2,3,4] into [9223372036854775807,9223372036854775807,-1] (the element count overflows)"},
    {OpKind::kReshape, {"f32[2,3,4]"}, {}, "error: op 'reshape' requires attribute 'shape' (ints)"},
    {OpKind::kFlatten, {"f32[2,3,4]"}, {}, "f32[2,12]"},
    {OpKind::kFlatten, {"f32[2,3,4]"}, {{"axis", I(0)}}, "f32[1,24]"},
    {OpKind::kFlatten, {"f32[2,3,4]"}, {{"axis", I(-1)}}, "f32[6,4]"},
    {OpKind::kFlatten, {"f32[2,3,4]@nchw"}, {{"axis", I(3)}}, "f32[24,1]"},
    {OpKind::kFlatten, {"f32[]"}, {{"axis", I(0)}}, "f32[1,1]"},
    {OpKind::kFlatten, {"f32[2,3,4]"}, {{"axis", I(4)}}, "error: flatten: axis 4 out of range for rank 3"},
    {OpKind::kFlatten, {"f32[2,3,4]"}, {{"axis", I(-4)}}, "error: axis -4 out of range"},
    {OpKind::kTranspose, {"f32[2,3,4]"}, {}, "f32[4,3,2]"},
    {OpKind::kTranspose, {"f32[2,3,4]@nhwc"}, {{"perm", Is({0, 2, 1})}}, "f32[2,4,3]"},
    {OpKind::kTranspose, {"f32[]"}, {}, "f32[]"},
    {OpKind::kTranspose, {"f32[2,3,4]"}, {{"perm", Is({0, 1})}}, "error: transpose: perm [0,1] must have 3 entries for input [2,3,4]"},
    {OpKind::kTranspose, {"f32[2,3,4]"}, {{"perm", Is({0, 1, 1})}}, "error: perm [0,1,1] is not a permutation of 0..2"},
    {OpKind::kTranspose, {"f32[2,3,4]"}, {{"perm", Is({0, 1, 3})}}, "error: is not a permutation"},
    {OpKind::kTranspose, {"f32[2,3,4]"}, {{"perm", Is({0, -1, 1})}}, "error: is not a permutation"},
    {OpKind::kConcat, {"f32[2,3]", "f32[2,5]"}, {{"axis", I(1)}}, "f32[2,8]"},
    {OpKind::kConcat, {"f32[2,3]", "f32[4,3]", "f32[0,3]"}, {{"axis", I(-2)}}, "f32[6,3]"},
    {OpKind::kConcat, {"i64[7]@nhwc"}, {{"axis", I(0)}}, "i64[7]"},
    {OpKind::kConcat, {"f32[2,3]", "f16[2,3]"}, {{"axis", I(0)}}, "error: concat: input 1 is f16[2,3], expected dtype and rank of f32[2,3]"},
    {OpKind::kConcat, {"f32[2,3]", "f32[2,3,1]"}, {{"axis", I(0)}}, "error: expected dtype and rank of f32[2,3]"},
    {OpKind::kConcat, {"f32[2,3]", "f32[3,3]"}, {{"axis", I(1)}}, "error: input 1 f32[3,3] differs from f32[2,3] outside axis 1"},
    {OpKind::kConcat, {"f32[2,3]"}, {{"axis", I(2)}}, "error: axis 2 is out of range for rank 2"},
    {OpKind::kConcat, {"f32[2,3]", "f32[2,3]"}, {}, "error: op 'concat' requires attribute 'axis' (int)"},
    {OpKind::kConcat, {}, {{"axis", I(0)}}, "error: op 'concat' takes at least 1 inputs, got 0"},
    {OpKind::kSlice, {"f32[10,8]"}, {{"starts", Is({2})}, {"ends", Is({7})}}, "f32[5,8]"},
    {OpKind::kSlice, {"f32[10,8]"}, {{"starts", Is({1})}, {"ends", Is({kMax})}, {"axes", Is({-1})}, {"steps", Is({3})}}, "f32[10,3]"},
    {OpKind::kSlice, {"f32[10,8]"}, {{"starts", Is({-3, 0})}, {"ends", Is({-1, 100})}}, "f32[2,8]"},
    {OpKind::kSlice, {"f32[10]"}, {{"starts", Is({-1})}, {"ends", Is({kMin})}, {"steps", Is({-1})}}, "f32[10]"},
    {OpKind::kSlice, {"f32[10]"}, {{"starts", Is({8})}, {"ends", Is({1})}, {"steps", Is({-3})}}, "f32[3]"},
    {OpKind::kSlice, {"f32[10]"}, {{"starts", Is({5})}, {"ends", Is({2})}}, "f32[0]"},
    {OpKind::kSlice, {"f32[10]"}, {{"starts", Is({0})}, {"ends", Is({kMax})}, {"steps", Is({kMax})}}, "f32[1]"},
    {OpKind::kSlice, {"f32[10]"}, {{"starts", Is({kMax})}, {"ends", Is({kMin})}, {"steps", Is({kMin})}}, "f32[1]"},
    {OpKind::kSlice, {"f32[0]"}, {{"starts", Is({0})}, {"ends", Is({kMin})}, {"steps", Is({-1})}}, "f32[0]"},
    {OpKind::kSlice, {"f32[10]@nhwc"}, {{"starts", Is({})}, {"ends", Is({})}}, "f32[10]"},
    {OpKind::kSlice, {"f32[10]"}, {{"starts", Is({0})}, {"ends", Is({5})}, {"steps", Is({0})}}, "error: slice: steps must not be 0"},
    {OpKind::kSlice, {"f32[10]"}, {{"starts", Is({0, 1})}, {"ends", Is({5})}}, "error: starts, ends, axes and steps must have the same length"},
    {OpKind::kSlice, {"f32[10,3]"}, {{"starts", Is({0, 1})}, {"ends", Is({5, 2})}, {"axes", Is({1, -1})}}, "error: axes repeats axis 1"},
    {OpKind::kSlice, {"f32[10,3]"}, {{"starts", Is({0})}, {"ends", Is({5})}, {"axes", Is({2})}}, "error: axes: axis 2 is out of range for rank 2"},
    {OpKind::kSlice, {"f32[10]"}, {{"starts", Is({0})}}, "error: op 'slice' requires attribute 'ends' (ints)"},
    {OpKind::kSqueeze, {"f32[1,3,1,2]"}, {}, "f32[3,2]"},
    {OpKind::kSqueeze, {"f32[1,3,1,2]"}, {{"axes", Is({-2})}}, "f32[1,3,2]"},
    {OpKind::kSqueeze, {"f32[1,1]@nhwc"}, {{"axes", Is({0, 1, -1})}}, "f32[]"},
    {OpKind::kSqueeze, {"f32[1,3]"}, {{"axes", Is({1})}}, "error: squeeze: cannot squeeze axis 1 of size 3 in [1,3]"},
    {OpKind::kSqueeze, {"f32[1,3]"}, {{"axes", Is({2})}}, "error: axis 2 is out of range"},
    {OpKind::kUnsqueeze, {"f32[3,4]"}, {{"axes", Is({0, 3})}}, "f32[1,3,4,1]"},
    {OpKind::kUnsqueeze, {"f32[3,4]"}, {{"axes", Is({-1})}}, "f32[3,4,1]"},
    {OpKind::kUnsqueeze, {"f32[]"}, {{"axes", Is({0, 1})}}, "f32[1,1]"},
    {OpKind::kUnsqueeze, {"f32[3,4]"}, {{"axes", Is({1, -3})}}, "error: unsqueeze: axes repeats axis -3"},
    {OpKind::kUnsqueeze, {"f32[3,4]"}, {{"axes", Is({3})}}, "error: axis 3 is out of range for rank 3"},
    {OpKind::kUnsqueeze, {"f32[3,4]"}, {}, "error: op 'unsqueeze' requires attribute 'axes' (ints)"},
    {OpKind::kExpand, {"f32[3,1]"}, {{"shape", Is({2, 1, 4})}}, "f32[2,3,4]"},
    {OpKind::kExpand, {"i8[2,3]@nhwc"}, {{"shape", Is({1})}}, "i8[2,3]"},
    {OpKind::kExpand, {"f32[3,2]"}, {{"shape", Is({3, 4})}}, "error: expand: shapes [3,2] and [3,4] do not broadcast"},
    {OpKind::kExpand, {"f32[3,1]"}, {{"shape", Is({-1, 4})}}, "error: shape [-1,4] has a negative dim"},
    {OpKind::kGather, {"f32[5,4]", "i64[2,3]"}, {}, "f32[2,3,4]"},
    {OpKind::kGather, {"f32[5,4]", "i32[2,3]"}, {{"axis", I(1)}}, "f32[5,2,3]"},
    {OpKind::kGather, {"f32[5,4]@nhwc", "i64[]"}, {{"axis", I(-2)}}, "f32[4]"},
    {OpKind::kGather, {"f32[5,4]", "f32[2]"}, {}, "error: gather: indices must be i64 or i32, got f32[2]"},
    {OpKind::kGather, {"f32[]", "i64[2]"}, {}, "error: data must have rank >= 1"},
    {OpKind::kGather, {"f32[5,4]", "i64[2]"}, {{"axis", I(2)}}, "error: axis 2 is out of range for rank 2"},
    // ---- Losses.
    {OpKind::kNllLoss, {"f32[8,10]", "i64[8]"}, {}, "f32[]"},
    {OpKind::kNllLoss, {"f32[8,10]", "i32[8]"}, {{"reduction", S("none")}}, "f32[8]"},
    {OpKind::kNllLoss, {"f64[2,5,4,4]", "i64[2,4,4]"}, {{"reduction", S("sum")}, {"ignore_index", I(0)}}, "f64[]"},
    {OpKind::kNllLoss, {"f32[8,10]", "f32[8]"}, {}, "error: nll_loss: target must be i64 or i32 class indices, got f32[8]"},
    {OpKind::kNllLoss, {"f32[8,10]", "i64[10]"}, {}, "error: target must have shape [8], got [10]"},
    {OpKind::kNllLoss, {"f32[8,10]", "i64[8]"}, {{"reduction", S("avg")}}, "error: attribute reduction must be mean, sum or none, got \"avg\""},
    {OpKind::kNllLoss, {"f32[8]", "i64[8]"}, {}, "error: input must be [N,C,...], got f32[8]"},
    {OpKind::kNllLoss, {"i64[8,10]", "i64[8]"}, {}, "error: floating-point"},
    {OpKind::kCrossEntropyLoss, {"f32[4,3]", "i64[4]"}, {}, "f32[]"},
    {OpKind::kCrossEntropyLoss, {"f16[4,3,2]", "i64[4,2]"}, {{"reduction", S("none")}}, "f16[4,2]"},
    {OpKind::kCrossEntropyLoss, {"f32[4,3]", "i64[4,1]"}, {}, "error: target must have shape [4], got [4,1]"},
    {OpKind::kCrossEntropyLoss, {"f32[4,3]"}, {}, "error: op 'cross_entropy_loss' takes 2 inputs, got 1"},
    {OpKind::kNllLossBackward, {"f32[]", "f32[4,3]", "i64[4]"}, {}, "f32[4,3]"},
    {OpKind::kCrossEntropyLossBackward, {"f32[4]", "f32[4,3]", "i64[4]"}, {{"reduction", S("none")}}, "f32[4,3]"},
    {OpKind::kCrossEntropyLossBackward, {"f32[2]", "f32[4,3]", "i64[4]"}, {{"reduction", S("none")}}, "error: grad must be f32[4] (the loss), got f32[2]"},
    {OpKind::kConv2dBackwardData, {"f32[1,4,3,3]", "f32[4,2,3,3]", "f32[1,2,5,5]"}, {}, "f32[1,2,5,5]"},
    {OpKind::kConv2dBackwardData, {"f32[1,4,5,5]", "f32[4,2,3,3]", "f32[1,2,5,5]"}, {}, "error: grad must be f32[1,4,3,3] (the forward output), got f32[1,4,5,5]"},
    {OpKind::kConv2dBackwardWeight, {"f32[1,4,5,5]", "f32[1,2,5,5]", "f32[4,2,3,3]"}, {{"pads", Is({1, 1, 1, 1})}}, "f32[4,2,3,3]"},
    {OpKind::kConv2dBackwardWeight, {"f32[1,4,3,3]@nhwc", "f32[1,2,5,5]@nhwc", "f32[4,2,3,3]"}, {}, "f32[4,2,3,3]"},
    {OpKind::kConv2dBackwardWeight, {"f32[1,4,3,3]@nhwc", "f32[1,2,5,5]", "f32[4,2,3,3]"}, {}, "error: grad must be plain as the input"},
    {OpKind::kConv2dBackwardWeight, {"f32[1,4,3,3]@nhwc", "f32[1,2,5,5]@nhwc", "f32[4,2,3,3]@nhwc"}, {}, "error: weight must be NCHW"},
    {OpKind::kConv2dBackwardData, {"f32[1,4,3,3]@nhwc", "f32[4,2,3,3]", "f32[1,2,5,5]@nhwc"}, {}, "f32[1,2,5,5]@nhwc"},
    {OpKind::kConv2dBackwardBias, {"f32[2,4,3,3]@nhwc"}, {}, "f32[4]"},
    {OpKind::kConv2dBackwardBias, {"f32[2,4,3]"}, {}, "error: grad must have rank 4, got f32[2,4,3]"},
    {OpKind::kMaxPool2dBackward, {"f32[1,2,2,2]", "f32[1,2,4,4]"}, {{"kernel", Is({2, 2})}, {"strides", Is({2, 2})}}, "f32[1,2,4,4]"},
    {OpKind::kMaxPool2dBackward, {"f32[1,2,3,3]", "f32[1,2,4,4]"}, {{"kernel", Is({2, 2})}, {"strides", Is({2, 2})}}, "error: grad must be f32[1,2,2,2]"},
    {OpKind::kMaxPool2dBackward, {"f32[1,2,2,2]@nhwc", "f32[1,2,4,4]@nhwc"}, {{"kernel", Is({2, 2})}, {"strides", Is({2, 2})}}, "f32[1,2,4,4]@nhwc"},
    {OpKind::kConvTranspose2d, {"f32[2,4,5,6]", "f32[4,3,3,2]"}, {{"strides", Is({2, 3})}, {"pads", Is({1, 0, 1, 1})}, {"output_padding", Is({1, 2})}}, "f32[2,3,10,18]"},
    {OpKind::kConvTranspose2d, {"f32[1,4,3,3]@nhwc", "f32[4,1,3,3]"}, {{"group", int64_t{2}}, {"dilations", Is({2, 2})}}, "f32[1,2,7,7]@nhwc"},
    {OpKind::kConvTranspose2d, {"f32[2,4,5,6]", "f32[3,3,3,2]"}, {}, "error: weight [3,3,3,2] expects 3 input channels, input [2,4,5,6] has 4"},
    {OpKind::kConvTranspose2d, {"f32[2,4,5,6]", "f32[4,3,3,2]"}, {{"strides", Is({2, 2})}, {"output_padding", Is({2, 0})}}, "error: output_padding [2,0] must be >= 0 and below the strides [2,2]"},
    {OpKind::kConvTranspose2d, {"f32[1,4,1,1]", "f32[4,3,1,1]"}, {{"pads", Is({1, 0, 0, 0})}}, "error: height: pads [1,0,0,0] leave no output"},
    {OpKind::kMaxPool2dIndices, {"f32[1,2,5,5]"}, {{"kernel", Is({3, 3})}, {"strides", Is({2, 2})}, {"pads", Is({1, 1, 1, 1})}}, "i64[1,2,3,3]"},
    {OpKind::kMaxPool2dIndices, {"bf16[1,2,4,4]@nchw"}, {{"kernel", Is({2, 2})}, {"strides", Is({2, 2})}, {"ceil_mode", int64_t{1}}}, "i64[1,2,2,2]"},
    {OpKind::kMaxPool2dIndices, {"f32[1,2,4,4]@nhwc"}, {{"kernel", Is({2, 2})}}, "error: input must be NCHW, got f32[1,2,4,4]@nhwc"},
    {OpKind::kMaxPool2dIndices, {"i64[1,2,4,4]"}, {{"kernel", Is({2, 2})}}, "error: input must be a floating-point tensor, got i64[1,2,4,4]"},
    {OpKind::kAvgPool2dBackward, {"f32[1,2,3,3]", "f32[1,2,4,4]"}, {{"kernel", Is({2, 2})}}, "f32[1,2,4,4]"},
    {OpKind::kAvgPool2dBackward, {"f32[1,2,3,3]", "f32[4,4]"}, {{"kernel", Is({2, 2})}}, "error: input [N,C,H,W]"},
    {OpKind::kNllLossBackward, {"f64[4,2]", "f64[4,3,2]", "i64[4,2]"}, {{"reduction", S("none")}}, "f64[4,3,2]"},
    {OpKind::kNllLossBackward, {"f32[4]", "f32[4,3]", "i64[4]"}, {}, "error: grad must be f32[] (the loss), got f32[4]"},
    {OpKind::kNllLossBackward, {"f32[]", "f32[4,3]", "i64[5]"}, {}, "error: target must have shape [4], got [5]"},
    {OpKind::kAbsBackward, {"f32[2,3]", "f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kAbsBackward, {"i32[2,3]", "i32[2,3]"}, {}, "error: floating-point"},
    {OpKind::kLeakyReluBackward, {"f64[4]", "f64[4]"}, {}, "f64[4]"},
    {OpKind::kLeakyReluBackward, {"f64[4]", "f32[4]"}, {}, "error: inputs must have the same dtype"},
    {OpKind::kClipBackward, {"f32[3]", "f32[3]"}, {}, "f32[3]"},
    {OpKind::kClipBackward, {"f32[3]", "f32[4]"}, {}, "error: shapes [3] and [4] do not broadcast"},
    {OpKind::kGeluBackward, {"f32[2,3]", "f32[2,3]"}, {}, "f32[2,3]"},
    {OpKind::kGeluBackward, {"f32[2,3]"}, {}, "error: op 'gelu_backward' takes 2 inputs, got 1"},
    {OpKind::kMseLoss, {"f32[4,3]", "f32[4,3]"}, {}, "f32[]"},
    {OpKind::kMseLoss, {"f32[4,3]", "f32[4,3]"}, {{"reduction", S("none")}}, "f32[4,3]"},
    {OpKind::kMseLoss, {"f32[4,3]", "f32[4]"}, {}, "error: target must be f32[4,3] (the input's type), got f32[4]"},
    {OpKind::kDropoutTrain, {"f32[4,3]", "i64[]"}, {{"ratio", F(0.25)}}, "f32[4,3]"},
    {OpKind::kDropoutTrain, {"f32[4,3]", "i32[]"}, {}, "error: step must be an i64 scalar, got i32[]"},
    {OpKind::kDropoutBackward, {"f32[4,3]", "i64[]"}, {{"ratio", F(1.0)}}, "error: attribute ratio must be in [0, 1)"},
    {OpKind::kDropoutBackward, {"f32[4,3]", "i64[]"}, {}, "f32[4,3]"},
    {OpKind::kBatchNormStats, {"f32[4,3,5,5]"}, {}, "f32[2,3]"},
    {OpKind::kBatchNormStats, {"f32[4,3,5,5]@nhwc"}, {}, "f32[2,3]"},
    {OpKind::kBatchNormStats, {"f32[4]"}, {}, "error: input must have rank >= 2"},
    {OpKind::kBatchNormTrain, {"f32[4,3,5]", "f32[3]", "f32[3]", "f32[3]", "f32[3]"}, {}, "f32[4,3,5]"},
    {OpKind::kBatchNormTrain, {"f32[4,3,5]", "f32[3]", "f32[3]", "f32[2,3]", "f32[3]"}, {}, "error: mean must have shape [3], got [2,3]"},
    {OpKind::kBatchNormBackwardReduce, {"f64[4,3]", "f64[4,3]", "f64[3]", "f64[3]"}, {}, "f64[2,3]"},
    {OpKind::kBatchNormBackwardReduce, {"f64[4,2]", "f64[4,3]", "f64[3]", "f64[3]"}, {}, "error: grad must have shape [4,3], got [4,2]"},
    {OpKind::kBatchNormBackwardReduce, {"f32[4,3,2,2]", "f32[4,3,2,2]@nhwc", "f32[3]", "f32[3]"}, {}, "error: grad must be nhwc as the input"},
    {OpKind::kBatchNormBackward, {"f32[4,3,2]", "f32[4,3,2]", "f32[3]", "f32[3]", "f32[3]", "f32[2,3]"}, {}, "f32[4,3,2]"},
    {OpKind::kBatchNormBackward, {"f32[4,3,2,2]@nhwc", "f32[4,3,2,2]@nhwc", "f32[3]", "f32[3]", "f32[3]", "f32[2,3]"}, {}, "f32[4,3,2,2]@nhwc"},
    {OpKind::kBatchNormBackward, {"f32[4,3,2]", "f32[4,3,2]", "f32[3]", "f32[3]", "f32[3]", "f32[3]"}, {}, "error: sums must have shape [2,3], got [3]"},
    {OpKind::kMaximumBackward, {"f32[2,3]", "f32[3]", "f32[2,1]"}, {}, "f32[2,3]"},
    {OpKind::kMaximumBackward, {"i32[2,3]", "i32[2,3]", "i32[2,3]"}, {}, "error: floating-point"},
    {OpKind::kMinimumBackward, {"f64[4]", "f64[4]", "f64[1]"}, {}, "f64[4]"},
    {OpKind::kMinimumBackward, {"f64[4]", "f64[4]", "f64[3]"}, {}, "error: shapes [4] and [3] do not broadcast"},
    {OpKind::kGatherBackward, {"f32[5,3]", "i64[5]", "f32[4,3]"}, {}, "f32[4,3]"},
    {OpKind::kGatherBackward, {"f32[4,3]", "i64[5]", "f32[4,3]"}, {}, "error: grad must be f32[5,3] (the gather's output), got f32[4,3]"},
    {OpKind::kReduceMaxBackward, {"f32[2]", "f32[2,3]", "f32[2]"}, {{"axes", Is({1})}, {"keepdims", I(0)}}, "f32[2,3]"},
    {OpKind::kReduceMaxBackward, {"f32[2,1]", "f32[2,3]", "f32[2]"}, {{"axes", Is({1})}}, "error: y must be f32[2,1] (the reduction's output), got f32[2]"},
    // ---- Arity, unknown and mistyped attributes: checked before the op's own inference.
    {OpKind::kAdd, {"f32[2]"}, {}, "error: op 'add' takes 2 inputs, got 1"},
    {OpKind::kRelu, {"f32[2]", "f32[2]"}, {}, "error: op 'relu' takes 1 inputs, got 2"},
    {OpKind::kLinear, {"f32[2,3]", "f32[4,3]", "f32[4]", "f32[4]"}, {}, "error: op 'linear' takes 2..3 inputs, got 4"},
    {OpKind::kGemm, {"f32[2,3]"}, {}, "error: op 'gemm' takes 2..3 inputs, got 1"},
    {OpKind::kWhere, {"bool[2]", "f32[2]"}, {}, "error: op 'where' takes 3 inputs, got 2"},
    {OpKind::kRelu, {"f32[2]"}, {{"alpha", F(0.1)}}, "error: op 'relu' has no attribute 'alpha' (it takes: none)"},
    {OpKind::kSoftmax, {"f32[2]"}, {{"dim", I(0)}}, "error: op 'softmax' has no attribute 'dim' (it takes: axis)"},
    {OpKind::kSoftmax, {"f32[2]"}, {{"axis", F(0)}}, "error: attribute 'axis' of op 'softmax' must be int, got float"},
  };
  return table;
}
// clang-format on

TensorType type(const std::string& text) {
  auto t = parseType(text);
  INFO(text << ": " << t.status().message());
  REQUIRE(t.hasValue());
  return *t;
}

}  // namespace

TEST_CASE("shape inference: every case in the table") {
  for (const InferCase& c : cases()) {
    std::vector<TensorType> inputs;
    std::string signature = std::string(opName(c.op)) + "(";
    for (const std::string& s : c.inputs) {
      inputs.push_back(type(s));
      signature += (inputs.size() > 1 ? ", " : "") + s;
    }
    signature += ")";
    INFO(signature << " -> " << c.expect);
    auto out = inferTypes(c.op, inputs, c.attrs);
    if (c.expect.starts_with("error: ")) {
      INFO((out ? "got " + (*out)[0].toString() : out.status().message()));
      REQUIRE_FALSE(out.hasValue());
      CHECK(out.status().code() == ErrorCode::kInvalidArgument);
      CHECK_THAT(out.status().message(), Contains(c.expect.substr(7)));
    } else {
      INFO(out.status().message());
      REQUIRE(out.hasValue());
      REQUIRE(out->size() == static_cast<size_t>(opInfo(c.op).numOutputs));
      CHECK((*out)[0].toString() == c.expect);
    }
  }
}

TEST_CASE("shape inference: every op has a success case and an error case in the table") {
  std::map<OpKind, std::pair<int, int>> counts;  // successes, errors
  for (const InferCase& c : cases()) {
    auto& [ok, err] = counts[c.op];
    (c.expect.starts_with("error: ") ? err : ok)++;
  }
  for (int k = 0; k < kNumOps; ++k) {
    const auto op = static_cast<OpKind>(k);
    INFO("op '" << opName(op) << "' needs inference cases in test_shape_inference.cpp");
    CHECK(counts[op].first > 0);
    CHECK(counts[op].second > 0);
  }
}

TEST_CASE("shape inference: errors from inference name the op") {
  for (const InferCase& c : cases()) {
    if (!c.expect.starts_with("error: ")) continue;
    std::vector<TensorType> inputs;
    for (const std::string& s : c.inputs) inputs.push_back(type(s));
    auto out = inferTypes(c.op, inputs, c.attrs);
    REQUIRE_FALSE(out.hasValue());
    INFO(out.status().message());
    CHECK_THAT(out.status().message(), Contains(std::string(opName(c.op))));
  }
}

TEST_CASE("shape inference: sizes that would overflow int64 are errors, not wraparound") {
  const TensorType huge{DType::kF32, {int64_t{1} << 62}, Layout::kPlain};
  auto cat = inferTypes(OpKind::kConcat, std::vector<TensorType>{huge, huge}, {{"axis", I(0)}});
  REQUIRE_FALSE(cat.hasValue());
  CHECK_THAT(cat.status().message(),
             Contains("concat: the concatenated size along axis 0 overflows"));
}

TEST_CASE("shape inference: NumPy broadcasting of two shapes") {
  struct B {
    Shape a, b;
    Shape expect;
  };
  const std::vector<B> ok = {
      {{}, {}, {}},
      {{1}, {5}, {5}},
      {{5}, {1}, {5}},
      {{2, 1, 3}, {4, 1}, {2, 4, 3}},
      {{8, 1, 6, 1}, {7, 1, 5}, {8, 7, 6, 5}},
      {{0}, {1}, {0}},
      {{1, 0}, {3, 1}, {3, 0}},
      {{256, 256, 3}, {3}, {256, 256, 3}},
  };
  for (const B& c : ok) {
    INFO(shapeToString(c.a) << " + " << shapeToString(c.b));
    auto s = broadcastShapes(c.a, c.b);
    REQUIRE(s.hasValue());
    CHECK(*s == c.expect);
    CHECK(*broadcastShapes(c.b, c.a) == c.expect);
  }
  auto bad = broadcastShapes({8, 4, 3}, {2, 1});
  REQUIRE_FALSE(bad.hasValue());
  CHECK(bad.status().message() ==
        "shapes [8,4,3] and [2,1] do not broadcast (dimension 1: 4 vs 2)");
  CHECK_FALSE(broadcastShapes({0}, {2}).hasValue());
  CHECK_FALSE(broadcastShapes({3}, {4}).hasValue());
}

TEST_CASE("shape inference: axis normalization names the attribute and the valid range") {
  CHECK(*normalizeAxis(-1, 4, "axis") == 3);
  CHECK(*normalizeAxis(0, 1, "axis") == 0);
  CHECK(*normalizeAxis(-4, 4, "axis") == 0);
  auto bad = normalizeAxis(std::numeric_limits<int64_t>::min(), 2, "axes");
  REQUIRE_FALSE(bad.hasValue());
  CHECK_THAT(bad.status().message(),
             Contains("axes: axis -9223372036854775808 is out of range for rank 2 (expected "
                      "-2..1)"));
  CHECK_FALSE(normalizeAxis(0, 0, "axis").hasValue());
}

TEST_CASE("shape inference: a backward slice clamps its start into the dim, as ONNX") {
  // ONNX Slice: with a negative step, start clamps to [0, dim-1] and end to [-1, dim-1], so
  // starts=-10, ends=-10 on a dim of 5 yields element 0.
  auto out = kiln::ir::inferTypes(kiln::ir::OpKind::kSlice,
                                  std::vector<kiln::ir::TensorType>{{kiln::ir::DType::kF32, {5}}},
                                  {{"starts", std::vector<int64_t>{-10}},
                                   {"ends", std::vector<int64_t>{-10}},
                                   {"steps", std::vector<int64_t>{-1}}});
  REQUIRE(out.hasValue());
  CHECK((*out)[0].shape == kiln::ir::Shape{1});
}
