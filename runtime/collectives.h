// Collectives: the communication of data-parallel training (one process per rank, each with a
// shard of every batch). A training step broadcasts the parameters from rank 0 once and sums the
// gradients over the ranks after each backward pass, in buckets started while the backward is
// still running (compiler/train.h). Two implementations: MPI on host memory (runtime/mpi/,
// OpenMPI; CPU and any backend whose results are copied to the host) and NCCL on device memory
// (runtime/gpu/nccl_collectives.h). Models read: PyTorch's ProcessGroup (c10d) and DDP reducer.
//
// Every rank must issue the same collectives in the same order (MPI and NCCL match them by
// order). Calls come from one thread at a time.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "ir/status.h"
#include "ir/types.h"

namespace kiln::runtime {

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether the pointers the calls take are host memory (MPI) rather than a device's (NCCL).
  virtual bool hostMemory() const = 0;

  // Blocking: `bytes` at `data` on every rank become rank `root`'s.
  virtual Status broadcast(void* data, size_t bytes, int root) = 0;
  // Blocking: `count` elements (f32, f64 or i64) at `data` become their sum over the ranks.
  virtual Status allReduceSum(void* data, size_t count, ir::DType dtype) = 0;

  // Non-blocking sum: starts it and returns a request number; `data` must stay untouched until
  // wait() returned. test() lets it progress (MPI over shared memory progresses only inside MPI
  // calls) and says whether it finished; wait() blocks until it did. A request is finished
  // exactly once, by a test() that returned true or by wait().
  virtual Expected<int> startAllReduceSum(void* data, size_t count, ir::DType dtype) = 0;
  virtual Expected<bool> test(int request) = 0;
  virtual Status wait(int request) = 0;

  // A rank that fails stops every rank: prints `message` on this rank and ends all processes
  // with `exitCode` (MPI_Abort). Does not return.
  [[noreturn]] virtual void abort(const std::string& message, int exitCode) = 0;
};

}  // namespace kiln::runtime
