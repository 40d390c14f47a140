#include "frontends/json/safetensors.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace kiln::frontends {

using Json = nlohmann::json;

// Tensor bytes go to and from files as they are in memory; safetensors is little-endian.
static_assert(std::endian::native == std::endian::little,
              "kiln's file formats assume a little-endian host");

namespace {

// The reference implementation refuses headers above 100 MB; a header that large describes
// millions of tensors, so anything bigger is corruption rather than a model.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeName {
  ir::DType dtype;
  std::string_view name;
};
// safetensors has no 4- or 2-bit dtypes nor the FNUZ 8-bit floats.
constexpr DTypeName kDTypeNames[] = {
    {ir::DType::kF32, "F32"},        {ir::DType::kF64, "F64"},
    {ir::DType::kF16, "F16"},        {ir::DType::kBF16, "BF16"},
    {ir::DType::kI64, "I64"},        {ir::DType::kI32, "I32"},
    {ir::DType::kI8, "I8"},          {ir::DType::kU8, "U8"},
    {ir::DType::kBool, "BOOL"},      {ir::DType::kI16, "I16"},
    {ir::DType::kU16, "U16"},        {ir::DType::kU32, "U32"},
    {ir::DType::kU64, "U64"},        {ir::DType::kF8E4M3FN, "F8_E4M3"},
    {ir::DType::kF8E5M2, "F8_E5M2"}, {ir::DType::kF8E8M0, "F8_E8M0"},
};
// Valid safetensors dtypes that kiln has no ir::DType for: reported as unsupported rather than
// as unknown, so that the user knows the file is fine and kiln is the limit.
// (F4 packs two elements a byte, which kiln's one-byte f4e2m1 does not read.)
constexpr std::array<std::string_view, 4> kOtherSafetensorsDTypes = {"F4", "F6_E2M3", "F6_E3M2",
                                                                     "C64"};

std::string supportedDTypeList() {
  std::string s;
  for (const auto& d : kDTypeNames) s += (s.empty() ? "" : ", ") + std::string(d.name);
  return s;
}

// A JSON value for an error message, cut short so that a hostile header cannot produce a
// megabyte-long message.
std::string brief(const Json& j) {
  // Containers are not printed beyond one level: dumping is recursive, and a hostile header can
  // nest arrays millions deep.
  if (j.is_object()) return "an object";
  if (j.is_array() &&
      std::any_of(j.begin(), j.end(), [](const Json& e) { return e.is_structured(); }))
    return "a nested array";
  std::string s = j.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// A safetensors header with a tensor named twice is corrupt; nlohmann alone would keep the last.
Expected<Json> parseHeaderJson(const std::string& text, const std::string& where) {
  StrictJson<Json> parsed = parseStrictJson<Json>(text);
  if (parsed.parseError)
    return invalidArgument(where + ": the header is not valid JSON (" + *parsed.parseError + ")");
  if (parsed.duplicateKey)
    return invalidArgument(where + ": the header names '" + *parsed.duplicateKey +
                           "' more than once (duplicate tensor names)");
  return std::move(parsed.value);
}

uint64_t readLittleEndian64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string encodeLittleEndian64(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// A validated header entry: where a tensor's bytes lie in the data section.
struct Entry {
  std::string name;
  ir::DType dtype;
  ir::Shape shape;
  uint64_t begin;
  uint64_t end;
};

Status parseMetadata(const Json& j, const std::string& where, SafetensorsMetadata& out) {
  if (!j.is_object())
    return invalidArgument(where + ": \"__metadata__\" must be an object of strings, got " +
                           std::string(j.type_name()));
  for (const auto& [key, value] : j.items()) {
    if (!value.is_string())
      return invalidArgument(where + ": \"__metadata__\" entry '" + key +
                             "' must be a string, got " + brief(value));
    out[key] = value.get<std::string>();
  }
  return Status::ok();
}

Expected<Entry> parseEntry(const std::string& name, const Json& j, uint64_t dataSize,
                           const std::string& where) {
  const std::string tensor = where + ": tensor '" + name + "'";
  if (!j.is_object())
    return invalidArgument(tensor + ": the entry must be an object with dtype, shape and " +
                           "data_offsets, got " + brief(j));
  for (const auto& [key, value] : j.items())
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      return invalidArgument(tensor + ": unknown field '" + key +
                             "' (expected dtype, shape and data_offsets)");
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!j.contains(key)) return invalidArgument(tensor + ": missing field '" + key + "'");

  Entry e;
  e.name = name;
  const Json& dtype = j["dtype"];
  if (!dtype.is_string())
    return invalidArgument(tensor + ": dtype must be a string, got " + brief(dtype));
  const auto& dtypeName = dtype.get_ref<const std::string&>();
  auto parsed = parseSafetensorsDType(dtypeName);
  if (!parsed) {
    const bool known = std::find(kOtherSafetensorsDTypes.begin(), kOtherSafetensorsDTypes.end(),
                                 dtypeName) != kOtherSafetensorsDTypes.end();
    return Status(known ? ErrorCode::kUnimplemented : ErrorCode::kInvalidArgument,
                  tensor + ": " + (known ? "unsupported" : "unknown") + " dtype '" + dtypeName +
                      "' (kiln reads " + supportedDTypeList() + ")");
  }
  e.dtype = *parsed;

  const Json& shape = j["shape"];
  std::vector<uint64_t> dims;
  if (!shape.is_array())
    return invalidArgument(tensor + ": shape must be an array of non-negative integers, got " +
                           brief(shape));
  for (const Json& d : shape) {
    if (!d.is_number_unsigned())
      return invalidArgument(tensor + ": shape must be an array of non-negative integers, got " +
                             brief(shape));
    dims.push_back(d.get<uint64_t>());
  }
  const auto bytes = checkedByteSize(dims, ir::dtypeSize(e.dtype));
  if (!bytes)
    return invalidArgument(tensor + ": shape " + brief(shape) +
                           " is too large (its size overflows 64 bits)");
  for (uint64_t d : dims) e.shape.push_back(static_cast<int64_t>(d));

  const Json& offsets = j["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    return invalidArgument(tensor + ": data_offsets must be [begin, end] with non-negative " +
                           "integers, got " + brief(offsets));
  e.begin = offsets[0].get<uint64_t>();
  e.end = offsets[1].get<uint64_t>();
  const std::string range = "[" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
  if (e.begin > e.end)
    return invalidArgument(tensor + ": data_offsets " + range + " end before they begin");
  if (e.end > dataSize)
    return invalidArgument(tensor + ": data_offsets " + range +
                           " run past the end of the data section, which is " +
                           std::to_string(dataSize) + " bytes (truncated file?)");
  if (e.end - e.begin != *bytes)
    return invalidArgument(tensor + ": data_offsets " + range + " hold " +
                           std::to_string(e.end - e.begin) + " bytes but " + dtypeName + " " +
                           ir::shapeToString(e.shape) + " needs " + std::to_string(*bytes));
  return e;
}

// Every byte of the data section must belong to exactly one tensor: overlaps would alias
// tensors and gaps hide data kiln would silently drop.
Status checkCoverage(std::vector<Entry>& entries, uint64_t dataSize, const std::string& where) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < cursor)
      return invalidArgument(where + ": tensors '" + previous->name + "' and '" + e.name +
                             "' overlap in the data section (bytes " + std::to_string(e.begin) +
                             ".." + std::to_string(cursor) + ")");
    if (e.begin > cursor)
      return invalidArgument(where + ": bytes " + std::to_string(cursor) + ".." +
                             std::to_string(e.begin) + " of the data section (before tensor '" +
                             e.name + "') belong to no tensor");
    cursor = e.end;
    if (e.end > e.begin) previous = &e;
  }
  if (cursor != dataSize)
    return invalidArgument(where + ": the data section is " + std::to_string(dataSize) +
                           " bytes but the tensors cover " + std::to_string(cursor) +
                           " (trailing bytes after the last tensor)");
  return Status::ok();
}

}  // namespace

std::string_view safetensorsDTypeName(ir::DType t) {
  for (const auto& d : kDTypeNames)
    if (d.dtype == t) return d.name;
  return "?";
}

std::optional<ir::DType> parseSafetensorsDType(std::string_view name) {
  for (const auto& d : kDTypeNames)
    if (d.name == name) return d.dtype;
  return std::nullopt;
}

Expected<SafetensorsContents> readSafetensorsFile(const std::string& path) {
  const std::string where = "safetensors file '" + path + "'";
  KILN_ASSIGN_OR_RETURN(InputFile file, openInputFile(path, "safetensors file"));
  auto readBytes = [&](void* dst, uint64_t n) -> Status {
    if (n && !file.stream.read(static_cast<char*>(dst), static_cast<std::streamsize>(n)))
      return ioError(where + ": reading failed (was the file changed while kiln read it?)");
    return Status::ok();
  };

  if (file.size < 8)
    return invalidArgument(where + ": the file is " + std::to_string(file.size) +
                           " bytes, shorter than the 8-byte header length (truncated, or not "
                           "a safetensors file)");
  unsigned char lengthBytes[8];
  KILN_TRY(readBytes(lengthBytes, 8));
  const uint64_t headerSize = readLittleEndian64(lengthBytes);
  if (headerSize > file.size - 8)
    return invalidArgument(where + ": the header length field says " + std::to_string(headerSize) +
                           " bytes but only " + std::to_string(file.size - 8) +
                           " follow it (truncated, or not a safetensors file)");
  if (headerSize > kMaxHeaderBytes)
    return invalidArgument(where + ": the header length field says " + std::to_string(headerSize) +
                           " bytes, more than the " + std::to_string(kMaxHeaderBytes) +
                           "-byte limit (corrupt file?)");
  if (headerSize < 2)
    return invalidArgument(where + ": the header is " + std::to_string(headerSize) +
                           " bytes, too short for a JSON object (corrupt file?)");
  std::string headerText(headerSize, '\0');
  KILN_TRY(readBytes(headerText.data(), headerSize));
  const uint64_t dataSize = file.size - 8 - headerSize;

  KILN_ASSIGN_OR_RETURN(Json header, parseHeaderJson(headerText, where));
  if (!header.is_object())
    return invalidArgument(where + ": the header must be a JSON object, got " +
                           std::string(header.type_name()));
  SafetensorsContents out;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      KILN_TRY(parseMetadata(value, where, out.metadata));
      continue;
    }
    KILN_ASSIGN_OR_RETURN(Entry e, parseEntry(key, value, dataSize, where));
    entries.push_back(std::move(e));
  }
  KILN_TRY(checkCoverage(entries, dataSize, where));

  // Entries are sorted by offset and cover the data contiguously, so one sequential pass reads
  // them; every allocation is bounded by the bytes the file holds.
  for (const Entry& e : entries) {
    ir::TensorData t(e.dtype, e.shape);
    KILN_TRY(readBytes(t.data(), e.end - e.begin));
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

Expected<TensorMap> readSafetensors(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(SafetensorsContents contents, readSafetensorsFile(path));
  return std::move(contents.tensors);
}

Expected<OutputFile> safetensorsOutput(const std::string& path, const TensorMap& tensors,
                                       const SafetensorsMetadata& metadata) {
  const std::string where = "cannot write safetensors file '" + path + "'";
  std::vector<std::pair<std::string, ir::TensorData>> ordered;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__")
      return invalidArgument(where + ": '__metadata__' is reserved and cannot name a tensor");
    if (t.empty()) return invalidArgument(where + ": tensor '" + name + "' has no data");
    for (int64_t d : t.shape())
      if (d < 0)
        return invalidArgument(where + ": tensor '" + name + "' has a negative dimension in " +
                               t.type().toString());
    if (t.byteSize() != static_cast<size_t>(t.numElements()) * ir::dtypeSize(t.dtype()))
      return internalError(where + ": tensor '" + name + "' holds " + std::to_string(t.byteSize()) +
                           " bytes, inconsistent with " + t.type().toString());
    ordered.emplace_back(name, t);
  }
  // Largest elements first: with the header padded to 8 bytes, every tensor then starts at a
  // multiple of its element size, so that the file can be memory-mapped and used in place.
  std::stable_sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
    return ir::dtypeSize(a.second.dtype()) > ir::dtypeSize(b.second.dtype());
  });

  Json header = Json::object();
  if (!metadata.empty()) {
    Json md = Json::object();
    for (const auto& [k, v] : metadata) md[k] = v;
    header["__metadata__"] = std::move(md);
  }
  uint64_t offset = 0;
  for (const auto& [name, t] : ordered) {
    if (safetensorsDTypeName(t.dtype()) == "?")
      return unimplemented(where + ": tensor '" + name + "': safetensors has no " +
                           std::string(ir::dtypeName(t.dtype())) +
                           " dtype; cast the tensor to a wider type before saving it");
    const uint64_t end = offset + t.byteSize();
    header[name] = {{"dtype", safetensorsDTypeName(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string headerText;
  try {
    headerText = header.dump();
  } catch (const Json::type_error&) {
    return invalidArgument(where + ": a tensor name or metadata string is not valid UTF-8");
  }
  headerText.append((8 - headerText.size() % 8) % 8, ' ');

  std::vector<ir::TensorData> data;
  data.reserve(ordered.size());
  for (auto& entry : ordered) data.push_back(std::move(entry.second));
  auto write = [headerText = std::move(headerText),
                data = std::move(data)](std::ostream& out) -> Status {
    out << encodeLittleEndian64(headerText.size()) << headerText;
    for (const ir::TensorData& t : data)
      out.write(reinterpret_cast<const char*>(t.data()),
                static_cast<std::streamsize>(t.byteSize()));
    return Status::ok();
  };
  return OutputFile{path, std::move(write)};
}

Status writeSafetensors(const std::string& path, const TensorMap& tensors,
                        const SafetensorsMetadata& metadata) {
  KILN_ASSIGN_OR_RETURN(OutputFile file, safetensorsOutput(path, tensors, metadata));
  return writeFilesAtomically({std::move(file)});
}

}  // namespace kiln::frontends
