// Vectorizable float math for the library's own loops (attention's softmax, the epilogue's
// sigmoid): written with selects instead of branches and libm calls, so that GCC vectorizes the
// loops that call them. The polynomial and range reduction are those of the generated kernels'
// kiln_vexp (codegen/prelude.cpp; the library is compiled apart from generated code and cannot
// call it), so library and generated results round alike.
#pragma once

#include <cstdint>
#include <cstring>

#include "runtime/cpu/cpu_clones.h"

namespace kiln::runtime::lib {

// exp(x), about 1 ulp: Cephes' range reduction and polynomial; results below the normal range
// flush to zero (x < -87.34), above it are +inf (x > 88.72); NaN stays NaN.
inline float vexp(float x) {
  // Clamped into [-87.34, 88.72] (a NaN too, so that the conversion below is defined).
  const float xc = x >= -87.3365f && x <= 88.7228394f ? x : (x > 0.f ? 88.7228394f : -87.3365f);
  // Round to nearest by adding and removing 1.5 * 2^23 (no SSE4.1 rounding instruction).
  const float k = (xc * 1.44269504088896341f + 12582912.f) - 12582912.f;
  float r = xc - k * 0.693359375f;
  r = r - k * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  // y * 2^k, k in [-126, 128]: one normal power of two and a doubling for k = 128.
  const float kc = k > 127.f ? 127.f : k;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(kc) + 127) << 23;
  float s;
  std::memcpy(&s, &bits, sizeof s);
  const float out = y * s * (k > 127.f ? 2.f : 1.f);
  return x != x ? x : (x > 88.7228394f ? __builtin_inff() : (x < -87.3365f ? 0.f : out));
}

// 1 / (1 + exp(-x)), as the sigmoid op computes it.
inline float vsigmoid(float x) {
  return 1.f / (1.f + vexp(-x));
}

}  // namespace kiln::runtime::lib
