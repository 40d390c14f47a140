#include "codegen/kernel_cache.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <set>
#include <thread>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace kiln::codegen {
namespace {

constexpr std::array<uint32_t, 64> kRoundConstants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'K', 'E', 'R', 'N'};
// Header field offsets; all integers little-endian.
constexpr size_t kMagicOffset = 0;
constexpr size_t kVersionOffset = 8;
constexpr size_t kHeaderSizeOffset = 12;
constexpr size_t kKeyOffset = 16;
constexpr size_t kLengthOffset = 48;
constexpr size_t kChecksumOffset = 56;
static_assert(kChecksumOffset + 32 == KernelCache::kHeaderSize);

uint32_t rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

void putLe(uint8_t* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

uint64_t getLe(const uint8_t* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= static_cast<uint64_t>(in[i]) << (8 * i);
  return value;
}

std::string errnoText() {
  return std::strerror(errno);
}

// Reads a whole file. Returns false with `error` set on failure; ENOENT leaves `error` empty.
// Opens without blocking (a FIFO put in place of an entry would otherwise block the open
// until a writer appears) and reads only regular files.
bool readFile(const std::filesystem::path& path, std::vector<uint8_t>& out, std::string& error) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno != ENOENT) error = errnoText();
    return false;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    error = errnoText();
    ::close(fd);
    return false;
  }
  if (!S_ISREG(st.st_mode)) {
    error = S_ISDIR(st.st_mode)    ? "a directory, not a cache entry"
            : S_ISFIFO(st.st_mode) ? "a FIFO, not a cache entry"
                                   : "not a regular file";
    ::close(fd);
    return false;
  }
  out.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = errnoText();
      ::close(fd);
      return false;
    }
    if (n == 0) break;  // The file shrank while reading; the size checks below catch it.
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  ::close(fd);
  return true;
}

Status writeAll(int fd, const uint8_t* data, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ioError(errnoText());
    done += static_cast<size_t>(n);
  }
  return Status::ok();
}

// A name no other writer (thread or process) uses at the same time.
std::string temporarySuffix() {
  static std::atomic<uint64_t> counter{0};
  return ".tmp." + std::to_string(::getpid()) + "." +
         std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()) % 1000000) + "." +
         std::to_string(counter.fetch_add(1));
}

}  // namespace

Sha256::Sha256()
    : state_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
             0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19} {}

void Sha256::compress(const uint8_t* block) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i) {
    w[i] = (uint32_t{block[4 * i]} << 24) | (uint32_t{block[4 * i + 1]} << 16) |
           (uint32_t{block[4 * i + 2]} << 8) | uint32_t{block[4 * i + 3]};
  }
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    const uint32_t ch = (e & f) ^ (~e & g);
    const uint32_t t1 = h + s1 + ch + kRoundConstants[i] + w[i];
    const uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = s0 + maj;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void Sha256::update(std::span<const std::byte> data) {
  const auto* p = reinterpret_cast<const uint8_t*>(data.data());
  size_t n = data.size();
  if (n == 0) return;  // An empty span's data() may be null, which memcpy must not get.
  totalBytes_ += n;
  if (buffered_ > 0) {
    const size_t take = std::min(n, 64 - buffered_);
    std::memcpy(buffer_.data() + buffered_, p, take);
    buffered_ += take;
    p += take;
    n -= take;
    if (buffered_ < 64) return;
    compress(buffer_.data());
    buffered_ = 0;
  }
  for (; n >= 64; p += 64, n -= 64) compress(p);
  std::memcpy(buffer_.data(), p, n);
  buffered_ = n;
}

Sha256Digest Sha256::finish() {
  const uint64_t bits = totalBytes_ * 8;
  uint8_t pad[72] = {0x80};
  // Pad to 56 mod 64, then the message length in bits, big-endian.
  const size_t padLength = (buffered_ < 56 ? 56 - buffered_ : 120 - buffered_);
  for (int i = 0; i < 8; ++i) pad[padLength + i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  update(std::as_bytes(std::span(pad, padLength + 8)));
  Sha256Digest digest;
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 4; ++j) digest[4 * i + j] = static_cast<uint8_t>(state_[i] >> (24 - 8 * j));
  }
  return digest;
}

Sha256Digest Sha256::of(std::span<const std::byte> data) {
  Sha256 h;
  h.update(data);
  return h.finish();
}

std::string toHex(std::span<const uint8_t> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (uint8_t b : bytes) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

CacheKeyBuilder& CacheKeyBuilder::add(std::string_view field) {
  uint8_t length[8];
  putLe(length, field.size(), 8);
  hash_.update(std::as_bytes(std::span(length)));
  hash_.update(field);
  return *this;
}

CacheKey CacheKeyBuilder::finish() {
  return CacheKey{hash_.finish()};
}

const char* missReasonName(CacheMissReason reason) {
  switch (reason) {
    case CacheMissReason::kNone:
      return "hit";
    case CacheMissReason::kDisabled:
      return "disabled";
    case CacheMissReason::kAbsent:
      return "absent";
    case CacheMissReason::kTruncated:
      return "truncated";
    case CacheMissReason::kBadMagic:
      return "magic";
    case CacheMissReason::kBadVersion:
      return "version";
    case CacheMissReason::kKeyMismatch:
      return "key";
    case CacheMissReason::kSizeMismatch:
      return "size";
    case CacheMissReason::kChecksum:
      return "checksum";
    case CacheMissReason::kIo:
      return "io";
  }
  return "unknown";
}

std::string CacheLookup::explain() const {
  if (hit) return "hit (" + std::to_string(payload.size()) + " bytes)";
  return std::string("miss (") + missReasonName(reason) + (detail.empty() ? "" : ": " + detail) +
         ")";
}

std::filesystem::path KernelCache::defaultDirectory() {
  auto env = [](const char* name) -> std::string {
    const char* value = std::getenv(name);
    return value ? std::string(value) : std::string();
  };
  if (std::string dir = env("KILN_CACHE_DIR"); !dir.empty()) return dir;
  if (std::string xdg = env("XDG_CACHE_HOME"); !xdg.empty() && xdg.front() == '/') {
    return std::filesystem::path(xdg) / "kiln";
  }
  if (std::string home = env("HOME"); !home.empty()) {
    return std::filesystem::path(home) / ".cache" / "kiln";
  }
  return std::filesystem::temp_directory_path() / ("kiln-cache-" + std::to_string(::getuid()));
}

KernelCache::KernelCache(bool enabled) : KernelCache(defaultDirectory(), enabled) {}

KernelCache::KernelCache(std::filesystem::path directory, bool enabled)
    : directory_(std::move(directory)), enabled_(enabled) {}

std::filesystem::path KernelCache::entryPath(const CacheKey& key) const {
  const std::string hex = key.hex();
  // A level of 256 subdirectories keeps directories small with many thousands of kernels.
  return directory_ / "kernels" / hex.substr(0, 2) / (hex + ".bin");
}

CacheLookup KernelCache::miss(CacheMissReason reason, std::string detail) {
  {
    std::lock_guard lock(mu_);
    ++stats_.misses;
    if (reason != CacheMissReason::kAbsent && reason != CacheMissReason::kDisabled &&
        reason != CacheMissReason::kIo) {
      ++stats_.corrupt;
    }
  }
  CacheLookup result;
  result.reason = reason;
  result.detail = std::move(detail);
  return result;
}

CacheLookup KernelCache::lookup(const CacheKey& key) {
  if (!enabled_) return miss(CacheMissReason::kDisabled, "the kernel cache is disabled");
  const std::filesystem::path path = entryPath(key);
  std::vector<uint8_t> file;
  std::string readError;
  if (!readFile(path, file, readError)) {
    if (readError.empty()) return miss(CacheMissReason::kAbsent, "no entry " + path.string());
    return miss(CacheMissReason::kIo, "cannot read " + path.string() + ": " + readError);
  }

  // Every failed check deletes the entry, so the caller's rebuild replaces it.
  auto corrupt = [&](CacheMissReason reason, const std::string& what) {
    std::error_code ec;
    std::filesystem::remove(path, ec);
    return miss(reason, what + " in " + path.string() +
                            (ec ? "; could not delete it: " + ec.message() : "; entry deleted"));
  };
  if (file.size() < kHeaderSize) {
    return corrupt(CacheMissReason::kTruncated, "file of " + std::to_string(file.size()) +
                                                    " bytes is shorter than the " +
                                                    std::to_string(kHeaderSize) + "-byte header");
  }
  if (std::memcmp(file.data() + kMagicOffset, kMagic, sizeof(kMagic)) != 0) {
    return corrupt(CacheMissReason::kBadMagic, "not a kiln kernel cache entry (bad magic)");
  }
  const uint64_t version = getLe(file.data() + kVersionOffset, 4);
  const uint64_t headerSize = getLe(file.data() + kHeaderSizeOffset, 4);
  if (version != kFormatVersion || headerSize != kHeaderSize) {
    return corrupt(CacheMissReason::kBadVersion, "entry format version " + std::to_string(version) +
                                                     " (header " + std::to_string(headerSize) +
                                                     " bytes), expected version " +
                                                     std::to_string(kFormatVersion));
  }
  if (std::memcmp(file.data() + kKeyOffset, key.digest.data(), key.digest.size()) != 0) {
    return corrupt(CacheMissReason::kKeyMismatch,
                   "entry is for key " + toHex(std::span(file.data() + kKeyOffset, 32)));
  }
  const uint64_t length = getLe(file.data() + kLengthOffset, 8);
  const uint64_t available = file.size() - kHeaderSize;
  if (available < length) {
    return corrupt(CacheMissReason::kTruncated, "payload has " + std::to_string(available) +
                                                    " of " + std::to_string(length) + " bytes");
  }
  if (available > length) {
    return corrupt(CacheMissReason::kSizeMismatch, std::to_string(available - length) +
                                                       " bytes after the " +
                                                       std::to_string(length) + "-byte payload");
  }
  const auto payload = std::as_bytes(std::span(file.data() + kHeaderSize, length));
  const Sha256Digest checksum = Sha256::of(payload);
  if (std::memcmp(file.data() + kChecksumOffset, checksum.data(), checksum.size()) != 0) {
    return corrupt(CacheMissReason::kChecksum, "payload checksum mismatch");
  }

  CacheLookup result;
  result.hit = true;
  result.payload.assign(payload.begin(), payload.end());
  std::lock_guard lock(mu_);
  ++stats_.hits;
  stats_.bytesRead += static_cast<int64_t>(length);
  return result;
}

Status KernelCache::store(const CacheKey& key, std::span<const std::byte> payload) {
  if (!enabled_) return Status::ok();
  const std::filesystem::path path = entryPath(key);
  auto fail = [&](const std::string& what) {
    return ioError("kernel cache: " + what +
                   " (set KILN_CACHE_DIR to a writable directory, or "
                   "disable the cache with --no-cache)");
  };
  std::error_code ec;
  std::filesystem::create_directories(path.parent_path(), ec);
  if (ec) return fail("cannot create " + path.parent_path().string() + ": " + ec.message());

  uint8_t header[kHeaderSize] = {};
  std::memcpy(header + kMagicOffset, kMagic, sizeof(kMagic));
  putLe(header + kVersionOffset, kFormatVersion, 4);
  putLe(header + kHeaderSizeOffset, kHeaderSize, 4);
  std::memcpy(header + kKeyOffset, key.digest.data(), key.digest.size());
  putLe(header + kLengthOffset, payload.size(), 8);
  const Sha256Digest checksum = Sha256::of(payload);
  std::memcpy(header + kChecksumOffset, checksum.data(), checksum.size());

  // Write a private temporary file in the same directory, then rename it over the entry: the
  // rename is atomic, so a reader never sees half an entry. No fsync: after a power loss an
  // entry may be damaged, and the checksum turns that into a miss.
  const std::filesystem::path temporary = path.string() + temporarySuffix();
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return fail("cannot create " + temporary.string() + ": " + errnoText());
  Status written = writeAll(fd, header, sizeof(header));
  if (written.isOk()) {
    written = writeAll(fd, reinterpret_cast<const uint8_t*>(payload.data()), payload.size());
  }
  if (::close(fd) != 0 && written.isOk()) written = ioError(errnoText());
  if (written.isOk() && ::rename(temporary.c_str(), path.c_str()) != 0) {
    written = ioError("rename to " + path.string() + ": " + errnoText());
  }
  if (!written.isOk()) {
    ::unlink(temporary.c_str());
    return fail("cannot write " + temporary.string() + ": " + written.message());
  }
  std::lock_guard lock(mu_);
  ++stats_.stores;
  stats_.bytesWritten += static_cast<int64_t>(payload.size());
  return Status::ok();
}

bool KernelCache::firstFailure(const std::filesystem::path& directory) {
  static std::mutex mu;
  static std::set<std::string> warned;
  std::lock_guard lock(mu);
  return warned.insert(directory.lexically_normal().string()).second;
}

CacheStats KernelCache::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace kiln::codegen
