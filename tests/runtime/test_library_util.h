// Helpers for the library-kernel tests: deterministic random tensors, NCHW <-> NHWC copies,
// running an op through runLibraryWithPostOps, the same op plus post-ops through the
// reference kernels (the ground truth), and comparisons relative to max |reference|.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "runtime/library/kernels.h"
#include "runtime/reference/helpers.h"
#include "runtime/reference/kernels.h"

namespace kiln::libtest {

using ir::DType;
using ir::OpKind;
using ir::Shape;
using runtime::ConvAlgo;
using runtime::GemmBackend;
using runtime::LibraryOptions;
using runtime::PostOp;
using runtime::Tensor;
using Kind = PostOp::Kind;

// Uniform values in [lo, hi) from a fixed seed.
inline Tensor randomTensor(const Shape& shape, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  auto t = Tensor::empty(DType::kF32, shape);
  REQUIRE(t.hasValue());
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  float* p = t->data<float>();
  for (int64_t i = 0; i < t->numElements(); ++i) p[i] = dist(gen);
  return *t;
}

inline Tensor emptyLike(const Shape& shape) {
  auto t = Tensor::empty(DType::kF32, shape);
  REQUIRE(t.hasValue());
  return *t;
}

// `t` (f32) rounded to bf16.
inline Tensor toBf16(const Tensor& t) {
  auto h = Tensor::empty(DType::kBF16, t.shape());
  REQUIRE(h.hasValue());
  runtime::ref::floatToHalfBits(DType::kBF16, t.data<float>(), h->data<uint16_t>(),
                                t.numElements());
  return *h;
}

// `h` (bf16) widened to f32 (exact).
inline Tensor fromBf16(const Tensor& h) {
  auto f = Tensor::empty(DType::kF32, h.shape());
  REQUIRE(f.hasValue());
  runtime::ref::halfBitsToFloat(DType::kBF16, h.data<uint16_t>(), f->data<float>(),
                                h.numElements());
  return *f;
}
// A copy of an NCHW tensor stored channels-last; the shape stays logical [N,C,H,W].
inline Tensor toNhwc(const Tensor& x) {
  const Shape& s = x.shape();
  Tensor y = emptyLike(s);
  const float* in = x.data<float>();
  float* out = y.data<float>();
  for (int64_t n = 0; n < s[0]; ++n)
    for (int64_t c = 0; c < s[1]; ++c)
      for (int64_t h = 0; h < s[2]; ++h)
        for (int64_t w = 0; w < s[3]; ++w)
          out[((n * s[2] + h) * s[3] + w) * s[1] + c] = in[((n * s[1] + c) * s[2] + h) * s[3] + w];
  return y;
}

// The NCHW copy of a channels-last tensor.
inline Tensor fromNhwc(const Tensor& x) {
  const Shape& s = x.shape();
  Tensor y = emptyLike(s);
  const float* in = x.data<float>();
  float* out = y.data<float>();
  for (int64_t n = 0; n < s[0]; ++n)
    for (int64_t c = 0; c < s[1]; ++c)
      for (int64_t h = 0; h < s[2]; ++h)
        for (int64_t w = 0; w < s[3]; ++w)
          out[((n * s[1] + c) * s[2] + h) * s[3] + w] = in[((n * s[2] + h) * s[3] + w) * s[1] + c];
  return y;
}

inline Tensor runRef(OpKind op, std::vector<Tensor> inputs, const ir::AttrMap& attrs = {}) {
  auto out = runtime::runReferenceOp(op, std::move(inputs), attrs);
  INFO(ir::opName(op) << ": " << out.status().message());
  REQUIRE(out.hasValue());
  return (*out)[0];
}

// The ground truth: the op, then each post-op as its own reference op.
inline Tensor referenceWithPostOps(OpKind op, const std::vector<Tensor>& inputs,
                                   const ir::AttrMap& attrs, const std::vector<PostOp>& post,
                                   const std::vector<Tensor>& extra) {
  Tensor y = runRef(op, inputs, attrs);
  for (const PostOp& p : post) {
    switch (p.kind) {
      case Kind::kRelu:
        y = runRef(OpKind::kRelu, {y});
        break;
      case Kind::kLeakyRelu:
        y = runRef(OpKind::kLeakyRelu, {y}, {{"alpha", p.alpha}});
        break;
      case Kind::kClip:
        y = runRef(OpKind::kClip, {y}, {{"min", p.alpha}, {"max", p.beta}});
        break;
      case Kind::kSigmoid:
        y = runRef(OpKind::kSigmoid, {y});
        break;
      case Kind::kTanh:
        y = runRef(OpKind::kTanh, {y});
        break;
      case Kind::kGeluErf:
        y = runRef(OpKind::kGelu, {y});
        break;
      case Kind::kGeluTanh:
        y = runRef(OpKind::kGelu, {y}, {{"approximate", std::string("tanh")}});
        break;
      case Kind::kAdd:
        y = runRef(OpKind::kAdd, {y, extra[static_cast<size_t>(p.input)]});
        break;
    }
  }
  return y;
}

inline Shape inferredShape(OpKind op, const std::vector<Tensor>& inputs, const ir::AttrMap& attrs) {
  std::vector<ir::TensorType> types;
  for (const Tensor& t : inputs) types.push_back(t.type());
  auto inferred = ir::inferTypes(op, types, attrs);
  REQUIRE(inferred.hasValue());
  return (*inferred)[0].shape;
}

// Runs op + post-ops through the library. Inputs and extras are NCHW: with channelsLast,
// activations (ir::isChannelsLastActivation, and the extras) are converted to NHWC first and
// an activation output back to NCHW, so results compare directly with the reference.
inline Tensor runLib(OpKind op, std::vector<Tensor> inputs, const ir::AttrMap& attrs,
                     const std::vector<PostOp>& post = {}, std::vector<Tensor> extra = {},
                     const LibraryOptions& options = {}) {
  const bool nhwc = options.channelsLast;
  Tensor out = emptyLike(inferredShape(op, inputs, attrs));
  const ir::OpInfo& info = ir::opInfo(op);
  if (nhwc) {
    for (size_t i = 0; i < inputs.size(); ++i)
      if (ir::isChannelsLastActivation(info, static_cast<int>(i), inputs[i].shape().size()))
        inputs[i] = toNhwc(inputs[i]);
    for (Tensor& e : extra) e = toNhwc(e);
  }
  const ir::AttrView view(ir::opInfo(op), attrs);
  const Status s = runtime::runLibraryWithPostOps(op, view, inputs, post, extra, out, options);
  INFO(ir::opName(op) << ": " << s.message());
  REQUIRE(s.isOk());
  return nhwc && ir::isChannelsLastActivation(info, -1, out.shape().size()) ? fromNhwc(out) : out;
}

// max |got - want| <= tol * max |want| (NaN must match NaN).
inline void checkRelClose(const Tensor& got, const Tensor& want, double tol) {
  REQUIRE(got.shape() == want.shape());
  const float* g = got.data<float>();
  const float* w = want.data<float>();
  double maxRef = 0, maxErr = 0;
  int64_t worst = -1, nanMismatch = -1;
  for (int64_t i = 0; i < want.numElements(); ++i) {
    if (std::isnan(w[i]) || std::isnan(g[i]) || std::isinf(w[i]) || std::isinf(g[i])) {
      // NaN where the reference has NaN, the same infinities.
      const bool same = std::isnan(w[i]) ? std::isnan(g[i]) : g[i] == w[i];
      if (!same && nanMismatch < 0) nanMismatch = i;
      continue;
    }
    maxRef = std::max(maxRef, std::fabs(static_cast<double>(w[i])));
    const double err = std::fabs(static_cast<double>(g[i]) - w[i]);
    if (err > maxErr) {
      maxErr = err;
      worst = i;
    }
  }
  INFO("max |ref| " << maxRef << ", max error " << maxErr << " at element " << worst
                    << (worst >= 0 ? " (got " + std::to_string(g[worst]) + ", want " +
                                         std::to_string(w[worst]) + ")"
                                   : std::string()));
  INFO("first NaN/inf mismatch at " << nanMismatch);
  CHECK(nanMismatch == -1);
  CHECK(maxErr <= tol * std::max(maxRef, 1e-30));
}

inline PostOp postOp(Kind kind, double alpha = 0, double beta = 0, int input = -1) {
  PostOp p;
  p.kind = kind;
  p.alpha = alpha;
  p.beta = beta;
  p.input = input;
  return p;
}

// Post-op chains every library op is tested with; kAdd reads extra 0 (and 1).
inline std::vector<std::pair<std::string, std::vector<PostOp>>> postOpChains() {
  return {
      {"relu", {postOp(Kind::kRelu)}},
      {"leaky_relu", {postOp(Kind::kLeakyRelu, 0.1)}},
      {"clip", {postOp(Kind::kClip, -0.5, 0.75)}},
      {"sigmoid", {postOp(Kind::kSigmoid)}},
      {"tanh", {postOp(Kind::kTanh)}},
      {"gelu_erf", {postOp(Kind::kGeluErf)}},
      {"gelu_tanh", {postOp(Kind::kGeluTanh)}},
      {"add", {postOp(Kind::kAdd, 0, 0, 0)}},
      {"add,relu", {postOp(Kind::kAdd, 0, 0, 0), postOp(Kind::kRelu)}},
      {"relu,add", {postOp(Kind::kRelu), postOp(Kind::kAdd, 0, 0, 0)}},
      {"gelu_erf,add,tanh",
       {postOp(Kind::kGeluErf), postOp(Kind::kAdd, 0, 0, 0), postOp(Kind::kTanh)}},
      {"add,clip(nan bounds),add",
       {postOp(Kind::kAdd, 0, 0, 1), postOp(Kind::kClip, std::nan(""), 0.25),
        postOp(Kind::kAdd, 0, 0, 0)}},
  };
}

}  // namespace kiln::libtest
