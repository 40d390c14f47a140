// The plan builder: from a schedule to a runtime::Plan — where every value lives (an input, a
// parameter, a result tensor, or an offset of the one scratch arena planned by
// compiler/memory_plan.h, with in-place reuse where a kernel reads and writes one index map),
// graph outputs written straight into the result tensors or over their parameter in place, and
// the steps with their buffers, kernel entry points and library options.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "compiler/compile.h"
#include "compiler/schedule.h"

namespace kiln::compiler {

struct PlanBuildInputs {
  const ir::Graph& graph;
  const Schedule& schedule;
  std::span<const void* const> kernelEntries;  // Per schedule kernel, on `backend`.
  std::shared_ptr<runtime::KernelModule> code;
  std::shared_ptr<runtime::Backend> backend;
  // CompileOptions::inPlaceOutputs.
  const std::vector<std::pair<size_t, std::string>>& inPlaceOutputs;
  bool tf32 = false;  // Library calls in TF32 (CompileOptions::precision).
};

// Fills the report's plan figures (arena and its lower bound, in-place reuses, reference and
// copy steps, parameter bytes).
Expected<std::shared_ptr<runtime::Plan>> buildPlan(const PlanBuildInputs& in,
                                                   CompileReport& report);

}  // namespace kiln::compiler
