// Reference matmul (batched, broadcasting, 1-D rules), gemm (transA/transB, alpha, beta,
// broadcast C) and linear against hand-computed products.
#include <cmath>

#include "runtime/reference_test_util.h"

using namespace kiln;
using namespace kiln::reftest;

namespace {
// A = [[1,2,3],[4,5,6]], B = [[7,8],[9,10],[11,12]], A*B = [[58,64],[139,154]].
const std::vector<int> kA = {1, 2, 3, 4, 5, 6};
const std::vector<int> kAT = {1, 4, 2, 5, 3, 6};
const std::vector<int> kB = {7, 8, 9, 10, 11, 12};
const std::vector<int> kBT = {7, 9, 11, 8, 10, 12};
}  // namespace

TEMPLATE_TEST_CASE("reference matmul 2-D and batched", "[reference][linalg]", float, double,
                   int64_t, int32_t, int8_t) {
  const Tensor a = make<TestType>({2, 3}, kA);
  const Tensor b = make<TestType>({3, 2}, kB);
  checkExact<TestType>(run(OpKind::kMatMul, {a, b}), {2, 2}, std::vector<int>{58, 64, 139, 154});

  // [2,2,2] x [2,2]: B broadcasts over the batch.
  const Tensor a3 = make<TestType>({2, 2, 2}, std::vector<int>{1, 2, 3, 4, 0, 1, 1, 0});
  const Tensor b2 = make<TestType>({2, 2}, std::vector<int>{5, 6, 7, 8});
  checkExact<TestType>(run(OpKind::kMatMul, {a3, b2}), {2, 2, 2},
                       std::vector<int>{19, 22, 43, 50, 7, 8, 5, 6});

  // Batch dims broadcast on both sides: [2,1,1,2] x [1,3,2,1] -> [2,3,1,1].
  const Tensor p = make<TestType>({2, 1, 1, 2}, std::vector<int>{1, 2, 3, 4});
  const Tensor q = make<TestType>({1, 3, 2, 1}, std::vector<int>{1, 1, 2, 0, 0, -1});
  checkExact<TestType>(run(OpKind::kMatMul, {p, q}), {2, 3, 1, 1},
                       std::vector<int>{3, 2, -2, 7, 6, -4});
}

TEMPLATE_TEST_CASE("reference matmul 1-D promotion", "[reference][linalg]", float, double, int64_t,
                   int32_t) {
  const Tensor v = make<TestType>({3}, std::vector<int>{1, 2, 3});
  const Tensor b = make<TestType>({3, 2}, kB);
  checkExact<TestType>(run(OpKind::kMatMul, {v, b}), {2}, std::vector<int>{58, 64});
  const Tensor a = make<TestType>({2, 3}, kA);
  checkExact<TestType>(run(OpKind::kMatMul, {a, make<TestType>({3}, std::vector<int>{1, 0, -1})}),
                       {2}, std::vector<int>{-2, -2});
  checkExact<TestType>(run(OpKind::kMatMul, {v, make<TestType>({3}, std::vector<int>{4, 5, 6})}),
                       {}, std::vector<int>{32});
  // A vector against a batch of matrices: [3] x [2,3,2] -> [2,2].
  const Tensor bb =
      make<TestType>({2, 3, 2}, std::vector<int>{7, 8, 9, 10, 11, 12, 14, 16, 18, 20, 22, 24});
  checkExact<TestType>(run(OpKind::kMatMul, {v, bb}), {2, 2}, std::vector<int>{58, 64, 116, 128});
}

TEST_CASE("reference matmul integer accumulation wraps", "[reference][linalg]") {
  // 100*100 + 100*100 = 20000, which wraps to 20000 mod 256 = 32 in i8.
  const Tensor a = make<int8_t>({1, 2}, std::vector<int>{100, 100});
  const Tensor b = make<int8_t>({2, 1}, std::vector<int>{100, 100});
  checkExact<int8_t>(run(OpKind::kMatMul, {a, b}), {1, 1}, std::vector<int>{32});
}

TEMPLATE_TEST_CASE("reference gemm", "[reference][linalg]", float, double) {
  const Tensor a = make<TestType>({2, 3}, kA);
  const Tensor b = make<TestType>({3, 2}, kB);
  const Tensor at = make<TestType>({3, 2}, kAT);
  const Tensor bt = make<TestType>({2, 3}, kBT);
  const std::vector<double> ab = {58, 64, 139, 154};
  checkClose<TestType>(run(OpKind::kGemm, {a, b}), {2, 2}, ab);
  checkClose<TestType>(run(OpKind::kGemm, {at, b}, {{"transA", attrInt(1)}}), {2, 2}, ab);
  checkClose<TestType>(run(OpKind::kGemm, {a, bt}, {{"transB", attrInt(1)}}), {2, 2}, ab);
  checkClose<TestType>(
      run(OpKind::kGemm, {at, bt}, {{"transA", attrInt(1)}, {"transB", attrInt(1)}}), {2, 2}, ab);

  // alpha * AB + beta * C with C broadcast from a row, a column and a scalar.
  const ir::AttrMap ab2 = {{"alpha", attrFloat(2)}, {"beta", attrFloat(0.5)}};
  checkClose<TestType>(run(OpKind::kGemm, {a, b, make<TestType>({2}, std::vector<int>{1, 2})}, ab2),
                       {2, 2}, {116.5, 129, 278.5, 309});
  checkClose<TestType>(
      run(OpKind::kGemm, {a, b, make<TestType>({2, 1}, std::vector<int>{1, 2})}, ab2), {2, 2},
      {116.5, 128.5, 279, 309});
  checkClose<TestType>(run(OpKind::kGemm, {a, b, make<TestType>({}, std::vector<int>{4})}, ab2),
                       {2, 2}, {118, 130, 280, 310});
  checkClose<TestType>(
      run(OpKind::kGemm, {a, b, make<TestType>({2, 2}, std::vector<int>{1, 2, 3, 4})},
          {{"beta", attrFloat(-1)}}),
      {2, 2}, {57, 62, 136, 150});
  checkClose<TestType>(run(OpKind::kGemm, {a, b}, {{"alpha", attrFloat(-0.5)}}), {2, 2},
                       {-29, -32, -69.5, -77});
}

TEMPLATE_TEST_CASE("reference linear", "[reference][linalg]", float, double) {
  const Tensor x = make<TestType>({2, 3}, kA);
  const Tensor w = make<TestType>({2, 3}, std::vector<int>{1, 0, -1, 2, 1, 0});
  const Tensor bias = make<TestType>({2}, std::vector<double>{0.5, -1});
  checkClose<TestType>(run(OpKind::kLinear, {x, w, bias}), {2, 2}, {-1.5, 3, -1.5, 12});
  checkClose<TestType>(run(OpKind::kLinear, {x, w}), {2, 2}, {-2, 4, -2, 13});
  const Tensor x3 = make<TestType>({1, 2, 3}, kA);
  checkClose<TestType>(run(OpKind::kLinear, {x3, w, bias}), {1, 2, 2}, {-1.5, 3, -1.5, 12});
  const Tensor x1 = make<TestType>({3}, std::vector<int>{1, 2, 3});
  checkClose<TestType>(run(OpKind::kLinear, {x1, w, bias}), {2}, {-1.5, 3});
}

TEMPLATE_TEST_CASE("reference det: LU with partial pivoting, batched", "[reference][linalg]", float,
                   double) {
  // [[1, 2], [3, 4]]: -2; a permutation needing a row swap: -1; a singular matrix: 0; and a
  // 3x3 whose first pivot is 0: det [[0, 2, 1], [1, 1, 1], [2, 0, 3]] = 0(3 - 0) - 2(3 - 2) +
  // 1(0 - 2) = -4.
  const Tensor a = make<TestType>({2, 2}, std::vector<double>{1, 2, 3, 4});
  checkClose<TestType>(run(OpKind::kDet, {a}), {}, {-2});
  const Tensor b = make<TestType>({3, 3, 3}, std::vector<double>{0, 1, 0, 1, 0, 0, 0, 0, 1,  //
                                                                 1, 2, 3, 2, 4, 6, 0, 1, 1,  //
                                                                 0, 2, 1, 1, 1, 1, 2, 0, 3});
  checkClose<TestType>(run(OpKind::kDet, {b}), {3}, {-1, 0, -4});
  // A zero pivot column does not hide a NaN elsewhere (LAPACK's getrf, NumPy: NaN).
  const Tensor c = make<TestType>({2, 2}, std::vector<double>{0, 1, 0, std::nan("")});
  CHECK(std::isnan(static_cast<double>(values<TestType>(run(OpKind::kDet, {c}))[0])));
}
