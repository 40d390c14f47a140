// The CPU backend: host memory from a caching allocator, kiln's generated C++ kernels loaded
// with LLVM's ORC JIT and run over the ComputeThreads budget, oneDNN/OpenBLAS library calls
// with fused post-ops, reference kernels for the rest. Streams run synchronously on the
// calling thread.
#pragma once

#include <memory>

#include "runtime/backend.h"

namespace kiln::runtime {

// A CPU backend allocating from `alloc` (the process's cpuAllocator() by default; eager
// sessions with a memory limit pass their own). The registry's "cpu" is makeCpuBackend().
std::shared_ptr<Backend> makeCpuBackend(CachingAllocator* alloc = &cpuAllocator());

}  // namespace kiln::runtime
