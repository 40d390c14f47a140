// Reference kernels for the pointwise ops: unary math, clip, cast, dropout, and the binary ops
// and where with NumPy broadcasting.
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <string>

#include "ir/dropout.h"
#include "ir/narrow.h"
#include "runtime/cpu/cpu_clones.h"
#include "runtime/reference/helpers.h"

namespace kiln::runtime {

namespace {

using ref::Tag;

// ---- Unary.

// out[i] = f(in[i]) for T in the dtype set that `Dispatch` accepts.
template <class Dispatch, class F>
Status mapUnary(Dispatch dispatch, const ir::AttrView& attrs, std::span<const Tensor> in,
                std::span<Tensor> out, F f) {
  return dispatch(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    const T* x = in[0].data<T>();
    T* y = out[0].data<T>();
    const int64_t n = in[0].numElements();
    for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(f(x[i]));
    return Status::ok();
  });
}

constexpr auto kFloat = [](std::string_view op, ir::DType t, auto&& f) {
  return ref::dispatchFloat(op, t, f);
};
constexpr auto kNumeric = [](std::string_view op, ir::DType t, auto&& f) {
  return ref::dispatchNumeric(op, t, f);
};

// Declares a kernel `name` applying the expression `expr` of `x` (of type T) elementwise.
#define KILN_UNARY_KERNEL(name, dispatch, expr)                                               \
  Status name(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) { \
    return mapUnary(dispatch, attrs, in, out, []<class T>(T x) -> T { return (expr); });      \
  }

// e^-|x| / (1 + e^-|x|) below 0, 1 / (1 + e^-x) above: the exponential cannot overflow, and
// the negative tail keeps its relative accuracy (the generated kernels' formula, prelude.cpp).
template <class T>
T sigmoidOf(T x) {
  const T z = std::exp(x < T(0) ? x : -x);
  return (x >= T(0) ? T(1) : z) / (T(1) + z);
}
// x * sigmoid(x) with one division: (x or x e^-|x|) / (1 + e^-|x|).
template <class T>
T siluOf(T x) {
  const T z = std::exp(x < T(0) ? x : -x);
  return (x >= T(0) ? x : x * z) / (T(1) + z);
}
// x tanh(softplus(x)), softplus(x) = log(1 + e^x)
template <class T>
T mishOf(T x) {
  return x * std::tanh(std::log1p(std::exp(x)));
}

KILN_UNARY_KERNEL(negKernel, kNumeric, ref::negWrap(x))
KILN_UNARY_KERNEL(sigmoidKernel, kFloat, sigmoidOf(x))
KILN_UNARY_KERNEL(tanhKernel, kFloat, std::tanh(x))
KILN_UNARY_KERNEL(siluKernel, kFloat, siluOf(x))
KILN_UNARY_KERNEL(mishKernel, kFloat, mishOf(x))
KILN_UNARY_KERNEL(expKernel, kFloat, std::exp(x))
KILN_UNARY_KERNEL(logKernel, kFloat, std::log(x))
KILN_UNARY_KERNEL(sqrtKernel, kFloat, std::sqrt(x))
KILN_UNARY_KERNEL(rsqrtKernel, kFloat, T(1) / std::sqrt(x))
// The rarer unary math ops; softplus as x + log1p(e^-x) above 20, where e^x overflows.
KILN_UNARY_KERNEL(floorKernel, kFloat, std::floor(x))
KILN_UNARY_KERNEL(ceilKernel, kFloat, std::ceil(x))
KILN_UNARY_KERNEL(roundKernel, kFloat, std::nearbyint(x))
KILN_UNARY_KERNEL(signKernel, kFloat, x > T(0) ? T(1) : (x < T(0) ? T(-1) : x))
KILN_UNARY_KERNEL(erfKernel, kFloat, std::erf(x))
KILN_UNARY_KERNEL(sinKernel, kFloat, std::sin(x))
KILN_UNARY_KERNEL(cosKernel, kFloat, std::cos(x))
KILN_UNARY_KERNEL(tanKernel, kFloat, std::tan(x))
KILN_UNARY_KERNEL(asinKernel, kFloat, std::asin(x))
KILN_UNARY_KERNEL(acosKernel, kFloat, std::acos(x))
KILN_UNARY_KERNEL(atanKernel, kFloat, std::atan(x))
KILN_UNARY_KERNEL(sinhKernel, kFloat, std::sinh(x))
KILN_UNARY_KERNEL(coshKernel, kFloat, std::cosh(x))
KILN_UNARY_KERNEL(asinhKernel, kFloat, std::asinh(x))
KILN_UNARY_KERNEL(acoshKernel, kFloat, std::acosh(x))
KILN_UNARY_KERNEL(atanhKernel, kFloat, std::atanh(x))
KILN_UNARY_KERNEL(softplusKernel, kFloat,
                  x > T(20) ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)))
#undef KILN_UNARY_KERNEL

Status absKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  return mapUnary(kNumeric, attrs, in, out, []<class T>(T x) -> T {
    if constexpr (std::is_floating_point_v<T>)
      return std::fabs(x);
    else if constexpr (std::is_unsigned_v<T>)
      return x;
    else
      return x < 0 ? ref::negWrap(x) : x;  // abs(INT_MIN) wraps to INT_MIN, as in PyTorch.
  });
}

Status reluKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  // `x < 0 ? 0 : x` lets NaN through, as PyTorch does.
  return mapUnary(kNumeric, attrs, in, out, []<class T>(T x) -> T {
    if constexpr (std::is_unsigned_v<T>)
      return x;
    else
      return x < T(0) ? T(0) : x;
  });
}

// elu, selu, celu and thresholded_relu, with expm1 so that small negative inputs keep their digits.
Status eluKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  const double alpha = attrs.getFloat("alpha");
  return mapUnary(kFloat, attrs, in, out, [alpha]<class T>(T x) -> T {
    return x > T(0) ? x : static_cast<T>(alpha) * std::expm1(x);
  });
}
Status seluKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  const double alpha = attrs.getFloat("alpha"), gamma = attrs.getFloat("gamma");
  return mapUnary(kFloat, attrs, in, out, [alpha, gamma]<class T>(T x) -> T {
    return static_cast<T>(gamma) * (x > T(0) ? x : static_cast<T>(alpha) * std::expm1(x));
  });
}
Status celuKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  const double alpha = attrs.getFloat("alpha");
  return mapUnary(kFloat, attrs, in, out, [alpha]<class T>(T x) -> T {
    const T a = static_cast<T>(alpha);
    return x > T(0) ? x : a * std::expm1(x / a);
  });
}
Status thresholdedReluKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                             std::span<Tensor> out) {
  const double alpha = attrs.getFloat("alpha");
  return mapUnary(kFloat, attrs, in, out,
                  [alpha]<class T>(T x) -> T { return x > static_cast<T>(alpha) ? x : T(0); });
}

Status leakyReluKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                       std::span<Tensor> out) {
  const double alpha = attrs.getFloat("alpha");
  return mapUnary(kFloat, attrs, in, out,
                  [alpha]<class T>(T x) -> T { return x >= T(0) ? x : static_cast<T>(alpha) * x; });
}

Status geluKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  if (attrs.getString("approximate") == "tanh") {
    return mapUnary(kFloat, attrs, in, out, []<class T>(T x) -> T {
      // sqrt(2 / pi) * (x + 0.044715 x^3)
      const T k = std::numbers::sqrt2_v<T> * std::numbers::inv_sqrtpi_v<T>;
      return T(0.5) * x * (T(1) + std::tanh(k * (x + T(0.044715) * x * x * x)));
    });
  }
  return mapUnary(kFloat, attrs, in, out, []<class T>(T x) -> T {
    // erfc(-z), not 1 + erf(z), which cancels on the negative tail (to 0 below x = -5.9).
    // glibc's erfcf costs about 1.6x its erff: eager gelu on bert_layer's [128, 3072] takes
    // 3.0 ms instead of 1.9 (2 threads); a branch between the two, or double, is slower still.
    return x * T(0.5) * std::erfc(-x / std::numbers::sqrt2_v<T>);
  });
}

// Clip bounds are float attributes. For integer tensors they become the nearest integers
// inside [min, max] (ceil of min, floor of max), saturated to the type's range, so that the
// result is the integer closest to the real-valued clip. NaN means no bound.
template <class T>
T lowerBound(double lo) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::isnan(lo) ? -std::numeric_limits<T>::infinity() : static_cast<T>(lo);
  } else {
    if (std::isnan(lo) || lo <= static_cast<double>(std::numeric_limits<T>::lowest()))
      return std::numeric_limits<T>::lowest();
    if (lo >= static_cast<double>(std::numeric_limits<T>::max()))
      return std::numeric_limits<T>::max();
    return static_cast<T>(std::ceil(lo));
  }
}
template <class T>
T upperBound(double hi) {
  if constexpr (std::is_floating_point_v<T>) {
    return std::isnan(hi) ? std::numeric_limits<T>::infinity() : static_cast<T>(hi);
  } else {
    if (std::isnan(hi) || hi >= static_cast<double>(std::numeric_limits<T>::max()))
      return std::numeric_limits<T>::max();
    if (hi <= static_cast<double>(std::numeric_limits<T>::lowest()))
      return std::numeric_limits<T>::lowest();
    return static_cast<T>(std::floor(hi));
  }
}

Status clipKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  const double lo = attrs.getFloat("min"), hi = attrs.getFloat("max");
  return mapUnary(kNumeric, attrs, in, out, [lo, hi]<class T>(T x) -> T {
    // min(max(x, lo), hi) with NaN x kept (both comparisons are false).
    const T l = lowerBound<T>(lo), h = upperBound<T>(hi);
    const T y = x < l ? l : x;
    return h < y ? h : y;
  });
}

// ---- Cast.

// Float to integer truncates toward zero. Values outside the target range (undefined in C++
// and ONNX) saturate and NaN becomes 0, so the reference is deterministic.
template <class D>
D truncSaturate(double v) {
  if (std::isnan(v)) return D(0);
  const double t = std::trunc(v);
  if (t <= static_cast<double>(std::numeric_limits<D>::lowest()))
    return std::numeric_limits<D>::lowest();
  if (t >= static_cast<double>(std::numeric_limits<D>::max())) return std::numeric_limits<D>::max();
  return static_cast<D>(t);
}

// Converts the exact value `v` of a floating-point source element.
template <class D>
D fromFloatValue(double v) {
  if constexpr (std::is_same_v<D, ref::Half>)
    return {ref::doubleToF16Bits(v)};
  else if constexpr (std::is_same_v<D, ref::BFloat16>)
    return {ref::doubleToBf16Bits(v)};
  else if constexpr (std::is_same_v<D, ref::Bool8>)
    return {static_cast<uint8_t>(v != 0)};
  else if constexpr (std::is_floating_point_v<D>)
    return static_cast<D>(v);
  else
    return truncSaturate<D>(v);
}

// Converts the value of an integer or bool source element (every one fits in int64).
template <class D>
D fromIntegerValue(int64_t v) {
  if constexpr (std::is_same_v<D, ref::Half>)
    return {ref::int64ToF16Bits(v)};
  else if constexpr (std::is_same_v<D, ref::BFloat16>)
    return {ref::int64ToBf16Bits(v)};
  else if constexpr (std::is_same_v<D, ref::Bool8>)
    return {static_cast<uint8_t>(v != 0)};
  else
    return static_cast<D>(v);  // Integers wrap (two's complement), floats round once.
}

// Calls onInteger with the value of an integer or bool element (as int64_t: a uint64_t wraps)
// or onFloat with a float element's exact value (as double).
template <class S, class I, class F>
auto withElementValue(S s, I onInteger, F onFloat) {
  if constexpr (std::is_same_v<S, ref::Bool8>)
    return onInteger(int64_t{s.v != 0});
  else if constexpr (std::is_integral_v<S>)
    return onInteger(static_cast<int64_t>(s));
  else
    return onFloat(static_cast<double>(ref::numericValue(s)));
}

template <class D, class S>
D convertElement(S s) {
  if constexpr (std::is_same_v<S, uint64_t>) {
    // Not every u64 fits in int64: integers wrap, floats round once from the exact value.
    if constexpr (std::is_integral_v<D> || std::is_floating_point_v<D>)
      return static_cast<D>(s);
    else
      return fromFloatValue<D>(static_cast<double>(s));
  } else
    return withElementValue(
        s, [](int64_t v) { return fromIntegerValue<D>(v); },
        [](double v) { return fromFloatValue<D>(v); });
}

// A cast from or to a narrow storage dtype (ir/narrow.h: 8- and 4-bit floats, 4- and 2-bit
// integers, a byte each), through each element's exact value: a float source rounds, an integer
// one keeps its low bits in a narrow integer; `saturate` applies to the 8-bit floats.
template <class S>
uint8_t toNarrow(ir::DType to, S s, bool saturate, ir::E8M0Round round = ir::E8M0Round::kUp) {
  if constexpr (std::is_same_v<S, uint64_t>)  // A float from the value, not its int64 wrap.
    if (ir::isNarrowFloat(to))
      return ir::narrowFromFloat(to, static_cast<double>(s), saturate, round);
  return withElementValue(
      s,
      [&](int64_t v) {
        return ir::isNarrowFloat(to)
                   ? ir::narrowFromFloat(to, static_cast<double>(v), saturate, round)
                   : ir::narrowFromInteger(to, v);
      },
      [&](double v) { return ir::narrowFromFloat(to, v, saturate, round); });
}

Status castNarrow(const ir::AttrView& attrs, const Tensor& x, Tensor& y) {
  const bool saturate = attrs.getInt("saturate") != 0;
  // Inference refused any other round_mode.
  const ir::E8M0Round round =
      ir::parseE8M0Round(attrs.getString("round_mode")).value_or(ir::E8M0Round::kUp);
  const ir::DType from = x.dtype(), to = y.dtype();
  const int64_t n = x.numElements();
  if (ir::isNarrow(from)) {
    const uint8_t* a = x.data<uint8_t>();
    if (ir::isNarrow(to)) {
      uint8_t* b = y.data<uint8_t>();
      for (int64_t i = 0; i < n; ++i) {
        const double v = ir::narrowToDouble(from, a[i]);
        b[i] = ir::isNarrowFloat(from) ? toNarrow(to, v, saturate, round)
                                       : toNarrow(to, static_cast<int64_t>(v), saturate, round);
      }
      return Status::ok();
    }
    return ref::dispatchAll(to, [&]<class D>(Tag<D>) {
      D* b = y.data<D>();
      for (int64_t i = 0; i < n; ++i) {
        const double v = ir::narrowToDouble(from, a[i]);
        b[i] = ir::isNarrowFloat(from) ? fromFloatValue<D>(v)
                                       : fromIntegerValue<D>(static_cast<int64_t>(v));
      }
      return Status::ok();
    });
  }
  return ref::dispatchAll(from, [&]<class S>(Tag<S>) {
    const S* a = x.data<S>();
    uint8_t* b = y.data<uint8_t>();
    for (int64_t i = 0; i < n; ++i) b[i] = toNarrow(to, a[i], saturate, round);
    return Status::ok();
  });
}

Status castKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  if (ir::isNarrow(in[0].dtype()) || ir::isNarrow(out[0].dtype()))
    return castNarrow(attrs, in[0], out[0]);
  const int64_t n = in[0].numElements();
  return ref::dispatchAll(in[0].dtype(), [&]<class S>(Tag<S>) {
    return ref::dispatchAll(out[0].dtype(), [&]<class D>(Tag<D>) {
      const S* x = in[0].data<S>();
      D* y = out[0].data<D>();
      for (int64_t i = 0; i < n; ++i) y[i] = convertElement<D>(x[i]);
      return Status::ok();
    });
  });
}

// ---- Binary with broadcasting.

// out = f(a, b) elementwise over the broadcast shape of the output.
template <class T, class F>
void mapBinary(const Tensor& a, const Tensor& b, Tensor& out, F f) {
  const T* x = a.data<T>();
  const T* y = b.data<T>();
  T* z = out.data<T>();
  const ir::Shape& shape = out.shape();
  if (a.shape() == shape && b.shape() == shape) {
    const int64_t n = out.numElements();
    for (int64_t i = 0; i < n; ++i) z[i] = f(x[i], y[i]);
    return;
  }
  ref::forEachStrided<2>(
      shape, {ref::broadcastStrides(a.shape(), shape), ref::broadcastStrides(b.shape(), shape)},
      {0, 0},
      [&](int64_t i, const std::array<int64_t, 2>& off) { z[i] = f(x[off[0]], y[off[1]]); });
}

template <class Dispatch, class F>
Status binaryKernel(Dispatch dispatch, const ir::AttrView& attrs, std::span<const Tensor> in,
                    std::span<Tensor> out, F f) {
  return dispatch(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    mapBinary<T>(in[0], in[1], out[0], [&](T a, T b) -> T { return f(a, b); });
    return Status::ok();
  });
}

Status addKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  return binaryKernel(kNumeric, attrs, in, out,
                      []<class T>(T a, T b) { return ref::addWrap(a, b); });
}
Status subKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  return binaryKernel(kNumeric, attrs, in, out,
                      []<class T>(T a, T b) { return ref::subWrap(a, b); });
}
Status mulKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  return binaryKernel(kNumeric, attrs, in, out,
                      []<class T>(T a, T b) { return ref::mulWrap(a, b); });
}
Status powKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  return binaryKernel(kFloat, attrs, in, out,
                      []<class T>(T a, T b) -> T { return std::pow(a, b); });
}

// maximum and minimum propagate NaN, as PyTorch's torch.maximum does.
Status maximumKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  return binaryKernel(kNumeric, attrs, in, out, []<class T>(T a, T b) -> T {
    if (ref::isNaN(a)) return a;
    if (ref::isNaN(b)) return b;
    return a < b ? b : a;
  });
}
Status minimumKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  return binaryKernel(kNumeric, attrs, in, out, []<class T>(T a, T b) -> T {
    if (ref::isNaN(a)) return a;
    if (ref::isNaN(b)) return b;
    return b < a ? b : a;
  });
}

}  // namespace

std::string zeroDivisorError(std::string_view op, std::string_view divisor,
                             std::string_view position) {
  return std::string(op) + ": integer division by zero (divisor " + std::string(divisor) +
         " is 0 at flat index " + std::string(position) + ")";
}

Status checkNonZeroDivisor(std::string_view op, const Tensor& divisor) {
  const size_t size = ir::dtypeSize(divisor.dtype());
  const std::byte* b = divisor.rawData();
  for (int64_t i = 0; i < divisor.numElements(); ++i) {
    bool zero = true;
    for (size_t e = 0; e < size; ++e)
      zero = zero && b[static_cast<size_t>(i) * size + e] == std::byte{0};
    if (zero) return invalidArgument(zeroDivisorError(op, divisor.describe(), std::to_string(i)));
  }
  return Status::ok();
}

namespace {

Status divKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  return ref::dispatchNumeric(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    if constexpr (std::is_integral_v<T>) {
      KILN_TRY(checkNonZeroDivisor("div", in[1]));
      // Truncates toward zero; INT_MIN / -1 wraps to INT_MIN instead of overflowing.
      mapBinary<T>(in[0], in[1], out[0], [](T a, T b) -> T {
        if constexpr (std::is_signed_v<T>)
          if (b == T(-1)) return ref::negWrap(a);
        return static_cast<T>(a / b);
      });
    } else {
      mapBinary<T>(in[0], in[1], out[0], [](T a, T b) -> T { return a / b; });
    }
    return Status::ok();
  });
}

template <class T>
T shiftBits(T a, T b, bool left) {
  constexpr int width = static_cast<int>(sizeof(T) * 8);
  using U = std::make_unsigned_t<T>;
  bool inRange = static_cast<U>(b) < static_cast<U>(width);
  if constexpr (std::is_signed_v<T>) inRange = inRange && b >= T(0);
  if (!inRange) {
    if constexpr (std::is_signed_v<T>)
      if (!left && a < T(0)) return T(-1);
    return T(0);
  }
  const int s = static_cast<int>(b);
  if (left) return static_cast<T>(static_cast<U>(static_cast<U>(a) << s));
  if constexpr (std::is_signed_v<T>)
    if (a < T(0)) return static_cast<T>(static_cast<U>(~(static_cast<U>(~static_cast<U>(a)) >> s)));
  return static_cast<T>(static_cast<U>(a) >> s);
}

template <class F>
Status bitwiseKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out,
                     F f) {
  return ref::dispatchNumeric(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    if constexpr (std::is_integral_v<T>) {
      mapBinary<T>(in[0], in[1], out[0], [&](T a, T b) -> T { return f(a, b); });
      return Status::ok();
    } else {
      return ref::unsupportedDType(ref::opNameOf(attrs), in[0].dtype());
    }
  });
}

Status bitShiftKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                      std::span<Tensor> out) {
  const bool left = attrs.getString("direction") == "LEFT";
  return bitwiseKernel(attrs, in, out,
                       [left]<class T>(T a, T b) -> T { return shiftBits(a, b, left); });
}
Status bitwiseAndKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                        std::span<Tensor> out) {
  return bitwiseKernel(attrs, in, out,
                       []<class T>(T a, T b) -> T { return static_cast<T>(a & b); });
}
Status bitwiseOrKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                       std::span<Tensor> out) {
  return bitwiseKernel(attrs, in, out,
                       []<class T>(T a, T b) -> T { return static_cast<T>(a | b); });
}
Status bitwiseXorKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                        std::span<Tensor> out) {
  return bitwiseKernel(attrs, in, out,
                       []<class T>(T a, T b) -> T { return static_cast<T>(a ^ b); });
}
Status bitwiseNotKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                        std::span<Tensor> out) {
  return ref::dispatchNumeric(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    if constexpr (std::is_integral_v<T>) {
      const T* x = in[0].data<T>();
      T* y = out[0].data<T>();
      for (int64_t i = 0; i < in[0].numElements(); ++i) y[i] = static_cast<T>(~x[i]);
      return Status::ok();
    } else {
      return ref::unsupportedDType(ref::opNameOf(attrs), in[0].dtype());
    }
  });
}

Status modKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  const bool fmod = attrs.getInt("fmod") != 0;
  return ref::dispatchNumeric(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    if constexpr (std::is_integral_v<T>) {
      KILN_TRY(checkNonZeroDivisor("mod", in[1]));
      mapBinary<T>(in[0], in[1], out[0], [fmod](T a, T b) -> T {
        if constexpr (std::is_signed_v<T>)
          if (b == T(-1)) return T(0);  // INT_MIN % -1 overflows; the remainder is 0.
        T r = static_cast<T>(a % b);
        if constexpr (std::is_signed_v<T>)
          if (!fmod && r != 0 && ((r < 0) != (b < 0))) r = static_cast<T>(r + b);
        return r;
      });
      return Status::ok();
    } else {
      // fmod=0: the divisor's sign (ONNX Mod 28, Python's %); a zero remainder takes it too.
      mapBinary<T>(in[0], in[1], out[0], [fmod](T a, T b) -> T {
        T r = std::fmod(a, b);
        if (!fmod) {
          if (r != T(0) && std::signbit(r) != std::signbit(b)) r += b;
          if (r == T(0)) r = std::copysign(T(0), b);
        }
        return r;
      });
      return Status::ok();
    }
  });
}

Status whereKernel(const ir::AttrView&, std::span<const Tensor> in, std::span<Tensor> out) {
  // Selection moves elements only, so it works for every dtype by element size.
  return ref::dispatchBySize(out[0].dtype(), [&]<class U>(Tag<U>) {
    const uint8_t* c = in[0].data<uint8_t>();
    const U* x = in[1].data<U>();
    const U* y = in[2].data<U>();
    U* z = out[0].data<U>();
    const ir::Shape& shape = out[0].shape();
    ref::forEachStrided<3>(
        shape,
        {ref::broadcastStrides(in[0].shape(), shape), ref::broadcastStrides(in[1].shape(), shape),
         ref::broadcastStrides(in[2].shape(), shape)},
        {0, 0, 0}, [&](int64_t i, const std::array<int64_t, 3>& off) {
          z[i] = c[off[0]] != 0 ? x[off[1]] : y[off[2]];
        });
    return Status::ok();
  });
}

// Comparisons: numeric inputs of one dtype (broadcast), bool output (1 or 0 per byte).
template <class F>
Status compareKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out,
                     F f) {
  return kNumeric(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    const T* x = in[0].data<T>();
    const T* y = in[1].data<T>();
    uint8_t* z = out[0].data<uint8_t>();
    const ir::Shape& shape = out[0].shape();
    ref::forEachStrided<2>(
        shape,
        {ref::broadcastStrides(in[0].shape(), shape), ref::broadcastStrides(in[1].shape(), shape)},
        {0, 0}, [&](int64_t i, const std::array<int64_t, 2>& off) {
          z[i] = f(x[off[0]], y[off[1]]) ? 1 : 0;
        });
    return Status::ok();
  });
}

Status equalKernel(const ir::AttrView& a, std::span<const Tensor> in, std::span<Tensor> out) {
  return compareKernel(a, in, out, []<class T>(T x, T y) { return x == y; });
}
Status lessKernel(const ir::AttrView& a, std::span<const Tensor> in, std::span<Tensor> out) {
  return compareKernel(a, in, out, []<class T>(T x, T y) { return x < y; });
}
Status lessEqualKernel(const ir::AttrView& a, std::span<const Tensor> in, std::span<Tensor> out) {
  return compareKernel(a, in, out, []<class T>(T x, T y) { return x <= y; });
}
Status greaterKernel(const ir::AttrView& a, std::span<const Tensor> in, std::span<Tensor> out) {
  return compareKernel(a, in, out, []<class T>(T x, T y) { return x > y; });
}
Status greaterEqualKernel(const ir::AttrView& a, std::span<const Tensor> in,
                          std::span<Tensor> out) {
  return compareKernel(a, in, out, []<class T>(T x, T y) { return x >= y; });
}

// Logic on bools: any non-zero byte is true; outputs are 1 or 0.
template <class F>
Status logicalKernel(std::span<const Tensor> in, std::span<Tensor> out, F f) {
  const uint8_t* x = in[0].data<uint8_t>();
  const uint8_t* y = in.size() > 1 ? in[1].data<uint8_t>() : x;
  uint8_t* z = out[0].data<uint8_t>();
  const ir::Shape& shape = out[0].shape();
  ref::forEachStrided<2>(shape,
                         {ref::broadcastStrides(in[0].shape(), shape),
                          ref::broadcastStrides(in[in.size() > 1 ? 1 : 0].shape(), shape)},
                         {0, 0}, [&](int64_t i, const std::array<int64_t, 2>& off) {
                           z[i] = f(x[off[0]] != 0, y[off[1]] != 0) ? 1 : 0;
                         });
  return Status::ok();
}

Status logicalAndKernel(const ir::AttrView&, std::span<const Tensor> in, std::span<Tensor> out) {
  return logicalKernel(in, out, [](bool a, bool b) { return a && b; });
}
Status logicalOrKernel(const ir::AttrView&, std::span<const Tensor> in, std::span<Tensor> out) {
  return logicalKernel(in, out, [](bool a, bool b) { return a || b; });
}
Status logicalXorKernel(const ir::AttrView&, std::span<const Tensor> in, std::span<Tensor> out) {
  return logicalKernel(in, out, [](bool a, bool b) { return a != b; });
}
Status logicalNotKernel(const ir::AttrView&, std::span<const Tensor> in, std::span<Tensor> out) {
  return logicalKernel(in, out, [](bool a, bool) { return !a; });
}

Status reluBackwardKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                          std::span<Tensor> out) {
  return binaryKernel(kFloat, attrs, in, out,
                      []<class T>(T g, T x) -> T { return x > T(0) ? g : T(0); });
}

// The other pointwise gradients, (grad, x) -> d x, as PyTorch defines them where the derivative
// is undefined.
Status absBackwardKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                         std::span<Tensor> out) {
  return binaryKernel(kFloat, attrs, in, out,
                      []<class T>(T g, T x) -> T { return x > T(0) ? g : (x < T(0) ? -g : T(0)); });
}
Status leakyReluBackwardKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                               std::span<Tensor> out) {
  const double alpha = attrs.getFloat("alpha");
  return binaryKernel(kFloat, attrs, in, out,
                      [&]<class T>(T g, T x) -> T { return x > T(0) ? g : g * T(alpha); });
}
Status clipBackwardKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                          std::span<Tensor> out) {
  const double lo = attrs.getFloat("min"), hi = attrs.getFloat("max");
  return binaryKernel(kFloat, attrs, in, out,
                      [&]<class T>(T g, T x) -> T { return T(lo) <= x && x <= T(hi) ? g : T(0); });
}
Status geluBackwardKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                          std::span<Tensor> out) {
  if (attrs.getString("approximate") == "tanh") {
    return binaryKernel(kFloat, attrs, in, out, []<class T>(T g, T x) -> T {
      const T k = std::numbers::sqrt2_v<T> * std::numbers::inv_sqrtpi_v<T>;
      const T t = std::tanh(k * (x + T(0.044715) * x * x * x));
      const T dinner = k * (T(1) + T(3 * 0.044715) * x * x);
      return g * (T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * dinner);
    });
  }
  return binaryKernel(kFloat, attrs, in, out, []<class T>(T g, T x) -> T {
    // Phi(x) + x phi(x).
    const T cdf = T(0.5) * std::erfc(-x / std::numbers::sqrt2_v<T>);
    const T pdf =
        std::exp(T(-0.5) * x * x) * std::numbers::inv_sqrtpi_v<T> / std::numbers::sqrt2_v<T>;
    return g * (cdf + x * pdf);
  });
}

// maximum_backward(grad, a, b) and minimum_backward: grad where a wins, half where it ties.
template <bool Max>
Status extremumBackwardKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                              std::span<Tensor> out) {
  return ref::dispatchFloat(ref::opNameOf(attrs), out[0].dtype(), [&]<class T>(Tag<T>) {
    const T* g = in[0].data<T>();
    const T* a = in[1].data<T>();
    const T* b = in[2].data<T>();
    T* y = out[0].data<T>();
    const ir::Shape& shape = out[0].shape();
    ref::forEachStrided<3>(
        shape,
        {ref::broadcastStrides(in[0].shape(), shape), ref::broadcastStrides(in[1].shape(), shape),
         ref::broadcastStrides(in[2].shape(), shape)},
        {0, 0, 0}, [&](int64_t i, const std::array<int64_t, 3>& off) {
          const T av = a[off[1]], bv = b[off[2]];
          const bool wins = Max ? av > bv : av < bv;
          y[i] = wins ? g[off[0]] : (av == bv ? g[off[0]] / T(2) : T(0));
        });
    return Status::ok();
  });
}

// ---- Training-mode dropout: a counter-based mask, the same for every executor (ir/dropout.h).
// Elements [lo, hi) of f32 dropout (the training hot path; the hash's 64-bit multiplies
// vectorize on AVX-512 and AVX2).
KILN_CPU_CLONES void dropoutRangeF32(const float* x, float* y, int64_t lo, int64_t hi,
                                     uint64_t base, uint64_t offset, uint64_t threshold,
                                     float scale) {
  for (int64_t i = lo; i < hi; ++i) {
    const uint64_t r = ir::dropout::bits(base, offset, static_cast<uint64_t>(i));
    y[i] = r >= threshold ? x[i] * scale : 0.f;
  }
}

// out = in * mask / (1 - ratio), where element i is kept when its hash is at least `ratio`.
Status dropoutMaskKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                         std::span<Tensor> out) {
  const double ratio = attrs.getFloat("ratio");
  const uint64_t seed = static_cast<uint64_t>(attrs.getInt("seed"));
  const uint64_t offset = static_cast<uint64_t>(attrs.getInt("offset"));
  const uint64_t step = static_cast<uint64_t>(in[1].data<int64_t>()[0]);
  const uint64_t base = ir::dropout::base(seed, step);
  const uint64_t threshold = ir::dropout::threshold(ratio);
  return ref::dispatchFloat(ref::opNameOf(attrs), in[0].dtype(), [&]<class T>(Tag<T>) {
    const T* x = in[0].data<T>();
    T* y = out[0].data<T>();
    const T scale = T(1) / T(1 - ratio);
    const int64_t n = in[0].numElements();
    // Each element's mask bit depends on its index only, so threads split the work freely.
    if constexpr (std::is_same_v<T, float>) {
      constexpr int64_t kChunk = 1 << 14;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (int64_t lo = 0; lo < n; lo += kChunk)
        dropoutRangeF32(x, y, lo, std::min(n, lo + kChunk), base, offset, threshold, scale);
    } else {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t r = ir::dropout::bits(base, offset, static_cast<uint64_t>(i));
        y[i] = r >= threshold ? x[i] * scale : T(0);
      }
    }
    return Status::ok();
  });
}

}  // namespace

void registerPointwiseKernels(RefKernelTable& t) {
  using ir::OpKind;
  ref::setKernel(t, OpKind::kNeg, negKernel);
  ref::setKernel(t, OpKind::kAbs, absKernel);
  ref::setKernel(t, OpKind::kRelu, reluKernel);
  ref::setKernel(t, OpKind::kLeakyRelu, leakyReluKernel);
  ref::setKernel(t, OpKind::kSigmoid, sigmoidKernel);
  ref::setKernel(t, OpKind::kTanh, tanhKernel);
  ref::setKernel(t, OpKind::kGelu, geluKernel);
  ref::setKernel(t, OpKind::kSilu, siluKernel);
  ref::setKernel(t, OpKind::kMish, mishKernel);
  ref::setKernel(t, OpKind::kFloor, floorKernel);
  ref::setKernel(t, OpKind::kCeil, ceilKernel);
  ref::setKernel(t, OpKind::kRound, roundKernel);
  ref::setKernel(t, OpKind::kSign, signKernel);
  ref::setKernel(t, OpKind::kErf, erfKernel);
  ref::setKernel(t, OpKind::kSin, sinKernel);
  ref::setKernel(t, OpKind::kCos, cosKernel);
  ref::setKernel(t, OpKind::kTan, tanKernel);
  ref::setKernel(t, OpKind::kAsin, asinKernel);
  ref::setKernel(t, OpKind::kAcos, acosKernel);
  ref::setKernel(t, OpKind::kAtan, atanKernel);
  ref::setKernel(t, OpKind::kSinh, sinhKernel);
  ref::setKernel(t, OpKind::kCosh, coshKernel);
  ref::setKernel(t, OpKind::kAsinh, asinhKernel);
  ref::setKernel(t, OpKind::kAcosh, acoshKernel);
  ref::setKernel(t, OpKind::kAtanh, atanhKernel);
  ref::setKernel(t, OpKind::kSoftplus, softplusKernel);
  ref::setKernel(t, OpKind::kElu, eluKernel);
  ref::setKernel(t, OpKind::kSelu, seluKernel);
  ref::setKernel(t, OpKind::kCelu, celuKernel);
  ref::setKernel(t, OpKind::kThresholdedRelu, thresholdedReluKernel);
  ref::setKernel(t, OpKind::kExp, expKernel);
  ref::setKernel(t, OpKind::kLog, logKernel);
  ref::setKernel(t, OpKind::kSqrt, sqrtKernel);
  ref::setKernel(t, OpKind::kRsqrt, rsqrtKernel);
  ref::setKernel(t, OpKind::kClip, clipKernel);
  ref::setKernel(t, OpKind::kCast, castKernel);
  ref::setKernel(t, OpKind::kDropout, ref::identityKernel);  // Inference mode.
  ref::setKernel(t, OpKind::kAdd, addKernel);
  ref::setKernel(t, OpKind::kSub, subKernel);
  ref::setKernel(t, OpKind::kMul, mulKernel);
  ref::setKernel(t, OpKind::kDiv, divKernel);
  ref::setKernel(t, OpKind::kPow, powKernel);
  ref::setKernel(t, OpKind::kMaximum, maximumKernel);
  ref::setKernel(t, OpKind::kMinimum, minimumKernel);
  ref::setKernel(t, OpKind::kWhere, whereKernel);
  ref::setKernel(t, OpKind::kMod, modKernel);
  ref::setKernel(t, OpKind::kBitShift, bitShiftKernel);
  ref::setKernel(t, OpKind::kBitwiseAnd, bitwiseAndKernel);
  ref::setKernel(t, OpKind::kBitwiseOr, bitwiseOrKernel);
  ref::setKernel(t, OpKind::kBitwiseXor, bitwiseXorKernel);
  ref::setKernel(t, OpKind::kBitwiseNot, bitwiseNotKernel);
  ref::setKernel(t, OpKind::kEqual, equalKernel);
  ref::setKernel(t, OpKind::kLess, lessKernel);
  ref::setKernel(t, OpKind::kLessEqual, lessEqualKernel);
  ref::setKernel(t, OpKind::kGreater, greaterKernel);
  ref::setKernel(t, OpKind::kGreaterEqual, greaterEqualKernel);
  ref::setKernel(t, OpKind::kLogicalAnd, logicalAndKernel);
  ref::setKernel(t, OpKind::kLogicalOr, logicalOrKernel);
  ref::setKernel(t, OpKind::kLogicalXor, logicalXorKernel);
  ref::setKernel(t, OpKind::kLogicalNot, logicalNotKernel);
  ref::setKernel(t, OpKind::kReluBackward, reluBackwardKernel);
  ref::setKernel(t, OpKind::kAbsBackward, absBackwardKernel);
  ref::setKernel(t, OpKind::kLeakyReluBackward, leakyReluBackwardKernel);
  ref::setKernel(t, OpKind::kClipBackward, clipBackwardKernel);
  ref::setKernel(t, OpKind::kGeluBackward, geluBackwardKernel);
  ref::setKernel(t, OpKind::kMaximumBackward, extremumBackwardKernel<true>);
  ref::setKernel(t, OpKind::kMinimumBackward, extremumBackwardKernel<false>);
  ref::setKernel(t, OpKind::kDropoutTrain, dropoutMaskKernel);
  ref::setKernel(t, OpKind::kDropoutBackward, dropoutMaskKernel);
}

}  // namespace kiln::runtime
