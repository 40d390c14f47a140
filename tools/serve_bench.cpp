#include "tools/serve_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "runtime/cpu/compute_threads.h"
#include "runtime/plan.h"

namespace kiln::cli {

namespace {

// Latencies in constant memory: log-spaced buckets 1% wide from 1 us to about two days, so that
// a long run's record does not grow (RSS over a serving run measures kiln, not the benchmark).
class Histogram {
 public:
  void add(double ms) {
    const double x = std::max(ms, kMinMs);
    const auto i = static_cast<size_t>(std::log(x / kMinMs) / std::log(kRatio));
    ++counts_[std::min(i, counts_.size() - 1)];
    ++total_;
    max_ = std::max(max_, ms);
  }
  void merge(const Histogram& o) {
    for (size_t i = 0; i < counts_.size(); ++i) counts_[i] += o.counts_[i];
    total_ += o.total_;
    max_ = std::max(max_, o.max_);
  }
  // The upper edge of the bucket holding the p-quantile (within 1%).
  double quantile(double p) const {
    const auto target = static_cast<int64_t>(std::ceil(p * static_cast<double>(total_)));
    int64_t seen = 0;
    for (size_t i = 0; i < counts_.size(); ++i) {
      seen += counts_[i];
      if (seen >= std::max<int64_t>(target, 1))
        return std::min(max_, kMinMs * std::pow(kRatio, static_cast<double>(i + 1)));
    }
    return max_;
  }
  int64_t total() const { return total_; }
  double max() const { return max_; }

 private:
  static constexpr double kMinMs = 1e-3;
  static constexpr double kRatio = 1.01;
  std::vector<int64_t> counts_ = std::vector<int64_t>(2600, 0);
  int64_t total_ = 0;
  double max_ = 0;
};

}  // namespace

Expected<ServeResult> serveBench(const std::function<Status()>& request, int concurrency,
                                 double seconds) {
  using Clock = std::chrono::steady_clock;
  std::vector<Histogram> latencies(static_cast<size_t>(concurrency));
  std::atomic<bool> stop{false};
  std::mutex errorMu;
  Status error;
  const auto start = Clock::now();
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  {
    std::vector<std::jthread> clients;
    for (int c = 0; c < concurrency; ++c)
      clients.emplace_back([&, c] {
        auto& mine = latencies[static_cast<size_t>(c)];
        while (!stop.load(std::memory_order_relaxed) && Clock::now() < deadline) {
          const auto t0 = Clock::now();
          Status st = request();
          mine.add(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
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
  Histogram all;
  for (const auto& l : latencies) all.merge(l);
  r.requests = all.total();
  r.throughputPerS = static_cast<double>(r.requests) / r.seconds;
  r.p50Ms = all.quantile(0.50);
  r.p90Ms = all.quantile(0.90);
  r.p99Ms = all.quantile(0.99);
  r.maxMs = all.max();
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
      return invalidArgument(
          "--concurrency expects client counts from 1 to 256 separated by "
          "commas (e.g. 1,2,4), got '" +
          *v + "'");
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
    std::printf("serving %s (batch %lld) on %d compute threads, %.1f s per level\n", what.c_str(),
                static_cast<long long>(batch), runtime::numThreads(), *seconds);
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
