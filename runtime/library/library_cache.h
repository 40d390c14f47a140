// LibraryCache internals: the caller-owned store of reordered weights (see kernels.h), and
// the aligned buffers the library kernels use for weights, scratch and layout copies.
#pragma once

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "runtime/library/kernels.h"

namespace kiln::runtime {

namespace lib {

// Uninitialized bytes aligned to a cache line (oneDNN prefers 64).
class AlignedBuffer {
 public:
  explicit AlignedBuffer(size_t bytes);
  std::byte* data() const { return data_.get(); }
  size_t bytes() const { return bytes_; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t bytes_ = 0;
};

}  // namespace lib

struct LibraryCache::Impl {
  // The buffer cached under (key, source's address), or a new one of `bytes` that fill(ptr)
  // writes and that is then cached. The entry keeps `source`'s storage alive. fill runs
  // outside the lock; two threads missing at once both fill and the first insert wins.
  template <class Fill>
  std::shared_ptr<const lib::AlignedBuffer> getOrCreate(const std::string& key,
                                                        const Tensor& source, size_t bytes,
                                                        Fill&& fill) {
    const auto address = reinterpret_cast<uintptr_t>(source.rawData());
    std::string fullKey;
    fullKey.reserve(key.size() + 1 + sizeof address);
    fullKey.append(key).append(1, '@').append(reinterpret_cast<const char*>(&address),
                                              sizeof address);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto it = entries.find(fullKey); it != entries.end()) {
        ++hits;
        return it->second.data;
      }
    }
    auto buffer = std::make_shared<lib::AlignedBuffer>(bytes);
    fill(buffer->data());
    std::lock_guard<std::mutex> lock(mu);
    auto [it, inserted] = entries.try_emplace(fullKey, Entry{source, buffer});
    if (inserted) totalBytes += bytes;
    return it->second.data;
  }

  struct Entry {
    Tensor pinned;  // Keeps the weights' storage (and so their address) alive.
    std::shared_ptr<const lib::AlignedBuffer> data;
  };
  mutable std::mutex mu;
  std::unordered_map<std::string, Entry> entries;
  size_t totalBytes = 0;
  size_t hits = 0;
};

}  // namespace kiln::runtime
