#include "ir/parser.h"

#include <algorithm>
#include <bit>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/verifier.h"

namespace kiln::ir {

namespace {

constexpr uint64_t kQuietNan = 0x7ff8000000000000ull;
constexpr uint64_t kSignBit = 0x8000000000000000ull;
constexpr const char* kColonHint =
    " (value names may contain ':', so write '%x : f32[...]' with spaces)";

bool isIdentStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) || c == '_';
}
bool isIdentChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
}
bool isNameChar(char c) {
  return isIdentChar(c) || c == '.' || c == '-' || c == '/' || c == ':';
}
bool isDigit(char c) {
  return c >= '0' && c <= '9';
}
bool isHexDigit(char c) {
  return std::isxdigit(static_cast<unsigned char>(c)) != 0;
}
int hexValue(char c) {
  return isDigit(c) ? c - '0' : std::tolower(static_cast<unsigned char>(c)) - 'a' + 10;
}

enum class Tok : uint8_t { kEnd, kIdent, kValue, kNumber, kHex, kString, kPunct, kError };

struct Token {
  Tok kind = Tok::kEnd;
  std::string_view text;  // Source text; a kValue's name without the '%'.
  size_t pos = 0;         // Byte offset of the token's first character.
};

// Splits the source into tokens on demand. A malformed token yields kError and keeps the
// message, which the parser reports at the token's position.
class Lexer {
 public:
  explicit Lexer(std::string_view src) : src_(src) {}

  Token next() {
    skipSpaceAndComments();
    const size_t start = pos_;
    if (pos_ >= src_.size()) return {Tok::kEnd, {}, start};
    const char c = src_[pos_];
    if (isIdentStart(c)) {
      while (pos_ < src_.size() && isIdentChar(src_[pos_])) ++pos_;
      return {Tok::kIdent, src_.substr(start, pos_ - start), start};
    }
    if (c == '%') {
      ++pos_;
      while (pos_ < src_.size() && isNameChar(src_[pos_])) ++pos_;
      if (pos_ == start + 1) return fail(start, "expected a value name after '%'");
      return {Tok::kValue, src_.substr(start + 1, pos_ - start - 1), start};
    }
    if (isDigit(c) || (c == '-' && pos_ + 1 < src_.size() && isDigit(src_[pos_ + 1])))
      return lexNumber(start);
    if (c == '"') return lexString(start);
    if (c != '\0' && std::strchr("(){}[],=:@-", c)) {
      ++pos_;
      return {Tok::kPunct, src_.substr(start, 1), start};
    }
    const auto u = static_cast<unsigned char>(c);
    if (std::isprint(u)) return fail(start, std::string("unexpected character '") + c + "'");
    static constexpr char kHex[] = "0123456789abcdef";
    return fail(start, std::string("unexpected byte 0x") + kHex[u >> 4] + kHex[u & 15]);
  }

  const std::string& errorMessage() const { return error_; }

 private:
  void skipSpaceAndComments() {
    while (pos_ < src_.size()) {
      const char c = src_[pos_];
      if (c == '#') {
        while (pos_ < src_.size() && src_[pos_] != '\n') ++pos_;
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  Token fail(size_t at, std::string message) {
    error_ = std::move(message);
    pos_ = src_.size();  // Everything after a lexical error is unreliable.
    return {Tok::kError, {}, at};
  }

  Token lexNumber(size_t start) {
    if (src_[pos_] == '0' && pos_ + 1 < src_.size() && (src_[pos_ + 1] | 0x20) == 'x') {
      pos_ += 2;
      while (pos_ < src_.size() && isHexDigit(src_[pos_])) ++pos_;
      if (pos_ < src_.size() && isIdentChar(src_[pos_]))
        return fail(pos_, "malformed hex literal (expected hex digits)");
      return {Tok::kHex, src_.substr(start, pos_ - start), start};
    }
    if (src_[pos_] == '-') ++pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < src_.size() && isDigit(src_[pos_])) ++pos_;
      return pos_ > from;
    };
    digits();
    if (pos_ < src_.size() && src_[pos_] == '.') {
      ++pos_;
      digits();
    }
    if (pos_ < src_.size() && (src_[pos_] | 0x20) == 'e') {
      ++pos_;
      if (pos_ < src_.size() && (src_[pos_] == '+' || src_[pos_] == '-')) ++pos_;
      if (!digits()) return fail(start, "malformed number (expected digits after the exponent)");
    }
    if (pos_ < src_.size() && (isIdentChar(src_[pos_]) || src_[pos_] == '.'))
      return fail(
          start, "malformed number '" +
                     std::string(src_.substr(start, std::min<size_t>(pos_ + 1 - start, 40))) + "'");
    return {Tok::kNumber, src_.substr(start, pos_ - start), start};
  }

  // Checks escapes here so that the parser can decode without failing.
  Token lexString(size_t start) {
    ++pos_;
    while (pos_ < src_.size() && src_[pos_] != '"') {
      const char c = src_[pos_];
      if (c == '\n') break;
      if (c == '\\') {
        const size_t escape = pos_;
        ++pos_;
        if (pos_ >= src_.size()) break;
        const char e = src_[pos_];
        if (e == 'x') {
          if (pos_ + 2 >= src_.size() || !isHexDigit(src_[pos_ + 1]) || !isHexDigit(src_[pos_ + 2]))
            return fail(escape, "bad escape in string: \\x needs two hex digits");
          pos_ += 2;
        } else if (e != '"' && e != '\\' && e != 'n' && e != 't') {
          return fail(escape, "bad escape in string (use \\\" \\\\ \\n \\t or \\xHH)");
        }
      }
      ++pos_;
    }
    if (pos_ >= src_.size() || src_[pos_] != '"')
      return fail(start, "unterminated string (strings end on the same line)");
    ++pos_;
    return {Tok::kString, src_.substr(start, pos_ - start), start};
  }

  std::string_view src_;
  size_t pos_ = 0;
  std::string error_;
};

std::string decodeString(std::string_view quoted) {
  std::string out;
  for (size_t i = 1; i + 1 < quoted.size(); ++i) {
    char c = quoted[i];
    if (c == '\\') {
      const char e = quoted[++i];
      if (e == 'n') {
        c = '\n';
      } else if (e == 't') {
        c = '\t';
      } else if (e == 'x') {
        c = static_cast<char>(hexValue(quoted[i + 1]) * 16 + hexValue(quoted[i + 2]));
        i += 2;
      } else {
        c = e;
      }
    }
    out += c;
  }
  return out;
}

std::string suggestOp(std::string_view original) {
  if (original.size() > 64) return "";
  std::string name(original);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string_view best;
  size_t bestDist = std::max<size_t>(1, name.size() / 3) + 1;
  for (int k = 0; k < kNumOps; ++k) {
    const std::string_view candidate = opName(static_cast<OpKind>(k));
    size_t d = nameDistance(name, candidate);
    // "conv" for "conv2d", "softmax" for "log_softmax": a prefix or suffix is close too.
    if (name.size() >= 3 && (candidate.starts_with(name) || candidate.ends_with(name))) d = 1;
    if (d < bestDist) {
      bestDist = d;
      best = candidate;
    }
  }
  return best.empty() ? "" : " (did you mean '" + std::string(best) + "'?)";
}

std::string dtypeList() {
  std::string s;
  for (int i = 0; i < kNumDTypes; ++i)
    s += (i ? ", " : "") + std::string(dtypeName(static_cast<DType>(i)));
  return s;
}

// Source text quoted in a message: shortened, control bytes shown as '?'.
std::string clip(std::string_view s, size_t n = 40) {
  std::string out(s.substr(0, n));
  for (char& c : out)
    if (!std::isprint(static_cast<unsigned char>(c)) && !(static_cast<unsigned char>(c) & 0x80))
      c = '?';
  return s.size() <= n ? out : out + "...";
}

class Parser {
 public:
  explicit Parser(std::string_view src) : src_(src), lex_(src) { tok_ = lex_.next(); }

  Expected<Graph> parseGraph();
  Expected<TensorType> parseTypeOnly();
  Expected<AttrValue> parseAttrValueOnly(AttrKind kind);

 private:
  // ---- Tokens and errors.
  Token take() {
    Token t = tok_;
    tok_ = lex_.next();
    return t;
  }
  bool atPunct(char c) const {
    return tok_.kind == Tok::kPunct && tok_.text.size() == 1 && tok_.text[0] == c;
  }
  bool atWord(std::string_view w) const { return tok_.kind == Tok::kIdent && tok_.text == w; }
  std::string describe(const Token& t) const;
  Status errorAt(size_t pos, const std::string& message) const;
  // "expected X, got Y" at the current token, or the lexer's own error.
  Status unexpected(const std::string& expected) const;
  Status expectPunct(char c, const std::string& context);
  Status expectEnd(const std::string& what);
  // The ':' between a value name and its type, with a hint when the name swallowed it.
  Status expectTypeColon(const Token& name, const std::string& context);
  std::string lineCol(size_t pos) const;

  // ---- Pieces.
  // `dimNames`: where a graph input's symbolic dim names go (batch=1); elsewhere nullptr, and
  // a name is an error.
  Expected<TensorType> parseType(std::vector<std::string>* dimNames = nullptr);
  Expected<int64_t> parseInt(const std::string& what);
  Expected<double> parseFloat();
  Expected<AttrValue> parseValue(AttrKind kind, const std::string& what);
  Status kindMismatch(AttrKind kind, const std::string& what) const;
  // A name may be defined once; checkNewName reports a clash, defineName records it.
  Status checkNewName(const Token& nameTok) const;
  Status defineName(const Token& nameTok);
  Expected<Value*> parseRef(Graph& g);
  Status parseParam(Graph& g);
  Status parseNode(Graph& g);
  Expected<AttrMap> parseAttrs(const OpInfo& op);
  Status parseReturn(Graph& g);

  std::string_view src_;
  Lexer lex_;
  Token tok_;
  std::unordered_map<std::string, size_t> definedAt_;
};

std::string Parser::describe(const Token& t) const {
  switch (t.kind) {
    case Tok::kEnd:
      return "end of input";
    case Tok::kValue:
      return "'%" + clip(t.text) + "'";
    case Tok::kString:
      return "string " + clip(t.text);
    case Tok::kNumber:
      return "number " + clip(t.text);
    default:
      return "'" + clip(t.text) + "'";
  }
}

std::string Parser::lineCol(size_t pos) const {
  pos = std::min(pos, src_.size());
  const size_t line = 1 + static_cast<size_t>(std::count(src_.begin(), src_.begin() + pos, '\n'));
  const size_t lineStart = src_.rfind('\n', pos == 0 ? 0 : pos - 1);
  const size_t col = pos - (lineStart == std::string_view::npos || pos == 0 ? 0 : lineStart + 1);
  return std::to_string(line) + ":" + std::to_string(col + 1);
}

Status Parser::errorAt(size_t pos, const std::string& message) const {
  pos = std::min(pos, src_.size());
  size_t lineStart = pos == 0 ? 0 : src_.rfind('\n', pos - 1);
  lineStart = lineStart == std::string_view::npos || pos == 0 ? 0 : lineStart + 1;
  size_t lineEnd = src_.find('\n', pos);
  if (lineEnd == std::string_view::npos) lineEnd = src_.size();
  // Show the line with a caret under the error; a long line shows a window around it.
  const size_t from = pos - lineStart > 60 ? pos - 60 : lineStart;
  const size_t to = std::min(lineEnd, pos + 60);
  std::string excerpt = "  ", caret = "  ";
  for (size_t i = from; i < to; ++i) {
    const char c = src_[i];
    const bool printable = std::isprint(static_cast<unsigned char>(c)) || c == '\t';
    excerpt += printable ? c : '?';
    if (i < pos) caret += c == '\t' ? '\t' : ' ';
  }
  return invalidArgument(lineCol(pos) + ": " + message + "\n" + excerpt + "\n" + caret + "^");
}

Status Parser::unexpected(const std::string& expected) const {
  if (tok_.kind == Tok::kError) return errorAt(tok_.pos, lex_.errorMessage());
  return errorAt(tok_.pos, "expected " + expected + ", got " + describe(tok_));
}

Status Parser::expectPunct(char c, const std::string& context) {
  if (!atPunct(c)) return unexpected(std::string("'") + c + "' " + context);
  take();
  return Status::ok();
}

Status Parser::expectEnd(const std::string& what) {
  if (tok_.kind == Tok::kEnd) return Status::ok();
  if (tok_.kind == Tok::kError) return unexpected("");
  return errorAt(tok_.pos, "unexpected " + describe(tok_) + " after " + what);
}

Status Parser::expectTypeColon(const Token& name, const std::string& context) {
  if (atPunct(':')) {
    take();
    return Status::ok();
  }
  if (tok_.kind == Tok::kError || name.text.find(':') == std::string_view::npos)
    return unexpected("':' and a type " + context);
  return errorAt(tok_.pos,
                 "expected ':' and a type " + context + ", got " + describe(tok_) + kColonHint);
}

Expected<TensorType> Parser::parseType(std::vector<std::string>* dimNames) {
  if (tok_.kind != Tok::kIdent) return unexpected("a type such as f32[1,3]");
  TensorType t;
  const Token dt = take();
  auto dtype = parseDType(dt.text);
  if (!dtype)
    return errorAt(dt.pos,
                   "unknown dtype '" + clip(dt.text) + "' (expected one of " + dtypeList() + ")");
  t.dtype = *dtype;
  KILN_TRY(expectPunct('[', "after the dtype (a scalar is written f32[])"));
  int64_t elements = 1;
  if (!atPunct(']')) {
    for (;;) {
      std::string dimName;
      if (tok_.kind == Tok::kIdent) {
        if (!dimNames)
          return unexpected("a dimension (symbolic dims such as batch=1 are for graph inputs)");
        const Token n = take();
        dimName = std::string(n.text);
        if (!Graph::isValidDimName(dimName))
          return errorAt(n.pos, "symbolic dim name '" + clip(n.text) +
                                    "' is not an identifier (letters, digits and _)");
        KILN_TRY(expectPunct('=', "after the symbolic dim name (batch=1)"));
      }
      if (tok_.kind != Tok::kNumber) return unexpected("a dimension");
      if (dimNames) dimNames->push_back(std::move(dimName));
      const Token d = tok_;
      KILN_ASSIGN_OR_RETURN(int64_t dim, parseInt("a dimension"));
      if (dim < 0)
        return errorAt(d.pos, "dimension " + std::to_string(dim) +
                                  " is negative (kiln shapes are static and >= 0)");
      if (!accumulateElements(elements, dim))
        return errorAt(d.pos, "type has more than 2^48 elements");
      t.shape.push_back(dim);
      if (atPunct(']')) break;
      KILN_TRY(expectPunct(',', "or ']' in the shape"));
    }
  }
  take();  // ']'
  if (atPunct('@')) {
    take();
    if (tok_.kind != Tok::kIdent) return unexpected("a layout (nchw, nhwc or plain) after '@'");
    const Token l = take();
    auto layout = parseLayout(l.text);
    if (!layout)
      return errorAt(l.pos, "unknown layout '" + clip(l.text) + "' (expected nchw, nhwc or plain)");
    t.layout = *layout;
  }
  return t;
}

Expected<int64_t> Parser::parseInt(const std::string& what) {
  if (tok_.kind != Tok::kNumber) return unexpected(what);
  const Token t = take();
  if (t.text.find_first_of(".eE") != std::string_view::npos)
    return errorAt(t.pos, what + " must be an integer, got " + describe(t));
  int64_t v = 0;
  auto [end, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
  if (ec != std::errc() || end != t.text.data() + t.text.size())
    return errorAt(t.pos, "integer " + clip(t.text) + " is out of range for int64");
  return v;
}

Expected<double> Parser::parseFloat() {
  bool negate = false;
  if (atPunct('-')) {
    take();
    negate = true;
  }
  double v = 0;
  if (tok_.kind == Tok::kNumber) {
    const Token t = take();
    auto [end, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
    if (ec != std::errc() || end != t.text.data() + t.text.size())
      return errorAt(t.pos, "number " + clip(t.text) + " is out of range for a float");
  } else if (atWord("inf")) {
    take();
    v = std::numeric_limits<double>::infinity();
  } else if (atWord("nan")) {
    take();
    uint64_t bits = kQuietNan;
    if (atPunct('(')) {
      take();
      if (tok_.kind != Tok::kHex || tok_.text.size() != 18)
        return unexpected("the 64-bit pattern of a NaN, e.g. 0x7ff8000000000001");
      const Token h = take();
      bits = 0;
      for (char c : h.text.substr(2)) bits = bits << 4 | static_cast<uint64_t>(hexValue(c));
      if (!std::isnan(std::bit_cast<double>(bits)))
        return errorAt(h.pos, "bit pattern " + std::string(h.text) + " is not a NaN");
      KILN_TRY(expectPunct(')', "after the NaN bits"));
    }
    v = std::bit_cast<double>(bits);
  } else {
    return unexpected(negate ? "a number, inf or nan after '-'" : "a float");
  }
  if (negate) v = std::bit_cast<double>(std::bit_cast<uint64_t>(v) ^ kSignBit);
  return v;
}

// What the user wrote instead of a value of `kind`, for "must be int, got float 1.5".
Status Parser::kindMismatch(AttrKind kind, const std::string& what) const {
  if (tok_.kind == Tok::kError || tok_.kind == Tok::kEnd) return unexpected("a value for " + what);
  std::string got = describe(tok_);
  if (tok_.kind == Tok::kNumber)
    got = (tok_.text.find_first_of(".eE") != std::string_view::npos ? "float " : "int ") +
          clip(tok_.text);
  else if (tok_.kind == Tok::kString)
    got = "string " + clip(tok_.text);
  else if (atPunct('['))
    got = "a list";
  else if (atWord("inf") || atWord("nan") || atPunct('-'))
    got = "float " + std::string(atPunct('-') ? "-" : tok_.text);
  else if (tok_.kind == Tok::kIdent && parseDType(tok_.text))
    got = "a tensor";
  return errorAt(tok_.pos, what + " must be " + std::string(attrKindName(kind)) + ", got " + got);
}

Expected<AttrValue> Parser::parseValue(AttrKind kind, const std::string& what) {
  const bool number = tok_.kind == Tok::kNumber;
  const bool floatLike = number || atPunct('-') || atWord("inf") || atWord("nan");
  switch (kind) {
    case AttrKind::kInt: {
      if (!number || tok_.text.find_first_of(".eE") != std::string_view::npos)
        return kindMismatch(kind, what);
      KILN_ASSIGN_OR_RETURN(int64_t v, parseInt(what));
      return AttrValue(v);
    }
    case AttrKind::kFloat: {
      if (!floatLike) return kindMismatch(kind, what);
      KILN_ASSIGN_OR_RETURN(double v, parseFloat());
      return AttrValue(v);
    }
    case AttrKind::kString: {
      if (tok_.kind != Tok::kString) return kindMismatch(kind, what);
      return AttrValue(decodeString(take().text));
    }
    case AttrKind::kInts:
    case AttrKind::kFloats: {
      if (!atPunct('[')) return kindMismatch(kind, what);
      take();
      std::vector<int64_t> ints;
      std::vector<double> floats;
      const AttrKind element = kind == AttrKind::kInts ? AttrKind::kInt : AttrKind::kFloat;
      while (!atPunct(']')) {
        const size_t index = ints.size() + floats.size();
        if (index > 0) KILN_TRY(expectPunct(',', "or ']' in the list"));
        KILN_ASSIGN_OR_RETURN(
            AttrValue v, parseValue(element, "element " + std::to_string(index) + " of " + what));
        if (element == AttrKind::kInt)
          ints.push_back(std::get<int64_t>(v));
        else
          floats.push_back(std::get<double>(v));
      }
      take();  // ']'
      if (kind == AttrKind::kInts) return AttrValue(std::move(ints));
      return AttrValue(std::move(floats));
    }
    case AttrKind::kTensor: {
      if (tok_.kind != Tok::kIdent || !parseDType(tok_.text)) return kindMismatch(kind, what);
      const size_t typePos = tok_.pos;
      KILN_ASSIGN_OR_RETURN(TensorType t, parseType());
      if (t.layout != Layout::kPlain)
        return errorAt(typePos, "tensor values have no layout; drop the '@" +
                                    std::string(layoutName(t.layout)) + "'");
      if (tok_.kind != Tok::kHex) return unexpected("the tensor's bytes as 0x<hex> after its type");
      const Token h = take();
      const size_t bytes = static_cast<size_t>(t.numElements()) * dtypeSize(t.dtype);
      const size_t digits = h.text.size() - 2;
      // Checked before allocating, so that a huge declared shape costs nothing.
      if (digits != 2 * bytes)
        return errorAt(h.pos, "tensor " + t.toString() + " needs " + std::to_string(2 * bytes) +
                                  " hex digits (" + std::to_string(bytes) + " bytes), got " +
                                  std::to_string(digits));
      TensorData data(t.dtype, t.shape);
      for (size_t i = 0; i < bytes; ++i)
        data.data()[i] =
            static_cast<std::byte>(hexValue(h.text[2 + 2 * i]) * 16 + hexValue(h.text[3 + 2 * i]));
      return AttrValue(std::move(data));
    }
  }
  return kindMismatch(kind, what);
}

Status Parser::checkNewName(const Token& nameTok) const {
  const std::string name(nameTok.text);
  if (auto it = definedAt_.find(name); it != definedAt_.end())
    return errorAt(nameTok.pos, "duplicate value name '%" + clip(name) + "' (first defined at " +
                                    lineCol(it->second) + ")");
  if (!Graph::isValidName(name))
    return errorAt(nameTok.pos, "value name '%" + clip(name) + "' is longer than 256 characters");
  return Status::ok();
}

Status Parser::defineName(const Token& nameTok) {
  KILN_TRY(checkNewName(nameTok));
  definedAt_.emplace(std::string(nameTok.text), nameTok.pos);
  return Status::ok();
}

Expected<Value*> Parser::parseRef(Graph& g) {
  if (tok_.kind != Tok::kValue) return unexpected("a value such as %x");
  const Token t = take();
  Value* v = g.findValue(std::string(t.text));
  if (!v)
    return errorAt(t.pos, "undefined value '%" + clip(t.text) +
                              "' (values must be defined before they are used)");
  return v;
}

Status Parser::parseParam(Graph& g) {
  take();  // 'param'
  if (tok_.kind != Tok::kValue) return unexpected("a parameter name such as %weight");
  const Token name = take();
  KILN_TRY(expectTypeColon(name, "after the parameter name"));
  KILN_ASSIGN_OR_RETURN(TensorType type, parseType());
  bool trainable = true, state = false;
  if (atWord("buffer") || atWord("state")) {
    state = atWord("state");
    take();
    trainable = false;
  }
  KILN_TRY(defineName(name));
  auto v = g.addParameter(std::string(name.text), std::move(type), trainable);
  if (!v) return errorAt(name.pos, v.status().message());
  if (state) KILN_TRY(g.markState(*v));
  return Status::ok();
}

Status Parser::parseNode(Graph& g) {
  struct Out {
    Token name;
    std::optional<TensorType> type;
    size_t typePos = 0;
  };
  std::vector<Out> outs;
  if (tok_.kind == Tok::kValue) {
    for (;;) {
      Out o{take(), std::nullopt, 0};
      KILN_TRY(checkNewName(o.name));
      for (const Out& earlier : outs)
        if (earlier.name.text == o.name.text)
          return errorAt(o.name.pos, "duplicate value name '%" + clip(o.name.text) +
                                         "' (first defined at " + lineCol(earlier.name.pos) + ")");
      if (atPunct(':')) {
        take();
        o.typePos = tok_.pos;
        KILN_ASSIGN_OR_RETURN(TensorType t, parseType());
        o.type = std::move(t);
      }
      outs.push_back(std::move(o));
      if (!atPunct(',')) break;
      take();
      if (tok_.kind != Tok::kValue) return unexpected("another output value after ','");
    }
    if (!atPunct('=')) {
      std::string hint;
      if (outs.back().name.text.find(':') != std::string_view::npos && !outs.back().type)
        hint = kColonHint;
      if (tok_.kind == Tok::kError) return unexpected("");
      return errorAt(
          tok_.pos, "expected '=' and an op after the output values, got " + describe(tok_) + hint);
    }
    take();
  }
  if (tok_.kind != Tok::kIdent) return unexpected("an op name");
  const Token opTok = take();
  const OpInfo* op = findOp(opTok.text);
  if (!op)
    return errorAt(opTok.pos, "unknown op '" + clip(opTok.text) + "'" + suggestOp(opTok.text));

  KILN_TRY(expectPunct('(', "after the op name"));
  std::vector<Value*> inputs;
  while (!atPunct(')')) {
    if (!inputs.empty()) KILN_TRY(expectPunct(',', "or ')' in the inputs"));
    if (tok_.kind == Tok::kValue)
      for (const Out& o : outs)
        if (o.name.text == tok_.text)
          return errorAt(tok_.pos, "node reads its own output '%" + clip(tok_.text) + "'");
    KILN_ASSIGN_OR_RETURN(Value * v, parseRef(g));
    inputs.push_back(v);
  }
  take();  // ')'

  KILN_ASSIGN_OR_RETURN(AttrMap attrs, parseAttrs(*op));

  std::string nodeName;
  if (atWord("name")) {
    take();
    KILN_TRY(expectPunct('=', "after 'name'"));
    if (tok_.kind != Tok::kString) return unexpected("the node name as a string");
    nodeName = decodeString(take().text);
  }

  for (const Out& o : outs) KILN_TRY(defineName(o.name));
  std::vector<std::pair<std::string, TensorType>> outTypes;
  for (const Out& o : outs)
    outTypes.emplace_back(std::string(o.name.text), o.type.value_or(TensorType{}));
  std::vector<TensorType> inTypes;
  for (const Value* v : inputs) inTypes.push_back(v->type());

  auto node =
      g.addNodeWithTypes(op->kind, std::move(inputs), std::move(attrs), std::move(outTypes));
  if (!node) return errorAt(opTok.pos, node.status().message());
  Node* n = *node;
  n->setName(std::move(nodeName));

  // Checked here as well as by the verifier so that errors point at the statement.
  auto inferred = inferTypes(op->kind, inTypes, n->attrs());
  if (!inferred) return errorAt(opTok.pos, n->describe() + ": " + inferred.status().message());
  if (inferred->size() != outs.size())
    return errorAt(opTok.pos, n->describe() + ": op '" + std::string(op->name) + "' produces " +
                                  std::to_string(inferred->size()) +
                                  " output(s), the statement names " + std::to_string(outs.size()));
  for (size_t i = 0; i < outs.size(); ++i) {
    Value* out = n->outputs()[i];
    const TensorType& want = (*inferred)[i];
    if (!outs[i].type) {
      // Inferred types obey the same bound as written ones (expand/reshape can blow up).
      int64_t elements = 1;
      for (int64_t d : want.shape)
        if (!accumulateElements(elements, d))
          return errorAt(outs[i].name.pos, n->describe() + ": inferred type of '%" + out->name() +
                                               "' has more than 2^48 elements");
      out->setType(want);
    } else if (want.dtype != out->type().dtype || want.shape != out->type().shape) {
      return errorAt(outs[i].typePos, n->describe() + ": output '%" + out->name() +
                                          "' is declared " + out->type().toString() +
                                          " but the op produces " + want.toString());
    }
  }
  return Status::ok();
}

Expected<AttrMap> Parser::parseAttrs(const OpInfo& op) {
  AttrMap attrs;
  if (!atPunct('{')) return attrs;
  take();
  while (!atPunct('}')) {
    if (!attrs.empty()) KILN_TRY(expectPunct(',', "or '}' in the attributes"));
    if (tok_.kind != Tok::kIdent) return unexpected("an attribute name");
    const Token nameTok = take();
    const std::string name(nameTok.text);
    const AttrSpec* spec = op.findAttr(name);
    if (!spec) {
      std::string known;
      for (const auto& a : op.attrs) known += (known.empty() ? "" : ", ") + a.name;
      return errorAt(nameTok.pos, "op '" + std::string(op.name) + "' has no attribute '" +
                                      clip(name) +
                                      "' (it takes: " + (known.empty() ? "none" : known) + ")");
    }
    if (attrs.count(name)) return errorAt(nameTok.pos, "attribute '" + name + "' is given twice");
    KILN_TRY(expectPunct('=', "after the attribute name"));
    // The schema gives the kind, so `[]` and `1` are read as the op expects.
    KILN_ASSIGN_OR_RETURN(AttrValue v, parseValue(spec->kind, "attribute '" + name + "' of op '" +
                                                                  std::string(op.name) + "'"));
    attrs.emplace(name, std::move(v));
  }
  take();  // '}'
  return attrs;
}

Status Parser::parseReturn(Graph& g) {
  const Token ret = take();
  if (tok_.kind != Tok::kValue) {
    if (atPunct('}'))
      return errorAt(ret.pos, "graph '" + g.name() + "' must return at least one value");
    return unexpected("a value to return");
  }
  std::vector<Value*> outs;
  for (;;) {
    KILN_ASSIGN_OR_RETURN(Value * v, parseRef(g));
    outs.push_back(v);
    if (!atPunct(',')) break;
    take();
  }
  g.setOutputs(std::move(outs));
  return Status::ok();
}

Expected<Graph> Parser::parseGraph() {
  if (!atWord("graph")) return unexpected("'graph' at the start of the text IR");
  take();
  Graph g;
  if (tok_.kind == Tok::kIdent)
    g.setName(std::string(take().text));
  else if (tok_.kind == Tok::kString)
    g.setName(decodeString(take().text));
  else
    return unexpected("the graph name");
  KILN_TRY(expectPunct('(', "after the graph name"));
  while (!atPunct(')')) {
    if (!g.inputs().empty()) KILN_TRY(expectPunct(',', "or ')' in the graph inputs"));
    if (tok_.kind != Tok::kValue) return unexpected("a graph input such as %x : f32[1,3]");
    const Token name = take();
    KILN_TRY(expectTypeColon(name, "after the input name"));
    std::vector<std::string> dimNames;
    KILN_ASSIGN_OR_RETURN(TensorType type, parseType(&dimNames));
    KILN_TRY(defineName(name));
    auto v = g.addInput(std::string(name.text), std::move(type));
    if (!v) return errorAt(name.pos, v.status().message());
    if (Status st = g.setDimNames(*v, std::move(dimNames)); !st)
      return errorAt(name.pos, st.message());
  }
  take();  // ')'
  KILN_TRY(expectPunct('{', "to open the graph body"));
  for (;;) {
    if (atWord("return")) {
      KILN_TRY(parseReturn(g));
      break;
    }
    if (atWord("param")) {
      KILN_TRY(parseParam(g));
    } else if (tok_.kind == Tok::kValue || tok_.kind == Tok::kIdent) {
      KILN_TRY(parseNode(g));
    } else if (atPunct('}')) {
      return errorAt(tok_.pos, "graph '" + g.name() + "' has no return statement before '}'");
    } else {
      return unexpected("a statement (param, a node or return)");
    }
  }
  KILN_TRY(expectPunct('}', "after the return statement"));
  KILN_TRY(expectEnd("the end of the graph"));
  KILN_TRY(verify(g));
  return g;
}

Expected<TensorType> Parser::parseTypeOnly() {
  KILN_ASSIGN_OR_RETURN(TensorType t, parseType());
  KILN_TRY(expectEnd("the type"));
  return t;
}

Expected<AttrValue> Parser::parseAttrValueOnly(AttrKind kind) {
  KILN_ASSIGN_OR_RETURN(AttrValue v, parseValue(kind, "the value"));
  KILN_TRY(expectEnd("the value"));
  return v;
}

// Parsing allocates in proportion to the input; an allocation failure on a hostile input is
// reported, not thrown.
template <class F>
auto guarded(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return invalidArgument("text IR: out of memory while parsing");
  } catch (const std::exception& e) {
    return internalError(std::string("text IR parser: unexpected exception: ") + e.what());
  }
}

}  // namespace

Expected<Graph> parseGraph(std::string_view text) {
  return guarded([&] { return Parser(text).parseGraph(); });
}

Expected<TensorType> parseType(std::string_view text) {
  return guarded([&] { return Parser(text).parseTypeOnly(); });
}

Expected<AttrValue> parseAttrValue(std::string_view text, AttrKind kind) {
  return guarded([&] { return Parser(text).parseAttrValueOnly(kind); });
}

}  // namespace kiln::ir
