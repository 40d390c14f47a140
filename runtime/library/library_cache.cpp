// LibraryCache (kernels.h) and the aligned buffers of the library kernels.
#include "runtime/library/library_cache.h"

#include <new>

namespace kiln::runtime {

namespace lib {

AlignedBuffer::AlignedBuffer(size_t bytes) : bytes_(bytes) {
  constexpr size_t kAlign = 64;
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  data_.reset(static_cast<std::byte*>(std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded)));
  if (!data_) throw std::bad_alloc();
}

}  // namespace lib

LibraryCache::LibraryCache() : impl_(std::make_unique<Impl>()) {}
LibraryCache::~LibraryCache() = default;

void LibraryCache::clear() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->entries.clear();
  impl_->totalBytes = 0;
}

size_t LibraryCache::numEntries() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->entries.size();
}

size_t LibraryCache::bytes() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->totalBytes;
}

size_t LibraryCache::hits() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->hits;
}

}  // namespace kiln::runtime
