#include "runtime/gpu/cuda_libraries.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <unordered_map>

#if KILN_HAVE_CUDA_HEADERS
#include <cublasLt.h>
#include <cudnn.h>

#include "runtime/reference/helpers.h"
#endif

namespace kiln::runtime::gpu {

void* openCudaLibrary(const char* soname, std::string& tried) {
  if (void* h = ::dlopen(soname, RTLD_NOW | RTLD_LOCAL)) return h;
  tried += std::string(tried.empty() ? "" : "; ") + ::dlerror();
#ifdef KILN_CUDA_LIBRARY_DIR
  const std::string path = std::string(KILN_CUDA_LIBRARY_DIR) + "/" + soname;
  if (void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
  tried += std::string("; ") + ::dlerror();
#endif
  return nullptr;
}

#if KILN_HAVE_CUDA_HEADERS

namespace {

// The libraries' names of kiln's dtypes (describesLibraryOp admits f32, f16 and bf16).
cudaDataType_t ltType(ir::DType t) {
  return t == ir::DType::kBF16 ? CUDA_R_16BF : t == ir::DType::kF16 ? CUDA_R_16F : CUDA_R_32F;
}
cudnnDataType_t dnnType(ir::DType t) {
  return t == ir::DType::kBF16  ? CUDNN_DATA_BFLOAT16
         : t == ir::DType::kF16 ? CUDNN_DATA_HALF
                                : CUDNN_DATA_FLOAT;
}

#define KILN_LT_FNS(X)                    \
  X(cublasLtCreate)                       \
  X(cublasLtDestroy)                      \
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
  X(cudnnCreateActivationDescriptor)                \
  X(cudnnSetActivationDescriptor)                   \
  X(cudnnDestroyActivationDescriptor)               \
  X(cudnnActivationForward)                         \
  X(cudnnConvolutionBiasActivationForward)          \
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
  // A convolution's algorithm and workspace size, resolved at its first call and kept, under
  // dnnMu, by ConvKey: cuDNN 9's cudnnGet*Algorithm_v7 heuristics take about a millisecond a
  // query, which every call paid before (resnet18 batch 1 on an H100: 41 ms a run without CUDA
  // graph replay, 1.3 ms with it).
  struct ConvPlan {
    int algo = 0;  // The pass's cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t.
    size_t workspaceBytes = 0;
  };
  std::unordered_map<std::string, ConvPlan> convPlans;

  // Whether the fused ReLUs (cudnnConvolutionBiasActivationForward, CUBLASLT_EPILOGUE_RELU*) are
  // used, per product dtype (f32, f16, bf16: dtypeIndex) and, for cuDNN, layout (NCHW, NHWC:
  // other kernels): until checkFusedRelu finds one that turns NaN into a number.
  bool fusedConvRelu[3][2] = {{true, true}, {true, true}, {true, true}};
  bool fusedGemmRelu[3] = {true, true, true};
  // Whether the separate epilogue calls (cudnnAddTensor for the bias and the residual,
  // cudnnActivationForward) ran right at start-up for a dtype and layout: where they did not, a
  // call that needs them is refused before it writes anything (the op then runs on the host),
  // since a refusal after the product has written its output could not fall back.
  bool separateConvEpilogue[3][2] = {{true, true}, {true, true}, {true, true}};
  bool separateGemmRelu[3] = {true, true, true};
  // Whether cuBLASLt's GELU epilogue computes kiln's tanh GELU and keeps NaN, per dtype: where it
  // does not, a product with it is refused before it writes (no separate GELU call exists).
  bool fusedGemmGelu[3] = {true, true, true};
  static constexpr ir::DType kProductDTypes[3] = {ir::DType::kF32, ir::DType::kF16,
                                                  ir::DType::kBF16};
  static int dtypeIndex(ir::DType t) {
    return t == ir::DType::kF16 ? 1 : t == ir::DType::kBF16 ? 2 : 0;
  }
  bool probing_ = false;  // checkFusedRelu is running: no fallback from a refused fused call.

  bool takesEpilogue(const LibraryEpilogue& e) const override {
    if (!e.geluTanh) return true;  // ReLU and residuals: fused, else separate calls.
    return fusedGemmGelu[0] && fusedGemmGelu[1] && fusedGemmGelu[2];
  }

  Status run(const LibraryCall& call, std::span<const DevicePtr> ops, void* stream) override {
    if (const auto* c = std::get_if<ConvDescriptor>(&call.desc)) return conv(call, *c, ops, stream);
    if (const auto* p = std::get_if<PoolDescriptor>(&call.desc)) return pool(*p, ops, stream);
    return gemm(call, std::get<GemmDescriptor>(call.desc), ops, stream);
  }

  // Each epilogue path on small but real shapes, per product dtype (f32, f16, bf16) and, for
  // cuDNN, layout: a 1x1 convolution of 8 channels over 2x3 pixels with identity filters and a
  // matrix product of 16x16 by an identity, so that y = x (+ bias[channel]) (+ z) goes through
  // the epilogue; x holds NaN at a few places, which the product spreads over its row (NaN * 0 is
  // NaN: every output channel of that pixel, every column of that matrix row; the other rows stay
  // finite), the bias differs per channel (a bias added along the wrong axis shows), the output
  // is prefilled with NaN (a residual-free call must not read it). The values are multiples of 1/4
  // below 8, exact in every dtype, so a ReLU must give the reference's values exactly; the GELU
  // must match kiln's tanh formula to the dtype's rounding. A path that gives anything else, or
  // that the library refuses here, is not used in this process (then the separate calls, the host,
  // or for the GELU an unfused kernel). The separate calls (cudnnAddTensor, cudnnActivationForward)
  // are checked on their own, so that a refused probe convolution does not condemn them.
  std::string checkFusedRelu(DeviceApi& dev) override {
    Expected<StreamHandle> s = dev.createStream();
    if (!s) return "fused epilogue check skipped: " + s.status().message();
    constexpr int64_t kC = 8, kH = 2, kW = 3, kConvElems = kC * kH * kW, kG = 16;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    auto xAt = [&](int64_t i) {
      return i % 37 == 3 ? nan : static_cast<float>((i * 7) % 13 - 6) * 0.25f;
    };
    auto zAt = [](int64_t i) { return static_cast<float>((i * 5) % 9 - 4) * 0.5f; };
    auto biasAt = [](int64_t k) { return static_cast<float>(k % 5 - 2) * 0.25f; };
    std::vector<DevicePtr> buffers;
    // Values in dtype t's bytes (all of them exact in f16 and bf16), and back.
    auto upload = [&](const std::vector<float>& v, ir::DType t) -> Expected<DevicePtr> {
      std::vector<std::byte> bytes(v.size() * ir::dtypeSize(t));
      if (t == ir::DType::kF32)
        std::memcpy(bytes.data(), v.data(), bytes.size());
      else
        runtime::ref::floatToHalfBits(t, v.data(), reinterpret_cast<uint16_t*>(bytes.data()),
                                      static_cast<int64_t>(v.size()));
      KILN_ASSIGN_OR_RETURN(DevicePtr p, dev.malloc(bytes.size()));
      buffers.push_back(p);
      KILN_TRY(dev.copyToDevice(p, bytes.data(), bytes.size(), *s));
      return p;
    };
    auto download = [&](DevicePtr p, size_t n, ir::DType t) -> Expected<std::vector<float>> {
      std::vector<std::byte> bytes(n * ir::dtypeSize(t));
      KILN_TRY(dev.copyToHost(bytes.data(), p, bytes.size(), *s));
      KILN_TRY(dev.synchronize(*s));
      std::vector<float> v(n);
      if (t == ir::DType::kF32)
        std::memcpy(v.data(), bytes.data(), bytes.size());
      else
        runtime::ref::halfBitsToFloat(t, reinterpret_cast<const uint16_t*>(bytes.data()), v.data(),
                                      static_cast<int64_t>(n));
      return v;
    };
    enum class Act { kNone, kRelu, kGelu };
    // Whether x holds a NaN among `count` values `stride` apart from `first`: a product's row.
    auto rowNaN = [&](int64_t first, int64_t stride, int64_t count) {
      for (int64_t k = 0; k < count; ++k)
        if (std::isnan(xAt(first + k * stride))) return true;
      return false;
    };
    auto expected = [&](int64_t i, int64_t channel, bool bias, bool residual, Act act,
                        bool productNaN) {
      double v = productNaN ? std::numeric_limits<double>::quiet_NaN()
                            : static_cast<double>(xAt(i)) + (bias ? biasAt(channel) : 0.f) +
                                  (residual ? zAt(i) : 0.f);
      if (act == Act::kRelu) v = v < 0 ? 0 : v;  // NaN stays NaN.
      if (act == Act::kGelu)
        v = 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
      return v;
    };
    auto matches = [](const std::vector<float>& got, const std::vector<double>& want, double tol) {
      for (size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(want[i]) != std::isnan(got[i])) return false;
        if (!std::isnan(want[i]) &&
            std::fabs(got[i] - want[i]) > tol * std::max(1.0, std::fabs(want[i])))
          return false;
      }
      return true;
    };
    // A library call of `call` on the probe's operands: x, identity w, [bias], [z], y.
    auto runCall = [&](const LibraryCall& call, int64_t n, int64_t channels, bool bias,
                       bool residual, ir::DType t) -> Expected<std::vector<float>> {
      std::vector<float> x(static_cast<size_t>(n)), w(static_cast<size_t>(channels * channels)),
          b(static_cast<size_t>(channels)), z(static_cast<size_t>(n)),
          y(static_cast<size_t>(n), nan);
      for (int64_t i = 0; i < n; ++i) x[i] = xAt(i), z[i] = zAt(i);
      for (int64_t k = 0; k < channels; ++k) w[k * channels + k] = 1.f, b[k] = biasAt(k);
      std::vector<DevicePtr> ops;
      KILN_ASSIGN_OR_RETURN(DevicePtr X, upload(x, t));
      KILN_ASSIGN_OR_RETURN(DevicePtr Wt, upload(w, t));
      ops = {X, Wt};
      if (bias) {
        KILN_ASSIGN_OR_RETURN(DevicePtr B, upload(b, t));
        ops.push_back(B);
      }
      if (residual) {
        KILN_ASSIGN_OR_RETURN(DevicePtr Z, upload(z, t));
        ops.push_back(Z);
      }
      KILN_ASSIGN_OR_RETURN(DevicePtr Y, upload(y, t));
      ops.push_back(Y);
      KILN_TRY(run(call, ops, reinterpret_cast<void*>(*s)));
      return download(Y, static_cast<size_t>(n), t);
    };
    // cudnnAddTensor (the bias row, then a residual) and cudnnActivationForward on x laid out as
    // the probe convolution's output, alone: the separate epilogue calls.
    auto runSeparate = [&](ir::DType t, bool nhwc) -> Expected<std::vector<float>> {
      std::vector<float> x(kConvElems), z(kConvElems), b(kC);
      for (int64_t i = 0; i < kConvElems; ++i) x[i] = xAt(i), z[i] = zAt(i);
      for (int64_t k = 0; k < kC; ++k) b[k] = biasAt(k);
      KILN_ASSIGN_OR_RETURN(DevicePtr Y, upload(x, t));
      KILN_ASSIGN_OR_RETURN(DevicePtr Z, upload(z, t));
      KILN_ASSIGN_OR_RETURN(DevicePtr B, upload(b, t));
      {
        std::lock_guard lock(dnnMu);
        cudnnTensorDescriptor_t yd = nullptr, bd = nullptr;
        struct Cleanup {
          Libraries& l;
          cudnnTensorDescriptor_t &y, &b;
          ~Cleanup() {
            if (y) l.cudnnDestroyTensorDescriptor(y);
            if (b) l.cudnnDestroyTensorDescriptor(b);
          }
        } cleanup{*this, yd, bd};
        const float one = 1.f;
        KILN_TRY(dnn_(cudnnSetStream(dnn, reinterpret_cast<cudaStream_t>(*s)), "SetStream"));
        KILN_TRY(dnn_(cudnnCreateTensorDescriptor(&yd), "CreateTensorDescriptor"));
        KILN_TRY(dnn_(cudnnCreateTensorDescriptor(&bd), "CreateTensorDescriptor"));
        KILN_TRY(dnn_(cudnnSetTensor4dDescriptor(yd, nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                                 dnnType(t), 1, kC, kH, kW),
                      "SetTensor4dDescriptor"));
        KILN_TRY(dnn_(cudnnSetTensor4dDescriptor(bd, CUDNN_TENSOR_NCHW, dnnType(t), 1, kC, 1, 1),
                      "SetTensor4dDescriptor bias"));
        KILN_TRY(dnn_(cudnnAddTensor(dnn, &one, bd, reinterpret_cast<const void*>(B), &one, yd,
                                     reinterpret_cast<void*>(Y)),
                      "AddTensor (bias)"));
        KILN_TRY(dnn_(cudnnAddTensor(dnn, &one, yd, reinterpret_cast<const void*>(Z), &one, yd,
                                     reinterpret_cast<void*>(Y)),
                      "AddTensor (residual)"));
        KILN_TRY(reluInPlace(Y, kConvElems, t));
      }
      return download(Y, static_cast<size_t>(kConvElems), t);
    };
    ConvDescriptor cd;
    cd.n = 1, cd.c = kC, cd.h = kH, cd.w = kW, cd.k = kC, cd.r = 1, cd.s = 1, cd.p = kH, cd.q = kW;
    cd.bias = true;     // cuDNN's fused call needs one.
    GemmDescriptor gd;  // A linear: x [16, 16] times I^T (plus a bias row).
    gd.m = gd.n = gd.k = kG, gd.transB = true, gd.lda = gd.ldb = kG;
    const double halfTol[3] = {0, 1.5 / 1024, 1.5 / 128};  // f32 exact; a half's rounding.
    std::string log;
    auto note = [&](const std::string& what, const Expected<std::vector<float>>& r) {
      log += std::string(log.empty() ? "" : "; ") + what +
             (r ? " gave other values" : " failed: " + r.status().message());
    };
    probing_ = true;  // A refused fused call is an error here, not a quiet fallback.
    for (ir::DType t : kProductDTypes) {
      const int di = dtypeIndex(t);
      const std::string dt(ir::dtypeName(t));
      for (int layout = 0; layout < 2; ++layout) {  // cuDNN's fused bias + residual + ReLU.
        cd.channelsLast = layout == 1;
        cd.dtype = t;
        bool ok = true;
        for (bool residual : {false, true}) {
          LibraryCall call;
          call.desc = cd;
          call.epilogue = {residual, true};
          auto r = runCall(call, kConvElems, kC, true, residual, t);
          std::vector<double> want(kConvElems);
          for (int64_t i = 0; i < kConvElems; ++i)
            want[i] =
                expected(i, layout ? i % kC : i / (kH * kW) % kC, true, residual, Act::kRelu,
                         layout ? rowNaN(i / kC * kC, 1, kC) : rowNaN(i % (kH * kW), kH * kW, kC));
          const bool good = r && matches(*r, want, halfTol[0]);
          if (!good)
            note(std::string("cuDNN ") + (layout ? "NHWC " : "NCHW ") + dt + " fused ReLU", r);
          ok = ok && good;
        }
        fusedConvRelu[di][layout] = ok;
        auto r = runSeparate(t, layout == 1);
        std::vector<double> want(kConvElems);
        for (int64_t i = 0; i < kConvElems; ++i)
          want[i] = expected(i, layout ? i % kC : i / (kH * kW) % kC, true, true, Act::kRelu,
                             std::isnan(xAt(i)));  // Elementwise: no product.
        separateConvEpilogue[di][layout] = r && matches(*r, want, halfTol[0]);
        if (!separateConvEpilogue[di][layout])
          note(std::string("cuDNN ") + (layout ? "NHWC " : "NCHW ") + dt +
                   " separate bias/residual/ReLU calls (such calls run on the host)",
               r);
      }
      gd.dtype = t;
      bool reluOk = true, geluOk = true;
      for (bool bias : {true, false})
        for (bool residual : {false, true})
          for (Act act : {Act::kRelu, Act::kGelu}) {
            gd.c = bias ? GemmDescriptor::C::kRow : GemmDescriptor::C::kNone;
            gd.beta = bias ? 1 : 0;
            LibraryCall call;
            call.desc = gd;
            call.epilogue.residual = residual;
            call.epilogue.relu = act == Act::kRelu;
            call.epilogue.geluTanh = act == Act::kGelu;
            auto r = runCall(call, kG * kG, kG, bias, residual, t);
            std::vector<double> want(kG * kG);
            for (int64_t i = 0; i < kG * kG; ++i)
              want[i] = expected(i, i % kG, bias, residual, act, rowNaN(i / kG * kG, 1, kG));
            // f32: ReLU exact, GELU to f32 rounding; halves: their rounding.
            const double tol = t == ir::DType::kF32 ? (act == Act::kGelu ? 1e-5 : 0) : halfTol[di];
            const bool good = r && matches(*r, want, tol);
            if (!good)
              note("cuBLASLt " + dt + (act == Act::kGelu ? " GELU" : " fused ReLU") +
                       (bias ? " with bias" : "") + (residual ? " with residual" : ""),
                   r);
            (act == Act::kGelu ? geluOk : reluOk) = (act == Act::kGelu ? geluOk : reluOk) && good;
          }
      fusedGemmRelu[di] = reluOk;
      fusedGemmGelu[di] = geluOk;
      separateGemmRelu[di] = separateConvEpilogue[di][0];  // The same cudnnActivationForward.
    }
    probing_ = false;
    for (DevicePtr p : buffers) (void)dev.free(p);
    {
      std::lock_guard lock(dnnMu);
      (void)cudnnSetStream(dnn, nullptr);  // Not the probe's stream, which goes away.
    }
    dev.destroyStream(*s);
    // "fused ReLU keeps NaN in: cuDNN NCHW f32 f16 bf16, cuDNN NHWC f32, cuBLASLt f32 bf16"
    const char* const paths[3] = {"cuDNN NCHW", "cuDNN NHWC", "cuBLASLt"};
    std::string kept, separate, gelu;
    for (int path = 0; path < 3; ++path) {
      std::string ok;
      for (ir::DType t : kProductDTypes)
        if (path < 2 ? fusedConvRelu[dtypeIndex(t)][path] : fusedGemmRelu[dtypeIndex(t)])
          ok += " " + std::string(ir::dtypeName(t));
      kept += std::string(path ? ", " : "") + paths[path] + (ok.empty() ? " none" : ok);
    }
    for (int layout = 0; layout < 2; ++layout) {
      std::string ok;
      for (ir::DType t : kProductDTypes)
        if (separateConvEpilogue[dtypeIndex(t)][layout]) ok += " " + std::string(ir::dtypeName(t));
      separate += std::string(layout ? ", " : "") + paths[layout] + (ok.empty() ? " none" : ok);
    }
    for (ir::DType t : kProductDTypes)
      if (fusedGemmGelu[dtypeIndex(t)]) gelu += " " + std::string(ir::dtypeName(t));
    return log + std::string(log.empty() ? "" : "; ") + "fused ReLU keeps NaN in: " + kept +
           "; separate bias/residual/ReLU calls in: " + separate +
           "; cuBLASLt's GELU is kiln's tanh GELU in:" + (gelu.empty() ? " none" : gelu);
  }

 private:
  // A status saying the library does not take this call is kUnimplemented: the backend then
  // runs the op on the host. Anything else is an error. Once a call has written the output (an
  // in-place residual may be gone), a later refusal cannot fall back: afterWrite makes it an
  // error.
  static Status afterWrite(Status s) {
    if (s.code() != ErrorCode::kUnimplemented) return s;
    return internalError(s.message() + " (after the output was written; no fallback possible)");
  }
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

  // The largest power of two up to 256 dividing an operand's address and its batch stride in
  // bytes, down to the element's size: cuBLASLt assumes 256-byte alignment unless told otherwise
  // (overstating it lets it pick vector loads that fault), and arena buffers are 64-aligned.
  static uint32_t alignment(DevicePtr p, int64_t strideElements, size_t elementBytes) {
    const uint64_t strideBytes = static_cast<uint64_t>(strideElements) * elementBytes;
    uint64_t a = 256;
    while (a > elementBytes && (p % a != 0 || strideBytes % a != 0)) a /= 2;
    return static_cast<uint32_t>(a);
  }

  // Row-major D = op(A) op(B) (+ C) is column-major D^T = op(B)^T op(A)^T: B's buffer is
  // cuBLASLt's first operand and A's the second; D^T's leading dimension is N.
  // The epilogue: a residual is C with beta 1 (cuBLASLt adds it before the bias, an exact
  // reordering of two IEEE additions only up to rounding), ReLU the RELU[_BIAS] epilogue or, where
  // that does not keep NaN, cuDNN's activation over D afterwards.
  Status gemm(const LibraryCall& call, const GemmDescriptor& g, std::span<const DevicePtr> ops,
              void* stream) {
    if (g.c == GemmDescriptor::C::kRow && g.beta != 1)
      return unimplemented("cuBLASLt: a bias row scaled by beta " + std::to_string(g.beta));
    if (g.m == 0 || g.n == 0) return Status::ok();  // Nothing to write.
    if (g.k == 0) return unimplemented("cuBLASLt: an empty inner dimension");
    const LibraryEpilogue& e = call.epilogue;
    if (e.residual && g.c == GemmDescriptor::C::kMatrix)
      return unimplemented("cuBLASLt: a residual added to a product with a C matrix");
    const DevicePtr A = ops[0], B = ops[1];
    const DevicePtr C = g.c != GemmDescriptor::C::kNone ? ops[2] : 0;
    const DevicePtr Z = e.residual ? ops[call.residualOperand()] : 0;
    const DevicePtr D = ops.back();
    // The fused ReLU where checkFusedRelu verified it for this dtype; else the separate one.
    const bool fusedRelu = e.relu && fusedGemmRelu[dtypeIndex(g.dtype)];
    if (e.relu && !fusedRelu && g.batch * g.m * g.n > std::numeric_limits<int>::max())
      return unimplemented("cuDNN: an activation over more than 2^31 elements");
    if (e.geluTanh && !fusedGemmGelu[dtypeIndex(g.dtype)])
      return unimplemented("cuBLASLt: a " + std::string(ir::dtypeName(g.dtype)) +
                           " product's GELU epilogue, which failed the start-up check on this GPU");
    if (e.relu && !fusedRelu && !separateGemmRelu[dtypeIndex(g.dtype)])
      return unimplemented("cuBLASLt: a " + std::string(ir::dtypeName(g.dtype)) +
                           " product's ReLU, which failed the start-up check on this GPU");
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
    KILN_TRY(lt_(cublasLtMatmulDescCreate(
                     &op, g.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F, CUDA_R_32F),
                 "MatmulDescCreate"));
    const cublasOperation_t first = g.transB ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t second = g.transA ? CUBLAS_OP_T : CUBLAS_OP_N;
    KILN_TRY(
        lt_(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &first, sizeof first),
            "TRANSA"));
    KILN_TRY(
        lt_(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &second, sizeof second),
            "TRANSB"));
    const bool bias = g.c == GemmDescriptor::C::kRow;
    const cublasLtEpilogue_t epi = bias ? (fusedRelu    ? CUBLASLT_EPILOGUE_RELU_BIAS
                                           : e.geluTanh ? CUBLASLT_EPILOGUE_GELU_BIAS
                                                        : CUBLASLT_EPILOGUE_BIAS)
                                        : (fusedRelu    ? CUBLASLT_EPILOGUE_RELU
                                           : e.geluTanh ? CUBLASLT_EPILOGUE_GELU
                                                        : CUBLASLT_EPILOGUE_DEFAULT);
    if (epi != CUBLASLT_EPILOGUE_DEFAULT)
      KILN_TRY(
          lt_(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi),
              "EPILOGUE"));
    if (bias) {  // A bias over D^T's rows: N values.
      const void* bias = reinterpret_cast<const void*>(C);
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
    // f16/bf16 operands and D with f32 accumulation and f32 alpha/beta (CUBLAS_COMPUTE_32F,
    // scale type CUDA_R_32F); the bias has D's type (cuBLASLt's default).
    const cudaDataType_t type = ltType(g.dtype);
    KILN_TRY(lt_(cublasLtMatrixLayoutCreate(&lb, type, bRows, bCols, g.ldb), "layout B"));
    KILN_TRY(lt_(cublasLtMatrixLayoutCreate(&la, type, aRows, aCols, g.lda), "layout A"));
    KILN_TRY(lt_(cublasLtMatrixLayoutCreate(&lc, type, g.n, g.m, g.n), "layout D"));
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
    const size_t elem = ir::dtypeSize(g.dtype);
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> aligns[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment(B, g.strideB, elem)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment(A, g.strideA, elem)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
         alignment(e.residual                          ? Z
                   : g.c == GemmDescriptor::C::kMatrix ? C
                                                       : D,
                   strideD, elem)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment(D, strideD, elem)}};
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
    const bool cMatrix = g.c == GemmDescriptor::C::kMatrix;
    const float beta = e.residual ? 1.f : cMatrix ? static_cast<float>(g.beta) : 0.f;
    // A residual has D's layout, batch stride included; the op's own C matrix is shared.
    const void* cPtr = reinterpret_cast<const void*>(e.residual ? Z : cMatrix ? C : D);
    if (cMatrix && g.batch > 1) return unimplemented("cuBLASLt: a C matrix shared by a batch");
    KILN_TRY(
        lt_(cublasLtMatmul(lt, op, &alpha, reinterpret_cast<const void*>(B), lb,
                           reinterpret_cast<const void*>(A), la, &beta, cPtr, lc,
                           reinterpret_cast<void*>(D), lc, &result.algo,
                           reinterpret_cast<void*>(ws), wsBytes, static_cast<cudaStream_t>(stream)),
            "Matmul"));
    if (!e.relu || fusedRelu) return Status::ok();
    std::lock_guard lock(dnnMu);
    KILN_TRY(afterWrite(dnn_(cudnnSetStream(dnn, static_cast<cudaStream_t>(stream)), "SetStream")));
    return afterWrite(reluInPlace(D, g.batch * g.m * g.n, g.dtype));
  }

  // y = relu(y) keeping NaN (CUDNN_PROPAGATE_NAN) over n values; under dnnMu, stream set.
  Status reluInPlace(DevicePtr y, int64_t n, ir::DType dtype) {
    if (n > std::numeric_limits<int>::max())
      return unimplemented("cuDNN: an activation over " + std::to_string(n) + " elements");
    cudnnTensorDescriptor_t t = nullptr;
    cudnnActivationDescriptor_t a = nullptr;
    struct Cleanup {
      Libraries& l;
      cudnnTensorDescriptor_t& t;
      cudnnActivationDescriptor_t& a;
      ~Cleanup() {
        if (t) l.cudnnDestroyTensorDescriptor(t);
        if (a) l.cudnnDestroyActivationDescriptor(a);
      }
    } cleanup{*this, t, a};
    KILN_TRY(dnn_(cudnnCreateTensorDescriptor(&t), "CreateTensorDescriptor"));
    KILN_TRY(dnn_(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, dnnType(dtype), 1, 1, 1,
                                             static_cast<int>(n)),
                  "SetTensor4dDescriptor"));
    KILN_TRY(makeRelu(a));
    const float one = 1.f, zero = 0.f;
    void* p = reinterpret_cast<void*>(y);
    return dnn_(cudnnActivationForward(dnn, a, &one, t, p, &zero, t, p), "ActivationForward");
  }

  Status makeRelu(cudnnActivationDescriptor_t& a) {
    KILN_TRY(dnn_(cudnnCreateActivationDescriptor(&a), "CreateActivationDescriptor"));
    return dnn_(cudnnSetActivationDescriptor(a, CUDNN_ACTIVATION_RELU, CUDNN_PROPAGATE_NAN, 0.0),
                "SetActivationDescriptor");
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
    const cudnnTensorFormat_t format = p.channelsLast ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    KILN_TRY(dnn_(
        cudnnSetTensor4dDescriptor(x, format, dnnType(p.dtype), i(p.n), i(p.c), i(p.h), i(p.w)),
        "SetTensor4dDescriptor x"));
    KILN_TRY(dnn_(
        cudnnSetTensor4dDescriptor(y, format, dnnType(p.dtype), i(p.n), i(p.c), i(p.p), i(p.q)),
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

  // The tensor, filter and convolution descriptors of `c` (destroyed with the struct).
  struct ConvDescs {
    Libraries& l;
    cudnnTensorDescriptor_t x = nullptr, y = nullptr, b = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t cd = nullptr;
    explicit ConvDescs(Libraries& lib) : l(lib) {}
    ConvDescs(const ConvDescs&) = delete;
    ~ConvDescs() {
      for (auto* t : {x, y, b})
        if (t) l.cudnnDestroyTensorDescriptor(t);
      if (w) l.cudnnDestroyFilterDescriptor(w);
      if (cd) l.cudnnDestroyConvolutionDescriptor(cd);
    }
  };

  // cuDNN's gradient algorithms kiln times and runs: the deterministic ones (a training step then
  // gives the same update every time; cuDNN's headers mark BWD_DATA_ALGO_0 and BWD_FILTER_ALGO_0/3
  // non-deterministic, and its heuristic reports each algorithm's determinism per shape) without
  // FFT or non-fused Winograd (their error).
  static constexpr std::pair<ConvAlgo, cudnnConvolutionBwdDataAlgo_t> kBwdDataAlgos[] = {
      {ConvAlgo::kCudnnBwdData1, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1},
      {ConvAlgo::kCudnnBwdDataWinograd, CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD}};
  static constexpr std::pair<ConvAlgo, cudnnConvolutionBwdFilterAlgo_t> kBwdFilterAlgos[] = {
      {ConvAlgo::kCudnnBwdFilter1, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1}};

  // The heuristic's deterministic algorithms in `table` that fit the workspace, in its order.
  template <class Perf, class Algo, size_t N>
  static std::vector<std::pair<ConvAlgo, Algo>> deterministic(
      const Perf* perf, int n, const std::pair<ConvAlgo, Algo> (&table)[N]) {
    std::vector<std::pair<ConvAlgo, Algo>> out;
    for (int k = 0; k < n; ++k) {
      if (perf[k].status != CUDNN_STATUS_SUCCESS || perf[k].memory > kWorkspaceBytes ||
          perf[k].determinism != CUDNN_DETERMINISTIC)
        continue;
      for (const auto& [kiln, cudnn] : table) {
        // A copy: clang 16 cannot capture a structured binding when OpenMP is on.
        const bool seen = std::any_of(out.begin(), out.end(),
                                      [c = cudnn](const auto& a) { return a.second == c; });
        if (cudnn == perf[k].algo && !seen) out.push_back({kiln, cudnn});
      }
    }
    return out;
  }

  // `chosen` (ConvDescriptor::algo, timed at compile time) where cuDNN offers it for these
  // descriptors, else the heuristic's first that kiln runs, else `fallback` (ALGO_1,
  // deterministic; cuDNN refuses it before writing anything where it cannot run the shape).
  template <class Perf, class Algo, size_t N>
  static Algo gradientAlgorithm(const Perf* perf, int n,
                                const std::pair<ConvAlgo, Algo> (&table)[N], ConvAlgo chosen,
                                Algo fallback) {
    const auto usable = deterministic(perf, n, table);
    for (const auto& [kiln, cudnn] : usable)
      if (kiln == chosen) return cudnn;
    return usable.empty() ? fallback : usable.front().second;
  }

  // dx = conv^T(dy, w): operands dy, w, x (its shape only), dx.
  Status backwardData(const ConvDescs& d, ConvPlan plan, std::span<const DevicePtr> ops,
                      void* stream) {
    KILN_ASSIGN_OR_RETURN(DevicePtr ws,
                          workspace(stream, std::max(plan.workspaceBytes, kWorkspaceBytes)));
    const float one = 1.f, zero = 0.f;
    return dnn_(cudnnConvolutionBackwardData(dnn, &one, d.w, reinterpret_cast<const void*>(ops[1]),
                                             d.y, reinterpret_cast<const void*>(ops[0]), d.cd,
                                             static_cast<cudnnConvolutionBwdDataAlgo_t>(plan.algo),
                                             reinterpret_cast<void*>(ws), plan.workspaceBytes,
                                             &zero, d.x, reinterpret_cast<void*>(ops[3])),
                "ConvolutionBackwardData");
  }

  // dw = x (*) dy: operands dy, x, w (its shape only), dw.
  Status backwardFilter(const ConvDescs& d, ConvPlan plan, std::span<const DevicePtr> ops,
                        void* stream) {
    KILN_ASSIGN_OR_RETURN(DevicePtr ws,
                          workspace(stream, std::max(plan.workspaceBytes, kWorkspaceBytes)));
    const float one = 1.f, zero = 0.f;
    return dnn_(
        cudnnConvolutionBackwardFilter(dnn, &one, d.x, reinterpret_cast<const void*>(ops[1]), d.y,
                                       reinterpret_cast<const void*>(ops[0]), d.cd,
                                       static_cast<cudnnConvolutionBwdFilterAlgo_t>(plan.algo),
                                       reinterpret_cast<void*>(ws), plan.workspaceBytes, &zero, d.w,
                                       reinterpret_cast<void*>(ops[3])),
        "ConvolutionBackwardFilter");
  }

  // Everything of `c` that the algorithm and workspace depend on (not the bias or epilogue).
  static std::string convKey(const ConvDescriptor& c) {
    const int64_t v[] = {c.n,
                         c.c,
                         c.h,
                         c.w,
                         c.k,
                         c.r,
                         c.s,
                         c.p,
                         c.q,
                         c.strideH,
                         c.strideW,
                         c.dilationH,
                         c.dilationW,
                         c.padTop,
                         c.padLeft,
                         c.padBottom,
                         c.padRight,
                         c.groups,
                         static_cast<int64_t>(c.pass),
                         static_cast<int64_t>(c.dtype),
                         c.tf32,
                         c.channelsLast,
                         static_cast<int64_t>(c.algo)};
    return std::string(reinterpret_cast<const char*>(v), sizeof v);
  }

  // The algorithm for `c`: the one chosen at compile time (ConvDescriptor::algo) where cuDNN
  // offers it for these descriptors, else the heuristic's first that kiln runs; and its
  // workspace size. Resolved once per ConvKey; under dnnMu.
  Expected<ConvPlan> convPlan(const ConvDescriptor& c, ConvDescs& d, const LibraryCall& call) {
    const std::string key = convKey(c);
    if (auto it = convPlans.find(key); it != convPlans.end()) return it->second;
    ConvPlan plan;
    int n = 0;
    if (c.pass == ConvDescriptor::Pass::kBackwardData) {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      KILN_TRY(dnn_(cudnnGetConvolutionBackwardDataAlgorithm_v7(
                        dnn, d.w, d.y, d.cd, d.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf),
                    "GetConvolutionBackwardDataAlgorithm_v7"));
      const auto algo =
          gradientAlgorithm(perf, n, kBwdDataAlgos, c.algo, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1);
      KILN_TRY(dnn_(cudnnGetConvolutionBackwardDataWorkspaceSize(dnn, d.w, d.y, d.cd, d.x, algo,
                                                                 &plan.workspaceBytes),
                    "GetConvolutionBackwardDataWorkspaceSize"));
      plan.algo = algo;
    } else if (c.pass == ConvDescriptor::Pass::kBackwardFilter) {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      KILN_TRY(
          dnn_(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                   dnn, d.x, d.y, d.cd, d.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf),
               "GetConvolutionBackwardFilterAlgorithm_v7"));
      const auto algo =
          gradientAlgorithm(perf, n, kBwdFilterAlgos, c.algo, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1);
      KILN_TRY(dnn_(cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn, d.x, d.y, d.cd, d.w, algo,
                                                                   &plan.workspaceBytes),
                    "GetConvolutionBackwardFilterWorkspaceSize"));
      plan.algo = algo;
    } else {
      const auto candidates = forwardAlgorithms(d);
      if (candidates.empty())
        return unimplemented("cuDNN: no forward algorithm for " + call.describe());
      cudnnConvolutionFwdAlgo_t algo = candidates.front().second;
      for (const auto& [kiln, cudnn] : candidates)
        if (kiln == c.algo) algo = cudnn;
      KILN_TRY(dnn_(cudnnGetConvolutionForwardWorkspaceSize(dnn, d.x, d.w, d.cd, d.y, algo,
                                                            &plan.workspaceBytes),
                    "GetConvolutionForwardWorkspaceSize"));
      plan.algo = algo;
    }
    convPlans.emplace(key, plan);
    return plan;
  }

  // Under dnnMu.
  Status describe(const ConvDescriptor& c, ConvDescs& d) {
    if (c.padTop != c.padBottom || c.padLeft != c.padRight)
      return unimplemented("cuDNN: asymmetric padding");
    if (c.n == 0 || c.k == 0 || c.c == 0) return unimplemented("cuDNN: an empty convolution");
    auto i = [](int64_t v) { return static_cast<int>(v); };
    KILN_TRY(dnn_(cudnnCreateTensorDescriptor(&d.x), "CreateTensorDescriptor"));
    KILN_TRY(dnn_(cudnnCreateTensorDescriptor(&d.y), "CreateTensorDescriptor"));
    KILN_TRY(dnn_(cudnnCreateFilterDescriptor(&d.w), "CreateFilterDescriptor"));
    KILN_TRY(dnn_(cudnnCreateConvolutionDescriptor(&d.cd), "CreateConvolutionDescriptor"));
    // f16/bf16: x, w and y in that type, f32 arithmetic (cuDNN's PSEUDO_HALF/BFLOAT16 configs).
    const cudnnDataType_t type = dnnType(c.dtype);
    // Channels-last: x and y NHWC, the filters KRSC (NHWC format), as PyTorch's cuDNN convolutions
    // in channels_last run them; the dims are given in NCHW order either way.
    const cudnnTensorFormat_t format = c.channelsLast ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    KILN_TRY(dnn_(cudnnSetTensor4dDescriptor(d.x, format, type, i(c.n), i(c.c), i(c.h), i(c.w)),
                  "SetTensor4dDescriptor x"));
    KILN_TRY(dnn_(
        cudnnSetFilter4dDescriptor(d.w, type, format, i(c.k), i(c.c / c.groups), i(c.r), i(c.s)),
        "SetFilter4dDescriptor"));
    KILN_TRY(dnn_(cudnnSetConvolution2dDescriptor(d.cd, i(c.padTop), i(c.padLeft), i(c.strideH),
                                                  i(c.strideW), i(c.dilationH), i(c.dilationW),
                                                  CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                  "SetConvolution2dDescriptor"));
    KILN_TRY(dnn_(cudnnSetConvolutionGroupCount(d.cd, i(c.groups)), "SetConvolutionGroupCount"));
    // fp32: FMA only (no TF32); tf32 and f16/bf16: tensor cores (which read fp32 operands as
    // TF32).
    const bool tensorCores = c.tf32 || c.dtype != ir::DType::kF32;
    KILN_TRY(
        dnn_(cudnnSetConvolutionMathType(d.cd, tensorCores ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH),
             "SetConvolutionMathType"));
    int on = 0, oc = 0, oh = 0, ow = 0;
    KILN_TRY(dnn_(cudnnGetConvolution2dForwardOutputDim(d.cd, d.x, d.w, &on, &oc, &oh, &ow),
                  "GetConvolution2dForwardOutputDim"));
    if (on != c.n || oc != c.k || oh != c.p || ow != c.q)
      return internalError("cuDNN computes a " + std::to_string(oh) + "x" + std::to_string(ow) +
                           " output where kiln's shape inference says " + std::to_string(c.p) +
                           "x" + std::to_string(c.q));
    return dnn_(cudnnSetTensor4dDescriptor(d.y, format, type, on, oc, oh, ow),
                "SetTensor4dDescriptor y");
  }

  // cuDNN's forward algorithms kiln runs: FFT and non-fused Winograd are left out (their error
  // exceeds the 1e-4 kiln allows an algorithm).
  static constexpr std::pair<ConvAlgo, cudnnConvolutionFwdAlgo_t> kForwardAlgos[] = {
      {ConvAlgo::kCudnnImplicitGemm, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM},
      {ConvAlgo::kCudnnImplicitPrecompGemm, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM},
      {ConvAlgo::kCudnnGemm, CUDNN_CONVOLUTION_FWD_ALGO_GEMM},
      {ConvAlgo::kCudnnDirect, CUDNN_CONVOLUTION_FWD_ALGO_DIRECT},
      {ConvAlgo::kCudnnWinograd, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD}};

  // The heuristic's algorithms for `d` that kiln runs and that fit the workspace, in its order.
  std::vector<std::pair<ConvAlgo, cudnnConvolutionFwdAlgo_t>> forwardAlgorithms(ConvDescs& d) {
    std::vector<std::pair<ConvAlgo, cudnnConvolutionFwdAlgo_t>> out;
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int returned = 0;
    if (cudnnGetConvolutionForwardAlgorithm_v7(dnn, d.x, d.w, d.cd, d.y,
                                               CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned,
                                               perf) != CUDNN_STATUS_SUCCESS)
      return out;
    for (int k = 0; k < returned; ++k) {
      if (perf[k].status != CUDNN_STATUS_SUCCESS || perf[k].memory > kWorkspaceBytes) continue;
      for (const auto& [kiln, cudnn] : kForwardAlgos) {
        const bool seen = std::any_of(out.begin(), out.end(),
                                      [c = cudnn](const auto& a) { return a.second == c; });
        if (cudnn == perf[k].algo && !seen) out.push_back({kiln, cudnn});  // Once per math type.
      }
    }
    return out;
  }

 public:
  std::vector<ConvAlgo> convAlgorithms(const ConvDescriptor& c) override {
    std::lock_guard lock(dnnMu);
    ConvDescs d(*this);
    if (!describe(c, d).isOk()) return {};
    std::vector<ConvAlgo> out;
    int n = 0;
    if (c.pass == ConvDescriptor::Pass::kBackwardData) {
      cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      if (cudnnGetConvolutionBackwardDataAlgorithm_v7(dnn, d.w, d.y, d.cd, d.x,
                                                      CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n,
                                                      perf) == CUDNN_STATUS_SUCCESS)
        for (const auto& a : deterministic(perf, n, kBwdDataAlgos)) out.push_back(a.first);
    } else if (c.pass == ConvDescriptor::Pass::kBackwardFilter) {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      if (cudnnGetConvolutionBackwardFilterAlgorithm_v7(dnn, d.x, d.y, d.cd, d.w,
                                                        CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n,
                                                        perf) == CUDNN_STATUS_SUCCESS)
        for (const auto& a : deterministic(perf, n, kBwdFilterAlgos)) out.push_back(a.first);
    } else {
      for (const auto& a : forwardAlgorithms(d)) out.push_back(a.first);
    }
    return out;
  }

 private:
  Status conv(const LibraryCall& call, const ConvDescriptor& c, std::span<const DevicePtr> ops,
              void* stream) {
    std::lock_guard lock(dnnMu);
    ConvDescs d(*this);
    KILN_TRY(describe(c, d));
    KILN_TRY(dnn_(cudnnSetStream(dnn, static_cast<cudaStream_t>(stream)), "SetStream"));
    auto i = [](int64_t v) { return static_cast<int>(v); };
    cudnnTensorDescriptor_t x = d.x, y = d.y, &b = d.b;
    cudnnFilterDescriptor_t w = d.w;
    cudnnConvolutionDescriptor_t cd = d.cd;
    KILN_ASSIGN_OR_RETURN(const ConvPlan plan, convPlan(c, d, call));
    if (c.pass == ConvDescriptor::Pass::kBackwardData) return backwardData(d, plan, ops, stream);
    if (c.pass == ConvDescriptor::Pass::kBackwardFilter)
      return backwardFilter(d, plan, ops, stream);
    const auto algo = static_cast<cudnnConvolutionFwdAlgo_t>(plan.algo);
    const size_t wsBytes = plan.workspaceBytes;
    KILN_ASSIGN_OR_RETURN(DevicePtr ws, workspace(stream, std::max(wsBytes, kWorkspaceBytes)));
    const float one = 1.f;
    const DevicePtr Y = ops.back();
    const LibraryEpilogue& e = call.epilogue;
    const DevicePtr Z = e.residual ? ops[call.residualOperand()] : 0;
    const bool residualInY = e.residual && Z == Y;  // In place: y holds the residual already.
    auto cp = [](DevicePtr p) { return reinterpret_cast<const void*>(p); };
    if (c.bias) {
      KILN_TRY(dnn_(cudnnCreateTensorDescriptor(&b), "CreateTensorDescriptor"));
      KILN_TRY(
          dnn_(cudnnSetTensor4dDescriptor(b, CUDNN_TENSOR_NCHW, dnnType(c.dtype), 1, i(c.k), 1, 1),
               "SetTensor4dDescriptor bias"));
    }
    if (e.relu && c.n * c.k * c.p * c.q > std::numeric_limits<int>::max())
      return unimplemented("cuDNN: an activation over more than 2^31 elements");
    // y = relu(conv(x) + z + bias) in one call where cuDNN's fused ReLU keeps NaN; where cuDNN
    // does not take this configuration, the separate calls below (nothing is written yet).
    if (e.relu && c.bias && fusedConvRelu[dtypeIndex(c.dtype)][c.channelsLast] && !residualInY) {
      cudnnActivationDescriptor_t act = nullptr;
      Status st = makeRelu(act);
      const float alpha2 = e.residual ? 1.f : 0.f;
      if (st.isOk())
        st = dnn_(cudnnConvolutionBiasActivationForward(
                      dnn, &one, x, cp(ops[0]), w, cp(ops[1]), cd, algo,
                      reinterpret_cast<void*>(ws), wsBytes, &alpha2, y, cp(e.residual ? Z : Y), b,
                      cp(ops[2]), act, y, reinterpret_cast<void*>(Y)),
                  "ConvolutionBiasActivationForward");
      if (act) cudnnDestroyActivationDescriptor(act);
      if (st.code() != ErrorCode::kUnimplemented || probing_) return st;
    }
    if ((c.bias || e.any()) && !separateConvEpilogue[dtypeIndex(c.dtype)][c.channelsLast])
      return unimplemented("cuDNN: a " + std::string(ir::dtypeName(c.dtype)) +
                           " convolution's bias, residual or ReLU as separate calls, which failed "
                           "the start-up check on this GPU");
    const float beta = residualInY ? 1.f : 0.f;
    KILN_TRY(dnn_(cudnnConvolutionForward(dnn, &one, x, cp(ops[0]), w, cp(ops[1]), cd, algo,
                                          reinterpret_cast<void*>(ws), wsBytes, &beta, y,
                                          reinterpret_cast<void*>(Y)),
                  "ConvolutionForward"));
    if (c.bias)
      KILN_TRY(afterWrite(
          dnn_(cudnnAddTensor(dnn, &one, b, cp(ops[2]), &one, y, reinterpret_cast<void*>(Y)),
               "AddTensor (bias)")));
    if (e.residual && !residualInY)
      KILN_TRY(
          afterWrite(dnn_(cudnnAddTensor(dnn, &one, y, cp(Z), &one, y, reinterpret_cast<void*>(Y)),
                          "AddTensor (residual)")));
    if (!e.relu) return Status::ok();
    return afterWrite(reluInPlace(Y, c.n * c.k * c.p * c.q, c.dtype));
  }
};

}  // namespace

Expected<std::unique_ptr<CudaLibraries>> openCudaLibraries(WorkspaceFn workspace) {
  std::string tried;
  void* lt = openCudaLibrary("libcublasLt.so.13", tried);
  void* dnn = openCudaLibrary("libcudnn.so.9", tried);
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
  if (cudnnStatus_t s = l->cudnnCreate(&l->dnn); s != CUDNN_STATUS_SUCCESS) {
    l->cublasLtDestroy(l->lt);  // Not kept: the device runs without libraries.
    return notFound(std::string("cuDNN cannot start (") + l->cudnnGetErrorString(s) + ")");
  }
  l->workspace = std::move(workspace);
  return std::unique_ptr<CudaLibraries>(std::move(l));
}

#else

Expected<std::unique_ptr<CudaLibraries>> openCudaLibraries(WorkspaceFn) {
  return notFound("kiln was built without the CUDA toolkit's headers");
}

#endif

}  // namespace kiln::runtime::gpu
