#include "ir/tensor_data.h"

#include <new>

namespace kiln::ir {

namespace {
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
  if (dtype == DType::kF64)
    *out.as<double>() = value;
  else
    *out.as<float>() = static_cast<float>(value);
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
