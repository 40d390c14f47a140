#include "runtime/tensor.h"

#include <cstring>

#include "ir/narrow.h"
#include "runtime/reference/helpers.h"

namespace kiln::runtime {

Storage::Storage(Allocator* alloc, size_t bytes) : bytes_(bytes), alloc_(alloc) {
  data_ = static_cast<std::byte*>(alloc_->allocate(bytes));
}

Storage::Storage(const ir::TensorData& borrowed) : borrowed_(borrowed) {
  // The view never writes through a borrowed TensorData unless its owner asked for it; the
  // const_cast only drops the constness of the shared handle.
  data_ = const_cast<std::byte*>(borrowed_.data());
  bytes_ = borrowed_.byteSize();
}

Storage::~Storage() {
  if (alloc_ && data_) alloc_->deallocate(data_, bytes_);
}

Expected<Tensor> Tensor::empty(DType dtype, Shape shape, Allocator* alloc) {
  for (int64_t d : shape)
    if (d < 0)
      return invalidArgument("tensor shape " + ir::shapeToString(shape) + " has a negative dim");
  Tensor t;
  t.dtype_ = dtype;
  t.strides_ = ir::contiguousStrides(shape);
  t.shape_ = std::move(shape);
  const size_t bytes = t.byteSize();
  Allocator* a = alloc ? alloc : &cpuAllocator();
  t.storage_ = std::make_shared<Storage>(a, bytes);
  if (!t.storage_->data()) return allocationFailure(*a, bytes, t.describe());
  return t;
}

Expected<Tensor> Tensor::zeros(DType dtype, Shape shape, Allocator* alloc) {
  KILN_ASSIGN_OR_RETURN(Tensor t, empty(dtype, std::move(shape), alloc));
  std::memset(t.rawData(), 0, t.byteSize());
  return t;
}

Tensor Tensor::fromData(const ir::TensorData& data) {
  Tensor t;
  t.dtype_ = data.dtype();
  t.shape_ = data.shape();
  t.strides_ = ir::contiguousStrides(t.shape_);
  t.storage_ = std::make_shared<Storage>(data);
  return t;
}

Tensor Tensor::wrap(std::byte* data, DType dtype, Shape shape) {
  Tensor t;
  t.dtype_ = dtype;
  t.strides_ = ir::contiguousStrides(shape);
  t.shape_ = std::move(shape);
  t.storage_ = std::make_shared<Storage>(data, t.byteSize());
  return t;
}

bool Tensor::isContiguous() const {
  return strides_ == ir::contiguousStrides(shape_);
}

Expected<Tensor> Tensor::reshaped(Shape shape) const {
  if (ir::numElements(shape) != numElements())
    return invalidArgument("cannot view " + describe() + " as shape " + ir::shapeToString(shape));
  if (!isContiguous())
    return invalidArgument("cannot reshape a non-contiguous tensor " + describe());
  Tensor t = *this;
  t.strides_ = ir::contiguousStrides(shape);
  t.shape_ = std::move(shape);
  return t;
}

Expected<Tensor> Tensor::contiguous(Allocator* alloc) const {
  if (isContiguous()) return *this;
  KILN_ASSIGN_OR_RETURN(Tensor out, empty(dtype_, shape_, alloc));
  KILN_TRY(out.copyFrom(*this));
  return out;
}

Status Tensor::copyFrom(const Tensor& src) {
  if (src.dtype_ != dtype_ || src.shape_ != shape_)
    return invalidArgument("copy from " + src.describe() + " into " + describe());
  const size_t esize = ir::dtypeSize(dtype_);
  if (src.isContiguous() && isContiguous()) {
    if (byteSize()) std::memmove(rawData(), src.rawData(), byteSize());
    return Status::ok();
  }
  // Strided element-by-element copy over a multi-index.
  const int64_t n = numElements();
  std::vector<int64_t> idx(shape_.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t so = 0, doff = 0;
    for (size_t d = 0; d < idx.size(); ++d) {
      so += idx[d] * src.strides_[d];
      doff += idx[d] * strides_[d];
    }
    std::memcpy(rawData() + doff * esize, src.rawData() + so * esize, esize);
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < shape_[d]) break;
      idx[d] = 0;
    }
  }
  return Status::ok();
}

ir::TensorData Tensor::toData() const {
  ir::TensorData d(dtype_, shape_);
  Tensor view = fromData(d);
  (void)view.copyFrom(*this);  // Same dtype and shape by construction.
  return d;
}

double Tensor::elementAsDouble(int64_t i) const {
  switch (dtype_) {
    case ir::DType::kF32:
      return data<float>()[i];
    case ir::DType::kF64:
      return data<double>()[i];
    case ir::DType::kF16:
      return ref::f16BitsToDouble(data<uint16_t>()[i]);
    case ir::DType::kBF16:
      return ref::bf16BitsToDouble(data<uint16_t>()[i]);
    case ir::DType::kI64:
      return static_cast<double>(data<int64_t>()[i]);
    case ir::DType::kI32:
      return data<int32_t>()[i];
    case ir::DType::kI8:
      return data<int8_t>()[i];
    case ir::DType::kU8:
      return data<uint8_t>()[i];
    case ir::DType::kBool:
      return data<uint8_t>()[i] != 0 ? 1 : 0;
    case ir::DType::kI16:
      return data<int16_t>()[i];
    case ir::DType::kU16:
      return data<uint16_t>()[i];
    case ir::DType::kU32:
      return data<uint32_t>()[i];
    case ir::DType::kU64:
      return static_cast<double>(data<uint64_t>()[i]);
    default:  // The narrow storage dtypes, a byte each.
      return ir::narrowToDouble(dtype_, data<uint8_t>()[i]);
  }
}

}  // namespace kiln::runtime
