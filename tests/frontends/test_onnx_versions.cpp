// ONNX versions: opsets 7-28 and IR versions 3-14, each op mapped by the version of its
// definition at the model's opset (onnx_op_versions.inc), and models outside libonnx 1.12's
// range validated by kiln itself.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "frontends/onnx/onnx_import.h"
#include "frontends/onnx/onnx_importer.h"
#include "frontends/test_onnx_model.h"

using namespace kiln::onnxtest;
using kiln::ErrorCode;
using kiln::Status;
namespace onnx_import = kiln::frontends::onnx_import;

TEST_CASE("onnx versions: every mapped version is one of ONNX's, and the gaps are listed") {
  // Versions a mapper does not implement although its op is mapped at other opsets of 7-28,
  // each with its reason. A new gap (a new ONNX version, a version dropped from a mapper) or a
  // closed one fails here.
  const std::set<std::string> expectedGaps = {
      "Scan-8",  // Scan 8 scans a batch of sequences (sequence_lens, batch axis 0).
  };
  std::set<std::string> gaps;
  for (const onnx_import::MappedOp& op : onnx_import::mappedOps()) {
    INFO(op.opType);
    const std::vector<int> history = onnx_import::onnxOpHistory(op.opType);
    REQUIRE_FALSE(history.empty());
    for (int v : op.versions) CHECK(std::find(history.begin(), history.end(), v) != history.end());
    for (int opset = kiln::frontends::kMinOnnxOpset; opset <= kiln::frontends::kMaxOnnxOpset;
         ++opset) {
      const int v = onnx_import::onnxOpVersion(op.opType, opset);
      if (v != 0 && std::find(op.versions.begin(), op.versions.end(), v) == op.versions.end())
        gaps.insert(op.opType + "-" + std::to_string(v));
    }
  }
  CHECK(gaps == expectedGaps);
  CHECK(onnx_import::mappedOps().size() >= 60);
}

TEST_CASE("onnx versions: the version in effect at an opset") {
  CHECK(onnx_import::onnxOpVersion("Relu", 7) == 6);
  CHECK(onnx_import::onnxOpVersion("Relu", 13) == 13);
  CHECK(onnx_import::onnxOpVersion("Relu", 28) == 14);
  CHECK(onnx_import::onnxOpVersion("ReduceMean", 17) == 13);
  CHECK(onnx_import::onnxOpVersion("ReduceMean", 18) == 18);
  CHECK(onnx_import::onnxOpVersion("Gelu", 19) == 0);  // Introduced in 20.
  CHECK(onnx_import::onnxOpVersion("Gelu", 20) == 20);
  CHECK(onnx_import::onnxOpVersion("Upsample", 9) == 9);
  CHECK(onnx_import::onnxOpVersion("Upsample", 10) == 0);  // Deprecated in 10.
  CHECK(onnx_import::onnxOpVersion("NoSuchOp", 17) == 0);
}

TEST_CASE(
    "onnx versions: opsets and IR versions outside kiln's range are refused with the way out") {
  auto relu = [](int opset) {
    Model m(opset);
    m.input("x", {int64_t{2}}).node("Relu", {"x"}, {"y"}).output("y");
    return m;
  };
  Status s = importError(relu(6));
  CHECK(s.code() == ErrorCode::kUnimplemented);
  CHECK_THAT(s.message(), Catch::Contains("opset 6") && Catch::Contains("version_converter"));
  s = importError(relu(29));
  CHECK(s.code() == ErrorCode::kUnimplemented);
  CHECK_THAT(s.message(), Catch::Contains("opset 29, newer than the 28"));
  s = importError(relu(20).irVersion(15));
  CHECK_THAT(s.message(), Catch::Contains("IR version is 15, newer than the 14"));
  s = importError(relu(9).irVersion(2));
  CHECK_THAT(s.message(), Catch::Contains("IR version is 2"));
}

TEST_CASE("onnx versions: a model of opset 20 and IR version 10 imports without libonnx") {
  // Version-18+ forms: ReduceMean's axes input, Split's num_outputs with an uneven last part,
  // Pad's axes input, Gelu (20) and Mish (18).
  Model m(20);
  m.irVersion(10);
  m.input("x", {int64_t{2}, int64_t{7}});
  m.initI64("axes1", {1}, {1});
  m.node("ReduceMean", {"x", "axes1"}, {"mean"}, {attrInt("keepdims", 1)}, "mean");
  m.node("Split", {"x"}, {"s0", "s1", "s2"}, {attrInt("axis", 1), attrInt("num_outputs", 3)},
         "split");
  m.initI64("pads", {2}, {1, 2});
  m.node("Pad", {"s2", "pads", "", "axes1"}, {"padded"}, {}, "pad");
  m.node("Gelu", {"x"}, {"g"}, {attrString("approximate", "tanh")}, "gelu");
  m.node("Mish", {"x"}, {"mish"}, {}, "mish");
  m.output("mean").output("s0").output("s2").output("padded").output("g").output("mish");
  const auto x = randomValues(14, 3);
  const auto y = run(m, {makeF32({2, 7}, x)});
  REQUIRE(y.size() == 6);
  for (int r = 0; r < 2; ++r) {
    double sum = 0;
    for (int c = 0; c < 7; ++c) sum += x[r * 7 + c];
    CHECK(floats(y[0])[r] == Approx(sum / 7).epsilon(1e-5));
  }
  CHECK(y[1].shape() == kiln::ir::Shape{2, 3});  // ceil(7 / 3) = 3, 3, then 1.
  CHECK(y[2].shape() == kiln::ir::Shape{2, 1});
  checkClose(y[3], {2, 4}, {0, x[6], 0, 0, 0, x[13], 0, 0});
  std::vector<float> gelu, mish;
  for (float v : x) {
    const double t = std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v));
    gelu.push_back(static_cast<float>(0.5 * v * (1 + t)));
    mish.push_back(static_cast<float>(v * std::tanh(std::log1p(std::exp(v)))));
  }
  checkClose(y[4], {2, 7}, gelu);
  checkClose(y[5], {2, 7}, mish);
}

TEST_CASE("onnx versions: an op not defined at the model's opset is invalid, named") {
  // Opsets past libonnx's (17): kiln's own message. (Within them the ONNX checker says it.)
  Model m(19);
  m.input("x", {int64_t{2}}).node("Gelu", {"x"}, {"y"}, {}, "gelu").output("y");
  Status s = importError(m);
  CHECK(s.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("Gelu (opset 19) node 'gelu': Gelu is not defined at "
                                          "opset 19; ONNX introduced it in opset 20"));
  Model u(18);
  u.input("x", {int64_t{1}, int64_t{1}, int64_t{2}, int64_t{2}});
  u.init("scales", {4}, {1, 1, 2, 2});
  u.node("Upsample", {"x", "scales"}, {"y"}, {}, "up").output("y");
  s = importError(u);
  CHECK(s.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("Upsample is deprecated at opset 18"));
  Model k(12);
  k.input("x", {int64_t{2}}).node("Gelu", {"x"}, {"y"}, {}, "gelu").output("y");
  CHECK_THAT(importError(k).message(), Catch::Contains("No Op registered for Gelu"));
}

TEST_CASE("onnx versions: a version kiln does not map is named with those it does") {
  // Scan 8 (a batch of sequences) with an identity body.
  ::onnx::AttributeProto body;
  body.set_name("body");
  body.set_type(::onnx::AttributeProto::GRAPH);
  ::onnx::GraphProto* g = body.mutable_g();
  g->set_name("body");
  auto valueInfo = [](::onnx::ValueInfoProto* v, const char* name) {
    v->set_name(name);
    v->mutable_type()->mutable_tensor_type()->set_elem_type(kFloat);
  };
  valueInfo(g->add_input(), "xi");
  valueInfo(g->add_output(), "yi");
  auto* id = g->add_node();
  id->set_op_type("Identity");
  id->add_input("xi");
  id->add_output("yi");
  Model m(8);
  m.input("x", {int64_t{1}, int64_t{3}, int64_t{2}});
  m.node("Scan", {"", "x"}, {"y"}, {attrInt("num_scan_inputs", 1), body}, "scan").output("y");
  const Status s = importError(m);
  CHECK(s.code() == ErrorCode::kUnimplemented);
  CHECK_THAT(s.message(), Catch::Contains("kiln does not map version 8 of Scan (the definition "
                                          "in effect at opset 8); it maps versions 9, 11"));
}

TEST_CASE("onnx versions: opsets 7-10 forms (attributes that later became inputs)") {
  const auto x = randomValues(6, 5, -3, 3);
  SECTION("Clip 6: min and max attributes") {
    Model m(7);
    m.input("x", {int64_t{2}, int64_t{3}});
    m.node("Clip", {"x"}, {"y"}, {attrFloat("min", -0.5f), attrFloat("max", 1.f)}).output("y");
    std::vector<float> want;
    for (float v : x) want.push_back(std::clamp(v, -0.5f, 1.f));
    checkClose(run(m, {makeF32({2, 3}, x)})[0], {2, 3}, want);
  }
  SECTION("Slice 1: starts, ends and axes attributes") {
    Model m(9);
    m.input("x", {int64_t{2}, int64_t{3}});
    m.node("Slice", {"x"}, {"y"},
           {attrInts("starts", {1}), attrInts("ends", {3}), attrInts("axes", {1})})
        .output("y");
    checkClose(run(m, {makeF32({2, 3}, x)})[0], {2, 2}, {x[1], x[2], x[4], x[5]});
  }
  SECTION("Pad 2: pads and value attributes") {
    Model m(10);
    m.input("x", {int64_t{2}, int64_t{3}});
    m.node("Pad", {"x"}, {"y"}, {attrInts("pads", {0, 1, 0, 0}), attrFloat("value", 7.f)})
        .output("y");
    checkClose(run(m, {makeF32({2, 3}, x)})[0], {2, 4}, {7, x[0], x[1], x[2], 7, x[3], x[4], x[5]});
  }
  SECTION("BatchNormalization 7 with spatial=0 is refused") {
    Model m(7);
    m.input("x", {int64_t{1}, int64_t{2}, int64_t{2}, int64_t{2}});
    for (const char* p : {"s", "b", "mu", "var"}) m.init(p, {2}, {1, 1});
    m.node("BatchNormalization", {"x", "s", "b", "mu", "var"}, {"y"}, {attrInt("spatial", 0)}, "bn")
        .output("y");
    CHECK_THAT(importError(m).message(), Catch::Contains("spatial=0"));
  }
}

TEST_CASE("onnx versions: without libonnx, malformed graphs are still clear errors") {
  SECTION("a value defined twice") {
    Model m(20);
    m.input("x", {int64_t{2}});
    m.node("Relu", {"x"}, {"y"}).node("Neg", {"x"}, {"y"}).output("y");
    const Status s = importError(m);
    CHECK(s.code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("value 'y' is defined twice"));
  }
  SECTION("an input nothing defines") {
    Model m(20);
    m.input("x", {int64_t{2}});
    m.node("Add", {"x", "nowhere"}, {"y"}, {}, "add").output("y");
    const Status s = importError(m);
    CHECK(s.code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("input 'nowhere' is not a graph input"));
  }
  SECTION("a declared output type the node does not compute") {
    Model m(20);
    m.input("x", {int64_t{2}, int64_t{3}});
    m.node("Relu", {"x"}, {"y"}, {}, "relu").output("y", {int64_t{3}, int64_t{2}});
    const Status s = importError(m);
    CHECK(s.code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("the model declares f32[3,2] for output 'y'"));
  }
  SECTION("AveragePool 19's dilations are applied, not ignored") {
    Model m(19);
    m.input("x", {int64_t{1}, int64_t{1}, int64_t{5}, int64_t{5}});
    m.node("AveragePool", {"x"}, {"y"},
           {attrInts("kernel_shape", {2, 2}), attrInts("dilations", {2, 2})}, "pool")
        .output("y");
    // y[r][c] = mean of x at (r, c), (r, c + 2), (r + 2, c), (r + 2, c + 2) = 5r + c + 6.
    std::vector<float> x(25), want;
    for (int i = 0; i < 25; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i);
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 3; ++c) want.push_back(static_cast<float>(5 * r + c + 6));
    checkClose(run(m, {makeF32({1, 1, 5, 5}, x)})[0], {1, 1, 3, 3}, want);
  }
}

TEST_CASE("onnx versions: docs/onnx.md's version table is the registry's") {
  std::string table = "\n| ONNX op | versions kiln maps |\n|---|---|\n";
  for (const onnx_import::MappedOp& op : onnx_import::mappedOps()) {
    std::string vs;
    for (int v : op.versions) vs += (vs.empty() ? "" : ", ") + std::to_string(v);
    table += "| " + op.opType + " | " + vs + " |\n";
  }
  const std::filesystem::path path =
      (std::filesystem::path(KILN_TEST_DATA_DIR) / "../../docs/onnx.md").lexically_normal();
  std::ifstream in(path);
  REQUIRE(in.good());
  std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string begin = "<!-- onnx-versions:begin -->", end = "<!-- onnx-versions:end -->";
  const size_t b = doc.find(begin), e = doc.find(end);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  const size_t from = b + begin.size();
  if (std::getenv("KILN_UPDATE_DOCS")) {
    doc.replace(from, e - from, table);
    std::ofstream(path) << doc;
    return;
  }
  INFO("docs/onnx.md is stale: rerun with KILN_UPDATE_DOCS=1");
  CHECK(doc.substr(from, e - from) == table);
}

TEST_CASE("onnx versions: a node written for another version is refused, not guessed") {
  // Without libonnx's checker (opset 18+), kiln checks each node against its version's
  // definition: ReduceMean 18 takes axes as an input, so an axes attribute is invalid (it would
  // otherwise reduce every axis); Clip 13 has no min/max attributes.
  Model r(18);
  r.input("x", {int64_t{2}, int64_t{3}});
  r.node("ReduceMean", {"x"}, {"y"}, {attrInts("axes", {1})}, "mean").output("y");
  Status s = importError(r);
  CHECK(s.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("ReduceMean version 18 has no attribute 'axes'"));
  Model c(20);
  c.input("x", {int64_t{3}});
  c.node("Clip", {"x"}, {"y"}, {attrFloat("min", 0.f)}, "clip").output("y");
  CHECK_THAT(importError(c).message(), Catch::Contains("Clip version 13 has no attribute 'min'"));
  Model n(20);
  n.input("x", {int64_t{3}});
  n.node("Relu", {"x"}, {"y"}, {}, "relu").node("Relu", {"x", "x"}, {"z"}, {}, "two").output("y");
  CHECK_THAT(importError(n).message(),
             Catch::Contains("Relu version 14 takes 1 inputs, the node has 2"));
  Model none(20);
  none.input("x", {int64_t{3}});
  none.node("Relu", {"x"}, {"y"}).node("Neg", {"x"}, {}, {}, "no_outputs").output("y");
  CHECK_THAT(importError(none).message(), Catch::Contains("(Neg) has no outputs"));
}

TEST_CASE("onnx versions: a model written by onnx 1.23's helper.make_model (IR 14) loads") {
  // tests/data/onnx/make_model_ir14.onnx comes from tools/onnx/make_ir14_model.py: IR 14,
  // opset 28, a node with metadata_props (a field libonnx 1.12 does not know).
  const std::string path =
      (std::filesystem::path(KILN_TEST_DATA_DIR) / "onnx" / "make_model_ir14.onnx").string();
  auto g = kiln::frontends::loadOnnx(path);
  INFO((g ? std::string() : g.status().message()));
  REQUIRE(g.hasValue());
  const std::vector<float> x = {1, -2, 0.5f, 0, 3, -1};
  const float w[3][2] = {{0.5f, -1.0f}, {0.25f, 2.0f}, {-0.75f, 0.125f}};
  const float b[2] = {0.1f, -0.2f};
  std::vector<float> expected;
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 2; ++c) {
      double pre = b[c];
      for (int k = 0; k < 3; ++k) pre += x[r * 3 + k] * w[k][c];
      expected.push_back(static_cast<float>(0.5 * pre * std::erfc(-pre / std::sqrt(2.0))));
    }
  const auto y = runGraph(*g, {makeF32({2, 3}, x)});
  REQUIRE(y.size() == 1);
  checkClose(y[0], {2, 2}, expected);
}

TEST_CASE("onnx versions: shape-like graph inputs are specialized on values given at import") {
  // Reshape's shape and ReduceSum's axes as graph inputs (ONNX allows it; kiln compiles for
  // static shapes): refused without their values, naming the input; with them (inputValues)
  // the importer binds exactly those two and keeps x an input, even when given x's value too.
  Model m(18);
  m.input("x", {int64_t{2}, int64_t{6}})
      .input("shape", {int64_t{3}}, kInt64)
      .input("axes", {int64_t{1}}, kInt64);
  m.node("Reshape", {"x", "shape"}, {"r"}, {}, "reshape");
  m.node("ReduceSum", {"r", "axes"}, {"y"}, {attrInt("keepdims", 0)}, "sum");
  m.output("y");
  Status s = importError(m);
  CHECK(s.code() == ErrorCode::kUnimplemented);
  CHECK_THAT(s.message(), Catch::Contains("shape (input 1) must be known at import"));

  auto i64 = [](kiln::ir::Shape shape, std::vector<int64_t> v) {
    kiln::ir::TensorData t(kiln::ir::DType::kI64, shape);
    std::memcpy(t.data(), v.data(), v.size() * sizeof(int64_t));
    return t;
  };
  const auto x = randomValues(12, 5);
  kiln::frontends::OnnxImportOptions options;
  options.inputValues.emplace("shape", i64({3}, {2, 3, 2}));
  options.inputValues.emplace("axes", i64({1}, {-1}));
  options.inputValues.emplace("x", makeF32({2, 6}, x).toData());
  const kiln::ir::Graph g = import(m, options);
  REQUIRE(g.inputs().size() == 1);
  CHECK(g.inputs()[0]->name() == "x");
  const auto y = runGraph(g, {makeF32({2, 6}, x)});
  std::vector<float> want;
  for (int i = 0; i < 6; ++i) want.push_back(x[2 * i] + x[2 * i + 1]);
  checkClose(y[0], {2, 3}, want);

  options.inputValues.insert_or_assign("axes", i64({2}, {0, 1}));
  s = importError(m, options);
  CHECK_THAT(s.message(), Catch::Contains("the value given for graph input 'axes' is i64[2], the "
                                          "model declares i64[1]"));
}

TEST_CASE("onnx versions: Round, Ceil, Floor and Relu of constants fold at import") {
  // A Reshape's shape computed from float constants: it imports only if every step folds.
  // Round halves to even (2.5 -> 2), Relu keeps 0 for -1 (+ 1 -> 1).
  Model m(18);
  m.input("x", {int64_t{12}});
  m.init("a", {1}, {2.5f}).init("b", {1}, {1.2f}).init("c", {1}, {3.7f}).init("d", {1}, {-1.f});
  m.init("one", {1}, {1.f});
  m.node("Round", {"a"}, {"ra"}).node("Ceil", {"b"}, {"cb"}).node("Floor", {"c"}, {"fc"});
  m.node("Relu", {"d"}, {"rd"}).node("Add", {"rd", "one"}, {"rd1"});
  m.node("Concat", {"ra", "cb", "fc", "rd1"}, {"sf"}, {attrInt("axis", 0)});
  m.node("Cast", {"sf"}, {"shape"}, {attrInt("to", kInt64)});
  m.node("Reshape", {"x", "shape"}, {"y"}).output("y");
  std::vector<float> x(12);
  for (int i = 0; i < 12; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i);
  const Tensor y = run(m, {makeF32({12}, x)})[0];
  CHECK(y.shape() == kiln::ir::Shape{2, 2, 3, 1});
}

TEST_CASE("onnx versions: reductions and Reciprocal of constants fold at import") {
  // torchvision's detection transform computes its Resize scale so: min and max of the image's
  // sides, a reciprocal. A Reshape's shape from reductions of constants imports only if each folds.
  Model m(18);
  m.input("x", {int64_t{24}});
  // Constants (float initializers would be weights, which stay trainable and are not folded).
  m.node("Constant", {}, {"hw"}, {attrTensor("value", floatTensor("hw", {2}, {4.f, 6.f}))});
  m.init("twelve", {1}, {12.f}).init("two", {1}, {2.f});
  m.initI64("i", {2, 2}, {2, 3, 4, 1}).initI64("cols", {1}, {1});
  m.node("ReduceMax", {"hw"}, {"most"});  // [6]
  m.node("Reciprocal", {"most"}, {"inv"}).node("Mul", {"inv", "twelve"}, {"af"});
  m.node("Cast", {"af"}, {"a"}, {attrInt("to", kInt64)});                   // [2]
  m.node("ReduceProd", {"i", "cols"}, {"rows"}, {attrInt("keepdims", 0)});  // [6, 4]
  m.node("ReduceMin", {"rows"}, {"b"});                                     // [4]
  m.node("ReduceMean", {"hw"}, {"mean"}).node("Sub", {"mean", "two"}, {"cf"});
  m.node("Cast", {"cf"}, {"c"}, {attrInt("to", kInt64)});  // [3]
  m.node("Concat", {"a", "b", "c"}, {"shape"}, {attrInt("axis", 0)});
  m.node("Reshape", {"x", "shape"}, {"y"}).output("y");
  std::vector<float> x(24, 1.f);
  const Tensor y = run(m, {makeF32({24}, x)})[0];
  CHECK(y.shape() == kiln::ir::Shape{2, 4, 3});
}

TEST_CASE(
    "onnx versions: a value needed at import is traced back to the graph inputs it comes "
    "from") {
  // Range's limit is n cast (CastLike x) and doubled; Pad's pads are (target - shape(x)) with
  // zeros before: the importer binds n and target (given among every input's values) and keeps
  // x an input, whose type (CastLike) and shape (Shape) alone the two read.
  Model m(18);
  m.input("x", {int64_t{3}}).input("n", {}, kInt64).input("target", {int64_t{1}}, kInt64);
  m.initI64("zero", {1}, {0});
  m.node("CastLike", {"n", "x"}, {"nf"});  // Reads x's type only.
  m.init("two", {}, {2.f}).init("start", {}, {0.f}).init("step", {}, {1.f});
  m.node("Mul", {"nf", "two"}, {"limit"}).node("Range", {"start", "limit", "step"}, {"r"});
  m.node("Shape", {"x"}, {"xs"}).node("Sub", {"target", "xs"}, {"after"});
  m.node("Concat", {"zero", "after"}, {"pads"}, {attrInt("axis", 0)});
  m.node("Pad", {"x", "pads"}, {"p"});
  m.output("r").output("p");
  CHECK_THAT(importError(m).message(), Catch::Contains("must be known at import"));
  kiln::frontends::OnnxImportOptions options;
  kiln::ir::TensorData n(kiln::ir::DType::kI64, {}), target(kiln::ir::DType::kI64, {1});
  *n.as<int64_t>() = 2;
  *target.as<int64_t>() = 5;
  options.inputValues.emplace("n", n);
  options.inputValues.emplace("target", target);
  options.inputValues.emplace("x", makeF32({3}, {7, 8, 9}).toData());
  const kiln::ir::Graph g = import(m, options);
  REQUIRE(g.inputs().size() == 1);
  CHECK(g.inputs()[0]->name() == "x");
  const auto y = runGraph(g, {makeF32({3}, {1, 2, 3})});
  checkClose(y[0], {4}, {0, 1, 2, 3});
  checkClose(y[1], {5}, {1, 2, 3, 0, 0});
}

TEST_CASE("onnx versions: Einsum equations compute or are refused by name") {
  const auto a = randomValues(6, 11), b = randomValues(12, 12);
  auto einsum = [&](const std::string& eq, int operands) {
    Model m(18);
    m.input("a", {int64_t{2}, int64_t{3}});
    std::vector<std::string> ins = {"a"};
    if (operands == 2) {
      m.input("b", {int64_t{3}, int64_t{4}});
      ins.push_back("b");
    }
    m.node("Einsum", ins, {"y"}, {attrString("equation", eq)}, "einsum").output("y");
    return m;
  };
  // Matrix product, explicit and implicit.
  std::vector<float> ab(8, 0);
  for (int i = 0; i < 2; ++i)
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 3; ++j) ab[i * 4 + k] += a[i * 3 + j] * b[j * 4 + k];
  for (const char* eq : {"ij,jk->ik", "ij,jk"}) {
    INFO(eq);
    const auto y = run(einsum(eq, 2), {makeF32({2, 3}, a), makeF32({3, 4}, b)});
    checkClose(y[0], {2, 4}, ab);
  }
  // Transpose with an ellipsis, and a full sum.
  const auto t = run(einsum("...j->j...", 1), {makeF32({2, 3}, a)});
  checkClose(t[0], {3, 2}, {a[0], a[3], a[1], a[4], a[2], a[5]});
  const auto s = run(einsum("ij->", 1), {makeF32({2, 3}, a)});
  double sum = 0;
  for (float v : a) sum += v;
  checkClose(s[0], {}, {static_cast<float>(sum)});
  CHECK_THAT(importError(einsum("...A->A", 1)).message(),
             Catch::Contains("has the upper-case letter 'A'"));
  // Refused with a reason, never a crash: a diagonal of unequal dims, stray characters, unknown
  // output letters, operand count and rank mismatches.
  CHECK_THAT(importError(einsum("ii->i", 1)).message(),
             Catch::Contains("letter 'i' repeats in operand 0 f32[2,3] over dims of sizes 2 and "
                             "3 (a diagonal needs equal ones)"));
  CHECK_THAT(importError(einsum("i.j->ij", 1)).message(), Catch::Contains("one dim per letter"));
  CHECK_THAT(importError(einsum("ij->ik", 1)).message(),
             Catch::Contains("output letter 'k' is in no operand"));
  CHECK_THAT(importError(einsum("ij->i->j", 1)).message(), Catch::Contains("in no operand"));
  CHECK_THAT(importError(einsum("ij,jk->ik", 1)).message(), Catch::Contains("has 2 operands"));
  CHECK_THAT(importError(einsum("ijk->i", 1)).message(), Catch::Contains("one dim per letter"));
  CHECK_THAT(importError(einsum("......->", 1)).message(), Catch::Contains("has fewer dims"));
  // Diagonals, as NumPy's einsum: of a matrix, its trace (implicit output), over two of three
  // dims, summed, with an ellipsis, and one letter three times.
  {
    const auto c = randomValues(18, 13);  // [3, 3, 2]
    auto one = [&](const std::string& eq, Shape shape, const std::vector<float>& x) {
      Model m(18);
      m.input("x", std::vector<Dim>(shape.begin(), shape.end()));
      m.node("Einsum", {"x"}, {"y"}, {attrString("equation", eq)}).output("y");
      return run(m, {makeF32(shape, x)})[0];
    };
    const std::vector<float> sq(c.begin(), c.begin() + 9);  // [3, 3]
    checkClose(one("ii->i", {3, 3}, sq), {3}, {sq[0], sq[4], sq[8]});
    checkClose(one("ii", {3, 3}, sq), {}, {sq[0] + sq[4] + sq[8]});
    std::vector<float> dij, dj(2, 0.f);
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 2; ++j) {
        dij.push_back(c[(i * 3 + i) * 2 + j]);
        dj[j] += c[(i * 3 + i) * 2 + j];
      }
    checkClose(one("iij->ij", {3, 3, 2}, c), {3, 2}, dij);
    checkClose(one("iij->j", {3, 3, 2}, c), {2}, dj);
    checkClose(one("jii->ji", {2, 3, 3}, c), {2, 3}, {c[0], c[4], c[8], c[9], c[13], c[17]});
    checkClose(one("...ii->...i", {2, 3, 3}, c), {2, 3}, {c[0], c[4], c[8], c[9], c[13], c[17]});
    const auto cube = randomValues(8, 14);  // [2, 2, 2]
    checkClose(one("iii->i", {2, 2, 2}, cube), {2}, {cube[0], cube[7]});
  }
  // An outer product keeps every letter.
  const auto outer = run(einsum("ij,kl->ijkl", 2), {makeF32({2, 3}, a), makeF32({3, 4}, b)});
  REQUIRE(outer[0].shape() == kiln::ir::Shape{2, 3, 3, 4});
  CHECK(floats(outer[0])[1 * 36 + 2 * 12 + 1 * 4 + 3] == Approx(a[5] * b[7]));
}
