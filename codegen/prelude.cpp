#include "codegen/prelude.h"

namespace kiln::codegen {

// Formulas match the reference kernels (runtime/reference/*.cpp) operation for operation, so
// that compiled results stay within rounding of eager ones.
std::string_view kernelPrelude() {
  return R"KILN(// kiln kernel prelude (shared by the C++ and CUDA dialects).
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define KILN_FN static __device__ __forceinline__
#define KILN_CUDA 1
KILN_FN float kiln_m_exp(float x) { return expf(x); }
KILN_FN double kiln_m_exp(double x) { return exp(x); }
KILN_FN float kiln_m_log(float x) { return logf(x); }
KILN_FN double kiln_m_log(double x) { return log(x); }
KILN_FN float kiln_m_sqrt(float x) { return sqrtf(x); }
KILN_FN double kiln_m_sqrt(double x) { return sqrt(x); }
KILN_FN float kiln_m_tanh(float x) { return tanhf(x); }
KILN_FN double kiln_m_tanh(double x) { return tanh(x); }
KILN_FN float kiln_m_erf(float x) { return erff(x); }
KILN_FN double kiln_m_erf(double x) { return erf(x); }
KILN_FN float kiln_m_pow(float x, float y) { return powf(x, y); }
KILN_FN double kiln_m_pow(double x, double y) { return pow(x, y); }
KILN_FN float kiln_m_fabs(float x) { return fabsf(x); }
KILN_FN double kiln_m_fabs(double x) { return fabs(x); }
KILN_FN float kiln_inf_f32() { return __int_as_float(0x7f800000); }
KILN_FN double kiln_inf_f64() { return __longlong_as_double(0x7ff0000000000000LL); }
KILN_FN float kiln_nan_f32() { return __int_as_float(0x7fc00000); }
KILN_FN double kiln_nan_f64() { return __longlong_as_double(0x7ff8000000000000LL); }
#else
#define KILN_FN static inline __attribute__((always_inline))
KILN_FN float kiln_m_exp(float x) { return __builtin_expf(x); }
KILN_FN double kiln_m_exp(double x) { return __builtin_exp(x); }
KILN_FN float kiln_m_log(float x) { return __builtin_logf(x); }
KILN_FN double kiln_m_log(double x) { return __builtin_log(x); }
KILN_FN float kiln_m_sqrt(float x) { return __builtin_sqrtf(x); }
KILN_FN double kiln_m_sqrt(double x) { return __builtin_sqrt(x); }
KILN_FN float kiln_m_tanh(float x) { return __builtin_tanhf(x); }
KILN_FN double kiln_m_tanh(double x) { return __builtin_tanh(x); }
KILN_FN float kiln_m_erf(float x) { return __builtin_erff(x); }
KILN_FN double kiln_m_erf(double x) { return __builtin_erf(x); }
KILN_FN float kiln_m_pow(float x, float y) { return __builtin_powf(x, y); }
KILN_FN double kiln_m_pow(double x, double y) { return __builtin_pow(x, y); }
KILN_FN float kiln_m_fabs(float x) { return __builtin_fabsf(x); }
KILN_FN double kiln_m_fabs(double x) { return __builtin_fabs(x); }
KILN_FN float kiln_inf_f32() { return __builtin_inff(); }
KILN_FN double kiln_inf_f64() { return __builtin_inf(); }
KILN_FN float kiln_nan_f32() { return __builtin_nanf(""); }
KILN_FN double kiln_nan_f64() { return __builtin_nan(""); }
#endif

template <class T> KILN_FN T kiln_neg(T x) { return -x; }
template <class T> KILN_FN T kiln_abs(T x) { return kiln_m_fabs(x); }
// `x < 0 ? 0 : x` lets NaN through, as PyTorch's relu does.
template <class T> KILN_FN T kiln_relu(T x) { return x < T(0) ? T(0) : x; }
template <class T> KILN_FN T kiln_leaky_relu(T x, T a) { return x >= T(0) ? x : a * x; }
template <class T> KILN_FN T kiln_sigmoid(T x) { return T(1) / (T(1) + kiln_m_exp(-x)); }
template <class T> KILN_FN T kiln_silu(T x) { return x * kiln_sigmoid(x); }
template <class T> KILN_FN T kiln_tanh(T x) { return kiln_m_tanh(x); }
template <class T> KILN_FN T kiln_exp(T x) { return kiln_m_exp(x); }
template <class T> KILN_FN T kiln_log(T x) { return kiln_m_log(x); }
template <class T> KILN_FN T kiln_sqrt(T x) { return kiln_m_sqrt(x); }
template <class T> KILN_FN T kiln_rsqrt(T x) { return T(1) / kiln_m_sqrt(x); }
// x * 0.5 * (1 + erf(x / sqrt(2)))
template <class T> KILN_FN T kiln_gelu(T x) {
  return x * T(0.5) * (T(1) + kiln_m_erf(x / T(1.4142135623730950488016887242096981)));
}
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
template <class T> KILN_FN T kiln_gelu_tanh(T x) {
  const T k = T(1.4142135623730950488016887242096981) * T(0.56418958354775628694807945156077259);
  return T(0.5) * x * (T(1) + kiln_m_tanh(k * (x + T(0.044715) * x * x * x)));
}
// NaN passes through; NaN bounds never clamp.
template <class T> KILN_FN T kiln_clip(T x, T lo, T hi) { return x < lo ? lo : (hi < x ? hi : x); }
template <class T> KILN_FN T kiln_add(T a, T b) { return a + b; }
template <class T> KILN_FN T kiln_sub(T a, T b) { return a - b; }
template <class T> KILN_FN T kiln_mul(T a, T b) { return a * b; }
template <class T> KILN_FN T kiln_div(T a, T b) { return a / b; }
template <class T> KILN_FN T kiln_pow(T a, T b) { return kiln_m_pow(a, b); }
// maximum and minimum propagate NaN, as torch.maximum does.
template <class T> KILN_FN T kiln_maximum(T a, T b) { return a != a ? a : (b != b ? b : (a < b ? b : a)); }
template <class T> KILN_FN T kiln_minimum(T a, T b) { return a != a ? a : (b != b ? b : (b < a ? b : a)); }
// (x - mean) / sqrt(var + eps) * scale + bias
template <class T> KILN_FN T kiln_batch_norm(T x, T scale, T bias, T mean, T var, T eps) {
  return (x - mean) / kiln_m_sqrt(var + eps) * scale + bias;
}

#ifdef KILN_CUDA
struct kiln_sum_op {
  template <class T> __device__ T operator()(T a, T b) const { return a + b; }
};
struct kiln_max_op {
  template <class T> __device__ T operator()(T a, T b) const { return kiln_maximum(a, b); }
};
// Reduces v over the block (blockDim.x a multiple of 32, at most 1024) and returns the
// result to every thread. `smem` holds 32 values.
template <class T, class Op> KILN_FN T kiln_block_reduce(T v, T init, Op op, T* smem) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < (int)((blockDim.x + 31) >> 5) ? smem[lane] : init;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    if (lane == 0) smem[0] = v;
  }
  __syncthreads();
  return smem[0];
}
#endif
)KILN";
}

}  // namespace kiln::codegen
