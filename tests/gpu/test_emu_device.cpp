// The device table's semantics on the emu device — stream order, events across streams, graph
// capture and replay, memory limits — and the CUDA backend's caching allocator above it (reuse,
// no overlap of live blocks, stream-ordered reuse, fragmentation counters, flush on exhaustion).
#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <numeric>
#include <random>
#include <thread>

#include "gpu_test_util.h"
#include "runtime/gpu/gpu_backend.h"

using namespace kiln;
using namespace kiln::runtime::gpu;
using kiln::testing::EmuModule;

namespace {

const char* kKernels = R"(
extern "C" __global__ void scale_add(kiln_gptr<const float> x, kiln_gptr<float> y, long long n) {
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    y[i] = 2.0f * x[i] + y[i];
}
)";

// A host function that holds its stream until opened: makes "work still pending" certain.
struct Gate {
  std::atomic<bool> open{false};
  static void wait(void* p) {
    auto* g = static_cast<Gate*>(p);
    while (!g->open.load()) std::this_thread::yield();
  }
};

}  // namespace

TEST_CASE("emu device: a stream runs in order; an event orders a second stream after it") {
  EmuModule m(kKernels, {"scale_add"});
  DeviceApi& dev = m.device();
  long long n = 5000;
  std::vector<float> x(n), y(n, 1.0f), out(n, -1.0f);
  std::iota(x.begin(), x.end(), 0.0f);
  auto dx = m.upload(x);
  auto dy = m.upload(y);
  auto other = dev.createStream();
  auto done = dev.createEvent();
  auto start = dev.createEvent();
  REQUIRE((other.hasValue() && done.hasValue() && start.hasValue()));
  Gate gate;
  REQUIRE(dev.recordEvent(*start, m.stream()).isOk());
  REQUIRE(dev.launchHostFunc(m.stream(), &Gate::wait, &gate).isOk());
  for (int k = 0; k < 2; ++k)  // y = 2x + (2x + 1): the second launch must see the first.
    REQUIRE(m.launchAsync("scale_add", 3, 128, {m.arg(dx), m.arg(dy), &n},
                          {m.bytes(dx), m.bytes(dy), -1})
                .isOk());
  REQUIRE(dev.recordEvent(*done, m.stream()).isOk());
  REQUIRE(dev.waitEvent(*other, *done).isOk());
  REQUIRE(dev.copyToHost(out.data(), dy.p, dy.bytes, *other).isOk());
  // Nothing has run past the gate: the event is pending and the copy has not happened.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(*dev.eventDone(*done));
  CHECK(out[10] == -1.0f);
  gate.open = true;
  REQUIRE(dev.synchronize(*other).isOk());
  CHECK(*dev.eventDone(*done));
  for (long long i = 0; i < n; ++i) REQUIRE(out[static_cast<size_t>(i)] == 4.0f * x[i] + 1.0f);
  auto ms = dev.elapsedMs(*start, *done);
  REQUIRE(ms.hasValue());
  CHECK(*ms >= 20.0f);  // The gate held the stream at least that long.
  REQUIRE(dev.synchronize(m.stream()).isOk());
  dev.destroyEvent(*done);
  dev.destroyEvent(*start);
  dev.destroyStream(*other);
}

TEST_CASE("emu device: a captured graph runs nothing until launched, then replays the work") {
  EmuModule m(kKernels, {"scale_add"});
  DeviceApi& dev = m.device();
  long long n = 1000;
  std::vector<float> host(n, 1.0f), zero(n, 0.0f), out(n, 0.0f);
  auto dx = m.upload(host);
  auto dy = m.upload(zero);
  const int64_t launchesBefore = emuCounters(dev)->kernelLaunches;
  REQUIRE(dev.beginCapture(m.stream()).isOk());
  REQUIRE(dev.copyToDevice(dx.p, host.data(), dx.bytes, m.stream()).isOk());
  REQUIRE(dev.copyToDevice(dy.p, zero.data(), dy.bytes, m.stream()).isOk());
  REQUIRE(
      m.launchAsync("scale_add", 2, 256, {m.arg(dx), m.arg(dy), &n}, {m.bytes(dx), m.bytes(dy), -1})
          .isOk());
  REQUIRE(dev.copyToHost(out.data(), dy.p, dy.bytes, m.stream()).isOk());
  CHECK_THAT(dev.synchronize(m.stream()).message(), Catch::Contains("capturing a graph"));
  auto graph = dev.endCapture(m.stream());
  REQUIRE(graph.hasValue());
  REQUIRE(dev.synchronize(m.stream()).isOk());
  CHECK(emuCounters(dev)->kernelLaunches == launchesBefore);  // Recorded, not run.
  CHECK(out[0] == 0.0f);
  for (float v : {1.0f, 3.0f}) {  // Replays read the host buffer's current bytes.
    std::fill(host.begin(), host.end(), v);
    REQUIRE(dev.launchGraph(*graph, m.stream()).isOk());
    REQUIRE(dev.synchronize(m.stream()).isOk());
    CHECK(out[0] == 2.0f * v);
    CHECK(out[n - 1] == 2.0f * v);
  }
  CHECK(emuCounters(dev)->graphLaunches == 2);
  CHECK(emuCounters(dev)->kernelLaunches == launchesBefore + 2);
  dev.destroyGraph(*graph);
}

TEST_CASE("emu device: memory past its limit is a clear error; copies must stay inside") {
  auto dev = makeEmuDevice({.memoryBytes = 1 << 20});
  auto a = dev->malloc(600 << 10);
  REQUIRE(a.hasValue());
  auto b = dev->malloc(600 << 10);
  REQUIRE_FALSE(b.hasValue());
  CHECK(b.status().code() == ErrorCode::kResourceExhausted);
  CHECK_THAT(
      b.status().message(),
      Catch::Contains(
          "out of device memory: allocating 614400 bytes with 614400 bytes of 1.0 MiB in use") &&
          Catch::Contains("KILN_EMU_MEMORY_MB"));
  auto s = dev->createStream();
  REQUIRE(s.hasValue());
  std::vector<char> host(700 << 10);
  CHECK_THAT(dev->copyToDevice(*a, host.data(), host.size(), *s).message(),
             Catch::Contains("outside every live device allocation"));
  CHECK_THAT(dev->free(*a + 8).message(), Catch::Contains("not the start of a live allocation"));
  REQUIRE(dev->free(*a).isOk());
  dev->destroyStream(*s);
}

TEST_CASE("gpu allocator: reuse, no overlap of live blocks, counters") {
  auto dev = makeEmuDevice({.memoryBytes = 256 << 20});
  DeviceCachingAllocator alloc(dev);
  std::mt19937 rng(1);
  std::map<DevicePtr, size_t> live;  // Address -> rounded size.
  for (int i = 0; i < 400; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      auto it = std::next(live.begin(), static_cast<long>(rng() % live.size()));
      alloc.free(it->first);
      live.erase(it);
      continue;
    }
    const size_t bytes = rng() % 4 == 0 ? (rng() % (8 << 20)) : (rng() % 20000);
    auto p = alloc.allocate(bytes);
    REQUIRE(p.hasValue());
    CHECK(*p % 256 == 0);
    const size_t size = DeviceCachingAllocator::roundSize(bytes);
    // No live block overlaps the new one.
    auto next = live.lower_bound(*p);
    if (next != live.end()) CHECK(*p + size <= next->first);
    if (next != live.begin()) CHECK(std::prev(next)->first + std::prev(next)->second <= *p);
    live[*p] = size;
  }
  const DeviceAllocatorStats s = alloc.stats();
  int64_t inUse = 0;
  for (const auto& [p, size] : live) inUse += static_cast<int64_t>(size);
  CHECK(s.bytesInUse >= inUse);  // Best fit may hand out a block up to 1/8 larger.
  CHECK(s.bytesInUse <= inUse + inUse / 8);
  CHECK(s.cacheHits > 0);
  CHECK(s.cacheHits + s.deviceMallocs == s.allocations);
  CHECK(s.bytesWasted >= 0);
  CHECK(s.peakBytesInUse >= s.bytesInUse);
  // A freed block of a size class serves the next request of that class without the device.
  auto a = alloc.allocate(3000);
  REQUIRE(a.hasValue());
  alloc.free(*a);
  const int64_t mallocs = alloc.stats().deviceMallocs;
  auto b = alloc.allocate(2900);  // Same 512-byte class.
  REQUIRE(b.hasValue());
  CHECK(alloc.stats().deviceMallocs == mallocs);
  alloc.free(*b);
  for (const auto& [p, size] : live) alloc.free(p);
  CHECK(alloc.stats().bytesInUse == 0);
  REQUIRE(alloc.emptyCache().isOk());
  CHECK(alloc.stats().bytesCached == 0);
  CHECK(emuCounters(*dev)->liveAllocations == 0);  // Everything went back to the device.
}

TEST_CASE("gpu allocator: a block freed in stream order is reused only after its work is done") {
  auto dev = makeEmuDevice();
  DeviceCachingAllocator alloc(dev);
  auto s = dev->createStream();
  REQUIRE(s.hasValue());
  Gate gate;
  auto p = alloc.allocate(4096);
  REQUIRE(p.hasValue());
  REQUIRE(dev->launchHostFunc(*s, &Gate::wait, &gate).isOk());  // "A reader" still running.
  auto e = dev->createEvent();
  REQUIRE(e.hasValue());
  REQUIRE(dev->recordEvent(*e, *s).isOk());
  alloc.free(*p, *e);
  CHECK(alloc.stats().blocksPending == 1);
  auto q = alloc.allocate(4096);
  REQUIRE(q.hasValue());
  CHECK(*q != *p);  // Still in use by the stream.
  gate.open = true;
  REQUIRE(dev->synchronize(*s).isOk());
  auto r = alloc.allocate(4096);
  REQUIRE(r.hasValue());
  CHECK(*r == *p);  // Its event completed: reused.
  CHECK(alloc.stats().blocksPending == 0);
  alloc.free(*q);
  alloc.free(*r);
  dev->destroyStream(*s);
}

TEST_CASE("gpu allocator: out of memory empties the cache and retries, else names the amounts") {
  auto dev = makeEmuDevice({.memoryBytes = 8 << 20});
  DeviceCachingAllocator alloc(dev);
  auto a = alloc.allocate(5 << 20);  // 6 MiB rounded.
  REQUIRE(a.hasValue());
  alloc.free(*a);                    // Cached: the device still holds it.
  auto b = alloc.allocate(3 << 20);  // 4 MiB: does not fit beside the cached 6 MiB.
  REQUIRE(b.hasValue());
  CHECK(alloc.stats().cacheFlushes == 1);
  auto c = alloc.allocate(7 << 20);
  REQUIRE_FALSE(c.hasValue());
  CHECK(c.status().code() == ErrorCode::kResourceExhausted);
  CHECK_THAT(c.status().message(), Catch::Contains("out of device memory: allocating 8.0 MiB"));
  alloc.free(*b);
}

TEST_CASE("gpu backend: --device names a backend or fails in one line") {
  CHECK(runtime::gpu::backendForDevice("cpu").hasValue());
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  CHECK((*emu)->caps().kernelCode == "cuda-emu-object");
  CHECK_FALSE((*emu)->caps().hostAddressable);
  CHECK(runtime::gpu::backendForDevice("emu")->get() == emu->get());  // Made once.
  auto bad = runtime::gpu::backendForDevice("tpu");
  CHECK_THAT(bad.status().message(),
             Catch::Contains("unknown device 'tpu' (devices: cpu, cuda, emu)"));
  auto cuda = runtime::gpu::backendForDevice("cuda");
  if (!cuda.hasValue()) {  // This machine has no GPU (the usual case here).
    CHECK(cuda.status().code() == ErrorCode::kNotFound);
    CHECK(cuda.status().isUserError());
    CHECK_THAT(cuda.status().message(), Catch::StartsWith("no CUDA device: "));
    CHECK(cuda.status().message().find('\n') == std::string::npos);
  }
}

TEST_CASE("gpu backend: large copies are staged through pinned buffers") {
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  auto stream = (*emu)->openStream(0);
  REQUIRE(stream.hasValue());
  for (size_t n : {size_t{1000}, size_t{300000}}) {  // Below and above the staging threshold.
    INFO(n << " floats");
    std::vector<float> host(n), back(n, -1.0f);
    std::iota(host.begin(), host.end(), 0.0f);
    auto buf = (*emu)->allocate(n * sizeof(float));
    REQUIRE(buf.hasValue());
    REQUIRE((*stream)
                ->upload(buf->address(), reinterpret_cast<const std::byte*>(host.data()),
                         n * sizeof(float))
                .isOk());
    if (n * sizeof(float) >= 64 * 1024)  // Staged: the caller's bytes were taken at once.
      std::fill(host.begin(), host.end(), 7.0f);
    REQUIRE(
        (*stream)
            ->download(reinterpret_cast<std::byte*>(back.data()), buf->address(), n * sizeof(float))
            .isOk());
    REQUIRE((*stream)->synchronize().isOk());
    CHECK(back[0] == 0.0f);
    CHECK(back[n - 1] == static_cast<float>(n - 1));
  }
}
