// Training steps (compiler/train.h): compiled == eager after several steps for each optimizer,
// and a model trained on a learnable problem gets its loss down.
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>

#include "compiler/compile.h"
#include "compiler/train.h"
#include "ir/parser.h"
#include "models/synthetic.h"
#include "models/zoo.h"
#include "runtime/cpu/compute_threads.h"
#include "runtime/eager.h"

using namespace kiln;
using runtime::Tensor;

namespace {

// A batch of images for `shape`, and labels in [0, classes).
std::pair<Tensor, Tensor> batch(const ir::Shape& shape, int64_t classes, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  Tensor x = *Tensor::zeros(ir::DType::kF32, shape);
  for (int64_t i = 0; i < x.numElements(); ++i) x.data<float>()[i] = dist(rng);
  Tensor t = *Tensor::zeros(ir::DType::kI64, {shape[0]});
  for (int64_t i = 0; i < shape[0]; ++i)
    t.data<int64_t>()[i] = static_cast<int64_t>(rng() % classes);
  return {x, t};
}

// Relative max difference of f32 tensors; integer state (a step counter) must be equal.
double maxAbsDiff(const ir::TensorData& a, const ir::TensorData& b) {
  double diff = 0;
  for (int64_t i = 0; i < a.numElements() && a.dtype() == ir::DType::kF32; ++i)
    diff = std::max(diff, std::fabs(static_cast<double>(a.as<float>()[i]) - b.as<float>()[i]));
  return diff;
}

// The largest difference over b's largest value (or, `l2`, the difference's L2 norm over b's).
double relDiff(const ir::TensorData& a, const ir::TensorData& b, bool l2 = false) {
  if (a.dtype() != ir::DType::kF32) return a == b ? 0 : 1;
  double diff = 0, ref = 0;
  for (int64_t i = 0; i < a.numElements(); ++i) {
    const double d = std::fabs(static_cast<double>(a.as<float>()[i]) - b.as<float>()[i]);
    const double v = std::fabs(static_cast<double>(b.as<float>()[i]));
    diff = l2 ? diff + d * d : std::max(diff, d);
    ref = l2 ? ref + v * v : std::max(ref, v);
  }
  if (l2) diff = std::sqrt(diff), ref = std::sqrt(ref);
  return diff / std::max(ref, 1e-30);
}

ir::Graph zoo(const std::string& name, models::ModelOptions options) {
  auto g = models::buildModel(name, options);
  REQUIRE(g.hasValue());
  return std::move(g).value();
}

std::string tempCache() {
  return (std::filesystem::temp_directory_path() /
          ("kiln_test_train_" + std::to_string(::getpid())))
      .string();
}

// The same zoo model as a compiled and an eager training step with options `o`.
std::pair<std::unique_ptr<compiler::TrainingStep>, std::unique_ptr<compiler::TrainingStep>>
compiledAndEager(const std::string& name, const compiler::TrainOptions& o) {
  auto eagerOpts = o;
  eagerOpts.eager = true;
  auto compiled = compiler::TrainingStep::create(zoo(name, {4, 7}), o);
  INFO(compiled.status().message());
  REQUIRE(compiled.hasValue());
  auto eager = compiler::TrainingStep::create(zoo(name, {4, 7}), eagerOpts);
  INFO(eager.status().message());
  REQUIRE(eager.hasValue());
  return {std::move(*compiled), std::move(*eager)};
}

// `steps` steps of both on the same seeded batches (seeds from `seed`): the same losses within
// `tol`, relative.
void checkLossesMatch(compiler::TrainingStep& compiled, compiler::TrainingStep& eager, int steps,
                      uint32_t seed, double tol) {
  const ir::Shape shape = compiled.graph().inputs()[0]->type().shape;
  for (int s = 0; s < steps; ++s) {
    auto [x, t] = batch(shape, 10, seed + static_cast<uint32_t>(s));
    auto lc = compiled(x, t);
    auto le = eager(x, t);
    REQUIRE(lc.hasValue());
    REQUIRE(le.hasValue());
    CHECK(std::fabs(lc->loss - le->loss) <= tol * std::fabs(le->loss));
  }
}

// Two steps of both on the same seeded batches (seeds from `seed`): bit for bit the same losses
// and parameters.
void checkBitwiseSameSteps(compiler::TrainingStep& a, compiler::TrainingStep& b, uint32_t seed) {
  const ir::Shape shape = a.graph().inputs()[0]->type().shape;
  for (uint32_t s = 0; s < 2; ++s) {
    auto [x, t] = batch(shape, 10, seed + s);
    auto ra = a(x, t);
    auto rb = b(x, t);
    REQUIRE(ra.hasValue());
    REQUIRE(rb.hasValue());
    CHECK(ra->loss == rb->loss);
  }
  const auto& pa = a.graph().parameters();
  const auto& pb = b.graph().parameters();
  REQUIRE(pa.size() == pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    INFO(pa[i]->name());
    CHECK(pa[i]->data() == pb[i]->data());
  }
}

}  // namespace

TEST_CASE("training: compiled step == eager step after 3 steps, SGD and Adam") {
  const std::string name = GENERATE(as<std::string>{}, "mlp", "mnist_cnn");
  const bool adam = GENERATE(false, true);
  INFO(name << (adam ? " adam" : " sgd"));
  compiler::TrainOptions o;
  o.compile.cacheDir = tempCache();
  if (adam) {
    o.optimizer = compiler::TrainOptions::Optimizer::kAdam;
    o.adam.lr = 1e-3;
    o.adam.weightDecay = 1e-2;
    o.adam.decoupled = true;
  } else {
    o.sgd = {.lr = 0.05, .momentum = 0.9, .weightDecay = 1e-4, .nesterov = true};
  }
  auto [compiled, eager] = compiledAndEager(name, o);
  checkLossesMatch(*compiled, *eager, 3, 100, 1e-4);
  // Every parameter and every piece of optimizer state, and they did change.
  const auto& pc = compiled->graph().parameters();
  const auto& pe = eager->graph().parameters();
  REQUIRE(pc.size() == pe.size());
  auto fresh = models::buildModel(name, {4, 7});
  int changed = 0;
  for (size_t i = 0; i < pc.size(); ++i) {
    if (!pc[i]->trainable() && !pc[i]->isState()) continue;
    INFO(pc[i]->name());
    // Adam divides by sqrt(v): where a gradient is near 0 its f32 rounding, which differs
    // between fused and op-by-op evaluation, decides a step of up to lr (1e-3 here), in either
    // direction. mnist_cnn's conv2.weight measured 1.35e-3 of its largest value (its gradients
    // run on winograd, whose transforms carry an input's rounding difference further than direct
    // sums do), then 1.6e-3 to 3.5e-3 depending on the thread count once dropout's step counter
    // advanced by 1 (it had added 1.0f's bits). So Adam's state is compared in L2 (measured:
    // 4.2e-5), where a few such flips weigh little and a wrong update weighs O(1).
    if (adam)
      CHECK(relDiff(pc[i]->data(), pe[i]->data(), /*l2=*/true) <= 1e-3);
    else
      CHECK(relDiff(pc[i]->data(), pe[i]->data()) <= 1e-4);
    if (const ir::Value* f = fresh->findValue(pc[i]->name()); f && f->trainable())
      changed += !(f->data() == pc[i]->data());
  }
  CHECK(changed > 0);
  std::filesystem::remove_all(o.compile.cacheDir);
}

TEST_CASE(
    "training: every zoo model, compiled step == eager step after 3 steps, in training "
    "mode") {
  // BatchNorm with batch statistics and running-statistics updates, dropout with seeded masks;
  // bert_layer (hidden states out) trains with the MSE loss. ResNets at 64x64 to keep the eager
  // reference kernels quick.
  const std::string name =
      GENERATE(as<std::string>{}, "mlp", "mnist_cnn", "resnet18", "resnet50", "bert_layer");
  INFO(name);
  const models::ModelOptions mo{
      .batch = 2, .seed = 3, .imageSize = name.starts_with("resnet") ? 64 : 0};
  compiler::TrainOptions o;
  o.compile.cacheDir = tempCache();
  // resnet50 at batch 2 is chaotic in training mode: its gradients are large (momentum
  // buffers near 90 after 3 steps) and so sensitive to the weights that the f32 rounding
  // differences between fused and op-by-op evaluation, after one update at lr 1e-3, grow to 1e-2
  // of the update within 3 steps (eager against eager with the weights perturbed by 1e-6 differs
  // by up to 34% in one step). Its steps run with lr 0: the gradients still go through
  // momentum, and the running statistics through their updates, three times. resnet18 at batch
  // 2 is at the edge of that regime: at lr 1e-3 it passes on 2 threads and fails on 1 (oneDNN's
  // summation order changes), so it runs at lr 1e-4; its updates are also compared with
  // PyTorch's over 5 steps at batch 4 in tests/peers/train_check.cpp.
  o.sgd = {.lr = name == "resnet50"   ? 0.0
                 : name == "resnet18" ? 1e-4
                                      : 1e-3,
           .momentum = 0.9,
           .weightDecay = 1e-4,
           .nesterov = false};
  auto eagerOpts = o;
  eagerOpts.eager = true;
  auto compiled = compiler::TrainingStep::create(zoo(name, mo), o);
  INFO(compiled.status().message());
  REQUIRE(compiled.hasValue());
  auto eager = compiler::TrainingStep::create(zoo(name, mo), eagerOpts);
  REQUIRE(eager.hasValue());
  CHECK((*compiled)->crossEntropy() == (name != "bert_layer"));
  // Every float parameter and state update is written in place (no result tensor, no copy);
  // the dropout step counter (i64, 8 bytes) may be copied back.
  const auto& written = (*compiled)->compiled()->plan().outputParameter;
  const auto& outputs = (*compiled)->graph().outputs();
  for (size_t i = 2; i < outputs.size(); ++i)
    if (outputs[i]->type().dtype == ir::DType::kF32) CHECK(written.at(i) >= 0);
  const ir::Shape shape = (*compiled)->graph().inputs()[0]->type().shape;
  const ir::TensorType targetType = (*compiled)->targetType();
  for (uint32_t s = 0; s < 2; ++s) {
    auto [x, t] = batch(shape, 10, 200 + s);
    if (!(*compiled)->crossEntropy()) t = batch(targetType.shape, 1, 300 + s).first;
    auto lc = (**compiled)(x, t);
    auto le = (**eager)(x, t);
    INFO(lc.status().message() << le.status().message());
    REQUIRE(lc.hasValue());
    REQUIRE(le.hasValue());
    CHECK(std::fabs(lc->loss - le->loss) <= 1e-4 * std::fabs(le->loss));
  }
  const auto& pc = (*compiled)->graph().parameters();
  const auto& pe = (*eager)->graph().parameters();
  REQUIRE(pc.size() == pe.size());
  auto fresh = models::buildModel(name, mo);
  // Within 1e-4 of each tensor's max, or of the largest change of a parameter: a ReLU input
  // within f32 rounding of 0 lands on either side in fused and op-by-op evaluation and moves the
  // nearly cancelling gradient sums of the BatchNorm biases behind it by percents of their tiny
  // values (tests/peers/train_check.cpp, where PyTorch does the same against kiln).
  double update = 0;
  for (const ir::Value* p : pe)
    if (const ir::Value* f = fresh->findValue(p->name()); f && f->trainable())
      update = std::max(update, maxAbsDiff(p->data(), f->data()));
  int changed = 0, states = 0;
  for (size_t i = 0; i < pc.size(); ++i) {
    if (!pc[i]->trainable() && !pc[i]->isState()) continue;
    INFO(pc[i]->name() << ": largest update " << update << ", max |diff| "
                       << maxAbsDiff(pc[i]->data(), pe[i]->data()));
    if (name == "resnet50")
      // At lr 0 the momentum buffers hold three gradients at the same weights, which batch 2
      // makes ill-conditioned (layer4's BatchNorm normalizes 8 values): on an AVX2 Zen 3,
      // oneDNN's channels-last gradient kernels sum in another order than eager's plain ones
      // and the early layers' momentum moves by up to 1.5% in l2 (within 1e-4 on the AVX-512
      // machines CI ran before; on the Zen 3 at batch 8 within 1e-4 with layout selection off,
      // conv1's momentum 0.31 apart with it). That is the conditioning, not an inaccurate kernel:
      // against PyTorch's float64 step (peer: train resnet50, batch 4) the channels-last step is
      // within 0.077 of its update, eager 0.19 and PyTorch's own float32 step 0.31. resnet18
      // holds 1e-4 here, and against PyTorch in tests/peers/train_check.cpp.
      CHECK(relDiff(pc[i]->data(), pe[i]->data(), /*l2=*/true) <= 5e-2);
    else
      CHECK((relDiff(pc[i]->data(), pe[i]->data()) <= 1e-4 ||
             maxAbsDiff(pc[i]->data(), pe[i]->data()) <= 1e-4 * update));
    if (const ir::Value* f = fresh->findValue(pc[i]->name()); f && !(f->data() == pc[i]->data())) {
      changed += f->trainable();
      states += f->isState() || !f->trainable();  // Running statistics moved.
    }
  }
  CHECK((changed > 0) == (name != "resnet50"));
  if (name.starts_with("resnet")) CHECK(states > 0);
  std::filesystem::remove_all(o.compile.cacheDir);
}

TEST_CASE("precision bf16 on the CPU: native or converted products, compiled == eager, near fp32") {
  // The CPU's library runs bf16 convolutions on oneDNN's native bf16 kernels where the CPU has
  // them and converts the other products (operands widened to f32, results rounded once):
  // compiled inference and a compiled training step agree with their eager runs on the same
  // autocast graph (the reference kernels' bf16 rule), and stay near fp32.
  const std::string name = GENERATE(as<std::string>{}, "mlp", "mnist_cnn");
  INFO(name);
  ir::Graph g = zoo(name, {2, 5});
  compiler::CompileOptions co;
  co.cacheDir = tempCache();
  co.precision = compiler::Precision::kBf16;
  auto cm = compiler::compile(g, co);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  int low = 0;
  for (const ir::Node* n : (*cm)->optimizedGraph().nodes())
    low += n->info().has(ir::kAutocast) && n->output()->type().dtype == ir::DType::kBF16;
  CHECK(low >= 2);
  auto autocast = compiler::withPrecision(g, co.precision);
  REQUIRE(autocast.hasValue());
  auto [x, t] = batch(g.inputs()[0]->type().shape, 10, 5);
  const std::vector<Tensor> ins{x};
  auto got = (*cm)->run(ins);
  auto want = runtime::EagerExecutor(*autocast).run(ins);
  auto fp32 = runtime::EagerExecutor(g).run(ins);
  REQUIRE(got.hasValue());
  REQUIRE(want.hasValue());
  REQUIRE(fp32.hasValue());
  CHECK(relDiff((*got)[0].toData(), (*want)[0].toData()) <= 2e-2);
  CHECK(relDiff((*got)[0].toData(), (*fp32)[0].toData()) <= 6e-2);

  compiler::TrainOptions o;
  o.compile = co;
  o.sgd = {.lr = 0.05, .momentum = 0.9, .weightDecay = 1e-4, .nesterov = false};
  auto [compiled, eager] = compiledAndEager(name, o);
  checkLossesMatch(*compiled, *eager, 2, 200, 1e-2);
  for (const ir::Value* p : compiled->graph().parameters())
    if (p->trainable()) CHECK(p->data().dtype() == ir::DType::kF32);  // Master weights.
  std::filesystem::remove_all(co.cacheDir);
}

TEST_CASE("training: the mlp learns a learnable problem (loss falls)") {
  // Each class has a fixed random pattern; an example is its class's pattern plus as much
  // noise, so the classes are separable but not trivially.
  compiler::TrainOptions o;
  o.compile.cacheDir = tempCache();
  o.sgd = {.lr = 0.05, .momentum = 0.9};
  auto step = compiler::TrainingStep::create(zoo("mlp", {32, 1}), o);
  REQUIRE(step.hasValue());
  const ir::Shape shape = (*step)->graph().inputs()[0]->type().shape;
  const int64_t features = shape[1];
  auto [patterns, unused] = batch({10, features}, 10, 999);
  double first = 0, last = 0;
  for (uint32_t s = 0; s < 30; ++s) {
    auto [x, t] = batch(shape, 10, s);
    for (int64_t n = 0; n < shape[0]; ++n)
      for (int64_t f = 0; f < features; ++f)
        x.data<float>()[n * features + f] +=
            patterns.data<float>()[t.data<int64_t>()[n] * features + f];
    auto loss = (**step)(x, t);
    REQUIRE(loss.hasValue());
    if (s == 0) first = loss->loss;
    last = loss->loss;
  }
  INFO("loss " << first << " -> " << last);
  CHECK(first > 1.5);
  CHECK(last < 0.25 * first);
  std::filesystem::remove_all(o.compile.cacheDir);
}

TEST_CASE("training: fp16 with dynamic loss scaling skips overflowing steps and adapts") {
  // A scale of 2^100 overflows fp16's gradients: those steps change nothing, count as skipped
  // and halve the scale until the gradients fit; then steps apply, and after the growth
  // interval of good steps the scale doubles.
  for (const bool eager : {false, true}) {
    INFO((eager ? "eager" : "compiled"));
    compiler::TrainOptions o;
    o.compile.cacheDir = tempCache();
    o.compile.precision = compiler::Precision::kFp16;
    o.eager = eager;
    o.lossScale = std::ldexp(1.0, 100);
    o.lossScaleGrowthInterval = 3;
    auto step = compiler::TrainingStep::create(zoo("mlp", {8, 1}), o);
    REQUIRE(step.hasValue());
    const ir::Shape shape = (*step)->graph().inputs()[0]->type().shape;
    auto weights = [&] { return (*step)->graph().findValue("fc1.weight")->data().clone(); };
    const ir::TensorData before = weights();
    auto [x, t] = batch(shape, 10, 1);
    auto r = (**step)(x, t);
    REQUIRE(r.hasValue());
    CHECK(r->skipped);
    CHECK(std::isfinite(r->loss));  // The unscaled loss: not an error.
    CHECK((*step)->skippedSteps() == 1);
    CHECK((*step)->lossScale() == std::ldexp(1.0, 99));
    CHECK(weights().bitwiseEqual(before));
    // Halving until the gradients fit, then three good steps in a row: the scale doubles at the
    // third (growth interval 3).
    int inARow = 0, s = 1;
    double scaleAtFirstGood = 0;
    for (; s < 200 && inARow < 3; ++s) {
      auto [xs, ts] = batch(shape, 10, static_cast<uint32_t>(s));
      const double scaleBefore = (*step)->lossScale();
      auto rs = (**step)(xs, ts);
      REQUIRE(rs.hasValue());
      if (rs->skipped) {
        CHECK((*step)->lossScale() == scaleBefore / 2);
        inARow = 0;
      } else {
        if (inARow == 0) scaleAtFirstGood = scaleBefore;
        ++inARow;
      }
    }
    REQUIRE(inARow == 3);
    INFO("skipped " << (*step)->skippedSteps() << ", scale " << (*step)->lossScale());
    CHECK((*step)->lossScale() == 2 * scaleAtFirstGood);
    CHECK(scaleAtFirstGood < std::ldexp(1.0, 99));
    CHECK((*step)->skippedSteps() == s - 3);  // Every step but the last three.
    CHECK_FALSE(weights().bitwiseEqual(before));
    std::filesystem::remove_all(o.compile.cacheDir);
  }
}

TEST_CASE("training: every node of the step belongs to a phase, by its name") {
  compiler::TrainOptions o;
  o.compile.cacheDir = tempCache();
  o.eager = true;
  auto step = compiler::TrainingStep::create(zoo("mnist_cnn", {8, 1}), o);
  REQUIRE(step.hasValue());
  std::map<std::string, int> count;
  for (const ir::Node* n : (*step)->graph().nodes())
    ++count[std::string(compiler::phaseOf(n->name()))];
  CHECK(count["forward"] > 5);
  CHECK(count["backward"] > count["forward"]);
  CHECK(count["optimizer"] >= 8);  // At least one update per parameter.
  CHECK(compiler::phaseOf("loss") == "forward");
  CHECK(compiler::phaseOf("conv2.backward") == "backward");
  CHECK(compiler::phaseOf("optimizer") == "optimizer");
  std::filesystem::remove_all(o.compile.cacheDir);
}

TEST_CASE("training: restore() of a saved state continues the run bit for bit") {
  runtime::ComputeThreads::setLoadAware(false);  // The same threads every step, as kiln train.
  compiler::TrainOptions o;
  o.compile.cacheDir = tempCache();
  o.optimizer = compiler::TrainOptions::Optimizer::kAdam;  // State: moments and a step count.
  auto step = compiler::TrainingStep::create(zoo("mnist_cnn", {8, 1}), o);
  REQUIRE(step.hasValue());
  const ir::Shape shape = (*step)->graph().inputs()[0]->type().shape;
  auto run = [&](uint32_t from, uint32_t to) {
    for (uint32_t s = from; s < to; ++s) {
      auto [x, t] = batch(shape, 10, s);
      REQUIRE((**step)(x, t).hasValue());
    }
  };
  auto snapshot = [&] {
    std::map<std::string, ir::TensorData> copy;
    for (const auto& [name, t] : (*step)->state()) copy.emplace(name, t.clone());
    return copy;
  };
  run(0, 2);
  const auto saved = snapshot();
  CHECK(saved.count("conv1.weight") == 1);
  run(2, 4);
  const auto uninterrupted = snapshot();
  REQUIRE((*step)->restore(saved, 2).isOk());
  CHECK((*step)->stepsRun() == 2);
  run(2, 4);
  const auto resumed = snapshot();
  for (const auto& [name, t] : uninterrupted) {
    INFO(name);
    CHECK(t.bitwiseEqual(resumed.at(name)));
  }
  // A state that is not this step's is refused before anything changes.
  auto missing = saved;
  missing.erase("fc1.bias");
  Status st = (*step)->restore(missing, 2);
  CHECK_THAT(st.message(), Catch::Matchers::Contains("no tensor 'fc1.bias'"));
  auto reshaped = saved;
  reshaped["fc2.weight"] = ir::TensorData(ir::DType::kF32, {3, 3});
  st = (*step)->restore(reshaped, 2);
  CHECK_THAT(st.message(), Catch::Matchers::Contains("'fc2.weight' is f32[3,3], the step's is"));
  for (const auto& [name, t] : (*step)->state()) CHECK(t.bitwiseEqual(resumed.at(name)));
  runtime::ComputeThreads::setLoadAware(true);
  std::filesystem::remove_all(o.compile.cacheDir);
}

TEST_CASE("training: mnist_cnn exceeds 95% accuracy on the synthetic dataset within 100 steps") {
  // The dataset `kiln train` uses (models/synthetic.h). Batch 16, SGD lr 0.02 momentum 0.9, with
  // dropout active. Then the trained weights, in inference mode (no dropout), classify 10 batches
  // the training never saw.
  compiler::TrainOptions o;
  o.compile.cacheDir = tempCache();
  o.sgd = {.lr = 0.02, .momentum = 0.9};
  auto step = compiler::TrainingStep::create(zoo("mnist_cnn", {16, 0}), o);
  REQUIRE(step.hasValue());
  const ir::Shape shape = (*step)->graph().inputs()[0]->type().shape;
  double loss = 0;
  for (uint64_t s = 0; s < 100; ++s) {
    const models::SyntheticBatch b = models::syntheticBatch(shape, 10, 0, s);
    auto r = (**step)(Tensor::fromData(b.x), Tensor::fromData(b.labels));
    REQUIRE(r.hasValue());
    if (s >= 80) loss += r->loss / 20;
  }
  ir::Graph model = zoo("mnist_cnn", {16, 0});
  for (ir::Value* p : model.parameters()) p->setData((*step)->graph().findValue(p->name())->data());
  runtime::EagerExecutor eval(model);
  int64_t correct = 0, seen = 0;
  for (uint64_t s = 1000; s < 1010; ++s) {
    const models::SyntheticBatch b = models::syntheticBatch(shape, 10, 0, s);
    const std::vector<Tensor> in{Tensor::fromData(b.x)};
    auto out = eval.run(in);
    REQUIRE(out.hasValue());
    const float* logits = (*out)[0].template data<float>();
    for (int64_t i = 0; i < shape[0]; ++i, ++seen) {
      const float* row = logits + i * 10;
      correct += std::max_element(row, row + 10) - row == b.labels.as<int64_t>()[i];
    }
  }
  INFO(correct << "/" << seen
               << " held-out examples correct; mean training loss over the last 20 "
                  "steps "
               << loss);
  CHECK(static_cast<double>(correct) / static_cast<double>(seen) > 0.95);
  CHECK(loss < 0.35);  // From 2.3 (ln 10) at the start; dropout keeps it from 0.
  std::filesystem::remove_all(o.compile.cacheDir);
}

TEST_CASE("training: bad models and options are clear errors") {
  compiler::TrainOptions o;
  o.eager = true;
  // BatchNorm over one value per channel has no batch variance.
  auto one = ir::parseGraph(
      "graph t(%x : f32[1,3]) {\n  param %s : f32[3]\n  param %b : f32[3]\n"
      "  param %m : f32[3] buffer\n  param %v : f32[3] buffer\n"
      "  %y = batch_norm(%x, %s, %b, %m, %v)\n  return %y\n}");
  REQUIRE(one.hasValue());
  for (ir::Value* p : one->parameters()) p->setData(ir::TensorData(ir::DType::kF32, {3}));
  auto r = compiler::TrainingStep::create(std::move(*one), o);
  REQUIRE_FALSE(r.hasValue());
  CHECK_THAT(r.status().message(), Catch::Contains("batch_norm") && Catch::Contains("at least 2"));
  // Running statistics that are trainable parameters.
  auto trainable = ir::parseGraph(
      "graph t(%x : f32[4,3]) {\n  param %s : f32[3]\n  param %b : f32[3]\n"
      "  param %m : f32[3]\n  param %v : f32[3] buffer\n"
      "  %y = batch_norm(%x, %s, %b, %m, %v)\n  return %y\n}");
  REQUIRE(trainable.hasValue());
  for (ir::Value* p : trainable->parameters()) p->setData(ir::TensorData(ir::DType::kF32, {3}));
  r = compiler::TrainingStep::create(std::move(*trainable), o);
  REQUIRE_FALSE(r.hasValue());
  CHECK_THAT(r.status().message(), Catch::Contains("'%m', a trainable parameter"));
  // Cross-entropy on an output that is not logits [N, C].
  o.loss = compiler::TrainOptions::Loss::kCrossEntropy;
  r = compiler::TrainingStep::create(zoo("bert_layer", {1, 0}), o);
  REQUIRE_FALSE(r.hasValue());
  CHECK_THAT(r.status().message(), Catch::Contains("needs an output of logits [N, C]"));
}

TEST_CASE("training: dropout masks are seeded, change every step, and --no-dropout removes them") {
  // Two eager steps with lr 0 on the same batch: the losses differ (new masks), and a second
  // TrainingStep with the same seed reproduces them; without dropout they are equal.
  auto losses = [](bool dropout) {
    compiler::TrainOptions o;
    o.eager = true;
    o.sgd.lr = 0;
    o.mode.dropout = dropout;
    auto step = compiler::TrainingStep::create(zoo("mnist_cnn", {8, 1}), o);
    REQUIRE(step.hasValue());
    auto [x, t] = batch((*step)->graph().inputs()[0]->type().shape, 10, 5);
    std::vector<double> out;
    for (int s = 0; s < 2; ++s) out.push_back((**step)(x, t)->loss);
    return out;
  };
  const auto a = losses(true), b = losses(true), c = losses(false);
  CHECK(a == b);
  CHECK(a[0] != a[1]);
  CHECK(c[0] == c[1]);
}

TEST_CASE("training: a non-finite loss is an error unless allowed, compiled and eager") {
  for (bool eager : {false, true}) {
    for (bool allow : {false, true}) {
      INFO((eager ? "eager" : "compiled") << (allow ? ", allowed" : ""));
      compiler::TrainOptions o;
      o.eager = eager;
      o.allowNonFinite = allow;
      auto step = compiler::TrainingStep::create(zoo("mlp", {4, 1}), o);
      REQUIRE(step.hasValue());
      Tensor x = *Tensor::empty(ir::DType::kF32, {4, 784});
      for (int64_t i = 0; i < x.numElements(); ++i) x.data<float>()[i] = 0.01f;
      Tensor y = *Tensor::empty(ir::DType::kI64, {4});
      for (int i = 0; i < 4; ++i) y.data<int64_t>()[i] = i;
      REQUIRE((**step)(x, y).hasValue());  // A finite step first.
      x.data<float>()[5] = std::nanf("");
      auto r = (**step)(x, y);
      if (allow) {
        REQUIRE(r.hasValue());
        CHECK(std::isnan(r->loss));
      } else {
        REQUIRE_FALSE(r.hasValue());
        CHECK(r.status().isUserError());
        CHECK_THAT(r.status().message(), Catch::Contains("training step 2: the loss is nan") &&
                                             Catch::Contains("allowNonFinite"));
      }
    }
  }
}

TEST_CASE("training: the optimizer updates every parameter in one horizontal kernel, in place") {
  // Horizontal fusion (compiler/schedule.cpp): the per-parameter update kernels are independent
  // and consecutive, so they run as the parts of one kernel (one parallel region, as PyTorch's
  // foreach optimizers launch one kernel over many tensors), each still written over its
  // parameter and state in place. Updates fused into the kernel of their own gradient (a
  // linear's bias: the gradient's column sum, then the update) stay there, and so do those a
  // library call takes as its epilogue (with momentum, a matmul's weight gradient adds the
  // decayed momentum as a post-op). (Their results: the compiled == eager tests above.)
  const bool adam = GENERATE(false, true);
  INFO((adam ? "adam" : "sgd"));
  compiler::TrainOptions o;
  o.compile.cacheDir = tempCache();
  if (adam) o.optimizer = compiler::TrainOptions::Optimizer::kAdam;
  auto step = compiler::TrainingStep::create(zoo("mnist_cnn", {4, 7}), o);
  INFO(step.status().message());
  REQUIRE(step.hasValue());
  const compiler::CompiledModel& m = *(*step)->compiled();
  const runtime::Plan& plan = m.plan();
  REQUIRE(m.report().stepWork.size() == plan.steps.size());
  // The optimizer's kernel steps: all updates in one (Adam: after its bias corrections, a
  // kernel of scalars they read).
  std::vector<size_t> updates;
  for (size_t i = 0; i < plan.steps.size(); ++i)
    if (plan.steps[i].kind == runtime::PlanStep::Kind::kKernel &&
        compiler::phaseOf(m.report().stepWork[i].firstNode) == "optimizer")
      updates.push_back(i);
  REQUIRE(updates.size() == (adam ? 2u : 1u));
  const runtime::PlanStep& h = plan.steps[updates.back()];
  size_t parts = 0;
  for (const compiler::KernelSource& k : m.report().kernels)
    if (k.name == h.name) {
      CHECK(k.group == "horizontal");
      for (size_t at = k.cpp.find("static void "); at != std::string::npos;
           at = k.cpp.find("static void ", at + 1))
        ++parts;
    }
  CHECK(parts >= 6);  // Of mnist_cnn's 8 parameters; the linears' biases update in their sums.
  // Each of those parameters (and Adam's moments) written over in place.
  int inPlace = 0;
  for (const runtime::BufferRef& b : h.outputs)
    inPlace += b.kind == runtime::BufferRef::Kind::kParameter;
  CHECK(inPlace == static_cast<int>(h.outputs.size()));
  CHECK(inPlace >= static_cast<int>(parts) * (adam ? 3 : 1));
  std::filesystem::remove_all(o.compile.cacheDir);
}

TEST_CASE("training: convolution networks train channels-last, converting only at their ends") {
  // Layout selection keeps the whole step NHWC (forward, the gradients of convolution, pooling
  // and BatchNorm, the pointwise ops between them): relayouts only where a value enters the
  // region (the image; the classifier's gradient coming back) or leaves it (flatten). Before the
  // gradients ran NHWC every one of them had a relayout on each side (resnet18: 3.78 s a step
  // at batch 32 against 2.69 s NCHW; now 0.86 s against 0.94 s NCHW).
  struct Case {
    const char* name;
    int conversions, minNhwcValues;
  };
  for (const Case c :
       {Case{"mnist_cnn", 3, 8}, Case{"resnet18", 2, 100}, Case{"resnet50", 2, 200}}) {
    INFO(c.name);
    const models::ModelOptions mo{
        .batch = 2, .seed = 3, .imageSize = std::string(c.name).starts_with("resnet") ? 64 : 0};
    compiler::TrainOptions o;
    o.compile.cacheDir = tempCache();
    auto step = compiler::TrainingStep::create(zoo(c.name, mo), o);
    INFO(step.status().message());
    REQUIRE(step.hasValue());
    const compiler::CompileReport& r = (*step)->compiled()->report();
    std::string remark;
    for (const std::string& m : r.remarks)
      if (m.starts_with("layout-selection")) remark = m;
    INFO(remark);
    CHECK(r.layoutConversions == c.conversions);
    // The activations of the convolution chains, forward and backward: "N values channels-last".
    CHECK(std::stoi(remark.substr(remark.find(':') + 1)) >= c.minNhwcValues);
    std::filesystem::remove_all(o.compile.cacheDir);
  }
}

TEST_CASE("training: bf16 keeps the narrow copies, recomputing the casts back to f32") {
  // Under autocast a convolution's bf16 output is cast to f32 for its BatchNorm, which reads it
  // in the forward and the backward pass: the rematerialize pass keeps the bf16 value and casts
  // it again in the backward (a widening op is recomputed from its input), exactly, so the step
  // is bit for bit the one without the pass (one thread), in less memory than fp32's (resnet18
  // at batch 32: 756 -> 599 MB, fp32 660).
  const models::ModelOptions mo{.batch = 8, .seed = 3, .imageSize = 128};
  compiler::TrainOptions o;
  o.compile.cacheDir = tempCache();
  o.compile.runThreads = 1;
  o.compile.precision = compiler::Precision::kBf16;
  o.sgd.lr = 1e-4;
  auto kept = o;
  kept.compile.disabledPasses.insert("rematerialize");
  auto fp32 = o;
  fp32.compile.precision = compiler::Precision::kFp32;
  auto narrow = compiler::TrainingStep::create(zoo("resnet18", mo), o);
  auto wide = compiler::TrainingStep::create(zoo("resnet18", mo), kept);
  auto full = compiler::TrainingStep::create(zoo("resnet18", mo), fp32);
  REQUIRE(narrow.hasValue());
  REQUIRE(wide.hasValue());
  REQUIRE(full.hasValue());
  const int64_t a = (*narrow)->compiled()->report().arenaBytes,
                b = (*wide)->compiled()->report().arenaBytes,
                f = (*full)->compiled()->report().arenaBytes;
  INFO("bf16 arena " << a << " (without the pass " << b << "), fp32 " << f);
  CHECK(a < b * 9 / 10);
  CHECK(a < f);
  checkBitwiseSameSteps(**narrow, **wide, 500);
  std::filesystem::remove_all(o.compile.cacheDir);
}

TEST_CASE("training: --recompute gives the same step with less memory") {
  // resnet18's BatchNorm ReLUs recomputed in the backward pass from the convolution outputs
  // the BatchNorm gradients keep anyway: the same formulas on the same values, so bit for bit
  // the same losses and parameters after two steps (one thread: two compiled instances on more
  // may get different thread grants for their library calls, and so round differently); the
  // arena drops by about a third (660 -> 422 MB at batch 32, 224x224). Values of 1 MB and more
  // are recomputed: batch 8 at 128x128.
  const models::ModelOptions mo{.batch = 8, .seed = 3, .imageSize = 128};
  compiler::TrainOptions o;
  o.compile.cacheDir = tempCache();
  o.compile.runThreads = 1;
  o.sgd.lr = 1e-4;
  auto recomputeOptions = o;
  recomputeOptions.compile.recompute = true;
  auto kept = compiler::TrainingStep::create(zoo("resnet18", mo), o);
  auto recomputed = compiler::TrainingStep::create(zoo("resnet18", mo), recomputeOptions);
  REQUIRE(kept.hasValue());
  REQUIRE(recomputed.hasValue());
  const auto& rk = (*kept)->compiled()->report();
  const auto& rr = (*recomputed)->compiled()->report();
  INFO("arena " << rk.arenaBytes << " -> " << rr.arenaBytes);
  CHECK(rr.arenaBytes < rk.arenaBytes * 9 / 10);  // 92 -> 74 MB here.
  checkBitwiseSameSteps(**kept, **recomputed, 400);
  std::filesystem::remove_all(o.compile.cacheDir);
}
