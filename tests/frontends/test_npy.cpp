// NumPy .npy reading and writing: bitwise round trips (every dtype, 0-d, empty), the header
// variants NumPy and older writers produce, and every kind of malformed file.
#include "frontends/npy/npy.h"

#include <catch2/catch.hpp>

#include "frontends/test_files.h"

using Catch::Matchers::Contains;
using kiln::ErrorCode;
using kiln::Status;
using kiln::frontends::readNpy;
using kiln::frontends::writeNpy;
using kiln::ir::DType;
using kiln::ir::Shape;
using kiln::ir::TensorData;
using kiln::test::errorOf;
using kiln::test::randomTensor;
using kiln::test::readBytes;
using kiln::test::TempDir;
using kiln::test::writeBytes;

namespace {

// An .npy file of the given version from its header text (padding and '\n' included by the
// caller) and data bytes.
std::string rawNpy(const std::string& header, const std::string& data, int major = 1) {
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const int lengthBytes = major == 1 ? 2 : 4;
  for (int i = 0; i < lengthBytes; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + data;
}

Status readError(const TempDir& dir, const std::string& bytes) {
  return kiln::test::readErrorOf(dir, "bad.npy", bytes,
                                 [](const std::string& p) { return readNpy(p); });
}

std::string floatBytes(std::initializer_list<float> values) {
  std::string s;
  for (float v : values) s.append(reinterpret_cast<const char*>(&v), sizeof v);
  return s;
}

}  // namespace

TEST_CASE("npy round trip keeps every dtype, 0-d and empty arrays bit for bit", "[npy]") {
  TempDir dir;
  uint64_t seed = 1;
  for (DType t : kiln::test::allDTypes()) {
    if (t == DType::kBF16) continue;  // NumPy has no bfloat16; see the next test.
    for (const Shape& shape :
         {Shape{}, Shape{0}, Shape{7}, Shape{2, 3}, Shape{2, 0, 4}, Shape{1, 2, 3, 4, 5}}) {
      INFO(kiln::ir::dtypeName(t) << kiln::ir::shapeToString(shape));
      const TensorData original = randomTensor(t, shape, seed++);
      const std::string path = dir.file("a.npy");
      KILN_REQUIRE_OK(writeNpy(path, original));
      auto read = readNpy(path);
      KILN_REQUIRE_OK(read);
      CHECK(read->bitwiseEqual(original));
      // NumPy's layout: the data starts at a multiple of 64 bytes.
      CHECK((readBytes(path).size() - original.byteSize()) % 64 == 0);
    }
  }
  CHECK(dir.list() == std::vector<std::string>{"a.npy"});
}

TEST_CASE("npy writes the header NumPy writes", "[npy]") {
  TempDir dir;
  TensorData t(DType::kF32, {2, 3});
  KILN_REQUIRE_OK(writeNpy(dir.file("a.npy"), t));
  const std::string bytes = readBytes(dir.file("a.npy"));
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  REQUIRE(bytes.size() == 128 + 24);
  CHECK(bytes.substr(0, 10) == std::string("\x93NUMPY\x01\x00\x76\x00", 10));
  CHECK(bytes.substr(10, dict.size()) == dict);
  CHECK(bytes.substr(10 + dict.size(), 128 - 11 - dict.size()) ==
        std::string(128 - 11 - dict.size(), ' '));
  CHECK(bytes[127] == '\n');

  KILN_REQUIRE_OK(writeNpy(dir.file("b.npy"), TensorData(DType::kBool, {5})));
  CHECK_THAT(readBytes(dir.file("b.npy")),
             Contains("{'descr': '|b1', 'fortran_order': False, 'shape': (5,), }"));
  KILN_REQUIRE_OK(writeNpy(dir.file("c.npy"), TensorData(DType::kI64, {})));
  CHECK_THAT(readBytes(dir.file("c.npy")),
             Contains("{'descr': '<i8', 'fortran_order': False, 'shape': (), }"));
}

TEST_CASE("npy switches to format 2.0 when the header outgrows 1.0", "[npy]") {
  TempDir dir;
  const TensorData t = randomTensor(DType::kI32, Shape(30000, 1), 3);  // A 90 kB shape tuple.
  KILN_REQUIRE_OK(writeNpy(dir.file("wide.npy"), t));
  const std::string bytes = readBytes(dir.file("wide.npy"));
  CHECK(bytes[6] == 2);
  CHECK((bytes.size() - 4) % 64 == 0);
  auto read = readNpy(dir.file("wide.npy"));
  KILN_REQUIRE_OK(read);
  CHECK(read->bitwiseEqual(t));
}

TEST_CASE("npy reads header variants of NumPy and older writers", "[npy]") {
  TempDir dir;
  const std::string data = floatBytes({1, 2, 3, 4, 5, 6});
  const std::string path = dir.file("v.npy");
  auto check = [&](const std::string& bytes) {
    writeBytes(path, bytes);
    auto t = readNpy(path);
    KILN_REQUIRE_OK(t);
    CHECK(t->dtype() == DType::kF32);
    CHECK(t->shape() == Shape{2, 3});
    CHECK(t->as<float>()[5] == 6.0f);
  };
  check(rawNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", data));
  // Format 2.0 and 3.0 have a 4-byte header length.
  check(rawNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", data, 2));
  check(rawNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", data, 3));
  // Python 2 long literals, double quotes, other key order, no trailing comma, extra spaces
  // (NumPy >= 1.23 reserves room for the shape to grow).
  check(rawNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }\n", data));
  check(rawNpy("{\"shape\": (2,3), \"fortran_order\": False, \"descr\": \"<f4\"}" +
                   std::string(40, ' ') + "\n",
               data));

  writeBytes(path, rawNpy("{'descr': '|u1', 'fortran_order': False, 'shape': (), }\n", "\x2a"));
  auto scalar = readNpy(path);
  KILN_REQUIRE_OK(scalar);
  CHECK(scalar->shape().empty());
  CHECK(scalar->as<uint8_t>()[0] == 42);
}

TEST_CASE("npy: every truncation of a file is an error, never a crash", "[npy]") {
  TempDir dir;
  for (const Shape& shape : {Shape{2, 3}, Shape{}, Shape{0}}) {
    const std::string path = dir.file("t.npy");
    KILN_REQUIRE_OK(writeNpy(path, randomTensor(DType::kF32, shape, 5)));
    const std::string bytes = readBytes(path);
    for (size_t n = 0; n < bytes.size(); ++n) {
      INFO("shape " << kiln::ir::shapeToString(shape) << " truncated to " << n << " bytes");
      Status st = readError(dir, bytes.substr(0, n));
      CHECK(st.code() == ErrorCode::kInvalidArgument);
    }
  }
  const std::string path = dir.file("t.npy");
  KILN_REQUIRE_OK(writeNpy(path, randomTensor(DType::kF32, {2, 3}, 5)));
  const std::string bytes = readBytes(path);
  CHECK_THAT(readError(dir, bytes.substr(0, 4)).message(), Contains("too short"));
  CHECK_THAT(readError(dir, bytes.substr(0, 9)).message(), Contains("header length field"));
  CHECK_THAT(readError(dir, bytes.substr(0, 60)).message(),
             Contains("header length field says 118 bytes but only 50 follow"));
  CHECK_THAT(readError(dir, bytes.substr(0, bytes.size() - 1)).message(),
             Contains("needs 24 bytes of data but the file holds 23 (truncated file)"));
  CHECK_THAT(readError(dir, bytes + "x").message(), Contains("trailing bytes"));
}

TEST_CASE("npy: corrupting any byte is an error or a valid read, never a crash", "[npy]") {
  TempDir dir;
  const std::string path = dir.file("t.npy");
  KILN_REQUIRE_OK(writeNpy(path, randomTensor(DType::kI32, {3, 2}, 5)));
  CHECK(kiln::test::corruptEveryByte(path, [](const std::string& p) { return readNpy(p); }) > 0);
}

TEST_CASE("npy: bad magic, versions and headers", "[npy]") {
  TempDir dir;
  const std::string f6 = floatBytes({1, 2, 3, 4, 5, 6});
  auto header = [&](const std::string& dict, const std::string& data) {
    return readError(dir, rawNpy(dict + "\n", data));
  };
  CHECK_THAT(readError(dir, "PK\x03\x04 this is a zip file").message(),
             Contains("not an .npy file"));
  {
    std::string v4 = rawNpy("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }\n", f6);
    v4[6] = 4;
    Status st = readError(dir, v4);
    CHECK(st.code() == ErrorCode::kUnimplemented);
    CHECK_THAT(st.message(), Contains("version 4.0 is not supported"));
  }
  {
    Status st = header("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", f6);
    CHECK(st.code() == ErrorCode::kUnimplemented);
    CHECK_THAT(st.message(), Contains("fortran_order=True"));
  }
  {
    Status st = header("{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", f6);
    CHECK(st.code() == ErrorCode::kUnimplemented);
    CHECK_THAT(st.message(), Contains("big-endian dtype '>f4'"));
  }
  {
    Status st = header("{'descr': '<c8', 'fortran_order': False, 'shape': (3,), }", f6);
    CHECK(st.code() == ErrorCode::kUnimplemented);
    CHECK_THAT(st.message(), Contains("unsupported dtype '<c8'"));
  }
  CHECK(header("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (6,), }", f6).code() ==
        ErrorCode::kUnimplemented);
  CHECK_THAT(header("{'descr': '|f4', 'fortran_order': False, 'shape': (6,), }", f6).message(),
             Contains("only 1-byte dtypes"));
  CHECK_THAT(header("{'descr': '<f4', 'fortran_order': False}", f6).message(),
             Contains("the key 'shape' is missing"));
  CHECK_THAT(
      header("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1}", f6).message(),
      Contains("unknown key 'x'"));
  CHECK_THAT(header("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,)}", f6)
                 .message(),
             Contains("'descr' appears twice"));
  CHECK_THAT(header("{'descr': '<f4', 'fortran_order': False, 'shape': (6)}", f6).message(),
             Contains("must be written (n,)"));
  CHECK_THAT(header("{'descr': '<f4', 'fortran_order': False, 'shape': (-6,)}", f6).message(),
             Contains("negative dimension"));
  CHECK_THAT(header("{'descr': '<f4', 'fortran_order': 0, 'shape': (6,)}", f6).message(),
             Contains("must be True or False"));
  CHECK_THAT(header("{'descr': '<f4', 'fortran_order': False, 'shape': (6,)", f6).message(),
             Contains("expected ',' or '}' after the value of 'shape'"));
  CHECK_THAT(header("{'descr': '<f4', 'fortran_order': False, 'shape': (6,)} x", f6).message(),
             Contains("after the closing"));
  CHECK_THAT(header("{'descr': '<f4, 'fortran_order': False, 'shape': (6,)}", f6).message(),
             Contains("malformed header"));
  CHECK_THAT(
      header("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", f6)
          .message(),
      Contains("does not fit in 64 bits"));
  // Enormous dims are rejected from the header alone, without allocating.
  CHECK_THAT(header("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, "
                    "4294967296)}",
                    f6)
                 .message(),
             Contains("too large"));
  CHECK_THAT(
      header("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,)}", f6).message(),
      Contains("needs 4398046511104 bytes of data but the file holds 24"));
  CHECK_THAT(header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2)}", f6).message(),
             Contains("needs 16 bytes of data but the file holds 24 (trailing bytes)"));
}

TEST_CASE("npy: missing files and failed writes", "[npy]") {
  TempDir dir;
  Status st = errorOf(readNpy(dir.file("nope.npy")));
  CHECK(st.code() == ErrorCode::kNotFound);
  CHECK_THAT(st.message(), Contains(dir.file("nope.npy")));

  st = errorOf(writeNpy(dir.file("b.npy"), TensorData(DType::kBF16, {2})));
  CHECK(st.code() == ErrorCode::kUnimplemented);
  CHECK_THAT(st.message(), Contains("NumPy has no bf16 dtype"));
  CHECK_THAT(errorOf(writeNpy(dir.file("e.npy"), TensorData())).message(), Contains("no data"));
  st = errorOf(writeNpy(dir.file("missing/a.npy"), TensorData(DType::kF32, {2})));
  CHECK_THAT(st.message(), Contains(dir.file("missing/a.npy")) && Contains("does not exist"));
  CHECK(dir.list().empty());

  // A failed write keeps the previous file intact and leaves no temporary behind.
  std::filesystem::create_directory(dir.file("d.npy"));
  CHECK_THAT(errorOf(writeNpy(dir.file("d.npy"), TensorData(DType::kF32, {2}))).message(),
             Contains("is a directory"));
  CHECK(dir.list() == std::vector<std::string>{"d.npy"});
}
