// Shared pieces of the reference kernels: dtype dispatch, broadcast/strided index iteration,
// wrapping integer arithmetic, and exact float <-> f16/bf16 conversions.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/reference/kernels.h"

namespace kiln::runtime::ref {

// Storage types of the dtypes that have no native C++ arithmetic type. Kernels only move or
// convert them; bool is kept as a byte so that reading a stray value is never UB.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};
struct Bool8 {
  uint8_t v;
};

// A type tag passed to the generic lambdas of the dispatchers below.
template <class T>
struct Tag {
  using type = T;
};

// The error every kernel returns for a dtype it does not support.
Status unsupportedDType(std::string_view op, ir::DType t);

// The name of the op a kernel runs, for error messages.
inline std::string_view opNameOf(const ir::AttrView& attrs) {
  return attrs.op().name;
}

inline void setKernel(RefKernelTable& t, ir::OpKind op, RefKernel k) {
  t[static_cast<size_t>(op)] = k;
}

// conv_transpose2d(x, w) -> y as the conv2d_backward_data(x, w, y) call it is (ops.def), for the
// reference and the library kernels: run(attrs, operands) gets the attributes without
// output_padding (the output's shape says it) and the operands x, w, y, of which that call reads
// y's shape only.
template <class F>
Status asConvBackwardData(const ir::AttrView& attrs, std::span<const Tensor> in, const Tensor& out,
                          F&& run) {
  ir::AttrMap data = attrs.raw();
  data.erase("output_padding");
  const ir::AttrView view(ir::opInfo(ir::OpKind::kConv2dBackwardData), data);
  const std::array<Tensor, 3> operands = {in[0], in[1], out};
  return run(view, std::span<const Tensor>(operands));
}

// Copies input 0 to output 0 byte for byte (any dtype): dropout in inference mode and the
// movement ops that only change the shape.
Status identityKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out);

// Calls f(Tag<T>{}) for f32 and f64, else reports the dtype as unsupported.
template <class F>
Status dispatchFloat(std::string_view op, ir::DType t, F&& f) {
  switch (t) {
    case ir::DType::kF32:
      return f(Tag<float>{});
    case ir::DType::kF64:
      return f(Tag<double>{});
    default:
      return unsupportedDType(op, t);
  }
}

// f32, f64 and the integer dtypes (i64, i32, i16, i8, u64, u32, u16, u8).
template <class F>
Status dispatchNumeric(std::string_view op, ir::DType t, F&& f) {
  switch (t) {
    case ir::DType::kF32:
      return f(Tag<float>{});
    case ir::DType::kF64:
      return f(Tag<double>{});
    case ir::DType::kI64:
      return f(Tag<int64_t>{});
    case ir::DType::kI32:
      return f(Tag<int32_t>{});
    case ir::DType::kI8:
      return f(Tag<int8_t>{});
    case ir::DType::kU8:
      return f(Tag<uint8_t>{});
    case ir::DType::kI16:
      return f(Tag<int16_t>{});
    case ir::DType::kU16:
      return f(Tag<uint16_t>{});
    case ir::DType::kU32:
      return f(Tag<uint32_t>{});
    case ir::DType::kU64:
      return f(Tag<uint64_t>{});
    default:
      return unsupportedDType(op, t);
  }
}

// Every dtype, with the storage types above for f16, bf16 and bool.
template <class F>
Status dispatchAll(ir::DType t, F&& f) {
  switch (t) {
    case ir::DType::kF16:
      return f(Tag<Half>{});
    case ir::DType::kBF16:
      return f(Tag<BFloat16>{});
    case ir::DType::kBool:
      return f(Tag<Bool8>{});
    default:
      return dispatchNumeric("dispatchAll", t, std::forward<F>(f));  // Every other dtype.
  }
}

// An unsigned integer type of the dtype's element size, for ops that only move elements.
template <class F>
Status dispatchBySize(ir::DType t, F&& f) {
  switch (ir::dtypeSize(t)) {
    case 1:
      return f(Tag<uint8_t>{});
    case 2:
      return f(Tag<uint16_t>{});
    case 4:
      return f(Tag<uint32_t>{});
    case 8:
      return f(Tag<uint64_t>{});
  }
  return internalError("dispatchBySize: unexpected element size");
}

// ---- Wrapping arithmetic. Signed overflow is UB in C++, so integer ops run on the unsigned
// type (two's complement wrap-around, as NumPy and PyTorch do); floats are unchanged.
template <class T>
using WrapUnsigned =
    std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

template <class T>
T addWrap(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<WrapUnsigned<T>>(a) + static_cast<WrapUnsigned<T>>(b));
  } else {
    return a + b;
  }
}
template <class T>
T subWrap(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<WrapUnsigned<T>>(a) - static_cast<WrapUnsigned<T>>(b));
  } else {
    return a - b;
  }
}
template <class T>
T mulWrap(T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<WrapUnsigned<T>>(a) * static_cast<WrapUnsigned<T>>(b));
  } else {
    return a * b;
  }
}
template <class T>
T negWrap(T a) {
  return subWrap(T(0), a);
}

// NaN test that also compiles for integer types (always false there).
template <class T>
bool isNaN(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::isnan(x);
  } else {
    (void)x;
    return false;
  }
}

// ---- Index iteration.

// The strides (in elements) that read a contiguous tensor of shape `in` as the broadcast
// shape `out` (NumPy rules: `in` is right-aligned; size-1 and missing dims get stride 0).
std::vector<int64_t> broadcastStrides(const ir::Shape& in, const ir::Shape& out);

// Splits a shape around `axis`: outer = prod(dims before), dim = shape[axis],
// inner = prod(dims after).
struct AxisSplit {
  int64_t outer = 1;
  int64_t dim = 1;
  int64_t inner = 1;
};
AxisSplit splitAt(const ir::Shape& shape, int axis);

// Visits every element of `shape` in row-major order and calls f(flatIndex, offsets), where
// offsets[k] = base[k] + sum_d index[d] * strides[k][d]. Strides may be zero or negative.
template <size_t N, class F>
void forEachStrided(const ir::Shape& shape, const std::array<std::vector<int64_t>, N>& strides,
                    const std::array<int64_t, N>& base, F&& f) {
  const int64_t total = ir::numElements(shape);
  if (total == 0) return;
  const size_t rank = shape.size();
  if (rank == 0) {
    f(int64_t{0}, base);
    return;
  }
  const int64_t inner = shape[rank - 1];
  std::array<int64_t, N> innerStride;
  for (size_t k = 0; k < N; ++k) innerStride[k] = strides[k][rank - 1];
  std::vector<int64_t> idx(rank, 0);
  std::array<int64_t, N> rowStart = base;
  for (int64_t row = 0; row < total; row += inner) {
    std::array<int64_t, N> off = rowStart;
    for (int64_t i = 0; i < inner; ++i) {
      f(row + i, std::as_const(off));
      for (size_t k = 0; k < N; ++k) off[k] += innerStride[k];
    }
    // Advance the multi-index over the outer dims (odometer order).
    for (size_t d = rank - 1; d-- > 0;) {
      ++idx[d];
      for (size_t k = 0; k < N; ++k) rowStart[k] += strides[k][d];
      if (idx[d] < shape[d]) break;
      for (size_t k = 0; k < N; ++k) rowStart[k] -= strides[k][d] * shape[d];
      idx[d] = 0;
    }
  }
}

// dst[i] = src[srcOffset + sum_d index_d(i) * srcStrides[d]] for every element i of the
// contiguous `dstShape`; elements are `elemSize` bytes. Transpose, slice and expand are this.
void copyStrided(const std::byte* src, int64_t srcOffset, const std::vector<int64_t>& srcStrides,
                 std::byte* dst, const ir::Shape& dstShape, size_t elemSize);

// ---- f16 / bf16 conversions. Values are rounded once, to nearest with ties to even, from
// the exact source value (no double rounding through f32); overflow gives inf, NaN stays a
// quiet NaN with its sign.
uint16_t doubleToF16Bits(double v);
uint16_t doubleToBf16Bits(double v);
// n f16/bf16 values (`t`, as bits) widened to f32, exactly; and n f32 values rounded to `t`'s
// bits once, to nearest even. The library calls that run f16/bf16 operands through f32 (the
// CPU's converted products, emu's) use these.
void halfBitsToFloat(ir::DType t, const uint16_t* src, float* dst, int64_t n);
void floatToHalfBits(ir::DType t, const float* src, uint16_t* dst, int64_t n);
uint16_t int64ToF16Bits(int64_t v);
uint16_t int64ToBf16Bits(int64_t v);
// Exact (every f16 and bf16 value is a double).
double f16BitsToDouble(uint16_t bits);
double bf16BitsToDouble(uint16_t bits);

// An element's value as a number of a built-in type: f16 and bf16 exactly (as double), bools as
// 0 and 1 (int), integers and floats as themselves (a uint64_t stays one).
template <class T>
auto numericValue(T v) {
  if constexpr (std::is_same_v<T, Half>)
    return f16BitsToDouble(v.bits);
  else if constexpr (std::is_same_v<T, BFloat16>)
    return bf16BitsToDouble(v.bits);
  else if constexpr (std::is_same_v<T, Bool8>)
    return int{v.v != 0};
  else
    return v;
}

}  // namespace kiln::runtime::ref
