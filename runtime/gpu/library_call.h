// kiln's descriptors of the library calls the CUDA backend makes: a convolution or a pooling as
// cuDNN is asked for it, a (batched) matrix product with its bias as cuBLASLt is asked for it. They
// are built from an op call (describeLibraryCall) by the same code for every device and consumed by
// the device: the real one hands them to cuDNN/cuBLASLt, the emu device runs the CPU's library with
// exactly the shapes, strides and flags the descriptor holds (so a field the descriptor gets wrong
// gives a wrong emu result, which the tests compare against the reference kernels).
// Epilogues: a bias is part of the call; a residual add and a ReLU after a convolution or a
// matrix product are its LibraryEpilogue (other post-ops stay generated kernels).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "ir/status.h"
#include "ir/types.h"
#include "runtime/backend.h"

namespace kiln::runtime::gpu {

// y[n,k,p,q] = sum over c, r, s of x[n, g*C/G + c, p*strideH - padTop + r*dilationH, ...] *
// w[k, c, r, s] (+ bias[k]); groups split channels. Tensors are dense NCHW, or with channelsLast
// NHWC — the filters then KRSC (w's [k, c, r, s] with c innermost), as cuDNN's NHWC kernels read
// them; the bias is a row either way.
struct ConvDescriptor {
  int64_t n = 0, c = 0, h = 0, w = 0;  // Input.
  int64_t k = 0, r = 0, s = 0;         // Filters: k x (c / groups) x r x s.
  int64_t p = 0, q = 0;                // Output height and width.
  int64_t strideH = 1, strideW = 1, dilationH = 1, dilationW = 1;
  int64_t padTop = 0, padLeft = 0, padBottom = 0, padRight = 0;
  int64_t groups = 1;
  bool bias = false;
  // Which product: the forward (operands x, w[, bias] -> y), the gradient of the input
  // (dy, w, x -> dx; x gives only its shape) or of the filters (dy, x, w -> dw; w gives only its
  // shape), as the conv2d_backward_* ops order their inputs.
  enum class Pass : uint8_t { kForward, kBackwardData, kBackwardFilter } pass = Pass::kForward;
  ir::DType dtype = ir::DType::kF32;
  bool tf32 = false;  // LibraryOptions::tf32: multiplicands rounded to TF32.
  // The algorithm (OpCall::options.algo, chosen at compile time among the device's
  // convAlgorithms for this pass): a cuDNN one on a GPU, the CPU library's on emu; kAuto: the
  // library's heuristic at run time (for gradients its first deterministic algorithm).
  ConvAlgo algo = ConvAlgo::kAuto;
  // x, w, y and a residual channels-last (forward only: the gradients are NCHW).
  bool channelsLast = false;
};

// D[b] = alpha * op(A[b]) op(B[b]) + beta * C, row-major: op(A) is M x K, op(B) K x N, D M x N
// (ldd = N, batch stride M * N). A stride of 0 broadcasts that operand over the batch. C: none,
// a row vector broadcast over the rows (a bias of N), or an M x N matrix shared by the batch.
struct GemmDescriptor {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  bool transA = false, transB = false;
  int64_t lda = 0, ldb = 0;          // Row strides of the stored A and B.
  int64_t strideA = 0, strideB = 0;  // Batch strides (elements); 0 broadcasts.
  enum class C : uint8_t { kNone, kRow, kMatrix } c = C::kNone;
  double alpha = 1, beta = 0;
  ir::DType dtype = ir::DType::kF32;
  bool tf32 = false;  // LibraryOptions::tf32: A and B rounded to TF32.
};

// y[n,c,p,q] = max (or mean) over the window at (p*strideH - padTop, q*strideW - padLeft) with
// taps dilation apart; padded positions never win a max, and count in a mean only with
// countPadding. The output size is given (it encodes floor or ceil rounding).
struct PoolDescriptor {
  bool max = true;
  int64_t n = 0, c = 0, h = 0, w = 0;
  int64_t windowH = 1, windowW = 1, strideH = 1, strideW = 1, dilationH = 1, dilationW = 1;
  int64_t padTop = 0, padLeft = 0, padBottom = 0, padRight = 0;
  int64_t p = 0, q = 0;
  bool countPadding = false;
  ir::DType dtype = ir::DType::kF32;
  bool channelsLast = false;  // x and y NHWC.
};

// What a forward convolution or a matrix product applies to its result before storing it, in
// kiln's post-op order: + a residual operand shaped like the output (an IEEE addition), then ReLU
// keeping NaN (kiln's rule: fused == unfused). These are the post-op chains every device runs
// exactly: cuDNN (cudnnConvolutionBiasActivationForward's z and CUDNN_PROPAGATE_NAN) and cuBLASLt
// (C with beta 1, CUBLASLT_EPILOGUE_RELU[_BIAS]) express them, and where a device's fused ReLU
// turns NaN into 0 (checked once per process on the real device) it runs cuDNN's separate
// NaN-propagating activation instead. After a matrix product, gelu(approximate="tanh") is
// cuBLASLt's CUBLASLT_EPILOGUE_GELU[_BIAS] where it matches kiln's formula and keeps NaN (also
// checked once per process; else such a call runs on the host). Other activations stay
// generated kernels: the libraries document neither their NaN behaviour nor kiln's erf GELU.
struct LibraryEpilogue {
  bool residual = false;  // Its operand follows the call's own inputs.
  bool relu = false;
  // gelu(approximate="tanh") after a matrix product: cuBLASLt's GELU epilogue, which computes
  // that formula (its erf GELU is not offered: kiln's default gelu stays a generated kernel).
  bool geluTanh = false;
  bool any() const { return residual || relu || geluTanh; }
  bool operator==(const LibraryEpilogue&) const = default;
};

// The epilogue that runs post-ops `post` after a library call of `op`, or nullopt where no
// device library call runs that chain (then the compiler keeps them as generated kernels).
std::optional<LibraryEpilogue> libraryEpilogueFor(ir::OpKind op, std::span<const PostOp> post);

struct LibraryCall {
  std::variant<ConvDescriptor, GemmDescriptor, PoolDescriptor> desc;
  LibraryEpilogue epilogue;
  // One line for --explain and errors: "conv2d n1 c64 56x56 -> k64 3x3 s1 p1 g1 +bias".
  std::string describe() const;
  std::string describeProduct() const;  // describe() without the epilogue.
  // The operand index of the residual (epilogue.residual): after the descriptor's own inputs.
  size_t residualOperand() const;
};

// The descriptor of `call` (inputs then the output in operand order: conv x, w[, b]; gemm A, B[,
// C]; then a residual post-op's operand), or kUnimplemented saying why the devices' libraries
// cannot take it (then the op runs on the host).
Expected<LibraryCall> describeLibraryCall(const OpCall& call,
                                          std::span<const ir::TensorType> inputs,
                                          const ir::TensorType& output);

// Whether describeLibraryCall takes `op` for some shapes with this output dtype and layout
// (channels-last: the forward convolution and pooling, ops with ir::kChannelsLast).
bool describesLibraryOp(ir::OpKind op, ir::DType dtype, ir::Layout layout);

// The bytes of each operand of a described call (inputs then the output), f32 elements.
std::vector<int64_t> operandBytes(const LibraryCall& call);

// The algorithms the CPU's library runs a forward convolution with (the emu device's choice).
std::vector<ConvAlgo> hostConvAlgorithms(const ConvDescriptor& c);

// `x` rounded to TF32 (8-bit exponent, 10-bit mantissa; to nearest, ties to even), as tensor
// cores read fp32 operands under TF32: what emu does to the multiplicands of a tf32 call.
float roundToTf32(float x);

// Runs a described call with the CPU's library on host memory (the emu device): operands as
// describeLibraryCall ordered them, the output last (a residual may share the output's memory).
Status runLibraryCallOnHost(const LibraryCall& call, std::span<void* const> operands);

}  // namespace kiln::runtime::gpu
