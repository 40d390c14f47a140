// ONNX pointwise ops through the importer, run eagerly, against hand-computed values.
#include <cmath>
#include <functional>

#include "frontends/test_onnx_model.h"

using namespace kiln::onnxtest;
using kiln::ir::OpKind;

namespace {

// A one-node model y = op(x) on a [2,3] input.
Model unaryModel(const std::string& op, const std::vector<::onnx::AttributeProto>& attrs = {},
                 int opset = 17) {
  Model m(opset);
  m.input("x", {int64_t{2}, int64_t{3}}).node(op, {"x"}, {"y"}, attrs, "n").output("y");
  return m;
}

std::vector<float> mapped(const std::vector<float>& x, const std::function<double(double)>& f) {
  std::vector<float> y;
  for (float v : x) y.push_back(static_cast<float>(f(v)));
  return y;
}

}  // namespace

TEST_CASE("onnx: unary activations and math match their formulas") {
  const std::vector<float> x = {-2.5f, -0.5f, 0.f, 0.25f, 1.5f, 3.f};
  const std::vector<float> pos = {0.1f, 0.5f, 1.f, 2.f, 4.f, 9.f};
  struct Case {
    std::string op;
    std::vector<::onnx::AttributeProto> attrs;
    bool positive;
    std::function<double(double)> f;
  };
  const std::vector<Case> cases = {
      {"Neg", {}, false, [](double v) { return -v; }},
      {"Abs", {}, false, [](double v) { return std::fabs(v); }},
      {"Relu", {}, false, [](double v) { return v > 0 ? v : 0; }},
      {"Sigmoid", {}, false, [](double v) { return 1 / (1 + std::exp(-v)); }},
      {"Tanh", {}, false, [](double v) { return std::tanh(v); }},
      {"Exp", {}, false, [](double v) { return std::exp(v); }},
      {"Log", {}, true, [](double v) { return std::log(v); }},
      {"Sqrt", {}, true, [](double v) { return std::sqrt(v); }},
      {"Reciprocal", {}, true, [](double v) { return 1 / v; }},
      {"LeakyRelu", {}, false, [](double v) { return v >= 0 ? v : 0.01 * v; }},
      {"LeakyRelu",
       {attrFloat("alpha", 0.2f)},
       false,
       [](double v) { return v >= 0 ? v : 0.2 * v; }},
      {"Identity", {}, false, [](double v) { return v; }},
  };
  for (const Case& c : cases) {
    INFO(c.op);
    const auto& in = c.positive ? pos : x;
    auto y = run(unaryModel(c.op, c.attrs), {makeF32({2, 3}, in)});
    checkClose(y[0], {2, 3}, mapped(in, c.f));
  }
}

TEST_CASE("onnx: binary ops broadcast an initializer, as NumPy does") {
  const std::vector<float> x = randomValues(6, 1, 0.5f, 2.f);
  const std::vector<float> b = {0.5f, 2.f, -1.5f};
  struct Case {
    std::string op;
    std::function<double(double, double)> f;
  };
  const std::vector<Case> cases = {
      {"Add", [](double p, double q) { return p + q; }},
      {"Sub", [](double p, double q) { return p - q; }},
      {"Mul", [](double p, double q) { return p * q; }},
      {"Div", [](double p, double q) { return p / q; }},
      {"Pow", [](double p, double q) { return std::pow(p, q); }},
  };
  for (const Case& c : cases) {
    INFO(c.op);
    Model m;
    m.input("x", {int64_t{2}, int64_t{3}}).init("b", {3}, b);
    m.node(c.op, {"x", "b"}, {"y"}).output("y");
    auto y = run(m, {makeF32({2, 3}, x)});
    std::vector<float> want;
    for (size_t i = 0; i < 6; ++i) want.push_back(static_cast<float>(c.f(x[i], b[i % 3])));
    checkClose(y[0], {2, 3}, want);
  }
}

TEST_CASE("onnx: Pow with an integer exponent casts it to the base's type") {
  Model m;
  m.input("x", {int64_t{4}}).initI64("e", {}, {3});
  m.node("Pow", {"x", "e"}, {"y"}).output("y");
  auto y = run(m, {makeF32({4}, {1.f, -2.f, 0.5f, 3.f})});
  checkClose(y[0], {4}, {1.f, -8.f, 0.125f, 27.f});
}

TEST_CASE("onnx: n-ary Max, Min and Sum are chains; one input is the identity") {
  const std::vector<float> a = {1, -2, 3, 0}, b = {0, 5, -1, 2}, c = {4, -3, 2, -5};
  for (const std::string op : {"Max", "Min", "Sum"}) {
    INFO(op);
    Model m;
    m.input("a", {int64_t{4}}).input("b", {int64_t{4}}).input("c", {int64_t{4}});
    m.node(op, {"a", "b", "c"}, {"y"}).node(op, {"a"}, {"z"}).output("y").output("z");
    auto y = run(m, {makeF32({4}, a), makeF32({4}, b), makeF32({4}, c)});
    std::vector<float> want;
    for (size_t i = 0; i < 4; ++i)
      want.push_back(op == "Max"   ? std::max({a[i], b[i], c[i]})
                     : op == "Min" ? std::min({a[i], b[i], c[i]})
                                   : a[i] + b[i] + c[i]);
    checkClose(y[0], {4}, want);
    checkClose(y[1], {4}, a);
  }
}

TEST_CASE("onnx: Where with a constant condition selects per element") {
  Model m;
  ::onnx::TensorProto cond;
  cond.set_name("cond");
  cond.set_data_type(kBool);
  cond.add_dims(4);
  for (int v : {1, 0, 0, 1}) cond.add_int32_data(v);
  m.input("x", {int64_t{4}}).input("y", {int64_t{4}}).initializer(cond);
  m.node("Where", {"cond", "x", "y"}, {"z"}).output("z");
  auto z = run(m, {makeF32({4}, {1, 2, 3, 4}), makeF32({4}, {10, 20, 30, 40})});
  checkClose(z[0], {4}, {1, 20, 30, 4});
}

TEST_CASE("onnx: Cast truncates toward zero; a cast to the same type is an alias") {
  Model m;
  m.input("x", {int64_t{4}});
  m.node("Cast", {"x"}, {"i"}, {attrInt("to", kInt64)});
  m.node("Cast", {"i"}, {"f"}, {attrInt("to", kFloat)});
  m.node("Cast", {"f"}, {"g"}, {attrInt("to", kFloat)});
  m.output("i", kInt64).output("g");
  const kiln::ir::Graph g = import(m);
  CHECK(countOps(g, OpKind::kCast) == 2);
  auto y = runGraph(g, {makeF32({4}, {1.7f, -1.7f, 2.5f, -0.2f})});
  CHECK(int64s(y[0]) == std::vector<int64_t>{1, -1, 2, 0});
  checkClose(y[1], {4}, {1, -1, 2, 0});
}

TEST_CASE("onnx: Clip takes min and max from optional constant inputs") {
  const std::vector<float> x = {-3, -1, 0, 2, 5, 7};
  SECTION("neither: unbounded") {
    Model m = unaryModel("Clip");
    checkClose(run(m, {makeF32({2, 3}, x)})[0], {2, 3}, x);
  }
  SECTION("min only (ReLU)") {
    Model m;
    m.input("x", {int64_t{2}, int64_t{3}}).init("lo", {}, {0.f});
    m.node("Clip", {"x", "lo"}, {"y"}).output("y");
    checkClose(run(m, {makeF32({2, 3}, x)})[0], {2, 3}, {0, 0, 0, 2, 5, 7});
  }
  SECTION("max only, min left out with an empty name") {
    Model m;
    m.input("x", {int64_t{2}, int64_t{3}}).init("hi", {}, {1.f});
    m.node("Clip", {"x", "", "hi"}, {"y"}).output("y");
    checkClose(run(m, {makeF32({2, 3}, x)})[0], {2, 3}, {-3, -1, 0, 1, 1, 1});
  }
  SECTION("both from Constant nodes (ReLU6)") {
    Model m;
    m.input("x", {int64_t{2}, int64_t{3}});
    m.node("Constant", {}, {"lo"}, {attrTensor("value", floatTensor("", {}, {0.f}))});
    m.node("Constant", {}, {"hi"}, {attrTensor("value", floatTensor("", {}, {6.f}))});
    m.node("Clip", {"x", "lo", "hi"}, {"y"}).output("y");
    checkClose(run(m, {makeF32({2, 3}, x)})[0], {2, 3}, {0, 0, 0, 2, 5, 6});
  }
  SECTION("a min computed at run time is unsupported") {
    Model m;
    m.input("x", {int64_t{2}, int64_t{3}}).input("lo", {});
    m.node("Clip", {"x", "lo"}, {"y"}, {}, "clip").output("y");
    const kiln::Status s = importError(m);
    CHECK(s.code() == kiln::ErrorCode::kUnimplemented);
    CHECK_THAT(s.message(), Catch::Contains("Clip (opset 17) node 'clip': min (input 1) must be "
                                            "known at import"));
  }
}

TEST_CASE(
    "onnx: Dropout is the identity at inference and in training at ratio 0, its mask all true; "
    "training above 0 is refused") {
  SECTION("opset 12+ with a ratio input") {
    Model m;
    m.input("x", {int64_t{2}, int64_t{3}}).init("ratio", {}, {0.3f});
    m.node("Dropout", {"x", "ratio"}, {"y", "mask"}).output("y");
    const auto x = randomValues(6, 2);
    const kiln::ir::Graph g = import(m);
    CHECK(g.numNodes() == 0);
    checkClose(runGraph(g, {makeF32({2, 3}, x)})[0], {2, 3}, x);
  }
  SECTION("opset 11 with a ratio attribute") {
    Model m(11);
    m.input("x", {int64_t{2}, int64_t{3}});
    m.node("Dropout", {"x"}, {"y"}, {attrFloat("ratio", 0.1f)}).output("y");
    const auto x = randomValues(6, 3);
    checkClose(run(m, {makeF32({2, 3}, x)})[0], {2, 3}, x);
  }
  SECTION("a used mask is all true (bool from opset 10, the input's type at 7)") {
    for (int opset : {17, 7}) {
      INFO("opset " << opset);
      Model m(opset);
      m.input("x", {int64_t{2}, int64_t{3}});
      m.node("Dropout", {"x"}, {"y", "mask"}, {}, "drop")
          .output("y")
          .output("mask", opset >= 10 ? kBool : kFloat);
      const auto out = run(m, {makeF32({2, 3}, randomValues(6, 4))});
      REQUIRE(out.size() == 2);
      CHECK(out[1].dtype() == (opset >= 10 ? kiln::ir::DType::kBool : kiln::ir::DType::kF32));
      for (int64_t i = 0; i < 6; ++i) CHECK(out[1].elementAsDouble(i) == 1.0);
    }
  }
  // Dropout in training mode (a bool initializer `train`) at `ratio`.
  auto training = [](float ratio) {
    Model m;
    ::onnx::TensorProto t;
    t.set_name("train");
    t.set_data_type(kBool);
    t.add_int32_data(1);
    m.input("x", {int64_t{2}, int64_t{3}}).init("ratio", {}, {ratio}).initializer(t);
    m.node("Dropout", {"x", "ratio", "train"}, {"y", "mask"}, {}, "drop");
    return m;
  };
  SECTION("training_mode=true is unsupported") {
    Model m = training(0.5f);
    m.output("y");
    CHECK_THAT(importError(m).message(),
               Catch::Contains("training_mode=true with a ratio above 0"));
  }
  SECTION("training_mode=true at ratio 0: nothing dropped, the mask all true") {
    Model m = training(0.0f);
    m.output("y").output("mask", kBool);
    const auto x = randomValues(6, 5);
    const auto out = run(m, {makeF32({2, 3}, x)});
    REQUIRE(out.size() == 2);
    checkClose(out[0], {2, 3}, x);
    for (int64_t i = 0; i < 6; ++i) CHECK(out[1].elementAsDouble(i) == 1.0);
  }
}

TEST_CASE("onnx: an Erf GELU subgraph becomes one gelu, in each order exporters write it") {
  // torch.onnx writes x * 0.5 * (1 + erf(x / sqrt(2))) as Div, Erf, Add, Mul, Mul; others
  // multiply by 0.5 first or by 1/sqrt(2) instead of dividing.
  const std::vector<float> x = {-3.f, -1.f, -0.25f, 0.f, 0.5f, 2.f};
  std::vector<float> want;
  for (float v : x)
    want.push_back(static_cast<float>(v * 0.5 * (1 + std::erf(v / std::sqrt(2.0)))));
  auto base = [] {
    Model m;
    m.input("x", {int64_t{2}, int64_t{3}});
    m.init("sqrt2", {}, {1.4142135381698608f}).init("one", {}, {1.f}).init("half", {}, {0.5f});
    m.init("rsqrt2", {}, {0.7071067690849304f});
    return m;
  };
  SECTION("(x * (1 + erf(x / sqrt2))) * 0.5") {
    Model m = base();
    m.node("Div", {"x", "sqrt2"}, {"d"}).node("Erf", {"d"}, {"e"}).node("Add", {"e", "one"}, {"a"});
    m.node("Mul", {"x", "a"}, {"m"}).node("Mul", {"m", "half"}, {"y"}).output("y");
    const kiln::ir::Graph g = import(m);
    CHECK(g.numNodes() == 1);
    CHECK(countOps(g, OpKind::kGelu) == 1);
    checkClose(runGraph(g, {makeF32({2, 3}, x)})[0], {2, 3}, want);
  }
  SECTION("(x * 0.5) * (1 + erf(x * (1/sqrt2)))") {
    Model m = base();
    m.node("Mul", {"rsqrt2", "x"}, {"d"})
        .node("Erf", {"d"}, {"e"})
        .node("Add", {"one", "e"}, {"a"});
    m.node("Mul", {"x", "half"}, {"h"}).node("Mul", {"h", "a"}, {"y"}).output("y");
    const kiln::ir::Graph g = import(m);
    CHECK(g.numNodes() == 1);
    checkClose(runGraph(g, {makeF32({2, 3}, x)})[0], {2, 3}, want);
  }
  SECTION("x * ((1 + erf(x / sqrt2)) * 0.5), constants from Constant nodes") {
    Model m;
    m.input("x", {int64_t{2}, int64_t{3}});
    m.node("Constant", {}, {"c2"}, {attrFloat("value_float", 1.41421356f)});
    m.node("Constant", {}, {"c1"}, {attrTensor("value", floatTensor("", {}, {1.f}))});
    m.node("Constant", {}, {"ch"}, {attrTensor("value", floatTensor("", {1}, {0.5f}))});
    m.node("Div", {"x", "c2"}, {"d"}).node("Erf", {"d"}, {"e"}).node("Add", {"e", "c1"}, {"a"});
    m.node("Mul", {"a", "ch"}, {"h"}).node("Mul", {"x", "h"}, {"y"}).output("y");
    const kiln::ir::Graph g = import(m);
    CHECK(countOps(g, OpKind::kGelu) == 1);
    checkClose(runGraph(g, {makeF32({2, 3}, x)})[0], {2, 3}, want);
  }
  SECTION("a pattern whose inner value is also a graph output stays unmatched (lone Erf)") {
    Model m = base();
    m.node("Div", {"x", "sqrt2"}, {"d"}).node("Erf", {"d"}, {"e"}, {}, "erf");
    m.node("Add", {"e", "one"}, {"a"});
    m.node("Mul", {"x", "a"}, {"m"}).node("Mul", {"m", "half"}, {"y"}).output("y").output("e");
    // The pattern is left alone: the Erf runs as kiln's erf op, the rest as its ops.
    const kiln::ir::Graph g = import(m);
    CHECK(countOps(g, OpKind::kGelu) == 0);
    CHECK(countOps(g, OpKind::kErf) == 1);
    checkClose(runGraph(g, {makeF32({2, 3}, x)})[0], {2, 3}, want);
  }
  SECTION("com.microsoft Gelu") {
    Model m;
    m.opsetImport("com.microsoft", 1);
    m.input("x", {int64_t{2}, int64_t{3}});
    m.node("Gelu", {"x"}, {"y"}, {}, "g", "com.microsoft").output("y", {int64_t{2}, int64_t{3}});
    checkClose(run(m, {makeF32({2, 3}, x)})[0], {2, 3}, want);
  }
}

TEST_CASE("onnx: comparisons and logic fold when their inputs are known, else are unsupported") {
  // A mask built from shapes: x * where(shape(x) == [3, 5], 1, 0), with x of shape [3, 2].
  Model m;
  m.input("x", {int64_t{3}, int64_t{2}});
  m.initI64("want", {2}, {3, 5});
  m.init("one", {}, {1.f}).init("zero", {}, {0.f});
  m.node("Shape", {"x"}, {"s"}).node("Equal", {"s", "want"}, {"eq"});
  m.node("Not", {"eq"}, {"ne"}).node("Or", {"eq", "ne"}, {"all"});
  m.node("Where", {"eq", "one", "zero"}, {"w"});
  m.node("Mul", {"x", "w"}, {"y"}).output("y").output("all", kBool);
  const kiln::ir::Graph g = import(m);
  CHECK(g.numNodes() == 1);  // Only the mul runs; the mask is a constant.
  auto y = runGraph(g, {makeF32({3, 2}, {1, 2, 3, 4, 5, 6})});
  checkClose(y[0], {3, 2}, {1, 0, 3, 0, 5, 0});
  REQUIRE(y[1].dtype() == DType::kBool);
  CHECK(y[1].data<uint8_t>()[0] == 1);
  CHECK(y[1].data<uint8_t>()[1] == 1);

  // At run time they are kiln's comparison and logic ops (bool outputs; NaN compares false).
  Model rt;
  rt.input("a", {int64_t{4}}).input("b", {int64_t{4}});
  rt.node("Less", {"a", "b"}, {"lt"}).node("Equal", {"a", "b"}, {"eq"});
  rt.node("GreaterOrEqual", {"a", "b"}, {"ge"}).node("Or", {"lt", "eq"}, {"le"});
  rt.node("Not", {"le"}, {"gt"}).node("Equal", {"lt", "ge"}, {"never"});
  rt.output("lt", kBool).output("le", kBool).output("gt", kBool).output("never", kBool);
  const float nan = std::nanf("");
  auto r = run(rt, {makeF32({4}, {1, 2, 3, nan}), makeF32({4}, {2, 2, 1, 0})});
  auto bools = [](const Tensor& t) {
    std::vector<int> v;
    for (int64_t i = 0; i < t.numElements(); ++i) v.push_back(t.data<uint8_t>()[i]);
    return v;
  };
  CHECK(bools(r[0]) == std::vector<int>{1, 0, 0, 0});
  CHECK(bools(r[1]) == std::vector<int>{1, 1, 0, 0});
  CHECK(bools(r[2]) == std::vector<int>{0, 0, 1, 1});  // not(NaN <= 0) is true.
  CHECK(bools(r[3]) == std::vector<int>{0, 0, 0, 1});  // lt == ge only where both are false: NaN.
}

TEST_CASE("onnx: Mod folds at import or runs as kiln's mod, with either sign rule") {
  // Python-style (fmod=0) takes the divisor's sign, C-style (fmod=1) the dividend's.
  Model m;
  m.input("x", {int64_t{4}});
  m.initI64("a", {4}, {7, -7, 7, -7}).initI64("b", {4}, {3, 3, -3, -3});
  m.node("Mod", {"a", "b"}, {"py"}).node("Mod", {"a", "b"}, {"c"}, {attrInt("fmod", 1)});
  m.node("Cast", {"py"}, {"pyf"}, {attrInt("to", kFloat)});
  m.node("Cast", {"c"}, {"cf"}, {attrInt("to", kFloat)});
  m.node("Add", {"x", "pyf"}, {"y"}).node("Add", {"x", "cf"}, {"z"}).output("y").output("z");
  auto out = runGraph(import(m), {makeF32({4}, {0, 0, 0, 0})});
  checkClose(out[0], {4}, {1, 2, -2, -1});
  checkClose(out[1], {4}, {1, -1, 1, -1});

  Model zero;
  zero.input("x", {int64_t{1}});
  zero.initI64("a", {1}, {5}).initI64("b", {1}, {0});
  zero.node("Mod", {"a", "b"}, {"r"}, {}, "mod").output("r", kInt64);
  CHECK_THAT(importError(zero).message(), Catch::Contains("Mod by zero"));

  // At run time: the same rules (integers), fmod for floats; fmod=0 on floats is invalid.
  Model rt;
  rt.input("a", {int64_t{4}}, kInt64).input("b", {int64_t{4}}, kInt64);
  rt.node("Mod", {"a", "b"}, {"py"}).node("Mod", {"a", "b"}, {"c"}, {attrInt("fmod", 1)});
  rt.output("py", kInt64).output("c", kInt64);
  auto r = run(rt, {makeI64({4}, {7, -7, 7, -7}), makeI64({4}, {3, 3, -3, -3})});
  CHECK(int64s(r[0]) == std::vector<int64_t>{1, 2, -2, -1});
  CHECK(int64s(r[1]) == std::vector<int64_t>{1, -1, 1, -1});
  Model fl;
  fl.input("a", {int64_t{2}}).input("b", {int64_t{2}});
  fl.node("Mod", {"a", "b"}, {"c"}, {attrInt("fmod", 1)}).output("c");
  checkClose(run(fl, {makeF32({2}, {5.5f, -5.5f}), makeF32({2}, {2.f, 2.f})})[0], {2},
             {1.5f, -1.5f});
  Model bad;
  bad.input("a", {int64_t{2}}).input("b", {int64_t{2}});
  bad.node("Mod", {"a", "b"}, {"c"}, {}, "mod").output("c");
  CHECK_THAT(importError(bad).message(), Catch::Contains("needs fmod=1"));
}
