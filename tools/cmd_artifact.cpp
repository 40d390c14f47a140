// `kiln inspect` and `kiln bench` of AOT artifacts (`kiln compile MODEL -o model.kiln`).
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "compiler/artifact.h"
#include "runtime/cpu/compute_threads.h"
#include "tools/cli.h"
#include "tools/serve_bench.h"

namespace kiln::cli {

namespace {

std::string typeWithNames(const ir::TensorType& t, const std::vector<std::string>& names) {
  if (names.empty()) return t.toString();
  std::string s = std::string(ir::dtypeName(t.dtype)) + "[";
  for (size_t i = 0; i < t.shape.size(); ++i) {
    if (i) s += ",";
    if (i < names.size() && !names[i].empty()) s += names[i] + "=";
    s += std::to_string(t.shape[i]);
  }
  return s + "]";
}

std::string megabytes(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MB", bytes / 1e6);
  return buf;
}

}  // namespace

int runInspect(const Args& args) {
  if (args.positional.size() != 1)
    return reportError("inspect", invalidArgument("expected one FILE.kiln"));
  auto info = runtime::inspectArtifact(args.positional[0]);
  if (!info) return reportError("inspect", info.status());
  if (args.flag("json")) {
    nlohmann::json j;
    j["file"] = info->path;
    j["format_version"] = info->version;
    j["bytes"] = info->fileBytes;
    j["model"] = info->modelName;
    j["producer"] = info->producer;
    j["target"] = {{"triple", info->triple}, {"cpu", info->cpu}, {"features", info->features}};
    j["inputs"] = nlohmann::json::array();
    for (size_t i = 0; i < info->inputs.size(); ++i)
      j["inputs"].push_back({{"name", info->inputNames[i]},
                             {"type", info->inputs[i].toString()},
                             {"dim_names", info->inputDimNames[i]}});
    j["outputs"] = nlohmann::json::array();
    for (size_t i = 0; i < info->outputs.size(); ++i)
      j["outputs"].push_back(
          {{"name", info->outputNames[i]}, {"type", info->outputs[i].toString()}});
    j["kernels"] = info->kernels;
    j["modules"] = info->moduleNames;
    j["ptx"] = info->ptxArchs;
    j["cubins"] = info->cubinArchs;
    j["device"] = {{"kernel_code", info->kernelCode.empty() ? "host-object" : info->kernelCode},
                   {"arch", info->deviceArch},
                   {"precision", info->precision}};
    j["steps"] = info->numSteps;
    j["arena_bytes"] = info->arenaBytes;
    j["parameter_bytes"] = info->parameterBytes;
    j["conv_algorithms"] = info->algorithmChoices;
    j["sections"] = nlohmann::json::array();
    for (const auto& s : info->sections)
      j["sections"].push_back(
          {{"name", s.name}, {"offset", s.offset}, {"bytes", s.size}, {"xxh3", s.checksum}});
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::printf("artifact    %s (%s, format version %u)\n", info->path.c_str(),
              megabytes(static_cast<double>(info->fileBytes)).c_str(), info->version);
  std::printf("model       %s\nproducer    %s\n", info->modelName.c_str(), info->producer.c_str());
  std::printf("target      %s, cpu %s (%zu features)\n", info->triple.c_str(), info->cpu.c_str(),
              static_cast<size_t>(std::count(info->features.begin(), info->features.end(), '+')));
  for (size_t i = 0; i < info->inputs.size(); ++i)
    std::printf("input       %%%s : %s\n", info->inputNames[i].c_str(),
                typeWithNames(info->inputs[i], info->inputDimNames[i]).c_str());
  for (size_t i = 0; i < info->outputs.size(); ++i)
    std::printf("output      %%%s : %s\n", info->outputNames[i].c_str(),
                info->outputs[i].toString().c_str());
  std::printf("plan        %zu steps, %zu generated kernels in %zu modules, arena %s, weights %s\n",
              info->numSteps, info->kernels.size(), info->moduleNames.size(),
              megabytes(static_cast<double>(info->arenaBytes)).c_str(),
              megabytes(static_cast<double>(info->parameterBytes)).c_str());
  std::string ptx;
  for (const auto& a : info->ptxArchs) ptx += (ptx.empty() ? "" : ", ") + a;
  std::printf("ptx         %s\n", ptx.empty() ? "none (compiled without NVRTC)" : ptx.c_str());
  std::string others;
  for (const auto& a : info->cubinArchs) others += ", " + a;
  if (!info->kernelCode.empty())
    std::printf(
        "device      CUDA kernels as %s%s%s%s, library calls in %s (run with --device %s)\n",
        info->kernelCode.c_str(), info->deviceArch.empty() ? "" : " for ", info->deviceArch.c_str(),
        others.c_str(), info->precision.c_str(), info->kernelCode == "cubin" ? "cuda" : "emu");
  for (const auto& k : info->kernels) std::printf("kernel      %s\n", k.c_str());
  for (const auto& a : info->algorithmChoices) std::printf("algo        %s\n", a.c_str());
  std::printf("sections\n");
  for (const auto& s : info->sections)
    std::printf("  %-8s offset %10llu  %12llu bytes  xxh3 %016llx\n", s.name.c_str(),
                static_cast<unsigned long long>(s.offset), static_cast<unsigned long long>(s.size),
                static_cast<unsigned long long>(s.checksum));
  return kExitOk;
}

int benchArtifact(const Args& args) {
  auto runs = args.intValue("runs", 10, 1, 100000);
  if (!runs) return reportError("bench", runs.status());
  auto warmup = args.intValue("warmup", 2, 0, 1000);
  if (!warmup) return reportError("bench", warmup.status());
  auto threads = args.intValue("threads", 0, 0, 1024);
  if (!threads) return reportError("bench", threads.status());
  if (*threads > 0) runtime::setNumThreads(static_cast<int>(*threads));
  runtime::LoadOptions options;
  auto limit = memoryLimit(args);
  if (!limit) return reportError("bench", limit.status());
  options.maxMemoryBytes = *limit;
  if (!args.flag("no-recompile")) options.recompile = compiler::recompileForHost;
  options.log = &std::cerr;
  options.threads = static_cast<int>(*threads);
  auto backend = deviceFromArgs(args);
  if (!backend) return reportError("bench", backend.status());
  options.backend = *backend;
  options.warmup = !args.flag("no-warmup");

  // Load time: open, verify every checksum, map the weights, link the kernels, prepare the
  // library calls (their primitives and reordered weights), and the warm-up run.
  auto start = std::chrono::steady_clock::now();
  auto model = kiln::load(args.positional[0], options);
  const double loadMs = msSince(start);
  if (!model) return reportError("bench", model.status());
  auto inputs = randomInputs((*model)->info().inputs, args);
  if (!inputs) return reportError("bench", inputs.status());
  if (args.value("concurrency")) {
    const auto& in = (*model)->info().inputs;
    const int64_t batch = in.empty() || in[0].shape.empty() ? 1 : in[0].shape[0];
    runtime::LoadedModel& loaded = **model;
    return runServeBench(args, args.positional[0], batch,
                         [&] { return loaded.run(*inputs).status(); });
  }
  // The first run: what load's preparation and warm-up leave to it.
  start = std::chrono::steady_clock::now();
  auto first = (*model)->run(*inputs);
  const double firstMs = msSince(start);
  if (!first) return reportError("bench", first.status());
  for (int64_t i = 0; i < *warmup; ++i)
    if (auto r = (*model)->run(*inputs); !r) return reportError("bench", r.status());
  std::vector<double> ms;
  for (int64_t i = 0; i < *runs; ++i) {
    start = std::chrono::steady_clock::now();
    auto r = (*model)->run(*inputs);
    ms.push_back(msSince(start));
    if (!r) return reportError("bench", r.status());
  }
  const Timing t = summarize(ms);
  const auto& info = (*model)->info();
  if (args.flag("json")) {
    nlohmann::json j{{"model", args.positional[0]},
                     {"artifact_bytes", info.fileBytes},
                     {"load_ms", loadMs},
                     {"prepare_ms", (*model)->prepareMs()},
                     {"warmup_ms", (*model)->warmupMs()},
                     {"first_run_ms", firstMs},
                     {"first_run_over_median", firstMs / t.median},
                     {"median_ms", t.median},
                     {"min_ms", t.min},
                     {"max_ms", t.max},
                     {"runs", *runs},
                     {"recompiled", (*model)->recompiled()},
                     {"arena_bytes", info.arenaBytes}};
    std::cout << j.dump(2) << "\n";
    return kExitOk;
  }
  std::printf(
      "%s: %s artifact, loaded in %.2f ms (%.2f of it preparing library calls, %.2f the warm-up "
      "run)%s\n",
      args.positional[0].c_str(), megabytes(static_cast<double>(info.fileBytes)).c_str(), loadMs,
      (*model)->prepareMs(), (*model)->warmupMs(),
      (*model)->recompiled() ? " (kernels recompiled for this CPU)" : "");
  std::printf(
      "first run %.2f ms (%.2fx steady); steady median %.2f ms (min %.2f, max %.2f, %lld runs)\n",
      firstMs, firstMs / t.median, t.median, t.min, t.max, static_cast<long long>(*runs));
  return kExitOk;
}

}  // namespace kiln::cli
