// Reference conv2d (stride, symmetric and asymmetric pads, dilation, groups, depthwise, bias)
// and pooling (pads, dilation, ceil_mode, count_include_pad both ways) against hand-computed
// windows.
#include <limits>
#include <numeric>
#include <random>

#include "runtime/reference_test_util.h"

using namespace kiln;
using namespace kiln::reftest;

namespace {

// 1, 2, ..., n as doubles.
std::vector<double> iota1(int n) {
  std::vector<double> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 1.0);
  return v;
}

ir::AttrMap convAttrs(std::vector<int64_t> strides, std::vector<int64_t> pads,
                      std::vector<int64_t> dilations = {1, 1}, int64_t group = 1) {
  return {{"strides", attrInts(std::move(strides))},
          {"pads", attrInts(std::move(pads))},
          {"dilations", attrInts(std::move(dilations))},
          {"group", attrInt(group)}};
}

}  // namespace

TEMPLATE_TEST_CASE("reference conv2d basic, bias and stride with padding", "[reference][conv]",
                   float, double) {
  // x = 1..9 as 3x3, w = [[1,2],[3,4]]: y00 = 1 + 2*2 + 3*4 + 4*5 = 37, ...
  const Tensor x = make<TestType>({1, 1, 3, 3}, iota1(9));
  const Tensor w = make<TestType>({1, 1, 2, 2}, std::vector<int>{1, 2, 3, 4});
  checkClose<TestType>(run(OpKind::kConv2d, {x, w}), {1, 1, 2, 2}, {37, 47, 67, 77});
  checkClose<TestType>(run(OpKind::kConv2d, {x, w, make<TestType>({1}, std::vector<double>{0.5})}),
                       {1, 1, 2, 2}, {37.5, 47.5, 67.5, 77.5});

  // 4x4 input 1..16, 3x3 ones, stride 2, pads 1: each output sums its window clipped to the
  // input, e.g. y00 = 1+2+5+6.
  const Tensor x4 = make<TestType>({1, 1, 4, 4}, iota1(16));
  const Tensor ones = make<TestType>({1, 1, 3, 3}, std::vector<double>(9, 1.0));
  checkClose<TestType>(run(OpKind::kConv2d, {x4, ones}, convAttrs({2, 2}, {1, 1, 1, 1})),
                       {1, 1, 2, 2}, {14, 30, 57, 99});
}

TEMPLATE_TEST_CASE("reference conv2d asymmetric pads", "[reference][conv]", float, double) {
  // pads [top=1, left=0, bottom=0, right=2] on 1..9 (3x3) with w = [[1,2],[3,4]]: the output is
  // 3x4; row 0 sees the zero row above, column 3 sees only the right padding.
  const Tensor x = make<TestType>({1, 1, 3, 3}, iota1(9));
  const Tensor w = make<TestType>({1, 1, 2, 2}, std::vector<int>{1, 2, 3, 4});
  checkClose<TestType>(run(OpKind::kConv2d, {x, w}, convAttrs({1, 1}, {1, 0, 0, 2})), {1, 1, 3, 4},
                       {11, 18, 9, 0, 37, 47, 21, 0, 67, 77, 33, 0});
}

TEMPLATE_TEST_CASE("reference conv2d dilation", "[reference][conv]", float, double) {
  // 5x5 input x[r][c] = 5r + c + 1, 2x2 kernel [[1,2],[3,4]] dilated by 2:
  // y[i][j] = x[i][j] + 2 x[i][j+2] + 3 x[i+2][j] + 4 x[i+2][j+2] = 10 x[i][j] + 82.
  const Tensor x = make<TestType>({1, 1, 5, 5}, iota1(25));
  const Tensor w = make<TestType>({1, 1, 2, 2}, std::vector<int>{1, 2, 3, 4});
  checkClose<TestType>(run(OpKind::kConv2d, {x, w}, convAttrs({1, 1}, {0, 0, 0, 0}, {2, 2})),
                       {1, 1, 3, 3}, {92, 102, 112, 142, 152, 162, 192, 202, 212});
}

TEMPLATE_TEST_CASE("reference conv2d groups and depthwise", "[reference][conv]", float, double) {
  // groups = 2 with 1x1 kernels: out0 = 1*c0 + 2*c1, out1 = -1*c2 + 3*c3.
  const Tensor x = make<TestType>({1, 4, 2, 2},
                                  std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 1, 1, 1, 1, 0, 1, 0, 1});
  const Tensor w = make<TestType>({2, 2, 1, 1}, std::vector<int>{1, 2, -1, 3});
  checkClose<TestType>(run(OpKind::kConv2d, {x, w}, convAttrs({1, 1}, {0, 0, 0, 0}, {1, 1}, 2)),
                       {1, 2, 2, 2}, {11, 14, 17, 20, -1, 2, -1, 2});

  // Depthwise (group = channels) 2x2 kernels with bias: c0 = 1..9 with [[1,2],[3,4]],
  // c1 = 9..1 with ones.
  const Tensor xd = make<TestType>(
      {1, 2, 3, 3}, std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 8, 7, 6, 5, 4, 3, 2, 1});
  const Tensor wd = make<TestType>({2, 1, 2, 2}, std::vector<int>{1, 2, 3, 4, 1, 1, 1, 1});
  const Tensor bd = make<TestType>({2}, std::vector<int>{1, -1});
  checkClose<TestType>(
      run(OpKind::kConv2d, {xd, wd, bd}, convAttrs({1, 1}, {0, 0, 0, 0}, {1, 1}, 2)), {1, 2, 2, 2},
      {38, 48, 68, 78, 27, 23, 15, 11});

  // A 1x1 kernel with stride 2 and padding (not a plain channel mix): 3x3 input 1..9,
  // pads 1 -> 3x3 output sampling rows/cols -1, 1, 3 (zero outside).
  const Tensor x3 = make<TestType>({1, 1, 3, 3}, iota1(9));
  const Tensor w1 = make<TestType>({1, 1, 1, 1}, std::vector<int>{2});
  checkClose<TestType>(run(OpKind::kConv2d, {x3, w1}, convAttrs({2, 2}, {1, 1, 1, 1})),
                       {1, 1, 3, 3}, {0, 0, 0, 0, 10, 0, 0, 0, 0});
}

TEMPLATE_TEST_CASE("reference conv2d everything at once", "[reference][conv]", float, double) {
  // N=2, C=4, M=6, group 2, kernel 3x2, strides (2,1), pads [1,0,2,1], dilations (1,2), bias.
  // Expected values from a naive 7-loop convolution over the zero-padded input.
  std::vector<double> xv(2 * 4 * 5 * 6), wv(6 * 2 * 3 * 2), bv(6);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<double>((i * 7) % 11) - 5;
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = static_cast<double>((i * 5) % 7) - 3;
  for (size_t i = 0; i < bv.size(); ++i) bv[i] = static_cast<double>(i) - 2;
  const Tensor y = run(
      OpKind::kConv2d,
      {make<TestType>({2, 4, 5, 6}, xv), make<TestType>({6, 2, 3, 2}, wv), make<TestType>({6}, bv)},
      convAttrs({2, 1}, {1, 0, 2, 1}, {1, 2}, 2));
  checkClose<TestType>(
      y, {2, 6, 3, 5},
      {-17, 7,   -13, -22, -1,  -9, -20, -9,  -9,  -10, -13, 7,   -17, -8,  27,  35,  11,  -2,
       7,   -6,  31,  2,   -5,  -1, 1,   6,   -23, 3,   7,   -35, -32, -6,  9,   -20, 10,  -20,
       10,  -15, -7,  12,  -3,  -4, -5,  -6,  29,  -11, -12, -2,  -3,  2,   -12, -17, 0,   17,
       -10, -13, 9,   9,   9,   11, 10,  10,  10,  -12, -6,  18,  1,   -16, -11, 7,   -2,  -1,
       -11, -10, 5,   3,   4,   -6, 28,  0,   -8,  -16, 31,  45,  3,   -19, 10,  39,  13,  -1,
       -8,  -17, 7,   -13, -11, -9, -9,  -20, -9,  -14, -22, -13, 7,   -17, -3,  -7,  35,  11,
       -2,  -3,  27,  31,  2,   -5, 9,   35,  6,   -23, 3,   9,   8,   -32, -6,  9,   -23, -28,
       -20, 10,  -15, 4,   -13, -3, -4,  -5,  -7,  1,   -11, -12, -2,  -1,  -7,  -12, -17, 0,
       27,  -13, -13, 9,   9,   -1, 10,  10,  10,  10,  -7,  2,   18,  1,   -16, -16, -3,  -2,
       -1,  -11, 1,   -9,  3,   4,  -6,  29,  11,  -8,  -16, 31,  25,  7,   -19, 10,  39,  3});
}

TEMPLATE_TEST_CASE("reference max_pool2d", "[reference][pool]", float, double) {
  const ir::AttrMap k2s2 = {{"kernel", attrInts({2, 2})}, {"strides", attrInts({2, 2})}};
  checkClose<TestType>(run(OpKind::kMaxPool2d, {make<TestType>({1, 1, 4, 4}, iota1(16))}, k2s2),
                       {1, 1, 2, 2}, {6, 8, 14, 16});

  // Padding never wins, even over negative inputs: x = -(1..16), 3x3 windows, stride 2, pads 1.
  std::vector<double> neg = iota1(16);
  for (double& v : neg) v = -v;
  checkClose<TestType>(run(OpKind::kMaxPool2d, {make<TestType>({1, 1, 4, 4}, neg)},
                           {{"kernel", attrInts({3, 3})},
                            {"strides", attrInts({2, 2})},
                            {"pads", attrInts({1, 1, 1, 1})}}),
                       {1, 1, 2, 2}, {-1, -2, -5, -6});

  // ceil_mode on 5x5 (x[r][c] = 5r + c + 1), kernel 2, stride 2: the last row/column of windows
  // holds one input row/column.
  const Tensor x5 = make<TestType>({1, 1, 5, 5}, iota1(25));
  checkClose<TestType>(run(OpKind::kMaxPool2d, {x5}, k2s2), {1, 1, 2, 2}, {7, 9, 17, 19});
  ir::AttrMap ceil = k2s2;
  ceil["ceil_mode"] = attrInt(1);
  checkClose<TestType>(run(OpKind::kMaxPool2d, {x5}, ceil), {1, 1, 3, 3},
                       {7, 9, 10, 17, 19, 20, 22, 24, 25});

  // Dilation 2: y[i][j] = max(x[i][j], x[i][j+2], x[i+2][j], x[i+2][j+2]) = x[i+2][j+2].
  checkClose<TestType>(run(OpKind::kMaxPool2d, {make<TestType>({1, 1, 4, 4}, iota1(16))},
                           {{"kernel", attrInts({2, 2})}, {"dilations", attrInts({2, 2})}}),
                       {1, 1, 2, 2}, {11, 12, 15, 16});

  // NaN wins its window, as in PyTorch; planes (n, c) are independent.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  checkClose<TestType>(
      run(OpKind::kMaxPool2d,
          {make<TestType>({2, 1, 2, 2}, std::vector<double>{1, nan, 3, 4, 5, 6, 8, 7})},
          {{"kernel", attrInts({2, 2})}}),
      {2, 1, 1, 1}, {nan, 8});
}

TEMPLATE_TEST_CASE("reference avg_pool2d", "[reference][pool]", float, double) {
  const Tensor x4 = make<TestType>({1, 1, 4, 4}, iota1(16));
  checkClose<TestType>(
      run(OpKind::kAvgPool2d, {x4}, {{"kernel", attrInts({2, 2})}, {"strides", attrInts({2, 2})}}),
      {1, 1, 2, 2}, {3.5, 5.5, 11.5, 13.5});

  // 3x3 windows, stride 2, pads 1 on 1..16: window sums 14, 30, 57, 99 over 4, 6, 6, 9 valid
  // cells; with count_include_pad every divisor is 9.
  ir::AttrMap a = {{"kernel", attrInts({3, 3})},
                   {"strides", attrInts({2, 2})},
                   {"pads", attrInts({1, 1, 1, 1})}};
  checkClose<TestType>(run(OpKind::kAvgPool2d, {x4}, a), {1, 1, 2, 2}, {3.5, 5, 9.5, 11});
  a["count_include_pad"] = attrInt(1);
  checkClose<TestType>(run(OpKind::kAvgPool2d, {x4}, a), {1, 1, 2, 2},
                       {14.0 / 9, 30.0 / 9, 57.0 / 9, 11});

  // ceil_mode adds a third window starting at 3 that spans rows 3..5; PyTorch clips it to the
  // padded input (rows 3..4) for the count_include_pad divisor and to row 3 for the data.
  a["ceil_mode"] = attrInt(1);
  checkClose<TestType>(
      run(OpKind::kAvgPool2d, {x4}, a), {1, 1, 3, 3},
      {14.0 / 9, 30.0 / 9, 12.0 / 6, 57.0 / 9, 11, 36.0 / 6, 27.0 / 6, 45.0 / 6, 16.0 / 4});
  a["count_include_pad"] = attrInt(0);
  checkClose<TestType>(run(OpKind::kAvgPool2d, {x4}, a), {1, 1, 3, 3},
                       {3.5, 5, 6, 9.5, 11, 12, 13.5, 15, 16});

  // ceil_mode without padding: the partial windows average only their input cells, under
  // both count_include_pad settings.
  const Tensor x5 = make<TestType>({1, 1, 5, 5}, iota1(25));
  const std::vector<double> expected = {4, 6, 7.5, 14, 16, 17.5, 21.5, 23.5, 25};
  for (int64_t include : {0, 1}) {
    checkClose<TestType>(run(OpKind::kAvgPool2d, {x5},
                             {{"kernel", attrInts({2, 2})},
                              {"strides", attrInts({2, 2})},
                              {"ceil_mode", attrInt(1)},
                              {"count_include_pad", attrInt(include)}}),
                         {1, 1, 3, 3}, expected);
  }
}

TEMPLATE_TEST_CASE("reference global_avg_pool", "[reference][pool]", float, double) {
  const Tensor x = make<TestType>({2, 2, 1, 2}, std::vector<double>{1, 2, -1, 7, 0.5, 0.25, 3, 3});
  checkClose<TestType>(run(OpKind::kGlobalAvgPool, {x}), {2, 2, 1, 1}, {1.5, 3, 0.375, 3});
}

TEMPLATE_TEST_CASE("reference max_pool2d_backward: ties go to the first maximum, NaN wins",
                   "[reference][pool]", float, double) {
  // 2x2 windows, stride 2 (interior windows) on a 4x4 plane, and 3x3 windows with padding
  // (windows that cross the border): each window's gradient lands on the element the forward
  // picked, accumulating where windows overlap.
  const TestType nan = std::numeric_limits<TestType>::quiet_NaN();
  const Tensor x = make<TestType>({1, 1, 4, 4}, {1, 1, 0, 2,    //
                                                 1, 0, 2, 0,    //
                                                 3, nan, 5, 5,  //
                                                 0, 4, 5, 5});
  const Tensor dy = make<TestType>({1, 1, 2, 2}, {10, 20, 30, 40});
  const ir::AttrMap k2s2 = {{"kernel", attrInts({2, 2})}, {"strides", attrInts({2, 2})}};
  checkClose<TestType>(run(OpKind::kMaxPool2dBackward, {dy, x}, k2s2), {1, 1, 4, 4},
                       {10, 0, 0, 20,  //
                        0, 0, 0, 0,    //
                        0, 30, 40, 0,  //
                        0, 0, 0, 0});
  const ir::AttrMap k3s2p1 = {{"kernel", attrInts({3, 3})},
                              {"strides", attrInts({2, 2})},
                              {"pads", attrInts({1, 1, 1, 1})}};
  // Windows: rows/cols [-1,1] x [-1,1] -> max 1 first at (0,0); [-1,1] x [1,3] -> 2 at (0,3);
  // [1,3] x [-1,1] -> NaN at (2,1); [1,3] x [1,3] -> NaN at (2,1).
  checkClose<TestType>(run(OpKind::kMaxPool2dBackward, {dy, x}, k3s2p1), {1, 1, 4, 4},
                       {10, 0, 0, 20,  //
                        0, 0, 0, 0,    //
                        0, 70, 0, 0,   //
                        0, 0, 0, 0});
}

TEMPLATE_TEST_CASE(
    "reference max_pool2d_backward (2x2 one pass, vectorized interior windows) on ties, NaNs, "
    "padding, dilation and odd sizes",
    "[reference][pool]", float, double) {
  // The kernels against the rule itself, brute force: each window's gradient goes to its first
  // NaN in scan order, else its first strict maximum (padding never chosen), accumulating where
  // windows overlap; elements in no window get 0. Values from {0, 1, 2, NaN} make ties and NaNs
  // common. 2x2 stride 2 takes the one-pass kernel; the others the general loop, whose windows
  // inside the input go through the branch-free row kernel (stride 1, 2 and other).
  const TestType nan = std::numeric_limits<TestType>::quiet_NaN();
  struct Config {
    int64_t k, s, p, d;
  };
  for (const Config cfg : {Config{2, 2, 0, 1}, Config{3, 2, 1, 1}, Config{3, 1, 1, 1},
                           Config{3, 3, 0, 1}, Config{2, 1, 0, 2}, Config{3, 2, 1, 2}}) {
    INFO("kernel " << cfg.k << " stride " << cfg.s << " pad " << cfg.p << " dilation " << cfg.d);
    const int64_t n = 2, c = 3, h = 11, w = 13;
    const int64_t oh = (h + 2 * cfg.p - cfg.d * (cfg.k - 1) - 1) / cfg.s + 1;
    const int64_t ow = (w + 2 * cfg.p - cfg.d * (cfg.k - 1) - 1) / cfg.s + 1;
    std::mt19937 gen(5);
    std::vector<double> xv(n * c * h * w), gv(n * c * oh * ow);
    for (double& v : xv) {
      const int r = static_cast<int>(gen() % 7);
      v = r == 6 ? static_cast<double>(nan) : r % 3;
    }
    for (size_t i = 0; i < gv.size(); ++i) gv[i] = static_cast<double>(i + 1);
    const Tensor x = make<TestType>({n, c, h, w}, xv);
    const Tensor dy = make<TestType>({n, c, oh, ow}, gv);
    const ir::AttrMap attrs = {{"kernel", attrInts({cfg.k, cfg.k})},
                               {"strides", attrInts({cfg.s, cfg.s})},
                               {"pads", attrInts({cfg.p, cfg.p, cfg.p, cfg.p})},
                               {"dilations", attrInts({cfg.d, cfg.d})}};
    std::vector<double> want(xv.size(), 0.0);
    for (int64_t p = 0; p < n * c; ++p)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          int64_t arg = -1;
          double best = 0;
          for (int64_t a = 0; a < cfg.k && !(arg >= 0 && std::isnan(best)); ++a)
            for (int64_t b = 0; b < cfg.k; ++b) {
              const int64_t r = i * cfg.s - cfg.p + a * cfg.d, col = j * cfg.s - cfg.p + b * cfg.d;
              if (r < 0 || r >= h || col < 0 || col >= w) continue;
              const int64_t at = p * h * w + r * w + col;
              if (arg < 0 || xv[at] > best || std::isnan(xv[at])) best = xv[at], arg = at;
              if (std::isnan(best)) break;
            }
          want[arg] += gv[p * oh * ow + i * ow + j];
        }
    checkClose<TestType>(run(OpKind::kMaxPool2dBackward, {dy, x}, attrs), {n, c, h, w}, want);
  }
}

TEMPLATE_TEST_CASE("reference max_pool2d_indices: PyTorch's indices on ties, NaNs and -inf",
                   "[reference][pool]", float, double) {
  const TestType nan = std::numeric_limits<TestType>::quiet_NaN();
  const TestType inf = std::numeric_limits<TestType>::infinity();
  const Tensor x = make<TestType>({1, 1, 4, 4}, {1, 1, 0, 2,        //
                                                 1, 0, 2, 0,        //
                                                 3, nan, nan, nan,  //
                                                 0, 4, 5, 5});
  // 2x2 windows: a tie's first element (0), 2 first at 3, the one NaN (9), the last of two NaNs
  // with larger numbers after them (11).
  const ir::AttrMap k2s2 = {{"kernel", attrInts({2, 2})}, {"strides", attrInts({2, 2})}};
  checkExact<int64_t>(run(OpKind::kMaxPool2dIndices, {x}, k2s2), {1, 1, 2, 2},
                      std::vector<int64_t>{0, 3, 9, 11});
  // 3x3 windows over the border: [-1,1]^2 -> 1 first at 0; [-1,1]x[1,3] -> 2 first at 3;
  // [1,3]x[-1,1] -> the NaN at 9 (4 after it does not take over); [1,3]^2 -> the last NaN, 11.
  const ir::AttrMap k3s2p1 = {{"kernel", attrInts({3, 3})},
                              {"strides", attrInts({2, 2})},
                              {"pads", attrInts({1, 1, 1, 1})}};
  checkExact<int64_t>(run(OpKind::kMaxPool2dIndices, {x}, k3s2p1), {1, 1, 2, 2},
                      std::vector<int64_t>{0, 3, 9, 11});
  // A window of -inf: its first element; -inf before a number: the number.
  const Tensor infs = make<TestType>({1, 1, 2, 4}, {-inf, -inf, -inf, -inf, -inf, -inf, -inf, 3});
  checkExact<int64_t>(run(OpKind::kMaxPool2dIndices, {infs}, k2s2), {1, 1, 1, 2},
                      std::vector<int64_t>{0, 7});
  // Dilated windows wholly in the padding (2x2 taps 4 apart, pads 2, on a 2x2 plane; kiln takes
  // pads up to half the dilated window, PyTorch refuses more than half the kernel): PyTorch's
  // start formula, the first tap at or past row and column 0: rows 2 and 3, columns 2 and 3, past
  // the input.
  const ir::AttrMap dilated = {{"kernel", attrInts({2, 2})},
                               {"pads", attrInts({2, 2, 2, 2})},
                               {"dilations", attrInts({4, 4})}};
  checkExact<int64_t>(
      run(OpKind::kMaxPool2dIndices, {make<TestType>({1, 1, 2, 2}, {1, 2, 3, 4})}, dilated),
      {1, 1, 2, 2}, std::vector<int64_t>{6, 7, 8, 9});
}

TEMPLATE_TEST_CASE(
    "reference max_pool2d_indices (vectorized interior windows and the general loop) on ties, "
    "NaNs, -inf, padding, dilation, ceil_mode and odd sizes",
    "[reference][pool]", float, double) {
  // The kernel against the rule, brute force: from -inf at the first tap at or past 0, the first
  // strictly larger element or any NaN. Values from {0, 1, 2, NaN, -inf} make ties and NaNs
  // common. Each index also names an element whose value max_pool2d returns.
  const TestType nan = std::numeric_limits<TestType>::quiet_NaN();
  const TestType inf = std::numeric_limits<TestType>::infinity();
  struct Config {
    int64_t k, s, p, d, ceil;
  };
  for (const Config cfg :
       {Config{2, 2, 0, 1, 0}, Config{3, 2, 1, 1, 0}, Config{3, 1, 1, 1, 0}, Config{3, 3, 0, 1, 1},
        Config{2, 1, 0, 2, 0}, Config{3, 2, 1, 2, 1}, Config{2, 2, 1, 1, 1}}) {
    INFO("kernel " << cfg.k << " stride " << cfg.s << " pad " << cfg.p << " dilation " << cfg.d
                   << " ceil_mode " << cfg.ceil);
    const int64_t n = 2, c = 3, h = 11, w = 13;
    const ir::AttrMap attrs = {{"kernel", attrInts({cfg.k, cfg.k})},
                               {"strides", attrInts({cfg.s, cfg.s})},
                               {"pads", attrInts({cfg.p, cfg.p, cfg.p, cfg.p})},
                               {"dilations", attrInts({cfg.d, cfg.d})},
                               {"ceil_mode", attrInt(cfg.ceil)}};
    std::mt19937 gen(7);
    std::vector<double> xv(n * c * h * w);
    for (double& v : xv) {
      const int r = static_cast<int>(gen() % 8);
      v = r == 6 ? static_cast<double>(nan) : r == 7 ? -static_cast<double>(inf) : r % 3;
    }
    const Tensor x = make<TestType>({n, c, h, w}, xv);
    const Tensor got = run(OpKind::kMaxPool2dIndices, {x}, attrs);
    const Tensor y = run(OpKind::kMaxPool2d, {x}, attrs);
    REQUIRE(got.shape() == y.shape());
    const int64_t oh = y.shape()[2], ow = y.shape()[3];
    std::vector<int64_t> want;
    for (int64_t p = 0; p < n * c; ++p)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          int64_t r0 = i * cfg.s - cfg.p, c0 = j * cfg.s - cfg.p;
          while (r0 < 0) r0 += cfg.d;
          while (c0 < 0) c0 += cfg.d;
          int64_t arg = r0 * w + c0;
          double best = -std::numeric_limits<double>::infinity();
          for (int64_t a = 0; a < cfg.k; ++a)
            for (int64_t b = 0; b < cfg.k; ++b) {
              const int64_t r = i * cfg.s - cfg.p + a * cfg.d, col = j * cfg.s - cfg.p + b * cfg.d;
              if (r < 0 || r >= h || col < 0 || col >= w) continue;
              const double v = xv[p * h * w + r * w + col];
              if (v > best || std::isnan(v)) best = v, arg = r * w + col;
            }
          want.push_back(arg);
        }
    checkExact<int64_t>(got, y.shape(), want);
    const std::vector<TestType> ys = values<TestType>(y);
    for (size_t i = 0; i < want.size(); ++i) {
      const double at = xv[static_cast<int64_t>(i) / (oh * ow) * h * w + want[i]];
      INFO("output " << i);
      CHECK((std::isnan(at) ? std::isnan(ys[i]) : static_cast<double>(ys[i]) == at));
    }
  }
}

TEMPLATE_TEST_CASE("reference conv_transpose2d scatters each input element through the kernel",
                   "[reference][conv]", float, double) {
  // Brute force, as PyTorch defines ConvTranspose2d: y[n, g*M/G + m, i*s - pt + a*d,
  // j*s - pl + b*d] += x[n, g*C/G + c, i, j] * w[g*C/G + c, m, a, b], taps outside y dropped;
  // output_padding adds rows and columns at the bottom and right.
  struct Config {
    int64_t c, mg, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, group, oph, opw;
  };
  for (const Config cfg : {Config{2, 3, 3, 2, 2, 1, 1, 0, 0, 1, 1, 1, 1, 1, 0},
                           Config{4, 1, 2, 3, 3, 2, 0, 1, 1, 0, 2, 1, 2, 2, 1},
                           Config{3, 2, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0}}) {
    const int64_t n = 2, h = 3, w = 4, m = cfg.mg * cfg.group;
    const int64_t oh = (h - 1) * cfg.sh - cfg.pt - cfg.pb + cfg.dh * (cfg.kh - 1) + cfg.oph + 1;
    const int64_t ow = (w - 1) * cfg.sw - cfg.pl - cfg.pr + cfg.dw * (cfg.kw - 1) + cfg.opw + 1;
    std::mt19937 gen(9);
    std::uniform_real_distribution<double> u(-1, 1);
    std::vector<double> xv(n * cfg.c * h * w), wv(cfg.c * cfg.mg * cfg.kh * cfg.kw);
    for (double& v : xv) v = u(gen);
    for (double& v : wv) v = u(gen);
    std::vector<double> want(n * m * oh * ow, 0.0);
    const int64_t cg = cfg.c / cfg.group;
    for (int64_t b = 0; b < n; ++b)
      for (int64_t ci = 0; ci < cfg.c; ++ci)
        for (int64_t i = 0; i < h; ++i)
          for (int64_t j = 0; j < w; ++j)
            for (int64_t mo = 0; mo < cfg.mg; ++mo)
              for (int64_t a = 0; a < cfg.kh; ++a)
                for (int64_t e = 0; e < cfg.kw; ++e) {
                  const int64_t r = i * cfg.sh - cfg.pt + a * cfg.dh;
                  const int64_t q = j * cfg.sw - cfg.pl + e * cfg.dw;
                  if (r < 0 || r >= oh || q < 0 || q >= ow) continue;
                  const int64_t out = (ci / cg) * cfg.mg + mo;
                  want[((b * m + out) * oh + r) * ow + q] +=
                      xv[((b * cfg.c + ci) * h + i) * w + j] *
                      wv[((ci * cfg.mg + mo) * cfg.kh + a) * cfg.kw + e];
                }
    const ir::AttrMap attrs = {{"strides", attrInts({cfg.sh, cfg.sw})},
                               {"pads", attrInts({cfg.pt, cfg.pl, cfg.pb, cfg.pr})},
                               {"dilations", attrInts({cfg.dh, cfg.dw})},
                               {"group", attrInt(cfg.group)},
                               {"output_padding", attrInts({cfg.oph, cfg.opw})}};
    checkClose<TestType>(run(OpKind::kConvTranspose2d,
                             {make<TestType>({n, cfg.c, h, w}, xv),
                              make<TestType>({cfg.c, cfg.mg, cfg.kh, cfg.kw}, wv)},
                             attrs),
                         {n, m, oh, ow}, want);
  }
}

TEMPLATE_TEST_CASE("reference roi_align: bins of bilinear samples, both coordinate modes, max",
                   "[reference][conv_pool]", float, double) {
  // Image 0 is x[h][w] = 4h + w, image 1 the same + 100: bilinear samples of a linear function
  // are exact, so each bin's mean is the function at its samples' mean position.
  std::vector<double> xv(32);
  for (int i = 0; i < 16; ++i)
    xv[static_cast<size_t>(i)] = i, xv[static_cast<size_t>(i) + 16] = i + 100;
  const Tensor x = make<TestType>({2, 1, 4, 4}, xv);
  auto attrs = [](const char* mode, int64_t oh, int64_t ow, int64_t ratio, int64_t aligned) {
    return ir::AttrMap{{"mode", attrStr(mode)},         {"output_height", attrInt(oh)},
                       {"output_width", attrInt(ow)},   {"sampling_ratio", attrInt(ratio)},
                       {"spatial_scale", attrFloat(1)}, {"aligned", attrInt(aligned)}};
  };
  const Tensor rois = make<TestType>({2, 4}, std::vector<double>{1, 1, 3, 3, 1, 1, 3, 3});
  const Tensor images = make<int64_t>({2}, std::vector<int64_t>{0, 1});
  // aligned (half_pixel): the roi starts at 0.5, bins of 1, samples 0.25 and 0.75 into each:
  // bin centres 1 and 2.
  checkClose<TestType>(run(OpKind::kRoiAlign, {x, rois, images}, attrs("avg", 2, 2, 2, 1)),
                       {2, 1, 2, 2}, {5, 6, 9, 10, 105, 106, 109, 110});
  // Not aligned: the roi starts at 1, bin centres 1.5 and 2.5.
  checkClose<TestType>(run(OpKind::kRoiAlign, {x, rois, images}, attrs("avg", 2, 2, 2, 0)),
                       {2, 1, 2, 2}, {7.5, 8.5, 11.5, 12.5, 107.5, 108.5, 111.5, 112.5});

  // sampling_ratio 0: ceil(4 / 1) = 4 samples a dim at 0.5, 1.5, 2.5, 3.5; the last is clamped
  // to the edge row and column (3): mean 1.875 per dim, 4 * 1.875 + 1.875. A roi whose one
  // sample lies beyond -1 reads 0.
  const Tensor two = make<TestType>({2, 4}, std::vector<double>{0, 0, 4, 4, -10, -10, -8, -8});
  const Tensor zeros = make<int64_t>({2}, std::vector<int64_t>{0, 0});
  checkClose<TestType>(run(OpKind::kRoiAlign, {x, two, zeros}, attrs("avg", 1, 1, 0, 0)),
                       {2, 1, 1, 1}, {9.375, 0});

  // max (ONNX's): each sample's largest weighted corner, then the largest over the samples. Roi
  // (1, 1)-(2, 2), 4 samples at 1.25 and 1.75: the one at (1.75, 1.75) weighs x[2][2] = 10 by
  // 0.75^2.
  const Tensor unit = make<TestType>({1, 4}, std::vector<double>{1, 1, 2, 2});
  const Tensor zero = make<int64_t>({1}, std::vector<int64_t>{0});
  checkClose<TestType>(run(OpKind::kRoiAlign, {x, unit, zero}, attrs("max", 1, 1, 2, 0)),
                       {1, 1, 1, 1}, {5.625});

  // A batch index outside the batch is an error naming the roi.
  const Tensor bad = make<int64_t>({2}, std::vector<int64_t>{0, 2});
  CHECK_THAT(runError(OpKind::kRoiAlign, {x, rois, bad}, attrs("avg", 1, 1, 1, 1)).message(),
             Catch::Contains("roi 1 names image 2 of a batch of 2"));
  const Tensor inf = make<TestType>({1, 4}, std::vector<double>{0, 0, INFINITY, 2});
  CHECK_THAT(runError(OpKind::kRoiAlign, {x, inf, zero}, attrs("avg", 1, 1, 1, 1)).message(),
             Catch::Contains("roi 0 has a coordinate that is not finite"));
  // A huge roi with an adaptive grid: 10^7 samples a dim, refused before its taps are allocated.
  const Tensor huge = make<TestType>({1, 4}, std::vector<double>{0, 0, 1e7, 1e7});
  CHECK_THAT(runError(OpKind::kRoiAlign, {x, huge, zero}, attrs("avg", 1, 1, 0, 1)).message(),
             Catch::Contains("takes more than 2^22 samples (set sampling_ratio)"));
}
