// NumPy .npy reading and writing: bitwise round trips (every dtype, 0-d, empty), the header
// variants NumPy and older writers produce, and every kind of malformed file.
#include "frontends/npy/npy.h"

#include <zip.h>

#include <catch2/catch.hpp>

#include "frontends/data/dataset.h"
#include "frontends/test_files.h"
#include "ir/narrow.h"

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
    if (kiln::ir::isNarrow(t)) {      // Nor 8-, 4- and 2-bit types (ml_dtypes' are not .npy's).
      const Status st = writeNpy(dir.file("narrow.npy"), randomTensor(t, {3}, seed++));
      CHECK(st.code() == kiln::ErrorCode::kUnimplemented);
      CHECK_THAT(st.message(),
                 Catch::Contains("NumPy has no " + std::string(kiln::ir::dtypeName(t)) + " dtype"));
      continue;
    }
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

// ---- .npz archives --------------------------------------------------------------------------

namespace {

// An archive of `members` (name, bytes) as np.savez (stored) or np.savez_compressed (deflated)
// writes one.
void writeZip(const std::string& path,
              const std::vector<std::pair<std::string, std::string>>& members, bool deflate) {
  int error = 0;
  zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
  REQUIRE(z != nullptr);
  for (const auto& [name, bytes] : members) {
    zip_source_t* src = zip_source_buffer(z, bytes.data(), bytes.size(), 0);
    REQUIRE(src != nullptr);
    const zip_int64_t i = zip_file_add(z, name.c_str(), src, ZIP_FL_OVERWRITE);
    REQUIRE(i >= 0);
    REQUIRE(zip_set_file_compression(z, static_cast<zip_uint64_t>(i),
                                     deflate ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0) == 0);
  }
  REQUIRE(zip_close(z) == 0);  // Writes the archive (the buffers are read here).
}

// The .npy bytes of `t`.
std::string npyBytes(const TempDir& dir, const TensorData& t) {
  const std::string p = dir.file("member.npy");
  REQUIRE(writeNpy(p, t).isOk());
  return readBytes(p);
}

}  // namespace

TEST_CASE("npz archives: stored and deflated members, Keras's mnist.npz layout, errors") {
  using kiln::frontends::readNpz;
  using kiln::frontends::readNpzData;
  TempDir dir;
  TensorData images(DType::kU8, {4, 28, 28}), labels(DType::kI64, {4});
  for (int64_t i = 0; i < images.numElements(); ++i)
    images.as<uint8_t>()[i] = static_cast<uint8_t>(i * 7);
  TensorData labelsU8(DType::kU8, {4});  // Keras's mnist.npz labels.
  for (int64_t i = 0; i < 4; ++i) {
    labels.as<int64_t>()[i] = i % 10;
    labelsU8.as<uint8_t>()[i] = static_cast<uint8_t>(i % 10);
  }
  const TensorData f = randomTensor(DType::kF32, {3, 5}, 3);
  for (bool deflate : {false, true}) {
    INFO((deflate ? "deflated" : "stored"));
    const std::string path = dir.file(deflate ? "c.npz" : "s.npz");
    writeZip(path,
             {{"x_train.npy", npyBytes(dir, images)},
              {"y_train.npy", npyBytes(dir, labels)},
              {"x_test.npy", npyBytes(dir, images)},
              {"y_test.npy", npyBytes(dir, labelsU8)},
              {"f.npy", npyBytes(dir, f)},
              {"README", "not an array"}},
             deflate);
    auto arrays = readNpz(path);
    INFO(arrays.status().message());
    REQUIRE(arrays.hasValue());
    CHECK(arrays->size() == 5);  // README is not an .npy member.
    CHECK(arrays->at("f").bitwiseEqual(f));
    CHECK(arrays->at("x_train").bitwiseEqual(images));
    // As training data for a model of [1, 28, 28]: scaled like IDX images, reshaped, x_test and
    // y_test the validation set.
    auto data = readNpzData(path, {1, 28, 28});
    INFO(data.status().message());
    REQUIRE(data.hasValue());
    CHECK(data->train.sampleShape() == Shape{1, 28, 28});
    CHECK(data->train.x.as<float>()[3] == static_cast<float>(21) / 255.f);
    REQUIRE(data->validation.has_value());
    CHECK(data->validation->labels.bitwiseEqual(labels));  // u8 widened to i64.
  }
  // x and y.
  writeZip(dir.file("xy.npz"),
           {{"x.npy", npyBytes(dir, f)}, {"y.npy", npyBytes(dir, TensorData(DType::kI32, {3}))}},
           true);
  auto xy = readNpzData(dir.file("xy.npz"));
  REQUIRE(xy.hasValue());
  CHECK(xy->train.labels.dtype() == DType::kI64);
  CHECK_FALSE(xy->validation.has_value());
  // Errors name the archive and the member.
  writeZip(dir.file("other.npz"), {{"a.npy", npyBytes(dir, f)}}, false);
  CHECK_THAT(errorOf(readNpzData(dir.file("other.npz"))).message(),
             Contains("expected arrays x_train and y_train") && Contains("it holds a"));
  writeZip(dir.file("bad.npz"), {{"x.npy", "\x93NUMPY garbage"}}, true);
  CHECK_THAT(errorOf(readNpz(dir.file("bad.npz"))).message(), Contains("bad.npz', member 'x.npy'"));
  writeBytes(dir.file("notzip.npz"), "plain text, not an archive");
  const Status notZip = errorOf(readNpz(dir.file("notzip.npz")));
  CHECK(notZip.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(notZip.message(), Contains("not a readable .npz (zip) archive"));
  CHECK(errorOf(readNpz(dir.file("missing.npz"))).code() == ErrorCode::kNotFound);
  // A truncated archive (its central directory cut off).
  const std::string whole = readBytes(dir.file("xy.npz"));
  writeBytes(dir.file("cut.npz"), whole.substr(0, whole.size() / 2));
  CHECK_FALSE(readNpz(dir.file("cut.npz")).hasValue());
}
