#include "frontends/onnx/onnx_tensor.h"

#include <cstring>
#include <filesystem>
#include <iterator>
#include <vector>

#include "frontends/file_io.h"
#include "ir/narrow.h"

namespace kiln::frontends::onnx_import {

namespace fs = std::filesystem;
using ::onnx::TensorProto;

std::optional<ir::DType> dtypeFromOnnx(int32_t elemType) {
  switch (elemType) {
    case TensorProto::FLOAT:
      return ir::DType::kF32;
    case TensorProto::DOUBLE:
      return ir::DType::kF64;
    case TensorProto::FLOAT16:
      return ir::DType::kF16;
    case TensorProto::BFLOAT16:
      return ir::DType::kBF16;
    case TensorProto::INT64:
      return ir::DType::kI64;
    case TensorProto::INT32:
      return ir::DType::kI32;
    case TensorProto::INT8:
      return ir::DType::kI8;
    case TensorProto::UINT8:
      return ir::DType::kU8;
    case TensorProto::INT16:
      return ir::DType::kI16;
    case TensorProto::UINT16:
      return ir::DType::kU16;
    case TensorProto::UINT32:
      return ir::DType::kU32;
    case TensorProto::UINT64:
      return ir::DType::kU64;
    case TensorProto::BOOL:
      return ir::DType::kBool;
    // Codes newer than libonnx 1.12's onnx.proto (onnxTypeName's kNewer).
    case 17:
      return ir::DType::kF8E4M3FN;
    case 18:
      return ir::DType::kF8E4M3FNUZ;
    case 19:
      return ir::DType::kF8E5M2;
    case 20:
      return ir::DType::kF8E5M2FNUZ;
    case 21:
      return ir::DType::kU4;
    case 22:
      return ir::DType::kI4;
    case 23:
      return ir::DType::kF4E2M1;
    case 24:
      return ir::DType::kF8E8M0;
    case 25:
      return ir::DType::kU2;
    case 26:
      return ir::DType::kI2;
    default:
      return std::nullopt;
  }
}

int32_t onnxElemTypeOf(ir::DType dtype) {
  for (int32_t code = 1; code < 64; ++code)
    if (dtypeFromOnnx(code) == dtype) return code;
  return 0;
}

std::string onnxTypeName(int32_t elemType) {
  if (TensorProto::DataType_IsValid(elemType))
    return TensorProto::DataType_Name(static_cast<TensorProto::DataType>(elemType));
  // Types newer than libonnx 1.12's onnx.proto (IR versions 9 to 13).
  static constexpr const char* kNewer[] = {
      "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2", "FLOAT8E5M2FNUZ", "UINT4",
      "INT4",         "FLOAT4E2M1",     "FLOAT8E8M0", "UINT2",          "INT2"};
  if (elemType >= 17 && elemType < 17 + static_cast<int32_t>(std::size(kNewer)))
    return kNewer[elemType - 17];
  return "unknown element type " + std::to_string(elemType);
}

namespace {

// Parses a non-negative decimal integer written as a string (external-data offset and length).
bool parseSize(const std::string& s, uint64_t& out) {
  if (s.empty() || s.size() > 19) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  out = v;
  return true;
}

// Elements of a 4- or 2-bit dtype a byte of the file holds (packed low bits first), else 1.
uint64_t perByte(ir::DType dtype) {
  const int bits = ir::narrowFileBits(dtype);
  return bits > 0 ? 8 / static_cast<uint64_t>(bits) : 1;
}

// Bytes the tensor's dims and dtype need in the file (the 4- and 2-bit dtypes packed), or an
// error naming the tensor.
Expected<uint64_t> expectedBytes(const TensorProto& t, ir::DType dtype, const std::string& what) {
  std::vector<uint64_t> dims;
  for (int64_t d : t.dims()) {
    if (d < 0) return invalidArgument(what + " has a negative dim " + std::to_string(d));
    dims.push_back(static_cast<uint64_t>(d));
  }
  auto bytes = checkedByteSize(dims, ir::dtypeSize(dtype));
  if (!bytes) return invalidArgument(what + " has dims whose size does not fit in 64 bits");
  return (*bytes + perByte(dtype) - 1) / perByte(dtype);
}

// The element types kiln reads, by their ONNX names.
std::string supportedTypes() {
  std::string s;
  for (int32_t code = 1; code < 32; ++code)
    if (dtypeFromOnnx(code)) s += (s.empty() ? "" : ", ") + onnxTypeName(code);
  return s;
}

Expected<ir::DType> tensorDType(const TensorProto& t, const std::string& what) {
  auto dtype = dtypeFromOnnx(t.data_type());
  if (!dtype)
    return unimplemented(what + " has element type " + onnxTypeName(t.data_type()) +
                         ", which kiln does not support (supported: " + supportedTypes() + ")");
  return *dtype;
}

// `packed` bytes of a file's 4- or 2-bit elements into `out`, one element a byte.
void unpack(const uint8_t* packed, ir::TensorData& out) {
  const uint64_t per = perByte(out.dtype()), n = static_cast<uint64_t>(out.numElements());
  const int bits = ir::narrowFileBits(out.dtype());
  uint8_t* dst = out.as<uint8_t>();
  for (uint64_t i = 0; i < n; ++i)
    dst[i] = ir::narrowFromFileBits(
        out.dtype(),
        static_cast<uint8_t>((packed[i / per] >> (bits * (i % per))) & ((1u << bits) - 1)));
}

const std::string* externalEntry(const TensorProto& t, const std::string& key) {
  const std::string* found = nullptr;
  for (const auto& e : t.external_data())
    if (e.key() == key) found = &e.value();
  return found;
}

template <class Src, class Dst>
void convertInto(const google::protobuf::RepeatedField<Src>& src, ir::TensorData& out) {
  Dst* dst = out.as<Dst>();
  for (int i = 0; i < src.size(); ++i) dst[i] = static_cast<Dst>(src.Get(i));
}

}  // namespace

Status resolveExternalData(TensorProto& tensor, const std::string& modelDir,
                           const std::string& what) {
  if (modelDir.empty())
    return invalidArgument(what + " is stored in an external file, but the model was not " +
                           "loaded from a file path; load it with loadOnnx(path)");
  const std::string* location = externalEntry(tensor, "location");
  if (!location || location->empty())
    return invalidArgument(what + " is stored externally but has no 'location' entry");
  KILN_ASSIGN_OR_RETURN(const std::string path,
                        resolveInsideDirectory(modelDir, *location, what + ": external data"));
  KILN_ASSIGN_OR_RETURN(ir::DType dtype, tensorDType(tensor, what));
  KILN_ASSIGN_OR_RETURN(uint64_t want, expectedBytes(tensor, dtype, what));
  KILN_ASSIGN_OR_RETURN(InputFile file, openInputFile(path, "external data file of " + what));
  uint64_t offset = 0, length = 0;
  if (const std::string* s = externalEntry(tensor, "offset"); s && !parseSize(*s, offset))
    return invalidArgument(what + ": external data offset '" + *s + "' is not a number");
  if (offset > file.size)
    return invalidArgument(what + ": external data offset " + std::to_string(offset) +
                           " lies past the end of '" + path + "' (" + std::to_string(file.size) +
                           " bytes)");
  length = file.size - offset;
  if (const std::string* s = externalEntry(tensor, "length")) {
    uint64_t v = 0;
    if (!parseSize(*s, v))
      return invalidArgument(what + ": external data length '" + *s + "' is not a number");
    if (v > file.size - offset)
      return invalidArgument(what + ": external data at offset " + std::to_string(offset) +
                             " with length " + std::to_string(v) + " runs past the end of '" +
                             path + "' (" + std::to_string(file.size) + " bytes)");
    length = v;
  }
  if (length != want)
    return invalidArgument(what + ": external data holds " + std::to_string(length) +
                           " bytes at offset " + std::to_string(offset) + " of '" + path +
                           "', but its dims and element type need " + std::to_string(want));
  tensor.clear_external_data();
  auto add = [&](const char* key, const std::string& value) {
    auto* e = tensor.add_external_data();
    e->set_key(key);
    e->set_value(value);
  };
  add("location", path);
  add("offset", std::to_string(offset));
  add("length", std::to_string(length));
  return Status::ok();
}

Status checkTensorData(const TensorProto& t, const std::string& what) {
  KILN_ASSIGN_OR_RETURN(ir::DType dtype, tensorDType(t, what));
  KILN_ASSIGN_OR_RETURN(uint64_t bytes, expectedBytes(t, dtype, what));
  if (t.data_location() == TensorProto::EXTERNAL) return Status::ok();  // resolveExternalData.
  const ir::Shape shape(t.dims().begin(), t.dims().end());
  if (t.has_raw_data()) {
    if (t.raw_data().size() != bytes)
      return invalidArgument(what + " has " + std::to_string(t.raw_data().size()) +
                             " bytes of raw_data, but its dims " + ir::shapeToString(shape) +
                             " and element type " + onnxTypeName(t.data_type()) + " need " +
                             std::to_string(bytes));
    return Status::ok();
  }
  // Typed fields: which one holds the values depends on the element type (onnx.proto).
  int64_t count = 0;
  const char* field = "";
  switch (t.data_type()) {
    case TensorProto::FLOAT:
      count = t.float_data_size(), field = "float_data";
      break;
    case TensorProto::DOUBLE:
      count = t.double_data_size(), field = "double_data";
      break;
    case TensorProto::INT64:
      count = t.int64_data_size(), field = "int64_data";
      break;
    case TensorProto::UINT32:
    case TensorProto::UINT64:
      count = t.uint64_data_size(), field = "uint64_data";
      break;
    default:
      count = t.int32_data_size(), field = "int32_data";
      break;
  }
  // bytes fit in 64 bits, so the element count does too (4- and 2-bit elements: a packed byte
  // a value).
  const uint64_t n = perByte(dtype) > 1 ? bytes : bytes / ir::dtypeSize(dtype);
  if (static_cast<uint64_t>(count) != n)
    return invalidArgument(what + " has " + std::to_string(count) + " values in " + field +
                           ", but its dims " + ir::shapeToString(shape) + " hold " +
                           std::to_string(n));
  return Status::ok();
}

Expected<ir::TensorData> tensorFromProto(const TensorProto& t, const std::string& what) {
  KILN_ASSIGN_OR_RETURN(ir::DType dtype, tensorDType(t, what));
  KILN_ASSIGN_OR_RETURN(uint64_t bytes, expectedBytes(t, dtype, what));
  if (t.has_segment())
    return unimplemented(what + " is a segmented tensor, which kiln does not support");
  const ir::Shape shape(t.dims().begin(), t.dims().end());

  if (t.data_location() == TensorProto::EXTERNAL) {
    const std::string* path = externalEntry(t, "location");
    const std::string* off = externalEntry(t, "offset");
    const std::string* len = externalEntry(t, "length");
    uint64_t offset = 0, length = 0;
    if (!path || !off || !len || !parseSize(*off, offset) || !parseSize(*len, length) ||
        length != bytes)
      return internalError(what + ": external data was not resolved before reading");
    KILN_ASSIGN_OR_RETURN(InputFile file, openInputFile(*path, "external data file of " + what));
    // The file may have changed since it was checked.
    if (offset > file.size || bytes > file.size - offset)
      return ioError(what + ": external data file '" + *path + "' changed while loading");
    ir::TensorData data(dtype, shape);
    std::vector<uint8_t> packed(perByte(dtype) > 1 ? bytes : 0);
    char* into = packed.empty() ? reinterpret_cast<char*>(data.data())
                                : reinterpret_cast<char*>(packed.data());
    file.stream.seekg(static_cast<std::streamoff>(offset));
    if (bytes && !file.stream.read(into, static_cast<std::streamsize>(bytes)))
      return ioError(what + ": reading external data from '" + *path + "' failed");
    if (!packed.empty()) unpack(packed.data(), data);
    return data;
  }

  KILN_TRY(checkTensorData(t, what));
  if (t.has_raw_data()) {
    ir::TensorData data(dtype, shape);
    if (perByte(dtype) > 1)
      unpack(reinterpret_cast<const uint8_t*>(t.raw_data().data()), data);
    else if (bytes)
      std::memcpy(data.data(), t.raw_data().data(), bytes);
    return data;
  }
  ir::TensorData data(dtype, shape);
  if (ir::isNarrow(dtype)) {
    // int32_data: one 8-bit float a value, or one packed byte of 4- or 2-bit elements.
    std::vector<uint8_t> low(static_cast<size_t>(t.int32_data_size()));
    for (int i = 0; i < t.int32_data_size(); ++i) low[i] = static_cast<uint8_t>(t.int32_data(i));
    if (perByte(dtype) > 1)
      unpack(low.data(), data);
    else if (!low.empty())
      std::memcpy(data.data(), low.data(), low.size());
    return data;
  }
  switch (t.data_type()) {
    case TensorProto::FLOAT:
      convertInto<float, float>(t.float_data(), data);
      break;
    case TensorProto::DOUBLE:
      convertInto<double, double>(t.double_data(), data);
      break;
    case TensorProto::INT64:
      convertInto<int64_t, int64_t>(t.int64_data(), data);
      break;
    case TensorProto::INT32:
      convertInto<int32_t, int32_t>(t.int32_data(), data);
      break;
    case TensorProto::INT8:
      convertInto<int32_t, int8_t>(t.int32_data(), data);
      break;
    case TensorProto::UINT8:
      convertInto<int32_t, uint8_t>(t.int32_data(), data);
      break;
    case TensorProto::INT16:
      convertInto<int32_t, int16_t>(t.int32_data(), data);
      break;
    case TensorProto::UINT16:
      convertInto<int32_t, uint16_t>(t.int32_data(), data);
      break;
    case TensorProto::UINT32:
      convertInto<uint64_t, uint32_t>(t.uint64_data(), data);
      break;
    case TensorProto::UINT64:
      convertInto<uint64_t, uint64_t>(t.uint64_data(), data);
      break;
    case TensorProto::BOOL: {
      auto* dst = data.as<uint8_t>();
      for (int i = 0; i < t.int32_data_size(); ++i) dst[i] = t.int32_data(i) != 0;
      break;
    }
    case TensorProto::FLOAT16:
    case TensorProto::BFLOAT16:
      // The 16 bits of each value are the low half of an int32_data element.
      convertInto<int32_t, uint16_t>(t.int32_data(), data);
      break;
    default:
      return internalError(what + ": unhandled element type " + onnxTypeName(t.data_type()));
  }
  return data;
}

}  // namespace kiln::frontends::onnx_import
