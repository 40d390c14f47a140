// ONNX's narrow storage dtypes: the 8-bit floats (FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2,
// FLOAT8E5M2FNUZ, and FLOAT8E8M0, the power-of-two scale of the microscaling formats), the 4-bit
// float FLOAT4E2M1 and the 4- and 2-bit integers (INT4, UINT4, INT2, UINT2) that quantized models
// store weights and activations in. kiln holds one element per byte (a float's code, an integer's
// value sign-extended), unpacked from ONNX's packed files at import; they are taken by cast (and so
// by QuantizeLinear and DequantizeLinear) and by the ops that only move bytes, never by arithmetic,
// which runs in the wider types they are cast to.
//
// Conversions follow ONNX's Cast and its reference implementation (ml_dtypes):
//  - to an 8-bit float, round to nearest even; with `saturate` (Cast's default) a value beyond
//    the largest finite one, infinities included, becomes it; without, it becomes NaN (E5M2:
//    infinity). The FNUZ formats have no negative zero (-0 becomes 0) and one NaN (0x80).
//  - to FLOAT4E2M1 (no infinity, no NaN), round to nearest even and saturate at +-6; NaN
//    becomes the code 0x8 (-0), as the reference gives.
//  - to FLOAT8E8M0 (2^(code - 127), 0xFF NaN; no zero, no sign), from the value's float32
//    bits as ONNX's reference does: the exponent, rounded by `round` (up: by any fraction, down:
//    not, nearest: by the guard bit with round, sticky or a nonzero exponent), saturating at
//    2^127 unless `saturate` is off; NaN and infinities become NaN.
//  - from a float to a 4- or 2-bit integer, truncate toward zero; a value outside the type's
//    range, and NaN, give 0 (undefined in ONNX; the reference's result). From an integer, keep
//    the low bits (two's complement), as ONNX's fixed-point casts do.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "ir/types.h"

namespace kiln::ir {

// f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz, f8e8m0, f4e2m1, i4, u4, i2, u2.
bool isNarrow(DType t);
bool isNarrowFloat(DType t);  // The 8- and 4-bit floats.
// Bits an element takes in an ONNX file (raw_data, external data): 4 for f4e2m1, i4 and u4,
// 2 for i2 and u2 (packed low bits first), 8 for the 8-bit floats; 0 for other dtypes.
int narrowFileBits(DType t);

// The value of element `code` (a byte as kiln holds it) of narrow dtype `t`.
double narrowToDouble(DType t, uint8_t code);
// How FLOAT8E8M0 rounds (ONNX Cast's round_mode).
enum class E8M0Round : uint8_t { kUp, kDown, kNearest };
// The rounding a round_mode attribute names ("up", "down" or "nearest"); nullopt for others.
std::optional<E8M0Round> parseE8M0Round(std::string_view name);

// The element of narrow dtype `t` for the value `v` of a floating-point source.
uint8_t narrowFromFloat(DType t, double v, bool saturate = true, E8M0Round round = E8M0Round::kUp);
// The element of narrow dtype `t` for the integer `v` (an integer or bool source): the low bits
// for the integer dtypes, the float's rounding of v (saturating) for the float ones.
uint8_t narrowFromInteger(DType t, int64_t v);
// An element as kiln holds it from its `bits` low bits in a file (sign-extended for i4 and i2).
uint8_t narrowFromFileBits(DType t, uint8_t bits);

}  // namespace kiln::ir
