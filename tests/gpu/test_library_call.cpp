// The CUDA backend's library-call descriptors (runtime/gpu/library_call.h), built from op calls
// and run by the emu device through the CPU's library with only what the descriptor says:
// convolutions over random strides, asymmetric pads, dilations, groups and bias, and matrix
// products in every form (linear, gemm with transposes, alpha, beta and each kind of C, matmul
// with batch dims on either side), against the reference kernels.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <limits>
#include <random>

#include "compiler/compile.h"
#include "compiler/train.h"
#include "ir/parser.h"
#include "models/zoo.h"
#include "random_inputs.h"
#include "runtime/eager.h"
#include "runtime/gpu/cuda_libraries.h"
#include "runtime/gpu/emu_device.h"
#include "runtime/gpu/gpu_backend.h"
#include "runtime/gpu/library_call.h"
#include "runtime/reference/kernels.h"

using namespace kiln;
using runtime::Tensor;

namespace {

// max(a, b) where a NaN b wins and stays (std::max(a, NaN) is a: a NaN difference would pass).
double maxKeepingNaN(double a, double b) {
  return std::isnan(b) || a < b ? b : a;
}

// One node on random inputs: compiled for emu it must be one library step, and match the
// reference kernel.
void checkOneOp(ir::OpKind op, std::vector<ir::TensorType> inputs, ir::AttrMap attrs, uint64_t seed,
                bool deviceCall = true) {
  ir::Graph g("one_op");
  std::vector<ir::Value*> ins;
  for (size_t i = 0; i < inputs.size(); ++i)
    ins.push_back(*g.addInput("x" + std::to_string(i), inputs[i]));
  auto node = g.addNode(op, ins, attrs);
  INFO(node.status().message());
  REQUIRE(node.hasValue());
  g.setOutputs({(*node)->output()});
  const std::vector<Tensor> xs = testing::randomInputs(g, seed);
  std::vector<Tensor> refOut;
  {
    auto types = ir::inferTypes(op, inputs, attrs);
    REQUIRE(types.hasValue());
    refOut.push_back(*Tensor::empty((*types)[0].dtype, (*types)[0].shape));
    REQUIRE(runtime::referenceKernel(op)(ir::AttrView(ir::opInfo(op), attrs), xs, refOut).isOk());
  }
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  compiler::CompileOptions o;
  o.backend = *emu;
  auto cm = compiler::compile(g, o);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  int library = 0;
  for (const auto& s : (*cm)->plan().steps) library += s.library;
  CHECK(library == 1);
  const int64_t calls = runtime::gpu::emuCounters(*runtime::gpu::gpuDevice(**emu))->libraryCalls;
  auto got = (*cm)->run(xs);
  INFO(got.status().message());
  REQUIRE(got.hasValue());
  // A device library call, or (shapes the descriptors cannot take) the op on the host.
  CHECK(runtime::gpu::emuCounters(*runtime::gpu::gpuDevice(**emu))->libraryCalls ==
        calls + (deviceCall ? 1 : 0));
  const Tensor& a = (*got)[0];
  double maxRef = 0, maxDiff = 0;
  for (int64_t i = 0; i < refOut[0].numElements(); ++i) {
    maxRef = std::max(maxRef, std::fabs(refOut[0].elementAsDouble(i)));
    maxDiff =
        maxKeepingNaN(maxDiff, std::fabs(a.elementAsDouble(i) - refOut[0].elementAsDouble(i)));
  }
  CHECK(maxDiff <= 1e-5 * std::max(maxRef, 1.0));
}

ir::TensorType f32(ir::Shape s) {
  return {ir::DType::kF32, std::move(s)};
}

}  // namespace

TEST_CASE("library calls: convolutions described for the device match the reference") {
  std::mt19937 rng(2);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 12; ++trial) {
    const int64_t groups = trial % 3 == 0 ? pick(2, 3) : 1;
    const int64_t c = groups * pick(1, 3), k = groups * pick(1, 4);
    const int64_t r = pick(1, 3), s = pick(1, 3);
    const int64_t h = pick(r + 2, 9), w = pick(s + 2, 9);
    ir::AttrMap a;
    a["strides"] = std::vector<int64_t>{pick(1, 2), pick(1, 2)};
    a["pads"] = std::vector<int64_t>{pick(0, 2), pick(0, 1), pick(0, 1), pick(0, 2)};
    a["dilations"] = std::vector<int64_t>{pick(1, 2), 1};
    a["group"] = groups;
    std::vector<ir::TensorType> in = {f32({pick(1, 2), c, h, w}), f32({k, c / groups, r, s})};
    if (trial % 2) in.push_back(f32({k}));
    INFO("trial " << trial);
    checkOneOp(ir::OpKind::kConv2d, in, a, 30 + trial);
  }
}

TEST_CASE("library calls: convolution gradients described for the device match the reference") {
  std::mt19937 rng(8);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 8; ++trial) {
    const int64_t groups = trial % 4 == 0 ? 2 : 1;
    const int64_t c = groups * pick(1, 3), k = groups * pick(1, 3);
    const int64_t r = pick(1, 3), s = pick(1, 3), n = pick(1, 2);
    const int64_t h = pick(r + 2, 8), w = pick(s + 2, 8);
    ir::AttrMap a;
    a["strides"] = std::vector<int64_t>{pick(1, 2), pick(1, 2)};
    a["pads"] = std::vector<int64_t>{pick(0, 1), pick(0, 1), pick(0, 1), pick(0, 1)};
    a["dilations"] = std::vector<int64_t>{1, pick(1, 2)};
    a["group"] = groups;
    const ir::TensorType x = f32({n, c, h, w}), wt = f32({k, c / groups, r, s});
    auto y = ir::inferTypes(ir::OpKind::kConv2d, std::vector<ir::TensorType>{x, wt}, a);
    REQUIRE(y.hasValue());
    const ir::TensorType dy = (*y)[0];
    INFO("trial " << trial);
    checkOneOp(ir::OpKind::kConv2dBackwardData, {dy, wt, x}, a, 70 + trial);
    checkOneOp(ir::OpKind::kConv2dBackwardWeight, {dy, x, wt}, a, 80 + trial);
  }
}

TEST_CASE("library calls: poolings described for the device match the reference") {
  std::mt19937 rng(4);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int trial = 0; trial < 12; ++trial) {
    const bool max = trial % 2 == 0;
    const int64_t kh = pick(1, 3), kw = pick(1, 3);
    ir::AttrMap a;
    a["kernel"] = std::vector<int64_t>{kh, kw};
    a["strides"] = std::vector<int64_t>{pick(1, 2), pick(1, 3)};
    a["pads"] =
        std::vector<int64_t>{pick(0, kh / 2), pick(0, kw / 2), pick(0, kh / 2), pick(0, kw / 2)};
    a["ceil_mode"] = int64_t{trial % 3 == 0};
    if (max)
      a["dilations"] = std::vector<int64_t>{pick(1, 2), 1};
    else
      a["count_include_pad"] = int64_t{trial % 4 == 1};
    INFO("trial " << trial);
    checkOneOp(max ? ir::OpKind::kMaxPool2d : ir::OpKind::kAvgPool2d,
               {f32({pick(1, 2), pick(1, 3), pick(5, 9), pick(5, 9)})}, a, 50 + trial);
  }
}

TEST_CASE("library calls: matrix products described for the device match the reference") {
  SECTION("linear, with and without bias, batched rows") {
    checkOneOp(ir::OpKind::kLinear, {f32({3, 5, 7}), f32({4, 7}), f32({4})}, {}, 1);
    checkOneOp(ir::OpKind::kLinear, {f32({6, 7}), f32({4, 7})}, {}, 2);
  }
  SECTION("gemm: transposes, alpha, beta, C as a row or a matrix") {
    for (int transA : {0, 1})
      for (int transB : {0, 1})
        for (int c : {0, 1, 2}) {
          INFO("transA " << transA << " transB " << transB << " C " << c);
          ir::AttrMap a{{"transA", int64_t{transA}},
                        {"transB", int64_t{transB}},
                        {"alpha", 0.5},
                        {"beta", 2.0}};
          std::vector<ir::TensorType> in = {f32(transA ? ir::Shape{6, 5} : ir::Shape{5, 6}),
                                            f32(transB ? ir::Shape{3, 6} : ir::Shape{6, 3})};
          if (c == 1) in.push_back(f32({3}));
          if (c == 2) in.push_back(f32({5, 3}));
          checkOneOp(ir::OpKind::kGemm, in, a, 10 + transA + 2 * transB + 4 * c);
        }
  }
  SECTION("matmul: shared B folds into rows, shared A, equal batch dims") {
    checkOneOp(ir::OpKind::kMatMul, {f32({2, 3, 4, 5}), f32({5, 6})}, {}, 3);
    checkOneOp(ir::OpKind::kMatMul, {f32({4, 5}), f32({3, 5, 6})}, {}, 4);
    checkOneOp(ir::OpKind::kMatMul, {f32({2, 3, 4, 5}), f32({2, 3, 5, 6})}, {}, 5);
  }
}

TEST_CASE("library calls: what the descriptors cannot take is named, and runs on the host") {
  runtime::OpCall call;
  call.name = "mm";
  call.op = ir::OpKind::kMatMul;
  call.library = true;
  const std::vector<ir::TensorType> in = {f32({2, 1, 4, 5}), f32({3, 5, 6})};
  auto d = runtime::gpu::describeLibraryCall(call, in, f32({2, 3, 4, 6}));
  CHECK(d.status().code() == ErrorCode::kUnimplemented);
  CHECK_THAT(d.status().message(), Catch::Contains("batch dims broadcast between the operands"));
  // Such a matmul still runs on the device, through the host.
  checkOneOp(ir::OpKind::kMatMul, in, {}, 6, /*deviceCall=*/false);
}

namespace {

// A product, then post-ops, compiled for emu with NaN and infinities in its inputs: the chains
// the device libraries take exactly (+ residual, ReLU) become one library call with its
// epilogue, others stay generated kernels; either way the result is the unfused reference's,
// NaN where it has NaN (kiln's rule: fused == unfused).
void checkEpilogue(const std::string& ir, int postOpsWanted, uint64_t seed) {
  INFO(ir);
  auto g = ir::parseGraph(ir);
  INFO(g.status().message());
  REQUIRE(g.hasValue());
  std::vector<Tensor> xs = testing::randomInputs(*g, seed);
  const float special[] = {std::numeric_limits<float>::quiet_NaN(),
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity()};
  std::mt19937 rng(static_cast<uint32_t>(seed));
  for (size_t i = 0; i < xs.size(); ++i)  // A few specials in every input but the weights.
    if (g->inputs()[i]->name() != "w" && g->inputs()[i]->name() != "b")
      for (int k = 0; k < 3; ++k) xs[i].data<float>()[rng() % xs[i].numElements()] = special[k];
  auto want = runtime::EagerExecutor(*g).run(xs);  // Op by op on the CPU.
  REQUIRE(want.hasValue());
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  compiler::CompileOptions o;
  o.backend = *emu;
  auto cm = compiler::compile(*g, o);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  int library = 0, postOps = 0;
  for (const auto& s : (*cm)->plan().steps) {
    library += s.library;
    postOps += static_cast<int>(s.postOps.size());
  }
  CHECK(library == 1);
  CHECK(postOps == postOpsWanted);
  CHECK((*cm)->report().hostSteps == 0);
  const int64_t calls = runtime::gpu::emuCounters(*runtime::gpu::gpuDevice(**emu))->libraryCalls;
  auto got = (*cm)->run(xs);
  INFO(got.status().message());
  REQUIRE(got.hasValue());
  CHECK(runtime::gpu::emuCounters(*runtime::gpu::gpuDevice(**emu))->libraryCalls == calls + 1);
  const Tensor& a = (*got)[0];
  const Tensor& r = (*want)[0];
  int nans = 0;
  for (int64_t i = 0; i < r.numElements(); ++i) {
    const double e = r.elementAsDouble(i), v = a.elementAsDouble(i);
    INFO("element " << i << ": " << v << " vs " << e);
    if (std::isnan(e)) {
      ++nans;
      CHECK(std::isnan(v));
    } else if (std::isinf(e)) {
      CHECK(v == e);
    } else {
      CHECK(std::fabs(v - e) <= 1e-4 * std::max(1.0, std::fabs(e)));
    }
  }
  CHECK(nans > 0);  // The specials reached the epilogue.
}

}  // namespace

TEST_CASE(
    "library calls: residual, ReLU and GELU epilogues on the device keep NaN and infinities") {
  // conv2d + bias + residual + relu: resnet's block tail, one cuDNN call on a GPU.
  checkEpilogue(R"(graph g(%x : f32[2,3,9,9], %w : f32[4,3,3,3], %b : f32[4], %r : f32[2,4,9,9]) {
  %y : f32[2,4,9,9] = conv2d(%x, %w, %b) {strides=[1,1], pads=[1,1,1,1], dilations=[1,1], group=1}
  %s : f32[2,4,9,9] = add(%y, %r)
  %o : f32[2,4,9,9] = relu(%s)
  return %o
})",
                2, 1);
  // conv2d without bias + relu (cuDNN's separate activation path), strided.
  checkEpilogue(R"(graph g(%x : f32[1,4,10,10], %w : f32[6,4,3,3]) {
  %y : f32[1,6,4,4] = conv2d(%x, %w) {strides=[2,2], pads=[0,0,0,0], dilations=[1,1], group=1}
  %o : f32[1,6,4,4] = relu(%y)
  return %o
})",
                1, 2);
  // linear + bias + relu (CUBLASLT_EPILOGUE_RELU_BIAS).
  checkEpilogue(R"(graph g(%x : f32[5,16], %w : f32[12,16], %b : f32[12]) {
  %y : f32[5,12] = linear(%x, %w, %b)
  %o : f32[5,12] = relu(%y)
  return %o
})",
                1, 3);
  // A batched matmul + residual (C with beta 1 and D's batch stride) + relu.
  checkEpilogue(R"(graph g(%a : f32[3,4,8], %b : f32[3,8,5], %r : f32[3,4,5]) {
  %y : f32[3,4,5] = matmul(%a, %b)
  %s : f32[3,4,5] = add(%r, %y)
  %o : f32[3,4,5] = relu(%s)
  return %o
})",
                2, 4);
  // linear + bias + tanh GELU (CUBLASLT_EPILOGUE_GELU_BIAS), a transformer's FFN.
  checkEpilogue(R"(graph g(%x : f32[5,16], %w : f32[12,16], %b : f32[12]) {
  %y : f32[5,12] = linear(%x, %w, %b)
  %o : f32[5,12] = gelu(%y) {approximate="tanh"}
  return %o
})",
                1, 6);
  // A batched matmul + residual + tanh GELU.
  checkEpilogue(R"(graph g(%a : f32[3,4,8], %b : f32[3,8,5], %r : f32[3,4,5]) {
  %y : f32[3,4,5] = matmul(%a, %b)
  %s : f32[3,4,5] = add(%y, %r)
  %o : f32[3,4,5] = gelu(%s) {approximate="tanh"}
  return %o
})",
                2, 7);
  // The erf GELU (kiln's default) has no library epilogue: a generated kernel.
  checkEpilogue(R"(graph g(%x : f32[5,16], %w : f32[12,16], %b : f32[12]) {
  %y : f32[5,12] = linear(%x, %w, %b)
  %o : f32[5,12] = gelu(%y)
  return %o
})",
                0, 8);
  // A sigmoid is no device epilogue: it stays a generated kernel after the call.
  checkEpilogue(R"(graph g(%x : f32[6,16], %w : f32[12,16], %b : f32[12]) {
  %y : f32[6,12] = linear(%x, %w, %b)
  %o : f32[6,12] = sigmoid(%y)
  return %o
})",
                0, 5);
}

TEST_CASE("library calls: the devices' epilogue chains") {
  using K = runtime::PostOp::Kind;
  auto chain = [](std::initializer_list<K> kinds) {
    std::vector<runtime::PostOp> v;
    for (K k : kinds) v.push_back({k, 0, 0, k == K::kAdd ? 0 : -1});
    return v;
  };
  using runtime::gpu::libraryEpilogueFor;
  CHECK(libraryEpilogueFor(ir::OpKind::kConv2d, chain({K::kAdd, K::kRelu})) ==
        runtime::gpu::LibraryEpilogue{true, true});
  CHECK(libraryEpilogueFor(ir::OpKind::kMatMul, chain({K::kRelu})) ==
        runtime::gpu::LibraryEpilogue{false, true});
  CHECK(libraryEpilogueFor(ir::OpKind::kLinear, chain({})) == runtime::gpu::LibraryEpilogue{});
  CHECK_FALSE(libraryEpilogueFor(ir::OpKind::kConv2d, chain({K::kRelu, K::kAdd})));
  CHECK_FALSE(libraryEpilogueFor(ir::OpKind::kConv2d, chain({K::kAdd, K::kAdd})));
  // cuBLASLt's GELU is the tanh one, after matrix products only; the erf GELU is not offered.
  CHECK(libraryEpilogueFor(ir::OpKind::kGemm, chain({K::kGeluTanh})) ==
        runtime::gpu::LibraryEpilogue{false, false, true});
  CHECK(libraryEpilogueFor(ir::OpKind::kLinear, chain({K::kAdd, K::kGeluTanh})) ==
        runtime::gpu::LibraryEpilogue{true, false, true});
  CHECK_FALSE(libraryEpilogueFor(ir::OpKind::kConv2d, chain({K::kGeluTanh})));
  CHECK_FALSE(libraryEpilogueFor(ir::OpKind::kLinear, chain({K::kGeluErf})));
  CHECK_FALSE(libraryEpilogueFor(ir::OpKind::kLinear, chain({K::kRelu, K::kGeluTanh})));
  CHECK_FALSE(libraryEpilogueFor(ir::OpKind::kMaxPool2d, chain({K::kRelu})));
}

TEST_CASE("library calls: a convolution's algorithm is timed on the device and followed") {
  // On emu the device's library is the CPU's, so its algorithms are the CPU library's; on a GPU
  // the same code times cuDNN's (cudnn_implicit_gemm, ...).
  auto g = ir::parseGraph(R"(graph g(%x : f32[1,8,12,12], %w : f32[8,8,3,3], %b : f32[8]) {
  %y : f32[1,8,12,12] = conv2d(%x, %w, %b) {strides=[1,1], pads=[1,1,1,1], dilations=[1,1], group=1}
  return %y
})");
  REQUIRE(g.hasValue());
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  const ir::Node* conv = g->nodes().front();
  const ir::TensorType types[] = {conv->input(0)->type(), conv->input(1)->type()};
  const auto algos = (*emu)->libraryAlgorithms(ir::OpKind::kConv2d, conv->attr(), types);
  REQUIRE(algos.size() >= 2);
  CHECK(algos == runtime::convAlgorithms(conv->attr(), types[0].shape, types[1].shape));
  compiler::CompileOptions o;
  o.backend = *emu;
  o.autotune = true;
  o.useCache = false;
  auto cm = compiler::compile(*g, o);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  REQUIRE((*cm)->report().algorithmChoices.size() == 1);
  const std::string& line = (*cm)->report().algorithmChoices[0];
  INFO(line);
  CHECK_THAT(line, Catch::Contains("timed: "));
  runtime::ConvAlgo chosen = runtime::ConvAlgo::kAuto;
  for (const auto& st : (*cm)->plan().steps)
    if (st.library) chosen = st.libraryOptions.algo;
  CHECK(chosen != runtime::ConvAlgo::kAuto);
  CHECK_THAT(line, Catch::Contains(std::string(runtime::convAlgoName(chosen))));
  const std::vector<Tensor> xs = testing::randomInputs(*g, 11);
  auto want = runtime::EagerExecutor(*g).run(xs);
  auto got = (*cm)->run(xs);
  REQUIRE(want.hasValue());
  REQUIRE(got.hasValue());
  for (int64_t i = 0; i < (*want)[0].numElements(); ++i)
    CHECK(std::fabs((*got)[0].elementAsDouble(i) - (*want)[0].elementAsDouble(i)) <= 1e-4);

  // The descriptor carries the choice; emu refuses a cuDNN algorithm by name.
  runtime::OpCall call;
  call.name = "c";
  call.op = ir::OpKind::kConv2d;
  call.attrs = &conv->attrs();
  call.library = true;
  const std::vector<ir::TensorType> in = {conv->input(0)->type(), conv->input(1)->type()};
  for (auto a : {runtime::ConvAlgo::kIm2colGemm, runtime::ConvAlgo::kCudnnImplicitGemm}) {
    call.options.algo = a;
    auto d = runtime::gpu::describeLibraryCall(call, in, conv->output()->type());
    REQUIRE(d.hasValue());
    CHECK(std::get<runtime::gpu::ConvDescriptor>(d->desc).algo == a);
    CHECK_THAT(d->describe(), Catch::Contains(std::string(runtime::convAlgoName(a))));
  }
  std::vector<float> x(8 * 144), w(8 * 8 * 9), y(8 * 144);
  void* ops[] = {x.data(), w.data(), y.data()};
  auto d = runtime::gpu::describeLibraryCall(call, in, conv->output()->type());
  const Status st = runtime::gpu::runLibraryCallOnHost(*d, ops);
  CHECK(st.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(st.message(), Catch::Contains("cuDNN algorithm"));
}

TEST_CASE("library calls: --precision tf32 rounds the multiplicands, and only on a GPU backend") {
  using runtime::gpu::roundToTf32;
  CHECK(roundToTf32(1.f) == 1.f);
  CHECK(roundToTf32(1.f + 0x1p-11f) == 1.f);                        // A tie: to even (down).
  CHECK(roundToTf32(1.f + 0x3p-11f) == 1.f + 0x1p-9f);              // A tie: to even (up).
  CHECK(roundToTf32(1.f + 0x1p-10f + 0x1p-20f) == 1.f + 0x1p-10f);  // Below half: down.
  CHECK(std::isnan(roundToTf32(std::numeric_limits<float>::quiet_NaN())));
  CHECK(roundToTf32(-std::numeric_limits<float>::infinity()) ==
        -std::numeric_limits<float>::infinity());

  // A convolution then a matrix product, on emu in tf32: each equals the fp32 computation on
  // TF32-rounded multiplicands (what tensor cores do), and differs from the fp32 result.
  auto g = ir::parseGraph(R"(graph g(%x : f32[2,8,10,10], %w : f32[16,8,3,3], %m : f32[10,24]) {
  %y : f32[2,16,10,10] = conv2d(%x, %w) {strides=[1,1], pads=[1,1,1,1], dilations=[1,1], group=1}
  %z : f32[2,16,10,24] = matmul(%y, %m)
  return %y, %z
})");
  REQUIRE(g.hasValue());
  const std::vector<Tensor> xs = testing::randomInputs(*g, 21);
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  compiler::CompileOptions o;
  o.backend = *emu;
  o.precision = compiler::Precision::kTf32;
  auto cm = compiler::compile(*g, o);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  CHECK((*cm)->report().precision == "tf32");
  int tf32Steps = 0;
  for (const auto& st : (*cm)->plan().steps) tf32Steps += st.libraryOptions.tf32;
  CHECK(tf32Steps == 2);
  auto got = (*cm)->run(xs);
  REQUIRE(got.hasValue());
  // The reference, op by op in fp32, on rounded multiplicands.
  auto rounded = [](const Tensor& t) {
    Tensor r = *Tensor::empty(t.dtype(), t.shape());
    for (int64_t i = 0; i < t.numElements(); ++i)
      r.data<float>()[i] = runtime::gpu::roundToTf32(t.data<float>()[i]);
    return r;
  };
  const ir::AttrMap& convAttrs = g->nodes()[0]->attrs();
  auto reference = [](ir::OpKind op, const ir::AttrMap& attrs, std::vector<Tensor> in,
                      const ir::Shape& shape) {
    std::vector<Tensor> out = {*Tensor::empty(ir::DType::kF32, shape)};
    REQUIRE(runtime::referenceKernel(op)(ir::AttrView(ir::opInfo(op), attrs), in, out).isOk());
    return out[0];
  };
  const Tensor y =
      reference(ir::OpKind::kConv2d, convAttrs, {rounded(xs[0]), rounded(xs[1])}, {2, 16, 10, 10});
  const Tensor z =
      reference(ir::OpKind::kMatMul, {}, {rounded((*got)[0]), rounded(xs[2])}, {2, 16, 10, 24});
  auto fp32 = runtime::EagerExecutor(*g).run(xs);
  REQUIRE(fp32.hasValue());
  for (int k = 0; k < 2; ++k) {
    const Tensor& want = k == 0 ? y : z;
    double maxDiff = 0, fromFp32 = 0, maxRef = 0;
    for (int64_t i = 0; i < want.numElements(); ++i) {
      maxRef = std::max(maxRef, std::fabs(want.elementAsDouble(i)));
      maxDiff =
          maxKeepingNaN(maxDiff, std::fabs((*got)[k].elementAsDouble(i) - want.elementAsDouble(i)));
      fromFp32 = std::max(fromFp32,
                          std::fabs((*got)[k].elementAsDouble(i) - (*fp32)[k].elementAsDouble(i)));
    }
    INFO("output " << k << ": vs rounded reference " << maxDiff << ", vs fp32 " << fromFp32);
    CHECK(maxDiff <= 1e-5 * std::max(maxRef, 1.0));
    CHECK(fromFp32 > 1e-6 * maxRef);                  // TF32 was applied,
    CHECK(fromFp32 <= 1e-2 * std::max(maxRef, 1.0));  // within TF32's error.
  }

  // The CPU has no TF32: compile and eager refuse it, naming the devices that have it.
  compiler::CompileOptions onCpu;
  onCpu.precision = compiler::Precision::kTf32;
  auto refused = compiler::compile(*g, onCpu);
  CHECK(refused.status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(refused.status().message(), Catch::Contains("--device cuda"));
  // bf16 autocast compiles there, its products native or converted to f32 and rounded (and it
  // says which).
  onCpu.precision = compiler::Precision::kBf16;
  auto converted = compiler::compile(*g, onCpu);
  INFO(converted.status().message());
  REQUIRE(converted.hasValue());
  bool said = false;
  for (const auto& r : (*converted)->report().remarks)
    said = said || r.find("operands widened to f32") != std::string::npos;
  CHECK(said);
  CHECK(*compiler::parsePrecision("fp16") == compiler::Precision::kFp16);
  CHECK(compiler::parsePrecision("fp8").status().code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(compiler::parsePrecision("fp8").status().message(),
             Catch::Contains("fp32, tf32, bf16 or fp16"));
}

TEST_CASE("library calls: cuBLASLt and cuDNN load with every function kiln calls") {
  // Without a GPU their handles cannot start, but every symbol must resolve first.
  auto libs = runtime::gpu::openCudaLibraries(
      [](void*, size_t) -> Expected<runtime::gpu::DevicePtr> { return internalError("unused"); });
  if (libs.hasValue()) return;  // A machine with a GPU.
  INFO(libs.status().message());
  CHECK_THAT(libs.status().message(),
             Catch::StartsWith("cuBLASLt cannot start") || Catch::StartsWith("cuDNN cannot start"));
}

namespace {

// A random convolution (then a max pooling) as IR text: in NCHW, or channels-last with the
// filters KRSC, written out with relayouts at the edges as layout selection leaves a GPU graph
// under tensor-core precisions.
std::string convPoolIr(bool nhwc, const ir::Shape& x, const ir::Shape& w, const ir::Shape& y,
                       const ir::Shape& pooled, const std::string& convAttrs) {
  auto t = [&](const ir::Shape& s) {
    return ir::TensorType{ir::DType::kF32, s, nhwc ? ir::Layout::kNHWC : ir::Layout::kPlain}
        .toString();
  };
  auto plain = [](const ir::Shape& s) { return ir::TensorType{ir::DType::kF32, s}.toString(); };
  const std::string toNhwc = " = relayout(%", attrs = ") {from=\"plain\", to=\"nhwc\"}\n";
  std::string ir = "graph g(%x : " + plain(x) + ", %w : " + plain(w) + ", %b : f32[" +
                   std::to_string(w[0]) + "]) {\n";
  std::string xs = "%x", ws = "%w";
  if (nhwc) {
    ir += "  %xn : " + t(x) + toNhwc + "x" + attrs + "  %wn : " + t(w) + toNhwc + "w" + attrs;
    xs = "%xn", ws = "%wn";
  }
  ir += "  %y : " + t(y) + " = conv2d(" + xs + ", " + ws + ", %b) {" + convAttrs + "}\n";
  ir += "  %r : " + t(y) + " = relu(%y)\n";
  ir += "  %m : " + t(pooled) + " = max_pool2d(%r) {kernel=[2,2], strides=[1,1]}\n";
  if (!nhwc) return ir + "  return %m\n}";
  return ir + "  %o : " + plain(pooled) + " = relayout(%m) {from=\"nhwc\", to=\"plain\"}\n" +
         "  return %o\n}";
}

// A convolution with unit strides and dilations and no padding, as one library call with a
// post-op no device descriptor takes (a sigmoid): it runs on the host.
struct HostConvCall {
  ir::AttrMap attrs = {{"strides", std::vector<int64_t>{1, 1}},
                       {"pads", std::vector<int64_t>{0, 0, 0, 0}},
                       {"dilations", std::vector<int64_t>{1, 1}},
                       {"group", int64_t{1}}};
  runtime::PostOp sigmoid{runtime::PostOp::Kind::kSigmoid};
  runtime::OpCall call;
  HostConvCall() {
    call.name = "conv";
    call.op = ir::OpKind::kConv2d;
    call.attrs = &attrs;
    call.library = true;
    call.postOps = std::span(&sigmoid, 1);
  }
  HostConvCall(const HostConvCall&) = delete;  // call points into it.
};

}  // namespace

TEST_CASE("library calls: channels-last convolutions (KRSC filters) and poolings on the device") {
  // The descriptors carry the layout: cuDNN gets NHWC tensors and NHWC-format filters, emu
  // relayouts to NCHW around the CPU's library, so a lost flag reads scrambled operands. Against
  // the same convolution in NCHW on the CPU; and through the host fallback, which relayouts
  // channels-last operands for the CPU's kernels.
  std::mt19937 rng(12);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  for (int trial = 0; trial < 6; ++trial) {
    INFO("trial " << trial);
    const int64_t groups = trial % 3 == 0 ? 2 : 1;
    const int64_t c = groups * pick(1, 3), k = groups * pick(1, 4), n = pick(1, 2);
    const int64_t r = pick(1, 3), s = pick(1, 3), h = pick(r + 3, 9), wd = pick(s + 3, 9);
    const std::string attrs =
        "strides=[" + std::to_string(pick(1, 2)) + "," + std::to_string(pick(1, 2)) + "], pads=[" +
        std::to_string(pick(0, 1)) + ",0," + std::to_string(pick(0, 1)) + ",1], dilations=[1," +
        std::to_string(pick(1, 2)) + "], group=" + std::to_string(groups);
    const ir::Shape x{n, c, h, wd}, w{k, c / groups, r, s};
    // The output shapes, from the NCHW graph's inference.
    auto probe = ir::parseGraph("graph g(%x : " + ir::TensorType{ir::DType::kF32, x}.toString() +
                                ", %w : " + ir::TensorType{ir::DType::kF32, w}.toString() +
                                ") {\n  %y = conv2d(%x, %w) {" + attrs +
                                "}\n  %m = max_pool2d(%y) {kernel=[2,2], strides=[1,1]}\n"
                                "  return %m\n}");
    INFO(probe.status().message());
    REQUIRE(probe.hasValue());
    const ir::Shape y = probe->nodes().front()->output()->type().shape;
    const ir::Shape m = probe->outputs()[0]->type().shape;
    auto plain = ir::parseGraph(convPoolIr(false, x, w, y, m, attrs));
    auto nhwc = ir::parseGraph(convPoolIr(true, x, w, y, m, attrs));
    INFO(nhwc.status().message());
    REQUIRE(plain.hasValue());
    REQUIRE(nhwc.hasValue());
    const std::vector<Tensor> xs = testing::randomInputs(*plain, 90 + trial);
    auto want = runtime::EagerExecutor(*plain).run(xs);
    REQUIRE(want.hasValue());
    compiler::CompileOptions o;
    o.backend = *emu;
    auto cm = compiler::compile(*nhwc, o);
    INFO(cm.status().message());
    REQUIRE(cm.hasValue());
    int libraryNhwc = 0;
    for (const auto& st : (*cm)->plan().steps)
      libraryNhwc += st.library && st.libraryOptions.channelsLast;
    CHECK(libraryNhwc == 2);  // The convolution (with its ReLU) and the pooling.
    CHECK((*cm)->report().hostSteps == 0);
    const int64_t calls = runtime::gpu::emuCounters(*runtime::gpu::gpuDevice(**emu))->libraryCalls;
    auto got = (*cm)->run(xs);
    INFO(got.status().message());
    REQUIRE(got.hasValue());
    CHECK(runtime::gpu::emuCounters(*runtime::gpu::gpuDevice(**emu))->libraryCalls == calls + 2);
    double maxDiff = 0;
    for (int64_t i = 0; i < (*want)[0].numElements(); ++i)
      maxDiff = maxKeepingNaN(
          maxDiff, std::fabs((*got)[0].elementAsDouble(i) - (*want)[0].elementAsDouble(i)));
    CHECK(maxDiff <= 1e-5);
  }

  // A channels-last call no descriptor takes (a sigmoid epilogue) runs on the host, relayouted.
  const ir::Shape x{2, 3, 6, 5}, w{4, 3, 3, 3}, y{2, 4, 4, 3};
  HostConvCall conv;
  const ir::AttrMap& attrs = conv.attrs;
  runtime::OpCall& call = conv.call;
  const ir::TensorType types[] = {{ir::DType::kF32, x, ir::Layout::kNHWC},
                                  {ir::DType::kF32, w, ir::Layout::kNHWC},
                                  {ir::DType::kF32, y, ir::Layout::kNHWC}};
  std::vector<Tensor> plainIn = {*Tensor::empty(ir::DType::kF32, x),
                                 *Tensor::empty(ir::DType::kF32, w)};
  std::mt19937 fill(4);
  for (Tensor& t : plainIn)
    for (int64_t i = 0; i < t.numElements(); ++i)
      t.data<float>()[i] = std::uniform_real_distribution<float>(-1, 1)(fill);
  auto want = runtime::runReferenceOp(ir::OpKind::kConv2d, plainIn, attrs);
  REQUIRE(want.hasValue());
  const ir::AttrMap toNhwc = {{"from", std::string("plain")}, {"to", std::string("nhwc")}};
  call.options.channelsLast = true;
  CHECK(runtime::gpu::describeLibraryCall(call, std::span(types, 2), types[2]).status().code() ==
        ErrorCode::kUnimplemented);
  auto stream = (*emu)->openStream(0);
  REQUIRE(stream.hasValue());
  std::vector<runtime::DeviceBuffer> buffers;
  std::vector<runtime::DeviceTensor> dev;
  for (int i = 0; i < 3; ++i) {
    auto b = (*emu)->allocate(types[i].byteSize());
    REQUIRE(b.hasValue());
    dev.push_back({b->address(), types[i]});
    buffers.push_back(std::move(*b));
    if (i == 2) break;
    auto cl = runtime::runReferenceOp(ir::OpKind::kRelayout, {plainIn[i]}, toNhwc);
    REQUIRE(cl.hasValue());
    REQUIRE((*stream)->upload(dev[i].address, (*cl)[0].rawData(), types[i].byteSize()).isOk());
  }
  Status st = (*stream)->run(call, std::span(dev.data(), 2), std::span(dev.data() + 2, 1));
  INFO(st.message());
  REQUIRE(st.isOk());
  Tensor out = *Tensor::empty(ir::DType::kF32, {y[0], y[2], y[3], y[1]});  // NHWC bytes.
  REQUIRE((*stream)->download(out.rawData(), dev[2].address, types[2].byteSize()).isOk());
  st = (*stream)->synchronize();
  INFO(st.message());
  REQUIRE(st.isOk());
  double maxDiff = 0;
  for (int64_t nn = 0; nn < y[0]; ++nn)
    for (int64_t kk = 0; kk < y[1]; ++kk)
      for (int64_t p = 0; p < y[2]; ++p)
        for (int64_t q = 0; q < y[3]; ++q) {
          const double e =
              1 /
              (1 + std::exp(-(*want)[0].data<float>()[((nn * y[1] + kk) * y[2] + p) * y[3] + q]));
          const double v = out.data<float>()[((nn * y[2] + p) * y[3] + q) * y[1] + kk];
          maxDiff = maxKeepingNaN(maxDiff, std::fabs(v - e));
        }
  CHECK(maxDiff <= 1e-5);
  for (auto& b : buffers) (*stream)->free(std::move(b));
}

namespace {

// The emu backend, but offering two algorithms for convolution gradients (the CPU library's
// names; its gradients have one implementation, so either computes the same): what a GPU's
// cuDNN offers, for testing the timing of gradients here.
class GradientAlgorithms final : public runtime::Backend {
 public:
  explicit GradientAlgorithms(std::shared_ptr<runtime::Backend> inner) : in_(std::move(inner)) {}
  std::string_view name() const override { return "emu-gradient-algorithms"; }
  const runtime::BackendCaps& caps() const override { return in_->caps(); }
  Expected<runtime::DeviceBuffer> allocate(size_t bytes) override { return in_->allocate(bytes); }
  Expected<runtime::DeviceBuffer> mapHost(std::byte* host, size_t bytes) override {
    return in_->mapHost(host, bytes);
  }
  runtime::Allocator& hostAllocator() override { return in_->hostAllocator(); }
  runtime::AllocatorStats memoryStats() const override { return in_->memoryStats(); }
  void resetPeakMemory() override { in_->resetPeakMemory(); }
  Expected<std::unique_ptr<runtime::Stream>> openStream(int threads) override {
    return in_->openStream(threads);
  }
  Expected<std::shared_ptr<runtime::KernelModule>> loadKernels(
      std::span<const runtime::KernelObject> objects) override {
    return in_->loadKernels(objects);
  }
  bool hasLibraryKernel(ir::OpKind op, ir::DType dtype, ir::Layout layout) const override {
    return in_->hasLibraryKernel(op, dtype, layout);
  }
  bool runsPostOps(ir::OpKind op, std::span<const runtime::PostOp> post) const override {
    return in_->runsPostOps(op, post);
  }
  std::vector<runtime::ConvAlgo> libraryAlgorithms(
      ir::OpKind op, const ir::AttrView& attrs,
      std::span<const ir::TensorType> inputs) const override {
    if (op != ir::OpKind::kConv2dBackwardData && op != ir::OpKind::kConv2dBackwardWeight)
      return in_->libraryAlgorithms(op, attrs, inputs);
    ++asked;
    return {runtime::ConvAlgo::kDirect, runtime::ConvAlgo::kIm2colGemm};
  }
  mutable int asked = 0;

 protected:
  void release(void*, size_t) noexcept override {}  // Its buffers are the inner backend's.

 private:
  std::shared_ptr<runtime::Backend> in_;
};

}  // namespace

TEST_CASE("library calls: gradient algorithms are timed like the forward's and reach the calls") {
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  auto offering = std::make_shared<GradientAlgorithms>(*emu);
  const std::string cache =
      (std::filesystem::temp_directory_path() / ("kiln_grad_algos_" + std::to_string(::getpid())))
          .string();
  compiler::TrainOptions o;
  o.compile.backend = offering;
  o.compile.autotune = true;
  o.compile.cacheDir = cache;
  compiler::TrainOptions plain = o;
  plain.compile.backend = *emu;
  plain.compile.autotune = false;
  std::vector<std::unique_ptr<compiler::TrainingStep>> steps;
  for (const auto* opts : {&o, &plain, &o}) {  // The third compile reads the cache.
    auto model = models::buildModel("mnist_cnn", {.batch = 4, .seed = 3});
    REQUIRE(model.hasValue());
    auto s = compiler::TrainingStep::create(std::move(model).value(), *opts);
    INFO(s.status().message());
    REQUIRE(s.hasValue());
    steps.push_back(std::move(*s));
  }
  CHECK(offering->asked >= 2);
  int data = 0, filter = 0;
  for (const std::string& line : steps[0]->compiled()->report().algorithmChoices) {
    INFO(line);
    const bool d = line.find("conv2d_backward_data") != std::string::npos;
    const bool f = line.find("conv2d_backward_weight") != std::string::npos;
    data += d, filter += f;
    if (d || f)
      CHECK_THAT(line, Catch::Contains("timed: direct") && Catch::Contains("im2col_gemm"));
  }
  CHECK(data >= 1);
  CHECK(filter >= 1);
  for (const std::string& line : steps[2]->compiled()->report().algorithmChoices)
    if (line.find("backward") != std::string::npos) CHECK_THAT(line, Catch::Contains("cached:"));
  // The choice is the node's attribute, which the plan's library step and its descriptor carry.
  int chosen = 0;
  for (const ir::Node* n : steps[0]->compiled()->optimizedGraph().nodes())
    if (n->op() == ir::OpKind::kConv2dBackwardData ||
        n->op() == ir::OpKind::kConv2dBackwardWeight) {
      const std::string a = n->attr().getString("algo");
      CHECK((a == "direct" || a == "im2col_gemm"));
      ++chosen;
    }
  CHECK(chosen == data + filter);
  int stepsWithAlgo = 0;
  for (const auto& st : steps[0]->compiled()->plan().steps)
    stepsWithAlgo += st.library && st.libraryOptions.algo != runtime::ConvAlgo::kAuto;
  CHECK(stepsWithAlgo >= chosen);
  // Either algorithm computes the gradients the heuristic's run computes (up to the forward
  // convolutions' algorithms, also timed here: rounding).
  std::mt19937 rng(1);
  Tensor x = *Tensor::empty(ir::DType::kF32, steps[0]->graph().inputs()[0]->type().shape);
  for (int64_t i = 0; i < x.numElements(); ++i)
    x.data<float>()[i] = std::uniform_real_distribution<float>(-1, 1)(rng);
  Tensor t = *Tensor::zeros(steps[0]->targetType().dtype, steps[0]->targetType().shape);
  auto a = (*steps[0])(x, t);
  auto b = (*steps[1])(x, t);
  REQUIRE(a.hasValue());
  REQUIRE(b.hasValue());
  CHECK(std::fabs(a->loss - b->loss) <= 1e-5);
  double maxDiff = 0;
  for (size_t i = 0; i < steps[0]->graph().parameters().size(); ++i) {
    const ir::Value* p = steps[0]->graph().parameters()[i];
    const ir::Value* q = steps[1]->graph().parameters()[i];
    if (!p->trainable()) continue;
    for (int64_t k = 0; k < p->data().numElements(); ++k)
      maxDiff = maxKeepingNaN(maxDiff, static_cast<double>(std::fabs(p->data().as<float>()[k] -
                                                                     q->data().as<float>()[k])));
  }
  CHECK(maxDiff <= 1e-6);
  std::filesystem::remove_all(cache);
}

TEST_CASE("library calls: an op run on the host keeps no weights by its pinned buffer's address") {
  // Calls of one convolution shape with different weights, one per synchronize(). An op run on
  // the host reads copies of its operands in pinned buffers that go back to the backend's pool at
  // synchronize(), so each call's weights land at the address of the last call's. A plan's
  // library cache (given for constant weights) keys reordered weights by their address, so an
  // op on the host must not use it: each call gets its own weights, and the cache stays empty.
  auto emu = runtime::gpu::backendForDevice("emu");
  REQUIRE(emu.hasValue());
  const ir::Shape x{1, 16, 8, 8}, w{16, 16, 1, 1};
  HostConvCall conv;
  const ir::AttrMap& attrs = conv.attrs;
  runtime::OpCall& call = conv.call;
  runtime::LibraryCache cache;
  call.options.cache = &cache;
  const ir::TensorType types[] = {f32(x), f32(w), f32(x)};
  REQUIRE(runtime::gpu::describeLibraryCall(call, std::span(types, 2), types[2]).status().code() ==
          ErrorCode::kUnimplemented);
  auto stream = (*emu)->openStream(0);
  REQUIRE(stream.hasValue());
  std::vector<runtime::DeviceBuffer> buffers;
  std::vector<runtime::DeviceTensor> dev;
  for (const ir::TensorType& t : types) {
    auto b = (*emu)->allocate(t.byteSize());
    REQUIRE(b.hasValue());
    dev.push_back({b->address(), t});
    buffers.push_back(std::move(*b));
  }
  std::mt19937 fill(8);
  for (int trial = 0; trial < 4; ++trial) {
    INFO("call " << trial);
    std::vector<Tensor> in = {*Tensor::empty(ir::DType::kF32, x),
                              *Tensor::empty(ir::DType::kF32, w)};
    for (Tensor& t : in)
      for (int64_t i = 0; i < t.numElements(); ++i)
        t.data<float>()[i] = std::uniform_real_distribution<float>(-1, 1)(fill);
    auto conv = runtime::runReferenceOp(ir::OpKind::kConv2d, in, attrs);
    REQUIRE(conv.hasValue());
    auto want = runtime::runReferenceOp(ir::OpKind::kSigmoid, {(*conv)[0]}, {});
    REQUIRE(want.hasValue());
    for (int i = 0; i < 2; ++i)
      REQUIRE((*stream)->upload(dev[i].address, in[i].rawData(), types[i].byteSize()).isOk());
    Status st = (*stream)->run(call, std::span(dev.data(), 2), std::span(dev.data() + 2, 1));
    INFO(st.message());
    REQUIRE(st.isOk());
    Tensor got = *Tensor::empty(ir::DType::kF32, x);
    REQUIRE((*stream)->download(got.rawData(), dev[2].address, types[2].byteSize()).isOk());
    st = (*stream)->synchronize();
    INFO(st.message());
    REQUIRE(st.isOk());
    double maxDiff = 0;
    for (int64_t i = 0; i < got.numElements(); ++i)
      maxDiff =
          std::max(maxDiff, std::fabs(got.elementAsDouble(i) - (*want)[0].elementAsDouble(i)));
    CHECK(maxDiff <= 1e-5);
    CHECK(cache.numEntries() == 0);
  }
}
