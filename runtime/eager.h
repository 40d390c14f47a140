// The eager interpreter: runs a Graph op by op through a backend's kernels (library kernels
// where it has them, reference kernels otherwise), allocating each output from the backend
// and freeing each intermediate right after its last use, as PyTorch eager does. It is the
// baseline of every eager-vs-compiled comparison and records per-op wall time and peak bytes.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"
#include "runtime/backend.h"
#include "runtime/tensor.h"

namespace kiln::runtime {

struct EagerNodeTiming {
  const ir::Node* node;
  double ms;           // On a backend with an asynchronous queue: the time to enqueue it.
  double startMs = 0;  // From the start of the run.
};

struct EagerOpTiming {
  int64_t count = 0;
  double ms = 0;
};

struct EagerStats {
  double totalMs = 0;
  double deviceMs = -1;  // As PlanRunStats::deviceMs: the stream's timer, where it has one.
  // Highest backend bytes in use during the run above what was in use when it started:
  // intermediates and outputs (weights are views of the graph's parameter data on the CPU).
  int64_t peakActivationBytes = 0;
  int64_t numAllocations = 0;
  std::vector<EagerNodeTiming> nodes;        // In execution order.
  std::map<std::string, EagerOpTiming> ops;  // Aggregated by op name.
};

// A generated kernel that computes one node by itself, for eager execution on a backend whose
// library and host calls do not cover every op (the GPU): made by the compiler layer
// (compiler/eager_kernels.h), looked up per node. `entry` null: the node is a copy of its input 0
// into its output (a reshape). `args`: per kernel argument, the node input it reads (>= 0) or
// the output it writes (-1 - k).
struct NodeKernel {
  const void* entry = nullptr;
  int64_t units = 0, elements = 0;
  int block = 0;
  int64_t grid = 0;
  int64_t scratchBytes = 0;  // KernelLaunch::scratchBytes.
  std::vector<int> args;
};
// A node's kernel, or nullopt when the node runs as an op call.
using NodeKernelFn = std::function<Expected<std::optional<NodeKernel>>(const ir::Node&)>;

// Not thread-safe: one run at a time per executor (its statistics and environment are
// members). Threads that run a graph eagerly at once each make their own executor.
class EagerExecutor {
 public:
  // The graph must outlive the executor and stay unchanged; it should pass ir::verify. A
  // backend whose memory is not the host's receives the inputs and the graph's current
  // parameter bytes at every run, and returns the outputs to host tensors.
  explicit EagerExecutor(const ir::Graph& graph,
                         std::shared_ptr<Backend> backend = defaultBackend());
  // On a CPU backend allocating from `alloc` (tests, memory-limited sessions).
  EagerExecutor(const ir::Graph& graph, CachingAllocator* alloc);

  // Checks inputs against the graph's input types (count, dtype, shape) and runs the graph.
  Expected<std::vector<Tensor>> run(std::span<const Tensor> inputs);
  const EagerStats& lastStats() const { return stats_; }
  // The parameters' bytes changed (an optimizer step): a backend that keeps device copies of
  // them (a GPU) uploads them again at the next run.
  void parametersChanged() { residentValid_ = false; }
  // Options every library call of a run takes (LibraryOptions::tf32 for --precision tf32).
  void setCallOptions(const LibraryOptions& o) { callOptions_ = o; }
  // Nodes that are not library calls on the backend run `kernels`' kernel when it gives one
  // (PyTorch eager on a GPU: one kernel per op); others run as op calls.
  void setNodeKernels(NodeKernelFn kernels) { nodeKernels_ = std::move(kernels); }

 private:
  const ir::Graph& graph_;
  std::shared_ptr<Backend> backend_;
  std::unordered_map<const ir::Value*, size_t> slot_;  // Value -> index into the environment.
  std::vector<std::vector<size_t>> freeAfter_;         // Per node: slots that die after it.
  NodeKernelFn nodeKernels_;
  std::vector<bool> isOutput_;      // Per slot: a graph output.
  std::vector<std::string> names_;  // Per node: its description, for errors.
  EagerStats stats_;
  std::vector<DeviceBuffer> resident_;  // Per parameter: its device copy (not host-addressable).
  bool residentValid_ = false;          // resident_ holds the parameters' current bytes.
  LibraryOptions callOptions_;
};

// Checks that `inputs` match the graph's inputs; errors name the input, expected vs actual.
Status checkInputs(const ir::Graph& graph, std::span<const Tensor> inputs);

}  // namespace kiln::runtime
