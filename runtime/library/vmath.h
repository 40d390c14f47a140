// Vectorizable float math for the library's own loops (attention's softmax, the epilogue's
// sigmoid): written with selects instead of branches and libm calls, so that GCC vectorizes the
// loops that call them. The polynomial and range reduction are those of the generated kernels'
// kiln_vexp (codegen/prelude.cpp; the library is compiled apart from generated code and cannot
// call it), so library and generated results round alike.
#pragma once

#include <bit>
#include <cstdint>

#include "runtime/cpu/cpu_clones.h"

namespace kiln::runtime::lib {

// The pieces of exp (prelude.cpp's kiln_vexp_t, _y, _pow2): t = x / ln 2 + 1.5 * 2^23 holds
// k = rint(x / ln 2) in its low bits, y = e^(x - k ln 2) by the degree-6 minimax polynomial,
// and 2^k (k in [-126, 127]) is t's low bits moved into the exponent field.
inline float vexpT(float x) {
  return x * 1.44269504088896341f + 12582912.f;
}
inline float vexpY(float x, float k) {
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
inline float vexpPow2(float t) {
  return std::bit_cast<float>((std::bit_cast<uint32_t>(t) << 23) + (127u << 23));
}

// exp(x), about 1 ulp; results below the normal range flush to zero (x < -87.34), above it are
// +inf (x > 88.72); NaN stays NaN.
inline float vexp(float x) {
  const float xc = x < -87.3365f ? -87.3365f : (x > 88.7228394f ? 88.7228394f : x);
  const float t = vexpT(xc), k = t - 12582912.f;
  const float tc = t > 12582912.f + 127.f ? 12582912.f + 127.f : t;
  const float out = vexpY(xc, k) * vexpPow2(tc) * (k > 127.f ? 2.f : 1.f);
  return x > 88.7228394f ? __builtin_inff() : (x < -87.3365f ? 0.f : out);
}

// vexp where x <= 88.03 (softmax's x - max(x), sigmoid's -|x|): the same bits, fewer operations.
inline float vexpNonpos(float x) {
  const float xc = x < -87.3365f ? -87.3365f : x;
  const float t = vexpT(xc);
  const float out = vexpY(xc, t - 12582912.f) * vexpPow2(t);
  return x < -87.3365f ? 0.f : out;
}

// The sigmoid op's formula (reference kernels, prelude's kiln_sigmoid): e^-|x| / (1 + e^-|x|)
// below 0, 1 / (1 + e^-x) above.
inline float vsigmoid(float x) {
  const float z = vexpNonpos(x < 0.f ? x : -x);
  return (x >= 0.f ? 1.f : z) / (1.f + z);
}

}  // namespace kiln::runtime::lib
