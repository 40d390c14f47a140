// ONNX ops the importer composes from kiln's, against direct computations written here: CumProd
// (a scan by doubling) against a running product along every axis, exclusive and reverse, i64
// products that wrap, f32; the window functions against their formulas; Col2Im against a direct
// scatter-add of each column entry; DeformConv against a direct loop over its taps.
#include <limits>
#include <tuple>
#include <type_traits>

#include "tests/frontends/test_onnx_model.h"

using namespace kiln;
using namespace kiln::onnxtest;

namespace {

// The running product of `x` ([3, 7, 5], row-major) along `axis`, as ONNX defines CumProd.
template <typename T>
std::vector<T> runningProduct(const std::vector<T>& x, const Shape& shape, int axis, bool exclusive,
                              bool reverse) {
  std::vector<T> y(x.size());
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t n = shape[static_cast<size_t>(axis)];
  const int64_t outer = static_cast<int64_t>(x.size()) / (n * inner);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      // Unsigned arithmetic: the wrapping product, without signed overflow here.
      using U = typename std::conditional_t<std::is_integral_v<T>, std::make_unsigned<T>,
                                            std::type_identity<T>>::type;
      U acc = 1;
      for (int64_t k = 0; k < n; ++k) {
        const int64_t j = reverse ? n - 1 - k : k;
        const size_t at = static_cast<size_t>((o * n + j) * inner + i);
        if (exclusive) {
          y[at] = static_cast<T>(acc);
          acc = static_cast<U>(acc * static_cast<U>(x[at]));
        } else {
          acc = static_cast<U>(acc * static_cast<U>(x[at]));
          y[at] = static_cast<T>(acc);
        }
      }
    }
  return y;
}

Model cumProdModel(int32_t type, int64_t axis, bool exclusive, bool reverse) {
  Model m(26);
  m.irVersion(10);
  m.input("x", {int64_t{3}, int64_t{7}, int64_t{5}}, type).initI64("axis", {}, {axis});
  m.node("CumProd", {"x", "axis"}, {"y"},
         {attrInt("exclusive", exclusive), attrInt("reverse", reverse)});
  m.output("y", type);
  return m;
}

}  // namespace

TEST_CASE("onnx: CumProd along every axis, exclusive and reverse, i64 wrapping and f32") {
  const Shape shape{3, 7, 5};
  const size_t count = 3 * 7 * 5;
  std::vector<int64_t> xi(count);
  std::mt19937 rng(7);
  // Large factors: the products wrap within a few steps.
  for (int64_t& v : xi) v = static_cast<int64_t>(rng() % 2000003) - 1000001;
  const std::vector<float> xf = randomValues(count, 8, 0.5f, 1.5f);
  for (int axis = -3; axis < 3; ++axis)
    for (int flags = 0; flags < 4; ++flags) {
      const bool exclusive = flags & 1, reverse = flags & 2;
      const int a = axis < 0 ? axis + 3 : axis;
      INFO("axis " << axis << " exclusive " << exclusive << " reverse " << reverse);
      const Tensor yi =
          run(cumProdModel(kInt64, axis, exclusive, reverse), {makeI64(shape, xi)})[0];
      CHECK(int64s(yi) == runningProduct(xi, shape, a, exclusive, reverse));
      const Tensor yf =
          run(cumProdModel(kFloat, axis, exclusive, reverse), {makeF32(shape, xf)})[0];
      const std::vector<float> want = runningProduct(xf, shape, a, exclusive, reverse);
      const std::vector<float> got = floats(yf);
      REQUIRE(got.size() == want.size());
      for (size_t k = 0; k < got.size(); ++k)  // A few ulps: the products associate differently.
        CHECK(std::fabs(got[k] - want[k]) <= 4e-7f * std::fabs(want[k]));
    }
}

TEST_CASE("onnx: Hann, Hamming and Blackman windows, periodic and symmetric, in f32 and f64") {
  struct Case {
    std::string op;
    double (*w)(double);  // Of x = 2 pi n / N.
  };
  const Case cases[] = {
      {"HannWindow", [](double x) { return 0.5 - 0.5 * std::cos(x); }},
      {"HammingWindow", [](double x) { return 25.0 / 46 - 21.0 / 46 * std::cos(x); }},
      {"BlackmanWindow",
       [](double x) { return 0.42 - 0.5 * std::cos(x) + 0.08 * std::cos(2 * x); }},
  };
  for (const Case& c : cases)
    for (int64_t size : {1, 2, 7, 10})
      for (bool periodic : {true, false})
        for (int32_t type : {kFloat, int32_t{::onnx::TensorProto::DOUBLE}}) {
          INFO(c.op << " size " << size << " periodic " << periodic << " type " << type);
          Model m(17);
          m.initI64("size", {}, {size});
          m.node(c.op, {"size"}, {"w"},
                 {attrInt("periodic", periodic), attrInt("output_datatype", type)});
          m.output("w", type);
          const Tensor w = run(m, {})[0];
          REQUIRE(w.shape() == Shape{size});
          const double n = static_cast<double>(periodic ? size : size - 1);
          for (int64_t i = 0; i < size; ++i) {
            const double want = size == 1 ? 1.0 : c.w(2 * M_PI * static_cast<double>(i) / n);
            const double got = type == kFloat ? w.data<float>()[i] : w.data<double>()[i];
            CHECK(std::fabs(got - want) <= (type == kFloat ? 1e-7 : 1e-15));
          }
        }
}

namespace {

// A Col2Im of input x, with constant image_shape and block_shape.
Model col2im(Shape x, const std::vector<int64_t>& image, const std::vector<int64_t>& block,
             std::vector<::onnx::AttributeProto> attrs = {}) {
  Model m(18);
  m.input("x", std::vector<Dim>(x.begin(), x.end()));
  m.initI64("image", {static_cast<int64_t>(image.size())}, image);
  m.initI64("block", {static_cast<int64_t>(block.size())}, block);
  m.node("Col2Im", {"x", "image", "block"}, {"y"}, std::move(attrs), "c2i").output("y");
  return m;
}

}  // namespace

TEST_CASE("onnx: Col2Im against a direct scatter-add, with strides, dilations and pads") {
  struct Case {
    std::vector<int64_t> image, block, dil, strides, pads;
  };
  const Case cases[] = {
      {{5, 5}, {2, 3}, {1, 1}, {1, 1}, {0, 0, 0, 0}},
      {{6, 7}, {3, 2}, {2, 1}, {1, 2}, {1, 0, 2, 1}},
      {{4, 6}, {2, 2}, {1, 3}, {2, 1}, {0, 2, 1, 0}},
      {{3, 3}, {3, 3}, {1, 1}, {3, 3}, {0, 0, 0, 0}},  // No overlap: a gather alone.
  };
  for (const Case& c : cases) {
    int64_t grid[2], k = c.block[0] * c.block[1];
    for (int d = 0; d < 2; ++d)
      grid[d] = (c.image[d] + c.pads[d] + c.pads[d + 2] - (c.dil[d] * (c.block[d] - 1) + 1)) /
                    c.strides[d] +
                1;
    const int64_t n = 2, ch = 3, l = grid[0] * grid[1];
    std::vector<float> x = randomValues(n * ch * k * l, 7);
    // The middle block's last entry, inside the image in every case: it adds as an infinity (no
    // product with 0).
    x[static_cast<size_t>((k - 1) * l + l / 2)] = std::numeric_limits<float>::infinity();
    std::vector<float> want(static_cast<size_t>(n * ch * c.image[0] * c.image[1]), 0.f);
    for (int64_t b = 0; b < n; ++b)
      for (int64_t q = 0; q < ch; ++q)
        for (int64_t kk = 0; kk < k; ++kk)
          for (int64_t ll = 0; ll < l; ++ll) {
            const int64_t h = ll / grid[1] * c.strides[0] + kk / c.block[1] * c.dil[0] - c.pads[0];
            const int64_t w = ll % grid[1] * c.strides[1] + kk % c.block[1] * c.dil[1] - c.pads[1];
            if (h < 0 || h >= c.image[0] || w < 0 || w >= c.image[1]) continue;
            want[static_cast<size_t>(((b * ch + q) * c.image[0] + h) * c.image[1] + w)] +=
                x[static_cast<size_t>(((b * ch + q) * k + kk) * l + ll)];
          }
    INFO("image " << c.image[0] << "x" << c.image[1] << " block " << c.block[0] << "x"
                  << c.block[1]);
    const Model m = col2im(
        {n, ch * k, l}, c.image, c.block,
        {attrInts("dilations", c.dil), attrInts("strides", c.strides), attrInts("pads", c.pads)});
    const Tensor y = run(m, {makeF32({n, ch * k, l}, x)})[0];
    REQUIRE(y.shape() == Shape{n, ch, c.image[0], c.image[1]});
    int infinities = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isinf(want[i])) {
        ++infinities;
        CHECK(y.data<float>()[i] == want[i]);
      } else {
        CHECK(std::fabs(y.data<float>()[i] - want[i]) <= 1e-6f);
      }
    }
    CHECK(infinities >= 1);
  }
}

TEST_CASE("onnx: Col2Im's malformed sizes are errors, not crashes") {
  // Block sizes whose product wraps int64 to 0 (found by review: a division by it); a table
  // too large to build at import; blocks that do not fit the image.
  const int64_t big = int64_t{1} << 32;
  CHECK(importError(col2im({1, 1, 1}, {big, big}, {big, big})).code() ==
        ErrorCode::kInvalidArgument);
  const Status s = importError(
      col2im({1, 1, 1}, {100000, 100000}, {1, 1}, {attrInts("strides", {100000, 100000})}));
  CHECK(s.code() == ErrorCode::kUnimplemented);
  CHECK_THAT(s.message(), Catch::Contains("index table"));
  CHECK_THAT(importError(col2im({1, 4, 5}, {4, 4}, {2, 2})).message(),
             Catch::Contains("node 'c2i'") && Catch::Contains("input f32[1,4,5]") &&
                 Catch::Contains("9 (the blocks that fit the padded image)"));
}

TEST_CASE("onnx: malformed inputs to the composed ops are errors, not crashes") {
  // Each was found by review: an overflowing size, an unchecked element count, a half-precision
  // scalar read, a subgraph node without outputs.
  SECTION("a cubic Resize whose weight matrix would wrap int64") {
    Model m(19);
    m.input("x", {int64_t{1}, int64_t{1} << 34});
    m.initI64("sizes", {2}, {1, int64_t{1} << 30});
    m.node("Resize", {"x", "", "", "sizes"}, {"y"}, {attrString("mode", "cubic")}, "up");
    m.output("y");
    const Status s = importError(m);
    CHECK(s.code() == ErrorCode::kUnimplemented);
    CHECK_THAT(s.message(), Catch::Contains("at most 2^22 entries"));
  }
  SECTION("an LpPool kernel too large for its constant of ones") {
    Model m(22);
    m.input("x", {int64_t{1}, int64_t{1}, int64_t{4}, int64_t{4}});
    const int64_t k = int64_t{1} << 31, p = int64_t{1} << 30;
    m.node("LpPool", {"x"}, {"y"},
           {attrInts("kernel_shape", {k, k}), attrInts("pads", {p, p, p, p})}, "lp");
    m.output("y");
    CHECK_THAT(importError(m).message(), Catch::Contains("too large"));
  }
  SECTION("a Loop trip count of two values") {
    Model m(21);
    ::onnx::GraphProto body;
    body.set_name("body");
    for (const char* n : {"i", "c"}) body.add_input()->set_name(n);
    body.add_output()->set_name("c");
    m.initI64("trip", {2}, {3, 4});
    m.input("v", {int64_t{2}});
    ::onnx::AttributeProto a;
    a.set_name("body");
    a.set_type(::onnx::AttributeProto::GRAPH);
    *a.mutable_g() = body;
    m.node("Loop", {"trip", ""}, {"out"}, {a}, "loop");
    m.output("out");
    CHECK_THAT(importError(m).message(), Catch::Contains("the trip count M must be one integer"));
  }
  SECTION("a node without outputs inside an If branch") {
    Model m(21);
    ::onnx::GraphProto branch;
    branch.set_name("then");
    auto* n = branch.add_node();
    n->set_op_type("Relu");
    n->add_input("x");
    branch.add_output()->set_name("x");
    ::onnx::AttributeProto t, e;
    t.set_name("then_branch");
    t.set_type(::onnx::AttributeProto::GRAPH);
    *t.mutable_g() = branch;
    e = t;
    e.set_name("else_branch");
    m.input("x", {int64_t{2}});
    ::onnx::TensorProto c;
    c.set_name("c");
    c.set_data_type(::onnx::TensorProto::BOOL);
    c.add_int32_data(1);
    m.initializer(c);
    m.node("If", {"c"}, {"y"}, {t, e}, "if");
    m.output("y");
    CHECK_THAT(importError(m).message(), Catch::Contains("has no outputs"));
  }
  SECTION("MelWeightMatrix with f16 band edges reads them as halves") {
    Model m(17);
    m.initI64("bins", {}, {4}).initI64("dft", {}, {16}).initI64("rate", {}, {8000});
    for (const auto& [name, bits] : {std::pair<const char*, uint16_t>{"lo", 0x5140},     // 42
                                     std::pair<const char*, uint16_t>{"hi", 0x6bd0}}) {  // 3952
      ::onnx::TensorProto h;
      h.set_name(name);
      h.set_data_type(::onnx::TensorProto::FLOAT16);
      h.set_raw_data(std::string(reinterpret_cast<const char*>(&bits), 2));
      m.initializer(h);
    }
    m.node("MelWeightMatrix", {"bins", "dft", "rate", "lo", "hi"}, {"w"});
    m.output("w");
    const Tensor w = run(m, {})[0];
    CHECK(w.shape() == Shape{9, 4});
  }
}

namespace {

// Bilinear sample of plane [h, w] at (y, x), 0 outside: torchvision's deform_conv2d rule.
double bilinearZero(const float* plane, int64_t h, int64_t w, double y, double x) {
  if (y <= -1 || y >= h || x <= -1 || x >= w) return 0;
  const auto y0 = static_cast<int64_t>(std::floor(y)), x0 = static_cast<int64_t>(std::floor(x));
  double v = 0;
  for (int64_t dy = 0; dy < 2; ++dy)
    for (int64_t dx = 0; dx < 2; ++dx) {
      const int64_t r = y0 + dy, c = x0 + dx;
      if (r < 0 || r >= h || c < 0 || c >= w) continue;
      const double wy = dy ? y - y0 : 1 - (y - y0), wx = dx ? x - x0 : 1 - (x - x0);
      v += wy * wx * plane[r * w + c];
    }
  return v;
}

}  // namespace

TEST_CASE("onnx: DeformConv against a direct loop: groups, offset groups, mask, bias, window") {
  // x [2, 4, 5, 6], w [6, 2, 3, 2] (group 2), offset group 2, stride (2, 1), pads (1, 0, 1, 1),
  // dilation (1, 2): oh = (5 + 2 - 3) / 2 + 1 = 3, ow = (6 + 1 - 3) / 1 + 1 = 5. Offsets up to
  // +-3 pixels send some taps outside the image (they read 0).
  // Also without groups and offset groups (one matmul over the columns as sampled), and with
  // either alone.
  const int64_t n = 2, c = 4, h = 5, wd = 6, m = 6, kh = 3, kw = 2;
  const int64_t sh = 2, sw = 1, pt = 1, pl = 0, pb = 1, pr = 1, dh = 1, dw = 2, oh = 3, ow = 5;
  const int64_t taps = kh * kw;
  const std::vector<float> x = randomValues(n * c * h * wd, 11);
  const std::vector<float> bias = randomValues(m, 15);
  for (auto [group, og, withMask] : {std::tuple{2, 2, true},
                                     {2, 2, false},
                                     {1, 1, true},
                                     {1, 1, false},
                                     {1, 2, true},
                                     {2, 1, true}}) {
    const std::vector<float> w = randomValues(m * c / group * taps, 12);
    const std::vector<float> offset = randomValues(n * og * taps * 2 * oh * ow, 13, -3, 3);
    const std::vector<float> mask = randomValues(n * og * taps * oh * ow, 14, 0, 1);
    std::vector<float> want(static_cast<size_t>(n * m * oh * ow));
    for (int64_t b = 0; b < n; ++b)
      for (int64_t o = 0; o < m; ++o)
        for (int64_t i = 0; i < oh; ++i)
          for (int64_t j = 0; j < ow; ++j) {
            double acc = bias[static_cast<size_t>(o)];
            const int64_t g = o / (m / group);
            for (int64_t ci = 0; ci < c / group; ++ci) {
              const int64_t ch = g * (c / group) + ci, q = ch / (c / og);
              const float* plane = x.data() + (b * c + ch) * h * wd;
              for (int64_t a = 0; a < kh; ++a)
                for (int64_t e = 0; e < kw; ++e) {
                  const int64_t k = a * kw + e;
                  const size_t at = static_cast<size_t>(((b * og + q) * taps + k) * 2 * oh * ow);
                  const double dy = offset[at + static_cast<size_t>(i * ow + j)];
                  const double dx = offset[at + static_cast<size_t>(oh * ow + i * ow + j)];
                  const double v = bilinearZero(plane, h, wd, i * sh - pt + a * dh + dy,
                                                j * sw - pl + e * dw + dx);
                  const double mk = withMask
                                        ? mask[static_cast<size_t>(
                                              ((b * og + q) * taps + k) * oh * ow + i * ow + j)]
                                        : 1.0;
                  acc +=
                      v * mk * w[static_cast<size_t>(((o * (c / group) + ci) * kh + a) * kw + e)];
                }
            }
            want[static_cast<size_t>(((b * m + o) * oh + i) * ow + j)] = static_cast<float>(acc);
          }
    Model model(22);
    model.input("x", {n, c, h, wd}).input("w", {m, c / group, kh, kw});
    model.input("offset", {n, og * taps * 2, oh, ow}).input("b", {m});
    std::vector<std::string> inputs{"x", "w", "offset", "b"};
    std::vector<Tensor> values{makeF32({n, c, h, wd}, x), makeF32({m, c / group, kh, kw}, w),
                               makeF32({n, og * taps * 2, oh, ow}, offset), makeF32({m}, bias)};
    if (withMask) {
      model.input("mask", {n, og * taps, oh, ow});
      inputs.push_back("mask");
      values.push_back(makeF32({n, og * taps, oh, ow}, mask));
    }
    model
        .node("DeformConv", inputs, {"y"},
              {attrInts("strides", {sh, sw}), attrInts("pads", {pt, pl, pb, pr}),
               attrInts("dilations", {dh, dw}), attrInt("group", group),
               attrInt("offset_group", og), attrInts("kernel_shape", {kh, kw})},
              "dc")
        .output("y");
    INFO("group " << group << ", offset_group " << og << ", mask " << withMask);
    checkClose(run(model, values)[0], {n, m, oh, ow}, want);
  }

  // An offset of the wrong size names the shape it must have.
  const int64_t group = 2;
  Model bad(22);
  bad.input("x", {n, c, h, wd}).input("w", {m, c / group, kh, kw}).input("offset", {n, 3, oh, ow});
  bad.node("DeformConv", {"x", "w", "offset"}, {"y"},
           {attrInts("strides", {sh, sw}), attrInts("pads", {pt, pl, pb, pr}),
            attrInts("dilations", {dh, dw}), attrInt("group", group)},
           "dc")
      .output("y");
  CHECK_THAT(importError(bad).message(),
             Catch::Contains("offset must be [N, offset_group*kh*kw*2, oh, ow] = [2,12,3,5]"));
}

TEST_CASE(
    "onnx: DeformConv and GridSample on empty or huge images are errors or empty, not crashes") {
  // Found by review: an empty batch divided by 0 in the columns' count; an empty spatial dim
  // left the taps nowhere to read; a batch of 2^30 images would have built a 2^30-element
  // constant of row indices.
  auto deform = [](Shape x, Shape offset, std::vector<int64_t> pads) {
    Model m(22);
    m.input("x", std::vector<Dim>(x.begin(), x.end())).input("w", {3, 2, 3, 3});
    m.input("offset", std::vector<Dim>(offset.begin(), offset.end()));
    m.node("DeformConv", {"x", "w", "offset"}, {"y"}, {attrInts("pads", pads)}, "dc").output("y");
    return m;
  };
  const Tensor empty = run(deform({0, 2, 5, 5}, {0, 18, 3, 3}, {0, 0, 0, 0}),
                           {makeF32({0, 2, 5, 5}, {}), makeF32({3, 2, 3, 3}, randomValues(54, 1)),
                            makeF32({0, 18, 3, 3}, {})})[0];
  CHECK(empty.shape() == Shape{0, 3, 3, 3});
  const Status flat = importError(deform({1, 2, 0, 5}, {1, 18, 2, 7}, {2, 2, 2, 2}));
  CHECK(flat.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(flat.message(), Catch::Contains("every spatial dim >= 1"));
  Model grid(22);
  grid.input("x", {int64_t{1} << 30, 1, 2, 2}).input("g", {int64_t{1} << 30, 1, 1, 2});
  grid.node("GridSample", {"x", "g"}, {"y"}, {}, "gs").output("y");
  const Status big = importError(grid);
  CHECK(big.code() == ErrorCode::kUnimplemented);
  CHECK_THAT(big.message(), Catch::Contains("batches of at most 2^24 images"));
}
