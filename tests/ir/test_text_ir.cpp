// The text IR: print -> parse -> print is byte-identical and rebuilds the same graph; parser
// errors carry line:column and name what is wrong; no input crashes the parser.
#include <bit>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>

#include "ir/attr_values.h"
#include "ir/graph.h"
#include "ir/parser.h"
#include "ir/printer.h"

using namespace kiln;
using namespace kiln::ir;
using Catch::Matchers::Contains;
using namespace kiln::ir::testing;

namespace {

TensorType T(DType d, Shape s, Layout l = Layout::kPlain) {
  return {d, std::move(s), l};
}

Value* add(Graph& g, OpKind op, std::vector<Value*> in, AttrMap attrs = {},
           std::string outName = "") {
  auto n = g.addNode(op, std::move(in), std::move(attrs), {outName});
  INFO(n.status().message());
  REQUIRE(n.hasValue());
  return (*n)->output();
}

Graph mustParse(std::string_view text) {
  auto g = parseGraph(text);
  INFO(text);
  INFO(g.status().message());
  REQUIRE(g.hasValue());
  return std::move(g).value();
}

std::string parseError(std::string_view text) {
  auto g = parseGraph(text);
  INFO(text);
  REQUIRE_FALSE(g.hasValue());
  CHECK(g.status().code() == ErrorCode::kInvalidArgument);
  return g.status().message();
}

// Bitwise, so that NaN attributes compare equal to themselves.
bool sameAttr(const AttrValue& a, const AttrValue& b) {
  if (kindOf(a) != kindOf(b)) return false;
  if (kindOf(a) == AttrKind::kFloat)
    return std::bit_cast<uint64_t>(std::get<double>(a)) ==
           std::bit_cast<uint64_t>(std::get<double>(b));
  if (kindOf(a) == AttrKind::kFloats) {
    const auto& x = std::get<std::vector<double>>(a);
    const auto& y = std::get<std::vector<double>>(b);
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (std::bit_cast<uint64_t>(x[i]) != std::bit_cast<uint64_t>(y[i])) return false;
    return true;
  }
  return attrEqual(a, b);
}

void requireSameValue(const Value* a, const Value* b) {
  REQUIRE(a->name() == b->name());
  REQUIRE(a->type() == b->type());
  REQUIRE(a->kind() == b->kind());
  REQUIRE(a->trainable() == b->trainable());
  REQUIRE(a->dimNames() == b->dimNames());
}

// Structural equality: names, types, kinds, ops, attributes, node names, edges, outputs.
void requireSameGraph(const Graph& a, const Graph& b) {
  REQUIRE(a.name() == b.name());
  REQUIRE(a.inputs().size() == b.inputs().size());
  for (size_t i = 0; i < a.inputs().size(); ++i) requireSameValue(a.inputs()[i], b.inputs()[i]);
  REQUIRE(a.parameters().size() == b.parameters().size());
  for (size_t i = 0; i < a.parameters().size(); ++i)
    requireSameValue(a.parameters()[i], b.parameters()[i]);
  const auto na = a.nodes(), nb = b.nodes();
  REQUIRE(na.size() == nb.size());
  for (size_t i = 0; i < na.size(); ++i) {
    INFO("node " << i);
    REQUIRE(na[i]->op() == nb[i]->op());
    REQUIRE(na[i]->name() == nb[i]->name());
    REQUIRE(na[i]->inputs().size() == nb[i]->inputs().size());
    for (size_t j = 0; j < na[i]->inputs().size(); ++j)
      REQUIRE(na[i]->inputs()[j]->name() == nb[i]->inputs()[j]->name());
    REQUIRE(na[i]->outputs().size() == nb[i]->outputs().size());
    for (size_t j = 0; j < na[i]->outputs().size(); ++j)
      requireSameValue(na[i]->outputs()[j], nb[i]->outputs()[j]);
    REQUIRE(na[i]->attrs().size() == nb[i]->attrs().size());
    for (const auto& [name, value] : na[i]->attrs()) {
      INFO("attribute " << name);
      auto it = nb[i]->attrs().find(name);
      REQUIRE(it != nb[i]->attrs().end());
      REQUIRE(sameAttr(value, it->second));
    }
  }
  REQUIRE(a.outputs().size() == b.outputs().size());
  for (size_t i = 0; i < a.outputs().size(); ++i)
    REQUIRE(a.outputs()[i]->name() == b.outputs()[i]->name());
}

// print -> parse -> print is exact and the parsed graph equals the original.
std::string checkRoundTrip(const Graph& g) {
  const std::string text = printGraph(g);
  Graph parsed = mustParse(text);
  requireSameGraph(g, parsed);
  REQUIRE(printGraph(parsed) == text);
  return text;
}

Graph mlp() {
  Graph g("mlp");
  Value* x = *g.addInput("x", T(DType::kF32, {1, 784}));
  Value* w1 = *g.addParameter("fc1.weight", T(DType::kF32, {512, 784}), true);
  Value* b1 = *g.addParameter("fc1.bias", T(DType::kF32, {512}), true);
  Value* w2 = *g.addParameter("fc2.weight", T(DType::kF32, {10, 512}), true);
  Value* h = add(g, OpKind::kLinear, {x, w1, b1}, {}, "h1");
  Value* r = add(g, OpKind::kRelu, {h});
  Value* y = add(g, OpKind::kLinear, {r, w2}, {}, "logits");
  Value* p = add(g, OpKind::kSoftmax, {y}, {{"axis", I(1)}}, "probs");
  g.setOutputs({p});
  return g;
}

}  // namespace

TEST_CASE("text IR: the printed form of a small MLP is pinned") {
  const char* expected =
      "graph mlp(%x : f32[1,784]) {\n"
      "  param %fc1.weight : f32[512,784]\n"
      "  param %fc1.bias : f32[512]\n"
      "  param %fc2.weight : f32[10,512]\n"
      "  %h1 : f32[1,512] = linear(%x, %fc1.weight, %fc1.bias)\n"
      "  %0 : f32[1,512] = relu(%h1)\n"
      "  %logits : f32[1,10] = linear(%0, %fc2.weight)\n"
      "  %probs : f32[1,10] = softmax(%logits) {axis=1}\n"
      "  return %probs\n"
      "}\n";
  Graph g = mlp();
  CHECK(printGraph(g) == expected);
  checkRoundTrip(g);
}

TEST_CASE("text IR: a conv net with layouts, buffers, node names and every kind of scalar attr") {
  Graph g("resnet_stem");
  Value* x = *g.addInput("input:0", T(DType::kF32, {1, 3, 32, 32}, Layout::kNHWC));
  Value* w = *g.addParameter("conv1/weight", T(DType::kF32, {16, 3, 3, 3}), true);
  Value* b = *g.addParameter("conv1/bias", T(DType::kF32, {16}), true);
  Value* scale = *g.addParameter("bn1.weight", T(DType::kF32, {16}), true);
  Value* shift = *g.addParameter("bn1.bias", T(DType::kF32, {16}), true);
  Value* mean = *g.addParameter("bn1.running_mean", T(DType::kF32, {16}), false);
  Value* var = *g.addParameter("bn1.running_var", T(DType::kF32, {16}), false);
  Node* conv = *g.addNode(OpKind::kConv2d, {x, w, b},
                          {{"strides", Is({2, 2})},
                           {"pads", Is({1, 1, 1, 1})},
                           {"dilations", Is({1, 1})},
                           {"group", I(1)}},
                          {"12"});
  conv->setName("layer1/conv \"a\"\\\n\t\x01 \xce\xbb");
  CHECK(conv->output()->type().layout == Layout::kNHWC);
  Value* bn = (*g.addNode(OpKind::kBatchNorm, {conv->output(), scale, shift, mean, var},
                          {{"epsilon", F(1e-5)}}))
                  ->output();
  bn->setType(T(DType::kF32, {1, 16, 16, 16}, Layout::kNCHW));  // A layout pass chose NCHW.
  Value* act = add(g, OpKind::kLeakyRelu, {bn}, {{"alpha", F(0.1)}});
  Value* c = add(g, OpKind::kClip, {act},
                 {{"min", F(-std::numeric_limits<double>::infinity())}, {"max", F(6.0)}});
  Value* pool = add(g, OpKind::kMaxPool2d, {c},
                    {{"kernel", Is({3, 3})},
                     {"strides", Is({2, 2})},
                     {"pads", Is({1, 1, 1, 1})},
                     {"ceil_mode", I(1)}},
                    "pool.out");
  Value* gelu = add(g, OpKind::kGelu, {pool}, {{"approximate", S("tanh")}});
  Value* gap = add(g, OpKind::kGlobalAvgPool, {gelu});
  Value* flat = add(g, OpKind::kFlatten, {gap}, {{"axis", I(1)}});
  Value* d = add(g, OpKind::kDropout, {flat}, {{"ratio", F(-0.0)}});
  Value* half = add(g, OpKind::kCast, {d}, {{"to", S("f16")}});
  g.setOutputs({half, pool, x, mean});

  const std::string text = checkRoundTrip(g);
  CHECK_THAT(text, Contains("graph resnet_stem(%input:0 : f32[1,3,32,32]@nhwc) {"));
  CHECK_THAT(text, Contains("  param %bn1.running_mean : f32[16] buffer\n"));
  CHECK_THAT(text, Contains("  param %bn1.weight : f32[16]\n"));
  CHECK_THAT(text,
             Contains("  %12 : f32[1,16,16,16]@nhwc = conv2d(%input:0, %conv1/weight, "
                      "%conv1/bias) {dilations=[1,1], group=1, pads=[1,1,1,1], strides=[2,2]} "
                      "name=\"layer1/conv \\\"a\\\"\\\\\\n\\t\\x01 \xce\xbb\"\n"));
  CHECK_THAT(text, Contains("@nchw = batch_norm("));
  CHECK_THAT(text, Contains("{epsilon=1e-05}"));
  CHECK_THAT(text, Contains("{alpha=0.1}"));
  CHECK_THAT(text, Contains("{max=6.0, min=-inf}"));
  CHECK_THAT(text, Contains("{approximate=\"tanh\"}"));
  CHECK_THAT(text, Contains("{ratio=-0.0}"));
  CHECK_THAT(text, Contains("{to=\"f16\"}"));
  CHECK_THAT(text, Contains("  return %7, %pool.out, %input:0, %bn1.running_mean\n}\n"));
}

TEST_CASE("text IR: int lists, empty lists, negative values, scalars and every dtype") {
  Graph g("lists");
  Value* x = *g.addInput("x", T(DType::kF32, {2, 3, 4}));
  Value* idx = *g.addInput("idx", T(DType::kI32, {5}));
  Value* cond = *g.addInput("cond", T(DType::kBool, {3, 4}));
  Value* s = *g.addInput("s", T(DType::kF32, {}));
  Value* empty = *g.addInput("empty", T(DType::kF32, {0, 3, 4}));
  for (DType d : {DType::kF64, DType::kBF16, DType::kI64, DType::kI8, DType::kU8})
    (void)*g.addInput(std::string("in_") + std::string(dtypeName(d)), T(d, {1}));
  Value* r = add(g, OpKind::kReshape, {x}, {{"shape", Is({-1, 0})}, {"allowzero", I(0)}});
  Value* t = add(g, OpKind::kTranspose, {r}, {{"perm", Is({})}});
  Value* sl = add(g, OpKind::kSlice, {x},
                  {{"starts", Is({-1, 0})},
                   {"ends", Is({std::numeric_limits<int64_t>::min(), 4})},
                   {"axes", Is({0, -1})},
                   {"steps", Is({-1, 2})}});
  Value* gt = add(g, OpKind::kGather, {x, idx}, {{"axis", I(-1)}});
  Value* rs = add(g, OpKind::kReduceSum, {x}, {{"axes", Is({})}, {"keepdims", I(0)}});
  Value* wh = add(g, OpKind::kWhere, {cond, x, s});
  Value* cat = add(g, OpKind::kConcat, {empty, empty, x}, {{"axis", I(-3)}});
  Value* us = add(g, OpKind::kUnsqueeze, {s}, {{"axes", Is({0, 1})}});
  Value* sq = add(g, OpKind::kSqueeze, {us}, {{"axes", Is({})}});
  g.setOutputs({t, sl, gt, rs, wh, cat, sq});

  const std::string text = checkRoundTrip(g);
  CHECK_THAT(text, Contains("%s : f32[]"));
  CHECK_THAT(text, Contains("%empty : f32[0,3,4]"));
  CHECK_THAT(text, Contains("%in_bf16 : bf16[1]"));
  CHECK_THAT(text, Contains("{allowzero=0, shape=[-1,0]}"));
  CHECK_THAT(text, Contains("transpose(%0) {perm=[]}"));
  CHECK_THAT(text,
             Contains("{axes=[0,-1], ends=[-9223372036854775808,4], starts=[-1,0], steps=[-1,2]}"));
  CHECK_THAT(text, Contains("concat(%empty, %empty, %x) {axis=-3}"));
}

TEST_CASE("text IR: value and graph names of every allowed shape round-trip") {
  for (std::string graphName : {"main", "my model/v2", "", "x.y", "9lives", "graph"}) {
    Graph g(graphName);
    Value* a = *g.addInput("0", T(DType::kF32, {2}));
    Value* b = *g.addInput("a-b/c.d:e_", T(DType::kF32, {2}));
    Value* c = *g.addInput("x:", T(DType::kF32, {2}));
    Value* d = *g.addInput(std::string(256, 'n'), T(DType::kF32, {2}));
    Value* s = add(g, OpKind::kAdd, {a, b}, {}, "12");
    Value* m = add(g, OpKind::kMul, {s, c}, {}, "param");
    Value* r = add(g, OpKind::kSub, {m, d}, {}, "return");
    g.setOutputs({r, r});
    INFO(graphName);
    const std::string text = checkRoundTrip(g);
    if (graphName == "my model/v2") CHECK_THAT(text, Contains("graph \"my model/v2\"(%0 : "));
    if (graphName == "") CHECK_THAT(text, Contains("graph \"\"(%0 : "));
    CHECK_THAT(text, Contains("%x: : f32[2]"));
  }
}

TEST_CASE("text IR: float attributes round-trip bit-exactly") {
  const double values[] = {0.0,
                           -0.0,
                           1.0,
                           -1.0,
                           0.1,
                           1.0 / 3.0,
                           1e-5,
                           1e300,
                           1e16,
                           123456789.0,
                           std::numeric_limits<double>::denorm_min(),
                           std::numeric_limits<double>::min(),
                           std::numeric_limits<double>::max(),
                           std::numeric_limits<double>::lowest(),
                           std::numeric_limits<double>::epsilon(),
                           static_cast<double>(0.1f),
                           std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity(),
                           std::numeric_limits<double>::quiet_NaN(),
                           -std::numeric_limits<double>::quiet_NaN(),
                           std::bit_cast<double>(uint64_t{0x7ff0000000000001}),
                           std::bit_cast<double>(uint64_t{0xfff8000000000abc})};
  for (double v : values) {
    const std::string text = printFloat(v);
    INFO(text);
    // A float literal never looks like an int.
    CHECK(text.find_first_of(".ein") != std::string::npos);
    auto back = parseAttrValue(text, AttrKind::kFloat);
    INFO(back.status().message());
    REQUIRE(back.hasValue());
    CHECK(std::bit_cast<uint64_t>(std::get<double>(*back)) == std::bit_cast<uint64_t>(v));

    Graph g("f");
    Value* x = *g.addInput("x", T(DType::kF32, {4}));
    g.setOutputs({add(g, OpKind::kLeakyRelu, {x}, {{"alpha", F(v)}})});
    checkRoundTrip(g);
  }
  CHECK(printFloat(1.0) == "1.0");
  CHECK(printFloat(-0.0) == "-0.0");
  CHECK(printFloat(1e-5) == "1e-05");
  CHECK(printFloat(1e20) == "1e+20");
  CHECK(printFloat(std::numeric_limits<double>::quiet_NaN()) == "nan");
  CHECK(printFloat(std::bit_cast<double>(uint64_t{0x7ff0000000000001})) ==
        "nan(0x7ff0000000000001)");
}

TEST_CASE("text IR: attribute values of all six kinds round-trip through their text form") {
  TensorData f(DType::kF32, {2, 2});
  const float fv[] = {1.0f, -2.5f, std::numeric_limits<float>::quiet_NaN(), 0.1f};
  std::memcpy(f.data(), fv, sizeof fv);
  TensorData i64(DType::kI64, {3});
  i64.as<int64_t>()[0] = -1;
  i64.as<int64_t>()[2] = std::numeric_limits<int64_t>::max();
  TensorData boolean(DType::kBool, {2});
  boolean.as<uint8_t>()[1] = 1;
  const std::vector<AttrValue> values = {
      I(0),
      I(-7),
      I(std::numeric_limits<int64_t>::min()),
      I(std::numeric_limits<int64_t>::max()),
      F(0.5),
      F(-std::numeric_limits<double>::infinity()),
      S(""),
      S("none"),
      S("quote\" backslash\\ newline\n tab\t bell\x07 del\x7f utf8 \xe2\x82\xac"),
      Is({}),
      Is({1}),
      Is({-1, 0, 3}),
      Fs({}),
      Fs({0.5, 1.0, -0.0, 1e-07, std::numeric_limits<double>::quiet_NaN()}),
      AttrValue(f),
      AttrValue(i64),
      AttrValue(boolean),
      AttrValue(TensorData(DType::kF16, {0, 3})),
      AttrValue(TensorData(DType::kBF16, {})),
  };
  for (const AttrValue& v : values) {
    const std::string text = printAttrValue(v);
    INFO(text);
    auto back = parseAttrValue(text, kindOf(v));
    INFO(back.status().message());
    REQUIRE(back.hasValue());
    CHECK(sameAttr(v, *back));
    CHECK(printAttrValue(*back) == text);
  }
  CHECK(printAttrValue(Fs({0.5, 1.0})) == "[0.5,1.0]");
  CHECK(printAttrValue(Is({2, 2})) == "[2,2]");
  CHECK(printAttrValue(AttrValue(f)) == "f32[2,2] 0x0000803f000020c00000c07fcdcccc3d");
  CHECK(printAttrValue(AttrValue(TensorData(DType::kF16, {0, 3}))) == "f16[0,3] 0x");
  // An integer is a fine float; a float is not an int; lists of the wrong kind are rejected.
  CHECK(std::get<double>(*parseAttrValue("3", AttrKind::kFloat)) == 3.0);
  CHECK(std::get<std::vector<double>>(*parseAttrValue("[1, -2]", AttrKind::kFloats)) ==
        std::vector<double>{1.0, -2.0});
  CHECK_THAT(parseAttrValue("1.5", AttrKind::kInt).status().message(),
             Contains("must be int, got float 1.5"));
  CHECK_THAT(parseAttrValue("[1, 2.5]", AttrKind::kInts).status().message(),
             Contains("element 1 of the value must be int, got float 2.5"));
  CHECK_THAT(parseAttrValue("f32[2] 0x00", AttrKind::kTensor).status().message(),
             Contains("needs 16 hex digits (8 bytes), got 2"));
  CHECK_THAT(parseAttrValue("f32[1]@nhwc 0x00000000", AttrKind::kTensor).status().message(),
             Contains("tensor values have no layout"));
  CHECK_THAT(parseAttrValue("nan(0x3ff0000000000000)", AttrKind::kFloat).status().message(),
             Contains("is not a NaN"));
  CHECK_THAT(parseAttrValue("1e999", AttrKind::kFloat).status().message(),
             Contains("out of range for a float"));
  CHECK_THAT(parseAttrValue("\"a\" \"b\"", AttrKind::kString).status().message(),
             Contains("unexpected string \"b\" after the value"));
}

TEST_CASE("text IR: every op's schema defaults print and parse back as their own kind") {
  for (int k = 0; k < kNumOps; ++k) {
    const OpInfo& op = opInfo(static_cast<OpKind>(k));
    for (const AttrSpec& spec : op.attrs) {
      if (!spec.defaultValue) continue;
      INFO(op.name << "." << spec.name);
      const std::string text = printAttrValue(*spec.defaultValue);
      auto back = parseAttrValue(text, spec.kind);
      INFO(back.status().message());
      REQUIRE(back.hasValue());
      CHECK(sameAttr(*spec.defaultValue, *back));
    }
  }
}

TEST_CASE("text IR: types parse with layouts and reject bad dtypes, dims and layouts") {
  CHECK(*parseType("f32[1,64,56,56]@nhwc") == T(DType::kF32, {1, 64, 56, 56}, Layout::kNHWC));
  CHECK(*parseType("bool[]") == T(DType::kBool, {}));
  CHECK(*parseType(" i64 [ 0 , 3 ] @ plain ") == T(DType::kI64, {0, 3}));
  CHECK_THAT(
      parseType("f33[1]").status().message(),
      Contains(
          "1:1: unknown dtype 'f33' (expected one of f32, f64, f16, bf16, i64, i32, "
          "i8, u8, bool, i16, u16, u32, u64, f8e4m3fn, f8e4m3fnuz, f8e5m2, f8e5m2fnuz, f4e2m1, i4, "
          "u4, i2, u2, f8e8m0)"));
  CHECK_THAT(parseType("f32[1]@nwhc").status().message(),
             Contains("1:8: unknown layout 'nwhc' (expected nchw, nhwc or plain)"));
  CHECK_THAT(parseType("f32[-1]").status().message(), Contains("dimension -1 is negative"));
  CHECK_THAT(parseType("f32[99999999999999999999]").status().message(),
             Contains("integer 99999999999999999999 is out of range for int64"));
  CHECK_THAT(parseType("f32[1048576,1048576,1048576]").status().message(),
             Contains("1:21: type has more than 2^48 elements"));
  CHECK_THAT(parseType("f32[0,1048576,1048576,1048576]").status().message(),
             Contains("more than 2^48 elements"));
  CHECK_THAT(parseType("f32[1.5]").status().message(),
             Contains("a dimension must be an integer, got number 1.5"));
  CHECK_THAT(
      parseType("f32").status().message(),
      Contains("expected '[' after the dtype (a scalar is written f32[]), got end of input"));
  CHECK_THAT(parseType("f32[1,2").status().message(),
             Contains("expected ',' or ']' in the shape, got end of input"));
}

TEST_CASE("text IR: hand-written IR may leave out types, use comments and free whitespace") {
  Graph g = mustParse(R"(
    # A comment line.
    graph g(%x : f32[2,3]@nchw,
            %y : f32[3]) {   # trailing comment
      param %w : f32[4,3] buffer
      %a = add(%x, %y)
      %b = relu(%a)
      %c : f32[2,4] = linear(%b, %w) name="fc"
      %d = leaky_relu(%c) {alpha = 1}
      %e = softmax(%d) {}
      return %e, %a
    })");
  auto nodes = g.nodes();
  REQUIRE(nodes.size() == 5);
  CHECK(nodes[0]->output()->type() == T(DType::kF32, {2, 3}));
  CHECK(nodes[2]->name() == "fc");
  CHECK(std::get<double>(nodes[3]->attrs().at("alpha")) == 1.0);
  CHECK(nodes[4]->attrs().empty());
  CHECK_FALSE(g.parameters()[0]->trainable());
  CHECK(g.parameters()[0]->data().empty());
  CHECK(printGraph(g) ==
        "graph g(%x : f32[2,3]@nchw, %y : f32[3]) {\n"
        "  param %w : f32[4,3] buffer\n"
        "  %a : f32[2,3] = add(%x, %y)\n"
        "  %b : f32[2,3] = relu(%a)\n"
        "  %c : f32[2,4] = linear(%b, %w) name=\"fc\"\n"
        "  %d : f32[2,4] = leaky_relu(%c) {alpha=1.0}\n"
        "  %e : f32[2,4] = softmax(%d)\n"
        "  return %e, %a\n"
        "}\n");
}

TEST_CASE("text IR: parameters may be declared between nodes and print first") {
  Graph g = mustParse(
      "graph g(%x : f32[2]) {\n"
      "  %a : f32[2] = relu(%x)\n"
      "  param %b : f32[2]\n"
      "  %c : f32[2] = add(%a, %b)\n"
      "  return %c\n"
      "}\n");
  CHECK_THAT(printGraph(g), Contains("{\n  param %b : f32[2]\n  %a : f32[2] = relu(%x)\n"));
}

TEST_CASE("text IR: a declared layout is kept even where inference would pick another") {
  Graph g = mustParse(
      "graph g(%x : f32[1,2,3,3]) {\n"
      "  %y : f32[1,2,3,3]@nhwc = relu(%x)\n"
      "  return %y\n"
      "}\n");
  CHECK(g.outputs()[0]->type().layout == Layout::kNHWC);
}

TEST_CASE("text IR: parse errors name the line, the column and the problem") {
  SECTION("empty and non-graph input") {
    CHECK_THAT(parseError(""), Contains("1:1: expected 'graph' at the start of the text IR, got "
                                        "end of input"));
    CHECK_THAT(parseError("   \n  # only a comment\n"), Contains("3:1: expected 'graph'"));
    CHECK_THAT(parseError("func f() {}"), Contains("1:1: expected 'graph' at the start"));
  }
  SECTION("unknown op, with a suggestion") {
    const std::string text =
        "graph g(%x : f32[2]) {\n"
        "  %y : f32[2] = reluu(%x)\n"
        "  return %y\n"
        "}\n";
    const std::string msg = parseError(text);
    CHECK_THAT(msg, Contains("2:17: unknown op 'reluu' (did you mean 'relu'?)"));
    // The message shows the line with a caret under the column.
    CHECK_THAT(msg, Contains("\n    %y : f32[2] = reluu(%x)\n                  ^"));
    CHECK_THAT(parseError("graph g(%x : f32[1,1,3,3]) {\n  %y = Conv(%x)\n  return %y\n}"),
               Contains("2:8: unknown op 'Conv' (did you mean 'conv2d'?)"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  %y = frobnicate(%x)\n  return %y\n}"),
               Contains("unknown op 'frobnicate'\n"));
  }
  SECTION("undefined values and use before definition") {
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  %y = relu(%z)\n  return %y\n}"),
               Contains("2:13: undefined value '%z'"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n"
                          "  %y = relu(%later)\n"
                          "  %later = relu(%x)\n"
                          "  return %y\n}"),
               Contains("2:13: undefined value '%later' (values must be defined before they "
                        "are used)"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  %y = relu(%x)\n  return %nope\n}"),
               Contains("3:10: undefined value '%nope'"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  %y = add(%x, %y)\n  return %y\n}"),
               Contains("2:16: node reads its own output '%y'"));
  }
  SECTION("duplicate names") {
    CHECK_THAT(parseError("graph g(%x : f32[2], %x : f32[2]) {\n  return %x\n}"),
               Contains("1:22: duplicate value name '%x' (first defined at 1:9)"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  param %x : f32[2]\n  return %x\n}"),
               Contains("2:9: duplicate value name '%x' (first defined at 1:9)"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n"
                          "  %y = relu(%x)\n"
                          "  %y = neg(%x)\n"
                          "  return %y\n}"),
               Contains("3:3: duplicate value name '%y' (first defined at 2:3)"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  %a, %a = relu(%x)\n  return %a\n}"),
               Contains("2:7: duplicate value name '%a' (first defined at 2:3)"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  %x = relu(%x)\n  return %x\n}"),
               Contains("2:3: duplicate value name '%x' (first defined at 1:9)"));
  }
  SECTION("bad dtypes and types") {
    CHECK_THAT(parseError("graph g(%x : float32[2]) {\n  return %x\n}"),
               Contains("1:14: unknown dtype 'float32'"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  param %w : 32[2]\n  return %x\n}"),
               Contains("2:14: expected a type such as f32[1,3], got number 32"));
    CHECK_THAT(parseError("graph g(%x:f32[2]) {\n  return %x\n}"),
               Contains("1:15: expected ':' and a type after the input name, got '[' (value names "
                        "may contain"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  %y:f32[2] = relu(%x)\n  return %y\n}"),
               Contains("value names may contain ':', so write '%x : f32[...]' with spaces"));
  }
  SECTION("attributes: wrong kind, unknown, twice, missing") {
    const char* head = "graph g(%x : f32[1,2,4,4]) {\n  %y = ";
    auto err = [&](const std::string& node) {
      return parseError(head + node + "\n  return %y\n}");
    };
    CHECK_THAT(err("softmax(%x) {axis=1.5}"),
               Contains("2:26: attribute 'axis' of op 'softmax' must be int, got float 1.5"));
    CHECK_THAT(err("softmax(%x) {axis=\"1\"}"), Contains("must be int, got string \"1\""));
    CHECK_THAT(err("softmax(%x) {axis=[1]}"), Contains("must be int, got a list"));
    CHECK_THAT(err("gelu(%x) {approximate=none}"),
               Contains("attribute 'approximate' of op 'gelu' must be string, got 'none'"));
    CHECK_THAT(err("max_pool2d(%x) {kernel=2}"),
               Contains("attribute 'kernel' of op 'max_pool2d' must be ints, got int 2"));
    CHECK_THAT(err("max_pool2d(%x) {kernel=[2,2.0]}"),
               Contains("element 1 of attribute 'kernel' of op 'max_pool2d' must be int, got "
                        "float 2.0"));
    CHECK_THAT(err("leaky_relu(%x) {alpha=\"big\"}"),
               Contains("attribute 'alpha' of op 'leaky_relu' must be float, got string"));
    CHECK_THAT(err("leaky_relu(%x) {alpha=f32[1] 0x00000000}"),
               Contains("must be float, got a tensor"));
    CHECK_THAT(err("relu(%x) {alpha=0.1}"),
               Contains("2:18: op 'relu' has no attribute 'alpha' (it takes: none)"));
    CHECK_THAT(err("softmax(%x) {dim=1}"),
               Contains("op 'softmax' has no attribute 'dim' (it takes: axis)"));
    CHECK_THAT(err("softmax(%x) {axis=1, axis=2}"),
               Contains("2:29: attribute 'axis' is given twice"));
    CHECK_THAT(
        err("reshape(%x)"),
        Contains("2:8: node (reshape -> %y): op 'reshape' requires attribute 'shape' (ints)"));
    CHECK_THAT(err("softmax(%x) {axis=1 axis=2}"),
               Contains("expected ',' or '}' in the attributes, got 'axis'"));
  }
  SECTION("types that disagree with inference, arity and output counts") {
    CHECK_THAT(parseError("graph g(%x : f32[1,3], %w : f32[4,3]) {\n"
                          "  %y : f32[1,3] = linear(%x, %w) name=\"fc\"\n"
                          "  return %y\n}"),
               Contains("2:8: node 'fc' (linear -> %y): output '%y' is declared f32[1,3] but the "
                        "op produces f32[1,4]"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  %y : i64[2] = relu(%x)\n  return %y\n}"),
               Contains("is declared i64[2] but the op produces f32[2]"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  %y = add(%x)\n  return %y\n}"),
               Contains("2:8: node (add -> %y): op 'add' takes 2 inputs, got 1"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  %y, %z = relu(%x)\n  return %y\n}"),
               Contains("2:12: node (relu -> %y): op 'relu' produces 1 output(s), the statement "
                        "names 2"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  relu(%x)\n  return %x\n}"),
               Contains("2:3: node (relu): op 'relu' produces 1 output(s), the statement names 0"));
    CHECK_THAT(parseError("graph g(%x : i64[2]) {\n  %y = sigmoid(%x)\n  return %y\n}"),
               Contains("sigmoid: input must be a floating-point tensor, got i64[2]"));
  }
  SECTION("structure: return, trailing garbage, truncation") {
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  %y = relu(%x)\n}"),
               Contains("3:1: graph 'g' has no return statement before '}'"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  return\n}"),
               Contains("2:3: graph 'g' must return at least one value"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  return %x\n}\ngraph h() {}"),
               Contains("4:1: unexpected 'graph' after the end of the graph"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  return %x\n} }"),
               Contains("3:3: unexpected '}' after the end of the graph"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  return %x\n  %y = relu(%x)\n}"),
               Contains("3:3: expected '}' after the return statement, got '%y'"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  %y = relu(%x"),
               Contains("2:15: expected ',' or ')' in the inputs, got end of input"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  return %x"),
               Contains("expected '}' after the return statement, got end of input"));
    CHECK_THAT(parseError("graph"), Contains("1:6: expected the graph name, got end of input"));
  }
  SECTION("lexical errors") {
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  %y = relu(%x) name=\"abc\n  return %y\n}"),
               Contains("2:22: unterminated string"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  %y = relu(%x) name=\"a\\q\"\n  return %y\n}"),
               Contains("2:24: bad escape in string"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  $y = relu(%x)\n}"),
               Contains("2:3: unexpected character '$'"));
    CHECK_THAT(parseError(std::string("graph g(%x : f32[2]) {\n  \x01") + "\n}"),
               Contains("2:3: unexpected byte 0x01"));
    CHECK_THAT(parseError("graph g(% : f32[2]) {}"),
               Contains("1:9: expected a value name after '%'"));
    CHECK_THAT(parseError("graph g(%x : f32[2x]) {}"), Contains("1:18: malformed number '2x'"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  %y = leaky_relu(%x) {alpha=1e}\n}"),
               Contains("2:30: malformed number (expected digits after the exponent)"));
    CHECK_THAT(parseError("graph g(%x : f32[2]) {\n  return %" + std::string(300, 'v') + "\n}"),
               Contains("undefined value '%vvvv"));
    CHECK_THAT(parseError("graph g(%" + std::string(300, 'v') + " : f32[2]) {}"),
               Contains("is longer than 256 characters"));
  }
}

TEST_CASE("text IR: nonsense, deep nesting and huge numbers fail cleanly") {
  const std::vector<std::string> inputs = {
      std::string(100000, '['),
      "graph g(" + std::string(100000, '('),
      "graph g(%x : f32[2]) {\n  %y = leaky_relu(%x) {alpha=" + std::string(100000, '[') + "}",
      "graph g(%x : f32[2]) {\n  %y = reshape(%x) {shape=[" + std::string(5000, '9') + "]}",
      "graph g(%x : f32[2]) {\n  %y = leaky_relu(%x) {alpha=1" + std::string(5000, '0') + "}",
      "graph g(%x : f32[" + std::string(50000, '1') + "]) {}",
      "graph g(%x : f32[1" + std::string(10000, ',') + "]) {}",
      "graph g(%x : f32[2]) {\n  %y = reshape(%x) {shape=[-1,-1]}\n  return %y\n}",
      "graph g(%x : f32[2]) {\n  %y = expand(%x) {shape=[4294967296,4294967296,2]}\n  return "
      "%y\n}",
      "graph g(%x : f32[2,2]) {\n  %y = reshape(%x) "
      "{shape=[4294967296,4294967296,4294967296,-1]}\n  "
      "return %y\n}",
      "graph g(%x : f32[2]) {\n  %y = leaky_relu(%x) {alpha=nan(0x1" + std::string(100, '0') +
          ")}\n}",
      std::string("graph g(%x : f32[2]) {\0}", 24),
      "graph \"\\x",
      "graph g(%x : f32[2]) {\n  %y = cast(%x) {to=\"f99\"}\n  return %y\n}",
      "graph g(%x : f32[2]) {\n  %y = add(%x, %x, %x, %x)\n  return %y\n}",
  };
  for (const std::string& text : inputs) {
    auto g = parseGraph(text);
    INFO(text.substr(0, 200));
    CHECK_FALSE(g.hasValue());
    CHECK(g.status().code() == ErrorCode::kInvalidArgument);
    CHECK(g.status().message().size() < 1000);
  }
  CHECK_THAT(parseError(inputs[8]), Contains("inferred type of '%y' has more than 2^48 elements"));
  CHECK_THAT(parseError(inputs[13]), Contains("cast: attribute to: unknown dtype 'f99'"));
}

TEST_CASE("text IR: every prefix of a valid text is an error, never a crash") {
  Graph g = mlp();
  g.nodes()[1]->setName("act \"1\"");
  const std::string text = printGraph(g);
  for (size_t n = 0; n <= text.size(); ++n) {
    const std::string prefix = text.substr(0, n);
    auto parsed = parseGraph(prefix);
    INFO(prefix);
    // Only the prefixes that end at or after the closing brace are complete.
    CHECK(parsed.hasValue() == (n + 1 >= text.size()));
  }
}

TEST_CASE("text IR: randomly mutated texts parse or fail without crashing") {
  Graph g("fuzz");
  Value* x = *g.addInput("x", T(DType::kF32, {1, 2, 8, 8}));
  Value* w = *g.addParameter("w", T(DType::kF32, {4, 2, 3, 3}), true);
  Value* c = add(g, OpKind::kConv2d, {x, w}, {{"pads", Is({1, 1, 1, 1})}});
  Value* p = add(g, OpKind::kAvgPool2d, {c}, {{"kernel", Is({2, 2})}, {"strides", Is({2, 2})}});
  Value* r = add(g, OpKind::kReshape, {p}, {{"shape", Is({1, -1})}});
  Value* l = add(g, OpKind::kLeakyRelu, {r}, {{"alpha", F(0.25)}});
  Value* s =
      add(g, OpKind::kSlice, {l}, {{"starts", Is({0})}, {"ends", Is({-1})}, {"axes", Is({1})}});
  g.setOutputs({s, c});
  const std::string text = printGraph(g);
  const std::string alphabet = "%[](){},=:@-\"\\#.0123456789eE xfinan\n";
  std::mt19937 rng(1234);
  int parsedOk = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string m = text;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % m.size();
      switch (rng() % 4) {
        case 0:
          m[at] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          m.insert(at, 1, alphabet[rng() % alphabet.size()]);
          break;
        case 2:
          m.erase(at, 1 + rng() % 8);
          break;
        case 3:
          m[at] = static_cast<char>(rng() % 256);
          break;
      }
      if (m.empty()) m = "g";
    }
    auto parsed = parseGraph(m);
    if (parsed.hasValue()) {
      ++parsedOk;
      // Whatever parses prints canonically.
      const std::string again = printGraph(*parsed);
      auto reparsed = parseGraph(again);
      REQUIRE(reparsed.hasValue());
      REQUIRE(printGraph(*reparsed) == again);
    } else {
      REQUIRE_FALSE(parsed.status().message().empty());
    }
  }
  CHECK(parsedOk > 0);
}

TEST_CASE("text IR: symbolic dims of graph inputs print as name=size and round-trip") {
  Graph g("sym");
  Value* x = *g.addInput("x", T(DType::kF32, {2, 3, 4}));
  Value* y = *g.addInput("y", T(DType::kF32, {2, 4}));
  REQUIRE(g.setDimNames(x, {"batch", "", "seq_len"}).isOk());
  REQUIRE(g.setDimNames(y, {"batch", "seq_len"}).isOk());
  g.setOutputs({x, y});
  const std::string text = checkRoundTrip(g);
  CHECK_THAT(text,
             Contains("graph sym(%x : f32[batch=2,3,seq_len=4], %y : f32[batch=2,seq_len=4])"));
  Graph parsed = mustParse(text);
  CHECK(parsed.inputs()[0]->dimNames() == std::vector<std::string>{"batch", "", "seq_len"});
  auto values = parsed.dimValues();
  REQUIRE(values.hasValue());
  CHECK(*values == std::map<std::string, int64_t>{{"batch", 2}, {"seq_len", 4}});
  // All-empty names clear them.
  REQUIRE(g.setDimNames(y, {"", ""}).isOk());
  CHECK_FALSE(g.inputs()[1]->hasDimNames());
}

TEST_CASE("text IR: misplaced or malformed symbolic dims are errors") {
  CHECK_THAT(parseError("graph g(%x : f32[n=2]) {\n  %y : f32[n=2] = relu(%x)\n  return %y\n}"),
             Contains("symbolic dims such as batch=1 are for graph inputs"));
  CHECK_THAT(parseError("graph g(%x : f32[n 2]) {\n  return %x\n}"),
             Contains("after the symbolic dim name"));
  CHECK_THAT(parseError("graph g(%x : f32[n=2], %y : f32[n=3]) {\n  return %x\n}"),
             Contains("symbolic dim 'n' is 2 in one input but 3 in input '%y'"));
  Graph g("bad");
  Value* x = *g.addInput("x", T(DType::kF32, {2, 3}));
  CHECK_THAT(g.setDimNames(x, {"batch"}).message(), Contains("has rank 2 but 1 dim names"));
  CHECK_THAT(g.setDimNames(x, {"9x", ""}).message(), Contains("'9x' is not an identifier"));
  CHECK_THAT(g.setDimNames(x, {"a-b", ""}).message(), Contains("not an identifier"));
}
