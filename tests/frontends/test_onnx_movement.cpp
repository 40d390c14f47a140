// ONNX data-movement and constant ops, Pad and Resize through the importer, run eagerly,
// against hand-computed values; and folding at import (graphs without shape arithmetic).
#include <numeric>

#include "frontends/test_onnx_model.h"

using namespace kiln::onnxtest;
using kiln::ErrorCode;
using kiln::ir::OpKind;

namespace {

std::vector<float> iota(size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.f);
  return v;
}

}  // namespace

TEST_CASE("onnx: Reshape (0 and -1), Flatten and Transpose") {
  const auto x = iota(24);
  Model m(14);
  m.input("x", {int64_t{2}, int64_t{3}, int64_t{4}}).initI64("shape", {3}, {0, -1, 2});
  m.node("Reshape", {"x", "shape"}, {"r"});
  m.node("Flatten", {"x"}, {"f0"}, {attrInt("axis", 0)});
  m.node("Flatten", {"x"}, {"f2"}, {attrInt("axis", -1)});
  m.node("Transpose", {"x"}, {"t"}, {attrInts("perm", {2, 0, 1})});
  m.node("Transpose", {"x"}, {"rev"});
  m.output("r").output("f0").output("f2").output("t").output("rev");
  auto y = run(m, {makeF32({2, 3, 4}, x)});
  checkClose(y[0], {2, 6, 2}, x);
  checkClose(y[1], {1, 24}, x);
  checkClose(y[2], {6, 4}, x);
  std::vector<float> t, rev;
  for (int k = 0; k < 4; ++k)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) t.push_back(x[(i * 3 + j) * 4 + k]);
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 3; ++j)
      for (int i = 0; i < 2; ++i) rev.push_back(x[(i * 3 + j) * 4 + k]);
  checkClose(y[3], {4, 2, 3}, t);
  checkClose(y[4], {4, 3, 2}, rev);
}

TEST_CASE("onnx: Concat of inputs and initializers; Split equal and by sizes") {
  Model m(13);
  m.input("a", {int64_t{2}, int64_t{2}}).init("b", {2, 1}, {9, 8});
  m.node("Concat", {"a", "b", "a"}, {"c"}, {attrInt("axis", -1)});
  m.initI64("sizes", {2}, {1, 4});
  m.node("Split", {"c", "sizes"}, {"s0", "s1"}, {attrInt("axis", 1)});
  m.node("Split", {"c"}, {"e0", "e1"}, {attrInt("axis", 0)});
  m.output("c").output("s0").output("s1").output("e0").output("e1");
  auto y = run(m, {makeF32({2, 2}, {1, 2, 3, 4})});
  checkClose(y[0], {2, 5}, {1, 2, 9, 1, 2, 3, 4, 8, 3, 4});
  checkClose(y[1], {2, 1}, {1, 3});
  checkClose(y[2], {2, 4}, {2, 9, 1, 2, 4, 8, 3, 4});
  checkClose(y[3], {1, 5}, {1, 2, 9, 1, 2});
  checkClose(y[4], {1, 5}, {3, 4, 8, 3, 4});
  SECTION("opset 11 takes split sizes as an attribute") {
    Model m11(11);
    m11.input("a", {int64_t{5}});
    m11.node("Split", {"a"}, {"p", "q"}, {attrInts("split", {3, 2})}).output("p").output("q");
    auto z = run(m11, {makeF32({5}, {1, 2, 3, 4, 5})});
    checkClose(z[0], {3}, {1, 2, 3});
    checkClose(z[1], {2}, {4, 5});
  }
}

TEST_CASE("onnx: Slice with negative bounds, axes, steps and clamped ends") {
  const auto x = iota(20);
  Model m;
  m.input("x", {int64_t{4}, int64_t{5}});
  m.initI64("s1", {2}, {1, -4}).initI64("e1", {2}, {INT64_MAX, -1}).initI64("a1", {2}, {0, 1});
  m.initI64("st1", {2}, {2, 2});
  m.node("Slice", {"x", "s1", "e1", "a1", "st1"}, {"y"});
  m.initI64("s2", {1}, {-1}).initI64("e2", {1}, {INT64_MIN});
  m.initI64("a2", {1}, {1}).initI64("st2", {1}, {-2});
  m.node("Slice", {"x", "s2", "e2", "a2", "st2"}, {"z"});
  m.initI64("s3", {1}, {2}).initI64("e3", {1}, {4});
  m.node("Slice", {"x", "s3", "e3"}, {"w"});  // No axes: the leading dims.
  m.output("y").output("z").output("w");
  auto y = run(m, {makeF32({4, 5}, x)});
  // Rows 1, 3; columns 1, 3 (from -4 = 1 to -1 = 4, step 2).
  checkClose(y[0], {2, 2}, {6, 8, 16, 18});
  // Columns 4, 2, 0 backwards.
  checkClose(y[1], {4, 3}, {4, 2, 0, 9, 7, 5, 14, 12, 10, 19, 17, 15});
  checkClose(y[2], {2, 5}, {10, 11, 12, 13, 14, 15, 16, 17, 18, 19});
}

TEST_CASE("onnx: Squeeze and Unsqueeze take axes as an attribute (opset 11) or input (13)") {
  const auto x = iota(6);
  Model m11(11), m13(13);
  m11.input("x", {int64_t{1}, int64_t{2}, int64_t{1}, int64_t{3}});
  m11.node("Squeeze", {"x"}, {"s"}, {attrInts("axes", {0})});
  m11.node("Squeeze", {"x"}, {"all"});
  m11.node("Unsqueeze", {"all"}, {"u"}, {attrInts("axes", {0, -1})});
  m11.output("s").output("all").output("u");
  m13.input("x", {int64_t{1}, int64_t{2}, int64_t{1}, int64_t{3}});
  m13.initI64("a0", {1}, {0}).initI64("au", {2}, {0, -1});
  m13.node("Squeeze", {"x", "a0"}, {"s"}).node("Squeeze", {"x"}, {"all"});
  m13.node("Unsqueeze", {"all", "au"}, {"u"});
  m13.output("s").output("all").output("u");
  for (Model* m : {&m11, &m13}) {
    auto y = run(*m, {makeF32({1, 2, 1, 3}, x)});
    checkClose(y[0], {2, 1, 3}, x);
    checkClose(y[1], {2, 3}, x);
    checkClose(y[2], {1, 2, 3, 1}, x);
  }
}

TEST_CASE("onnx: Expand broadcasts both ways; Gather with run-time and constant indices") {
  Model m;
  m.input("x", {int64_t{3}, int64_t{1}}).initI64("shape", {3}, {2, 1, 4});
  m.node("Expand", {"x", "shape"}, {"e"});
  m.input("idx", {int64_t{2}, int64_t{2}}, kInt64);
  m.init("table", {4, 2}, {0, 1, 10, 11, 20, 21, 30, 31});
  m.node("Gather", {"table", "idx"}, {"g"});
  m.initI64("last", {}, {-1});
  m.node("Gather", {"table", "last"}, {"row"}, {attrInt("axis", 1)});
  m.output("e").output("g").output("row");
  auto y = run(m, {makeF32({3, 1}, {1, 2, 3}), makeI64({2, 2}, {3, 0, -1, 1})});
  std::vector<float> e;
  for (int b = 0; b < 2; ++b)
    for (float v : {1.f, 2.f, 3.f})
      for (int k = 0; k < 4; ++k) e.push_back(v);
  checkClose(y[0], {2, 3, 4}, e);
  checkClose(y[1], {2, 2, 2}, {30, 31, 0, 1, 30, 31, 10, 11});
  checkClose(y[2], {4}, {1, 11, 21, 31});
}

TEST_CASE("onnx: Constant forms, Shape, Size, ConstantOfShape and Range fold at import") {
  Model m(15);
  m.input("x", {int64_t{2}, int64_t{3}, int64_t{4}});
  m.node("Constant", {}, {"cf"}, {attrFloat("value_float", 2.5f)});
  m.node("Constant", {}, {"cfs"}, {attrFloats("value_floats", {1, 2, 3, 4})});
  m.node("Constant", {}, {"ci"}, {attrInt("value_int", 3)});
  m.node("Constant", {}, {"cis"}, {attrInts("value_ints", {2, 12})});
  m.node("Shape", {"x"}, {"s"}, {attrInt("start", 1), attrInt("end", -1)});  // [3]
  m.node("Size", {"x"}, {"n"});                                              // 24
  m.node("Reshape", {"x", "cis"}, {"r"});
  m.node("ConstantOfShape", {"s"}, {"ones"},
         {attrTensor("value", floatTensor("", {1}, {1.f}))});  // [3] of 1
  m.node("ConstantOfShape", {"cis"}, {"zeros"});               // [2,12] of 0.f
  m.initI64("start", {}, {10}).initI64("delta", {}, {-3});
  m.node("Range", {"start", "ci", "delta"}, {"range"});  // 10, 7, 4
  m.init("fstart", {}, {0.5f}).init("flimit", {}, {2.f}).init("fdelta", {}, {0.5f});
  m.node("Range", {"fstart", "flimit", "fdelta"}, {"frange"});  // 0.5, 1, 1.5
  m.node("Add", {"r", "zeros"}, {"r0"}).node("Mul", {"r0", "cf"}, {"y"});
  m.node("Add", {"frange", "ones"}, {"z"});  // Both constants: folded too.
  m.output("y").output("n", kInt64).output("range", kInt64).output("z").output("cfs");
  const kiln::ir::Graph g = import(m);
  CHECK(g.numNodes() == 3);  // reshape, add, mul; everything else is a constant.
  auto y = runGraph(g, {makeF32({2, 3, 4}, iota(24))});
  std::vector<float> want;
  for (float v : iota(24)) want.push_back(v * 2.5f);
  checkClose(y[0], {2, 12}, want);
  CHECK(int64s(y[1]) == std::vector<int64_t>{24});
  CHECK(int64s(y[2]) == std::vector<int64_t>{10, 7, 4});
  checkClose(y[3], {3}, {1.5f, 2.f, 2.5f});
  checkClose(y[4], {4}, {1, 2, 3, 4});
  for (const kiln::ir::Value* p : g.parameters()) CHECK_FALSE(p->trainable());
}

TEST_CASE("onnx: OptionalHasElement and OptionalGetElement of a tensor, and of no input") {
  Model m(18);
  m.input("x", {int64_t{3}});
  m.node("OptionalHasElement", {"x"}, {"has"}).node("OptionalHasElement", {""}, {"none"});
  m.node("OptionalGetElement", {"x"}, {"y"});
  m.output("has", ::onnx::TensorProto::BOOL).output("none", ::onnx::TensorProto::BOOL).output("y");
  auto out = run(m, {makeF32({3}, {1, 2, 3})});
  CHECK(*out[0].data<bool>());
  CHECK_FALSE(*out[1].data<bool>());
  checkClose(out[2], {3}, {1, 2, 3});
}

TEST_CASE("onnx: BitCast and Det of malformed shapes and widths are invalid models") {
  Model b(26);
  b.input("x", {int64_t{2}});
  b.node("BitCast", {"x"}, {"y"}, {attrInt("to", kInt64)}, "bc").output("y", kInt64);
  kiln::Status s = importError(b);
  CHECK(s.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("32-bit elements, i64 64-bit ones"));
  Model d(22);
  d.input("x", {int64_t{2}, int64_t{3}});
  d.node("Det", {"x"}, {"y"}, {}, "det").output("y");
  s = importError(d);
  CHECK(s.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("must be square matrices"));
}

TEST_CASE("onnx: a ConstantOfShape too large to fold becomes a run-time expand") {
  Model m;
  m.initI64("shape", {2}, {2048, 1024});
  m.input("x", {int64_t{2048}, int64_t{1024}});
  m.node("ConstantOfShape", {"shape"}, {"c"}, {attrTensor("value", floatTensor("", {1}, {3.f}))});
  m.node("Add", {"x", "c"}, {"y"}).output("y");
  const kiln::ir::Graph g = import(m);
  CHECK(countOps(g, OpKind::kExpand) == 1);
  CHECK(g.parameterBytes() == 4);
  auto y = runGraph(g, {makeF32({2048, 1024}, std::vector<float>(2048 * 1024, 1.f))});
  const auto v = floats(y[0]);
  CHECK(v.front() == 4.f);
  CHECK(v.back() == 4.f);
}

TEST_CASE("onnx: Pad in constant, reflect, edge and wrap modes, with negative pads") {
  const auto x = iota(6);  // [[0 1 2] [3 4 5]]
  auto padModel = [](const std::string& mode, std::vector<int64_t> pads, bool value) {
    Model m;
    m.input("x", {int64_t{2}, int64_t{3}}).initI64("pads", {4}, pads);
    std::vector<std::string> ins{"x", "pads"};
    if (value) {
      m.init("v", {}, {-1.f});
      ins.push_back("v");
    }
    m.node("Pad", ins, {"y"}, {attrString("mode", mode)}).output("y");
    return m;
  };
  SECTION("constant") {
    auto y = run(padModel("constant", {1, 0, 0, 2}, true), {makeF32({2, 3}, x)});
    checkClose(y[0], {3, 5}, {-1, -1, -1, -1, -1, 0, 1, 2, -1, -1, 3, 4, 5, -1, -1});
    auto z = run(padModel("constant", {0, 1, 1, 0}, false), {makeF32({2, 3}, x)});
    checkClose(z[0], {3, 4}, {0, 0, 1, 2, 0, 3, 4, 5, 0, 0, 0, 0});
  }
  SECTION("reflect") {
    auto y = run(padModel("reflect", {1, 2, 0, 2}, false), {makeF32({2, 3}, x)});
    // Rows: [3 4 5], [0 1 2], [3 4 5]; each row r reflected: r2 r1 | r0 r1 r2 | r1 r0.
    checkClose(y[0], {3, 7}, {5, 4, 3, 4, 5, 4, 3, 2, 1, 0, 1, 2, 1, 0, 5, 4, 3, 4, 5, 4, 3});
  }
  SECTION("edge") {
    auto y = run(padModel("edge", {0, 2, 1, 1}, false), {makeF32({2, 3}, x)});
    checkClose(y[0], {3, 6}, {0, 0, 0, 1, 2, 2, 3, 3, 3, 4, 5, 5, 3, 3, 3, 4, 5, 5});
  }
  SECTION("a constant_value computed at run time") {
    Model m;
    m.input("x", {int64_t{2}, int64_t{3}}).input("v", {}).initI64("pads", {4}, {0, 1, 0, 0});
    m.node("Neg", {"v"}, {"nv"}).node("Pad", {"x", "pads", "nv"}, {"y"}).output("y");
    auto y = run(m, {makeF32({2, 3}, x), makeF32({}, {2.5f})});
    checkClose(y[0], {2, 4}, {-2.5f, 0, 1, 2, -2.5f, 3, 4, 5});
  }
  SECTION("negative pads crop") {
    auto y = run(padModel("constant", {0, -1, -1, 1}, false), {makeF32({2, 3}, x)});
    checkClose(y[0], {1, 3}, {1, 2, 0});
  }
  SECTION("wrap, with pads longer than the dim (as NumPy's pad)") {
    auto y = run(padModel("wrap", {1, 4, 0, 1}, false), {makeF32({2, 3}, x)});
    // Rows: [3 4 5], [0 1 2], [3 4 5]; each row r wrapped: r2 r0 r1 r2 | r0 r1 r2 | r0.
    checkClose(y[0], {3, 8},
               {5, 3, 4, 5, 3, 4, 5, 3, 2, 0, 1, 2, 0, 1, 2, 0, 5, 3, 4, 5, 3, 4, 5, 3});
    auto z = run(padModel("wrap", {0, -1, 0, 2}, false), {makeF32({2, 3}, x)});
    // Cropped first, then wrapped (ONNX Runtime 1.31 gives both results too).
    checkClose(z[0], {2, 4}, {1, 2, 1, 2, 4, 5, 4, 5});
  }
  SECTION("an unknown mode is unsupported") {
    Model m = padModel("constant", {0, 0, 0, 0}, false);
    m.proto().mutable_graph()->mutable_node(0)->mutable_attribute(0)->set_s("symmetric");
    m.proto().mutable_graph()->mutable_node(0)->set_name("pad");
    CHECK_THAT(importError(m).message(), Catch::Contains("node 'pad': mode 'symmetric'"));
  }
}

TEST_CASE("onnx: a zero Pad read only by Conv nodes folds into their pads") {
  const auto x = randomValues(1 * 2 * 4 * 4, 5), w = randomValues(3 * 2 * 3 * 3, 6);
  Model m;
  m.input("x", {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{4}}).init("w", {3, 2, 3, 3}, w);
  m.initI64("pads", {8}, {0, 0, 1, 2, 0, 0, 0, 1});
  m.node("Pad", {"x", "pads"}, {"p"});
  m.node("Conv", {"p", "w"}, {"y"}, {attrInts("pads", {1, 0, 0, 0})}).output("y");
  const kiln::ir::Graph g = import(m);
  CHECK(g.numNodes() == 1);
  REQUIRE(countOps(g, OpKind::kConv2d) == 1);
  const Tensor want =
      reference(OpKind::kConv2d, {makeF32({1, 2, 4, 4}, x), makeF32({3, 2, 3, 3}, w)},
                {{"pads", std::vector<int64_t>{2, 2, 0, 1}}});
  checkClose(runGraph(g, {makeF32({1, 2, 4, 4}, x)})[0], want);
}

TEST_CASE("onnx: Resize nearest and linear, with scales or sizes") {
  const Tensor x = makeF32({1, 1, 2, 2}, {1, 2, 3, 4});
  auto resize = [](std::vector<::onnx::AttributeProto> attrs, bool sizes) {
    Model m(13);
    m.input("x", {int64_t{1}, int64_t{1}, int64_t{2}, int64_t{2}});
    if (sizes) {
      m.initI64("sizes", {4}, {1, 1, 4, 3});
      m.node("Resize", {"x", "", "", "sizes"}, {"y"}, attrs);
    } else {
      m.init("scales", {4}, {1, 1, 2, 2});
      m.node("Resize", {"x", "", "scales"}, {"y"}, attrs);
    }
    m.output("y");
    return m;
  };
  SECTION("nearest, asymmetric, floor (PyTorch's nearest upsampling)") {
    auto y = run(resize({attrString("coordinate_transformation_mode", "asymmetric"),
                         attrString("nearest_mode", "floor")},
                        false),
                 {x});
    checkClose(y[0], {1, 1, 4, 4}, {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4});
  }
  SECTION("nearest with the defaults (half_pixel, round_prefer_floor) to sizes 4x3") {
    // Rows: (i + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25 -> 0, 0, 1, 1.
    // Columns, scale 1.5: (j + 0.5) / 1.5 - 0.5 = -0.17, 0.5, 1.17 -> 0, 0 (0.5 prefers floor), 1.
    auto y = run(resize({}, true), {x});
    checkClose(y[0], {1, 1, 4, 3}, {1, 1, 2, 1, 1, 2, 3, 3, 4, 3, 3, 4});
  }
  SECTION("linear, half_pixel (PyTorch's bilinear, align_corners=False)") {
    auto y = run(resize({attrString("mode", "linear")}, false), {x});
    checkClose(y[0], {1, 1, 4, 4},
               {1, 1.25f, 1.75f, 2, 1.5f, 1.75f, 2.25f, 2.5f, 2.5f, 2.75f, 3.25f, 3.5f, 3, 3.25f,
                3.75f, 4});
  }
  SECTION("linear, align_corners") {
    auto y = run(resize({attrString("mode", "linear"),
                         attrString("coordinate_transformation_mode", "align_corners")},
                        false),
                 {x});
    const float a = 1.f / 3, b = 2.f / 3;
    checkClose(y[0], {1, 1, 4, 4},
               {1, 1 + a, 1 + b, 2, 1 + 2 * a, 1 + 2 * a + a, 1 + 2 * a + b, 2 + 2 * a, 1 + 2 * b,
                1 + 2 * b + a, 1 + 2 * b + b, 2 + 2 * b, 3, 3 + a, 3 + b, 4});
  }
  SECTION("cubic keeps a constant (its weights sum to 1); an unknown mode is an error") {
    auto y = run(resize({attrString("mode", "cubic")}, false),
                 {makeF32({1, 1, 2, 2}, {2.5f, 2.5f, 2.5f, 2.5f})});
    checkClose(y[0], {1, 1, 4, 4}, std::vector<float>(16, 2.5f));
    Model m = resize({attrString("mode", "bicubic")}, false);
    m.proto().mutable_graph()->mutable_node(0)->set_name("up");
    const kiln::Status s = importError(m);
    CHECK(s.code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("Resize (opset 13) node 'up': mode 'bicubic' is not "
                                            "nearest, linear or cubic"));
  }
}
