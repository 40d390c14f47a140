// `kiln bench`: eager and compiled execution side by side (latency, throughput, peak memory,
// compile time), or with --concurrency a serving benchmark (tools/serve_bench.h).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "compiler/compile.h"
#include "compiler/eager_kernels.h"
#include "compiler/profile.h"
#include "runtime/cpu/compute_threads.h"
#include "runtime/eager.h"
#include "tools/cli.h"
#include "tools/serve_bench.h"

namespace kiln::cli {

namespace {

// kiln bench MODEL --concurrency ...: the compiled model served from client threads.
int serveCompiled(const Args& args, const ir::Graph& g, const compiler::CompileOptions& opts) {
  auto cm = compiler::compile(g, opts);
  if (!cm) return reportError("bench", cm.status());
  auto inputs = randomInputs(inputTypes(g), args);
  if (!inputs) return reportError("bench", inputs.status());
  compiler::CompiledModel& model = **cm;
  const int64_t batch = g.inputs().empty() || g.inputs()[0]->type().shape.empty()
                            ? 1
                            : g.inputs()[0]->type().shape[0];
  return runServeBench(args, args.positional[0] + " compiled", batch,
                       [&] { return model.run(*inputs).status(); });
}

}  // namespace

int runBench(const Args& args) {
  if (!args.positional.empty() && isArtifactPath(args.positional[0])) return benchArtifact(args);
  auto g = loadModelFromArgs(args);
  if (!g) return reportError("bench", g.status());
  auto opts = compileOptionsFromArgs(args);
  if (!opts) return reportError("bench", opts.status());
  auto runs = args.intValue("runs", 10, 1, 100000);
  if (!runs) return reportError("bench", runs.status());
  auto warmup = args.intValue("warmup", 2, 0, 1000);
  if (!warmup) return reportError("bench", warmup.status());
  opts->log = args.flag("json") ? nullptr : &std::cerr;
  if (args.value("concurrency")) return serveCompiled(args, *g, *opts);
  const std::string only = args.value("only").value_or("");
  if (!only.empty() && only != "eager" && only != "compiled")
    return reportError("bench",
                       invalidArgument("--only takes eager or compiled, got '" + only + "'"));
  if (!only.empty() && args.flag("profile"))
    return reportError("bench", invalidArgument("--profile times both: drop --only"));
  const bool timeEager = only != "compiled", timeCompiled = only != "eager";

  // Compile cold (a fresh, empty cache directory) and warm (the same directory again).
  const auto tmp = std::filesystem::temp_directory_path() /
                   ("kiln-bench-cache-" + std::to_string(std::random_device{}()));
  compiler::CompileOptions cold = *opts;
  cold.useCache = true;
  cold.cacheDir = tmp.string();
  auto t0 = std::chrono::steady_clock::now();
  auto first = compiler::compile(*g, cold);
  const double coldMs = msSince(t0);
  if (!first) {
    std::filesystem::remove_all(tmp);
    return reportError("bench", first.status());
  }
  cold.log = nullptr;
  t0 = std::chrono::steady_clock::now();
  auto cm = compiler::compile(*g, cold);
  const double warmMs = msSince(t0);
  std::filesystem::remove_all(tmp);
  if (!cm) return reportError("bench", cm.status());

  auto randomIns = randomInputs(inputTypes(*g), args);
  if (!randomIns) return reportError("bench", randomIns.status());
  const std::vector<runtime::Tensor>& inputs = *randomIns;
  // Eager computes the products in the same precision (autocast applied to its graph).
  auto eagerGraph = compiler::withPrecision(*g, opts->precision);
  if (!eagerGraph) return reportError("bench", eagerGraph.status());
  runtime::EagerExecutor eager(*eagerGraph, opts->backend);
  if (Status st = compiler::useDeviceKernels(eager, opts->backend, *opts); !st)
    return reportError("bench", st);
  std::vector<double> eagerMs, compiledMs, eagerDeviceMs, compiledDeviceMs;
  int64_t eagerPeak = 0;
  double firstCompiledMs = 0;  // The compiled model's first call (compile() prepared it).
  // Interleave eager and compiled runs so that machine noise hits both alike.
  for (int64_t i = 0; i < *warmup + *runs; ++i) {
    if (timeEager) {
      auto e0 = std::chrono::steady_clock::now();
      auto ye = eager.run(inputs);
      const double em = msSince(e0);
      if (!ye) return reportError("bench", ye.status());
      eagerPeak = std::max(eagerPeak, eager.lastStats().peakActivationBytes);
      if (i >= *warmup) {
        eagerMs.push_back(em);
        // A device with a stream timer (CUDA events): its time for the enqueued work too.
        if (eager.lastStats().deviceMs >= 0) eagerDeviceMs.push_back(eager.lastStats().deviceMs);
      }
    }
    if (timeCompiled) {
      auto c0 = std::chrono::steady_clock::now();
      runtime::PlanRunStats cs;
      auto yc = (*cm)->run(inputs, &cs);
      const double cmMs = msSince(c0);
      if (!yc) return reportError("bench", yc.status());
      if (i == 0) firstCompiledMs = cmMs;
      if (i >= *warmup) {
        compiledMs.push_back(cmMs);
        if (cs.deviceMs >= 0) compiledDeviceMs.push_back(cs.deviceMs);
      }
    }
  }
  // A skipped one reads as zeros (and is left out of the JSON).
  auto timing = [](const std::vector<double>& ms) { return ms.empty() ? Timing{} : summarize(ms); };
  const Timing te = timing(eagerMs), tc = timing(compiledMs);
  const bool deviceTimed = !compiledDeviceMs.empty() || !eagerDeviceMs.empty();
  const Timing de = timing(eagerDeviceMs), dc = timing(compiledDeviceMs);
  const auto& r = (*cm)->report();
  const int64_t batch = g->inputs().empty() || g->inputs()[0]->type().shape.empty()
                            ? 1
                            : g->inputs()[0]->type().shape[0];
  const int64_t outputBytes = [&] {
    int64_t b = 0;
    for (const ir::Value* v : g->outputs()) b += static_cast<int64_t>(v->type().byteSize());
    return b;
  }();
  const int64_t compiledPeak = r.arenaBytes + outputBytes;
  nlohmann::json j{
      {"model", args.positional[0]},
      {"batch", batch},
      {"threads", runtime::numThreads()},
      {"runs", *runs},
      {"eager",
       {{"median_ms", te.median},
        {"min_ms", te.min},
        {"max_ms", te.max},
        {"throughput_per_s", 1000.0 * static_cast<double>(batch) / te.median},
        {"peak_activation_bytes", eagerPeak}}},
      {"compiled",
       {{"median_ms", tc.median},
        {"min_ms", tc.min},
        {"max_ms", tc.max},
        {"throughput_per_s", 1000.0 * static_cast<double>(batch) / tc.median},
        {"peak_activation_bytes", compiledPeak},
        {"arena_bytes", r.arenaBytes},
        {"compile_cold_ms", coldMs},
        {"compile_warm_ms", warmMs},
        {"prepare_ms", r.prepareMs},
        {"first_run_ms", firstCompiledMs},
        {"kernels_generated", r.generatedKernels},
        {"kernels_compiled", r.compiledKernels},
        {"steps", (*cm)->plan().steps.size()},
        // Runs that met a NaN at a fused relu or clip and ran again without (PlanExecutor).
        {"exact_reruns", (*cm)->exactReruns()}}},
      {"speedup", te.median / tc.median},
      {"memory_ratio",
       eagerPeak ? static_cast<double>(compiledPeak) / static_cast<double>(eagerPeak) : 0.0},
      {"weights_bytes", g->parameterBytes()},
      {"nodes", g->numNodes()},
      {"device", std::string(opts->backend->name())},
      {"precision", std::string(compiler::precisionName(opts->precision))}};
  if (deviceTimed) {
    j["eager"]["device_median_ms"] = de.median;
    j["compiled"]["device_median_ms"] = dc.median;
    j["compiled"]["cuda_graph"] = opts->cudaGraphs;
    j["device_speedup"] = de.median / dc.median;
  }
  if (!only.empty()) {
    j.erase(timeEager ? "compiled" : "eager");
    for (const char* both : {"speedup", "memory_ratio", "device_speedup"}) j.erase(both);
    const Timing& t = timeEager ? te : tc;
    if (args.flag("json")) {
      std::cout << j.dump(2) << "\n";
      return kExitOk;
    }
    std::printf(
        "%s, batch %lld, %d threads, %s alone, %lld runs: median %.3f ms (min %.3f, max "
        "%.3f)\n",
        args.positional[0].c_str(), static_cast<long long>(batch), runtime::numThreads(),
        only.c_str(), static_cast<long long>(*runs), t.median, t.min, t.max);
    if (deviceTimed) std::printf("device median %.3f ms\n", (timeEager ? de : dc).median);
    if (timeCompiled)
      std::printf("compile cold %.1f ms, warm %.1f ms; first run %.2f ms (%.2fx the median)\n",
                  coldMs, warmMs, firstCompiledMs, firstCompiledMs / tc.median);
    return kExitOk;
  }
  if (args.flag("profile")) {
    // One more run of each with per-step timing: the compiled plan's steps, eager's ops.
    (*cm)->setProfiling(true);
    auto yc = (*cm)->run(inputs);
    auto ye = eager.run(inputs);
    if (!yc || !ye) return reportError("bench", !yc ? yc.status() : ye.status());
    const auto& steps = (*cm)->plan().steps;
    const auto& ms = (*cm)->lastStats().stepMs;
    std::vector<size_t> order(ms.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ms[a] > ms[b]; });
    nlohmann::json prof = nlohmann::json::array();
    for (size_t i : order) {
      const auto& s = steps[i];
      const std::string kind(compiler::stepKind(s));
      prof.push_back({{"step", i}, {"kind", kind}, {"name", s.name}, {"ms", ms[i]}});
    }
    j["compiled_profile"] = prof;
    for (const auto& [op, t] : eager.lastStats().ops)
      j["eager_profile"].push_back({{"op", op}, {"count", t.count}, {"ms", t.ms}});
  }
  if (args.flag("json")) {
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::printf("%s, batch %lld, %d threads, %lld runs (medians; eager and compiled interleaved)\n",
              args.positional[0].c_str(), static_cast<long long>(batch), runtime::numThreads(),
              static_cast<long long>(*runs));
  std::printf("                 eager      compiled\n");
  std::printf("latency median %9.2f ms %9.2f ms   speedup %.2fx\n", te.median, tc.median,
              te.median / tc.median);
  if (deviceTimed)
    std::printf(
        "device median  %9.2f ms %9.2f ms   speedup %.2fx   (stream events: copies in, "
        "work, copies out%s)\n",
        de.median, dc.median, de.median / dc.median,
        opts->cudaGraphs ? "; compiled as a CUDA graph" : "");
  std::printf("latency min    %9.2f ms %9.2f ms\n", te.min, tc.min);
  std::printf("latency max    %9.2f ms %9.2f ms\n", te.max, tc.max);
  std::printf("throughput     %9.1f /s %9.1f /s\n", 1000.0 * batch / te.median,
              1000.0 * batch / tc.median);
  std::printf("peak memory    %9.2f MB %9.2f MB   (activations and outputs; weights %.2f MB)\n",
              eagerPeak / 1e6, compiledPeak / 1e6, g->parameterBytes() / 1e6);
  std::printf("steps          %9zu    %9zu      (%d generated kernels, %d compiled)\n",
              g->numNodes(), (*cm)->plan().steps.size(), r.generatedKernels, r.compiledKernels);
  std::printf(
      "compile        cold %.1f ms, warm (cache hit) %.1f ms; first run %.2f ms (%.2fx "
      "the median)\n",
      coldMs, warmMs, firstCompiledMs, firstCompiledMs / tc.median);
  if (args.flag("profile")) {
    std::printf("\ncompiled steps, slowest first:\n");
    int shown = 0;
    for (const auto& p : j["compiled_profile"]) {
      if (shown++ == 15) break;
      std::printf("  %8.3f ms  %-9s %s\n", p["ms"].get<double>(),
                  p["kind"].get<std::string>().c_str(), p["name"].get<std::string>().c_str());
    }
    std::printf("eager ops:\n");
    for (const auto& p : j["eager_profile"])
      std::printf("  %8.3f ms  %-18s x%lld\n", p["ms"].get<double>(),
                  p["op"].get<std::string>().c_str(),
                  static_cast<long long>(p["count"].get<int64_t>()));
  }
  return kExitOk;
}

}  // namespace kiln::cli
