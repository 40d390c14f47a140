// `kiln train`: train a zoo model with a cross-entropy loss, compiled (forward, backward and
// optimizer update as one graph) or --eager, on the built-in synthetic dataset or .npy data.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "compiler/train.h"
#include "frontends/npy/npy.h"
#include "models/synthetic.h"
#include "models/zoo.h"
#include "runtime/cpu/compute_threads.h"
#include "tools/cli.h"

namespace kiln::cli {

namespace {

// Batches from --data x.npy [M, ...] and --labels y.npy [M] (i64 or i32), taken in order and
// wrapping around.
struct NpyDataset {
  ir::TensorData x, labels;
};

Expected<NpyDataset> loadDataset(const std::string& data, const std::string& labels,
                                 const ir::Shape& inputShape) {
  KILN_ASSIGN_OR_RETURN(ir::TensorData x, frontends::readNpy(data));
  KILN_ASSIGN_OR_RETURN(ir::TensorData y, frontends::readNpy(labels));
  ir::Shape sample(inputShape.begin() + 1, inputShape.end());
  if (x.dtype() != ir::DType::kF32 || x.shape().size() != inputShape.size() ||
      !std::equal(sample.begin(), sample.end(), x.shape().begin() + 1))
    return invalidArgument(data + ": the model takes samples of f32" + ir::shapeToString(sample) +
                           ", the file holds " + x.type().toString() + " (expected [M" +
                           ir::shapeToString(sample).substr(1));
  if ((y.dtype() != ir::DType::kI64 && y.dtype() != ir::DType::kI32) || y.shape().size() != 1 ||
      y.shape()[0] != x.shape()[0])
    return invalidArgument(labels + ": expected i64 or i32 [" + std::to_string(x.shape()[0]) +
                           "] class indices, got " + y.type().toString());
  if (x.shape()[0] < inputShape[0])
    return invalidArgument(data + " holds " + std::to_string(x.shape()[0]) +
                           " samples, fewer than one batch of " + std::to_string(inputShape[0]));
  if (y.dtype() == ir::DType::kI32) {
    ir::TensorData wide(ir::DType::kI64, y.shape());
    for (int64_t i = 0; i < y.numElements(); ++i) wide.as<int64_t>()[i] = y.as<int32_t>()[i];
    y = std::move(wide);
  }
  return NpyDataset{std::move(x), std::move(y)};
}

models::SyntheticBatch datasetBatch(const NpyDataset& d, const ir::Shape& inputShape,
                                    uint64_t index) {
  const int64_t batch = inputShape[0], m = d.x.shape()[0];
  const int64_t per = d.x.numElements() / m;
  models::SyntheticBatch b{ir::TensorData(ir::DType::kF32, inputShape),
                           ir::TensorData(ir::DType::kI64, {batch})};
  for (int64_t n = 0; n < batch; ++n) {
    const int64_t src = static_cast<int64_t>((index * batch + n) % static_cast<uint64_t>(m));
    std::copy_n(d.x.as<float>() + src * per, per, b.x.as<float>() + n * per);
    b.labels.as<int64_t>()[n] = d.labels.as<int64_t>()[src];
  }
  return b;
}

// Where one profiled step's time went, to stderr: totals per kind (generated kernels, each op
// run as a library or reference call), then the slowest steps (eager: ops, aggregated).
void printProfile(const compiler::TrainingStep& step) {
  struct Row {
    double ms;
    std::string name, kind;
  };
  std::vector<Row> rows;
  if (const compiler::CompiledModel* cm = step.compiled()) {
    const auto& ms = cm->lastStats().stepMs;
    const auto& steps = cm->plan().steps;
    for (size_t i = 0; i < ms.size() && i < steps.size(); ++i) {
      const runtime::PlanStep& s = steps[i];
      rows.push_back({ms[i], s.name,
                      s.kind == runtime::PlanStep::Kind::kKernel ? "generated kernels"
                      : s.kind == runtime::PlanStep::Kind::kCopy ? "copies"
                                                                 : std::string(ir::opName(s.op))});
    }
  } else {
    for (const auto& [op, t] : step.eager()->lastStats().ops)
      rows.push_back({t.ms, op + " x" + std::to_string(t.count), op});
  }
  double total = 0;
  std::map<std::string, double> kinds;
  for (const Row& row : rows) {
    total += row.ms;
    kinds[row.kind] += row.ms;
  }
  std::vector<std::pair<double, std::string>> byKind;
  for (const auto& [k, ms] : kinds) byKind.emplace_back(ms, k);
  std::sort(byKind.begin(), byKind.end(), std::greater<>());
  std::sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) { return x.ms > y.ms; });
  std::fprintf(stderr, "profile of one step (%.1f ms):\n", total);
  for (const auto& [ms, k] : byKind)
    std::fprintf(stderr, "  %9.2f ms %5.1f%%  %s\n", ms, 100 * ms / total, k.c_str());
  std::fprintf(stderr, "slowest steps:\n");
  for (size_t i = 0; i < rows.size() && i < 15; ++i)
    std::fprintf(stderr, "  %9.2f ms %5.1f%%  %s\n", rows[i].ms, 100 * rows[i].ms / total,
                 rows[i].name.c_str());
}

}  // namespace

int runTrain(const Args& args) {
  if (args.positional.size() != 1)
    return reportError("train", invalidArgument("expected one MODEL (a zoo name)"));
  auto steps = args.intValue("steps", 100, 1, 10'000'000);
  if (!steps) return reportError("train", steps.status());
  auto batch = args.intValue("batch", 64, 1, 1 << 16);
  if (!batch) return reportError("train", batch.status());
  auto seed = args.intValue("seed", 0, 0, INT64_MAX);
  if (!seed) return reportError("train", seed.status());
  auto threads = args.intValue("threads", 0, 0, 1024);
  if (!threads) return reportError("train", threads.status());
  if (*threads > 0) runtime::setNumThreads(static_cast<int>(*threads));

  compiler::TrainOptions o;
  const std::string optimizer = args.value("optimizer").value_or("sgd");
  double lr = optimizer == "adam" ? 1e-3 : 0.01;
  if (auto v = args.value("lr")) {
    char* end = nullptr;
    lr = std::strtod(v->c_str(), &end);
    if (v->empty() || *end != '\0' || !(lr > 0) || lr > 10)
      return reportError("train",
                         invalidArgument("--lr expects a number in (0, 10], got '" + *v + "'"));
  }
  if (optimizer == "sgd") {
    o.optimizer = compiler::TrainOptions::Optimizer::kSgd;
    o.sgd = {.lr = lr, .momentum = 0.9};
  } else if (optimizer == "adam") {
    o.optimizer = compiler::TrainOptions::Optimizer::kAdam;
    o.adam.lr = lr;
  } else {
    return reportError("train",
                       invalidArgument("--optimizer must be sgd or adam, got '" + optimizer + "'"));
  }
  o.eager = args.flag("eager");
  o.mode.dropout = !args.flag("no-dropout");
  o.allowNonFinite = args.flag("allow-nonfinite");
  auto copts = compileOptionsFromArgs(args);
  if (!copts) return reportError("train", copts.status());
  copts->log = nullptr;
  o.compile = *copts;
  const bool json = args.flag("json");

  auto g = models::loadModel(args.positional[0], *batch, static_cast<uint64_t>(*seed));
  if (!g) return reportError("train", g.status());
  const ir::Shape inputShape = g->inputs()[0]->type().shape;
  if (g->outputs().size() != 1 || g->outputs()[0]->type().rank() != 2)
    return reportError(
        "train",
        invalidArgument("kiln train trains classifiers (one output of logits [N, C], "
                        "cross-entropy loss); '" +
                        args.positional[0] + "' outputs " + g->outputs()[0]->type().toString() +
                        ". Other models train through the C++ API "
                        "(compiler::TrainingStep, MSE loss)"));
  const int64_t classes = g->outputs()[0]->type().shape[1];
  std::optional<NpyDataset> data;
  const auto dataFile = args.value("data");
  const auto labelFile = args.value("labels");
  if (dataFile.has_value() != labelFile.has_value())
    return reportError("train", invalidArgument("--data and --labels go together"));
  if (dataFile) {
    auto d = loadDataset(*dataFile, *labelFile, inputShape);
    if (!d) return reportError("train", d.status());
    data = std::move(*d);
  }

  const auto t0 = std::chrono::steady_clock::now();
  auto step = compiler::TrainingStep::create(std::move(*g), o);
  if (!step) return reportError("train", step.status());
  const double setupMs = msSince(t0);
  if (!json)
    std::printf("training %s (batch %lld, %s, lr %g, %s) on %s; %s in %.0f ms\n",
                args.positional[0].c_str(), static_cast<long long>(*batch), optimizer.c_str(), lr,
                o.eager ? "eager" : "compiled", data ? dataFile->c_str() : "the synthetic dataset",
                o.eager ? "built the step graph" : "compiled the step", setupMs);

  std::vector<double> stepMs;
  double firstLoss = 0, lastLoss = 0;
  int64_t windowCorrect = 0, windowSeen = 0;
  double lastAccuracy = 0;
  const int64_t report = std::max<int64_t>(1, *steps / 10);
  for (int64_t s = 0; s < *steps; ++s) {
    models::SyntheticBatch b =
        data ? datasetBatch(*data, inputShape, static_cast<uint64_t>(s))
             : models::syntheticBatch(inputShape, classes, static_cast<uint64_t>(*seed),
                                      static_cast<uint64_t>(s));
    const auto ts = std::chrono::steady_clock::now();
    auto r = (**step)(runtime::Tensor::fromData(b.x), runtime::Tensor::fromData(b.labels));
    stepMs.push_back(msSince(ts));
    if (!r) return reportError("train", r.status());
    if (s == 0) firstLoss = r->loss;
    lastLoss = r->loss;
    windowCorrect += r->correct;
    windowSeen += *batch;
    if ((s + 1) % report == 0 || s + 1 == *steps) {
      lastAccuracy = static_cast<double>(windowCorrect) / static_cast<double>(windowSeen);
      if (!json) {
        const double ms = stepMs.back();
        std::printf("step %6lld/%lld  loss %.4f  accuracy %5.1f%%  %8.1f samples/s\n",
                    static_cast<long long>(s + 1), static_cast<long long>(*steps), r->loss,
                    100 * lastAccuracy, static_cast<double>(*batch) * 1000.0 / ms);
        std::fflush(stdout);
      }
      windowCorrect = windowSeen = 0;
    }
  }
  if (args.flag("profile")) {
    // One more step, timed step by step.
    (*step)->setProfiling(true);
    models::SyntheticBatch b = models::syntheticBatch(inputShape, classes, 0, 0);
    auto r = (**step)(runtime::Tensor::fromData(b.x), runtime::Tensor::fromData(b.labels));
    if (!r) return reportError("train", r.status());
    printProfile(**step);
  }
  // Throughput from the median step, leaving out the first (it pays first-touch costs).
  std::vector<double> steady(stepMs.size() > 1 ? stepMs.begin() + 1 : stepMs.begin(), stepMs.end());
  const Timing t = summarize(steady);
  const double samplesPerS = static_cast<double>(*batch) * 1000.0 / t.median;
  const int64_t peak = (*step)->compiled() ? (*step)->compiled()->report().arenaBytes
                                           : (*step)->eager()->lastStats().peakActivationBytes;
  if (json) {
    nlohmann::json j{{"model", args.positional[0]},
                     {"mode", o.eager ? "eager" : "compiled"},
                     {"optimizer", optimizer},
                     {"lr", lr},
                     {"batch", *batch},
                     {"steps", *steps},
                     {"first_loss", firstLoss},
                     {"final_loss", lastLoss},
                     {"final_accuracy", lastAccuracy},
                     {"samples_per_s", samplesPerS},
                     {"median_step_ms", t.median},
                     {"setup_ms", setupMs},
                     {"peak_activation_bytes", peak},
                     {"parameter_bytes", (*step)->graph().parameterBytes()}};
    if (const compiler::CompiledModel* cm = (*step)->compiled())
      j["arena_lower_bound_bytes"] = cm->report().arenaLowerBound;
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf(
        "loss %.4f -> %.4f; median step %.2f ms (%.1f samples/s); peak activations %.2f MB\n",
        firstLoss, lastLoss, t.median, samplesPerS, static_cast<double>(peak) / 1e6);
  }
  return kExitOk;
}

}  // namespace kiln::cli
