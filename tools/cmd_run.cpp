// `kiln run` and `kiln export`: execute a model on real or seeded inputs; write it to disk.
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "compiler/artifact.h"
#include "compiler/compile.h"
#include "compiler/eager_kernels.h"
#include "compiler/jit.h"
#include "compiler/staged.h"
#include "frontends/json/graph_json.h"
#include "frontends/npy/npy.h"
#include "frontends/onnx/onnx_import.h"
#include "ir/timing.h"
#include "runtime/eager.h"
#include "tools/cli.h"

namespace kiln::cli {

namespace {

using runtime::Tensor;

// The inputs: --input files (NAME=FILE or in order), else seeded random values. When the files'
// shapes differ from the graph's only in its symbolic dims (Value::dimNames) and `specializer`
// is set, `g` is made again for them first (an ONNX model is imported again).
Expected<std::vector<Tensor>> gatherInputs(ir::Graph& g, const Args& args,
                                           const ir::GraphSpecializer& specializer = {}) {
  const auto& files = args.all("input");
  std::vector<Tensor> inputs(g.inputs().size());
  if (files.empty()) return randomInputs(inputTypes(g), args);
  if (files.size() != inputs.size())
    return invalidArgument("the model has " + std::to_string(inputs.size()) + " inputs, got " +
                           std::to_string(files.size()) + " --input files");
  std::vector<ir::TensorData> data(inputs.size());
  std::vector<std::string> paths(inputs.size());
  for (size_t i = 0; i < files.size(); ++i) {
    std::string path = files[i];
    size_t slot = i;
    if (auto eq = path.find('='); eq != std::string::npos && !std::filesystem::exists(path)) {
      const std::string name = path.substr(0, eq);
      path = path.substr(eq + 1);
      slot = inputs.size();
      for (size_t k = 0; k < g.inputs().size(); ++k)
        if (g.inputs()[k]->name() == name) slot = k;
      if (slot == inputs.size())
        return invalidArgument("--input " + files[i] + ": the model has no input named '" + name +
                               "'");
    }
    KILN_ASSIGN_OR_RETURN(data[slot], frontends::readNpy(path));
    paths[slot] = path;
  }
  std::vector<ir::TensorType> types;
  bool same = true;
  for (size_t i = 0; i < data.size(); ++i) {
    types.push_back({data[i].dtype(), data[i].shape()});
    same = same && types[i].dtype == g.inputs()[i]->type().dtype &&
           types[i].shape == g.inputs()[i]->type().shape;
  }
  if (!same && specializer && compiler::checkSignature(g, types)) {
    KILN_ASSIGN_OR_RETURN(g, specializer(types));
  }
  for (size_t i = 0; i < data.size(); ++i) {
    const ir::TensorType& want = g.inputs()[i]->type();
    if (data[i].dtype() != want.dtype || data[i].shape() != want.shape) {
      Status why = compiler::checkSignature(g, types);
      return invalidArgument(paths[i] + ": input '" + g.inputs()[i]->name() + "' expects " +
                             ir::TensorType{want.dtype, want.shape}.toString() +
                             ", the file holds " + data[i].type().toString() +
                             (why ? "" : " (" + why.message() + ")"));
    }
    inputs[i] = Tensor::fromData(data[i]);
  }
  return inputs;
}

// What a run produced, whichever way it ran.
struct RunResult {
  std::string mode;  // "eager", "compiled" or "artifact".
  std::vector<std::string> outputNames;
  std::vector<Tensor> outputs;
  double latencyMs = 0;
  int64_t peakBytes = 0, steps = 0;
  bool stages = false;  // `steps` counts the stages made (a model run in stages).
};

// Writes the --output files (all or none) and prints or --json's the summary.
int reportRun(const Args& args, const RunResult& r);

nlohmann::json summarize(const std::string& name, const Tensor& t) {
  nlohmann::json j{
      {"name", name}, {"dtype", std::string(ir::dtypeName(t.dtype()))}, {"shape", t.shape()}};
  const int64_t n = t.numElements();
  double mn = INFINITY, mx = -INFINITY, sum = 0;
  bool finite = true;
  std::vector<double> head;
  for (int64_t i = 0; i < n; ++i) {
    const double v = t.elementAsDouble(i);
    finite = finite && std::isfinite(v);
    mn = std::min(mn, v);
    mx = std::max(mx, v);
    sum += v;
    if (i < 8) head.push_back(v);
  }
  j["min"] = n ? mn : 0.0;
  j["max"] = n ? mx : 0.0;
  j["mean"] = n ? sum / static_cast<double>(n) : 0.0;
  j["all_finite"] = finite;
  j["first"] = head;
  return j;
}

}  // namespace

// An ONNX model with nodes whose output size depends on run-time values (NonZero), run in stages
// (compiler::StagedModule), compiled or --eager.
int runStaged(const Args& args) {
  auto batch = args.intValue("batch", 1, 1, 1 << 20);
  if (!batch) return reportError("run", batch.status());
  frontends::OnnxImportOptions onnx;
  onnx.defaultBatch = *batch;
  auto staged = frontends::onnxStages(args.positional[0], onnx);
  if (!staged) return reportError("run", staged.status());
  const auto& outFiles = args.all("output");
  if (!outFiles.empty() && outFiles.size() != staged->outputs.size())
    return reportError(
        "run",
        invalidArgument("the model has " + std::to_string(staged->outputs.size()) +
                        " outputs, got " + std::to_string(outFiles.size()) + " --output files"));
  // The inputs as a graph of inputs only, for reading --input files (any sizes: each stage is
  // made for them) or seeding them.
  auto signature = [&](std::span<const ir::TensorType> types) -> Expected<ir::Graph> {
    if (types.size() != staged->inputs.size())
      return invalidArgument("the model has " + std::to_string(staged->inputs.size()) +
                             " inputs, got " + std::to_string(types.size()));
    ir::Graph g(args.positional[0]);
    for (size_t i = 0; i < types.size(); ++i)
      KILN_TRY(g.addInput(staged->inputs[i], types[i]).status());
    return g;
  };
  auto g = signature(staged->inputTypes);
  if (!g) return reportError("run", g.status());
  auto inputs = gatherInputs(*g, args, signature);
  if (!inputs) return reportError("run", inputs.status());
  compiler::CompileOptions options;
  const bool eager = args.flag("eager");
  if (eager) {
    auto backend = deviceFromArgs(args);
    if (!backend) return reportError("run", backend.status());
    options.backend = *backend;
  } else {
    auto opts = compileOptionsFromArgs(args);
    if (!opts) return reportError("run", opts.status());
    options = std::move(*opts);
  }
  compiler::StagedModule module(*staged, options, eager);
  const auto start = std::chrono::steady_clock::now();
  auto outputs = module(*inputs);
  const double ms = msSince(start);
  if (!outputs) return reportError("run", outputs.status());
  if (!args.flag("json"))
    for (const std::string& line : module.log()) std::printf("%s\n", line.c_str());
  RunResult r;
  r.mode = eager ? "eager" : "compiled";
  r.outputNames = staged->outputs;
  r.outputs = std::move(*outputs);
  r.latencyMs = ms;  // Making and compiling the stages included.
  r.steps = module.stagesMade();
  r.stages = true;
  return reportRun(args, r);
}

int runRun(const Args& args) {
  if (!args.positional.empty() && isArtifactPath(args.positional[0])) return runArtifact(args);
  auto g = loadModelFromArgs(args);
  if (!g && frontends::needsStages(g.status()) &&
      std::filesystem::path(args.positional[0]).extension() == ".onnx")
    return runStaged(args);
  if (!g) return reportError("run", g.status());
  const auto& outFiles = args.all("output");
  if (!outFiles.empty() && outFiles.size() != g->outputs().size())
    return reportError(
        "run",
        invalidArgument("the model has " + std::to_string(g->outputs().size()) + " outputs, got " +
                        std::to_string(outFiles.size()) + " --output files"));
  ir::GraphSpecializer specializer;
  if (std::filesystem::path(args.positional[0]).extension() == ".onnx") {
    auto made = frontends::onnxSpecializer(args.positional[0]);
    if (!made) return reportError("run", made.status());
    specializer = std::move(*made);
  }
  auto inputs = gatherInputs(*g, args, specializer);
  if (!inputs) return reportError("run", inputs.status());

  const bool eager = args.flag("eager");
  RunResult r;
  for (const ir::Value* o : g->outputs()) r.outputNames.push_back(o->name());
  r.mode = eager ? "eager" : "compiled";
  if (eager) {
    // --max-memory: the weights first, then every tensor the run allocates.
    auto limit = memoryLimit(args);
    if (!limit) return reportError("run", limit.status());
    if (*limit > 0) {
      int64_t weights = 0;
      for (const ir::Value* p : g->parameters())
        weights += static_cast<int64_t>(p->data().byteSize());
      if (weights >= *limit)
        return reportError(
            "run", resourceExhausted("the model's weights (" + std::to_string(weights) +
                                     " bytes) alone exceed the memory limit of " +
                                     std::to_string(*limit) + " bytes; raise --max-memory"));
      runtime::cpuAllocator().setLimit(*limit - weights);
    }
    auto backend = deviceFromArgs(args);
    if (!backend) return reportError("run", backend.status());
    compiler::CompileOptions kernelOptions;
    if (auto d = args.value("cache-dir")) kernelOptions.cacheDir = *d;
    if (auto p = args.value("precision")) {
      auto precision = compiler::parsePrecision(*p);
      if (!precision) return reportError("run", precision.status());
      kernelOptions.precision = *precision;
    }
    if (Status st = compiler::checkPrecision(kernelOptions.precision, **backend); !st)
      return reportError("run", st);
    auto eagerGraph = compiler::withPrecision(*g, kernelOptions.precision);
    if (!eagerGraph) return reportError("run", eagerGraph.status());
    runtime::EagerExecutor exec(*eagerGraph, *backend);
    if (Status st = compiler::useDeviceKernels(exec, *backend, kernelOptions); !st)
      return reportError("run", st);
    auto outputs = exec.run(*inputs);
    if (!outputs) return reportError("run", outputs.status());
    r.outputs = std::move(*outputs);
    r.latencyMs = exec.lastStats().totalMs;
    r.peakBytes = exec.lastStats().peakActivationBytes;
    r.steps = static_cast<int64_t>(g->numNodes());
  } else {
    auto opts = compileOptionsFromArgs(args);
    if (!opts) return reportError("run", opts.status());
    auto cm = compiler::compile(*g, *opts);
    if (!cm) return reportError("run", cm.status());
    auto outputs = (*cm)->run(*inputs);
    if (!outputs) return reportError("run", outputs.status());
    r.outputs = std::move(*outputs);
    r.latencyMs = (*cm)->lastStats().totalMs;
    r.peakBytes = (*cm)->report().arenaBytes;
    r.steps = static_cast<int64_t>((*cm)->plan().steps.size());
  }
  return reportRun(args, r);
}

int runArtifact(const Args& args) {
  if (args.flag("eager"))
    return reportError("run", invalidArgument(args.positional[0] +
                                              " is a compiled artifact; --eager needs the model "
                                              "(a zoo name, .json or .onnx)"));
  runtime::LoadOptions options;
  auto limit = memoryLimit(args);
  if (!limit) return reportError("run", limit.status());
  options.maxMemoryBytes = *limit;
  if (!args.flag("no-recompile")) options.recompile = compiler::recompileForHost;
  options.log = &std::cerr;
  auto threads = args.intValue("threads", 0, 0, 1024);
  if (!threads) return reportError("run", threads.status());
  options.threads = static_cast<int>(*threads);
  auto backend = deviceFromArgs(args);
  if (!backend) return reportError("run", backend.status());
  options.backend = *backend;
  options.warmup = false;  // One call: a warm-up run would only double it.
  auto model = kiln::load(args.positional[0], options);
  if (!model) return reportError("run", model.status());
  const runtime::ArtifactInfo& info = (*model)->info();
  const auto& outFiles = args.all("output");
  if (!outFiles.empty() && outFiles.size() != info.outputs.size())
    return reportError(
        "run",
        invalidArgument("the model has " + std::to_string(info.outputs.size()) + " outputs, got " +
                        std::to_string(outFiles.size()) + " --output files"));
  // The compiled signature as a graph of inputs only, for reading and checking --input files.
  ir::Graph signature(info.modelName);
  for (size_t i = 0; i < info.inputs.size(); ++i) {
    auto in = signature.addInput(info.inputNames[i], info.inputs[i]);
    if (!in) return reportError("run", in.status());
  }
  auto inputs = gatherInputs(signature, args);
  if (!inputs) return reportError("run", inputs.status());
  auto outputs = (*model)->run(*inputs);
  if (!outputs) return reportError("run", outputs.status());
  RunResult r;
  r.mode = "artifact";
  r.outputNames = info.outputNames;
  r.outputs = std::move(*outputs);
  r.latencyMs = (*model)->lastStats().totalMs;
  r.peakBytes = info.arenaBytes;
  r.steps = static_cast<int64_t>(info.numSteps);
  return reportRun(args, r);
}

namespace {

int reportRun(const Args& args, const RunResult& r) {
  const auto& outFiles = args.all("output");
  const std::vector<runtime::Tensor>* outputs = &r.outputs;
  // Write every output or none: on a failure, remove the ones already written.
  for (size_t i = 0; i < outFiles.size(); ++i) {
    Status st = frontends::writeNpy(outFiles[i], (*outputs)[i].toData());
    if (!st.isOk()) {
      for (size_t k = 0; k < i; ++k) std::filesystem::remove(outFiles[k]);
      return reportError("run", st);
    }
  }

  nlohmann::json j;
  j["model"] = args.positional[0];
  j["mode"] = r.mode;
  j["latency_ms"] = r.latencyMs;
  j["peak_activation_bytes"] = r.peakBytes;
  j["steps"] = r.steps;
  j["outputs"] = nlohmann::json::array();
  for (size_t i = 0; i < outputs->size(); ++i)
    j["outputs"].push_back(summarize(r.outputNames[i], (*outputs)[i]));
  if (args.flag("json")) {
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  if (r.stages)
    std::printf("ran %s %s in %lld stages in %.2f ms (making and compiling them included)\n",
                args.positional[0].c_str(), r.mode == "eager" ? "eagerly" : "compiled",
                static_cast<long long>(r.steps), r.latencyMs);
  else
    std::printf(
        "ran %s %s: %lld steps in %.2f ms, peak activations %.2f MB\n", args.positional[0].c_str(),
        r.mode == "eager"      ? "eagerly"
        : r.mode == "artifact" ? "from the artifact"
                               : "compiled",
        static_cast<long long>(r.steps), r.latencyMs, static_cast<double>(r.peakBytes) / 1e6);
  for (const auto& o : j["outputs"]) {
    std::printf("%%%s : %s%s  min %.6g  max %.6g  mean %.6g%s\n  first:",
                o["name"].get<std::string>().c_str(), o["dtype"].get<std::string>().c_str(),
                ir::shapeToString(o["shape"].get<ir::Shape>()).c_str(), o["min"].get<double>(),
                o["max"].get<double>(), o["mean"].get<double>(),
                o["all_finite"].get<bool>() ? "" : "  (NOT FINITE)");
    for (double v : o["first"]) std::printf(" %.6g", v);
    std::printf("\n");
  }
  for (size_t i = 0; i < outFiles.size(); ++i) std::printf("wrote %s\n", outFiles[i].c_str());
  return kExitOk;
}

}  // namespace

int runExport(const Args& args) {
  auto out = args.value("output");
  if (!out) return reportError("export", invalidArgument("missing -o FILE.json"));
  if (std::filesystem::path(*out).extension() != ".json")
    return reportError("export", invalidArgument(*out + ": the output must be a .json file"));
  auto g = loadModelFromArgs(args);
  if (!g) return reportError("export", g.status());
  Status st = frontends::saveGraphJson(*g, *out);
  if (!st.isOk()) return reportError("export", st);
  if (args.flag("json")) {
    std::cout << nlohmann::json{{"graph", *out}, {"parameters", g->numTrainableParameters()}}.dump(
                     2)
              << "\n";
  } else {
    std::cout << "wrote " << *out << " and its weights file\n";
  }
  return kExitOk;
}

}  // namespace kiln::cli
