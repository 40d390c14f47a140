// Reference kernels for the movement ops: reshape, flatten, squeeze, unsqueeze (byte copies),
// transpose, slice, expand (strided copies), concat and gather. Every dtype is supported:
// elements are moved by size, never interpreted.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/reference/helpers.h"

namespace kiln::runtime {

namespace {

Status transposeKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                       std::span<Tensor> out) {
  const ir::Shape& s = in[0].shape();
  std::vector<int64_t> perm = attrs.getInts("perm");
  if (perm.empty())
    for (size_t i = s.size(); i-- > 0;) perm.push_back(static_cast<int64_t>(i));
  const std::vector<int64_t> inStrides = ir::contiguousStrides(s);
  std::vector<int64_t> strides(perm.size());  // Output dim i walks input dim perm[i].
  for (size_t i = 0; i < perm.size(); ++i) strides[i] = inStrides[perm[i]];
  ref::copyStrided(in[0].rawData(), 0, strides, out[0].rawData(), out[0].shape(),
                   ir::dtypeSize(in[0].dtype()));
  return Status::ok();
}

Status sliceKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  const ir::Shape& s = in[0].shape();
  const auto& starts = attrs.getInts("starts");
  std::vector<int64_t> axes = attrs.getInts("axes");
  std::vector<int64_t> steps = attrs.getInts("steps");
  if (axes.empty())
    for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
  if (steps.empty()) steps.assign(starts.size(), 1);
  // Output element index i along a sliced axis reads input index start + i * step; the
  // output sizes (from shape inference) already account for the ends.
  std::vector<int64_t> strides = ir::contiguousStrides(s);
  int64_t offset = 0;
  for (size_t i = 0; i < starts.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(const int ax, ir::normalizeAxis(axes[i], s.size(), "axes"));
    const int64_t dim = s[ax];
    int64_t start = starts[i] < 0 ? starts[i] + dim : starts[i];
    // The same clamping as shape inference (infer_movement.cpp).
    start = steps[i] > 0 ? std::clamp<int64_t>(start, 0, dim)
                         : (dim == 0 ? 0 : std::clamp<int64_t>(start, 0, dim - 1));
    offset += start * strides[ax];
    // With at most one output element the step is never taken (and a huge step must not
    // overflow the stride).
    strides[ax] = out[0].shape()[ax] > 1 ? strides[ax] * steps[i] : 0;
  }
  if (out[0].numElements() == 0) return Status::ok();
  ref::copyStrided(in[0].rawData(), offset, strides, out[0].rawData(), out[0].shape(),
                   ir::dtypeSize(in[0].dtype()));
  return Status::ok();
}

Status expandKernel(const ir::AttrView&, std::span<const Tensor> in, std::span<Tensor> out) {
  ref::copyStrided(in[0].rawData(), 0, ref::broadcastStrides(in[0].shape(), out[0].shape()),
                   out[0].rawData(), out[0].shape(), ir::dtypeSize(in[0].dtype()));
  return Status::ok();
}

Status concatKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  const ir::Shape& s = out[0].shape();
  KILN_ASSIGN_OR_RETURN(const int axis, ir::normalizeAxis(attrs.getInt("axis"), s.size(), "axis"));
  const ref::AxisSplit split = ref::splitAt(s, axis);
  const size_t esize = ir::dtypeSize(out[0].dtype());
  // Each outer index holds, in input order, a block of dim_i * inner elements per input.
  const size_t outBlock = static_cast<size_t>(split.dim * split.inner) * esize;
  size_t at = 0;  // Byte offset of the current input's block inside an output block.
  for (const Tensor& t : in) {
    const size_t block = static_cast<size_t>(t.shape()[axis] * split.inner) * esize;
    for (int64_t o = 0; o < split.outer; ++o)
      if (block) std::memcpy(out[0].rawData() + o * outBlock + at, t.rawData() + o * block, block);
    at += block;
  }
  return Status::ok();
}

// Positions along dim `axis` (of size `size`) of `data`, each in [-size, size) (negatives from
// the end): every one checked before any is used, so that an error leaves nothing half-done;
// `resolved` (if given) gets them counted from the start.
template <class I>
Status readPositions(std::string_view op, const I* indices, int64_t count, int64_t size, int axis,
                     std::string_view data, std::vector<int64_t>* resolved) {
  if (resolved) resolved->resize(static_cast<size_t>(count));
  for (int64_t j = 0; j < count; ++j) {
    const auto idx = static_cast<int64_t>(indices[j]);
    if (idx < -size || idx >= size)
      return invalidArgument(
          positionError(op, std::to_string(idx), std::to_string(j), size, axis, data));
    if (resolved) (*resolved)[static_cast<size_t>(j)] = idx < 0 ? idx + size : idx;
  }
  return Status::ok();
}

template <class I>
Status gatherTyped(const ir::AttrView& attrs, const Tensor& data, const I* indices,
                   int64_t numIndices, Tensor& out) {
  KILN_ASSIGN_OR_RETURN(const int axis,
                        ir::normalizeAxis(attrs.getInt("axis"), data.shape().size(), "axis"));
  const ref::AxisSplit split = ref::splitAt(data.shape(), axis);
  const size_t esize = ir::dtypeSize(data.dtype());
  const size_t row = static_cast<size_t>(split.inner) * esize;
  std::vector<int64_t> resolved;
  KILN_TRY(
      readPositions("gather", indices, numIndices, split.dim, axis, data.describe(), &resolved));
  if (row == 0) return Status::ok();
  for (int64_t o = 0; o < split.outer; ++o)
    for (int64_t j = 0; j < numIndices; ++j)
      std::memcpy(out.rawData() + (o * numIndices + j) * row,
                  data.rawData() + (o * split.dim + resolved[j]) * row, row);
  return Status::ok();
}

Status gatherKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  const Tensor& idx = in[1];
  if (idx.dtype() == ir::DType::kI64)
    return gatherTyped(attrs, in[0], idx.data<int64_t>(), idx.numElements(), out[0]);
  if (idx.dtype() == ir::DType::kI32)
    return gatherTyped(attrs, in[0], idx.data<int32_t>(), idx.numElements(), out[0]);
  return ref::unsupportedDType("gather (indices)", idx.dtype());
}

// The element index of an index value along a dim of `size`, negatives counting from the end.
Expected<int64_t> resolveIndex(const char* op, int64_t k, int64_t size, int dim) {
  const int64_t r = k < 0 ? k + size : k;
  if (r < 0 || r >= size)
    return invalidArgument(resolvedIndexError(op, std::to_string(k), dim, size));
  return r;
}

// What gather_elements and scatter_elements walk: the data's strides with the axis's zeroed
// (an element's offset but for its index along the axis), the axis's size and stride.
struct ElementAxis {
  int axis;
  std::vector<int64_t> base;
  int64_t dim, stride;
};

Expected<ElementAxis> elementAxis(const ir::AttrView& attrs, const ir::Shape& data) {
  KILN_ASSIGN_OR_RETURN(const int axis,
                        ir::normalizeAxis(attrs.getInt("axis"), data.size(), "axis"));
  ElementAxis e{axis, ir::contiguousStrides(data), data[static_cast<size_t>(axis)], 0};
  e.stride = e.base[static_cast<size_t>(axis)];
  e.base[static_cast<size_t>(axis)] = 0;
  return e;
}

// Calls f(Tag<I>{}) for i64 or i32 indices.
template <class F>
Status byIndexType(const char* op, ir::DType t, F&& f) {
  if (t == ir::DType::kI64) return f(ref::Tag<int64_t>{});
  if (t == ir::DType::kI32) return f(ref::Tag<int32_t>{});
  return ref::unsupportedDType(std::string(op) + " (indices)", t);
}

// ONNX's scatter `reduction`, parsed once per call.
enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

Reduction reductionOf(const ir::AttrView& attrs) {
  const std::string& r = attrs.getString("reduction");
  return r == "add"   ? Reduction::kAdd
         : r == "mul" ? Reduction::kMul
         : r == "max" ? Reduction::kMax
         : r == "min" ? Reduction::kMin
                      : Reduction::kNone;
}

// Combines an update into its destination.
template <class T>
T combine(Reduction r, T dst, T upd) {
  switch (r) {
    case Reduction::kAdd:
      return ref::addWrap(dst, upd);
    case Reduction::kMul:
      return ref::mulWrap(dst, upd);
    case Reduction::kMax:
      return dst < upd ? upd : dst;
    case Reduction::kMin:
      return upd < dst ? upd : dst;
    case Reduction::kNone:
      break;
  }
  return upd;
}

// gather_elements: each output element reads data at its own position, the axis coordinate
// replaced by its index.
template <class I>
Status gatherElementsTyped(const ir::AttrView& attrs, const Tensor& data, const Tensor& indices,
                           Tensor& out) {
  KILN_ASSIGN_OR_RETURN(const ElementAxis e, elementAxis(attrs, data.shape()));
  const ir::Shape& shape = out.shape();
  const I* idx = indices.data<I>();
  KILN_TRY(readPositions("gather_elements", idx, indices.numElements(), e.dim, e.axis,
                         data.describe(), nullptr));
  return ref::dispatchBySize(data.dtype(), [&]<class U>(ref::Tag<U>) {
    const U* x = data.data<U>();
    U* y = out.data<U>();
    ref::forEachStrided<2>(shape, {ir::contiguousStrides(shape), e.base}, {0, 0},
                           [&](int64_t i, const std::array<int64_t, 2>& off) {
                             const auto k = static_cast<int64_t>(idx[off[0]]);
                             y[i] = x[off[1] + (k < 0 ? k + e.dim : k) * e.stride];
                           });
    return Status::ok();
  });
}

template <class I>
Status scatterElementsTyped(const ir::AttrView& attrs, std::span<const Tensor> in, Tensor& out) {
  const Tensor &data = in[0], &indices = in[1], &updates = in[2];
  KILN_ASSIGN_OR_RETURN(const ElementAxis e, elementAxis(attrs, data.shape()));
  const Reduction reduction = reductionOf(attrs);
  const I* idx = indices.data<I>();
  return ref::dispatchNumeric(ref::opNameOf(attrs), data.dtype(), [&]<class T>(ref::Tag<T>) {
    T* y = out.data<T>();
    std::copy(data.data<T>(), data.data<T>() + data.numElements(), y);
    const T* u = updates.data<T>();
    Status st = Status::ok();
    // In index order, so that repeated indices combine (or overwrite) deterministically.
    ref::forEachStrided<2>(indices.shape(), {ir::contiguousStrides(indices.shape()), e.base},
                           {0, 0}, [&](int64_t i, const std::array<int64_t, 2>& off) {
                             if (!st.isOk()) return;
                             auto k =
                                 resolveIndex("scatter_elements", static_cast<int64_t>(idx[off[0]]),
                                              e.dim, e.axis);
                             if (!k) {
                               st = k.status();
                               return;
                             }
                             T& dst = y[off[1] + *k * e.stride];
                             dst = combine(reduction, dst, u[i]);
                           });
    return st;
  });
}

Status scatterElementsKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                             std::span<Tensor> out) {
  return byIndexType("scatter_elements", in[1].dtype(), [&]<class I>(ref::Tag<I>) {
    return scatterElementsTyped<I>(attrs, in, out[0]);
  });
}

template <class I>
Status scatterNdTyped(const ir::AttrView& attrs, std::span<const Tensor> in, Tensor& out) {
  const Tensor &data = in[0], &indices = in[1], &updates = in[2];
  const Reduction reduction = reductionOf(attrs);
  const int64_t k = indices.shape().back();
  const int64_t count = indices.numElements() / std::max<int64_t>(k, 1);
  const std::vector<int64_t> strides = ir::contiguousStrides(data.shape());
  int64_t slice = 1;
  for (size_t d = static_cast<size_t>(k); d < data.shape().size(); ++d) slice *= data.shape()[d];
  const I* idx = indices.data<I>();
  return ref::dispatchNumeric(ref::opNameOf(attrs), data.dtype(), [&]<class T>(ref::Tag<T>) {
    T* y = out.data<T>();
    std::copy(data.data<T>(), data.data<T>() + data.numElements(), y);
    const T* u = updates.data<T>();
    for (int64_t j = 0; j < count; ++j) {
      int64_t offset = 0;
      for (int64_t d = 0; d < k; ++d) {
        KILN_ASSIGN_OR_RETURN(
            int64_t r, resolveIndex("scatter_nd", static_cast<int64_t>(idx[j * k + d]),
                                    data.shape()[static_cast<size_t>(d)], static_cast<int>(d)));
        offset += r * strides[static_cast<size_t>(d)];
      }
      for (int64_t e = 0; e < slice; ++e)
        y[offset + e] = combine(reduction, y[offset + e], u[j * slice + e]);
    }
    return Status::ok();
  });
}

Status scatterNdKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                       std::span<Tensor> out) {
  return byIndexType("scatter_nd", in[1].dtype(),
                     [&]<class I>(ref::Tag<I>) { return scatterNdTyped<I>(attrs, in, out[0]); });
}

Status gatherElementsKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                            std::span<Tensor> out) {
  return byIndexType("gather_elements", in[1].dtype(), [&]<class I>(ref::Tag<I>) {
    return gatherElementsTyped<I>(attrs, in[0], in[1], out[0]);
  });
}

// gather_backward(grad, indices, data): zeros shaped like data, each grad row added at its
// index (in index order, so repeated indices accumulate deterministically).
template <class I>
Status gatherBackwardTyped(const ir::AttrView& attrs, const Tensor& grad, const I* indices,
                           int64_t numIndices, const Tensor& data, Tensor& out) {
  KILN_ASSIGN_OR_RETURN(const int axis,
                        ir::normalizeAxis(attrs.getInt("axis"), data.shape().size(), "axis"));
  const ref::AxisSplit split = ref::splitAt(data.shape(), axis);
  std::vector<int64_t> resolved;
  KILN_TRY(readPositions("gather_backward", indices, numIndices, split.dim, axis, data.describe(),
                         &resolved));
  return ref::dispatchFloat(ref::opNameOf(attrs), data.dtype(), [&]<class T>(ref::Tag<T>) {
    const T* g = grad.data<T>();
    T* d = out.data<T>();
    std::fill(d, d + out.numElements(), T(0));
    for (int64_t o = 0; o < split.outer; ++o)
      for (int64_t j = 0; j < numIndices; ++j) {
        const T* src = g + (o * numIndices + j) * split.inner;
        T* dst = d + (o * split.dim + resolved[j]) * split.inner;
        for (int64_t i = 0; i < split.inner; ++i) dst[i] += src[i];
      }
    return Status::ok();
  });
}

Status gatherBackwardKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                            std::span<Tensor> out) {
  const Tensor& idx = in[1];
  if (idx.dtype() == ir::DType::kI64)
    return gatherBackwardTyped(attrs, in[0], idx.data<int64_t>(), idx.numElements(), in[2], out[0]);
  if (idx.dtype() == ir::DType::kI32)
    return gatherBackwardTyped(attrs, in[0], idx.data<int32_t>(), idx.numElements(), in[2], out[0]);
  return ref::unsupportedDType("gather_backward (indices)", idx.dtype());
}

// relayout: the same logical tensor in another memory order. The input's bytes are in layout
// `from`, the output's in `to`; both tensors carry the logical [N,C,H,W] shape.
Status relayoutKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                      std::span<Tensor> out) {
  const auto from = ir::parseLayout(attrs.getString("from"));
  const auto to = ir::parseLayout(attrs.getString("to"));
  const ir::Shape& shape = in[0].shape();
  const std::vector<int64_t> src = ir::TensorType{in[0].dtype(), shape, *from}.memoryStrides();
  // The output's memory order as a permutation of the logical dims.
  std::vector<int> order(shape.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  if (*to == ir::Layout::kNHWC && shape.size() == 4) order = {0, 2, 3, 1};
  ir::Shape dstShape;
  std::vector<int64_t> srcStrides;
  for (int d : order) {
    dstShape.push_back(shape[d]);
    srcStrides.push_back(src[d]);
  }
  if (out[0].numElements() == 0) return Status::ok();
  ref::copyStrided(in[0].rawData(), 0, srcStrides, out[0].rawData(), dstShape,
                   ir::dtypeSize(in[0].dtype()));
  return Status::ok();
}

}  // namespace

std::string resolvedIndexError(std::string_view op, std::string_view value, int dim, int64_t size) {
  return std::string(op) + ": index " + std::string(value) + " is out of range for dim " +
         std::to_string(dim) + " of size " + std::to_string(size);
}

Status checkResolvedIndices(std::string_view op, const Tensor& indices,
                            std::span<const int64_t> limits, std::span<const int> dims) {
  const std::string name(op);
  return byIndexType(name.c_str(), indices.dtype(), [&]<class I>(ref::Tag<I>) -> Status {
    const I* idx = indices.data<I>();
    const size_t k = limits.size();
    for (int64_t i = 0; i < indices.numElements(); ++i) {
      const size_t c = static_cast<size_t>(i) % k;
      KILN_TRY(
          resolveIndex(name.c_str(), static_cast<int64_t>(idx[i]), limits[c], dims[c]).status());
    }
    return Status::ok();
  });
}

std::string positionError(std::string_view op, std::string_view value, std::string_view position,
                          int64_t size, int axis, std::string_view data) {
  return std::string(op) + ": index " + std::string(value) + " (at flat position " +
         std::string(position) + ") is out of range for dim " + std::to_string(axis) + " of size " +
         std::to_string(size) + " in data " + std::string(data) +
         " (valid: " + std::to_string(-size) + ".." + std::to_string(size - 1) + ")";
}

Status checkPositions(std::string_view op, const Tensor& indices, int64_t size, int axis,
                      std::string_view data) {
  return byIndexType(std::string(op).c_str(), indices.dtype(), [&]<class I>(ref::Tag<I>) {
    return readPositions(op, indices.data<I>(), indices.numElements(), size, axis, data, nullptr);
  });
}

void registerMovementKernels(RefKernelTable& t) {
  using ir::OpKind;
  // Ops that only change the shape: the row-major bytes are the same.
  ref::setKernel(t, OpKind::kReshape, ref::identityKernel);
  ref::setKernel(t, OpKind::kBitcast, ref::identityKernel);  // The same bytes, another dtype.
  ref::setKernel(t, OpKind::kFlatten, ref::identityKernel);
  ref::setKernel(t, OpKind::kSqueeze, ref::identityKernel);
  ref::setKernel(t, OpKind::kUnsqueeze, ref::identityKernel);
  ref::setKernel(t, OpKind::kTranspose, transposeKernel);
  ref::setKernel(t, OpKind::kSlice, sliceKernel);
  ref::setKernel(t, OpKind::kExpand, expandKernel);
  ref::setKernel(t, OpKind::kConcat, concatKernel);
  ref::setKernel(t, OpKind::kGatherBackward, gatherBackwardKernel);
  ref::setKernel(t, OpKind::kGather, gatherKernel);
  ref::setKernel(t, OpKind::kGatherElements, gatherElementsKernel);
  ref::setKernel(t, OpKind::kScatterElements, scatterElementsKernel);
  ref::setKernel(t, OpKind::kScatterNd, scatterNdKernel);
  ref::setKernel(t, OpKind::kRelayout, relayoutKernel);
}

}  // namespace kiln::runtime
