// The caching allocator's statistics: bytes in use, peak, cache reuse.
#include <catch2/catch.hpp>

#include "runtime/allocator.h"
#include "runtime/tensor.h"

using kiln::runtime::CachingAllocator;

TEST_CASE("caching allocator rounds sizes and tracks bytes in use and peak") {
  CachingAllocator a;
  void* p1 = a.allocate(1000);  // Rounded to 1024.
  void* p2 = a.allocate(100);   // Rounded to 512.
  REQUIRE(p1 != nullptr);
  REQUIRE(p2 != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(p1) % 64 == 0);
  auto s = a.stats();
  CHECK(s.bytesInUse == 1024 + 512);
  CHECK(s.peakBytesInUse == 1024 + 512);
  CHECK(s.numAllocations == 2);
  CHECK(s.numSystemAllocations == 2);
  a.deallocate(p1, 1000);
  s = a.stats();
  CHECK(s.bytesInUse == 512);
  CHECK(s.peakBytesInUse == 1536);
  CHECK(s.bytesReserved == 1536);  // The freed block stays cached.
  a.resetPeak();
  CHECK(a.stats().peakBytesInUse == 512);
  a.deallocate(p2, 100);
}

TEST_CASE("caching allocator reuses a freed block of the same rounded size") {
  CachingAllocator a;
  void* p = a.allocate(4096);
  a.deallocate(p, 4096);
  void* q = a.allocate(4000);  // Same rounded size (4096).
  CHECK(q == p);
  CHECK(a.stats().numSystemAllocations == 1);
  CHECK(a.stats().numAllocations == 2);
  void* r = a.allocate(8192);  // Different size: a new block.
  CHECK(a.stats().numSystemAllocations == 2);
  a.deallocate(q, 4000);
  a.deallocate(r, 8192);
  CHECK(a.stats().bytesInUse == 0);
  a.emptyCache();
  CHECK(a.stats().bytesReserved == 0);
}

TEST_CASE("tensors return their storage to the allocator when the last reference dies") {
  CachingAllocator a;
  {
    auto t = kiln::runtime::Tensor::empty(kiln::ir::DType::kF32, {256, 256}, &a);
    REQUIRE(t.hasValue());
    CHECK(a.stats().bytesInUse == 256 * 256 * 4);
    kiln::runtime::Tensor copy = *t;  // Shares storage.
    CHECK(a.stats().bytesInUse == 256 * 256 * 4);
  }
  CHECK(a.stats().bytesInUse == 0);
  CHECK(a.stats().peakBytesInUse == 256 * 256 * 4);
}

TEST_CASE("an impossible allocation is an error, not a crash") {
  CachingAllocator a;
  auto t = kiln::runtime::Tensor::empty(kiln::ir::DType::kF32, {int64_t{1} << 40, 1 << 10}, &a);
  REQUIRE_FALSE(t.hasValue());
  CHECK_THAT(t.status().message(), Catch::Contains("out of memory"));
}

TEST_CASE("caching allocator: a limit refuses what would pass it, and the error says so") {
  kiln::runtime::CachingAllocator alloc;
  alloc.setLimit(4096);
  void* a = alloc.allocate(2048);
  REQUIRE(a != nullptr);
  CHECK(alloc.allocate(4096) == nullptr);  // 2048 + 4096 in use would pass 4096.
  auto t = kiln::runtime::Tensor::empty(kiln::ir::DType::kF32, {1024}, &alloc);
  REQUIRE_FALSE(t.hasValue());
  CHECK(t.status().code() == kiln::ErrorCode::kResourceExhausted);
  CHECK(t.status().message().find("past the limit of 4096 bytes") != std::string::npos);
  alloc.deallocate(a, 2048);
  void* b = alloc.allocate(4096);  // Fits once the first block is given back.
  CHECK(b != nullptr);
  alloc.deallocate(b, 4096);
  alloc.setLimit(0);
  void* c = alloc.allocate(1 << 20);
  CHECK(c != nullptr);
  alloc.deallocate(c, 1 << 20);
}
