#include "frontends/npy/npy.h"

#include <array>
#include <cctype>
#include <cstring>
#include <limits>
#include <optional>
#include <vector>

#include "frontends/file_io.h"

namespace kiln::frontends {

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
// NumPy pads headers so that the data starts at a multiple of 64 bytes (memory-mappable).
constexpr size_t kAlign = 64;

// Type codes without the byte-order character. Multi-byte codes are written with '<', 1-byte
// ones with '|', as NumPy does.
struct NpyDType {
  ir::DType dtype;
  std::string_view code;
};
constexpr std::array<NpyDType, 12> kNpyDTypes = {{
    {ir::DType::kF32, "f4"},
    {ir::DType::kF64, "f8"},
    {ir::DType::kF16, "f2"},
    {ir::DType::kI64, "i8"},
    {ir::DType::kI32, "i4"},
    {ir::DType::kI8, "i1"},
    {ir::DType::kU8, "u1"},
    {ir::DType::kBool, "b1"},
    {ir::DType::kI16, "i2"},
    {ir::DType::kU16, "u2"},
    {ir::DType::kU32, "u4"},
    {ir::DType::kU64, "u8"},
}};

std::string supportedDescrs() {
  std::string s;
  for (const auto& d : kNpyDTypes)
    s += (s.empty() ? "" : ", ") + std::string(ir::dtypeSize(d.dtype) == 1 ? "|" : "<") +
         std::string(d.code);
  return s;
}

// The header for an error message: printable ASCII, cut short.
std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 80)) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out += c;
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    }
  }
  return s.size() > 80 ? out + "..." : out;
}

struct Header {
  std::string descr;
  bool fortranOrder = false;
  std::vector<uint64_t> shape;
};

// Parses the header, a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// It accepts exactly what NumPy's own reader accepts for these three keys: single- or
// double-quoted strings, True/False, and tuples of integers (Python 2 files may write 3L).
class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string where) : text_(text), where_(std::move(where)) {}

  Expected<Header> parse() {
    Header h;
    bool seenDescr = false, seenOrder = false, seenShape = false;
    skipSpace();
    KILN_TRY(expect('{'));
    skipSpace();
    while (!atEnd() && peek() != '}') {
      KILN_ASSIGN_OR_RETURN(std::string key, parseString("a key"));
      skipSpace();
      KILN_TRY(expect(':'));
      skipSpace();
      if (key == "descr") {
        if (seenDescr) return error("the key 'descr' appears twice");
        seenDescr = true;
        if (!atEnd() && peek() == '[')
          return unimplemented(where_ + ": structured dtypes (a list as 'descr') are not " +
                               "supported; save a plain numeric array");
        KILN_ASSIGN_OR_RETURN(h.descr, parseString("the dtype string of 'descr'"));
      } else if (key == "fortran_order") {
        if (seenOrder) return error("the key 'fortran_order' appears twice");
        seenOrder = true;
        KILN_ASSIGN_OR_RETURN(h.fortranOrder, parseBool());
      } else if (key == "shape") {
        if (seenShape) return error("the key 'shape' appears twice");
        seenShape = true;
        KILN_ASSIGN_OR_RETURN(h.shape, parseShape());
      } else {
        return error("unknown key '" + printable(key) +
                     "' (expected 'descr', 'fortran_order' and 'shape')");
      }
      skipSpace();
      if (!atEnd() && peek() == ',') {
        ++pos_;
        skipSpace();
      } else if (atEnd() || peek() != '}') {
        return error("expected ',' or '}' after the value of '" + key + "'");
      }
    }
    KILN_TRY(expect('}'));
    skipSpace();
    if (!atEnd()) return error("unexpected text after the closing '}'");
    if (!seenDescr) return error("the key 'descr' is missing");
    if (!seenOrder) return error("the key 'fortran_order' is missing");
    if (!seenShape) return error("the key 'shape' is missing");
    return h;
  }

 private:
  bool atEnd() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }
  void skipSpace() {
    while (!atEnd() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r'))
      ++pos_;
  }
  Status error(const std::string& what) const {
    return invalidArgument(where_ + ": malformed header at byte " + std::to_string(pos_) + ": " +
                           what + " (header: \"" + printable(text_) + "\")");
  }
  Status expect(char c) {
    if (atEnd() || peek() != c) return error(std::string("expected '") + c + "'");
    ++pos_;
    return Status::ok();
  }
  Expected<std::string> parseString(const std::string& what) {
    if (atEnd() || (peek() != '\'' && peek() != '"')) return error("expected " + what);
    const char quote = text_[pos_++];
    const size_t start = pos_;
    while (!atEnd() && peek() != quote) {
      if (peek() == '\\') return error("escape sequences are not supported in header strings");
      ++pos_;
    }
    if (atEnd()) return error("unterminated string");
    return std::string(text_.substr(start, pos_++ - start));
  }
  Expected<bool> parseBool() {
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    return error("'fortran_order' must be True or False");
  }
  Expected<std::vector<uint64_t>> parseShape() {
    KILN_TRY(expect('('));
    std::vector<uint64_t> dims;
    bool trailingComma = false;
    skipSpace();
    while (!atEnd() && peek() != ')') {
      if (peek() == '-') return error("the shape has a negative dimension");
      if (!std::isdigit(static_cast<unsigned char>(peek())))
        return error("the shape must be a tuple of non-negative integers");
      uint64_t d = 0;
      while (!atEnd() && std::isdigit(static_cast<unsigned char>(peek()))) {
        const uint64_t digit = static_cast<uint64_t>(peek() - '0');
        if (d > (std::numeric_limits<uint64_t>::max() - digit) / 10)
          return error("a dimension of the shape does not fit in 64 bits");
        d = d * 10 + digit;
        ++pos_;
      }
      if (!atEnd() && peek() == 'L') ++pos_;  // Python 2 long literal.
      dims.push_back(d);
      skipSpace();
      trailingComma = false;
      if (!atEnd() && peek() == ',') {
        ++pos_;
        trailingComma = true;
        skipSpace();
      } else if (atEnd() || peek() != ')') {
        return error("expected ',' or ')' in the shape");
      }
    }
    KILN_TRY(expect(')'));
    // In Python "(3)" is the integer 3, not a tuple; NumPy rejects it too.
    if (dims.size() == 1 && !trailingComma)
      return error("a 1-d shape must be written (n,), with the comma");
    return dims;
  }

  std::string_view text_;
  std::string where_;
  size_t pos_ = 0;
};

Expected<ir::DType> parseDescr(const std::string& descr, const std::string& where) {
  const std::string shown = "'" + printable(descr) + "'";
  if (descr.size() < 2)
    return unimplemented(where + ": unsupported dtype " + shown + " (kiln reads " +
                         supportedDescrs() + ")");
  const char order = descr[0];
  const std::string_view code = std::string_view(descr).substr(1);
  const NpyDType* found = nullptr;
  for (const auto& d : kNpyDTypes)
    if (d.code == code) found = &d;
  if (order == '>' && (!found || ir::dtypeSize(found->dtype) > 1))
    return unimplemented(where + ": big-endian dtype " + shown +
                         " is not supported; convert it with a.astype('<" + std::string(code) +
                         "')");
  if (!found || (order != '<' && order != '|' && order != '>'))
    return unimplemented(where + ": unsupported dtype " + shown + " (kiln reads " +
                         supportedDescrs() + ")");
  if (order == '|' && ir::dtypeSize(found->dtype) > 1)
    return invalidArgument(where + ": dtype " + shown +
                           " has byte order '|' (not applicable), which only 1-byte dtypes may "
                           "have; multi-byte data must say '<'");
  return found->dtype;
}

uint64_t readLittleEndian(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string shapeTuple(const ir::Shape& shape) {
  if (shape.size() == 1) return "(" + std::to_string(shape[0]) + ",)";
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + ")";
}

}  // namespace

Expected<ir::TensorData> readNpy(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(InputFile file, openInputFile(path, "npy file"));
  return readNpy(file.stream, file.size, "npy file '" + path + "'");
}

Expected<ir::TensorData> readNpy(std::istream& in, uint64_t size, const std::string& where) {
  struct {
    std::istream& stream;
    uint64_t size;
  } file{in, size};
  auto readBytes = [&](void* dst, uint64_t n) -> Status {
    if (n && !file.stream.read(static_cast<char*>(dst), static_cast<std::streamsize>(n)))
      return ioError(where + ": reading failed (was the file changed while kiln read it?)");
    return Status::ok();
  };

  unsigned char preamble[12];
  const uint64_t magicAndVersion = kMagic.size() + 2;
  if (file.size < magicAndVersion)
    return invalidArgument(where + ": the file is " + std::to_string(file.size) +
                           " bytes, too short for the .npy preamble (truncated, or not an .npy "
                           "file)");
  KILN_TRY(readBytes(preamble, magicAndVersion));
  if (std::memcmp(preamble, kMagic.data(), kMagic.size()) != 0)
    return invalidArgument(
        where + ": not an .npy file (the first bytes are \"" +
        printable(std::string_view(reinterpret_cast<const char*>(preamble), kMagic.size())) +
        "\", expected \"\\x93NUMPY\")");
  const int major = preamble[6], minor = preamble[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0)
    return unimplemented(where + ": .npy format version " + std::to_string(major) + "." +
                         std::to_string(minor) + " is not supported (kiln reads 1.0, 2.0, 3.0)");
  // Version 1.0 has a 2-byte header length; 2.0 and 3.0 (UTF-8 header) have 4 bytes.
  const int lengthBytes = major == 1 ? 2 : 4;
  const uint64_t prefix = magicAndVersion + static_cast<uint64_t>(lengthBytes);
  if (file.size < prefix)
    return invalidArgument(where + ": the file is " + std::to_string(file.size) +
                           " bytes, too short for the header length field (truncated file)");
  KILN_TRY(readBytes(preamble + magicAndVersion, static_cast<uint64_t>(lengthBytes)));
  const uint64_t headerSize = readLittleEndian(preamble + magicAndVersion, lengthBytes);
  if (headerSize > file.size - prefix)
    return invalidArgument(where + ": the header length field says " + std::to_string(headerSize) +
                           " bytes but only " + std::to_string(file.size - prefix) +
                           " follow it (truncated file)");
  std::string headerText(headerSize, '\0');
  KILN_TRY(readBytes(headerText.data(), headerSize));

  KILN_ASSIGN_OR_RETURN(Header header, HeaderParser(headerText, where).parse());
  KILN_ASSIGN_OR_RETURN(ir::DType dtype, parseDescr(header.descr, where));
  if (header.fortranOrder)
    return unimplemented(where + ": fortran_order=True (column-major) arrays are not supported; " +
                         "save np.ascontiguousarray(a) instead");
  const auto bytes = checkedByteSize(header.shape, ir::dtypeSize(dtype));
  if (!bytes)
    return invalidArgument(where + ": the shape in the header is too large (its size overflows " +
                           "64 bits; corrupt header?)");
  ir::Shape shape(header.shape.begin(), header.shape.end());
  const uint64_t dataSize = file.size - prefix - headerSize;
  if (dataSize != *bytes)
    return invalidArgument(where + ": " + printable(header.descr) + " " + ir::shapeToString(shape) +
                           " needs " + std::to_string(*bytes) + " bytes of data but the file " +
                           "holds " + std::to_string(dataSize) +
                           (dataSize < *bytes ? " (truncated file)" : " (trailing bytes)"));
  ir::TensorData t(dtype, std::move(shape));
  KILN_TRY(readBytes(t.data(), *bytes));
  return t;
}

Status writeNpy(const std::string& path, const ir::TensorData& t) {
  const std::string where = "cannot write npy file '" + path + "'";
  if (t.empty()) return invalidArgument(where + ": the tensor has no data");
  const NpyDType* found = nullptr;
  for (const auto& d : kNpyDTypes)
    if (d.dtype == t.dtype()) found = &d;
  if (!found)
    return unimplemented(where + ": NumPy has no " + std::string(ir::dtypeName(t.dtype())) +
                         " dtype; cast the tensor to f32, or save it as safetensors");
  for (int64_t d : t.shape())
    if (d < 0)
      return invalidArgument(where + ": the tensor has a negative dimension in " +
                             t.type().toString());
  const std::string descr = (ir::dtypeSize(t.dtype()) == 1 ? "|" : "<") + std::string(found->code);
  std::string header = "{'descr': '" + descr +
                       "', 'fortran_order': False, 'shape': " + shapeTuple(t.shape()) + ", }";
  // Pad with spaces and end with '\n' so that magic + version + length + header is a multiple
  // of kAlign; use format 2.0 only when the header outgrows 1.0's 16-bit length.
  auto padded = [&header](size_t prefix) {
    std::string h = header;
    h.append((kAlign - (prefix + h.size() + 1) % kAlign) % kAlign, ' ');
    return h + '\n';
  };
  std::string preamble(kMagic);
  std::string text = padded(kMagic.size() + 4);
  if (text.size() <= std::numeric_limits<uint16_t>::max()) {
    preamble += std::string{'\x01', '\x00'};
    for (int i = 0; i < 2; ++i) preamble += static_cast<char>((text.size() >> (8 * i)) & 0xff);
  } else {
    text = padded(kMagic.size() + 6);
    if (text.size() > std::numeric_limits<uint32_t>::max())
      return invalidArgument(where + ": the shape makes the header too long for .npy");
    preamble += std::string{'\x02', '\x00'};
    for (int i = 0; i < 4; ++i) preamble += static_cast<char>((text.size() >> (8 * i)) & 0xff);
  }
  auto write = [preamble = preamble + text, t](std::ostream& out) -> Status {
    out << preamble;
    out.write(reinterpret_cast<const char*>(t.data()), static_cast<std::streamsize>(t.byteSize()));
    return Status::ok();
  };
  return writeFilesAtomically({OutputFile{path, std::move(write)}});
}

}  // namespace kiln::frontends
