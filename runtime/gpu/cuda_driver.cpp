// The real device: the CUDA driver API loaded with dlopen("libcuda.so.1"), so that kiln starts
// on machines without the driver (docs/toolchain.md). cuda.h supplies the types only; no CUDA
// library is linked. Every call binds the device's primary context to the calling thread first
// (plans are called from many threads).
#include <dlfcn.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/gpu/cuda_libraries.h"
#include "runtime/gpu/device_api.h"
#include "runtime/gpu/nvjitlink.h"

#if KILN_HAVE_CUDA_HEADERS
#include <cuda.h>
#endif

namespace kiln::runtime::gpu {

namespace {

using Result = int;  // CUresult
using GetErrorNameFn = Result (*)(Result, const char**);

std::string errorName(void* lib, Result r) {
  auto name = reinterpret_cast<GetErrorNameFn>(::dlsym(lib, "cuGetErrorName"));
  const char* s = nullptr;
  if (name && name(r, &s) == 0 && s) return s;
  // The driver could not name it (the toolkit's stub library names nothing): the codes a
  // machine without a working driver returns.
  switch (r) {
    case 34:
      return "CUDA_ERROR_STUB_LIBRARY: the toolkit's stub libcuda, not a driver";
    case 35:
      return "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case 100:
      return "CUDA_ERROR_NO_DEVICE";
    case 101:
      return "CUDA_ERROR_INVALID_DEVICE";
    default:
      return "CUresult " + std::to_string(r);
  }
}

#if KILN_HAVE_CUDA_HEADERS

// The driver functions kiln calls, by their exported (versioned) names.
struct Driver {
  void* lib = nullptr;
#define KILN_CU_FN(name, symbol) decltype(&::name) name = nullptr;
#define KILN_CU_FNS(X)                                          \
  X(cuInit, "cuInit")                                           \
  X(cuDeviceGetCount, "cuDeviceGetCount")                       \
  X(cuDeviceGet, "cuDeviceGet")                                 \
  X(cuDeviceGetAttribute, "cuDeviceGetAttribute")               \
  X(cuDeviceGetName, "cuDeviceGetName")                         \
  X(cuDeviceTotalMem, "cuDeviceTotalMem_v2")                    \
  X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")       \
  X(cuCtxSetCurrent, "cuCtxSetCurrent")                         \
  X(cuMemAlloc, "cuMemAlloc_v2")                                \
  X(cuMemFree, "cuMemFree_v2")                                  \
  X(cuMemAllocHost, "cuMemAllocHost_v2")                        \
  X(cuMemFreeHost, "cuMemFreeHost")                             \
  X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2")                  \
  X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")                  \
  X(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2")                  \
  X(cuModuleLoadData, "cuModuleLoadData")                       \
  X(cuModuleUnload, "cuModuleUnload")                           \
  X(cuModuleGetFunction, "cuModuleGetFunction")                 \
  X(cuLaunchKernel, "cuLaunchKernel")                           \
  X(cuLaunchHostFunc, "cuLaunchHostFunc")                       \
  X(cuStreamCreate, "cuStreamCreate")                           \
  X(cuStreamDestroy, "cuStreamDestroy_v2")                      \
  X(cuStreamSynchronize, "cuStreamSynchronize")                 \
  X(cuEventCreate, "cuEventCreate")                             \
  X(cuEventDestroy, "cuEventDestroy_v2")                        \
  X(cuEventRecord, "cuEventRecord")                             \
  X(cuStreamWaitEvent, "cuStreamWaitEvent")                     \
  X(cuEventQuery, "cuEventQuery")                               \
  X(cuEventSynchronize, "cuEventSynchronize")                   \
  X(cuStreamBeginCapture, "cuStreamBeginCapture_v2")            \
  X(cuStreamEndCapture, "cuStreamEndCapture")                   \
  X(cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags") \
  X(cuGraphLaunch, "cuGraphLaunch")                             \
  X(cuGraphExecDestroy, "cuGraphExecDestroy")                   \
  X(cuGraphDestroy, "cuGraphDestroy")
  KILN_CU_FNS(KILN_CU_FN)
  KILN_CU_FN(cuEventElapsedTime, "")
#undef KILN_CU_FN

  // kNotFound naming the first missing function.
  Status load() {
#define KILN_CU_LOAD(name, symbol)                                                   \
  name = reinterpret_cast<decltype(name)>(::dlsym(lib, symbol));                     \
  if (!name)                                                                         \
    return notFound(std::string("no CUDA device: the CUDA driver lacks ") + symbol + \
                    " (update the NVIDIA driver)");
    KILN_CU_FNS(KILN_CU_LOAD)
#undef KILN_CU_LOAD
    // Timing: the _v2 entry point since CUDA 12.8, the original before.
    cuEventElapsedTime =
        reinterpret_cast<decltype(cuEventElapsedTime)>(::dlsym(lib, "cuEventElapsedTime_v2"));
    if (!cuEventElapsedTime)
      cuEventElapsedTime =
          reinterpret_cast<decltype(cuEventElapsedTime)>(::dlsym(lib, "cuEventElapsedTime"));
    if (!cuEventElapsedTime)
      return notFound(
          "no CUDA device: the CUDA driver lacks cuEventElapsedTime (update the NVIDIA driver)");
    return Status::ok();
  }
};

class CudaDevice final : public DeviceApi {
 public:
  CudaDevice(Driver d, CUcontext ctx, DeviceProps props)
      : d_(d), ctx_(ctx), props_(std::move(props)) {}

  const DeviceProps& props() const override { return props_; }
  std::string_view codeFormat() const override { return "cubin"; }

  Expected<DevicePtr> malloc(size_t bytes) override {
    KILN_TRY(bind());
    CUdeviceptr p = 0;
    const CUresult r = d_.cuMemAlloc(&p, std::max<size_t>(bytes, 1));
    if (r == CUDA_ERROR_OUT_OF_MEMORY)
      return resourceExhausted("out of device memory: allocating " +
                               bytesText(static_cast<int64_t>(bytes)) + " on " + props_.name +
                               " (" + bytesText(props_.totalMemory) + " in all)");
    KILN_TRY(check(r, "cuMemAlloc"));
    return static_cast<DevicePtr>(p);
  }
  Status free(DevicePtr p) override {
    KILN_TRY(bind());
    return check(d_.cuMemFree(static_cast<CUdeviceptr>(p)), "cuMemFree");
  }
  Expected<void*> mallocHost(size_t bytes) override {
    KILN_TRY(bind());
    void* p = nullptr;
    KILN_TRY(check(d_.cuMemAllocHost(&p, std::max<size_t>(bytes, 1)), "cuMemAllocHost"));
    return p;
  }
  void freeHost(void* p) override {
    if (bind().isOk()) (void)d_.cuMemFreeHost(p);
  }
  Status copyToDevice(DevicePtr dst, const void* src, size_t bytes, StreamHandle s) override {
    KILN_TRY(bind());
    return check(d_.cuMemcpyHtoDAsync(dst, src, bytes, stream(s)), "cuMemcpyHtoDAsync");
  }
  Status copyToHost(void* dst, DevicePtr src, size_t bytes, StreamHandle s) override {
    KILN_TRY(bind());
    return check(d_.cuMemcpyDtoHAsync(dst, src, bytes, stream(s)), "cuMemcpyDtoHAsync");
  }
  Status copyOnDevice(DevicePtr dst, DevicePtr src, size_t bytes, StreamHandle s) override {
    KILN_TRY(bind());
    return check(d_.cuMemcpyDtoDAsync(dst, src, bytes, stream(s)), "cuMemcpyDtoDAsync");
  }

  // A cubin as is; PTX (an artifact's fallback for another GPU) linked for this GPU by
  // nvJitLink, or where nvJitLink is missing JIT-compiled by the driver.
  Expected<ModuleHandle> loadModule(std::span<const std::byte> image,
                                    std::string_view name) override {
    KILN_TRY(bind());
    std::vector<std::byte> linked, text;
    if (isPtx(image)) {
      Expected<std::vector<std::byte>> cubin = linkPtxToCubin(image, props_.smArch, name);
      if (cubin) {
        linked = std::move(*cubin);
        image = linked;
      } else if (cubin.status().code() != ErrorCode::kNotFound) {
        return cubin.status();
      } else if (image.empty() || image.back() != std::byte{0}) {
        text.assign(image.begin(), image.end());  // The driver takes PTX as a C string.
        text.push_back(std::byte{0});
        image = text;
      }
    }
    CUmodule m = nullptr;
    KILN_TRY(check(d_.cuModuleLoadData(&m, image.data()),
                   "cuModuleLoadData (module '" + std::string(name) + "')"));
    return reinterpret_cast<ModuleHandle>(m);
  }
  void unloadModule(ModuleHandle m) override {
    if (bind().isOk()) (void)d_.cuModuleUnload(reinterpret_cast<CUmodule>(m));
  }
  Expected<FunctionHandle> function(ModuleHandle m, std::string_view kernel) override {
    KILN_TRY(bind());
    CUfunction f = nullptr;
    const std::string name(kernel);
    const CUresult r = d_.cuModuleGetFunction(&f, reinterpret_cast<CUmodule>(m), name.c_str());
    if (r == CUDA_ERROR_NOT_FOUND) return notFound("kernel '" + name + "' is not in the module");
    KILN_TRY(check(r, "cuModuleGetFunction '" + name + "'"));
    return reinterpret_cast<FunctionHandle>(f);
  }
  Status launch(FunctionHandle f, Dim3 grid, Dim3 block, size_t dynamicSharedBytes, StreamHandle s,
                void** params, std::span<const int64_t>) override {
    KILN_TRY(bind());
    return check(d_.cuLaunchKernel(reinterpret_cast<CUfunction>(f), grid.x, grid.y, grid.z, block.x,
                                   block.y, block.z, static_cast<unsigned>(dynamicSharedBytes),
                                   stream(s), params, nullptr),
                 "cuLaunchKernel");
  }
  Status launchHostFunc(StreamHandle s, HostFn fn, void* data) override {
    KILN_TRY(bind());
    return check(d_.cuLaunchHostFunc(stream(s), fn, data), "cuLaunchHostFunc");
  }

  // cuDNN and cuBLASLt (cuda_libraries.h) where they load; without them library ops run on the
  // host in stream order.
  bool hasLibraryCalls() const override { return libs_ != nullptr; }
  std::vector<ConvAlgo> convAlgorithms(const ConvDescriptor& c) override {
    if (!libs_ || !bind().isOk()) return {};
    return libs_->convAlgorithms(c);
  }
  bool takesEpilogue(const LibraryEpilogue& e) const override {
    return libs_ && libs_->takesEpilogue(e);
  }
  Status libraryCall(const LibraryCall& call, std::span<const DevicePtr> operands,
                     StreamHandle s) override {
    if (!libs_) return unimplemented("CUDA: " + call.describe() + ": " + libsMissing_);
    KILN_TRY(bind());
    return libs_->run(call, operands, stream(s));
  }

  // Opens cuBLASLt and cuDNN in this device's context; a failure is kept as the reason library
  // ops run on the host.
  void openLibraries() {
    if (!bind().isOk()) return;
    auto libs = openCudaLibraries([this](void* s, size_t bytes) { return workspace(s, bytes); });
    if (libs) {
      libs_ = std::move(*libs);
      props_.libraries = "cuBLASLt and cuDNN; " + libs_->checkFusedRelu(*this);
    } else {
      libsMissing_ = libs.status().message();
      props_.libraries = "none (library ops run on the host): " + libsMissing_;
    }
  }

  Expected<StreamHandle> createStream() override {
    KILN_TRY(bind());
    CUstream s = nullptr;
    KILN_TRY(check(d_.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate"));
    return reinterpret_cast<StreamHandle>(s);
  }
  void destroyStream(StreamHandle s) override {
    if (bind().isOk()) (void)d_.cuStreamDestroy(stream(s));
  }
  Status synchronize(StreamHandle s) override {
    KILN_TRY(bind());
    return check(d_.cuStreamSynchronize(stream(s)), "cuStreamSynchronize");
  }
  Expected<EventHandle> createEvent() override {
    KILN_TRY(bind());
    CUevent e = nullptr;
    KILN_TRY(check(d_.cuEventCreate(&e, CU_EVENT_DEFAULT), "cuEventCreate"));
    return reinterpret_cast<EventHandle>(e);
  }
  void destroyEvent(EventHandle e) override {
    if (bind().isOk()) (void)d_.cuEventDestroy(event(e));
  }
  Status recordEvent(EventHandle e, StreamHandle s) override {
    KILN_TRY(bind());
    return check(d_.cuEventRecord(event(e), stream(s)), "cuEventRecord");
  }
  Status waitEvent(StreamHandle s, EventHandle e) override {
    KILN_TRY(bind());
    return check(d_.cuStreamWaitEvent(stream(s), event(e), 0), "cuStreamWaitEvent");
  }
  Expected<bool> eventDone(EventHandle e) override {
    KILN_TRY(bind());
    const CUresult r = d_.cuEventQuery(event(e));
    if (r == CUDA_ERROR_NOT_READY) return false;
    KILN_TRY(check(r, "cuEventQuery"));
    return true;
  }
  Status synchronizeEvent(EventHandle e) override {
    KILN_TRY(bind());
    return check(d_.cuEventSynchronize(event(e)), "cuEventSynchronize");
  }
  Expected<float> elapsedMs(EventHandle start, EventHandle end) override {
    KILN_TRY(bind());
    float ms = 0;
    KILN_TRY(check(d_.cuEventElapsedTime(&ms, event(start), event(end)), "cuEventElapsedTime"));
    return ms;
  }

  Status beginCapture(StreamHandle s) override {
    KILN_TRY(bind());
    // Relaxed: a library call captured for the first time may allocate its workspace and a
    // host op its pinned buffers (neither is recorded; both outlive every graph using them).
    return check(d_.cuStreamBeginCapture(stream(s), CU_STREAM_CAPTURE_MODE_RELAXED),
                 "cuStreamBeginCapture");
  }
  Expected<GraphHandle> endCapture(StreamHandle s) override {
    KILN_TRY(bind());
    CUgraph g = nullptr;
    KILN_TRY(check(d_.cuStreamEndCapture(stream(s), &g), "cuStreamEndCapture"));
    CUgraphExec exec = nullptr;
    const Status st = check(d_.cuGraphInstantiateWithFlags(&exec, g, 0), "cuGraphInstantiate");
    (void)d_.cuGraphDestroy(g);
    KILN_TRY(st);
    return reinterpret_cast<GraphHandle>(exec);
  }
  Status launchGraph(GraphHandle g, StreamHandle s) override {
    KILN_TRY(bind());
    return check(d_.cuGraphLaunch(reinterpret_cast<CUgraphExec>(g), stream(s)), "cuGraphLaunch");
  }
  void destroyGraph(GraphHandle g) override {
    if (bind().isOk()) (void)d_.cuGraphExecDestroy(reinterpret_cast<CUgraphExec>(g));
  }

 private:
  static CUstream stream(StreamHandle s) { return reinterpret_cast<CUstream>(s); }
  static CUevent event(EventHandle e) { return reinterpret_cast<CUevent>(e); }

  Status bind() {
    thread_local CUcontext bound = nullptr;
    if (bound == ctx_) return Status::ok();
    KILN_TRY(check(d_.cuCtxSetCurrent(ctx_), "cuCtxSetCurrent"));
    bound = ctx_;
    return Status::ok();
  }
  Status check(CUresult r, const std::string& what) const {
    if (r == CUDA_SUCCESS) return Status::ok();
    return internalError("CUDA: " + what + " failed: " + errorName(d_.lib, r));
  }

  // Scratch memory for the libraries, one per stream (work on two streams may run at once). A
  // workspace outgrown is kept, not freed: graphs captured with it still use its address.
  Expected<DevicePtr> workspace(void* s, size_t bytes) {
    std::lock_guard lock(wsMu_);
    auto& [p, size] = workspaces_[s];
    if (size >= bytes) return p;
    if (p) retired_.push_back(p);
    p = 0;
    size = 0;
    KILN_ASSIGN_OR_RETURN(DevicePtr fresh, malloc(bytes));
    p = fresh;
    size = bytes;
    return p;
  }

  Driver d_;
  CUcontext ctx_;
  DeviceProps props_;
  std::unique_ptr<CudaLibraries> libs_;
  std::string libsMissing_ = "cuBLASLt/cuDNN were not opened";
  std::mutex wsMu_;
  std::map<void*, std::pair<DevicePtr, size_t>> workspaces_;
  std::vector<DevicePtr> retired_;
};

#endif  // KILN_HAVE_CUDA_HEADERS

}  // namespace

Expected<std::shared_ptr<DeviceApi>> openCudaDevice() {
  void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = ::dlerror();
    return notFound(std::string("no CUDA device: CUDA driver not found (") +
                    (why ? why : "libcuda.so.1 cannot be loaded") + ")");
  }
#if KILN_HAVE_CUDA_HEADERS
  Driver d;
  d.lib = lib;
  KILN_TRY(d.load());
  if (Result r = d.cuInit(0); r != CUDA_SUCCESS)
    return notFound("no CUDA device: the CUDA driver failed to initialize (" + errorName(lib, r) +
                    ")");
  int n = 0;
  if (Result r = d.cuDeviceGetCount(&n); r != CUDA_SUCCESS || n == 0)
    return notFound("no CUDA device: the driver reports none (" +
                    (r != CUDA_SUCCESS ? errorName(lib, r) : std::string("0 devices")) + ")");
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (Result r = d.cuDeviceGet(&dev, 0); r != CUDA_SUCCESS)
    return notFound("no CUDA device: cuDeviceGet failed (" + errorName(lib, r) + ")");
  if (Result r = d.cuDevicePrimaryCtxRetain(&ctx, dev); r != CUDA_SUCCESS)
    return notFound("no CUDA device: cannot create a context (" + errorName(lib, r) + ")");
  DeviceProps p;
  char name[256] = {};
  (void)d.cuDeviceGetName(name, sizeof name, dev);
  p.name = name;
  int major = 0, minor = 0, sms = 0, threads = 0, perSm = 0, shared = 0;
  (void)d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  (void)d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  (void)d.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
  (void)d.cuDeviceGetAttribute(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, dev);
  (void)d.cuDeviceGetAttribute(&perSm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev);
  (void)d.cuDeviceGetAttribute(&shared, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK, dev);
  size_t total = 0;
  (void)d.cuDeviceTotalMem(&total, dev);
  p.smArch = major * 10 + minor;
  p.multiProcessors = std::max(1, sms);
  p.maxThreadsPerBlock = threads > 0 ? threads : 1024;
  p.maxThreadsPerMultiProcessor = perSm > 0 ? perSm : 2048;
  p.sharedBytesPerBlock = shared > 0 ? shared : 48 * 1024;
  p.totalMemory = static_cast<int64_t>(total);
  auto device = std::make_shared<CudaDevice>(d, ctx, std::move(p));
  device->openLibraries();
  return std::shared_ptr<DeviceApi>(std::move(device));
#else
  return notFound(
      "no CUDA device: kiln was built without the CUDA toolkit's headers; rebuild on a machine "
      "with the toolkit (scripts/install-deps.sh)");
#endif
}

}  // namespace kiln::runtime::gpu
