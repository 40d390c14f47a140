// oneDNN plumbing shared by the library kernels: the CPU engine, per-thread
// streams and scratch memory, the process-wide primitive plan cache and its keys, the
// translation of post-ops into oneDNN attributes, and thread-count alignment.
#pragma once

#include <dnnl.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/library/kernels.h"

namespace kiln::runtime::lib {

const dnnl::engine& cpuEngine();
// One stream per calling thread: oneDNN streams are not meant to be shared between threads.
dnnl::stream& threadStream();

// omp_get_max_threads(): oneDNN runs on this many OpenMP threads.
int maxThreads();
// Row-major C = alpha op(A) op(B) + beta C on oneDNN's sgemm, with bits that do not depend on
// the thread count: the product is cut into a grid of row and column blocks that depends on the
// shape alone (never K: each dot product is summed in one order), and every block runs on one
// thread (oneDNN's own threading splits K for some shapes at some counts, and OpenBLAS 0.3.21's
// results differed between 1 and 2 threads on most shapes). Measured on a Zen 5, 2 threads,
// against OpenBLAS 0.3.21 (whose AVX2 kernels it runs there) and oneDNN's own threading:
//   [128,768] x [768,768]   702 us OpenBLAS, 323 oneDNN threaded, 352 here
//   [1,768] x [768,768]      66 (sgemm; sgemv similar), 14 (differs by thread count), 23 here
//   [197,384] x [384,64]     92 (differs by thread count), 23, 28 here
// With oneDNN limited to AVX2 (ONEDNN_MAX_CPU_ISA) it was still ahead of OpenBLAS on every shape
// but the tiniest (2x9x16: 0.2 against 0.1 us). Inside a parallel region it runs on the calling
// thread alone.
void sgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// oneDNN generates its sgemm kernels at the first product of each kind in the process (on a Zen
// 5: 7 ms for the one-row kernels, 20 ms for the others, 33 ms for every kind). A prepared call
// that will run on sgemm calls this, so that the first run of a compiled or loaded model does
// not pay for it (runs once per process; later calls return at once).
void warmUpSgemm();

// Thread-local, grow-only scratch memory, one slot per purpose, so that repeated calls do
// not allocate (and page-fault) every time. A pointer stays valid until the same thread asks
// for the same slot again; reusing a slot between primitives of one call is safe because
// oneDNN's CPU stream on the OpenMP runtime executes each primitive before returning.
// A buffer is written, a byte a page, when it is made: a prepared call asks for the slots its
// runs will use (on the thread that prepares, usually the one that runs), so that the first run
// does not page-fault in them (mnist_cnn's artifact: 235 faults, 1.0-1.3 ms against 0.2 ms).
enum class Scratch : uint8_t { kPrimitive, kSrc, kDst, kWeights, kExtra, kCount };
std::byte* scratch(Scratch slot, size_t bytes);
inline std::atomic<uint64_t> scratchBuffersMade{0};  // Buffers scratch() allocated (tests).
// The scratchpad a primitive of scratchpad descriptor `md` needs (the kPrimitive slot), or null
// when it needs none: called by runs to pass it, and by prepared calls to make it ahead.
inline std::byte* scratchpad(const dnnl::memory::desc& md) {
  const size_t bytes = md.get_size();
  return bytes > 0 ? scratch(Scratch::kPrimitive, bytes) : nullptr;
}
inline float* scratchFloats(Scratch slot, size_t count) {
  return reinterpret_cast<float*>(scratch(slot, count * sizeof(float)));
}

// A byte-string cache key built from the values that determine a primitive.
class CacheKey {
 public:
  explicit CacheKey(std::string_view family) {
    bytes_.reserve(256);  // A convolution's key is about 200 bytes: one allocation.
    bytes_ = family;
  }
  CacheKey& add(int64_t v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  CacheKey& add(double v) {
    int64_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return add(bits);
  }
  CacheKey& add(std::span<const int64_t> v) {
    add(static_cast<int64_t>(v.size()));
    for (int64_t x : v) add(x);
    return *this;
  }
  CacheKey& add(std::span<const PostOp> post);
  const std::string& str() const { return bytes_; }

 private:
  std::string bytes_;
};

// Plans made by every PlanCache since the process started (tests: a run after prepare() makes
// none).
inline std::atomic<uint64_t> plansMade{0};

// A process-wide, thread-safe LRU cache of immutable plans (primitive descriptors, primitives
// and their reorders) keyed by CacheKey. Keys hold shapes and attributes, never addresses.
template <class Plan>
class PlanCache {
 public:
  explicit PlanCache(size_t capacity) : capacity_(capacity) {}

  // The plan under `key`, or make()'s (an Expected<std::shared_ptr<const Plan>>) once cached.
  // make() runs outside the lock (creating a primitive takes 0.3-0.6 ms).
  template <class Make>
  Expected<std::shared_ptr<const Plan>> getOrCreate(const std::string& key, Make&& make) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = index_.find(key); it != index_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);
        return it->second->second;
      }
    }
    Expected<std::shared_ptr<const Plan>> made = make();
    if (!made.hasValue()) return made;
    plansMade.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = index_.find(key); it != index_.end()) return it->second->second;
    lru_.emplace_front(key, *made);
    index_.emplace(key, lru_.begin());
    if (lru_.size() > capacity_) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    return made;
  }

 private:
  using Entry = std::pair<std::string, std::shared_ptr<const Plan>>;
  std::mutex mu_;
  size_t capacity_;
  std::list<Entry> lru_;
  std::unordered_map<std::string, typename std::list<Entry>::iterator> index_;
};

inline constexpr size_t kPlanCacheCapacity = 1024;

// How many leading post-ops of `post` a oneDNN primitive may run. Always the kAdds (IEEE
// addition: oneDNN computes them as the reference kernels do, NaN and infinities included).
// oneDNN computes relu and clip with max/min instructions that turn NaN into 0 or the bound
// (measured on AVX-512, tests/compiler/test_nan.cpp), where PyTorch and the reference let NaN
// through; so they join only with `activations` (LibraryOptions::fuseActivations): the caller
// then checks the floating-point invalid flag, which those instructions raise on a NaN operand,
// and runs again without them where it was raised (PlanExecutor). Other activations always run
// in kiln's epilogue pass (epilogue.h): their injectors differ per ISA and version.
size_t fusedPostOpPrefix(std::span<const PostOp> post, bool activations);

// Appends the oneDNN post-ops for `post` (those fusedPostOpPrefix allows) to `ops`. The first
// kAdd becomes a sum post-op when `sumForFirstAdd` (the caller prefills dst with that addend)
// and the others binary adds reading `addMd`; relu and clip become eltwise post-ops.
// binaryIndex gets, per post-op, its position in `ops` when it is a binary add, else -1.
void appendPostOps(dnnl::post_ops& ops, std::span<const PostOp> post, bool sumForFirstAdd,
                   const dnnl::memory::desc& addMd, std::vector<int>& binaryIndex);

// An f32 row-major (dense, last dim fastest) descriptor of `dims`.
dnnl::memory::desc plainMd(const dnnl::memory::dims& dims);

// A memory descriptor's layout as text (dims, data type, strides and inner blocks, or a
// winograd format's blocking), for keys that must tell two formats apart and nothing else.
// Formats are blocked or winograd here; another kind is told apart by its kind only.
std::string describeMd(const dnnl::memory::desc& md);

// A primitive attribute with user-managed scratchpad (so concurrent calls of one cached
// primitive never share scratch memory) and the given post-ops.
dnnl::primitive_attr makeAttr(const dnnl::post_ops& postOps);

// The arguments of one execution of a cached primitive. The memory objects of the previous call of
// the same primitive (`owner`: its plan) on this thread are pointed at this call's buffers
// instead of made anew: making them and their map took about 1 us a call (a harness on a small
// depthwise convolution: 3.7 us a call made, 2.7 us kept). A plan freed and another made at its
// address is told apart by the descriptors, which must match. The map stays valid until this
// thread's next CallArgs of the same owner.
class CallArgs {
 public:
  explicit CallArgs(const void* owner);
  CallArgs(const CallArgs&) = delete;
  CallArgs& operator=(const CallArgs&) = delete;
  CallArgs& set(int arg, const dnnl::memory::desc& md, const void* data);
  // The arguments set since construction (others of an earlier call removed).
  const std::unordered_map<int, dnnl::memory>& map();

 private:
  bool wasSet(int arg) const;

  std::unordered_map<int, dnnl::memory>* args_;
  std::unordered_map<int, dnnl::memory> local_;  // When this thread keeps too many already.
  // The arguments set by this call: no allocation for the usual few (this runs every call).
  std::array<int, 8> set_{};
  size_t numSet_ = 0;
  std::vector<int> moreSet_;
};

// A reorder between two memory formats, with user-managed scratchpad.
struct ReorderPlan {
  dnnl::reorder prim;
  dnnl::memory::desc from, to, scratchMd;
};
ReorderPlan makeReorder(const dnnl::memory::desc& from, const dnnl::memory::desc& to);
// Copies `from` (in r.from's format) into `to` (r.to's) on this thread's stream.
void runReorder(const ReorderPlan& r, const void* from, void* to);

// Whether oneDNN picked its reference implementation (slower than kiln's own kernels).
inline bool isReferenceImpl(const dnnl::primitive_desc_base& pd) {
  return std::string_view(pd.impl_info_str()).starts_with("ref");
}

// The oneDNN type of a product operand: f32 or bf16.
inline dnnl::memory::data_type operandType(ir::DType t) {
  return t == ir::DType::kBF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

// dims of a memory descriptor from a kiln shape.
inline dnnl::memory::dims dimsOf(std::span<const int64_t> shape) {
  return dnnl::memory::dims(shape.begin(), shape.end());
}

}  // namespace kiln::runtime::lib
