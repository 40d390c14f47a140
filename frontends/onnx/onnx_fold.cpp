#include "frontends/onnx/onnx_fold.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ir/narrow.h"

namespace kiln::frontends::onnx_import {

using ir::DType;
using ir::OpKind;
using ir::Shape;
using ir::TensorData;

bool foldableDType(DType dtype) {
  // Integers through int64: u64 values need not fit. The narrow storage dtypes are cast by the
  // reference kernel alone (ir/narrow.h).
  return dtype != DType::kF16 && dtype != DType::kBF16 && dtype != DType::kU64 &&
         !ir::isNarrow(dtype);
}

int64_t elementAsInt(const TensorData& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kI64:
      return t.as<int64_t>()[i];
    case DType::kI32:
      return t.as<int32_t>()[i];
    case DType::kI8:
      return t.as<int8_t>()[i];
    case DType::kI16:
      return t.as<int16_t>()[i];
    case DType::kU16:
      return t.as<uint16_t>()[i];
    case DType::kU32:
      return t.as<uint32_t>()[i];
    case DType::kU8:
    case DType::kBool:
      return t.as<uint8_t>()[i];
    case DType::kU64: {  // Saturating above int64's range.
      const uint64_t v = t.as<uint64_t>()[i];
      return v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
                 ? std::numeric_limits<int64_t>::max()
                 : static_cast<int64_t>(v);
    }
    default: {
      const double d = elementAsDouble(t, i);
      // Truncation toward zero, saturating where a C++ conversion would be undefined.
      if (std::isnan(d)) return 0;
      if (d >= 9.2233720368547758e18) return std::numeric_limits<int64_t>::max();
      if (d <= -9.2233720368547758e18) return std::numeric_limits<int64_t>::min();
      return static_cast<int64_t>(d);
    }
  }
}

double elementAsDouble(const TensorData& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kF32:
      return t.as<float>()[i];
    case DType::kF64:
      return t.as<double>()[i];
    case DType::kBF16: {
      const uint32_t bits = uint32_t{t.as<uint16_t>()[i]} << 16;
      float f;
      std::memcpy(&f, &bits, sizeof f);
      return f;
    }
    case DType::kF16: {
      const uint16_t h = t.as<uint16_t>()[i];
      const int exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
      const double sign = (h & 0x8000) ? -1.0 : 1.0;
      if (exp == 0) return sign * std::ldexp(frac, -24);  // Zero and subnormals.
      if (exp == 31) return frac ? NAN : sign * INFINITY;
      return sign * std::ldexp(1024 + frac, exp - 25);
    }
    case DType::kU64:
      return static_cast<double>(t.as<uint64_t>()[i]);
    default:
      return static_cast<double>(elementAsInt(t, i));
  }
}

namespace {

template <class T>
T saturate(int64_t v) {
  return static_cast<T>(
      std::clamp<int64_t>(v, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
}

void setInt(TensorData& t, int64_t i, int64_t v) {
  switch (t.dtype()) {
    case DType::kI64:
      t.as<int64_t>()[i] = v;
      break;
    case DType::kI32:
      t.as<int32_t>()[i] = static_cast<int32_t>(v);  // Wraps, as a C++ cast does.
      break;
    case DType::kI8:
      t.as<int8_t>()[i] = static_cast<int8_t>(v);
      break;
    case DType::kU8:
      t.as<uint8_t>()[i] = static_cast<uint8_t>(v);
      break;
    case DType::kI16:
      t.as<int16_t>()[i] = static_cast<int16_t>(v);
      break;
    case DType::kU16:
      t.as<uint16_t>()[i] = static_cast<uint16_t>(v);
      break;
    case DType::kU32:
      t.as<uint32_t>()[i] = static_cast<uint32_t>(v);
      break;
    case DType::kBool:
      t.as<uint8_t>()[i] = v != 0;
      break;
    case DType::kF32:
      t.as<float>()[i] = static_cast<float>(v);
      break;
    case DType::kF64:
      t.as<double>()[i] = static_cast<double>(v);
      break;
    default:
      break;
  }
}

void setDouble(TensorData& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::kF32:
      t.as<float>()[i] = static_cast<float>(v);
      break;
    case DType::kF64:
      t.as<double>()[i] = v;
      break;
    case DType::kBool:
      t.as<uint8_t>()[i] = v != 0;
      break;
    default: {
      int64_t n = 0;
      if (std::isnan(v))
        n = 0;
      else if (v >= 9.2233720368547758e18)
        n = std::numeric_limits<int64_t>::max();
      else if (v <= -9.2233720368547758e18)
        n = std::numeric_limits<int64_t>::min();
      else
        n = static_cast<int64_t>(v);
      if (t.dtype() == DType::kI32) n = saturate<int32_t>(n);
      if (t.dtype() == DType::kI8) n = saturate<int8_t>(n);
      if (t.dtype() == DType::kU8) n = saturate<uint8_t>(n);
      if (t.dtype() == DType::kI16) n = saturate<int16_t>(n);
      if (t.dtype() == DType::kU16) n = saturate<uint16_t>(n);
      if (t.dtype() == DType::kU32) n = saturate<uint32_t>(n);
      setInt(t, i, n);
    }
  }
}

// For each element of `out`, the linear index of the element of `in` that NumPy broadcasting
// reads (in's shape broadcasts to out's).
std::vector<int64_t> broadcastSource(const Shape& out, const Shape& in) {
  const int64_t n = ir::numElements(out);
  std::vector<int64_t> src(static_cast<size_t>(n), 0);
  const size_t rank = out.size(), offset = rank - in.size();
  const std::vector<int64_t> inStrides = ir::contiguousStrides(in);
  std::vector<int64_t> idx(rank, 0);
  for (int64_t k = 0; k < n; ++k) {
    int64_t s = 0;
    for (size_t d = offset; d < rank; ++d)
      if (in[d - offset] != 1) s += idx[d] * inStrides[d - offset];
    src[static_cast<size_t>(k)] = s;
    for (size_t d = rank; d-- > 0;) {
      if (++idx[d] < out[d]) break;
      idx[d] = 0;
    }
  }
  return src;
}

void copyElement(const TensorData& from, int64_t i, TensorData& to, int64_t j) {
  const size_t es = ir::dtypeSize(from.dtype());
  std::memcpy(to.data() + static_cast<size_t>(j) * es, from.data() + static_cast<size_t>(i) * es,
              es);
}

Status checkSize(const ir::TensorType& t) {
  // Shape inference has bounded the byte size to 64 bits; folding is bounded further.
  int64_t n = 1;
  for (int64_t d : t.shape)
    if (__builtin_mul_overflow(n, d, &n) || n > kMaxFoldElements)
      return unimplemented("the constant result " + t.toString() + " is too large to fold");
  return Status::ok();
}

// Output element -> input element for the movement ops.
Status moveElements(OpKind op, std::span<const TensorData* const> in, const ir::AttrMap& attrs,
                    TensorData& out) {
  const ir::AttrView a(ir::opInfo(op), attrs);
  const Shape& x = in[0]->shape();
  const Shape& y = out.shape();
  const int64_t n = out.numElements();
  switch (op) {
    case OpKind::kReshape:
    case OpKind::kFlatten:
    case OpKind::kSqueeze:
    case OpKind::kUnsqueeze:
      if (n) std::memcpy(out.data(), in[0]->data(), out.byteSize());
      return Status::ok();
    case OpKind::kExpand: {
      const auto src = broadcastSource(y, x);
      for (int64_t k = 0; k < n; ++k) copyElement(*in[0], src[static_cast<size_t>(k)], out, k);
      return Status::ok();
    }
    case OpKind::kTranspose: {
      std::vector<int64_t> perm = a.getInts("perm");
      if (perm.empty())
        for (size_t i = x.size(); i-- > 0;) perm.push_back(static_cast<int64_t>(i));
      const auto xs = ir::contiguousStrides(x);
      std::vector<int64_t> idx(y.size(), 0);
      for (int64_t k = 0; k < n; ++k) {
        int64_t s = 0;
        for (size_t d = 0; d < y.size(); ++d) s += idx[d] * xs[static_cast<size_t>(perm[d])];
        copyElement(*in[0], s, out, k);
        for (size_t d = y.size(); d-- > 0;) {
          if (++idx[d] < y[d]) break;
          idx[d] = 0;
        }
      }
      return Status::ok();
    }
    case OpKind::kConcat: {
      const int axis =
          static_cast<int>(a.getInt("axis") < 0 ? a.getInt("axis") + y.size() : a.getInt("axis"));
      int64_t outer = 1, inner = 1;
      for (int d = 0; d < axis; ++d) outer *= y[d];
      for (size_t d = axis + 1; d < y.size(); ++d) inner *= y[d];
      int64_t k = 0;
      for (int64_t o = 0; o < outer; ++o)
        for (const TensorData* t : in) {
          const int64_t block = t->shape()[axis] * inner;
          for (int64_t e = 0; e < block; ++e) copyElement(*t, o * block + e, out, k++);
        }
      return Status::ok();
    }
    case OpKind::kSlice: {
      // Starts as shape inference clamps them; the output shape gives the counts.
      std::vector<int64_t> start(x.size(), 0), step(x.size(), 1);
      const auto& starts = a.getInts("starts");
      std::vector<int64_t> axes = a.getInts("axes");
      std::vector<int64_t> steps = a.getInts("steps");
      for (size_t i = 0; i < starts.size(); ++i) {
        const int64_t ax = axes.empty() ? static_cast<int64_t>(i) : axes[i];
        const size_t d = static_cast<size_t>(ax < 0 ? ax + static_cast<int64_t>(x.size()) : ax);
        const int64_t st = steps.empty() ? 1 : steps[i];
        int64_t s = starts[i] < 0 ? starts[i] + x[d] : starts[i];
        s = st > 0 ? std::clamp<int64_t>(s, 0, x[d]) : std::clamp<int64_t>(s, 0, x[d] - 1);
        start[d] = s;
        step[d] = st;
      }
      const auto xs = ir::contiguousStrides(x);
      std::vector<int64_t> idx(y.size(), 0);
      for (int64_t k = 0; k < n; ++k) {
        int64_t s = 0;
        for (size_t d = 0; d < y.size(); ++d) s += (start[d] + idx[d] * step[d]) * xs[d];
        copyElement(*in[0], s, out, k);
        for (size_t d = y.size(); d-- > 0;) {
          if (++idx[d] < y[d]) break;
          idx[d] = 0;
        }
      }
      return Status::ok();
    }
    case OpKind::kGather: {
      const int64_t axis = a.getInt("axis") < 0 ? a.getInt("axis") + static_cast<int64_t>(x.size())
                                                : a.getInt("axis");
      int64_t outer = 1, inner = 1;
      for (int64_t d = 0; d < axis; ++d) outer *= x[d];
      for (size_t d = axis + 1; d < x.size(); ++d) inner *= x[d];
      const int64_t dim = x[axis];
      const int64_t numIdx = in[1]->numElements();
      int64_t k = 0;
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t j = 0; j < numIdx; ++j) {
          int64_t i = elementAsInt(*in[1], j);
          if (i < -dim || i >= dim)
            return invalidArgument("gather index " + std::to_string(i) +
                                   " is out of range for a dim of " + std::to_string(dim));
          if (i < 0) i += dim;
          for (int64_t e = 0; e < inner; ++e)
            copyElement(*in[0], (o * dim + i) * inner + e, out, k++);
        }
      return Status::ok();
    }
    default:
      return unimplemented("cannot evaluate " + std::string(ir::opName(op)) + " at import");
  }
}

Expected<double> binaryDouble(OpKind op, double x, double y) {
  switch (op) {
    case OpKind::kAdd:
      return x + y;
    case OpKind::kSub:
      return x - y;
    case OpKind::kMul:
      return x * y;
    case OpKind::kDiv:
      return x / y;
    case OpKind::kMaximum:
      return std::isnan(x) || std::isnan(y) ? std::nan("") : std::max(x, y);
    case OpKind::kMinimum:
      return std::isnan(x) || std::isnan(y) ? std::nan("") : std::min(x, y);
    case OpKind::kPow:
      return std::pow(x, y);
    default:
      return unimplemented("cannot evaluate " + std::string(ir::opName(op)) + " at import");
  }
}

Expected<int64_t> binaryInt(OpKind op, int64_t x, int64_t y) {
  int64_t r = 0;
  switch (op) {
    case OpKind::kAdd:
      if (__builtin_add_overflow(x, y, &r)) break;
      return r;
    case OpKind::kSub:
      if (__builtin_sub_overflow(x, y, &r)) break;
      return r;
    case OpKind::kMul:
      if (__builtin_mul_overflow(x, y, &r)) break;
      return r;
    case OpKind::kDiv:
      if (y == 0) return invalidArgument("integer division by zero in a constant expression");
      if (x == std::numeric_limits<int64_t>::min() && y == -1) break;
      return x / y;
    case OpKind::kMaximum:
      return std::max(x, y);
    case OpKind::kMinimum:
      return std::min(x, y);
    default:
      return unimplemented("cannot evaluate " + std::string(ir::opName(op)) + " on integers");
  }
  return invalidArgument("integer overflow in a constant expression (" + std::to_string(x) + " " +
                         std::string(ir::opName(op)) + " " + std::to_string(y) + ")");
}

Status computeElements(OpKind op, std::span<const TensorData* const> in, TensorData& out) {
  for (const TensorData* t : in)
    if (!foldableDType(t->dtype()))
      return unimplemented("cannot evaluate " + std::string(ir::dtypeName(t->dtype())) +
                           " arithmetic at import");
  // Nor write them (a Cast to f16 of a constant runs at run time).
  if (!foldableDType(out.dtype()))
    return unimplemented("cannot evaluate " + std::string(ir::dtypeName(out.dtype())) +
                         " results at import");
  const int64_t n = out.numElements();
  const bool floatOut = ir::isFloat(out.dtype());
  switch (op) {
    case OpKind::kNeg:
    case OpKind::kAbs:
      for (int64_t k = 0; k < n; ++k) {
        if (floatOut) {
          const double v = elementAsDouble(*in[0], k);
          setDouble(out, k, op == OpKind::kNeg ? -v : std::fabs(v));
        } else {
          const int64_t v = elementAsInt(*in[0], k);
          if (v == std::numeric_limits<int64_t>::min())
            return invalidArgument("integer overflow in a constant expression");
          setInt(out, k, op == OpKind::kNeg ? -v : (v < 0 ? -v : v));
        }
      }
      return Status::ok();
    case OpKind::kCeil:
    case OpKind::kFloor:
    case OpKind::kRound:
    case OpKind::kRelu:
      // Exact in double: the runtime ops' results (Round: halves to even, the default rounding
      // mode's nearbyint; Relu keeps NaN and -0 as the reference's x < 0 ? 0 : x).
      for (int64_t k = 0; k < n; ++k) {
        if (!floatOut) {
          const int64_t v = elementAsInt(*in[0], k);
          setInt(out, k, op == OpKind::kRelu && v < 0 ? 0 : v);
          continue;
        }
        const double v = elementAsDouble(*in[0], k);
        setDouble(out, k,
                  op == OpKind::kCeil    ? std::ceil(v)
                  : op == OpKind::kFloor ? std::floor(v)
                  : op == OpKind::kRound ? std::nearbyint(v)
                                         : (v < 0 ? 0.0 : v));
      }
      return Status::ok();
    case OpKind::kCast:
      for (int64_t k = 0; k < n; ++k) {
        if (ir::isFloat(in[0]->dtype()))
          setDouble(out, k, elementAsDouble(*in[0], k));
        else
          setInt(out, k, elementAsInt(*in[0], k));
      }
      return Status::ok();
    case OpKind::kWhere: {
      const auto c = broadcastSource(out.shape(), in[0]->shape());
      const auto x = broadcastSource(out.shape(), in[1]->shape());
      const auto y = broadcastSource(out.shape(), in[2]->shape());
      for (int64_t k = 0; k < n; ++k) {
        const size_t kk = static_cast<size_t>(k);
        if (elementAsInt(*in[0], c[kk]))
          copyElement(*in[1], x[kk], out, k);
        else
          copyElement(*in[2], y[kk], out, k);
      }
      return Status::ok();
    }
    case OpKind::kAdd:
    case OpKind::kSub:
    case OpKind::kMul:
    case OpKind::kDiv:
    case OpKind::kMaximum:
    case OpKind::kMinimum:
    case OpKind::kPow: {
      const auto x = broadcastSource(out.shape(), in[0]->shape());
      const auto y = broadcastSource(out.shape(), in[1]->shape());
      for (int64_t k = 0; k < n; ++k) {
        const size_t kk = static_cast<size_t>(k);
        if (floatOut) {
          KILN_ASSIGN_OR_RETURN(double v, binaryDouble(op, elementAsDouble(*in[0], x[kk]),
                                                       elementAsDouble(*in[1], y[kk])));
          setDouble(out, k, v);
        } else {
          KILN_ASSIGN_OR_RETURN(
              int64_t v, binaryInt(op, elementAsInt(*in[0], x[kk]), elementAsInt(*in[1], y[kk])));
          setInt(out, k, v);
        }
      }
      return Status::ok();
    }
    default:
      return unimplemented("cannot evaluate " + std::string(ir::opName(op)) + " at import");
  }
}

template <class T>
bool compareValues(Compare op, T p, T q) {
  switch (op) {
    case Compare::kEqual:
      return p == q;
    case Compare::kLess:
      return p < q;
    case Compare::kGreater:
      return p > q;
    case Compare::kLessOrEqual:
      return p <= q;
    case Compare::kGreaterOrEqual:
      return p >= q;
    case Compare::kAnd:
      return p != 0 && q != 0;
    case Compare::kOr:
      return p != 0 || q != 0;
    case Compare::kXor:
      return (p != 0) != (q != 0);
  }
  return false;
}

}  // namespace

Expected<std::vector<int64_t>> toInts(const TensorData& t, const std::string& what) {
  if (!ir::isInteger(t.dtype()))
    return invalidArgument(what + " must be an integer tensor, got " + t.type().toString());
  std::vector<int64_t> v(static_cast<size_t>(t.numElements()));
  for (int64_t i = 0; i < t.numElements(); ++i) v[static_cast<size_t>(i)] = elementAsInt(t, i);
  return v;
}

Expected<double> toScalar(const TensorData& t, const std::string& what) {
  if (t.numElements() != 1)
    return invalidArgument(what + " must hold one value, got " + t.type().toString());
  if (!foldableDType(t.dtype()))
    return unimplemented(what + " has dtype " + std::string(ir::dtypeName(t.dtype())) +
                         ", which the importer cannot read as a number");
  return elementAsDouble(t, 0);
}

TensorData intTensor(const std::vector<int64_t>& values, Shape shape) {
  TensorData t(DType::kI64, std::move(shape));
  if (!values.empty()) std::memcpy(t.data(), values.data(), values.size() * sizeof(int64_t));
  return t;
}

TensorData int1d(const std::vector<int64_t>& values) {
  return intTensor(values, {static_cast<int64_t>(values.size())});
}

TensorData filledTensor(DType dtype, const Shape& shape, double value) {
  TensorData t(dtype, shape);
  for (int64_t k = 0; k < t.numElements(); ++k) setDouble(t, k, value);
  return t;
}

TensorData withShape(const TensorData& t, Shape shape) {
  TensorData out(t.dtype(), std::move(shape));
  if (out.byteSize()) std::memcpy(out.data(), t.data(), out.byteSize());
  return out;
}

Expected<TensorData> evaluateOp(OpKind op, std::span<const TensorData* const> inputs,
                                const ir::AttrMap& attrs) {
  std::vector<ir::TensorType> types;
  for (const TensorData* t : inputs) types.push_back(t->type());
  KILN_ASSIGN_OR_RETURN(auto outTypes, ir::inferTypes(op, types, attrs));
  KILN_TRY(checkSize(outTypes[0]));
  TensorData out(outTypes[0].dtype, outTypes[0].shape);
  if (ir::hasTrait(op, ir::kMovement))
    KILN_TRY(moveElements(op, inputs, attrs, out));
  else
    KILN_TRY(computeElements(op, inputs, out));
  return out;
}

Expected<TensorData> evaluateCompare(Compare op, const TensorData& a, const TensorData& b) {
  if (a.dtype() != b.dtype())
    return invalidArgument("operands have different dtypes: " + a.type().toString() + " and " +
                           b.type().toString());
  if (!foldableDType(a.dtype()))
    return unimplemented("cannot compare " + std::string(ir::dtypeName(a.dtype())) +
                         " values at import");
  KILN_ASSIGN_OR_RETURN(Shape shape, ir::broadcastShapes(a.shape(), b.shape()));
  KILN_TRY(checkSize({DType::kBool, shape}));
  TensorData out(DType::kBool, shape);
  const auto x = broadcastSource(shape, a.shape());
  const auto y = broadcastSource(shape, b.shape());
  const bool fl = ir::isFloat(a.dtype());
  for (int64_t k = 0; k < out.numElements(); ++k) {
    const size_t kk = static_cast<size_t>(k);
    const bool r = fl ? compareValues(op, elementAsDouble(a, x[kk]), elementAsDouble(b, y[kk]))
                      : compareValues(op, elementAsInt(a, x[kk]), elementAsInt(b, y[kk]));
    out.as<uint8_t>()[k] = r;
  }
  return out;
}

Expected<TensorData> evaluateNot(const TensorData& a) {
  if (a.dtype() != DType::kBool)
    return invalidArgument("Not takes a bool tensor, got " + a.type().toString());
  TensorData out(DType::kBool, a.shape());
  for (int64_t k = 0; k < a.numElements(); ++k) out.as<uint8_t>()[k] = !a.as<uint8_t>()[k];
  return out;
}

Expected<TensorData> evaluateReduce(Reduce op, const TensorData& x,
                                    const std::vector<int64_t>& axes, bool keepdims) {
  const DType dt = x.dtype();
  const bool fl = ir::isFloat(dt);
  if (!foldableDType(dt) || dt == DType::kBool || (op == Reduce::kMean && !fl) ||
      x.numElements() == 0)
    return unimplemented("this reduction is not evaluated at import");
  const int rank = static_cast<int>(x.shape().size());
  std::vector<bool> reduced(static_cast<size_t>(rank), axes.empty());
  for (int64_t a : axes) {
    KILN_ASSIGN_OR_RETURN(int d, ir::normalizeAxis(a, static_cast<size_t>(rank), "axes"));
    reduced[static_cast<size_t>(d)] = true;
  }
  Shape shape;
  std::vector<int64_t> stride(static_cast<size_t>(rank), 0);  // Of each input dim in the output.
  int64_t outer = 1;
  for (int d = rank; d-- > 0;) {
    if (reduced[static_cast<size_t>(d)]) continue;
    stride[static_cast<size_t>(d)] = outer;
    outer *= x.shape()[static_cast<size_t>(d)];
  }
  for (int d = 0; d < rank; ++d) {
    if (!reduced[static_cast<size_t>(d)])
      shape.push_back(x.shape()[static_cast<size_t>(d)]);
    else if (keepdims)
      shape.push_back(1);
  }
  TensorData out(dt, shape);
  const int64_t m = out.numElements();
  std::vector<double> accD(static_cast<size_t>(m));
  std::vector<int64_t> accI(static_cast<size_t>(m));
  std::vector<bool> seen(static_cast<size_t>(m), false);
  std::vector<int64_t> coord(static_cast<size_t>(rank), 0);
  for (int64_t k = 0; k < x.numElements(); ++k) {
    int64_t o = 0;
    for (int d = 0; d < rank; ++d)
      o += coord[static_cast<size_t>(d)] * stride[static_cast<size_t>(d)];
    const size_t oo = static_cast<size_t>(o);
    if (fl) {
      const double v = elementAsDouble(x, k);
      if (std::isnan(v)) return unimplemented("a NaN in a reduction at import");
      double& a = accD[oo];
      if (!seen[oo])
        a = v;
      else if (op == Reduce::kSum || op == Reduce::kMean)
        a += v;
      else if (op == Reduce::kProd)
        a *= v;
      else
        a = op == Reduce::kMax ? std::max(a, v) : std::min(a, v);
    } else {
      const int64_t v = elementAsInt(x, k);
      int64_t& a = accI[oo];
      if (!seen[oo]) {
        a = v;
      } else if (op == Reduce::kSum || op == Reduce::kProd) {
        const bool overflow = op == Reduce::kSum ? __builtin_add_overflow(a, v, &a)
                                                 : __builtin_mul_overflow(a, v, &a);
        if (overflow) return unimplemented("integer overflow in a reduction at import");
      } else {
        a = op == Reduce::kMax ? std::max(a, v) : std::min(a, v);
      }
    }
    seen[oo] = true;
    for (int d = rank; d-- > 0;) {  // The next coordinate, the last dim fastest.
      if (++coord[static_cast<size_t>(d)] < x.shape()[static_cast<size_t>(d)]) break;
      coord[static_cast<size_t>(d)] = 0;
    }
  }
  const double count = static_cast<double>(x.numElements() / std::max<int64_t>(m, 1));
  for (int64_t o = 0; o < m; ++o) {
    const size_t oo = static_cast<size_t>(o);
    if (!fl) {
      setInt(out, o, accI[oo]);
      if (elementAsInt(out, o) != accI[oo])
        return unimplemented("a reduction's result beyond its dtype at import");
      continue;
    }
    setDouble(out, o, op == Reduce::kMean ? accD[oo] / count : accD[oo]);
  }
  return out;
}

Expected<TensorData> evaluateMod(const TensorData& a, const TensorData& b, bool fmod) {
  if (a.dtype() != b.dtype())
    return invalidArgument("operands have different dtypes: " + a.type().toString() + " and " +
                           b.type().toString());
  if (!foldableDType(a.dtype()) || a.dtype() == DType::kBool)
    return unimplemented("cannot evaluate Mod of " + std::string(ir::dtypeName(a.dtype())) +
                         " values at import");
  const bool fl = ir::isFloat(a.dtype());
  if (fl && !fmod)
    return invalidArgument("Mod of floating-point operands needs fmod=1 (the ONNX spec)");
  KILN_ASSIGN_OR_RETURN(Shape shape, ir::broadcastShapes(a.shape(), b.shape()));
  KILN_TRY(checkSize({a.dtype(), shape}));
  TensorData out(a.dtype(), shape);
  const auto x = broadcastSource(shape, a.shape());
  const auto y = broadcastSource(shape, b.shape());
  for (int64_t k = 0; k < out.numElements(); ++k) {
    const size_t kk = static_cast<size_t>(k);
    if (fl) {
      setDouble(out, k, std::fmod(elementAsDouble(a, x[kk]), elementAsDouble(b, y[kk])));
      continue;
    }
    const int64_t p = elementAsInt(a, x[kk]), q = elementAsInt(b, y[kk]);
    if (q == 0) return invalidArgument("Mod by zero (element " + std::to_string(k) + ")");
    // fmod=1: the sign of the dividend, as C's %; fmod=0: the sign of the divisor, as Python's.
    int64_t r = q == -1 ? 0 : p % q;
    if (!fmod && r != 0 && ((r < 0) != (q < 0))) r += q;
    setInt(out, k, r);
  }
  return out;
}

}  // namespace kiln::frontends::onnx_import
