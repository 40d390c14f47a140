// The real device: the CUDA driver API loaded with dlopen("libcuda.so.1"), so that kiln starts
// on machines without the driver (docs/toolchain.md).
#include <dlfcn.h>

#include <string>

#include "runtime/gpu/device_api.h"

namespace kiln::runtime::gpu {

namespace {

using CUresult = int;
using GetErrorNameFn = CUresult (*)(CUresult, const char**);
using InitFn = CUresult (*)(unsigned);
using DeviceGetCountFn = CUresult (*)(int*);

std::string errorName(void* lib, CUresult r) {
  auto name = reinterpret_cast<GetErrorNameFn>(::dlsym(lib, "cuGetErrorName"));
  const char* s = nullptr;
  if (name && name(r, &s) == 0 && s) return s;
  return "CUresult " + std::to_string(r);
}

}  // namespace

Expected<std::shared_ptr<DeviceApi>> openCudaDevice() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = ::dlerror();
    return notFound(std::string("no CUDA device: CUDA driver not found (") +
                    (why ? why : "libcuda.so.1 cannot be loaded") + ")");
  }
  auto init = reinterpret_cast<InitFn>(::dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<DeviceGetCountFn>(::dlsym(lib, "cuDeviceGetCount"));
  if (!init || !count)
    return notFound("no CUDA device: libcuda.so.1 lacks cuInit/cuDeviceGetCount");
  if (CUresult r = init(0); r != 0)
    return notFound("no CUDA device: the CUDA driver failed to initialize (" + errorName(lib, r) +
                    ")");
  int n = 0;
  if (CUresult r = count(&n); r != 0 || n == 0)
    return notFound("no CUDA device: the driver reports none (" +
                    (r != 0 ? errorName(lib, r) : std::string("0 devices")) + ")");
  return unimplemented(
      "the CUDA device was found, but kiln's driver-API device table is not built yet; use "
      "--device emu (the same kernels on the host)");
}

}  // namespace kiln::runtime::gpu
