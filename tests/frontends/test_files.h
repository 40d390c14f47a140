// Helpers for the frontend tests: a unique temporary directory per test, raw file bytes, and
// tensors filled with seeded random bytes.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "ir/status.h"
#include "ir/tensor_data.h"

namespace kiln::test {

// REQUIRE that a Status or Expected is OK, printing its message when it is not.
#define KILN_REQUIRE_OK(expr)                                     \
  do {                                                            \
    const ::kiln::Status kiln_st_ = ::kiln::test::statusOf(expr); \
    INFO(kiln_st_.message());                                     \
    REQUIRE(kiln_st_.isOk());                                     \
  } while (0)

inline Status statusOf(const Status& s) {
  return s;
}
template <class T>
Status statusOf(const Expected<T>& e) {
  return e.status();
}

// The error of `e`; fails the test when `e` holds a value.
template <class T>
Status errorOf(const Expected<T>& e) {
  REQUIRE_FALSE(e.hasValue());
  return e.status();
}
inline Status errorOf(const Status& s) {
  REQUIRE_FALSE(s.isOk());
  return s;
}

// A fresh directory under the system temp directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("kiln-frontends-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string path() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // The names of the entries in the directory, sorted; temporary files included.
  std::vector<std::string> list() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(path_))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  std::filesystem::path path_;
};

inline std::string readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

inline void writeBytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  REQUIRE(out.good());
}

// A tensor of random bytes (NaN and denormal patterns included, which round trips must keep
// bit for bit); bool tensors get 0 or 1.
inline ir::TensorData randomTensor(ir::DType dtype, ir::Shape shape, uint64_t seed) {
  ir::TensorData t(dtype, std::move(shape));
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < t.byteSize(); ++i)
    t.data()[i] = static_cast<std::byte>(dtype == ir::DType::kBool ? rng() & 1 : rng() & 0xff);
  return t;
}

inline std::vector<ir::DType> allDTypes() {
  std::vector<ir::DType> all;
  for (int i = 0; i < ir::kNumDTypes; ++i) all.push_back(static_cast<ir::DType>(i));
  return all;
}

// Writes `bytes` to `name` in `dir`, reads it with `read(path)` and returns the error, failing
// when the read succeeds or its message does not name the file.
template <class Read>
Status readErrorOf(const TempDir& dir, const std::string& name, const std::string& bytes,
                   Read read) {
  const std::string path = dir.file(name);
  writeBytes(path, bytes);
  Status st = errorOf(read(path));
  CHECK_THAT(st.message(), Catch::Matchers::Contains(path));
  return st;
}

// Corrupts each byte of the file at `path` in turn (four bit masks each) and reads it back
// with `read(path)`: a failed read must name the file, and nothing may crash. Returns how many
// reads failed (a format with no check at all would return 0).
template <class Read>
int corruptEveryByte(const std::string& path, Read read) {
  const std::string bytes = readBytes(path);
  int errors = 0;
  for (size_t i = 0; i < bytes.size(); ++i)
    for (unsigned char mask : {0x01, 0x20, 0x80, 0xff}) {
      std::string corrupt = bytes;
      corrupt[i] = static_cast<char>(corrupt[i] ^ mask);
      writeBytes(path, corrupt);
      auto result = read(path);
      if (!result) {
        ++errors;
        CHECK_THAT(result.status().message(), Catch::Matchers::Contains(path));
      }
    }
  return errors;
}

}  // namespace kiln::test
