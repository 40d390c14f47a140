#include "codegen/nvrtc_compiler.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <regex>

#if KILN_HAVE_NVRTC
#include <dlfcn.h>
#include <nvrtc.h>
#endif

namespace kiln::codegen {

std::vector<KernelResources> parsePtxasInfo(std::string_view log) {
  static const std::regex entryRe(R"(Compiling entry function '([^']+)')");
  static const std::regex propertiesRe(R"(Function properties for (\S+))");
  static const std::regex stackRe(
      R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  static const std::regex registersRe(R"(Used (\d+) registers)");
  static const std::regex barriersRe(R"(used (\d+) barriers)");
  static const std::regex sharedRe(R"((\d+) bytes smem)");

  std::vector<KernelResources> kernels;
  auto find = [&](const std::string& name) -> KernelResources* {
    for (KernelResources& k : kernels) {
      if (k.name == name) return &k;
    }
    return nullptr;
  };
  KernelResources* current = nullptr;       // The entry function ptxas is compiling.
  KernelResources* propertiesOf = nullptr;  // Whose "Function properties" come next.
  size_t start = 0;
  while (start < log.size()) {
    size_t end = log.find('\n', start);
    if (end == std::string_view::npos) end = log.size();
    const std::string line(log.substr(start, end - start));
    start = end + 1;
    std::smatch m;
    if (std::regex_search(line, m, entryRe)) {
      if (!find(m[1])) kernels.push_back(KernelResources{.name = m[1]});
      current = find(m[1]);
    } else if (std::regex_search(line, m, propertiesRe)) {
      // Device functions that are not entries get properties too; those are not kernels.
      propertiesOf = find(m[1]);
    } else if (std::regex_search(line, m, stackRe)) {
      if (propertiesOf) {
        propertiesOf->stackBytes = std::stol(m[1]);
        propertiesOf->spillStoreBytes = std::stol(m[2]);
        propertiesOf->spillLoadBytes = std::stol(m[3]);
      }
      propertiesOf = nullptr;
    } else if (std::regex_search(line, m, registersRe) && current) {
      current->registers = std::stoi(m[1]);
      if (std::regex_search(line, m, barriersRe)) current->barriers = std::stoi(m[1]);
      if (std::regex_search(line, m, sharedRe)) current->sharedBytes = std::stol(m[1]);
    }
  }
  return kernels;
}

#if KILN_HAVE_NVRTC

namespace {

// NVRTC is loaded with dlopen at its first use, like every CUDA library kiln uses: the `kiln`
// binary and programs embedding the compiler then start on machines without the CUDA toolkit
// (CPU-only use needs none of it), and CUDA compiles report why they cannot run.
#define KILN_NVRTC_FNS(X)      \
  X(nvrtcVersion)              \
  X(nvrtcGetErrorString)       \
  X(nvrtcCreateProgram)        \
  X(nvrtcDestroyProgram)       \
  X(nvrtcCompileProgram)       \
  X(nvrtcGetNumSupportedArchs) \
  X(nvrtcGetSupportedArchs)    \
  X(nvrtcGetProgramLogSize)    \
  X(nvrtcGetProgramLog)        \
  X(nvrtcGetPTXSize)           \
  X(nvrtcGetPTX)               \
  X(nvrtcGetCUBINSize)         \
  X(nvrtcGetCUBIN)

struct Nvrtc {
#define KILN_NVRTC_MEMBER(name) decltype(&::name) name = nullptr;
  KILN_NVRTC_FNS(KILN_NVRTC_MEMBER)
#undef KILN_NVRTC_MEMBER
  std::string missing;  // Why NVRTC is unavailable ("" when it loaded).
};

const Nvrtc& nvrtc() {
  static const Nvrtc n = [] {
    Nvrtc l;
    void* h = ::dlopen(KILN_NVRTC_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      l.missing = ::dlerror();
      // Found only by path: NVRTC loads its builtins library by name (it has no RUNPATH), so
      // that one is loaded from the same directory first and then found as already loaded.
      const std::string dir = std::string(KILN_CUDA_LIBRARY_DIR) + "/";
      (void)::dlopen((dir + KILN_NVRTC_BUILTINS_SONAME).c_str(), RTLD_NOW | RTLD_GLOBAL);
      h = ::dlopen((dir + KILN_NVRTC_SONAME).c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!h) {
        l.missing = "NVRTC not found (" + l.missing + "; " + ::dlerror() +
                    "): install the CUDA toolkit (scripts/install-deps.sh) to compile CUDA kernels";
        return l;
      }
    }
#define KILN_NVRTC_LOAD(name)                                                \
  l.name = reinterpret_cast<decltype(l.name)>(::dlsym(h, #name));            \
  if (!l.name) {                                                             \
    l.missing = std::string("NVRTC (" KILN_NVRTC_SONAME ") lacks ") + #name; \
    return l;                                                                \
  }
    KILN_NVRTC_FNS(KILN_NVRTC_LOAD)
#undef KILN_NVRTC_LOAD
    return l;
  }();
  return n;
}

// Calls an NVRTC function; a failure becomes a Status naming the call.
#define KILN_NVRTC(call)                                                     \
  do {                                                                       \
    nvrtcResult kiln_nvrtc_result_ = (nvrtc().call);                         \
    if (kiln_nvrtc_result_ != NVRTC_SUCCESS) {                               \
      return internalError(std::string("NVRTC: " #call " failed: ") +        \
                           nvrtc().nvrtcGetErrorString(kiln_nvrtc_result_)); \
    }                                                                        \
  } while (0)

// Destroys the program on every return path.
struct ProgramGuard {
  nvrtcProgram program = nullptr;
  ~ProgramGuard() {
    if (program) nvrtc().nvrtcDestroyProgram(&program);
  }
};

Expected<std::vector<int>> supportedArchs() {
  int count = 0;
  KILN_NVRTC(nvrtcGetNumSupportedArchs(&count));
  std::vector<int> archs(static_cast<size_t>(count));
  if (count > 0) KILN_NVRTC(nvrtcGetSupportedArchs(archs.data()));
  return archs;
}

Expected<std::string> programLog(nvrtcProgram program) {
  size_t size = 0;
  KILN_NVRTC(nvrtcGetProgramLogSize(program, &size));
  std::string log(size, '\0');
  if (size > 0) KILN_NVRTC(nvrtcGetProgramLog(program, log.data()));
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  return log;
}

}  // namespace

bool cudaCompilerAvailable() {
  return nvrtc().missing.empty();
}

std::string cudaCompilerIdentity() {
  if (!cudaCompilerAvailable()) return "none (" + nvrtc().missing + ")";
  int major = 0, minor = 0;
  if (nvrtc().nvrtcVersion(&major, &minor) != NVRTC_SUCCESS) return "nvrtc (version unknown)";
  return "nvrtc " + std::to_string(major) + "." + std::to_string(minor);
}

Expected<CudaPtx> compileCuda(std::string_view source, std::string_view name, int smArch,
                              const CudaCompileOptions& options) {
  if (!cudaCompilerAvailable())
    return unimplemented("cannot compile CUDA kernel '" + std::string(name) + "' for sm_" +
                         std::to_string(smArch) + ": " + nvrtc().missing);
  const auto start = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(std::vector<int> archs, supportedArchs());
  if (std::find(archs.begin(), archs.end(), smArch) == archs.end()) {
    std::string list;
    for (int a : archs) list += (list.empty() ? "" : " ") + std::to_string(a);
    return invalidArgument("CUDA compile of '" + std::string(name) + "': sm_" +
                           std::to_string(smArch) + " is not supported by " +
                           cudaCompilerIdentity() + "; supported: " + list);
  }

  const std::string fileName = name.empty() ? std::string("kernel.cu") : std::string(name);
  const std::string sourceText(source);
  ProgramGuard guard;
  KILN_NVRTC(nvrtcCreateProgram(&guard.program, sourceText.c_str(), fileName.c_str(), 0, nullptr,
                                nullptr));

  // compute_XX yields PTX only; sm_XX also runs ptxas, which is what reports resources. The
  // PTX is the same either way.
  std::vector<std::string> flags = {std::string("--gpu-architecture=") +
                                        (options.resourceUsage ? "sm_" : "compute_") +
                                        std::to_string(smArch),
                                    "--std=c++17"};
  if (options.resourceUsage) flags.push_back("--ptxas-options=-v");
#ifdef KILN_CUDA_INCLUDE_DIR
  // NVRTC searches no directory by default; cuda_fp16.h and cuda_bf16.h live here.
  std::error_code ec;
  if (std::filesystem::is_directory(KILN_CUDA_INCLUDE_DIR, ec)) {
    flags.push_back("--include-path=" KILN_CUDA_INCLUDE_DIR);
  }
#endif
  flags.insert(flags.end(), options.extraOptions.begin(), options.extraOptions.end());
  std::vector<const char*> flagPtrs;
  for (const std::string& f : flags) flagPtrs.push_back(f.c_str());

  const nvrtcResult result = nvrtc().nvrtcCompileProgram(
      guard.program, static_cast<int>(flagPtrs.size()), flagPtrs.data());
  KILN_ASSIGN_OR_RETURN(std::string log, programLog(guard.program));
  if (result != NVRTC_SUCCESS) {
    return invalidArgument("CUDA kernel '" + fileName + "' failed to compile for sm_" +
                           std::to_string(smArch) + " (" + nvrtc().nvrtcGetErrorString(result) +
                           "):\n" + log);
  }

  CudaPtx out;
  size_t ptxSize = 0;
  KILN_NVRTC(nvrtcGetPTXSize(guard.program, &ptxSize));
  out.ptx.assign(ptxSize, '\0');
  KILN_NVRTC(nvrtcGetPTX(guard.program, out.ptx.data()));
  while (!out.ptx.empty() && out.ptx.back() == '\0') out.ptx.pop_back();
  if (options.resourceUsage) {
    size_t cubinSize = 0;
    KILN_NVRTC(nvrtcGetCUBINSize(guard.program, &cubinSize));
    out.cubin.assign(cubinSize, '\0');
    if (cubinSize > 0) KILN_NVRTC(nvrtcGetCUBIN(guard.program, out.cubin.data()));
    out.resources = parsePtxasInfo(log);
  }
  out.name = fileName;
  out.smArch = smArch;
  out.log = std::move(log);
  out.compileMs =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return out;
}

#else  // !KILN_HAVE_NVRTC

bool cudaCompilerAvailable() {
  return false;
}

std::string cudaCompilerIdentity() {
  return "none (kiln was built without the CUDA toolkit)";
}

Expected<CudaPtx> compileCuda(std::string_view, std::string_view name, int smArch,
                              const CudaCompileOptions&) {
  return unimplemented("cannot compile CUDA kernel '" + std::string(name) + "' for sm_" +
                       std::to_string(smArch) +
                       ": kiln was built without the CUDA toolkit (NVRTC); install it and "
                       "reconfigure, or compile for the CPU");
}

#endif  // KILN_HAVE_NVRTC

}  // namespace kiln::codegen
