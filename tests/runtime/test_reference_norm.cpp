// Reference batch_norm (inference), layer_norm and softmax / log_softmax on any axis,
// including the numerically stable path for large inputs.
#include <limits>

#include "runtime/reference_test_util.h"

using namespace kiln;
using namespace kiln::reftest;

TEMPLATE_TEST_CASE("reference batch_norm", "[reference][norm]", float, double) {
  // Channels c0 = [1, 3], c1 = [2, 4]; scale [2, 0.5], bias [0.5, -1], mean [2, 3], var [4, 0.25].
  const Tensor x = make<TestType>({1, 2, 1, 2}, std::vector<int>{1, 3, 2, 4});
  const Tensor scale = make<TestType>({2}, std::vector<double>{2, 0.5});
  const Tensor bias = make<TestType>({2}, std::vector<double>{0.5, -1});
  const Tensor mean = make<TestType>({2}, std::vector<double>{2, 3});
  const Tensor var = make<TestType>({2}, std::vector<double>{4, 0.25});
  // epsilon = 0: c0 -> (x - 2) / 2 * 2 + 0.5, c1 -> (x - 3) / 0.5 * 0.5 - 1.
  checkClose<TestType>(
      run(OpKind::kBatchNorm, {x, scale, bias, mean, var}, {{"epsilon", attrFloat(0)}}),
      {1, 2, 1, 2}, {-0.5, 1.5, -2, 0});
  // The default epsilon 1e-5 is added to the variance.
  checkClose<TestType>(
      run(OpKind::kBatchNorm, {x, scale, bias, mean, var}), {1, 2, 1, 2},
      {-0.49999875000234373, 1.4999987500023437, -1.99998000059998, -1.9999400020065394e-05});
  // Rank 2 ([N, C]) input: two samples.
  const Tensor x2 = make<TestType>({2, 2}, std::vector<int>{1, 2, 3, 4});
  checkClose<TestType>(
      run(OpKind::kBatchNorm, {x2, scale, bias, mean, var}, {{"epsilon", attrFloat(0)}}), {2, 2},
      {-0.5, -2, 1.5, 0});
}

TEMPLATE_TEST_CASE("reference layer_norm", "[reference][norm]", float, double) {
  // Rows [1,2,3] and [2,4,6] both normalize to [-a, 0, a] with a = 1 / sqrt(2/3).
  const double a = 1.224744871391589;
  const Tensor x = make<TestType>({2, 3}, std::vector<int>{1, 2, 3, 2, 4, 6});
  const ir::AttrMap noEps = {{"epsilon", attrFloat(0)}};
  checkClose<TestType>(run(OpKind::kLayerNorm, {x}, noEps), {2, 3}, {-a, 0, a, -a, 0, a});
  const Tensor scale = make<TestType>({3}, std::vector<int>{1, 2, 3});
  const Tensor bias = make<TestType>({3}, std::vector<int>{0, 1, -1});
  checkClose<TestType>(run(OpKind::kLayerNorm, {x, scale, bias}, noEps), {2, 3},
                       {-a, 1, 3 * a - 1, -a, 1, 3 * a - 1});
  checkClose<TestType>(run(OpKind::kLayerNorm, {x, scale}, noEps), {2, 3},
                       {-a, 0, 3 * a, -a, 0, 3 * a});
  // Default epsilon: 1 / sqrt(2/3 + 1e-5) for the first row.
  checkClose<TestType>(run(OpKind::kLayerNorm, {make<TestType>({3}, std::vector<int>{1, 2, 3})}),
                       {3}, {-1.2247356859083902, 0, 1.2247356859083902});
  // axis = 0 normalizes over the whole tensor: mean 2.5, variance 1.25.
  checkClose<TestType>(
      run(OpKind::kLayerNorm, {make<TestType>({2, 2}, std::vector<int>{1, 2, 3, 4})},
          {{"axis", attrInt(0)}, {"epsilon", attrFloat(0)}}),
      {2, 2}, {-1.3416407864998738, -0.4472135954999579, 0.4472135954999579, 1.3416407864998738});
  // axis = 1 of rank 3 normalizes the trailing [2,2] block of each sample, scale shaped [2,2].
  const Tensor x3 = make<TestType>({2, 2, 2}, std::vector<int>{1, 2, 3, 4, 4, 3, 2, 1});
  const Tensor s3 = make<TestType>({2, 2}, std::vector<int>{1, 1, 2, 2});
  checkClose<TestType>(
      run(OpKind::kLayerNorm, {x3, s3}, {{"axis", attrInt(1)}, {"epsilon", attrFloat(0)}}),
      {2, 2, 2},
      {-1.3416407864998738, -0.4472135954999579, 2 * 0.4472135954999579, 2 * 1.3416407864998738,
       1.3416407864998738, 0.4472135954999579, -2 * 0.4472135954999579, -2 * 1.3416407864998738});
}

TEMPLATE_TEST_CASE("reference softmax and log_softmax", "[reference][norm]", float, double) {
  const Tensor x = make<TestType>({3}, std::vector<int>{1, 2, 3});
  checkClose<TestType>(run(OpKind::kSoftmax, {x}), {3},
                       {0.09003057317038046, 0.24472847105479764, 0.6652409557748218});
  checkClose<TestType>(run(OpKind::kLogSoftmax, {x}), {3},
                       {-2.4076059644443806, -1.4076059644443804, -0.4076059644443804});

  // Large inputs stay finite because the maximum is subtracted first.
  const Tensor big = make<TestType>({1, 2}, std::vector<int>{1000, 1001});
  checkClose<TestType>(run(OpKind::kSoftmax, {big}), {1, 2},
                       {0.2689414213699951, 0.7310585786300049});
  checkClose<TestType>(run(OpKind::kLogSoftmax, {big}), {1, 2},
                       {-1.3132616875182228, -0.31326168751822286});
  const Tensor neg = make<TestType>({2}, std::vector<int>{-1000, -1001});
  checkClose<TestType>(run(OpKind::kSoftmax, {neg}), {2}, {0.7310585786300049, 0.2689414213699951});

  // -inf is a zero-probability entry.
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor m = make<TestType>({2}, std::vector<double>{-inf, 0});
  checkClose<TestType>(run(OpKind::kSoftmax, {m}), {2}, {0, 1});
  checkClose<TestType>(run(OpKind::kLogSoftmax, {m}), {2}, {-inf, 0});
}

TEMPLATE_TEST_CASE("reference softmax on a non-last axis", "[reference][norm]", float, double) {
  // [[1,2],[3,5]] along axis 0: columns (1,3) and (2,5).
  const Tensor x = make<TestType>({2, 2}, std::vector<int>{1, 2, 3, 5});
  checkClose<TestType>(
      run(OpKind::kSoftmax, {x}, {{"axis", attrInt(0)}}), {2, 2},
      {0.11920292202211755, 0.04742587317756679, 0.8807970779778823, 0.9525741268224334});
  checkClose<TestType>(
      run(OpKind::kLogSoftmax, {x}, {{"axis", attrInt(-2)}}), {2, 2},
      {-2.1269280110429727, -3.048587351573742, -0.1269280110429726, -0.04858735157374196});
  // Middle axis of [2,2,2]: pairs (0,2), (1,4), (-1,3), (-1,0).
  const Tensor x3 = make<TestType>({2, 2, 2}, std::vector<int>{0, 1, 2, 4, -1, -1, 3, 0});
  checkClose<TestType>(
      run(OpKind::kSoftmax, {x3}, {{"axis", attrInt(1)}}), {2, 2, 2},
      {0.11920292202211755, 0.04742587317756679, 0.8807970779778823, 0.9525741268224334,
       0.017986209962091555, 0.2689414213699951, 0.9820137900379085, 0.7310585786300049});
  checkClose<TestType>(
      run(OpKind::kLogSoftmax, {x3}, {{"axis", attrInt(1)}}), {2, 2, 2},
      {-2.1269280110429727, -3.048587351573742, -0.1269280110429726, -0.04858735157374196,
       -4.0181499279178094, -1.3132616875182228, -0.01814992791780978, -0.31326168751822286});
}
