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
