// The CPU backend: host memory from a caching allocator, kiln's generated C++ kernels loaded
// with LLVM's ORC JIT and run over the ComputeThreads budget, oneDNN library calls
// with fused post-ops, reference kernels for the rest. Streams run synchronously on the
// calling thread.
#pragma once

#include <memory>

#include "runtime/backend.h"
#include "runtime/tensor.h"

namespace kiln::runtime {

// A CPU backend allocating from `alloc` (the process's cpuAllocator() by default; eager
// sessions with a memory limit pass their own). The registry's "cpu" is makeCpuBackend().
std::shared_ptr<Backend> makeCpuBackend(CachingAllocator* alloc = &cpuAllocator());

// Runs one op call on host tensors with the CPU's kernels: the library call with its post-ops
// (call.library), else the op's library kernel where one exists for the output dtype (oneDNN,
// as PyTorch eager does), else its reference kernel. The CPU stream runs every op this
// way, and the CUDA backend runs ops it has no device kernel for this way on the host.
Status runOnHost(const OpCall& call, std::span<const Tensor> inputs, std::span<Tensor> outputs);

}  // namespace kiln::runtime
