#include "runtime/reference/kernels.h"

namespace kiln::runtime {

namespace {
const RefKernelTable& table() {
  static const RefKernelTable t = [] {
    RefKernelTable k{};
    registerPointwiseKernels(k);
    registerLinalgKernels(k);
    registerConvPoolKernels(k);
    registerNormKernels(k);
    registerReduceKernels(k);
    registerMovementKernels(k);
    registerLossKernels(k);
    return k;
  }();
  return t;
}
}  // namespace

RefKernel referenceKernel(ir::OpKind op) {
  return table()[static_cast<size_t>(op)];
}

Expected<std::vector<Tensor>> runReferenceOp(ir::OpKind op, std::vector<Tensor> inputs,
                                             const ir::AttrMap& attrs, Allocator* alloc) {
  std::vector<ir::TensorType> types;
  for (auto& t : inputs) {
    KILN_ASSIGN_OR_RETURN(t, t.contiguous(alloc));
    types.push_back(t.type());
  }
  KILN_ASSIGN_OR_RETURN(auto outTypes, ir::inferTypes(op, types, attrs));
  std::vector<Tensor> outputs;
  for (const auto& ot : outTypes) {
    KILN_ASSIGN_OR_RETURN(Tensor t, Tensor::empty(ot.dtype, ot.shape, alloc));
    outputs.push_back(std::move(t));
  }
  RefKernel k = referenceKernel(op);
  if (!k) return unimplemented("op '" + std::string(ir::opName(op)) + "' has no reference kernel");
  const ir::OpInfo& info = ir::opInfo(op);
  KILN_TRY(k(ir::AttrView(info, attrs), inputs, outputs));
  return outputs;
}

Expected<std::vector<ir::TensorData>> evaluateNode(const ir::Node& node,
                                                   std::span<const ir::TensorData> inputs) {
  std::vector<Tensor> ts;
  for (const auto& d : inputs) ts.push_back(Tensor::fromData(d));
  KILN_ASSIGN_OR_RETURN(auto outs, runReferenceOp(node.op(), ts, node.attrs()));
  std::vector<ir::TensorData> res;
  for (const auto& t : outs) res.push_back(t.toData());
  return res;
}

}  // namespace kiln::runtime
