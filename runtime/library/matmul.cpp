// matmul (NumPy: batched, broadcast batch dims, 1-D promotion), gemm (ONNX: transA/transB,
// alpha, beta, broadcast C) and linear (x W^T + b) on lib::sgemm (oneDNN's sgemm in one-thread
// blocks) or oneDNN's matmul primitive.
//
// BLAS path: one sgemm per batch (a batch folds into the rows when B is shared), then one
// epilogue pass (bias or beta*C, post-ops) over the output. oneDNN path: one matmul primitive
// (batch broadcasting, transposes as strides, alpha as output scale, C and kAdds as binary
// post-ops, activations as eltwise post-ops; B prepacked once into the caller's LibraryCache
// where it is a parameter); shapes or chains it cannot take run on the BLAS path.
//
// kAuto's choice between them, measured when the BLAS path was OpenBLAS 0.3.21 (lib::sgemm has
// been oneDNN's sgemm since, faster than OpenBLAS on every shape measured; not re-measured) on the
// 2-core development machine (fp32 GFLOP/s of
// runLibraryWithPostOps, best of >= 1 s of calls, OMP_NUM_THREADS=2; x W^T for linear):
//   shape                                OpenBLAS   oneDNN
//   matmul [1,784] x [784,512]               61       27     (M = 1: OpenBLAS's gemv)
//   linear [1,784] x [512,784]^T             64       26
//   matmul [128,768] x [768,768]            284      364
//   linear [128,768] x [768,768]^T          273      371
//   matmul [32,2048] x [2048,1000]          186      242
//   linear [32,2048] x [1000,2048]^T        172      254
//   matmul [12,128,64] x [12,64,128]        134      388     (one primitive for the batch)
//   linear [2,784] x [512,784]^T             96       51     (0.8M MACs: OpenBLAS's small path)
//   linear [4,784] x [512,784]^T             33       96
//   matmul [2,2048] x [2048,1000]            27       68
//   matmul [4,16,64] x [4,64,128]           179      170     (0.5M MACs, 6 us a call)
// With one thread the picture is the same (oneDNN 1.1-1.4x from M >= 32, OpenBLAS 4.5x at
// M = 1). Hence kAuto: the BLAS path for matrix-vector products and for products of at most 2^20
// multiply-adds (call overhead dominates), oneDNN otherwise.
#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "runtime/library/dnnl_support.h"
#include "runtime/library/epilogue.h"
#include "runtime/library/families.h"
#include "runtime/library/library_cache.h"

namespace kiln::runtime::lib {

namespace {

using dnnl::memory;

// kAuto's rule (see the measurements above). `rows` is M of each GEMM, `macs` the
// multiply-adds of the whole call.
constexpr int64_t kAutoBlasMaxMacs = int64_t{1} << 20;
// The narrowest product (N) oneDNN's gemm-based matmul runs (makePlan).
constexpr int64_t kGemmJitMinColumns = 128;
// A prepacked B that oneDNN's gemm-based matmul (AVX2) wants as plain [K, N] rows is kept with
// rows this many floats longer. Its no-copy kernels, which it runs for products of fewer than
// about 260 rows, read B's rows at their stride, and rows a multiple of 1 KiB apart (N = 1024,
// 2048, 3072, 4096) all land on the same cache sets. Measured on a 2-core Zen 3 (oneDNN 2.6.3,
// 2 threads, fp32): [128,768] x [768,3072] 93 -> 188 GFLOP/s (95% of the FMA peak); 1.9-2.2x
// for M of 8, 32, 64, 128 and 256 with N = 1024, 2048, 3072 or 4096 (and M = 4 with N = 3072),
// 1.1-1.7x with N = 512, 768, 1152 or 1536, 0.98-1.0x from M = 512 (its copy-based kernels).
constexpr int64_t kPaddedColumns = 16;

bool useDnnl(const LibraryOptions& options, int64_t rows, int64_t macs) {
  switch (options.gemm) {
    case GemmBackend::kBlas:
      return false;
    case GemmBackend::kOneDnn:
      return true;
    case GemmBackend::kAuto:
      break;
  }
  return rows > 1 && macs > kAutoBlasMaxMacs;
}

// ---- oneDNN matmul plans.

struct MatMulPlan {
  dnnl::matmul prim;
  memory::desc scratchMd;
  // B (the call's input 1) in the format the primitive prefers, when it is a parameter kept in
  // the caller's LibraryCache: reordered once, keyed by that format (see ConvPlan::weightsKey).
  std::optional<ReorderPlan> weightsIn;
  memory::desc weightsMd;
  std::string weightsKey;
  size_t fusedPostOps = 0;       // Leading post-ops in the primitive; the epilogue runs the rest.
  std::vector<int> binaryIndex;  // Per post-op: its binary post-op position, or -1.
};

PlanCache<MatMulPlan>& matmulPlans() {
  static PlanCache<MatMulPlan> cache(kPlanCacheCapacity);
  return cache;
}

// A matmul problem for oneDNN: operand descriptors (transposes are strides), an optional
// bias, alpha, and an optional addend C (gemm, beta = 1) broadcast to dst.
struct DnnlProblem {
  memory::desc a, b, bias, c, dst;
  float alpha = 1.f;
};

void addMd(CacheKey& key, const memory::desc& md) {
  key.add(int64_t{md.data.ndims});
  for (int i = 0; i < md.data.ndims; ++i) {
    key.add(int64_t{md.data.dims[i]});
    key.add(int64_t{md.data.format_desc.blocking.strides[i]});
  }
}

// Row-major [K, N] B, rows N floats apart.
memory::desc denseRowMajor(const memory::desc& b) {
  return memory::desc(b.dims(), b.data_type(), memory::format_tag::ab);
}

// `packB`: B may take the primitive's preferred (blocked) format, reordered once into a cache;
// otherwise the primitive reads B as the caller holds it (and packs it inside every call).
Expected<std::shared_ptr<const MatMulPlan>> makePlan(const DnnlProblem& p,
                                                     std::span<const PostOp> post, bool packB,
                                                     bool activations) {
  auto plan = std::make_shared<MatMulPlan>();
  memory::desc b = packB ? memory::desc(p.b.dims(), p.b.data_type(), memory::format_tag::any) : p.b;
  const size_t exact = fusedPostOpPrefix(post, activations);
  auto tryCreate = [&](bool withPost) -> std::optional<dnnl::matmul::primitive_desc> {
    try {
      dnnl::post_ops ops;
      if (!p.c.is_zero()) ops.append_binary(dnnl::algorithm::binary_add, p.c);
      // kAdds read the caller's tensors directly: binary adds, no sum prefill. Activations run
      // in kiln's epilogue unless the caller checks for NaN (fusedPostOpPrefix).
      std::vector<int> index;
      appendPostOps(ops, post.first(withPost ? exact : 0), /*sumForFirstAdd=*/false, p.dst, index);
      index.resize(post.size(), -1);
      dnnl::primitive_attr attr = makeAttr(ops);
      if (p.alpha != 1.f) attr.set_output_scales(0, {p.alpha});
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(p.a, b, p.bias, p.dst), attr, cpuEngine());
      const std::string_view impl = pd.impl_info_str();
      // oneDNN's reference matmul is far slower than the BLAS path: let that run it.
      if (impl.starts_with("ref")) return std::nullopt;
      // oneDNN's gemm-based matmul (gemm:jit, which runs every matmul on AVX2 in oneDNN 2.6)
      // splits the sum over K between threads for narrow products (on a 2-core Zen 3: every
      // N = 64 of M 2..200 and K 64..4096 measured, none of N >= 128), so that its bits would
      // depend on the threads a call is granted: the BLAS path, one thread per block, runs
      // those. Wider ones stay: the BLAS path was 1.1-1.7x slower on bert_layer, vit_small and
      // transformer_encoder.
      if (impl.starts_with("gemm") && p.dst.dims().back() < kGemmJitMinColumns) return std::nullopt;
      plan->binaryIndex = std::move(index);
      return pd;
    } catch (const dnnl::error&) {
      return std::nullopt;
    }
  };
  auto create = [&]() -> std::optional<dnnl::matmul::primitive_desc> {
    std::optional<dnnl::matmul::primitive_desc> pd;
    if (exact > 0) pd = tryCreate(true);
    plan->fusedPostOps = pd ? exact : 0;
    if (!pd) pd = tryCreate(false);
    return pd;
  };
  std::optional<dnnl::matmul::primitive_desc> pd = create();
  if (!pd) return unimplemented("oneDNN matmul cannot run this problem");
  if (packB && pd->weights_desc() == denseRowMajor(p.b)) {
    // The primitive takes B as plain [K, N] rows (gemm:jit): give it rows kPaddedColumns longer.
    b = memory::desc(p.b.dims(), p.b.data_type(), {p.b.dims()[1] + kPaddedColumns, 1});
    const auto unpadded = std::pair(plan->fusedPostOps, plan->binaryIndex);
    if (auto padded = create())
      pd = std::move(padded);
    else
      std::tie(plan->fusedPostOps, plan->binaryIndex) = unpadded;
  }
  plan->prim = dnnl::matmul(*pd);
  plan->scratchMd = pd->scratchpad_desc();
  plan->weightsMd = pd->weights_desc();
  if (packB && plan->weightsMd != p.b) {
    plan->weightsIn = makeReorder(p.b, plan->weightsMd);
    plan->weightsKey = "matmul-weights:" + describeMd(p.b) + ">" + describeMd(plan->weightsMd);
  }
  return std::shared_ptr<const MatMulPlan>(std::move(plan));
}

// Runs the problem on oneDNN; kUnimplemented when oneDNN cannot (the caller uses the BLAS path).
// B is the call's input 1. Where it is a parameter (the call has a LibraryCache) and one
// matrix, the primitive takes it prepacked: oneDNN's brgemm matmul otherwise copies B into its
// blocked layout in every call (bert's [128,768] x [768,3072]: 1.48 -> 1.23 ms, 2 threads).
Status runDnnl(const Call& call, const DnnlProblem& p, const void* a, const void* b,
               const void* bias, const void* c) {
  const bool packB = call.options.cache != nullptr && p.b.data.ndims == 2;
  CacheKey key("matmul");
  for (const memory::desc* md : {&p.a, &p.b, &p.bias, &p.c, &p.dst}) addMd(key, *md);
  const bool activations = call.options.fuseActivations;
  key.add(static_cast<double>(p.alpha)).add(call.post).add(int64_t{packB});
  key.add(int64_t{activations});
  key.add(int64_t{maxThreads()});
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<const MatMulPlan> plan,
                        matmulPlans().getOrCreate(
                            key.str(), [&] { return makePlan(p, call.post, packB, activations); }));
  std::shared_ptr<const AlignedBuffer> packed;  // Keeps a cache entry alive during the call.
  if (plan->weightsIn) {
    const Tensor& w = call.in[1];
    packed = call.options.cache->impl().getOrCreate(
        plan->weightsKey, w, plan->weightsMd.get_size(),
        [&](std::byte* to) { runReorder(*plan->weightsIn, w.rawData(), to); });
    b = packed->data();
  }
  if (call.options.prepare) {  // The scratch the runs will use, mapped now.
    (void)scratchpad(plan->scratchMd);
    return Status::ok();
  }
  float* y = call.out.data<float>();
  CallArgs args(plan.get());
  args.set(DNNL_ARG_SRC, p.a, a)
      .set(DNNL_ARG_WEIGHTS, plan->weightsMd, b)
      .set(DNNL_ARG_DST, p.dst, y);
  if (bias) args.set(DNNL_ARG_BIAS, p.bias, bias);
  if (c) args.set(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, p.c, c);
  for (size_t i = 0; i < plan->binaryIndex.size(); ++i) {
    if (plan->binaryIndex[i] < 0) continue;
    const Tensor& addend = call.extra[static_cast<size_t>(call.post[i].input)];
    args.set(DNNL_ARG_ATTR_MULTIPLE_POST_OP(plan->binaryIndex[i]) | DNNL_ARG_SRC_1, p.dst,
             addend.rawData());
  }
  if (std::byte* pad = scratchpad(plan->scratchMd))
    args.set(DNNL_ARG_SCRATCHPAD, plan->scratchMd, pad);
  plan->prim.execute(threadStream(), args.map());
  if (plan->fusedPostOps < call.post.size()) {
    const auto post = resolvePostOps(call.post, call.extra);
    const int64_t cols = call.out.rank() == 0 ? 1 : call.out.shape().back();
    applyEpilogue(y, cols == 0 ? 0 : call.out.numElements() / cols, cols, cols, Addend{},
                  std::span(post).subspan(plan->fusedPostOps));
  }
  return Status::ok();
}

// ---- Batch broadcasting.

// For every index of the broadcast batch shape, the offset (in whole matrices) of the operand
// batch whose own batch shape is `own` (right-aligned; size-1 dims broadcast).
std::vector<int64_t> batchOffsets(const ir::Shape& own, const ir::Shape& batch) {
  const size_t rank = batch.size(), lead = rank - own.size();
  std::vector<int64_t> stride(rank, 0);
  int64_t s = 1;
  for (size_t d = rank; d-- > lead;) {
    const int64_t dim = own[d - lead];
    stride[d] = dim == 1 ? 0 : s;
    s *= dim;
  }
  const int64_t total = ir::numElements(batch);
  std::vector<int64_t> out(static_cast<size_t>(total));
  std::vector<int64_t> idx(rank, 0);
  int64_t cur = 0;
  for (int64_t i = 0; i < total; ++i) {
    out[static_cast<size_t>(i)] = cur;
    for (size_t d = rank; d-- > 0;) {  // Odometer step.
      cur += stride[d];
      if (++idx[d] < batch[d]) break;
      cur -= stride[d] * batch[d];
      idx[d] = 0;
    }
  }
  return out;
}

}  // namespace

Status runMatMul(const Call& call) {
  // Promote 1-D operands ([K] -> [1,K] for A, [K] -> [K,1] for B); the output keeps the
  // [batch..., M, N] memory order either way.
  ir::Shape as = call.in[0].shape(), bs = call.in[1].shape();
  if (as.size() == 1) as.insert(as.begin(), 1);
  if (bs.size() == 1) bs.push_back(1);
  const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
  const ir::Shape aBatch(as.begin(), as.end() - 2), bBatch(bs.begin(), bs.end() - 2);
  KILN_ASSIGN_OR_RETURN(const ir::Shape batch, ir::broadcastShapes(aBatch, bBatch));
  const int64_t batchCount = ir::numElements(batch);
  const float* a = call.in[0].data<float>();
  const float* b = call.in[1].data<float>();
  float* y = call.out.data<float>();
  const auto post = resolvePostOps(call.post, call.extra);
  if (k == 0) {  // Sums over nothing. BLAS rejects lda = 0.
    if (call.options.prepare) return Status::ok();
    std::fill(y, y + call.out.numElements(), 0.f);
    applyEpilogue(y, batchCount * m, n, n, Addend{}, post);
    return Status::ok();
  }

  const size_t rank = batch.size() + 2;
  // B shared by every batch of A: one GEMM of batch*M rows (on either backend).
  const bool foldBatch = ir::numElements(bBatch) == 1 && ir::numElements(aBatch) == batchCount;
  if (useDnnl(call.options, foldBatch ? batchCount * m : m, batchCount * m * n * k) &&
      rank <= DNNL_MAX_NDIMS) {
    auto padded = [&](const ir::Shape& own, int64_t r, int64_t c) {
      memory::dims d(batch.size() - own.size(), 1);
      d.insert(d.end(), own.begin(), own.end());
      d.push_back(r);
      d.push_back(c);
      return plainMd(d);
    };
    memory::dims dst(batch.begin(), batch.end());
    dst.push_back(m);
    dst.push_back(n);
    // B shared by the batch: one [batch*M, K] x [K, N] product, as on the BLAS path. oneDNN runs
    // the batched form as one small product per batch: ViT's [197, 1, 384] x [384, 1152] input
    // projection (M = 1 per batch, as PyTorch's exporter writes nn.MultiheadAttention) took 1.9
    // ms, 4x its FLOPs' worth.
    const DnnlProblem p =
        foldBatch ? DnnlProblem{plainMd({batchCount * m, k}),
                                plainMd({k, n}),
                                {},
                                {},
                                plainMd({batchCount * m, n})}
                  : DnnlProblem{padded(aBatch, m, k), padded(bBatch, k, n), {}, {}, plainMd(dst)};
    Status s = runDnnl(call, p, a, b, nullptr, nullptr);
    if (s.code() != ErrorCode::kUnimplemented) return s;
  }

  if (call.options.prepare) {  // The BLAS path keeps no state; oneDNN's sgemm kernels exist.
    warmUpSgemm();
    return Status::ok();
  }
  if (foldBatch) {
    sgemm(false, false, batchCount * m, n, k, 1.f, a, k, b, n, 0.f, y, n);
  } else {
    const auto aOff = batchOffsets(aBatch, batch), bOff = batchOffsets(bBatch, batch);
    for (int64_t i = 0; i < batchCount; ++i)
      sgemm(false, false, m, n, k, 1.f, a + aOff[i] * m * k, k, b + bOff[i] * k * n, n, 0.f,
            y + i * m * n, n);
  }
  applyEpilogue(y, batchCount * m, n, n, Addend{}, post);
  return Status::ok();
}

Status runGemm(const Call& call) {
  const bool transA = call.attrs.getInt("transA") != 0, transB = call.attrs.getInt("transB") != 0;
  const float alpha = static_cast<float>(call.attrs.getFloat("alpha"));
  const float beta = static_cast<float>(call.attrs.getFloat("beta"));
  const int64_t m = call.out.shape()[0], n = call.out.shape()[1];
  const int64_t k = transA ? call.in[0].shape()[0] : call.in[0].shape()[1];
  const float* a = call.in[0].data<float>();
  const float* b = call.in[1].data<float>();
  float* y = call.out.data<float>();
  const Tensor* c = call.in.size() == 3 ? &call.in[2] : nullptr;
  // C right-aligned against [M, N]: rows and columns of size 1 broadcast.
  const ir::Shape cs = c ? c->shape() : ir::Shape{};
  const int64_t cRows = cs.size() == 2 ? cs[0] : 1, cCols = cs.empty() ? 1 : cs.back();

  // oneDNN has no scale for a binary post-op's operand, so it takes C only when beta is 1.
  if (useDnnl(call.options, m, m * n * k) && k > 0 && (!c || beta == 1.f)) {
    auto operand = [](int64_t rows, int64_t cols, bool trans) {
      return memory::desc({rows, cols}, memory::data_type::f32,
                          trans ? memory::dims{1, rows} : memory::dims{cols, 1});
    };
    const DnnlProblem p{operand(m, k, transA),
                        operand(k, n, transB),
                        {},
                        c ? plainMd({cRows, cCols}) : memory::desc(),
                        plainMd({m, n}),
                        alpha};
    Status s = runDnnl(call, p, a, b, nullptr, c ? c->rawData() : nullptr);
    if (s.code() != ErrorCode::kUnimplemented) return s;
  }

  if (call.options.prepare) {  // The BLAS path keeps no state; oneDNN's sgemm kernels exist.
    warmUpSgemm();
    return Status::ok();
  }
  if (k == 0)
    std::fill(y, y + m * n, 0.f);
  else
    sgemm(transA, transB, m, n, k, alpha, a, transA ? m : k, b, transB ? k : n, 0.f, y, n);
  // y = alpha*AB + beta*C as the reference computes it: even beta = 0 adds 0*C (NaN for inf).
  Addend addend;
  if (c) addend = {c->data<float>(), cRows == 1 ? 0 : cCols, cCols == 1 ? 0 : 1, beta};
  applyEpilogue(y, m, n, n, addend, resolvePostOps(call.post, call.extra));
  return Status::ok();
}

Status runLinear(const Call& call) {
  const int64_t inF = call.in[1].shape()[1], outF = call.in[1].shape()[0];
  const int64_t rows = outF == 0 ? 0 : call.out.numElements() / outF;
  const float* x = call.in[0].data<float>();
  const float* w = call.in[1].data<float>();
  const float* bias = call.in.size() == 3 ? call.in[2].data<float>() : nullptr;
  float* y = call.out.data<float>();

  if (useDnnl(call.options, rows, rows * outF * inF) && inF > 0) {
    const DnnlProblem p{
        plainMd({rows, inF}),
        memory::desc({inF, outF}, memory::data_type::f32, memory::dims{1, inF}),  // W^T
        bias ? plainMd({1, outF}) : memory::desc(),
        {},
        plainMd({rows, outF})};
    Status s = runDnnl(call, p, x, w, bias, nullptr);
    if (s.code() != ErrorCode::kUnimplemented) return s;
  }

  if (call.options.prepare) {  // The BLAS path keeps no state; oneDNN's sgemm kernels exist.
    warmUpSgemm();
    return Status::ok();
  }
  if (inF == 0)
    std::fill(y, y + rows * outF, 0.f);
  else
    sgemm(false, true, rows, outF, inF, 1.f, x, inF, w, inF, 0.f, y, outF);
  applyEpilogue(y, rows, outF, outF, Addend{bias, 0, 1, 1.f},
                resolvePostOps(call.post, call.extra));
  return Status::ok();
}

}  // namespace kiln::runtime::lib
