#include "tools/serve_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "runtime/plan.h"

namespace kiln::cli {

namespace {

double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t i = std::min(sorted.size() - 1, static_cast<size_t>(p * sorted.size()));
  return sorted[i];
}

}  // namespace

Expected<ServeResult> serveBench(const std::function<Status()>& request, int concurrency,
                                 double seconds) {
  using Clock = std::chrono::steady_clock;
  std::vector<std::vector<double>> latencies(static_cast<size_t>(concurrency));
  std::atomic<bool> stop{false};
  std::mutex errorMu;
  Status error;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(seconds));
  {
    std::vector<std::jthread> clients;
    for (int c = 0; c < concurrency; ++c)
      clients.emplace_back([&, c] {
        auto& mine = latencies[static_cast<size_t>(c)];
        while (!stop.load(std::memory_order_relaxed) && Clock::now() < deadline) {
          const auto t0 = Clock::now();
          Status st = request();
          mine.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
          if (!st.isOk()) {
            std::lock_guard lock(errorMu);
            if (error.isOk()) error = st;
            stop = true;
          }
        }
      });
  }
  if (!error.isOk()) return error;
  ServeResult r;
  r.concurrency = concurrency;
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  r.requests = static_cast<int64_t>(all.size());
  r.throughputPerS = static_cast<double>(r.requests) / r.seconds;
  r.p50Ms = percentile(all, 0.50);
  r.p90Ms = percentile(all, 0.90);
  r.p99Ms = percentile(all, 0.99);
  r.maxMs = all.empty() ? 0 : all.back();
  return r;
}

std::vector<OptionSpec> serveOptionSpecs() {
  return {{"concurrency", true,
           "serving benchmark: client threads calling the compiled model at once, e.g. 1,2,4 "
           "(throughput and p50/p90/p99 latency per request)"},
          {"duration", true, "seconds per concurrency level of --concurrency (default 5)"}};
}

Expected<std::vector<int>> concurrencyLevels(const Args& args) {
  std::vector<int> levels;
  const auto v = args.value("concurrency");
  if (!v) return levels;
  std::stringstream ss(*v);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const long n = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || n < 1 || n > 256)
      return invalidArgument("--concurrency expects client counts from 1 to 256 separated by "
                             "commas (e.g. 1,2,4), got '" + *v + "'");
    levels.push_back(static_cast<int>(n));
  }
  if (levels.empty()) return invalidArgument("--concurrency needs at least one client count");
  return levels;
}

Expected<double> serveDuration(const Args& args) {
  const auto v = args.value("duration");
  if (!v) return 5.0;
  char* end = nullptr;
  const double s = std::strtod(v->c_str(), &end);
  if (v->empty() || *end != '\0' || !(s > 0) || s > 86400)
    return invalidArgument("--duration expects seconds (a number above 0), got '" + *v + "'");
  return s;
}

int runServeBench(const Args& args, const std::string& what, int64_t batch,
                  const std::function<Status()>& request) {
  auto levels = concurrencyLevels(args);
  if (!levels) return reportError("bench", levels.status());
  auto seconds = serveDuration(args);
  if (!seconds) return reportError("bench", seconds.status());
  // Warm up once: first-call costs (arena pages, oneDNN primitives, reordered weights).
  if (Status st = request(); !st) return reportError("bench", st);
  const bool json = args.flag("json");
  if (!json)
    std::printf("serving %s (batch %lld) on %d compute threads, %.1f s per level\n",
                what.c_str(), static_cast<long long>(batch), runtime::numThreads(), *seconds);
  nlohmann::json rows = nlohmann::json::array();
  if (!json)
    std::printf("%12s %10s %12s %14s %10s %10s %10s %10s\n", "concurrency", "requests",
                "requests/s", "samples/s", "p50 ms", "p90 ms", "p99 ms", "max ms");
  for (int c : *levels) {
    auto r = serveBench(request, c, *seconds);
    if (!r) return reportError("bench", r.status());
    const double samples = r->throughputPerS * static_cast<double>(batch);
    if (json) {
      rows.push_back({{"concurrency", c},
                      {"requests", r->requests},
                      {"seconds", r->seconds},
                      {"requests_per_s", r->throughputPerS},
                      {"samples_per_s", samples},
                      {"p50_ms", r->p50Ms},
                      {"p90_ms", r->p90Ms},
                      {"p99_ms", r->p99Ms},
                      {"max_ms", r->maxMs}});
    } else {
      std::printf("%12d %10lld %12.1f %14.1f %10.3f %10.3f %10.3f %10.3f\n", c,
                  static_cast<long long>(r->requests), r->throughputPerS, samples, r->p50Ms,
                  r->p90Ms, r->p99Ms, r->maxMs);
      std::fflush(stdout);
    }
  }
  if (json)
    std::cout << nlohmann::json{{"model", what},
                                {"batch", batch},
                                {"threads", runtime::numThreads()},
                                {"levels", rows}}
                     .dump(2)
              << "\n";
  return kExitOk;
}

}  // namespace kiln::cli
