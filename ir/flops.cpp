#include "ir/flops.h"

namespace kiln::ir {

WorkCount countWork(const Node& n) {
  WorkCount w;
  const Shape& out = n.output()->type().shape;
  const int64_t outElems = numElements(out);
  switch (n.op()) {
    case OpKind::kConv2d: {
      const Shape& wt = n.input(1)->type().shape;  // [M, C/g, kh, kw]
      w.macs = outElems * wt[1] * wt[2] * wt[3];
      if (n.numInputs() > 2) w.otherFlops = outElems;
      break;
    }
    case OpKind::kConvTranspose2d: {
      const Shape& wt = n.input(1)->type().shape;  // [C, M/g, kh, kw]: each input element's taps.
      w.macs = numElements(n.input(0)->type().shape) * wt[1] * wt[2] * wt[3];
      break;
    }
    case OpKind::kMatMul: {
      const Shape& a = n.input(0)->type().shape;
      w.macs = outElems * a.back();
      break;
    }
    case OpKind::kGemm: {
      const bool ta = n.attr().getInt("transA") != 0;
      const Shape& a = n.input(0)->type().shape;
      w.macs = outElems * (ta ? a[0] : a[1]);
      if (n.numInputs() > 2) w.otherFlops = outElems;
      break;
    }
    case OpKind::kLinear:
      w.macs = outElems * n.input(0)->type().shape.back();
      if (n.numInputs() > 2) w.otherFlops = outElems;
      break;
    case OpKind::kAttention: {
      // q @ kt and p @ v; the scores' scale, mask, exponential and sum about 5 ops each.
      const Shape& q = n.input(0)->type().shape;
      const int64_t t = n.input(1)->type().shape.back();
      const int64_t scores = numElements(q) / q.back() * t;
      w.macs = scores * q.back() + outElems * t;
      w.otherFlops = 5 * scores;
      break;
    }
    case OpKind::kMaxPool2d:
    case OpKind::kMaxPool2dIndices:
    case OpKind::kAvgPool2d: {
      const auto& k = n.attr().getInts("kernel");
      w.otherFlops = outElems * k[0] * k[1];
      break;
    }
    default:
      // Movement ops do no arithmetic; everything else costs about one op per input element.
      if (!n.info().has(kMovement)) {
        int64_t inElems = 0;
        for (const Value* v : n.inputs()) inElems = std::max(inElems, v->type().numElements());
        w.otherFlops = std::max(inElems, outElems);
      }
      break;
  }
  return w;
}

WorkCount countWork(const Graph& g) {
  WorkCount total;
  for (const Node* n : g.nodes()) total += countWork(*n);
  return total;
}

}  // namespace kiln::ir
