// kiln's JSON graph format: bitwise round trips of graphs and attributes, the documented
// example, and every kind of bad file with the message a user would see.
#include "frontends/json/graph_json.h"

#include <catch2/catch.hpp>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>

#include "frontends/test_files.h"
#include "ir/verifier.h"

using Catch::Matchers::Contains;
using kiln::ErrorCode;
using kiln::Status;
using kiln::frontends::decodeAttribute;
using kiln::frontends::encodeAttribute;
using kiln::frontends::loadGraphJson;
using kiln::frontends::saveGraphJson;
using kiln::frontends::TensorMap;
using kiln::frontends::writeSafetensors;
using kiln::ir::AttrKind;
using kiln::ir::AttrMap;
using kiln::ir::AttrValue;
using kiln::ir::DType;
using kiln::ir::Graph;
using kiln::ir::Layout;
using kiln::ir::OpKind;
using kiln::ir::TensorType;
using kiln::ir::Value;
using kiln::test::errorOf;
using kiln::test::randomTensor;
using kiln::test::readBytes;
using kiln::test::TempDir;
using kiln::test::writeBytes;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool sameBits(double a, double b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

bool sameAttr(const AttrValue& a, const AttrValue& b) {
  if (a.index() != b.index()) return false;
  switch (kiln::ir::kindOf(a)) {
    case AttrKind::kFloat:
      return sameBits(std::get<double>(a), std::get<double>(b));
    case AttrKind::kFloats: {
      const auto& x = std::get<std::vector<double>>(a);
      const auto& y = std::get<std::vector<double>>(b);
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!sameBits(x[i], y[i])) return false;
      return true;
    }
    case AttrKind::kTensor:
      return std::get<kiln::ir::TensorData>(a).bitwiseEqual(std::get<kiln::ir::TensorData>(b));
    default:
      return a == b;
  }
}

// Structure, names, types, attributes and weights, compared bit for bit.
void requireSameGraph(const Graph& a, const Graph& b) {
  CHECK(a.name() == b.name());
  auto sameValues = [](const std::vector<Value*>& x, const std::vector<Value*>& y) {
    REQUIRE(x.size() == y.size());
    for (size_t i = 0; i < x.size(); ++i) {
      INFO("value " << x[i]->name());
      CHECK(x[i]->name() == y[i]->name());
      CHECK(x[i]->type() == y[i]->type());
    }
  };
  sameValues(a.inputs(), b.inputs());
  sameValues(a.parameters(), b.parameters());
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    INFO("parameter " << a.parameters()[i]->name());
    CHECK(a.parameters()[i]->trainable() == b.parameters()[i]->trainable());
    CHECK(a.parameters()[i]->data().bitwiseEqual(b.parameters()[i]->data()));
  }
  const auto na = a.nodes(), nb = b.nodes();
  REQUIRE(na.size() == nb.size());
  for (size_t i = 0; i < na.size(); ++i) {
    INFO("node " << i << " " << na[i]->describe());
    CHECK(na[i]->op() == nb[i]->op());
    CHECK(na[i]->name() == nb[i]->name());
    sameValues(na[i]->inputs(), nb[i]->inputs());
    sameValues(na[i]->outputs(), nb[i]->outputs());
    REQUIRE(na[i]->attrs().size() == nb[i]->attrs().size());
    for (const auto& [name, value] : na[i]->attrs()) {
      INFO("attribute " << name);
      REQUIRE(nb[i]->attrs().count(name));
      CHECK(sameAttr(value, nb[i]->attrs().at(name)));
    }
  }
  sameValues(a.outputs(), b.outputs());
}

// A graph with every dtype among its parameters, trainable and non-trainable parameters,
// layouts, and int, float (non-finite and denormal included), string and ints attributes.
Graph buildGraph() {
  Graph g("round \"trip\" ü");
  uint64_t seed = 100;
  auto param = [&](const std::string& name, DType t, kiln::ir::Shape shape, bool trainable) {
    auto v = g.addParameter(name, randomTensor(t, std::move(shape), seed++), trainable);
    KILN_REQUIRE_OK(v);
    return *v;
  };
  auto node = [&](OpKind op, std::vector<Value*> in, AttrMap attrs, std::string out) {
    auto n = g.addNode(op, std::move(in), std::move(attrs), {std::move(out)});
    KILN_REQUIRE_OK(n);
    return (*n)->output();
  };
  Value* x = *g.addInput("x", {DType::kF32, {2, 3, 8, 8}, Layout::kNCHW});
  Value* indices = *g.addInput("indices", {DType::kI64, {3}, Layout::kPlain});
  Value* convW = param("conv.weight", DType::kF32, {4, 3, 3, 3}, true);
  Value* convB = param("conv.bias", DType::kF32, {4}, true);
  Value* scale = param("bn.scale", DType::kF32, {4}, true);
  Value* bias = param("bn.bias", DType::kF32, {4}, true);
  Value* mean = param("bn.running_mean", DType::kF32, {4}, false);
  Value* var = param("bn.running_var", DType::kF32, {4}, false);
  Value* fcW = param("fc/weight", DType::kF32, {10, 4}, true);
  Value* fcB = param("fc/bias", DType::kF32, {10}, true);
  // Buffers of every other dtype, 0-d and empty ones included.
  param("buf.f64", DType::kF64, {2, 2}, false);
  param("buf.f16", DType::kF16, {3}, false);
  param("buf.bf16", DType::kBF16, {3}, false);
  param("buf.i64", DType::kI64, {}, false);
  param("buf.i32", DType::kI32, {2}, false);
  param("buf.i8", DType::kI8, {5}, false);
  param("buf.u8", DType::kU8, {0}, false);
  param("buf.bool", DType::kBool, {4}, false);

  Value* conv = node(OpKind::kConv2d, {x, convW, convB},
                     {{"strides", std::vector<int64_t>{1, 1}},
                      {"pads", std::vector<int64_t>{1, 1, 1, 1}},
                      {"group", int64_t{1}}},
                     "conv");
  conv->producer()->setName("conv1");
  Value* bn = node(OpKind::kBatchNorm, {conv, scale, bias, mean, var}, {{"epsilon", 1e-3}}, "bn");
  // An output whose layout a pass chose.
  auto gelu = g.addNodeWithTypes(OpKind::kGelu, {bn}, {{"approximate", std::string("tanh")}},
                                 {{"act", TensorType{DType::kF32, {2, 4, 8, 8}, Layout::kNHWC}}});
  KILN_REQUIRE_OK(gelu);
  Value* clip = node(OpKind::kClip, {(*gelu)->output()}, {{"min", -kInf}, {"max", 6.0}}, "clip");
  Value* leaky = node(OpKind::kLeakyRelu, {clip}, {{"alpha", 0.1}}, "leaky");
  leaky->producer()->setName("leaky \"quoted\" ünïcode");
  Value* drop = node(OpKind::kDropout, {leaky}, {{"ratio", 4.9406564584124654e-324}}, "drop");
  Value* pool = node(OpKind::kGlobalAvgPool, {drop}, {}, "pool");
  Value* flat = node(OpKind::kFlatten, {pool}, {{"axis", int64_t{1}}}, "flat");
  Value* fc = node(OpKind::kLinear, {flat, fcW, fcB}, {}, "fc");
  Value* gathered = node(OpKind::kGather, {fc, indices}, {{"axis", int64_t{-1}}}, "gathered");
  Value* reshaped =
      node(OpKind::kReshape, {gathered}, {{"shape", std::vector<int64_t>{-1}}}, "reshaped");
  Value* probs = node(OpKind::kSoftmax, {fc}, {{"axis", int64_t{-1}}}, "probs");
  g.setOutputs({reshaped, probs, fcB});
  KILN_REQUIRE_OK(kiln::ir::verify(g));
  return g;
}

// A small valid graph file; the error tests below break one thing in it at a time.
const std::string kBase = R"({
  "format": "kiln-graph",
  "version": 1,
  "name": "tiny",
  "weights": "model.safetensors",
  "inputs": [
    {"name": "x", "dtype": "f32", "shape": [2, 3], "layout": "plain"}
  ],
  "parameters": [
    {"name": "w", "dtype": "f32", "shape": [4, 3], "trainable": true},
    {"name": "b", "dtype": "f32", "shape": [4], "trainable": false}
  ],
  "nodes": [
    {"op": "linear", "name": "fc", "inputs": ["x", "w", "b"],
     "outputs": [{"name": "y", "dtype": "f32", "shape": [2, 4]}]},
    {"op": "leaky_relu", "inputs": ["y"],
     "outputs": [{"name": "z", "dtype": "f32", "shape": [2, 4]}],
     "attributes": {"alpha": {"float": 0.2}}},
    {"op": "reshape", "inputs": ["z"],
     "outputs": [{"name": "r", "dtype": "f32", "shape": [8]}],
     "attributes": {"shape": {"ints": [-1]}}}
  ],
  "outputs": ["r"]
}
)";

TensorMap baseWeights() {
  return {{"w", randomTensor(DType::kF32, {4, 3}, 1)}, {"b", randomTensor(DType::kF32, {4}, 2)}};
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const size_t pos = text.find(from);
  INFO("replacing '" << from << "'");
  REQUIRE(pos != std::string::npos);
  return text.replace(pos, from.size(), to);
}

// Writes `json` and `weights` as model.json and model.safetensors and returns the load error.
Status loadError(const std::string& json, const TensorMap& weights = baseWeights()) {
  TempDir dir;
  const std::string path = dir.file("model.json");
  writeBytes(path, json);
  KILN_REQUIRE_OK(writeSafetensors(dir.file("model.safetensors"), weights));
  Status st = errorOf(loadGraphJson(path));
  CHECK_THAT(st.message(), Contains(path));
  return st;
}

}  // namespace

TEST_CASE("graph JSON round trip is bitwise", "[graph_json]") {
  TempDir dir;
  const Graph original = buildGraph();
  const std::string path = dir.file("model.json");
  KILN_REQUIRE_OK(saveGraphJson(original, path));
  CHECK(dir.list() == std::vector<std::string>{"model.json", "model.safetensors"});

  auto loaded = loadGraphJson(path);
  KILN_REQUIRE_OK(loaded);
  requireSameGraph(original, *loaded);

  // Saving the loaded graph reproduces both files byte for byte.
  TempDir again;
  KILN_REQUIRE_OK(saveGraphJson(*loaded, again.file("model.json")));
  CHECK(readBytes(again.file("model.json")) == readBytes(path));
  CHECK(readBytes(again.file("model.safetensors")) == readBytes(dir.file("model.safetensors")));

  // The weights file is plain safetensors, readable on its own.
  auto weights = kiln::frontends::readSafetensors(dir.file("model.safetensors"));
  KILN_REQUIRE_OK(weights);
  CHECK(weights->size() == original.parameters().size());
  CHECK(weights->at("bn.running_mean").bitwiseEqual(original.parameters()[4]->data()));
}

TEST_CASE("graph JSON text follows the documented layout", "[graph_json]") {
  TempDir dir;
  KILN_REQUIRE_OK(saveGraphJson(buildGraph(), dir.file("net.json")));
  const std::string text = readBytes(dir.file("net.json"));
  CHECK(text.starts_with("{\n  \"format\": \"kiln-graph\",\n  \"version\": 1,\n"));
  CHECK_THAT(text, Contains("\"weights\": \"net.safetensors\""));
  CHECK_THAT(text, Contains("\"name\": \"round \\\"trip\\\" ü\""));
  CHECK_THAT(text, Contains(R"({"name":"x","dtype":"f32","shape":[2,3,8,8],"layout":"nchw"})"));
  CHECK_THAT(text, Contains(R"({"name":"bn.running_mean","dtype":"f32","shape":[4],)"
                            R"("layout":"plain","trainable":false})"));
  CHECK_THAT(text, Contains(R"({"op":"conv2d","name":"conv1","inputs":["x","conv.weight",)"
                            R"("conv.bias"],"outputs":[{"name":"conv","dtype":"f32",)"
                            R"("shape":[2,4,8,8],"layout":"nchw"}],"attributes":{"group":)"
                            R"({"int":1},"pads":{"ints":[1,1,1,1]},"strides":{"ints":[1,1]}}})"));
  CHECK_THAT(text, Contains(R"("attributes":{"max":{"float":6.0},"min":{"float":"-inf"}})"));
  CHECK_THAT(text, Contains(R"("attributes":{"approximate":{"string":"tanh"}})"));
  CHECK_THAT(text, Contains(R"("layout":"nhwc")"));
  CHECK_THAT(text,
             Contains("\"outputs\": [\n    \"reshaped\",\n    \"probs\",\n    \"fc/bias\"\n  ]"));
  CHECK(dir.list() == std::vector<std::string>{"net.json", "net.safetensors"});
}

TEST_CASE("attribute encoding round trips every kind bitwise", "[graph_json]") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<AttrValue> values = {
      AttrValue(int64_t{0}),
      AttrValue(std::numeric_limits<int64_t>::min()),
      AttrValue(std::numeric_limits<int64_t>::max()),
      AttrValue(0.1),
      AttrValue(-0.0),
      AttrValue(4.9406564584124654e-324),
      AttrValue(std::numeric_limits<double>::max()),
      AttrValue(kInf),
      AttrValue(-kInf),
      AttrValue(nan),
      AttrValue(std::string("")),
      AttrValue(std::string("tanh \"q\" \\ ü\n")),
      AttrValue(std::vector<int64_t>{}),
      AttrValue(std::vector<int64_t>{-1, 0, 3}),
      AttrValue(std::vector<double>{}),
      AttrValue(std::vector<double>{1.0 / 3, -kInf, kInf, nan, -0.0, 1e308}),
      AttrValue(randomTensor(DType::kF32, {2, 2}, 7)),
      AttrValue(randomTensor(DType::kBF16, {}, 8)),
      AttrValue(randomTensor(DType::kI8, {0}, 9)),
  };
  for (size_t i = 0; i < values.size(); ++i) {
    INFO("value " << i << " kind " << kiln::ir::attrKindName(kiln::ir::kindOf(values[i])));
    TensorMap weights;
    auto json = encodeAttribute(values[i], "@attr/0/v" + std::to_string(i), weights);
    KILN_REQUIRE_OK(json);
    INFO(*json);
    CHECK(weights.size() == (kiln::ir::kindOf(values[i]) == AttrKind::kTensor ? 1u : 0u));
    auto decoded = decodeAttribute(*json, weights);
    KILN_REQUIRE_OK(decoded);
    CHECK(sameAttr(values[i], *decoded));
  }
  TensorMap weights;
  CHECK(*encodeAttribute(AttrValue(-kInf), "", weights) == R"({"float":"-inf"})");
  CHECK(*encodeAttribute(AttrValue(std::vector<int64_t>{1, 1}), "", weights) ==
        R"({"ints":[1,1]})");
  CHECK(*encodeAttribute(AttrValue(randomTensor(DType::kF32, {1}, 1)), "@attr/3/value", weights) ==
        R"({"tensor":"@attr/3/value"})");
  // Integers are accepted where floats are expected, as a hand-written file would have them.
  CHECK(std::get<double>(*decodeAttribute(R"({"float": 2})", weights)) == 2.0);

  CHECK_THAT(errorOf(decodeAttribute(R"({"tensor": "@attr/9/x"})", weights)).message(),
             Contains("the weights file has no tensor '@attr/9/x'"));
  CHECK_THAT(errorOf(decodeAttribute(R"({"tensor": "w"})", weights)).message(),
             Contains("starting with '@attr/'"));
  CHECK_THAT(errorOf(decodeAttribute(R"({"list": [1]})", weights)).message(),
             Contains("unknown kind 'list'"));
  CHECK_THAT(errorOf(decodeAttribute(R"({"int": 1, "float": 1.0})", weights)).message(),
             Contains("one key naming its kind"));
  CHECK_THAT(errorOf(decodeAttribute(R"({"int": 1.5})", weights)).message(),
             Contains("must be an integer, got 1.5"));
  CHECK_THAT(errorOf(decodeAttribute(R"({"int": 9223372036854775808})", weights)).message(),
             Contains("does not fit in a 64-bit integer"));
  CHECK_THAT(errorOf(decodeAttribute(R"({"floats": [1, "infinity"]})", weights)).message(),
             Contains("must be a number (or \"inf\""));
  CHECK_THAT(errorOf(decodeAttribute(R"({"ints": 3})", weights)).message(),
             Contains("must be an array of integers, got 3"));
  CHECK_THAT(errorOf(decodeAttribute(R"({"string": 3})", weights)).message(),
             Contains("must be a string"));
  CHECK_THAT(
      errorOf(encodeAttribute(AttrValue(kiln::ir::TensorData()), "@attr/0/a", weights)).message(),
      Contains("no data"));
}

TEST_CASE("the example in docs/graph-format.md loads", "[graph_json]") {
  // Found from the test data directory (an absolute path CMake passes in).
  const auto docPath =
      (std::filesystem::path(KILN_TEST_DATA_DIR) / "../../docs/graph-format.md").lexically_normal();
  const std::string doc = readBytes(docPath.string());
  const size_t begin = doc.find("```json\n");
  REQUIRE(begin != std::string::npos);
  const size_t end = doc.find("```", begin + 8);
  REQUIRE(end != std::string::npos);
  TempDir dir;
  writeBytes(dir.file("model.json"), doc.substr(begin + 8, end - begin - 8));
  KILN_REQUIRE_OK(writeSafetensors(dir.file("model.safetensors"), baseWeights()));
  auto g = loadGraphJson(dir.file("model.json"));
  KILN_REQUIRE_OK(g);
  CHECK(g->numNodes() == 3);
  CHECK(g->outputs().at(0)->type().toString() == "f32[8]");
}

TEST_CASE("graph JSON: the base file of the error tests is valid", "[graph_json]") {
  TempDir dir;
  writeBytes(dir.file("model.json"), kBase);
  KILN_REQUIRE_OK(writeSafetensors(dir.file("model.safetensors"), baseWeights()));
  auto g = loadGraphJson(dir.file("model.json"));
  KILN_REQUIRE_OK(g);
  CHECK(g->parameters().at(0)->trainable());
  CHECK_FALSE(g->parameters().at(1)->trainable());
  CHECK(g->nodes().at(0)->name() == "fc");
  CHECK(g->nodes().at(1)->attr().getFloat("alpha") == 0.2);
  CHECK(g->parameters().at(0)->data().bitwiseEqual(baseWeights().at("w")));
}

TEST_CASE("graph JSON: invalid and truncated JSON", "[graph_json]") {
  CHECK_THAT(loadError(replaced(kBase, "\"version\": 1,", "\"version\": 1")).message(),
             Contains("invalid JSON: parse error at line 4"));
  CHECK_THAT(loadError("").message(), Contains("invalid JSON"));
  CHECK_THAT(loadError("[1, 2]").message(), Contains("must be a JSON object"));
  CHECK_THAT(
      loadError(replaced(kBase, "\"name\": \"tiny\",", "\"name\": \"tiny\", \"name\": \"t\","))
          .message(),
      Contains("the key 'name' appears twice"));

  TempDir dir;
  const std::string path = dir.file("model.json");
  KILN_REQUIRE_OK(writeSafetensors(dir.file("model.safetensors"), baseWeights()));
  const size_t complete = kBase.rfind('}') + 1;
  for (size_t n = 0; n < complete; ++n) {
    INFO("truncated to " << n << " bytes");
    writeBytes(path, kBase.substr(0, n));
    Status st = errorOf(loadGraphJson(path));
    CHECK(st.code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(st.message(), Contains(path) && Contains("invalid JSON"));
  }
}

TEST_CASE("graph JSON: extreme numbers anywhere are an error or a valid load, never a crash",
          "[graph_json]") {
  TempDir dir;
  const std::string path = dir.file("model.json");
  KILN_REQUIRE_OK(writeSafetensors(dir.file("model.safetensors"), baseWeights()));
  const std::vector<std::string> extremes = {"0",          "-1",  "-9223372036854775808",
                                             "1e308",      "0.5", "18446744073709551616",
                                             "4294967296", "null"};
  int loads = 0;
  for (size_t pos = 0; pos < kBase.size(); ++pos) {
    const bool startsNumber =
        pos > 0 && (std::isdigit(static_cast<unsigned char>(kBase[pos])) || kBase[pos] == '-') &&
        !std::isalnum(static_cast<unsigned char>(kBase[pos - 1])) && kBase[pos - 1] != '-' &&
        kBase[pos - 1] != '_';
    if (!startsNumber) continue;
    size_t end = pos + 1;
    while (end < kBase.size() && std::isdigit(static_cast<unsigned char>(kBase[end]))) ++end;
    if (end < kBase.size() && kBase[end] == '.')
      for (++end; std::isdigit(static_cast<unsigned char>(kBase[end]));) ++end;
    for (const std::string& e : extremes) {
      std::string text = kBase;
      text.replace(pos, end - pos, e);
      INFO(text);
      writeBytes(path, text);
      auto g = loadGraphJson(path);
      ++loads;
      if (!g) CHECK_THAT(g.status().message(), Contains(path));
    }
  }
  CHECK(loads > 100);
}

TEST_CASE("graph JSON: deeply nested values are an error, never a stack overflow", "[graph_json]") {
  const size_t depth = 1'000'000;
  const std::string nested = std::string(depth, '[') + std::string(depth, ']');
  CHECK_THAT(loadError(replaced(kBase, "\"shape\": [2, 3]", "\"shape\": " + nested)).message(),
             Contains("input 0 ('x'): \"shape\" must be an array of non-negative integers, got "
                      "an array at position 0"));
  CHECK_THAT(
      loadError(replaced(kBase, "{\"float\": 0.2}", "{\"floats\": " + nested + "}")).message(),
      Contains("attribute 'alpha' must be float, got floats"));
  CHECK_THAT(loadError(replaced(kBase, "\"outputs\": [\"r\"]", "\"outputs\": " + nested)).message(),
             Contains("graph output 0: must be a value name, got an array"));
  CHECK_THAT(loadError(std::string(depth, '{')).message(), Contains("invalid JSON"));
}

TEST_CASE("graph JSON: format, version and top-level keys", "[graph_json]") {
  CHECK_THAT(loadError(replaced(kBase, "\"kiln-graph\"", "\"onnx\"")).message(),
             Contains("not a kiln graph: \"format\" must be \"kiln-graph\", got \"onnx\""));
  Status version = loadError(replaced(kBase, "\"version\": 1", "\"version\": 2"));
  CHECK(version.code() == ErrorCode::kUnimplemented);
  CHECK_THAT(version.message(), Contains("unsupported kiln-graph version 2 (this kiln reads "
                                         "version 1)"));
  CHECK_THAT(loadError(replaced(kBase, "\"version\": 1", "\"version\": \"1\"")).message(),
             Contains("\"version\" must be an integer"));
  CHECK_THAT(loadError(replaced(kBase, "\"name\": \"tiny\"", "\"nmae\": \"tiny\"")).message(),
             Contains("unknown key 'nmae'"));
  CHECK_THAT(loadError(replaced(kBase, "\"name\": \"tiny\",", "")).message(),
             Contains("missing key 'name'"));
  CHECK_THAT(loadError(replaced(kBase, "\"outputs\": [\"r\"]", "\"outputs\": \"r\"")).message(),
             Contains("\"outputs\" must be an array of value names, got \"r\""));
  CHECK_THAT(loadError(replaced(kBase,
                                "\"inputs\": [\n    {\"name\": \"x\", \"dtype\": \"f32\", "
                                "\"shape\": [2, 3], \"layout\": \"plain\"}\n  ],",
                                "\"inputs\": {},"))
                 .message(),
             Contains("\"inputs\" must be an array, got an object"));
  CHECK_THAT(loadError(replaced(kBase, "\"outputs\": [\"r\"]", "\"outputs\": []")).message(),
             Contains("\"outputs\" is empty"));
  CHECK_THAT(loadError(replaced(kBase, "\"outputs\": [\"r\"]", "\"outputs\": [\"q\"]")).message(),
             Contains("graph output 0: 'q' is not defined"));
}

TEST_CASE("graph JSON: ops and attributes", "[graph_json]") {
  SECTION("unknown op, with suggestions") {
    Status st = loadError(replaced(kBase, "\"op\": \"linear\"", "\"op\": \"linaer\""));
    CHECK_THAT(st.message(),
               Contains("node 0: unknown op 'linaer'") && Contains("closest known ops: linear"));
  }
  SECTION("wrong attribute kind") {
    Status st = loadError(replaced(kBase, "{\"float\": 0.2}", "{\"int\": 1}"));
    CHECK_THAT(st.message(),
               Contains("node 1 (leaky_relu): attribute 'alpha' must be float, got int"));
    st = loadError(replaced(kBase, "{\"float\": 0.2}", "{\"tensor\": \"@attr/1/alpha\"}"));
    CHECK_THAT(st.message(), Contains("attribute 'alpha' must be float, got tensor"));
    st = loadError(replaced(kBase, "{\"ints\": [-1]}", "{\"ints\": -1}"));
    CHECK_THAT(st.message(), Contains("node 2 (reshape): attribute 'shape' (ints) must be an "
                                      "array of integers, got -1"));
    st = loadError(replaced(kBase, "{\"float\": 0.2}", "0.2"));
    CHECK_THAT(st.message(), Contains("attribute 'alpha' must be an object with one key"));
  }
  SECTION("unknown and missing attributes") {
    Status st = loadError(replaced(kBase, "\"alpha\"", "\"alfa\""));
    CHECK_THAT(st.message(), Contains("leaky_relu has no attribute 'alfa' (it takes: alpha)"));
    st = loadError(
        replaced(kBase, "\"attributes\": {\"shape\": {\"ints\": [-1]}}", "\"attributes\": {}"));
    CHECK_THAT(st.message(),
               Contains("node 2 (reshape): missing required attribute 'shape' (ints)"));
  }
  SECTION("arity and outputs") {
    Status st = loadError(replaced(kBase, "\"inputs\": [\"y\"]", "\"inputs\": [\"y\", \"y\"]"));
    CHECK_THAT(st.message(), Contains("node 1 (leaky_relu): leaky_relu takes 1 input, got 2"));
    st = loadError(replaced(kBase,
                            "\"outputs\": [{\"name\": \"z\", \"dtype\": \"f32\", "
                            "\"shape\": [2, 4]}]",
                            "\"outputs\": []"));
    CHECK_THAT(st.message(), Contains("declares 0 outputs but leaky_relu produces 1"));
    st = loadError(replaced(kBase, "\"op\": \"linear\",", "\"op\": \"linear\", \"extra\": 1,"));
    CHECK_THAT(st.message(), Contains("node 0 (linear 'fc'): unknown key 'extra'"));
  }
  SECTION("attribute values that inference rejects") {
    Status st = loadError(replaced(kBase, "{\"ints\": [-1]}", "{\"ints\": [3]}"));
    CHECK_THAT(st.message(), Contains("node 2 (reshape)") && Contains("cannot reshape"));
  }
}

TEST_CASE("graph JSON: values, types and names", "[graph_json]") {
  CHECK_THAT(loadError(replaced(kBase, "\"dtype\": \"f32\", \"shape\": [2, 3]",
                                "\"dtype\": \"float32\", \"shape\": [2, 3]"))
                 .message(),
             Contains("input 0 ('x'): unknown dtype \"float32\" (expected one of f32, f64"));
  CHECK_THAT(loadError(replaced(kBase, "\"layout\": \"plain\"", "\"layout\": \"nwhc\"")).message(),
             Contains("unknown layout \"nwhc\" (expected plain, nchw or nhwc)"));
  CHECK_THAT(loadError(replaced(kBase, "\"shape\": [2, 3]", "\"shape\": [2, -3]")).message(),
             Contains("\"shape\" must be an array of non-negative integers, got -3 at position 1"));
  CHECK_THAT(loadError(replaced(kBase, "\"shape\": [2, 3]", "\"shape\": [4294967296, 4294967296]"))
                 .message(),
             Contains("is too large"));
  CHECK_THAT(loadError(replaced(kBase, "\"inputs\": [\"y\"]", "\"inputs\": [\"nope\"]")).message(),
             Contains("node 1 (leaky_relu): input 0 'nope' is not defined"));
  CHECK_THAT(loadError(replaced(kBase, "\"inputs\": [\"z\"]", "\"inputs\": [\"r\"]")).message(),
             Contains("input 0 'r' is not defined"));  // Defined only later.
  CHECK_THAT(loadError(replaced(kBase, "{\"name\": \"z\"", "{\"name\": \"x\"")).message(),
             Contains("node 1 (leaky_relu): output 0: value name 'x' is already defined by "
                      "graph input 'x'"));
  CHECK_THAT(loadError(replaced(kBase, "{\"name\": \"b\"", "{\"name\": \"w\"")).message(),
             Contains("parameter 1 ('w'): value name 'w' is already defined by parameter 'w'"));
  CHECK_THAT(loadError(replaced(kBase, "{\"name\": \"z\"", "{\"name\": \"y\"")).message(),
             Contains("already defined by an output of node 'fc' (linear -> %y)"));
  CHECK_THAT(loadError(replaced(kBase, "{\"name\": \"x\"", "{\"name\": \"a b\"")).message(),
             Contains("invalid value name 'a b'"));
  CHECK_THAT(loadError(replaced(kBase, "\"trainable\": true", "\"trainable\": 1")).message(),
             Contains("parameter 0 ('w'): \"trainable\" must be true or false, got 1"));
  // The input's shape does not fit the weight: the first node reports it.
  CHECK_THAT(
      loadError(replaced(kBase, "\"shape\": [2, 3], \"layout\"", "\"shape\": [2, 5], \"layout\""))
          .message(),
      Contains("node 0 (linear 'fc')") && Contains("weight must have shape [out,5]"));
  // A declared output type that shape inference contradicts.
  CHECK_THAT(loadError(replaced(kBase, "\"shape\": [2, 4]}]},", "\"shape\": [2, 5]}]},")).message(),
             Contains("node 0 (linear 'fc'): output 0: 'y' is declared f32[2,5] but linear "
                      "produces f32[2,4] from inputs x: f32[2,3], w: f32[4,3], b: f32[4]"));
  CHECK_THAT(loadError(replaced(kBase, "\"shape\": [2, 4]}]},",
                                "\"shape\": [2, 4], "
                                "\"dtype\": \"f64\"}]},"))
                 .message(),
             Contains("appears twice"));
}

TEST_CASE("graph JSON: the weights file", "[graph_json]") {
  SECTION("missing weights file names the expected path") {
    TempDir dir;
    writeBytes(dir.file("model.json"), kBase);
    Status st = errorOf(loadGraphJson(dir.file("model.json")));
    CHECK(st.code() == ErrorCode::kNotFound);
    CHECK_THAT(st.message(), Contains(dir.file("model.json") + ": the weights file '" +
                                      dir.file("model.safetensors") + "' does not exist"));
  }
  SECTION("a weights path outside the JSON file's directory") {
    CHECK_THAT(
        loadError(replaced(kBase, "\"model.safetensors\"", "\"../model.safetensors\"")).message(),
        Contains("must stay inside the JSON file's directory (no '..')"));
    CHECK_THAT(
        loadError(replaced(kBase, "\"model.safetensors\"", "\"/tmp/model.safetensors\"")).message(),
        Contains("must be relative"));
  }
  SECTION("a parameter missing from the weights file") {
    TensorMap w = baseWeights();
    w.erase("b");
    CHECK_THAT(loadError(kBase, w).message(),
               Contains("parameter 1 ('b'): the weights file '") && Contains("has no tensor 'b'"));
  }
  SECTION("declared shape or dtype differs from the weights") {
    CHECK_THAT(loadError(replaced(kBase, "\"shape\": [4, 3]", "\"shape\": [3, 4]")).message(),
               Contains("parameter 0 ('w'): declared f32[3,4] but the weights file '") &&
                   Contains("holds f32[4,3]"));
    TensorMap w = baseWeights();
    w["b"] = randomTensor(DType::kF64, {4}, 3);
    CHECK_THAT(loadError(kBase, w).message(),
               Contains("parameter 1 ('b'): declared f32[4] but") && Contains("holds f64[4]"));
  }
  SECTION("a tensor the graph does not use") {
    TensorMap w = baseWeights();
    w["stray"] = randomTensor(DType::kF32, {1}, 3);
    CHECK_THAT(loadError(kBase, w).message(),
               Contains("holds tensor 'stray', which is neither a parameter nor a tensor "
                        "attribute"));
  }
  SECTION("a corrupt weights file names both files") {
    TempDir dir;
    writeBytes(dir.file("model.json"), kBase);
    writeBytes(dir.file("model.safetensors"), "garbage");
    Status st = errorOf(loadGraphJson(dir.file("model.json")));
    CHECK_THAT(st.message(), Contains(dir.file("model.json") + ": reading its weights") &&
                                 Contains(dir.file("model.safetensors")));
  }
  SECTION("weights path must be relative") {
    CHECK_THAT(
        loadError(replaced(kBase, "\"model.safetensors\"", "\"/tmp/model.safetensors\"")).message(),
        Contains("must be relative to the JSON file's directory"));
  }
  SECTION("a weights symlink out of the JSON file's directory is refused, one inside followed") {
    TempDir dir, other;
    KILN_REQUIRE_OK(writeSafetensors(other.file("x.st"), baseWeights()));
    std::filesystem::create_symlink(other.file("x.st"), dir.file("link.st"));
    writeBytes(dir.file("model.json"), replaced(kBase, "\"model.safetensors\"", "\"link.st\""));
    Status st = errorOf(loadGraphJson(dir.file("model.json")));
    CHECK(st.isUserError());
    CHECK_THAT(st.message(), Contains("outside the JSON file's directory") && Contains("link.st"));
    std::filesystem::create_symlink("/etc/passwd", dir.file("passwd"));
    writeBytes(dir.file("model.json"), replaced(kBase, "\"model.safetensors\"", "\"passwd\""));
    CHECK_THAT(errorOf(loadGraphJson(dir.file("model.json"))).message(),
               Contains("outside the JSON file's directory"));
    KILN_REQUIRE_OK(writeSafetensors(dir.file("real.st"), baseWeights()));
    std::filesystem::create_symlink("real.st", dir.file("alias.st"));
    writeBytes(dir.file("model.json"), replaced(kBase, "\"model.safetensors\"", "\"alias.st\""));
    KILN_REQUIRE_OK(loadGraphJson(dir.file("model.json")));
  }
  SECTION("weights in a subdirectory") {
    TempDir dir;
    std::filesystem::create_directory(dir.file("w"));
    writeBytes(dir.file("model.json"), replaced(kBase, "\"model.safetensors\"", "\"w/x.st\""));
    KILN_REQUIRE_OK(writeSafetensors(dir.file("w/x.st"), baseWeights()));
    KILN_REQUIRE_OK(loadGraphJson(dir.file("model.json")));
  }
}

TEST_CASE("graph JSON: a file that does not exist", "[graph_json]") {
  TempDir dir;
  Status st = errorOf(loadGraphJson(dir.file("none.json")));
  CHECK(st.code() == ErrorCode::kNotFound);
  CHECK_THAT(st.message(), Contains(dir.file("none.json")) && Contains("does not exist"));
  CHECK_THAT(errorOf(loadGraphJson(dir.path())).message(), Contains("is a directory"));
}

TEST_CASE("graph JSON: failed saves leave no output behind", "[graph_json]") {
  TempDir dir;
  const Graph g = buildGraph();
  SECTION("a directory that does not exist") {
    Status st = saveGraphJson(g, dir.file("missing/model.json"));
    REQUIRE_FALSE(st.isOk());
    CHECK_THAT(st.message(), Contains("does not exist"));
    CHECK(dir.list().empty());
  }
  SECTION("the JSON target is a directory: the weights temporary is removed") {
    std::filesystem::create_directory(dir.file("model.json"));
    Status st = saveGraphJson(g, dir.file("model.json"));
    REQUIRE_FALSE(st.isOk());
    CHECK_THAT(st.message(), Contains("is a directory"));
    CHECK(dir.list() == std::vector<std::string>{"model.json"});
  }
  SECTION("a failed save keeps the previous files intact") {
    KILN_REQUIRE_OK(saveGraphJson(g, dir.file("model.json")));
    const std::string json = readBytes(dir.file("model.json"));
    Graph other("other");
    Value* x = *other.addInput("x", {DType::kF32, {2}, Layout::kPlain});
    auto p = other.addParameter("p", TensorType{DType::kF32, {2}, Layout::kPlain}, true);
    KILN_REQUIRE_OK(p);
    auto n = other.addNode(OpKind::kAdd, {x, *p});
    KILN_REQUIRE_OK(n);
    other.setOutputs({(*n)->output()});
    Status st = saveGraphJson(other, dir.file("model.json"));
    CHECK_THAT(st.message(), Contains("parameter 'p' has no data"));
    CHECK(readBytes(dir.file("model.json")) == json);
    CHECK(dir.list() == std::vector<std::string>{"model.json", "model.safetensors"});
  }
  SECTION("an invalid graph or file name") {
    Graph noOutputs("empty");
    (void)noOutputs.addInput("x", {DType::kF32, {2}, Layout::kPlain});
    CHECK_THAT(saveGraphJson(noOutputs, dir.file("model.json")).message(),
               Contains("has no outputs"));
    CHECK_THAT(saveGraphJson(g, dir.file("model.txt")).message(), Contains("must end in .json"));
    CHECK(dir.list().empty());
  }
  SECTION("a node name that is not UTF-8") {
    Graph bad("bad");
    Value* x = *bad.addInput("x", {DType::kF32, {2}, Layout::kPlain});
    auto n = bad.addNode(OpKind::kRelu, {x});
    KILN_REQUIRE_OK(n);
    (*n)->setName("bad \xff name");
    bad.setOutputs({(*n)->output()});
    CHECK_THAT(saveGraphJson(bad, dir.file("model.json")).message(), Contains("not valid UTF-8"));
    CHECK(dir.list().empty());
  }
}

TEST_CASE("graph JSON: symbolic dim names of inputs round-trip; malformed ones are errors",
          "[graph_json]") {
  Graph g("sym");
  auto x = g.addInput("x", {DType::kF32, {2, 3}});
  KILN_REQUIRE_OK(x);
  KILN_REQUIRE_OK(g.setDimNames(*x, {"batch", ""}));
  auto y = g.addNode(OpKind::kRelu, {*x});
  KILN_REQUIRE_OK(y);
  g.setOutputs({(*y)->output()});
  TempDir dir;
  const std::string path = dir.file("model.json");
  KILN_REQUIRE_OK(saveGraphJson(g, path));
  const std::string text = readBytes(path);
  CHECK_THAT(text, Contains("\"dim_names\":[\"batch\",\"\"]"));
  auto loaded = loadGraphJson(path);
  KILN_REQUIRE_OK(loaded);
  CHECK(loaded->inputs()[0]->dimNames() == std::vector<std::string>{"batch", ""});

  auto withNames = [&](const std::string& names) {
    std::string bad = text;
    const std::string from = "[\"batch\",\"\"]";
    bad.replace(bad.find(from), from.size(), names);
    writeBytes(path, bad);
    auto r = loadGraphJson(path);
    REQUIRE_FALSE(r.hasValue());
    return r.status().message();
  };
  CHECK_THAT(withNames("[1,\"\"]"), Contains("\"dim_names\" must be an array of strings"));
  CHECK_THAT(withNames("[\"batch\"]"), Contains("has rank 2 but 1 dim names"));
  CHECK_THAT(withNames("[\"b-1\",\"\"]"), Contains("'b-1' is not an identifier"));
}

TEST_CASE("graph JSON: persistent state parameters round-trip; a malformed flag is an error",
          "[graph_json]") {
  const std::string stateful =
      replaced(kBase, "{\"name\": \"b\", \"dtype\": \"f32\", \"shape\": [4], \"trainable\": false}",
               "{\"name\": \"b\", \"dtype\": \"f32\", \"shape\": [4], \"trainable\": false, "
               "\"state\": true}");
  TempDir dir;
  writeBytes(dir.file("model.json"), stateful);
  KILN_REQUIRE_OK(writeSafetensors(dir.file("model.safetensors"), baseWeights()));
  auto g = loadGraphJson(dir.file("model.json"));
  KILN_REQUIRE_OK(g);
  CHECK(g->findValue("b")->isState());
  TempDir again;
  KILN_REQUIRE_OK(saveGraphJson(*g, again.file("model.json")));
  CHECK_THAT(readBytes(again.file("model.json")), Contains("\"state\":true"));
  auto reloaded = loadGraphJson(again.file("model.json"));
  KILN_REQUIRE_OK(reloaded);
  CHECK(reloaded->findValue("b")->isState());
  CHECK_THAT(loadError(replaced(stateful, "\"state\": true", "\"state\": 1")).message(),
             Contains("\"state\" must be true or false"));
  CHECK_THAT(loadError(replaced(stateful, "\"trainable\": false, \"state\"",
                                "\"trainable\": true, \"state\""))
                 .message(),
             Contains("only a non-trainable parameter"));
}
