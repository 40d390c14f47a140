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
#include "peer_util.h"
#include "runtime/eager.h"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

constexpr double kTolerance = 1e-4;  // Relative to max |reference|, f32.
}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: kiln_peer_check MODEL [PEERS_DIR]\n");
    return 2;
  }
  const std::string model = argv[1];
  const fs::path root = peers::peersRoot(argc, argv);
  const fs::path dir = root / model;
  for (const char* f : {"model.onnx", "input.npy", "torch.npy", "onnxruntime.npy"})
    if (!fs::exists(dir / f)) {
      std::printf(
          "peer: skipped: %s not found. The peer exports come from tools/peers/setup.sh "
          "(a Python venv with PyTorch and ONNX Runtime from PyPI); set KILN_PEERS_DIR "
          "if they live elsewhere than %s.\n",
          (dir / f).c_str(), root.c_str());
      return peers::kSkip;
    }

  auto input = frontends::readNpy((dir / "input.npy").string());
  if (!input) return peers::fail("input.npy", input.status());
  frontends::OnnxImportOptions options;
  if (!input->shape().empty()) options.defaultBatch = input->shape()[0];
  auto graph = frontends::loadOnnx((dir / "model.onnx").string(), options);
  if (!graph) return peers::fail("import", graph.status());
  if (graph->inputs().size() != 1 || graph->outputs().size() != 1)
    return peers::fail("import", invalidArgument("expected one input and one output"));

  const std::vector<runtime::Tensor> inputs{runtime::Tensor::fromData(*input)};
  runtime::EagerExecutor eager(*graph);
  auto eagerOut = eager.run(inputs);
  if (!eagerOut) return peers::fail("eager run", eagerOut.status());
  auto compiled = compiler::compile(*graph);
  if (!compiled) return peers::fail("compile", compiled.status());
  auto compiledOut = (*compiled)->run(inputs);
  if (!compiledOut) return peers::fail("compiled run", compiledOut.status());

  int failures = 0;
  for (const char* peer : {"torch", "onnxruntime"}) {
    auto ref = frontends::readNpy((dir / (std::string(peer) + ".npy")).string());
    if (!ref) return peers::fail(std::string(peer) + ".npy", ref.status());
    const std::pair<const char*, const runtime::Tensor*> runs[] = {
        {"eager", &(*eagerOut)[0]}, {"compiled", &(*compiledOut)[0]}};
    for (const auto& [how, out] : runs) {
      const double err = peers::relativeError(out->toData(), *ref);
      const bool ok = err <= kTolerance;
      failures += !ok;
      std::printf("peer: %s: kiln %-8s vs %-11s max |diff| / max |ref| = %.3g %s\n", model.c_str(),
                  how, peer, err, ok ? "(ok)" : "FAILS (tolerance 1e-4)");
    }
  }
  return failures ? 1 : 0;
}
