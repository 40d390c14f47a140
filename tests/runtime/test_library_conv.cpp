// Library conv2d (oneDNN direct and winograd, im2col + lib::sgemm) against the reference
// kernel over a table of shapes and attributes, every algorithm candidate, both layouts,
// every post-op kind, the weight cache, the RefKernel-ABI kernel and the error paths.
// Tolerance: 1e-5 of max |reference|, 1e-4 for winograd (its transforms round more).
#include <omp.h>

#include <random>
#include <thread>

#include "runtime/cpu/compute_threads.h"
#include "runtime/reference/helpers.h"
#include "runtime/test_library_util.h"

using namespace kiln;
using namespace kiln::libtest;

namespace {

struct ConvCase {
  const char* name;
  Shape x;  // [N,C,H,W]
  int64_t m, kh, kw;
  std::vector<int64_t> strides, pads, dilations;
  int64_t group;
  bool bias;
};

const std::vector<ConvCase>& convCases() {
  static const std::vector<ConvCase> cases = {
      {"3x3 pad 1", {1, 3, 8, 8}, 4, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true},
      {"stride 2, asymmetric pads, batch 2",
       {2, 4, 9, 7},
       6,
       3,
       3,
       {2, 2},
       {1, 0, 2, 1},
       {1, 1},
       1,
       true},
      {"dilation 2", {1, 5, 11, 10}, 3, 3, 3, {1, 1}, {2, 2, 2, 2}, {2, 2}, 1, false},
      {"groups 2", {2, 8, 7, 7}, 6, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 2, true},
      {"depthwise", {1, 16, 10, 10}, 16, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 16, true},
      {"depthwise x2, stride 2, asymmetric",
       {1, 8, 9, 9},
       16,
       3,
       3,
       {2, 2},
       {0, 1, 1, 0},
       {1, 1},
       8,
       false},
      {"1x1", {2, 32, 7, 7}, 16, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, true},
      {"1x1 stride 2", {1, 16, 9, 9}, 8, 1, 1, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1, true},
      // Squeeze-excite's: one pixel, a matrix-vector product (kAuto takes sgemv).
      {"1x1 on one pixel", {1, 40, 1, 1}, 10, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, true},
      {"1x1 groups 4", {1, 16, 5, 6}, 8, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 4, true},
      {"5x3 odd, mixed stride and dilation",
       {1, 3, 13, 11},
       5,
       5,
       3,
       {2, 1},
       {2, 1, 1, 0},
       {1, 2},
       1,
       true},
      {"7x7 stride 2 stem", {1, 3, 23, 23}, 8, 7, 7, {2, 2}, {3, 3, 3, 3}, {1, 1}, 1, true},
      {"3x3 32->32 (winograd-sized)",
       {1, 32, 14, 14},
       32,
       3,
       3,
       {1, 1},
       {1, 1, 1, 1},
       {1, 1},
       1,
       true},
      {"3x3 16->24 batch 2 unpadded",
       {2, 16, 12, 12},
       24,
       3,
       3,
       {1, 1},
       {0, 0, 0, 0},
       {1, 1},
       1,
       false},
      {"groups 3, stride 2, dilation 2, asymmetric",
       {2, 6, 12, 12},
       9,
       3,
       3,
       {2, 2},
       {2, 1, 2, 3},
       {2, 2},
       3,
       true},
      {"kernel as large as the padded input",
       {1, 2, 4, 5},
       3,
       5,
       6,
       {1, 1},
       {1, 0, 0, 1},
       {1, 1},
       1,
       true},
  };
  return cases;
}

ir::AttrMap attrsOf(const ConvCase& c) {
  return {{"strides", c.strides}, {"pads", c.pads}, {"dilations", c.dilations}, {"group", c.group}};
}

std::vector<Tensor> inputsOf(const ConvCase& c, uint32_t seed) {
  std::vector<Tensor> in{randomTensor(c.x, seed),
                         randomTensor({c.m, c.x[1] / c.group, c.kh, c.kw}, seed + 1)};
  if (c.bias) in.push_back(randomTensor({c.m}, seed + 2));
  return in;
}

std::vector<ConvAlgo> algorithmsOf(const ConvCase& c, const ir::AttrMap& attrs) {
  const ir::AttrView view(ir::opInfo(OpKind::kConv2d), attrs);
  std::vector<ConvAlgo> algos =
      runtime::convAlgorithms(view, c.x, {c.m, c.x[1] / c.group, c.kh, c.kw});
  algos.insert(algos.begin(), ConvAlgo::kAuto);
  return algos;
}

double toleranceOf(ConvAlgo algo) {
  return algo == ConvAlgo::kWinograd ? 1e-4 : 1e-5;
}

}  // namespace

TEST_CASE("library conv2d matches the reference for every algorithm and layout",
          "[library][conv]") {
  uint32_t seed = 1;
  for (const ConvCase& c : convCases()) {
    const ir::AttrMap attrs = attrsOf(c);
    const std::vector<Tensor> in = inputsOf(c, seed += 10);
    const Tensor want = runRef(OpKind::kConv2d, in, attrs);
    for (ConvAlgo algo : algorithmsOf(c, attrs)) {
      for (bool nhwc : {false, true}) {
        INFO(c.name << ", " << runtime::convAlgoName(algo) << (nhwc ? ", NHWC" : ", NCHW"));
        LibraryOptions options;
        options.algo = algo;
        options.channelsLast = nhwc;
        checkRelClose(runLib(OpKind::kConv2d, in, attrs, {}, {}, options), want, toleranceOf(algo));
      }
    }
  }
}

TEST_CASE("library conv2d candidates: direct and im2col always, winograd where oneDNN has it",
          "[library][conv]") {
  auto algos = [](const ConvCase& c) {
    const ir::AttrMap attrs = attrsOf(c);
    return runtime::convAlgorithms(ir::AttrView(ir::opInfo(OpKind::kConv2d), attrs), c.x,
                                   {c.m, c.x[1] / c.group, c.kh, c.kw});
  };
  const ConvCase wino{"3x3", {1, 32, 14, 14}, 32, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true};
  const ConvCase pointwise{"1x1", {1, 32, 7, 7}, 16, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, true};
  const ConvCase strided{"3x3 s2", {1, 32, 14, 14}, 32,     3, 3,
                         {2, 2},   {1, 1, 1, 1},    {1, 1}, 1, true};
  for (const ConvCase& c : {wino, pointwise, strided}) {
    INFO(c.name);
    const auto a = algos(c);
    CHECK(std::count(a.begin(), a.end(), ConvAlgo::kAuto) == 0);
    CHECK(a.front() == ConvAlgo::kDirect);
    CHECK(std::count(a.begin(), a.end(), ConvAlgo::kDirect) == 1);
    CHECK(std::count(a.begin(), a.end(), ConvAlgo::kIm2colGemm) == 1);
  }
  // oneDNN's winograd needs 3x3, stride 1, no dilation, one group.
  const auto p = algos(pointwise), s = algos(strided);
  CHECK(std::count(p.begin(), p.end(), ConvAlgo::kWinograd) == 0);
  CHECK(std::count(s.begin(), s.end(), ConvAlgo::kWinograd) == 0);
  CHECK(runtime::convAlgoName(ConvAlgo::kIm2colGemm) == "im2col_gemm");
  CHECK(runtime::convAlgoName(ConvAlgo::kWinograd) == "winograd");

  // Asking for winograd where it is not a candidate is an error, not a wrong answer.
  const ir::AttrMap attrs = attrsOf(pointwise);
  const std::vector<Tensor> in = inputsOf(pointwise, 7);
  Tensor out = emptyLike({1, 16, 7, 7});
  LibraryOptions options;
  options.algo = ConvAlgo::kWinograd;
  const Status st = runtime::runLibraryWithPostOps(
      OpKind::kConv2d, ir::AttrView(ir::opInfo(OpKind::kConv2d), attrs), in, {}, {}, out, options);
  CHECK(st.code() == ErrorCode::kUnimplemented);
}

TEST_CASE("library conv2d fuses every post-op kind for every algorithm and layout",
          "[library][conv][postops]") {
  const std::vector<ConvCase> cases = {
      {"3x3 16->16", {2, 16, 8, 8}, 16, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true},
      {"depthwise stride 2", {1, 8, 9, 9}, 8, 3, 3, {2, 2}, {1, 0, 1, 1}, {1, 1}, 8, true},
      {"1x1 no bias", {1, 12, 5, 5}, 20, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, false},
  };
  uint32_t seed = 100;
  for (const ConvCase& c : cases) {
    const ir::AttrMap attrs = attrsOf(c);
    const std::vector<Tensor> in = inputsOf(c, seed += 10);
    const Shape yShape = inferredShape(OpKind::kConv2d, in, attrs);
    const std::vector<Tensor> extra{randomTensor(yShape, seed + 5), randomTensor(yShape, seed + 6)};
    for (const auto& [chainName, chain] : postOpChains()) {
      const Tensor want = referenceWithPostOps(OpKind::kConv2d, in, attrs, chain, extra);
      for (ConvAlgo algo : algorithmsOf(c, attrs)) {
        for (bool nhwc : {false, true}) {
          INFO(c.name << " + " << chainName << ", " << runtime::convAlgoName(algo)
                      << (nhwc ? ", NHWC" : ", NCHW"));
          LibraryOptions options;
          options.algo = algo;
          options.channelsLast = nhwc;
          checkRelClose(runLib(OpKind::kConv2d, in, attrs, chain, extra, options), want,
                        toleranceOf(algo));
        }
      }
    }
  }
}

TEST_CASE("library conv2d with an in-place residual (the output is the kAdd input)",
          "[library][conv][postops]") {
  // kAuto runs the one-pixel 1x1 case on im2col, which writes the output before it adds.
  for (const ConvCase& c :
       {ConvCase{"3x3", {1, 16, 6, 6}, 16, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true},
        ConvCase{
            "1x1 on one pixel", {1, 16, 1, 1}, 16, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, true}}) {
    const ir::AttrMap attrs = attrsOf(c);
    const std::vector<Tensor> in = inputsOf(c, 5);
    const Tensor residual = randomTensor({1, 16, c.x[2], c.x[3]}, 9);
    const std::vector<PostOp> post{postOp(Kind::kAdd, 0, 0, 0), postOp(Kind::kRelu)};
    const Tensor want = referenceWithPostOps(OpKind::kConv2d, in, attrs, post, {residual});
    for (ConvAlgo algo : algorithmsOf(c, attrs)) {
      INFO(c.name << ", " << runtime::convAlgoName(algo));
      Tensor out = emptyLike(residual.shape());
      REQUIRE(out.copyFrom(residual).isOk());
      LibraryOptions options;
      options.algo = algo;
      const std::vector<Tensor> extra{out};  // Shares the output's storage.
      REQUIRE(runtime::runLibraryWithPostOps(OpKind::kConv2d,
                                             ir::AttrView(ir::opInfo(OpKind::kConv2d), attrs), in,
                                             post, extra, out, options)
                  .isOk());
      checkRelClose(out, want, toleranceOf(algo));
    }
  }
}

TEST_CASE("library conv2d of a large channels-last batch runs in slices of images",
          "[library][conv][postops]") {
  // Outputs over 8 MB whose post-ops end in kiln's epilogue pass run a few images at a time
  // (conv_dnnl.cpp, imagesPerSlice), the residual added in that pass: the result is the
  // reference's for a residual of its own and one planned in place over the output, for a batch
  // of 4 at 100x100 (slices of 1 image: 2.6 MB) and of 6 at 80x80 (slices of 2: 3.3 MB).
  for (const auto& [n, side] : {std::pair<int64_t, int64_t>{4, 100}, {6, 80}}) {
    const ConvCase c{"1x1 16->64", {n, 16, side, side}, 64,     1, 1,
                     {1, 1},       {0, 0, 0, 0},        {1, 1}, 1, true};
    const ir::AttrMap attrs = attrsOf(c);
    const std::vector<Tensor> in = inputsOf(c, 17);
    const Shape yShape = inferredShape(OpKind::kConv2d, in, attrs);
    const Tensor residual = randomTensor(yShape, 19);
    for (const auto& post : {std::vector<PostOp>{postOp(Kind::kAdd, 0, 0, 0), postOp(Kind::kRelu)},
                             std::vector<PostOp>{postOp(Kind::kRelu)}}) {
      const Tensor want = referenceWithPostOps(OpKind::kConv2d, in, attrs, post, {residual});
      for (const bool inPlace : {false, true}) {
        INFO("batch " << n << ", " << post.size() << " post-ops, in place " << inPlace);
        LibraryOptions options;
        options.channelsLast = true;
        const std::vector<Tensor> nhwcIn{toNhwc(in[0]), in[1], in[2]};
        Tensor out = emptyLike(yShape);
        const Tensor r = toNhwc(residual);
        if (inPlace) REQUIRE(out.copyFrom(r).isOk());
        const std::vector<Tensor> extra{inPlace ? out : r};
        REQUIRE(runtime::runLibraryWithPostOps(OpKind::kConv2d,
                                               ir::AttrView(ir::opInfo(OpKind::kConv2d), attrs),
                                               nhwcIn, post, extra, out, options)
                    .isOk());
        checkRelClose(fromNhwc(out), want, 1e-5);
      }
    }
  }
}

TEST_CASE("library conv2d keeps reordered weights in the caller's cache", "[library][conv]") {
  const ConvCase c{"3x3", {1, 16, 8, 8}, 32, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true};
  const ir::AttrMap attrs = attrsOf(c);
  const std::vector<Tensor> in = inputsOf(c, 21);
  const Tensor want = runRef(OpKind::kConv2d, in, attrs);
  runtime::LibraryCache cache;
  for (ConvAlgo algo : algorithmsOf(c, attrs)) {
    for (bool nhwc : {false, true}) {
      INFO(runtime::convAlgoName(algo) << (nhwc ? ", NHWC" : ", NCHW"));
      LibraryOptions options;
      options.algo = algo;
      options.channelsLast = nhwc;
      options.cache = &cache;
      const size_t before = cache.numEntries();
      checkRelClose(runLib(OpKind::kConv2d, in, attrs, {}, {}, options), want, toleranceOf(algo));
      const size_t entries = cache.numEntries(), hits = cache.hits();
      checkRelClose(runLib(OpKind::kConv2d, in, attrs, {}, {}, options), want, toleranceOf(algo));
      // The second call reuses what the first one cached.
      CHECK(cache.numEntries() == entries);
      if (entries > before) CHECK(cache.hits() > hits);
    }
  }
  // At least oneDNN's blocked weights and im2col's channels-last weights were cached.
  CHECK(cache.numEntries() >= 2);
  CHECK(cache.bytes() > 0);

  // Other weights at another address get their own entry, never the cached ones.
  std::vector<Tensor> other = in;
  other[1] = randomTensor(in[1].shape(), 77);
  LibraryOptions options;
  options.cache = &cache;
  checkRelClose(runLib(OpKind::kConv2d, other, attrs, {}, {}, options),
                runRef(OpKind::kConv2d, other, attrs), 1e-5);
  cache.clear();
  CHECK(cache.numEntries() == 0);
  CHECK(cache.bytes() == 0);
}

TEST_CASE("a prepared bf16 conv2d call reorders its weights where it runs natively",
          "[library][conv]") {
  // Native bf16 convolutions (runtime::nativeBf16Convolutions()) are prepared like f32 ones: the
  // bf16 weights reordered into the cache, nothing computed, the output untouched; converted
  // calls have nothing to prepare.
  const ConvCase c{"3x3", {2, 16, 8, 8}, 32, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true};
  const ir::AttrMap attrs = attrsOf(c);
  const std::vector<Tensor> f32 = inputsOf(c, 29);
  const std::vector<Tensor> in{toBf16(toNhwc(f32[0])), toBf16(f32[1]), toBf16(f32[2])};
  const Shape yShape = inferredShape(OpKind::kConv2d, f32, attrs);
  runtime::LibraryCache cache;
  LibraryOptions options;
  options.channelsLast = true;
  options.cache = &cache;
  options.prepare = true;
  Tensor out = *Tensor::empty(DType::kBF16, yShape);
  std::fill_n(out.data<uint16_t>(), out.numElements(), uint16_t{0x4242});
  const ir::AttrView view(ir::opInfo(OpKind::kConv2d), attrs);
  REQUIRE(runtime::runLibraryWithPostOps(OpKind::kConv2d, view, in, {}, {}, out, options).isOk());
  for (int64_t i = 0; i < out.numElements(); ++i) REQUIRE(out.data<uint16_t>()[i] == 0x4242);
  CHECK(cache.numEntries() == (runtime::nativeBf16Convolutions() ? 1u : 0u));
  // The call after it finds its weights ready and computes the f32 call's result, rounded once.
  const size_t hits = cache.hits();
  options.prepare = false;
  REQUIRE(runtime::runLibraryWithPostOps(OpKind::kConv2d, view, in, {}, {}, out, options).isOk());
  if (runtime::nativeBf16Convolutions()) CHECK(cache.hits() > hits);
  Tensor want = emptyLike(yShape);
  const std::vector<Tensor> wide{fromBf16(in[0]), fromBf16(in[1]), fromBf16(in[2])};
  REQUIRE(
      runtime::runLibraryWithPostOps(OpKind::kConv2d, view, wide, {}, {}, want, options).isOk());
  checkRelClose(fromBf16(out), fromBf16(toBf16(want)), 1.0 / 128);
}

TEST_CASE("a prepared conv2d call reorders its weights into the cache and computes nothing",
          "[library][conv]") {
  const ConvCase c{"3x3", {1, 16, 8, 8}, 32, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true};
  const ir::AttrMap attrs = attrsOf(c);
  const std::vector<Tensor> in = inputsOf(c, 23);
  const Tensor want = runRef(OpKind::kConv2d, in, attrs);
  for (ConvAlgo algo : algorithmsOf(c, attrs)) {
    for (bool nhwc : {false, true}) {
      INFO(runtime::convAlgoName(algo) << (nhwc ? ", NHWC" : ", NCHW"));
      runtime::LibraryCache cache;
      LibraryOptions options;
      options.algo = algo;
      options.channelsLast = nhwc;
      options.cache = &cache;
      options.prepare = true;
      Tensor out = emptyLike(want.shape());
      for (int64_t i = 0; i < out.numElements(); ++i) out.data<float>()[i] = 12345.f;
      const ir::AttrView view(ir::opInfo(OpKind::kConv2d), attrs);
      REQUIRE(
          runtime::runLibraryWithPostOps(OpKind::kConv2d, view, in, {}, {}, out, options).isOk());
      for (int64_t i = 0; i < out.numElements(); ++i) REQUIRE(out.data<float>()[i] == 12345.f);
      // The call after it finds its weights ready: no new entry, the same result.
      const size_t entries = cache.numEntries(), hits = cache.hits();
      options.prepare = false;
      checkRelClose(runLib(OpKind::kConv2d, in, attrs, {}, {}, options), want, toleranceOf(algo));
      CHECK(cache.numEntries() == entries);
      if (entries > 0) CHECK(cache.hits() > hits);
      // oneDNN's direct convolution reorders OIHW weights into a blocked format.
      if (algo == ConvAlgo::kDirect) CHECK(entries > 0);
    }
  }
}

TEST_CASE("library conv2d is safe to call from several threads sharing a cache",
          "[library][conv]") {
  const std::vector<ConvCase> cases = {
      {"a", {1, 16, 8, 8}, 16, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true},
      {"b", {2, 8, 7, 7}, 8, 3, 3, {2, 2}, {1, 1, 1, 1}, {1, 1}, 2, false},
  };
  std::vector<std::vector<Tensor>> inputs;
  std::vector<Tensor> wants;
  for (size_t i = 0; i < cases.size(); ++i) {
    inputs.push_back(inputsOf(cases[i], 300 + 10 * static_cast<uint32_t>(i)));
    wants.push_back(runRef(OpKind::kConv2d, inputs.back(), attrsOf(cases[i])));
  }
  runtime::LibraryCache cache;
  std::vector<double> maxErr(4, 0.0);
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 4; ++rep) {
        const size_t i = static_cast<size_t>((t + rep) % 2);
        const ir::AttrMap attrs = attrsOf(cases[i]);
        LibraryOptions options;
        options.cache = &cache;
        options.channelsLast = false;
        options.algo = rep % 2 ? ConvAlgo::kIm2colGemm : ConvAlgo::kDirect;
        auto out = Tensor::empty(DType::kF32, wants[i].shape());
        if (!out.hasValue()) return;
        const Status s = runtime::runLibraryWithPostOps(
            OpKind::kConv2d, ir::AttrView(ir::opInfo(OpKind::kConv2d), attrs), inputs[i], {}, {},
            *out, options);
        if (!s.isOk()) {
          maxErr[t] = 1e9;
          return;
        }
        const float* g = out->data<float>();
        const float* w = wants[i].data<float>();
        for (int64_t e = 0; e < out->numElements(); ++e)
          maxErr[t] = std::max(maxErr[t], static_cast<double>(std::fabs(g[e] - w[e])));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (double e : maxErr) CHECK(e < 1e-4);
}

TEST_CASE("library conv2d RefKernel-ABI kernel equals the reference", "[library][conv]") {
  const runtime::RefKernel k = runtime::libraryKernel(OpKind::kConv2d, DType::kF32);
  REQUIRE(k != nullptr);
  for (const ConvCase& c : convCases()) {
    INFO(c.name);
    const ir::AttrMap attrs = attrsOf(c);
    const std::vector<Tensor> in = inputsOf(c, 500);
    const Tensor want = runRef(OpKind::kConv2d, in, attrs);
    Tensor out = emptyLike(want.shape());
    std::vector<Tensor> outs{out};
    REQUIRE(k(ir::AttrView(ir::opInfo(OpKind::kConv2d), attrs), in, outs).isOk());
    checkRelClose(out, want, 1e-5);
  }

  // No input channels: nothing for oneDNN to run; the ABI kernel runs the reference (bias
  // only) and runLibraryWithPostOps says kUnimplemented.
  const ir::AttrMap attrs = {{"pads", std::vector<int64_t>{1, 1, 1, 1}}};
  const std::vector<Tensor> in{emptyLike({1, 0, 4, 4}), emptyLike({2, 0, 3, 3}),
                               randomTensor({2}, 3)};
  const Tensor want = runRef(OpKind::kConv2d, in, attrs);
  Tensor out = emptyLike(want.shape());
  std::vector<Tensor> outs{out};
  const ir::AttrView view(ir::opInfo(OpKind::kConv2d), attrs);
  REQUIRE(k(view, in, outs).isOk());
  checkRelClose(out, want, 0);
  CHECK(runtime::runLibraryWithPostOps(OpKind::kConv2d, view, in, {}, {}, out).code() ==
        ErrorCode::kUnimplemented);
}

TEST_CASE("libraryKernel is f32 (and converted f16/bf16) only, for library ops only", "[library]") {
  for (OpKind op :
       {OpKind::kConv2d, OpKind::kMaxPool2d, OpKind::kAvgPool2d, OpKind::kMatMul, OpKind::kGemm,
        OpKind::kLinear, OpKind::kConv2dBackwardData, OpKind::kConv2dBackwardWeight}) {
    INFO(ir::opName(op));
    CHECK(runtime::libraryKernel(op, DType::kF32) != nullptr);
    CHECK(runtime::libraryKernel(op, DType::kF64) == nullptr);
    CHECK(runtime::libraryKernel(op, DType::kBF16) != nullptr);  // Widened, run, rounded.
    CHECK(runtime::libraryKernel(op, DType::kI64) == nullptr);
  }
  for (OpKind op : {OpKind::kAdd, OpKind::kRelu, OpKind::kSoftmax, OpKind::kGlobalAvgPool,
                    OpKind::kBatchNorm, OpKind::kReshape})
    CHECK(runtime::libraryKernel(op, DType::kF32) == nullptr);
}

TEST_CASE("runLibraryWithPostOps rejects what it cannot run, naming the problem", "[library]") {
  const ConvCase c{"3x3", {1, 4, 6, 6}, 4, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true};
  const ir::AttrMap attrs = attrsOf(c);
  const ir::AttrView view(ir::opInfo(OpKind::kConv2d), attrs);
  const std::vector<Tensor> in = inputsOf(c, 1);
  Tensor out = emptyLike({1, 4, 6, 6});

  // f64: the reference runs it.
  auto x64 = Tensor::zeros(DType::kF64, {1, 4, 6, 6});
  auto w64 = Tensor::zeros(DType::kF64, {4, 4, 3, 3});
  REQUIRE(x64.hasValue());
  REQUIRE(w64.hasValue());
  auto out64 = Tensor::zeros(DType::kF64, {1, 4, 6, 6});
  REQUIRE(out64.hasValue());
  CHECK(runtime::runLibraryWithPostOps(OpKind::kConv2d, view, std::vector<Tensor>{*x64, *w64}, {},
                                       {}, *out64)
            .code() == ErrorCode::kUnimplemented);

  // An op without a library kernel.
  const ir::AttrMap none;
  CHECK(runtime::runLibraryWithPostOps(OpKind::kAdd, ir::AttrView(ir::opInfo(OpKind::kAdd), none),
                                       std::vector<Tensor>{out, out}, {}, {}, out)
            .code() == ErrorCode::kUnimplemented);

  // A wrongly shaped output.
  Tensor bad = emptyLike({1, 4, 5, 5});
  const Status s = runtime::runLibraryWithPostOps(OpKind::kConv2d, view, in, {}, {}, bad);
  CHECK(s.code() == ErrorCode::kInvalidArgument);
  CHECK(s.message().find("conv2d") != std::string::npos);

  // A kAdd reading a missing or wrongly shaped extra.
  const std::vector<PostOp> add{postOp(Kind::kAdd, 0, 0, 0)};
  CHECK(runtime::runLibraryWithPostOps(OpKind::kConv2d, view, in, add, {}, out).code() ==
        ErrorCode::kInvalidArgument);
  const std::vector<Tensor> wrong{emptyLike({1, 4, 6, 5})};
  CHECK(runtime::runLibraryWithPostOps(OpKind::kConv2d, view, in, add, wrong, out).code() ==
        ErrorCode::kInvalidArgument);
}

TEST_CASE("library conv2d equals the reference over random geometries", "[library][conv]") {
  // Fixed-seed random geometries: groups (incl. depthwise), kernels 1-5, strides 1-3,
  // dilations 1-3, asymmetric pads 0-3, odd sizes, batch 1-2; every candidate and layout.
  std::mt19937 gen(2024);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
  };
  int checked = 0;
  for (int trial = 0; trial < 120; ++trial) {
    const int64_t group = std::vector<int64_t>{1, 1, 2, 3, 0}[static_cast<size_t>(pick(0, 4))];
    const int64_t cPerGroup = group == 0 ? 1 : pick(1, 6);
    const int64_t groups = group == 0 ? pick(2, 12) : group;  // 0: depthwise.
    const int64_t mPerGroup = group == 0 ? pick(1, 2) : pick(1, 6);
    ConvCase c{"random",
               {pick(1, 2), cPerGroup * groups, pick(1, 12), pick(1, 12)},
               mPerGroup * groups,
               pick(1, 5),
               pick(1, 5),
               {pick(1, 3), pick(1, 3)},
               {pick(0, 3), pick(0, 3), pick(0, 3), pick(0, 3)},
               {pick(1, 3), pick(1, 3)},
               groups,
               pick(0, 1) == 1};
    const ir::AttrMap attrs = attrsOf(c);
    const std::vector<Tensor> in = inputsOf(c, static_cast<uint32_t>(1000 + trial));
    std::vector<ir::TensorType> types;
    types.reserve(in.size());
    for (const Tensor& t : in) types.push_back(t.type());
    if (!ir::inferTypes(OpKind::kConv2d, types, attrs).hasValue()) continue;  // Window too big.
    const Tensor want = runRef(OpKind::kConv2d, in, attrs);
    for (ConvAlgo algo : algorithmsOf(c, attrs)) {
      for (bool nhwc : {false, true}) {
        INFO("x " << ir::shapeToString(c.x) << " w [" << c.m << "," << c.x[1] / c.group << ","
                  << c.kh << "," << c.kw << "] strides " << c.strides[0] << "," << c.strides[1]
                  << " pads " << c.pads[0] << "," << c.pads[1] << "," << c.pads[2] << ","
                  << c.pads[3] << " dilations " << c.dilations[0] << "," << c.dilations[1]
                  << " group " << c.group << (c.bias ? " bias" : "") << ", "
                  << runtime::convAlgoName(algo) << (nhwc ? ", NHWC" : ", NCHW"));
        LibraryOptions options;
        options.algo = algo;
        options.channelsLast = nhwc;
        checkRelClose(runLib(OpKind::kConv2d, in, attrs, {}, {}, options), want, toleranceOf(algo));
        ++checked;
      }
    }
  }
  CHECK(checked > 300);
}

TEST_CASE("library conv2d backward (data, weight) equals the reference over random geometries",
          "[library][conv]") {
  // The oneDNN backward kernels (eager and compiled training use them through libraryKernel)
  // against kiln's reference kernels, which the f64 gradient checks verify: groups (incl.
  // depthwise), kernels 1-5, strides 1-3, dilations 1-3, asymmetric pads, batch 1-3.
  const runtime::RefKernel data = runtime::libraryKernel(OpKind::kConv2dBackwardData, DType::kF32);
  const runtime::RefKernel weight =
      runtime::libraryKernel(OpKind::kConv2dBackwardWeight, DType::kF32);
  REQUIRE(data != nullptr);
  REQUIRE(weight != nullptr);
  std::mt19937 gen(77);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(gen);
  };
  int checked = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const int64_t kind = pick(0, 3);  // 0-1 dense, 2 grouped, 3 depthwise.
    const int64_t groups = kind < 2 ? 1 : (kind == 2 ? pick(2, 3) : pick(2, 8));
    const int64_t cPerGroup = kind == 3 ? 1 : pick(1, 6);
    const int64_t mPerGroup = kind == 3 ? pick(1, 2) : pick(1, 6);
    ConvCase c{"random",
               {pick(1, 3), cPerGroup * groups, pick(1, 14), pick(1, 14)},
               mPerGroup * groups,
               pick(1, 5),
               pick(1, 5),
               {pick(1, 3), pick(1, 3)},
               {pick(0, 2), pick(0, 2), pick(0, 2), pick(0, 2)},
               {pick(1, 2), pick(1, 2)},
               groups,
               false};
    const ir::AttrMap attrs = attrsOf(c);
    const std::vector<Tensor> xw = inputsOf(c, static_cast<uint32_t>(3000 + trial));
    std::vector<ir::TensorType> types{xw[0].type(), xw[1].type()};
    auto y = ir::inferTypes(OpKind::kConv2d, types, attrs);
    if (!y.hasValue()) continue;  // Window too big.
    const Tensor grad = randomTensor((*y)[0].shape, static_cast<uint32_t>(4000 + trial));
    INFO("x " << ir::shapeToString(c.x) << " w " << ir::shapeToString(xw[1].shape()) << " strides "
              << c.strides[0] << "," << c.strides[1] << " pads " << c.pads[0] << "," << c.pads[1]
              << "," << c.pads[2] << "," << c.pads[3] << " dilations " << c.dilations[0] << ","
              << c.dilations[1] << " group " << c.group);
    for (const bool w : {false, true}) {
      const OpKind op = w ? OpKind::kConv2dBackwardWeight : OpKind::kConv2dBackwardData;
      const std::vector<Tensor> in =
          w ? std::vector<Tensor>{grad, xw[0], xw[1]} : std::vector<Tensor>{grad, xw[1], xw[0]};
      const Tensor want = runRef(op, in, attrs);
      Tensor out = emptyLike(want.shape());
      std::vector<Tensor> outs{out};
      REQUIRE((w ? weight : data)(ir::AttrView(ir::opInfo(op), attrs), in, outs).isOk());
      checkRelClose(out, want, 1e-5);
      ++checked;
    }
  }
  CHECK(checked > 100);
}

TEST_CASE("library conv2d backward on bf16 operands (autocast training) equals the reference",
          "[library][conv]") {
  // On oneDNN's native bf16 kernels, or widened to f32 where the CPU has none, rounded once
  // (185 -> 28 ms a mnist_cnn step against the reference kernel's bf16 loop, converted); the
  // reference computes from the same bf16 operands.
  const ConvCase cases[] = {
      {"3x3 pad 1, batch 2", {2, 8, 12, 12}, 16, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, false},
      {"stride 2, groups 2", {1, 8, 9, 9}, 8, 3, 3, {2, 2}, {1, 0, 1, 0}, {1, 1}, 2, false},
      {"1x1", {3, 16, 5, 5}, 8, 1, 1, {1, 1}, {0, 0, 0, 0}, {1, 1}, 1, false},
  };
  for (const ConvCase& c : cases) {
    INFO(c.name);
    const ir::AttrMap attrs = attrsOf(c);
    const std::vector<Tensor> xw = inputsOf(c, 91);
    std::vector<ir::TensorType> types{xw[0].type(), xw[1].type()};
    auto y = ir::inferTypes(OpKind::kConv2d, types, attrs);
    REQUIRE(y.hasValue());
    const Tensor grad = toBf16(randomTensor((*y)[0].shape, 92)), x = toBf16(xw[0]),
                 w = toBf16(xw[1]);
    for (const bool weights : {false, true}) {
      const OpKind op = weights ? OpKind::kConv2dBackwardWeight : OpKind::kConv2dBackwardData;
      const std::vector<Tensor> in =
          weights ? std::vector<Tensor>{grad, x, w} : std::vector<Tensor>{grad, w, x};
      const Tensor want = runRef(op, in, attrs);
      REQUIRE(want.dtype() == DType::kBF16);
      Tensor out = *Tensor::empty(DType::kBF16, want.shape());
      std::vector<Tensor> outs{out};
      const runtime::RefKernel k = runtime::libraryKernel(op, DType::kBF16);
      REQUIRE(k != nullptr);
      REQUIRE(k(ir::AttrView(ir::opInfo(op), attrs), in, outs).isOk());
      checkRelClose(fromBf16(out), fromBf16(want),
                    1e-2);  // bf16's 8 bits of mantissa, rounded once.
    }
  }
}

TEST_CASE("library conv2d and its gradients on bf16 operands are the f32 call, rounded once",
          "[library][conv]") {
  // Where oneDNN has native bf16 kernels (runtime::nativeBf16Convolutions(): AVX512-BF16 or AMX),
  // the products read the bf16 operands as they are and accumulate in f32, and the f32 result (its
  // bias and post-ops in f32) is rounded once; elsewhere the operands are widened for the f32
  // call. Either way the result is the f32 call on the widened operands, up to the order of the
  // f32 sums: within one bf16 rounding, and equal for nearly every element.
  auto compare = [&](const Tensor& got, const Tensor& f32Result) {
    const Tensor want = toBf16(f32Result);
    const Tensor g = fromBf16(got), w = fromBf16(want);
    int64_t equal = 0;
    for (int64_t i = 0; i < g.numElements(); ++i) {
      const float a = g.data<float>()[i], b = w.data<float>()[i];
      equal += a == b;
      INFO("element " << i << ": " << a << " against " << b);
      REQUIRE(std::abs(a - b) <= std::abs(b) * (1.0f / 128) + 1e-30f);  // One bf16 step.
    }
    INFO(equal << " of " << g.numElements() << " equal");
    CHECK(equal >= g.numElements() * 9 / 10);
  };
  const ConvCase cases[] = {
      {"3x3 16->32, batch 2, bias",
       {2, 16, 10, 10},
       32,
       3,
       3,
       {1, 1},
       {1, 1, 1, 1},
       {1, 1},
       1,
       true},
      {"1x1 32->16, stride 2", {1, 32, 9, 9}, 16, 1, 1, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1, false},
      {"groups 2", {1, 8, 9, 9}, 8, 3, 3, {1, 1}, {1, 0, 1, 0}, {1, 1}, 2, true},
  };
  const std::vector<std::pair<const char*, std::vector<PostOp>>> chains = {
      {"none", {}},
      {"relu", {postOp(Kind::kRelu)}},
      {"add, relu", {postOp(Kind::kAdd, 0, 0, 0), postOp(Kind::kRelu)}}};
  uint32_t seed = 300;
  for (const ConvCase& c : cases) {
    const ir::AttrMap attrs = attrsOf(c);
    const std::vector<Tensor> in = inputsOf(c, seed += 10);
    const Shape yShape = inferredShape(OpKind::kConv2d, in, attrs);
    const Tensor residual = randomTensor(yShape, seed + 5), dy = randomTensor(yShape, seed + 6);
    for (const bool nhwc : {false, true}) {
      auto activation = [&](const Tensor& t) { return toBf16(nhwc ? toNhwc(t) : t); };
      LibraryOptions options;
      options.channelsLast = nhwc;
      const Tensor x = activation(in[0]), w = toBf16(in[1]), r = activation(residual),
                   g = activation(dy);
      std::vector<Tensor> half{x, w}, f32{fromBf16(x), fromBf16(w)};
      if (c.bias) {
        half.push_back(toBf16(in[2]));
        f32.push_back(fromBf16(half.back()));
      }
      for (const auto& [chainName, chain] : chains) {
        INFO(c.name << " + " << chainName << (nhwc ? ", NHWC" : ", NCHW"));
        const std::vector<Tensor> halfExtra{r}, f32Extra{fromBf16(r)};
        const ir::AttrView view(ir::opInfo(OpKind::kConv2d), attrs);
        Tensor got = *Tensor::empty(DType::kBF16, yShape), want = emptyLike(yShape);
        REQUIRE(runtime::runLibraryWithPostOps(OpKind::kConv2d, view, half, chain, halfExtra, got,
                                               options)
                    .isOk());
        REQUIRE(runtime::runLibraryWithPostOps(OpKind::kConv2d, view, f32, chain, f32Extra, want,
                                               options)
                    .isOk());
        compare(got, want);
      }
      for (const bool weights : {false, true}) {
        INFO(c.name << (weights ? ": weight gradient" : ": data gradient")
                    << (nhwc ? ", NHWC" : ", NCHW"));
        const OpKind op = weights ? OpKind::kConv2dBackwardWeight : OpKind::kConv2dBackwardData;
        const std::vector<Tensor> halfIn =
            weights ? std::vector<Tensor>{g, x, w} : std::vector<Tensor>{g, w, x};
        const std::vector<Tensor> f32In{fromBf16(halfIn[0]), fromBf16(halfIn[1]),
                                        fromBf16(halfIn[2])};
        const Shape shape = (weights ? in[1] : in[0]).shape();
        const ir::AttrView view(ir::opInfo(op), attrs);
        Tensor got = *Tensor::empty(DType::kBF16, shape), want = emptyLike(shape);
        REQUIRE(runtime::runLibraryWithPostOps(op, view, halfIn, {}, {}, got, options).isOk());
        REQUIRE(runtime::runLibraryWithPostOps(op, view, f32In, {}, {}, want, options).isOk());
        compare(got, want);
      }
    }
  }
}

TEST_CASE("library conv2d and its gradients on winograd equal the reference in both layouts",
          "[library][conv]") {
  // Winograd works in oneDNN's blocked formats (reorders in and out of both layouts); its
  // weights are transformed once into a cache (forward_inference) or in each call (no cache:
  // training, where they change every step). Batch 8 of 64 -> 64 channels at 12x12 is where
  // kAuto takes winograd too (lib::prefersWinograd), so the default path is checked as well.
  const ConvCase c{"3x3 64->64", {8, 64, 12, 12}, 64, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, false};
  const ir::AttrMap attrs = attrsOf(c);
  const std::vector<ConvAlgo> algos = algorithmsOf(c, attrs);
  if (std::count(algos.begin(), algos.end(), ConvAlgo::kWinograd) == 0) {
    WARN("oneDNN has no winograd on this CPU: nothing to check");
    return;
  }
  const std::vector<Tensor> xw = inputsOf(c, 91);
  const Tensor want = runRef(OpKind::kConv2d, xw, attrs);
  const Tensor grad = randomTensor(want.shape(), 92);
  for (const ConvAlgo algo : {ConvAlgo::kWinograd, ConvAlgo::kAuto}) {
    for (const bool nhwc : {false, true}) {
      INFO(runtime::convAlgoName(algo) << (nhwc ? ", channels-last" : ", NCHW"));
      LibraryOptions options;
      options.algo = algo;
      options.channelsLast = nhwc;
      checkRelClose(runLib(OpKind::kConv2d, xw, attrs, {}, {}, options), want, 1e-4);
      runtime::LibraryCache cache;
      options.cache = &cache;
      for (int call = 0; call < 2; ++call)  // Transformed into the cache, then read from it.
        checkRelClose(runLib(OpKind::kConv2d, xw, attrs, {}, {}, options), want, 1e-4);
      options.cache = nullptr;
      for (const bool weights : {false, true}) {
        INFO((weights ? "d weight" : "d input"));
        const OpKind op = weights ? OpKind::kConv2dBackwardWeight : OpKind::kConv2dBackwardData;
        const std::vector<Tensor> in = weights ? std::vector<Tensor>{grad, xw[0], xw[1]}
                                               : std::vector<Tensor>{grad, xw[1], xw[0]};
        checkRelClose(runLib(op, in, attrs, {}, {}, options), runRef(op, in, attrs), 1e-4);
      }
    }
  }
}

TEST_CASE("library conv2d by default gives the same bits at every thread count",
          "[library][conv]") {
  // A call is granted 1 to numThreads() threads (runtime::ComputeThreads), and kiln's results do
  // not depend on it. oneDNN's winograd sizes its schedule by the thread count, and for some
  // shapes the schedules sum in different orders (32 -> 64 channels at 14x14, batch 2: 1 and 2
  // threads differ), so kAuto takes winograd only where a probe found every count equal.
  const int budget = runtime::numThreads();
  runtime::setNumThreads(2);
  const int before = omp_get_max_threads();
  for (const ConvCase& c :
       {ConvCase{
            "32->64 14x14 x2", {2, 32, 14, 14}, 64, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, false},
        ConvCase{"64->64 28x28", {1, 64, 28, 28}, 64, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, false},
        ConvCase{
            "128->32 28x28", {1, 128, 28, 28}, 32, 3, 3, {1, 1}, {1, 1, 1, 1}, {1, 1}, 1, true}}) {
    INFO(c.name);
    const ir::AttrMap attrs = attrsOf(c);
    const std::vector<Tensor> in = inputsOf(c, 61);
    for (const bool cached : {false, true}) {
      INFO((cached ? "weights cached" : "weights per call"));
      runtime::LibraryCache cache;
      LibraryOptions options;
      options.channelsLast = true;
      options.cache = cached ? &cache : nullptr;
      omp_set_num_threads(1);
      const Tensor one = runLib(OpKind::kConv2d, in, attrs, {}, {}, options);
      omp_set_num_threads(2);
      const Tensor two = runLib(OpKind::kConv2d, in, attrs, {}, {}, options);
      CHECK(one.toData().bitwiseEqual(two.toData()));
    }
  }
  omp_set_num_threads(before);
  runtime::setNumThreads(budget);
}

TEST_CASE("library conv2d gradients equal the reference in both layouts", "[library][conv]") {
  // Training keeps convolution chains channels-last through the backward pass: the gradients
  // read NHWC grad and input (the filter OIHW) and write an NHWC d input and an OIHW d weight.
  // Every case of the forward sweep (groups, dilation and strides included: what oneDNN would
  // run on its reference implementation runs on kiln's, through plain copies when NHWC).
  for (const ConvCase& c : convCases()) {
    INFO(c.name);
    const ir::AttrMap attrs = attrsOf(c);
    const std::vector<Tensor> xw = inputsOf(c, 71);
    std::vector<ir::TensorType> types{xw[0].type(), xw[1].type()};
    auto y = ir::inferTypes(OpKind::kConv2d, types, attrs);
    REQUIRE(y.hasValue());
    const Tensor grad = randomTensor((*y)[0].shape, 72);
    for (const bool weights : {false, true}) {
      const OpKind op = weights ? OpKind::kConv2dBackwardWeight : OpKind::kConv2dBackwardData;
      const std::vector<Tensor> in = weights ? std::vector<Tensor>{grad, xw[0], xw[1]}
                                             : std::vector<Tensor>{grad, xw[1], xw[0]};
      const Tensor want = runRef(op, in, attrs);
      for (const bool nhwc : {false, true}) {
        INFO((weights ? "d weight" : "d input") << (nhwc ? ", channels-last" : ", NCHW"));
        LibraryOptions options;
        options.channelsLast = nhwc;
        checkRelClose(runLib(op, in, attrs, {}, {}, options), want, 1e-5);
      }
    }
    const Tensor db = runRef(OpKind::kConv2dBackwardBias, {grad});
    for (const bool nhwc : {false, true}) {
      INFO("d bias" << (nhwc ? ", channels-last" : ", NCHW"));
      LibraryOptions options;
      options.channelsLast = nhwc;
      checkRelClose(runLib(OpKind::kConv2dBackwardBias, {grad}, {}, {}, {}, options), db, 1e-6);
    }
  }
}
