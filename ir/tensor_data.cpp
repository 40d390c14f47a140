#include "ir/tensor_data.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>

#include "ir/narrow.h"

namespace kiln::ir {

namespace {

// `v`'s bits in a 16-bit float with `mant` mantissa bits and exponent bias `bias` when `v` is
// exactly representable there (0, 1, 0.5, -2, ...), else `nan`.
uint16_t exactHalfBits(double v, int mant, int bias, uint16_t nan) {
  if (v == 0) return std::signbit(v) ? 0x8000 : 0;
  if (std::isnan(v)) return nan;
  const uint16_t sign = v < 0 ? 0x8000 : 0;
  if (std::isinf(v)) return static_cast<uint16_t>(sign | ((2 * bias + 1) << mant));
  int e = 0;
  const double m = std::frexp(std::fabs(v), &e);  // |v| = m 2^e, m in [0.5, 1).
  const int exponent = e - 1 + bias;              // Biased, for 1.f * 2^(e-1).
  if (exponent >= 2 * bias + 1) return nan;       // Past the largest finite value.
  if (exponent >= 1) {                            // Normal: mant + 1 significant bits.
    const double q = std::ldexp(m, mant + 1);
    if (q != std::floor(q)) return nan;
    return static_cast<uint16_t>(sign | (exponent << mant) | (static_cast<int>(q) - (1 << mant)));
  }
  const double q =
      std::ldexp(std::fabs(v), bias - 1 + mant);  // Subnormal: in units of 2^(1-bias-mant).
  if (q != std::floor(q) || q >= (1 << mant)) return nan;
  return static_cast<uint16_t>(sign | static_cast<int>(q));
}

// `v` as integer type T, saturated to T's range (NaN: 0), as the reference's float-to-integer
// casts: a plain static_cast of an out-of-range double is undefined.
template <class T>
T saturated(double v) {
  if (std::isnan(v)) return T(0);
  if (v <= static_cast<double>(std::numeric_limits<T>::min())) return std::numeric_limits<T>::min();
  if (v >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
  return static_cast<T>(v);
}

struct AlignedDelete {
  void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t(64)); }
};
}  // namespace

TensorData::TensorData(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  bytes_ = static_cast<size_t>(ir::numElements(shape_)) * dtypeSize(dtype_);
  // Allocate at least one byte so that a zero-sized tensor still has non-null storage.
  auto* p = static_cast<std::byte*>(::operator new[](bytes_ ? bytes_ : 1, std::align_val_t(64)));
  std::memset(p, 0, bytes_ ? bytes_ : 1);
  data_ = std::shared_ptr<std::byte[]>(p, AlignedDelete{});
}

bool TensorData::bitwiseEqual(const TensorData& other) const {
  if (dtype_ != other.dtype_ || shape_ != other.shape_ || bytes_ != other.bytes_) return false;
  return bytes_ == 0 || std::memcmp(data_.get(), other.data_.get(), bytes_) == 0;
}

TensorData TensorData::scalar(DType dtype, double value) {
  TensorData out(dtype, {});
  auto put = [&](auto v) { std::memcpy(out.data_.get(), &v, sizeof(v)); };
  switch (dtype) {
    case DType::kF64:
      put(value);
      break;
    case DType::kF32:
      put(static_cast<float>(value));
      break;
    case DType::kI64:
      put(saturated<int64_t>(value));
      break;
    case DType::kI32:
      put(saturated<int32_t>(value));
      break;
    case DType::kI8:
      put(saturated<int8_t>(value));
      break;
    case DType::kU8:
      put(saturated<uint8_t>(value));
      break;
    case DType::kI16:
      put(saturated<int16_t>(value));
      break;
    case DType::kU16:
      put(saturated<uint16_t>(value));
      break;
    case DType::kU32:
      put(saturated<uint32_t>(value));
      break;
    case DType::kU64:
      put(saturated<uint64_t>(value));
      break;
    case DType::kBool:
      put(static_cast<uint8_t>(value != 0));
      break;
    case DType::kF16:
      put(exactHalfBits(value, 10, 15, 0x7E00));
      break;
    case DType::kBF16:
      put(exactHalfBits(value, 7, 127, 0x7FC0));
      break;
    default:  // The narrow storage dtypes, a byte each.
      put(narrowFromFloat(dtype, value));
      break;
  }
  return out;
}

TensorData TensorData::wrap(DType dtype, Shape shape, std::byte* data,
                            std::shared_ptr<void> owner) {
  TensorData out;
  out.dtype_ = dtype;
  out.shape_ = std::move(shape);
  out.bytes_ = static_cast<size_t>(ir::numElements(out.shape_)) * dtypeSize(dtype);
  out.data_ = std::shared_ptr<std::byte[]>(std::move(owner), data);  // Aliasing: shares `owner`.
  return out;
}

TensorData TensorData::clone() const {
  TensorData out(dtype_, shape_);
  if (bytes_) std::memcpy(out.data(), data(), bytes_);
  return out;
}

}  // namespace kiln::ir
