// Single-op kernels for eager execution on a backend that runs generated code but has no kernel
// of its own for most ops (the GPU: runtime::EagerExecutor would run them on the host). Each
// distinct node signature (op, attributes, input types) is compiled once, as a one-node graph
// through the normal pipeline, and its kernel handed to the executor: PyTorch eager on a GPU,
// one kernel per op.
#pragma once

#include <memory>

#include "compiler/compile.h"
#include "runtime/eager.h"

namespace kiln::compiler {

// The kernels of `backend` for eager runs, compiled with `options`' cache settings (thread-safe;
// keeps the compiled kernels alive). Nodes whose one-node plan is not a single kernel or copy
// (library and reference ops, multi-step lowerings) get nullopt: they run as op calls.
runtime::NodeKernelFn eagerKernels(std::shared_ptr<runtime::Backend> backend,
                                   const CompileOptions& options = {});

// Gives `exec` the backend's single-op kernels where the backend runs CUDA code (cuda, emu;
// the CPU's eager keeps its library and reference kernels) and the options' precision for its
// library calls (kInvalidArgument where the backend cannot compute in it).
Status useDeviceKernels(runtime::EagerExecutor& exec,
                        const std::shared_ptr<runtime::Backend>& backend,
                        const CompileOptions& options = {});

}  // namespace kiln::compiler
