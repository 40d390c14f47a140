// Data-parallel training over MPI, run by ctest under `mpirun -np 2` (tests/CMakeLists.txt):
//   ddp_check equivalence  10 steps on 2 ranks with batch B each give the parameters and optimizer
//                          state of one process with batch 2B (after the first step within 1e-5
//                          of each tensor's largest value, after 10 within 1e-2 in L2 per
//                          tensor: equivalence()): mnist_cnn with dropout on (masks keyed by the
//                          global sample index), SGD with Nesterov momentum and AdamW, compiled
//                          with small buckets (started during the backward) and eager; on the
//                          emu device with host buckets and with device buckets.
//   ddp_check batchnorm    a ResNet-18 (BatchNorm: each rank normalizes its own shard) keeps
//                          every rank's whole state identical, running statistics included.
//   ddp_check failure      a step that fails on rank 1 alone (an input of the wrong shape, a
//                          label out of range, both before any all-reduce; an embedding row out
//                          of range, found on the emu device after its bucket started; compiled
//                          and eager) fails on both
//                          ranks, changes no rank's state by a bit (dropout's step count
//                          included), and the next step equals one process's that never saw it.
//   ddp_check abort        rank 1 fails while rank 0 waits in an all-reduce: both stop, with
//                          rank 1's message.
// Prints one line per check; exit 0 when all pass.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>

#include "compiler/train.h"
#include "models/zoo.h"
#include "runtime/gpu/gpu_backend.h"
#include "runtime/mpi/mpi_collectives.h"

using namespace kiln;

namespace {

int failures = 0;
// The state after 10 steps, in L2 per tensor (equivalence(); measured: up to 4.6e-4 on emu,
// where near-tied max-pooling windows flipped).
constexpr double kL2Tolerance = 1e-2;

void check(bool ok, const std::string& what, int rank) {
  if (rank == 0) std::printf("%s: %s\n", ok ? "ok" : "FAILED", what.c_str());
  if (!ok) ++failures;
}

template <class T>
T orDie(Expected<T> e, const char* what) {
  if (!e) {
    std::fprintf(stderr, "%s: %s\n", what, e.status().message().c_str());
    std::exit(1);
  }
  return std::move(*e);
}

// Batch `step` of a seeded dataset: `n` samples of `shape` (without the batch dim) and labels.
std::pair<runtime::Tensor, runtime::Tensor> globalBatch(ir::Shape shape, int64_t n, int step,
                                                        int64_t classes = 10) {
  std::mt19937 rng(1234 + step);
  std::normal_distribution<float> x;
  std::uniform_int_distribution<int64_t> label(0, classes - 1);
  shape.insert(shape.begin(), n);
  ir::TensorData xs(ir::DType::kF32, shape), ys(ir::DType::kI64, {n});
  for (int64_t i = 0; i < xs.numElements(); ++i) xs.as<float>()[i] = x(rng);
  for (int64_t i = 0; i < n; ++i) ys.as<int64_t>()[i] = label(rng);
  return {runtime::Tensor::fromData(xs), runtime::Tensor::fromData(ys)};
}

// Rows [first, first + n) of a batch.
runtime::Tensor rows(const runtime::Tensor& t, int64_t first, int64_t n) {
  ir::Shape shape = t.shape();
  const size_t row = t.byteSize() / static_cast<size_t>(shape[0]);
  shape[0] = n;
  ir::TensorData part(t.dtype(), shape);
  std::memcpy(part.data(), t.rawData() + static_cast<size_t>(first) * row, part.byteSize());
  return runtime::Tensor::fromData(part);
}

// logits = gather(table, cast(x[:, 0])) over 3 classes: on a GPU (and the emu device) the step's
// gather and its gradient check the rows the graph computes on the device, so a row out of range
// is reported after the run, once its buckets have started.
ir::Graph embedding(int64_t batch) {
  ir::Graph g("embedding");
  ir::Value* x = *g.addInput("x", ir::TensorType(ir::DType::kF32, {batch, 2}));
  ir::TensorData w(ir::DType::kF32, {5, 3});
  for (int64_t i = 0; i < 15; ++i) w.as<float>()[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  ir::Value* table = *g.addParameter("table", std::move(w), true);
  ir::Value* col = (*g.addNode(ir::OpKind::kSlice, {x},
                               {{"starts", std::vector<int64_t>{0}},
                                {"ends", std::vector<int64_t>{1}},
                                {"axes", std::vector<int64_t>{1}}}))
                       ->output();
  ir::Value* flat =
      (*g.addNode(ir::OpKind::kReshape, {col}, {{"shape", std::vector<int64_t>{batch}}}))->output();
  ir::Value* rows = (*g.addNode(ir::OpKind::kCast, {flat}, {{"to", std::string("i64")}}))->output();
  g.setOutputs(
      {(*g.addNode(ir::OpKind::kGather, {table, rows}, {{"axis", int64_t{0}}}))->output()});
  return g;
}

std::unique_ptr<compiler::TrainingStep> makeStep(const std::string& model, int64_t batch,
                                                 int64_t imageSize, compiler::TrainOptions o) {
  models::ModelOptions mo;
  mo.batch = batch;
  mo.seed = 7;
  mo.imageSize = imageSize;
  auto g = model == "embedding" ? embedding(batch)
                                : orDie(models::buildModel(model, mo), "building the model");
  return orDie(compiler::TrainingStep::create(std::move(g), o), "creating the step");
}

// The largest difference over the largest value (or, `l2`, the difference's L2 norm over the
// tensor's), per tensor; the worst over the state (parameters and optimizer state: momenta,
// Adam's moments).
double worstDifference(const compiler::TrainingStep& a, const compiler::TrainingStep& b,
                       std::string& worstName, bool l2 = false) {
  double worst = 0;
  const auto sb = b.state();
  int compared = 0;
  for (const auto& [name, t] : a.state()) {
    // Constants have fresh (numeric) names, which differ between the two steps' graphs.
    if (name.find_first_not_of("0123456789") == std::string::npos) continue;
    auto it = sb.find(name);
    if (it == sb.end() || it->second.byteSize() != t.byteSize()) {
      worstName = name + " (missing)";
      return INFINITY;
    }
    ++compared;
    if (t.dtype() != ir::DType::kF32) continue;
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < t.numElements(); ++i) {
      const double d = std::abs(double(t.as<float>()[i]) - it->second.as<float>()[i]);
      const double v = std::abs(double(it->second.as<float>()[i]));
      if (std::isnan(d))
        diff = INFINITY;  // A NaN on one side is a difference.
      else
        diff = l2 ? diff + d * d : std::max(diff, d);
      scale = l2 ? scale + v * v : std::max(scale, v);
    }
    if (l2) diff = std::sqrt(diff), scale = std::sqrt(scale);
    const double rel = scale > 0 ? diff / scale : diff;
    if (rel > worst) {
      worst = rel;
      worstName = name;
    }
  }
  // The weights and their optimizer state at least.
  if (compared == 0 || compared < 2 * static_cast<int>(a.graph().parameters().size()) / 3)
    return INFINITY;
  return worst;
}

// `tol`: the parameters' tolerance (relative to each tensor's largest value).
// `deviceSum`: the step's device collectives (TrainOptions::deviceCollectives), when given.
void equivalence(const std::shared_ptr<runtime::Collectives>& comm, const std::string& label,
                 compiler::TrainOptions o, int64_t bucketBytes, double tol = 1e-5,
                 const std::string& model = "mnist_cnn",
                 std::shared_ptr<runtime::Collectives> deviceSum = nullptr) {
  const int rank = comm->rank(), ranks = comm->size();
  const int64_t batch = 8;
  o.mode.dropout = true;
  compiler::TrainOptions ddp = o;
  ddp.collectives = comm;
  ddp.deviceCollectives = std::move(deviceSum);
  ddp.bucketBytes = bucketBytes;
  ddp.mode.firstSample = rank * batch;
  auto step = makeStep(model, batch, 0, ddp);
  // Rank 0 also runs the whole global batch in one process.
  auto single = rank == 0 ? makeStep(model, batch * ranks, 0, o) : nullptr;
  ir::Shape sample = step->graph().inputs()[0]->type().shape;
  sample.erase(sample.begin());
  bool lossesMatch = true;
  int early = 0;
  double firstWorst = 0;
  std::string firstName;
  for (int s = 0; s < 10; ++s) {
    auto [x, y] = globalBatch(sample, batch * ranks, s);
    auto r = orDie((*step)(rows(x, rank * batch, batch), rows(y, rank * batch, batch)), "ddp step");
    early = std::max(early, step->communication().startedEarly);
    if (single) {
      auto rs = orDie((*single)(x, y), "single step");
      lossesMatch &= std::abs(rs.loss - r.loss) <= 1e-5 * std::abs(rs.loss);
      if (s == 0) firstWorst = worstDifference(*step, *single, firstName);
    }
  }
  // After the first step, from the same weights, every element agrees within `tol` (a gradient
  // element summed or copied wrongly, a mask drawn for the wrong samples, is O(1) off). Later
  // steps start from weights that differ by rounding (the batch's sums run in another order), and
  // a max-pooling window whose two largest values are that close may choose the other one, moving
  // its gradient to another element, and the runs diverge from there (measured on emu: 1.8e-3 of
  // conv2.weight.momentum's largest value after 10 steps, 4.6e-4 of conv1.weight.momentum in
  // L2): after 10 steps the state is compared in L2, where a bucket or a rank's contribution lost
  // or doubled weighs O(1).
  double worst = 0;
  std::string name;
  if (single) worst = worstDifference(*step, *single, name, /*l2=*/true);
  char what[480];
  std::snprintf(what, sizeof what,
                "%s: %d ranks x batch %lld == 1 process x batch %lld after 1 step within %.0e "
                "(worst %.2g in '%s'), after 10 steps within %.0e in L2 (worst %.2g in '%s'); the "
                "global losses match: %s",
                label.c_str(), ranks, static_cast<long long>(batch),
                static_cast<long long>(batch * ranks), tol, firstWorst, firstName.c_str(),
                kL2Tolerance, worst, name.c_str(), lossesMatch ? "yes" : "no");
  check(firstWorst <= tol && worst <= kL2Tolerance && lossesMatch, what, rank);
  if (!o.eager && bucketBytes < (1 << 20))
    check(early > 0 && step->allReduceBuckets() > 1,
          label + ": " + std::to_string(step->allReduceBuckets()) + " buckets, " +
              std::to_string(early) + " started during the backward",
          rank);
}

// MPI as device collectives, on the emu device: its buffers stand behind device handles as a
// GPU's do, but are host memory, so MPI can sum them where NCCL sums a GPU's. The step's device
// bucket path (TrainOptions::deviceCollectives: gradients copied within the device on the
// step's stream, summed there, copied to the host for the update) runs over two real ranks.
class MpiOnEmuDevice final : public runtime::Collectives {
 public:
  explicit MpiOnEmuDevice(std::shared_ptr<runtime::Collectives> mpi) : mpi_(std::move(mpi)) {}
  std::string_view name() const override { return "mpi-on-emu-device"; }
  int rank() const override { return mpi_->rank(); }
  int size() const override { return mpi_->size(); }
  bool hostMemory() const override { return false; }
  Status broadcast(void* data, size_t bytes, int root) override {
    return mpi_->broadcast(data, bytes, root);
  }
  Status allReduceSum(void* data, size_t count, ir::DType dtype) override {
    return mpi_->allReduceSum(data, count, dtype);
  }
  Expected<int> startAllReduceSum(void* data, size_t count, ir::DType dtype) override {
    return mpi_->startAllReduceSum(data, count, dtype);
  }
  Expected<bool> test(int request) override { return mpi_->test(request); }
  Status wait(int request) override { return mpi_->wait(request); }
  [[noreturn]] void abort(const std::string& message, int exitCode) override {
    mpi_->abort(message, exitCode);
  }

 private:
  std::shared_ptr<runtime::Collectives> mpi_;
};

// Every rank's state equals rank 0's (sent by broadcast, compared here).
void batchNorm(const std::shared_ptr<runtime::Collectives>& comm) {
  const int rank = comm->rank();
  compiler::TrainOptions o;
  o.sgd = {.lr = 0.05, .momentum = 0.9};
  o.collectives = comm;
  o.mode.firstSample = rank * 4;
  auto step = makeStep("resnet18", 4, 32, o);
  for (int s = 0; s < 2; ++s) {
    auto [x, y] = globalBatch({3, 32, 32}, 4 * comm->size(), s);
    orDie((*step)(rows(x, rank * 4, 4), rows(y, rank * 4, 4)), "ddp step");
  }
  bool same = true, runningStats = false;
  for (const auto& [name, t] : step->state()) {
    ir::TensorData mine = t.clone(), zeros = t.clone();
    if (!comm->broadcast(zeros.data(), zeros.byteSize(), 0)) same = false;
    same &= std::memcmp(mine.data(), zeros.data(), mine.byteSize()) == 0;
    runningStats |= name.find("running_mean") != std::string::npos;
  }
  int sameAll = same ? 0 : 1;
  int64_t bad = sameAll;
  (void)comm->allReduceSum(&bad, 1, ir::DType::kI64);
  check(bad == 0 && runningStats,
        "resnet18 (BatchNorm): every rank's state, running statistics included, is rank 0's", rank);
}

// Every tensor of the step's state, copied.
std::map<std::string, ir::TensorData> snapshot(const compiler::TrainingStep& step) {
  std::map<std::string, ir::TensorData> out;
  for (const auto& [name, t] : step.state()) out.emplace(name, t.clone());
  return out;
}

bool sameBytes(const std::map<std::string, ir::TensorData>& a,
               const std::map<std::string, ir::TensorData>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.byteSize() != t.byteSize() ||
        std::memcmp(it->second.data(), t.data(), t.byteSize()) != 0)
      return false;
  }
  return true;
}

// Rank 1's shard of a step is bad (`bad`: "shape", a batch one row short; "label", a class past
// the last; "row", an embedding row past the table's): the step fails on both ranks, each with its
// own message, no rank's state changes, and the next (good) step is one process's first step on
// the whole batch.
void failedStep(const std::shared_ptr<runtime::Collectives>& comm, const std::string& label,
                compiler::TrainOptions o, const std::string& bad, const std::string& model,
                bool startedBeforeFailure = false, int64_t imageSize = 0) {
  const int rank = comm->rank(), ranks = comm->size();
  const int64_t batch = imageSize > 0 ? 4 : 8;
  o.mode.dropout = true;
  compiler::TrainOptions ddp = o;
  ddp.collectives = comm;
  ddp.bucketBytes = 1;  // A bucket per gradient: the most collectives to keep matched.
  ddp.mode.firstSample = rank * batch;
  auto step = makeStep(model, batch, imageSize, ddp);
  // BatchNorm normalizes each rank's shard on its own: one process's step is another.
  const bool batchNorm = model == "resnet18";
  auto single = rank == 0 && !batchNorm ? makeStep(model, batch * ranks, imageSize, o) : nullptr;
  ir::Shape sample = step->graph().inputs()[0]->type().shape;
  sample.erase(sample.begin());
  // The parameters are rank 0's once the first call broadcast them: a good step's state is
  // compared below, the failed one's against the state before it, taken after that broadcast.
  const int64_t classes = step->graph().outputs()[1]->type().shape[1];  // The logits'.
  auto [x, y] = globalBatch(sample, batch * ranks, 0, std::min<int64_t>(classes, 10));
  runtime::Tensor mx = rows(x, rank * batch, batch), my = rows(y, rank * batch, batch);
  if (rank == 1 && bad == "shape") {
    mx = rows(x, rank * batch, batch - 1);
    my = rows(y, rank * batch, batch - 1);
  }
  if (rank == 1 && bad == "label") my.data<int64_t>()[3] = classes;
  if (rank == 1 && bad == "row") mx.data<float>()[3 * 2] = 7;  // Row 7 of a table of 5.
  // Rank 0's parameters, as every rank holds them once the step broadcast them.
  std::map<std::string, ir::TensorData> before;
  {
    auto all = snapshot(*step);
    for (auto& [name, t] : all)
      if (!comm->broadcast(t.data(), t.byteSize(), 0)) ++failures;
    before = std::move(all);
  }
  auto failed = (*step)(mx, my);
  const std::string message = failed ? "" : failed.status().message();
  const bool ownError =
      rank == 1 ? message.find("data-parallel step on rank 1 of 2") != std::string::npos &&
                      message.find(bad == "shape"   ? "got f32[7"
                                   : bad == "label" ? "target class"
                                                    : "index 7") != std::string::npos
                : message.find("data-parallel step: rank 1 failed") != std::string::npos;
  const bool userError = !failed && failed.status().isUserError();
  const bool unchanged = sameBytes(before, snapshot(*step));
  const bool early = !startedBeforeFailure || rank != 1 || step->communication().startedEarly > 0;
  int64_t bad1 = (ownError && userError ? 0 : 1) + (unchanged ? 0 : 2) + (early ? 0 : 4);
  int64_t mine = bad1;
  (void)comm->allReduceSum(&bad1, 1, ir::DType::kI64);
  if (mine != 0)
    std::fprintf(stderr, "rank %d: failed step check %lld, its message: %s\n", rank,
                 static_cast<long long>(mine), message.c_str());
  check(bad1 == 0,
        label + ": rank 1's " + bad +
            " error fails the step on both ranks (user errors, each rank's own message)" +
            (startedBeforeFailure ? ", reported after its buckets started" : "") +
            ", and no rank's state changed by a bit",
        rank);
  // The next step goes on as if the failed one had not been.
  auto r = (*step)(rows(x, rank * batch, batch), rows(y, rank * batch, batch));
  double worst = single ? INFINITY : 0;  // Rank 0 compares.
  std::string name;
  bool lossMatches = !single;
  if (single) {
    auto rs = orDie((*single)(x, y), "single step");
    if (r) {
      worst = worstDifference(*step, *single, name);
      lossMatches = std::abs(rs.loss - r->loss) <= 1e-5 * std::abs(rs.loss);
    }
  }
  int64_t ok = r ? 0 : 1;
  (void)comm->allReduceSum(&ok, 1, ir::DType::kI64);
  char what[320];
  if (batchNorm)
    std::snprintf(what, sizeof what, "%s: the next step succeeds on both ranks", label.c_str());
  else
    std::snprintf(what, sizeof what,
                  "%s: the next step succeeds on both ranks and equals one process's first step "
                  "within 1e-5 (worst %.2g in '%s'; the losses match: %s)",
                  label.c_str(), worst, name.c_str(), lossMatches ? "yes" : "no");
  check(ok == 0 && worst <= 1e-5 && lossMatches, what, rank);
}

}  // namespace

int main(int argc, char** argv) {
  auto comm = orDie(runtime::mpiCollectives(&argc, &argv), "MPI");
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "equivalence") {
    compiler::TrainOptions sgd;
    sgd.sgd = {.lr = 0.05, .momentum = 0.9, .weightDecay = 1e-4, .nesterov = true};
    equivalence(comm, "compiled SGD (Nesterov), 64 KB buckets", sgd, 64 << 10);
    compiler::TrainOptions adamw;
    adamw.optimizer = compiler::TrainOptions::Optimizer::kAdam;
    adamw.adam = {.lr = 1e-3, .eps = 1e-3, .weightDecay = 0.01, .decoupled = true};
    // With eps = 1e-3, above these gradients' scale, Adam's update m / (sqrt(v) + eps) stays
    // linear in the gradients, so the two runs agree to rounding (2.4e-6). With the default 1e-8
    // the update is about lr times the sign of every gradient element well above 1e-8: an element
    // near zero, summed in another order, moves its weight by lr the other way, and after 10 steps
    // the two runs differ by up to 10 lr (measured from 2.1e-3 to 0.046 of fc1.weight's largest
    // value as rounding elsewhere changed), which no tolerance separates from a real bug.
    equivalence(comm, "compiled AdamW (eps 1e-3), one 25 MB bucket", adamw, 25 << 20);
    compiler::TrainOptions eager = sgd;
    eager.eager = true;
    equivalence(comm, "eager SGD (Nesterov)", eager, 64 << 10);
    // The CUDA backend's code path on the emu device: gradients copied to the host buckets
    // through the stream.
    compiler::TrainOptions emu = sgd;
    emu.compile.backend = orDie(runtime::gpu::backendForDevice("emu"), "the emu device");
    equivalence(comm, "emu device, SGD (Nesterov), mlp", emu, 64 << 10, 1e-5, "mlp");
    // One bucket per gradient: steps that finish several (a fused kernel's outputs) start them
    // together after one synchronize.
    equivalence(comm, "emu device, one bucket per gradient, mnist_cnn", emu, 1, 1e-5);
    equivalence(comm, "emu device, gradients summed in device buckets, mnist_cnn", emu, 64 << 10,
                1e-5, "mnist_cnn", std::make_shared<MpiOnEmuDevice>(comm));
  } else if (mode == "batchnorm") {
    batchNorm(comm);
  } else if (mode == "failure") {
    compiler::TrainOptions sgd;
    sgd.sgd = {.lr = 0.05, .momentum = 0.9};
    failedStep(comm, "compiled", sgd, "shape", "mnist_cnn");
    failedStep(comm, "compiled", sgd, "label", "mnist_cnn");
    // BatchNorm's running statistics, which the compiled step writes in place as it runs: rank
    // 0's run went through, and they are put back.
    failedStep(comm, "compiled resnet18", sgd, "label", "resnet18", false, 32);
    compiler::TrainOptions eager = sgd;
    eager.eager = true;
    failedStep(comm, "eager", eager, "label", "mnist_cnn");
    compiler::TrainOptions emu = sgd;
    emu.compile.backend = orDie(runtime::gpu::backendForDevice("emu"), "the emu device");
    failedStep(comm, "emu device", emu, "label", "mlp");
    failedStep(comm, "emu device", emu, "row", "embedding", /*startedBeforeFailure=*/true);
  } else if (mode == "abort") {
    if (comm->rank() == 1) comm->abort("a test failure on purpose", 3);
    double v = 1;
    (void)comm->allReduceSum(&v, 1, ir::DType::kF64);  // Rank 1 never joins.
    std::printf("FAILED: rank 0 went on after rank 1 stopped\n");
    return 1;
  } else {
    std::fprintf(stderr, "usage: ddp_check equivalence|batchnorm|failure|abort (under mpirun)\n");
    return 2;
  }
  return failures == 0 ? 0 : 1;
}
