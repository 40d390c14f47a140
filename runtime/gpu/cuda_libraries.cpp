#include "runtime/gpu/cuda_libraries.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

#if KILN_HAVE_CUDA_HEADERS
#include <cublasLt.h>
#include <cudnn.h>
#endif

namespace kiln::runtime::gpu {

#if KILN_HAVE_CUDA_HEADERS

namespace {

// dlopen by soname, then in the toolkit's library directory (not always on the loader's path).
void* openLibrary(const char* soname, std::string& tried) {
  if (void* h = ::dlopen(soname, RTLD_NOW | RTLD_LOCAL)) return h;
  tried += std::string(tried.empty() ? "" : "; ") + ::dlerror();
#ifdef KILN_CUDA_LIBRARY_DIR
  const std::string path = std::string(KILN_CUDA_LIBRARY_DIR) + "/" + soname;
  if (void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  tried += std::string("; ") + ::dlerror();
#endif
  return nullptr;
}

#define KILN_LT_FNS(X)                    \
  X(cublasLtCreate)                       \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescDestroy)            \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatrixLayoutDestroy)          \
  X(cublasLtMatrixLayoutSetAttribute)     \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatmulAlgoGetHeuristic)       \
  X(cublasLtMatmul)

#define KILN_DNN_FNS(X)                             \
  X(cudnnCreate)                                    \
  X(cudnnGetErrorString)                            \
  X(cudnnSetStream)                                 \
  X(cudnnCreateTensorDescriptor)                    \
  X(cudnnDestroyTensorDescriptor)                   \
  X(cudnnSetTensor4dDescriptor)                     \
  X(cudnnCreateFilterDescriptor)                    \
  X(cudnnDestroyFilterDescriptor)                   \
  X(cudnnSetFilter4dDescriptor)                     \
  X(cudnnCreateConvolutionDescriptor)               \
  X(cudnnDestroyConvolutionDescriptor)              \
  X(cudnnSetConvolution2dDescriptor)                \
  X(cudnnSetConvolutionGroupCount)                  \
  X(cudnnSetConvolutionMathType)                    \
  X(cudnnGetConvolution2dForwardOutputDim)          \
  X(cudnnGetConvolutionForwardAlgorithm_v7)         \
  X(cudnnGetConvolutionForwardWorkspaceSize)        \
  X(cudnnConvolutionForward)                        \
  X(cudnnAddTensor)                                 \
  X(cudnnGetConvolutionBackwardDataAlgorithm_v7)    \
  X(cudnnGetConvolutionBackwardDataWorkspaceSize)   \
  X(cudnnConvolutionBackwardData)                   \
  X(cudnnGetConvolutionBackwardFilterAlgorithm_v7)  \
  X(cudnnGetConvolutionBackwardFilterWorkspaceSize) \
  X(cudnnConvolutionBackwardFilter)                 \
  X(cudnnCreatePoolingDescriptor)                   \
  X(cudnnDestroyPoolingDescriptor)                  \
  X(cudnnSetPooling2dDescriptor)                    \
  X(cudnnPoolingForward)

constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLASLt's (PyTorch uses 32 MiB on Hopper).

class Libraries final : public CudaLibraries {
 public:
#define KILN_FN_MEMBER(name) decltype(&::name) name = nullptr;
  KILN_LT_FNS(KILN_FN_MEMBER)
  KILN_DNN_FNS(KILN_FN_MEMBER)
#undef KILN_FN_MEMBER
  cublasLtHandle_t lt = nullptr;
  cudnnHandle_t dnn = nullptr;
  WorkspaceFn workspace;
  std::mutex dnnMu;  // One cuDNN handle: cudnnSetStream then the call, under the lock.

  Status run(const LibraryCall& call, std::span<const DevicePtr> ops, void* stream) override {
    if (const auto* c = std::get_if<ConvDescriptor>(&call.desc)) return conv(*c, ops, stream);
    if (const auto* p = std::get_if<PoolDescriptor>(&call.desc)) return pool(*p, ops, stream);
    return gemm(std::get<GemmDescriptor>(call.desc), ops, stream);
  }

 private:
  // A status saying the library does not take this call is kUnimplemented: the backend then
  // runs the op on the host. Anything else is an error.
  static Status lt_(cublasStatus_t s, const char* what) {
    if (s == CUBLAS_STATUS_SUCCESS) return Status::ok();
    const std::string m = std::string("cuBLASLt: ") + what + " failed (cublasStatus " +
                          std::to_string(static_cast<int>(s)) + ")";
    return s == CUBLAS_STATUS_NOT_SUPPORTED ? unimplemented(m) : internalError(m);
  }
  Status dnn_(cudnnStatus_t s, const char* what) const {
    if (s == CUDNN_STATUS_SUCCESS) return Status::ok();
    const std::string m =
        std::string("cuDNN: ") + what + " failed (" + cudnnGetErrorString(s) + ")";
    // cuDNN 9's codes come in families: 2xxx bad parameter, 3xxx not supported.
    const int family = static_cast<int>(s) / 1000;
    return family == 2 || family == 3 ? unimplemented(m) : internalError(m);
  }

  // The largest power of two up to 256 dividing an operand's address and its batch stride:
  // cuBLASLt assumes 256-byte alignment unless told otherwise, and arena buffers are 64-aligned.
  static uint32_t alignment(DevicePtr p, int64_t strideElements) {
    uint64_t a = 256;
    while (a > 4 && (p % a != 0 || (static_cast<uint64_t>(strideElements) * 4) % a != 0)) a /= 2;
    return static_cast<uint32_t>(a);
  }

  // Row-major D = op(A) op(B) (+ C) is column-major D^T = op(B)^T op(A)^T: B's buffer is
  // cuBLASLt's first operand and A's the second; D^T's leading dimension is N.
  Status gemm(const GemmDescriptor& g, std::span<const DevicePtr> ops, void* stream) {
    if (g.c == GemmDescriptor::C::kRow && g.beta != 1)
      return unimplemented("cuBLASLt: a bias row scaled by beta " + std::to_string(g.beta));
    if (g.m == 0 || g.n == 0) return Status::ok();  // Nothing to write.
    if (g.k == 0) return unimplemented("cuBLASLt: an empty inner dimension");
    const DevicePtr A = ops[0], B = ops[1];
    const DevicePtr C = g.c != GemmDescriptor::C::kNone ? ops[2] : 0;
    const DevicePtr D = ops.back();
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    struct Cleanup {
      Libraries& l;
      cublasLtMatmulDesc_t& op;
      cublasLtMatrixLayout_t &a, &b, &c;
      cublasLtMatmulPreference_t& p;
      ~Cleanup() {
        if (p) l.cublasLtMatmulPreferenceDestroy(p);
        for (auto* x : {a, b, c})
          if (x) l.cublasLtMatrixLayoutDestroy(x);
        if (op) l.cublasLtMatmulDescDestroy(op);
      }
    } cleanup{*this, op, la, lb, lc, pref};
    KILN_TRY(
        lt_(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate"));
    const cublasOperation_t first = g.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t second = g.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    KILN_TRY(
        lt_(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &first, sizeof first),
            "TRANSA"));
    KILN_TRY(
        lt_(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &second, sizeof second),
            "TRANSB"));
    if (g.c == GemmDescriptor::C::kRow) {  // A bias over D^T's rows: N values.
      const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
      const void* bias = reinterpret_cast<const void*>(C);
      KILN_TRY(
          lt_(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
              "EPILOGUE"));
      KILN_TRY(lt_(
          cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias),
          "BIAS_POINTER"));
      const int64_t zero = 0;  // One bias for every batch.
      KILN_TRY(lt_(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &zero,
                                                  sizeof zero),
                   "BIAS_BATCH_STRIDE"));
    }
    // Column-major views of the row-major buffers.
    const uint64_t bRows = g.transB ? g.k : g.n, bCols = g.transB ? g.n : g.k;
    const uint64_t aRows = g.transA ? g.m : g.k, aCols = g.transA ? g.k : g.m;
    KILN_TRY(lt_(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, bRows, bCols, g.ldb), "layout B"));
    KILN_TRY(lt_(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, aRows, aCols, g.lda), "layout A"));
    KILN_TRY(lt_(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, g.n, g.m, g.n), "layout D"));
    if (g.batch > 1) {
      const int32_t count = static_cast<int32_t>(g.batch);
      const int64_t sd = g.m * g.n;
      for (auto [layout, stride] :
           {std::pair{lb, g.strideB}, std::pair{la, g.strideA}, std::pair{lc, sd}}) {
        KILN_TRY(lt_(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                      &count, sizeof count),
                     "BATCH_COUNT"));
        KILN_TRY(
            lt_(cublasLtMatrixLayoutSetAttribute(
                    layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride),
                "STRIDED_BATCH_OFFSET"));
      }
    }
    KILN_ASSIGN_OR_RETURN(DevicePtr ws, workspace(stream, kWorkspaceBytes));
    KILN_TRY(lt_(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate"));
    const size_t wsBytes = kWorkspaceBytes;
    KILN_TRY(lt_(cublasLtMatmulPreferenceSetAttribute(
                     pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes, sizeof wsBytes),
                 "MAX_WORKSPACE_BYTES"));
    const int64_t strideD = g.batch > 1 ? g.m * g.n : 0;
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(B, g.strideB)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(A, g.strideA)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
         alignment(g.c == GemmDescriptor::C::kMatrix ? C : D, strideD)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(D, strideD)}};
    for (const auto& [attr, bytes] : aligns)
      KILN_TRY(lt_(cublasLtMatmulPreferenceSetAttribute(pref, attr, &bytes, sizeof bytes),
                   "MIN_ALIGNMENT"));
    // C (a matrix shared by the batch, or D itself when there is none) has D's layout.
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    KILN_TRY(lt_(cublasLtMatmulAlgoGetHeuristic(lt, op, lb, la, lc, lc, pref, 1, &result, &found),
                 "AlgoGetHeuristic"));
    if (found == 0) return unimplemented("cuBLASLt: no algorithm for this product");
    const float alpha = static_cast<float>(g.alpha);
    const float beta = g.c == GemmDescriptor::C::kMatrix ? static_cast<float>(g.beta) : 0.f;
    const void* cPtr = reinterpret_cast<const void*>(g.c == GemmDescriptor::C::kMatrix ? C : D);
    if (g.c == GemmDescriptor::C::kMatrix && g.batch > 1)
      return unimplemented("cuBLASLt: a C matrix shared by a batch");
    return lt_(
        cublasLtMatmul(lt, op, &alpha, reinterpret_cast<const void*>(B), lb,
                       reinterpret_cast<const void*>(A), la, &beta, cPtr, lc,
                       reinterpret_cast<void*>(D), lc, &result.algo, reinterpret_cast<void*>(ws),
                       wsBytes, static_cast<cudaStream_t>(stream)),
        "Matmul");
  }

  // NaN propagates through max pooling (kiln's rule); cuDNN's 2-D pooling has symmetric pads,
  // no dilation, and computes its own (floor) output size, which must be kiln's.
  Status pool(const PoolDescriptor& p, std::span<const DevicePtr> ops, void* stream) {
    if (p.padTop != p.padBottom || p.padLeft != p.padRight || p.dilationH != 1 || p.dilationW != 1)
      return unimplemented("cuDNN: pooling with asymmetric padding or dilation");
    if ((p.h + 2 * p.padTop - p.windowH) / p.strideH + 1 != p.p ||
        (p.w + 2 * p.padLeft - p.windowW) / p.strideW + 1 != p.q)
      return unimplemented("cuDNN: pooling with ceil rounding");
    std::lock_guard lock(dnnMu);
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnPoolingDescriptor_t pd = nullptr;
    struct Cleanup {
      Libraries& l;
      cudnnTensorDescriptor_t &x, &y;
      cudnnPoolingDescriptor_t& pd;
      ~Cleanup() {
        for (auto* t : {x, y})
          if (t) l.cudnnDestroyTensorDescriptor(t);
        if (pd) l.cudnnDestroyPoolingDescriptor(pd);
      }
    } cleanup{*this, x, y, pd};
    auto i = [](int64_t v) { return static_cast<int>(v); };
    KILN_TRY(dnn_(cudnnSetStream(dnn, static_cast<cudaStream_t>(stream)), "SetStream"));
    KILN_TRY(dnn_(cudnnCreateTensorDescriptor(&x), "CreateTensorDescriptor"));
    KILN_TRY(dnn_(cudnnCreateTensorDescriptor(&y), "CreateTensorDescriptor"));
    KILN_TRY(dnn_(cudnnCreatePoolingDescriptor(&pd), "CreatePoolingDescriptor"));
    KILN_TRY(dnn_(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, i(p.n), i(p.c),
                                             i(p.h), i(p.w)),
                  "SetTensor4dDescriptor x"));
    KILN_TRY(dnn_(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, i(p.n), i(p.c),
                                             i(p.p), i(p.q)),
                  "SetTensor4dDescriptor y"));
    const cudnnPoolingMode_t mode = p.max            ? CUDNN_POOLING_MAX_DETERMINISTIC
                                    : p.countPadding ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                                     : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING;
    KILN_TRY(
        dnn_(cudnnSetPooling2dDescriptor(pd, mode, CUDNN_PROPAGATE_NAN, i(p.windowH), i(p.windowW),
                                         i(p.padTop), i(p.padLeft), i(p.strideH), i(p.strideW)),
             "SetPooling2dDescriptor"));
    const float one = 1.f, zero = 0.f;
    return dnn_(cudnnPoolingForward(dnn, pd, &one, x, reinterpret_cast<const void*>(ops[0]), &zero,
                                    y, reinterpret_cast<void*>(ops[1])),
                "PoolingForward");
  }

  // The first deterministic algorithm of cuDNN's heuristic that fits the workspace (gradients
  // then come out the same at every step), else the first that fits.
  template <class Perf, class Algo>
  static Algo pickAlgorithm(const Perf* perf, int n, Algo fallback) {
    for (bool deterministic : {true, false})
      for (int k = 0; k < n; ++k)
        if (perf[k].status == CUDNN_STATUS_SUCCESS && perf[k].memory <= kWorkspaceBytes &&
            (!deterministic || perf[k].determinism == CUDNN_DETERMINISTIC))
          return perf[k].algo;
    return fallback;
  }

  // dx = conv^T(dy, w): operands dy, w, x (its shape only), dx.
  Status backwardData(cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                      cudnnTensorDescriptor_t y, cudnnConvolutionDescriptor_t cd,
                      std::span<const DevicePtr> ops, void* stream) {
    cudnnConvolutionBwdDataAlgoPerf_t perf[8];
    int n = 0;
    KILN_TRY(dnn_(cudnnGetConvolutionBackwardDataAlgorithm_v7(dnn, w, y, cd, x, 8, &n, perf),
                  "GetConvolutionBackwardDataAlgorithm_v7"));
    const auto algo = pickAlgorithm(perf, n, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1);
    size_t wsBytes = 0;
    KILN_TRY(dnn_(cudnnGetConvolutionBackwardDataWorkspaceSize(dnn, w, y, cd, x, algo, &wsBytes),
                  "GetConvolutionBackwardDataWorkspaceSize"));
    KILN_ASSIGN_OR_RETURN(DevicePtr ws, workspace(stream, std::max(wsBytes, kWorkspaceBytes)));
    const float one = 1.f, zero = 0.f;
    return dnn_(cudnnConvolutionBackwardData(dnn, &one, w, reinterpret_cast<const void*>(ops[1]), y,
                                             reinterpret_cast<const void*>(ops[0]), cd, algo,
                                             reinterpret_cast<void*>(ws), wsBytes, &zero, x,
                                             reinterpret_cast<void*>(ops[3])),
                "ConvolutionBackwardData");
  }

  // dw = x (*) dy: operands dy, x, w (its shape only), dw.
  Status backwardFilter(cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                        cudnnTensorDescriptor_t y, cudnnConvolutionDescriptor_t cd,
                        std::span<const DevicePtr> ops, void* stream) {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[8];
    int n = 0;
    KILN_TRY(dnn_(cudnnGetConvolutionBackwardFilterAlgorithm_v7(dnn, x, y, cd, w, 8, &n, perf),
                  "GetConvolutionBackwardFilterAlgorithm_v7"));
    const auto algo = pickAlgorithm(perf, n, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);
    size_t wsBytes = 0;
    KILN_TRY(dnn_(cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn, x, y, cd, w, algo, &wsBytes),
                  "GetConvolutionBackwardFilterWorkspaceSize"));
    KILN_ASSIGN_OR_RETURN(DevicePtr ws, workspace(stream, std::max(wsBytes, kWorkspaceBytes)));
    const float one = 1.f, zero = 0.f;
    return dnn_(cudnnConvolutionBackwardFilter(dnn, &one, x, reinterpret_cast<const void*>(ops[1]),
                                               y, reinterpret_cast<const void*>(ops[0]), cd, algo,
                                               reinterpret_cast<void*>(ws), wsBytes, &zero, w,
                                               reinterpret_cast<void*>(ops[3])),
                "ConvolutionBackwardFilter");
  }

  Status conv(const ConvDescriptor& c, std::span<const DevicePtr> ops, void* stream) {
    if (c.padTop != c.padBottom || c.padLeft != c.padRight)
      return unimplemented("cuDNN: asymmetric padding");
    if (c.n == 0 || c.k == 0 || c.c == 0) return unimplemented("cuDNN: an empty convolution");
    std::lock_guard lock(dnnMu);
    cudnnTensorDescriptor_t x = nullptr, y = nullptr, b = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t cd = nullptr;
    struct Cleanup {
      Libraries& l;
      cudnnTensorDescriptor_t &x, &y, &b;
      cudnnFilterDescriptor_t& w;
      cudnnConvolutionDescriptor_t& cd;
      ~Cleanup() {
        for (auto* t : {x, y, b})
          if (t) l.cudnnDestroyTensorDescriptor(t);
        if (w) l.cudnnDestroyFilterDescriptor(w);
        if (cd) l.cudnnDestroyConvolutionDescriptor(cd);
      }
    } cleanup{*this, x, y, b, w, cd};
    auto i = [](int64_t v) { return static_cast<int>(v); };
    KILN_TRY(dnn_(cudnnSetStream(dnn, static_cast<cudaStream_t>(stream)), "SetStream"));
    KILN_TRY(dnn_(cudnnCreateTensorDescriptor(&x), "CreateTensorDescriptor"));
    KILN_TRY(dnn_(cudnnCreateTensorDescriptor(&y), "CreateTensorDescriptor"));
    KILN_TRY(dnn_(cudnnCreateFilterDescriptor(&w), "CreateFilterDescriptor"));
    KILN_TRY(dnn_(cudnnCreateConvolutionDescriptor(&cd), "CreateConvolutionDescriptor"));
    KILN_TRY(dnn_(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, i(c.n), i(c.c),
                                             i(c.h), i(c.w)),
                  "SetTensor4dDescriptor x"));
    KILN_TRY(dnn_(cudnnSetFilter4dDescriptor(w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, i(c.k),
                                             i(c.c / c.groups), i(c.r), i(c.s)),
                  "SetFilter4dDescriptor"));
    KILN_TRY(dnn_(cudnnSetConvolution2dDescriptor(cd, i(c.padTop), i(c.padLeft), i(c.strideH),
                                                  i(c.strideW), i(c.dilationH), i(c.dilationW),
                                                  CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                  "SetConvolution2dDescriptor"));
    KILN_TRY(dnn_(cudnnSetConvolutionGroupCount(cd, i(c.groups)), "SetConvolutionGroupCount"));
    KILN_TRY(dnn_(cudnnSetConvolutionMathType(cd, CUDNN_FMA_MATH), "SetConvolutionMathType"));
    int on = 0, oc = 0, oh = 0, ow = 0;
    KILN_TRY(dnn_(cudnnGetConvolution2dForwardOutputDim(cd, x, w, &on, &oc, &oh, &ow),
                  "GetConvolution2dForwardOutputDim"));
    if (on != c.n || oc != c.k || oh != c.p || ow != c.q)
      return internalError("cuDNN computes a " + std::to_string(oh) + "x" + std::to_string(ow) +
                           " output where kiln's shape inference says " + std::to_string(c.p) +
                           "x" + std::to_string(c.q));
    KILN_TRY(
        dnn_(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, on, oc, oh, ow),
             "SetTensor4dDescriptor y"));
    if (c.pass == ConvDescriptor::Pass::kBackwardData)
      return backwardData(x, w, y, cd, ops, stream);
    if (c.pass == ConvDescriptor::Pass::kBackwardFilter)
      return backwardFilter(x, w, y, cd, ops, stream);
    cudnnConvolutionFwdAlgoPerf_t perf[8];
    int returned = 0;
    KILN_TRY(dnn_(cudnnGetConvolutionForwardAlgorithm_v7(dnn, x, w, cd, y, 8, &returned, perf),
                  "GetConvolutionForwardAlgorithm_v7"));
    cudnnConvolutionFwdAlgo_t algo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    for (int k = 0; k < returned; ++k)
      if (perf[k].status == CUDNN_STATUS_SUCCESS && perf[k].memory <= kWorkspaceBytes) {
        algo = perf[k].algo;
        break;
      }
    size_t wsBytes = 0;
    KILN_TRY(dnn_(cudnnGetConvolutionForwardWorkspaceSize(dnn, x, w, cd, y, algo, &wsBytes),
                  "GetConvolutionForwardWorkspaceSize"));
    KILN_ASSIGN_OR_RETURN(DevicePtr ws, workspace(stream, std::max(wsBytes, kWorkspaceBytes)));
    const float one = 1.f, zero = 0.f;
    const DevicePtr Y = ops.back();
    KILN_TRY(dnn_(cudnnConvolutionForward(dnn, &one, x, reinterpret_cast<const void*>(ops[0]), w,
                                          reinterpret_cast<const void*>(ops[1]), cd, algo,
                                          reinterpret_cast<void*>(ws), wsBytes, &zero, y,
                                          reinterpret_cast<void*>(Y)),
                  "ConvolutionForward"));
    if (!c.bias) return Status::ok();
    KILN_TRY(dnn_(cudnnCreateTensorDescriptor(&b), "CreateTensorDescriptor"));
    KILN_TRY(
        dnn_(cudnnSetTensor4dDescriptor(b, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, i(c.k), 1, 1),
             "SetTensor4dDescriptor bias"));
    return dnn_(cudnnAddTensor(dnn, &one, b, reinterpret_cast<const void*>(ops[2]), &one, y,
                               reinterpret_cast<void*>(Y)),
                "AddTensor (bias)");
  }
};

}  // namespace

Expected<std::unique_ptr<CudaLibraries>> openCudaLibraries(WorkspaceFn workspace) {
  std::string tried;
  void* lt = openLibrary("libcublasLt.so.13", tried);
  void* dnn = openLibrary("libcudnn.so.9", tried);
  if (!lt || !dnn) return notFound("cuBLASLt/cuDNN not found: " + tried);
  auto l = std::make_unique<Libraries>();
#define KILN_FN_LOAD(name, lib)                                       \
  l->name = reinterpret_cast<decltype(l->name)>(::dlsym(lib, #name)); \
  if (!l->name) return notFound(std::string("the CUDA libraries lack ") + #name);
#define KILN_LT_LOAD(name) KILN_FN_LOAD(name, lt)
#define KILN_DNN_LOAD(name) KILN_FN_LOAD(name, dnn)
  KILN_LT_FNS(KILN_LT_LOAD)
  KILN_DNN_FNS(KILN_DNN_LOAD)
#undef KILN_DNN_LOAD
#undef KILN_LT_LOAD
#undef KILN_FN_LOAD
  if (cublasStatus_t s = l->cublasLtCreate(&l->lt); s != CUBLAS_STATUS_SUCCESS)
    return notFound("cuBLASLt cannot start (cublasStatus " + std::to_string(static_cast<int>(s)) +
                    ")");
  if (cudnnStatus_t s = l->cudnnCreate(&l->dnn); s != CUDNN_STATUS_SUCCESS)
    return notFound(std::string("cuDNN cannot start (") + l->cudnnGetErrorString(s) + ")");
  l->workspace = std::move(workspace);
  return std::unique_ptr<CudaLibraries>(std::move(l));
}

#else

Expected<std::unique_ptr<CudaLibraries>> openCudaLibraries(WorkspaceFn) {
  return notFound("kiln was built without the CUDA toolkit's headers");
}

#endif

}  // namespace kiln::runtime::gpu
