// Reference pointwise kernels against hand-computed values: unary math, clip, dropout,
// broadcasting binary ops, where, integer semantics and errors.
#include <limits>

#include "runtime/reference/helpers.h"
#include "runtime/reference_test_util.h"

using namespace kiln;
using namespace kiln::reftest;

namespace {
const double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const std::vector<double> kX = {-2, -0.5, 0, 0.5, 1, 3};
}  // namespace

TEMPLATE_TEST_CASE("reference unary float ops", "[reference][pointwise]", float, double) {
  const Tensor x = make<TestType>({2, 3}, kX);
  checkClose<TestType>(run(OpKind::kNeg, {x}), {2, 3}, {2, 0.5, 0, -0.5, -1, -3});
  checkClose<TestType>(run(OpKind::kAbs, {x}), {2, 3}, {2, 0.5, 0, 0.5, 1, 3});
  checkClose<TestType>(run(OpKind::kRelu, {x}), {2, 3}, {0, 0, 0, 0.5, 1, 3});
  checkClose<TestType>(run(OpKind::kLeakyRelu, {x}), {2, 3}, {-0.02, -0.005, 0, 0.5, 1, 3});
  checkClose<TestType>(run(OpKind::kLeakyRelu, {x}, {{"alpha", attrFloat(0.1)}}), {2, 3},
                       {-0.2, -0.05, 0, 0.5, 1, 3});
  checkClose<TestType>(run(OpKind::kSigmoid, {x}), {2, 3},
                       {0.11920292202211755, 0.3775406687981454, 0.5, 0.6224593312018546,
                        0.7310585786300049, 0.9525741268224334});
  checkClose<TestType>(run(OpKind::kTanh, {x}), {2, 3},
                       {-0.9640275800758169, -0.46211715726000974, 0, 0.46211715726000974,
                        0.7615941559557649, 0.9950547536867305});
  checkClose<TestType>(run(OpKind::kGelu, {x}), {2, 3},
                       {-0.04550026389635842, -0.15426876936299344, 0, 0.34573123063700656,
                        0.8413447460685429, 2.99595030590511});
  checkClose<TestType>(run(OpKind::kGelu, {x}, {{"approximate", attrStr("tanh")}}), {2, 3},
                       {-0.04540230591222494, -0.15428599017485606, 0, 0.34571400982514394,
                        0.8411919906082768, 2.996362607918227});
  checkClose<TestType>(run(OpKind::kSilu, {x}), {2, 3},
                       {-0.2384058440442351, -0.1887703343990727, 0, 0.3112296656009273,
                        0.7310585786300049, 2.8577223804673});
  checkClose<TestType>(run(OpKind::kMish, {x}), {2, 3},
                       {-0.2525014826957089, -0.22074377465173, 0, 0.3752452113048951,
                        0.8650983882673103, 2.9865350049679575});
  checkClose<TestType>(run(OpKind::kExp, {x}), {2, 3},
                       {0.1353352832366127, 0.6065306597126334, 1, 1.6487212707001282,
                        2.718281828459045, 20.085536923187668});
  checkClose<TestType>(run(OpKind::kDropout, {x}, {{"ratio", attrFloat(0.3)}}), {2, 3}, kX);

  const Tensor pos = make<TestType>({4}, std::vector<double>{0.25, 1, 4, 10});
  checkClose<TestType>(run(OpKind::kLog, {pos}), {4},
                       {-1.3862943611198906, 0, 1.3862943611198906, 2.302585092994046});
  checkClose<TestType>(run(OpKind::kSqrt, {pos}), {4}, {0.5, 1, 2, 3.1622776601683795});
  checkClose<TestType>(run(OpKind::kRsqrt, {pos}), {4}, {2, 1, 0.5, 0.31622776601683794});

  // IEEE edge values pass through: log(0) = -inf, sqrt(-1) = NaN, relu keeps NaN.
  const Tensor edge = make<TestType>({3}, std::vector<double>{0, -1, kNaN});
  checkClose<TestType>(run(OpKind::kLog, {edge}), {3}, {-kInf, kNaN, kNaN});
  checkClose<TestType>(run(OpKind::kSqrt, {edge}), {3}, {0, kNaN, kNaN});
  checkClose<TestType>(run(OpKind::kRelu, {edge}), {3}, {0, 0, kNaN});
}

TEMPLATE_TEST_CASE("reference sigmoid, silu and mish saturate without overflow",
                   "[reference][pointwise]", float, double) {
  const Tensor x = make<TestType>({2}, std::vector<double>{-1000, 1000});
  checkClose<TestType>(run(OpKind::kSigmoid, {x}), {2}, {0, 1});
  checkClose<TestType>(run(OpKind::kSilu, {x}), {2}, {0, 1000});
  checkClose<TestType>(run(OpKind::kMish, {x}), {2}, {0, 1000});
}

TEMPLATE_TEST_CASE("reference clip", "[reference][pointwise]", float, double) {
  const Tensor x = make<TestType>({2, 3}, kX);
  checkClose<TestType>(run(OpKind::kClip, {x}, {{"min", attrFloat(-1)}, {"max", attrFloat(0.75)}}),
                       {2, 3}, {-1, -0.5, 0, 0.5, 0.75, 0.75});
  checkClose<TestType>(run(OpKind::kClip, {x}, {{"min", attrFloat(0.5)}}), {2, 3},
                       {0.5, 0.5, 0.5, 0.5, 1, 3});
  checkClose<TestType>(run(OpKind::kClip, {x}), {2, 3}, kX);  // Unbounded by default.
}

TEST_CASE("reference unary ops on integers", "[reference][pointwise]") {
  const int32_t kMin32 = std::numeric_limits<int32_t>::min();
  const Tensor x = make<int32_t>({5}, std::vector<int32_t>{-3, 0, 5, kMin32, 2});
  // neg and abs of INT_MIN wrap to INT_MIN (two's complement), as in PyTorch.
  checkExact<int32_t>(run(OpKind::kNeg, {x}), {5}, {3, 0, -5, kMin32, -2});
  checkExact<int32_t>(run(OpKind::kAbs, {x}), {5}, {3, 0, 5, kMin32, 2});
  checkExact<int32_t>(run(OpKind::kRelu, {x}), {5}, {0, 0, 5, 0, 2});
  // Float bounds become the integers inside [min, max]: ceil(-1.5) = -1, floor(2.5) = 2.
  checkExact<int32_t>(run(OpKind::kClip, {x}, {{"min", attrFloat(-1.5)}, {"max", attrFloat(2.5)}}),
                      {5}, {-1, 0, 2, -1, 2});
  checkExact<int32_t>(run(OpKind::kClip, {x}), {5}, {-3, 0, 5, kMin32, 2});

  const Tensor y = make<int64_t>({3}, std::vector<int64_t>{-7, 0, int64_t{1} << 40});
  checkExact<int64_t>(run(OpKind::kNeg, {y}), {3}, {7, 0, -(int64_t{1} << 40)});
  checkExact<int64_t>(run(OpKind::kAbs, {y}), {3}, {7, 0, int64_t{1} << 40});
  checkExact<int64_t>(run(OpKind::kClip, {y}, {{"max", attrFloat(1e30)}, {"min", attrFloat(-5)}}),
                      {3}, {-5, 0, int64_t{1} << 40});

  const Tensor u = make<uint8_t>({3}, std::vector<int>{0, 1, 200});
  checkExact<uint8_t>(run(OpKind::kNeg, {u}), {3}, std::vector<int>{0, 255, 56});
  checkExact<uint8_t>(run(OpKind::kRelu, {u}), {3}, std::vector<int>{0, 1, 200});
  checkExact<uint8_t>(run(OpKind::kClip, {u}, {{"min", attrFloat(-3)}, {"max", attrFloat(100)}}),
                      {3}, std::vector<int>{0, 1, 100});

  const Tensor b = make<int8_t>({3}, std::vector<int>{-128, -1, 127});
  checkExact<int8_t>(run(OpKind::kAbs, {b}), {3}, std::vector<int>{-128, 1, 127});
  checkExact<int8_t>(run(OpKind::kDropout, {b}), {3}, std::vector<int>{-128, -1, 127});
}

TEMPLATE_TEST_CASE("reference binary ops broadcast like NumPy", "[reference][pointwise]", float,
                   double, int64_t, int32_t) {
  const Tensor a = make<TestType>({2, 3}, std::vector<int>{1, 2, 3, 4, 5, 6});
  const Tensor row = make<TestType>({3}, std::vector<int>{10, 20, 30});
  const Tensor col = make<TestType>({2, 1}, std::vector<int>{10, 20});
  const Tensor scalar = make<TestType>({}, std::vector<int>{2});

  checkExact<TestType>(run(OpKind::kAdd, {a, row}), {2, 3},
                       std::vector<int>{11, 22, 33, 14, 25, 36});
  checkExact<TestType>(run(OpKind::kAdd, {row, a}), {2, 3},
                       std::vector<int>{11, 22, 33, 14, 25, 36});
  checkExact<TestType>(run(OpKind::kSub, {a, col}), {2, 3},
                       std::vector<int>{-9, -8, -7, -16, -15, -14});
  checkExact<TestType>(run(OpKind::kMul, {a, scalar}), {2, 3},
                       std::vector<int>{2, 4, 6, 8, 10, 12});
  checkExact<TestType>(run(OpKind::kMaximum, {a, make<TestType>({3}, std::vector<int>{3, 0, 9})}),
                       {2, 3}, std::vector<int>{3, 2, 9, 4, 5, 9});
  checkExact<TestType>(run(OpKind::kMinimum, {a, make<TestType>({3}, std::vector<int>{3, 0, 9})}),
                       {2, 3}, std::vector<int>{1, 0, 3, 3, 0, 6});
  checkExact<TestType>(run(OpKind::kDiv, {a, scalar}), {2, 3},
                       std::is_integral_v<TestType> ? std::vector<double>{0, 1, 1, 2, 2, 3}
                                                    : std::vector<double>{0.5, 1, 1.5, 2, 2.5, 3});

  // Both operands broadcast: [2,1,2] + [3,1] -> [2,3,2].
  const Tensor p = make<TestType>({2, 1, 2}, std::vector<int>{1, 2, 3, 4});
  const Tensor q = make<TestType>({3, 1}, std::vector<int>{10, 20, 30});
  checkExact<TestType>(run(OpKind::kAdd, {p, q}), {2, 3, 2},
                       std::vector<int>{11, 12, 21, 22, 31, 32, 13, 14, 23, 24, 33, 34});
  // Size-1 dims on both sides: [2,1] * [1,3] -> [2,3].
  checkExact<TestType>(run(OpKind::kMul, {col, make<TestType>({1, 3}, std::vector<int>{1, 2, 3})}),
                       {2, 3}, std::vector<int>{10, 20, 30, 20, 40, 60});
}

TEMPLATE_TEST_CASE("reference float binary ops", "[reference][pointwise]", float, double) {
  const Tensor a = make<TestType>({4}, std::vector<double>{2, 4, 9, 2});
  const Tensor b = make<TestType>({4}, std::vector<double>{0.5, -1, 0.5, 3});
  checkClose<TestType>(run(OpKind::kPow, {a, b}), {4}, {1.4142135623730951, 0.25, 3, 8});
  checkClose<TestType>(run(OpKind::kDiv, {a, b}), {4}, {4, -4, 18, 2.0 / 3.0});
  // Float division by zero is IEEE, not an error.
  const Tensor z = make<TestType>({3}, std::vector<double>{1, -1, 0});
  checkClose<TestType>(run(OpKind::kDiv, {z, make<TestType>({}, std::vector<double>{0})}), {3},
                       {kInf, -kInf, kNaN});
  // maximum and minimum propagate NaN from either side.
  const Tensor n = make<TestType>({3}, std::vector<double>{kNaN, 1, 5});
  const Tensor m = make<TestType>({3}, std::vector<double>{1, kNaN, 2});
  checkClose<TestType>(run(OpKind::kMaximum, {n, m}), {3}, {kNaN, kNaN, 5});
  checkClose<TestType>(run(OpKind::kMinimum, {n, m}), {3}, {kNaN, kNaN, 2});
}

TEST_CASE("reference integer arithmetic wraps and truncates", "[reference][pointwise]") {
  const int32_t kMax32 = std::numeric_limits<int32_t>::max();
  const int32_t kMin32 = std::numeric_limits<int32_t>::min();
  checkExact<int32_t>(run(OpKind::kAdd, {make<int32_t>({1}, std::vector<int32_t>{kMax32}),
                                         make<int32_t>({1}, std::vector<int32_t>{1})}),
                      {1}, {kMin32});
  checkExact<int8_t>(run(OpKind::kAdd, {make<int8_t>({1}, std::vector<int>{100}),
                                        make<int8_t>({1}, std::vector<int>{100})}),
                     {1}, std::vector<int>{-56});
  checkExact<uint8_t>(run(OpKind::kMul, {make<uint8_t>({2}, std::vector<int>{200, 16}),
                                         make<uint8_t>({}, std::vector<int>{2})}),
                      {2}, std::vector<int>{144, 32});
  // Division truncates toward zero; INT_MIN / -1 wraps instead of trapping.
  checkExact<int32_t>(
      run(OpKind::kDiv, {make<int32_t>({5}, std::vector<int32_t>{7, -7, 7, -7, kMin32}),
                         make<int32_t>({5}, std::vector<int32_t>{2, 2, -2, -2, -1})}),
      {5}, {3, -3, -3, 3, kMin32});
  checkExact<int64_t>(run(OpKind::kDiv, {make<int64_t>({2}, std::vector<int64_t>{9, -9}),
                                         make<int64_t>({}, std::vector<int64_t>{4})}),
                      {2}, {2, -2});
}

TEST_CASE("reference integer division by zero is an error", "[reference][pointwise]") {
  const Status st = runError(OpKind::kDiv, {make<int32_t>({3}, std::vector<int32_t>{1, 2, 3}),
                                            make<int32_t>({3}, std::vector<int32_t>{1, 0, 1})});
  CHECK(st.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(st.message(), Catch::Contains("division by zero") && Catch::Contains("index 1"));
  CHECK_FALSE(runtime::runReferenceOp(OpKind::kDiv, {make<int64_t>({1}, std::vector<int64_t>{1}),
                                                     make<int64_t>({}, std::vector<int64_t>{0})})
                  .hasValue());
}

TEMPLATE_TEST_CASE("reference where broadcasts condition and values", "[reference][pointwise]",
                   float, double, int64_t, int32_t) {
  const Tensor cond = makeBool({2, 1}, {1, 0});
  const Tensor x = make<TestType>({3}, std::vector<int>{1, 2, 3});
  const Tensor y = make<TestType>({}, std::vector<int>{-1});
  checkExact<TestType>(run(OpKind::kWhere, {cond, x, y}), {2, 3},
                       std::vector<int>{1, 2, 3, -1, -1, -1});
  const Tensor c2 = makeBool({3}, {0, 1, 0});
  checkExact<TestType>(run(OpKind::kWhere, {c2, x, y}), {3}, std::vector<int>{-1, 2, -1});
}

TEST_CASE("reference where moves any dtype", "[reference][pointwise]") {
  const Tensor cond = makeBool({2}, {0, 1});
  const Tensor x = makeBits(DType::kF16, {2}, {0x3C00, 0x4000});
  const Tensor y = makeBits(DType::kF16, {2}, {0xC000, 0xC400});
  const Tensor out = run(OpKind::kWhere, {cond, x, y});
  CHECK(out.dtype() == DType::kF16);
  CHECK(values<uint16_t>(out) == std::vector<uint16_t>{0xC000, 0x4000});
  const Tensor b = run(OpKind::kWhere, {cond, makeBool({2}, {1, 1}), makeBool({2}, {0, 0})});
  CHECK(values<uint8_t>(b) == std::vector<uint8_t>{0, 1});
}

TEST_CASE("reference kernels compute f16 and bf16 in f32, each result rounded once",
          "[reference][pointwise]") {
  // Kernels that compute only f32/f64 run on widened halves and round their results once, as
  // PyTorch's CPU kernels and NumPy do; movement ops and cast move halves themselves.
  const Tensor h = makeBits(DType::kF16, {2}, {0x3C00, 0xC000});  // 1, -2
  CHECK(values<uint16_t>(run(OpKind::kRelu, {h})) == std::vector<uint16_t>{0x3C00, 0x0000});
  // 1 + 2^-11 is exact in f32 and halfway between two f16 values: ties to even gives 1.
  const Tensor tiny = makeBits(DType::kF16, {2}, {0x1000, 0x3C00});  // 2^-11, 1
  CHECK(values<uint16_t>(run(OpKind::kAdd, {h, tiny})) == std::vector<uint16_t>{0x3C00, 0xBC00});
  const Tensor b = makeBits(DType::kBF16, {2}, {0x3F80, 0x4000});  // 1, 2
  CHECK(values<uint16_t>(run(OpKind::kSigmoid, {b})) ==
        std::vector<uint16_t>{
            kiln::runtime::ref::doubleToBf16Bits(static_cast<float>(1 / (1 + std::exp(-1.0)))),
            kiln::runtime::ref::doubleToBf16Bits(static_cast<float>(1 / (1 + std::exp(-2.0))))});
  const Tensor soft = run(OpKind::kSoftmax, {b});
  CHECK(soft.dtype() == DType::kBF16);
  CHECK(values<uint16_t>(soft)[1] ==
        kiln::runtime::ref::doubleToBf16Bits(1 / (1 + std::exp(-1.0))));
  const Tensor ones = makeBits(DType::kF16, {2, 2}, {0x3C00, 0x3C00, 0x3C00, 0x3C00});
  CHECK(values<uint16_t>(run(OpKind::kMatMul, {ones, ones})) ==
        std::vector<uint16_t>(4, 0x4000));  // 2
}

TEST_CASE("reference kernels on i16, u16, u32 and u64: wrap, shift and convert exactly",
          "[reference][pointwise]") {
  // u16 addition wraps; u64 values above INT64_MAX convert to floats from their exact value.
  CHECK(values<uint16_t>(run(OpKind::kAdd, {make<uint16_t>({2}, std::vector<uint16_t>{65535, 1}),
                                            make<uint16_t>({2}, std::vector<uint16_t>{2, 3})})) ==
        std::vector<uint16_t>{1, 4});
  const Tensor big = make<uint64_t>({1}, std::vector<uint64_t>{18446744073709551615ull});
  CHECK(values<double>(run(OpKind::kCast, {big}, {{"to", std::string("f64")}}))[0] ==
        18446744073709551616.0);
  // ONNX BitShift 28: shifts below 0 or of the width or more give 0 (-1 for a right shift of a
  // negative value); right shifts of negative values are arithmetic.
  const Tensor a = make<int16_t>({4}, std::vector<int16_t>{-8, 1, -8, 3});
  const Tensor s = make<int16_t>({4}, std::vector<int16_t>{1, 16, 20, -1});
  CHECK(values<int16_t>(run(OpKind::kBitShift, {a, s}, {{"direction", std::string("RIGHT")}})) ==
        std::vector<int16_t>{-4, 0, -1, 0});
  CHECK(values<int16_t>(run(OpKind::kBitShift, {a, s}, {{"direction", std::string("LEFT")}})) ==
        std::vector<int16_t>{-16, 0, 0, 0});
  const Tensor u = make<uint32_t>({2}, std::vector<uint32_t>{0xF0F0F0F0u, 7});
  CHECK(values<uint32_t>(run(OpKind::kBitwiseNot, {u})) ==
        std::vector<uint32_t>{0x0F0F0F0Fu, 0xFFFFFFF8u});
}
