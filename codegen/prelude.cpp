#include "codegen/prelude.h"

#include <string>
#include <utility>

#include "ir/index_word.h"

namespace kiln::codegen {

// Formulas match the reference kernels (runtime/reference/*.cpp) operation for operation, so
// that compiled results stay within rounding of eager ones.
namespace {

constexpr std::string_view kPrelude =
    R"KILN(// kiln kernel prelude (shared by the C++ and CUDA dialects).
#if defined(__CUDACC_RTC__) || defined(__CUDACC__)
#define KILN_FN static __device__ __forceinline__
#define KILN_CUDA 1
// A kernel uses few of these functions: "declared but never referenced" is expected.
#pragma nv_diag_suppress 177
// A kernel's pointer argument (the emu device's prelude makes it a bound-checked pointer).
template <class T> using kiln_gptr = T*;
// A block's __shared__ array.
#define KILN_SHARED(T, name, n) __shared__ T name[n]
// Vector accesses of pointwise kernels (16 bytes; the kernel checks kiln_aligned16 first).
KILN_FN bool kiln_aligned16(const void* p) { return ((unsigned long long)p & 15ull) == 0; }
KILN_FN float4 kiln_ld4(const float* p, long long i) { return *(const float4*)(p + i); }
KILN_FN void kiln_st4(float* p, long long i, float4 v) { *(float4*)(p + i) = v; }
KILN_FN float kiln_m_exp(float x) { return expf(x); }
KILN_FN double kiln_m_exp(double x) { return exp(x); }
KILN_FN float kiln_m_exp_nonpos(float x) { return expf(x); }
KILN_FN double kiln_m_exp_nonpos(double x) { return exp(x); }
KILN_FN float kiln_m_log(float x) { return logf(x); }
KILN_FN double kiln_m_log(double x) { return log(x); }
KILN_FN float kiln_m_log1p(float x) { return log1pf(x); }
KILN_FN double kiln_m_log1p(double x) { return log1p(x); }
KILN_FN float kiln_m_sqrt(float x) { return sqrtf(x); }
KILN_FN double kiln_m_sqrt(double x) { return sqrt(x); }
KILN_FN float kiln_m_tanh(float x) { return tanhf(x); }
KILN_FN double kiln_m_tanh(double x) { return tanh(x); }
KILN_FN float kiln_m_erf(float x) { return erff(x); }
KILN_FN double kiln_m_erf(double x) { return erf(x); }
KILN_FN float kiln_m_erfc(float x) { return erfcf(x); }
KILN_FN double kiln_m_erfc(double x) { return erfc(x); }
KILN_FN float kiln_m_floor(float x) { return floorf(x); }
KILN_FN double kiln_m_floor(double x) { return floor(x); }
KILN_FN float kiln_m_ceil(float x) { return ceilf(x); }
KILN_FN double kiln_m_ceil(double x) { return ceil(x); }
KILN_FN float kiln_m_rint(float x) { return rintf(x); }
KILN_FN double kiln_m_rint(double x) { return rint(x); }
KILN_FN float kiln_m_sin(float x) { return sinf(x); }
KILN_FN double kiln_m_sin(double x) { return sin(x); }
KILN_FN float kiln_m_cos(float x) { return cosf(x); }
KILN_FN double kiln_m_cos(double x) { return cos(x); }
KILN_FN float kiln_m_tan(float x) { return tanf(x); }
KILN_FN double kiln_m_tan(double x) { return tan(x); }
KILN_FN float kiln_m_asin(float x) { return asinf(x); }
KILN_FN double kiln_m_asin(double x) { return asin(x); }
KILN_FN float kiln_m_acos(float x) { return acosf(x); }
KILN_FN double kiln_m_acos(double x) { return acos(x); }
KILN_FN float kiln_m_atan(float x) { return atanf(x); }
KILN_FN double kiln_m_atan(double x) { return atan(x); }
KILN_FN float kiln_m_sinh(float x) { return sinhf(x); }
KILN_FN double kiln_m_sinh(double x) { return sinh(x); }
KILN_FN float kiln_m_cosh(float x) { return coshf(x); }
KILN_FN double kiln_m_cosh(double x) { return cosh(x); }
KILN_FN float kiln_m_asinh(float x) { return asinhf(x); }
KILN_FN double kiln_m_asinh(double x) { return asinh(x); }
KILN_FN float kiln_m_acosh(float x) { return acoshf(x); }
KILN_FN double kiln_m_acosh(double x) { return acosh(x); }
KILN_FN float kiln_m_atanh(float x) { return atanhf(x); }
KILN_FN double kiln_m_atanh(double x) { return atanh(x); }
KILN_FN float kiln_m_expm1(float x) { return expm1f(x); }
KILN_FN double kiln_m_expm1(double x) { return expm1(x); }
KILN_FN float kiln_m_pow(float x, float y) { return powf(x, y); }
KILN_FN double kiln_m_pow(double x, double y) { return pow(x, y); }
KILN_FN float kiln_m_fabs(float x) { return fabsf(x); }
KILN_FN double kiln_m_fabs(double x) { return fabs(x); }
KILN_FN float kiln_m_fmod(float x, float y) { return fmodf(x, y); }
KILN_FN double kiln_m_fmod(double x, double y) { return fmod(x, y); }
KILN_FN float kiln_m_copysign(float x, float y) { return copysignf(x, y); }
KILN_FN double kiln_m_copysign(double x, double y) { return copysign(x, y); }
KILN_FN float kiln_inf_f32() { return __int_as_float(0x7f800000); }
KILN_FN double kiln_inf_f64() { return __longlong_as_double(0x7ff0000000000000LL); }
KILN_FN float kiln_nan_f32() { return __int_as_float(0x7fc00000); }
KILN_FN double kiln_nan_f64() { return __longlong_as_double(0x7ff8000000000000LL); }
KILN_FN unsigned kiln_f32_bits(float x) { return __float_as_uint(x); }
KILN_FN float kiln_bits_f32(unsigned b) { return __uint_as_float(b); }
#else
#define KILN_FN static inline __attribute__((always_inline))
// f32 exp, tanh and erf written so that loops over them vectorize (libm calls do not):
// Cody and Waite's range reduction and a minimax polynomial for exp (about 1 ulp, flushing
// results below the normal range to zero), tanh from exp(-2|x|) (a Taylor series near 0), erfc by Numerical
// Recipes' erfcc (relative error below 1.2e-7, plus about z^2 x 6e-8 from rounding -z^2) and erf
// from it (a Taylor series near 0): relative errors, so that GELU's negative tail and small
// arguments stay accurate, not only absolute ones.
// e^x = y * 2^k: k = rint(x / ln 2), and y = e^(x - k ln 2) by a polynomial. Adding 1.5 * 2^23
// rounds x / ln 2 to the nearest integer k and leaves k in the low bits of t = k + 1.5 * 2^23
// (|k| < 2^22), from which 2^k is two integer operations (no rounding or conversion
// instruction). With the polynomial below, against rint, a float-to-int conversion and Cephes'
// degree 7 (a harness, one thread, in cache): kiln_vexp_nonpos 0.268 -> 0.226 ns an element,
// SiLU 0.413 -> 0.337.
KILN_FN float kiln_vexp_t(float x) { return x * 1.44269504088896341f + 12582912.0f; }
// y = e^r for r = x - k ln 2 (Cody and Waite's two-constant ln 2, exact products in fp32 for
// |k| <= 128): the degree-6 minimax polynomial for e^r, |r| <= ln 2 / 2 (relative error 2e-9,
// far below fp32 rounding; Cephes' degree 7 costs two more operations for nothing).
KILN_FN float kiln_vexp_y(float x, float k) {
  float r = x - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.38436036e-3f;
  p = p * r + 8.37419555e-3f;
  p = p * r + 4.16680048e-2f;
  p = p * r + 1.66664308e-1f;
  p = p * r + 4.99999942e-1f;
  p = p * r + 1.0f;
  return p * r + 1.0f;
}
// 2^k from t = k + 1.5 * 2^23 for k in [-126, 127]: the exponent field of k + 127 (the
// shift drops the bits above k's).
KILN_FN float kiln_vexp_pow2(float t) {
  return __builtin_bit_cast(float, (__builtin_bit_cast(unsigned, t) << 23) + (127u << 23));
}
KILN_FN float kiln_vexp(float x) {
  // Clamped so that k stays in [-126, 128] (a NaN passes both and makes y NaN).
  const float xc = x < -87.3365f ? -87.3365f : (x > 88.7228394f ? 88.7228394f : x);
  const float t = kiln_vexp_t(xc), k = t - 12582912.0f;
  // k = 128 (x > 88.38) takes 2^127 and a doubling: y <= 1 there, so the product stays finite.
  const float tc = t > 12582912.0f + 127.0f ? 12582912.0f + 127.0f : t;
  const float out = kiln_vexp_y(xc, k) * kiln_vexp_pow2(tc) * (k > 127.0f ? 2.0f : 1.0f);
  // Results below the smallest normal float (x < -87.34) flush to zero: denormal arithmetic
  // costs ~100 cycles per operation, and softmax rows are full of such tails. The error is
  // below 1.2e-38 absolute.
  return x > 88.7228394f ? __builtin_inff() : (x < -87.3365f ? 0.0f : out);
}
// kiln_vexp where k <= 127 (x <= 88.03; NaN included), as softmax's x - max(x), sigmoid's
// -|x| and tanh's -2|x|: no doubling and no overflow select, and the same bits as kiln_vexp
// there (wrong above 88.38). Softmax's exponential stage 3.44 -> 2.89 ms a thread (2048 rows
// of 4096, in cache).
KILN_FN float kiln_vexp_nonpos(float x) {
  const float xc = x < -87.3365f ? -87.3365f : x;
  const float t = kiln_vexp_t(xc);
  const float out = kiln_vexp_y(xc, t - 12582912.0f) * kiln_vexp_pow2(t);
  return x < -87.3365f ? 0.0f : out;
}
KILN_FN float kiln_vtanh(float x) {
  const float ax = x < 0.0f ? -x : x;
  const float e = kiln_vexp_nonpos(-2.0f * ax);
  const float t = (1.0f - e) / (1.0f + e);
  // Near 0, 1 - e cancels (a relative error of eps / 2|x|): the odd Taylor series instead,
  // whose first omitted term is below 3e-11 relative for |x| < 1/8.
  const float x2 = x * x;
  const float small = x * (1.0f + x2 * (-1.0f / 3.0f + x2 * (2.0f / 15.0f + x2 * (-17.0f / 315.0f))));
  return x != x ? x : (ax < 0.125f ? small : (x < 0.0f ? -t : t));
}
// log(1 + x) without the cancellation of 1 + x for small x: log(u) * x / (u - 1) with u = 1 + x
// (the rounding of u cancels out; Goldberg, "What every computer scientist should know about
// floating-point arithmetic", theorem 4).
KILN_FN float kiln_vlog1p(float x) {
  const float u = 1.0f + x;
  const float d = u - 1.0f;
  return d == 0.0f || x == __builtin_inff() ? x : __builtin_logf(u) * (x / d);
}
// erfc(z) for z >= 0.
KILN_FN float kiln_verfc_nonneg(float z) {
  const float t = 1.0f / (1.0f + 0.5f * z);
  const float p =
      -1.26551223f +
      t * (1.00002368f +
           t * (0.37409196f +
                t * (0.09678418f +
                     t * (-0.18628806f +
                          t * (0.27886807f +
                               t * (-1.13520398f +
                                    t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
  return t * kiln_vexp_nonpos(-z * z + p);
}
KILN_FN float kiln_verfc(float x) {
  const float e = kiln_verfc_nonneg(x < 0.0f ? -x : x);
  return x != x ? x : (x < 0.0f ? 2.0f - e : e);
}
KILN_FN float kiln_verf(float x) {
  const float ax = x < 0.0f ? -x : x;
  const float big = 1.0f - kiln_verfc_nonneg(ax);
  // 2/sqrt(pi) (x - x^3/3 + x^5/10 - x^7/42 + x^9/216): below 1e-7 relative for |x| < 1/4.
  const float x2 = x * x;
  const float small =
      1.12837916709551257f * x *
      (1.0f - x2 * (1.0f / 3.0f - x2 * (1.0f / 10.0f - x2 * (1.0f / 42.0f - x2 / 216.0f))));
  return x != x ? x : (ax < 0.25f ? small : (x < 0.0f ? -big : big));
}
KILN_FN float kiln_m_exp(float x) { return kiln_vexp(x); }
KILN_FN double kiln_m_exp(double x) { return __builtin_exp(x); }
KILN_FN float kiln_m_exp_nonpos(float x) { return kiln_vexp_nonpos(x); }
KILN_FN double kiln_m_exp_nonpos(double x) { return __builtin_exp(x); }
KILN_FN float kiln_m_log(float x) { return __builtin_logf(x); }
KILN_FN double kiln_m_log(double x) { return __builtin_log(x); }
KILN_FN float kiln_m_log1p(float x) { return kiln_vlog1p(x); }
KILN_FN double kiln_m_log1p(double x) { return __builtin_log1p(x); }
KILN_FN float kiln_m_sqrt(float x) { return __builtin_sqrtf(x); }
KILN_FN double kiln_m_sqrt(double x) { return __builtin_sqrt(x); }
KILN_FN float kiln_m_tanh(float x) { return kiln_vtanh(x); }
KILN_FN double kiln_m_tanh(double x) { return __builtin_tanh(x); }
KILN_FN float kiln_m_erf(float x) { return kiln_verf(x); }
KILN_FN double kiln_m_erf(double x) { return __builtin_erf(x); }
KILN_FN float kiln_m_erfc(float x) { return kiln_verfc(x); }
KILN_FN double kiln_m_erfc(double x) { return __builtin_erfc(x); }
// Libm calls (not vectorized): the rarer math ops.
KILN_FN float kiln_m_floor(float x) { return __builtin_floorf(x); }
KILN_FN double kiln_m_floor(double x) { return __builtin_floor(x); }
KILN_FN float kiln_m_ceil(float x) { return __builtin_ceilf(x); }
KILN_FN double kiln_m_ceil(double x) { return __builtin_ceil(x); }
KILN_FN float kiln_m_rint(float x) { return __builtin_rintf(x); }
KILN_FN double kiln_m_rint(double x) { return __builtin_rint(x); }
KILN_FN float kiln_m_sin(float x) { return __builtin_sinf(x); }
KILN_FN double kiln_m_sin(double x) { return __builtin_sin(x); }
KILN_FN float kiln_m_cos(float x) { return __builtin_cosf(x); }
KILN_FN double kiln_m_cos(double x) { return __builtin_cos(x); }
KILN_FN float kiln_m_tan(float x) { return __builtin_tanf(x); }
KILN_FN double kiln_m_tan(double x) { return __builtin_tan(x); }
KILN_FN float kiln_m_asin(float x) { return __builtin_asinf(x); }
KILN_FN double kiln_m_asin(double x) { return __builtin_asin(x); }
KILN_FN float kiln_m_acos(float x) { return __builtin_acosf(x); }
KILN_FN double kiln_m_acos(double x) { return __builtin_acos(x); }
KILN_FN float kiln_m_atan(float x) { return __builtin_atanf(x); }
KILN_FN double kiln_m_atan(double x) { return __builtin_atan(x); }
KILN_FN float kiln_m_sinh(float x) { return __builtin_sinhf(x); }
KILN_FN double kiln_m_sinh(double x) { return __builtin_sinh(x); }
KILN_FN float kiln_m_cosh(float x) { return __builtin_coshf(x); }
KILN_FN double kiln_m_cosh(double x) { return __builtin_cosh(x); }
KILN_FN float kiln_m_asinh(float x) { return __builtin_asinhf(x); }
KILN_FN double kiln_m_asinh(double x) { return __builtin_asinh(x); }
KILN_FN float kiln_m_acosh(float x) { return __builtin_acoshf(x); }
KILN_FN double kiln_m_acosh(double x) { return __builtin_acosh(x); }
KILN_FN float kiln_m_atanh(float x) { return __builtin_atanhf(x); }
KILN_FN double kiln_m_atanh(double x) { return __builtin_atanh(x); }
KILN_FN float kiln_m_expm1(float x) { return __builtin_expm1f(x); }
KILN_FN double kiln_m_expm1(double x) { return __builtin_expm1(x); }
KILN_FN float kiln_m_pow(float x, float y) { return __builtin_powf(x, y); }
KILN_FN double kiln_m_pow(double x, double y) { return __builtin_pow(x, y); }
KILN_FN float kiln_m_fabs(float x) { return __builtin_fabsf(x); }
KILN_FN double kiln_m_fabs(double x) { return __builtin_fabs(x); }
KILN_FN float kiln_m_fmod(float x, float y) { return __builtin_fmodf(x, y); }
KILN_FN double kiln_m_fmod(double x, double y) { return __builtin_fmod(x, y); }
KILN_FN float kiln_m_copysign(float x, float y) { return __builtin_copysignf(x, y); }
KILN_FN double kiln_m_copysign(double x, double y) { return __builtin_copysign(x, y); }
KILN_FN float kiln_inf_f32() { return __builtin_inff(); }
KILN_FN double kiln_inf_f64() { return __builtin_inf(); }
KILN_FN float kiln_nan_f32() { return __builtin_nanf(""); }
KILN_FN double kiln_nan_f64() { return __builtin_nan(""); }
KILN_FN unsigned kiln_f32_bits(float x) { return __builtin_bit_cast(unsigned, x); }
KILN_FN float kiln_bits_f32(unsigned b) { return __builtin_bit_cast(float, b); }
#endif

// f16 and bf16 storage, as bits: widening is exact; narrowing rounds to nearest even (f16: to
// +-inf from 65520 on, subnormals below 2^-14), NaN stays a quiet NaN of the same sign. Written
// with integer operations so that the C++, CUDA and emu kernels round identically.
KILN_FN float kiln_bf16_to_f32(unsigned short h) { return kiln_bits_f32((unsigned)h << 16); }
KILN_FN unsigned short kiln_f32_to_bf16(float x) {
  const unsigned u = kiln_f32_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
KILN_FN float kiln_f16_to_f32(unsigned short h) {
  const unsigned sign = ((unsigned)h & 0x8000u) << 16, e = ((unsigned)h >> 10) & 0x1fu,
                 m = (unsigned)h & 0x3ffu;
  if (e == 0x1fu) return kiln_bits_f32(sign | 0x7f800000u | (m << 13));
  if (e == 0) {  // Zero or subnormal: m * 2^-24, exact in f32.
    const float f = (float)m * 5.9604644775390625e-8f;
    return sign ? -f : f;
  }
  return kiln_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}
KILN_FN unsigned short kiln_f32_to_f16(float x) {
  const unsigned u = kiln_f32_bits(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (unsigned short)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // >= 65520: inf.
  if (a >= 0x38800000u) {  // A normal f16: drop 13 mantissa bits, ties to even.
    unsigned h = (a >> 13) - (112u << 10);
    const unsigned rest = a & 0x1fffu;
    h += rest > 0x1000u || (rest == 0x1000u && (h & 1u));
    return (unsigned short)(sign | h);
  }
  // Subnormal (or zero): the count of 2^-24 steps, rounded to nearest even (1024 is the least
  // normal's encoding).
  return (unsigned short)(sign | (unsigned)kiln_m_rint(kiln_bits_f32(a) * 16777216.0f));
}
// f64 narrowed to f16 or bf16, rounded once from the double's exact value (as the reference's
// casts): through f32 rounded to odd (an inexact f32 moved toward zero, its last bit set), which
// makes the later rounding to nearest even, at least 2 bits narrower, the correct one. NaN: the
// quiet NaN of its sign (a GPU's f64 -> f32 need not keep a NaN's sign).
KILN_FN float kiln_f64_to_f32_odd(double d) {
  const float f = (float)d;
  if ((double)f == d || d != d) return f;
  unsigned b = kiln_f32_bits(f);
  if (kiln_m_fabs((double)f) > kiln_m_fabs(d)) b -= 1u;
  return kiln_bits_f32(b | 1u);
}
KILN_FN unsigned short kiln_f64_to_f16(double d) {
  if (d != d) return (unsigned short)(kiln_m_copysign(1.0, d) < 0 ? 0xfe00u : 0x7e00u);
  return kiln_f32_to_f16(kiln_f64_to_f32_odd(d));
}
KILN_FN unsigned short kiln_f64_to_bf16(double d) {
  if (d != d) return (unsigned short)(kiln_m_copysign(1.0, d) < 0 ? 0xffc0u : 0x7fc0u);
  return kiln_f32_to_bf16(kiln_f64_to_f32_odd(d));
}
KILN_FN float kiln_round_bf16(float x) { return kiln_bf16_to_f32(kiln_f32_to_bf16(x)); }
KILN_FN float kiln_round_f16(float x) { return kiln_f16_to_f32(kiln_f32_to_f16(x)); }

template <class T> KILN_FN T kiln_neg(T x) { return -x; }
template <class T> KILN_FN T kiln_abs(T x) { return kiln_m_fabs(x); }
// `x < 0 ? 0 : x` lets NaN through, as PyTorch's relu does.
template <class T> KILN_FN T kiln_relu(T x) { return x < T(0) ? T(0) : x; }
template <class T> KILN_FN T kiln_leaky_relu(T x, T a) { return x >= T(0) ? x : a * x; }
// e^-|x| / (1 + e^-|x|) below 0 and 1 / (1 + e^-x) above: one exponential that cannot
// overflow (kiln_m_exp_nonpos), and full relative accuracy in the negative tail, where
// 1 / (1 + e^-x) divides by a huge number.
template <class T> KILN_FN T kiln_sigmoid(T x) {
  const T z = kiln_m_exp_nonpos(x < T(0) ? x : -x);
  return (x >= T(0) ? T(1) : z) / (T(1) + z);
}
// x * sigmoid(x) with one division: (x or x e^-|x|) / (1 + e^-|x|).
template <class T> KILN_FN T kiln_silu(T x) {
  const T z = kiln_m_exp_nonpos(x < T(0) ? x : -x);
  return (x >= T(0) ? x : x * z) / (T(1) + z);
}
// x tanh(softplus(x)), softplus(x) = log1p(e^x) (accurate where e^x is small); e^x overflows to
// inf for large x, where tanh gives 1.
template <class T> KILN_FN T kiln_mish(T x) {
  return x * kiln_m_tanh(kiln_m_log1p(kiln_m_exp(x)));
}
template <class T> KILN_FN T kiln_tanh(T x) { return kiln_m_tanh(x); }
template <class T> KILN_FN T kiln_exp(T x) { return kiln_m_exp(x); }
// exp(x) where x <= 0 or NaN (softmax's x - max(x)).
template <class T> KILN_FN T kiln_exp_nonpos(T x) { return kiln_m_exp_nonpos(x); }
template <class T> KILN_FN T kiln_log(T x) { return kiln_m_log(x); }
template <class T> KILN_FN T kiln_sqrt(T x) { return kiln_m_sqrt(x); }
template <class T> KILN_FN T kiln_rsqrt(T x) { return T(1) / kiln_m_sqrt(x); }
// x * 0.5 * (1 + erf(x / sqrt(2))) = x * 0.5 * erfc(-x / sqrt(2)), accurate for negative x too.
template <class T> KILN_FN T kiln_gelu(T x) {
  return x * T(0.5) * kiln_m_erfc(-x * T(0.70710678118654752440084436210484903));
}
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
template <class T> KILN_FN T kiln_gelu_tanh(T x) {
  const T k = T(1.4142135623730950488016887242096981) * T(0.56418958354775628694807945156077259);
  return T(0.5) * x * (T(1) + kiln_m_tanh(k * (x + T(0.044715) * x * x * x)));
}
// NaN passes through; NaN bounds never clamp.
// min(max(x, lo), hi) as the reference kernel (hi wins when lo > hi); NaN x stays NaN.
template <class T> KILN_FN T kiln_clip(T x, T lo, T hi) { const T y = x < lo ? lo : x; return hi < y ? hi : y; }
template <class T> KILN_FN T kiln_add(T a, T b) { return a + b; }
template <class T> KILN_FN T kiln_sub(T a, T b) { return a - b; }
template <class T> KILN_FN T kiln_mul(T a, T b) { return a * b; }
template <class T> KILN_FN T kiln_div(T a, T b) { return a / b; }
template <class T> KILN_FN T kiln_pow(T a, T b) { return kiln_m_pow(a, b); }
// maximum and minimum propagate NaN, as torch.maximum does.
// The rarer unary math ops (libm through kiln_m_*); softplus as x + log1p(e^-x) above 20.
template <class T> KILN_FN T kiln_floor(T x) { return kiln_m_floor(x); }
template <class T> KILN_FN T kiln_ceil(T x) { return kiln_m_ceil(x); }
template <class T> KILN_FN T kiln_round(T x) { return kiln_m_rint(x); }
template <class T> KILN_FN T kiln_sign(T x) { return x > T(0) ? T(1) : (x < T(0) ? T(-1) : x); }
template <class T> KILN_FN T kiln_erf(T x) { return kiln_m_erf(x); }
template <class T> KILN_FN T kiln_sin(T x) { return kiln_m_sin(x); }
template <class T> KILN_FN T kiln_cos(T x) { return kiln_m_cos(x); }
template <class T> KILN_FN T kiln_tan(T x) { return kiln_m_tan(x); }
template <class T> KILN_FN T kiln_asin(T x) { return kiln_m_asin(x); }
template <class T> KILN_FN T kiln_acos(T x) { return kiln_m_acos(x); }
template <class T> KILN_FN T kiln_atan(T x) { return kiln_m_atan(x); }
template <class T> KILN_FN T kiln_sinh(T x) { return kiln_m_sinh(x); }
template <class T> KILN_FN T kiln_cosh(T x) { return kiln_m_cosh(x); }
template <class T> KILN_FN T kiln_asinh(T x) { return kiln_m_asinh(x); }
template <class T> KILN_FN T kiln_acosh(T x) { return kiln_m_acosh(x); }
template <class T> KILN_FN T kiln_atanh(T x) { return kiln_m_atanh(x); }
template <class T> KILN_FN T kiln_softplus(T x) { return x > T(20) ? x + kiln_m_log1p(kiln_m_exp(-x)) : kiln_m_log1p(kiln_m_exp(x)); }
// elu, selu, celu with expm1 (small negative inputs keep their digits); thresholded_relu.
template <class T> KILN_FN T kiln_elu(T x, T a) { return x > T(0) ? x : a * kiln_m_expm1(x); }
template <class T> KILN_FN T kiln_selu(T x, T a, T g) { return g * (x > T(0) ? x : a * kiln_m_expm1(x)); }
template <class T> KILN_FN T kiln_celu(T x, T a) { return x > T(0) ? x : a * kiln_m_expm1(x / a); }
template <class T> KILN_FN T kiln_thresholded_relu(T x, T a) { return x > a ? x : T(0); }
// Comparisons (bool results; NaN compares unequal and unordered) and logic on bools.
template <class T> KILN_FN bool kiln_equal(T a, T b) { return a == b; }
template <class T> KILN_FN bool kiln_less(T a, T b) { return a < b; }
template <class T> KILN_FN bool kiln_less_equal(T a, T b) { return a <= b; }
template <class T> KILN_FN bool kiln_greater(T a, T b) { return a > b; }
template <class T> KILN_FN bool kiln_greater_equal(T a, T b) { return a >= b; }
KILN_FN bool kiln_logical_and(bool a, bool b) { return a && b; }
KILN_FN bool kiln_logical_or(bool a, bool b) { return a || b; }
KILN_FN bool kiln_logical_xor(bool a, bool b) { return a != b; }
KILN_FN bool kiln_logical_not(bool a) { return !a; }
template <class T> KILN_FN T kiln_relu_backward(T g, T x) { return x > T(0) ? g : T(0); }
template <class T> KILN_FN T kiln_abs_backward(T g, T x) { return x > T(0) ? g : (x < T(0) ? -g : T(0)); }
template <class T> KILN_FN T kiln_leaky_relu_backward(T g, T x, T a) { return x > T(0) ? g : g * a; }
template <class T> KILN_FN T kiln_clip_backward(T g, T x, T lo, T hi) { return lo <= x && x <= hi ? g : T(0); }
template <class T> KILN_FN T kiln_maximum_backward(T g, T a, T b) { return a > b ? g : (a == b ? g / T(2) : T(0)); }
template <class T> KILN_FN T kiln_minimum_backward(T g, T a, T b) { return a < b ? g : (a == b ? g / T(2) : T(0)); }
// Phi(x) + x phi(x)
template <class T> KILN_FN T kiln_gelu_backward(T g, T x) {
  const T cdf = T(0.5) * kiln_m_erfc(-x * T(0.70710678118654752440084436210484903));
  const T pdf = kiln_m_exp(T(-0.5) * x * x) * T(0.39894228040143267793994605993438187);
  return g * (cdf + x * pdf);
}
template <class T> KILN_FN T kiln_gelu_tanh_backward(T g, T x) {
  const T k = T(1.4142135623730950488016887242096981) * T(0.56418958354775628694807945156077259);
  const T t = kiln_m_tanh(k * (x + T(0.044715) * x * x * x));
  const T dinner = k * (T(1) + T(3 * 0.044715) * x * x);
  return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dinner);
}
template <class T> KILN_FN T kiln_maximum(T a, T b) { return a != a ? a : (b != b ? b : (a < b ? b : a)); }
template <class T> KILN_FN T kiln_minimum(T a, T b) { return a != a ? a : (b != b ? b : (b < a ? b : a)); }
// (x - mean) / sqrt(var + eps) * scale + bias
template <class T> KILN_FN T kiln_batch_norm(T x, T scale, T bias, T mean, T var, T eps) {
  return (x - mean) / kiln_m_sqrt(var + eps) * scale + bias;
}

#if defined(KILN_CUDA) || defined(KILN_EMU)
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

// Reports index `value` at flat position `position` out of range into the word of a device
// index check: ir::index_word::encode, printed with its constants; the lowest position wins.
std::string reportIndexFunction() {
  using namespace ir::index_word;
  std::string s = R"KILN(#if defined(KILN_CUDA) || defined(KILN_EMU)
// ir::index_word::encode (ir/index_word.h) in CUDA C.
KILN_FN void kiln_report_index(kiln_gptr<unsigned long long> w, long long position, long long value) {
  const unsigned long long p = position < {max}LL ? (unsigned long long)position : {max}ULL;
  const long long v = value < {lo}LL ? {lo}LL : (value > {hi}LL ? {hi}LL : value);
  atomicMin(&w[0], (p << {shift}) | ((unsigned long long)(v != value) << {bit}) | (unsigned long long)(v + {bias}LL));
}
#endif
)KILN";
  const std::pair<std::string_view, int64_t> constants[] = {
      {"{max}", kMaxPosition},     {"{lo}", kMinValue},         {"{hi}", kMaxValue},
      {"{shift}", kPositionShift}, {"{bit}", kOutsideInt32Bit}, {"{bias}", kValueBias}};
  for (const auto& [key, value] : constants)
    for (size_t at = s.find(key); at != std::string::npos; at = s.find(key, at))
      s.replace(at, key.size(), std::to_string(value));
  return s;
}

}  // namespace

std::string_view kernelPrelude() {
  static const std::string prelude = std::string(kPrelude) + reportIndexFunction();
  return prelude;
}

}  // namespace kiln::codegen
