// Writes the seed corpora of the fuzz targets: small valid inputs made by kiln's own writers
// (printGraph, saveGraphJson, writeSafetensors, writeNpy), covering every op family, attribute
// kind, dtype and header variant. Usage: kiln_fuzz_seeds <tests/fuzz/corpus>.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <zip.h>

#include "frontends/onnx_model_builder.h"
#include "fuzz/fuzz_checks.h"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

struct Source {
  const char* name;
  const char* text;
};

// Small graphs in text IR; together they use every op in ir/ops.def.
const Source kGraphs[] = {
    {"mlp", R"(graph mlp(%x : f32[batch=2,4]) {
  param %fc1.weight : f32[3,4]
  param %fc1.bias : f32[3]
  param %fc2.weight : f32[2,3]
  %h = linear(%x, %fc1.weight, %fc1.bias) name="fc1"
  %r = relu(%h)
  %y = linear(%r, %fc2.weight) name="fc2"
  %p = softmax(%y) {axis = 1}
  return %p
})"},
    {"cnn", R"(graph cnn(%x : f32[1,2,6,6]@nchw) {
  param %conv.weight : f32[4,2,3,3]
  param %conv.bias : f32[4]
  param %dw.weight : f32[4,1,3,3]
  param %bn.scale : f32[4]
  param %bn.bias : f32[4]
  param %bn.mean : f32[4] buffer
  param %bn.var : f32[4] buffer
  %c = conv2d(%x, %conv.weight, %conv.bias) {strides = [1,1], pads = [1,1,1,1], group = 1} name="conv"
  %d = conv2d(%c, %dw.weight) {dilations = [2,2], pads = [2,2,2,2], group = 4, algo = "direct"}
  %b = batch_norm(%d, %bn.scale, %bn.bias, %bn.mean, %bn.var) {epsilon = 0.001}
  %r = relu(%b)
  %m = max_pool2d(%r) {kernel = [2,2], strides = [2,2]}
  %a = avg_pool2d(%m) {kernel = [2,2], pads = [0,0,1,1], ceil_mode = 1, count_include_pad = 1}
  %g = global_avg_pool(%a)
  %f = flatten(%g) {axis = 1}
  return %f
})"},
    {"layouts", R"(graph layouts(%x : f32[1,3,4,4]@nchw) {
  param %w : f32[2,3,1,1]
  %n = relayout(%x) {from = "nchw", to = "nhwc"}
  %c : f32[1,2,4,4]@nhwc = conv2d(%n, %w)
  %p = max_pool2d(%c) {kernel = [3,3], strides = [2,2], pads = [1,1,1,1], dilations = [1,1], ceil_mode = 0}
  %b = relayout(%p) {from = "nhwc", to = "nchw"}
  return %b
})"},
    {"backward", R"(graph backward(%g : f32[2,3], %x : f32[2,3], %t : i64[2]) {
  %r = relu_backward(%g, %x)
  %l = nll_loss(%r, %t) {reduction = "sum"}
  %d = nll_loss_backward(%l, %r, %t) {reduction = "sum", ignore_index = 1}
  return %d
})"},
    {"conv_backward",
     R"(graph conv_backward(%x : f32[1,2,5,5], %w : f32[3,2,3,3], %dy : f32[1,3,3,3], %dp : f32[1,2,2,2]) {
  %dx = conv2d_backward_data(%dy, %w, %x)
  %dw = conv2d_backward_weight(%dy, %x, %w) {strides = [1,1], pads = [0,0,0,0]}
  %m = max_pool2d_backward(%dp, %x) {kernel = [2,2], strides = [2,2]}
  %a = avg_pool2d_backward(%dp, %x) {kernel = [3,3], strides = [2,2], ceil_mode = 1, count_include_pad = 1}
  %s = add(%m, %a)
  %i = max_pool2d_indices(%x) {kernel = [3,3], strides = [2,2], pads = [1,1,1,1]}
  %t = conv_transpose2d(%dy, %w) {strides = [2,2], pads = [1,1,0,0], output_padding = [1,0]}
  return %dx, %dw, %s, %i, %t
})"},
    {"pointwise", R"(graph pointwise(%a : f32[2,3], %b : f32[3], %c : bool[2,1]) {
  %s = add(%a, %b)
  %d = sub(%s, %a)
  %m = mul(%d, %b)
  %q = div(%m, %a)
  %p = pow(%q, %b)
  %mx = maximum(%p, %a)
  %mn = minimum(%mx, %b)
  %w = where(%c, %mn, %a)
  %e1 = exp(%w)
  %e2 = log(%e1)
  %e3 = sqrt(%e2)
  %e4 = rsqrt(%e3)
  %e5 = sigmoid(%e4)
  %e6 = tanh(%e5)
  %e7 = silu(%e6)
  %e8 = gelu(%e7) {approximate = "tanh"}
  %e9 = leaky_relu(%e8) {alpha = 0.2}
  %e10 = clip(%e9) {min = -1.5, max = inf}
  %e11 = neg(%e10)
  %e12 = abs(%e11)
  %e13 = dropout(%e12) {ratio = 0.1}
  %i = cast(%e13) {to = "i64"}
  %h = cast(%e13) {to = "f16"}
  %hb = cast(%h) {to = "bf16"}
  return %i, %hb
})"},
    {"movement", R"(graph movement(%x : f32[2,3,4], %idx : i64[2], %idx32 : i32[2,2]) {
  %r = reshape(%x) {shape = [6,-1]}
  %r0 = reshape(%x) {shape = [0,-1], allowzero = 0}
  %t = transpose(%r) {perm = [1,0]}
  %t2 = transpose(%x)
  %c = concat(%x, %x, %x) {axis = -1}
  %s = slice(%c) {starts = [0,1], ends = [2,100], axes = [0,2], steps = [1,3]}
  %u = unsqueeze(%s) {axes = [0,-1]}
  %q = squeeze(%u)
  %e = expand(%q) {shape = [2,1,1,1]}
  %g = gather(%x, %idx) {axis = 1}
  %g2 = gather(%x, %idx32) {axis = -1}
  %f = flatten(%g2) {axis = 2}
  return %r0, %t, %t2, %e, %g, %f
})"},
    {"norms", R"(graph norms(%x : f32[2,3,4]) {
  param %ln.scale : f32[4]
  param %ln.bias : f32[4]
  param %ln2.scale : f32[3,4] buffer
  %l = layer_norm(%x, %ln.scale, %ln.bias) {axis = -1, epsilon = 1e-05}
  %l2 = layer_norm(%l, %ln2.scale) {axis = 1}
  %s = reduce_sum(%l2) {axes = [1], keepdims = 0}
  %m = reduce_mean(%l) {axes = [0,2]}
  %x2 = reduce_max(%l)
  %ls = log_softmax(%s) {axis = 0}
  return %ls, %m, %x2
})"},
    {"linalg", R"(graph linalg(%a : f32[2,3,4], %b : f32[4,5], %c : f32[3,2]) {
  param %w : f32[5,3]
  param %bias : f32[5]
  %m = matmul(%a, %b)
  %g = gemm(%c, %w, %bias) {alpha = 0.5, beta = 2, transA = 1, transB = 1}
  %g2 = gemm(%g, %b) {transB = 1}
  %v = matmul(%b, %bias)
  return %m, %g2, %v
})"},
    {"losses", R"(graph losses(%logits : f32[4,3], %target : i64[4]) {
  %ls = log_softmax(%logits) {axis = 1}
  %nll = nll_loss(%ls, %target) {ignore_index = 1, reduction = "sum"}
  %ce = cross_entropy_loss(%logits, %target)
  %cen = cross_entropy_loss(%logits, %target) {reduction = "none"}
  return %nll, %ce, %cen
})"},
    {"dtypes",
     R"(graph dtypes(%x : i32[3], %y : i8[3], %z : u8[3], %w : f64[3], %h : f16[3], %bf : bf16[3]) {
  param %k32 : i32[3] buffer
  param %k64 : f64[3]
  param %kb : bool[3] buffer
  param %kh : f16[]
  %a = add(%x, %k32)
  %b = mul(%y, %y)
  %c = maximum(%z, %z)
  %d = sub(%w, %k64)
  %e = where(%kb, %h, %kh)
  %f = relu(%bf)
  %g = cast(%e) {to = "f32"}
  return %a, %b, %c, %d, %f, %g
})"},
    {"names", R"(graph "odd \"name\"\n"(%x.in/0:a : f32[0,3], %s : f32[]) {
  param %p-1 : f32[] buffer
  %y_1 = relu(%x.in/0:a) name="relu \"quoted\" \x01 \xc3\xa9"
  %z = add(%y_1, %p-1)
  %w = mul(%s, %p-1) name=""
  return %z, %w, %z
})"},
};

void writeBytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out) {
    std::fprintf(stderr, "kiln_fuzz_seeds: cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

std::string readBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

template <class T>
T orDie(Expected<T> e, const std::string& what) {
  if (!e) {
    std::fprintf(stderr, "kiln_fuzz_seeds: %s: %s\n", what.c_str(), e.status().message().c_str());
    std::exit(1);
  }
  return std::move(*e);
}

void orDie(const Status& st, const std::string& what) {
  if (!st) {
    std::fprintf(stderr, "kiln_fuzz_seeds: %s: %s\n", what.c_str(), st.message().c_str());
    std::exit(1);
  }
}

// Seeded random bytes; bool elements get 0 or 1.
ir::TensorData randomTensor(ir::DType dtype, ir::Shape shape, std::mt19937& rng) {
  ir::TensorData t(dtype, std::move(shape));
  for (size_t i = 0; i < t.byteSize(); ++i)
    t.data()[i] = static_cast<std::byte>(dtype == ir::DType::kBool ? rng() & 1 : rng() & 0xff);
  return t;
}

// The graph as text IR, and as a json_graph input (JSON, separator, weights) whose parameters
// hold random data. The weights files are safetensors seeds too.
void graphSeeds(const fs::path& corpus, const fs::path& tmp, std::mt19937& rng) {
  for (const Source& src : kGraphs) {
    ir::Graph g = orDie(ir::parseGraph(src.text), src.name);
    writeBytes(corpus / "text_ir" / (std::string(src.name) + ".ir"), ir::printGraph(g));
    for (ir::Value* p : g.parameters())
      p->setData(randomTensor(p->type().dtype, p->type().shape, rng));
    const fs::path json = tmp / "model.json";
    orDie(frontends::saveGraphJson(g, json.string()), src.name);
    const std::string weights = readBytes(tmp / "model.safetensors");
    writeBytes(corpus / "json_graph" / (std::string(src.name) + ".seed"),
               readBytes(json) + std::string(fuzz::kJsonGraphSeparator) + weights);
    if (!g.parameters().empty())
      writeBytes(corpus / "safetensors" / (std::string(src.name) + ".safetensors"), weights);
  }
}

void safetensorsSeeds(const fs::path& corpus, std::mt19937& rng) {
  frontends::TensorMap all;
  for (int i = 0; i < ir::kNumDTypes; ++i) {
    const auto dtype = static_cast<ir::DType>(i);
    // The dtypes safetensors has (not the 4- and 2-bit ones, nor FNUZ and E8M0).
    if (frontends::safetensorsDTypeName(dtype) == "?") continue;
    all.emplace(std::string("t_") + std::string(ir::dtypeName(dtype)),
                randomTensor(dtype, {2, 3}, rng));
  }
  orDie(frontends::writeSafetensors((corpus / "safetensors" / "all_dtypes.safetensors").string(),
                                    all, {{"format", "pt"}, {"note", "kiln fuzz seed"}}),
        "all_dtypes");
  frontends::TensorMap odd;
  odd.emplace("scalar", randomTensor(ir::DType::kF64, {}, rng));
  odd.emplace("empty", randomTensor(ir::DType::kI64, {0, 4}, rng));
  odd.emplace("@attr/0/value", randomTensor(ir::DType::kF32, {3}, rng));
  odd.emplace("u8", randomTensor(ir::DType::kU8, {5}, rng));
  orDie(frontends::writeSafetensors((corpus / "safetensors" / "odd_shapes.safetensors").string(),
                                    odd),
        "odd_shapes");
  orDie(frontends::writeSafetensors((corpus / "safetensors" / "no_tensors.safetensors").string(),
                                    {}, {{"only", "metadata"}}),
        "no_tensors");
}

// MNIST-format pairs (fuzz_checks.h: images, the separator, labels) that read: the mutations
// reach the header checks and the data.
void idxSeeds(const fs::path& corpus) {
  auto idx = [](uint8_t type, std::vector<uint32_t> dims, size_t bytes) {
    std::string s{'\0', '\0', static_cast<char>(type), static_cast<char>(dims.size())};
    for (uint32_t d : dims)
      for (int shift = 24; shift >= 0; shift -= 8) s.push_back(static_cast<char>(d >> shift));
    for (size_t i = 0; i < bytes; ++i) s.push_back(static_cast<char>(i * 37));
    return s;
  };
  const std::string sep(fuzz::kIdxSeparator);
  const fs::path dir = corpus / "idx";
  writeBytes(dir / "three_4x4", idx(8, {3, 4, 4}, 48) + sep + idx(8, {3}, 3));
  writeBytes(dir / "one_28x28", idx(8, {1, 28, 28}, 784) + sep + idx(8, {1}, 1));
  writeBytes(dir / "two_1x5", idx(8, {2, 1, 5}, 10) + sep + idx(8, {2}, 2));
}

void npySeeds(const fs::path& corpus, std::mt19937& rng) {
  struct Array {
    const char* name;
    ir::DType dtype;
    ir::Shape shape;
  };
  const Array arrays[] = {
      {"f32_2x3", ir::DType::kF32, {2, 3}},      {"f64_scalar", ir::DType::kF64, {}},
      {"f16_4", ir::DType::kF16, {4}},           {"i64_empty_0x3", ir::DType::kI64, {0, 3}},
      {"i32_2x1x2", ir::DType::kI32, {2, 1, 2}}, {"i8_3", ir::DType::kI8, {3}},
      {"u8_2x2", ir::DType::kU8, {2, 2}},        {"bool_5", ir::DType::kBool, {5}},
  };
  const fs::path dir = corpus / "npy";
  for (const Array& a : arrays)
    orDie(frontends::writeNpy((dir / a.name).string(), randomTensor(a.dtype, a.shape, rng)),
          a.name);

  // Versions 2.0 and 3.0 (4-byte header length) and the header spellings other writers use:
  // double quotes, no trailing comma, Python 2 long dims, another key order.
  auto npy = [](int major, const std::string& header, const std::string& data) {
    std::string out = "\x93NUMPY";
    out += static_cast<char>(major);
    out += '\0';
    const int lengthBytes = major == 1 ? 2 : 4;
    for (int i = 0; i < lengthBytes; ++i)
      out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
    return out + header + data;
  };
  const std::string six(24, '\x01');
  writeBytes(dir / "f32_v2",
             npy(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n", six));
  writeBytes(dir / "f32_v3",
             npy(3, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }\n", six));
  writeBytes(dir / "f32_variants",
             npy(1, "{\"shape\": (3L, 2L), \"fortran_order\": False, \"descr\": \"<f4\"}\n", six));
}

// Small ONNX models that together use the ops the importer mapped before 2026-12-02 (the later
// ones have conformance models as seeds: tests/fuzz/README.md), symbolic batch
// dims, both opset generations of the ops whose inputs moved, and every initializer encoding.
void onnxSeeds(const fs::path& corpus, std::mt19937& rng) {
  using namespace onnxtest;
  auto values = [&](size_t n) {
    std::uniform_real_distribution<float> dist(-1, 1);
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  };
  const fs::path dir = corpus / "onnx";

  // A CNN with a symbolic batch: Conv, BatchNormalization, Relu, MaxPool, AveragePool,
  // GlobalAveragePool, Flatten, Gemm, Softmax.
  Model cnn(13);
  cnn.input("x", {std::string("N"), 2, 8, 8})
      .init("conv.w", {4, 2, 3, 3}, values(72))
      .init("conv.b", {4}, values(4))
      .init("bn.scale", {4}, values(4))
      .init("bn.bias", {4}, values(4))
      .init("bn.mean", {4}, values(4))
      .initializer(floatTensor("bn.var", {4}, {0.5f, 1, 1.5f, 2}, /*raw=*/false))
      .init("fc.w", {3, 4}, values(12))
      .init("fc.b", {3}, values(3))
      .node("Conv", {"x", "conv.w", "conv.b"}, {"c"},
            {attrInts("pads", {1, 1, 1, 1}), attrInts("strides", {1, 1})}, "conv")
      .node("BatchNormalization", {"c", "bn.scale", "bn.bias", "bn.mean", "bn.var"}, {"b"},
            {attrFloat("epsilon", 1e-3f)})
      .node("Relu", {"b"}, {"r"})
      .node("MaxPool", {"r"}, {"m"},
            {attrInts("kernel_shape", {2, 2}), attrInts("strides", {2, 2})})
      .node("AveragePool", {"m"}, {"a"},
            {attrInts("kernel_shape", {3, 3}), attrInts("pads", {1, 1, 1, 1}),
             attrInt("count_include_pad", 1)})
      .node("GlobalAveragePool", {"a"}, {"g"})
      .node("Flatten", {"g"}, {"f"}, {attrInt("axis", 1)})
      .node("Gemm", {"f", "fc.w", "fc.b"}, {"y"}, {attrInt("transB", 1), attrFloat("alpha", 0.5f)})
      .node("Softmax", {"y"}, {"p"}, {attrInt("axis", 1)})
      .output("p");
  writeBytes(dir / "cnn.onnx", cnn.bytes());

  // An attention block as torch.onnx writes it at opset 17: MatMul, Add, Reshape through
  // Shape / Gather / Unsqueeze / Concat, Transpose, Div, Softmax, the Erf GELU pattern,
  // LayerNormalization.
  Model attn(17);
  attn.input("x", {2, 4, 8})
      .init("wq", {8, 8}, values(64))
      .init("bq", {8}, values(8))
      .init("ln.w", {8}, values(8))
      .init("ln.b", {8}, values(8))
      .initI64("zero", {1}, {0})
      .initI64("heads", {1}, {2})
      .initI64("hd", {1}, {4})
      .initI64("minus1", {1}, {-1})
      .node("MatMul", {"x", "wq"}, {"q0"})
      .node("Add", {"q0", "bq"}, {"q"})
      .node("Shape", {"q"}, {"qs"})
      .node("Gather", {"qs", "zero"}, {"batch"}, {attrInt("axis", 0)})
      .node("Concat", {"batch", "minus1", "heads", "hd"}, {"shape4"}, {attrInt("axis", 0)})
      .node("Reshape", {"q", "shape4"}, {"q4"})
      .node("Transpose", {"q4"}, {"qt"}, {attrInts("perm", {0, 2, 1, 3})})
      .node("Transpose", {"q4"}, {"kt"}, {attrInts("perm", {0, 2, 3, 1})})
      .node("MatMul", {"qt", "kt"}, {"s0"})
      .node("Constant", {}, {"scale"}, {attrFloat("value_float", 2.0f)})
      .node("Div", {"s0", "scale"}, {"s"})
      .node("Softmax", {"s"}, {"attn"}, {attrInt("axis", -1)})
      .node("MatMul", {"attn", "qt"}, {"o4"})
      .node("Transpose", {"o4"}, {"o3"}, {attrInts("perm", {0, 2, 1, 3})})
      .initI64("shape3", {3}, {0, 0, 8})
      .node("Reshape", {"o3", "shape3"}, {"o"})
      .node("Constant", {}, {"sqrt2"}, {attrFloat("value_float", 1.41421356f)})
      .node("Constant", {}, {"one"}, {attrFloat("value_float", 1.0f)})
      .node("Constant", {}, {"half"}, {attrFloat("value_float", 0.5f)})
      .node("Div", {"o", "sqrt2"}, {"g0"})
      .node("Erf", {"g0"}, {"g1"})
      .node("Add", {"g1", "one"}, {"g2"})
      .node("Mul", {"o", "g2"}, {"g3"})
      .node("Mul", {"g3", "half"}, {"gelu"})
      .node("Add", {"gelu", "x"}, {"res"})
      .node("LayerNormalization", {"res", "ln.w", "ln.b"}, {"y"},
            {attrInt("axis", -1), attrFloat("epsilon", 1e-5f)})
      .output("y");
  writeBytes(dir / "attention.onnx", attn.bytes());

  // Data movement and pointwise math at opset 13 (axes and sizes as inputs).
  Model move(13);
  move.input("x", {2, 3, 4})
      .input("idx", {2}, kInt64)
      .initI64("starts", {2}, {0, 1})
      .initI64("ends", {2}, {-1, 100})
      .initI64("axes", {2}, {1, 2})
      .initI64("steps", {2}, {1, 2})
      .initI64("split", {2}, {1, 2})
      .initI64("ax0", {1}, {0})
      .initI64("expand", {4}, {2, 2, 3, 4})
      .initI64("pads", {6}, {0, 1, 0, 0, 1, -1})
      .initI64("rshape", {2}, {4, 2})
      .node("Slice", {"x", "starts", "ends", "axes", "steps"}, {"sl"})
      .node("Split", {"x", "split"}, {"sp0", "sp1"}, {attrInt("axis", 1)})
      .node("Concat", {"sp1", "sp0"}, {"cat"}, {attrInt("axis", 1)})
      .node("Unsqueeze", {"cat", "ax0"}, {"un"})
      .node("Expand", {"un", "expand"}, {"ex"})
      .node("ReduceMean", {"ex"}, {"rm"}, {attrInts("axes", {0}), attrInt("keepdims", 0)})
      .node("Squeeze", {"un", "ax0"}, {"sq"})
      .node("Gather", {"sq", "idx"}, {"ga"}, {attrInt("axis", 2)})
      .node("Pad", {"x", "pads"}, {"pd"}, {attrString("mode", "reflect")})
      .node("Reshape", {"sl", "rshape"}, {"rs"})
      .node("Sigmoid", {"rm"}, {"sg"})
      .node("Tanh", {"sg"}, {"th"})
      .node("Exp", {"th"}, {"e"})
      .node("Log", {"e"}, {"lg"})
      .node("Abs", {"lg"}, {"ab"})
      .node("Sqrt", {"ab"}, {"sr"})
      .node("Neg", {"sr"}, {"ng"})
      .node("LeakyRelu", {"ng"}, {"lr"}, {attrFloat("alpha", 0.1f)})
      .node("Reciprocal", {"sl"}, {"rc"})
      .node("Max", {"lr", "x", "rm"}, {"mx"})
      .node("Min", {"mx", "x"}, {"mn"})
      .node("Sum", {"mn", "x", "x"}, {"sum"})
      .node("Cast", {"sum"}, {"f64"}, {attrInt("to", ::onnx::TensorProto::DOUBLE)})
      .node("Cast", {"f64"}, {"f32"}, {attrInt("to", kFloat)})
      .node("ReduceSum", {"f32", "ax0"}, {"rsum"})
      .node("ReduceMax", {"f32"}, {"rmax"}, {attrInts("axes", {2}), attrInt("keepdims", 1)})
      .node("ReduceMin", {"f32"}, {"rmin"}, {attrInts("axes", {1})})
      .output("rs")
      .output("ga")
      .output("pd")
      .output("rc")
      .output("rsum")
      .output("rmax")
      .output("rmin");
  writeBytes(dir / "movement.onnx", move.bytes());

  // Import-time folding: Shape, Size, ConstantOfShape, Range, comparisons feeding Where, Clip
  // with constant bounds, Pow with an integer exponent, Resize with scales, a constant Pad.
  Model fold(13);
  fold.input("x", {1, 2, 3, 3})
      .initI64("rstart", {}, {0})
      .initI64("rlimit", {}, {3})
      .initI64("rdelta", {}, {1})
      .initI64("cshape", {1}, {3})
      .initializer(floatTensor("lo", {}, {-0.5f}))
      .initializer(floatTensor("hi", {}, {0.5f}))
      .initializer(floatTensor("roi", {0}, {}))
      .initializer(floatTensor("scales", {4}, {1, 1, 2, 1.5f}))
      .initI64("cpads", {8}, {0, 0, 1, 0, 0, 0, 0, 1})
      .initI64("two", {}, {2})
      .node("Size", {"x"}, {"size"})
      .node("Range", {"rstart", "rlimit", "rdelta"}, {"range"})
      .node("ConstantOfShape", {"cshape"}, {"ones"},
            {attrTensor("value", int64Tensor("v", {1}, {1}))})
      .node("Less", {"range", "ones"}, {"lt"})
      .node("Not", {"lt"}, {"nlt"})
      .node("Where", {"nlt", "x", "lo"}, {"w"})
      .node("Clip", {"w", "lo", "hi"}, {"cl"})
      .node("Pow", {"cl", "two"}, {"pw"})
      .node("Resize", {"pw", "roi", "scales"}, {"rz"},
            {attrString("mode", "linear"),
             attrString("coordinate_transformation_mode", "half_pixel")})
      .node("Resize", {"x", "roi", "scales"}, {"rn"}, {attrString("mode", "nearest")})
      .node("Pad", {"x", "cpads"}, {"cp"})
      .output("size", kInt64)
      .output("rz")
      .output("rn")
      .output("cp");
  writeBytes(dir / "folding.onnx", fold.bytes());

  // Opset 11: axes as attributes, Softmax over flattened dims, a 1-D Conv and MaxPool with
  // auto_pad and ceil_mode, a Dropout at inference, Identity.
  Model old(11);
  old.input("x", {std::string("batch"), 2, 9})
      .init("w", {3, 2, 3}, values(18))
      .node("Conv", {"x", "w"}, {"c"}, {attrString("auto_pad", "SAME_UPPER")})
      .node("MaxPool", {"c"}, {"m"},
            {attrInts("kernel_shape", {2}), attrInts("strides", {2}), attrInt("ceil_mode", 1)})
      .node("Unsqueeze", {"m"}, {"u"}, {attrInts("axes", {1})})
      .node("Squeeze", {"u"}, {"s"}, {attrInts("axes", {1})})
      .node("Dropout", {"s"}, {"d"}, {attrFloat("ratio", 0.3f)})
      .node("Identity", {"d"}, {"i"})
      .node("Softmax", {"i"}, {"y"}, {attrInt("axis", 1)})
      .node("LogSoftmax", {"i"}, {"ly"}, {attrInt("axis", 2)})
      .node("GlobalMaxPool", {"c"}, {"gm"})
      .output("y")
      .output("ly")
      .output("gm");
  writeBytes(dir / "opset11.onnx", old.bytes());

  // Opset 26 (past libonnx 1.12: kiln's own checks): the composed window ops (Col2Im, a dilated
  // AveragePool with pads beyond half its window, a ceil-mode MaxPool over an explicit -inf
  // padding), Pad in wrap mode, an Einsum diagonal, BitCast and Det. Fixed values: the other
  // seeds' random draws stay as they were.
  std::vector<float> ramp(36);
  for (size_t i = 0; i < ramp.size(); ++i) ramp[i] = 0.25f * static_cast<float>(i) - 4.f;
  Model win(26);
  win.input("x", {1, 1, 6, 6})
      .input("m", {2, 3, 3})
      .initializer(floatTensor("cols", {1, 4, 9}, ramp))
      .initI64("image", {2}, {4, 4})
      .initI64("block", {2}, {2, 2})
      .initI64("wpads", {8}, {0, 0, 1, 2, 0, 0, 2, 1})
      .node("Col2Im", {"cols", "image", "block"}, {"img"},
            {attrInts("strides", {1, 1}), attrInts("pads", {0, 0, 0, 0})})
      .node("AveragePool", {"x"}, {"ap"},
            {attrInts("kernel_shape", {2, 2}), attrInts("dilations", {2, 2}),
             attrInts("pads", {2, 2, 2, 2}), attrInt("count_include_pad", 1)})
      .node("MaxPool", {"x"}, {"mp"},
            {attrInts("kernel_shape", {3, 3}), attrInts("strides", {2, 2}),
             attrInts("pads", {2, 2, 2, 2}), attrInt("ceil_mode", 1)})
      .node("Pad", {"x", "wpads"}, {"wp"}, {attrString("mode", "wrap")})
      .node("Einsum", {"m"}, {"diag"}, {attrString("equation", "bii->bi")})
      .node("BitCast", {"m"}, {"bits"}, {attrInt("to", ::onnx::TensorProto::INT32)})
      .node("Det", {"m"}, {"det"})
      .output("img")
      .output("ap")
      .output("mp")
      .output("wp")
      .output("diag")
      .output("bits", ::onnx::TensorProto::INT32)
      .output("det");
  writeBytes(dir / "windows_opset26.onnx", win.bytes());
}

}  // namespace

// .npz archives as np.savez (stored) and np.savez_compressed (deflated) write them.
void npzSeeds(const fs::path& corpus, std::mt19937& rng) {
  const fs::path dir = corpus / "npz";
  const fs::path scratch = fuzz::scratchDir() / "member.npy";
  auto npyBytes = [&](const ir::TensorData& t) {
    orDie(frontends::writeNpy(scratch.string(), t), "npz member");
    std::ifstream in(scratch, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto archive = [&](const std::string& name,
                     const std::vector<std::pair<std::string, std::string>>& members,
                     bool deflate) {
    int error = 0;
    const std::string path = (dir / name).string();
    zip_t* z = zip_open(path.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &error);
    if (!z) orDie(ioError("cannot create " + path), name.c_str());
    for (const auto& [member, bytes] : members) {
      zip_source_t* src = zip_source_buffer(z, bytes.data(), bytes.size(), 0);
      const zip_int64_t i = zip_file_add(z, member.c_str(), src, ZIP_FL_OVERWRITE);
      zip_set_file_compression(z, static_cast<zip_uint64_t>(i),
                               deflate ? ZIP_CM_DEFLATE : ZIP_CM_STORE, 0);
    }
    if (zip_close(z) != 0) orDie(ioError("cannot write " + path), name.c_str());
  };
  const std::string x = npyBytes(randomTensor(ir::DType::kU8, {2, 4, 4}, rng)),
                    y = npyBytes(randomTensor(ir::DType::kI64, {2}, rng)),
                    f = npyBytes(randomTensor(ir::DType::kF32, {3}, rng));
  archive("stored_xy", {{"x.npy", x}, {"y.npy", y}}, false);
  archive("deflated_train_test",
          {{"x_train.npy", x}, {"y_train.npy", y}, {"x_test.npy", x}, {"y_test.npy", y}}, true);
  archive("mixed", {{"f.npy", f}, {"notes.txt", "not an array"}}, true);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln_fuzz_seeds CORPUS_DIR (tests/fuzz/corpus)\n");
    return 2;
  }
  const fs::path corpus = argv[1];
  for (const fuzz::Target& t : fuzz::kTargets) fs::create_directories(corpus / t.name);
  const fs::path tmp = fuzz::scratchDir();
  std::mt19937 rng(20240601);
  graphSeeds(corpus, tmp, rng);
  safetensorsSeeds(corpus, rng);
  npySeeds(corpus, rng);
  npzSeeds(corpus, rng);
  onnxSeeds(corpus, rng);
  idxSeeds(corpus);
  std::printf("wrote the seed corpora under %s\n", corpus.c_str());
  return 0;
}
