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
// computing work units [begin, end) of Kernel::numUnits() (of cpuRowSplit's chunks, and a
// scratch buffer after the arguments, where that splits the kernel); args in Kernel::args order.
// The CUDA ABI: extern "C" __global__ void name(kiln_gptr<T0> a0, kiln_gptr<T1> a1, ...) (a
// plain T* on a GPU, a bound-checked pointer on the emu device), launched with any
// one-dimensional block of whole warps (32..1024 threads) and any grid: grid-stride loops over
// elements, or over rows with one block per row.
inline constexpr int kCudaBlock = 256;

struct CudaLaunchGeometry {
  int block = kCudaBlock;  // Threads per block.
  int64_t grid = 1;        // Blocks.
};
// The launch codegen chooses for `k` on a device with `multiProcessors` SMs: pointwise kernels
// take blocks of 256 threads (fewer for small kernels) and at most four waves of resident blocks
// (the grid-stride loop covers the rest); reductions take one block per row, sized to the
// reduced length (32..512 threads, whole warps) so that short rows do not idle most threads.
// Vectorized kernels (cudaVectorWidth) size the grid by vectors, not elements.
CudaLaunchGeometry cudaLaunchGeometry(const Kernel& k, int multiProcessors,
                                      int maxThreadsPerBlock = 1024);

// Elements per thread per iteration of a pointwise CUDA kernel: 4 (float4 loads and stores) where
// the innermost dim is a multiple of 4 and some f32 access is contiguous along it from a
// 4-element boundary (such accesses are then 16-byte aligned when their buffer is; the kernel
// checks its buffers' alignment and otherwise runs its scalar loop), else 1. Geometry and
// rendering both follow it.
int cudaVectorWidth(const Kernel& k);

// A CPU reduction split along its reduced dim. A column-wise reduction (a few hundred channels
// of a channels-last tensor, each summed over thousands of pixels: squeeze-excite's mean, global
// pooling) split by channel makes every thread read part of every row, much of it written by
// another core (the producer splits rows): on 2 cores no faster than one thread, and half the
// speed of a split by rows (96 x 3136 in a harness: 135 us, 134 on one thread, 67 by rows).
// Split, its work units are `chunks` contiguous runs of rows instead: each unit reduces its rows
// into partial results in a scratch buffer of `scratchBytes` (64-byte aligned) that the runtime
// passes after the kernel's arguments, the units run in parallel, then one call with
// begin = chunks adds the partial results in chunk order and writes the row outputs. The chunks
// depend on the shape only, so the bits do not depend on the thread count. {0, 0}: not split
// (not column-wise, several stages, a max, an element output that reads the reduction, or
// fewer than 128 rows).
struct CpuRowSplit {
  int64_t chunks = 0;
  int64_t scratchBytes = 0;
};
CpuRowSplit cpuRowSplit(const Kernel& k);

std::string renderKernel(const Kernel& k, Dialect d);
// The prelude followed by every kernel: one translation unit.
std::string renderModule(std::span<const Kernel> kernels, Dialect d);

// The C type of an element of `t` in both dialects ("float", "long long", "bool", ...).
std::string_view cType(ScalarType t);

}  // namespace kiln::codegen
