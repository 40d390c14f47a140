// Training's BatchNorm and max-pooling gradients as library calls (runtime/library/
// training_kernels.cpp): plain memory runs the reference kernels, channels-last memory kiln's
// NHWC kernels, which must give the reference's results.
#include <omp.h>

#include <limits>

#include "tests/runtime/test_library_util.h"

using namespace kiln;
using namespace kiln::libtest;

namespace {

ir::AttrMap eps() {
  return {{"epsilon", 1e-5}};
}

// The BatchNorm training ops on x [N,C,H,W] through the library in one layout against the
// reference: stats, then the gradient's sums and the gradient from them.
void checkBatchNorm(const Shape& shape, bool nhwc, uint32_t seed) {
  // Values off zero with a large mean: the variance's two passes matter.
  const Tensor x = randomTensor(shape, seed, 2.f, 5.f);
  const Tensor g = randomTensor(shape, seed + 1);
  const int64_t c = shape[1];
  LibraryOptions options;
  options.channelsLast = nhwc;
  const Tensor stats = runLib(OpKind::kBatchNormStats, {x}, {}, {}, {}, options);
  checkRelClose(stats, runRef(OpKind::kBatchNormStats, {x}), 1e-6);
  Tensor mean = emptyLike({c}), var = emptyLike({c});
  for (int64_t k = 0; k < c; ++k) {
    mean.data<float>()[k] = stats.data<float>()[k];
    var.data<float>()[k] = stats.data<float>()[c + k];
  }
  const Tensor sums =
      runLib(OpKind::kBatchNormBackwardReduce, {g, x, mean, var}, eps(), {}, {}, options);
  checkRelClose(sums, runRef(OpKind::kBatchNormBackwardReduce, {g, x, mean, var}, eps()), 1e-5);
  const Tensor scale = randomTensor({c}, seed + 2);
  const std::vector<Tensor> in{g, x, mean, var, scale, sums};
  checkRelClose(runLib(OpKind::kBatchNormBackward, in, eps(), {}, {}, options),
                runRef(OpKind::kBatchNormBackward, in, eps()), 1e-5);
}

}  // namespace

TEST_CASE("library BatchNorm training ops equal the reference in both layouts", "[library]") {
  // Channel counts below, at and off the vector width; one image and many; a shape whose rows
  // span several of the kernels' fixed chunks.
  const Shape shapes[] = {
      {2, 3, 5, 7}, {1, 16, 4, 4}, {4, 64, 9, 9}, {3, 130, 6, 5}, {8, 32, 40, 40}};
  for (const Shape& s : shapes)
    for (const bool nhwc : {false, true}) {
      INFO(ir::shapeToString(s) << (nhwc ? " channels-last" : " NCHW"));
      checkBatchNorm(s, nhwc, 11);
    }
}

TEST_CASE("library BatchNorm statistics do not depend on the thread count", "[library]") {
  // The double partial sums are cut by the shape alone: bitwise resume holds at any thread count.
  const Tensor x = randomTensor({8, 24, 30, 30}, 5);
  LibraryOptions options;
  options.channelsLast = true;
  const int before = omp_get_max_threads();
  omp_set_num_threads(1);
  const Tensor one = runLib(OpKind::kBatchNormStats, {x}, {}, {}, {}, options);
  omp_set_num_threads(2);
  const Tensor two = runLib(OpKind::kBatchNormStats, {x}, {}, {}, {}, options);
  omp_set_num_threads(before);
  for (int64_t i = 0; i < one.numElements(); ++i)
    CHECK(one.data<float>()[i] == two.data<float>()[i]);
}

TEST_CASE("library max_pool2d_backward equals the reference in both layouts", "[library][pool]") {
  // Values from {0, 1, 2, NaN} make ties (the first maximum wins) and NaNs (the first NaN wins);
  // overlapping windows add up; padding, dilation and ceil_mode leave some cells in no window.
  struct Config {
    int64_t k, s, p, d, ceil;
  };
  const Config configs[] = {{2, 2, 0, 1, 0}, {3, 2, 1, 1, 0}, {3, 1, 1, 1, 0},
                            {3, 3, 0, 1, 1}, {2, 1, 0, 2, 0}, {3, 2, 1, 2, 1}};
  const Shape shapes[] = {{2, 3, 7, 9}, {1, 70, 8, 8}, {2, 16, 11, 10}};
  for (const Config cfg : configs)
    for (const Shape& s : shapes) {
      INFO("kernel " << cfg.k << " stride " << cfg.s << " pad " << cfg.p << " dilation " << cfg.d
                     << " ceil " << cfg.ceil << " " << ir::shapeToString(s));
      Tensor x = randomTensor(s, 3, 0.f, 4.f);
      float* xp = x.data<float>();
      for (int64_t i = 0; i < x.numElements(); ++i) {
        const int v = static_cast<int>(xp[i]);
        xp[i] = v == 3 && i % 7 == 0 ? std::numeric_limits<float>::quiet_NaN()
                                     : static_cast<float>(std::min(v, 2));
      }
      const ir::AttrMap attrs = {{"kernel", std::vector<int64_t>{cfg.k, cfg.k}},
                                 {"strides", std::vector<int64_t>{cfg.s, cfg.s}},
                                 {"pads", std::vector<int64_t>{cfg.p, cfg.p, cfg.p, cfg.p}},
                                 {"dilations", std::vector<int64_t>{cfg.d, cfg.d}},
                                 {"ceil_mode", cfg.ceil}};
      const Shape ys = inferredShape(OpKind::kMaxPool2d, {x}, attrs);
      const Tensor dy = randomTensor(ys, 4);
      const Tensor want = runRef(OpKind::kMaxPool2dBackward, {dy, x}, attrs);
      for (const bool nhwc : {false, true}) {
        INFO((nhwc ? "channels-last" : "NCHW"));
        LibraryOptions options;
        options.channelsLast = nhwc;
        // The same gradients summed (overlapping windows) in another order: rounding apart.
        checkRelClose(runLib(OpKind::kMaxPool2dBackward, {dy, x}, attrs, {}, {}, options), want,
                      1e-6);
      }
    }
}

TEST_CASE("library BatchNorm statistics of non-finite data are the reference's", "[library]") {
  // A NaN makes its channel's mean and variance NaN; an infinity its mean infinite and its
  // variance NaN, also when it is the channel's first value (the one-pass kernel's shift).
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  Tensor x = randomTensor({2, 4, 3, 3}, 7);
  float* p = x.data<float>();
  p[0 * 9 + 4] = nan;   // Channel 0, image 0.
  p[1 * 9 + 0] = inf;   // Channel 1's first value.
  p[4 * 9 + 8] = inf;   // Channel 0, image 1.
  p[6 * 9 + 2] = -inf;  // Channel 2, image 1.
  LibraryOptions options;
  options.channelsLast = true;
  checkRelClose(runLib(OpKind::kBatchNormStats, {x}, {}, {}, {}, options),
                runRef(OpKind::kBatchNormStats, {x}), 1e-6);
}

TEST_CASE("library BatchNorm statistics of bf16 equal the reference's in both layouts",
          "[library]") {
  // f16/bf16 calls of training's BatchNorm and gradient kernels run the reference kernel in
  // their type, as eager mode does (channels-last through 2-byte plain copies): bit for bit.
  const Tensor x = toBf16(randomTensor({2, 3, 4, 5}, 9, 1.f, 3.f));
  const Tensor want = runRef(OpKind::kBatchNormStats, {x});
  for (const bool nhwc : {false, true}) {
    INFO((nhwc ? "channels-last" : "NCHW"));
    LibraryOptions options;
    options.channelsLast = nhwc;
    const Tensor in = nhwc ? runRef(OpKind::kRelayout, {x},
                                    {{"from", std::string("plain")}, {"to", std::string("nhwc")}})
                           : x;
    Tensor got = *Tensor::empty(DType::kBF16, want.shape());
    const Status st = runtime::runLibraryWithPostOps(
        OpKind::kBatchNormStats, ir::AttrView(ir::opInfo(OpKind::kBatchNormStats), {}),
        std::vector<Tensor>{in}, {}, {}, got, options);
    INFO(st.message());
    REQUIRE(st.isOk());
    for (int64_t i = 0; i < want.numElements(); ++i)
      CHECK(got.data<uint16_t>()[i] == want.data<uint16_t>()[i]);
  }
}

TEST_CASE("library conv_transpose2d equals the reference in both layouts", "[library][conv]") {
  // oneDNN's backward-data primitive (conv_transpose2d runs as conv2d_backward_data with its
  // output giving the shape): strides, asymmetric pads, dilation, groups and output_padding.
  struct Config {
    int64_t c, m, k, s, pt, pb, d, group, op;
  };
  const Config configs[] = {{4, 3, 3, 2, 1, 1, 1, 1, 1},
                            {6, 4, 2, 2, 0, 0, 1, 2, 0},
                            {3, 5, 3, 1, 1, 0, 2, 1, 0},
                            {8, 8, 4, 3, 1, 2, 1, 4, 2}};
  for (const Config& cfg : configs)
    for (const bool nhwc : {false, true}) {
      INFO("config c " << cfg.c << " m " << cfg.m << " k " << cfg.k << " s " << cfg.s
                       << (nhwc ? " channels-last" : " NCHW"));
      const Tensor x = randomTensor({2, cfg.c, 5, 6}, 3);
      const Tensor w = randomTensor({cfg.c, cfg.m / cfg.group, cfg.k, cfg.k}, 4);
      const ir::AttrMap attrs = {{"strides", std::vector<int64_t>{cfg.s, cfg.s}},
                                 {"pads", std::vector<int64_t>{cfg.pt, cfg.pt, cfg.pb, cfg.pb}},
                                 {"dilations", std::vector<int64_t>{cfg.d, cfg.d}},
                                 {"group", cfg.group},
                                 {"output_padding", std::vector<int64_t>{cfg.op, cfg.op}}};
      LibraryOptions options;
      options.channelsLast = nhwc;
      checkRelClose(runLib(OpKind::kConvTranspose2d, {x, w}, attrs, {}, {}, options),
                    runRef(OpKind::kConvTranspose2d, {x, w}, attrs), 1e-5);
    }
}
