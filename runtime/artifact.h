// Ahead-of-time artifacts (docs/artifact-format.md): one file holding a compiled model's plan
// and memory plan, the object code of its generated kernels, their sources and PTX, and its
// weights. Loading one needs the runtime only: no Clang, no NVRTC, no frontend. Every section
// carries a checksum; the header names the format version and the CPU the code was built for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "runtime/plan.h"

namespace kiln::runtime {

inline constexpr char kArtifactMagic[8] = {'K', 'I', 'L', 'N', 'A', 'O', 'T', '\0'};
// The format written; also read: every version from kArtifactOldestVersion on (1: kernel steps
// without scratchBytes, which that kiln never made).
inline constexpr uint32_t kArtifactVersion = 2;
inline constexpr uint32_t kArtifactOldestVersion = 1;

// One generated kernel module: its C++ source (to recompile on a CPU that cannot run the object
// code) and its relocatable object.
struct ArtifactModule {
  std::string name;
  std::string source;
  std::vector<std::byte> object;
};

// What `kiln compile -o` writes (compiler/artifact.h fills it from a CompiledModel).
struct ArtifactContents {
  std::string modelName;
  std::string producer;        // e.g. "kiln 0.1 (LLVM 16, oneDNN 3.0)"
  std::string optimizedGraph;  // Text IR, for `kiln inspect` and debugging.
  std::vector<std::vector<std::string>> inputDimNames;  // Per input (ir::Value::dimNames).
  std::vector<std::string> outputNames;
  std::shared_ptr<const Plan> plan;
  std::string triple, cpu, features;  // What the object code was compiled for.
  std::vector<ArtifactModule> modules;
  std::vector<std::pair<std::string, std::string>> ptx;  // (arch "sm_80", PTX text).
  // Cubins of all the kernels in one module per architecture (sm_80 and sm_90 besides
  // `deviceArch`'s): other GPUs load these instead of `modules`' objects.
  std::vector<std::pair<std::string, std::vector<std::byte>>> cubins;
  std::vector<std::string> algorithmChoices;  // One line per conv2d.
  // The code format of `modules`' objects when it is not the CPU's "host-object": CUDA kernels
  // ("cubin" for `deviceArch`, or "cuda-emu-object"); written to the `device` section with each
  // kernel step's launch geometry.
  std::string kernelCode;
  std::string deviceArch;  // "sm_90" for cubins.
};

// Which of a cubin artifact's codes a GPU of architecture `smArch` (90 for sm_90) loads: its own
// cubins (`deviceArch`), else a cubin of the same major architecture and the newest minor not
// above the GPU's (CUDA's binary compatibility), else the newest PTX not above it (linked for the
// GPU by nvJitLink); nullopt: none runs there. Architectures are named "sm_XY".
struct CudaCodeChoice {
  enum class Kind : uint8_t { kObjects, kCubin, kPtx } kind = Kind::kObjects;
  std::string arch;  // The cubin's or the PTX's; deviceArch for kObjects.
};
std::optional<CudaCodeChoice> chooseCudaCode(int smArch, const std::string& deviceArch,
                                             std::span<const std::string> cubinArchs,
                                             std::span<const std::string> ptxArchs);

// Writes the artifact atomically (a temporary file renamed into place): on error nothing is
// left at `path`.
Status writeArtifact(const std::string& path, const ArtifactContents& contents);

struct ArtifactSection {
  std::string name;
  uint64_t offset = 0, size = 0, checksum = 0;  // XXH3-64 of the section's bytes.
};

// What `kiln inspect` shows; everything but the code and the weights.
struct ArtifactInfo {
  std::string path;
  uint32_t version = 0;
  uint64_t fileBytes = 0;
  std::vector<ArtifactSection> sections;
  std::string modelName, producer, triple, cpu, features;
  std::vector<std::string> inputNames, outputNames;
  std::vector<ir::TensorType> inputs, outputs;
  std::vector<std::vector<std::string>> inputDimNames;
  std::vector<std::string> kernels;  // Symbols of the generated kernels, in plan order.
  std::vector<std::string> moduleNames;
  std::vector<std::string> ptxArchs;
  std::vector<std::string> cubinArchs;  // Of the `cubins` section.
  std::vector<std::string> algorithmChoices;
  // The `device` section: the CUDA code format ("cubin", "cuda-emu-object"; empty for a CPU
  // artifact) and the architecture of the cubins.
  std::string kernelCode, deviceArch;
  std::string precision = "fp32";  // Of the library calls (--precision).
  int64_t arenaBytes = 0;
  int64_t parameterBytes = 0;
  size_t numSteps = 0;
  std::string optimizedGraph;
};

struct LoadOptions {
  // Called with each module when this CPU lacks a feature its object code needs: returns an
  // object compiled from the module's source for this machine (the `kiln` tool passes its
  // Clang compiler). Unset, such an artifact is refused with the missing features named.
  std::function<Expected<std::vector<std::byte>>(const ArtifactModule&)> recompile;
  std::ostream* log = nullptr;  // Notices (e.g. "recompiling ...") go here.
  int threads = 0;              // Kernel threads; 0: OpenMP's default.
  int64_t maxMemoryBytes = 0;   // PlanExecutor::limitMemory; 0: no bound.
  // The backend to run on: one that loads the artifact's code format (the CPU for host objects;
  // cuda or emu for CUDA kernels); null: defaultBackend().
  std::shared_ptr<Backend> backend;
  // Run the model once on zero inputs before returning (LoadedModel::warmUp), so that the first
  // real call does not pay for what only a run touches, as Triton's model warm-up does.
  bool warmup = true;
};

// A model loaded from an artifact: its plan with code and weights mapped, ready to run.
// Thread-safe: run() may be called from many threads at once (each call has its own scratch
// arena and statistics; the mapped weights and code are shared read-only; see PlanExecutor).
class LoadedModel {
 public:
  LoadedModel(std::shared_ptr<const Plan> plan, ArtifactInfo info, int threads, double loadMs,
              bool recompiled);
  // Checks the inputs against the compiled signature (count, dtype, shape; errors name the
  // input, expected vs actual) and runs the plan. `stats`, when given, receives this call's.
  Expected<std::vector<Tensor>> run(std::span<const Tensor> inputs, PlanRunStats* stats = nullptr);
  Expected<std::vector<Tensor>> operator()(std::span<const Tensor> inputs) { return run(inputs); }
  // PlanExecutor::runOnDevice: inputs and outputs in the backend's memory.
  Expected<std::vector<DeviceBuffer>> runOnDevice(std::span<const DeviceTensor> inputs,
                                                  uintptr_t waitFor = 0) {
    return exec_.runOnDevice(inputs, waitFor);
  }
  const ArtifactInfo& info() const { return info_; }
  const Plan& plan() const { return *plan_; }
  // The statistics of the call that finished last (a copy; any thread's call).
  PlanRunStats lastStats() const { return exec_.lastStats(); }
  size_t arenasAllocated() const { return exec_.arenasAllocated(); }
  size_t reorderedWeightBytes() const { return exec_.reorderedWeightBytes(); }
  Status limitMemory(int64_t limitBytes) { return exec_.limitMemory(limitBytes); }
  double loadMs() const { return loadMs_; }  // Open, verify, map, link.
  // Library primitives created and weights reordered (PlanExecutor::prepare; load() calls it).
  Status prepare();
  double prepareMs() const { return prepareMs_; }
  // One run on zero inputs of the compiled signature (load() calls it unless told not to): what
  // prepare cannot do ahead of a run — the calling thread's compute threads started, every
  // kernel's and library call's code and the arena's pages touched — so that the first real
  // call costs about what later ones do. Its outputs are dropped. A model that rejects zeros as
  // an invalid argument (an integer division by an input) is left cold, not failed.
  Status warmUp();
  double warmupMs() const { return warmupMs_; }    // 0 when not warmed up.
  bool recompiled() const { return recompiled_; }  // Object code rebuilt from the sources.

 private:
  std::shared_ptr<const Plan> plan_;
  ArtifactInfo info_;
  PlanExecutor exec_;
  double loadMs_;
  double prepareMs_ = 0;
  double warmupMs_ = 0;
  bool recompiled_;
};

// Recomputes every checksum of an artifact image in memory (each section's, the table's, the
// header's) and its size field, so that it verifies again after its bytes were changed. For tests
// and the artifact fuzz target, and a statement of the trust model: the checksums detect damage,
// not tampering; anyone who can write the file can reseal it (docs/artifact-format.md).
// kInvalidArgument when the image has no readable header or table.
Status resealArtifact(std::span<std::byte> image);

// Reads the header, section table and metadata, verifying every section's checksum. Errors
// (kInvalidArgument, naming the file): not an artifact, an unsupported format version, a
// truncated file, a checksum mismatch (naming the section), a malformed section.
Expected<ArtifactInfo> inspectArtifact(const std::string& path);

// Loads an artifact: the checks of inspectArtifact, then a CPU check of the object code (see
// LoadOptions::recompile), then the plan with its kernels linked and its weights mapped from
// the file (not copied), its library calls prepared and (LoadOptions::warmup) one run on zero
// inputs.
Expected<std::unique_ptr<LoadedModel>> loadArtifact(const std::string& path,
                                                    const LoadOptions& options = {});

}  // namespace kiln::runtime

namespace kiln {
// The embedding API: auto model = kiln::load("model.kiln"); auto y = (*model)->run(inputs);
inline Expected<std::unique_ptr<runtime::LoadedModel>> load(
    const std::string& path, const runtime::LoadOptions& options = {}) {
  return runtime::loadArtifact(path, options);
}
}  // namespace kiln
