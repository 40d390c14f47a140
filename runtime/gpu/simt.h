// The emulation device's SIMT engine: runs a kernel compiled for the host over a grid with real
// CUDA semantics. Each block's threads are fibers (one stack each) on the calling OS thread,
// scheduled cooperatively: a thread runs until it reaches __syncthreads, a warp shuffle or its
// end; a barrier releases when every thread of the block (a shuffle: every lane of the warp)
// has reached it. Fibers, not barrier-separated loops over threads (pocl's work-item loops),
// because the kernels run exactly the CUDA C that NVRTC compiles — barriers inside helper
// functions and loops included — with no transformation that could itself be wrong; the cost
// (a context switch per thread per barrier, tens of nanoseconds) is acceptable for a device
// that exists for correctness.
//
// Stricter than a GPU: every global access is checked against its argument's bytes, a barrier
// that only part of a block reaches (or a shuffle with exited lanes) is an error, and an error
// names the kernel, block and thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "ir/status.h"
#include "runtime/gpu/device_api.h"
#include "runtime/gpu/emu_abi.h"

namespace kiln::runtime::gpu {

// An entry point of an emu module: KILN_EMU_ENTRY's wrapper of one kernel, taking
// cuLaunchKernel's parameter array.
using EmuEntry = void (*)(void** params);

struct SimtLaunch {
  std::string kernel;  // For errors.
  EmuEntry entry = nullptr;
  Dim3 grid, block;
  size_t dynamicSharedBytes = 0;
  int64_t sharedLimit = 48 * 1024;
  int maxThreadsPerBlock = 1024;
  void** params = nullptr;
  // Per parameter: [begin, end) of the bytes it may touch (pointer arguments), else empty.
  std::span<const std::pair<char*, char*>> ranges;
};

// Runs every block of the grid on the calling thread. The first failure (out-of-bounds access,
// divergent barrier, deadlock, too much shared memory) stops the launch and is returned.
Status runGrid(const SimtLaunch& launch);

// The table emu kernels call (bound to the symbol `kiln_emu_runtime` when a module loads).
const kiln_emu_rt& emuRuntime();

}  // namespace kiln::runtime::gpu
