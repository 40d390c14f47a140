// Host memory allocators. CachingAllocator is eager mode's allocator (as PyTorch's caching
// allocator: freed blocks are kept in size buckets and reused) with the statistics that
// `kiln bench` and the tests read: bytes in use, peak, allocation counts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "ir/status.h"

namespace kiln::runtime {

struct AllocatorStats {
  int64_t bytesInUse = 0;      // Sum of live allocations, rounded to the allocator's block size.
  int64_t peakBytesInUse = 0;  // Highest bytesInUse since the last resetPeak().
  int64_t bytesReserved = 0;   // bytesInUse plus cached free blocks.
  int64_t numAllocations = 0;  // allocate() calls.
  int64_t numSystemAllocations = 0;  // Allocations that went to the system (cache misses).
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns 64-byte aligned memory, or nullptr when the system is out of memory.
  virtual void* allocate(size_t bytes) = 0;
  virtual void deallocate(void* p, size_t bytes) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void resetPeak() = 0;
  // Bytes in use this allocator refuses to exceed (0: none). Optional.
  virtual int64_t limit() const { return 0; }
};

class CachingAllocator final : public Allocator {
 public:
  // Block sizes are rounded up to this granularity (PyTorch rounds to 512 bytes).
  static constexpr size_t kRound = 512;
  ~CachingAllocator() override;
  void* allocate(size_t bytes) override;
  void deallocate(void* p, size_t bytes) override;
  AllocatorStats stats() const override;
  void resetPeak() override;
  // Returns cached free blocks to the system.
  void emptyCache();
  // Refuses (allocate returns nullptr) what would take the bytes in use past `bytes`, and keeps
  // the cached blocks within it too; 0 removes the limit. Eager runs under --max-memory.
  void setLimit(int64_t bytes);
  int64_t limit() const override;
  static size_t roundSize(size_t bytes) {
    return bytes == 0 ? kRound : (bytes + kRound - 1) / kRound * kRound;
  }

 private:
  void emptyCacheLocked();
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // Rounded size -> block.
  AllocatorStats stats_;
  int64_t limit_ = 0;
};

// Why `alloc` returned nullptr for `bytes` (for `what`, e.g. a tensor type): past its limit
// (kResourceExhausted, naming the amounts and --max-memory) or out of system memory.
Status allocationFailure(const Allocator& alloc, size_t bytes, const std::string& what);

// The process-wide CPU allocator used for eager execution and tensors created by the user.
CachingAllocator& cpuAllocator();

}  // namespace kiln::runtime
