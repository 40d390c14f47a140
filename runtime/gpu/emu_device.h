// The emulation device: a DeviceApi whose memory is host memory handed out as device
// addresses, whose streams are in-order queues run by a worker thread each, and whose kernels
// are kiln's CUDA C compiled for the host with the emu prelude (emuKernelPrelude) and run by
// the SIMT engine (simt.h). For correctness, not speed — and stricter than a GPU where it can
// be: copies must stay inside live allocations, kernel accesses inside their arguments' bytes,
// freeing an unknown address is an error, and allocations past the memory limit fail with the
// amounts named.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "runtime/gpu/device_api.h"

namespace kiln::runtime::gpu {

struct EmuOptions {
  // Device memory; 0 takes $KILN_EMU_MEMORY_MB, else 16 GiB.
  int64_t memoryBytes = 0;
  // What the device reports (launch geometry sizes grids by the multiprocessor count).
  int multiProcessors = 4;
  int smArch = 90;
};

std::shared_ptr<DeviceApi> makeEmuDevice(const EmuOptions& options = {});

// Statistics of an emu device, for tests: launches run, graphs launched, live allocations.
struct EmuCounters {
  int64_t kernelLaunches = 0;
  int64_t graphLaunches = 0;
  int64_t hostFunctions = 0;
  int64_t libraryCalls = 0;
  int64_t liveAllocations = 0;
  int64_t bytesInUse = 0;
  int64_t hostAllocations = 0;  // mallocHost calls (pinned memory on a GPU).
};
// kInvalidArgument when `device` is not an emu device.
Expected<EmuCounters> emuCounters(const DeviceApi& device);

// The source placed before a module of kiln's CUDA C compiled for the emu device: the SIMT
// environment (threadIdx, __syncthreads, shuffles, __shared__ arrays, bound-checked kernel
// arguments) and KILN_EMU_ENTRY(name), which defines the entry the device launches.
std::string_view emuKernelPrelude();

}  // namespace kiln::runtime::gpu
