// The disk kernel cache: keys, hits and misses, and every kind of damaged entry reported as a
// miss with its reason, deleted, and rebuilt. Each test uses its own KILN_CACHE_DIR.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "codegen/kernel_cache.h"

using kiln::codegen::CacheKey;
using kiln::codegen::CacheKeyBuilder;
using kiln::codegen::CacheMissReason;
using kiln::codegen::KernelCache;
using kiln::codegen::missReasonName;
using kiln::codegen::Sha256;
namespace fs = std::filesystem;

namespace {

// A fresh directory as $KILN_CACHE_DIR for one test; the old value comes back afterwards.
class TempCacheDir {
 public:
  TempCacheDir() {
    char dirTemplate[] = "/tmp/kiln-cache-test-XXXXXX";
    REQUIRE(::mkdtemp(dirTemplate) != nullptr);
    path_ = dirTemplate;
    if (const char* old = std::getenv("KILN_CACHE_DIR")) old_ = old;
    ::setenv("KILN_CACHE_DIR", path_.c_str(), 1);
  }
  ~TempCacheDir() {
    if (old_.empty()) {
      ::unsetenv("KILN_CACHE_DIR");
    } else {
      ::setenv("KILN_CACHE_DIR", old_.c_str(), 1);
    }
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
  std::string old_;
};

std::string sha(std::string_view s) {
  Sha256 h;
  h.update(s);
  return kiln::codegen::toHex(h.finish());
}

CacheKey keyFor(const std::string& source) {
  return CacheKeyBuilder().add("ptx").add(source).add("nvrtc 13.0|sm_90").finish();
}

std::vector<char> readAll(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

void writeAll(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<fs::path> filesUnder(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) files.push_back(e.path());
  }
  return files;
}

const std::string kPayload = ".version 9.0\n.target sm_90\n.address_size 64\n// kernel body\n";

}  // namespace

TEST_CASE("kernel cache: SHA-256 matches the FIPS 180-4 test vectors") {
  CHECK(sha("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(sha(std::string(1000000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Fed in pieces that straddle block boundaries, the digest is the same.
  const std::string text(1000, 'x');
  Sha256 pieces;
  for (size_t i = 0; i < text.size(); i += 37) pieces.update(std::string_view(text).substr(i, 37));
  CHECK(kiln::codegen::toHex(pieces.finish()) == sha(text));
}

TEST_CASE("kernel cache: keys hash every field with its boundary") {
  CHECK(CacheKeyBuilder().add("ab").add("c").finish() !=
        CacheKeyBuilder().add("a").add("bc").finish());
  CHECK(CacheKeyBuilder().add("src").add("id").finish() ==
        CacheKeyBuilder().add("src").add("id").finish());
  CHECK(keyFor("a").hex().size() == 64);
  CHECK(keyFor("a") != keyFor("b"));
}

TEST_CASE("kernel cache: the directory comes from KILN_CACHE_DIR") {
  TempCacheDir dir;
  CHECK(KernelCache::defaultDirectory() == dir.path());
  KernelCache cache;
  CHECK(cache.directory() == dir.path());
  CHECK(cache.enabled());
  const CacheKey key = keyFor("k");
  CHECK(cache.entryPath(key).string().rfind(dir.path().string(), 0) == 0);
}

TEST_CASE("kernel cache: miss, then store, then hit, counted in the statistics") {
  TempCacheDir dir;
  KernelCache cache;
  const CacheKey key = keyFor("kernel source");
  auto first = cache.lookup(key);
  CHECK_FALSE(first.hit);
  CHECK(first.reason == CacheMissReason::kAbsent);
  CHECK(std::string(missReasonName(first.reason)) == "absent");
  CHECK(first.explain().find("miss (absent") == 0);

  REQUIRE(cache.store(key, kPayload).isOk());
  auto second = cache.lookup(key);
  REQUIRE(second.hit);
  CHECK(second.reason == CacheMissReason::kNone);
  CHECK(second.payloadString() == kPayload);
  CHECK(second.explain() == "hit (" + std::to_string(kPayload.size()) + " bytes)");

  // Another key misses; an empty payload round-trips.
  CHECK(cache.lookup(keyFor("other")).reason == CacheMissReason::kAbsent);
  const CacheKey emptyKey = keyFor("empty");
  REQUIRE(cache.store(emptyKey, std::string_view()).isOk());
  auto empty = cache.lookup(emptyKey);
  REQUIRE(empty.hit);
  CHECK(empty.payload.empty());

  // A second cache object (another process, later) sees the entry.
  KernelCache later;
  CHECK(later.lookup(key).hit);

  const auto stats = cache.stats();
  CHECK(stats.hits == 2);
  CHECK(stats.misses == 2);
  CHECK(stats.corrupt == 0);
  CHECK(stats.stores == 2);
  CHECK(stats.bytesRead == static_cast<int64_t>(kPayload.size()));
  CHECK(stats.bytesWritten == static_cast<int64_t>(kPayload.size()));
}

TEST_CASE("kernel cache: a damaged entry is a miss with its reason, deleted, then rebuilt") {
  TempCacheDir dir;
  KernelCache cache;
  const CacheKey key = keyFor("damaged");
  REQUIRE(cache.store(key, kPayload).isOk());
  const fs::path entry = cache.entryPath(key);
  const std::vector<char> good = readAll(entry);
  REQUIRE(good.size() == KernelCache::kHeaderSize + kPayload.size());

  struct Damage {
    const char* what;
    CacheMissReason reason;
    const char* name;
    std::vector<char> bytes;
  };
  std::vector<Damage> cases;
  {
    auto b = good;
    b[KernelCache::kHeaderSize + 5] ^= 0x01;  // One flipped bit in the payload.
    cases.push_back({"payload byte", CacheMissReason::kChecksum, "checksum", b});
  }
  {
    auto b = good;
    b[60] ^= 0x40;  // One flipped bit in the stored checksum.
    cases.push_back({"checksum byte", CacheMissReason::kChecksum, "checksum", b});
  }
  cases.push_back({"payload cut short", CacheMissReason::kTruncated, "truncated",
                   std::vector<char>(good.begin(), good.end() - 10)});
  cases.push_back({"header cut short", CacheMissReason::kTruncated, "truncated",
                   std::vector<char>(good.begin(), good.begin() + 20)});
  cases.push_back({"empty file", CacheMissReason::kTruncated, "truncated", {}});
  {
    auto b = good;
    b[0] = 'X';
    cases.push_back({"wrong magic", CacheMissReason::kBadMagic, "magic", b});
  }
  {
    auto b = good;
    b[8] = 7;  // Format version 7.
    cases.push_back({"other format version", CacheMissReason::kBadVersion, "version", b});
  }
  {
    auto b = good;
    b[20] ^= 0x01;  // The key stored in the header.
    cases.push_back({"other key", CacheMissReason::kKeyMismatch, "key", b});
  }
  {
    auto b = good;
    b.push_back('!');
    cases.push_back({"trailing byte", CacheMissReason::kSizeMismatch, "size", b});
  }

  for (const Damage& d : cases) {
    SECTION(d.what) {
      writeAll(entry, d.bytes);
      auto result = cache.lookup(key);
      CHECK_FALSE(result.hit);
      CHECK(result.reason == d.reason);
      CHECK(std::string(missReasonName(result.reason)) == d.name);
      CHECK(result.explain().find(std::string("miss (") + d.name) == 0);
      CHECK(result.detail.find("entry deleted") != std::string::npos);
      CHECK_FALSE(fs::exists(entry));
      CHECK(cache.stats().corrupt == 1);
      // The caller rebuilds and stores; the next lookup hits.
      CHECK(cache.lookup(key).reason == CacheMissReason::kAbsent);
      REQUIRE(cache.store(key, kPayload).isOk());
      auto rebuilt = cache.lookup(key);
      REQUIRE(rebuilt.hit);
      CHECK(rebuilt.payloadString() == kPayload);
    }
  }
}

TEST_CASE("kernel cache: an entry copied to another key's name is rejected") {
  TempCacheDir dir;
  KernelCache cache;
  const CacheKey a = keyFor("a"), b = keyFor("b");
  REQUIRE(cache.store(a, kPayload).isOk());
  fs::create_directories(cache.entryPath(b).parent_path());
  fs::copy_file(cache.entryPath(a), cache.entryPath(b));
  auto result = cache.lookup(b);
  CHECK(result.reason == CacheMissReason::kKeyMismatch);
  CHECK(result.detail.find(a.hex()) != std::string::npos);
  CHECK(cache.lookup(a).hit);
}

TEST_CASE("kernel cache: disabled (--no-cache) never reads or writes") {
  TempCacheDir dir;
  KernelCache enabled;
  const CacheKey key = keyFor("k");
  REQUIRE(enabled.store(key, kPayload).isOk());

  KernelCache disabled(/*enabled=*/false);
  CHECK_FALSE(disabled.enabled());
  auto result = disabled.lookup(key);
  CHECK_FALSE(result.hit);
  CHECK(result.reason == CacheMissReason::kDisabled);
  CHECK(result.explain().find("miss (disabled") == 0);
  const CacheKey other = keyFor("other");
  REQUIRE(disabled.store(other, kPayload).isOk());
  CHECK_FALSE(fs::exists(disabled.entryPath(other)));
  CHECK(disabled.stats().misses == 1);
  CHECK(disabled.stats().stores == 0);
}

TEST_CASE("kernel cache: writes are atomic and leave no temporary files") {
  TempCacheDir dir;
  KernelCache cache;
  for (int i = 0; i < 20; ++i) {
    REQUIRE(cache.store(keyFor(std::to_string(i % 5)), kPayload + std::to_string(i)).isOk());
  }
  // Eight threads replace the same entry at once: every store succeeds and the survivor is
  // one whole entry.
  const CacheKey shared = keyFor("shared");
  std::vector<std::thread> writers;
  std::vector<int> ok(8, 0);
  for (int t = 0; t < 8; ++t) {
    writers.emplace_back([&, t] {
      const std::string payload(4096 + static_cast<size_t>(t), static_cast<char>('a' + t));
      for (int i = 0; i < 10; ++i)
        ok[static_cast<size_t>(t)] += cache.store(shared, payload).isOk();
    });
  }
  for (auto& w : writers) w.join();
  for (int n : ok) CHECK(n == 10);
  auto result = cache.lookup(shared);
  REQUIRE(result.hit);
  const size_t t = result.payload.size() - 4096;
  REQUIRE(t < 8);
  CHECK(result.payloadString() == std::string(4096 + t, static_cast<char>('a' + t)));

  const auto files = filesUnder(dir.path());
  CHECK(files.size() == 6);
  for (const fs::path& f : files) {
    INFO(f.string());
    CHECK(f.extension() == ".bin");
    CHECK(f.string().find(".tmp") == std::string::npos);
  }
}

TEST_CASE("kernel cache: an unwritable directory is an I/O error, not a crash") {
  TempCacheDir dir;
  const fs::path notADirectory = dir.path() / "file";
  std::ofstream(notADirectory) << "x";
  KernelCache cache(notADirectory, true);
  const CacheKey key = keyFor("k");
  kiln::Status status = cache.store(key, kPayload);
  CHECK(status.code() == kiln::ErrorCode::kIo);
  CHECK(status.message().find("KILN_CACHE_DIR") != std::string::npos);
  CHECK(cache.lookup(key).reason != CacheMissReason::kNone);
}

TEST_CASE("kernel cache: a FIFO, directory or device in an entry's place is a miss, never a hang") {
  TempCacheDir dir;
  KernelCache cache(dir.path(), true);
  int n = 0;
  for (const char* kind : {"fifo", "directory", "device"}) {
    INFO(kind);
    const CacheKey key = keyFor(std::string("odd entry ") + kind);
    const fs::path entry = cache.entryPath(key);
    fs::create_directories(entry.parent_path());
    if (std::string(kind) == "fifo") {
      REQUIRE(::mkfifo(entry.c_str(), 0600) == 0);  // A blocking open would wait forever.
    } else if (std::string(kind) == "directory") {
      fs::create_directory(entry);
    } else {
      fs::create_symlink("/dev/zero", entry);  // Endless bytes if it were read.
    }
    const auto lookup = cache.lookup(key);
    CHECK_FALSE(lookup.hit);
    CHECK(lookup.reason == CacheMissReason::kIo);
    CHECK(lookup.detail.find("not") != std::string::npos);
    ++n;
  }
  CHECK(n == 3);
}

TEST_CASE("kernel cache: an unusable directory is reported once per process and directory") {
  TempCacheDir dir;
  const fs::path a = dir.path() / "a-file", b = dir.path() / "another-file";
  std::ofstream(a) << "x";
  std::ofstream(b) << "x";
  CHECK(KernelCache::firstFailure(a));
  CHECK_FALSE(KernelCache::firstFailure(a));
  CHECK_FALSE(KernelCache::firstFailure(dir.path() / "." / "a-file"));
  CHECK(KernelCache::firstFailure(b));
}
