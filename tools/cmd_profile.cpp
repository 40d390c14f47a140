// `kiln profile MODEL`: where the time goes, eager and compiled side by side. Each profiled run
// times every step (a compiled model's plan steps, eager's nodes); the steps are grouped like
// PyTorch profiler's key_averages() (compiler/profile.h) and set against this machine's peaks
// measured in the same run (compiler/machine_peak.h). --trace writes every executed step of
// both as a Chrome trace (chrome://tracing, ui.perfetto.dev).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "compiler/compile.h"
#include "compiler/eager_kernels.h"
#include "compiler/machine_peak.h"
#include "compiler/profile.h"
#include "frontends/file_io.h"
#include "runtime/cpu/compute_threads.h"
#include "runtime/eager.h"
#include "tools/cli.h"

namespace kiln::cli {

namespace {

nlohmann::json rowsJson(const compiler::Profile& p,
                        const std::optional<compiler::MachinePeak>& peak) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& r : p.rows) {
    const double seconds = r.ms / 1e3;
    nlohmann::json j{{"ops", r.ops},
                     {"kind", r.kind},
                     {"calls_per_run", static_cast<double>(r.calls) / p.runs},
                     {"ms_per_run", r.ms / p.runs},
                     {"mean_ms", r.ms / static_cast<double>(r.calls)},
                     {"share", p.stepMs > 0 ? r.ms / p.stepMs : 0.0},
                     {"flops_per_run", static_cast<double>(r.flops) / p.runs},
                     {"bytes_per_run", static_cast<double>(r.bytes) / p.runs}};
    if (seconds > 0) {
      j["gflops"] = static_cast<double>(r.flops) / seconds / 1e9;
      j["gb_per_s"] = static_cast<double>(r.bytes) / seconds / 1e9;
      if (peak) {
        j["fraction_of_fma_peak"] = j["gflops"].get<double>() / peak->gflops;
        j["fraction_of_copy_peak"] = j["gb_per_s"].get<double>() / peak->copyGBps;
      }
    }
    rows.push_back(std::move(j));
  }
  return rows;
}

void printTable(const char* title, const nlohmann::json& rows, double medianMs, int top,
                bool peak) {
  double sum = 0;
  for (const auto& r : rows) sum += r["ms_per_run"].get<double>();
  std::printf("\n%s: %.3f ms a run (median), %.3f ms of it in steps\n", title, medianMs, sum);
  std::printf("  %-34s %-9s %6s %9s %9s %6s %8s %8s", "ops", "kind", "calls", "total ms", "mean ms",
              "share", "GFLOP/s", "GB/s");
  if (peak) std::printf(" %6s %6s", "%fma", "%bw");
  std::printf("\n");
  int shown = 0;
  for (const auto& r : rows) {
    if (shown++ == top) {
      std::printf("  ... %zu more rows (--top 0 shows all)\n", rows.size() - top);
      break;
    }
    std::string ops = r["ops"].get<std::string>();
    if (ops.size() > 34) ops = ops.substr(0, 31) + "...";
    std::printf("  %-34s %-9s %6.0f %9.3f %9.4f %5.1f%% %8.1f %8.2f", ops.c_str(),
                r["kind"].get<std::string>().c_str(), r["calls_per_run"].get<double>(),
                r["ms_per_run"].get<double>(), r["mean_ms"].get<double>(),
                100 * r["share"].get<double>(), r.value("gflops", 0.0), r.value("gb_per_s", 0.0));
    if (peak)
      std::printf(" %5.1f%% %5.1f%%", 100 * r.value("fraction_of_fma_peak", 0.0),
                  100 * r.value("fraction_of_copy_peak", 0.0));
    std::printf("\n");
  }
}

// Chrome's trace event format: one complete ("X") event per executed step, microseconds; eager
// and compiled as two processes, each profiled run after the one before.
nlohmann::json chromeTrace(const std::string& model, const compiler::Profile& eager,
                           const compiler::Profile& compiled) {
  nlohmann::json events = nlohmann::json::array();
  int pid = 1;
  const std::pair<const char*, const compiler::Profile*> sides[] = {{"eager", &eager},
                                                                    {"compiled", &compiled}};
  for (const auto& [name, p] : sides) {
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", pid},
                      {"args", {{"name", model + " " + name}}}});
    // Runs laid end to end: each starts where the one before ended.
    std::vector<double> runStart(static_cast<size_t>(p->runs) + 1, 0.0);
    for (const auto& e : p->events)
      runStart[static_cast<size_t>(e.run) + 1] =
          std::max(runStart[static_cast<size_t>(e.run) + 1], e.startMs + e.ms);
    for (size_t r = 1; r < runStart.size(); ++r) runStart[r] += runStart[r - 1];
    for (const auto& e : p->events)
      events.push_back({{"name", e.name},
                        {"cat", e.kind},
                        {"ph", "X"},
                        {"pid", pid},
                        {"tid", 1},
                        {"ts", 1e3 * (runStart[static_cast<size_t>(e.run)] + e.startMs)},
                        {"dur", 1e3 * e.ms},
                        {"args", {{"ops", e.ops}, {"run", e.run}}}});
    ++pid;
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

}  // namespace

int runProfile(const Args& args) {
  auto g = loadModelFromArgs(args);
  if (!g) return reportError("profile", g.status());
  auto opts = compileOptionsFromArgs(args);
  if (!opts) return reportError("profile", opts.status());
  auto runs = args.intValue("runs", 10, 1, 100000);
  if (!runs) return reportError("profile", runs.status());
  auto warmup = args.intValue("warmup", 2, 0, 1000);
  if (!warmup) return reportError("profile", warmup.status());
  auto top = args.intValue("top", 20, 0, 1000000);
  if (!top) return reportError("profile", top.status());
  const std::string tracePath = args.value("trace").value_or("");
  opts->log = nullptr;

  auto cm = compiler::compile(*g, *opts);
  if (!cm) return reportError("profile", cm.status());
  auto inputs = randomInputs(inputTypes(*g), args);
  if (!inputs) return reportError("profile", inputs.status());
  auto eagerGraph = compiler::withPrecision(*g, opts->precision);
  if (!eagerGraph) return reportError("profile", eagerGraph.status());
  runtime::EagerExecutor eager(*eagerGraph, opts->backend);
  if (Status st = compiler::useDeviceKernels(eager, opts->backend, *opts); !st)
    return reportError("profile", st);

  (*cm)->setProfiling(true);
  std::vector<runtime::PlanRunStats> compiledRuns;
  std::vector<runtime::EagerStats> eagerRuns;
  std::vector<double> eagerMs, compiledMs;
  for (int64_t i = 0; i < *warmup + *runs; ++i) {  // Interleaved, as kiln bench.
    auto e0 = std::chrono::steady_clock::now();
    auto ye = eager.run(*inputs);
    const double em = msSince(e0);
    if (!ye) return reportError("profile", ye.status());
    runtime::PlanRunStats cs;
    auto c0 = std::chrono::steady_clock::now();
    auto yc = (*cm)->run(*inputs, &cs);
    const double cmMs = msSince(c0);
    if (!yc) return reportError("profile", yc.status());
    if (i < *warmup) continue;
    eagerRuns.push_back(eager.lastStats());
    compiledRuns.push_back(std::move(cs));
    eagerMs.push_back(em);
    compiledMs.push_back(cmMs);
  }
  const compiler::Profile pe = compiler::profileEager(eagerRuns);
  const compiler::Profile pc = compiler::profileCompiled(**cm, compiledRuns);

  std::optional<compiler::MachinePeak> peak;
  if (!args.flag("no-peak") && opts->backend->caps().kernelCode != "cubin") {
    auto m = compiler::measureMachinePeak(runtime::numThreads());
    if (!m) return reportError("profile", m.status());
    peak = *m;
  }
  const Timing te = summarize(eagerMs), tc = summarize(compiledMs);
  nlohmann::json j{{"model", args.positional[0]},
                   {"device", std::string(opts->backend->name())},
                   {"threads", runtime::numThreads()},
                   {"runs", *runs},
                   {"eager", {{"median_ms", te.median}, {"ops", rowsJson(pe, peak)}}},
                   {"compiled", {{"median_ms", tc.median}, {"ops", rowsJson(pc, peak)}}}};
  if (peak)
    j["peak"] = {
        {"fma_gflops", peak->gflops}, {"copy_gb_per_s", peak->copyGBps}, {"isa", peak->isa}};
  if (!tracePath.empty()) {
    const nlohmann::json trace = chromeTrace(args.positional[0], pe, pc);
    Status st = frontends::writeFilesAtomically({{tracePath, [&](std::ostream& os) {
                                                    os << trace.dump() << "\n";
                                                    return os ? Status::ok()
                                                              : internalError("write failed");
                                                  }}});
    if (!st) return reportError("profile", st);
  }
  if (args.flag("json")) {
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::printf(
      "%s on %s, %d threads, %lld profiled runs of each (every step timed: a run takes "
      "somewhat longer than unprofiled)\n",
      args.positional[0].c_str(), std::string(opts->backend->name()).c_str(), runtime::numThreads(),
      static_cast<long long>(*runs));
  if (peak)
    std::printf(
        "peaks measured now: fp32 FMA %.1f GFLOP/s (%s), copy %.2f GB/s (read + write); "
        "%%fma and %%bw are shares of them\n",
        peak->gflops, peak->isa.c_str(), peak->copyGBps);
  const int shown = *top == 0 ? -1 : static_cast<int>(*top);
  printTable("eager", j["eager"]["ops"], te.median, shown, peak.has_value());
  printTable("compiled", j["compiled"]["ops"], tc.median, shown, peak.has_value());
  if (!tracePath.empty())
    std::printf("\ntrace: %s (%zu events; open in ui.perfetto.dev or chrome://tracing)\n",
                tracePath.c_str(), pe.events.size() + pc.events.size());
  return kExitOk;
}

}  // namespace kiln::cli
