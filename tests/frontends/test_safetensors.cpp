// safetensors reading and writing: bitwise round trips of every dtype, interoperability with
// hand-built files in the reference layout, every kind of corrupt file, and atomic writes.
#include "frontends/json/safetensors.h"

#include <catch2/catch.hpp>
#include <cstring>

#include "frontends/test_files.h"
#include "ir/narrow.h"

using Catch::Matchers::Contains;
using kiln::ErrorCode;
using kiln::Status;
using kiln::frontends::OutputFile;
using kiln::frontends::readSafetensors;
using kiln::frontends::readSafetensorsFile;
using kiln::frontends::SafetensorsMetadata;
using kiln::frontends::TensorMap;
using kiln::frontends::writeFilesAtomically;
using kiln::frontends::writeSafetensors;
using kiln::ir::DType;
using kiln::ir::TensorData;
using kiln::test::errorOf;
using kiln::test::randomTensor;
using kiln::test::readBytes;
using kiln::test::TempDir;
using kiln::test::writeBytes;

namespace {

// A safetensors file from its header text and data bytes, as the reference layout has it.
std::string rawFile(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// Reads `bytes` written to a file and returns the error, failing when the read succeeds.
Status readError(const TempDir& dir, const std::string& bytes) {
  return kiln::test::readErrorOf(dir, "bad.safetensors", bytes,
                                 [](const std::string& p) { return readSafetensors(p); });
}

TensorMap smallTensors() {
  TensorMap m;
  m["weight"] = randomTensor(DType::kF32, {2, 3}, 1);
  m["bias"] = randomTensor(DType::kF16, {3}, 2);
  m["steps"] = randomTensor(DType::kI64, {}, 3);
  m["mask"] = randomTensor(DType::kBool, {4}, 4);
  return m;
}

}  // namespace

TEST_CASE("safetensors round trip keeps every dtype bit for bit", "[safetensors]") {
  TempDir dir;
  TensorMap tensors;
  uint64_t seed = 10;
  for (DType t : kiln::test::allDTypes()) {
    const std::string name(kiln::ir::dtypeName(t));
    if (kiln::frontends::safetensorsDTypeName(t) == "?") {
      // The 4- and 2-bit types and the FNUZ 8-bit floats: safetensors has no name for them.
      CHECK(kiln::ir::isNarrow(t));
      TensorMap one{{name, randomTensor(t, {2}, seed++)}};
      const Status st = writeSafetensors(dir.file("narrow.safetensors"), one, {});
      CHECK(st.code() == kiln::ErrorCode::kUnimplemented);
      CHECK_THAT(st.message(), Catch::Contains("safetensors has no " + name + " dtype"));
      continue;
    }
    tensors[name + ".matrix"] = randomTensor(t, {3, 5}, seed++);
    tensors[name + ".scalar"] = randomTensor(t, {}, seed++);
    tensors[name + ".empty"] = randomTensor(t, {0, 4}, seed++);
  }
  const SafetensorsMetadata metadata = {{"format", "pt"}, {"note", "ünïcode \"quoted\""}};
  const std::string path = dir.file("all.safetensors");
  KILN_REQUIRE_OK(writeSafetensors(path, tensors, metadata));

  auto read = readSafetensorsFile(path);
  KILN_REQUIRE_OK(read);
  CHECK(read->metadata == metadata);
  REQUIRE(read->tensors.size() == tensors.size());
  for (const auto& [name, t] : tensors) {
    INFO(name);
    REQUIRE(read->tensors.count(name));
    CHECK(read->tensors.at(name).bitwiseEqual(t));
  }
  // The header is padded so that the data section starts 8-byte aligned.
  const std::string bytes = readBytes(path);
  uint64_t headerSize = 0;
  for (int i = 7; i >= 0; --i) headerSize = headerSize << 8 | static_cast<uint8_t>(bytes[i]);
  CHECK((8 + headerSize) % 8 == 0);
  CHECK(dir.list() == std::vector<std::string>{"all.safetensors"});

  // Writing what was read reproduces the file byte for byte.
  const std::string again = dir.file("again.safetensors");
  KILN_REQUIRE_OK(writeSafetensors(again, read->tensors, read->metadata));
  CHECK(readBytes(again) == bytes);
}

TEST_CASE("safetensors reads files in the reference layout", "[safetensors]") {
  TempDir dir;
  float values[2] = {1.5f, -2.0f};
  std::string data(reinterpret_cast<const char*>(values), 8);
  data += std::string("\x07\x00", 2);
  // Metadata first, spaces as padding, tensors out of name order: as other writers emit.
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"U8","shape":[2],"data_offsets":[8,10]},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}    )";
  const std::string path = dir.file("ref.safetensors");
  writeBytes(path, rawFile(header, data));
  auto read = readSafetensorsFile(path);
  KILN_REQUIRE_OK(read);
  CHECK(read->metadata.at("format") == "pt");
  const TensorData& a = read->tensors.at("a");
  CHECK(a.dtype() == DType::kF32);
  CHECK(a.shape() == kiln::ir::Shape{2});
  CHECK(a.as<float>()[0] == 1.5f);
  CHECK(a.as<float>()[1] == -2.0f);
  CHECK(read->tensors.at("b").as<uint8_t>()[0] == 7);

  // An empty header object is a valid file with no tensors.
  writeBytes(path, rawFile("{}"));
  auto empty = readSafetensors(path);
  KILN_REQUIRE_OK(empty);
  CHECK(empty->empty());
}

TEST_CASE("safetensors: every truncation of a file is an error, never a crash", "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("small.safetensors");
  KILN_REQUIRE_OK(writeSafetensors(path, smallTensors(), {{"k", "v"}}));
  const std::string bytes = readBytes(path);
  for (size_t n = 0; n < bytes.size(); ++n) {
    INFO("truncated to " << n << " of " << bytes.size() << " bytes");
    Status st = readError(dir, bytes.substr(0, n));
    CHECK(st.code() == ErrorCode::kInvalidArgument);
  }
  CHECK_THAT(readError(dir, bytes.substr(0, 5)).message(), Contains("shorter than the 8-byte"));
  CHECK_THAT(readError(dir, bytes.substr(0, 20)).message(), Contains("header length field says"));
  CHECK_THAT(readError(dir, bytes.substr(0, bytes.size() - 1)).message(),
             Contains("run past the end of the data section"));
  CHECK_THAT(readError(dir, bytes + "x").message(), Contains("trailing bytes"));
}

TEST_CASE("safetensors: corrupting any byte is an error or a valid read, never a crash",
          "[safetensors]") {
  TempDir dir;
  const std::string path = dir.file("small.safetensors");
  KILN_REQUIRE_OK(writeSafetensors(path, smallTensors()));
  CHECK(kiln::test::corruptEveryByte(path,
                                     [](const std::string& p) { return readSafetensors(p); }) > 0);
}

TEST_CASE("safetensors: corrupt header length", "[safetensors]") {
  TempDir dir;
  std::string file = rawFile(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x");
  std::string huge = file;
  for (int i = 0; i < 8; ++i) huge[i] = '\xff';
  CHECK_THAT(readError(dir, huge).message(), Contains("header length field says"));
  std::string zero = file;
  for (int i = 0; i < 8; ++i) zero[i] = 0;
  CHECK_THAT(readError(dir, zero).message(), Contains("too short for a JSON object"));
  std::string shorter = file;
  shorter[0] = static_cast<char>(shorter[0] - 5);  // The header now ends mid-JSON.
  CHECK_THAT(readError(dir, shorter).message(), Contains("not valid JSON"));
  // A length within the file but above the sanity limit.
  std::string big = rawFile(std::string(101 << 20, ' '));
  CHECK_THAT(readError(dir, big).message(), Contains("limit"));
}

TEST_CASE("safetensors: invalid headers are rejected with the tensor named", "[safetensors]") {
  TempDir dir;
  auto error = [&](const std::string& header, const std::string& data = std::string(8, '\0')) {
    return readError(dir, rawFile(header, data)).message();
  };
  CHECK_THAT(error("{not json}"), Contains("not valid JSON"));
  CHECK_THAT(error("[1, 2]"), Contains("must be a JSON object"));
  CHECK_THAT(error(R"({"w":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})"),
             Contains("tensor 'w': unknown dtype 'F33'"));
  {
    const std::string path = dir.file("f6.safetensors");
    writeBytes(
        path, rawFile(R"({"w":{"dtype":"F6_E2M3","shape":[8],"data_offsets":[0,8]}})", "12345678"));
    Status st = errorOf(readSafetensors(path));
    CHECK(st.code() == ErrorCode::kUnimplemented);
    CHECK_THAT(st.message(), Contains("unsupported dtype 'F6_E2M3'"));
  }
  {
    // The 8-bit floats read as kiln's, byte for byte.
    const std::string path = dir.file("f8.safetensors");
    writeBytes(
        path, rawFile(R"({"w":{"dtype":"F8_E4M3","shape":[8],"data_offsets":[0,8]}})", "12345678"));
    auto read = readSafetensorsFile(path);
    KILN_REQUIRE_OK(read);
    const auto& w = read->tensors.at("w");
    CHECK(w.dtype() == kiln::ir::DType::kF8E4M3FN);
    CHECK(std::string(reinterpret_cast<const char*>(w.data()), 8) == "12345678");
  }
  CHECK_THAT(error(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})"),
             Contains("tensor 'w': shape must be an array of non-negative integers"));
  CHECK_THAT(error(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})"),
             Contains("non-negative integers"));
  CHECK_THAT(error(R"({"w":{"dtype":"F32","shape":"2","data_offsets":[0,8]}})"),
             Contains("non-negative integers"));
  // Enormous dims: rejected from the header alone, without allocating.
  CHECK_THAT(error(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})"),
             Contains("too large"));
  CHECK_THAT(error(R"({"w":{"dtype":"F32","shape":[1099511627776],"data_offsets":[0,8]}})"),
             Contains("needs 4398046511104"));
  CHECK_THAT(error(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})"),
             Contains("tensor 'w': data_offsets [0, 8] hold 8 bytes but F32 [3] needs 12"));
  CHECK_THAT(error(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})"),
             Contains("end before they begin"));
  CHECK_THAT(error(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})"),
             Contains("run past the end of the data section, which is 8 bytes"));
  CHECK_THAT(error(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0]}})"),
             Contains("data_offsets must be [begin, end]"));
  CHECK_THAT(error(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,-8]}})"),
             Contains("data_offsets must be [begin, end]"));
  CHECK_THAT(error(R"({"w":{"dtype":"F32","shape":[2]}})"),
             Contains("missing field 'data_offsets'"));
  CHECK_THAT(error(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})"),
             Contains("unknown field 'x'"));
  CHECK_THAT(error(R"({"w":[1,2]})"), Contains("tensor 'w': the entry must be an object"));
  CHECK_THAT(error(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                   R"("a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})"),
             Contains("names 'a' more than once"));
  CHECK_THAT(error(R"({"a":{"dtype":"U8","shape":[6],"data_offsets":[0,6]},)"
                   R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})"),
             Contains("tensors 'a' and 'b' overlap"));
  CHECK_THAT(error(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                   R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})"),
             Contains("bytes 2..4 of the data section (before tensor 'b') belong to no tensor"));
  CHECK_THAT(error(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                   R"("z":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}})"),
             Contains("overlap"));
  CHECK_THAT(error(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})"),
             Contains("trailing bytes"));
  CHECK_THAT(error(R"({"__metadata__":{"k":1}})", ""),
             Contains("\"__metadata__\" entry 'k' must be a string"));
  CHECK_THAT(error(R"({"__metadata__":[1]})", ""), Contains("must be an object of strings"));
  CHECK_THAT(error("{\"a\xff\":{}}"), Contains("not valid JSON"));
}

TEST_CASE("safetensors: deeply nested headers are an error, never a stack overflow",
          "[safetensors]") {
  TempDir dir;
  const size_t depth = 1'000'000;
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  CHECK_THAT(readError(dir, rawFile(R"({"w":{"dtype":"F32","shape":)" + nested +
                                    R"(,"data_offsets":[0,0]}})"))
                 .message(),
             Contains("tensor 'w': shape must be an array of non-negative integers, got a "
                      "nested array"));
  CHECK_THAT(readError(dir, rawFile(R"({"w":)" + nested + "}")).message(),
             Contains("the entry must be an object"));
  CHECK_THAT(readError(dir, rawFile(std::string(depth, '{'))).message(),
             Contains("not valid JSON"));
}

TEST_CASE("safetensors: missing files and directories", "[safetensors]") {
  TempDir dir;
  const std::string missing = dir.file("nope.safetensors");
  Status st = errorOf(readSafetensors(missing));
  CHECK(st.code() == ErrorCode::kNotFound);
  CHECK_THAT(st.message(), Contains(missing) && Contains("does not exist"));
  CHECK_THAT(errorOf(readSafetensors(dir.path())).message(), Contains("is a directory"));
}

TEST_CASE("safetensors: failed writes leave nothing behind", "[safetensors]") {
  TempDir dir;
  SECTION("a directory that does not exist") {
    const std::string path = dir.file("missing/w.safetensors");
    Status st = errorOf(writeSafetensors(path, smallTensors()));
    CHECK_THAT(st.message(), Contains(path) && Contains("does not exist"));
    CHECK(dir.list().empty());
  }
  SECTION("a reserved or empty tensor") {
    TensorMap bad = smallTensors();
    bad["__metadata__"] = randomTensor(DType::kF32, {1}, 1);
    CHECK_THAT(errorOf(writeSafetensors(dir.file("w.safetensors"), bad)).message(),
               Contains("'__metadata__' is reserved"));
    TensorMap empty = smallTensors();
    empty["nothing"] = TensorData();
    CHECK_THAT(errorOf(writeSafetensors(dir.file("w.safetensors"), empty)).message(),
               Contains("tensor 'nothing' has no data"));
    CHECK(dir.list().empty());
  }
  SECTION("names that are not UTF-8") {
    TensorMap bad;
    bad["w\xff"] = randomTensor(DType::kF32, {1}, 1);
    CHECK_THAT(errorOf(writeSafetensors(dir.file("w.safetensors"), bad)).message(),
               Contains("not valid UTF-8"));
    CHECK(dir.list().empty());
  }
  SECTION("the target is a directory") {
    std::filesystem::create_directory(dir.file("w.safetensors"));
    CHECK_THAT(errorOf(writeSafetensors(dir.file("w.safetensors"), smallTensors())).message(),
               Contains("is a directory"));
    CHECK(dir.list() == std::vector<std::string>{"w.safetensors"});
  }
}

TEST_CASE("writeFilesAtomically removes its temporaries and keeps old files on failure",
          "[safetensors][atomic]") {
  TempDir dir;
  auto text = [](std::string s) {
    return [s](std::ostream& out) -> Status {
      out << s;
      return Status::ok();
    };
  };
  const std::string a = dir.file("a.txt"), b = dir.file("b.txt");
  KILN_REQUIRE_OK(
      writeFilesAtomically({OutputFile{a, text("old a")}, OutputFile{b, text("old b")}}));
  CHECK(dir.list() == std::vector<std::string>{"a.txt", "b.txt"});

  // The second writer fails after the first temporary is complete: neither target changes.
  auto failing = [](std::ostream& out) -> Status {
    out << "partial";
    return kiln::ioError("simulated failure");
  };
  Status st = writeFilesAtomically({OutputFile{a, text("new a")}, OutputFile{b, failing}});
  CHECK_THAT(st.message(), Contains("simulated failure"));
  CHECK(readBytes(a) == "old a");
  CHECK(readBytes(b) == "old b");
  CHECK(dir.list() == std::vector<std::string>{"a.txt", "b.txt"});

  // The second target's directory is missing: the first temporary is removed.
  st = writeFilesAtomically(
      {OutputFile{a, text("new a")}, OutputFile{dir.file("no/such/dir/b.txt"), text("b")}});
  CHECK_THAT(st.message(), Contains("does not exist"));
  CHECK(readBytes(a) == "old a");
  CHECK(dir.list() == std::vector<std::string>{"a.txt", "b.txt"});

  // A writer that throws still leaves no temporary behind.
  auto throwing = [](std::ostream&) -> Status { throw std::runtime_error("boom"); };
  CHECK_THROWS(writeFilesAtomically({OutputFile{a, throwing}}));
  CHECK(dir.list() == std::vector<std::string>{"a.txt", "b.txt"});

  KILN_REQUIRE_OK(writeFilesAtomically({OutputFile{a, text("new a")}}));
  CHECK(readBytes(a) == "new a");
}
