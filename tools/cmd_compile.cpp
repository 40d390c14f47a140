// `kiln compile`: JIT-compile a model and show what happened (passes, fusion, kernels, memory
// plan, cache), or write an ahead-of-time artifact.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "codegen/prelude.h"
#include "compiler/artifact.h"
#include "compiler/compile.h"
#include "compiler/jit.h"
#include "frontends/onnx/onnx_import.h"
#include "runtime/cpu/compute_threads.h"
#include "runtime/gpu/gpu_backend.h"
#include "tools/cli.h"

namespace kiln::cli {

namespace {

std::set<std::string> splitList(const std::vector<std::string>& values) {
  std::set<std::string> out;
  for (const auto& v : values) {
    std::stringstream ss(v);
    for (std::string item; std::getline(ss, item, ',');)
      if (!item.empty()) out.insert(item);
  }
  return out;
}

Status writeKernels(const compiler::CompileReport& r, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return ioError(dir + ": cannot create the directory: " + ec.message());
  for (const auto& k : r.kernels) {
    for (const auto& [ext, text] :
         {std::pair<std::string, const std::string*>{".cpp", &k.cpp}, {".cu", &k.cuda}}) {
      if (text->empty()) continue;
      const std::string path = (std::filesystem::path(dir) / (k.name + ext)).string();
      std::ofstream f(path);
      // Self-contained: the kernel prelude then the kernel, so that the file compiles alone
      // (nvcc -ptx -arch=compute_90 NAME.cu; clang++ -c NAME.cpp).
      f << "// kiln " << k.group << " kernel " << k.name << " (module " << k.module << ")\n"
        << codegen::kernelPrelude() << "\n"
        << *text;
      if (!f) return ioError(path + ": write failed");
    }
  }
  return Status::ok();
}

}  // namespace

Expected<int64_t> memoryLimit(const Args& args) {
  const auto v = args.value("max-memory");
  if (!v) return int64_t{0};
  char* end = nullptr;
  const double n = std::strtod(v->c_str(), &end);
  const std::string suffix(end);
  const double scale = suffix.empty() || suffix == "B"   ? 1
                       : suffix == "K" || suffix == "KB" ? 1e3
                       : suffix == "M" || suffix == "MB" ? 1e6
                       : suffix == "G" || suffix == "GB" ? 1e9
                                                         : 0;
  if (v->empty() || end == v->c_str() || scale == 0 || !(n * scale >= 1) || n * scale > 1e18)
    return invalidArgument("--max-memory expects a size such as 512M, 2G or 1000000, got '" + *v +
                           "'");
  return static_cast<int64_t>(n * scale);
}

std::vector<OptionSpec> compileOptionSpecs() {
  return {{"device", true,
           "where the model runs: cpu (default), cuda (the first GPU), or emu (the CUDA "
           "backend's kernels run on this CPU with CUDA semantics, for testing)"},
          {"precision", true,
           "arithmetic of convolutions and matrix products: fp32 (default; no TF32), tf32 "
           "(cuda/emu: multiplicands rounded to TF32 on tensor cores, fp32 accumulation), or "
           "bf16/fp16 (cuda/emu autocast: products read bf16/fp16 operands, accumulate in fp32 "
           "and round their results to bf16/fp16; everything else computes in fp32)"},
          {"no-horizontal-fusion", false,
           "run each pointwise kernel alone instead of joining consecutive independent ones "
           "into one (an optimizer's parameter updates), to measure what joining them gives"},
          {"no-cuda-graph", false,
           "on cuda/emu, enqueue every step at every call instead of replaying a CUDA graph "
           "recorded at the first"},
          {"disable-pass", true, "skip a pass (repeatable, or comma-separated)", true},
          {"dump-after", true, "print the IR after a pass, or 'all' (to stderr)", true},
          {"time-passes", false, "print each pass's time (to stderr)"},
          {"verify-each", false, "run the IR verifier after every pass"},
          {"no-cache", false, "do not read or write the kernel cache"},
          {"cache-dir", true, "kernel cache directory (default $KILN_CACHE_DIR or ~/.cache/kiln)"},
          {"threads", true, "threads for kernels (default: all cores)"},
          {"max-memory", true,
           "fail before allocating when the compiled model needs more: bytes, or with K, M, G "
           "(powers of 1000); concurrent calls beyond it wait"},
          {"target-cpu", true,
           "CPU for generated code: native (default, or $KILN_TARGET_CPU) or an LLVM CPU name, "
           "e.g. x86-64-v3 for an artifact that runs on every AVX2 machine"},
          {"autotune", false, "time each convolution's algorithms (the default for compile)"},
          {"no-autotune", false, "pick convolution algorithms by heuristic"}};
}

Expected<std::shared_ptr<runtime::Backend>> deviceFromArgs(const Args& args) {
  const auto d = args.value("device");
  return runtime::gpu::backendForDevice(d ? *d : "cpu");
}

Expected<compiler::CompileOptions> compileOptionsFromArgs(const Args& args) {
  compiler::CompileOptions o;
  KILN_ASSIGN_OR_RETURN(o.backend, deviceFromArgs(args));
  o.cudaGraphs = !args.flag("no-cuda-graph");
  o.fusion.horizontal = !args.flag("no-horizontal-fusion");
  if (const auto p = args.value("precision")) {
    KILN_ASSIGN_OR_RETURN(o.precision, compiler::parsePrecision(*p));
  }
  o.disabledPasses = splitList(args.all("disable-pass"));
  o.dumpAfter = splitList(args.all("dump-after"));
  o.timePasses = args.flag("time-passes");
  o.verifyEachPass = args.flag("verify-each");
  o.useCache = !args.flag("no-cache");
  if (auto d = args.value("cache-dir")) o.cacheDir = *d;
  KILN_ASSIGN_OR_RETURN(int64_t threads, args.intValue("threads", 0, 0, 1024));
  o.runThreads = static_cast<int>(threads);
  if (threads > 0) runtime::setNumThreads(static_cast<int>(threads));
  o.autotune = args.flag("autotune") && !args.flag("no-autotune");
  KILN_ASSIGN_OR_RETURN(o.maxMemoryBytes, memoryLimit(args));
  if (auto t = args.value("target-cpu")) {
    if (t->empty()) return invalidArgument("--target-cpu needs a CPU name (or 'native')");
    o.targetCpu = *t;
  }
  // Checked here so that a bad name is a usage error before any work.
  KILN_TRY(compiler::checkTargetCpu(o.targetCpu));
  o.log = &std::cerr;
  return o;
}

namespace {

// --shapes name=1x3x224x224,other=2x8: the graph specialized for those input shapes (symbolic
// dims of ONNX models re-imported; static dims checked as kiln::jit does).
Expected<ir::Graph> applyShapes(const Args& args, ir::Graph g) {
  const auto spec = args.value("shapes");
  if (!spec) return g;
  std::vector<ir::TensorType> types;
  for (const ir::Value* in : g.inputs()) types.push_back(in->type());
  for (const std::string& item : splitList({*spec})) {
    const size_t eq = item.find('=');
    const std::string name = item.substr(0, eq);
    size_t slot = types.size();
    for (size_t i = 0; i < g.inputs().size(); ++i)
      if (g.inputs()[i]->name() == name) slot = i;
    if (eq == std::string::npos || slot == types.size())
      return invalidArgument("--shapes " + item + ": expected NAME=DxDx... with NAME one of the " +
                             "model's inputs");
    ir::Shape shape;
    std::stringstream dims(item.substr(eq + 1));
    for (std::string d; std::getline(dims, d, 'x');) {
      char* end = nullptr;
      const long long v = std::strtoll(d.c_str(), &end, 10);
      if (d.empty() || *end != '\0' || v < 0 || v > (1LL << 40))
        return invalidArgument("--shapes " + item + ": '" + d + "' is not a dimension");
      shape.push_back(v);
    }
    types[slot].shape = std::move(shape);
  }
  KILN_TRY(compiler::checkSignature(g, types));
  if (std::filesystem::path(args.positional[0]).extension() == ".onnx") {
    KILN_ASSIGN_OR_RETURN(auto specializer, frontends::onnxSpecializer(args.positional[0]));
    return specializer(types);
  }
  return compiler::respecialize(g, types);
}

}  // namespace

int runCompile(const Args& args) {
  auto loaded = loadModelFromArgs(args);
  if (!loaded) return reportError("compile", loaded.status());
  auto g = applyShapes(args, std::move(*loaded));
  if (!g) return reportError("compile", g.status());
  auto opts = compileOptionsFromArgs(args);
  if (!opts) return reportError("compile", opts.status());
  const auto artifact = args.value("output");
  if (artifact && !isArtifactPath(*artifact))
    return reportError("compile",
                       invalidArgument(*artifact + ": an artifact's name ends in .kiln"));
  // An artifact carries PTX for the CUDA kernels: NVRTC compiles them when it is available.
  opts->cudaCheck = args.flag("cuda-check") || args.value("emit-kernels").has_value() || artifact;
  opts->autotune = !args.flag("no-autotune");  // compile autotunes by default
  auto cm = compiler::compile(*g, *opts);
  if (!cm) return reportError("compile", cm.status());
  const auto& r = (*cm)->report();
  if (artifact) {
    std::string name = args.positional[0];
    if (name.find('/') != std::string::npos || name.find('.') != std::string::npos)
      name = std::filesystem::path(name).stem().string();
    Status st = compiler::saveArtifact(**cm, *artifact, name);
    if (!st.isOk()) return reportError("compile", st);
    if (!args.flag("json"))
      std::printf("wrote %s (%.2f MB)\n", artifact->c_str(),
                  static_cast<double>(std::filesystem::file_size(*artifact)) / 1e6);
  }
  if (auto dir = args.value("emit-kernels")) {
    Status st = writeKernels(r, *dir);
    if (!st.isOk()) return reportError("compile", st);
  }
  if (args.flag("json")) {
    nlohmann::json j{{"model", args.positional[0]},
                     {"nodes", r.nodesIn},
                     {"nodes_optimized", r.nodesOptimized},
                     {"generated_kernels", r.generatedKernels},
                     {"compiled_kernels", r.compiledKernels},
                     {"library_or_reference_steps", r.referenceSteps},
                     {"steps", (*cm)->plan().steps.size()},
                     {"aliases", r.aliases},
                     {"compile_ms", r.totalMs},
                     {"passes_ms", r.passesMs},
                     {"kernel_compile_ms", r.compileMs},
                     {"cache_hits", r.cacheHits},
                     {"cache_misses", r.cacheMisses},
                     {"arena_bytes", r.arenaBytes},
                     {"arena_lower_bound_bytes", r.arenaLowerBound},
                     {"inplace_reuses", r.inplaceReuses},
                     {"cuda_kernels_checked", r.cudaKernelsChecked},
                     {"layout_conversions", r.layoutConversions},
                     {"conv_algorithms", r.algorithmChoices},
                     {"cuda_errors", r.cudaErrors},
                     {"target_cpu", (*cm)->code().cpu}};
    if (artifact) j["artifact"] = *artifact;
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf(
        "compiled %s in %.1f ms (passes %.1f, fusion %.1f, codegen %.1f, kernel compile %.1f, plan "
        "%.1f), then %.1f ms preparing library calls\n",
        args.positional[0].c_str(), r.totalMs, r.passesMs, r.fusionMs, r.codegenMs, r.compileMs,
        r.planMs, r.prepareMs);
    std::printf(
        "nodes %d -> %d after passes; %zu steps: %d generated kernels (%d compiled, the others "
        "equal to one of them), %d library/reference calls, %d copies; %d reshapes and slices "
        "became "
        "views\n",
        r.nodesIn, r.nodesOptimized, (*cm)->plan().steps.size(), r.generatedKernels,
        r.compiledKernels, r.referenceSteps, r.copySteps, r.aliases);
    std::printf("arena %.2f MB (lower bound %.2f MB, %d in-place reuses); weights %.2f MB\n",
                static_cast<double>(r.arenaBytes) / 1e6,
                static_cast<double>(r.arenaLowerBound) / 1e6, r.inplaceReuses,
                static_cast<double>(r.parameterBytes) / 1e6);
    std::printf("kernel cache: %d hits, %d misses; %d layout conversions; code for CPU %s\n",
                r.cacheHits, r.cacheMisses, r.layoutConversions,
                (*cm)->code().cpu.empty() ? "(no kernels)" : (*cm)->code().cpu.c_str());
    if (r.hostSteps)
      std::printf("%d op(s) run on the host (no device kernel yet; --verbose lists them)\n",
                  r.hostSteps);
    if (r.cudaKernelsChecked)
      std::printf("CUDA: %d kernels compiled by NVRTC for sm_80 and sm_90, %zu errors\n",
                  r.cudaKernelsChecked, r.cudaErrors.size());
    for (const auto& e : r.cudaErrors) std::printf("  %s\n", e.c_str());
  }
  if (args.flag("explain-fusion")) std::cout << r.fusionExplanation;
  if (args.flag("explain-algos"))
    for (const auto& line : r.algorithmChoices) std::cout << "algo " << line << "\n";
  if (args.flag("explain-cache"))
    for (const auto& line : r.cacheExplanations) std::cout << "cache " << line << "\n";
  if (args.flag("explain-fusion") || args.flag("verbose"))
    for (const auto& m : r.remarks) std::cout << "note: " << m << "\n";
  return r.cudaErrors.empty() ? kExitOk : kExitInternal;
}

}  // namespace kiln::cli
