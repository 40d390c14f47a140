// Op kernels (codegen/op_kernels.h): ops compiled for the emu device (or $KILN_TEST_DEVICE:
// scripts/gpu-check.sh runs the "emu:" tests on a GPU) as hand-written CUDA C run as one device
// kernel, nothing on the host, and give the reference kernels' results on inputs full of ties and
// NaNs (the choices a wrong scan order or tie rule would change).
#include <array>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "codegen/nvrtc_compiler.h"
#include "codegen/op_kernels.h"
#include "codegen/render.h"
#include "compiler/compile.h"
#include "compiler/eager_kernels.h"
#include "compiler/train.h"
#include "gpu_test_util.h"
#include "models/zoo.h"
#include "runtime/eager.h"
#include "runtime/gpu/emu_device.h"
#include "runtime/gpu/gpu_backend.h"
#include "runtime/reference/helpers.h"

using namespace kiln;
using runtime::Tensor;

namespace {

// Small integers (sums of a few are exact in f32, f16 and bf16, whatever their order), `nanRate`
// of them NaN.
Tensor smallIntegers(ir::Shape shape, int64_t range, double nanRate, std::mt19937& rng) {
  Tensor t = *Tensor::empty(ir::DType::kF32, std::move(shape));
  std::uniform_int_distribution<int64_t> value(-range, range);
  std::bernoulli_distribution nan(nanRate);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numElements(); ++i)
    p[i] = nan(rng) ? std::nanf("") : static_cast<float>(value(rng));
  return t;
}

// `g` on `ins`: the reference kernels' output (eager on the CPU) and the test device's (compiled
// without the kernel cache), which must run nothing on the host (on emu: no host function ran).
struct Outputs {
  Tensor device, reference;
  int opKernels = 0;       // Of the compile's kernels.
  size_t indexChecks = 0;  // The plan's index checks.
};
Outputs onDeviceAndReference(const ir::Graph& g, const std::vector<Tensor>& ins) {
  auto want = runtime::EagerExecutor(g).run(ins);
  INFO(want.status().message());
  REQUIRE(want.hasValue());
  const std::shared_ptr<runtime::Backend> device = testing::testDevice();
  compiler::CompileOptions o;
  o.backend = device;
  o.useCache = false;
  auto cm = compiler::compile(g, o);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  CHECK((*cm)->report().hostSteps == 0);
  Outputs out;
  for (const auto& k : (*cm)->report().kernels) out.opKernels += k.group == "op";
  out.indexChecks = (*cm)->plan().indexChecks.size();
  auto hostFunctions = [&]() -> int64_t {
    auto c = runtime::gpu::emuCounters(*runtime::gpu::gpuDevice(*device));
    return c ? c->hostFunctions : 0;
  };
  const int64_t before = hostFunctions();
  auto got = (*cm)->run(ins);
  INFO(got.status().message());
  REQUIRE(got.hasValue());
  CHECK(hostFunctions() == before);
  REQUIRE((*got)[0].shape() == (*want)[0].shape());
  out.device = (*got)[0];
  out.reference = (*want)[0];
  return out;
}

// max_pool2d_backward(grad, x) in `dtype` (f32 inputs cast to it, the result cast back), compiled
// for emu and run eagerly on the CPU's reference kernels: the same bits, NaNs in the same places.
// `given`: the f32 inputs (grad, x), else random ones from `seed`.
void checkMaxPoolBackward(ir::Shape xShape, ir::AttrMap attrs, ir::DType dtype, uint64_t seed,
                          std::vector<Tensor> given = {}) {
  const std::vector<ir::TensorType> xType = {ir::TensorType(ir::DType::kF32, xShape)};
  const auto fwd = ir::inferTypes(ir::OpKind::kMaxPool2d, xType, attrs);
  REQUIRE(fwd.hasValue());
  ir::Graph g("max_pool_backward");
  ir::Value* gradIn = *g.addInput("grad", ir::TensorType(ir::DType::kF32, (*fwd)[0].shape));
  ir::Value* xIn = *g.addInput("x", xType[0]);
  ir::Value *grad = gradIn, *x = xIn;
  const ir::AttrMap to = {{"to", std::string(ir::dtypeName(dtype))}};
  const ir::AttrMap back = {{"to", std::string("f32")}};
  if (dtype != ir::DType::kF32) {
    grad = (*g.addNode(ir::OpKind::kCast, {gradIn}, to))->output();
    x = (*g.addNode(ir::OpKind::kCast, {xIn}, to))->output();
  }
  auto pool = g.addNode(ir::OpKind::kMaxPool2dBackward, {grad, x}, attrs);
  INFO(pool.status().message());
  REQUIRE(pool.hasValue());
  ir::Value* out = (*pool)->output();
  if (dtype != ir::DType::kF32) out = (*g.addNode(ir::OpKind::kCast, {out}, back))->output();
  g.setOutputs({out});

  std::mt19937 rng(static_cast<uint32_t>(seed));
  // x: values in [-2, 2] (windows full of tied maxima) with some NaNs; grad: normal, so that
  // sums of several windows' gradients round by their order (and f16/bf16 by when they round).
  std::vector<Tensor> ins = std::move(given);
  if (ins.empty()) {
    Tensor grad = *Tensor::empty(ir::DType::kF32, (*fwd)[0].shape);
    std::normal_distribution<float> normal(0.f, 3.f);
    for (int64_t i = 0; i < grad.numElements(); ++i) grad.data<float>()[i] = normal(rng);
    ins = {grad, smallIntegers(xShape, 2, 0.04, rng)};
  }
  const Outputs r = onDeviceAndReference(g, ins);
  CHECK(r.opKernels == 1);
  const Tensor& a = r.device;
  const Tensor& b = r.reference;
  int64_t differ = 0, first = -1, nonzero = 0;
  for (int64_t i = 0; i < a.numElements(); ++i) {
    const double u = a.elementAsDouble(i), v = b.elementAsDouble(i);
    nonzero += v != 0;
    // The same value and sign (a -0 gradient stays -0 where the reference stores it).
    if ((u == v && std::signbit(u) == std::signbit(v)) || (std::isnan(u) && std::isnan(v)))
      continue;
    if (differ++ == 0) first = i;
  }
  INFO("first difference at " << first << " of " << a.numElements());
  CHECK(differ == 0);
  CHECK(nonzero > 0);  // Gradients reached the input: the comparison saw something.
}

// A random 2-D pooling and its input shape: windows of 1-3, strides of 1-3, dilations of 1-2,
// pads of at most half the window, ceil mode or not, an input the window fits.
std::pair<ir::Shape, ir::AttrMap> randomPooling(std::mt19937& rng) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  const std::vector<int64_t> k = {pick(1, 3), pick(1, 3)}, d = {pick(1, 2), pick(1, 2)};
  auto pad = [&](int i) { return pick(0, ((k[i] - 1) * d[i] + 1) / 2); };
  ir::AttrMap a = {{"kernel", k},
                   {"strides", std::vector<int64_t>{pick(1, 3), pick(1, 3)}},
                   {"pads", std::vector<int64_t>{pad(0), pad(1), pad(0), pad(1)}},
                   {"dilations", d},
                   {"ceil_mode", pick(0, 1)}};
  ir::Shape shape = {pick(1, 2), pick(1, 3), pick((k[0] - 1) * d[0] + 1, 10),
                     pick((k[1] - 1) * d[1] + 1, 10)};
  return {std::move(shape), std::move(a)};
}

Tensor f32Values(ir::Shape shape, std::vector<float> values) {
  Tensor t = *Tensor::empty(ir::DType::kF32, std::move(shape));
  REQUIRE(static_cast<int64_t>(values.size()) == t.numElements());
  std::copy(values.begin(), values.end(), t.data<float>());
  return t;
}

}  // namespace

TEST_CASE("emu: op kernel max_pool2d_backward sums in the reference's order and precision") {
  // Three windows choose element 1 of [0, 5, 0, 0] (1x3 windows, stride 1, padding 1 on each
  // side). The reference adds the windows inside the input first (1 and 2), then the padded one
  // (0); f16/bf16 in f32, rounded once.
  const ir::AttrMap attrs = {{"kernel", std::vector<int64_t>{1, 3}},
                             {"strides", std::vector<int64_t>{1, 1}},
                             {"pads", std::vector<int64_t>{0, 1, 0, 1}}};
  const Tensor x = f32Values({1, 1, 1, 4}, {0, 5, 0, 0});
  // f32: (1 + 1) + 2^24 is 2^24 + 2, (2^24 + 1) + 1 is 2^24.
  checkMaxPoolBackward({1, 1, 1, 4}, attrs, ir::DType::kF32, 0,
                       {f32Values({1, 1, 1, 4}, {16777216.f, 1.f, 1.f, 0.f}), x});
  // bf16: 1 + 2^-8 + 2^-8 rounded once is 1.0078125; rounded after each add, 1.
  checkMaxPoolBackward({1, 1, 1, 4}, attrs, ir::DType::kBF16, 0,
                       {f32Values({1, 1, 1, 4}, {1.f, 0x1p-8f, 0x1p-8f, 0.f}), x});
  // The 2x2 stride-2 path stores a window's gradient: -0 stays -0.
  checkMaxPoolBackward(
      {1, 1, 2, 4},
      {{"kernel", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}},
      ir::DType::kF32, 0,
      {f32Values({1, 1, 1, 2}, {-0.f, 3.f}), f32Values({1, 1, 2, 4}, {1, 0, 0, 0, 0, 2, 0, 0})});
}

TEST_CASE("emu: op kernel max_pool2d_backward gives the reference's bits") {
  // The common poolings: ResNet's stem (3x3, stride 2, pad 1), the 2x2 downsampling (odd sizes
  // leave a row and a column in no window), a stride-1 3x3 (windows overlapping three ways).
  const std::vector<std::pair<ir::Shape, ir::AttrMap>> fixed = {
      {{2, 3, 16, 16},
       {{"kernel", std::vector<int64_t>{3, 3}},
        {"strides", std::vector<int64_t>{2, 2}},
        {"pads", std::vector<int64_t>{1, 1, 1, 1}}}},
      {{1, 4, 9, 7},
       {{"kernel", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}}},
      {{1, 2, 8, 8},
       {{"kernel", std::vector<int64_t>{3, 3}},
        {"strides", std::vector<int64_t>{1, 1}},
        {"pads", std::vector<int64_t>{1, 1, 1, 1}}}},
  };
  uint64_t seed = 1;
  for (const auto& [shape, attrs] : fixed)
    for (ir::DType dt : {ir::DType::kF32, ir::DType::kF16, ir::DType::kBF16}) {
      INFO(ir::TensorType(ir::DType::kF32, shape).toString() << " " << ir::dtypeName(dt));
      checkMaxPoolBackward(shape, attrs, dt, seed++);
    }
  // Random windows, strides, pads (at most half the window), dilations and ceil mode.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 16; ++trial) {
    const auto [shape, a] = randomPooling(rng);
    INFO("trial " << trial << " " << ir::TensorType(ir::DType::kF32, shape).toString());
    checkMaxPoolBackward(shape, a, trial % 3 == 2 ? ir::DType::kBF16 : ir::DType::kF32,
                         100 + trial);
  }
}

TEST_CASE("emu: op kernels: the zoo's training steps run nothing on the host") {
  // Before op kernels resnet18's step ran its loss, the loss's gradient and the max-pooling
  // gradient on the host, their operands copied both ways (at batch 32: 100 MB each way a step
  // for the pooling gradient); mnist_cnn's its dropouts and their step counter too.
  const std::string name = GENERATE(as<std::string>{}, "resnet18", "mnist_cnn");
  // resnet18: max_pool2d_backward, cross_entropy_loss and its gradient; mnist_cnn: those, two
  // dropout_train, two dropout_backward and the counter's add.
  const int want = name == "resnet18" ? 3 : 8;
  INFO(name);
  compiler::TrainOptions t;
  t.compile.backend = testing::testDevice();
  auto model =
      models::buildModel(name, {.batch = 2, .seed = 1, .imageSize = name == "resnet18" ? 32 : 0});
  REQUIRE(model.hasValue());
  auto step = compiler::TrainingStep::create(std::move(model).value(), t);
  INFO(step.status().message());
  REQUIRE(step.hasValue());
  REQUIRE((*step)->compiled());
  const compiler::CompileReport& r = (*step)->compiled()->report();
  std::string remarks;
  for (const auto& m : r.remarks) remarks += m + "\n";
  INFO(remarks);
  CHECK(r.hostSteps == 0);
  int opKernels = 0;
  for (const auto& k : r.kernels) opKernels += k.group == "op";
  CHECK(opKernels == want);
  // The labels, read unchecked by the loss and its gradient, are checked on the host once a run.
  const auto& checks = (*step)->compiled()->plan().indexChecks;
  REQUIRE(checks.size() == 1);
  CHECK(checks[0].limit == (name == "resnet18" ? 1000 : 10));
}

namespace {

struct LossCase {
  ir::OpKind op;
  std::string reduction;
  ir::Shape x;  // [N, C, d..]
  ir::DType index;
};

// A loss (or its gradient) over random logits and targets in [0, C) with some ignored, compiled
// for the test device against the reference kernels run eagerly: within rounding (exp and log
// differ in the last bits; a mean's sum is a block reduction there, a loop here).
void checkLoss(const LossCase& c, uint64_t seed) {
  const bool backward =
      c.op == ir::OpKind::kNllLossBackward || c.op == ir::OpKind::kCrossEntropyLossBackward;
  ir::Shape tShape = c.x;
  tShape.erase(tShape.begin() + 1);
  const ir::AttrMap attrs = {{"reduction", c.reduction}, {"ignore_index", int64_t{-1}}};
  ir::Graph g("loss");
  std::vector<ir::Value*> ins;
  const ir::OpKind forward = c.op == ir::OpKind::kNllLossBackward ? ir::OpKind::kNllLoss
                             : c.op == ir::OpKind::kCrossEntropyLossBackward
                                 ? ir::OpKind::kCrossEntropyLoss
                                 : c.op;
  const std::vector<ir::TensorType> lossIn = {ir::TensorType(ir::DType::kF32, c.x),
                                              ir::TensorType(c.index, tShape)};
  const auto lossType = ir::inferTypes(forward, lossIn, attrs);
  REQUIRE(lossType.hasValue());
  if (backward) ins.push_back(*g.addInput("grad", (*lossType)[0]));
  ins.push_back(*g.addInput("x", lossIn[0]));
  ins.push_back(*g.addInput("target", lossIn[1]));
  auto node = g.addNode(c.op, ins, attrs);
  INFO(node.status().message());
  REQUIRE(node.hasValue());
  g.setOutputs({(*node)->output()});

  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.f, 2.f);
  std::vector<Tensor> xs;
  if (backward) {
    Tensor gr = *Tensor::empty(ir::DType::kF32, (*lossType)[0].shape);
    for (int64_t i = 0; i < gr.numElements(); ++i) gr.data<float>()[i] = 0.5f + normal(rng);
    xs.push_back(gr);
  }
  Tensor x = *Tensor::empty(ir::DType::kF32, c.x);
  for (int64_t i = 0; i < x.numElements(); ++i) x.data<float>()[i] = normal(rng);
  xs.push_back(x);
  Tensor t = *Tensor::empty(c.index, tShape);
  std::uniform_int_distribution<int64_t> cls(-1, c.x[1] - 1);  // -1: ignored.
  for (int64_t i = 0; i < t.numElements(); ++i) {
    const int64_t v = cls(rng);
    if (c.index == ir::DType::kI64)
      t.data<int64_t>()[i] = v;
    else
      t.data<int32_t>()[i] = static_cast<int32_t>(v);
  }
  xs.push_back(t);
  const Outputs r = onDeviceAndReference(g, xs);
  CHECK(r.indexChecks == 1);
  const Tensor& a = r.device;
  const Tensor& b = r.reference;
  double worst = 0, largest = 0;
  int64_t nonzero = 0;
  for (int64_t i = 0; i < b.numElements(); ++i) {
    const double u = a.elementAsDouble(i), v = b.elementAsDouble(i);
    REQUIRE(std::isfinite(v));
    worst = std::max(worst, std::isfinite(u) ? std::fabs(u - v) : INFINITY);
    largest = std::max(largest, std::fabs(v));
    nonzero += v != 0;
  }
  CHECK(nonzero > 0);
  CHECK(worst <= 1e-5 * std::max(1.0, largest));
}

}  // namespace

TEST_CASE("emu: op kernels: losses and their gradients match the reference kernels") {
  uint64_t seed = 40;
  for (ir::OpKind op : {ir::OpKind::kCrossEntropyLoss, ir::OpKind::kNllLoss,
                        ir::OpKind::kCrossEntropyLossBackward, ir::OpKind::kNllLossBackward})
    for (const char* red : {"mean", "sum", "none"})
      for (const ir::Shape& x : {ir::Shape{6, 10}, ir::Shape{3, 4, 5, 2}, ir::Shape{300, 7}}) {
        const LossCase c{op, red, x, seed % 2 ? ir::DType::kI32 : ir::DType::kI64};
        INFO(ir::opName(op) << " " << red << " " << ir::TensorType(ir::DType::kF32, x).toString()
                            << " " << ir::dtypeName(c.index));
        checkLoss(c, seed++);
      }
}

TEST_CASE("emu: op kernels: a target out of range is the reference's error, before any step") {
  // The loss's kernels read the labels unchecked: the plan checks its inputs on the host.
  const ir::AttrMap attrs = {{"reduction", std::string("mean")}, {"ignore_index", int64_t{-100}}};
  ir::Graph g("loss");
  ir::Value* x = *g.addInput("logits", ir::TensorType(ir::DType::kF32, {4, 5}));
  ir::Value* t = *g.addInput("labels", ir::TensorType(ir::DType::kI64, {4}));
  g.setOutputs({(*g.addNode(ir::OpKind::kCrossEntropyLoss, {x, t}, attrs))->output()});
  compiler::CompileOptions o;
  o.backend = testing::testDevice();
  auto cm = compiler::compile(g, o);
  REQUIRE(cm.hasValue());
  CHECK((*cm)->report().hostSteps == 0);
  Tensor xs = *Tensor::zeros(ir::DType::kF32, {4, 5});
  Tensor ts = *Tensor::zeros(ir::DType::kI64, {4});
  ts.data<int64_t>()[2] = 7;
  auto r = (*cm)->run(std::vector<Tensor>{xs, ts});
  REQUIRE_FALSE(r.hasValue());
  CHECK(r.status().isUserError());
  CHECK_THAT(r.status().message(), Catch::Contains("input 'labels'") &&
                                       Catch::Contains("target class 7 at flat position 2") &&
                                       Catch::Contains("out of range for 5 classes"));
  ts.data<int64_t>()[2] = -100;  // Ignored: fine.
  auto ok = (*cm)->run(std::vector<Tensor>{xs, ts});
  INFO(ok.status().message());
  REQUIRE(ok.hasValue());
  CHECK(std::fabs((*ok)[0].elementAsDouble(0) - std::log(5.0)) < 1e-6);

  // Eager runs on the device run no plan, so no host check: their losses are op calls, whose
  // kernel checks the targets (the loss's op kernel would give NaN).
  runtime::EagerExecutor eager(g, o.backend);
  REQUIRE(compiler::useDeviceKernels(eager, o.backend).isOk());
  ts.data<int64_t>()[2] = 7;
  auto er = eager.run(std::vector<Tensor>{xs, ts});
  REQUIRE_FALSE(er.hasValue());
  CHECK_THAT(er.status().message(), Catch::Contains("target class 7 at flat position 2"));
}

TEST_CASE("emu: op kernels: dropout draws the reference's masks") {
  // The mask of ir/dropout.h with the step read on the device: every bit as the reference's,
  // over ratios, seeds, offsets (a rank's place in the global batch) and steps.
  std::mt19937 rng(21);
  int trial = 0;
  for (ir::OpKind op : {ir::OpKind::kDropoutTrain, ir::OpKind::kDropoutBackward})
    for (double ratio : {0.1, 0.5, 0.9})
      for (int64_t step : {int64_t{0}, int64_t{1}, int64_t{12345}, int64_t{1} << 40}) {
        const ir::Shape shape = {3, 5, 7 + trial % 3};
        const ir::AttrMap attrs = {{"ratio", ratio},
                                   {"seed", static_cast<int64_t>(rng() % 1000)},
                                   {"offset", trial % 2 ? int64_t{0} : int64_t{105} * 3}};
        // f64 (the reference's other dtype) through a cast on the device.
        const bool f64 = trial % 3 == 1;
        INFO(ir::opName(op) << " ratio " << ratio << " step " << step << (f64 ? " f64" : ""));
        ir::Graph g("dropout");
        ir::Value* x = *g.addInput("x", ir::TensorType(ir::DType::kF32, shape));
        ir::Value* st = *g.addInput("step", ir::TensorType(ir::DType::kI64, {}));
        if (f64) x = (*g.addNode(ir::OpKind::kCast, {x}, {{"to", std::string("f64")}}))->output();
        g.setOutputs({(*g.addNode(op, {x, st}, attrs))->output()});
        const std::vector<Tensor> ins = {smallIntegers(shape, 9, 0.02, rng),
                                         *Tensor::zeros(ir::DType::kI64, {})};
        ins[1].data<int64_t>()[0] = step;
        const Outputs r = onDeviceAndReference(g, ins);
        int64_t differ = 0, kept = 0;
        for (int64_t i = 0; i < r.reference.numElements(); ++i) {
          const double u = r.device.elementAsDouble(i), v = r.reference.elementAsDouble(i);
          kept += v != 0;
          differ += !(u == v || (std::isnan(u) && std::isnan(v)));
        }
        CHECK(differ == 0);
        CHECK(kept > 0);
        ++trial;
      }
}

TEST_CASE("emu: op kernels: integer add, sub and mul wrap as the reference's") {
  for (ir::DType dt : {ir::DType::kI64, ir::DType::kI32})
    for (ir::OpKind op : {ir::OpKind::kAdd, ir::OpKind::kSub, ir::OpKind::kMul}) {
      INFO(ir::opName(op) << " " << ir::dtypeName(dt));
      ir::Graph g("integers");
      ir::Value* a = *g.addInput("a", ir::TensorType(dt, {5}));
      ir::Value* b = *g.addInput("b", ir::TensorType(dt, {}));
      ir::Value* ab = (*g.addNode(op, {a, b}))->output();
      g.setOutputs({(*g.addNode(op, {ab, a}))->output()});
      Tensor x = *Tensor::empty(dt, {5}), y = *Tensor::empty(dt, {});
      const int64_t values[] = {0, -7, 123456789, std::numeric_limits<int64_t>::max(),
                                std::numeric_limits<int64_t>::min()};
      for (int i = 0; i < 5; ++i) {
        if (dt == ir::DType::kI64)
          x.data<int64_t>()[i] = values[i];
        else
          x.data<int32_t>()[i] = static_cast<int32_t>(values[i] >> (i >= 3 ? 32 : 0));
      }
      if (dt == ir::DType::kI64)
        y.data<int64_t>()[0] = 3037000500;  // Squares past 2^63: the products wrap.
      else
        y.data<int32_t>()[0] = 46341;
      const Outputs r = onDeviceAndReference(g, {x, y});
      CHECK(std::memcmp(r.device.rawData(), r.reference.rawData(), r.reference.byteSize()) == 0);
    }
}

namespace {

// Random bits (NaN payloads and negative zeros among the floats: a gather moves them as they
// are), 0/1 for bool.
Tensor randomBits(ir::DType dt, const ir::Shape& shape, std::mt19937& rng) {
  Tensor t = *Tensor::empty(dt, shape);
  for (size_t i = 0; i < t.byteSize(); ++i)
    t.rawData()[i] = static_cast<std::byte>(dt == ir::DType::kBool ? rng() % 2 : rng() % 256);
  return t;
}

// Indices in [-dim, dim) (negatives count from the end).
Tensor randomPositions(ir::DType dt, const ir::Shape& shape, int64_t dim, std::mt19937& rng) {
  Tensor t = *Tensor::empty(dt, shape);
  std::uniform_int_distribution<int64_t> pick(-dim, dim - 1);
  for (int64_t i = 0; i < t.numElements(); ++i) {
    if (dt == ir::DType::kI64)
      t.data<int64_t>()[i] = pick(rng);
    else
      t.data<int32_t>()[i] = static_cast<int32_t>(pick(rng));
  }
  return t;
}

// `op` (gather or gather_elements) of data and indices, both graph inputs.
ir::Graph gatherGraph(ir::OpKind op, const ir::TensorType& data, const ir::TensorType& indices,
                      int64_t axis) {
  ir::Graph g("gather");
  ir::Value* d = *g.addInput("data", data);
  ir::Value* i = *g.addInput("ids", indices);
  auto n = g.addNode(op, {d, i}, {{"axis", axis}});
  INFO(n.status().message());
  REQUIRE(n.hasValue());
  g.setOutputs({(*n)->output()});
  return g;
}

}  // namespace

TEST_CASE("emu: op kernels: gather and gather_elements move the reference's bits") {
  std::mt19937 rng(5);
  const ir::Shape data = {6, 5, 4};
  int trial = 0;
  for (ir::OpKind op : {ir::OpKind::kGather, ir::OpKind::kGatherElements})
    for (ir::DType dt :
         {ir::DType::kF32, ir::DType::kF16, ir::DType::kI64, ir::DType::kBool, ir::DType::kU8})
      for (int64_t axis : {0, 1, 2, -1}) {
        const size_t a = static_cast<size_t>(axis < 0 ? axis + 3 : axis);
        const ir::DType index = trial++ % 2 ? ir::DType::kI32 : ir::DType::kI64;
        // gather: indices of any shape, a scalar among them; gather_elements: the data's rank,
        // other dims no larger than the data's, the axis's any size.
        ir::Shape ids = op == ir::OpKind::kGather ? (trial % 3 == 0 ? ir::Shape{} : ir::Shape{3, 7})
                                                  : ir::Shape{5, 3, 2};
        if (op == ir::OpKind::kGatherElements) ids[a] = 9;
        INFO(ir::opName(op) << " " << ir::dtypeName(dt) << " axis " << axis << " indices "
                            << ir::TensorType(index, ids).toString());
        const ir::Graph g = gatherGraph(op, {dt, data}, {index, ids}, axis);
        const Outputs r = onDeviceAndReference(
            g, {randomBits(dt, data, rng), randomPositions(index, ids, data[a], rng)});
        CHECK(r.opKernels == 1);
        CHECK(r.indexChecks == 1);
        CHECK(std::memcmp(r.device.rawData(), r.reference.rawData(), r.reference.byteSize()) == 0);
      }
}

TEST_CASE("emu: op kernels: concat moves the reference's bits") {
  // Axes first, middle and last; dtypes of each size; an input empty along the axis; the same
  // value twice; DenseNet's many inputs (its last dense block concatenates 33).
  std::mt19937 rng(9);
  struct Case {
    std::vector<int64_t> sizes;  // Along the axis, per input (-1: the previous input again).
    int64_t axis;
    ir::DType dtype;
  };
  std::vector<int64_t> many(33, 0);
  for (size_t i = 0; i < many.size(); ++i) many[i] = i == 0 ? 64 : 32;
  for (const Case& c : {Case{{2, 3, 1}, 0, ir::DType::kF32}, Case{{4, 0, 5}, 1, ir::DType::kF16},
                        Case{{3, -1, 2}, 2, ir::DType::kI64}, Case{{1, 1}, -1, ir::DType::kBool},
                        Case{{2, 7}, 1, ir::DType::kU8}, Case{many, 1, ir::DType::kF32}}) {
    INFO("inputs " << c.sizes.size() << " axis " << c.axis << " " << ir::dtypeName(c.dtype));
    ir::Graph g("concat");
    std::vector<ir::Value*> ins;
    std::vector<Tensor> values;
    const size_t a = static_cast<size_t>(c.axis < 0 ? c.axis + 3 : c.axis);
    for (int64_t size : c.sizes) {
      if (size < 0) {
        ins.push_back(ins.back());
        continue;
      }
      ir::Shape shape = c.sizes.size() > 8 ? ir::Shape{1, 0, 3} : ir::Shape{2, 3, 4};
      shape[a] = size;
      ins.push_back(*g.addInput(g.freshName(), ir::TensorType(c.dtype, shape)));
      values.push_back(randomBits(c.dtype, shape, rng));
      // f16 without NaNs: the CPU's library concat computes halves through f32 (a signaling
      // NaN comes back quiet, its payload lost), the op kernel moves bits.
      if (c.dtype == ir::DType::kF16)
        for (int64_t i = 0; i < values.back().numElements(); ++i)
          values.back().data<uint16_t>()[i] &= 0xBFFF;  // Exponent below all ones.
    }
    auto n = g.addNode(ir::OpKind::kConcat, ins, {{"axis", c.axis}});
    INFO(n.status().message());
    REQUIRE(n.hasValue());
    g.setOutputs({(*n)->output()});
    const Outputs r = onDeviceAndReference(g, values);
    CHECK(r.opKernels == 1);
    CHECK(std::memcmp(r.device.rawData(), r.reference.rawData(), r.reference.byteSize()) == 0);
  }
}

TEST_CASE("emu: op kernels: a gather's index out of range is the reference's error") {
  compiler::CompileOptions o;
  o.backend = testing::testDevice();
  const ir::Graph g =
      gatherGraph(ir::OpKind::kGather, {ir::DType::kF32, {5, 3}}, {ir::DType::kI64, {4}}, 0);
  auto cm = compiler::compile(g, o);
  INFO(cm.status().message());
  REQUIRE(cm.hasValue());
  CHECK((*cm)->report().hostSteps == 0);
  Tensor data = *Tensor::zeros(ir::DType::kF32, {5, 3});
  Tensor ids = *Tensor::zeros(ir::DType::kI64, {4});
  ids.data<int64_t>()[1] = 5;
  auto r = (*cm)->run(std::vector<Tensor>{data, ids});
  REQUIRE_FALSE(r.hasValue());
  CHECK(r.status().isUserError());
  // The reference kernel's words (runtime::ref::checkPositions), with the input's name.
  const std::string want =
      "gather: index 5 (at flat position 1) is out of range for dim 0 of size 5 in data "
      "f32[5,3] (valid: -5..4)";
  CHECK_THAT(r.status().message(), Catch::Contains("input 'ids'") && Catch::Contains(want));
  auto onHost = runtime::EagerExecutor(g).run(std::vector<Tensor>{data, ids});
  REQUIRE_FALSE(onHost.hasValue());
  CHECK_THAT(onHost.status().message(), Catch::Contains(want));
  // Eager on the device runs no plan, so no host check: its gather is an op call, whose kernel
  // checks the indices (the op kernel would write the filler).
  runtime::EagerExecutor eager(g, o.backend);
  REQUIRE(compiler::useDeviceKernels(eager, o.backend).isOk());
  auto onDevice = eager.run(std::vector<Tensor>{data, ids});
  REQUIRE_FALSE(onDevice.hasValue());
  CHECK_THAT(onDevice.status().message(), Catch::Contains(want));
  ids.data<int64_t>()[1] = -5;  // The first row, counted from the end.
  auto ok = (*cm)->run(std::vector<Tensor>{data, ids});
  INFO(ok.status().message());
  CHECK(ok.hasValue());

  // Constant indices are checked by the compiler: in range, the op kernel and no run-time
  // check; out of range, the host's kernel, which reports them at the run as it always did.
  for (const int64_t bad : {int64_t{2}, int64_t{7}}) {
    ir::Graph h("constant_ids");
    ir::Value* d = *h.addInput("data", ir::TensorType(ir::DType::kF32, {5, 3}));
    ir::TensorData c(ir::DType::kI64, {2});
    c.as<int64_t>()[1] = bad;
    ir::Value* k = *h.addParameter("rows", std::move(c), false);
    h.setOutputs({(*h.addNode(ir::OpKind::kGather, {d, k}, {{"axis", int64_t{0}}}))->output()});
    auto hm = compiler::compile(h, o);
    INFO(hm.status().message());
    REQUIRE(hm.hasValue());
    CHECK((*hm)->report().hostSteps == (bad < 5 ? 0 : 1));
    CHECK((*hm)->plan().indexChecks.empty());
    auto hr = (*hm)->run(std::vector<Tensor>{data});
    CHECK(hr.hasValue() == (bad < 5));
    if (!hr) CHECK_THAT(hr.status().message(), Catch::Contains("gather: index 7"));
  }
  // State (a step counter indexing a table, rewritten by the step) is no constant: the kernel
  // checks it on the device at every run.
  ir::Graph st("state_index");
  ir::Value* table = *st.addInput("table", ir::TensorType(ir::DType::kF32, {5, 3}));
  ir::Value* step = *st.addParameter("step", ir::TensorData(ir::DType::kI64, {}), false);
  REQUIRE(st.markState(step).isOk());
  st.setOutputs(
      {(*st.addNode(ir::OpKind::kGather, {table, step}, {{"axis", int64_t{0}}}))->output()});
  compiler::CompileOptions so = o;
  so.inference = false;
  auto sm = compiler::compile(st, so);
  INFO(sm.status().message());
  REQUIRE(sm.hasValue());
  CHECK((*sm)->report().hostSteps == 0);
  CHECK((*sm)->plan().deviceIndexChecks.size() == 1);
}

namespace {

// `g` compiled for the CPU (whose reference kernels check indices as they read them) and for the
// test device (whose op kernels check the indices the graph computes themselves).
struct TwoCompiles {
  std::shared_ptr<compiler::CompiledModel> cpu, device;
};
TwoCompiles compileTwice(const ir::Graph& g) {
  TwoCompiles c;
  compiler::CompileOptions o;
  o.useCache = false;
  auto cpu = compiler::compile(g, o);
  INFO(cpu.status().message());
  REQUIRE(cpu.hasValue());
  o.backend = testing::testDevice();
  auto dev = compiler::compile(g, o);
  INFO(dev.status().message());
  REQUIRE(dev.hasValue());
  c.cpu = std::move(*cpu);
  c.device = std::move(*dev);
  return c;
}

// Both runs of `ins`: the same bytes, or the same error.
void checkSameOutcome(const TwoCompiles& c, const std::vector<Tensor>& ins) {
  auto want = c.cpu->run(ins);
  auto got = c.device->run(ins);
  INFO("cpu: " << want.status().message());
  INFO("device: " << got.status().message());
  REQUIRE(want.hasValue() == got.hasValue());
  if (!want) {
    CHECK(got.status().isUserError());
    CHECK(got.status().message() == want.status().message());
    return;
  }
  REQUIRE(got->size() == want->size());
  for (size_t i = 0; i < want->size(); ++i) {
    REQUIRE((*got)[i].type() == (*want)[i].type());
    CHECK(std::memcmp((*got)[i].rawData(), (*want)[i].rawData(), (*want)[i].byteSize()) == 0);
  }
}

}  // namespace

TEST_CASE("emu: op kernels: indices the graph computes are checked on the device") {
  // ids + shift: the gathers' and the losses' kernels check such indices themselves and report
  // the lowest flat position out of range in the run's index word; the run then fails with the
  // reference kernel's error, word for word the CPU's, and discards its results.
  const ir::AttrMap lossAttrs = {{"reduction", std::string("mean")},
                                 {"ignore_index", int64_t{-100}}};
  struct Case {
    const char* name;
    ir::OpKind op;
    ir::DType index;
    ir::Shape ids;
  };
  for (const Case& c :
       {Case{"gather", ir::OpKind::kGather, ir::DType::kI64, {2, 3}},
        Case{"gather i32", ir::OpKind::kGather, ir::DType::kI32, {4}},
        Case{"gather_elements", ir::OpKind::kGatherElements, ir::DType::kI64, {2, 3}},
        Case{"cross_entropy_loss", ir::OpKind::kCrossEntropyLoss, ir::DType::kI64, {2}},
        Case{"nll_loss and its gradient", ir::OpKind::kNllLossBackward, ir::DType::kI32, {2}}}) {
    INFO(c.name);
    ir::Graph g("computed");
    ir::Value* data = *g.addInput("data", ir::TensorType(ir::DType::kF32, {2, 3}));
    ir::Value* ids = *g.addInput("ids", ir::TensorType(c.index, c.ids));
    ir::Value* shift = *g.addInput("shift", ir::TensorType(c.index, {}));
    ir::Value* at = (*g.addNode(ir::OpKind::kAdd, {ids, shift}))->output();
    std::vector<ir::Value*> outs;
    switch (c.op) {
      case ir::OpKind::kGather:
      case ir::OpKind::kGatherElements:
        outs.push_back((*g.addNode(c.op, {data, at}, {{"axis", int64_t{1}}}))->output());
        break;
      case ir::OpKind::kCrossEntropyLoss:
        outs.push_back((*g.addNode(c.op, {data, at}, lossAttrs))->output());
        break;
      default: {  // The loss and its gradient read the same targets: two words.
        ir::AttrMap none = lossAttrs;
        none["reduction"] = std::string("none");
        ir::Value* loss = (*g.addNode(ir::OpKind::kNllLoss, {data, at}, none))->output();
        outs.push_back(loss);
        outs.push_back((*g.addNode(c.op, {loss, data, at}, none))->output());
      }
    }
    g.setOutputs(outs);
    const TwoCompiles m = compileTwice(g);
    CHECK(m.device->report().hostSteps == 0);
    CHECK(m.device->plan().indexChecks.empty());
    CHECK(m.device->plan().deviceIndexChecks.size() == outs.size());

    std::mt19937 rng(3);
    Tensor x = smallIntegers({2, 3}, 9, 0.0, rng);
    Tensor id = *Tensor::zeros(c.index, c.ids);
    auto set = [&](Tensor& t, int64_t i, int64_t v) {
      if (t.dtype() == ir::DType::kI64)
        t.data<int64_t>()[i] = v;
      else
        t.data<int32_t>()[i] = static_cast<int32_t>(v);
    };
    for (int64_t i = 0; i < id.numElements(); ++i) set(id, i, i % 3);
    Tensor sh = *Tensor::zeros(c.index, {});
    auto run = [&](int64_t shift) {
      set(sh, 0, shift);
      INFO("shift " << shift);
      checkSameOutcome(m, {x, id, sh});
    };
    run(0);   // In range.
    run(-3);  // Gathers: negatives from the end; losses: out of range.
    run(1);   // The last index out of range, and later ones.
    run(5);   // Every index out of range: the first is reported.
    run(-7);
    run(0);  // A run after a bad one: its words were cleared.
    // The runs above replayed a captured graph (the words cleared inside it); the same without.
    CHECK(m.device->graphsCaptured() > 0);
    m.device->setGraphs(false);
    run(1);
    run(0);
    // int32's bounds themselves are exact, as the CPU says them; only values beyond are said
    // saturated.
    run(INT32_MAX);
    run(INT32_MIN);
    if (c.index != ir::DType::kI64) continue;
    set(sh, 0, int64_t{1} << 40);
    auto big = m.device->run(std::vector<Tensor>{x, id, sh});
    REQUIRE_FALSE(big.hasValue());
    CHECK_THAT(big.status().message(),
               Catch::Contains(" 2147483647 or more ") && Catch::Contains("at flat position 0"));
  }
}

TEST_CASE("index words: what a kernel reports decodes to its position and value") {
  using runtime::IndexWord;
  struct Case {
    int64_t position, value;
    IndexWord::Report want;
  };
  const int64_t maxPos = IndexWord::kMaxPosition;
  for (const Case& c : {Case{0, 5, {0, 5, false, false}}, Case{7, -1, {7, -1, false, false}},
                        Case{3, INT32_MAX, {3, INT32_MAX, false, false}},
                        Case{3, INT32_MIN, {3, INT32_MIN, false, false}},
                        Case{3, int64_t{1} << 40, {3, INT32_MAX, false, true}},
                        Case{3, -(int64_t{1} << 40), {3, INT32_MIN, false, true}},
                        Case{int64_t{1} << 40, 2, {maxPos, 2, true, false}}}) {
    INFO(c.position << " " << c.value);
    const uint64_t w = IndexWord::encode(c.position, c.value);
    CHECK(w != IndexWord::kClear);
    const IndexWord::Report r = IndexWord::decode(w);
    CHECK(r.position == c.want.position);
    CHECK(r.value == c.want.value);
    CHECK(r.positionSaturated == c.want.positionSaturated);
    CHECK(r.valueSaturated == c.want.valueSaturated);
  }
  // The lowest position wins an atomicMin, whatever the values.
  CHECK(IndexWord::encode(2, INT32_MAX) < IndexWord::encode(3, INT32_MIN));
  CHECK(IndexWord::encode(2, int64_t{1} << 40) < IndexWord::encode(3, 0));
}

TEST_CASE("emu: op kernels: device tensors are not checked: a bad index gives the filler") {
  // runOnDevice (Python's CUDA tensors) cannot read the indices before the run: the gathers'
  // kernels write all bits set (a NaN; -1 for signed integers), 0 for bool, for an index out of
  // range, and read nothing outside the data (on emu, a read outside a buffer fails the run).
  // data [5, 3] holds 1..15; indices [3, 3]: row 0 in range (4, or -1 for the last row), rows
  // 1 and 2 out of range (a huge one and one just below -5).
  const std::shared_ptr<runtime::Backend> backend = testing::testDevice();
  runtime::gpu::DeviceApi& dev = *runtime::gpu::gpuDevice(*backend);
  auto devPtr = [](const runtime::DeviceBuffer& b) {
    return reinterpret_cast<runtime::gpu::DevicePtr>(b.address().handle);
  };
  struct Case {
    ir::OpKind op;
    ir::DType data, index;
  };
  for (const Case& c : {Case{ir::OpKind::kGather, ir::DType::kF32, ir::DType::kI64},
                        Case{ir::OpKind::kGather, ir::DType::kI32, ir::DType::kI32},
                        Case{ir::OpKind::kGatherElements, ir::DType::kBool, ir::DType::kI32},
                        Case{ir::OpKind::kGatherElements, ir::DType::kF16, ir::DType::kI64}}) {
    INFO(ir::opName(c.op) << " " << ir::dtypeName(c.data) << " " << ir::dtypeName(c.index));
    compiler::CompileOptions o;
    o.backend = backend;
    o.useCache = false;
    const ir::Shape idShape = c.op == ir::OpKind::kGather ? ir::Shape{3} : ir::Shape{3, 3};
    auto cm = compiler::compile(gatherGraph(c.op, {c.data, {5, 3}}, {c.index, idShape}, 0), o);
    INFO(cm.status().message());
    REQUIRE(cm.hasValue());
    REQUIRE((*cm)->report().hostSteps == 0);
    Tensor data = *Tensor::empty(c.data, {5, 3});
    for (int64_t i = 0; i < 15; ++i) {
      const int64_t v = c.data == ir::DType::kBool ? 1 : i + 1;
      if (c.data == ir::DType::kF32) data.data<float>()[i] = static_cast<float>(v);
      if (c.data == ir::DType::kI32) data.data<int32_t>()[i] = static_cast<int32_t>(v);
      if (c.data == ir::DType::kBool) data.rawData()[i] = std::byte{1};
      if (c.data == ir::DType::kF16) data.data<uint16_t>()[i] = runtime::ref::doubleToF16Bits(v);
    }
    Tensor ids = *Tensor::zeros(c.index, idShape);
    const int64_t rows = c.op == ir::OpKind::kGather ? 1 : 3;  // Index elements per row.
    for (int64_t k = 0; k < 3 * rows; ++k) {
      const int64_t v = k < rows ? (k % 2 ? -1 : 4) : k < 2 * rows ? 1000000 : -6;
      if (c.index == ir::DType::kI64)
        ids.data<int64_t>()[k] = v;
      else
        ids.data<int32_t>()[k] = static_cast<int32_t>(v);
    }
    auto stream = dev.createStream();
    REQUIRE(stream.hasValue());
    std::vector<runtime::DeviceTensor> ins;
    std::vector<runtime::DeviceBuffer> keep;
    for (const Tensor* t : {&data, &ids}) {
      auto b = backend->allocate(t->byteSize());
      REQUIRE(b.hasValue());
      REQUIRE(dev.copyToDevice(devPtr(*b), t->rawData(), t->byteSize(), *stream).isOk());
      ins.push_back({b->address(), t->type()});
      keep.push_back(std::move(*b));
    }
    REQUIRE(dev.synchronize(*stream).isOk());
    auto outs = (*cm)->runOnDevice(ins);
    INFO(outs.status().message());
    REQUIRE(outs.hasValue());
    // The reference's row 0 (indices in range), then the filler's bytes.
    const ir::Shape firstShape = c.op == ir::OpKind::kGather ? ir::Shape{1} : ir::Shape{1, 3};
    Tensor first = *Tensor::empty(c.index, firstShape);
    std::memcpy(first.rawData(), ids.rawData(), first.byteSize());
    const ir::Graph firstRow = gatherGraph(c.op, {c.data, {5, 3}}, {c.index, firstShape}, 0);
    auto want = runtime::EagerExecutor(firstRow).run(std::vector<Tensor>{data, first});
    REQUIRE(want.hasValue());
    Tensor y = *Tensor::empty(c.data, {3, 3});
    REQUIRE(dev.copyToHost(y.rawData(), devPtr((*outs)[0]), y.byteSize(), *stream).isOk());
    REQUIRE(dev.synchronize(*stream).isOk());
    dev.destroyStream(*stream);
    const size_t row = y.byteSize() / 3;
    CHECK(std::memcmp(y.rawData(), (*want)[0].rawData(), row) == 0);
    const std::byte filler = c.data == ir::DType::kBool ? std::byte{0} : std::byte{0xFF};
    for (size_t i = row; i < y.byteSize(); ++i) CHECK(y.rawData()[i] == filler);
  }
}

namespace {

// Random values of dtype `dt` in `shape`, many of them the edges (0, +-1, the type's extremes),
// the rest small or anywhere in the type's range; floats (a cast's source) also NaN, +-inf,
// huge values and fractions next to the integer types' bounds.
Tensor edgyValues(ir::DType dt, const ir::Shape& shape, std::mt19937& rng) {
  Tensor t = *Tensor::empty(dt, shape);
  std::uniform_int_distribution<int> kind(0, 5);
  std::uniform_int_distribution<int64_t> small(-10, 10);
  std::uniform_int_distribution<uint64_t> any;
  static const double floats[] = {NAN,
                                  INFINITY,
                                  -INFINITY,
                                  1e20,
                                  -1e20,
                                  -0.7,
                                  2.5,
                                  -0.0,
                                  2147483647.5,
                                  -2147483648.5,
                                  127.9,
                                  -128.9,
                                  255.5,
                                  256.0,
                                  9.3e18,
                                  -9.3e18,
                                  9223372036854775807.0,
                                  -129.0,
                                  3e9,
                                  32767.5,
                                  -32768.5,
                                  65535.5,
                                  65536.0,
                                  4294967295.5,
                                  4294967296.0,
                                  18446744073709551615.0,
                                  1.9e19};
  for (int64_t i = 0; i < t.numElements(); ++i) {
    const int k = kind(rng);
    int64_t v = k == 0   ? 0
                : k == 1 ? 1
                : k == 2 ? -1
                : k == 3 ? small(rng)
                         : static_cast<int64_t>(any(rng));
    if (k == 5 && rng() % 2)
      v = rng() % 2 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
    const double f =
        k >= 4 ? floats[rng() % std::size(floats)] : static_cast<double>(small(rng)) / 3;
    switch (dt) {
      case ir::DType::kI64:
        t.data<int64_t>()[i] = v;
        break;
      case ir::DType::kI32:
        t.data<int32_t>()[i] = static_cast<int32_t>(k == 5 ? v >> 32 : v);
        break;
      case ir::DType::kI8:
        t.data<int8_t>()[i] = static_cast<int8_t>(k == 5 ? v >> 56 : v);
        break;
      case ir::DType::kU8:
        t.data<uint8_t>()[i] = static_cast<uint8_t>(k == 5 ? v >> 56 : v);
        break;
      case ir::DType::kI16:
        t.data<int16_t>()[i] = static_cast<int16_t>(k == 5 ? v >> 48 : v);
        break;
      case ir::DType::kU16:
        t.data<uint16_t>()[i] = static_cast<uint16_t>(k == 5 ? v >> 48 : v);
        break;
      case ir::DType::kU32:
        t.data<uint32_t>()[i] = static_cast<uint32_t>(k == 5 ? v >> 32 : v);
        break;
      case ir::DType::kU64:
        t.data<uint64_t>()[i] = static_cast<uint64_t>(v);
        break;
      case ir::DType::kBool:  // Any non-zero byte is true (the kernels test != 0).
        t.data<uint8_t>()[i] = std::array<uint8_t, 4>{0, 1, 2, 255}[rng() % 4];
        break;
      case ir::DType::kF32:
        t.data<float>()[i] = static_cast<float>(f);
        break;
      case ir::DType::kF64:
        t.data<double>()[i] = f;
        break;
      case ir::DType::kF16:
        t.data<uint16_t>()[i] = runtime::ref::doubleToF16Bits(f);
        break;
      case ir::DType::kBF16:
        t.data<uint16_t>()[i] = runtime::ref::doubleToBf16Bits(f);
        break;
      default:
        FAIL("no values for " << ir::dtypeName(dt));
    }
  }
  return t;
}

}  // namespace

TEST_CASE("emu: op kernels: integer and bool pointwise ops give the reference's bits") {
  // The ops the kernel IR leaves to the reference (it computes in floats), compiled for the
  // device as op kernels: the reference's bytes, operands broadcast either way.
  std::mt19937 rng(17);
  // Operand shapes by variant: the second broadcast; the first (and the third a scalar); the
  // first a scalar, the output with a size-1 dim.
  const std::vector<std::vector<ir::Shape>> shapes = {
      {{2, 3, 4}, {3, 1}, {2, 3, 4}}, {{3, 1}, {2, 3, 4}, {}}, {{}, {2, 1, 4}, {1, 4}}};
  auto check = [&](ir::OpKind op, std::vector<ir::DType> dts, ir::AttrMap attrs = {}) {
    for (size_t variant = 0; variant < shapes.size(); ++variant) {
      INFO(ir::opName(op) << " " << ir::dtypeName(dts.front()) << " -> "
                          << ir::dtypeName(dts.back()) << " shapes " << variant);
      ir::Graph g("integers");
      std::vector<ir::Value*> ins;
      std::vector<Tensor> values;
      for (size_t j = 0; j + 1 < dts.size(); ++j) {
        const ir::Shape& shape = shapes[variant][j];
        ins.push_back(*g.addInput(g.freshName(), ir::TensorType(dts[j], shape)));
        values.push_back(edgyValues(dts[j], shape, rng));
        if (op == ir::OpKind::kBitShift && j == 1)  // Counts in and out of [0, width).
          for (int64_t i = 0; i < values.back().numElements(); ++i) {
            const int64_t c = static_cast<int64_t>(rng() % 70) - 3;
            if (dts[j] == ir::DType::kI64) values.back().data<int64_t>()[i] = c;
            if (dts[j] == ir::DType::kI32)
              values.back().data<int32_t>()[i] = static_cast<int32_t>(c);
            if (dts[j] == ir::DType::kI8)
              values.back().data<int8_t>()[i] = static_cast<int8_t>(c % 12);
            if (dts[j] == ir::DType::kU8)
              values.back().data<uint8_t>()[i] = static_cast<uint8_t>(c % 12);
            if (dts[j] == ir::DType::kI16)
              values.back().data<int16_t>()[i] = static_cast<int16_t>(c % 20);
            if (dts[j] == ir::DType::kU16)
              values.back().data<uint16_t>()[i] = static_cast<uint16_t>(c % 20);
            if (dts[j] == ir::DType::kU32)
              values.back().data<uint32_t>()[i] = static_cast<uint32_t>(c % 36);
            if (dts[j] == ir::DType::kU64)
              values.back().data<uint64_t>()[i] = static_cast<uint64_t>(c);
          }
      }
      auto n = g.addNode(op, ins, attrs);
      INFO(n.status().message());
      REQUIRE(n.hasValue());
      REQUIRE((*n)->output()->type().dtype == dts.back());
      g.setOutputs({(*n)->output()});
      const Outputs r = onDeviceAndReference(g, values);
      CHECK(r.opKernels == 1);
      CHECK(std::memcmp(r.device.rawData(), r.reference.rawData(), r.reference.byteSize()) == 0);
    }
  };
  using ir::DType;
  using ir::OpKind;
  for (DType t : {DType::kI64, DType::kI32, DType::kI16, DType::kI8, DType::kU64, DType::kU32,
                  DType::kU16, DType::kU8}) {
    for (OpKind op : {OpKind::kEqual, OpKind::kLess, OpKind::kLessEqual, OpKind::kGreater,
                      OpKind::kGreaterEqual})
      check(op, {t, t, DType::kBool});
    for (OpKind op : {OpKind::kAdd, OpKind::kSub, OpKind::kMul, OpKind::kMinimum, OpKind::kMaximum,
                      OpKind::kBitwiseAnd, OpKind::kBitwiseOr, OpKind::kBitwiseXor})
      check(op, {t, t, t});
    for (const char* dir : {"LEFT", "RIGHT"})
      check(OpKind::kBitShift, {t, t, t}, {{"direction", std::string(dir)}});
    for (OpKind op : {OpKind::kNeg, OpKind::kAbs, OpKind::kBitwiseNot}) check(op, {t, t});
    check(OpKind::kWhere, {DType::kBool, t, t, t});
    for (DType from :
         {DType::kF32, DType::kF64, DType::kF16, DType::kBF16, DType::kI64, DType::kI32,
          DType::kI16, DType::kI8, DType::kU64, DType::kU16, DType::kU8, DType::kBool})
      if (from != t)  // A cast to its own dtype is no node after the passes.
        check(OpKind::kCast, {from, t}, {{"to", std::string(ir::dtypeName(t))}});
  }
  for (OpKind op : {OpKind::kLogicalAnd, OpKind::kLogicalOr, OpKind::kLogicalXor})
    check(op, {DType::kBool, DType::kBool, DType::kBool});
  check(OpKind::kLogicalNot, {DType::kBool, DType::kBool});
  check(OpKind::kWhere, {DType::kBool, DType::kBool, DType::kBool, DType::kBool});
  for (DType from : {DType::kF32, DType::kF16, DType::kI64, DType::kU8})
    check(OpKind::kCast, {from, DType::kBool}, {{"to", std::string("bool")}});
}

TEST_CASE("emu: op kernels: integer div and mod by a constant give the reference's bits") {
  // A constant divisor without zeros (edge values: -1 with the type's minimum, the extremes) is
  // an op kernel; one holding a zero, or a divisor the graph computes, stays on the host, whose
  // kernel reports the zero.
  std::mt19937 rng(29);
  for (ir::DType t : {ir::DType::kI64, ir::DType::kI32, ir::DType::kI16, ir::DType::kI8,
                      ir::DType::kU64, ir::DType::kU32, ir::DType::kU16, ir::DType::kU8})
    for (int variant = 0; variant < 3; ++variant) {
      const ir::OpKind op = variant == 0 ? ir::OpKind::kDiv : ir::OpKind::kMod;
      INFO(ir::opName(op) << " " << ir::dtypeName(t) << " variant " << variant);
      ir::Graph g("divide");
      ir::Value* a = *g.addInput("a", ir::TensorType(t, {2, 3, 4}));
      Tensor divisor = edgyValues(t, {3, 1}, rng);
      for (int64_t i = 0; i < 3; ++i)
        if (divisor.elementAsDouble(i) == 0)
          std::memset(divisor.rawData() + i * ir::dtypeSize(t), 0x7f, 1);
      ir::Value* b = *g.addParameter("b", divisor.toData(), false);
      ir::AttrMap attrs;
      if (op == ir::OpKind::kMod) attrs = {{"fmod", int64_t{variant == 2}}};
      g.setOutputs({(*g.addNode(op, {a, b}, attrs))->output()});
      const Outputs r = onDeviceAndReference(g, {edgyValues(t, {2, 3, 4}, rng)});
      CHECK(r.opKernels == 1);
      CHECK(std::memcmp(r.device.rawData(), r.reference.rawData(), r.reference.byteSize()) == 0);
    }
  // A constant holding a zero stays on the host, whose kernel reports it at the run; a divisor
  // that is an input is checked before the run, in the reference's words.
  compiler::CompileOptions o;
  o.backend = testing::testDevice();
  for (const bool constant : {true, false}) {
    ir::Graph g("zero");
    ir::Value* a = *g.addInput("a", ir::TensorType(ir::DType::kI32, {4}));
    ir::Value* b = constant ? *g.addParameter("b", ir::TensorData(ir::DType::kI32, {4}), false)
                            : *g.addInput("b", ir::TensorType(ir::DType::kI32, {4}));
    g.setOutputs({(*g.addNode(ir::OpKind::kDiv, {a, b}))->output()});
    auto cm = compiler::compile(g, o);
    INFO(cm.status().message());
    REQUIRE(cm.hasValue());
    CHECK((*cm)->report().hostSteps == (constant ? 1 : 0));
    std::vector<Tensor> ins = {*Tensor::zeros(ir::DType::kI32, {4})};
    if (!constant) {
      ins.push_back(*Tensor::zeros(ir::DType::kI32, {4}));
      for (int64_t i : {0, 1, 3}) ins.back().data<int32_t>()[i] = 2;
    }
    auto r = (*cm)->run(ins);
    REQUIRE_FALSE(r.hasValue());
    CHECK_THAT(r.status().message(), Catch::Contains("integer division by zero"));
    if (!constant)
      CHECK_THAT(r.status().message(),
                 Catch::Contains("input 'b': div: integer division by zero (divisor i32[4] is 0 "
                                 "at flat index 2)"));
  }
}

TEST_CASE("emu: op kernels: integer div and mod by a computed divisor check it on the device") {
  // divisor = b + shift, broadcast against a: the kernel reports the first zero (its flat index
  // in the divisor) in an index word, with the CPU's error; nonzero divisors give its bits.
  std::mt19937 rng(37);
  for (ir::DType t : {ir::DType::kI64, ir::DType::kI32, ir::DType::kI16, ir::DType::kI8,
                      ir::DType::kU64, ir::DType::kU32, ir::DType::kU16, ir::DType::kU8})
    for (const ir::OpKind op : {ir::OpKind::kDiv, ir::OpKind::kMod}) {
      INFO(ir::opName(op) << " " << ir::dtypeName(t));
      ir::Graph g("divide");
      ir::Value* a = *g.addInput("a", ir::TensorType(t, {2, 3, 4}));
      ir::Value* b = *g.addInput("b", ir::TensorType(t, {3, 1}));
      ir::Value* shift = *g.addInput("shift", ir::TensorType(t, {}));
      ir::Value* d = (*g.addNode(ir::OpKind::kAdd, {b, shift}))->output();
      ir::AttrMap attrs;
      if (op == ir::OpKind::kMod) attrs = {{"fmod", int64_t{0}}};
      g.setOutputs({(*g.addNode(op, {a, d}, attrs))->output()});
      const TwoCompiles m = compileTwice(g);
      CHECK(m.device->report().hostSteps == 0);
      CHECK(m.device->plan().deviceIndexChecks.size() == 1);
      Tensor as = edgyValues(t, {2, 3, 4}, rng);
      Tensor bs = *Tensor::empty(t, {3, 1});
      for (int64_t i = 0; i < 3; ++i)
        std::memset(bs.rawData() + i * ir::dtypeSize(t), 0, ir::dtypeSize(t));
      bs.rawData()[0] = std::byte{3};
      bs.rawData()[ir::dtypeSize(t)] = std::byte{1};
      bs.rawData()[2 * ir::dtypeSize(t)] = std::byte{5};  // 3, 1, 5.
      for (const int shift : {0, -1, -5, 2, 0}) {         // -1 zeroes index 1; -5 index 2.
        INFO("shift " << shift);
        Tensor st = *Tensor::zeros(t, {});
        const int64_t v = shift;
        std::memcpy(st.rawData(), &v, ir::dtypeSize(t));  // Little-endian: the low bytes.
        checkSameOutcome(m, {as, bs, st});
      }
    }
}

TEST_CASE("emu: op kernel max_pool2d_indices gives the reference's (PyTorch's) indices") {
  // Windows full of tied maxima, NaNs (two in a window: the last is chosen) and -inf (a window
  // of them: its first tap), over ResNet's stem pooling, the 2x2 downsampling and random
  // geometries with dilations and ceil mode; f16/bf16 and f64 inputs through casts.
  std::mt19937 rng(31);
  std::vector<std::pair<ir::Shape, ir::AttrMap>> cases = {
      {{2, 3, 16, 16},
       {{"kernel", std::vector<int64_t>{3, 3}},
        {"strides", std::vector<int64_t>{2, 2}},
        {"pads", std::vector<int64_t>{1, 1, 1, 1}}}},
      {{1, 4, 9, 7},
       {{"kernel", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}}},
      // Dilated windows wholly in the padding: PyTorch's start, past the input.
      {{1, 1, 2, 2},
       {{"kernel", std::vector<int64_t>{2, 2}},
        {"pads", std::vector<int64_t>{2, 2, 2, 2}},
        {"dilations", std::vector<int64_t>{4, 4}}}},
  };
  for (int trial = 0; trial < 12; ++trial) cases.push_back(randomPooling(rng));
  int trial = 0;
  for (const auto& [shape, attrs] : cases) {
    const ir::DType dt = std::array{ir::DType::kF32, ir::DType::kF64, ir::DType::kF16,
                                    ir::DType::kBF16}[static_cast<size_t>(trial++ % 4)];
    INFO("case " << trial << " " << ir::TensorType(ir::DType::kF32, shape).toString() << " "
                 << ir::dtypeName(dt));
    ir::Graph g("pool_indices");
    ir::Value* x = *g.addInput("x", ir::TensorType(ir::DType::kF32, shape));
    if (dt != ir::DType::kF32)
      x = (*g.addNode(ir::OpKind::kCast, {x}, {{"to", std::string(ir::dtypeName(dt))}}))->output();
    auto n = g.addNode(ir::OpKind::kMaxPool2dIndices, {x}, attrs);
    INFO(n.status().message());
    REQUIRE(n.hasValue());
    g.setOutputs({(*n)->output()});
    Tensor v = smallIntegers(shape, 1, 0.08, rng);
    for (int64_t i = 0; i < v.numElements(); ++i)
      if (rng() % 9 == 0) v.data<float>()[i] = -std::numeric_limits<float>::infinity();
    const Outputs r = onDeviceAndReference(g, {v});
    CHECK(r.opKernels >= 1);
    CHECK(std::memcmp(r.device.rawData(), r.reference.rawData(), r.reference.byteSize()) == 0);
  }
}

TEST_CASE("emu: op kernels: argmax and argmin pick the reference's index") {
  // Values full of ties (and NaNs among the floats), every axis, keepdims, first or last.
  std::mt19937 rng(23);
  const ir::Shape shape = {3, 7, 5};
  for (ir::OpKind op : {ir::OpKind::kArgMax, ir::OpKind::kArgMin})
    for (ir::DType dt : {ir::DType::kF32, ir::DType::kF64, ir::DType::kI64, ir::DType::kI32,
                         ir::DType::kI8, ir::DType::kU8})
      for (int64_t axis : {0, 1, -1})
        for (int64_t lastIndex : {0, 1}) {
          const int64_t keepdims = (axis + lastIndex + 2) % 2;
          INFO(ir::opName(op) << " " << ir::dtypeName(dt) << " axis " << axis << " last "
                              << lastIndex);
          ir::Graph g("arg");
          ir::Value* x = *g.addInput("x", ir::TensorType(dt, shape));
          auto n = g.addNode(
              op, {x}, {{"axis", axis}, {"keepdims", keepdims}, {"select_last_index", lastIndex}});
          INFO(n.status().message());
          REQUIRE(n.hasValue());
          g.setOutputs({(*n)->output()});
          Tensor v = *Tensor::empty(dt, shape);
          for (int64_t i = 0; i < v.numElements(); ++i) {
            // Ties among -2..2, and the extremes of i8.
            int64_t k = static_cast<int64_t>(rng() % 5) - 2;
            if (rng() % 8 == 0) k = rng() % 2 ? 127 : -128;
            const bool nan = ir::isFloat(dt) && rng() % 10 == 0;
            if (dt == ir::DType::kF32) v.data<float>()[i] = nan ? NAN : static_cast<float>(k);
            if (dt == ir::DType::kF64) v.data<double>()[i] = nan ? NAN : static_cast<double>(k);
            if (dt == ir::DType::kI64) v.data<int64_t>()[i] = k;
            if (dt == ir::DType::kI32) v.data<int32_t>()[i] = static_cast<int32_t>(k);
            if (dt == ir::DType::kI8) v.data<int8_t>()[i] = static_cast<int8_t>(k);
            if (dt == ir::DType::kU8) v.data<uint8_t>()[i] = static_cast<uint8_t>(k + 128);
          }
          const Outputs r = onDeviceAndReference(g, {v});
          CHECK(r.opKernels == 1);
          CHECK(std::memcmp(r.device.rawData(), r.reference.rawData(), r.reference.byteSize()) ==
                0);
        }
}

TEST_CASE("emu: op kernels: every variant compiles with NVRTC for sm_80 and sm_90") {
  // The emu device compiles CUDA C as C++; NVRTC is stricter (shuffles of 64-bit values, shared
  // arrays, hex floats): every op kernel variant in one module, without a GPU.
  if (!codegen::cudaCompilerAvailable()) {
    WARN("skipped: kiln was built without the CUDA toolkit (NVRTC)");
    return;
  }
  ir::Graph g("variants");
  std::vector<const ir::Node*> nodes;
  auto add = [&](ir::OpKind op, std::vector<ir::TensorType> types, ir::AttrMap attrs) {
    std::vector<ir::Value*> ins;
    for (const auto& t : types) ins.push_back(*g.addInput(g.freshName(), t));
    auto n = g.addNode(op, ins, std::move(attrs));
    INFO(n.status().message());
    REQUIRE(n.hasValue());
    nodes.push_back(*n);
  };
  const ir::AttrMap pool = {{"kernel", std::vector<int64_t>{3, 3}},
                            {"strides", std::vector<int64_t>{2, 2}},
                            {"pads", std::vector<int64_t>{1, 1, 1, 1}}};
  for (ir::DType dt : {ir::DType::kF32, ir::DType::kF16, ir::DType::kBF16})
    add(ir::OpKind::kMaxPool2dBackward, {{dt, {1, 2, 4, 4}}, {dt, {1, 2, 8, 8}}}, pool);
  for (ir::DType dt : {ir::DType::kF32, ir::DType::kF64, ir::DType::kF16, ir::DType::kBF16})
    add(ir::OpKind::kMaxPool2dIndices, {{dt, {1, 2, 8, 8}}}, pool);
  for (const char* red : {"none", "sum", "mean"})
    for (ir::DType index : {ir::DType::kI64, ir::DType::kI32}) {
      const ir::AttrMap a = {{"reduction", std::string(red)}, {"ignore_index", int64_t{-100}}};
      const ir::Shape lossShape = std::string(red) == "none" ? ir::Shape{4, 3} : ir::Shape{};
      for (ir::OpKind op : {ir::OpKind::kNllLoss, ir::OpKind::kCrossEntropyLoss})
        add(op, {{ir::DType::kF32, {4, 5, 3}}, {index, {4, 3}}}, a);
      for (ir::OpKind op : {ir::OpKind::kNllLossBackward, ir::OpKind::kCrossEntropyLossBackward})
        add(op, {{ir::DType::kF32, lossShape}, {ir::DType::kF32, {4, 5, 3}}, {index, {4, 3}}}, a);
    }
  for (ir::OpKind op : {ir::OpKind::kDropoutTrain, ir::OpKind::kDropoutBackward})
    for (ir::DType dt : {ir::DType::kF32, ir::DType::kF64})
      add(op, {{dt, {6}}, {ir::DType::kI64, {}}}, {{"ratio", 0.3}, {"seed", int64_t{5}}});
  for (ir::DType dt : {ir::DType::kI64, ir::DType::kI32})
    for (ir::OpKind op : {ir::OpKind::kAdd, ir::OpKind::kSub, ir::OpKind::kMul})
      add(op, {{dt, {6}}, {dt, {}}}, {});
  for (ir::DType dt : {ir::DType::kI64, ir::DType::kI32, ir::DType::kI16, ir::DType::kI8,
                       ir::DType::kU64, ir::DType::kU32, ir::DType::kU16, ir::DType::kU8}) {
    for (ir::OpKind op : {ir::OpKind::kLess, ir::OpKind::kBitwiseXor, ir::OpKind::kMaximum})
      add(op, {{dt, {2, 3}}, {dt, {3}}}, {});
    add(ir::OpKind::kAbs, {{dt, {4}}}, {});
    for (const char* dir : {"LEFT", "RIGHT"})
      add(ir::OpKind::kBitShift, {{dt, {2, 3}}, {dt, {1}}}, {{"direction", std::string(dir)}});
    add(ir::OpKind::kWhere, {{ir::DType::kBool, {2, 1}}, {dt, {2, 3}}, {dt, {3}}}, {});
    for (ir::DType from : {ir::DType::kF32, ir::DType::kF64, ir::DType::kBF16, ir::DType::kBool})
      add(ir::OpKind::kCast, {{from, {5}}}, {{"to", std::string(ir::dtypeName(dt))}});
  }
  add(ir::OpKind::kLogicalXor, {{ir::DType::kBool, {2, 3}}, {ir::DType::kBool, {3}}}, {});
  for (ir::DType dt : {ir::DType::kI64, ir::DType::kI32, ir::DType::kI16, ir::DType::kI8,
                       ir::DType::kU64, ir::DType::kU32, ir::DType::kU16, ir::DType::kU8}) {
    ir::TensorData three(dt, {3});  // A constant divisor: 3, 3, 3 (low bytes).
    for (int64_t e = 0; e < 3; ++e)
      three.data()[static_cast<size_t>(e) * ir::dtypeSize(dt)] = std::byte{3};
    ir::Value* d = *g.addParameter(g.freshName(), std::move(three), false);
    for (int64_t fmod : {-1, 0, 1}) {
      ir::Value* x = *g.addInput(g.freshName(), ir::TensorType(dt, {2, 3}));
      auto n = fmod < 0 ? g.addNode(ir::OpKind::kDiv, {x, d})
                        : g.addNode(ir::OpKind::kMod, {x, d}, {{"fmod", fmod}});
      REQUIRE(n.hasValue());
      nodes.push_back(*n);
    }
  }
  for (ir::DType dt :
       {ir::DType::kF32, ir::DType::kF64, ir::DType::kI64, ir::DType::kI8, ir::DType::kU8})
    for (ir::OpKind op : {ir::OpKind::kArgMax, ir::OpKind::kArgMin})
      add(op, {{dt, {4, 6}}}, {{"axis", int64_t{1}}, {"select_last_index", int64_t{1}}});
  add(ir::OpKind::kCast, {{ir::DType::kF16, {5}}}, {{"to", std::string("bool")}});
  for (ir::DType dt : {ir::DType::kF32, ir::DType::kF16, ir::DType::kF64, ir::DType::kBool})
    add(ir::OpKind::kConcat, {{dt, {2, 3}}, {dt, {2, 1}}, {dt, {2, 0}}}, {{"axis", int64_t{1}}});
  for (ir::DType dt : {ir::DType::kF32, ir::DType::kF16, ir::DType::kF64, ir::DType::kBool})
    for (ir::DType index : {ir::DType::kI64, ir::DType::kI32}) {
      add(ir::OpKind::kGather, {{dt, {4, 6}}, {index, {2, 3}}}, {{"axis", int64_t{1}}});
      add(ir::OpKind::kGatherElements, {{dt, {4, 6}}, {index, {4, 2}}}, {{"axis", int64_t{1}}});
    }
  for (const char* reduction : {"none", "add", "mul", "max", "min"})
    for (ir::DType dt : {ir::DType::kF32, ir::DType::kF64, ir::DType::kI64, ir::DType::kI8}) {
      const ir::AttrMap a = {{"reduction", std::string(reduction)}};
      const ir::DType index = dt == ir::DType::kI8 ? ir::DType::kI32 : ir::DType::kI64;
      add(ir::OpKind::kScatterNd, {{dt, {4, 6, 3}}, {index, {5, 2}}, {dt, {5, 3}}}, a);
      ir::AttrMap e = a;
      e["axis"] = int64_t{1};
      add(ir::OpKind::kScatterElements, {{dt, {4, 6}}, {index, {4, 2}}, {dt, {4, 2}}}, e);
    }
  for (ir::DType dt : {ir::DType::kF32, ir::DType::kF64, ir::DType::kI64, ir::DType::kU8})
    for (int64_t largest : {0, 1})
      add(ir::OpKind::kTopKIndices, {{dt, {4, 9, 2}}},
          {{"k", int64_t{3}}, {"axis", int64_t{1}}, {"largest", largest}});
  for (ir::DType dt : {ir::DType::kF32, ir::DType::kF64})
    for (ir::DType index : {ir::DType::kI64, ir::DType::kI32})
      add(ir::OpKind::kGatherBackward, {{dt, {4, 2, 3}}, {index, {2}}, {dt, {4, 6, 3}}},
          {{"axis", int64_t{1}}});
  for (ir::DType dt : {ir::DType::kF32, ir::DType::kF64, ir::DType::kF16, ir::DType::kBF16})
    for (int64_t fmod : {0, 1}) add(ir::OpKind::kMod, {{dt, {2, 3}}, {dt, {3}}}, {{"fmod", fmod}});
  for (auto [from, to] : {std::pair{ir::DType::kF64, ir::DType::kF16},
                          {ir::DType::kF64, ir::DType::kBF16},
                          {ir::DType::kU32, ir::DType::kF16},
                          {ir::DType::kU64, ir::DType::kBF16},
                          {ir::DType::kI16, ir::DType::kF32},
                          {ir::DType::kBool, ir::DType::kF64}})
    add(ir::OpKind::kCast, {{from, {5}}}, {{"to", std::string(ir::dtypeName(to))}});
  std::vector<codegen::Kernel> kernels;
  for (const ir::Node* n : nodes) {
    auto k = codegen::opKernel(*n, "k" + std::to_string(kernels.size()));
    INFO(n->describe() << ": " << k.status().message());
    REQUIRE(k.hasValue());
    const bool indices = !k->indexArgs.empty();
    auto keep = [&](codegen::Kernel kernel) {  // With the launches after it.
      std::vector<codegen::Kernel> then = std::move(kernel.then);
      kernel.then.clear();
      kernels.push_back(std::move(kernel));
      for (codegen::Kernel& t : then) kernels.push_back(std::move(t));
    };
    keep(std::move(*k));
    if (!indices) continue;
    // Checking the indices itself, as for indices the graph computes.
    k = codegen::opKernel(*n, "k" + std::to_string(kernels.size()), /*indexWord=*/true);
    REQUIRE(k.hasValue());
    CHECK(k->indexWord);
    keep(std::move(*k));
  }
  const std::string src = codegen::renderModule(kernels, codegen::Dialect::kCuda);
  for (int arch : {80, 90}) {
    auto ptx = codegen::compileCuda(src, "op_kernels.cu", arch);
    INFO("sm_" << arch << ": " << ptx.status().message());
    CHECK(ptx.hasValue());
  }
}

TEST_CASE("emu: op kernels: a training step that fails on the device updates nothing") {
  // logits = gather(table, rows), rows = cast(x[:, 0]): the step's gather (and its gradient)
  // check the computed rows on the device. A step with a row out of range fails with the CPU's
  // error, and its parameter writes (on the device, done by then) are dropped: the next steps
  // continue from the last good one, as on the CPU, whose kernel fails before the update. The
  // same for an integer division by a computed divisor, checked on the device as well: rows =
  // cast(x[:, 0]) / cast(x[:, 1]) in i16, a zero divisor. (The same path, the run's outcome after
  // its stream synchronized, drops the writes of a run whose op on the host failed.)
  for (const bool divide : {false, true}) {
    INFO((divide ? "a zero divisor" : "an index out of range"));
    auto model = [&] {
      ir::Graph g("embedding");
      ir::Value* x = *g.addInput("x", ir::TensorType(ir::DType::kF32, {4, 2}));
      ir::TensorData w(ir::DType::kF32, {5, 3});
      for (int64_t i = 0; i < 15; ++i) w.as<float>()[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
      ir::Value* table = *g.addParameter("table", std::move(w), true);
      auto column = [&](int64_t c, const char* type) {
        ir::Value* col = (*g.addNode(ir::OpKind::kSlice, {x},
                                     {{"starts", std::vector<int64_t>{c}},
                                      {"ends", std::vector<int64_t>{c + 1}},
                                      {"axes", std::vector<int64_t>{1}}}))
                             ->output();
        ir::Value* flat =
            (*g.addNode(ir::OpKind::kReshape, {col}, {{"shape", std::vector<int64_t>{4}}}))
                ->output();
        return (*g.addNode(ir::OpKind::kCast, {flat}, {{"to", std::string(type)}}))->output();
      };
      ir::Value* rows = column(0, "i64");
      if (divide) {
        ir::Value* q =
            (*g.addNode(ir::OpKind::kDiv, {column(0, "i16"), column(1, "i16")}))->output();
        rows = (*g.addNode(ir::OpKind::kCast, {q}, {{"to", std::string("i64")}}))->output();
      }
      g.setOutputs(
          {(*g.addNode(ir::OpKind::kGather, {table, rows}, {{"axis", int64_t{0}}}))->output()});
      return g;
    };
    compiler::TrainOptions cpuOptions;
    cpuOptions.sgd.lr = 0.5;
    compiler::TrainOptions devOptions = cpuOptions;
    devOptions.compile.backend = testing::testDevice();
    auto cpu = compiler::TrainingStep::create(model(), cpuOptions);
    INFO(cpu.status().message());
    REQUIRE(cpu.hasValue());
    auto dev = compiler::TrainingStep::create(model(), devOptions);
    INFO(dev.status().message());
    REQUIRE(dev.hasValue());
    REQUIRE((*dev)->compiled());
    // The gather and its gradient (gather_backward) read the rows: two words (and the divisor's).
    CHECK((*dev)->compiled()->plan().deviceIndexChecks.size() == (divide ? 3 : 2));
    CHECK((*dev)->compiled()->report().hostSteps == 0);
    Tensor x = *Tensor::zeros(ir::DType::kF32, {4, 2});
    Tensor t = *Tensor::zeros(ir::DType::kI64, {4});
    for (int64_t i = 0; i < 4; ++i) t.data<int64_t>()[i] = i % 3;
    for (int step = 0; step < 4; ++step) {
      INFO("step " << step);
      for (int64_t i = 0; i < 4; ++i) {
        x.data<float>()[2 * i] = static_cast<float>((i + step) % 5);
        x.data<float>()[2 * i + 1] = 1;
      }
      if (step == 2) x.data<float>()[divide ? 5 : 4] = divide ? 0 : 5;
      auto want = (**cpu)(x, t);
      auto got = (**dev)(x, t);
      INFO("cpu: " << want.status().message());
      INFO("device: " << got.status().message());
      REQUIRE(want.hasValue() == got.hasValue());
      if (!want) {
        CHECK(step == 2);
        CHECK(got.status().message() == want.status().message());
        CHECK_THAT(got.status().message(),
                   Catch::Contains(divide ? "division by zero" : "index 5 (at flat position 2)"));
        continue;
      }
      CHECK(std::fabs(got->loss - want->loss) <= 1e-6 * std::max(1.0, std::fabs(want->loss)));
    }
    CHECK((*dev)->stepsRun() == (*cpu)->stepsRun());
    const auto a = (*cpu)->state(), b = (*dev)->state();
    const ir::TensorData& wa = a.at("table");
    const ir::TensorData& wb = b.at("table");
    for (int64_t i = 0; i < 15; ++i)
      CHECK(std::fabs(wa.as<float>()[i] - wb.as<float>()[i]) <= 1e-6);
  }
}

TEST_CASE("emu: op kernels: gather_backward adds repeated indices in the reference's order") {
  // An embedding's gradient: each row's gradients added in index order, from 0, in the data's
  // type (three launches: a stable counting sort of the positions by row, then the sums). Gradients
  // of mixed magnitudes and many repeats, so that another order of the adds gives other bits
  // (checked: the test could fail), and negative indices; 5000 ids span many chunks of the sort.
  std::mt19937 rng(17);
  struct Case {
    ir::DType dtype, index;
    ir::Shape data, ids;
    int64_t axis;
  };
  for (const Case& c : {Case{ir::DType::kF32, ir::DType::kI64, {7, 5}, {40}, 0},
                        Case{ir::DType::kF32, ir::DType::kI32, {7, 3}, {4, 10}, 0},
                        Case{ir::DType::kF64, ir::DType::kI64, {2, 6, 3}, {25}, 1},
                        Case{ir::DType::kF32, ir::DType::kI64, {3, 9}, {300}, 1},
                        Case{ir::DType::kF32, ir::DType::kI64, {5, 4}, {5000}, 0},
                        Case{ir::DType::kF32, ir::DType::kI32, {1000, 2}, {3}, 0}}) {
    const ir::TensorType dataType(c.dtype, c.data);
    INFO(dataType.toString() << " ids " << ir::TensorType(c.index, c.ids).toString() << " axis "
                             << c.axis);
    ir::Shape gradShape;
    const size_t axis = static_cast<size_t>(c.axis);
    for (size_t d = 0; d < axis; ++d) gradShape.push_back(c.data[d]);
    for (int64_t d : c.ids) gradShape.push_back(d);
    for (size_t d = axis + 1; d < c.data.size(); ++d) gradShape.push_back(c.data[d]);
    ir::Graph g("gather_backward");
    ir::Value* grad = *g.addInput("grad", ir::TensorType(c.dtype, gradShape));
    ir::Value* ids = *g.addInput("ids", ir::TensorType(c.index, c.ids));
    ir::Value* data = *g.addInput("data", dataType);
    auto n = g.addNode(ir::OpKind::kGatherBackward, {grad, ids, data}, {{"axis", c.axis}});
    INFO(n.status().message());
    REQUIRE(n.hasValue());
    g.setOutputs({(*n)->output()});
    Tensor gt = *Tensor::empty(c.dtype, gradShape);
    std::uniform_real_distribution<double> unit(-1, 1);
    std::uniform_int_distribution<int> scale(-12, 12);
    for (int64_t i = 0; i < gt.numElements(); ++i) {
      const double v = unit(rng) * std::ldexp(1.0, scale(rng));
      if (c.dtype == ir::DType::kF32)
        gt.data<float>()[i] = static_cast<float>(v);
      else
        gt.data<double>()[i] = v;
    }
    const int64_t dim = c.data[axis];
    Tensor it = *Tensor::empty(c.index, c.ids);
    // Few distinct rows (many repeats), some counted from the end.
    std::uniform_int_distribution<int64_t> pick(-dim, std::min<int64_t>(dim, 4) - 1);
    for (int64_t i = 0; i < it.numElements(); ++i) {
      const int64_t v = pick(rng);
      if (c.index == ir::DType::kI64)
        it.data<int64_t>()[i] = v;
      else
        it.data<int32_t>()[i] = static_cast<int32_t>(v);
    }
    const Outputs r = onDeviceAndReference(g, {gt, it, *Tensor::zeros(c.dtype, c.data)});
    CHECK(r.opKernels == 3);  // combineByRows' launches.
    CHECK(std::memcmp(r.device.rawData(), r.reference.rawData(), r.reference.byteSize()) == 0);
    if (it.numElements() < 20) continue;
    // The adds in reverse order give other bits somewhere.
    Tensor reversedIds = *Tensor::empty(c.index, c.ids);
    Tensor reversedGrad = *Tensor::empty(c.dtype, gradShape);
    const int64_t count = it.numElements();
    int64_t inner = 1;
    for (size_t d = axis + 1; d < c.data.size(); ++d) inner *= c.data[d];
    const int64_t outerDims = gt.numElements() / (count * inner);
    const size_t es = ir::dtypeSize(c.dtype), is = ir::dtypeSize(c.index);
    for (int64_t j = 0; j < count; ++j) {
      std::memcpy(reversedIds.rawData() + j * is, it.rawData() + (count - 1 - j) * is, is);
      for (int64_t o = 0; o < outerDims; ++o)
        std::memcpy(reversedGrad.rawData() + ((o * count + j) * inner) * es,
                    gt.rawData() + ((o * count + count - 1 - j) * inner) * es, inner * es);
    }
    auto reversed = runtime::EagerExecutor(g).run(
        std::vector<Tensor>{reversedGrad, reversedIds, *Tensor::zeros(c.dtype, c.data)});
    REQUIRE(reversed.hasValue());
    CHECK(std::memcmp((*reversed)[0].rawData(), r.reference.rawData(), r.reference.byteSize()) !=
          0);
  }

  // Indices the graph computes: checked by its first launch, with the CPU's error.
  ir::Graph g("computed");
  ir::Value* grad = *g.addInput("grad", ir::TensorType(ir::DType::kF32, {6, 2}));
  ir::Value* ids = *g.addInput("ids", ir::TensorType(ir::DType::kI64, {6}));
  ir::Value* shift = *g.addInput("shift", ir::TensorType(ir::DType::kI64, {}));
  ir::Value* data = *g.addInput("data", ir::TensorType(ir::DType::kF32, {4, 2}));
  ir::Value* at = (*g.addNode(ir::OpKind::kAdd, {ids, shift}))->output();
  g.setOutputs({(*g.addNode(ir::OpKind::kGatherBackward, {grad, at, data}))->output()});
  const TwoCompiles m = compileTwice(g);
  CHECK(m.device->report().hostSteps == 0);
  CHECK(m.device->plan().deviceIndexChecks.size() == 1);
  Tensor gt = *Tensor::empty(ir::DType::kF32, {6, 2});
  for (int64_t i = 0; i < 12; ++i) gt.data<float>()[i] = 0.1f * static_cast<float>(i) - 0.35f;
  Tensor it = *Tensor::empty(ir::DType::kI64, {6});
  for (int64_t i = 0; i < 6; ++i) it.data<int64_t>()[i] = i % 3;
  Tensor dt = *Tensor::zeros(ir::DType::kF32, {4, 2});
  for (const int64_t sh : {0, 1, 2, -4, -5, 0}) {
    INFO("shift " << sh);
    Tensor st = *Tensor::zeros(ir::DType::kI64, {});
    st.data<int64_t>()[0] = sh;
    checkSameOutcome(m, {gt, it, st, dt});
  }
}

namespace {

// Random values of `dtype` (integers over their whole range, floats of mixed magnitudes).
Tensor mixedValues(ir::DType dtype, const ir::Shape& shape, std::mt19937& rng) {
  Tensor t = *Tensor::empty(dtype, shape);
  std::uniform_real_distribution<double> unit(-1, 1);
  std::uniform_int_distribution<int> scale(-12, 12);
  for (int64_t i = 0; i < t.numElements(); ++i) {
    const double v = unit(rng) * std::ldexp(1.0, scale(rng));
    const uint64_t bits = (uint64_t{rng()} << 32) | rng();
    switch (dtype) {
      case ir::DType::kF32:
        t.data<float>()[i] = static_cast<float>(v);
        break;
      case ir::DType::kF64:
        t.data<double>()[i] = v;
        break;
      default:
        std::memcpy(t.rawData() + i * ir::dtypeSize(dtype), &bits, ir::dtypeSize(dtype));
    }
  }
  return t;
}

Tensor indicesIn(ir::DType index, const ir::Shape& shape, int64_t lo, int64_t hi,
                 std::mt19937& rng) {
  Tensor t = *Tensor::empty(index, shape);
  std::uniform_int_distribution<int64_t> pick(lo, hi);
  for (int64_t i = 0; i < t.numElements(); ++i) {
    const int64_t v = pick(rng);
    if (index == ir::DType::kI64)
      t.data<int64_t>()[i] = v;
    else
      t.data<int32_t>()[i] = static_cast<int32_t>(v);
  }
  return t;
}

}  // namespace

TEST_CASE("emu: op kernels: scatters combine their updates in the reference's order") {
  // scatter_elements and scatter_nd with every reduction over dtypes, many repeated indices (the
  // last update wins without a reduction; float adds and products depend on the order) and
  // negative ones: the reference's bytes.
  std::mt19937 rng(29);
  int trial = 0;
  for (ir::OpKind op : {ir::OpKind::kScatterElements, ir::OpKind::kScatterNd})
    for (const char* reduction : {"none", "add", "mul", "max", "min"})
      for (ir::DType dt : {ir::DType::kF32, ir::DType::kF64, ir::DType::kI64, ir::DType::kI32,
                           ir::DType::kI8, ir::DType::kU8}) {
        const ir::DType index = trial++ % 2 ? ir::DType::kI32 : ir::DType::kI64;
        const ir::Shape data = {3, 4, 5};
        ir::Shape ids, updates;
        int64_t axis = 0, lo = 0, hi = 0;
        if (op == ir::OpKind::kScatterElements) {
          axis = trial % 3;
          ids = {3, 4, 5};
          ids[static_cast<size_t>(axis)] = 7;  // More updates than the dim: repeats.
          updates = ids;
          lo = -data[static_cast<size_t>(axis)];
          hi = data[static_cast<size_t>(axis)] - 1;
        } else {
          ids = {9, 2};  // Tuples of 2 into [3, 4], updates of slices [5].
          updates = {9, 5};
          lo = -3;
          hi = 2;  // Resolved against 3, then 4: in range for both.
        }
        INFO(ir::opName(op) << " " << reduction << " " << ir::dtypeName(dt) << " "
                            << ir::dtypeName(index) << " axis " << axis);
        ir::Graph g("scatter");
        ir::Value* d = *g.addInput("data", ir::TensorType(dt, data));
        ir::Value* i = *g.addInput("ids", ir::TensorType(index, ids));
        ir::Value* u = *g.addInput("updates", ir::TensorType(dt, updates));
        ir::AttrMap attrs = {{"reduction", std::string(reduction)}};
        if (op == ir::OpKind::kScatterElements) attrs["axis"] = axis;
        auto n = g.addNode(op, {d, i, u}, attrs);
        INFO(n.status().message());
        REQUIRE(n.hasValue());
        g.setOutputs({(*n)->output()});
        const Outputs r =
            onDeviceAndReference(g, {mixedValues(dt, data, rng), indicesIn(index, ids, lo, hi, rng),
                                     mixedValues(dt, updates, rng)});
        CHECK(r.opKernels == 3);
        CHECK(r.indexChecks == 1);
        CHECK(std::memcmp(r.device.rawData(), r.reference.rawData(), r.reference.byteSize()) == 0);
      }
}

TEST_CASE("emu: op kernels: a scatter's index out of range is the reference's error") {
  // The indices are resolved as the reference's kernels read them ("index 4 is out of range for
  // dim 1 of size 4", no position): checked before the run for an input, by the first launch
  // for computed ones, and by the compiler for constants.
  for (ir::OpKind op : {ir::OpKind::kScatterNd, ir::OpKind::kScatterElements}) {
    INFO(ir::opName(op));
    const bool nd = op == ir::OpKind::kScatterNd;
    ir::Graph g("scatter");
    ir::Value* d = *g.addInput("data", ir::TensorType(ir::DType::kF32, {3, 4}));
    ir::Value* i = *g.addInput("ids", ir::TensorType(ir::DType::kI64, {2, 2}));
    ir::Value* shift = *g.addInput("shift", ir::TensorType(ir::DType::kI64, {}));
    ir::Value* u = *g.addInput(
        "updates", ir::TensorType(ir::DType::kF32, nd ? ir::Shape{2} : ir::Shape{2, 2}));
    ir::Value* at = (*g.addNode(ir::OpKind::kAdd, {i, shift}))->output();
    ir::AttrMap attrs = {{"reduction", std::string("add")}};
    if (!nd) attrs["axis"] = int64_t{1};
    ir::Value* y = (*g.addNode(op, {d, at, u}, attrs))->output();
    ir::Value* direct = (*g.addNode(op, {d, i, u}, attrs))->output();
    g.setOutputs({y, direct});
    const TwoCompiles m = compileTwice(g);
    CHECK(m.device->report().hostSteps == 0);
    CHECK(m.device->plan().indexChecks.size() == 1);
    CHECK(m.device->plan().deviceIndexChecks.size() == 1);
    Tensor data = *Tensor::zeros(ir::DType::kF32, {3, 4});
    Tensor ids = *Tensor::zeros(ir::DType::kI64, {2, 2});
    const int64_t v[] = {0, 1, 2, 3};
    std::memcpy(ids.rawData(), v, sizeof(v));
    Tensor upd = *Tensor::empty(ir::DType::kF32, nd ? ir::Shape{2} : ir::Shape{2, 2});
    for (int64_t e = 0; e < upd.numElements(); ++e)
      upd.data<float>()[e] = static_cast<float>(e) + 0.5f;
    for (const int64_t sh : {0, 1, -3, -5, 2, 0}) {
      INFO("shift " << sh);
      Tensor st = *Tensor::zeros(ir::DType::kI64, {});
      st.data<int64_t>()[0] = sh;
      checkSameOutcome(m, {data, ids, st, upd});
    }
    // The input itself out of range: the plan's check, before the run, in the reference's words.
    ids.data<int64_t>()[3] = nd ? 4 : -5;
    Tensor st = *Tensor::zeros(ir::DType::kI64, {});
    auto r = m.device->run(std::vector<Tensor>{data, ids, st, upd});
    REQUIRE_FALSE(r.hasValue());
    CHECK(r.status().isUserError());
    CHECK_THAT(r.status().message(),
               Catch::Contains("input 'ids': " + std::string(ir::opName(op)) + ": index " +
                               (nd ? "4 is out of range for dim 1 of size 4"
                                   : "-5 is out of range for dim 1 of size 4")));
  }
}

TEST_CASE("emu: op kernels: topk_indices picks the reference's order") {
  // Rows full of ties and NaNs (NaN the largest: first when largest, last when smallest; ties by
  // index), over axes, k up to the whole row, largest and smallest, dtypes.
  std::mt19937 rng(31);
  int trial = 0;
  for (ir::DType dt : {ir::DType::kF32, ir::DType::kF64, ir::DType::kI64, ir::DType::kI32,
                       ir::DType::kI8, ir::DType::kU8})
    for (const ir::Shape& shape : {ir::Shape{3, 17}, ir::Shape{2, 300, 3}, ir::Shape{600}})
      for (int64_t largest : {1, 0}) {
        const int64_t axis = shape.size() == 3 ? 1 : static_cast<int64_t>(shape.size()) - 1;
        const int64_t dim = shape[static_cast<size_t>(axis)];
        const int64_t k = trial++ % 3 == 0 ? dim : std::min<int64_t>(dim, 1 + trial % 9);
        INFO(ir::dtypeName(dt) << " " << ir::TensorType(dt, shape).toString() << " k " << k
                               << " largest " << largest);
        ir::Graph g("topk");
        ir::Value* x = *g.addInput("x", ir::TensorType(dt, shape));
        auto n = g.addNode(ir::OpKind::kTopKIndices, {x},
                           {{"k", k}, {"axis", axis}, {"largest", largest}});
        INFO(n.status().message());
        REQUIRE(n.hasValue());
        g.setOutputs({(*n)->output()});
        // Few distinct values (ties everywhere), a tenth NaN for floats.
        Tensor xs =
            smallIntegers(shape, 3, dt == ir::DType::kF32 || dt == ir::DType::kF64 ? 0.1 : 0, rng);
        auto cast = runtime::runReferenceOp(ir::OpKind::kCast, {xs},
                                            {{"to", std::string(ir::dtypeName(dt))}});
        REQUIRE(cast.hasValue());
        const Outputs r = onDeviceAndReference(g, {(*cast)[0]});
        CHECK(r.opKernels == 1);
        CHECK(std::memcmp(r.device.rawData(), r.reference.rawData(), r.reference.byteSize()) == 0);
      }
}

TEST_CASE("emu: op kernels: float mod gives the reference's values") {
  // C's fmod (fmod=1) and the divisor's sign (fmod=0: ONNX Mod, Python's %), over edge values
  // (signed zeros, infinities, NaN, divisors of 0) and mixed magnitudes, broadcast: the
  // reference's bits, any NaN for a NaN (a GPU's NaN need not carry the host's payload). f16
  // and bf16 compute in f32, rounded once, as the host runs the reference.
  std::mt19937 rng(41);
  for (ir::DType t : {ir::DType::kF32, ir::DType::kF64, ir::DType::kF16, ir::DType::kBF16})
    for (int64_t fmod : {0, 1}) {
      INFO(ir::dtypeName(t) << " fmod " << fmod);
      ir::Graph g("mod");
      ir::Value* a = *g.addInput("a", ir::TensorType(t, {6, 40}));
      ir::Value* b = *g.addInput("b", ir::TensorType(t, {40}));
      g.setOutputs({(*g.addNode(ir::OpKind::kMod, {a, b}, {{"fmod", fmod}}))->output()});
      Tensor as = edgyValues(t, {6, 40}, rng), bs = edgyValues(t, {40}, rng);
      const Tensor mixed = mixedValues(t, {6, 40}, rng);
      std::memcpy(as.rawData(), mixed.rawData(), mixed.byteSize() / 2);  // Half the rows.
      const size_t size = ir::dtypeSize(t);
      std::memset(bs.rawData(), 0, 2 * size);  // Divisors 0 and -0: the sign bit's byte.
      bs.rawData()[2 * size - 1] = std::byte{0x80};
      const Outputs r = onDeviceAndReference(g, {as, bs});
      CHECK(r.opKernels == 1);
      int64_t nans = 0;
      for (int64_t i = 0; i < r.reference.numElements(); ++i) {
        const double want = r.reference.elementAsDouble(i), got = r.device.elementAsDouble(i);
        INFO("element " << i << ": " << as.elementAsDouble(i) << " mod "
                        << bs.elementAsDouble(i % 40) << " = " << want << ", got " << got);
        if (std::isnan(want)) {
          CHECK(std::isnan(got));
          ++nans;
          continue;
        }
        CHECK(std::memcmp(r.device.rawData() + i * size, r.reference.rawData() + i * size, size) ==
              0);
      }
      CHECK(nans > 0);
    }
}

TEST_CASE("emu: op kernels: casts to floats give the reference's bits") {
  // Every integer dtype and bool to f32, f64, f16 and bf16 (the op kernel's, or the kernel IR's
  // for its own dtypes), and f64 to f16 and bf16 rounded once from the double: values just past
  // a tie of the narrow type, which rounding through f32 to nearest would round the other way
  // (checked: the test could fail), overflow and subnormal edges, NaN of either sign.
  std::mt19937 rng(43);
  using ir::DType;
  auto run = [&](DType from, DType to, const Tensor& values) {
    INFO(ir::dtypeName(from) << " -> " << ir::dtypeName(to));
    ir::Graph g("cast");
    ir::Value* x = *g.addInput("x", ir::TensorType(from, values.shape()));
    g.setOutputs(
        {(*g.addNode(ir::OpKind::kCast, {x}, {{"to", std::string(ir::dtypeName(to))}}))->output()});
    const Outputs r = onDeviceAndReference(g, {values});
    CHECK(std::memcmp(r.device.rawData(), r.reference.rawData(), r.reference.byteSize()) == 0);
  };
  for (DType from : {DType::kI64, DType::kI32, DType::kI16, DType::kI8, DType::kU64, DType::kU32,
                     DType::kU16, DType::kU8, DType::kBool})
    for (DType to : {DType::kF32, DType::kF64, DType::kF16, DType::kBF16})
      if (!(from == DType::kI64 && to == DType::kBF16)) run(from, to, edgyValues(from, {40}, rng));
  std::vector<double> doubles = {1 + 0x1p-11 + 0x1p-40,
                                 1 + 0x1p-11,
                                 1 + 0x1p-8 + 0x1p-40,
                                 1 + 0x1p-8,
                                 3 + 0x1p-9 + 0x1p-45,
                                 65504,
                                 65519.99999,
                                 65520,
                                 0x1p-25 + 0x1p-60,
                                 0x1p-25,
                                 0x1.8p-24 + 0x1p-70,
                                 1e300,
                                 3.3961e38,
                                 3.3963e38,
                                 0x1p-140 + 0x1p-170,
                                 NAN,
                                 -NAN,
                                 INFINITY,
                                 0x1p-1074};
  for (size_t i = 0, n = doubles.size(); i < n; ++i) doubles.push_back(-doubles[i]);
  Tensor t = *Tensor::empty(DType::kF64, {static_cast<int64_t>(doubles.size())});
  std::memcpy(t.rawData(), doubles.data(), t.byteSize());
  for (DType to : {DType::kF16, DType::kBF16}) {
    run(DType::kF64, to, t);
    run(DType::kF64, to, edgyValues(DType::kF64, {40}, rng));
  }
}
