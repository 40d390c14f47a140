// `kiln bench MODEL --concurrency 1,2,4 [--duration S]`: a serving benchmark. N client
// threads call one compiled model (or a loaded artifact) back to back for S seconds each;
// reported per concurrency: requests per second and the latency of each request (p50, p90,
// p99 within 1%, max), which includes waiting for compute threads (runtime::ComputeThreads).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ir/status.h"
#include "tools/cli.h"

namespace kiln::cli {

struct ServeResult {
  int concurrency = 0;
  int64_t requests = 0;
  double seconds = 0;
  double throughputPerS = 0;  // Requests per second (multiply by the batch for samples).
  double p50Ms = 0, p90Ms = 0, p99Ms = 0, maxMs = 0;
};

// Calls `request` from `concurrency` threads until `seconds` have passed (each thread finishes
// its request in flight). The first error stops every thread and is returned.
Expected<ServeResult> serveBench(const std::function<Status()>& request, int concurrency,
                                 double seconds);

// --concurrency and --duration, for `kiln bench`.
std::vector<OptionSpec> serveOptionSpecs();
// Parses --concurrency "1,2,4" (empty when the option is absent) and --duration.
Expected<std::vector<int>> concurrencyLevels(const Args& args);
Expected<double> serveDuration(const Args& args);

// Runs serveBench for every level of --concurrency and prints a table (or --json), the batch
// scaling requests to samples. Returns the exit code.
int runServeBench(const Args& args, const std::string& what, int64_t batch,
                  const std::function<Status()>& request);

}  // namespace kiln::cli
