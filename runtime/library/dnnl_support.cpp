// oneDNN plumbing shared by the library kernels (see dnnl_support.h).
#include "runtime/library/dnnl_support.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "runtime/cpu/chunk_queues.h"
#include "runtime/library/library_cache.h"

namespace kiln::runtime::lib {

const dnnl::engine& cpuEngine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& threadStream() {
  thread_local dnnl::stream stream(cpuEngine());
  return stream;
}

int maxThreads() {
  return omp_get_max_threads();
}

namespace {

int64_t ceilDiv(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// One block of the product on this thread alone: inside an active parallel region oneDNN runs
// one thread by itself; outside one (a single block, or one thread granted) the caller's
// OpenMP thread count is 1 for the duration of the call.
bool sgemmOnThisThread(char transA, char transB, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                       float* c, int64_t ldc) {
  const bool serial = !omp_in_parallel();
  const int before = serial ? omp_get_max_threads() : 1;
  if (serial) omp_set_num_threads(1);
  const dnnl_status_t st = dnnl_sgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (serial) omp_set_num_threads(before);
  return st == dnnl_success;
}

}  // namespace

void sgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // An empty sum: C = beta C (oneDNN rejects a leading dimension of 0).
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.f ? 0.f : beta * c[i * ldc + j];
    return;
  }
  // Blocks of >= 2^17 multiply-adds (about 0.5 us on one core), a multiple of 4 of them (even
  // shares for 1, 2 and 4 threads; 3 blocks on 2 threads cost mobilenet_v3_small's classifier
  // a third), at most 64: rows first, in multiples of 8 and at least 32 of them, then columns in
  // multiples of 16, at least 64. The grid depends on the shape alone.
  constexpr int64_t kBlockMacs = int64_t{1} << 17, kMaxBlocks = 64;
  int64_t want = std::clamp<int64_t>(m * n * k / kBlockMacs, 1, kMaxBlocks);
  if (want > 1) want = std::min(kMaxBlocks, (want + 3) / 4 * 4);
  int64_t rowBlocks = std::min(want, ceilDiv(m, 32));
  const int64_t rows = ceilDiv(ceilDiv(m, rowBlocks), 8) * 8;
  rowBlocks = ceilDiv(m, rows);
  int64_t colBlocks = std::min(std::max<int64_t>(want / rowBlocks, 1), ceilDiv(n, 64));
  const int64_t cols = ceilDiv(ceilDiv(n, colBlocks), 16) * 16;
  colBlocks = ceilDiv(n, cols);
  const int64_t blocks = rowBlocks * colBlocks;
  const char ta = transA ? 'T' : 'N', tb = transB ? 'T' : 'N';
  std::atomic<bool> rejected{false};
  parallelUnits(blocks, true, [&](int64_t i) {
    const int64_t r0 = i / colBlocks * rows, c0 = i % colBlocks * cols;
    const float* ai = a + (transA ? r0 : r0 * lda);  // Row r0 of op(A).
    const float* bi = b + (transB ? c0 * ldb : c0);  // Column c0 of op(B).
    if (!sgemmOnThisThread(ta, tb, std::min(rows, m - r0), std::min(cols, n - c0), k, alpha, ai,
                           lda, bi, ldb, beta, c + r0 * ldc + c0, ldc))
      rejected = true;
  });
  // oneDNN rejects only wrong arguments (a leading dimension below its row's length): a bug.
  if (rejected) throw std::logic_error("sgemm: oneDNN's dnnl_sgemm rejected its arguments");
}

void warmUpSgemm() {
  static std::once_flag once;
  std::call_once(once, [] {
    constexpr int64_t kSize = 512;  // The largest dimension below: 8x512x512.
    std::vector<float> a(kSize * kSize, 0.f), b(kSize * kSize, 0.f), c(kSize * kSize, 0.f);
    struct Dims {
      int64_t m, n, k;
    };
    for (const bool ta : {false, true})
      for (const bool tb : {false, true})
        for (const float beta : {0.f, 1.f})
          for (const Dims d :
               {Dims{1, 64, 64}, Dims{64, 1, 64}, Dims{64, 64, 64}, Dims{8, 512, 512}})
            (void)sgemmOnThisThread(ta ? 'T' : 'N', tb ? 'T' : 'N', d.m, d.n, d.k, 1.f, a.data(),
                                    ta ? d.m : d.k, b.data(), tb ? d.k : d.n, beta, c.data(), d.n);
  });
}

std::byte* scratch(Scratch slot, size_t bytes) {
  thread_local std::array<std::unique_ptr<AlignedBuffer>, static_cast<size_t>(Scratch::kCount)>
      slots;
  auto& buf = slots[static_cast<size_t>(slot)];
  if (!buf || buf->bytes() < bytes) {
    buf.reset();  // Free the old buffer first: peak memory stays one buffer per slot.
    buf = std::make_unique<AlignedBuffer>(bytes);
    scratchBuffersMade.fetch_add(1, std::memory_order_relaxed);
    volatile std::byte* pages = buf->data();  // Mapped now, not inside a primitive.
    for (size_t i = 0; i < bytes; i += 4096) pages[i] = std::byte{0};
  }
  return buf->data();
}

CacheKey& CacheKey::add(std::span<const PostOp> post) {
  add(static_cast<int64_t>(post.size()));
  for (const PostOp& p : post) {
    add(static_cast<int64_t>(p.kind));
    if (p.kind != PostOp::Kind::kAdd) add(p.alpha).add(p.beta);
  }
  return *this;
}

size_t fusedPostOpPrefix(std::span<const PostOp> post, bool activations) {
  size_t n = 0;
  while (n < post.size() &&
         (post[n].kind == PostOp::Kind::kAdd || (activations && fusesWhenChecked(post[n].kind))))
    ++n;
  return n;
}

void appendPostOps(dnnl::post_ops& ops, std::span<const PostOp> post, bool sumForFirstAdd,
                   const dnnl::memory::desc& addMd, std::vector<int>& binaryIndex) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  binaryIndex.assign(post.size(), -1);
  bool sumUsed = !sumForFirstAdd;
  for (size_t i = 0; i < post.size(); ++i) {
    switch (post[i].kind) {
      case PostOp::Kind::kAdd:
        if (!sumUsed) {
          ops.append_sum(1.f);
          sumUsed = true;
        } else {
          binaryIndex[i] = ops.len();
          ops.append_binary(dnnl::algorithm::binary_add, addMd);
        }
        break;
      case PostOp::Kind::kRelu:
        ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
        break;
      case PostOp::Kind::kClip:  // A NaN bound is no bound, as the clip op.
        ops.append_eltwise(1.f, dnnl::algorithm::eltwise_clip,
                           std::isnan(post[i].alpha) ? -kInf : static_cast<float>(post[i].alpha),
                           std::isnan(post[i].beta) ? kInf : static_cast<float>(post[i].beta));
        break;
      default:
        throw std::logic_error("appendPostOps: a post-op oneDNN does not run exactly");
    }
  }
}

dnnl::memory::desc plainMd(const dnnl::memory::dims& dims) {
  dnnl::memory::dims strides(dims.size());
  int64_t s = 1;
  for (size_t d = dims.size(); d-- > 0;) {
    strides[d] = s;
    s *= dims[d];
  }
  return dnnl::memory::desc(dims, dnnl::memory::data_type::f32, strides);
}

std::string describeMd(const dnnl::memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  std::string s = "md" + std::to_string(d.ndims) + ":" + std::to_string(d.data_type) + ":" +
                  std::to_string(d.format_kind) + ":" + std::to_string(d.extra.flags);
  for (int i = 0; i < d.ndims; ++i)
    s += "," + std::to_string(d.dims[i]) + "/" + std::to_string(d.padded_dims[i]);
  if (d.format_kind == dnnl_blocked) {
    const auto& b = d.format_desc.blocking;
    for (int i = 0; i < d.ndims; ++i) s += ";" + std::to_string(b.strides[i]);
    for (int i = 0; i < b.inner_nblks; ++i)
      s += "|" + std::to_string(b.inner_idxs[i]) + "x" + std::to_string(b.inner_blks[i]);
  } else if (d.format_kind == dnnl_format_kind_wino) {
    // Winograd weights: the blocking is oneDNN's choice per primitive (it sizes it by the
    // thread count), so two plans' formats share the kind and dims but not the layout.
    const auto& w = d.format_desc.wino_desc;
    for (int64_t v : {int64_t{w.wino_format}, int64_t{w.r}, int64_t{w.alpha}, int64_t{w.ic},
                      int64_t{w.oc}, int64_t{w.ic_block}, int64_t{w.oc_block}, int64_t{w.ic2_block},
                      int64_t{w.oc2_block}, static_cast<int64_t>(w.size)})
      s += ";" + std::to_string(v);
    s += ";" + std::to_string(w.adj_scale);
  }
  return s;
}

CallArgs::CallArgs(const void* owner) {
  // Per thread, per primitive plan. Entries of freed plans stay (their address may come back
  // with another plan, which then reuses what matches); past kMaxOwners a thread keeps no more.
  constexpr size_t kMaxOwners = 4096;
  thread_local std::unordered_map<const void*, std::unordered_map<int, dnnl::memory>> kept;
  auto it = kept.find(owner);
  if (it == kept.end() && kept.size() < kMaxOwners) it = kept.try_emplace(owner).first;
  args_ = it != kept.end() ? &it->second : &local_;
}

CallArgs& CallArgs::set(int arg, const dnnl::memory::desc& md, const void* data) {
  if (numSet_ < set_.size())
    set_[numSet_++] = arg;
  else
    moreSet_.push_back(arg);
  void* handle = const_cast<void*>(data);
  auto it = args_->find(arg);
  if (it != args_->end() && it->second.get_desc() == md)
    it->second.set_data_handle(handle);
  else
    args_->insert_or_assign(arg, dnnl::memory(md, cpuEngine(), handle));
  return *this;
}

bool CallArgs::wasSet(int arg) const {
  return std::find(set_.begin(), set_.begin() + static_cast<std::ptrdiff_t>(numSet_), arg) !=
             set_.begin() + static_cast<std::ptrdiff_t>(numSet_) ||
         std::find(moreSet_.begin(), moreSet_.end(), arg) != moreSet_.end();
}

const std::unordered_map<int, dnnl::memory>& CallArgs::map() {
  if (args_->size() > numSet_ + moreSet_.size())
    std::erase_if(*args_, [&](const auto& kv) { return !wasSet(kv.first); });
  return *args_;
}

dnnl::primitive_attr makeAttr(const dnnl::post_ops& postOps) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  attr.set_post_ops(postOps);
  return attr;
}

ReorderPlan makeReorder(const dnnl::memory::desc& from, const dnnl::memory::desc& to) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::reorder::primitive_desc pd(cpuEngine(), from, cpuEngine(), to, attr);
  return {dnnl::reorder(pd), from, to, pd.scratchpad_desc()};
}

void runReorder(const ReorderPlan& r, const void* from, void* to) {
  CallArgs args(&r);
  args.set(DNNL_ARG_FROM, r.from, from).set(DNNL_ARG_TO, r.to, to);
  if (std::byte* pad = scratchpad(r.scratchMd)) args.set(DNNL_ARG_SCRATCHPAD, r.scratchMd, pad);
  r.prim.execute(threadStream(), args.map());
}

}  // namespace kiln::runtime::lib
