// oneDNN / OpenBLAS plumbing shared by the library kernels (see dnnl_support.h).
#include "runtime/library/dnnl_support.h"

#include <cblas.h>
#include <omp.h>

#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>

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

void sgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 1 && n > 0 && k > 0) {  // Row 0 of op(A) is a[i * (transA ? lda : 1)].
    cblas_sgemv(CblasRowMajor, transB ? CblasNoTrans : CblasTrans,
                static_cast<blasint>(transB ? n : k), static_cast<blasint>(transB ? k : n), alpha,
                b, static_cast<blasint>(ldb), a, static_cast<blasint>(transA ? lda : 1), beta, c,
                1);
    return;
  }
  if (n == 1 && m > 0 && k > 0) {  // One column of op(B): b[i * (transB ? 1 : ldb)].
    cblas_sgemv(CblasRowMajor, transA ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(transA ? k : m), static_cast<blasint>(transA ? m : k), alpha,
                a, static_cast<blasint>(lda), b, static_cast<blasint>(transB ? 1 : ldb), beta, c,
                static_cast<blasint>(ldc));
    return;
  }
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
}

BlasThreads::BlasThreads() {
  // Inside a parallel region OpenBLAS runs single-threaded by itself, reading no count.
  if (omp_in_parallel()) return;
  static std::shared_mutex mu;
  const int n = omp_get_max_threads();
  for (;;) {
    std::shared_lock shared(mu);
    if (openblas_get_num_threads() == n) {
      lock_ = std::move(shared);
      return;
    }
    shared.unlock();
    std::unique_lock exclusive(mu);  // No OpenBLAS call is in flight while this is held.
    if (openblas_get_num_threads() != n) openblas_set_num_threads(n);
  }
}

std::byte* scratch(Scratch slot, size_t bytes) {
  thread_local std::array<std::unique_ptr<AlignedBuffer>, static_cast<size_t>(Scratch::kCount)>
      slots;
  auto& buf = slots[static_cast<size_t>(slot)];
  if (!buf || buf->bytes() < bytes) {
    buf.reset();  // Free the old buffer first: peak memory stays one buffer per slot.
    buf = std::make_unique<AlignedBuffer>(bytes);
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

size_t nanExactPostOpPrefix(std::span<const PostOp> post) {
  size_t n = 0;
  while (n < post.size() && post[n].kind == PostOp::Kind::kAdd) ++n;
  return n;
}

void appendPostOps(dnnl::post_ops& ops, std::span<const PostOp> post, bool sumForFirstAdd,
                   const dnnl::memory::desc& addMd, std::vector<int>& binaryIndex) {
  binaryIndex.assign(post.size(), -1);
  bool sumUsed = !sumForFirstAdd;
  for (size_t i = 0; i < post.size(); ++i) {
    if (post[i].kind != PostOp::Kind::kAdd) {
      throw std::logic_error("appendPostOps: only kAdd post-ops go into oneDNN primitives");
    } else if (!sumUsed) {
      ops.append_sum(1.f);
      sumUsed = true;
    } else {
      binaryIndex[i] = ops.len();
      ops.append_binary(dnnl::algorithm::binary_add, addMd);
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
  dnnl::memory fromMem(r.from, cpuEngine(), const_cast<void*>(from));
  dnnl::memory toMem(r.to, cpuEngine(), to);
  std::unordered_map<int, dnnl::memory> args{{DNNL_ARG_FROM, fromMem}, {DNNL_ARG_TO, toMem}};
  if (const size_t bytes = r.scratchMd.get_size(); bytes > 0)
    args.emplace(DNNL_ARG_SCRATCHPAD,
                 dnnl::memory(r.scratchMd, cpuEngine(), scratch(Scratch::kPrimitive, bytes)));
  r.prim.execute(threadStream(), args);
}

}  // namespace kiln::runtime::lib
