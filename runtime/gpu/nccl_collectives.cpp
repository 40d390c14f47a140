#include "runtime/gpu/nccl_collectives.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <map>

#include "runtime/gpu/cuda_libraries.h"

#if KILN_HAVE_CUDA_HEADERS
#include <cuda.h>
#include <nccl.h>
#endif

namespace kiln::runtime::gpu {

#if KILN_HAVE_CUDA_HEADERS

namespace {

// The driver and NCCL entry points the collectives call.
struct Api {
  void* cuda = nullptr;
  void* nccl = nullptr;
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuStreamCreate)(CUstream*, unsigned);
  CUresult (*cuStreamDestroy)(CUstream);
  CUresult (*cuStreamSynchronize)(CUstream);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventDestroy)(CUevent);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventQuery)(CUevent);
  CUresult (*cuEventSynchronize)(CUevent);
  ncclResult_t (*ncclGetUniqueId)(ncclUniqueId*);
  ncclResult_t (*ncclCommInitRank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*ncclCommDestroy)(ncclComm_t);
  ncclResult_t (*ncclCommAbort)(ncclComm_t);
  ncclResult_t (*ncclAllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t,
                                cudaStream_t);
  ncclResult_t (*ncclBroadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t,
                                cudaStream_t);
  const char* (*ncclGetErrorString)(ncclResult_t);

  Status load() {
    std::string tried;
    cuda = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) return notFound(std::string("NCCL collectives need a CUDA device: ") + ::dlerror());
    nccl = openCudaLibrary("libnccl.so.2", tried);
    if (!nccl) return notFound("NCCL collectives: libnccl.so.2 not found (" + tried + ")");
#define KILN_LOAD(lib, name)                                    \
  name = reinterpret_cast<decltype(name)>(::dlsym(lib, #name)); \
  if (!name)                                                    \
    return notFound(std::string("NCCL collectives: ") +         \
                    (lib == cuda ? "the CUDA "                  \
                                   "driver"                     \
                                 : "NCCL") +                    \
                    " lacks " #name);
    KILN_LOAD(cuda, cuInit)
    KILN_LOAD(cuda, cuDeviceGet)
    KILN_LOAD(cuda, cuDevicePrimaryCtxRetain)
    KILN_LOAD(cuda, cuDevicePrimaryCtxRelease)
    KILN_LOAD(cuda, cuCtxSetCurrent)
    KILN_LOAD(cuda, cuStreamCreate)
    KILN_LOAD(cuda, cuStreamDestroy)
    KILN_LOAD(cuda, cuStreamSynchronize)
    KILN_LOAD(cuda, cuEventCreate)
    KILN_LOAD(cuda, cuEventDestroy)
    KILN_LOAD(cuda, cuEventRecord)
    KILN_LOAD(cuda, cuEventQuery)
    KILN_LOAD(cuda, cuEventSynchronize)
    KILN_LOAD(nccl, ncclGetUniqueId)
    KILN_LOAD(nccl, ncclCommInitRank)
    KILN_LOAD(nccl, ncclCommDestroy)
    KILN_LOAD(nccl, ncclCommAbort)
    KILN_LOAD(nccl, ncclAllReduce)
    KILN_LOAD(nccl, ncclBroadcast)
    KILN_LOAD(nccl, ncclGetErrorString)
#undef KILN_LOAD
    return Status::ok();
  }
};

Expected<ncclDataType_t> ncclType(ir::DType t) {
  switch (t) {
    case ir::DType::kF32:
      return ncclFloat32;
    case ir::DType::kF64:
      return ncclFloat64;
    case ir::DType::kI64:
      return ncclInt64;
    case ir::DType::kF16:
      return ncclFloat16;
    case ir::DType::kBF16:
      return ncclBfloat16;
    default:
      return invalidArgument("NCCL collectives sum f32, f64, i64, f16 or bf16, not " +
                             std::string(ir::dtypeName(t)));
  }
}

class NcclCollectives final : public Collectives {
 public:
  NcclCollectives(std::unique_ptr<Api> api, std::shared_ptr<Collectives> bootstrap, CUdevice dev,
                  CUcontext ctx, CUstream stream, ncclComm_t comm)
      : api_(std::move(api)),
        bootstrap_(std::move(bootstrap)),
        dev_(dev),
        ctx_(ctx),
        stream_(stream),
        comm_(comm) {}
  ~NcclCollectives() override {
    (void)api_->cuCtxSetCurrent(ctx_);
    (void)api_->cuStreamSynchronize(stream_);
    for (auto& [id, e] : pending_) (void)api_->cuEventDestroy(e);
    (void)api_->ncclCommDestroy(comm_);
    (void)api_->cuStreamDestroy(stream_);
    (void)api_->cuDevicePrimaryCtxRelease(dev_);
  }
  std::string_view name() const override { return "nccl"; }
  int rank() const override { return bootstrap_->rank(); }
  int size() const override { return bootstrap_->size(); }
  bool hostMemory() const override { return false; }

  Status broadcast(void* data, size_t bytes, int root) override {
    KILN_TRY(current());
    KILN_TRY(check(api_->ncclBroadcast(data, data, bytes, ncclUint8, root, comm_, stream()),
                   "ncclBroadcast"));
    return drv(api_->cuStreamSynchronize(stream_), "cuStreamSynchronize");
  }
  Status allReduceSum(void* data, size_t count, ir::DType dtype) override {
    KILN_ASSIGN_OR_RETURN(int r, startAllReduceSum(data, count, dtype));
    return wait(r);
  }
  Expected<int> startAllReduceSum(void* data, size_t count, ir::DType dtype) override {
    KILN_TRY(current());
    KILN_ASSIGN_OR_RETURN(ncclDataType_t t, ncclType(dtype));
    KILN_TRY(check(api_->ncclAllReduce(data, data, count, t, ncclSum, comm_, stream()),
                   "ncclAllReduce"));
    CUevent e;
    KILN_TRY(drv(api_->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate"));
    if (Status st = drv(api_->cuEventRecord(e, stream_), "cuEventRecord"); !st) {
      (void)api_->cuEventDestroy(e);
      return st;
    }
    const int id = next_++;
    pending_.emplace(id, e);
    return id;
  }
  Expected<bool> test(int request) override {
    auto it = pending_.find(request);
    if (it == pending_.end())
      return internalError("NCCL collectives: no request " + std::to_string(request) + " pending");
    const CUresult r = api_->cuEventQuery(it->second);
    if (r == CUDA_ERROR_NOT_READY) return false;
    (void)api_->cuEventDestroy(it->second);
    pending_.erase(it);
    KILN_TRY(drv(r, "cuEventQuery"));
    return true;
  }
  Status wait(int request) override {
    auto it = pending_.find(request);
    if (it == pending_.end())
      return internalError("NCCL collectives: no request " + std::to_string(request) + " pending");
    const CUresult r = api_->cuEventSynchronize(it->second);
    (void)api_->cuEventDestroy(it->second);
    pending_.erase(it);
    return drv(r, "cuEventSynchronize");
  }
  [[noreturn]] void abort(const std::string& message, int exitCode) override {
    (void)api_->ncclCommAbort(comm_);  // Frees ranks blocked in NCCL kernels.
    bootstrap_->abort(message, exitCode);
    std::_Exit(exitCode);  // Not reached: the bootstrap's abort ends the process.
  }

 private:
  cudaStream_t stream() const { return reinterpret_cast<cudaStream_t>(stream_); }
  Status current() { return drv(api_->cuCtxSetCurrent(ctx_), "cuCtxSetCurrent"); }
  Status check(ncclResult_t r, const char* call) {
    if (r == ncclSuccess) return Status::ok();
    return internalError(std::string(call) + " failed: " + api_->ncclGetErrorString(r));
  }
  static Status drv(CUresult r, const char* call) {
    if (r == CUDA_SUCCESS) return Status::ok();
    return internalError(std::string(call) + " failed with CUDA error " + std::to_string(r));
  }

  std::unique_ptr<Api> api_;
  std::shared_ptr<Collectives> bootstrap_;
  CUdevice dev_;
  CUcontext ctx_;
  CUstream stream_;
  ncclComm_t comm_;
  int next_ = 0;
  std::map<int, CUevent> pending_;
};

}  // namespace

Expected<std::shared_ptr<Collectives>> ncclCollectives(std::shared_ptr<Collectives> bootstrap,
                                                       int device) {
  auto api = std::make_unique<Api>();
  // Every rank learns whether all could load NCCL before any waits in the unique id's broadcast.
  Status loaded = api->load();
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  if (loaded) {
    if (CUresult r = api->cuInit(0); r != CUDA_SUCCESS)
      loaded = notFound("NCCL collectives need a CUDA device: cuInit failed with CUDA error " +
                        std::to_string(r));
    else if ((r = api->cuDeviceGet(&dev, device)) != CUDA_SUCCESS)
      loaded = notFound("NCCL collectives: no CUDA device " + std::to_string(device));
    else if ((r = api->cuDevicePrimaryCtxRetain(&ctx, dev)) != CUDA_SUCCESS)
      loaded = notFound("NCCL collectives: cuDevicePrimaryCtxRetain failed with CUDA error " +
                        std::to_string(r));
  }
  int64_t failed = loaded ? 0 : 1;
  KILN_TRY(bootstrap->allReduceSum(&failed, 1, ir::DType::kI64));
  if (!loaded) return loaded;
  auto release = [&] { (void)api->cuDevicePrimaryCtxRelease(dev); };
  if (failed > 0) {
    release();
    return notFound(std::to_string(failed) + " rank(s) could not load NCCL or their CUDA device");
  }
  (void)api->cuCtxSetCurrent(ctx);
  // Rank 0's id with a flag saying whether it could make one, then every rank's stream: each
  // failure is agreed on before anyone waits for a rank that gave up.
  struct {
    ncclUniqueId id{};
    int32_t ok = 1;
  } shared;
  Status local = Status::ok();
  if (bootstrap->rank() == 0) {
    if (ncclResult_t r = api->ncclGetUniqueId(&shared.id); r != ncclSuccess) {
      shared.ok = 0;
      local = internalError(std::string("ncclGetUniqueId failed: ") + api->ncclGetErrorString(r));
    }
  }
  KILN_TRY(bootstrap->broadcast(&shared, sizeof shared, 0));
  CUstream stream = nullptr;
  if (!shared.ok) {
    if (local) local = internalError("rank 0 could not make the NCCL unique id");
  } else if (CUresult r = api->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING); r != CUDA_SUCCESS) {
    local = internalError("cuStreamCreate failed with CUDA error " + std::to_string(r));
  }
  int64_t failures = local ? 0 : 1;
  KILN_TRY(bootstrap->allReduceSum(&failures, 1, ir::DType::kI64));
  if (failures > 0) {
    if (stream) (void)api->cuStreamDestroy(stream);
    release();
    if (!local) return local;
    return internalError(std::to_string(failures) + " rank(s) could not set up NCCL");
  }
  // A rank whose ncclCommInitRank fails leaves the others waiting inside theirs: the caller
  // stops every rank (Collectives::abort on the bootstrap) when this returns an error.
  ncclComm_t comm = nullptr;
  const ncclUniqueId& id = shared.id;
  if (ncclResult_t r = api->ncclCommInitRank(&comm, bootstrap->size(), id, bootstrap->rank());
      r != ncclSuccess) {
    (void)api->cuStreamDestroy(stream);
    release();
    return internalError(std::string("ncclCommInitRank failed: ") + api->ncclGetErrorString(r));
  }
  return std::shared_ptr<Collectives>(std::make_shared<NcclCollectives>(
      std::move(api), std::move(bootstrap), dev, ctx, stream, comm));
}

#else

Expected<std::shared_ptr<Collectives>> ncclCollectives(std::shared_ptr<Collectives> bootstrap,
                                                       int device) {
  (void)bootstrap;
  (void)device;
  return notFound("NCCL collectives: this kiln was built without the CUDA headers");
}

#endif

}  // namespace kiln::runtime::gpu
