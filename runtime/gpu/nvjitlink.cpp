#include "runtime/gpu/nvjitlink.h"

#include <dlfcn.h>

#include <cstring>
#include <mutex>
#include <string>

#include "runtime/gpu/cuda_libraries.h"

#if KILN_HAVE_CUDA_HEADERS
#include <nvJitLink.h>
#endif

namespace kiln::runtime::gpu {

bool isPtx(std::span<const std::byte> image) {
  // PTX is text: it starts (after blank space) with a comment or a directive (".version").
  for (std::byte b : image) {
    const char c = static_cast<char>(b);
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    return c == '/' || c == '.';
  }
  return false;
}

#if KILN_HAVE_CUDA_HEADERS

namespace {

// nvJitLink's entry points are versioned by the header (nvJitLinkCreate is an inline call of
// __nvJitLinkCreate_13_0): the library must be the toolkit's major version.
#define KILN_JITLINK_FNS(X)                        \
  X(create, __nvJitLinkCreate_13_0)                \
  X(destroy, __nvJitLinkDestroy_13_0)              \
  X(addData, __nvJitLinkAddData_13_0)              \
  X(complete, __nvJitLinkComplete_13_0)            \
  X(cubinSize, __nvJitLinkGetLinkedCubinSize_13_0) \
  X(cubin, __nvJitLinkGetLinkedCubin_13_0)         \
  X(errorLogSize, __nvJitLinkGetErrorLogSize_13_0) \
  X(errorLog, __nvJitLinkGetErrorLog_13_0)

struct JitLink {
#define KILN_JITLINK_MEMBER(member, symbol) decltype(&::symbol) member = nullptr;
  KILN_JITLINK_FNS(KILN_JITLINK_MEMBER)
#undef KILN_JITLINK_MEMBER
  std::string missing;  // Why it is unavailable.
};

const JitLink& jitLink() {
  static const JitLink j = [] {
    JitLink l;
    void* h = openCudaLibrary("libnvJitLink.so.13", l.missing);
    if (!h) {
      l.missing = "nvJitLink not found: " + l.missing;
      return l;
    }
#define KILN_JITLINK_LOAD(member, symbol)                                      \
  l.member = reinterpret_cast<decltype(l.member)>(::dlsym(h, #symbol));        \
  if (!l.member) {                                                             \
    l.missing = "nvJitLink lacks " #symbol " (a CUDA 13 nvJitLink is needed)"; \
    return l;                                                                  \
  }
    KILN_JITLINK_FNS(KILN_JITLINK_LOAD)
#undef KILN_JITLINK_LOAD
    return l;
  }();
  return j;
}

}  // namespace

Expected<std::vector<std::byte>> linkPtxToCubin(std::span<const std::byte> ptx, int smArch,
                                                std::string_view name) {
  const JitLink& j = jitLink();
  if (!j.missing.empty()) return notFound(j.missing);
  size_t size = ptx.size();
  while (size > 0 && ptx[size - 1] == std::byte{0}) --size;
  const std::string arch = "-arch=sm_" + std::to_string(smArch);
  const char* options[] = {arch.c_str()};
  nvJitLinkHandle h = nullptr;
  struct Destroy {  // A failed create may still leave a handle (with its error log).
    const JitLink& j;
    nvJitLinkHandle& h;
    ~Destroy() {
      if (h) j.destroy(&h);
    }
  } destroy{j, h};
  const std::string label(name);
  nvJitLinkResult r = j.create(&h, 1, options);
  if (r == NVJITLINK_ERROR_UNRECOGNIZED_ARCH || r == NVJITLINK_ERROR_UNSUPPORTED_ARCH ||
      r == NVJITLINK_ERROR_UNRECOGNIZED_OPTION)
    // A GPU newer than this linker: the caller may still hand the PTX to the driver's JIT.
    return notFound("nvJitLink does not know sm_" + std::to_string(smArch) + " (nvJitLinkResult " +
                    std::to_string(static_cast<int>(r)) + ")");
  if (r == NVJITLINK_SUCCESS)
    r = j.addData(h, NVJITLINK_INPUT_PTX, ptx.data(), size, label.c_str());
  if (r == NVJITLINK_SUCCESS) r = j.complete(h);
  if (r != NVJITLINK_SUCCESS) {
    size_t logSize = 0;
    std::string log;
    if (h && j.errorLogSize(h, &logSize) == NVJITLINK_SUCCESS && logSize > 1) {
      log.resize(logSize);
      if (j.errorLog(h, log.data()) != NVJITLINK_SUCCESS) log.clear();
      while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
    }
    return invalidArgument("nvJitLink: module '" + label + "' does not link for sm_" +
                           std::to_string(smArch) + " (nvJitLinkResult " +
                           std::to_string(static_cast<int>(r)) + ")" +
                           (log.empty() ? "" : ": " + log));
  }
  size_t bytes = 0;
  if (j.cubinSize(h, &bytes) != NVJITLINK_SUCCESS || bytes == 0)
    return internalError("nvJitLink: module '" + label + "' linked to an empty cubin");
  std::vector<std::byte> cubin(bytes);
  if (j.cubin(h, cubin.data()) != NVJITLINK_SUCCESS)
    return internalError("nvJitLink: cannot read the cubin of module '" + label + "'");
  return cubin;
}

#else

Expected<std::vector<std::byte>> linkPtxToCubin(std::span<const std::byte>, int, std::string_view) {
  return notFound("kiln was built without the CUDA toolkit's headers (no nvJitLink)");
}

#endif

}  // namespace kiln::runtime::gpu
