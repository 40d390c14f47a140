// The ONNX importer as a whole: files and external data, symbolic dims, the one error that lists
// every unsupported node, and malformed models (each an error, never a crash or a huge
// allocation).
#include <sys/stat.h>

#include <filesystem>

#include "frontends/test_files.h"
#include "frontends/test_onnx_model.h"
#include "ir/printer.h"

using namespace kiln::onnxtest;
using kiln::ErrorCode;
using kiln::Status;
using kiln::frontends::loadOnnx;
using kiln::frontends::loadOnnxFromBytes;
using kiln::frontends::needsStages;
using kiln::frontends::OnnxImportOptions;
using kiln::ir::OpKind;
using kiln::test::TempDir;
using kiln::test::writeBytes;

namespace {

// conv -> relu -> global pool -> flatten -> gemm: a small CNN with every kind of initializer.
Model smallCnn(const std::vector<Dim>& inputDims) {
  Model m;
  m.input("image", inputDims);
  m.init("conv.w", {4, 3, 3, 3}, randomValues(108, 1)).init("conv.b", {4}, randomValues(4, 2));
  m.init("fc.w", {5, 4}, randomValues(20, 3)).init("fc.b", {5}, randomValues(5, 4));
  m.node("Conv", {"image", "conv.w", "conv.b"}, {"c"}, {attrInts("pads", {1, 1, 1, 1})}, "conv");
  m.node("Relu", {"c"}, {"r"}, {}, "relu");
  m.node("GlobalAveragePool", {"r"}, {"p"}, {}, "pool");
  m.node("Flatten", {"p"}, {"f"}, {}, "flatten");
  m.node("Gemm", {"f", "fc.w", "fc.b"}, {"logits"}, {attrInt("transB", 1)}, "fc");
  m.output("logits", {inputDims[0], int64_t{5}});
  return m;
}

Status loadError(const std::string& path, const OnnxImportOptions& options = {}) {
  auto g = loadOnnx(path, options);
  REQUIRE_FALSE(g.hasValue());
  return g.status();
}

}  // namespace

TEST_CASE("onnx: a model file imports, runs, and keeps node names and weights") {
  TempDir dir;
  const std::string path = dir.file("cnn.onnx");
  writeBytes(path, smallCnn({int64_t{2}, int64_t{3}, int64_t{5}, int64_t{5}}).bytes());
  auto g = loadOnnx(path);
  INFO(g.status().message());
  REQUIRE(g.hasValue());
  CHECK(g->name() == "test");
  REQUIRE(g->inputs().size() == 1);
  CHECK(g->inputs()[0]->name() == "image");
  CHECK(g->inputs()[0]->type().shape == Shape{2, 3, 5, 5});
  CHECK(g->outputs()[0]->name() == "logits");
  CHECK(g->numTrainableParameters() == 108 + 4 + 20 + 5);
  bool named = false;
  for (const kiln::ir::Node* n : g->nodes()) named |= n->name() == "conv";
  CHECK(named);
  auto y = runGraph(*g, {makeF32({2, 3, 5, 5}, randomValues(150, 9))});
  CHECK(y[0].shape() == Shape{2, 5});
}

TEST_CASE("onnx: symbolic dims are specialized from the options") {
  const Model m = smallCnn({std::string("N"), int64_t{3}, std::string("H"), std::string("H")});
  SECTION("defaultBatch gives the first dim; dimValues the others") {
    OnnxImportOptions options;
    options.defaultBatch = 3;
    options.dimValues["H"] = 6;
    const kiln::ir::Graph g = import(m, options);
    CHECK(g.inputs()[0]->type().shape == Shape{3, 3, 6, 6});
    CHECK(g.outputs()[0]->type().shape == Shape{3, 5});
    // The symbolic dims stay named in the graph, for kiln::jit to specialize again.
    CHECK(g.inputs()[0]->dimNames() == std::vector<std::string>{"N", "", "H", "H"});
    CHECK_THAT(kiln::ir::printGraph(g), Catch::Contains("%image : f32[N=3,3,H=6,H=6]"));
  }
  SECTION("dim_params that are not identifiers are named after them") {
    const Model odd =
        smallCnn({std::string("batch size"), int64_t{3}, std::string("2h"), std::string("2h")});
    OnnxImportOptions options;
    options.dimValues = {{"batch size", 2}, {"2h", 5}};
    CHECK(import(odd, options).inputs()[0]->dimNames() ==
          std::vector<std::string>{"batch_size", "", "_2h", "_2h"});
  }
  SECTION("dimValues wins over defaultBatch") {
    OnnxImportOptions options;
    options.defaultBatch = 3;
    options.dimValues = {{"N", 1}, {"H", 4}};
    CHECK(import(m, options).inputs()[0]->type().shape == Shape{1, 3, 4, 4});
  }
  SECTION("an unset dim is an error naming every one and the fix") {
    const Status s = importError(m);
    CHECK(s.code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains("input 'image' dim 0 ('N')") &&
                                Catch::Contains("input 'image' dim 2 ('H')") &&
                                Catch::Contains("input 'image' dim 3 ('H')") &&
                                Catch::Contains("OnnxImportOptions::dimValues") &&
                                Catch::Contains("--batch"));
    OnnxImportOptions batchOnly;
    batchOnly.defaultBatch = 2;
    const Status t = importError(m, batchOnly);
    CHECK_THAT(t.message(), !Catch::Contains("dim 0") && Catch::Contains("dim 2 ('H')"));
  }
  SECTION("an unnamed unknown dim takes the batch only as the first dim") {
    Model u;
    u.input("x", {std::string(), int64_t{3}});
    u.proto()
        .mutable_graph()
        ->mutable_input(0)
        ->mutable_type()
        ->mutable_tensor_type()
        ->mutable_shape()
        ->mutable_dim(0)
        ->clear_dim_param();
    u.node("Relu", {"x"}, {"y"}).output("y");
    OnnxImportOptions options;
    options.defaultBatch = 4;
    CHECK(import(u, options).inputs()[0]->type().shape == Shape{4, 3});
    CHECK(import(u, options).inputs()[0]->dimNames() == std::vector<std::string>{"batch", ""});
    CHECK_THAT(importError(u).message(), Catch::Contains("input 'x' dim 0 (unnamed)"));
  }
  SECTION("negative option values are rejected") {
    OnnxImportOptions options;
    options.dimValues = {{"N", -1}, {"H", 4}};
    CHECK_THAT(importError(m, options).message(), Catch::Contains("must be >= 0"));
  }
}

TEST_CASE("onnx: one error lists every unsupported node, and no graph is returned") {
  Model m;
  m.opsetImport("custom.domain", 1);
  m.input("x", {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{4}});
  m.node("RandomNormalLike", {"x"}, {"e"}, {}, "random");
  m.node("Relu", {"e"}, {"after_erf"}, {}, "relu_after_erf");  // Unreachable: not listed.
  m.node("RandomUniformLike", {"x"}, {"u"}, {}, "uniform");
  m.node("MyOp", {"x"}, {"mine"}, {}, "custom", "custom.domain");
  m.node("Bernoulli", {"x"}, {"up"}, {}, "bernoulli");
  m.node("Relu", {"x"}, {"fine"}, {}, "supported");
  m.output("after_erf").output("u").output("mine", {int64_t{1}}).output("up").output("fine");
  const Status s = importError(m);
  CHECK(s.code() == ErrorCode::kUnimplemented);
  CHECK(s.isUserError());
  CHECK_THAT(s.message(), Catch::Contains("cannot import 4 nodes of 6"));
  CHECK_THAT(s.message(),
             Catch::Contains("RandomNormalLike (opset 17) node 'random': kiln has no mapping"));
  CHECK_THAT(s.message(), Catch::Contains("RandomUniformLike (opset 17) node 'uniform': kiln has "
                                          "no mapping for this op"));
  CHECK_THAT(s.message(), Catch::Contains("custom.domain.MyOp (opset 1) node 'custom'"));
  CHECK_THAT(s.message(), Catch::Contains("Bernoulli (opset 17) node 'bernoulli': kiln has no "
                                          "mapping for this op"));
  CHECK_THAT(s.message(), !Catch::Contains("relu_after_erf") && !Catch::Contains("'supported'"));
  CHECK_FALSE(needsStages(s));
}

TEST_CASE("onnx: an op kiln cannot map after a stage's end is listed before any stage runs") {
  Model m;
  m.input("x", {int64_t{2}, int64_t{3}});
  m.node("NonZero", {"x"}, {"nz"}, {}, "nonzero");
  m.node("Bernoulli", {"x"}, {"up"}, {}, "bernoulli");  // Independent of the cut.
  m.node("Relu", {"x"}, {"fine"}, {}, "supported");
  m.output("nz", kInt64).output("up").output("fine");
  const Status s = importError(m);
  CHECK(s.code() == ErrorCode::kUnimplemented);
  CHECK_THAT(s.message(), Catch::Contains("cannot import 2 nodes of 3"));
  CHECK_THAT(s.message(), Catch::Contains("NonZero (opset 17) node 'nonzero': the size of its "
                                          "output depends on the values of its input"));
  CHECK_THAT(s.message(), Catch::Contains("Bernoulli (opset 17) node 'bernoulli': kiln has no "
                                          "mapping for this op"));
  CHECK_FALSE(needsStages(s));  // Stages would run the prefix, then fail: the error comes first.
  // Without the unmappable node, the same model runs in stages.
  Model ok;
  ok.input("x", {int64_t{2}, int64_t{3}});
  ok.node("NonZero", {"x"}, {"nz"}, {}, "nonzero");
  ok.node("Relu", {"x"}, {"fine"}, {}, "supported");
  ok.output("nz", kInt64).output("fine");
  CHECK(needsStages(importError(ok)));
}

TEST_CASE("onnx: a value-sized op checks its input's type before a stage ends for it") {
  constexpr int32_t kFloat8E4M3FN = 17;  // ONNX 1.14+; libonnx 1.12's proto has no name for it.
  Model m(21);
  m.input("x", {int64_t{4}}, kFloat8E4M3FN);
  m.node("Unique", {"x"}, {"y"}, {}, "u");
  m.output("y", kFloat8E4M3FN);
  const Status s = importError(m);
  CHECK_FALSE(needsStages(s));  // Else the stages before it would run, then fail.
  CHECK(s.isUserError());
  CHECK_THAT(s.message(), Catch::Contains("Unique (opset 21) node 'u'") &&
                              Catch::Contains("must be a float, integer or bool tensor"));
}

TEST_CASE("onnx: external data is read relative to the model and checked against the file") {
  TempDir dir;
  const auto w = randomValues(6, 7);
  const std::string prefix(16, 'p');  // The weights sit at offset 16.
  writeBytes(dir.file("weights.bin"),
             prefix + std::string(reinterpret_cast<const char*>(w.data()), 24));
  auto model = [&](const std::string& location, const std::string& offset,
                   const std::string& length) {
    Model m;
    m.input("x", {int64_t{2}, int64_t{3}});
    ::onnx::TensorProto t;
    t.set_name("w");
    t.set_data_type(kFloat);
    t.add_dims(2);
    t.add_dims(3);
    t.set_data_location(::onnx::TensorProto::EXTERNAL);
    for (auto [k, v] : {std::pair<std::string, std::string>{"location", location},
                        {"offset", offset},
                        {"length", length}}) {
      if (v.empty()) continue;
      auto* e = t.add_external_data();
      e->set_key(k);
      e->set_value(v);
    }
    m.initializer(t).node("Add", {"x", "w"}, {"y"}).output("y");
    return m;
  };
  const std::string path = dir.file("model.onnx");
  SECTION("valid") {
    writeBytes(path, model("weights.bin", "16", "24").bytes());
    auto g = loadOnnx(path);
    INFO(g.status().message());
    REQUIRE(g.hasValue());
    checkClose(runGraph(*g, {makeF32({2, 3}, std::vector<float>(6, 0.f))})[0], {2, 3}, w);
  }
  SECTION("length past the end of the file") {
    writeBytes(path, model("weights.bin", "16", "4000").bytes());
    CHECK_THAT(loadError(path).message(), Catch::Contains("runs past the end"));
  }
  SECTION("offset past the end of the file") {
    writeBytes(path, model("weights.bin", "99999999999", "").bytes());
    CHECK_THAT(loadError(path).message(), Catch::Contains("lies past the end"));
  }
  SECTION("length that does not match the dims") {
    writeBytes(path, model("weights.bin", "0", "").bytes());  // 40 bytes to the end.
    CHECK_THAT(loadError(path).message(),
               Catch::Contains("holds 40 bytes") && Catch::Contains("need 24"));
  }
  SECTION("a location outside the model's directory") {
    writeBytes(path, model("../weights.bin", "", "").bytes());
    CHECK_THAT(loadError(path).message(), Catch::Contains("must stay inside"));
    writeBytes(path, model("/etc/passwd", "", "").bytes());
    CHECK_THAT(loadError(path).message(), Catch::Contains("must be relative"));
  }
  SECTION("symlinks: resolved, and refused when they leave the model's directory") {
    // Outside: a symlink in the model's directory to a file elsewhere (/etc/passwd in the
    // report that found it; here a file of the right size next to the directory).
    TempDir other;
    writeBytes(other.file("secret.bin"), std::string(24, 's'));
    std::filesystem::create_symlink(other.file("secret.bin"), dir.file("link.bin"));
    writeBytes(path, model("link.bin", "", "").bytes());
    Status st = loadError(path);
    CHECK(st.isUserError());
    CHECK_THAT(st.message(),
               Catch::Contains("outside the model's directory") && Catch::Contains("link.bin"));
    std::filesystem::create_symlink("/etc/passwd", dir.file("passwd"));
    writeBytes(path, model("passwd", "", "").bytes());
    CHECK_THAT(loadError(path).message(), Catch::Contains("outside the model's directory"));
    // A directory symlink out of the model's directory.
    std::filesystem::create_directory_symlink(other.path(), dir.file("sub"));
    writeBytes(path, model("sub/secret.bin", "", "").bytes());
    CHECK_THAT(loadError(path).message(), Catch::Contains("outside the model's directory"));
    // Inside: a symlink to a file in the same directory is followed.
    std::filesystem::create_symlink("weights.bin", dir.file("alias.bin"));
    writeBytes(path, model("alias.bin", "16", "24").bytes());
    auto g = loadOnnx(path);
    INFO(g.status().message());
    CHECK(g.hasValue());
  }
  SECTION("a FIFO, a directory") {
    REQUIRE(::mkfifo(dir.file("fifo.bin").c_str(), 0600) == 0);
    writeBytes(path, model("fifo.bin", "", "").bytes());
    CHECK_THAT(loadError(path).message(), Catch::Contains("not a regular file"));
    std::filesystem::create_directory(dir.file("d.bin"));
    writeBytes(path, model("d.bin", "", "").bytes());
    CHECK_THAT(loadError(path).message(), Catch::Contains("is a directory"));
  }
  SECTION("a missing file, a bad number") {
    writeBytes(path, model("nothere.bin", "", "").bytes());
    CHECK(loadError(path).code() == ErrorCode::kNotFound);
    writeBytes(path, model("weights.bin", "-5", "").bytes());
    CHECK_THAT(loadError(path).message(), Catch::Contains("offset '-5' is not a number"));
  }
  SECTION("from bytes without a directory") {
    auto g = loadOnnxFromBytes(model("weights.bin", "16", "24").bytes());
    REQUIRE_FALSE(g.hasValue());
    CHECK_THAT(g.status().message(), Catch::Contains("load it with loadOnnx(path)"));
  }
}

TEST_CASE("onnx: files that are not models are errors") {
  TempDir dir;
  CHECK(loadError(dir.file("missing.onnx")).code() == ErrorCode::kNotFound);
  CHECK_THAT(loadError(dir.path()).message(), Catch::Contains("is a directory"));
  const std::string path = dir.file("bad.onnx");
  writeBytes(path, "");
  CHECK_THAT(loadError(path).message(), Catch::Contains("has no graph"));
  writeBytes(path, "\x08\x07\x12\x04garbage bytes \xff\xff\xff\xff not a protobuf");
  CHECK_THAT(loadError(path).message(), Catch::Contains("is not an ONNX model"));
  std::string random(4096, '\0');
  std::mt19937 rng(5);
  for (char& c : random) c = static_cast<char>(rng());
  writeBytes(path, random);
  CHECK_FALSE(loadOnnx(path).hasValue());
}

TEST_CASE("onnx: a truncated model is an error at every cut") {
  const std::string bytes = smallCnn({int64_t{1}, int64_t{3}, int64_t{5}, int64_t{5}}).bytes();
  for (size_t cut : {size_t{1}, size_t{2}, size_t{7}, size_t{40}, bytes.size() / 3,
                     bytes.size() / 2, bytes.size() - 20, bytes.size() - 1}) {
    INFO("cut at " << cut << " of " << bytes.size());
    auto g = loadOnnxFromBytes(bytes.substr(0, cut));
    REQUIRE_FALSE(g.hasValue());
    CHECK(g.status().isUserError());
  }
}

TEST_CASE("onnx: malformed graphs are errors that say what is wrong") {
  auto base = [] {
    Model m;
    m.input("x", {int64_t{2}, int64_t{3}});
    return m;
  };
  SECTION("an attribute of the wrong type") {
    Model m = base();
    m.node("Flatten", {"x"}, {"y"}, {attrFloat("axis", 1.f)}).output("y");
    CHECK_THAT(importError(m).message(), Catch::Contains("ONNX checker rejects the model"));
  }
  SECTION("a negative input dim") {
    Model m = base();
    m.proto()
        .mutable_graph()
        ->mutable_input(0)
        ->mutable_type()
        ->mutable_tensor_type()
        ->mutable_shape()
        ->mutable_dim(1)
        ->set_dim_value(-3);
    m.node("Relu", {"x"}, {"y"}).output("y");
    CHECK_THAT(importError(m).message(), Catch::Contains("negative dim -3"));
  }
  SECTION("input dims too large for 64 bits") {
    Model m;
    m.input("x", {int64_t{1} << 40, int64_t{1} << 40}).node("Relu", {"x"}, {"y"}).output("y");
    CHECK_THAT(importError(m).message(), Catch::Contains("does not fit in 64 bits"));
  }
  SECTION("an initializer claiming huge dims with no data allocates nothing") {
    Model m = base();
    ::onnx::TensorProto t = floatTensor("w", {1, 3}, {1, 2, 3});
    t.set_dims(0, int64_t{1} << 40);
    m.initializer(t).node("Identity", {"w"}, {"y"}).output("y");
    const Status s = importError(m);
    CHECK(s.code() == ErrorCode::kInvalidArgument);
    CHECK_THAT(s.message(),
               Catch::Contains("12 bytes of raw_data") && Catch::Contains("need 13194139533312"));
    // (2^33 + 1)^2 elements: libonnx's element count wraps to a small positive number.
    t.set_dims(0, (int64_t{1} << 33) + 1);
    t.set_dims(1, (int64_t{1} << 33) + 1);
    Model n = base();
    n.initializer(t).node("Identity", {"w"}, {"y"}).output("y");
    CHECK_THAT(importError(n).message(), Catch::Contains("does not fit in 64 bits"));
  }
  SECTION("raw_data of the wrong size") {
    Model m = base();
    ::onnx::TensorProto t = floatTensor("w", {3}, {1, 2, 3});
    t.mutable_raw_data()->resize(7);
    m.initializer(t).node("Add", {"x", "w"}, {"y"}).output("y");
    CHECK_THAT(importError(m).message(),
               Catch::Contains("7 bytes of raw_data") && Catch::Contains("need 12"));
  }
  SECTION("typed data of the wrong count") {
    Model m = base();
    ::onnx::TensorProto t = floatTensor("w", {3}, {1, 2}, false);
    m.initializer(t).node("Add", {"x", "w"}, {"y"}).output("y");
    CHECK_THAT(importError(m).message(), Catch::Contains("2 values in float_data"));
  }
  SECTION("a missing initializer (an undefined input)") {
    Model m = base();
    m.node("Add", {"x", "w"}, {"y"}).output("y");
    CHECK_THAT(importError(m).message(), Catch::Contains("topologically sorted"));
  }
  SECTION("a cycle") {
    Model m = base();
    m.node("Add", {"x", "b"}, {"a"}).node("Relu", {"a"}, {"b"}).output("b");
    CHECK_THAT(importError(m).message(), Catch::Contains("topologically sorted"));
  }
  SECTION("a value defined twice") {
    Model m = base();
    m.node("Relu", {"x"}, {"y"}).node("Neg", {"x"}, {"y"}).output("y");
    CHECK_THAT(importError(m).message(), Catch::Contains("ONNX checker rejects"));
  }
  SECTION("a dtype mismatch") {
    Model m = base();
    m.initI64("w", {3}, {1, 2, 3}).node("Add", {"x", "w"}, {"y"}).output("y");
    CHECK_THAT(importError(m).message(), Catch::Contains("shape inference fails"));
  }
  SECTION("a declared output shape that disagrees with the graph") {
    Model m = base();
    m.node("Relu", {"x"}, {"y"}).output("y", {int64_t{3}, int64_t{2}});
    CHECK_THAT(importError(m).message(), Catch::Contains("shape inference fails"));
  }
  SECTION("an unsupported element type") {
    Model m;
    m.input("x", {int64_t{2}}, ::onnx::TensorProto::COMPLEX64);
    m.node("Identity", {"x"}, {"y"}).output("y", ::onnx::TensorProto::COMPLEX64);
    const Status s = importError(m);
    CHECK(s.code() == ErrorCode::kUnimplemented);
    CHECK_THAT(s.message(), Catch::Contains("COMPLEX64"));
  }
  SECTION("no graph outputs") {
    Model m = base();
    m.node("Relu", {"x"}, {"y"});
    CHECK(importError(m).isUserError());
  }
  SECTION("a Reshape to an impossible shape from a constant") {
    Model m = base();
    m.initI64("s", {2}, {4, 4}).node("Reshape", {"x", "s"}, {"y"}, {}, "reshape").output("y");
    CHECK(importError(m).isUserError());
  }
  SECTION("a Gather index out of range in a constant expression") {
    Model m = base();
    m.initI64("i", {}, {5});
    m.node("Shape", {"x"}, {"s"}).node("Gather", {"s", "i"}, {"d"}, {}, "gather");
    m.node("Relu", {"x"}, {"y"}).output("y").output("d", kInt64);
    const Status s = importError(m);
    CHECK(s.isUserError());
  }
}

TEST_CASE("onnx: names that are not kiln identifiers are made valid and unique") {
  Model m;
  m.input("input 0", {int64_t{2}});
  m.node("Relu", {"input 0"}, {"out#1"}).node("Neg", {"out#1"}, {"out_1"}).output("out_1");
  const kiln::ir::Graph g = import(m);
  CHECK(g.inputs()[0]->name() == "input_0");
  CHECK(g.outputs()[0]->name() == "out_1.1");
  checkClose(runGraph(g, {makeF32({2}, {-1, 2})})[0], {2}, {0, -2});
}

TEST_CASE("onnx: weights stay trainable through import-time folding; constants do not") {
  // MatMul(x, Transpose(W)) with W an initializer, plus a Constant bias: W^T is folded at import.
  const auto w = randomValues(6, 8);
  Model m;
  m.input("x", {int64_t{1}, int64_t{3}}).init("W", {2, 3}, w);
  m.node("Transpose", {"W"}, {"Wt"}).node("MatMul", {"x", "Wt"}, {"xw"});
  m.node("Constant", {}, {"bias"}, {attrTensor("value", floatTensor("", {2}, {1, 2}))});
  m.node("Add", {"xw", "bias"}, {"y"}).output("y");
  const kiln::ir::Graph g = import(m);
  CHECK(countOps(g, OpKind::kTranspose) == 0);
  REQUIRE(g.parameters().size() == 2);
  for (const kiln::ir::Value* p : g.parameters())
    CHECK(p->trainable() == (p->type().shape == Shape{3, 2}));
  auto y = runGraph(g, {makeF32({1, 3}, {1, 2, 3})});
  checkClose(y[0], {1, 2}, {w[0] + 2 * w[1] + 3 * w[2] + 1, w[3] + 2 * w[4] + 3 * w[5] + 2});
}

TEST_CASE("onnx: a graph input that is also an initializer is a parameter (IR version 3 style)") {
  Model m;
  m.input("x", {int64_t{2}}).input("w", {int64_t{2}}).init("w", {2}, {10, 20});
  m.node("Add", {"x", "w"}, {"y"}).output("y");
  const kiln::ir::Graph g = import(m);
  CHECK(g.inputs().size() == 1);
  CHECK(g.parameters().size() == 1);
  checkClose(runGraph(g, {makeF32({2}, {1, 2})})[0], {2}, {11, 22});
}
