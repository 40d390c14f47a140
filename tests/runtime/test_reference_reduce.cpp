// Reference reduce_sum / reduce_mean / reduce_max: axes (negative, several, empty = all),
// keepdims, integer dtypes and NaN.
#include <limits>

#include "runtime/reference_test_util.h"

using namespace kiln;
using namespace kiln::reftest;

namespace {
ir::AttrMap axes(std::vector<int64_t> a, int64_t keepdims = 1) {
  return {{"axes", attrInts(std::move(a))}, {"keepdims", attrInt(keepdims)}};
}
}  // namespace

TEMPLATE_TEST_CASE("reference reduce_sum and reduce_max", "[reference][reduce]", float, double,
                   int64_t, int32_t, int8_t, uint8_t) {
  // [[1,2,3],[4,5,6]]
  const Tensor x = make<TestType>({2, 3}, std::vector<int>{1, 2, 3, 4, 5, 6});
  checkExact<TestType>(run(OpKind::kReduceSum, {x}, axes({0})), {1, 3}, std::vector<int>{5, 7, 9});
  checkExact<TestType>(run(OpKind::kReduceSum, {x}, axes({1}, 0)), {2}, std::vector<int>{6, 15});
  checkExact<TestType>(run(OpKind::kReduceSum, {x}, axes({-1})), {2, 1}, std::vector<int>{6, 15});
  checkExact<TestType>(run(OpKind::kReduceSum, {x}), {1, 1}, std::vector<int>{21});
  checkExact<TestType>(run(OpKind::kReduceSum, {x}, axes({}, 0)), {}, std::vector<int>{21});
  checkExact<TestType>(run(OpKind::kReduceMax, {x}, axes({0}, 0)), {3}, std::vector<int>{4, 5, 6});
  checkExact<TestType>(run(OpKind::kReduceMax, {x}, axes({1})), {2, 1}, std::vector<int>{3, 6});
  checkExact<TestType>(run(OpKind::kReduceMax, {x}, axes({}, 0)), {}, std::vector<int>{6});

  // Non-adjacent axes of [2,2,2] (0..7): reduce dims 0 and 2.
  const Tensor y = make<TestType>({2, 2, 2}, std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  checkExact<TestType>(run(OpKind::kReduceSum, {y}, axes({0, 2})), {1, 2, 1},
                       std::vector<int>{10, 18});
  checkExact<TestType>(run(OpKind::kReduceMax, {y}, axes({2, 0}, 0)), {2}, std::vector<int>{5, 7});
}

TEMPLATE_TEST_CASE("reference reduce_max of negative values", "[reference][reduce]", float, double,
                   int64_t, int32_t) {
  const Tensor x = make<TestType>({2, 2}, std::vector<int>{-5, -3, -7, -9});
  checkExact<TestType>(run(OpKind::kReduceMax, {x}, axes({1}, 0)), {2}, std::vector<int>{-3, -7});
}

TEMPLATE_TEST_CASE("reference reduce_mean", "[reference][reduce]", float, double) {
  const Tensor x = make<TestType>({2, 3}, std::vector<int>{1, 2, 3, 4, 5, 6});
  checkClose<TestType>(run(OpKind::kReduceMean, {x}, axes({0})), {1, 3}, {2.5, 3.5, 4.5});
  checkClose<TestType>(run(OpKind::kReduceMean, {x}, axes({1}, 0)), {2}, {2, 5});
  checkClose<TestType>(run(OpKind::kReduceMean, {x}, axes({}, 0)), {}, {3.5});
  const Tensor y = make<TestType>({2, 2, 2}, std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  checkClose<TestType>(run(OpKind::kReduceMean, {y}, axes({0, 2})), {1, 2, 1}, {2.5, 4.5});
}

TEMPLATE_TEST_CASE("reference reduce_max and reduce_sum propagate NaN", "[reference][reduce]",
                   float, double) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Tensor x = make<TestType>({2, 3}, std::vector<double>{1, nan, 3, 4, 5, 6});
  checkClose<TestType>(run(OpKind::kReduceMax, {x}, axes({1}, 0)), {2}, {nan, 6});
  checkClose<TestType>(run(OpKind::kReduceMax, {x}, axes({0}, 0)), {3}, {4, nan, 6});
  checkClose<TestType>(run(OpKind::kReduceSum, {x}, axes({1}, 0)), {2}, {nan, 15});
}

TEST_CASE("reference reduce integer sums wrap", "[reference][reduce]") {
  checkExact<int8_t>(run(OpKind::kReduceSum, {make<int8_t>({3}, std::vector<int>{100, 100, 1})}),
                     {1}, std::vector<int>{-55});
}

TEST_CASE("reference reduce_mean on integers is unsupported", "[reference][reduce]") {
  const Status st = runError(OpKind::kReduceMean, {make<int32_t>({2}, std::vector<int32_t>{1, 2})});
  CHECK(st.code() == ErrorCode::kUnimplemented);
  CHECK(st.message() == "reduce_mean: dtype i32 is not supported by the reference kernel");
}
