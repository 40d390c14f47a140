// Tensor: a runtime tensor (dtype, shape, strides, device) that owns its storage or views
// another tensor's. Eager execution, reference kernels and the CLI all trade in Tensors.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "ir/tensor_data.h"
#include "runtime/allocator.h"

namespace kiln::runtime {

using ir::DType;
using ir::Shape;

enum class DeviceKind : uint8_t { kCPU, kCUDA };

// Bytes shared by tensors. Either allocated from an Allocator (freed back to it) or borrowed
// from an ir::TensorData (kept alive by a reference).
class Storage {
 public:
  Storage(Allocator* alloc, size_t bytes);  // data() is nullptr when allocation failed.
  Storage(std::byte* unowned, size_t bytes) : data_(unowned), bytes_(bytes) {}
  explicit Storage(const ir::TensorData& borrowed);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  std::byte* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  std::byte* data_ = nullptr;
  size_t bytes_ = 0;
  Allocator* alloc_ = nullptr;
  ir::TensorData borrowed_;
};

class Tensor {
 public:
  Tensor() = default;
  // A new contiguous tensor. Contents are uninitialized; errors when memory runs out.
  static Expected<Tensor> empty(DType dtype, Shape shape, Allocator* alloc = nullptr);
  static Expected<Tensor> zeros(DType dtype, Shape shape, Allocator* alloc = nullptr);
  // A contiguous view of a TensorData's bytes (no copy; shares ownership).
  static Tensor fromData(const ir::TensorData& data);
  // A contiguous view of memory the caller owns and keeps alive (an arena slot).
  static Tensor wrap(std::byte* data, DType dtype, Shape shape);

  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  DeviceKind device() const { return DeviceKind::kCPU; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numElements() const { return ir::numElements(shape_); }
  size_t byteSize() const { return static_cast<size_t>(numElements()) * ir::dtypeSize(dtype_); }
  ir::TensorType type() const { return {dtype_, shape_, ir::Layout::kPlain}; }
  bool defined() const { return storage_ != nullptr; }
  bool isContiguous() const;

  std::byte* rawData() const { return storage_->data() + offset_ * ir::dtypeSize(dtype_); }
  template <class T>
  T* data() const {
    return reinterpret_cast<T*>(rawData());
  }

  // Element i of a contiguous tensor (row-major) as a double, for every dtype (f16 and bf16
  // converted exactly, bool as 0 or 1): summaries and comparisons.
  double elementAsDouble(int64_t i) const;

  // A view with another shape over the same contiguous bytes (element counts must match).
  Expected<Tensor> reshaped(Shape shape) const;
  // A contiguous copy (or this tensor when it already is contiguous).
  Expected<Tensor> contiguous(Allocator* alloc = nullptr) const;
  // A deep copy into a new TensorData (contiguous, owns its bytes).
  ir::TensorData toData() const;
  // Copies `src` (same dtype and shape) into this tensor's storage.
  Status copyFrom(const Tensor& src);

  std::string describe() const { return type().toString(); }

 private:
  DType dtype_ = DType::kF32;
  Shape shape_;
  std::vector<int64_t> strides_;  // In elements.
  int64_t offset_ = 0;            // In elements.
  std::shared_ptr<Storage> storage_;
};

}  // namespace kiln::runtime
