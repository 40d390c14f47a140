#include "runtime/allocator.h"

#include <new>

namespace kiln::runtime {

CachingAllocator::~CachingAllocator() {
  emptyCache();
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t size = roundSize(bytes);
  std::lock_guard lock(mu_);
  if (limit_ > 0 && stats_.bytesInUse + static_cast<int64_t>(size) > limit_) return nullptr;
  ++stats_.numAllocations;
  void* p = nullptr;
  // Reuse a cached block of exactly this rounded size. Eager runs repeat the same sizes, so
  // exact matching hits after the first run and keeps the accounting exact.
  if (auto it = free_.find(size); it != free_.end()) {
    p = it->second;
    free_.erase(it);
  } else {
    // Under a limit, cached blocks give way before the reserved bytes pass it.
    if (limit_ > 0 && stats_.bytesReserved + static_cast<int64_t>(size) > limit_)
      emptyCacheLocked();
    p = ::operator new(size, std::align_val_t(64), std::nothrow);
    if (!p) {
      emptyCacheLocked();
      p = ::operator new(size, std::align_val_t(64), std::nothrow);
      if (!p) return nullptr;
    }
    ++stats_.numSystemAllocations;
    stats_.bytesReserved += static_cast<int64_t>(size);
  }
  stats_.bytesInUse += static_cast<int64_t>(size);
  if (stats_.bytesInUse > stats_.peakBytesInUse) stats_.peakBytesInUse = stats_.bytesInUse;
  return p;
}

void CachingAllocator::deallocate(void* p, size_t bytes) {
  if (!p) return;
  const size_t size = roundSize(bytes);
  std::lock_guard lock(mu_);
  stats_.bytesInUse -= static_cast<int64_t>(size);
  free_.emplace(size, p);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void CachingAllocator::resetPeak() {
  std::lock_guard lock(mu_);
  stats_.peakBytesInUse = stats_.bytesInUse;
}

void CachingAllocator::emptyCache() {
  std::lock_guard lock(mu_);
  emptyCacheLocked();
}

void CachingAllocator::emptyCacheLocked() {
  for (auto& [size, p] : free_) {
    ::operator delete(p, std::align_val_t(64));
    stats_.bytesReserved -= static_cast<int64_t>(size);
  }
  free_.clear();
}

Status allocationFailure(const Allocator& a, size_t bytes, const std::string& what) {
  if (const int64_t limit = a.limit(); limit > 0)
    return resourceExhausted("allocating " + std::to_string(bytes) + " bytes for " + what +
                             " would take the memory in use (" +
                             std::to_string(a.stats().bytesInUse) + " bytes) past the limit of " +
                             std::to_string(limit) + " bytes; raise --max-memory");
  return resourceExhausted("out of memory allocating " + std::to_string(bytes) + " bytes for " +
                           what);
}

CachingAllocator& cpuAllocator() {
  static CachingAllocator* a =
      new CachingAllocator();  // Never destroyed: tensors may outlive main.
  return *a;
}

void CachingAllocator::setLimit(int64_t bytes) {
  std::lock_guard lock(mu_);
  limit_ = bytes > 0 ? bytes : 0;
}

int64_t CachingAllocator::limit() const {
  std::lock_guard lock(mu_);
  return limit_;
}

}  // namespace kiln::runtime
