#include "ir/printer.h"

#include <bit>
#include <cctype>
#include <charconv>
#include <cmath>

namespace kiln::ir {

namespace {

constexpr uint64_t kQuietNan = 0x7ff8000000000000ull;
constexpr uint64_t kSignBit = 0x8000000000000000ull;
constexpr char kHexDigits[] = "0123456789abcdef";

void appendHex(std::string& out, uint8_t byte) {
  out += kHexDigits[byte >> 4];
  out += kHexDigits[byte & 15];
}

// Graph names that lex as an identifier print bare; anything else is quoted.
bool isBareIdentifier(const std::string& s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_')) return false;
  for (char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

std::string valueRef(const Value* v) {
  return v ? "%" + v->name() : std::string("<null>");
}

std::string typedValue(const Value* v) {
  return v ? valueRef(v) + " : " + v->type().toString() : valueRef(v);
}

// A graph input; its symbolic dims print as name=size: %x : f32[batch=1,3,224,224].
std::string typedInput(const Value* v) {
  if (!v->hasDimNames()) return typedValue(v);
  const TensorType& t = v->type();
  std::string out = valueRef(v) + " : " + std::string(dtypeName(t.dtype)) + "[";
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (i) out += ",";
    if (!v->dimNames()[i].empty()) out += v->dimNames()[i] + "=";
    out += std::to_string(t.shape[i]);
  }
  out += "]";
  if (t.layout != Layout::kPlain) out += "@" + std::string(layoutName(t.layout));
  return out;
}

void printNode(std::string& out, const Node& n) {
  out += "  ";
  for (size_t i = 0; i < n.outputs().size(); ++i) {
    if (i) out += ", ";
    out += typedValue(n.outputs()[i]);
  }
  if (!n.outputs().empty()) out += " = ";
  out += opName(n.op());
  out += '(';
  for (size_t i = 0; i < n.inputs().size(); ++i) {
    if (i) out += ", ";
    out += valueRef(n.inputs()[i]);
  }
  out += ')';
  if (!n.attrs().empty()) {
    out += " {";
    bool first = true;
    for (const auto& [name, value] : n.attrs()) {
      if (!first) out += ", ";
      first = false;
      out += name + "=" + printAttrValue(value);
    }
    out += '}';
  }
  if (!n.name().empty()) out += " name=" + quoteString(n.name());
  out += '\n';
}

}  // namespace

std::string printFloat(double v) {
  const uint64_t bits = std::bit_cast<uint64_t>(v);
  if (std::isnan(v)) {
    if (bits == kQuietNan) return "nan";
    if (bits == (kQuietNan | kSignBit)) return "-nan";
    std::string s = "nan(0x";
    for (int shift = 60; shift >= 0; shift -= 4) s += kHexDigits[(bits >> shift) & 15];
    return s + ")";
  }
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string s(buf, ec == std::errc() ? end : buf);
  // Shortest form can look like an integer ("1", "-0"); keep it a float literal.
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string quoteString(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (u < 0x20 || u == 0x7f) {
          out += "\\x";
          appendHex(out, u);
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string printAttrValue(const AttrValue& v) {
  switch (kindOf(v)) {
    case AttrKind::kInt:
      return std::to_string(std::get<int64_t>(v));
    case AttrKind::kFloat:
      return printFloat(std::get<double>(v));
    case AttrKind::kString:
      return quoteString(std::get<std::string>(v));
    case AttrKind::kInts:
      return shapeToString(std::get<std::vector<int64_t>>(v));
    case AttrKind::kFloats: {
      std::string out = "[";
      const auto& fs = std::get<std::vector<double>>(v);
      for (size_t i = 0; i < fs.size(); ++i) {
        if (i) out += ',';
        out += printFloat(fs[i]);
      }
      return out + "]";
    }
    case AttrKind::kTensor: {
      // Raw bytes in memory order, so that every dtype (and every NaN payload) round-trips.
      const TensorData& t = std::get<TensorData>(v);
      std::string out = t.type().toString() + " 0x";
      out.reserve(out.size() + 2 * t.byteSize());
      for (std::byte b : t.bytes()) appendHex(out, static_cast<uint8_t>(b));
      return out;
    }
  }
  return "?";
}

std::string printGraph(const Graph& g) {
  std::string out = "graph ";
  out += isBareIdentifier(g.name()) ? g.name() : quoteString(g.name());
  out += '(';
  for (size_t i = 0; i < g.inputs().size(); ++i) {
    if (i) out += ", ";
    out += typedInput(g.inputs()[i]);
  }
  out += ") {\n";
  for (const Value* p : g.parameters()) {
    out += "  param " + typedValue(p);
    if (p->isState())
      out += " state";
    else if (!p->trainable())
      out += " buffer";
    out += '\n';
  }
  for (const Node* n : g.nodes()) printNode(out, *n);
  out += "  return";
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    out += i ? ", " : " ";
    out += valueRef(g.outputs()[i]);
  }
  out += "\n}\n";
  return out;
}

}  // namespace kiln::ir
