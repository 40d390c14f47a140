// The pass interface and the context a pipeline hands to every pass. A pass is a small class
// with one job: `bool run(Graph&, PassContext&)` returns whether it changed the graph.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace kiln::passes {

// Evaluates one node on constant inputs. Injected by the compiler (it runs the runtime's
// reference kernels) so that passes never link a backend.
using ConstantEvaluator = std::function<Expected<std::vector<ir::TensorData>>(
    const ir::Node& node, std::span<const ir::TensorData> inputs)>;

// Picks an algorithm for one conv2d (e.g. by timing the candidates on its real shape): the
// algo attribute's value and a one-line explanation. Injected by the compiler.
struct AlgorithmChoice {
  std::string algo;
  std::string explanation;
};
using ConvAlgorithmChooser = std::function<Expected<AlgorithmChoice>(const ir::Node& conv)>;

struct PassTiming {
  std::string pass;
  double ms = 0;
  bool changed = false;
};

struct PassContext {
  // Inference compiles may fold trainable parameters (weights) into constants; training
  // compiles must keep them, since the optimizer updates them.
  bool inference = true;
  ConstantEvaluator evaluate;         // Constant folding is a no-op without one.
  int64_t maxFoldedBytes = 64 << 20;  // Larger constants stay computed at run time.
  // The target backend's library registry (runtime::Backend::hasLibraryKernel): whether its
  // library runs an op at an output dtype and activation layout. Layout selection keeps NHWC
  // where it says so; without one (or with channels-last off) layouts stay plain.
  std::function<bool(ir::OpKind, ir::DType, ir::Layout)> hasLibraryKernel;
  bool channelsLast = false;  // Layout selection may choose NHWC at all.
  // Training: rematerialize recomputes pointwise values for the backward pass from values it
  // keeps anyway, instead of keeping them (kiln train --recompute).
  bool recompute = false;
  // NHWC convolutions take NHWC (KRSC) filters: layout selection converts the weights too.
  bool channelsLastFilters = false;
  // The backend runs generated kernels and library calls only (a GPU: everything else runs on
  // the host, with copies): device-lowering rewrites what it can into kernel-IR ops.
  bool lowerForDevice = false;
  // Autocast (--precision bf16|fp16): kAutocast ops run in this dtype (f16 or bf16); kF32: off.
  ir::DType autocast = ir::DType::kF32;
  int layoutConversions = 0;                  // Relayouts inserted by layout selection.
  ConvAlgorithmChooser chooseConvAlgorithm;   // conv-algorithm-selection is a no-op without one.
  std::vector<std::string> algorithmChoices;  // One line per conv: --explain-algos.

  // Instrumentation, owned by the pipeline (not by the passes).
  bool verifyAfterEach = false;
  std::set<std::string> disabled;   // Pass names to skip.
  std::set<std::string> dumpAfter;  // Pass names, or "all".
  bool timePasses = false;
  std::ostream* log = nullptr;      // Where dumps and timings go.
  std::vector<PassTiming> timings;  // Filled by the pipeline.
  // Free-form notes a pass wants the user to see (e.g. why a fold was skipped).
  std::vector<std::string> remarks;
};

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string_view name() const = 0;
  virtual bool run(ir::Graph& g, PassContext& ctx) = 0;
};

// Declares one class per pass in passes.def.
#define KILN_PASS(Class, passName, description)                 \
  class Class final : public Pass {                             \
   public:                                                      \
    std::string_view name() const override { return passName; } \
    bool run(ir::Graph& g, PassContext& ctx) override;          \
  };
#include "passes/passes.def"
#undef KILN_PASS

struct PassInfo {
  std::string_view name;
  std::string_view description;
  std::unique_ptr<Pass> (*create)();
};
const std::vector<PassInfo>& allPasses();
std::unique_ptr<Pass> createPass(std::string_view name);  // nullptr when unknown.

}  // namespace kiln::passes
