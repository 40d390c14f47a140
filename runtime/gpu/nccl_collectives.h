// Collectives over NCCL on device memory: the CUDA backend's data-parallel communication
// (runtime/collectives.h). NCCL (libnccl.so.2, shipped with CUDA 13) and the CUDA driver are loaded
// with dlopen, as the rest of the CUDA backend, so that kiln starts without them. Every rank uses
// the primary context of its `device` (the one the CUDA backend uses); rank 0's ncclUniqueId
// reaches the others through `bootstrap` (MPI). Pointers are device addresses (CUdeviceptr) of
// that context; each operation is enqueued on a stream of the collectives' own, and finished by
// test()/wait() (an event recorded after it) or, for the blocking calls, before they return.
#pragma once

#include <memory>

#include "runtime/collectives.h"

namespace kiln::runtime::gpu {

// kNotFound naming what is missing (no driver, no device, no NCCL) on a machine without them.
// Every rank returns the same success or failure, except when NCCL's own setup fails on one
// rank (ncclCommInitRank): then the others may wait in theirs, and the caller stops every rank
// with bootstrap->abort.
Expected<std::shared_ptr<Collectives>> ncclCollectives(std::shared_ptr<Collectives> bootstrap,
                                                       int device = 0);

}  // namespace kiln::runtime::gpu
