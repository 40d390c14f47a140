// TensorData: an immutable-by-convention host tensor (dense, row-major) used for parameters,
// tensor attributes and file I/O. Copies share the bytes; the runtime wraps it without copying.
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <span>

#include "ir/types.h"

namespace kiln::ir {

class TensorData {
 public:
  TensorData() = default;
  // Zero-filled, 64-byte aligned storage for `shape` elements of `dtype`.
  TensorData(DType dtype, Shape shape);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  TensorType type() const { return {dtype_, shape_, Layout::kPlain}; }
  int64_t numElements() const { return ir::numElements(shape_); }
  size_t byteSize() const { return bytes_; }
  bool empty() const { return !data_; }

  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  template <class T>
  T* as() {
    return reinterpret_cast<T*>(data_.get());
  }
  template <class T>
  const T* as() const {
    return reinterpret_cast<const T*>(data_.get());
  }
  std::span<const std::byte> bytes() const { return {data_.get(), bytes_}; }

  // Bitwise equality of dtype, shape and bytes.
  bool bitwiseEqual(const TensorData& other) const;
  bool operator==(const TensorData& other) const { return bitwiseEqual(other); }
  // A 0-d tensor holding `value` (the constants passes add: 1, 0, a learning rate, a step
  // counter's increment): integers saturated (NaN: 0); f16 and bf16 hold it where it is exactly
  // representable (infinities too), else NaN: rounding them is the runtime's (a cast node does
  // it: passes::GraphBuilder::scalar).
  static TensorData scalar(DType dtype, double value);
  // A deep copy with its own storage.
  TensorData clone() const;
  // A tensor over bytes someone else owns (e.g. a memory-mapped artifact): `owner` keeps them
  // alive as long as any copy of the tensor lives. `data` must hold the shape's bytes.
  static TensorData wrap(DType dtype, Shape shape, std::byte* data, std::shared_ptr<void> owner);

 private:
  DType dtype_ = DType::kF32;
  Shape shape_;
  size_t bytes_ = 0;
  std::shared_ptr<std::byte[]> data_;
};

}  // namespace kiln::ir
