// DType, Shape and TensorType: the static type of every value in a kiln graph.
// Shapes are logical (NCHW order for images); the layout tag says how memory is ordered.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/status.h"

namespace kiln::ir {

// New dtypes go at the end: artifacts store the enum value.
enum class DType : uint8_t {
  kF32,
  kF64,
  kF16,
  kBF16,
  kI64,
  kI32,
  kI8,
  kU8,
  kBool,
  kI16,
  kU16,
  kU32,
  kU64,
  // ONNX's narrow storage formats (ir/narrow.h): one element per byte.
  kF8E4M3FN,
  kF8E4M3FNUZ,
  kF8E5M2,
  kF8E5M2FNUZ,
  kF4E2M1,
  kI4,
  kU4,
  kI2,
  kU2,
  kF8E8M0
};
inline constexpr int kNumDTypes = 23;

// Short name used by the text IR and JSON ("f32", "i64", "bool", ...).
std::string_view dtypeName(DType t);
std::optional<DType> parseDType(std::string_view name);
size_t dtypeSize(DType t);
bool isFloat(DType t);    // f32, f64, f16, bf16
bool isInteger(DType t);  // i64, i32, i16, i8, u64, u32, u16, u8 (not bool, not i4 and i2)
// The dtypes generated kernels read and write (codegen::ScalarType): f32, f64, i64, i32, i8,
// u8, bool, and f16/bf16 as storage (computed in f32). Nodes on other dtypes run on the
// reference kernels.
bool isKernelDType(DType t);

// Memory order of a tensor. Shapes stay logical; NHWC means a 4-D tensor whose logical
// dims are [N,C,H,W] is stored channels-last.
enum class Layout : uint8_t { kPlain, kNCHW, kNHWC };
std::string_view layoutName(Layout l);
std::optional<Layout> parseLayout(std::string_view name);

using Shape = std::vector<int64_t>;

int64_t numElements(const Shape& s);
// The bound on every value's type: the product of its dims, zeros counted as ones, at most 2^48,
// so that element counts, byte sizes (2^48 elements of 8 bytes is 2^51 bytes) and the products
// shape inference forms never overflow int64. accumulateElements multiplies a running count by
// one dim, false once it would pass the bound; withinElementBound checks a whole shape.
inline constexpr int64_t kMaxElements = int64_t{1} << 48;
bool accumulateElements(int64_t& elements, int64_t dim);
bool withinElementBound(const Shape& s);
std::string shapeToString(const Shape& s);  // "[1,3,224,224]"
// Row-major (contiguous) strides in elements.
std::vector<int64_t> contiguousStrides(const Shape& s);
// Normalizes a possibly negative axis against rank; error names `what`.
Expected<int> normalizeAxis(int64_t axis, size_t rank, const std::string& what);
// NumPy broadcasting of two shapes; the error names both shapes.
Expected<Shape> broadcastShapes(const Shape& a, const Shape& b);

struct TensorType {
  DType dtype = DType::kF32;
  Shape shape;
  Layout layout = Layout::kPlain;

  int rank() const { return static_cast<int>(shape.size()); }
  int64_t numElements() const { return ir::numElements(shape); }
  size_t byteSize() const { return static_cast<size_t>(numElements()) * dtypeSize(dtype); }
  std::string toString() const;  // "f32[1,64,56,56]" or "f32[1,64,56,56]@nhwc"
  // Element strides of the logical dims in memory: row-major, except NHWC (rank 4), where
  // channels are innermost: [H*W*C, 1, W*C, C].
  std::vector<int64_t> memoryStrides() const;
  bool operator==(const TensorType&) const = default;
};

}  // namespace kiln::ir
