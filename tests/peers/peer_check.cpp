// One peer check (ctest label `peer`): imports MODEL's ONNX export written by
// tools/peers/export.py, runs it eagerly and compiled on the recorded input, and compares both
// with what PyTorch eager and ONNX Runtime computed, relative to max |reference| (1e-4 in f32).
//   kiln_peer_check MODEL [PEERS_DIR]
// PEERS_DIR defaults to $KILN_PEERS_DIR, else the build's default (.peers/models in the source
// tree). Exits 0 when all four comparisons pass, 1 when one fails or a step errs, and 77 (ctest's
// skip) when the exports are absent.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "compiler/compile.h"
#include "frontends/npy/npy.h"
#include "frontends/onnx/onnx_import.h"
#include "runtime/eager.h"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

constexpr double kTolerance = 1e-4;  // Relative to max |reference|, f32.
constexpr int kSkip = 77;

int fail(const std::string& what, const Status& st) {
  std::fprintf(stderr, "peer: %s: %s\n", what.c_str(), st.message().c_str());
  return 1;
}

// max |got - ref| / max |ref|, or +inf when the shapes differ.
double relativeError(const runtime::Tensor& got, const ir::TensorData& ref) {
  if (got.shape() != ref.shape() || ref.dtype() != ir::DType::kF32 ||
      got.dtype() != ir::DType::kF32)
    return INFINITY;
  const ir::TensorData g = got.toData();
  const float* a = g.as<float>();
  const float* b = ref.as<float>();
  double scale = 0, diff = 0;
  for (int64_t i = 0; i < ref.numElements(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
  }
  return diff / std::max(scale, 1e-30);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: kiln_peer_check MODEL [PEERS_DIR]\n");
    return 2;
  }
  const std::string model = argv[1];
  fs::path root = argc == 3 ? fs::path(argv[2]) : fs::path();
  if (root.empty()) {
    const char* env = std::getenv("KILN_PEERS_DIR");
    root = env && *env ? fs::path(env) : fs::path(KILN_PEERS_DEFAULT_DIR);
  }
  const fs::path dir = root / model;
  for (const char* f : {"model.onnx", "input.npy", "torch.npy", "onnxruntime.npy"})
    if (!fs::exists(dir / f)) {
      std::printf(
          "peer: skipped: %s not found. The peer exports come from tools/peers/setup.sh "
          "(a Python venv with PyTorch and ONNX Runtime from PyPI); set KILN_PEERS_DIR "
          "if they live elsewhere than %s.\n",
          (dir / f).c_str(), root.c_str());
      return kSkip;
    }

  auto input = frontends::readNpy((dir / "input.npy").string());
  if (!input) return fail("input.npy", input.status());
  frontends::OnnxImportOptions options;
  if (!input->shape().empty()) options.defaultBatch = input->shape()[0];
  auto graph = frontends::loadOnnx((dir / "model.onnx").string(), options);
  if (!graph) return fail("import", graph.status());
  if (graph->inputs().size() != 1 || graph->outputs().size() != 1)
    return fail("import", invalidArgument("expected one input and one output"));

  const std::vector<runtime::Tensor> inputs{runtime::Tensor::fromData(*input)};
  runtime::EagerExecutor eager(*graph);
  auto eagerOut = eager.run(inputs);
  if (!eagerOut) return fail("eager run", eagerOut.status());
  auto compiled = compiler::compile(*graph);
  if (!compiled) return fail("compile", compiled.status());
  auto compiledOut = (*compiled)->run(inputs);
  if (!compiledOut) return fail("compiled run", compiledOut.status());

  int failures = 0;
  for (const char* peer : {"torch", "onnxruntime"}) {
    auto ref = frontends::readNpy((dir / (std::string(peer) + ".npy")).string());
    if (!ref) return fail(std::string(peer) + ".npy", ref.status());
    const std::pair<const char*, const runtime::Tensor*> runs[] = {
        {"eager", &(*eagerOut)[0]}, {"compiled", &(*compiledOut)[0]}};
    for (const auto& [how, out] : runs) {
      const double err = relativeError(*out, *ref);
      const bool ok = err <= kTolerance;
      failures += !ok;
      std::printf("peer: %s: kiln %-8s vs %-11s max |diff| / max |ref| = %.3g %s\n", model.c_str(),
                  how, peer, err, ok ? "(ok)" : "FAILS (tolerance 1e-4)");
    }
  }
  return failures ? 1 : 0;
}
