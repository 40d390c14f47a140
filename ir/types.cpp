#include "ir/types.h"

#include <algorithm>
#include <array>

namespace kiln::ir {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeInfo, kNumDTypes> kDTypes = {{
    {DType::kF32, "f32", 4},
    {DType::kF64, "f64", 8},
    {DType::kF16, "f16", 2},
    {DType::kBF16, "bf16", 2},
    {DType::kI64, "i64", 8},
    {DType::kI32, "i32", 4},
    {DType::kI8, "i8", 1},
    {DType::kU8, "u8", 1},
    {DType::kBool, "bool", 1},
    {DType::kI16, "i16", 2},
    {DType::kU16, "u16", 2},
    {DType::kU32, "u32", 4},
    {DType::kU64, "u64", 8},
    {DType::kF8E4M3FN, "f8e4m3fn", 1},
    {DType::kF8E4M3FNUZ, "f8e4m3fnuz", 1},
    {DType::kF8E5M2, "f8e5m2", 1},
    {DType::kF8E5M2FNUZ, "f8e5m2fnuz", 1},
    {DType::kF4E2M1, "f4e2m1", 1},
    {DType::kI4, "i4", 1},
    {DType::kU4, "u4", 1},
    {DType::kI2, "i2", 1},
    {DType::kU2, "u2", 1},
    {DType::kF8E8M0, "f8e8m0", 1},
}};
}  // namespace

std::string_view dtypeName(DType t) {
  return kDTypes[static_cast<int>(t)].name;
}
size_t dtypeSize(DType t) {
  return kDTypes[static_cast<int>(t)].size;
}

std::optional<DType> parseDType(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.type;
  return std::nullopt;
}

bool isFloat(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kF16 || t == DType::kBF16;
}
bool isInteger(DType t) {
  return t == DType::kI64 || t == DType::kI32 || t == DType::kI16 || t == DType::kI8 ||
         t == DType::kU64 || t == DType::kU32 || t == DType::kU16 || t == DType::kU8;
}
bool isKernelDType(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kI64 || t == DType::kI32 ||
         t == DType::kI8 || t == DType::kU8 || t == DType::kBool || t == DType::kF16 ||
         t == DType::kBF16;
}

std::string_view layoutName(Layout l) {
  switch (l) {
    case Layout::kPlain:
      return "plain";
    case Layout::kNCHW:
      return "nchw";
    case Layout::kNHWC:
      return "nhwc";
  }
  return "?";
}

std::optional<Layout> parseLayout(std::string_view name) {
  if (name == "plain") return Layout::kPlain;
  if (name == "nchw") return Layout::kNCHW;
  if (name == "nhwc") return Layout::kNHWC;
  return std::nullopt;
}

int64_t numElements(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

bool accumulateElements(int64_t& elements, int64_t dim) {
  if (dim > kMaxElements / elements) return false;
  elements *= std::max<int64_t>(dim, 1);
  return true;
}

bool withinElementBound(const Shape& s) {
  int64_t elements = 1;
  for (int64_t d : s)
    if (d < 0 || !accumulateElements(elements, d)) return false;
  return true;
}

std::string shapeToString(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  return out + "]";
}

std::vector<int64_t> contiguousStrides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}

Expected<int> normalizeAxis(int64_t axis, size_t rank, const std::string& what) {
  const auto r = static_cast<int64_t>(rank);
  if (axis < -r || axis >= r)
    return invalidArgument(what + ": axis " + std::to_string(axis) + " is out of range for rank " +
                           std::to_string(rank) + " (expected " + std::to_string(-r) + ".." +
                           std::to_string(r - 1) + ")");
  return static_cast<int>(axis < 0 ? axis + r : axis);
}

Expected<Shape> broadcastShapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1)
      return invalidArgument("shapes " + shapeToString(a) + " and " + shapeToString(b) +
                             " do not broadcast (dimension " + std::to_string(i) + ": " +
                             std::to_string(da) + " vs " + std::to_string(db) + ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<int64_t> TensorType::memoryStrides() const {
  if (layout == Layout::kNHWC && shape.size() == 4) {
    const int64_t c = shape[1], h = shape[2], w = shape[3];
    return {h * w * c, 1, w * c, c};
  }
  return contiguousStrides(shape);
}

std::string TensorType::toString() const {
  std::string s = std::string(dtypeName(dtype)) + shapeToString(shape);
  if (layout != Layout::kPlain) s += "@" + std::string(layoutName(layout));
  return s;
}

}  // namespace kiln::ir
