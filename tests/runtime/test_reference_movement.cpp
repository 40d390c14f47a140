// Reference movement kernels: reshape, flatten, transpose, concat, slice (negative steps,
// clamping), squeeze, unsqueeze, expand and gather (negative indices, out-of-range errors),
// on several dtypes including bool and f16.
#include <limits>
#include <numeric>

#include "runtime/reference_test_util.h"

using namespace kiln;
using namespace kiln::reftest;

namespace {
std::vector<int> iota0(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}
}  // namespace

TEMPLATE_TEST_CASE("reference shape-only movement ops", "[reference][movement]", float, double,
                   int64_t, int32_t, int8_t, uint8_t) {
  const Tensor x = make<TestType>({2, 3, 2}, iota0(12));
  checkExact<TestType>(run(OpKind::kReshape, {x}, {{"shape", attrInts({3, -1})}}), {3, 4},
                       iota0(12));
  checkExact<TestType>(run(OpKind::kReshape, {x}, {{"shape", attrInts({0, 6})}}), {2, 6},
                       iota0(12));
  checkExact<TestType>(run(OpKind::kFlatten, {x}), {2, 6}, iota0(12));
  checkExact<TestType>(run(OpKind::kFlatten, {x}, {{"axis", attrInt(0)}}), {1, 12}, iota0(12));
  checkExact<TestType>(run(OpKind::kFlatten, {x}, {{"axis", attrInt(-1)}}), {6, 2}, iota0(12));
  const Tensor y = make<TestType>({1, 3, 1}, std::vector<int>{4, 5, 6});
  checkExact<TestType>(run(OpKind::kSqueeze, {y}), {3}, std::vector<int>{4, 5, 6});
  checkExact<TestType>(run(OpKind::kSqueeze, {y}, {{"axes", attrInts({0})}}), {3, 1},
                       std::vector<int>{4, 5, 6});
  checkExact<TestType>(run(OpKind::kUnsqueeze, {y}, {{"axes", attrInts({0, -1})}}), {1, 1, 3, 1, 1},
                       std::vector<int>{4, 5, 6});
}

TEST_CASE("reference bitcast: the bytes as another dtype of their size", "[reference][movement]") {
  const Tensor f = make<float>({2}, std::vector<float>{1.f, -2.f});
  const Tensor i = run(OpKind::kBitcast, {f}, {{"to", std::string("i32")}});
  REQUIRE(i.dtype() == DType::kI32);
  CHECK(values<int32_t>(i) == std::vector<int32_t>{0x3f800000, static_cast<int32_t>(0xc0000000u)});
  const Tensor back = run(OpKind::kBitcast, {i}, {{"to", std::string("f32")}});
  CHECK(values<float>(back) == std::vector<float>{1.f, -2.f});
  const Tensor b = makeBool({3}, {1, 0, 1});
  CHECK(values<uint8_t>(run(OpKind::kBitcast, {b}, {{"to", std::string("u8")}})) ==
        std::vector<uint8_t>{1, 0, 1});
}

TEMPLATE_TEST_CASE("reference transpose", "[reference][movement]", float, int64_t, uint8_t) {
  const Tensor x = make<TestType>({2, 3}, std::vector<int>{1, 2, 3, 4, 5, 6});
  checkExact<TestType>(run(OpKind::kTranspose, {x}, {{"perm", attrInts({1, 0})}}), {3, 2},
                       std::vector<int>{1, 4, 2, 5, 3, 6});
  checkExact<TestType>(run(OpKind::kTranspose, {x}), {3, 2}, std::vector<int>{1, 4, 2, 5, 3, 6});
  // perm [1,2,0] of [2,3,4] (0..23): out[i][j][k] = x[k][i][j].
  const Tensor z = make<TestType>({2, 3, 4}, iota0(24));
  checkExact<TestType>(run(OpKind::kTranspose, {z}, {{"perm", attrInts({1, 2, 0})}}), {3, 4, 2},
                       std::vector<int>{0, 12, 1, 13, 2, 14, 3, 15, 4,  16, 5,  17,
                                        6, 18, 7, 19, 8, 20, 9, 21, 10, 22, 11, 23});
}

TEMPLATE_TEST_CASE("reference concat", "[reference][movement]", float, double, int32_t, int8_t) {
  const Tensor a = make<TestType>({2, 1}, std::vector<int>{1, 2});
  const Tensor b = make<TestType>({2, 2}, std::vector<int>{3, 4, 5, 6});
  checkExact<TestType>(run(OpKind::kConcat, {a, b}, {{"axis", attrInt(1)}}), {2, 3},
                       std::vector<int>{1, 3, 4, 2, 5, 6});
  checkExact<TestType>(run(OpKind::kConcat, {b, a, a}, {{"axis", attrInt(-1)}}), {2, 4},
                       std::vector<int>{3, 4, 1, 1, 5, 6, 2, 2});
  const Tensor c = make<TestType>({1, 2}, std::vector<int>{7, 8});
  checkExact<TestType>(run(OpKind::kConcat, {b, c}, {{"axis", attrInt(0)}}), {3, 2},
                       std::vector<int>{3, 4, 5, 6, 7, 8});
  checkExact<TestType>(run(OpKind::kConcat, {c}, {{"axis", attrInt(0)}}), {1, 2},
                       std::vector<int>{7, 8});
  // An empty input contributes nothing.
  const Tensor e = make<TestType>({2, 0}, std::vector<int>{});
  checkExact<TestType>(run(OpKind::kConcat, {a, e, a}, {{"axis", attrInt(1)}}), {2, 2},
                       std::vector<int>{1, 1, 2, 2});
}

TEMPLATE_TEST_CASE("reference slice", "[reference][movement]", float, int64_t) {
  const Tensor x = make<TestType>({10}, iota0(10));
  auto slice = [&](const Tensor& t, std::vector<int64_t> starts, std::vector<int64_t> ends,
                   std::vector<int64_t> steps, std::vector<int64_t> axes = {}) {
    return run(OpKind::kSlice, {t},
               {{"starts", attrInts(std::move(starts))},
                {"ends", attrInts(std::move(ends))},
                {"steps", attrInts(std::move(steps))},
                {"axes", attrInts(std::move(axes))}});
  };
  checkExact<TestType>(slice(x, {2}, {8}, {2}), {3}, std::vector<int>{2, 4, 6});
  checkExact<TestType>(slice(x, {-3}, {100}, {1}), {3}, std::vector<int>{7, 8, 9});
  checkExact<TestType>(slice(x, {-100}, {3}, {1}), {3}, std::vector<int>{0, 1, 2});  // Clamped.
  checkExact<TestType>(slice(x, {8}, {2}, {-3}), {2}, std::vector<int>{8, 5});
  checkExact<TestType>(slice(x, {-1}, {-100}, {-1}), {10},
                       std::vector<int>{9, 8, 7, 6, 5, 4, 3, 2, 1, 0});
  checkExact<TestType>(slice(x, {100}, {-100}, {-4}), {3}, std::vector<int>{9, 5, 1});
  checkExact<TestType>(slice(x, {5}, {2}, {1}), {0}, std::vector<int>{});
  // Huge steps take one element without overflowing.
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t kMin = std::numeric_limits<int64_t>::min();
  checkExact<TestType>(slice(x, {3}, {kMax}, {kMax}), {1}, std::vector<int>{3});
  checkExact<TestType>(slice(x, {-1}, {kMin}, {kMin}), {1}, std::vector<int>{9});
  // 2-D: rows 1..2, columns from the last down to 1 (end 0 exclusive).
  const Tensor m = make<TestType>({3, 4}, iota0(12));
  checkExact<TestType>(slice(m, {1, -1}, {3, 0}, {1, -1}, {0, 1}), {2, 3},
                       std::vector<int>{7, 6, 5, 11, 10, 9});
  checkExact<TestType>(slice(m, {1}, {3}, {}, {-1}), {3, 2}, std::vector<int>{1, 2, 5, 6, 9, 10});
}

TEMPLATE_TEST_CASE("reference expand", "[reference][movement]", float, double, int32_t) {
  const Tensor x = make<TestType>({3, 1}, std::vector<int>{1, 2, 3});
  checkExact<TestType>(
      run(OpKind::kExpand, {x}, {{"shape", attrInts({2, 1, 4})}}), {2, 3, 4},
      std::vector<int>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3});
  // Bidirectional: a smaller target shape keeps the input's dims.
  const Tensor y = make<TestType>({2, 3}, std::vector<int>{1, 2, 3, 4, 5, 6});
  checkExact<TestType>(run(OpKind::kExpand, {y}, {{"shape", attrInts({1})}}), {2, 3},
                       std::vector<int>{1, 2, 3, 4, 5, 6});
  checkExact<TestType>(run(OpKind::kExpand, {make<TestType>({}, std::vector<int>{7})},
                           {{"shape", attrInts({2, 2})}}),
                       {2, 2}, std::vector<int>{7, 7, 7, 7});
}

TEMPLATE_TEST_CASE("reference gather", "[reference][movement]", float, double, int64_t, uint8_t) {
  // data [[1,2],[3,4],[5,6]]
  const Tensor data = make<TestType>({3, 2}, std::vector<int>{1, 2, 3, 4, 5, 6});
  checkExact<TestType>(
      run(OpKind::kGather, {data, make<int64_t>({2}, std::vector<int64_t>{2, -3})}), {2, 2},
      std::vector<int>{5, 6, 1, 2});
  // axis 1 with 2-D i32 indices [[1,0],[0,-1]]: out[r] = [[x[r][1], x[r][0]], [x[r][0], x[r][1]]].
  checkExact<TestType>(
      run(OpKind::kGather, {data, make<int32_t>({2, 2}, std::vector<int32_t>{1, 0, 0, -1})},
          {{"axis", attrInt(1)}}),
      {3, 2, 2}, std::vector<int>{2, 1, 1, 2, 4, 3, 3, 4, 6, 5, 5, 6});
  // A scalar index removes the dim.
  checkExact<TestType>(run(OpKind::kGather, {data, make<int64_t>({}, std::vector<int64_t>{1})}),
                       {2}, std::vector<int>{3, 4});
  checkExact<TestType>(run(OpKind::kGather, {data, make<int64_t>({}, std::vector<int64_t>{-1})},
                           {{"axis", attrInt(-1)}}),
                       {3}, std::vector<int>{2, 4, 6});
}

TEST_CASE("reference gather out of range is a clear error", "[reference][movement]") {
  const Tensor data = make<float>({3, 2}, std::vector<float>{1, 2, 3, 4, 5, 6});
  Status st = runError(OpKind::kGather, {data, make<int64_t>({2}, std::vector<int64_t>{0, 3})});
  CHECK(st.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(st.message(), Catch::Contains("gather") && Catch::Contains("index 3") &&
                               Catch::Contains("dim 0") && Catch::Contains("size 3"));
  st = runError(OpKind::kGather, {data, make<int32_t>({1}, std::vector<int32_t>{-3})},
                {{"axis", attrInt(1)}});
  CHECK_THAT(st.message(),
             Catch::Contains("index -3") && Catch::Contains("dim 1") && Catch::Contains("size 2"));
}

TEST_CASE("reference movement ops move bool and f16 elements", "[reference][movement]") {
  const Tensor b = makeBool({2, 2}, {1, 0, 0, 1});
  const Tensor bt = run(OpKind::kTranspose, {makeBool({2, 3}, {1, 1, 0, 0, 0, 1})});
  CHECK(bt.dtype() == DType::kBool);
  CHECK(values<uint8_t>(bt) == std::vector<uint8_t>{1, 0, 1, 0, 0, 1});
  CHECK(values<uint8_t>(run(OpKind::kConcat, {b, b}, {{"axis", attrInt(0)}})) ==
        std::vector<uint8_t>{1, 0, 0, 1, 1, 0, 0, 1});
  const Tensor h = makeBits(DType::kF16, {2, 2}, {0x3C00, 0x4000, 0x4200, 0x7E00});
  const Tensor g = run(OpKind::kGather, {h, make<int64_t>({2}, std::vector<int64_t>{1, 0})});
  CHECK(g.dtype() == DType::kF16);
  CHECK(values<uint16_t>(g) == std::vector<uint16_t>{0x4200, 0x7E00, 0x3C00, 0x4000});
  CHECK(values<uint16_t>(run(OpKind::kSlice, {h},
                             {{"starts", attrInts({1})},
                              {"ends", attrInts({-5})},
                              {"steps", attrInts({-1})},
                              {"axes", attrInts({1})}})) ==
        std::vector<uint16_t>{0x4000, 0x3C00, 0x7E00, 0x4200});
  CHECK(values<uint16_t>(run(OpKind::kExpand, {makeBits(DType::kBF16, {1}, {0x3F80})},
                             {{"shape", attrInts({3})}})) ==
        std::vector<uint16_t>{0x3F80, 0x3F80, 0x3F80});
  CHECK(values<uint16_t>(run(OpKind::kReshape, {h}, {{"shape", attrInts({4})}})) ==
        std::vector<uint16_t>{0x3C00, 0x4000, 0x4200, 0x7E00});
  CHECK(values<uint16_t>(run(OpKind::kDropout, {h})) ==
        std::vector<uint16_t>{0x3C00, 0x4000, 0x4200, 0x7E00});
}

TEST_CASE("slice with a negative step clamps its start as ONNX does") {
  Tensor x = *Tensor::empty(DType::kF32, {5});
  for (int i = 0; i < 5; ++i) x.data<float>()[i] = static_cast<float>(i + 1);
  auto y = runtime::runReferenceOp(OpKind::kSlice, {x},
                                   {{"starts", std::vector<int64_t>{-10}},
                                    {"ends", std::vector<int64_t>{-10}},
                                    {"steps", std::vector<int64_t>{-1}}});
  REQUIRE(y.hasValue());
  REQUIRE((*y)[0].numElements() == 1);
  CHECK((*y)[0].data<float>()[0] == 1.0f);
}

TEST_CASE("relayout converts between NCHW and NHWC memory orders and back") {
  // Logical [1,2,2,3]: value = c*100 + h*10 + w, stored plain (NCHW).
  Tensor x = *Tensor::empty(DType::kF32, {1, 2, 2, 3});
  for (int c = 0; c < 2; ++c)
    for (int h = 0; h < 2; ++h)
      for (int w = 0; w < 3; ++w)
        x.data<float>()[(c * 2 + h) * 3 + w] = static_cast<float>(c * 100 + h * 10 + w);
  auto nhwc = runtime::runReferenceOp(
      OpKind::kRelayout, {x}, {{"from", std::string("plain")}, {"to", std::string("nhwc")}});
  REQUIRE(nhwc.hasValue());
  // NHWC memory: ((h*3 + w)*2 + c).
  for (int c = 0; c < 2; ++c)
    for (int h = 0; h < 2; ++h)
      for (int w = 0; w < 3; ++w)
        CHECK((*nhwc)[0].data<float>()[(h * 3 + w) * 2 + c] ==
              static_cast<float>(c * 100 + h * 10 + w));
}
