// One peer check (ctest label `peer`): imports MODEL's ONNX export written by
// tools/peers/export.py — PyTorch's default exporter (model.onnx: opset 20, external data), or
// with --legacy the TorchScript exporter (legacy.onnx, opset 17) — runs it eagerly and compiled
// on the recorded input (the default exporter's file also compiled for the emu device, the CUDA
// backend's kernels), and compares each with what PyTorch eager and ONNX Runtime (on the same
// file) computed, relative to max |reference| (1e-4 in f32).
//   kiln_peer_check MODEL [--legacy]      (exports in $KILN_PEERS_DIR)
// Exits 0 when all four comparisons pass, 1 when one fails or a step errs, and 77 (ctest's
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
#include "runtime/gpu/gpu_backend.h"

namespace fs = std::filesystem;
using namespace kiln;

namespace {

constexpr double kTolerance = 1e-4;  // Relative to max |reference|, f32.
}  // namespace

int main(int argc, char** argv) {
  const bool legacy = argc == 3 && std::string(argv[2]) == "--legacy";
  if (argc < 2 || (argc == 3 && !legacy) || argc > 3) {
    std::fprintf(stderr, "usage: kiln_peer_check MODEL [--legacy] (exports in $KILN_PEERS_DIR)\n");
    return 2;
  }
  const std::string model = argv[1];
  const fs::path root = peers::peersRoot();
  const fs::path dir = root / model;
  const std::string onnxFile = legacy ? "legacy.onnx" : "model.onnx";
  const std::string ortFile = legacy ? "onnxruntime_legacy.npy" : "onnxruntime.npy";
  for (const std::string& f :
       {onnxFile, std::string("input.npy"), std::string("torch.npy"), ortFile})
    if (root.empty() || !fs::exists(dir / f)) return peers::skipMissing(root, dir / f);

  auto input = frontends::readNpy((dir / "input.npy").string());
  if (!input) return peers::fail("input.npy", input.status());
  frontends::OnnxImportOptions options;
  if (!input->shape().empty()) options.defaultBatch = input->shape()[0];
  auto graph = frontends::loadOnnx((dir / onnxFile).string(), options);
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
  // The default exporter's file also runs compiled for the CUDA backend, on the emu device.
  std::vector<runtime::Tensor> emuOut;
  if (!legacy) {
    compiler::CompileOptions o;
    auto emu = runtime::gpu::backendForDevice("emu");
    if (!emu) return peers::fail("emu device", emu.status());
    o.backend = *emu;
    auto onEmu = compiler::compile(*graph, o);
    if (!onEmu) return peers::fail("compile for emu", onEmu.status());
    auto out = (*onEmu)->run(inputs);
    if (!out) return peers::fail("run on emu", out.status());
    emuOut = std::move(*out);
  }

  int failures = 0;
  const char* label = legacy ? "legacy" : "default";
  for (const char* peer : {"torch", "onnxruntime"}) {
    const std::string refFile = std::string(peer) == "torch" ? "torch.npy" : ortFile;
    auto ref = frontends::readNpy((dir / refFile).string());
    if (!ref) return peers::fail(refFile, ref.status());
    std::vector<std::pair<const char*, const runtime::Tensor*>> runs = {
        {"eager", &(*eagerOut)[0]}, {"compiled", &(*compiledOut)[0]}};
    if (!emuOut.empty()) runs.emplace_back("emu", &emuOut[0]);
    for (const auto& [how, out] : runs) {
      const double err = peers::relativeError(out->toData(), *ref);
      const bool ok = err <= kTolerance;
      failures += !ok;
      std::printf("peer: %s (%s exporter): kiln %-8s vs %-11s max |diff| / max |ref| = %.3g %s\n",
                  model.c_str(), label, how, peer, err, ok ? "(ok)" : "FAILS (tolerance 1e-4)");
    }
  }
  return failures ? 1 : 0;
}
