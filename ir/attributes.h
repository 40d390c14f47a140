// Typed node attributes (int, float, string, ints, floats, tensor) and the per-op attribute
// schema parsed from the spec strings in ops.def.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ir/tensor_data.h"

namespace kiln::ir {

enum class AttrKind : uint8_t { kInt, kFloat, kString, kInts, kFloats, kTensor };
std::string_view attrKindName(AttrKind k);
std::optional<AttrKind> parseAttrKind(std::string_view name);

// Index order matches AttrKind.
using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>,
                               std::vector<double>, TensorData>;
inline AttrKind kindOf(const AttrValue& v) {
  return static_cast<AttrKind>(v.index());
}
bool attrEqual(const AttrValue& a, const AttrValue& b);

// Ordered so that printing is deterministic.
using AttrMap = std::map<std::string, AttrValue>;

struct AttrSpec {
  std::string name;
  AttrKind kind;
  std::optional<AttrValue> defaultValue;  // Absent: the attribute is required.
};

// Parses "axis:int=-1;shape:ints;approximate:string=none". Empty string: no attributes.
// Float defaults accept "inf" and "-inf". Called on the literal specs in ops.def, so a
// malformed spec is a kiln bug (reported as kInternal).
Expected<std::vector<AttrSpec>> parseAttrSpecs(std::string_view spec);

}  // namespace kiln::ir
