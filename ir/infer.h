// Shape and dtype inference functions named in ops.def (one family per infer_*.cpp file).
#pragma once

#include <span>
#include <vector>

#include "ir/op_table.h"

namespace kiln::ir {

#define KILN_OP(E, name, minIn, maxIn, nOut, traits, attrs, infer) \
  Expected<std::vector<TensorType>> infer(std::span<const TensorType> in, const AttrView& a);
#include "ir/ops.def"
#undef KILN_OP

// Shared helpers.
Status requireFloat(const TensorType& t, const char* what);
Status requireNumeric(const TensorType& t, const char* what);
Status requireRank(const TensorType& t, int rank, const char* what);
std::vector<TensorType> one(TensorType t);
// The largest pad kiln's pools take along a dim of window kernel (dilated by `dilation`, both
// >= 1): half the dilated window, as PyTorch's, so that no window lies wholly in the padding.
inline int64_t maxPoolPad(int64_t kernel, int64_t dilation) {
  const int64_t span = dilation * (kernel - 1);
  return span / 2 + (span & 1);  // (span + 1) / 2 without overflow.
}
// Output size of a sliding window along one dim (conv and pooling), or an error.
Expected<int64_t> windowOutputSize(int64_t in, int64_t kernel, int64_t stride, int64_t padBegin,
                                   int64_t padEnd, int64_t dilation, bool ceilMode,
                                   const char* dimName);

}  // namespace kiln::ir
