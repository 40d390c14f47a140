#include "ir/attributes.h"

#include <charconv>
#include <cmath>
#include <limits>

namespace kiln::ir {

std::string_view attrKindName(AttrKind k) {
  switch (k) {
    case AttrKind::kInt:
      return "int";
    case AttrKind::kFloat:
      return "float";
    case AttrKind::kString:
      return "string";
    case AttrKind::kInts:
      return "ints";
    case AttrKind::kFloats:
      return "floats";
    case AttrKind::kTensor:
      return "tensor";
  }
  return "?";
}

std::optional<AttrKind> parseAttrKind(std::string_view name) {
  for (int i = 0; i <= static_cast<int>(AttrKind::kTensor); ++i)
    if (attrKindName(static_cast<AttrKind>(i)) == name) return static_cast<AttrKind>(i);
  return std::nullopt;
}

bool attrEqual(const AttrValue& a, const AttrValue& b) {
  return a == b;
}

namespace {

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(sep, start);
    if (end == std::string_view::npos) end = s.size();
    parts.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

std::optional<double> parseDouble(std::string_view s) {
  if (s == "inf") return std::numeric_limits<double>::infinity();
  if (s == "-inf") return -std::numeric_limits<double>::infinity();
  try {
    size_t used = 0;
    double v = std::stod(std::string(s), &used);
    if (used != s.size()) return std::nullopt;
    return v;
  } catch (...) {
    return std::nullopt;
  }
}

std::optional<int64_t> parseInt(std::string_view s) {
  int64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<AttrValue> parseDefault(AttrKind kind, std::string_view text) {
  switch (kind) {
    case AttrKind::kInt:
      if (auto v = parseInt(text)) return AttrValue(*v);
      return std::nullopt;
    case AttrKind::kFloat:
      if (auto v = parseDouble(text)) return AttrValue(*v);
      return std::nullopt;
    case AttrKind::kString:
      return AttrValue(std::string(text));
    case AttrKind::kInts: {
      std::vector<int64_t> out;
      if (!text.empty())
        for (auto p : split(text, ',')) {
          auto v = parseInt(p);
          if (!v) return std::nullopt;
          out.push_back(*v);
        }
      return AttrValue(out);
    }
    case AttrKind::kFloats: {
      std::vector<double> out;
      if (!text.empty())
        for (auto p : split(text, ',')) {
          auto v = parseDouble(p);
          if (!v) return std::nullopt;
          out.push_back(*v);
        }
      return AttrValue(out);
    }
    case AttrKind::kTensor:
      return std::nullopt;  // Tensor attributes have no defaults.
  }
  return std::nullopt;
}

}  // namespace

Expected<std::vector<AttrSpec>> parseAttrSpecs(std::string_view spec) {
  std::vector<AttrSpec> out;
  if (spec.empty()) return out;
  for (auto item : split(spec, ';')) {
    const size_t colon = item.find(':');
    if (colon == std::string_view::npos)
      return internalError("attribute spec '" + std::string(item) + "' has no ':kind'");
    AttrSpec a;
    a.name = std::string(item.substr(0, colon));
    std::string_view rest = item.substr(colon + 1);
    const size_t eq = rest.find('=');
    auto kind = parseAttrKind(rest.substr(0, eq));
    if (!kind) return internalError("attribute spec '" + std::string(item) + "' has a bad kind");
    a.kind = *kind;
    if (eq != std::string_view::npos) {
      a.defaultValue = parseDefault(a.kind, rest.substr(eq + 1));
      if (!a.defaultValue)
        return internalError("attribute spec '" + std::string(item) + "' has a bad default");
    }
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace kiln::ir
