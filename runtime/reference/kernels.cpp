#include "runtime/reference/kernels.h"

#include "runtime/reference/helpers.h"

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
    registerValueSizedKernels(k);
    return k;
  }();
  return t;
}
}  // namespace

namespace {

bool isHalf(ir::DType t) {
  return t == ir::DType::kF16 || t == ir::DType::kBF16;
}

// f16/bf16 <-> f32, each value exact one way and rounded once (to nearest even) the other.
Expected<Tensor> widen(const Tensor& t) {
  KILN_ASSIGN_OR_RETURN(Tensor w, Tensor::empty(ir::DType::kF32, t.shape()));
  float* dst = w.data<float>();
  for (int64_t i = 0; i < t.numElements(); ++i) dst[i] = static_cast<float>(t.elementAsDouble(i));
  return w;
}

void narrow(const Tensor& wide, Tensor& out) {
  const float* src = wide.data<float>();
  uint16_t* dst = out.data<uint16_t>();
  const bool f16 = out.dtype() == ir::DType::kF16;
  for (int64_t i = 0; i < out.numElements(); ++i)
    dst[i] = f16 ? ref::doubleToF16Bits(src[i]) : ref::doubleToBf16Bits(src[i]);
}

// Every reference kernel as the table gives it: a kernel that computes only f32/f64 (it
// refuses f16 and bf16 with kUnimplemented) runs on f16/bf16 tensors widened to f32, its
// results rounded once to the narrow type, as PyTorch's CPU kernels and NumPy compute half
// precision. Movement, cast and where move f16/bf16 themselves.
Status halfAwareKernel(const ir::AttrView& attrs, std::span<const Tensor> in,
                       std::span<Tensor> out) {
  const RefKernel k = table()[static_cast<size_t>(attrs.op().kind)];
  Status s = k(attrs, in, out);
  if (s.code() != ErrorCode::kUnimplemented) return s;
  bool anyHalf = false;
  for (const Tensor& t : in) anyHalf |= isHalf(t.dtype());
  for (const Tensor& t : out) anyHalf |= isHalf(t.dtype());
  if (!anyHalf) return s;
  std::vector<Tensor> wideIn, wideOut;
  for (const Tensor& t : in) {
    if (!isHalf(t.dtype())) {
      wideIn.push_back(t);
      continue;
    }
    KILN_ASSIGN_OR_RETURN(Tensor w, widen(t));
    wideIn.push_back(std::move(w));
  }
  for (const Tensor& t : out) {
    if (!isHalf(t.dtype())) {
      wideOut.push_back(t);
      continue;
    }
    KILN_ASSIGN_OR_RETURN(Tensor w, Tensor::empty(ir::DType::kF32, t.shape()));
    wideOut.push_back(std::move(w));
  }
  // The attributes still say f16 where an op names its output dtype (a cast handles halves
  // itself and never gets here).
  if (Status wide = k(attrs, wideIn, wideOut); !wide) return s;
  for (size_t i = 0; i < out.size(); ++i)
    if (isHalf(out[i].dtype())) narrow(wideOut[i], out[i]);
  return Status::ok();
}

}  // namespace

RefKernel referenceKernel(ir::OpKind op) {
  return table()[static_cast<size_t>(op)] ? &halfAwareKernel : nullptr;
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
