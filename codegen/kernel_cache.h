// The on-disk kernel cache: compiled kernels (CPU objects, PTX) keyed by a SHA-256 of their
// source, target and compiler identity, in $KILN_CACHE_DIR (default ~/.cache/kiln).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/status.h"

namespace kiln::codegen {

using Sha256Digest = std::array<uint8_t, 32>;

// SHA-256 (FIPS 180-4), incremental.
class Sha256 {
 public:
  Sha256();
  void update(std::span<const std::byte> data);
  void update(std::string_view data) { update(std::as_bytes(std::span(data.data(), data.size()))); }
  Sha256Digest finish();  // The object is spent afterwards.
  static Sha256Digest of(std::span<const std::byte> data);

 private:
  void compress(const uint8_t* block);
  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t totalBytes_ = 0;
};

std::string toHex(std::span<const uint8_t> bytes);

struct CacheKey {
  Sha256Digest digest{};
  std::string hex() const { return toHex(digest); }
  bool operator==(const CacheKey&) const = default;
};

// Builds a key from fields: the kind of blob ("cpu-object", "ptx"), the source, the compiler
// identity, flags... Each field is hashed with its length, so ("ab", "c") and ("a", "bc")
// give different keys.
class CacheKeyBuilder {
 public:
  CacheKeyBuilder& add(std::string_view field);
  CacheKey finish();

 private:
  Sha256 hash_;
};

enum class CacheMissReason {
  kNone,          // A hit.
  kDisabled,      // The cache is off (--no-cache).
  kAbsent,        // No entry for this key.
  kTruncated,     // The file is shorter than its header or than the length the header gives.
  kBadMagic,      // Not a kiln cache entry.
  kBadVersion,    // Written by another entry format version.
  kKeyMismatch,   // The header names another key (a file copied or renamed by hand).
  kSizeMismatch,  // Bytes after the payload.
  kChecksum,      // The payload's SHA-256 differs from the one in the header.
  kIo,            // The file exists but could not be read.
};

// Short stable name of a reason ("checksum", "truncated", ...), as --explain-cache prints it.
const char* missReasonName(CacheMissReason reason);

struct CacheLookup {
  bool hit = false;
  std::vector<std::byte> payload;  // Valid when hit.
  CacheMissReason reason = CacheMissReason::kNone;
  std::string detail;  // What was found and done, e.g. "payload checksum mismatch; entry deleted".
  std::string payloadString() const {
    return std::string(reinterpret_cast<const char*>(payload.data()), payload.size());
  }
  // One line for --explain-cache: "hit (2048 bytes)" or "miss (checksum: ...)".
  std::string explain() const;
};

struct CacheStats {
  int64_t hits = 0;
  int64_t misses = 0;   // Every miss, including absent and disabled.
  int64_t corrupt = 0;  // Misses where an entry existed but failed a check (and was deleted).
  int64_t stores = 0;
  int64_t bytesRead = 0;     // Payload bytes returned by hits.
  int64_t bytesWritten = 0;  // Payload bytes stored.
};

// A directory of entries <dir>/kernels/<2 hex>/<64 hex>.bin. Each entry is a header (magic,
// format version, key, payload length, payload SHA-256) and the payload, written to a
// temporary file and renamed into place, so readers in other threads or processes see a
// whole entry or none. A damaged entry is reported as a miss with its reason and deleted;
// the caller rebuilds and stores it again. Thread-safe.
class KernelCache {
 public:
  static constexpr uint32_t kFormatVersion = 1;
  static constexpr size_t kHeaderSize = 88;

  // $KILN_CACHE_DIR; else $XDG_CACHE_HOME/kiln; else $HOME/.cache/kiln.
  static std::filesystem::path defaultDirectory();

  explicit KernelCache(bool enabled = true);  // In defaultDirectory().
  KernelCache(std::filesystem::path directory, bool enabled);

  const std::filesystem::path& directory() const { return directory_; }
  bool enabled() const { return enabled_; }
  std::filesystem::path entryPath(const CacheKey& key) const;

  CacheLookup lookup(const CacheKey& key);
  // Writes (or replaces) the entry. kIo when the directory is not writable; callers may
  // treat that as a warning, since the cache only saves time. A no-op when disabled.
  Status store(const CacheKey& key, std::span<const std::byte> payload);
  Status store(const CacheKey& key, std::string_view payload) {
    return store(key, std::as_bytes(std::span(payload.data(), payload.size())));
  }

  CacheStats stats() const;

  // True the first time in this process that it is called for `directory`: callers warn once
  // that a cache directory cannot be used (read-only, not a directory), not once per kernel.
  static bool firstFailure(const std::filesystem::path& directory);

 private:
  CacheLookup miss(CacheMissReason reason, std::string detail);

  std::filesystem::path directory_;
  bool enabled_;
  mutable std::mutex mu_;
  CacheStats stats_;
};

}  // namespace kiln::codegen
