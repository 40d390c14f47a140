// Reference nll_loss, cross_entropy_loss and its gradient: reductions, ignore_index (the mean
// divides by the non-ignored count), spatial dims, i32 targets, and out-of-range class errors.
#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/reference_test_util.h"

using namespace kiln;
using namespace kiln::reftest;

namespace {
ir::AttrMap reduction(const char* r) {
  return {{"reduction", attrStr(r)}};
}
}  // namespace

TEMPLATE_TEST_CASE("reference nll_loss", "[reference][loss]", float, double) {
  // Log-probabilities [3,2]; targets 1, 0 and the default ignore_index -100.
  const Tensor x = make<TestType>({3, 2}, std::vector<double>{-0.5, -1.0, -2.0, -0.1, -0.3, -1.5});
  const Tensor t = make<int64_t>({3}, std::vector<int64_t>{1, 0, -100});
  checkClose<TestType>(run(OpKind::kNllLoss, {x, t}), {}, {1.5});  // (1 + 2) / 2 counted
  checkClose<TestType>(run(OpKind::kNllLoss, {x, t}, reduction("sum")), {}, {3});
  checkClose<TestType>(run(OpKind::kNllLoss, {x, t}, reduction("none")), {3}, {1, 2, 0});

  // A custom ignore_index; i32 targets.
  const Tensor t32 = make<int32_t>({3}, std::vector<int32_t>{1, 0, 1});
  checkClose<TestType>(run(OpKind::kNllLoss, {x, t32}, {{"ignore_index", attrInt(0)}}), {}, {1.25});
  checkClose<TestType>(run(OpKind::kNllLoss, {x, t32},
                           {{"ignore_index", attrInt(0)}, {"reduction", attrStr("none")}}),
                       {3}, {1, 0, 1.5});

  // Spatial dims: input [1,2,2] (N=1, C=2, d1=2), target [1,2].
  const Tensor xs = make<TestType>({1, 2, 2}, std::vector<double>{-0.1, -0.2, -0.3, -0.4});
  const Tensor ts = make<int64_t>({1, 2}, std::vector<int64_t>{1, 0});
  checkClose<TestType>(run(OpKind::kNllLoss, {xs, ts}), {}, {0.25});
  checkClose<TestType>(run(OpKind::kNllLoss, {xs, ts}, reduction("none")), {1, 2}, {0.3, 0.2});

  // Every target ignored: the mean is 0/0 = NaN (as in PyTorch), the sum 0.
  const Tensor all = make<int64_t>({3}, std::vector<int64_t>{-100, -100, -100});
  checkClose<TestType>(run(OpKind::kNllLoss, {x, all}), {},
                       {std::numeric_limits<double>::quiet_NaN()});
  checkClose<TestType>(run(OpKind::kNllLoss, {x, all}, reduction("sum")), {}, {0});
}

TEMPLATE_TEST_CASE("reference cross_entropy_loss", "[reference][loss]", float, double) {
  // Row 0 logits [1,2,3] with target 2: loss = log(1 + e^-1 + e^-2) = 0.40760596444438.
  // Row 1 is row 0 shifted by 999 (stable for large logits) with target 0: loss + 2.
  const Tensor x = make<TestType>({2, 3}, std::vector<double>{1, 2, 3, 1000, 1001, 1002});
  const Tensor t = make<int64_t>({2}, std::vector<int64_t>{2, 0});
  checkClose<TestType>(run(OpKind::kCrossEntropyLoss, {x, t}, reduction("none")), {2},
                       {0.4076059644443806, 2.4076059644443806});
  checkClose<TestType>(run(OpKind::kCrossEntropyLoss, {x, t}), {}, {1.4076059644443806});
  checkClose<TestType>(run(OpKind::kCrossEntropyLoss, {x, t}, reduction("sum")), {},
                       {2.815211928888761});
  // Ignoring row 1 leaves row 0 alone in the mean.
  checkClose<TestType>(
      run(OpKind::kCrossEntropyLoss, {x, make<int32_t>({2}, std::vector<int32_t>{2, 7})},
          {{"ignore_index", attrInt(7)}}),
      {}, {0.4076059644443806});

  // Spatial: [1,2,2] logits, classes along dim 1: position 0 has logits (0, 2), position 1 has
  // (1, 4); targets 0 and 1.
  const Tensor xs = make<TestType>({1, 2, 2}, std::vector<double>{0, 1, 2, 4});
  const Tensor ts = make<int64_t>({1, 2}, std::vector<int64_t>{0, 1});
  checkClose<TestType>(run(OpKind::kCrossEntropyLoss, {xs, ts}, reduction("none")), {1, 2},
                       {2.1269280110429727, 0.04858735157374196});
}

// The logits' gradient of cross_entropy_loss, in one op: softmax(row) - one_hot(target), times
// the row's factor (grad; / counted targets with mean; 0 at ignored targets).
TEMPLATE_TEST_CASE("reference cross_entropy_loss_backward", "[reference][loss]", float, double) {
  const std::vector<double> logits{1, 2, 3, 1000, 1001, 1002, -1, 0.5, 0};
  const Tensor x = make<TestType>({3, 3}, logits);
  // softmax(row) minus one at the target, times s, in double.
  auto expected = [&](std::vector<int64_t> targets, std::vector<double> s) {
    std::vector<double> d(9);
    for (size_t r = 0; r < 3; ++r) {
      double mx = std::max({logits[3 * r], logits[3 * r + 1], logits[3 * r + 2]}), sum = 0;
      for (size_t j = 0; j < 3; ++j) sum += std::exp(logits[3 * r + j] - mx);
      for (size_t j = 0; j < 3; ++j)
        d[3 * r + j] = (std::exp(logits[3 * r + j] - mx) / sum -
                        (static_cast<int64_t>(j) == targets[r] ? 1.0 : 0.0)) *
                       s[r];
    }
    return d;
  };
  const Tensor one = make<TestType>({}, std::vector<double>{1});
  const Tensor t = make<int64_t>({3}, std::vector<int64_t>{2, 0, -100});
  // Mean over the two counted targets; the ignored row is 0.
  checkClose<TestType>(run(OpKind::kCrossEntropyLossBackward, {one, x, t}), {3, 3},
                       expected({2, 0, -1}, {0.5, 0.5, 0}));
  const Tensor two = make<TestType>({}, std::vector<double>{2});
  checkClose<TestType>(run(OpKind::kCrossEntropyLossBackward, {two, x, t}, reduction("sum")),
                       {3, 3}, expected({2, 0, -1}, {2, 2, 0}));
  const Tensor per = make<TestType>({3}, std::vector<double>{0.5, -1, 3});
  checkClose<TestType>(
      run(OpKind::kCrossEntropyLossBackward,
          {per, x, make<int32_t>({3}, std::vector<int32_t>{0, 1, 2})}, reduction("none")),
      {3, 3}, expected({0, 1, 2}, {0.5, -1, 3}));

  // Spatial: [1,2,2] logits (classes along dim 1), targets 0 and 1: position 0 has logits (0, 2),
  // position 1 (1, 4); mean over 2.
  const Tensor xs = make<TestType>({1, 2, 2}, std::vector<double>{0, 1, 2, 4});
  const Tensor ts = make<int64_t>({1, 2}, std::vector<int64_t>{0, 1});
  const double p0 = 1 / (1 + std::exp(2.0)), p1 = 1 / (1 + std::exp(3.0));
  checkClose<TestType>(run(OpKind::kCrossEntropyLossBackward, {one, xs, ts}), {1, 2, 2},
                       {(p0 - 1) / 2, p1 / 2, (1 - p0) / 2, (1 - p1 - 1) / 2});

  // A NaN logit makes its row NaN, ignored or not (softmax times 0, as log_softmax's gradient of
  // nll_loss's gives); every target ignored with mean: 0, as PyTorch's.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor xn = make<TestType>({2, 2}, std::vector<double>{nan, 0, 1, 2});
  checkClose<TestType>(run(OpKind::kCrossEntropyLossBackward,
                           {one, xn, make<int64_t>({2}, std::vector<int64_t>{-100, 1})}),
                       {2, 2}, {nan, nan, 1 / (1 + std::exp(1.0)), -1 / (1 + std::exp(1.0))});
  checkClose<TestType>(run(OpKind::kCrossEntropyLossBackward,
                           {one, x, make<int64_t>({3}, std::vector<int64_t>{-100, -100, -100})}),
                       {3, 3}, std::vector<double>(9, 0));
  // Out-of-range targets are errors, as for the loss.
  const Status st = runError(OpKind::kCrossEntropyLossBackward,
                             {one, x, make<int64_t>({3}, std::vector<int64_t>{0, 3, 1})});
  CHECK_THAT(st.message(),
             Catch::Contains("cross_entropy_loss_backward") && Catch::Contains("class 3"));
}

TEST_CASE("reference losses reject out-of-range targets", "[reference][loss]") {
  const Tensor x = make<float>({2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
  Status st =
      runError(OpKind::kCrossEntropyLoss, {x, make<int64_t>({2}, std::vector<int64_t>{0, 3})});
  CHECK(st.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(st.message(), Catch::Contains("cross_entropy_loss") && Catch::Contains("class 3") &&
                               Catch::Contains("3 classes"));
  st = runError(OpKind::kNllLoss, {x, make<int32_t>({2}, std::vector<int32_t>{-1, 0})});
  CHECK_THAT(st.message(), Catch::Contains("nll_loss") && Catch::Contains("class -1"));
  // -100 is the ignore_index, not an error.
  CHECK(runtime::runReferenceOp(OpKind::kNllLoss,
                                {x, make<int64_t>({2}, std::vector<int64_t>{-100, 2})})
            .hasValue());
}
