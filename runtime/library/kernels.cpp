// The library kernels' entry points (kernels.h): validation of a call, dispatch to a family,
// conv2d algorithm choice, and the RefKernel-ABI kernels eager execution uses.
#include "runtime/library/kernels.h"

#include <omp.h>
#include <dnnl.hpp>

#include <cfenv>
#include <cmath>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "runtime/library/dnnl_support.h"
#include "runtime/library/epilogue.h"
#include "runtime/library/families.h"
#include "runtime/reference/helpers.h"

namespace kiln::runtime {

namespace {

using ir::OpKind;

bool isHalf(ir::DType t) {
  return t == ir::DType::kF16 || t == ir::DType::kBF16;
}

// The op table's library ops (ops.def's kLibrary).
bool hasLibraryKernel(OpKind op) {
  return ir::opInfo(op).has(ir::kLibrary);
}

// The algorithm kAuto stands for, given the operands' type. A 1x1 convolution of one pixel
// (squeeze-excite's, at batch 1) is a matrix-vector product: lib::sgemm in 1-4 us (measured
// with OpenBLAS's sgemv; oneDNN's sgemm is as fast there) where oneDNN's primitive takes 3-6 us
// (autotuned on mobilenet_v3_small's 18 of them, 2 threads); f32 3x3 convolutions of enough
// channels run on oneDNN's winograd where it has one (lib::prefersWinograd, what autotuning picks
// there); everything else on oneDNN's direct.
bool runsOnIm2col(ConvAlgo algo, const lib::ConvGeometry& g) {
  return algo == ConvAlgo::kIm2colGemm ||
         (algo == ConvAlgo::kAuto && g.isPointwise() && g.group == 1 && g.n * g.oh * g.ow == 1);
}
ConvAlgo resolvedConvAlgo(ConvAlgo algo, const lib::ConvGeometry& g, ir::DType operands,
                          const LibraryOptions& options) {
  if (algo != ConvAlgo::kAuto) return algo;
  if (runsOnIm2col(algo, g)) return ConvAlgo::kIm2colGemm;
  if (operands == ir::DType::kF32 && lib::prefersWinograd(g, options.cache != nullptr))
    return ConvAlgo::kWinograd;
  return ConvAlgo::kDirect;
}

Status runConv2d(const lib::Call& call) {
  const lib::ConvGeometry g =
      lib::ConvGeometry::of(call.attrs, call.in[0].shape(), call.in[1].shape());
  if (g.c == 0) return unimplemented("conv2d with no input channels");
  const ConvAlgo algo = resolvedConvAlgo(call.options.algo, g, call.in[0].dtype(), call.options);
  switch (algo) {
    case ConvAlgo::kDirect:
    case ConvAlgo::kWinograd:
      return lib::runConvDnnl(call, g, algo);
    case ConvAlgo::kIm2colGemm:
      return lib::runConvIm2col(call, g);
    default:
      break;
  }
  return invalidArgument("conv2d: algorithm '" + std::string(convAlgoName(call.options.algo)) +
                         "' is not the CPU's (a plan compiled for a CUDA device)");
}

// Runs a validated call on its family. oneDNN and allocation failures become errors.
Status runFamily(OpKind op, const lib::Call& call) {
  try {
    switch (op) {
      case OpKind::kConv2d:
        return runConv2d(call);
      case OpKind::kConvTranspose2d:
        return ref::asConvBackwardData(
            call.attrs, call.in, call.out,
            [&](const ir::AttrView& data, std::span<const Tensor> operands) {
              return runFamily(
                  OpKind::kConv2dBackwardData,
                  lib::Call{data, operands, call.post, call.extra, call.out, call.options});
            });
      case OpKind::kConv2dBackwardData:
      case OpKind::kConv2dBackwardWeight: {
        // Shapes oneDNN would run on its reference implementation run on kiln's.
        Status s = lib::runConvBackwardDnnl(call, op == OpKind::kConv2dBackwardWeight);
        if (s.code() != ErrorCode::kUnimplemented) return s;
        return call.options.prepare ? Status::ok() : lib::runReferenceThroughPlain(op, call);
      }
      case OpKind::kBatchNormStats:
      case OpKind::kBatchNormBackwardReduce:
      case OpKind::kBatchNormBackward:
      case OpKind::kMaxPool2dBackward:
      case OpKind::kConv2dBackwardBias:
        return lib::runTrainingKernel(op, call);
      case OpKind::kMaxPool2d:
      case OpKind::kAvgPool2d:
        return lib::runPool2d(call);
      case OpKind::kMatMul:
        return lib::runMatMul(call);
      case OpKind::kGemm:
        return lib::runGemm(call);
      case OpKind::kLinear:
        return lib::runLinear(call);
      case OpKind::kConcat:
        return lib::runConcat(call);
      case OpKind::kAttention:
        return lib::runAttention(call);
      default:
        break;
    }
  } catch (const dnnl::error& e) {
    return internalError(std::string(ir::opName(op)) + ": oneDNN failed: " + e.what());
  } catch (const std::bad_alloc&) {
    return invalidArgument(std::string(ir::opName(op)) +
                           ": out of memory for the library kernel's buffers");
  }
  return unimplemented("no library kernel for " + std::string(ir::opName(op)));
}

// `what` names the tensor in errors, with `index` after it when >= 0. Nothing is built on success:
// a plan runs these checks at every library call.
Status checkTensor(OpKind op, const Tensor& t, std::string_view what, int64_t index = -1) {
  auto named = [&] {
    return index >= 0 ? std::string(what) + " " + std::to_string(index) : std::string(what);
  };
  if (!t.defined())
    return invalidArgument(std::string(ir::opName(op)) + ": " + named() + " is empty");
  if (t.dtype() != ir::DType::kF32)
    return unimplemented(std::string(ir::opName(op)) + ": library kernels run f32 only, " +
                         named() + " is " + t.describe());
  if (!t.isContiguous())
    return invalidArgument(std::string(ir::opName(op)) + ": " + named() + " " + t.describe() +
                           " must be contiguous");
  return Status::ok();
}

// Checks dtypes, contiguity, the output's shape against shape inference and the kAdd extras.
Status validate(OpKind op, const ir::AttrView& attrs, std::span<const Tensor> inputs,
                std::span<const PostOp> post, std::span<const Tensor> extra, const Tensor& output) {
  auto name = [op] { return std::string(ir::opName(op)); };
  if (!hasLibraryKernel(op)) return unimplemented("no library kernel for " + name());
  if (attrs.op().kind != op)
    return internalError(name() + ": attributes are for " + std::string(attrs.op().name));
  std::vector<ir::TensorType> types;
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_TRY(checkTensor(op, inputs[i], "input", static_cast<int64_t>(i)));
    types.push_back(inputs[i].type());
  }
  KILN_TRY(checkTensor(op, output, "output"));
  KILN_ASSIGN_OR_RETURN(auto inferred, ir::inferTypes(op, types, attrs.raw()));
  if (inferred.size() != 1 || inferred[0].shape != output.shape())
    return invalidArgument(name() + ": output " + output.describe() + " should be " +
                           (inferred.empty() ? std::string("?") : inferred[0].toString()));
  for (const PostOp& p : post) {
    if (p.kind != PostOp::Kind::kAdd) continue;
    if (p.input < 0 || static_cast<size_t>(p.input) >= extra.size())
      return invalidArgument(name() + ": add post-op reads extra input " + std::to_string(p.input) +
                             " of " + std::to_string(extra.size()));
    const Tensor& e = extra[static_cast<size_t>(p.input)];
    KILN_TRY(checkTensor(op, e, "add post-op input", p.input));
    if (e.shape() != output.shape())
      return invalidArgument(name() + ": add post-op input " + e.describe() +
                             " must have the output's shape " + output.describe());
  }
  return Status::ok();
}

// A copy of half-precision `t` widened to f32 (exact), in the same memory order.
Expected<Tensor> widened(const Tensor& t) {
  KILN_ASSIGN_OR_RETURN(Tensor w, Tensor::empty(ir::DType::kF32, t.shape()));
  ref::halfBitsToFloat(t.dtype(), t.data<uint16_t>(), w.data<float>(), t.numElements());
  return w;
}

// An f16/bf16 call run in f32: every operand (inputs and extras, contiguous, in `output`'s
// dtype) widened to f32 (exact), `run(wideIn, wideExtra, wideOut)`, the result rounded once into
// `output`, as a GPU's library computes it. kUnimplemented for other operands.
template <class Run>
Status runConverted(OpKind op, std::span<const Tensor> inputs, std::span<const Tensor> extra,
                    Tensor& output, Run run) {
  std::vector<Tensor> wideIn, wideExtra;
  for (auto [group, wide] : {std::pair{inputs, &wideIn}, std::pair{extra, &wideExtra}})
    for (const Tensor& t : group) {
      if (!t.defined() || t.dtype() != output.dtype() || !t.isContiguous())
        return unimplemented(
            std::string(ir::opName(op)) + ": a " + std::string(ir::dtypeName(output.dtype())) +
            " library call takes contiguous " + std::string(ir::dtypeName(output.dtype())) +
            " operands, got " + (t.defined() ? t.describe() : std::string("none")));
      KILN_ASSIGN_OR_RETURN(Tensor w, widened(t));
      wide->push_back(std::move(w));
    }
  KILN_ASSIGN_OR_RETURN(Tensor wideOut, Tensor::empty(ir::DType::kF32, output.shape()));
  KILN_TRY(run(wideIn, wideExtra, wideOut));
  ref::floatToHalfBits(output.dtype(), wideOut.data<float>(), output.data<uint16_t>(),
                       output.numElements());
  return Status::ok();
}

// A bf16 convolution or convolution gradient on oneDNN's native bf16 kernels (where
// nativeBf16Convolutions()): the operands the products read stay bf16, everything else (a
// convolution's bias and residual addends, the result, the post-ops) is f32, and the result is
// rounded once into `output`: the numerics of the converted call, at bf16 speed. kUnimplemented
// for other ops, algorithms and shapes oneDNN runs on its reference code (the caller converts).
Status runNativeBf16(OpKind op, const ir::AttrView& attrs, std::span<const Tensor> inputs,
                     std::span<const PostOp> post, std::span<const Tensor> extra, Tensor& output,
                     const LibraryOptions& options) {
  const bool forward = op == OpKind::kConv2d;
  const bool gradient = op == OpKind::kConv2dBackwardData || op == OpKind::kConv2dBackwardWeight;
  if (!forward && (!gradient || !post.empty())) return unimplemented("no native bf16 kernel");
  // Every operand contiguous bf16, as the converted call requires (conv2d reads x and w and
  // widens its bias; the gradients read two operands, the third gives a shape), every add
  // post-op's operand the output's shape.
  if (inputs.size() < 2) return unimplemented("native bf16 products take two operands");
  for (auto group : {inputs, extra})
    for (const Tensor& t : group)
      if (!t.defined() || t.dtype() != ir::DType::kBF16 || !t.isContiguous())
        return unimplemented("native bf16 products take contiguous bf16 operands");
  for (const Tensor& e : extra)
    if (e.shape() != output.shape()) return unimplemented("an add operand of another shape");
  if (output.numElements() == 0) return Status::ok();
  // conv2d (x, w, bias), conv2d_backward_data (dy, w, x), conv2d_backward_weight (dy, x, w).
  const bool dataGradient = op == OpKind::kConv2dBackwardData;
  const Tensor& x = inputs[forward ? 0 : dataGradient ? 2 : 1];
  const Tensor& w = inputs[forward || dataGradient ? 1 : 2];
  const lib::ConvGeometry g = lib::ConvGeometry::of(attrs, x.shape(), w.shape());
  if (g.c == 0 || g.m == 0) return unimplemented("an empty convolution");
  if (forward && resolvedConvAlgo(options.algo, g, x.dtype(), options) != ConvAlgo::kDirect)
    return unimplemented("native bf16 convolutions are oneDNN's direct ones");
  // Preparing (LibraryOptions::prepare) makes the primitive and reorders the weights only: the
  // activations are placeholders, read as f32 for their shapes, nothing allocated or converted.
  auto asF32 = [](const Tensor& t) {
    return Tensor::wrap(const_cast<std::byte*>(t.rawData()), ir::DType::kF32, t.shape());
  };
  std::vector<Tensor> in(inputs.begin(), inputs.end()), wideExtra;
  if (forward && in.size() == 3) {
    KILN_ASSIGN_OR_RETURN(in[2], widened(inputs[2]));  // The bias.
  }
  for (const Tensor& e : extra) {
    if (options.prepare) {
      wideExtra.push_back(asF32(e));
      continue;
    }
    KILN_ASSIGN_OR_RETURN(Tensor w, widened(e));
    wideExtra.push_back(std::move(w));
  }
  Tensor wideOut = asF32(output);
  if (!options.prepare) {
    KILN_ASSIGN_OR_RETURN(wideOut, Tensor::empty(ir::DType::kF32, output.shape()));
  }
  const lib::Call call{attrs, in, post, wideExtra, wideOut, options};
  KILN_TRY(forward ? lib::runConvDnnl(call, g, ConvAlgo::kDirect)
                   : lib::runConvBackwardDnnl(call, op == OpKind::kConv2dBackwardWeight));
  if (options.prepare) return Status::ok();
  ref::floatToHalfBits(output.dtype(), wideOut.data<float>(), output.data<uint16_t>(),
                       output.numElements());
  return Status::ok();
}

// The RefKernel-ABI library kernel of Op: plain NCHW, no post-ops, no weight cache. What the
// library cannot express runs the reference kernel, so the result is always the reference's.
template <OpKind Op>
Status abiKernel(const ir::AttrView& attrs, std::span<const Tensor> in, std::span<Tensor> out) {
  if (in[0].dtype() == ir::DType::kF32) {
    if (out[0].numElements() == 0) return Status::ok();
    const LibraryOptions options;
    const lib::Call call{attrs, in, {}, {}, out[0], options};
    Status s = runFamily(Op, call);
    if (s.code() != ErrorCode::kUnimplemented) return s;
  } else if (isHalf(in[0].dtype())) {
    // f16/bf16 as a compiled plan runs them (runLibraryWithPostOps).
    Status s = runLibraryWithPostOps(Op, attrs, in, {}, {}, out[0], LibraryOptions{});
    if (s.code() != ErrorCode::kUnimplemented) return s;
  }
  return referenceKernel(Op)(attrs, in, out);
}

}  // namespace

namespace lib {

ConvGeometry ConvGeometry::of(const ir::AttrView& attrs, const ir::Shape& x, const ir::Shape& w) {
  const auto& st = attrs.getInts("strides");
  const auto& pads = attrs.getInts("pads");
  const auto& dil = attrs.getInts("dilations");
  ConvGeometry g;
  g.n = x[0];
  g.c = x[1];
  g.h = x[2];
  g.w = x[3];
  g.m = w[0];
  g.kh = w[2];
  g.kw = w[3];
  g.group = attrs.getInt("group");
  g.strideH = st[0];
  g.strideW = st[1];
  g.padTop = pads[0];
  g.padLeft = pads[1];
  g.padBottom = pads[2];
  g.padRight = pads[3];
  g.dilH = dil[0];
  g.dilW = dil[1];
  // Shape inference's formula (ir/infer_nn.cpp, floor mode).
  g.oh = (g.h + g.padTop + g.padBottom - ((g.kh - 1) * g.dilH + 1)) / g.strideH + 1;
  g.ow = (g.w + g.padLeft + g.padRight - ((g.kw - 1) * g.dilW + 1)) / g.strideW + 1;
  return g;
}

}  // namespace lib

std::vector<ConvAlgo> convAlgorithms(const ir::AttrView& attrs, const ir::Shape& x,
                                     const ir::Shape& w) {
  std::vector<ConvAlgo> algos{ConvAlgo::kDirect};
  const lib::ConvGeometry g = lib::ConvGeometry::of(attrs, x, w);
  try {
    // Autotuning is for a compiled model, whose weights are cached; a winograd whose bits
    // depend on the thread count is no candidate (kiln's results do not).
    if (lib::winogradAvailable(g) && lib::winogradThreadInvariant(g, /*weightsCached=*/true))
      algos.push_back(ConvAlgo::kWinograd);
  } catch (const dnnl::error&) {
    // Probing failed: winograd is not a candidate.
  }
  algos.push_back(ConvAlgo::kIm2colGemm);
  return algos;
}

RefKernel libraryKernel(ir::OpKind op, ir::DType dtype) {
  if (dtype != ir::DType::kF32 && !isHalf(dtype)) return nullptr;
  switch (op) {
    case OpKind::kConv2d:
      return abiKernel<OpKind::kConv2d>;
    case OpKind::kConv2dBackwardData:
      return abiKernel<OpKind::kConv2dBackwardData>;
    case OpKind::kConv2dBackwardWeight:
      return abiKernel<OpKind::kConv2dBackwardWeight>;
    case OpKind::kConvTranspose2d:
      return abiKernel<OpKind::kConvTranspose2d>;
    case OpKind::kMaxPool2d:
      return abiKernel<OpKind::kMaxPool2d>;
    case OpKind::kAvgPool2d:
      return abiKernel<OpKind::kAvgPool2d>;
    case OpKind::kMatMul:
      return abiKernel<OpKind::kMatMul>;
    case OpKind::kGemm:
      return abiKernel<OpKind::kGemm>;
    case OpKind::kLinear:
      return abiKernel<OpKind::kLinear>;
    case OpKind::kConcat:
      return abiKernel<OpKind::kConcat>;
    case OpKind::kAttention:
      return abiKernel<OpKind::kAttention>;
    case OpKind::kConv2dBackwardBias:
      return abiKernel<OpKind::kConv2dBackwardBias>;
    case OpKind::kMaxPool2dBackward:
      return abiKernel<OpKind::kMaxPool2dBackward>;
    case OpKind::kBatchNormStats:
      return abiKernel<OpKind::kBatchNormStats>;
    case OpKind::kBatchNormBackwardReduce:
      return abiKernel<OpKind::kBatchNormBackwardReduce>;
    case OpKind::kBatchNormBackward:
      return abiKernel<OpKind::kBatchNormBackward>;
    default:
      return nullptr;
  }
}

bool nativeBf16Convolutions() {
  // oneDNN's avx512_core_bf16 kernels (vdpbf16ps, f32 accumulation): AVX512-BF16 or AMX.
  static const bool native = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (isa & bf16) == bf16;
  }();
  return native;
}

namespace {

// One 1x1 convolution of 8 channels over 2x3 pixels with identity filters, channels-last, post-op
// `op` fused: whether each NaN of the exact call (kiln's epilogue after the primitive) came out
// NaN or raised FE_INVALID, every other value came out equal, and an input without NaN left the
// flag clear.
bool fusedActivationChecks(const PostOp& op) {
  constexpr int64_t kC = 8, kPixels = 6;
  constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
  Tensor w = *Tensor::empty(ir::DType::kF32, {kC, kC, 1, 1});
  for (int64_t o = 0; o < kC; ++o)
    for (int64_t i = 0; i < kC; ++i) w.data<float>()[o * kC + i] = o == i ? 1.f : 0.f;
  ir::AttrMap attrs = {{"strides", std::vector<int64_t>{1, 1}},
                       {"pads", std::vector<int64_t>{0, 0, 0, 0}},
                       {"dilations", std::vector<int64_t>{1, 1}},
                       {"group", int64_t{1}}};
  const ir::AttrView view(ir::opInfo(ir::OpKind::kConv2d), attrs);
  LibraryOptions options;
  options.channelsLast = true;
  options.fuseActivations = true;
  options.algo = ConvAlgo::kDirect;
  for (const bool withNaN : {false, true}) {
    Tensor x = *Tensor::empty(ir::DType::kF32, {1, kC, 2, 3});  // NHWC in memory.
    float* xs = x.data<float>();
    for (int64_t i = 0; i < kC * kPixels; ++i) xs[i] = static_cast<float>(i % 13) * 0.75f - 4.f;
    if (withNaN) xs[5] = xs[22] = xs[40] = kNaN;
    Tensor y = *Tensor::empty(ir::DType::kF32, {1, kC, 2, 3});
    Tensor want = *Tensor::empty(ir::DType::kF32, {1, kC, 2, 3});
    const std::vector<Tensor> in{x, w};
    LibraryOptions exact = options;
    exact.fuseActivations = false;
    if (!runLibraryWithPostOps(ir::OpKind::kConv2d, view, in, std::span(&op, 1), {}, want, exact)
             .isOk())
      return false;
    feclearexcept(FE_INVALID);
    if (!runLibraryWithPostOps(ir::OpKind::kConv2d, view, in, std::span(&op, 1), {}, y, options)
             .isOk())
      return false;
    const bool raised = fetestexcept(FE_INVALID) != 0;
    feclearexcept(FE_INVALID);
    if (!withNaN && raised) return false;
    for (int64_t i = 0; i < kC * kPixels; ++i) {
      const float got = y.data<float>()[i], ref = want.data<float>()[i];
      if (std::isnan(ref) ? !std::isnan(got) && !raised : got != ref) return false;
    }
  }
  return true;
}

}  // namespace

bool fusedActivationsFlagNaN() {
  static const bool safe = [] {
    // One thread: the flag is the calling thread's.
    const int before = omp_get_max_threads();
    omp_set_num_threads(1);
    PostOp relu, clip;
    relu.kind = PostOp::Kind::kRelu;
    clip.kind = PostOp::Kind::kClip;
    clip.alpha = 0;
    clip.beta = 6;
    const bool ok = fusedActivationChecks(relu) && fusedActivationChecks(clip);
    omp_set_num_threads(before);
    return ok;
  }();
  return safe;
}

Status runLibraryWithPostOps(ir::OpKind op, const ir::AttrView& attrs,
                             std::span<const Tensor> inputs, std::span<const PostOp> post,
                             std::span<const Tensor> extra, Tensor& output,
                             const LibraryOptions& options) {
  if (op == OpKind::kConvTranspose2d)  // The backward-data call it is, bf16 kernels and all.
    return ref::asConvBackwardData(
        attrs, inputs, output, [&](const ir::AttrView& data, std::span<const Tensor> operands) {
          return runLibraryWithPostOps(OpKind::kConv2dBackwardData, data, operands, post, extra,
                                       output, options);
        });
  // f16/bf16 (autocast): the operands widened to f32 (exact), the f32 call with its post-ops,
  // the result rounded once, as a GPU's library computes it. bf16 convolutions and their
  // gradients run on oneDNN's native bf16 kernels where the CPU has them (runNativeBf16: the
  // same numerics, f32 accumulation); the rest is converted, slower than f32.
  if (output.defined() && isHalf(output.dtype())) {
    if (output.dtype() == ir::DType::kBF16 && nativeBf16Convolutions()) {
      Status s = runNativeBf16(op, attrs, inputs, post, extra, output, options);
      if (s.code() != ErrorCode::kUnimplemented) return s;
    }
    if (options.prepare) return Status::ok();  // Converted calls have nothing to prepare.
    // Training's BatchNorm and gradient kernels (channels-last ops that are neither autocast
    // products nor low-precision ops) compute in their type, as their reference kernels and
    // eager mode do: through plain copies when channels-last.
    if (ir::hasTrait(op, ir::kChannelsLast) && !ir::hasTrait(op, ir::kAutocast) &&
        !ir::hasTrait(op, ir::kLowPrecision)) {
      return lib::runReferenceThroughPlain(op,
                                           lib::Call{attrs, inputs, post, extra, output, options});
    }
    // No reordered-weight cache: its entries are keyed by the (here fresh) operand's address
    // and would pin a new widened copy at every call.
    LibraryOptions f32Options = options;
    f32Options.cache = nullptr;
    f32Options.validated = false;  // A prepared half call returned before validating.
    return runConverted(
        op, inputs, extra, output,
        [&](std::span<const Tensor> wideIn, std::span<const Tensor> wideExtra, Tensor& wideOut) {
          return runLibraryWithPostOps(op, attrs, wideIn, post, wideExtra, wideOut, f32Options);
        });
  }
  if (!options.validated) KILN_TRY(validate(op, attrs, inputs, post, extra, output));
  if (output.numElements() == 0) return Status::ok();
  // oneDNN convolutions detach aliased extras themselves (their sum post-op reads dst; a
  // residual planned in place over the output stays there); im2col writes the output first.
  const bool dnnlConv = op == OpKind::kConv2d &&
                        !runsOnIm2col(options.algo, lib::ConvGeometry::of(attrs, inputs[0].shape(),
                                                                          inputs[1].shape()));
  std::vector<Tensor> detached;
  if (!dnnlConv && !extra.empty() && !options.prepare) {
    try {
      detached = lib::detachAliasedExtras(extra, output);
    } catch (const std::bad_alloc&) {
      return invalidArgument(std::string(ir::opName(op)) + ": out of memory copying a residual");
    }
    extra = detached;
  }
  const lib::Call call{attrs, inputs, post, extra, output, options};
  return runFamily(op, call);
}

}  // namespace kiln::runtime
