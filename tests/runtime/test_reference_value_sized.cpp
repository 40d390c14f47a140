// Reference kernels of the ops whose output size their inputs' values give (nonzero), and
// runtime::valueSizedCount, which computes that size for a run in stages.
#include <limits>

#include "runtime/reference_test_util.h"

using namespace kiln;
using namespace kiln::reftest;

namespace {

int64_t countOf(const Tensor& x) {
  auto n = runtime::valueSizedCount(OpKind::kNonZero, {}, std::vector<Tensor>{x});
  REQUIRE(n.hasValue());
  return *n;
}

}  // namespace

TEST_CASE("reference nonzero: coordinates in row-major order, NaN non-zero, -0 zero",
          "[reference][value_sized]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // [2, 3]: non-zeros at (0, 1), (1, 0), (1, 2).
  const Tensor x = make<float>({2, 3}, std::vector<float>{0.f, nan, -0.f, 2.f, 0.f, -1.f});
  REQUIRE(countOf(x) == 3);
  checkExact<int64_t>(run(OpKind::kNonZero, {x}, {{"count", attrInt(3)}}), {2, 3},
                      std::vector<int64_t>{0, 1, 1, 1, 0, 2});
  // Rank 3 of bool, and f16 (-0 and a denormal), int64 and a scalar (as [1]).
  const Tensor b = makeBool({2, 1, 2}, {0, 1, 1, 0});
  REQUIRE(countOf(b) == 2);
  checkExact<int64_t>(run(OpKind::kNonZero, {b}, {{"count", attrInt(2)}}), {3, 2},
                      std::vector<int64_t>{0, 1, 0, 0, 1, 0});
  const Tensor h = makeBits(DType::kF16, {4}, {0x8000, 0x0001, 0x0000, 0x3c00});
  REQUIRE(countOf(h) == 2);
  checkExact<int64_t>(run(OpKind::kNonZero, {h}, {{"count", attrInt(2)}}), {1, 2},
                      std::vector<int64_t>{1, 3});
  const Tensor i =
      make<int64_t>({3}, std::vector<int64_t>{0, std::numeric_limits<int64_t>::min(), 0});
  checkExact<int64_t>(run(OpKind::kNonZero, {i}, {{"count", attrInt(1)}}), {1, 1},
                      std::vector<int64_t>{1});
  const Tensor s = make<float>({}, std::vector<float>{5.f});
  checkExact<int64_t>(run(OpKind::kNonZero, {s}, {{"count", attrInt(1)}}), {1, 1},
                      std::vector<int64_t>{0});
  // None: an empty [2, 0].
  const Tensor z = make<float>({2, 2}, std::vector<float>{0.f, -0.f, 0.f, 0.f});
  REQUIRE(countOf(z) == 0);
  CHECK(run(OpKind::kNonZero, {z}, {{"count", attrInt(0)}}).shape() == Shape{2, 0});
  // A count that is not the input's: the stage was made for other values (a kiln bug), never a
  // partial answer; shape inference bounds the count by the elements.
  const Status wrong = runError(OpKind::kNonZero, {x}, {{"count", attrInt(2)}});
  CHECK(wrong.code() == ErrorCode::kInternal);
  CHECK_THAT(wrong.message(), Catch::Contains("made for 2 non-zero elements"));
  CHECK(runError(OpKind::kNonZero, {x}, {{"count", attrInt(7)}}).code() ==
        ErrorCode::kInvalidArgument);
  // Other ops have no value-sized output.
  CHECK_FALSE(runtime::valueSizedCount(OpKind::kRelu, {}, std::vector<Tensor>{x}).hasValue());
}

TEST_CASE("reference non_max_suppression: by score, IoU above the threshold suppressed, per class",
          "[reference][value_sized]") {
  // One batch, 4 boxes [y1, x1, y2, x2]: 0 and 1 overlap with IoU 0.6 (0.75 / 1.25), box 2 is
  // apart, box 3 is 0 flipped (the same box, corners swapped). Two classes.
  const Tensor boxes = make<float>(
      {1, 4, 4}, std::vector<float>{0, 0, 1, 1, 0, 0.25f, 1, 1.25f, 5, 5, 6, 6, 1, 1, 0, 0});
  const Tensor scores =
      make<float>({1, 2, 4}, std::vector<float>{0.9f, 0.8f, 0.7f, 0.6f, 0.1f, 0.5f, 0.5f, 0.2f});
  const Tensor most = make<int64_t>({1}, std::vector<int64_t>{10});
  const Tensor iou = make<float>({}, std::vector<float>{0.5f});
  const Tensor above = make<float>({1}, std::vector<float>{0.3f});
  const ir::AttrMap given{{"has_max_output", attrInt(1)},
                          {"has_iou_threshold", attrInt(1)},
                          {"has_score_threshold", attrInt(1)}};
  const std::vector<Tensor> in{boxes, scores, most, iou, above};
  auto n = runtime::valueSizedCount(OpKind::kNonMaxSuppression, given, in);
  REQUIRE(n.hasValue());
  // Class 0: 0 kept, 1 and 3 suppressed by it, 2 kept. Class 1 (scores above 0.3: boxes 1 and
  // 2, tied at 0.5, the lower index first): both kept.
  REQUIRE(*n == 4);
  ir::AttrMap attrs = given;
  attrs["count"] = attrInt(4);
  checkExact<int64_t>(run(OpKind::kNonMaxSuppression, in, attrs), {4, 3},
                      std::vector<int64_t>{0, 0, 0, 0, 0, 2, 0, 1, 1, 0, 1, 2});
  // An IoU threshold of 0.7 keeps box 1 (IoU 0.6); without max_output_boxes_per_class nothing.
  const Tensor loose = make<float>({}, std::vector<float>{0.7f});
  auto m = runtime::valueSizedCount(OpKind::kNonMaxSuppression, given,
                                    std::vector<Tensor>{boxes, scores, most, loose, above});
  REQUIRE(m.hasValue());
  CHECK(*m == 5);
  auto none =
      runtime::valueSizedCount(OpKind::kNonMaxSuppression, {}, std::vector<Tensor>{boxes, scores});
  REQUIRE(none.hasValue());
  CHECK(*none == 0);
  // A threshold that is not one value, and a count the inputs do not give.
  auto bad = runtime::valueSizedCount(OpKind::kNonMaxSuppression, given,
                                      std::vector<Tensor>{boxes, scores, most, most, above});
  REQUIRE_FALSE(bad.hasValue());
  CHECK_THAT(bad.status().message(), Catch::Contains("iou_threshold must be one f32 value"));
  attrs["count"] = attrInt(3);
  CHECK(runError(OpKind::kNonMaxSuppression, in, attrs).code() == ErrorCode::kInternal);
}

TEST_CASE("reference unique_indices and unique_inverse: by value, sorted or in order, by axis",
          "[reference][value_sized]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto count = [](const Tensor& x, const ir::AttrMap& attrs) {
    auto n = runtime::valueSizedCount(OpKind::kUniqueIndices, attrs, std::vector<Tensor>{x});
    REQUIRE(n.hasValue());
    return *n;
  };
  // The count, the first occurrences and every item's group of x under `attrs`.
  auto check = [&](const Tensor& x, const ir::AttrMap& attrs, const std::vector<int64_t>& first,
                   const std::vector<int64_t>& inverse) {
    const int64_t n = static_cast<int64_t>(first.size());
    REQUIRE(count(x, attrs) == n);
    ir::AttrMap withCount = attrs;
    withCount["count"] = attrInt(n);
    checkExact<int64_t>(run(OpKind::kUniqueIndices, {x}, withCount), {n}, first);
    checkExact<int64_t>(run(OpKind::kUniqueInverse, {x}, attrs),
                        {static_cast<int64_t>(inverse.size())}, inverse);
  };
  // The flattened [2, 3]: -0 equals 0 (the first kept), NaN above every number and equal to NaN;
  // sorted, then in order of first occurrence.
  const Tensor x = make<float>({2, 3}, std::vector<float>{2.f, nan, -0.f, 1.f, 0.f, nan});
  check(x, {}, {2, 3, 0, 1}, {2, 3, 0, 1, 0, 3});
  check(x, {{"sorted", attrInt(0)}}, {0, 1, 2, 3}, {0, 1, 2, 3, 2, 1});
  // Slices along axis 1 of [2, 4, 2], compared element by element (ONNX's 3-D example):
  // (1 1 1 1), (0 1 0 1), (2 1 2 1), (0 1 0 1).
  const Tensor s = make<float>({2, 4, 2}, std::vector<float>{1, 1, 0, 1, 2, 1, 0, 1,  //
                                                             1, 1, 0, 1, 2, 1, 0, 1});
  check(s, {{"axis", attrInt(1)}, {"has_axis", attrInt(1)}}, {1, 0, 2}, {1, 0, 2, 0});
  // Rows of [4, 2] along axis 0, as NumPy's unique compares them: (0, 1) and (-0, 1) are one,
  // the two (nan, 1) rows are two (a slice with a NaN equals no other), above the numbers.
  const Tensor rows = make<float>({4, 2}, std::vector<float>{nan, 1, 0, 1, -0.f, 1, nan, 1});
  check(rows, {{"axis", attrInt(0)}, {"has_axis", attrInt(1)}}, {1, 0, 3}, {1, 0, 0, 2});
  // An 8-bit float is no value unique compares: a clear error naming the op.
  const Tensor f8x = makeAs<uint8_t>(DType::kF8E4M3FN, {2}, {1, 2});
  const Status f8 =
      runtime::valueSizedCount(OpKind::kUniqueIndices, {}, std::vector<Tensor>{f8x}).status();
  CHECK_FALSE(f8.isOk());
  CHECK_THAT(f8.message(), Catch::Contains("unique"));
  // bf16 by value (-1 below 1), bool, and int64 neighbours no double could tell apart.
  const Tensor b = makeBits(DType::kBF16, {3}, {0x3f80, 0xbf80, 0x3f80});
  checkExact<int64_t>(run(OpKind::kUniqueIndices, {b}, {{"count", attrInt(2)}}), {2},
                      std::vector<int64_t>{1, 0});
  const Tensor flags = makeBool({4}, {1, 0, 1, 1});
  checkExact<int64_t>(run(OpKind::kUniqueInverse, {flags}, {}), {4},
                      std::vector<int64_t>{1, 0, 1, 1});
  const int64_t big = std::numeric_limits<int64_t>::max();
  CHECK(count(make<int64_t>({3}, std::vector<int64_t>{big, big - 1, big}), {}) == 2);
  // Empty: no elements, none distinct; three empty slices are one.
  CHECK(count(make<float>({0}, std::vector<float>{}), {}) == 0);
  CHECK(count(make<float>({2, 0, 3}, std::vector<float>{}),
              {{"axis", attrInt(2)}, {"has_axis", attrInt(1)}}) == 1);
  // A count that is not the input's: an internal error, never a partial answer.
  const Status wrong = runError(OpKind::kUniqueIndices, {x}, {{"count", attrInt(3)}});
  CHECK(wrong.code() == ErrorCode::kInternal);
  CHECK_THAT(wrong.message(), Catch::Contains("made for 3 distinct values"));
}

TEST_CASE("valueSizedCount of a cast to i64: the one value a stage cut reads (If, Loop)",
          "[reference][value_sized]") {
  auto valueOf = [](const Tensor& x) {
    return runtime::valueSizedCount(OpKind::kCast, {{"to", std::string("i64")}},
                                    std::vector<Tensor>{x});
  };
  auto value = [&](const Tensor& x) {
    auto v = valueOf(x);
    INFO((v ? std::string() : v.status().message()));
    REQUIRE(v.hasValue());
    return *v;
  };
  CHECK(value(makeBool({}, {1})) == 1);
  CHECK(value(makeBool({1}, {0})) == 0);
  CHECK(value(make<int32_t>({1, 1}, std::vector<int32_t>{-3})) == -3);
  CHECK(value(make<int64_t>({}, std::vector<int64_t>{std::numeric_limits<int64_t>::max()})) ==
        std::numeric_limits<int64_t>::max());
  CHECK(value(make<uint8_t>({}, std::vector<uint8_t>{200})) == 200);
  // Not one integer or bool: an error, never a truncated value.
  auto big = valueOf(make<uint64_t>({}, std::vector<uint64_t>{uint64_t{1} << 63}));
  REQUIRE_FALSE(big.hasValue());
  CHECK_THAT(big.status().message(), Catch::Contains("beyond int64"));
  auto two = valueOf(make<int64_t>({2}, std::vector<int64_t>{1, 2}));
  REQUIRE_FALSE(two.hasValue());
  CHECK_THAT(two.status().message(), Catch::Contains("one element"));
  auto real = valueOf(make<float>({}, std::vector<float>{2.f}));
  REQUIRE_FALSE(real.hasValue());
  CHECK_THAT(real.status().message(), Catch::Contains("integer or bool"));
}
