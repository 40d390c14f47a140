#include "runtime/gpu/library_call.h"

#include <array>
#include <cstdio>
#include <cstring>

#include "runtime/library/epilogue.h"
#include "runtime/library/kernels.h"
#include "runtime/reference/helpers.h"
#include "runtime/tensor.h"

namespace kiln::runtime::gpu {

namespace {

int64_t product(const ir::Shape& s, size_t begin, size_t end) {
  int64_t p = 1;
  for (size_t i = begin; i < end; ++i) p *= s[i];
  return p;
}

bool channelsLast(const LibraryCall& call) {
  const auto* c = std::get_if<ConvDescriptor>(&call.desc);
  const auto* p = std::get_if<PoolDescriptor>(&call.desc);
  return (c && c->channelsLast) || (p && p->channelsLast);
}

Status notTaken(const OpCall& call, const std::string& why) {
  return unimplemented(std::string(call.name) + ": no device library call for " +
                       std::string(ir::opName(call.op)) + " (" + why + ")");
}

Expected<LibraryCall> describeConv(const OpCall& call, const ir::AttrView& a,
                                   std::span<const ir::TensorType> in, const ir::TensorType& out) {
  ConvDescriptor d;
  using Pass = ConvDescriptor::Pass;
  d.pass = call.op == ir::OpKind::kConv2dBackwardData     ? Pass::kBackwardData
           : call.op == ir::OpKind::kConv2dBackwardWeight ? Pass::kBackwardFilter
                                                          : Pass::kForward;
  // The input, the filters and the output of the forward convolution.
  const ir::Shape& x = d.pass == Pass::kForward        ? in[0].shape
                       : d.pass == Pass::kBackwardData ? in[2].shape
                                                       : in[1].shape;
  const ir::Shape& w = d.pass == Pass::kBackwardFilter ? in[2].shape : in[1].shape;
  const ir::Shape& y = d.pass == Pass::kForward ? out.shape : in[0].shape;
  if (x.size() != 4 || w.size() != 4 || y.size() != 4)
    return notTaken(call, "not a 2-D convolution of 4-D tensors");
  d.n = x[0], d.c = x[1], d.h = x[2], d.w = x[3];
  d.k = w[0], d.r = w[2], d.s = w[3];
  d.p = y[2], d.q = y[3];
  const auto& st = a.getInts("strides");
  const auto& pads = a.getInts("pads");
  const auto& dil = a.getInts("dilations");
  if (st.size() != 2 || pads.size() != 4 || dil.size() != 2)
    return notTaken(call, "unexpected strides/pads/dilations");
  d.strideH = st[0], d.strideW = st[1];
  d.padTop = pads[0], d.padLeft = pads[1], d.padBottom = pads[2], d.padRight = pads[3];
  d.dilationH = dil[0], d.dilationW = dil[1];
  d.groups = a.getInt("group");
  d.bias = d.pass == Pass::kForward && in.size() == 3;
  d.dtype = out.dtype;
  d.algo = call.options.algo;
  return LibraryCall{d, {}};
}

Expected<LibraryCall> describePool(const OpCall& call, const ir::AttrView& a,
                                   std::span<const ir::TensorType> in, const ir::TensorType& out) {
  const ir::Shape& x = in[0].shape;
  if (x.size() != 4 || out.shape.size() != 4) return notTaken(call, "not a 2-D pooling");
  PoolDescriptor d;
  d.max = call.op == ir::OpKind::kMaxPool2d;
  d.n = x[0], d.c = x[1], d.h = x[2], d.w = x[3];
  d.p = out.shape[2], d.q = out.shape[3];
  const auto& k = a.getInts("kernel");
  const auto& st = a.getInts("strides");
  const auto& pads = a.getInts("pads");
  if (k.size() != 2 || st.size() != 2 || pads.size() != 4)
    return notTaken(call, "unexpected kernel/strides/pads");
  d.windowH = k[0], d.windowW = k[1], d.strideH = st[0], d.strideW = st[1];
  d.padTop = pads[0], d.padLeft = pads[1], d.padBottom = pads[2], d.padRight = pads[3];
  if (d.max) {
    const auto& dil = a.getInts("dilations");
    if (dil.size() != 2) return notTaken(call, "unexpected dilations");
    d.dilationH = dil[0], d.dilationW = dil[1];
  } else {
    d.countPadding = a.getInt("count_include_pad") != 0;
  }
  d.dtype = out.dtype;
  return LibraryCall{d, {}};
}

Expected<LibraryCall> describeGemm(const OpCall& call, const ir::AttrView& a,
                                   std::span<const ir::TensorType> in, const ir::TensorType& out) {
  GemmDescriptor d;
  d.dtype = out.dtype;
  const ir::Shape& A = in[0].shape;
  const ir::Shape& B = in[1].shape;
  switch (call.op) {
    case ir::OpKind::kLinear: {  // x [..., in] W [out, in] (+ b [out]).
      if (A.empty() || B.size() != 2) return notTaken(call, "linear of a scalar");
      d.m = product(A, 0, A.size() - 1), d.k = A.back(), d.n = B[0];
      d.transB = true;
      d.lda = d.k, d.ldb = d.k;
      if (in.size() == 3) d.c = GemmDescriptor::C::kRow, d.beta = 1;
      return LibraryCall{d, {}};
    }
    case ir::OpKind::kGemm: {
      if (A.size() != 2 || B.size() != 2) return notTaken(call, "gemm of non-matrices");
      d.transA = a.getInt("transA") != 0, d.transB = a.getInt("transB") != 0;
      d.m = d.transA ? A[1] : A[0], d.k = d.transA ? A[0] : A[1];
      d.n = d.transB ? B[0] : B[1];
      d.lda = A[1], d.ldb = B[1];
      d.alpha = a.getFloat("alpha");
      if (in.size() == 3) {
        const ir::Shape& C = in[2].shape;
        d.beta = a.getFloat("beta");
        if ((C.size() == 1 && C[0] == d.n) || (C.size() == 2 && C[0] == 1 && C[1] == d.n))
          d.c = GemmDescriptor::C::kRow;
        else if (C.size() == 2 && C[0] == d.m && C[1] == d.n)
          d.c = GemmDescriptor::C::kMatrix;
        else
          return notTaken(call, "C of shape " + ir::shapeToString(C) + " broadcasts otherwise");
      }
      return LibraryCall{d, {}};
    }
    case ir::OpKind::kMatMul: {  // A [..., M, K] B [..., K, N]
      if (A.size() < 2 || B.size() < 2) return notTaken(call, "matmul of a vector");
      d.m = A[A.size() - 2], d.k = A.back(), d.n = B.back();
      d.lda = d.k, d.ldb = d.n;
      const ir::Shape ab(A.begin(), A.end() - 2), bb(B.begin(), B.end() - 2);
      if (bb.empty()) {  // B shared: the batch folds into the rows.
        d.m *= product(A, 0, A.size() - 2);
      } else if (ab.empty()) {
        d.batch = product(B, 0, B.size() - 2), d.strideB = d.k * d.n;
      } else if (ab == bb) {
        d.batch = product(A, 0, A.size() - 2), d.strideA = d.m * d.k, d.strideB = d.k * d.n;
      } else {
        return notTaken(call, "batch dims broadcast between the operands");
      }
      return LibraryCall{d, {}};
    }
    default:
      return notTaken(call, "not a matrix product");
  }
}

}  // namespace

std::optional<LibraryEpilogue> libraryEpilogueFor(ir::OpKind op, std::span<const PostOp> post) {
  const bool product = op == ir::OpKind::kConv2d || op == ir::OpKind::kLinear ||
                       op == ir::OpKind::kGemm || op == ir::OpKind::kMatMul;
  if (!product)
    return post.empty() ? std::optional<LibraryEpilogue>(LibraryEpilogue{}) : std::nullopt;
  LibraryEpilogue e;
  size_t i = 0;
  if (i < post.size() && post[i].kind == PostOp::Kind::kAdd && post[i].input == 0)
    e.residual = true, ++i;
  if (i < post.size() && post[i].kind == PostOp::Kind::kRelu)
    e.relu = true, ++i;
  else if (i < post.size() && post[i].kind == PostOp::Kind::kGeluTanh && op != ir::OpKind::kConv2d)
    e.geluTanh = true, ++i;
  if (i != post.size()) return std::nullopt;
  return e;
}

std::string LibraryCall::describe() const {
  std::string d = describeProduct();
  const auto* c = std::get_if<ConvDescriptor>(&desc);
  const auto* g = std::get_if<GemmDescriptor>(&desc);
  if (channelsLast(*this)) d += ", nhwc";
  if ((c && c->tf32) || (g && g->tf32)) d += ", tf32";
  if (const ir::DType t = c ? c->dtype : g ? g->dtype : ir::DType::kF32; t != ir::DType::kF32)
    d += ", " + std::string(ir::dtypeName(t)) + " (f32 accumulation)";
  if (epilogue.residual) d += " + residual";
  if (epilogue.relu) d += ", relu";
  if (epilogue.geluTanh) d += ", gelu (tanh)";
  return d;
}

std::string LibraryCall::describeProduct() const {
  char buf[256];
  if (const auto* c = std::get_if<ConvDescriptor>(&desc)) {
    std::snprintf(buf, sizeof buf,
                  "conv2d n%lld c%lld %lldx%lld -> k%lld %lldx%lld (filter %lldx%lld, stride "
                  "%lldx%lld, dilation %lldx%lld, pads %lld,%lld,%lld,%lld, groups %lld)%s",
                  (long long)c->n, (long long)c->c, (long long)c->h, (long long)c->w,
                  (long long)c->k, (long long)c->p, (long long)c->q, (long long)c->r,
                  (long long)c->s, (long long)c->strideH, (long long)c->strideW,
                  (long long)c->dilationH, (long long)c->dilationW, (long long)c->padTop,
                  (long long)c->padLeft, (long long)c->padBottom, (long long)c->padRight,
                  (long long)c->groups,
                  c->pass == ConvDescriptor::Pass::kBackwardData     ? " backward data"
                  : c->pass == ConvDescriptor::Pass::kBackwardFilter ? " backward filter"
                  : c->bias                                          ? " +bias"
                                                                     : "");
    if (c->algo != ConvAlgo::kAuto) return buf + (", " + std::string(convAlgoName(c->algo)));
    return buf;
  }
  if (const auto* p = std::get_if<PoolDescriptor>(&desc)) {
    std::snprintf(buf, sizeof buf,
                  "%s n%lld c%lld %lldx%lld -> %lldx%lld (window %lldx%lld, stride %lldx%lld, "
                  "dilation %lldx%lld, pads %lld,%lld,%lld,%lld%s)",
                  p->max ? "max_pool2d" : "avg_pool2d", (long long)p->n, (long long)p->c,
                  (long long)p->h, (long long)p->w, (long long)p->p, (long long)p->q,
                  (long long)p->windowH, (long long)p->windowW, (long long)p->strideH,
                  (long long)p->strideW, (long long)p->dilationH, (long long)p->dilationW,
                  (long long)p->padTop, (long long)p->padLeft, (long long)p->padBottom,
                  (long long)p->padRight, p->countPadding ? ", padding counted" : "");
    return buf;
  }
  const auto& g = std::get<GemmDescriptor>(desc);
  std::snprintf(buf, sizeof buf, "gemm batch %lld: %lldx%lld * %lldx%lld%s%s alpha %g%s",
                (long long)g.batch, (long long)g.m, (long long)g.k, (long long)g.k, (long long)g.n,
                g.transA ? " (A^T)" : "", g.transB ? " (B^T)" : "", g.alpha,
                g.c == GemmDescriptor::C::kRow      ? " + bias row"
                : g.c == GemmDescriptor::C::kMatrix ? " + C"
                                                    : "");
  return buf;
}

bool describesLibraryOp(ir::OpKind op, ir::DType dtype, ir::Layout layout) {
  if (layout != ir::Layout::kPlain &&
      (layout != ir::Layout::kNHWC || !ir::opInfo(op).has(ir::kChannelsLast)))
    return false;
  const bool product = op == ir::OpKind::kConv2d || op == ir::OpKind::kConv2dBackwardData ||
                       op == ir::OpKind::kConv2dBackwardWeight || op == ir::OpKind::kLinear ||
                       op == ir::OpKind::kGemm || op == ir::OpKind::kMatMul;
  // f32, and f16/bf16 (products on tensor cores with f32 accumulation, pooling in f32 arithmetic
  // rounded once: max exactly).
  return (dtype == ir::DType::kF32 || dtype == ir::DType::kF16 || dtype == ir::DType::kBF16) &&
         (product || op == ir::OpKind::kMaxPool2d || op == ir::OpKind::kAvgPool2d);
}

Expected<LibraryCall> describeLibraryCall(const OpCall& call, std::span<const ir::TensorType> in,
                                          const ir::TensorType& out) {
  if (!describesLibraryOp(call.op, out.dtype, out.layout))
    return notTaken(call, "op, dtype " + std::string(ir::dtypeName(out.dtype)) + " or layout");
  const std::optional<LibraryEpilogue> epilogue = libraryEpilogueFor(call.op, call.postOps);
  if (!epilogue) return notTaken(call, "post-ops other than a residual add and a ReLU");
  if (call.numExtra != (epilogue->residual ? 1 : 0) ||
      in.size() < static_cast<size_t>(call.numExtra))
    return notTaken(call, "post-op operands");
  if (epilogue->residual && in.back().shape != out.shape)
    return notTaken(call, "a residual of shape " + ir::shapeToString(in.back().shape));
  // Channels-last calls (the output NHWC) take every 4-D operand NHWC — a convolution's filters
  // KRSC — and the bias as its row.
  for (const ir::TensorType& t : in)
    if (t.dtype != out.dtype || t.layout != (t.shape.size() == 4 ? out.layout : ir::Layout::kPlain))
      return notTaken(call, "mixed dtypes or layouts: " + t.toString() + " operand, " +
                                out.toString() + " output");
  static const ir::AttrMap none;
  const ir::AttrView attrs(ir::opInfo(call.op), call.attrs ? *call.attrs : none);
  const std::span<const ir::TensorType> own = in.first(in.size() - call.numExtra);
  Expected<LibraryCall> d = call.op == ir::OpKind::kConv2d ||
                                    call.op == ir::OpKind::kConv2dBackwardData ||
                                    call.op == ir::OpKind::kConv2dBackwardWeight
                                ? describeConv(call, attrs, own, out)
                            : call.op == ir::OpKind::kMaxPool2d || call.op == ir::OpKind::kAvgPool2d
                                ? describePool(call, attrs, own, out)
                                : describeGemm(call, attrs, own, out);
  if (!d) return d;
  d->epilogue = *epilogue;
  // TF32 applies to f32 operands only (f16/bf16 ones are on tensor cores already).
  const bool tf32 = call.options.tf32 && out.dtype == ir::DType::kF32;
  if (auto* c = std::get_if<ConvDescriptor>(&d->desc)) c->tf32 = tf32;
  if (auto* g = std::get_if<GemmDescriptor>(&d->desc)) g->tf32 = tf32;
  const bool nhwc = out.layout == ir::Layout::kNHWC;
  if (auto* c = std::get_if<ConvDescriptor>(&d->desc)) c->channelsLast = nhwc;
  if (auto* p = std::get_if<PoolDescriptor>(&d->desc)) p->channelsLast = nhwc;
  if (const auto* g = std::get_if<GemmDescriptor>(&d->desc);
      g && epilogue->residual && g->c == GemmDescriptor::C::kMatrix)
    return notTaken(call, "a residual added to a product that has a C matrix");
  return d;
}

namespace {

// The descriptor's own operands (inputs, then the output).
ir::DType dtypeOf(const LibraryCall& call) {
  return std::visit([](const auto& d) { return d.dtype; }, call.desc);
}

std::vector<int64_t> productOperandBytes(const LibraryCall& call) {
  const int64_t e = static_cast<int64_t>(ir::dtypeSize(dtypeOf(call)));
  if (const auto* c = std::get_if<ConvDescriptor>(&call.desc)) {
    const int64_t x = c->n * c->c * c->h * c->w * e;
    const int64_t w = c->k * (c->c / c->groups) * c->r * c->s * e;
    const int64_t y = c->n * c->k * c->p * c->q * e;
    switch (c->pass) {
      case ConvDescriptor::Pass::kBackwardData:
        return {y, w, x, x};
      case ConvDescriptor::Pass::kBackwardFilter:
        return {y, x, w, w};
      case ConvDescriptor::Pass::kForward:
        break;
    }
    std::vector<int64_t> b = {x, w};
    if (c->bias) b.push_back(c->k * e);
    b.push_back(y);
    return b;
  }
  if (const auto* p = std::get_if<PoolDescriptor>(&call.desc))
    return {p->n * p->c * p->h * p->w * e, p->n * p->c * p->p * p->q * e};
  const auto& g = std::get<GemmDescriptor>(call.desc);
  std::vector<int64_t> b = {(g.strideA ? g.batch : 1) * g.m * g.k * e,
                            (g.strideB ? g.batch : 1) * g.k * g.n * e};
  if (g.c == GemmDescriptor::C::kRow) b.push_back(g.n * e);
  if (g.c == GemmDescriptor::C::kMatrix) b.push_back(g.m * g.n * e);
  b.push_back(g.batch * g.m * g.n * e);
  return b;
}

}  // namespace

size_t LibraryCall::residualOperand() const {
  return productOperandBytes(*this).size() - 1;
}

std::vector<int64_t> operandBytes(const LibraryCall& call) {
  std::vector<int64_t> b = productOperandBytes(call);
  if (call.epilogue.residual) b.insert(b.end() - 1, b.back());
  return b;
}

namespace {

ir::AttrMap convAttrs(const ConvDescriptor& c) {
  ir::AttrMap attrs;
  attrs["strides"] = std::vector<int64_t>{c.strideH, c.strideW};
  attrs["pads"] = std::vector<int64_t>{c.padTop, c.padLeft, c.padBottom, c.padRight};
  attrs["dilations"] = std::vector<int64_t>{c.dilationH, c.dilationW};
  attrs["group"] = c.groups;
  return attrs;
}

}  // namespace

float roundToTf32(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if ((bits & 0x7f800000u) == 0x7f800000u) return x;  // Infinities and NaN as they are.
  bits += 0xfffu + ((bits >> 13) & 1u);               // To nearest, ties to even, on bit 13.
  bits &= ~0x1fffu;
  std::memcpy(&x, &bits, 4);
  return x;
}

std::vector<ConvAlgo> hostConvAlgorithms(const ConvDescriptor& c) {
  if (c.pass != ConvDescriptor::Pass::kForward || c.dtype != ir::DType::kF32) return {};
  const ir::AttrMap attrs = convAttrs(c);
  return convAlgorithms(ir::AttrView(ir::opInfo(ir::OpKind::kConv2d), attrs), {c.n, c.c, c.h, c.w},
                        {c.k, c.c / c.groups, c.r, c.s});
}

namespace {

// A call on f16/bf16 operands as the devices' libraries compute it: every operand widened to f32
// (exact), the f32 call (products accumulating in f32, the epilogue applied in f32), the output
// rounded once to the operands' type.
Status runHalfCallOnHost(const LibraryCall& call, std::span<void* const> given) {
  const ir::DType t = dtypeOf(call);
  const std::vector<int64_t> bytes = operandBytes(call);
  std::vector<std::vector<float>> wide(given.size());
  std::vector<void*> operands;
  for (size_t i = 0; i < given.size(); ++i) {
    const auto* src = static_cast<const uint16_t*>(given[i]);
    wide[i].resize(static_cast<size_t>(bytes[i]) / sizeof(uint16_t));
    if (i + 1 < given.size())  // The output is written, not read (a residual has its own copy).
      ref::halfBitsToFloat(t, src, wide[i].data(), static_cast<int64_t>(wide[i].size()));
    operands.push_back(wide[i].data());
  }
  LibraryCall f32 = call;
  std::visit([](auto& d) { d.dtype = ir::DType::kF32; }, f32.desc);
  KILN_TRY(runLibraryCallOnHost(f32, operands));
  ref::floatToHalfBits(t, wide.back().data(), static_cast<uint16_t*>(given.back()),
                       static_cast<int64_t>(wide.back().size()));
  return Status::ok();
}

// Copies a logical [d0, d1, d2, d3] tensor of `elem`-byte elements between NCHW and NHWC memory.
void permuteChannels(const std::byte* src, std::byte* dst, const std::array<int64_t, 4>& d,
                     size_t elem, bool toNhwc) {
  for (int64_t n = 0; n < d[0]; ++n)
    for (int64_t c = 0; c < d[1]; ++c)
      for (int64_t h = 0; h < d[2]; ++h)
        for (int64_t w = 0; w < d[3]; ++w) {
          const int64_t nchw = ((n * d[1] + c) * d[2] + h) * d[3] + w;
          const int64_t nhwc = ((n * d[2] + h) * d[3] + w) * d[1] + c;
          std::memcpy(dst + static_cast<size_t>(toNhwc ? nhwc : nchw) * elem,
                      src + static_cast<size_t>(toNhwc ? nchw : nhwc) * elem, elem);
        }
}

// A channels-last call as cuDNN computes it: the same arithmetic as the NCHW call on the same
// logical tensors. Emu relayouts the NHWC operands (and KRSC filters) to NCHW, runs the NCHW
// call, and writes the output back channels-last, so that a descriptor whose layout flag is
// wrong reads scrambled operands and fails the tests.
Status runChannelsLastCallOnHost(const LibraryCall& call, std::span<void* const> given) {
  LibraryCall plain = call;
  std::vector<std::pair<size_t, std::array<int64_t, 4>>> nhwc;  // Operand, logical dims.
  if (auto* c = std::get_if<ConvDescriptor>(&plain.desc)) {
    if (c->pass != ConvDescriptor::Pass::kForward)
      return internalError("emu: a channels-last convolution gradient: " + call.describe());
    c->channelsLast = false;
    nhwc = {{0, {c->n, c->c, c->h, c->w}}, {1, {c->k, c->c / c->groups, c->r, c->s}}};
    if (call.epilogue.residual) nhwc.push_back({call.residualOperand(), {c->n, c->k, c->p, c->q}});
    nhwc.push_back({given.size() - 1, {c->n, c->k, c->p, c->q}});
  } else if (auto* p = std::get_if<PoolDescriptor>(&plain.desc)) {
    p->channelsLast = false;
    nhwc = {{0, {p->n, p->c, p->h, p->w}}, {given.size() - 1, {p->n, p->c, p->p, p->q}}};
  } else {
    return internalError("emu: a channels-last matrix product: " + call.describe());
  }
  const size_t elem = ir::dtypeSize(dtypeOf(call));
  std::vector<void*> operands(given.begin(), given.end());
  std::vector<std::vector<std::byte>> copies;
  for (const auto& [i, dims] : nhwc) {
    std::vector<std::byte>& b =
        copies.emplace_back(static_cast<size_t>(dims[0] * dims[1] * dims[2] * dims[3]) * elem);
    if (i + 1 < given.size())  // Inputs; the output is written.
      permuteChannels(static_cast<const std::byte*>(given[i]), b.data(), dims, elem, false);
    operands[i] = b.data();
  }
  KILN_TRY(runLibraryCallOnHost(plain, operands));
  permuteChannels(copies.back().data(), static_cast<std::byte*>(given.back()), nhwc.back().second,
                  elem, true);
  return Status::ok();
}

}  // namespace

Status runLibraryCallOnHost(const LibraryCall& call, std::span<void* const> given) {
  if (channelsLast(call)) return runChannelsLastCallOnHost(call, given);
  if (const ir::DType t = dtypeOf(call); t == ir::DType::kF16 || t == ir::DType::kBF16)
    return runHalfCallOnHost(call, given);
  // Under TF32 the multiplicands (operands 0 and 1 of every call: x and w, dy and w, dy and x,
  // A and B) are read rounded, as tensor cores read them.
  const auto* cd = std::get_if<ConvDescriptor>(&call.desc);
  const auto* gd = std::get_if<GemmDescriptor>(&call.desc);
  std::vector<void*> operands(given.begin(), given.end());
  std::vector<float> rounded[2];
  if ((cd && cd->tf32) || (gd && gd->tf32)) {
    const std::vector<int64_t> bytes = operandBytes(call);
    for (int i = 0; i < 2; ++i) {
      const auto* src = static_cast<const float*>(operands[static_cast<size_t>(i)]);
      rounded[i].resize(static_cast<size_t>(bytes[static_cast<size_t>(i)]) / sizeof(float));
      for (size_t k = 0; k < rounded[i].size(); ++k) rounded[i][k] = roundToTf32(src[k]);
      operands[static_cast<size_t>(i)] = rounded[i].data();
    }
  }
  auto wrap = [&](size_t i, ir::Shape shape) {
    return Tensor::wrap(static_cast<std::byte*>(operands[i]), ir::DType::kF32, std::move(shape));
  };
  const size_t last = operands.size() - 1;
  LibraryOptions options;  // The convolution's algorithm.
  ir::AttrMap attrs;
  std::vector<Tensor> in;
  Tensor out;
  ir::OpKind op = ir::OpKind::kConv2d;
  if (const auto* c = std::get_if<ConvDescriptor>(&call.desc)) {
    if (c->dtype != ir::DType::kF32) return unimplemented("emu: conv2d of " + call.describe());
    if (isCudnnConvAlgo(c->algo))
      return invalidArgument("emu: " + call.describe() +
                             ": a cuDNN algorithm (compiled for a GPU)");
    options.algo = c->algo;
    attrs = convAttrs(*c);
    const ir::Shape x{c->n, c->c, c->h, c->w}, w{c->k, c->c / c->groups, c->r, c->s},
        y{c->n, c->k, c->p, c->q};
    switch (c->pass) {
      case ConvDescriptor::Pass::kForward:
        op = ir::OpKind::kConv2d;
        in = {wrap(0, x), wrap(1, w)};
        if (c->bias) in.push_back(wrap(2, {c->k}));
        out = wrap(last, y);
        break;
      case ConvDescriptor::Pass::kBackwardData:
        op = ir::OpKind::kConv2dBackwardData;
        in = {wrap(0, y), wrap(1, w), wrap(2, x)};
        out = wrap(last, x);
        break;
      case ConvDescriptor::Pass::kBackwardFilter:
        op = ir::OpKind::kConv2dBackwardWeight;
        in = {wrap(0, y), wrap(1, x), wrap(2, w)};
        out = wrap(last, w);
        break;
    }
  } else if (const auto* p = std::get_if<PoolDescriptor>(&call.desc)) {
    if (p->dtype != ir::DType::kF32) return unimplemented("emu: " + call.describe());
    op = p->max ? ir::OpKind::kMaxPool2d : ir::OpKind::kAvgPool2d;
    attrs["kernel"] = std::vector<int64_t>{p->windowH, p->windowW};
    attrs["strides"] = std::vector<int64_t>{p->strideH, p->strideW};
    attrs["pads"] = std::vector<int64_t>{p->padTop, p->padLeft, p->padBottom, p->padRight};
    if (p->max)
      attrs["dilations"] = std::vector<int64_t>{p->dilationH, p->dilationW};
    else
      attrs["count_include_pad"] = int64_t{p->countPadding};
    // The rounding that gives the descriptor's output size: floor, else ceil.
    const int64_t extentH = p->dilationH * (p->windowH - 1) + 1;
    const int64_t floorP = (p->h + p->padTop + p->padBottom - extentH) / p->strideH + 1;
    attrs["ceil_mode"] = int64_t{floorP != p->p};
    in.push_back(wrap(0, {p->n, p->c, p->h, p->w}));
    out = wrap(last, {p->n, p->c, p->p, p->q});
    auto types =
        ir::inferTypes(op, std::vector<ir::TensorType>{{ir::DType::kF32, in[0].shape()}}, attrs);
    if (!types || (*types)[0].shape != out.shape())
      return internalError("emu: no rounding gives the output size of " + call.describe());
  } else {
    const auto& g = std::get<GemmDescriptor>(call.desc);
    const int64_t denseLda = g.transA ? g.m : g.k, denseLdb = g.transB ? g.k : g.n;
    if (g.lda != denseLda || g.ldb != denseLdb || g.dtype != ir::DType::kF32)
      return unimplemented("emu: a strided or non-f32 " + call.describe());
    if (g.batch == 1 && g.strideA == 0 && g.strideB == 0) {
      op = ir::OpKind::kGemm;
      attrs["alpha"] = g.alpha;
      attrs["beta"] = g.beta;
      attrs["transA"] = int64_t{g.transA};
      attrs["transB"] = int64_t{g.transB};
      in.push_back(wrap(0, g.transA ? ir::Shape{g.k, g.m} : ir::Shape{g.m, g.k}));
      in.push_back(wrap(1, g.transB ? ir::Shape{g.n, g.k} : ir::Shape{g.k, g.n}));
      if (g.c == GemmDescriptor::C::kRow) in.push_back(wrap(2, {g.n}));
      if (g.c == GemmDescriptor::C::kMatrix) in.push_back(wrap(2, {g.m, g.n}));
      out = wrap(last, {g.m, g.n});
    } else {
      if (g.transA || g.transB || g.alpha != 1 || g.c != GemmDescriptor::C::kNone)
        return unimplemented("emu: a batched " + call.describe());
      op = ir::OpKind::kMatMul;
      in.push_back(wrap(0, g.strideA ? ir::Shape{g.batch, g.m, g.k} : ir::Shape{g.m, g.k}));
      in.push_back(wrap(1, g.strideB ? ir::Shape{g.batch, g.k, g.n} : ir::Shape{g.k, g.n}));
      out = wrap(last, {g.batch, g.m, g.n});
    }
  }
  // The epilogue, with the reference kernels' formulas (epilogue.h); a residual sharing the
  // output's memory is read from a copy, as the product overwrites it first.
  std::vector<lib::ResolvedPostOp> post;
  std::vector<float> residualCopy;
  if (call.epilogue.residual) {
    const auto* z = static_cast<const float*>(operands[call.residualOperand()]);
    if (z == static_cast<const float*>(operands[last])) {
      residualCopy.assign(z, z + out.numElements());
      z = residualCopy.data();
    }
    post.push_back({PostOp::Kind::kAdd, 0.f, 0.f, z});
  }
  if (call.epilogue.relu) post.push_back({PostOp::Kind::kRelu, 0.f, 0.f, nullptr});
  if (call.epilogue.geluTanh) post.push_back({PostOp::Kind::kGeluTanh, 0.f, 0.f, nullptr});
  const ir::AttrView view(ir::opInfo(op), attrs);
  // The CPU library has one implementation of each convolution gradient: an algorithm chosen
  // for a gradient (by a device that offers several) is a hint it has nothing to apply to.
  const bool gradient = cd && cd->pass != ConvDescriptor::Pass::kForward;
  if (options.algo != ConvAlgo::kAuto && !gradient) {
    KILN_TRY(runLibraryWithPostOps(op, view, in, {}, {}, out, options)
                 .withContext("emu: " + call.describe()));
  } else {
    RefKernel k = libraryKernel(op, ir::DType::kF32);
    if (!k) k = referenceKernel(op);
    std::span<Tensor> outs(&out, 1);
    KILN_TRY(k(view, in, outs).withContext("emu: " + call.describe()));
  }
  const int64_t n = out.numElements();
  lib::applyEpilogue(out.data<float>(), n > 0 ? 1 : 0, n, n, lib::Addend{}, post);
  return Status::ok();
}

}  // namespace kiln::runtime::gpu
