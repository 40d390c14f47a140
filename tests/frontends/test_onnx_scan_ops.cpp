// ONNX's CumProd, composed by the importer as a scan by doubling, against a running product
// written here: every axis, exclusive and reverse, i64 products that wrap, f32.
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
