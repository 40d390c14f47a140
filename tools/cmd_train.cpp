// `kiln train`: train a zoo model with a cross-entropy loss, compiled (forward, backward and
// optimizer update as one graph) or --eager, on the built-in synthetic dataset or a dataset
// (--data: IDX files or .npy pairs, shuffled per epoch, batches prepared on a background
// thread, validation accuracy per epoch).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "compiler/train.h"
#include "frontends/data/dataset.h"
#include "models/synthetic.h"
#include "models/zoo.h"
#include "runtime/cpu/compute_threads.h"
#include "runtime/eager.h"
#include "runtime/gpu/nccl_collectives.h"
#include "tools/checkpoint.h"
#include "tools/cli.h"
#ifdef KILN_HAVE_MPI
#include "runtime/mpi/mpi_collectives.h"
#endif

namespace kiln::cli {

namespace {

// The training data of --data (and --labels, the older form of npy pairs), checked against the
// model: samples of its input's shape, labels below its number of classes, at least one global
// batch (`globalBatch`: the batch over every data-parallel rank); a validation set from the
// data's own split or --val-split.
Expected<frontends::DataSplit> loadTrainingData(const Args& args, const ir::Shape& inputShape,
                                                int64_t classes, uint64_t seed,
                                                int64_t globalBatch) {
  const std::string spec = *args.value("data");
  frontends::DataSplit split;
  const ir::Shape sample(inputShape.begin() + 1, inputShape.end());
  std::vector<float> mean, stdev;
  if (const auto n = args.value("normalize")) {
    // MEAN,...:STD,... per channel, as torchvision's Normalize.
    const size_t colon = n->find(':');
    auto parse = [](const std::string& list, std::vector<float>& out) {
      std::stringstream in(list);
      std::string item;
      while (std::getline(in, item, ',')) {
        char* end = nullptr;
        const float v = std::strtof(item.c_str(), &end);
        if (item.empty() || *end != '\0' || !std::isfinite(v)) return false;
        out.push_back(v);
      }
      return !out.empty();
    };
    if (colon == std::string::npos || !parse(n->substr(0, colon), mean) ||
        !parse(n->substr(colon + 1), stdev) || mean.size() != stdev.size() ||
        std::any_of(stdev.begin(), stdev.end(), [](float v) { return !(v > 0); }))
      return invalidArgument(
          "--normalize expects MEAN,...:STD,... (one per channel, STD > 0), "
          "got '" +
          *n + "'");
    if (spec.rfind("folder:", 0) != 0)
      return invalidArgument("--normalize applies to image folders (folder:DIR)");
  }
  if (const auto labels = args.value("labels")) {
    KILN_ASSIGN_OR_RETURN(split.train, frontends::readNpyPair(spec, *labels));
  } else {
    KILN_ASSIGN_OR_RETURN(split, frontends::loadDataSpec(spec, sample, mean, stdev));
  }
  auto check = [&](const frontends::Dataset& d) -> Status {
    const ir::Shape xs = d.sampleShape();
    if (xs != sample)
      return invalidArgument(d.source + ": samples of " + ir::shapeToString(xs) +
                             ", the model takes " + ir::shapeToString(sample));
    const int64_t* y = d.labels.as<int64_t>();
    for (int64_t i = 0; i < d.size(); ++i)
      if (y[i] < 0 || y[i] >= classes)
        return invalidArgument(d.source + ": sample " + std::to_string(i) + " has label " +
                               std::to_string(y[i]) + ", the model has " + std::to_string(classes) +
                               " classes");
    return Status::ok();
  };
  KILN_TRY(check(split.train));
  if (split.validation) KILN_TRY(check(*split.validation));
  double fraction = 0;
  if (const auto v = args.value("val-split")) {
    char* end = nullptr;
    fraction = std::strtod(v->c_str(), &end);
    if (v->empty() || *end != '\0' || !(fraction >= 0 && fraction < 1))
      return invalidArgument("--val-split expects a fraction in [0, 1), got '" + *v + "'");
    if (split.validation && fraction > 0)
      return invalidArgument("--val-split: " + spec + " has a validation set of its own");
  } else if (!split.validation && args.value("epochs")) {
    fraction = 0.1;  // The default hold-out for epochs over data without a validation set.
  }
  if (fraction > 0) {
    KILN_ASSIGN_OR_RETURN(split,
                          frontends::splitValidation(std::move(split.train), fraction, seed));
  }
  if (split.train.size() < globalBatch)
    return invalidArgument(split.train.source + ": " + std::to_string(split.train.size()) +
                           " training samples, fewer than one batch of " +
                           std::to_string(globalBatch) +
                           (globalBatch != inputShape[0] ? " (--batch per rank x ranks)" : ""));
  return split;
}

// Accuracy of the model's current weights on `d`: `eval` is the inference graph (its own copy of
// the weights), refreshed from the training step's parameters and running statistics by name,
// then run eagerly batch by batch (a last partial batch padded, its padding not counted).
Expected<double> validationAccuracy(ir::Graph& eval, const ir::Graph& trained,
                                    const frontends::Dataset& d) {
  for (ir::Value* p : eval.parameters()) {
    const ir::Value* q = trained.findValue(p->name());
    if (!q || !q->isParameter() || q->data().byteSize() != p->data().byteSize()) continue;
    ir::TensorData copy = p->data();
    std::memcpy(copy.data(), q->data().data(), copy.byteSize());
  }
  const int64_t batch = eval.inputs()[0]->type().shape[0];
  runtime::EagerExecutor exec(eval);
  int64_t correct = 0;
  std::vector<int64_t> order;
  for (int64_t first = 0; first < d.size(); first += batch) {
    const int64_t n = std::min(batch, d.size() - first);
    order.clear();
    for (int64_t k = 0; k < batch; ++k) order.push_back(k < n ? first + k : 0);
    KILN_ASSIGN_OR_RETURN(frontends::Batch b, frontends::gatherBatch(d, order, 0, batch));
    const runtime::Tensor x = runtime::Tensor::fromData(b.x);
    KILN_ASSIGN_OR_RETURN(auto out, exec.run(std::span<const runtime::Tensor>(&x, 1)));
    const runtime::Tensor& logits = out[0];
    const int64_t classes = logits.shape()[1];
    const float* l = logits.data<float>();
    for (int64_t k = 0; k < n; ++k) {
      const float* row = l + k * classes;
      correct += (std::max_element(row, row + classes) - row) == b.labels.as<int64_t>()[k];
    }
  }
  return static_cast<double>(correct) / static_cast<double>(d.size());
}

std::string clock(double seconds) {
  const auto s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

// Where one profiled step's time went, to stderr: totals per kind (generated kernels, each op
// run as a library or reference call), then the slowest steps (eager: ops, aggregated).
void printProfile(const compiler::TrainingStep& step) {
  struct Row {
    double ms;
    std::string name, kind;
  };
  std::vector<Row> rows;
  std::map<std::string, double> phases;
  if (step.compiled()) {
    // Data-parallel steps run the update as a plan of its own.
    for (const compiler::CompiledModel* cm : {step.compiled(), step.compiledUpdate()}) {
      if (!cm) continue;
      const auto& ms = cm->lastStats().stepMs;
      const auto& steps = cm->plan().steps;
      const auto& work = cm->report().stepWork;
      for (size_t i = 0; i < ms.size() && i < work.size(); ++i)
        phases[std::string(compiler::phaseOf(work[i].firstNode))] += ms[i];
      for (size_t i = 0; i < ms.size() && i < steps.size(); ++i) {
        const runtime::PlanStep& s = steps[i];
        rows.push_back({ms[i], s.name,
                        s.kind == runtime::PlanStep::Kind::kKernel ? "generated kernels"
                        : s.kind == runtime::PlanStep::Kind::kCopy
                            ? "copies"
                            : std::string(ir::opName(s.op))});
      }
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
  if (!phases.empty()) {
    std::fprintf(stderr, "  by phase (a fused kernel counts in its first node's):");
    for (const char* p : {"forward", "backward", "optimizer"})
      std::fprintf(stderr, " %s %.2f ms (%.0f%%)", p, phases[p], 100 * phases[p] / total);
    std::fprintf(stderr, "\n");
  }
  for (const auto& [ms, k] : byKind)
    std::fprintf(stderr, "  %9.2f ms %5.1f%%  %s\n", ms, 100 * ms / total, k.c_str());
  std::fprintf(stderr, "slowest steps:\n");
  for (size_t i = 0; i < rows.size() && i < 15; ++i)
    std::fprintf(stderr, "  %9.2f ms %5.1f%%  %s\n", rows[i].ms, 100 * rows[i].ms / total,
                 rows[i].name.c_str());
}

// runTrain on this process's rank of `comm` (data-parallel; null: one process).
int train(const Args& args, const std::shared_ptr<runtime::Collectives>& comm) {
  const int rank = comm ? comm->rank() : 0, ranks = comm ? comm->size() : 1;
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
  // Every step runs on the same number of threads, whatever else loads the machine: the
  // libraries' reductions split work by thread count, and a run (and a resumed one) must be
  // reproducible bit for bit. Load awareness (runtime/cpu/compute_threads.h) is for serving.
  runtime::ComputeThreads::setLoadAware(false);

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
  const int64_t globalBatch = *batch * ranks;  // Data-parallel: over every rank.
  o.mode.firstSample = rank * *batch;          // Dropout masks by global sample index.
  o.collectives = comm;
  o.overlap = !args.flag("no-overlap");
  auto bucketMb = args.intValue("bucket-mb", 25, 1, 1 << 14);
  if (!bucketMb) return reportError("train", bucketMb.status());
  o.bucketBytes = *bucketMb << 20;
  if (!comm && (args.value("bucket-mb") || args.flag("no-overlap") || args.value("collectives")))
    return reportError(
        "train", invalidArgument("--bucket-mb, --no-overlap and --collectives go with --ddp"));
  if (comm) {
    const std::string device = args.value("device").value_or("cpu");
    const std::string sum = args.value("collectives").value_or(device == "cuda" ? "nccl" : "mpi");
    if (sum == "nccl") {
      if (device != "cuda")
        return reportError("train", invalidArgument("--collectives nccl sums GPU memory: it goes "
                                                    "with --device cuda (here: " +
                                                    device + "); use --collectives mpi"));
      auto nccl = runtime::gpu::ncclCollectives(comm);
      if (!nccl)
        return reportError("train",
                           nccl.status().withContext("--collectives nccl (use --collectives mpi to "
                                                     "sum the gradients on the host instead)"));
      o.deviceCollectives = *nccl;
    } else if (sum != "mpi") {
      return reportError("train",
                         invalidArgument("--collectives must be nccl or mpi, got '" + sum + "'"));
    }
  }
  o.allowNonFinite = args.flag("allow-nonfinite");
  auto copts = compileOptionsFromArgs(args);
  if (!copts) return reportError("train", copts.status());
  copts->log = nullptr;
  o.compile = *copts;
  o.compile.recompute = args.flag("recompute");
  const bool json = args.flag("json");

  auto g = models::loadModel(args.positional[0], *batch, static_cast<uint64_t>(*seed));
  if (!g) return reportError("train", g.status());
  if (const auto weights = args.value("weights"))  // Fine-tuning from trained weights.
    if (Status st = applyWeights(*g, *weights); !st) return reportError("train", st);
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
  std::optional<frontends::DataSplit> data;
  const auto dataSpec = args.value("data");
  if (args.value("labels") && !dataSpec)
    return reportError("train", invalidArgument("--labels goes with --data x.npy"));
  if (dataSpec) {
    auto d = loadTrainingData(args, inputShape, classes, static_cast<uint64_t>(*seed), globalBatch);
    if (!d) return reportError("train", d.status());
    data = std::move(*d);
  } else if (args.value("epochs") || args.value("val-split")) {
    return reportError("train", invalidArgument("--epochs and --val-split need --data"));
  }
  // Checkpoints: the settings that decide the batches and the update rule, which a resumed run
  // must repeat, and the checkpoint to resume from.
  const std::optional<std::string> checkpointDir = args.value("checkpoint");
  auto saveEvery = args.intValue("save-every", 0, 1, 1'000'000'000);
  if (!saveEvery) return reportError("train", saveEvery.status());
  if ((args.value("save-every") || args.flag("resume")) && !checkpointDir)
    return reportError("train", invalidArgument("--save-every and --resume need --checkpoint DIR"));
  char lrText[32];
  std::snprintf(lrText, sizeof lrText, "%.17g", lr);
  CheckpointInfo info;
  info.settings = {{"model", args.positional[0]},
                   {"batch", std::to_string(*batch)},
                   {"seed", std::to_string(*seed)},
                   {"optimizer", optimizer},
                   {"lr", lrText},
                   {"data", dataSpec.value_or("synthetic") +
                                (args.value("labels") ? "," + *args.value("labels") : "")},
                   {"shuffle", args.flag("no-shuffle") ? "no" : "yes"},
                   {"dropout", o.mode.dropout ? "yes" : "no"},
                   {"val-split", args.value("val-split").value_or("default")},
                   {"precision", std::string(compiler::precisionName(o.compile.precision))},
                   {"ranks", std::to_string(ranks)},
                   {"ddp", comm ? "yes" : "no"}};
  std::optional<Checkpoint> resumeFrom;
  if (args.flag("resume")) {
    auto c = loadCheckpoint(*checkpointDir);
    if (!c) return reportError("train", c.status());
    for (const auto& [key, value] : info.settings) {
      auto it = c->info.settings.find(key);
      // Checkpoints from before data-parallel training were one rank's, without --ddp (whose
      // step holds the update's state apart: the two do not resume each other).
      const std::string was = it != c->info.settings.end() ? it->second
                              : key == "ranks"             ? "1"
                              : key == "ddp"               ? "no"
                                                           : "(none)";
      if (was != value)
        return reportError("train", invalidArgument("--resume: " + c->path + " was trained with " +
                                                    key + " " + was + ", this run has " + value +
                                                    " (a resumed run repeats the settings that "
                                                    "decide its batches and updates)"));
    }
    resumeFrom = std::move(*c);
  }
  if (checkpointDir && !resumeFrom &&
      std::filesystem::exists(std::filesystem::path(*checkpointDir) / "latest.json"))
    return reportError("train", invalidArgument("--checkpoint '" + *checkpointDir +
                                                "' holds a checkpoint already: --resume to "
                                                "continue that run, or give another directory"));
  const int64_t startStep = resumeFrom ? resumeFrom->info.step : 0;

  std::unique_ptr<frontends::BatchLoader> loader;
  int64_t totalSteps = *steps, epochs = 0;
  if (data) {
    const int64_t perEpoch = data->train.size() / globalBatch;  // At least 1: checked on load.
    loader = std::make_unique<frontends::BatchLoader>(
        data->train, *batch, static_cast<uint64_t>(*seed), !args.flag("no-shuffle"), 2,
        startStep / perEpoch, startStep % perEpoch, frontends::Shard{rank, ranks});
    auto e = args.intValue("epochs", 0, 1, 1'000'000);
    if (!e) return reportError("train", e.status());
    if (args.value("epochs")) {
      epochs = *e;
      totalSteps = epochs * loader->batchesPerEpoch();
    }
  }
  if (startStep >= totalSteps)
    return reportError("train", invalidArgument("--resume: " + resumeFrom->path + " is at step " +
                                                std::to_string(startStep) + ", this run ends at " +
                                                std::to_string(totalSteps)));
  // The inference graph, with weights of its own, for the validation accuracy.
  std::optional<ir::Graph> eval;
  if (data && data->validation && rank == 0) {  // Every rank holds the same weights.
    eval = g->clone();
    for (ir::Value* p : eval->parameters()) p->setData(p->data().clone());
  }

  const auto t0 = std::chrono::steady_clock::now();
  auto step = compiler::TrainingStep::create(std::move(*g), o);
  if (!step) return reportError("train", step.status());
  const double setupMs = msSince(t0);

  if (!json) {
    std::string on = "the synthetic dataset";
    if (data) {
      on = data->train.source + " (" + std::to_string(data->train.size()) + " samples";
      if (data->validation)
        on += ", " + std::to_string(data->validation->size()) + " for validation";
      on += ")";
    }
    std::printf("training %s (batch %lld, %s, lr %g, %s) on %s; %s in %.0f ms\n",
                args.positional[0].c_str(), static_cast<long long>(*batch), optimizer.c_str(), lr,
                o.eager ? "eager" : "compiled", on.c_str(),
                o.eager ? "built the step graph" : "compiled the step", setupMs);
    if (comm)
      std::printf(
          "data-parallel over %s: %d ranks x batch %lld = global batch %lld; gradients "
          "all-reduced in %zu bucket(s) of up to %lld MB%s\n",
          std::string(comm->name()).c_str(), ranks, static_cast<long long>(*batch),
          static_cast<long long>(globalBatch), (*step)->allReduceBuckets(),
          static_cast<long long>(*bucketMb),
          o.overlap ? ", each started during the backward" : ", started after the backward");
  }

  if (resumeFrom) {
    if (Status st = (*step)->restore(resumeFrom->tensors, startStep); !st)
      return reportError("train", st.withContext("--resume: " + resumeFrom->path));
    if (!json)
      std::printf("resumed from %s at step %lld\n", resumeFrom->path.c_str(),
                  static_cast<long long>(startStep));
  }
  if (!json && o.compile.precision != compiler::Precision::kFp32) {
    const auto backend = o.compile.backend ? o.compile.backend : runtime::defaultBackend();
    if (!backend->caps().lowPrecisionNote.empty())
      std::printf("%s on %s: %s\n",
                  std::string(compiler::precisionName(o.compile.precision)).c_str(),
                  std::string(backend->name()).c_str(), backend->caps().lowPrecisionNote.c_str());
  }
  std::vector<double> stepMs, backwardMs, exposedMs, updateMs;  // The last three: --ddp.
  int startedEarly = 0;
  double firstLoss = 0, lastLoss = 0;
  int64_t windowCorrect = 0, windowSeen = 0;
  double lastAccuracy = 0, windowLoss = 0, valAccuracy = -1;
  nlohmann::json epochLog = nlohmann::json::array();
  const int64_t perEpoch = loader ? loader->batchesPerEpoch() : 0;
  const int64_t report = epochs > 0 ? perEpoch : std::max<int64_t>(1, *steps / 10);
  const bool bar = !json && isatty(fileno(stdout)) != 0;
  const auto runStart = std::chrono::steady_clock::now();
  for (int64_t s = startStep; s < totalSteps; ++s) {
    frontends::Batch fb;
    models::SyntheticBatch sb;
    if (loader) {
      auto next = loader->next();
      if (!next) return reportError("train", next.status());
      fb = std::move(*next);
    } else {
      // Data-parallel: this rank's rows of the global batch.
      ir::Shape globalShape = inputShape;
      globalShape[0] *= ranks;
      sb = models::syntheticBatch(globalShape, classes, static_cast<uint64_t>(*seed),
                                  static_cast<uint64_t>(s));
      if (ranks > 1) {
        auto rows = [&](const ir::TensorData& all) {
          ir::Shape shape = all.shape();
          shape[0] /= ranks;
          ir::TensorData part(all.dtype(), shape);
          std::memcpy(part.data(), all.data() + rank * part.byteSize(), part.byteSize());
          return part;
        };
        sb.x = rows(sb.x);
        sb.labels = rows(sb.labels);
      }
    }
    const ir::TensorData& bx = loader ? fb.x : sb.x;
    const ir::TensorData& by = loader ? fb.labels : sb.labels;
    const auto ts = std::chrono::steady_clock::now();
    auto r = (**step)(runtime::Tensor::fromData(bx), runtime::Tensor::fromData(by));
    stepMs.push_back(msSince(ts));
    if (!r) return reportError("train", r.status());
    if (s == startStep) firstLoss = r->loss;
    lastLoss = r->loss;
    windowCorrect += r->correct;  // Data-parallel: the global batch's.
    windowSeen += globalBatch;
    windowLoss += r->loss;
    const double elapsed = msSince(runStart) / 1000;
    const double eta =
        elapsed / static_cast<double>(s + 1) * static_cast<double>(totalSteps - s - 1);
    if (bar && (s + 1) % report != 0) {
      // A progress bar within the report window (an epoch with --epochs), on a terminal only.
      const int64_t inWindow = s % report + 1, width = 24;
      const int64_t filled = inWindow * width / report;
      std::printf("\r%s [%s%s] %lld/%lld  loss %.4f  %.0f samples/s  ETA %s ",
                  epochs > 0 ? ("epoch " + std::to_string(s / perEpoch + 1)).c_str() : "steps",
                  std::string(static_cast<size_t>(filled), '=').c_str(),
                  std::string(static_cast<size_t>(width - filled), ' ').c_str(),
                  static_cast<long long>(inWindow), static_cast<long long>(report), r->loss,
                  static_cast<double>(globalBatch) * 1000.0 / stepMs.back(), clock(eta).c_str());
      std::fflush(stdout);
    }
    if ((s + 1) % report == 0 || s + 1 == totalSteps) {
      const int64_t windowSteps = windowSeen / globalBatch;
      lastAccuracy = static_cast<double>(windowCorrect) / static_cast<double>(windowSeen);
      if (eval) {
        auto acc = validationAccuracy(*eval, (*step)->graph(), *data->validation);
        if (!acc) return reportError("train", acc.status());
        valAccuracy = *acc;
      }
      const double waitShare = loader ? loader->waitMs() / (elapsed * 1000) : 0;
      if (epochs > 0)
        epochLog.push_back({{"epoch", s / perEpoch + 1},
                            {"loss", windowLoss / static_cast<double>(windowSteps)},
                            {"accuracy", lastAccuracy},
                            {"val_accuracy", valAccuracy},
                            {"elapsed_s", elapsed}});
      if (!json) {
        const double ms = stepMs.back();
        std::string head =
            epochs > 0 ? "epoch " + std::to_string(s / perEpoch + 1) + "/" + std::to_string(epochs)
                       : "step " + std::to_string(s + 1) + "/" + std::to_string(totalSteps);
        std::printf("%s%-14s loss %.4f  accuracy %5.1f%%", bar ? "\r" : "", head.c_str(),
                    epochs > 0 ? windowLoss / static_cast<double>(windowSteps) : r->loss,
                    100 * lastAccuracy);
        if (valAccuracy >= 0) std::printf("  val %5.1f%%", 100 * valAccuracy);
        std::printf("  %8.1f samples/s", static_cast<double>(globalBatch) * 1000.0 / ms);
        if (loader) std::printf("  data wait %.1f%%", 100 * waitShare);
        std::printf("  ETA %s%s\n", clock(eta).c_str(), bar ? "          " : "");
        std::fflush(stdout);
      }
      windowCorrect = windowSeen = 0;
      windowLoss = 0;
    }
    if (comm) {
      const compiler::CommunicationStats& c = (*step)->communication();
      backwardMs.push_back(c.backwardMs);
      exposedMs.push_back(c.exposedMs);
      updateMs.push_back(c.optimizerMs);
      startedEarly = c.startedEarly;
    }
    // Every rank holds the same state: rank 0 saves it.
    if (checkpointDir && rank == 0 &&
        ((*saveEvery > 0 && (s + 1) % *saveEvery == 0) || s + 1 == totalSteps)) {
      info.step = s + 1;
      if (Status st = saveCheckpoint(*checkpointDir, info, (*step)->state()); !st)
        return reportError("train", st);
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
  // Medians leave out the first step (it pays first-touch costs).
  auto median = [](std::vector<double> v) {
    if (v.size() > 1) v.erase(v.begin());
    return v.empty() ? 0.0 : summarize(v).median;
  };
  const double medianStepMs = median(stepMs);
  const double samplesPerS = static_cast<double>(globalBatch) * 1000.0 / medianStepMs;
  const int64_t peak = (*step)->compiled() ? (*step)->compiled()->report().arenaBytes
                                           : (*step)->eager()->lastStats().peakActivationBytes;
  if (json) {
    nlohmann::json j{{"model", args.positional[0]},
                     {"mode", o.eager ? "eager" : "compiled"},
                     {"optimizer", optimizer},
                     {"lr", lr},
                     {"batch", *batch},
                     {"steps", totalSteps},
                     {"first_loss", firstLoss},
                     {"final_loss", lastLoss},
                     {"final_accuracy", lastAccuracy},
                     {"samples_per_s", samplesPerS},
                     {"median_step_ms", medianStepMs},
                     {"setup_ms", setupMs},
                     {"peak_activation_bytes", peak},
                     {"parameter_bytes", (*step)->graph().parameterBytes()}};
    if (const compiler::CompiledModel* cm = (*step)->compiled())
      j["arena_lower_bound_bytes"] = cm->report().arenaLowerBound;
    if ((*step)->lossScale() > 0) {
      j["skipped_steps"] = (*step)->skippedSteps();
      j["loss_scale"] = (*step)->lossScale();
    }
    if (comm)
      j["data_parallel"] = {
          {"collectives", std::string(comm->name())},
          {"gradient_collectives",
           std::string((o.deviceCollectives ? o.deviceCollectives : comm)->name())},
          {"ranks", ranks},
          {"global_batch", globalBatch},
          {"buckets", (*step)->allReduceBuckets()},
          {"bucket_bytes", o.bucketBytes},
          {"overlap", o.overlap},
          {"allreduce_bytes", (*step)->communication().bytes},
          {"buckets_started_during_backward", startedEarly},
          {"median_forward_backward_ms", median(backwardMs)},
          {"median_exposed_allreduce_ms", median(exposedMs)},
          {"median_update_ms", median(updateMs)}};
    if (loader) {
      const double totalMs = msSince(runStart);
      j["data_wait_ms"] = loader->waitMs();
      j["data_wait_fraction"] = loader->waitMs() / totalMs;
      j["train_samples"] = data->train.size();
    }
    if (valAccuracy >= 0) j["val_accuracy"] = valAccuracy;
    if (epochs > 0) {
      j["epochs"] = epochs;
      j["epoch_log"] = epochLog;
    }
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf(
        "loss %.4f -> %.4f; median step %.2f ms (%.1f samples/s); peak activations %.2f MB\n",
        firstLoss, lastLoss, medianStepMs, samplesPerS, static_cast<double>(peak) / 1e6);
    if ((*step)->lossScale() > 0)
      std::printf(
          "fp16 loss scaling: %lld step(s) skipped for overflowing gradients; scale now "
          "%g\n",
          static_cast<long long>((*step)->skippedSteps()), (*step)->lossScale());
    if (comm)
      std::printf(
          "all-reduce per step (median, rank 0): forward+backward %.2f ms, then waited %.2f ms "
          "for the gradients' sums (%d of %zu bucket(s) started during the backward); update "
          "%.2f ms\n",
          median(backwardMs), median(exposedMs), startedEarly, (*step)->allReduceBuckets(),
          median(updateMs));
  }
  return kExitOk;
}

}  // namespace

int runTrain(const Args& args) {
  if (!args.flag("ddp")) return train(args, nullptr);
#ifdef KILN_HAVE_MPI
  auto comm = runtime::mpiCollectives();
  if (!comm) return reportError("train", comm.status());
  // Only rank 0 prints results; every rank prints its errors (stderr).
  int rc = kExitOk;
  if ((*comm)->rank() != 0 && !std::freopen("/dev/null", "w", stdout))
    rc = reportError("train", ioError("--ddp: cannot silence rank " +
                                      std::to_string((*comm)->rank()) + "'s output"));
  else
    rc = train(args, *comm);
  // A rank that fails stops every rank (the others may wait in a collective for it).
  if (rc != kExitOk && (*comm)->size() > 1)
    (*comm)->abort("kiln train exited with code " + std::to_string(rc) + " (its error is above)",
                   rc);
  return rc;
#else
  return reportError("train", unimplemented("--ddp: this kiln was built without MPI (install "
                                            "libopenmpi-dev and openmpi-bin: "
                                            "scripts/install-deps.sh, then rebuild)"));
#endif
}

}  // namespace kiln::cli
