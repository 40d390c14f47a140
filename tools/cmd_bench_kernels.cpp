// `kiln bench-kernels`: memory bandwidth of generated pointwise kernels against a plain copy,
// measured in the same run: a copy (std::memcpy and a generated identity kernel), one fused
// 10-op pointwise chain, a fused softmax and a layernorm over rows; with --peak, the machine's
// FMA peak and multi-threaded copy bandwidth (compiler/machine_peak.h) first.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "compiler/compile.h"
#include "compiler/machine_peak.h"
#include "ir/parser.h"
#include "runtime/cpu/compute_threads.h"
#include "tools/cli.h"

namespace kiln::cli {

namespace {

double medianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Each case's median over `runs` rounds, one run of every case a round (after one untimed run of
// each): a slow spell of the machine (this VM's last seconds) lands on every case alike, not on
// the one that happened to be timing then.
Expected<std::vector<double>> interleavedMedians(std::vector<std::function<Status()>>& cases,
                                                 int runs) {
  std::vector<std::vector<double>> ms(cases.size());
  for (auto& c : cases)  // Warm-up: page faults and caches.
    if (Status s = c(); !s.isOk()) return s;
  for (int i = 0; i < runs; ++i)
    for (size_t k = 0; k < cases.size(); ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      if (Status s = cases[k](); !s.isOk()) return s;
      ms[k].push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  std::vector<double> medians;
  for (auto& v : ms) medians.push_back(medianOf(std::move(v)));
  return medians;
}

Expected<std::unique_ptr<compiler::CompiledModel>> compileText(const std::string& text,
                                                               compiler::CompileOptions opts) {
  KILN_ASSIGN_OR_RETURN(ir::Graph g, ir::parseGraph(text));
  // Keep the graph as written: the identity copy must stay a kernel.
  opts.disabledPasses = {"dce", "cse", "constant-folding", "algebraic-simplification",
                         "batchnorm-folding"};
  return compiler::compile(g, opts);
}

}  // namespace

int runBenchKernels(const Args& args) {
  auto opts = compileOptionsFromArgs(args);
  if (!opts) return reportError("bench-kernels", opts.status());
  opts->log = nullptr;
  auto rows = args.intValue("rows", 4096, 1, 1 << 20);
  auto cols = args.intValue("cols", 4096, 1, 1 << 20);
  auto runs = args.intValue("runs", 20, 1, 100000);
  if (!rows || !cols || !runs)
    return reportError("bench-kernels", !rows   ? rows.status()
                                        : !cols ? cols.status()
                                                : runs.status());
  const std::string shape = "[" + std::to_string(*rows) + "," + std::to_string(*cols) + "]";
  const std::string bshape = "[" + std::to_string(*cols) + "]";
  const std::string copy =
      "graph copy(%x : f32" + shape + ") {\n %y : f32" + shape + " = dropout(%x)\n return %y\n}";
  const std::string chain = "graph chain(%x : f32" + shape + ", %b : f32" + bshape +
                            ") {\n"
                            " %1 : f32" +
                            shape + " = add(%x, %b)\n %2 : f32" + shape +
                            " = relu(%1)\n"
                            " %3 : f32" +
                            shape + " = mul(%2, %x)\n %4 : f32" + shape +
                            " = sub(%3, %b)\n"
                            " %5 : f32" +
                            shape + " = maximum(%4, %x)\n %6 : f32" + shape +
                            " = clip(%5) {min=-1.0, max=4.0}\n"
                            " %7 : f32" +
                            shape + " = neg(%6)\n %8 : f32" + shape +
                            " = abs(%7)\n"
                            " %9 : f32" +
                            shape + " = mul(%8, %b)\n %10 : f32" + shape +
                            " = add(%9, %x)\n return %10\n}";
  const std::string softmax = "graph sm(%x : f32" + shape + ") {\n %y : f32" + shape +
                              " = softmax(%x) {axis=1}\n return %y\n}";
  const std::string layernorm = "graph ln(%x : f32" + shape + ", %g : f32" + bshape + ", %b : f32" +
                                bshape + ") {\n %y : f32" + shape +
                                " = layer_norm(%x, %g, %b) {axis=1}\n return %y\n}";
  nlohmann::json j;
  std::optional<compiler::MachinePeak> peak;
  if (args.flag("peak")) {
    auto m = compiler::measureMachinePeak(runtime::numThreads());
    if (!m) return reportError("bench-kernels", m.status());
    peak = *m;
    j["peak"] = {{"threads", m->threads},
                 {"fma_gflops", m->gflops},
                 {"isa", m->isa},
                 {"lanes", m->lanes},
                 {"chains", m->chains},
                 {"cpuinfo_mhz", m->cpuinfoMHz},
                 {"implied_ghz_two_fma_units", m->impliedGHz},
                 {"copy_gb_per_s", m->copyGBps},
                 {"copy_bytes", m->copyBytes}};
  }

  std::vector<std::pair<std::string, std::unique_ptr<compiler::CompiledModel>>> models;
  for (const auto& [name, text] : {std::pair{"identity kernel", copy},
                                   {"10-op pointwise chain", chain},
                                   {"softmax (rows)", softmax},
                                   {"layernorm (rows)", layernorm}}) {
    auto cm = compileText(text, *opts);
    if (!cm) return reportError("bench-kernels", cm.status());
    if ((*cm)->report().generatedKernels != 1)
      return reportError("bench-kernels",
                         internalError(std::string(name) + " did not compile to one kernel"));
    models.emplace_back(name, std::move(*cm));
  }
  const int64_t n = *rows * *cols;
  runtime::Tensor x = *runtime::Tensor::empty(ir::DType::kF32, {*rows, *cols});
  runtime::Tensor b = *runtime::Tensor::empty(ir::DType::kF32, {*cols});
  for (int64_t i = 0; i < n; ++i) x.data<float>()[i] = static_cast<float>(i % 97) * 0.01f - 0.4f;
  for (int64_t i = 0; i < *cols; ++i) b.data<float>()[i] = 0.5f;
  runtime::Tensor dst = *runtime::Tensor::empty(ir::DType::kF32, {*rows, *cols});
  const double bytes = 2.0 * static_cast<double>(n) * 4;  // One read and one write per element.
  j["elements"] = n;
  j["threads"] = runtime::numThreads();
  auto record = [&](const std::string& name, double ms) {
    const double gbs = bytes / (ms * 1e6);
    j["results"].push_back({{"kernel", name}, {"median_ms", ms}, {"gb_per_s", gbs}});
    return gbs;
  };
  std::vector<std::string> names{"memcpy"};
  std::vector<std::function<Status()>> cases{[&] {
    std::memcpy(dst.rawData(), x.rawData(), n * 4);
    return Status::ok();
  }};
  for (auto& [name, cm] : models) {
    std::vector<runtime::Tensor> ins{x};
    if (name == "10-op pointwise chain") ins.push_back(b);
    if (name == "layernorm (rows)") ins.insert(ins.end(), {b, b});
    names.push_back(name);
    cases.push_back([&cm = cm, ins]() -> Status {
      auto r = cm->run(ins);
      return r ? Status::ok() : r.status();
    });
  }
  auto medians = interleavedMedians(cases, static_cast<int>(*runs));
  if (!medians) return reportError("bench-kernels", medians.status());
  const double memcpyGbs = record(names[0], (*medians)[0]);
  double copyGbs = 0;
  for (size_t k = 1; k < names.size(); ++k) {
    const double gbs = record(names[k], (*medians)[k]);
    if (names[k] == "identity kernel") copyGbs = gbs;
  }
  for (auto& r : j["results"]) {
    r["fraction_of_copy_kernel"] = r["gb_per_s"].get<double>() / copyGbs;
    if (peak) r["fraction_of_peak_copy"] = r["gb_per_s"].get<double>() / peak->copyGBps;
  }
  j["fraction_of_memcpy"] = copyGbs / memcpyGbs;
  if (args.flag("json")) {
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::printf(
      "%lld x %lld f32 (%.1f MB per tensor), %d threads, median of %lld rounds (one run of each "
      "case "
      "a round); bytes = 1 read + 1 write per element\n",
      static_cast<long long>(*rows), static_cast<long long>(*cols), n * 4 / 1e6,
      runtime::numThreads(), static_cast<long long>(*runs));
  if (peak) {
    std::printf("peak: fp32 FMA %.1f GFLOP/s on %d threads (%s, %d chains of %d lanes",
                peak->gflops, peak->threads, peak->isa.c_str(), peak->chains, peak->lanes);
    std::printf("; two FMA units per core would run at %.2f GHz", peak->impliedGHz);
    if (peak->cpuinfoMHz > 0) std::printf(", /proc/cpuinfo says %.2f", peak->cpuinfoMHz / 1e3);
    std::printf(")\n      copy %.2f GB/s (%lld MB over %d threads, read + write)\n", peak->copyGBps,
                static_cast<long long>(peak->copyBytes >> 20), peak->threads);
  }
  for (const auto& r : j["results"]) {
    std::printf("  %-24s %8.3f ms  %7.2f GB/s  %5.0f%% of the identity kernel",
                r["kernel"].get<std::string>().c_str(), r["median_ms"].get<double>(),
                r["gb_per_s"].get<double>(), 100 * r["fraction_of_copy_kernel"].get<double>());
    if (peak) std::printf("  %5.0f%% of peak copy", 100 * r["fraction_of_peak_copy"].get<double>());
    std::printf("\n");
  }
  return kExitOk;
}

}  // namespace kiln::cli
