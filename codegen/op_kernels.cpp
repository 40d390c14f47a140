#include "codegen/op_kernels.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <functional>
#include <utility>

#include "codegen/render.h"
#include "ir/dropout.h"

namespace kiln::codegen {

namespace {

// How an op kernel reads and writes a float dtype: the C type of its buffers, the load widening
// to f32 and the store narrowing an f32 result (rounded once, to nearest even).
struct FloatIo {
  ScalarType type;
  std::string c;            // Element type in the kernel's signature.
  std::string load, store;  // Function names ("" for f32: nothing to do).

  std::string loaded(const std::string& e) const { return load.empty() ? e : load + "(" + e + ")"; }
  std::string stored(const std::string& e) const {
    return store.empty() ? e : store + "(" + e + ")";
  }
};

Expected<FloatIo> floatIo(ir::DType t) {
  switch (t) {
    case ir::DType::kF32:
      return FloatIo{ScalarType::kF32, "float", "", ""};
    case ir::DType::kF16:
      return FloatIo{ScalarType::kF16, "unsigned short", "kiln_f16_to_f32", "kiln_f32_to_f16"};
    case ir::DType::kBF16:
      return FloatIo{ScalarType::kBF16, "unsigned short", "kiln_bf16_to_f32", "kiln_f32_to_bf16"};
    default:
      return unimplemented("no op kernel for dtype " + std::string(ir::dtypeName(t)));
  }
}

// The most threads a block has (CUDA's limit, and what an artifact's geometry may say): a
// kernel's per-thread shared arrays hold this many.
constexpr int kMaxBlock = 1024;

std::string ll(int64_t v) {
  return std::to_string(v) + "LL";
}

// The kernel's arguments: the node's inputs, then its output; its domain the output's elements.
// An op kernel's source declares its arguments' C types itself: an integer dtype the kernel IR
// has no ScalarType for (i16, u16, u32, u64) is named by one of its size.
Expected<ScalarType> argType(ir::DType t) {
  if (Expected<ScalarType> s = scalarTypeOf(t)) return s;
  switch (t) {
    case ir::DType::kI16:
    case ir::DType::kU16:
      return ScalarType::kF16;
    case ir::DType::kU32:
      return ScalarType::kI32;
    case ir::DType::kU64:
      return ScalarType::kI64;
    default:
      return scalarTypeOf(t);
  }
}

Expected<Kernel> kernelFor(const ir::Node& n, std::string name) {
  Kernel k;
  k.name = std::move(name);
  k.domain = {n.output()->type().numElements()};
  for (const ir::Value* v : n.inputs()) {
    KILN_ASSIGN_OR_RETURN(const ScalarType t, argType(v->type().dtype));
    k.args.push_back({v->name(), t, false});
  }
  KILN_ASSIGN_OR_RETURN(const ScalarType t, argType(n.output()->type().dtype));
  k.args.push_back({n.output()->name(), t, true});
  return k;
}

// The grid-stride loop over `count` units of one thread each.
std::string gridLoop(const std::string& var, int64_t count) {
  return "for (long long " + var + " = (long long)blockIdx.x * blockDim.x + threadIdx.x; " + var +
         " < " + ll(count) + "; " + var + " += (long long)gridDim.x * blockDim.x)";
}

// An op kernel reading indices that the graph computes takes, with `on`, the word of their device
// check (runtime::IndexWord) as its last argument `aw`, into which it reports an index out of
// range (Kernel::indexWord): wordParam is that parameter in its signature, reportIndex the
// statement reporting index `value` at flat position `position`.
void addIndexWord(Kernel& k, bool on) {
  k.indexWord = on;
  if (on) k.args.push_back({std::string(), ScalarType::kI64, true});
}
std::string wordParam(const Kernel& k) {
  return k.indexWord ? ", kiln_gptr<unsigned long long> aw" : "";
}
std::string reportIndex(const Kernel& k, const std::string& position, const std::string& value) {
  return k.indexWord ? "kiln_report_index(aw, " + position + ", " + value + "); " : "";
}

// max_pool2d_backward(grad [N,C,OH,OW], x [N,C,H,W]) -> dx [N,C,H,W], plain layout. The
// windows that hold input row h are those with oh*S in [h + P - (K-1)D, h + P] and (h + P -
// oh*S) a multiple of D (the same for columns); each window's choice is the reference's scan
// (runtime/reference/conv_pool.cpp): the first tap inside the input, then the first strictly
// larger one or the first NaN. The gradients are added in the reference's order: per output
// row, on a row whose windows lie inside the input vertically, the windows inside horizontally
// first, then the others, left to right (a plain row-major order differs in the last bits with
// left padding); in f32, rounded once for f16/bf16 (the reference computes halves in f32). Its
// 2x2 stride-2 path stores each window's gradient where the sums start from 0: a -0 stays.
Expected<Kernel> maxPool2dBackward(const ir::Node& n, std::string name) {
  const ir::TensorType& g = n.input(0)->type();
  const ir::TensorType& x = n.input(1)->type();
  if (x.rank() != 4 || x.layout != ir::Layout::kPlain || g.layout != ir::Layout::kPlain)
    return unimplemented("max_pool2d_backward's op kernel takes plain [N,C,H,W] tensors");
  KILN_ASSIGN_OR_RETURN(const FloatIo io, floatIo(x.dtype));
  const auto& kernel = n.attr().getInts("kernel");
  const auto& strides = n.attr().getInts("strides");
  const auto& pads = n.attr().getInts("pads");
  const auto& dil = n.attr().getInts("dilations");
  if (kernel.size() != 2 || strides.size() != 2 || pads.size() != 4 || dil.size() != 2)
    return unimplemented("max_pool2d_backward's op kernel takes 2-D pooling attributes");
  const int64_t H = x.shape[2], W = x.shape[3], OH = g.shape[2], OW = g.shape[3];
  // The reference's two paths and its interior windows (Window::validOutputs of the first and
  // the last tap along the width; none for planes of 2^31 elements or more).
  const bool tiles = kernel[0] == 2 && kernel[1] == 2 && strides[0] == 2 && strides[1] == 2 &&
                     dil[0] == 1 && dil[1] == 1 && pads[0] == 0 && pads[1] == 0 && 2 * OH <= H &&
                     2 * OW <= W;
  auto validOutputs = [&](int64_t tap) {
    const int64_t shift = pads[1] - tap * dil[1];
    const int64_t lo = shift > 0 ? (shift + strides[1] - 1) / strides[1] : 0;
    const int64_t last = W + shift - 1;
    const int64_t hi = last < 0 ? 0 : std::min(OW, last / strides[1] + 1);
    return std::pair{lo, std::max(lo, hi)};
  };
  const auto [lo0, hi0] = validOutputs(0);
  const auto [loK, hiK] = validOutputs(kernel[1] - 1);
  const int64_t innerLo = std::max(lo0, loK);
  const int64_t innerHi =
      H * W < (int64_t{1} << 31) ? std::max(innerLo, std::min(hi0, hiK)) : innerLo;

  KILN_ASSIGN_OR_RETURN(Kernel k, kernelFor(n, std::move(name)));
  const std::string T = io.c;
  // The pooling's numbers, declared in both functions.
  const std::string dims =
      "  const long long H = " + ll(H) + ", W = " + ll(W) + ", OH = " + ll(OH) +
      ", OW = " + ll(OW) + ", KH = " + ll(kernel[0]) + ", KW = " + ll(kernel[1]) +
      ", SH = " + ll(strides[0]) + ", SW = " + ll(strides[1]) + ", PT = " + ll(pads[0]) +
      ", PL = " + ll(pads[1]) + ", DH = " + ll(dil[0]) + ", DW = " + ll(dil[1]) + ";\n";
  std::string s = "// max_pool2d_backward " + n.describe() + "\n";
  // The choice of window (oh, ow): its element's offset in the plane.
  s += "KILN_FN long long " + k.name + "_choice(kiln_gptr<const " + T +
       "> a1, long long x0, long long oh, long long ow) {\n" + dims;
  s += R"(  long long arg = -1;
  float best = 0.f;
  for (long long kh = 0; kh < KH && !(arg >= 0 && best != best); ++kh) {
    const long long ih = oh * SH - PT + kh * DH;
    if (ih < 0 || ih >= H) continue;
    for (long long kw = 0; kw < KW; ++kw) {
      const long long iw = ow * SW - PL + kw * DW;
      if (iw < 0 || iw >= W) continue;
)";
  s += "      const float v = " + io.loaded("a1[x0 + ih * W + iw]") + ";\n";
  s += R"(      if (arg < 0 || v > best || v != v) {
        best = v;
        arg = ih * W + iw;
      }
      if (best != best) break;
    }
  }
  return arg;
}
)";
  s += "extern \"C\" __global__ void " + k.name + "(kiln_gptr<const " + T +
       "> a0, kiln_gptr<const " + T + "> a1, kiln_gptr<" + T + "> a2) {\n";
  s += dims + "  const long long INNER_LO = " + ll(innerLo) + ", INNER_HI = " + ll(innerHi) + ";\n";
  s += "  " + gridLoop("i", k.numElements()) + " {\n";
  s += R"(    const long long w = i % W, h = (i / W) % H, p = i / (H * W);
    const long long x0 = p * (H * W), g0 = p * (OH * OW), self = h * W + w;
    const long long nh = h + PT - (KH - 1) * DH, nw = w + PL - (KW - 1) * DW;
    const long long ohLo = nh > 0 ? (nh + SH - 1) / SH : 0, owLo = nw > 0 ? (nw + SW - 1) / SW : 0;
    const long long ohHi = (h + PT) / SH < OH - 1 ? (h + PT) / SH : OH - 1;
    const long long owHi = (w + PL) / SW < OW - 1 ? (w + PL) / SW : OW - 1;
    float acc = 0.f;
    for (long long oh = ohLo; oh <= ohHi; ++oh) {
      if ((h + PT - oh * SH) % DH != 0) continue;
      const long long top = oh * SH - PT;
      const bool rowInside = INNER_LO < INNER_HI && top >= 0 && top + (KH - 1) * DH < H;
      for (int pass = 0; pass < 2; ++pass)
        for (long long ow = owLo; ow <= owHi; ++ow) {
          if ((w + PL - ow * SW) % DW != 0) continue;
          const bool interior = rowInside && ow >= INNER_LO && ow < INNER_HI;
          if (interior != (pass == 0)) continue;
)";
  s += "          if (" + k.name +
       "_choice(a1, x0, oh, ow) == self) acc = " + (tiles ? std::string() : std::string("acc + ")) +
       io.loaded("a0[g0 + oh * OW + ow]") + ";\n";
  s += "        }\n    }\n    a2[i] = " + io.stored("acc") + ";\n  }\n}\n";
  k.source = std::move(s);
  return k;
}

// max_pool2d_indices(x [N,C,H,W]) -> i64 [N,C,OH,OW], NCHW: one thread an output element scanning
// its window's taps in the reference's order with its rule (ops.def; runtime/reference/
// conv_pool.cpp): from PyTorch's start (the first tap at or past row and column 0) and -inf, the
// first strictly larger element or each NaN. Halves compare widened (exactly), f64 as doubles.
Expected<Kernel> maxPool2dIndices(const ir::Node& n, std::string name) {
  const ir::TensorType& x = n.input(0)->type();
  if (x.rank() != 4 || x.layout == ir::Layout::kNHWC)
    return unimplemented("max_pool2d_indices' op kernel takes NCHW tensors");
  const bool f64 = x.dtype == ir::DType::kF64;
  FloatIo io{ScalarType::kF64, "double", "", ""};
  if (!f64) {
    KILN_ASSIGN_OR_RETURN(io, floatIo(x.dtype));
  }
  const auto& kernel = n.attr().getInts("kernel");
  const auto& strides = n.attr().getInts("strides");
  const auto& pads = n.attr().getInts("pads");
  const auto& dil = n.attr().getInts("dilations");
  if (kernel.size() != 2 || strides.size() != 2 || pads.size() != 4 || dil.size() != 2)
    return unimplemented("max_pool2d_indices' op kernel takes 2-D pooling attributes");
  const ir::TensorType& y = n.output()->type();
  KILN_ASSIGN_OR_RETURN(Kernel k, kernelFor(n, std::move(name)));
  const std::string V = f64 ? "double" : "float";
  std::string s = "// max_pool2d_indices " + n.describe() + "\n";
  s += "extern \"C\" __global__ void " + k.name + "(kiln_gptr<const " + io.c +
       "> a0, kiln_gptr<long long> a1) {\n";
  s += "  const long long H = " + ll(x.shape[2]) + ", W = " + ll(x.shape[3]) +
       ", OH = " + ll(y.shape[2]) + ", OW = " + ll(y.shape[3]) + ", KH = " + ll(kernel[0]) +
       ", KW = " + ll(kernel[1]) + ", SH = " + ll(strides[0]) + ", SW = " + ll(strides[1]) +
       ", PT = " + ll(pads[0]) + ", PL = " + ll(pads[1]) + ", DH = " + ll(dil[0]) +
       ", DW = " + ll(dil[1]) + ";\n";
  s += "  " + gridLoop("i", k.numElements()) + " {\n";
  s += R"(    const long long ow = i % OW, oh = (i / OW) % OH, x0 = (i / (OH * OW)) * (H * W);
    const long long h0 = oh * SH - PT, w0 = ow * SW - PL;
    const long long fh = h0 >= 0 ? h0 : h0 + (-h0 + DH - 1) / DH * DH;
    const long long fw = w0 >= 0 ? w0 : w0 + (-w0 + DW - 1) / DW * DW;
    long long arg = fh * W + fw;
)";
  s += "    " + V + " best = -kiln_inf_" + (f64 ? "f64" : "f32") + "();\n";
  s += R"(    for (long long kh = 0; kh < KH; ++kh) {
      const long long ih = h0 + kh * DH;
      if (ih < 0 || ih >= H) continue;
      for (long long kw = 0; kw < KW; ++kw) {
        const long long iw = w0 + kw * DW;
        if (iw < 0 || iw >= W) continue;
)";
  s += "        const " + V + " v = " + io.loaded("a0[x0 + ih * W + iw]") + ";\n";
  s += R"(        if (v > best || v != v) {
          best = v;
          arg = ih * W + iw;
        }
      }
    }
    a1[i] = arg;
  }
}
)";
  k.source = std::move(s);
  return k;
}

// The losses over class-index targets: x [N,C,d..] (f32) and target [N,d..] (i64/i32), a row
// being one sample and spatial position (its classes `inner` apart). Each row is computed by one
// thread, serially over its classes, in the reference kernels' order
// (runtime/reference/loss.cpp); a mean's count and sum run in one block.
struct LossShape {
  int64_t rows = 0, classes = 0, inner = 1;
  int64_t ignore = 0;
  std::string reduction;
  std::string index;  // The target's C type.
};

Expected<LossShape> lossShape(const ir::Node& n, const ir::TensorType& x, const ir::TensorType& t) {
  if (x.dtype != ir::DType::kF32 || x.layout != ir::Layout::kPlain || x.rank() < 2)
    return unimplemented(std::string(ir::opName(n.op())) +
                         "'s op kernel takes plain f32 [N,C,...]");
  if (t.dtype != ir::DType::kI64 && t.dtype != ir::DType::kI32)
    return unimplemented(std::string(ir::opName(n.op())) + "'s op kernel takes i64 or i32 targets");
  LossShape l;
  l.classes = x.shape[1];
  for (size_t d = 2; d < x.shape.size(); ++d) l.inner *= x.shape[d];
  l.rows = x.shape[0] * l.inner;
  l.ignore = n.attr().getInt("ignore_index");
  l.reduction = n.attr().getString("reduction");
  l.index = t.dtype == ir::DType::kI64 ? "long long" : "int";
  return l;
}

// The row's base offset `base` in x, and its target `c`, for row `r`.
std::string rowHead(const LossShape& l, const std::string& targets) {
  return "    const long long base = (r / " + ll(l.inner) + ") * " + ll(l.classes * l.inner) +
         " + r % " + ll(l.inner) + ";\n    const long long c = (long long)" + targets + "[r];\n";
}

// `mx` and `sum`: the row's maximum (NaN first, as the reference) and sum of exp(x - mx).
std::string rowSoftmaxSums(const LossShape& l, const std::string& x) {
  const std::string at = x + "[base + j * " + ll(l.inner) + "]";
  return "    float mx = -kiln_inf_f32(), sum = 0.f;\n    for (long long j = 0; j < " +
         ll(l.classes) + "; ++j) {\n      const float v = " + at +
         ";\n      if (v > mx || v != v) mx = v;\n    }\n    for (long long j = 0; j < " +
         ll(l.classes) + "; ++j) sum += kiln_exp(" + at + " - mx);\n";
}

std::string badTarget(const LossShape& l) {
  return "(c < 0 || c >= " + ll(l.classes) + ")";
}

// nll_loss and cross_entropy_loss: a0 x, a1 target, a2 the loss.
Expected<Kernel> loss(const ir::Node& n, std::string name, bool crossEntropy, bool indexWord) {
  KILN_ASSIGN_OR_RETURN(const LossShape l, lossShape(n, n.input(0)->type(), n.input(1)->type()));
  KILN_ASSIGN_OR_RETURN(Kernel k, kernelFor(n, std::move(name)));
  k.domain = {l.rows};
  k.indexArgs.push_back({.arg = 1, .limit = l.classes, .ignore = l.ignore});
  addIndexWord(k, indexWord);
  const bool none = l.reduction == "none";
  k.oneBlock = !none;
  std::string s = "// " + n.describe() + "\n";
  // The row's loss -log p(c) (0 ignored, NaN for a class out of range), and whether it counts.
  s += "KILN_FN float " + k.name + "_row(kiln_gptr<const float> a0, kiln_gptr<const " + l.index +
       "> a1" + wordParam(k) + ", long long r, long long* counted) {\n" + rowHead(l, "a1");
  s += "    *counted = c != " + ll(l.ignore) + ";\n    if (!*counted) return 0.f;\n    if (" +
       badTarget(l) + ") { " + reportIndex(k, "r", "c") + "return kiln_nan_f32(); }\n";
  if (crossEntropy)
    s += rowSoftmaxSums(l, "a0") + "    return -(a0[base + c * " + ll(l.inner) +
         "] - mx - kiln_log(sum));\n";
  else
    s += "    return -a0[base + c * " + ll(l.inner) + "];\n";
  s += "}\n";
  s += "extern \"C\" __global__ void " + k.name + "(kiln_gptr<const float> a0, kiln_gptr<const " +
       l.index + "> a1, kiln_gptr<float> a2" + wordParam(k) + ") {\n  long long counted = 0;\n";
  const std::string rowArgs =
      std::string("(a0, a1") + (k.indexWord ? ", aw" : "") + ", r, &counted)";
  if (none) {
    s += "  " + gridLoop("r", l.rows) + " a2[r] = " + k.name + "_row" + rowArgs + ";\n}\n";
  } else {
    s += "  KILN_SHARED(float, kiln_smem_f32, 32);\n  KILN_SHARED(long long, kiln_smem_i64, 32);\n";
    s += "  float total = 0.f;\n  long long count = 0;\n";
    s += "  for (long long r = threadIdx.x; r < " + ll(l.rows) + "; r += blockDim.x) {\n";
    s += "    total += " + k.name + "_row" + rowArgs + ";\n    count += counted;\n  }\n";
    s += "  total = kiln_block_reduce(total, 0.f, kiln_sum_op(), kiln_smem_f32);\n";
    s += "  count = kiln_block_reduce(count, 0LL, kiln_sum_op(), kiln_smem_i64);\n";
    // With every target ignored, mean is 0/0 = NaN, as the reference's and PyTorch's.
    s += std::string("  if (threadIdx.x == 0) a2[0] = ") +
         (l.reduction == "mean" ? "total / (float)count" : "total") + ";\n}\n";
  }
  k.source = std::move(s);
  return k;
}

// nll_loss_backward and cross_entropy_loss_backward (a0 grad, a1 x, a2 target, a3 dx): each row
// times its factor s (grad, per row with reduction none; over the counted targets with mean; 0
// at ignored targets): -s at the target (nll), or softmax * s minus s at the target.
Expected<Kernel> lossBackward(const ir::Node& n, std::string name, bool crossEntropy,
                              bool indexWord) {
  KILN_ASSIGN_OR_RETURN(const LossShape l, lossShape(n, n.input(1)->type(), n.input(2)->type()));
  KILN_ASSIGN_OR_RETURN(Kernel k, kernelFor(n, std::move(name)));
  k.domain = {l.rows};
  k.indexArgs.push_back({.arg = 2, .limit = l.classes, .ignore = l.ignore});
  addIndexWord(k, indexWord);
  const bool mean = l.reduction == "mean";
  k.oneBlock = mean;  // Every row needs the count first.
  const std::string cls = ll(l.classes), inner = ll(l.inner);
  std::string s = "// " + n.describe() + "\n";
  s += "extern \"C\" __global__ void " + k.name + "(kiln_gptr<const float> a0, kiln_gptr<const " +
       "float> a1, kiln_gptr<const " + l.index + "> a2, kiln_gptr<float> a3" + wordParam(k) +
       ") {\n";
  s += "  float scale = 1.f;\n";
  if (mean) {
    s += "  KILN_SHARED(long long, kiln_smem_i64, 32);\n  long long count = 0;\n";
    s += "  for (long long r = threadIdx.x; r < " + ll(l.rows) +
         "; r += blockDim.x) count += (long long)a2[r] != " + ll(l.ignore) + ";\n";
    s += "  count = kiln_block_reduce(count, 0LL, kiln_sum_op(), kiln_smem_i64);\n";
    s += "  scale = 1.f / (float)count;\n";
    s += "  for (long long r = threadIdx.x; r < " + ll(l.rows) + "; r += blockDim.x) {\n";
  } else {
    s += "  " + gridLoop("r", l.rows) + " {\n";
  }
  s += rowHead(l, "a2");
  s += "    const float f = c == " + ll(l.ignore) +
       " ? 0.f : " + (l.reduction == "none" ? "a0[r]" : "a0[0]") + " * scale;\n";
  s += "    if (c != " + ll(l.ignore) + " && " + badTarget(l) + ") {\n      " +
       reportIndex(k, "r", "c") + "\n      for (long long j = 0; j < " + cls +
       "; ++j) a3[base + j * " + inner + "] = kiln_nan_f32();\n      continue;\n    }\n";
  if (crossEntropy) {
    s += rowSoftmaxSums(l, "a1");
    s += "    const float factor = f / sum;\n    for (long long j = 0; j < " + cls +
         "; ++j) a3[base + j * " + inner + "] = kiln_exp(a1[base + j * " + inner +
         "] - mx) * factor;\n";
    s += "    if (c != " + ll(l.ignore) + ") a3[base + c * " + inner + "] -= f;\n";
  } else {
    s += "    for (long long j = 0; j < " + cls + "; ++j) a3[base + j * " + inner +
         "] = j == c && c != " + ll(l.ignore) + " ? -f : 0.f;\n";
  }
  s += "  }\n}\n";
  k.source = std::move(s);
  return k;
}

// dropout_train(x, step) and dropout_backward(grad, step) (a0 x, a1 the i64 step, a2 y): the
// mask of ir/dropout.h, printed in CUDA C; kept elements times the reference's scale.
Expected<Kernel> dropout(const ir::Node& n, std::string name) {
  const ir::TensorType& x = n.input(0)->type();
  const bool f64 = x.dtype == ir::DType::kF64;
  if (x.dtype != ir::DType::kF32 && !f64)
    return unimplemented("dropout's op kernel takes f32 or f64 (the reference kernel's dtypes)");
  KILN_ASSIGN_OR_RETURN(Kernel k, kernelFor(n, std::move(name)));
  const double ratio = n.attr().getFloat("ratio");
  // As the reference's T(1) / T(1 - ratio).
  const double scale = f64 ? 1.0 / (1 - ratio) : 1.f / static_cast<float>(1 - ratio);
  const std::string T = f64 ? "double" : "float";
  char scaleText[48];
  std::snprintf(scaleText, sizeof scaleText, "(%s)%a", T.c_str(), scale);
  auto u64 = [](uint64_t v) { return std::to_string(v) + "ULL"; };
  const std::string mix = k.name + "_mix";
  std::string s = "// " + n.describe() + "\n";
  s += "KILN_FN unsigned long long " + mix + "(unsigned long long z) {\n";
  s += "  z = (z ^ (z >> 30)) * " + u64(ir::dropout::kMix1) + ";\n";
  s += "  z = (z ^ (z >> 27)) * " + u64(ir::dropout::kMix2) + ";\n  return z ^ (z >> 31);\n}\n";
  s += "extern \"C\" __global__ void " + k.name + "(kiln_gptr<const " + T +
       "> a0, kiln_gptr<const long long> a1, kiln_gptr<" + T + "> a2) {\n";
  s += "  const unsigned long long base = " + mix + "(" +
       u64(static_cast<uint64_t>(n.attr().getInt("seed"))) + " * " + u64(ir::dropout::kGolden) +
       " + " + mix + "((unsigned long long)a1[0] + " + u64(ir::dropout::kStepSalt) + "));\n";
  s += "  " + gridLoop("i", k.numElements()) + " {\n";
  s += "    const unsigned long long r = " + mix + "(base + (" +
       u64(static_cast<uint64_t>(n.attr().getInt("offset"))) + " + (unsigned long long)i) * " +
       u64(ir::dropout::kGolden) + ") >> 40;\n";
  s += "    a2[i] = r >= " + u64(ir::dropout::threshold(ratio)) + " ? a0[i] * " + scaleText +
       " : (" + T + ")0;\n  }\n}\n";
  k.source = std::move(s);
  return k;
}

// The C type of an element of dtype `t` in the integer and bool op kernels (render.h's, but
// bool as a byte, so that one holding 2 or 255 is read as it is: true), or "" where they take
// none.
std::string elementCType(ir::DType t) {
  switch (t) {
    case ir::DType::kBool:
      return "unsigned char";
    // Integer dtypes the kernel IR does not take (it has no ScalarType for them).
    case ir::DType::kI16:
      return "short";
    case ir::DType::kU16:
      return "unsigned short";
    case ir::DType::kU32:
      return "unsigned int";
    case ir::DType::kU64:
      return "unsigned long long";
    default: {
      const Expected<ScalarType> s = scalarTypeOf(t);
      return s ? std::string(cType(*s)) : std::string();
    }
  }
}

// The integer dtypes (every one, signed and unsigned), and the unsigned C type of their size:
// wrapping arithmetic computes in it.
bool isKernelInteger(ir::DType t) {
  return ir::isInteger(t);
}
bool isSignedInteger(ir::DType t) {
  return t == ir::DType::kI64 || t == ir::DType::kI32 || t == ir::DType::kI16 ||
         t == ir::DType::kI8;
}
std::string unsignedCType(ir::DType t) {
  static constexpr const char* kBySize[] = {"unsigned char", "unsigned short", "unsigned int",
                                            "unsigned long long"};
  return kBySize[std::countr_zero(ir::dtypeSize(t))];
}
// Where wrapping arithmetic of dtype `t` computes: unsigned, and at least an unsigned int, so
// that narrower operands are not promoted to a signed int (65535 * 65535 overflows one).
std::string wrapType(ir::DType t) {
  return ir::dtypeSize(t) < 4 ? "unsigned int" : unsignedCType(t);
}

// The code that computes, for output element `i` of shape `y`, each input's element offset under
// broadcasting (numpy's: shapes aligned at the right, size-1 dims repeated): `offsets[j]` names
// it ("i" for an input of the output's shape, "0" for a single element, else a variable).
std::string broadcastOffsets(const ir::Shape& y, const std::vector<ir::Shape>& ins,
                             std::vector<std::string>* offsets) {
  std::string decls, body;
  std::vector<std::vector<int64_t>> strides(ins.size());
  for (size_t j = 0; j < ins.size(); ++j) {
    const ir::Shape& x = ins[j];
    if (x == y) {
      offsets->push_back("i");
      continue;
    }
    if (ir::numElements(x) == 1) {
      offsets->push_back("0");
      continue;
    }
    offsets->push_back("o" + std::to_string(j));
    decls += ", o" + std::to_string(j) + " = 0";
    strides[j].assign(y.size(), 0);
    int64_t stride = 1;
    for (size_t k = 0; k < x.size(); ++k) {  // From the last dim.
      const size_t dx = x.size() - 1 - k, dy = y.size() - 1 - k;
      if (x[dx] != 1) strides[j][dy] = stride;
      stride *= x[dx];
    }
  }
  if (decls.empty()) return "";
  body = "    long long rest = i" + decls + ";\n";
  for (size_t d = y.size(); d-- > 0;) {
    if (y[d] == 1) continue;
    body += "    {\n      const long long c = rest % " + ll(y[d]) + ";\n      rest /= " + ll(y[d]) +
            ";\n";
    for (size_t j = 0; j < ins.size(); ++j)
      if (!strides[j].empty() && strides[j][d] != 0)
        body += "      o" + std::to_string(j) + " += c * " + ll(strides[j][d]) + ";\n";
    body += "    }\n";
  }
  return body;
}

// Pointwise ops on integers and bools, which the kernel IR leaves alone (it computes in floats:
// integer arithmetic must wrap, casts to integers saturate), each element as the reference
// kernels compute it (runtime/reference/pointwise.cpp), operands broadcast:
//   equal, less, less_equal, greater, greater_equal of integers (-> bool);
//   logical_and, _or, _xor, _not of bools; bitwise_and, _or, _xor, _not and bitshift, add, sub,
//   mul (wrapping), minimum, maximum, neg and abs (wrapping) of integers;
//   where with integer or bool values; cast to an integer (floats truncated toward zero,
//   saturated, NaN 0; integers wrapped) or to bool (non-zero, NaN too).
//   div and mod of integers: by a constant divisor without zeros (a constant holding one runs on
//   the host, whose kernel reports it), or by another divisor, checked as indices are
//   (IndexArg::nonZero: before the run, or by the kernel into an index word), a zero giving 0.
Expected<Kernel> integerPointwise(const ir::Node& n, std::string name, bool indexWord) {
  const ir::OpKind op = n.op();
  const std::string opName(ir::opName(op));
  const ir::DType out = n.output()->type().dtype;
  const ir::DType first = n.input(0)->type().dtype;
  std::vector<ir::DType> in;
  for (const ir::Value* v : n.inputs()) {
    if (v->type().layout != ir::Layout::kPlain)
      return unimplemented(opName + "'s op kernel takes plain tensors");
    in.push_back(v->type().dtype);
  }
  if (n.output()->type().numElements() == 0)
    return unimplemented(opName + "'s op kernel takes a non-empty output");
  auto allOf = [&](auto pred) { return std::all_of(in.begin(), in.end(), pred); };
  const bool integers = allOf(isKernelInteger) && allOf([&](ir::DType t) { return t == first; });
  const bool bools = allOf([](ir::DType t) { return t == ir::DType::kBool; });
  const std::string T = elementCType(first);
  const std::string U = unsignedCType(first);
  auto none = [&] {
    return unimplemented("no op kernel for " + opName + " of " + std::string(ir::dtypeName(first)) +
                         " (the kernel IR's, or the host's)");
  };
  // x, y, z: the operands' elements; the expression of the output element.
  std::string expr, helper;
  bool checkedDivisor = false;  // div or mod by a divisor that may hold 0.
  const std::string x = "x", y = "y";
  switch (op) {
    case ir::OpKind::kEqual:
    case ir::OpKind::kLess:
    case ir::OpKind::kLessEqual:
    case ir::OpKind::kGreater:
    case ir::OpKind::kGreaterEqual: {
      if (!integers) return none();
      const char* cmp = op == ir::OpKind::kEqual       ? "=="
                        : op == ir::OpKind::kLess      ? "<"
                        : op == ir::OpKind::kLessEqual ? "<="
                        : op == ir::OpKind::kGreater   ? ">"
                                                       : ">=";
      expr = "(x " + std::string(cmp) + " y) ? 1 : 0";
      break;
    }
    case ir::OpKind::kLogicalAnd:
    case ir::OpKind::kLogicalOr:
    case ir::OpKind::kLogicalXor:
    case ir::OpKind::kLogicalNot: {
      if (!bools) return none();
      expr = op == ir::OpKind::kLogicalAnd   ? "(x != 0 && y != 0) ? 1 : 0"
             : op == ir::OpKind::kLogicalOr  ? "(x != 0 || y != 0) ? 1 : 0"
             : op == ir::OpKind::kLogicalXor ? "((x != 0) != (y != 0)) ? 1 : 0"
                                             : "x == 0 ? 1 : 0";
      break;
    }
    case ir::OpKind::kBitwiseAnd:
    case ir::OpKind::kBitwiseOr:
    case ir::OpKind::kBitwiseXor:
    case ir::OpKind::kBitwiseNot:
      if (!integers) return none();
      expr = op == ir::OpKind::kBitwiseAnd   ? "(" + T + ")(x & y)"
             : op == ir::OpKind::kBitwiseOr  ? "(" + T + ")(x | y)"
             : op == ir::OpKind::kBitwiseXor ? "(" + T + ")(x ^ y)"
                                             : "(" + T + ")(~x)";
      break;
    case ir::OpKind::kBitShift: {
      if (!integers) return none();
      const bool left = n.attr().getString("direction") == "LEFT";
      const bool isSigned = isSignedInteger(first);
      const std::string width = std::to_string(ir::dtypeSize(first) * 8);
      // The reference's shiftBits: a count outside [0, width) gives 0 (-1 for a negative value
      // shifted right); a right shift of a negative value fills with ones.
      helper = "KILN_FN " + T + " " + "SHIFT(" + T + " a, " + T + " b) {\n  bool inRange = (" + U +
               ")b < (" + U + ")" + width + ";\n";
      if (isSigned) helper += "  inRange = inRange && b >= 0;\n";
      helper += "  if (!inRange) return " +
                std::string(isSigned && !left ? "a < 0 ? (" + T + ")-1 : " : "") + "(" + T +
                ")0;\n  const int s = (int)b;\n";
      if (left) {
        helper += "  return (" + T + ")(" + U + ")((" + U + ")a << s);\n}\n";
      } else {
        if (isSigned)
          helper +=
              "  if (a < 0) return (" + T + ")(" + U + ")(~((" + U + ")(~(" + U + ")a) >> s));\n";
        helper += "  return (" + T + ")((" + U + ")a >> s);\n}\n";
      }
      expr = "SHIFT(x, y)";
      break;
    }
    case ir::OpKind::kAdd:
    case ir::OpKind::kSub:
    case ir::OpKind::kMul: {
      if (!integers) return none();
      const char* o = op == ir::OpKind::kAdd ? "+" : op == ir::OpKind::kSub ? "-" : "*";
      expr = "(" + T + ")((" + wrapType(first) + ")x " + o + " (" + wrapType(first) + ")y)";
      break;
    }
    case ir::OpKind::kDiv:
    case ir::OpKind::kMod: {
      const bool half = first == ir::DType::kF16 || first == ir::DType::kBF16;
      const bool floats = (first == ir::DType::kF32 || first == ir::DType::kF64 || half) &&
                          allOf([&](ir::DType t) { return t == first; });
      if (op == ir::OpKind::kMod && floats) {
        // C's fmod (exact), then with fmod=0 the divisor's sign: a nonzero remainder of the
        // other sign moves by y, a zero one takes y's sign (the reference's bits; a NaN is a NaN,
        // its sign the device's fmod's). f16 and bf16 in f32, rounded once, as the host's
        // reference runs them.
        const bool fmod = n.attr().getInt("fmod") != 0;
        const std::string C = half ? "float" : T;
        const FloatIo io = half ? *floatIo(first) : FloatIo{};  // f32 and f64: no conversions.
        helper =
            "KILN_FN " + T + " MOD(" + T + " xs, " + T + " ys) {\n  const " + C +
            " x = " + io.loaded("xs") + ", y = " + io.loaded("ys") + ";\n  " + C +
            " r = kiln_m_fmod(x, y);\n" +
            (fmod ? std::string()
                  : "  if (r != 0 && kiln_m_copysign((" + C + ")1, r) != kiln_m_copysign((" + C +
                        ")1, y)) r += y;\n  if (r == 0) r = kiln_m_copysign((" + C + ")0, y);\n") +
            "  return " + io.stored("r") + ";\n}\n";
        expr = "MOD(x, y)";
        break;
      }
      // The reference reports a zero divisor: a constant divisor without zeros (x // 2, a
      // position's row and column) leaves nothing to report; others are checked (below).
      if (!integers) return none();
      const ir::Value* d = n.input(1);
      checkedDivisor = !d->isConstant(/*inference=*/false);
      const size_t size = ir::dtypeSize(first);
      for (int64_t e = 0; !checkedDivisor && e < d->data().numElements(); ++e) {
        bool zero = true;
        for (size_t b = 0; b < size; ++b)
          zero = zero && d->data().data()[static_cast<size_t>(e) * size + b] == std::byte{0};
        if (zero) return unimplemented(opName + " by a constant holding 0 runs on the host");
      }
      const bool isSigned = isSignedInteger(first);
      if (op == ir::OpKind::kDiv) {
        // Truncated toward zero; x / -1 wraps (INT_MIN / -1 is INT_MIN).
        expr = isSigned ? "y == -1 ? (" + T + ")((" + U + ")0 - (" + U + ")x) : (" + T + ")(x / y)"
                        : "(" + T + ")(x / y)";
      } else if (!isSigned) {
        expr = "(" + T + ")(x % y)";
      } else {
        // The dividend's sign (fmod=1, C's %) or the divisor's (fmod=0: a nonzero remainder of
        // the other sign moves by y); x % -1 is 0.
        const bool fmod = n.attr().getInt("fmod") != 0;
        helper = "KILN_FN " + T + " MOD(" + T + " x, " + T + " y) {\n  if (y == -1) return 0;\n  " +
                 T + " r = (" + T + ")(x % y);\n" +
                 (fmod ? std::string()
                       : "  if (r != 0 && ((r < 0) != (y < 0))) r = (" + T + ")(r + y);\n") +
                 "  return r;\n}\n";
        expr = "MOD(x, y)";
      }
      break;
    }
    case ir::OpKind::kMinimum:
    case ir::OpKind::kMaximum:
      if (!integers) return none();
      expr = op == ir::OpKind::kMinimum ? "y < x ? y : x" : "x < y ? y : x";
      break;
    case ir::OpKind::kNeg:
    case ir::OpKind::kAbs:
      if (!integers) return none();
      expr = op == ir::OpKind::kNeg ? "(" + T + ")((" + U + ")0 - (" + U + ")x)"
                                    : "x < 0 ? (" + T + ")((" + U + ")0 - (" + U + ")x) : x";
      break;
    case ir::OpKind::kWhere: {
      if (in[0] != ir::DType::kBool || in[1] != in[2] ||
          !(isKernelInteger(in[1]) || in[1] == ir::DType::kBool))
        return none();
      expr = "x != 0 ? y : z";
      break;
    }
    case ir::OpKind::kCast: {
      if (ir::isFloat(out)) {
        // To a float from an integer or bool (f16: through f32, exact up to 2^24, beyond which
        // f16 is infinite; bf16: through f64, exact for 32-bit sources, u64's as the reference
        // rounds it), or f64 to f16/bf16 rounded once (kiln_f64_to_f16): the reference's bits.
        const bool half = out == ir::DType::kF16 || out == ir::DType::kBF16;
        const std::string v = first == ir::DType::kBool ? "(x != 0 ? 1 : 0)" : "x";
        const std::string narrow = out == ir::DType::kF16 ? "kiln_f64_to_f16" : "kiln_f64_to_bf16";
        if (first == ir::DType::kF64 && half)
          expr = narrow + "(x)";
        else if (!(isKernelInteger(first) || first == ir::DType::kBool))
          return none();
        else if (out == ir::DType::kF16)
          expr = "kiln_f32_to_f16((float)" + v + ")";
        else if (out == ir::DType::kBF16 && first != ir::DType::kI64)
          expr = narrow + "((double)" + v + ")";
        else if (!half)
          expr = "(" + elementCType(out) + ")" + v;
        else
          return none();  // i64 -> bf16: the reference rounds the exact int64 once.
        break;
      }
      if (!(isKernelInteger(out) || out == ir::DType::kBool) || elementCType(first).empty())
        return none();
      // The source's value: exact in double for every float dtype.
      const std::string v = first == ir::DType::kF16    ? "(double)kiln_f16_to_f32(x)"
                            : first == ir::DType::kBF16 ? "(double)kiln_bf16_to_f32(x)"
                            : first == ir::DType::kBool ? "(x != 0 ? 1 : 0)"
                                                        : "x";
      const bool fromFloat = ir::isFloat(first);
      const std::string D = elementCType(out);
      if (out == ir::DType::kBool) {
        expr = "(" + v + ") != 0 ? 1 : 0";  // NaN != 0: true, as the reference.
      } else if (!fromFloat) {
        expr = "(" + D + ")(" + v + ")";  // Wraps (two's complement).
      } else {
        // Truncated toward zero, saturated, NaN 0: the reference's truncSaturate (comparing
        // the value itself with the bounds gives the same as comparing its truncation).
        const int bits = static_cast<int>(ir::dtypeSize(out) * 8);
        const bool isSigned = isSignedInteger(out);
        // The bounds, written so that no literal overflows (i64's minimum, u64's maximum).
        const std::string lo =
            !isSigned    ? "(" + D + ")0"
            : bits == 64 ? "(-9223372036854775807LL - 1)"
                         : "(" + D + ")(" + std::to_string(-(int64_t{1} << (bits - 1))) + ")";
        const std::string hi =
            bits == 64 ? (isSigned ? "9223372036854775807LL" : "18446744073709551615ULL")
                       : "(" + D + ")" +
                             std::to_string(isSigned ? (int64_t{1} << (bits - 1)) - 1
                                                     : (int64_t{1} << bits) - 1);
        helper = "KILN_FN " + D + " CONVERT(double v) {\n  if (v != v) return (" + D +
                 ")0;\n  if (v <= (double)" + lo + ") return " + lo + ";\n  if (v >= (double)" +
                 hi + ") return " + hi + ";\n  return (" + D + ")v;\n}\n";
        expr = "CONVERT(" + v + ")";
      }
      break;
    }
    default:
      return none();
  }
  KILN_ASSIGN_OR_RETURN(Kernel k, kernelFor(n, std::move(name)));
  if (checkedDivisor) {
    k.indexArgs.push_back({.arg = 1, .limit = 1, .nonZero = true});
    addIndexWord(k, indexWord);
  }
  auto replaceAll = [](std::string text, const std::string& from, const std::string& to) {
    for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
    return text;
  };
  for (const auto& [from, to] : {std::pair<std::string, std::string>{"SHIFT", "_shift"},
                                 {"CONVERT", "_cvt"},
                                 {"MOD", "_mod"}}) {
    helper = replaceAll(helper, from, k.name + to);
    expr = replaceAll(expr, from, k.name + to);
  }
  std::vector<ir::Shape> shapes;
  for (const ir::Value* v : n.inputs()) shapes.push_back(v->type().shape);
  std::vector<std::string> offsets;
  const std::string offsetCode = broadcastOffsets(n.output()->type().shape, shapes, &offsets);
  std::string s =
      "// " + n.describe() + "\n" + helper + "extern \"C\" __global__ void " + k.name + "(";
  for (size_t j = 0; j < in.size(); ++j)
    s += "kiln_gptr<const " + elementCType(in[j]) + "> a" + std::to_string(j) + ", ";
  s +=
      "kiln_gptr<" + elementCType(out) + "> a" + std::to_string(in.size()) + wordParam(k) + ") {\n";
  s += "  " + gridLoop("i", k.numElements()) + " {\n" + offsetCode;
  static const char* kNames[] = {"x", "y", "z"};
  for (size_t j = 0; j < in.size(); ++j)
    s += "    const " + elementCType(in[j]) + " " + kNames[j] + " = a" + std::to_string(j) + "[" +
         offsets[j] + "];\n";
  if (checkedDivisor)  // A zero divisor: 0, reported at its flat index in the divisor.
    s += "    if (y == 0) {\n      " + reportIndex(k, offsets[1], "0") + "a" +
         std::to_string(in.size()) + "[i] = 0;\n      continue;\n    }\n";
  s += "    a" + std::to_string(in.size()) + "[i] = " + expr + ";\n  }\n}\n";
  k.source = std::move(s);
  return k;
}

// The C type that moves an element of node `n`'s output (the movement ops' data): an unsigned
// integer of its size, its bits unchanged; kUnimplemented for other layouts than plain, empty
// outputs and other sizes.
Expected<std::string> movedElement(const ir::Node& n) {
  const std::string op(ir::opName(n.op()));
  for (const ir::Value* v : n.inputs())
    if (v->type().layout != ir::Layout::kPlain)
      return unimplemented(op + "'s op kernel takes plain tensors");
  if (n.output()->type().layout != ir::Layout::kPlain)
    return unimplemented(op + "'s op kernel takes plain tensors");
  if (n.output()->type().numElements() == 0)
    return unimplemented(op + "'s op kernel takes a non-empty output");
  const size_t size = ir::dtypeSize(n.output()->type().dtype);
  if (size != 1 && size != 2 && size != 4 && size != 8)
    return unimplemented(op + "'s op kernel takes elements of 1, 2, 4 or 8 bytes");
  static constexpr const char* kBySize[] = {"unsigned char", "unsigned short", "unsigned int",
                                            "unsigned long long"};
  return std::string(kBySize[std::countr_zero(size)]);
}

// How a gather moves an element (movedElement), with all bits set where the index is out of
// range (a NaN for floats, -1 for signed integers), 0 for bool; the C type of its indices.
struct GatherTypes {
  std::string element, filler, index;
};

Expected<GatherTypes> gatherTypes(const ir::Node& n) {
  const ir::DType idx = n.input(1)->type().dtype;
  if (idx != ir::DType::kI64 && idx != ir::DType::kI32)
    return unimplemented(std::string(ir::opName(n.op())) + "'s op kernel takes i64 or i32 indices");
  GatherTypes t;
  KILN_ASSIGN_OR_RETURN(t.element, movedElement(n));
  t.index = idx == ir::DType::kI64 ? "long long" : "int";
  t.filler = n.output()->type().dtype == ir::DType::kBool ? "0" : "~0ULL";
  return t;
}

// The gathers' signature: a0 data, a1 indices, a2 output.
std::string gatherHead(const Kernel& k, const GatherTypes& t) {
  return "extern \"C\" __global__ void " + k.name + "(kiln_gptr<const " + t.element +
         "> a0, kiln_gptr<const " + t.index + "> a1, kiln_gptr<" + t.element + "> a2" +
         wordParam(k) + ") {\n";
}
// gather(data [outer, dim, inner], indices [count..]) -> [outer, count.., inner] along `axis`:
// one thread an output element.
Expected<Kernel> gather(const ir::Node& n, std::string name, bool indexWord) {
  KILN_ASSIGN_OR_RETURN(const GatherTypes t, gatherTypes(n));
  const ir::Shape& d = n.input(0)->type().shape;
  KILN_ASSIGN_OR_RETURN(const int axis,
                        ir::normalizeAxis(n.attr().getInt("axis"), d.size(), "axis"));
  int64_t inner = 1;
  for (size_t i = static_cast<size_t>(axis) + 1; i < d.size(); ++i) inner *= d[i];
  const int64_t dim = d[static_cast<size_t>(axis)];
  if (dim == 0) return unimplemented("gather's op kernel takes a dim to gather from");
  const int64_t count = n.input(1)->type().numElements();
  KILN_ASSIGN_OR_RETURN(Kernel k, kernelFor(n, std::move(name)));
  k.indexArgs.push_back({.arg = 1, .position = true, .limit = dim, .axis = axis});
  addIndexWord(k, indexWord);
  std::string s = "// " + n.describe() + "\n" + gatherHead(k, t);
  s += "  " + gridLoop("i", k.numElements()) + " {\n";
  s += "    const long long r = i % " + ll(inner) + ", j = (i / " + ll(inner) + ") % " + ll(count) +
       ", o = i / " + ll(inner * count) + ";\n";
  s += "    long long p = (long long)a1[j];\n    if (p < 0) p += " + ll(dim) + ";\n";
  if (k.indexWord)
    s += "    if (p < 0 || p >= " + ll(dim) + ") " + reportIndex(k, "j", "(long long)a1[j]") + "\n";
  s += "    a2[i] = p >= 0 && p < " + ll(dim) + " ? a0[(o * " + ll(dim) + " + p) * " + ll(inner) +
       " + r] : (" + t.element + ")" + t.filler + ";\n  }\n}\n";
  k.source = std::move(s);
  return k;
}

// gather_elements(data, indices) along `axis`: output element c (of the indices' shape) reads
// data at c with c[axis] replaced by its index; one thread an output element.
Expected<Kernel> gatherElements(const ir::Node& n, std::string name, bool indexWord) {
  KILN_ASSIGN_OR_RETURN(const GatherTypes t, gatherTypes(n));
  const ir::Shape& d = n.input(0)->type().shape;
  const ir::Shape& y = n.output()->type().shape;
  KILN_ASSIGN_OR_RETURN(const int axis,
                        ir::normalizeAxis(n.attr().getInt("axis"), d.size(), "axis"));
  if (y.size() != d.size())
    return unimplemented("gather_elements' op kernel takes indices of the data's rank");
  const std::vector<int64_t> strides = ir::contiguousStrides(d);
  const int64_t dim = d[static_cast<size_t>(axis)];
  if (dim == 0) return unimplemented("gather_elements' op kernel takes a dim to gather from");
  KILN_ASSIGN_OR_RETURN(Kernel k, kernelFor(n, std::move(name)));
  k.indexArgs.push_back({.arg = 1, .position = true, .limit = dim, .axis = axis});
  addIndexWord(k, indexWord);
  std::string s = "// " + n.describe() + "\n" + gatherHead(k, t);
  s += "  " + gridLoop("i", k.numElements()) + " {\n";
  s += "    long long rest = i, at = 0;\n";
  for (size_t e = y.size(); e-- > 0;) {
    if (static_cast<int>(e) != axis)
      s += "    at += (rest % " + ll(y[e]) + ") * " + ll(strides[e]) + ";\n";
    if (e > 0) s += "    rest /= " + ll(y[e]) + ";\n";
  }
  s += "    long long p = (long long)a1[i];\n    if (p < 0) p += " + ll(dim) + ";\n";
  if (k.indexWord)
    s += "    if (p < 0 || p >= " + ll(dim) + ") " + reportIndex(k, "i", "(long long)a1[i]") + "\n";
  s += "    a2[i] = p >= 0 && p < " + ll(dim) + " ? a0[at + p * " +
       ll(strides[static_cast<size_t>(axis)]) + "] : (" + t.element + ")" + t.filler +
       ";\n  }\n}\n";
  k.source = std::move(s);
  return k;
}

// An op that combines sources into the rows of its output in source order: an embedding's
// gradient (gather_backward: gradient rows added at their index), a scatter (updates combined
// into a copy of the data at their index). The reference walks the sources in order, so that
// repeated indices combine deterministically; here a stable counting sort of the sources by row,
// in three launches over a workspace of u64s: the rows' starts (rows + 1), a cursor per row
// (rows) and the sources sorted by row (count):
//   _a (one block): each row's count of sources (atomic adds of integers: exact in any order),
//      their running sum (the starts), and the cursors set to the starts;
//   _b (one block): the sources in chunks of a block, in order; each thread's slot is its row's
//      cursor plus its rank among the chunk's earlier sources of that row (shared memory), and
//      the cursors advance by the chunk's counts before the next chunk. Work: count times the
//      block size, whatever the rows (ranking among all of a row's sources instead cost the sum
//      of each row's sources squared: 10^10 compares for 10^5 ids into one row);
//   _c (a thread an output element): its initial value combined with its row's sources in
//      order: the reference's bits.
// The kernels take a0 .. a2 (the node's inputs), a3 (its output), a4 (the workspace), then the
// index word.
struct RowCombine {
  int64_t rows = 0, count = 0, outElements = 0;
  std::string params;  // The kernels' parameters.
  // Statements setting `long long p` for source `j`: its row, or -1 for an index out of range
  // (reported with an index word, where `report`).
  std::function<std::string(bool report)> rowOf;
  // Statements for output element `i` setting `long long r`, its row (and what the expressions
  // below read); its type, the value before any source; source `j`'s value `v` combined into
  // `acc`.
  std::string element, type, init, source, combine;
};

void combineByRows(Kernel& k, const ir::Node& n, const RowCombine& c) {
  const int64_t rows = c.rows, count = c.count;
  const std::string cursor = ll(rows + 1), sorted = ll(2 * rows + 1);
  k.workspaceBytes = 8 * (2 * rows + 1 + count);
  auto head = [&](const std::string& name) {
    return "extern \"C\" __global__ void " + name + "(" + c.params + ") {\n";
  };
  std::vector<Kernel> then(2, k);
  const char* suffix[] = {"_b", "_c"};
  for (size_t i = 0; i < 2; ++i) {
    then[i].name = k.name + suffix[i];
    then[i].indexArgs.clear();
  }
  // _a
  k.oneBlock = true;
  std::string s = "// " + n.describe() + ": rows' starts\n" + head(k.name);
  s += "  for (long long r = threadIdx.x; r <= " + ll(rows) + "; r += blockDim.x) a4[r] = 0;\n";
  s += "  __syncthreads();\n";
  s += "  for (long long j = threadIdx.x; j < " + ll(count) + "; j += blockDim.x) {\n" +
       c.rowOf(true) + "    if (p >= 0) atomicAdd(&a4[p + 1], 1ULL);\n  }\n  __syncthreads();\n";
  // Each thread sums a chunk of the counts; thread 0 the chunks' sums; each its chunk's starts.
  s += "  KILN_SHARED(unsigned long long, kiln_smem_u64, " + std::to_string(kMaxBlock) + ");\n";
  s += "  const long long chunk = (" + ll(rows) + " + blockDim.x - 1) / blockDim.x;\n";
  s += "  const long long lo = 1 + (long long)threadIdx.x * chunk;\n";
  s += "  const long long hi = lo + chunk < " + ll(rows + 1) + " ? lo + chunk : " + ll(rows + 1) +
       ";\n";
  s += "  unsigned long long sum = 0;\n  for (long long r = lo; r < hi; ++r) sum += a4[r];\n";
  s += "  kiln_smem_u64[threadIdx.x] = sum;\n  __syncthreads();\n";
  s += "  if (threadIdx.x == 0) {\n    unsigned long long run = 0;\n";
  s += "    for (unsigned t = 0; t < blockDim.x; ++t) {\n      const unsigned long long v = "
       "kiln_smem_u64[t];\n      kiln_smem_u64[t] = run;\n      run += v;\n    }\n  }\n";
  s += "  __syncthreads();\n  unsigned long long run = kiln_smem_u64[threadIdx.x];\n";
  s += "  for (long long r = lo; r < hi; ++r) {\n    run += a4[r];\n    a4[r] = run;\n  }\n";
  s += "  __syncthreads();\n";
  s += "  for (long long r = threadIdx.x; r < " + ll(rows) + "; r += blockDim.x) a4[" + cursor +
       " + r] = a4[r];\n}\n";
  k.source = std::move(s);
  // _b: every thread runs every chunk (the barriers), those past the end with no row.
  then[0].oneBlock = true;
  s = "// " + n.describe() + ": sources by row, in order\n" + head(then[0].name);
  s += "  KILN_SHARED(long long, kiln_smem_rows, " + std::to_string(kMaxBlock) + ");\n";
  s += "  for (long long base = 0; base < " + ll(count) + "; base += blockDim.x) {\n";
  s += "    const long long j = base + threadIdx.x;\n    long long row = -1;\n";
  s += "    if (j < " + ll(count) + ") {\n" + c.rowOf(false) + "    row = p;\n    }\n";
  s += "    kiln_smem_rows[threadIdx.x] = row;\n    __syncthreads();\n";
  s += "    if (row >= 0) {\n      unsigned long long rank = 0;\n";
  s += "      for (unsigned t = 0; t < threadIdx.x; ++t) rank += kiln_smem_rows[t] == row;\n";
  s += "      a4[" + sorted + " + a4[" + cursor +
       " + row] + rank] = (unsigned long long)j;\n    }\n";
  s += "    __syncthreads();\n";  // Every slot read its cursor before any advances.
  s += "    if (row >= 0) atomicAdd(&a4[" + cursor +
       " + row], 1ULL);\n    __syncthreads();\n  }\n}\n";
  then[0].source = std::move(s);
  // _c
  then[1].domain = {c.outElements};
  s = "// " + n.describe() + ": combined\n" + head(then[1].name);
  s += "  " + gridLoop("i", c.outElements) + " {\n" + c.element;
  s += "    " + c.type + " acc = " + c.init + ";\n";
  s += "    for (unsigned long long e = a4[r]; e < a4[r + 1]; ++e) {\n";
  s += "      const long long j = (long long)a4[" + sorted + " + e];\n";
  s += "      const " + c.type + " v = " + c.source + ";\n      acc = " + c.combine + ";\n    }\n";
  s += "    a3[i] = acc;\n  }\n}\n";
  then[1].source = std::move(s);
  k.then = std::move(then);
}

// The statements resolving index `value` (a C expression) along a dim of `size` into `q`, and
// on one out of range setting `bad` (reporting flat position `position` with an index word,
// where `report`).
std::string resolveInto(const Kernel& k, bool report, const std::string& value,
                        const std::string& position, int64_t size) {
  std::string s = "      long long q = (long long)" + value +
                  ";\n      if (q < 0) q += " + ll(size) +
                  ";\n      if (q < 0 || q >= " + ll(size) + ") { bad = true; ";
  if (report) s += reportIndex(k, position, "(long long)" + value);
  return s + "}\n";
}

// gather_backward(grad [outer, count, inner], indices [count..], data [outer, dim, inner]) ->
// d data [outer, dim, inner] (f32, f64; i64/i32 indices): zeros with each grad row added at its
// index, in index order (combineByRows). Indices out of range add nothing (reported with an index
// word; checked before the run, or by the compiler, otherwise).
Expected<Kernel> gatherBackward(const ir::Node& n, std::string name, bool indexWord) {
  const ir::TensorType& d = n.input(2)->type();
  const ir::DType idx = n.input(1)->type().dtype;
  if (d.dtype != ir::DType::kF32 && d.dtype != ir::DType::kF64)
    return unimplemented("gather_backward's op kernel takes f32 or f64");
  if (idx != ir::DType::kI64 && idx != ir::DType::kI32)
    return unimplemented("gather_backward's op kernel takes i64 or i32 indices");
  for (const ir::Value* v : n.inputs())
    if (v->type().layout != ir::Layout::kPlain)
      return unimplemented("gather_backward's op kernel takes plain tensors");
  KILN_ASSIGN_OR_RETURN(const int axis,
                        ir::normalizeAxis(n.attr().getInt("axis"), d.shape.size(), "axis"));
  int64_t inner = 1;
  for (size_t i = static_cast<size_t>(axis) + 1; i < d.shape.size(); ++i) inner *= d.shape[i];
  const int64_t dim = d.shape[static_cast<size_t>(axis)];
  const int64_t count = n.input(1)->type().numElements();
  if (dim == 0 || count == 0 || n.output()->type().numElements() == 0)
    return unimplemented("gather_backward's op kernel takes non-empty operands");
  const std::string T = d.dtype == ir::DType::kF32 ? "float" : "double";
  const std::string I = idx == ir::DType::kI64 ? "long long" : "int";
  KILN_ASSIGN_OR_RETURN(Kernel k, kernelFor(n, std::move(name)));
  k.indexArgs.push_back({.arg = 1, .position = true, .limit = dim, .axis = axis, .data = 2});
  k.args.push_back({std::string(), ScalarType::kU8, true});
  addIndexWord(k, indexWord);
  RowCombine c;
  c.rows = dim;
  c.count = count;
  c.outElements = n.output()->type().numElements();
  c.params = "kiln_gptr<const " + T + "> a0, kiln_gptr<const " + I + "> a1, kiln_gptr<const " + T +
             "> a2, kiln_gptr<" + T + "> a3, kiln_gptr<unsigned long long> a4" + wordParam(k);
  c.rowOf = [&k, dim](bool report) {
    return "    long long p = -1;\n    {\n      bool bad = false;\n" +
           resolveInto(k, report, "a1[j]", "j", dim) + "      if (!bad) p = q;\n    }\n";
  };
  c.element = "    const long long col = i % " + ll(inner) + ", r = (i / " + ll(inner) + ") % " +
              ll(dim) + ", o = i / " + ll(dim * inner) + ";\n";
  c.type = T;
  c.init = "0";
  c.source = "a0[(o * " + ll(count) + " + j) * " + ll(inner) + " + col]";
  c.combine = "acc + v";
  combineByRows(k, n, c);
  return k;
}

// scatter_elements(data, indices, updates) along `axis` and scatter_nd(data, indices [.., K],
// updates) (f32, f64, i64, i32, i8, u8; i64/i32 indices; reduction none, add, mul, max, min):
// a copy of the data with each update combined in at its index, in index order
// (combineByRows), as the reference: the last one wins without a reduction; integers wrap.
// Each index is resolved as the reference's kernel reads it (IndexArg::limits); out of range,
// an update adds nothing (reported with an index word; checked before the run, or by the
// compiler, otherwise).
Expected<Kernel> scatter(const ir::Node& n, std::string name, bool indexWord) {
  const std::string op(ir::opName(n.op()));
  const ir::TensorType& d = n.input(0)->type();
  const ir::TensorType& ix = n.input(1)->type();
  for (const ir::Value* v : n.inputs())
    if (v->type().layout != ir::Layout::kPlain)
      return unimplemented(op + "'s op kernel takes plain tensors");
  if (ix.dtype != ir::DType::kI64 && ix.dtype != ir::DType::kI32)
    return unimplemented(op + "'s op kernel takes i64 or i32 indices");
  const ir::DType t = d.dtype;
  if (t != ir::DType::kF32 && t != ir::DType::kF64 && !isKernelInteger(t))
    return unimplemented(op + "'s op kernel takes f32, f64 or integers");
  if (d.numElements() == 0 || ix.numElements() == 0)
    return unimplemented(op + "'s op kernel takes non-empty operands");
  const std::string T = elementCType(t);
  const std::string I = ix.dtype == ir::DType::kI64 ? "long long" : "int";
  const std::string reduction = n.attr().getString("reduction");
  const bool isFloat = t == ir::DType::kF32 || t == ir::DType::kF64;
  std::string combine;
  if (reduction == "none")
    combine = "v";
  else if (reduction == "add")
    combine =
        isFloat ? "acc + v" : "(" + T + ")((" + wrapType(t) + ")acc + (" + wrapType(t) + ")v)";
  else if (reduction == "mul")
    combine =
        isFloat ? "acc * v" : "(" + T + ")((" + wrapType(t) + ")acc * (" + wrapType(t) + ")v)";
  else if (reduction == "max")
    combine = "acc < v ? v : acc";
  else if (reduction == "min")
    combine = "v < acc ? v : acc";
  else
    return unimplemented(op + "'s op kernel has no reduction '" + reduction + "'");
  KILN_ASSIGN_OR_RETURN(Kernel k, kernelFor(n, std::move(name)));
  RowCombine c;
  c.outElements = d.numElements();
  c.type = T;
  c.init = "a0[i]";
  c.combine = combine;
  IndexArg a{.arg = 1};
  if (n.op() == ir::OpKind::kScatterNd) {
    const int64_t kdims = ix.shape.back();
    if (kdims < 1 || kdims > static_cast<int64_t>(d.shape.size()))
      return unimplemented("scatter_nd's op kernel takes index tuples of 1 to rank dims");
    int64_t slice = 1;
    for (size_t e = static_cast<size_t>(kdims); e < d.shape.size(); ++e) slice *= d.shape[e];
    c.rows = d.numElements() / slice;
    c.count = ix.numElements() / kdims;
    std::vector<int64_t> rowStride(static_cast<size_t>(kdims), 1);
    for (int64_t e = kdims - 1; e > 0; --e)
      rowStride[static_cast<size_t>(e - 1)] =
          rowStride[static_cast<size_t>(e)] * d.shape[static_cast<size_t>(e)];
    for (int64_t e = 0; e < kdims; ++e) {
      a.limits.push_back(d.shape[static_cast<size_t>(e)]);
      a.dims.push_back(static_cast<int>(e));
    }
    c.rowOf = [&k, kdims, rowStride, shape = d.shape](bool report) {
      std::string s = "    long long p = 0;\n    bool bad = false;\n";
      for (int64_t e = 0; e < kdims; ++e) {
        const std::string at = "j * " + ll(kdims) + " + " + ll(e);
        s += "    {\n" +
             resolveInto(k, report, "a1[" + at + "]", at, shape[static_cast<size_t>(e)]) +
             "      p += q * " + ll(rowStride[static_cast<size_t>(e)]) + ";\n    }\n";
      }
      return s + "    if (bad) p = -1;\n";
    };
    c.element = "    const long long r = i / " + ll(slice) + ";\n";
    c.source = "a2[j * " + ll(slice) + " + i % " + ll(slice) + "]";
  } else {
    KILN_ASSIGN_OR_RETURN(const int axis,
                          ir::normalizeAxis(n.attr().getInt("axis"), d.shape.size(), "axis"));
    if (ix.shape.size() != d.shape.size())
      return unimplemented("scatter_elements' op kernel takes indices of the data's rank");
    c.rows = d.numElements();
    c.count = ix.numElements();
    a.limits = {d.shape[static_cast<size_t>(axis)]};
    a.dims = {axis};
    const std::vector<int64_t> strides = ir::contiguousStrides(d.shape);
    c.rowOf = [&k, axis, strides, dshape = d.shape, ishape = ix.shape](bool report) {
      std::string s = "    long long p = 0, rest = j;\n    bool bad = false;\n";
      for (size_t e = ishape.size(); e-- > 0;) {
        s += "    {\n";
        if (static_cast<int>(e) == axis)
          s += resolveInto(k, report, "a1[j]", "j", dshape[e]) + "      p += q * " +
               ll(strides[e]) + ";\n";
        else
          s += "      p += (rest % " + ll(ishape[e]) + ") * " + ll(strides[e]) + ";\n";
        s += "      rest /= " + ll(ishape[e]) + ";\n    }\n";
      }
      return s + "    if (bad) p = -1;\n";
    };
    c.element = "    const long long r = i;\n";
    c.source = "a2[j]";
  }
  if (c.count == 0) return unimplemented(op + "'s op kernel takes updates");
  a.limit = a.limits.front();
  k.indexArgs.push_back(std::move(a));
  k.args.push_back({std::string(), ScalarType::kU8, true});
  addIndexWord(k, indexWord);
  c.params = "kiln_gptr<const " + T + "> a0, kiln_gptr<const " + I + "> a1, kiln_gptr<const " + T +
             "> a2, kiln_gptr<" + T + "> a3, kiln_gptr<unsigned long long> a4" + wordParam(k);
  combineByRows(k, n, c);
  return k;
}

// topk_indices(x [outer, dim, inner]) -> i64 [outer, k, inner] along `axis` (f32, f64, i64, i32,
// i8, u8): the reference's stable order (by value, largest or smallest first, NaN the largest;
// ties by index), as k selections: a block a row, each selection the first element after the
// previous one in that order (a block's threads over the row, then thread 0 over theirs), so
// that nothing needs to remember what was chosen.
Expected<Kernel> topK(const ir::Node& n, std::string name) {
  const ir::TensorType& x = n.input(0)->type();
  if (x.layout != ir::Layout::kPlain)
    return unimplemented("topk_indices' op kernel takes a plain tensor");
  if (x.dtype != ir::DType::kF32 && x.dtype != ir::DType::kF64 && !isKernelInteger(x.dtype))
    return unimplemented("topk_indices' op kernel takes f32, f64 or integers");
  if (n.output()->type().numElements() == 0)
    return unimplemented("topk_indices' op kernel takes a non-empty output");
  KILN_ASSIGN_OR_RETURN(const int axis,
                        ir::normalizeAxis(n.attr().getInt("axis"), x.shape.size(), "axis"));
  int64_t outer = 1, inner = 1;
  for (size_t i = 0; i < static_cast<size_t>(axis); ++i) outer *= x.shape[i];
  for (size_t i = static_cast<size_t>(axis) + 1; i < x.shape.size(); ++i) inner *= x.shape[i];
  const int64_t dim = x.shape[static_cast<size_t>(axis)];
  const int64_t kk = n.attr().getInt("k");
  const bool largest = n.attr().getInt("largest") != 0;
  const std::string T = elementCType(x.dtype);
  KILN_ASSIGN_OR_RETURN(Kernel k, kernelFor(n, std::move(name)));
  const int64_t rows = outer * inner;
  k.domain = {rows * kCudaBlock};  // A block a row.
  const std::string before = k.name + "_before", D = ll(dim), I = ll(inner);
  std::string s = "// " + n.describe() + "\n";
  // Whether (a, ia) comes before (b, ib).
  s += "KILN_FN bool " + before + "(" + T + " a, long long ia, " + T + " b, long long ib) {\n";
  s += "  const bool an = a != a, bn = b != b;\n";
  s += "  const bool gt = an ? !bn : (!bn && a > b), lt = bn ? !an : (!an && a < b);\n";
  s += std::string("  return ") + (largest ? "gt" : "lt") + " || (!gt && !lt && ia < ib);\n}\n";
  s += "extern \"C\" __global__ void " + k.name + "(kiln_gptr<const " + T +
       "> a0, kiln_gptr<long long> a1) {\n";
  s += "  KILN_SHARED(" + T + ", kiln_smem_v, " + std::to_string(kMaxBlock) + ");\n";
  s += "  KILN_SHARED(long long, kiln_smem_i, " + std::to_string(kMaxBlock) + ");\n";
  s += "  for (long long row = blockIdx.x; row < " + ll(rows) + "; row += gridDim.x) {\n";
  s +=
      "    const long long base = (row / " + I + ") * " + ll(dim * inner) + " + row % " + I + ";\n";
  s += "    " + T + " prev = 0;\n    long long prevI = -1;\n";
  s += "    for (long long t = 0; t < " + ll(kk) + "; ++t) {\n";
  s += "      " + T + " best = 0;\n      long long bestI = -1;\n";
  s += "      for (long long j = threadIdx.x; j < " + D + "; j += blockDim.x) {\n";
  s += "        const " + T + " v = a0[base + j * " + I + "];\n";
  s += "        if (prevI >= 0 && !" + before + "(prev, prevI, v, j)) continue;\n";
  s += "        if (bestI < 0 || " + before + "(v, j, best, bestI)) {\n";
  s += "          best = v;\n          bestI = j;\n        }\n      }\n";
  s += "      kiln_smem_v[threadIdx.x] = best;\n      kiln_smem_i[threadIdx.x] = bestI;\n";
  s += "      __syncthreads();\n      if (threadIdx.x == 0) {\n";
  s += "        for (unsigned u = 1; u < blockDim.x; ++u) {\n";
  s += "          const long long ui = kiln_smem_i[u];\n";
  s += "          if (ui >= 0 && (bestI < 0 || " + before +
       "(kiln_smem_v[u], ui, best, bestI))) {\n";
  s += "            best = kiln_smem_v[u];\n            bestI = ui;\n          }\n        }\n";
  s += "        a1[(row / " + I + ") * " + ll(kk * inner) + " + t * " + I + " + row % " + I +
       "] = bestI;\n";
  s += "        kiln_smem_v[0] = best;\n        kiln_smem_i[0] = bestI;\n      }\n";
  s += "      __syncthreads();\n      prev = kiln_smem_v[0];\n      prevI = kiln_smem_i[0];\n";
  s += "      __syncthreads();\n    }\n  }\n}\n";
  k.source = std::move(s);
  return k;
}

// concat(a0 .. a{k-1}) -> ak along `axis`: each input [outer, d_t, inner] copied in a
// grid-stride loop of its own into its slot [outer, offset_t .. offset_t + d_t, inner] of the
// output [outer, D, inner], reads and writes contiguous runs; moved as bits.
Expected<Kernel> concat(const ir::Node& n, std::string name) {
  KILN_ASSIGN_OR_RETURN(const std::string T, movedElement(n));
  const ir::Shape& y = n.output()->type().shape;
  KILN_ASSIGN_OR_RETURN(const int axis,
                        ir::normalizeAxis(n.attr().getInt("axis"), y.size(), "axis"));
  int64_t inner = 1;
  for (size_t i = static_cast<size_t>(axis) + 1; i < y.size(); ++i) inner *= y[i];
  const int64_t D = y[static_cast<size_t>(axis)];
  // A pointer argument each: CUDA before 12.1 takes 4 KiB of kernel parameters (512 pointers).
  static constexpr size_t kMaxInputs = 500;
  if (n.inputs().size() > kMaxInputs)
    return unimplemented("concat's op kernel takes at most " + std::to_string(kMaxInputs) +
                         " inputs (a kernel parameter each)");
  KILN_ASSIGN_OR_RETURN(Kernel k, kernelFor(n, std::move(name)));
  const size_t count = n.inputs().size();
  std::string s = "// " + n.describe() + "\nextern \"C\" __global__ void " + k.name + "(";
  for (size_t t = 0; t < count; ++t) s += "kiln_gptr<const " + T + "> a" + std::to_string(t) + ", ";
  s += "kiln_gptr<" + T + "> a" + std::to_string(count) + ") {\n";
  int64_t offset = 0;
  for (size_t t = 0; t < count; ++t) {
    const ir::TensorType& x = n.input(t)->type();
    const int64_t run = x.shape[static_cast<size_t>(axis)] * inner;  // Elements per outer index.
    if (x.numElements() > 0) {
      const std::string at = "a" + std::to_string(t);
      s += "  " + gridLoop("i", x.numElements()) + "\n    a" + std::to_string(count) + "[(i / " +
           ll(run) + ") * " + ll(D * inner) + " + " + ll(offset * inner) + " + i % " + ll(run) +
           "] = " + at + "[i];\n";
    }
    offset += x.shape[static_cast<size_t>(axis)];
  }
  s += "}\n";
  k.source = std::move(s);
  return k;
}

// argmax and argmin (a0 x -> a1 i64) along `axis`: one thread an output element, scanning the
// axis in order as the reference (runtime/reference/reduce.cpp): the first extremum (the last
// with select_last_index), NaN winning over every number. x of f32, f64 or an integer dtype.
Expected<Kernel> argReduce(const ir::Node& n, std::string name) {
  const ir::TensorType& x = n.input(0)->type();
  if (x.layout != ir::Layout::kPlain || n.output()->type().numElements() == 0 ||
      !(x.dtype == ir::DType::kF32 || x.dtype == ir::DType::kF64 || isKernelInteger(x.dtype)))
    return unimplemented(std::string(ir::opName(n.op())) +
                         "'s op kernel takes plain f32, f64 or integers");
  KILN_ASSIGN_OR_RETURN(const int axis,
                        ir::normalizeAxis(n.attr().getInt("axis"), x.shape.size(), "axis"));
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(axis) + 1; d < x.shape.size(); ++d) inner *= x.shape[d];
  const int64_t dim = x.shape[static_cast<size_t>(axis)];
  const bool last = n.attr().getInt("select_last_index") != 0;
  const char* better = n.op() == ir::OpKind::kArgMax ? "v > b" : "v < b";
  KILN_ASSIGN_OR_RETURN(Kernel k, kernelFor(n, std::move(name)));
  const std::string T = elementCType(x.dtype);
  std::string s = "// " + n.describe() + "\nextern \"C\" __global__ void " + k.name +
                  "(kiln_gptr<const " + T + "> a0, kiln_gptr<long long> a1) {\n";
  s += "  " + gridLoop("r", k.numElements()) + " {\n";
  s += "    const long long base = (r / " + ll(inner) + ") * " + ll(dim * inner) + " + r % " +
       ll(inner) + ";\n";
  s += "    long long best = 0;\n    " + T + " b = a0[base];\n";
  s += "    for (long long k = 1; k < " + ll(dim) + "; ++k) {\n";
  s += "      const " + T + " v = a0[base + k * " + ll(inner) + "];\n";
  s += "      const bool vn = v != v, bn = b != b;\n";
  s += "      const bool better = !bn && (vn || " + std::string(better) + ");\n";
  s += "      const bool tie = (vn && bn) || (!vn && !bn && v == b);\n";
  s += std::string("      if (better") + (last ? " || tie" : "") +
       ") {\n        best = k;\n        b = v;\n      }\n    }\n    a1[r] = best;\n  }\n}\n";
  k.source = std::move(s);
  return k;
}

}  // namespace

Expected<Kernel> opKernel(const ir::Node& n, std::string name, bool indexWord) {
  switch (n.op()) {
    case ir::OpKind::kMaxPool2dBackward:
      return maxPool2dBackward(n, std::move(name));
    case ir::OpKind::kMaxPool2dIndices:
      return maxPool2dIndices(n, std::move(name));
    case ir::OpKind::kGather:
      return gather(n, std::move(name), indexWord);
    case ir::OpKind::kGatherElements:
      return gatherElements(n, std::move(name), indexWord);
    case ir::OpKind::kGatherBackward:
      return gatherBackward(n, std::move(name), indexWord);
    case ir::OpKind::kScatterElements:
    case ir::OpKind::kScatterNd:
      return scatter(n, std::move(name), indexWord);
    case ir::OpKind::kTopKIndices:
      return topK(n, std::move(name));
    case ir::OpKind::kConcat:
      return concat(n, std::move(name));
    case ir::OpKind::kArgMax:
    case ir::OpKind::kArgMin:
      return argReduce(n, std::move(name));
    case ir::OpKind::kAdd:
    case ir::OpKind::kSub:
    case ir::OpKind::kMul:
    case ir::OpKind::kDiv:
    case ir::OpKind::kMod:
    case ir::OpKind::kMinimum:
    case ir::OpKind::kMaximum:
    case ir::OpKind::kNeg:
    case ir::OpKind::kAbs:
    case ir::OpKind::kEqual:
    case ir::OpKind::kLess:
    case ir::OpKind::kLessEqual:
    case ir::OpKind::kGreater:
    case ir::OpKind::kGreaterEqual:
    case ir::OpKind::kLogicalAnd:
    case ir::OpKind::kLogicalOr:
    case ir::OpKind::kLogicalXor:
    case ir::OpKind::kLogicalNot:
    case ir::OpKind::kBitwiseAnd:
    case ir::OpKind::kBitwiseOr:
    case ir::OpKind::kBitwiseXor:
    case ir::OpKind::kBitwiseNot:
    case ir::OpKind::kBitShift:
    case ir::OpKind::kWhere:
    case ir::OpKind::kCast:
      return integerPointwise(n, std::move(name), indexWord);
    case ir::OpKind::kDropoutTrain:
    case ir::OpKind::kDropoutBackward:
      return dropout(n, std::move(name));
    case ir::OpKind::kNllLoss:
    case ir::OpKind::kCrossEntropyLoss:
      return loss(n, std::move(name), n.op() == ir::OpKind::kCrossEntropyLoss, indexWord);
    case ir::OpKind::kNllLossBackward:
    case ir::OpKind::kCrossEntropyLossBackward:
      return lossBackward(n, std::move(name), n.op() == ir::OpKind::kCrossEntropyLossBackward,
                          indexWord);
    default:
      return unimplemented("no op kernel for " + std::string(ir::opName(n.op())));
  }
}

}  // namespace kiln::codegen
