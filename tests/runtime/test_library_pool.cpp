// Library max_pool2d and avg_pool2d (kiln's loops, runtime/library/pool.cpp) against the
// reference kernels over a table of shapes: pads (asymmetric), dilation, ceil_mode (incl.
// windows running past the padded input), count_include_pad both ways, both layouts, post-ops
// and the ABI kernel. Exact: the library computes each output as the reference does (post-op
// chains: 1e-5 of max |reference|).
#include "runtime/test_library_util.h"

using namespace kiln;
using namespace kiln::libtest;

namespace {

struct PoolCase {
  const char* name;
  Shape x;
  std::vector<int64_t> kernel, strides, pads, dilations;
  int64_t ceil;
};

const std::vector<PoolCase>& poolCases() {
  static const std::vector<PoolCase> cases = {
      {"2x2 stride 2", {1, 3, 8, 8}, {2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 0},
      {"3x3 stride 2 pad 1, batch 2", {2, 4, 9, 9}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 0},
      {"3x3 stride 2 pad 1 ceil (past the padded input)",
       {2, 4, 8, 8},
       {3, 3},
       {2, 2},
       {1, 1, 1, 1},
       {1, 1},
       1},
      {"asymmetric pads, ceil", {1, 5, 10, 7}, {3, 3}, {2, 2}, {1, 0, 1, 1}, {1, 1}, 1},
      {"rectangular kernel and strides, ceil",
       {1, 3, 11, 9},
       {2, 3},
       {3, 2},
       {1, 0, 0, 1},
       {1, 1},
       1},
      {"stride larger than kernel, ceil", {1, 3, 7, 8}, {2, 2}, {3, 3}, {0, 0, 0, 0}, {1, 1}, 1},
      {"ceil without effect", {1, 2, 7, 7}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 1},
      {"resnet stem 3x3/2 pad 1, 16 channels",
       {1, 16, 14, 14},
       {3, 3},
       {2, 2},
       {1, 1, 1, 1},
       {1, 1},
       0},
      {"dilation 2 (max only)", {1, 2, 11, 11}, {3, 3}, {2, 2}, {2, 2, 2, 2}, {2, 2}, 1},
      {"odd everything", {3, 5, 13, 6}, {3, 2}, {2, 1}, {1, 1, 0, 0}, {1, 1}, 1},
      // Vector loops with remainders (37 channels, rows of 21 outputs at stride 2).
      {"37 channels, wide rows", {2, 37, 12, 41}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 1},
      // Enough taps for the threads (over 2^17).
      {"resnet stem at 56x56, 64 channels",
       {1, 64, 56, 56},
       {3, 3},
       {2, 2},
       {1, 1, 1, 1},
       {1, 1},
       0},
  };
  return cases;
}

ir::AttrMap maxAttrs(const PoolCase& c) {
  return {{"kernel", c.kernel},
          {"strides", c.strides},
          {"pads", c.pads},
          {"dilations", c.dilations},
          {"ceil_mode", c.ceil}};
}

ir::AttrMap avgAttrs(const PoolCase& c, int64_t includePad) {
  return {{"kernel", c.kernel},
          {"strides", c.strides},
          {"pads", c.pads},
          {"ceil_mode", c.ceil},
          {"count_include_pad", includePad}};
}

bool dense(const PoolCase& c) {
  return c.dilations == std::vector<int64_t>{1, 1};
}

}  // namespace

TEST_CASE("library max_pool2d matches the reference in both layouts", "[library][pool]") {
  uint32_t seed = 1;
  for (const PoolCase& c : poolCases()) {
    const ir::AttrMap attrs = maxAttrs(c);
    const std::vector<Tensor> in{randomTensor(c.x, seed++)};
    const Tensor want = runRef(OpKind::kMaxPool2d, in, attrs);
    for (bool nhwc : {false, true}) {
      INFO(c.name << (nhwc ? ", NHWC" : ", NCHW"));
      LibraryOptions options;
      options.channelsLast = nhwc;
      checkRelClose(runLib(OpKind::kMaxPool2d, in, attrs, {}, {}, options), want, 0);
    }
  }
}

TEST_CASE("library max_pool2d propagates NaN as the reference does, in both layouts",
          "[library][pool]") {
  uint32_t seed = 30;
  for (const PoolCase& c : poolCases()) {
    const ir::AttrMap attrs = maxAttrs(c);
    Tensor x = randomTensor(c.x, seed++);
    // NaN in a corner, on an edge and inside, and one +inf.
    float* p = x.data<float>();
    const int64_t n = x.numElements();
    for (int64_t i : {int64_t{0}, n / 3, n / 2 + 1, n - 1}) p[i] = std::nanf("");
    p[n / 5] = std::numeric_limits<float>::infinity();
    const std::vector<Tensor> in{x};
    const Tensor want = runRef(OpKind::kMaxPool2d, in, attrs);
    int64_t nans = 0;
    for (int64_t i = 0; i < want.numElements(); ++i) nans += std::isnan(want.data<float>()[i]);
    CHECK(nans > 0);
    for (bool nhwc : {false, true}) {
      INFO(c.name << (nhwc ? ", NHWC" : ", NCHW"));
      LibraryOptions options;
      options.channelsLast = nhwc;
      checkRelClose(runLib(OpKind::kMaxPool2d, in, attrs, {}, {}, options), want, 0);
    }
  }
}

TEST_CASE("library avg_pool2d matches the reference, count_include_pad both ways",
          "[library][pool]") {
  uint32_t seed = 50;
  for (const PoolCase& c : poolCases()) {
    if (!dense(c)) continue;  // avg_pool2d has no dilations.
    const std::vector<Tensor> in{randomTensor(c.x, seed++)};
    for (int64_t includePad : {0, 1}) {
      const ir::AttrMap attrs = avgAttrs(c, includePad);
      const Tensor want = runRef(OpKind::kAvgPool2d, in, attrs);
      for (bool nhwc : {false, true}) {
        INFO(c.name << ", count_include_pad " << includePad << (nhwc ? ", NHWC" : ", NCHW"));
        LibraryOptions options;
        options.channelsLast = nhwc;
        checkRelClose(runLib(OpKind::kAvgPool2d, in, attrs, {}, {}, options), want, 0);
      }
    }
  }
}

TEST_CASE("library avg_pool2d ceil_mode divides the last windows as the reference does",
          "[library][pool]") {
  // 1x1x4x4 of ones, 3x3 kernel, stride 2, pads 1, ceil: output 3x3 (the last window starts at
  // row 3 and reaches row 5, one past the padded input). With count_include_pad the corner
  // divides by 2x2 cells of the padded input: (1) / 4 = 0.25 (one input cell); an edge by 3x2.
  auto ones = Tensor::empty(DType::kF32, {1, 1, 4, 4});
  REQUIRE(ones.hasValue());
  std::fill(ones->data<float>(), ones->data<float>() + 16, 1.f);
  const PoolCase c{"ones", {1, 1, 4, 4}, {3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 1};
  const Tensor got = runLib(OpKind::kAvgPool2d, {*ones}, avgAttrs(c, 1));
  REQUIRE(got.shape() == Shape{1, 1, 3, 3});
  const float* y = got.data<float>();
  CHECK(y[0] == Approx(4.0 / 9));  // Rows -1..1, cols -1..1: 4 input cells of 9.
  CHECK(y[2] == Approx(2.0 / 6));  // Cols 3..4 (clipped to the padded input): 2 of 6.
  CHECK(y[8] == Approx(1.0 / 4));  // The corner: 1 of 2x2.
  checkRelClose(got, runRef(OpKind::kAvgPool2d, {*ones}, avgAttrs(c, 1)), 0);
}

TEST_CASE("library pooling applies post-ops", "[library][pool][postops]") {
  const PoolCase c{"3x3/2 ceil", {2, 6, 9, 8}, {3, 3}, {2, 2}, {1, 0, 1, 1}, {1, 1}, 1};
  const std::vector<Tensor> in{randomTensor(c.x, 9)};
  for (OpKind op : {OpKind::kMaxPool2d, OpKind::kAvgPool2d}) {
    const ir::AttrMap attrs = op == OpKind::kMaxPool2d ? maxAttrs(c) : avgAttrs(c, 1);
    const Shape yShape = inferredShape(op, in, attrs);
    const std::vector<Tensor> extra{randomTensor(yShape, 10), randomTensor(yShape, 11)};
    for (const auto& [chainName, chain] : postOpChains()) {
      const Tensor want = referenceWithPostOps(op, in, attrs, chain, extra);
      for (bool nhwc : {false, true}) {
        INFO(ir::opName(op) << " + " << chainName << (nhwc ? ", NHWC" : ", NCHW"));
        LibraryOptions options;
        options.channelsLast = nhwc;
        checkRelClose(runLib(op, in, attrs, chain, extra, options), want, 1e-5);
      }
    }
  }
}

TEST_CASE("library pooling RefKernel-ABI kernels equal the reference", "[library][pool]") {
  uint32_t seed = 200;
  for (const PoolCase& c : poolCases()) {
    const std::vector<Tensor> in{randomTensor(c.x, seed++)};
    std::vector<std::pair<OpKind, ir::AttrMap>> runs{{OpKind::kMaxPool2d, maxAttrs(c)}};
    if (dense(c)) {
      runs.emplace_back(OpKind::kAvgPool2d, avgAttrs(c, 0));
      runs.emplace_back(OpKind::kAvgPool2d, avgAttrs(c, 1));
    }
    for (const auto& [op, attrs] : runs) {
      INFO(c.name << ", " << ir::opName(op));
      const runtime::RefKernel k = runtime::libraryKernel(op, DType::kF32);
      REQUIRE(k != nullptr);
      const Tensor want = runRef(op, in, attrs);
      std::vector<Tensor> outs{emptyLike(want.shape())};
      REQUIRE(k(ir::AttrView(ir::opInfo(op), attrs), in, outs).isOk());
      checkRelClose(outs[0], want, 0);
    }
  }
}

TEST_CASE("library pooling equals the reference over a sweep of small geometries",
          "[library][pool]") {
  // Every valid (input, kernel, stride, dilation, pads, ceil_mode) along H, with an odd W
  // window, for max, avg and avg with count_include_pad, in both layouts. Catches ceil_mode
  // padding, clipped divisors and dilated windows that miss the input entirely.
  int checked = 0;
  for (int64_t in = 1; in <= 9; ++in) {
    const Tensor x = randomTensor({1, 3, in, 4}, static_cast<uint32_t>(in));
    for (int64_t k = 1; k <= 4; ++k)
      for (int64_t s = 1; s <= 4; ++s)
        for (int64_t d = 1; d <= 2; ++d)
          for (int64_t padBegin = 0; padBegin <= 2; ++padBegin)
            for (int64_t padEnd = 0; padEnd <= 2; ++padEnd)
              for (int64_t ceil = 0; ceil <= 1; ++ceil)
                for (int variant = 0; variant < 3; ++variant) {
                  if (variant > 0 && d > 1) continue;  // avg_pool2d has no dilations.
                  const OpKind op = variant == 0 ? OpKind::kMaxPool2d : OpKind::kAvgPool2d;
                  ir::AttrMap attrs{{"kernel", std::vector<int64_t>{k, 2}},
                                    {"strides", std::vector<int64_t>{s, 1}},
                                    {"pads", std::vector<int64_t>{padBegin, 0, padEnd, 1}},
                                    {"ceil_mode", ceil}};
                  if (variant == 0)
                    attrs["dilations"] = std::vector<int64_t>{d, 1};
                  else
                    attrs["count_include_pad"] = int64_t{variant - 1};
                  const std::vector<ir::TensorType> types{x.type()};
                  if (!ir::inferTypes(op, types, attrs).hasValue()) continue;
                  const Tensor want = runRef(op, {x}, attrs);
                  for (bool nhwc : {false, true}) {
                    INFO(ir::opName(op)
                         << " in " << in << " kernel " << k << " stride " << s << " dilation " << d
                         << " pads " << padBegin << "/" << padEnd << " ceil " << ceil << " variant "
                         << variant << (nhwc ? " NHWC" : " NCHW"));
                    LibraryOptions options;
                    options.channelsLast = nhwc;
                    checkRelClose(runLib(op, {x}, attrs, {}, {}, options), want, 0);
                    ++checked;
                  }
                }
  }
  CHECK(checked > 1000);
}

TEST_CASE("library concat equals the reference bit for bit in both layouts", "[library]") {
  // Plain along every axis and NHWC along channels (kiln's row copies: DenseNet's many narrow
  // inputs included), NHWC along the other axes (oneDNN's concat), empty inputs skipped.
  struct Case {
    std::vector<Shape> in;
    int64_t axis;
  };
  std::vector<Shape> dense{{1, 64, 7, 7}};
  for (int i = 0; i < 12; ++i) dense.push_back({1, 32, 7, 7});
  const std::vector<Case> cases = {
      {{{2, 3, 4, 5}, {2, 6, 4, 5}}, 1},
      {{{2, 3, 4, 5}, {1, 3, 4, 5}, {3, 3, 4, 5}}, 0},
      {{{2, 3, 4, 5}, {2, 3, 1, 5}}, 2},
      {{{2, 3, 4, 5}, {2, 3, 4, 7}, {2, 3, 4, 1}}, 3},
      {{{2, 3, 4, 5}, {2, 0, 4, 5}, {2, 2, 4, 5}}, 1},
      {dense, 1},
      {{{1, 16, 56, 56}, {1, 48, 56, 56}}, 1},  // Large enough to run on several threads.
  };
  uint32_t seed = 1;
  for (const Case& c : cases) {
    std::vector<Tensor> in;
    for (const Shape& s : c.in) in.push_back(randomTensor(s, seed++));
    const ir::AttrMap attrs = {{"axis", c.axis}};
    const Tensor want = runRef(OpKind::kConcat, in, attrs);
    INFO(c.in.size() << " inputs, first " << ir::shapeToString(c.in[0]) << ", axis " << c.axis);
    CHECK(runLib(OpKind::kConcat, in, attrs).toData().bitwiseEqual(want.toData()));
    LibraryOptions options;  // runLib converts the inputs to NHWC and the output back.
    options.channelsLast = true;
    CHECK(runLib(OpKind::kConcat, in, attrs, {}, {}, options).toData().bitwiseEqual(want.toData()));
  }
}
