// Library kernels: the fast CPU implementations of library ops (oneDNN for convolution and
// pooling, oneDNN's sgemm or matmul for matmul/gemm/linear), with fused epilogues (post-ops). Eager
// and compiled execution both use them; ops and dtypes without one run the reference kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "ir/conv_algo.h"
#include "runtime/reference/kernels.h"

namespace kiln::runtime {

// An epilogue applied to a library op's output before it is stored: y = post(y). Formulas are
// the reference kernels' (ops.def), NaN and infinities included: a oneDNN primitive runs only
// the leading residual adds, kiln's own epilogue pass the activations (oneDNN's relu and clip
// turn NaN into a number; dnnl_support.h). Max pooling propagates NaN as the reference does.
struct PostOp {
  enum class Kind : uint8_t {
    kRelu,
    kLeakyRelu,  // alpha: the slope
    kClip,       // alpha: min, beta: max (NaN: no bound, as the clip op)
    kSigmoid,
    kTanh,
    kGeluErf,
    kGeluTanh,
    kAdd,  // y += extra[input] (same shape as y): a residual or broadcast-free add
  };
  Kind kind = Kind::kRelu;
  double alpha = 0;
  double beta = 0;
  int input = -1;
  bool operator==(const PostOp&) const = default;
};

// The post-ops oneDNN may run in a call with LibraryOptions::fuseActivations: relu and clip,
// whose max/min turn NaN into a number but raise the invalid flag when they do.
inline bool fusesWhenChecked(PostOp::Kind kind) {
  return kind == PostOp::Kind::kRelu || kind == PostOp::Kind::kClip;
}

// How conv2d is computed (ir/conv_algo.h).
using ir::ConvAlgo;  // ir/conv_algo.h
using ir::convAlgoName;
using ir::isCudnnConvAlgo;
using ir::parseConvAlgo;

// The algorithms that can run conv2d with these attributes, input shape x [N,C,H,W] and
// weight shape w [M,C/group,kh,kw] on this CPU, in order of preference (kAuto excluded).
// Winograd is probed by creating oneDNN's primitive descriptor, and is a candidate only where
// its bits do not depend on the thread count (lib::winogradThreadInvariant; both cached).
std::vector<ConvAlgo> convAlgorithms(const ir::AttrView& attrs, const ir::Shape& x,
                                     const ir::Shape& w);

// Which library runs matmul, gemm and linear. kAuto follows the measurements in matmul.cpp.
// kBlas: lib::sgemm per matrix and kiln's epilogue; kOneDnn: one oneDNN matmul primitive.
enum class GemmBackend : uint8_t { kAuto, kBlas, kOneDnn };

// Weights reordered for a library kernel (oneDNN blocked formats, im2col's channels-last
// weights), owned by the caller: a compiled plan or an eager session over a fixed model.
// Entries are keyed by the weight tensor's address and the target format, and keep the
// tensor's storage alive, so the address cannot be reused for other data while the entry
// lives. The contract is that cached weights are constant: call clear() after changing
// weights in place (an optimizer step). Thread-safe.
class LibraryCache {
 public:
  LibraryCache();
  ~LibraryCache();
  LibraryCache(const LibraryCache&) = delete;
  LibraryCache& operator=(const LibraryCache&) = delete;

  void clear();
  size_t numEntries() const;
  size_t bytes() const;  // Bytes of reordered weights held.
  size_t hits() const;   // Lookups served from the cache since construction.

  struct Impl;  // Defined in library/library_cache.h.
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// How runLibraryWithPostOps runs one call.
struct LibraryOptions {
  ConvAlgo algo = ConvAlgo::kAuto;  // conv2d only.
  // conv2d, max_pool2d, avg_pool2d: the activations (x, the output and kAdd extras) are
  // stored channels-last (NHWC) while their shapes stay logical [N,C,H,W]. Weights are OIHW.
  bool channelsLast = false;
  // Reordered weights are kept here across calls; without a cache they are reordered on
  // every call, as PyTorch eager does.
  LibraryCache* cache = nullptr;
  GemmBackend gemm = GemmBackend::kAuto;  // matmul, gemm and linear.
  // Convolutions and matrix products on a GPU round their multiplicands to TF32 (10-bit
  // mantissa, fp32 accumulation) on tensor cores (--precision tf32; BackendCaps::tf32). The
  // CPU's library has no TF32 and the compiler refuses it there.
  bool tf32 = false;
  // Set-up only: create the call's primitive and reorder its weights into `cache`, as its first
  // run would, and compute nothing (the activations' contents are not read). A plan prepares
  // every library step at compile or load time (PlanExecutor::prepare), so that its first run
  // pays no set-up. f16/bf16 calls (converted per call) have nothing to keep and return at once.
  bool prepare = false;
  // The call's operands were validated before, with these types and attributes: a plan step
  // after PlanExecutor::prepare validated it (a plan's steps keep their types). Skips the
  // per-call checks (dtypes, contiguity, shape inference of the output).
  bool validated = false;
  // relu and clip post-ops may run inside oneDNN's primitives (fusedPostOpPrefix), which turn a
  // NaN there into 0 or the bound where kiln's rule (the reference's) keeps it, and raise the
  // floating-point invalid flag (FE_INVALID) when they meet one: x86's max and min signal on a
  // NaN operand. Only a caller that clears the flag on every thread of the call before it,
  // tests it after it and, where it was raised, runs the call again without this option may set
  // it (PlanExecutor::run on the CPU), and only where fusedActivationsFlagNaN().
  bool fuseActivations = false;
};

// A library kernel for (op, dtype), or nullptr when there is none (use the reference).
// Same ABI as reference kernels: contiguous inputs, preallocated contiguous outputs, plain
// NCHW, no post-ops, no weight cache. f32, and f16/bf16 converted (widened, run, rounded once).
// Attribute combinations that oneDNN cannot express exactly run the reference kernel inside, so the
// result is always the reference's.
RefKernel libraryKernel(ir::OpKind op, ir::DType dtype);

// Whether bf16 convolutions and their gradients run on oneDNN's native bf16 kernels on this CPU
// (AVX512-BF16 or AMX: f32 accumulation, the result rounded once); elsewhere, and for every other
// f16/bf16 library call, the operands are widened to f32 and the result rounded once.
bool nativeBf16Convolutions();

// Whether LibraryOptions::fuseActivations is safe here: checked once per process on a small
// convolution with fused relu and clip, fed NaN, negatives and infinities, on one thread — every
// NaN must come out NaN or raise FE_INVALID, the finite values must equal kiln's epilogue's, and
// a run without NaN must leave the flag clear (else every run would run twice).
bool fusedActivationsFlagNaN();

// The same ops with an epilogue: `extra` holds the tensors kAdd post-ops read (same shape and
// layout as the output). Supported for conv2d, linear, gemm, matmul, max_pool2d and
// avg_pool2d in f32 with contiguous tensors; kUnimplemented for other ops and dtypes, for an
// algorithm that cannot run the shape, and for the rare attribute combinations oneDNN cannot
// express exactly (the caller then runs the reference kernel and the post-ops itself).
// Post-ops that a oneDNN primitive cannot fuse run in kiln's own pass over the output.
Status runLibraryWithPostOps(ir::OpKind op, const ir::AttrView& attrs,
                             std::span<const Tensor> inputs, std::span<const PostOp> post,
                             std::span<const Tensor> extra, Tensor& output,
                             const LibraryOptions& options = {});

}  // namespace kiln::runtime
