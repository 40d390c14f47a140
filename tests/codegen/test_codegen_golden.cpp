// Codegen under direct test: a fused group (text IR in) is lowered to kernel IR and rendered
// as C++ and CUDA C; the text must match the golden file tests/data/codegen_golden/<case>.txt,
// the C++ must compile and compute what the reference kernels compute, and the CUDA C must
// compile with NVRTC. "Every op lowers" checks that each op has a kernel form or a declared
// route (a library kernel or, for ops no group fuses, its reference kernel).
//
// After an intended change to lowering or the renderers, regenerate the goldens with
//   KILN_UPDATE_GOLDEN=1 build/tests/test_codegen "codegen golden*"
// and review the diff like code.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <unordered_set>

#include "codegen/cpu_compiler.h"
#include "codegen/lower.h"
#include "codegen/nvrtc_compiler.h"
#include "codegen/render.h"
#include "ir/fusion_group.h"
#include "ir/parser.h"
#include "ir/verifier.h"
#include "runtime/eager.h"
#include "runtime/library/kernels.h"
#include "runtime/object_loader.h"
#include "runtime/reference/kernels.h"

using namespace kiln;

namespace {

namespace fs = std::filesystem;

ir::Graph parse(const std::string& text) {
  auto g = ir::parseGraph(text);
  INFO(g.status().message());
  REQUIRE(g.hasValue());
  REQUIRE(ir::verify(*g).isOk());
  return std::move(g).value();
}

// The whole graph as one group, as the fusion pass would form it: a reduction group around
// its one reduction, a view group when every node is a view, else a pointwise group. Built
// here rather than by the fusion pass so that these tests follow codegen alone.
ir::FusionGroup wholeGraph(const ir::Graph& g) {
  ir::FusionGroup group;
  bool allViews = true;
  for (ir::Node* n : g.nodes()) {
    group.nodes.push_back(n);
    allViews = allViews && ir::isViewOp(*n);
    if (n->info().has(ir::kReduction)) group.anchor = n;
  }
  group.kind = group.anchor ? ir::GroupKind::kReduction
               : allViews   ? ir::GroupKind::kView
                            : ir::GroupKind::kPointwise;
  return group;
}

std::unordered_set<const ir::Value*> outputsOf(const ir::Graph& g) {
  return {g.outputs().begin(), g.outputs().end()};
}

codegen::Kernel lowerOrFail(const ir::Graph& g, const std::string& name) {
  auto k = codegen::lowerGroup(wholeGraph(g), outputsOf(g), name);
  INFO(k.status().message());
  REQUIRE(k.hasValue());
  return std::move(k).value();
}

// Inputs in [-1, 1] (integers in [-3, 3], bools half true), seeded.
std::vector<runtime::Tensor> sampleInputs(const ir::Graph& g) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<runtime::Tensor> ins;
  for (const ir::Value* v : g.inputs()) {
    runtime::Tensor t = *runtime::Tensor::empty(v->type().dtype, v->type().shape);
    for (int64_t i = 0; i < t.numElements(); ++i) {
      const float x = dist(rng);
      switch (v->type().dtype) {
        case ir::DType::kF32:
          t.data<float>()[i] = x;
          break;
        case ir::DType::kI64:
          t.data<int64_t>()[i] = std::lround(3 * x);
          break;
        case ir::DType::kBool:
          t.data<bool>()[i] = x > 0;
          break;
        default:
          FAIL("sampleInputs: add dtype " << ir::dtypeName(v->type().dtype));
      }
    }
    ins.push_back(t);
  }
  return ins;
}

// Runs the compiled C++ kernel on sample inputs and checks every graph output against the
// reference kernels (eager execution).
void checkAgainstReference(const ir::Graph& g, const codegen::Kernel& k) {
  auto object = codegen::compileCpp(codegen::renderModule({&k, 1}, codegen::Dialect::kCpu), k.name);
  INFO(object.status().message());
  REQUIRE(object.hasValue());
  runtime::LoadedObjects loaded;
  REQUIRE(loaded.add(object->bytes, k.name).isOk());
  auto fn = loaded.lookupFunction<void(void* const*, long long, long long)>(k.name);
  REQUIRE(fn.hasValue());

  const std::vector<runtime::Tensor> ins = sampleInputs(g);
  runtime::EagerExecutor eager(g);
  auto expected = eager.run(ins);
  INFO(expected.status().message());
  REQUIRE(expected.hasValue());

  std::vector<runtime::Tensor> outs;
  for (const ir::Value* v : g.outputs())
    outs.push_back(*runtime::Tensor::empty(v->type().dtype, v->type().shape));
  std::vector<void*> args;
  for (const codegen::KernelArg& a : k.args) {
    void* p = nullptr;
    for (size_t i = 0; i < g.inputs().size(); ++i)
      if (g.inputs()[i]->name() == a.value) p = ins[i].rawData();
    for (size_t i = 0; i < g.outputs().size(); ++i)
      if (a.output && g.outputs()[i]->name() == a.value) p = outs[i].rawData();
    INFO("kernel argument " << a.value);
    REQUIRE(p != nullptr);
    args.push_back(p);
  }
  // The CPU ABI (codegen/render.h): a row-split reduction's chunks (here in two calls, as two
  // threads would take them) with its partial results after the arguments, then the call that
  // combines them.
  const codegen::CpuRowSplit split = codegen::cpuRowSplit(k);
  std::vector<std::byte> scratch(static_cast<size_t>(split.scratchBytes) + 64);
  if (split.chunks > 0) {
    args.push_back(reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) &
                                           ~uintptr_t{63}));
    (*fn)(args.data(), 0, 1);
    (*fn)(args.data(), 1, split.chunks);
    (*fn)(args.data(), split.chunks, split.chunks + 1);
  } else {
    (*fn)(args.data(), 0, k.numUnits());
  }

  for (size_t o = 0; o < outs.size(); ++o) {
    INFO("output " << g.outputs()[o]->name());
    REQUIRE(outs[o].dtype() == ir::DType::kF32);
    const float* got = outs[o].data<float>();
    const float* want = (*expected)[o].data<float>();
    for (int64_t i = 0; i < outs[o].numElements(); ++i) {
      INFO("element " << i);
      // Generated reductions sum in 16 lanes, the reference in order: a few ulps apart.
      REQUIRE((std::abs(got[i] - want[i]) <= 1e-5f * (1 + std::abs(want[i])) ||
               (std::isnan(got[i]) && std::isnan(want[i]))));
    }
  }
}

struct GoldenCase {
  const char* name;  // The golden file's stem.
  const char* ir;
  bool run = true;  // Execute it (false for domains too large to allocate).
};

// The representative groups. Shapes are small and odd so that tails show.
const GoldenCase kCases[] = {
    {"pointwise_chain", R"(
graph g(%x : f32[4,33]) {
  %a : f32[4,33] = relu(%x)
  %b : f32[4,33] = exp(%a)
  %c : f32[4,33] = clip(%b) {min=0.5, max=2.0}
  %d : f32[4,33] = mul(%c, %x)
  return %d
})"},
    {"broadcast", R"(
graph g(%x : f32[3,5,7], %row : f32[7], %col : f32[3,5,1]) {
  %a : f32[3,5,7] = add(%x, %row)
  %b : f32[3,5,7] = sub(%a, %col)
  %c : f32[3,5,7] = leaky_relu(%b) {alpha=0.1}
  return %c
})"},
    {"reduction_prologue_epilogue", R"(
graph g(%x : f32[6,37]) {
  %a : f32[6,37] = mul(%x, %x)
  %m : f32[6,1] = reduce_mean(%a) {axes=[1]}
  %r : f32[6,1] = sqrt(%m)
  %e : f32[6,1] = neg(%r)
  return %e
})"},
    {"reduce_max_middle_dim", R"(
graph g(%x : f32[3,19,5]) {
  %m : f32[3,5] = reduce_max(%x) {axes=[1], keepdims=0}
  return %m
})"},
    // Column-wise on the CPU (units contiguous, the reduced dim strided): 70 units are a block
    // of 64 and a tail of 6 (under 128 rows: not split in chunks of rows).
    {"column_sum", R"(
graph g(%x : f32[100,70]) {
  %e : f32[100,70] = exp(%x)
  %m : f32[1,70] = reduce_sum(%e) {axes=[0]}
  return %m
})"},
    {"column_softmax", R"(
graph g(%x : f32[33,70]) {
  %p : f32[33,70] = softmax(%x) {axis=0}
  %m : f32[70] = reduce_max(%x) {axes=[0], keepdims=0}
  return %p, %m
})"},
    // Squeeze-excite's SiLU and mean over channels-last pixels: the SiLU is stored while it is
    // summed (one pass; no element loop computes it again).
    {"column_silu_mean", R"(
graph g(%x : f32[40,70]) {
  %s : f32[40,70] = silu(%x)
  %m : f32[70] = reduce_mean(%s) {axes=[0], keepdims=0}
  return %s, %m
})"},
    // 300 rows: split in 4 chunks of 75 rows (cpuRowSplit), partial sums after the arguments,
    // the call with begin = 4 adds them.
    {"column_silu_mean_rows", R"(
graph g(%x : f32[300,70]) {
  %s : f32[300,70] = silu(%x)
  %m : f32[70] = reduce_mean(%s) {axes=[0], keepdims=0}
  return %s, %m
})"},
    {"strided_view", R"(
graph g(%x : f32[8,20]) {
  %s : f32[4,6] = slice(%x) {starts=[1,2], ends=[8,20], axes=[0,1], steps=[2,3]}
  %r : f32[4,6] = tanh(%s)
  return %r
})"},
    {"softmax", R"(
graph g(%x : f32[5,41], %t : f32[5,41]) {
  %a : f32[5,41] = div(%x, %t)
  %p : f32[5,41] = softmax(%a) {axis=1}
  %q : f32[5,41] = sigmoid(%p)
  return %q
})"},
    {"layernorm", R"(
graph g(%x : f32[2,3,24], %w : f32[24], %b : f32[24]) {
  %y : f32[2,3,24] = layer_norm(%x, %w, %b) {axis=-1, epsilon=1e-5}
  %z : f32[2,3,24] = gelu(%y)
  return %z
})"},
    {"transposed_load", R"(
graph g(%x : f32[6,10], %y : f32[10,6]) {
  %t : f32[10,6] = transpose(%x) {perm=[1,0]}
  %a : f32[10,6] = add(%t, %y)
  return %a
})"},
    {"view_copy", R"(
graph g(%x : f32[2,3,4]) {
  %t : f32[4,2,3] = transpose(%x) {perm=[2,0,1]}
  return %t
})"},
    {"integer_and_bool_inputs", R"(
graph g(%i : i64[4,9], %c : bool[4,9], %x : f32[4,9]) {
  %f : f32[4,9] = cast(%i) {to="f32"}
  %m : f32[4,9] = mul(%f, %x)
  %w : f32[4,9] = where(%c, %m, %x)
  return %w
})"},
    // 50000 x 50000 = 2.5e9 elements: every index and offset must be 64-bit.
    {"int64_indices", R"(
graph g(%x : f32[50000,50000], %y : f32[50000,50000]) {
  %t : f32[50000,50000] = transpose(%x) {perm=[1,0]}
  %a : f32[50000,50000] = add(%t, %y)
  return %a
})",
     false},
    // 1000 elements: 3 full CUDA blocks of kCudaBlock = 256 and a tail of 232.
    {"cuda_tail_block", R"(
graph g(%x : f32[1000]) {
  %a : f32[1000] = silu(%x)
  return %a
})"},
};

std::string renderBoth(const codegen::Kernel& k) {
  return "// ---- C++ (CPU)\n" + codegen::renderKernel(k, codegen::Dialect::kCpu) +
         "// ---- CUDA C\n" + codegen::renderKernel(k, codegen::Dialect::kCuda);
}

fs::path goldenPath(const std::string& name) {
  return fs::path(KILN_TEST_DATA_DIR) / "codegen_golden" / (name + ".txt");
}

// The first line where `want` and `got` differ, for the failure message.
std::string firstDifference(const std::string& want, const std::string& got) {
  std::istringstream a(want), b(got);
  std::string la, lb;
  for (int line = 1;; ++line) {
    const bool ha = static_cast<bool>(std::getline(a, la));
    const bool hb = static_cast<bool>(std::getline(b, lb));
    if (!ha && !hb) return "";
    if (!ha || !hb || la != lb)
      return "line " + std::to_string(line) + ":\n  golden: " + (ha ? la : "<end>") +
             "\n  now:    " + (hb ? lb : "<end>");
  }
}

}  // namespace

TEST_CASE("codegen golden: kernel text of representative groups, and their results") {
  const bool update = std::getenv("KILN_UPDATE_GOLDEN") != nullptr;
  for (const GoldenCase& c : kCases) {
    INFO("case " << c.name);
    const ir::Graph g = parse(c.ir);
    const codegen::Kernel k = lowerOrFail(g, std::string("k_") + c.name);
    const std::string text = renderBoth(k);
    const fs::path path = goldenPath(c.name);
    if (update) {
      fs::create_directories(path.parent_path());
      std::ofstream(path, std::ios::binary) << text;
    }
    std::ifstream in(path, std::ios::binary);
    INFO("golden file " << path.string() << " (regenerate: KILN_UPDATE_GOLDEN=1)");
    REQUIRE(in.good());
    const std::string golden((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
    INFO(firstDifference(golden, text));
    CHECK(golden == text);
    if (c.run) checkAgainstReference(g, k);
  }
}

TEST_CASE("codegen golden: what the representative kernels must show") {
  auto cuda = [](const char* name) {
    for (const GoldenCase& c : kCases)
      if (std::string(c.name) == name)
        return codegen::renderKernel(lowerOrFail(parse(c.ir), "k"), codegen::Dialect::kCuda);
    FAIL("no case " << name);
    return std::string();
  };
  // The grid-stride loop bounds the tail block: 1000 is not a multiple of the block size.
  static_assert(1000 % codegen::kCudaBlock != 0);
  CHECK_THAT(cuda("cuda_tail_block"), Catch::Contains("kiln_t < 1000LL"));
  CHECK_THAT(cuda("cuda_tail_block"),
             Catch::Contains("kiln_t += (long long)gridDim.x * blockDim.x"));
  // 64-bit element counts and strides.
  CHECK_THAT(cuda("int64_indices"), Catch::Contains("kiln_t < 2500000000LL"));
  CHECK_THAT(cuda("int64_indices"), Catch::Contains("* 50000LL"));
  // A reduction is one block per row, with a block reduction.
  CHECK_THAT(cuda("softmax"), Catch::Contains("kiln_block_reduce("));
}

TEST_CASE("codegen golden: the CUDA C of every representative group compiles with NVRTC") {
  if (!codegen::cudaCompilerAvailable()) {
    WARN("built without NVRTC: " << codegen::cudaCompilerIdentity());
    return;
  }
  std::vector<codegen::Kernel> kernels;
  for (const GoldenCase& c : kCases)
    kernels.push_back(lowerOrFail(parse(c.ir), std::string("k_") + c.name));
  auto ptx = codegen::compileCuda(codegen::renderModule(kernels, codegen::Dialect::kCuda),
                                  "golden.cu", 80);
  INFO(ptx.status().message());
  REQUIRE(ptx.hasValue());
  for (const GoldenCase& c : kCases)
    CHECK_THAT(ptx->ptx, Catch::Contains(std::string(".entry k_") + c.name));
}

TEST_CASE("codegen golden: f16 and bf16 are loaded widened, rounded per op, stored narrowed") {
  // Halves are storage types: arithmetic is f32, each half-typed op result is rounded once (the
  // reference kernels' rule), and the kernels convert bits with the prelude's functions.
  const ir::Graph g = parse(R"(graph g(%x : bf16[4,8], %y : f16[4,8]) {
  %a : bf16[4,8] = relu(%x)
  %b : f32[4,8] = cast(%a) {to="f32"}
  %c : f16[4,8] = cast(%b) {to="f16"}
  %d : f16[4,8] = add(%c, %y)
  return %a, %d
})");
  auto k = codegen::lowerGroup(wholeGraph(g), outputsOf(g), "k");
  INFO(k.status().message());
  REQUIRE(k.hasValue());
  for (codegen::Dialect d : {codegen::Dialect::kCpu, codegen::Dialect::kCuda}) {
    const std::string src = codegen::renderKernel(*k, d);
    INFO(src);
    CHECK_THAT(src, Catch::Contains("kiln_bf16_to_f32(") && Catch::Contains("kiln_f16_to_f32(") &&
                        Catch::Contains("kiln_round_bf16(") && Catch::Contains("kiln_round_f16(") &&
                        Catch::Contains("= kiln_f32_to_bf16(") &&
                        Catch::Contains("= kiln_f32_to_f16("));
  }
  std::vector<codegen::Kernel> kernels{*k};
  auto ptx =
      codegen::compileCuda(codegen::renderModule(kernels, codegen::Dialect::kCuda), "half.cu", 80);
  INFO(ptx.status().message());
  CHECK(ptx.hasValue());
  // f64 and wide integers would round twice through f32: those casts stay reference ops.
  const ir::Graph wide = parse(R"(graph g(%x : f64[4]) {
  %a : bf16[4] = cast(%x) {to="bf16"}
  return %a
})");
  auto refused = codegen::lowerGroup(wholeGraph(wide), outputsOf(wide), "k");
  REQUIRE_FALSE(refused.hasValue());
  CHECK(refused.status().code() == ErrorCode::kUnimplemented);
  CHECK_THAT(refused.status().message(), Catch::Contains("cast from f64 to bf16"));
}

namespace {

// A one-node graph of `op` on f32 [2,3,4,5] inputs (per-channel [3] for a kChannelwise op's
// parameters), required attributes by name, or "" when an attribute has no sample here.
std::string sampleGraphText(const ir::OpInfo& op) {
  // A layout conversion (an op with a `from` layout) reads NCHW and writes NHWC.
  const bool relayout = op.findAttr("from") != nullptr;
  const std::string x = relayout ? "f32[2,3,4,5]@nchw" : "f32[2,3,4,5]";
  std::string attrs;
  for (const ir::AttrSpec& a : op.attrs) {
    if (a.defaultValue) continue;
    std::string v;
    if (a.name == "shape")
      v = "[2,3,4,5]";
    else if (a.name == "to")
      v = relayout ? "\"nhwc\"" : "\"f32\"";
    else if (a.name == "from")
      v = "\"nchw\"";
    else if (a.name == "starts")
      v = "[0]";
    else if (a.name == "ends")
      v = "[1]";
    else if (a.name == "axes")
      v = "[0]";
    else
      return "";
    attrs += (attrs.empty() ? "" : ", ") + a.name + "=" + v;
  }
  std::string params, args;
  for (int i = 0; i < op.minInputs; ++i) {
    const std::string t = op.has(ir::kChannelwise) && i > 0 ? "f32[3]" : x;
    params += (i ? ", " : "") + std::string("%i") + std::to_string(i) + " : " + t;
    args += (i ? ", " : "") + std::string("%i") + std::to_string(i);
  }
  return "graph g(" + params + ") {\n  %y = " + std::string(op.name) + "(" + args + ")" +
         (attrs.empty() ? "" : " {" + attrs + "}") + "\n  return %y\n}";
}

}  // namespace

TEST_CASE("codegen golden: every op lowers to a kernel or has a declared route") {
  std::vector<codegen::Kernel> kernels;
  int generated = 0, library = 0, referenceOnly = 0;
  for (int i = 0; i < ir::kNumOps; ++i) {
    const ir::OpInfo& op = ir::opInfo(static_cast<ir::OpKind>(i));
    INFO("op " << op.name);
    // Every op has its reference kernel: the ground truth, and eager mode's route.
    CHECK(runtime::referenceKernel(op.kind) != nullptr);
    if (op.has(ir::kLibrary)) {
      // A library op runs as a library call (with a reference fallback for other dtypes).
      CHECK(runtime::libraryKernel(op.kind, ir::DType::kF32) != nullptr);
      ++library;
      continue;
    }
    const bool fusable = op.has(ir::kPointwise) || op.has(ir::kChannelwise) ||
                         op.has(ir::kReduction) || op.has(ir::kReshapeLike) ||
                         op.has(ir::kStridedView);
    if (!fusable) {
      ++referenceOnly;  // Groups never hold it: it runs alone on its reference kernel.
      continue;
    }
    // A fusable op must lower: a gap here would make the compiler run it op by op instead.
    const std::string text = sampleGraphText(op);
    INFO(text);
    REQUIRE_FALSE(text.empty());
    auto g = ir::parseGraph(text);
    if (!g.hasValue()) {
      // where(cond, x, y) takes a bool condition; logic ops take bools only.
      std::string t = text;
      t.replace(t.find("%i0 : f32"), 9, "%i0 : bool");
      g = ir::parseGraph(t);
      for (size_t at; !g.hasValue() && (at = t.find(": f32")) != std::string::npos;) {
        t.replace(at, 5, ": bool");
        g = ir::parseGraph(t);
      }
    }
    INFO(g.status().message());
    REQUIRE(g.hasValue());
    auto k = codegen::lowerGroup(wholeGraph(*g), outputsOf(*g), "k_" + std::string(op.name));
    INFO(k.status().message());
    REQUIRE(k.hasValue());
    kernels.push_back(std::move(k).value());
    ++generated;
  }
  // One module with a kernel per fusable op: each call resolves to a prelude function.
  auto object =
      codegen::compileCpp(codegen::renderModule(kernels, codegen::Dialect::kCpu), "every_op");
  INFO(object.status().message());
  REQUIRE(object.hasValue());
  runtime::LoadedObjects loaded;
  REQUIRE(loaded.add(object->bytes, "every_op").isOk());
  for (const codegen::Kernel& k : kernels) {
    INFO(k.name);
    CHECK(loaded.lookup(k.name).hasValue());
  }
  if (codegen::cudaCompilerAvailable()) {
    auto ptx = codegen::compileCuda(codegen::renderModule(kernels, codegen::Dialect::kCuda),
                                    "every_op.cu", 80);
    INFO(ptx.status().message());
    CHECK(ptx.hasValue());
  }
  CHECK(generated + library + referenceOnly == ir::kNumOps);
  CHECK(generated >= 40);
  // conv2d, conv_transpose2d, max_pool2d, avg_pool2d, matmul, gemm, linear, concat, attention;
  // training's conv2d_backward_data, _weight and _bias, max_pool2d_backward, batch_norm_stats,
  // batch_norm_backward_reduce and batch_norm_backward.
  CHECK(library == 16);
}

TEST_CASE("codegen golden: generated unary math matches the reference kernels") {
  // Every unary float pointwise op whose attributes all have defaults, compiled as a one-node
  // kernel, on values across the float range (tiny ones included, where cancellation hides),
  // against its reference kernel: relative error at most 4e-6 (GELU's far negative tail, where
  // rounding -z^2 inside erfc costs about z^2 x 6e-8; everything else is below 3e-7), or an
  // absolute 1e-10 for results that small.
  std::vector<float> xs = {0.f, -0.f, 1e-30f, -1e-30f, 1e-7f, -1e-7f, 1e-4f, -1e-4f};
  for (float v = -30.f; v <= 30.f; v += 0.0625f) xs.push_back(v);
  for (float v : {1e-3f, 3e-3f, 1e-2f, 0.1f, 0.124f, 0.126f, 0.5f, 88.f, 89.f, 100.f, 1e4f}) {
    xs.push_back(v);
    xs.push_back(-v);
  }
  const int64_t n = static_cast<int64_t>(xs.size());
  for (int i = 0; i < ir::kNumOps; ++i) {
    const ir::OpInfo& op = ir::opInfo(static_cast<ir::OpKind>(i));
    if (!op.has(ir::kPointwise) || op.minInputs != 1 || op.maxInputs != 1) continue;
    bool defaults = true;
    for (const ir::AttrSpec& a : op.attrs) defaults = defaults && a.defaultValue.has_value();
    if (!defaults) continue;
    const ir::TensorType f32{ir::DType::kF32, {n}};
    const ir::TensorType ins[] = {f32};
    auto out = ir::inferTypes(op.kind, ins, {});
    if (!out || out.value()[0].dtype != ir::DType::kF32) continue;  // Not float math.
    INFO("op " << op.name);
    const ir::Graph g = parse("graph g(%x : f32[" + std::to_string(n) +
                              "]) {\n  %y = " + std::string(op.name) + "(%x)\n  return %y\n}");
    const codegen::Kernel k = lowerOrFail(g, "k_" + std::string(op.name));
    auto object =
        codegen::compileCpp(codegen::renderModule({&k, 1}, codegen::Dialect::kCpu), k.name);
    REQUIRE(object.hasValue());
    runtime::LoadedObjects loaded;
    REQUIRE(loaded.add(object->bytes, k.name).isOk());
    auto fn = loaded.lookupFunction<void(void* const*, long long, long long)>(k.name);
    REQUIRE(fn.hasValue());
    runtime::Tensor x = *runtime::Tensor::empty(ir::DType::kF32, {n});
    std::copy(xs.begin(), xs.end(), x.data<float>());
    runtime::Tensor y = *runtime::Tensor::empty(ir::DType::kF32, {n});
    void* args[] = {x.rawData(), y.rawData()};
    (*fn)(args, 0, k.numUnits());
    auto want = runtime::runReferenceOp(op.kind, {x});
    REQUIRE(want.hasValue());
    const float* w = (*want)[0].data<float>();
    for (int64_t j = 0; j < n; ++j) {
      const double a = y.data<float>()[j], b = w[j];
      if (std::isnan(a) || std::isnan(b)) {
        INFO("x = " << xs[j] << ": " << a << " vs " << b);
        CHECK(std::isnan(a) == std::isnan(b));
        continue;
      }
      if (a == b) continue;
      INFO("x = " << xs[j] << ": generated " << a << ", reference " << b);
      CHECK((std::abs(a - b) <= 4e-6 * std::abs(b) || std::abs(a - b) <= 1e-10));
    }
  }
}

// Horizontal kernels (codegen::horizontalKernel): independent pointwise kernels as one entry
// point whose work units are each part's in turn; any split of [0, units) over threads computes
// what the parts compute alone; a part reading another's output, or a reduction, is refused.
TEST_CASE("codegen: horizontal kernels run their parts over any split of the units") {
  const ir::Graph g = parse(R"(
graph g(%a : f32[3,5000], %b : f32[7], %c : f32[7]) {
  %x : f32[3,5000] = mul(%a, %a)
  %y : f32[7] = add(%b, %c)
  %z : f32[7] = sub(%c, %b)
  %w : f32[3,5000] = exp(%a)
  %s : f32[3,1] = reduce_sum(%a) {axes=[1]}
  %v : f32[3,5000] = neg(%x)
  return %x, %y, %z, %w, %s, %v
})");
  const std::unordered_set<const ir::Value*> outs = outputsOf(g);
  std::vector<codegen::Kernel> parts;
  for (size_t i = 0; i < 4; ++i) {
    ir::FusionGroup one;
    one.kind = ir::GroupKind::kPointwise;
    one.nodes = {g.nodes()[i]};
    auto k = codegen::lowerGroup(one, outs, "k" + std::to_string(i));
    REQUIRE(k.hasValue());
    parts.push_back(std::move(*k));
  }
  auto h = codegen::horizontalKernel("h", parts);
  INFO(h.status().message());
  REQUIRE(h.hasValue());
  REQUIRE(h->parts.size() == 4);
  CHECK(h->numUnits() == 4 + 1 + 1 + 4);  // 15,000 elements are 4 chunks of 4,096.
  CHECK(h->numElements() == 2 * 15000 + 2 * 7);
  // Each input once (a, b, c), then the four outputs.
  REQUIRE(h->args.size() == 7);
  CHECK(h->partArgs[1] == std::vector<int>{1, 2, 4});
  CHECK(h->partArgs[2] == std::vector<int>{2, 1, 5});
  const std::string text = codegen::renderKernel(*h, codegen::Dialect::kCpu);
  CHECK_THAT(text, Catch::Contains("static void h_p3(") &&
                       Catch::Contains("extern \"C\" void h(void* const* kiln_args"));
  // CUDA C (the CUDA check of a CPU compile): each part a kernel of its own, which NVRTC takes.
  const std::string cuda = codegen::renderKernel(*h, codegen::Dialect::kCuda);
  CHECK_THAT(cuda,
             Catch::Contains("__global__ void h_p0(") && Catch::Contains("__global__ void h_p3("));
  if (codegen::cudaCompilerAvailable()) {
    auto ptx = codegen::compileCuda(codegen::renderModule({&*h, 1}, codegen::Dialect::kCuda),
                                    "horizontal.cu", 80);
    INFO(ptx.status().message());
    CHECK(ptx.hasValue());
  }
  // Joining a horizontal kernel flattens it.
  auto again = codegen::horizontalKernel("h2", {*h, parts[0]});
  CHECK_FALSE(again.hasValue());  // Two parts would write %x.
  auto flat = codegen::horizontalKernel(
      "h2", {codegen::horizontalKernel("i", {parts[0], parts[1]}).value(), parts[2]});
  REQUIRE(flat.hasValue());
  CHECK(flat->parts.size() == 3);

  auto object = codegen::compileCpp(codegen::renderModule({&*h, 1}, codegen::Dialect::kCpu), "h");
  INFO(object.status().message());
  REQUIRE(object.hasValue());
  runtime::LoadedObjects loaded;
  REQUIRE(loaded.add(object->bytes, "h").isOk());
  auto fn = loaded.lookupFunction<void(void* const*, long long, long long)>("h");
  REQUIRE(fn.hasValue());
  const std::vector<runtime::Tensor> ins = sampleInputs(g);
  runtime::EagerExecutor eager(g);
  auto expected = eager.run(ins);
  REQUIRE(expected.hasValue());
  for (int64_t threads : {1, 2, 3, 7, 10}) {
    std::vector<runtime::Tensor> got;
    for (size_t o = 0; o < 4; ++o) {
      got.push_back(*runtime::Tensor::empty(ir::DType::kF32, g.outputs()[o]->type().shape));
      std::fill_n(got.back().data<float>(), got.back().numElements(), -7.f);
    }
    std::vector<void*> args{ins[0].rawData(), ins[1].rawData(), ins[2].rawData()};
    for (auto& t : got) args.push_back(t.rawData());
    const int64_t units = h->numUnits();
    for (int64_t t = threads; t-- > 0;)  // Out of order, as threads may run.
      (*fn)(args.data(), units * t / threads, units * (t + 1) / threads);
    for (size_t o = 0; o < 4; ++o)
      for (int64_t i = 0; i < got[o].numElements(); ++i) {
        INFO(threads << " splits, output " << o << " element " << i);
        REQUIRE(got[o].data<float>()[i] == Approx((*expected)[o].data<float>()[i]).epsilon(1e-6));
      }
  }

  ir::FusionGroup reduction;
  reduction.kind = ir::GroupKind::kReduction;
  reduction.nodes = {g.nodes()[4]};
  reduction.anchor = g.nodes()[4];
  auto r = codegen::lowerGroup(reduction, outs, "r");
  REQUIRE(r.hasValue());
  auto refused = codegen::horizontalKernel("bad", {parts[0], *r});
  REQUIRE_FALSE(refused.hasValue());
  CHECK_THAT(refused.status().message(), Catch::Contains("reduction"));
  ir::FusionGroup reader;
  reader.kind = ir::GroupKind::kPointwise;
  reader.nodes = {g.nodes()[5]};
  auto v = codegen::lowerGroup(reader, outs, "v");
  REQUIRE(v.hasValue());
  refused = codegen::horizontalKernel("bad", {parts[0], *v});
  REQUIRE_FALSE(refused.hasValue());
  CHECK_THAT(refused.status().message(), Catch::Contains("reads x"));
}
