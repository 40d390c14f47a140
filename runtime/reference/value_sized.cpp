// Ops whose output size is given by their inputs' values (ops.def, "Outputs sized by their
// inputs' values"): their reference kernels, and valueSizedCount, the size a run in stages
// takes from the values before it imports the op.
#include <string>

#include "runtime/reference/helpers.h"
#include "runtime/reference/kernels.h"

namespace kiln::runtime {

namespace {

// Calls f(isNonZero) with isNonZero(i) telling whether element i of `x` is not zero, by value:
// NaN is not zero, -0 is (the sign bit of a float ignored).
template <class F>
Status withNonZeroTest(const Tensor& x, F&& f) {
  const ir::DType t = x.dtype();
  const bool isFloat = ir::isFloat(t);
  if (t != ir::DType::kF16 && t != ir::DType::kBF16 && t != ir::DType::kBool &&
      t != ir::DType::kF32 && t != ir::DType::kF64 && !ir::isInteger(t))
    return ref::unsupportedDType("nonzero", t);
  return ref::dispatchBySize(t, [&]<class U>(ref::Tag<U>) {
    const U mask = isFloat ? static_cast<U>(~(U{1} << (8 * sizeof(U) - 1))) : static_cast<U>(~U{0});
    const U* bits = reinterpret_cast<const U*>(x.rawData());
    return f([bits, mask](int64_t i) { return (bits[i] & mask) != 0; });
  });
}

Expected<int64_t> countNonZero(const Tensor& x) {
  int64_t count = 0;
  KILN_TRY(withNonZeroTest(x, [&](auto nonZero) {
    const int64_t n = x.numElements();
    for (int64_t i = 0; i < n; ++i) count += nonZero(i) ? 1 : 0;
    return Status::ok();
  }));
  return count;
}

// nonzero: the coordinates of each non-zero element, in row-major order, as the columns of
// [rank, count] (a scalar's coordinate 0).
Status nonZeroKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  const Tensor& x = in[0];
  const int64_t count = attrs.getInt("count");
  KILN_ASSIGN_OR_RETURN(const int64_t actual, countNonZero(x));
  if (actual != count)
    return internalError("nonzero: the graph was made for " + std::to_string(count) +
                         " non-zero elements, its input " + x.describe() + " has " +
                         std::to_string(actual) + " (the stage was not imported for this input)");
  const ir::Shape& shape = x.shape();
  const size_t rank = shape.size();
  int64_t* y = out[0].data<int64_t>();
  return withNonZeroTest(x, [&](auto nonZero) {
    std::vector<int64_t> coord(rank, 0);
    const int64_t n = x.numElements();
    int64_t column = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (nonZero(i)) {
        if (rank == 0) y[column] = 0;
        for (size_t d = 0; d < rank; ++d) y[static_cast<int64_t>(d) * count + column] = coord[d];
        ++column;
      }
      for (size_t d = rank; d-- > 0;) {  // The next coordinate, the last dim fastest.
        if (++coord[d] < shape[d]) break;
        coord[d] = 0;
      }
    }
    return Status::ok();
  });
}

}  // namespace

Expected<int64_t> valueSizedCount(ir::OpKind op, const ir::AttrMap& attrs,
                                  std::span<const Tensor> inputs) {
  (void)attrs;
  switch (op) {
    case ir::OpKind::kNonZero:
      if (inputs.size() != 1) return invalidArgument("nonzero takes 1 input");
      return countNonZero(inputs[0]);
    default:
      break;
  }
  return invalidArgument(std::string(ir::opName(op)) + " has no output sized by its values");
}

void registerValueSizedKernels(RefKernelTable& t) {
  ref::setKernel(t, ir::OpKind::kNonZero, nonZeroKernel);
}

}  // namespace kiln::runtime
