#include "passes/graph_builder.h"

#include <algorithm>

namespace kiln::passes {

Expected<ir::Value*> GraphBuilder::op(ir::OpKind k, std::vector<ir::Value*> ins, ir::AttrMap a) {
  auto node = before_ ? g_.insertNode(before_, k, std::move(ins), std::move(a))
                      : g_.addNode(k, std::move(ins), std::move(a));
  if (!node) return context_.empty() ? node.status() : node.status().withContext(context_);
  if (origin_ && !origin_->name().empty()) (*node)->setName(origin_->name() + suffix_);
  return (*node)->output(0);
}

Expected<ir::Value*> GraphBuilder::scalar(ir::DType dtype, double v) {
  const bool half = dtype == ir::DType::kF16 || dtype == ir::DType::kBF16;
  KILN_ASSIGN_OR_RETURN(
      ir::Value * p,
      g_.addParameter(g_.freshName(), ir::TensorData::scalar(half ? ir::DType::kF32 : dtype, v),
                      /*trainable=*/false));
  if (!half) return p;
  // Rounded once by the cast (constant folding runs it on the reference kernels).
  return op(ir::OpKind::kCast, {p}, {{"to", std::string(ir::dtypeName(dtype))}});
}

Expected<ir::Value*> GraphBuilder::mulScalar(ir::Value* v, double s) {
  KILN_ASSIGN_OR_RETURN(ir::Value * c, scalar(v->type().dtype, s));
  return op(ir::OpKind::kMul, {v, c});
}

Expected<ir::Value*> GraphBuilder::axpy(ir::Value* a, double s, ir::Value* b) {
  KILN_ASSIGN_OR_RETURN(ir::Value * sb, mulScalar(b, s));
  return op(ir::OpKind::kAdd, {a, sb});
}

Expected<ir::Value*> GraphBuilder::reshape(ir::Value* v, const ir::Shape& shape) {
  if (v->type().shape == shape) return v;
  const bool zero = std::find(shape.begin(), shape.end(), 0) != shape.end();
  return op(ir::OpKind::kReshape, {v}, {{"shape", shape}, {"allowzero", int64_t{zero}}});
}

Expected<ir::Value*> GraphBuilder::row(ir::Value* pair, int64_t r) {
  KILN_ASSIGN_OR_RETURN(ir::Value * s, op(ir::OpKind::kSlice, {pair},
                                          {{"starts", std::vector<int64_t>{r}},
                                           {"ends", std::vector<int64_t>{r + 1}},
                                           {"axes", std::vector<int64_t>{0}}}));
  return reshape(s, {pair->type().shape[1]});
}

}  // namespace kiln::passes
