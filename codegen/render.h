// Renderers: kernel IR -> source. One C-family printer with two dialects, C++ for the CPU
// (a plain function over a range of work units; the runtime splits units across threads)
// and CUDA C (grid-stride loops, one block per row with block reductions). The dialects
// differ only in data, a DialectTable in render.cpp (types, kernel prefix, argument passing,
// pointer qualifiers, loop pragmas, element and row loops, reduction strategy, shared memory,
// barriers); expressions print the same. Golden tests: tests/codegen/test_codegen_golden.cpp.
#pragma once

#include <span>
#include <string>

#include "codegen/kernel_ir.h"

namespace kiln::codegen {

enum class Dialect : uint8_t { kCpu, kCuda };

// The CPU ABI: extern "C" void name(void* const* args, long long begin, long long end),
// computing work units [begin, end) of Kernel::numUnits(); args in Kernel::args order.
// The CUDA ABI: extern "C" __global__ void name(T0* a0, T1* a1, ...), launched with
// blockDim.x == kCudaBlock and any grid (grid-stride loops).
inline constexpr int kCudaBlock = 256;

std::string renderKernel(const Kernel& k, Dialect d);
// The prelude followed by every kernel: one translation unit.
std::string renderModule(std::span<const Kernel> kernels, Dialect d);

}  // namespace kiln::codegen
