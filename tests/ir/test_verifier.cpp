// The IR verifier: accepts well-formed graphs and rejects broken ones (types, order, arity,
// attributes, outputs, parameter data, sizes) with messages that name the node or value.
#include <catch2/catch.hpp>

#include "ir/graph.h"
#include "ir/parser.h"
#include "ir/verifier.h"

using namespace kiln;
using namespace kiln::ir;
using Catch::Matchers::Contains;

namespace {

TensorType T(DType d, Shape s, Layout l = Layout::kPlain) {
  return {d, std::move(s), l};
}

Node* addTyped(Graph& g, OpKind op, std::vector<Value*> in, AttrMap attrs,
               std::vector<std::pair<std::string, TensorType>> outs) {
  auto n = g.addNodeWithTypes(op, std::move(in), std::move(attrs), std::move(outs));
  INFO(n.status().message());
  REQUIRE(n.hasValue());
  return *n;
}

std::string verifyError(const Graph& g) {
  Status s = verify(g);
  REQUIRE_FALSE(s.isOk());
  CHECK(s.code() == ErrorCode::kInvalidArgument);
  return s.message();
}

// x -> linear(w, b) "fc" -> relu "act" -> outputs
struct Small {
  Graph g{"small"};
  Value* x;
  Value* w;
  Value* b;
  Node* fc;
  Node* act;
  Small() {
    x = *g.addInput("x", T(DType::kF32, {1, 3}));
    w = *g.addParameter("w", T(DType::kF32, {4, 3}), true);
    b = *g.addParameter("b", T(DType::kF32, {4}), true);
    fc = *g.addNode(OpKind::kLinear, {x, w, b}, {}, {"h"});
    fc->setName("fc");
    act = *g.addNode(OpKind::kRelu, {fc->output()}, {}, {"y"});
    act->setName("act");
    g.setOutputs({act->output()});
  }
};

}  // namespace

TEST_CASE("verifier: accepts well-formed graphs") {
  SECTION("built with addNode") {
    Small s;
    CHECK(verify(s.g).isOk());
  }
  SECTION("built with addNodeWithTypes, declaring a layout inference would not pick") {
    Graph g("typed");
    Value* x = *g.addInput("x", T(DType::kF32, {1, 2, 4, 4}));
    Node* r =
        addTyped(g, OpKind::kRelu, {x}, {}, {{"r", T(DType::kF32, {1, 2, 4, 4}, Layout::kNHWC)}});
    g.setOutputs({r->output()});
    CHECK(verify(g).isOk());
  }
  SECTION("outputs that are inputs or parameters, a value read twice, parameters with data") {
    Graph g("mixed");
    Value* x = *g.addInput("x", T(DType::kF32, {2}));
    TensorData data(DType::kF32, {2});
    Value* p = *g.addParameter("p", data, false);
    Value* sq = (*g.addNode(OpKind::kMul, {x, x}))->output();
    g.setOutputs({sq, x, p, sq});
    CHECK(verify(g).isOk());
  }
  SECTION("every graph the parser returns") {
    auto g = parseGraph(
        "graph g(%x : f32[1,4]) {\n"
        "  param %w : f32[2,4]\n"
        "  %y : f32[1,2] = linear(%x, %w)\n"
        "  return %y\n"
        "}\n");
    REQUIRE(g.hasValue());
    CHECK(verify(*g).isOk());
  }
  SECTION("after a rewrite that replaces uses and removes the dead node") {
    Small s;
    Node* neg = *s.g.addNode(OpKind::kNeg, {s.fc->output()}, {}, {"n"});
    s.g.replaceAllUsesWith(s.act->output(), neg->output());
    s.g.removeNodesIf([&](const Node& n) { return &n == s.act; });
    CHECK(verify(s.g).isOk());
    CHECK(s.g.outputs()[0]->name() == "n");
  }
}

TEST_CASE("verifier: an output type that disagrees with inference names the node") {
  Graph g("bad_type");
  Value* x = *g.addInput("x", T(DType::kF32, {1, 3}));
  Value* w = *g.addParameter("w", T(DType::kF32, {4, 3}), true);
  Node* fc = addTyped(g, OpKind::kLinear, {x, w}, {}, {{"y", T(DType::kF32, {1, 3})}});
  fc->setName("fc");
  g.setOutputs({fc->output()});
  CHECK(verifyError(g) ==
        "node 'fc' (linear -> %y): output '%y' is declared f32[1,3] but the op produces f32[1,4]");

  fc->output()->setType(T(DType::kF16, {1, 4}));
  CHECK_THAT(verifyError(g),
             Contains("output '%y' is declared f16[1,4] but the op produces f32[1,4]"));
  fc->output()->setType(T(DType::kF32, {1, 4}, Layout::kNHWC));
  CHECK(verify(g).isOk());  // Layout is a pass's choice, not the op's.
}

TEST_CASE("verifier: use before definition") {
  SECTION("a node reading a value produced by a later node") {
    Small s;
    // act was appended after fc; make fc read act's output.
    s.fc->replaceInput(0, s.act->output());
    CHECK(verifyError(s.g) ==
          "node 'fc' (linear -> %h): input 0 '%y' is not defined before the node (not SSA or "
          "not in order)");
  }
  SECTION("a node reading its own output") {
    Small s;
    s.act->replaceInput(0, s.act->output());
    CHECK_THAT(verifyError(s.g),
               Contains("node 'act' (relu -> %y): input 0 '%y' is not defined before the node"));
  }
  SECTION("a node reading the output of a removed node") {
    Small s;
    s.g.removeNodesIf([&](const Node& n) { return &n == s.fc; });
    CHECK_THAT(verifyError(s.g),
               Contains("node 'act' (relu -> %y): input 0 '%h' is not defined before the node"));
  }
}

TEST_CASE("verifier: graph outputs must exist and be defined") {
  SECTION("no outputs") {
    Small s;
    s.g.setOutputs({});
    CHECK(verifyError(s.g) == "graph 'small' has no outputs");
  }
  SECTION("an output whose node was removed") {
    Small s;
    s.g.removeNodesIf([&](const Node& n) { return &n == s.act; });
    CHECK(verifyError(s.g) == "graph output '%y' is not defined in the graph");
  }
  SECTION("a null output") {
    Small s;
    s.g.setOutputs({s.act->output(), nullptr});
    CHECK(verifyError(s.g) == "graph output '%?' is not defined in the graph");
  }
}

TEST_CASE("verifier: arity, output count and attributes are checked per node") {
  Graph g("attrs");
  Value* x = *g.addInput("x", T(DType::kF32, {2, 3}));
  SECTION("too few inputs") {
    Node* n = addTyped(g, OpKind::kAdd, {x}, {}, {{"s", T(DType::kF32, {2, 3})}});
    g.setOutputs({n->output()});
    CHECK(verifyError(g) == "node (add -> %s): op 'add' takes 2 inputs, got 1");
  }
  SECTION("too many outputs") {
    Node* n = addTyped(g, OpKind::kRelu, {x}, {},
                       {{"a", T(DType::kF32, {2, 3})}, {"b", T(DType::kF32, {2, 3})}});
    g.setOutputs({n->output()});
    CHECK(verifyError(g) == "node (relu -> %a): has 2 outputs, op 'relu' produces 1");
  }
  SECTION("an attribute of the wrong kind set after construction") {
    Node* n = *g.addNode(OpKind::kSoftmax, {x}, {}, {"p"});
    n->setName("sm");
    n->setAttr("axis", AttrValue(1.5));
    g.setOutputs({n->output()});
    CHECK(verifyError(g) ==
          "node 'sm' (softmax -> %p): attribute 'axis' of op 'softmax' must be int, got float");
  }
  SECTION("an unknown attribute") {
    Node* n = *g.addNode(OpKind::kRelu, {x}, {}, {"r"});
    n->setAttr("alpha", AttrValue(0.1));
    g.setOutputs({n->output()});
    CHECK_THAT(verifyError(g),
               Contains("node (relu -> %r): op 'relu' has no attribute 'alpha' (it takes: none)"));
  }
  SECTION("a missing required attribute") {
    Node* n = addTyped(g, OpKind::kReshape, {x}, {}, {{"r", T(DType::kF32, {6})}});
    g.setOutputs({n->output()});
    CHECK_THAT(verifyError(g), Contains("node (reshape -> %r): op 'reshape' requires attribute "
                                        "'shape' (ints)"));
  }
  SECTION("an attribute value that makes inference fail") {
    Node* n = *g.addNode(OpKind::kSoftmax, {x}, {}, {"p"});
    n->setAttr("axis", AttrValue(int64_t{5}));
    g.setOutputs({n->output()});
    CHECK_THAT(verifyError(g), Contains("node (softmax -> %p): softmax: axis: axis 5 is out of "
                                        "range for rank 2"));
  }
}

TEST_CASE("verifier: parameter data must match the declared type") {
  Small s;
  s.w->setData(TensorData(DType::kF32, {3, 4}));
  CHECK(verifyError(s.g) == "parameter '%w' is declared f32[4,3] but its data is f32[3,4]");
  s.w->setData(TensorData(DType::kF16, {4, 3}));
  CHECK_THAT(verifyError(s.g), Contains("but its data is f16[4,3]"));
  s.w->setData(TensorData(DType::kF32, {4, 3}));
  CHECK(verify(s.g).isOk());
}

TEST_CASE("graph: a type past 2^48 elements cannot be made; the verifier checks sizes again") {
  // Every value is made through one check (the bound the text IR reads back, ir::kMaxElements:
  // the dims other than 0 multiplied), so that no frontend builds a graph that does not print
  // and parse again (fuzz_onnx found an initializer of dims [276465,16,109,1,0,77,...]).
  SECTION("on a graph input") {
    Graph g("huge");
    auto x = g.addInput("x", T(DType::kF32, {int64_t{1} << 31, int64_t{1} << 31}));
    REQUIRE_FALSE(x.hasValue());
    CHECK(x.status().message() ==
          "value '%x' of type f32[2147483648,2147483648] has more than 2^48 elements (its dims "
          "other than 0 multiplied)");
  }
  SECTION("on a node output produced by an expand of huge attribute values") {
    Graph g("huge");
    Value* x = *g.addInput("x", T(DType::kF32, {2}));
    const int64_t big = int64_t{1} << 32;
    auto e = g.addNode(OpKind::kExpand, {x},
                       {{"shape", AttrValue(std::vector<int64_t>{big, big, 2})}}, {"e"});
    REQUIRE_FALSE(e.hasValue());
    CHECK_THAT(e.status().message(), Contains("value '%e' of type f32[4294967296,4294967296,2]"));
    CHECK(g.nodes().empty());  // Nothing half-made.
    CHECK(g.findValue("e") == nullptr);
  }
  SECTION("on a parameter with a zero dim: the others still count") {
    Graph g("empty");
    auto p =
        g.addParameter("p", T(DType::kU8, {276465, 16, 109, 0, 77, 16, 24, 16, 16, 16}), false);
    REQUIRE_FALSE(p.hasValue());
  }
  SECTION("zero-size tensors with large dims are fine while the other dims fit") {
    Graph g("empty");
    Value* x = *g.addInput("x", T(DType::kF64, {0, int64_t{1} << 40}));
    g.setOutputs({x});
    CHECK(verify(g).isOk());
  }
  SECTION("a type set later past the bytes int64 holds is the verifier's error") {
    Graph g("huge");
    Value* x = *g.addInput("x", T(DType::kF32, {2}));
    x->setType(T(DType::kF32, {int64_t{1} << 31, int64_t{1} << 31}));
    g.setOutputs({x});
    CHECK(verifyError(g) ==
          "graph input: value '%x' has type f32[2147483648,2147483648], whose size does not fit "
          "in 64 bits");
  }
}

TEST_CASE("verifier: duplicate value names cannot be created, and the errors name them") {
  // The Graph API refuses duplicate names at every entry point, so the verifier's own
  // duplicate check is a second line of defence that well-formed API use cannot reach.
  Graph g("dups");
  Value* x = *g.addInput("x", T(DType::kF32, {2}));
  auto in = g.addInput("x", T(DType::kF32, {2}));
  REQUIRE_FALSE(in.hasValue());
  CHECK(in.status().message() == "duplicate value name '%x'");
  auto param = g.addParameter("x", T(DType::kF32, {2}), true);
  REQUIRE_FALSE(param.hasValue());
  CHECK(param.status().message() == "duplicate value name '%x'");
  auto node = g.addNode(OpKind::kRelu, {x}, {}, {"x"});
  REQUIRE_FALSE(node.hasValue());
  CHECK(node.status().message() == "duplicate value name '%x'");
  auto bad = g.addInput("has space", T(DType::kF32, {2}));
  REQUIRE_FALSE(bad.hasValue());
  CHECK_THAT(bad.status().message(), Contains("invalid value name 'has space'"));
  g.setOutputs({x});
  CHECK(verify(g).isOk());
  // The text parser reports them with the position of both definitions.
  auto parsed = parseGraph("graph g(%x : f32[2]) {\n  %x = relu(%x)\n  return %x\n}");
  REQUIRE_FALSE(parsed.hasValue());
  CHECK_THAT(parsed.status().message(),
             Contains("2:3: duplicate value name '%x' (first defined at 1:9)"));
}
