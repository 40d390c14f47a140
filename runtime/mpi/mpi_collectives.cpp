#include "runtime/mpi/mpi_collectives.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>

namespace kiln::runtime {

namespace {

std::string mpiError(const char* call, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(call) + " failed: " + std::string(text, static_cast<size_t>(len));
}

Expected<MPI_Datatype> mpiType(ir::DType dtype) {
  switch (dtype) {
    case ir::DType::kF32:
      return MPI_FLOAT;
    case ir::DType::kF64:
      return MPI_DOUBLE;
    case ir::DType::kI64:
      return MPI_INT64_T;
    default:
      return invalidArgument("MPI collectives sum f32, f64 or i64, not " +
                             std::string(ir::dtypeName(dtype)));
  }
}

// MPI counts are int: larger arrays go in pieces (a bucket never is that large; a broadcast of
// the parameters may be).
constexpr size_t kMaxCount = std::numeric_limits<int>::max() / 2;

class MpiCollectives final : public Collectives {
 public:
  MpiCollectives() {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  ~MpiCollectives() override {
    for (auto& [id, r] : pending_) MPI_Wait(&r, MPI_STATUS_IGNORE);
  }
  std::string_view name() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool hostMemory() const override { return true; }

  Status broadcast(void* data, size_t bytes, int root) override {
    auto* p = static_cast<char*>(data);
    for (size_t done = 0; done < bytes;) {
      const size_t n = std::min(bytes - done, kMaxCount);
      if (int rc = MPI_Bcast(p + done, static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD);
          rc != MPI_SUCCESS)
        return internalError(mpiError("MPI_Bcast", rc));
      done += n;
    }
    return Status::ok();
  }

  Status allReduceSum(void* data, size_t count, ir::DType dtype) override {
    KILN_ASSIGN_OR_RETURN(MPI_Datatype t, mpiType(dtype));
    auto* p = static_cast<char*>(data);
    for (size_t done = 0; done < count;) {
      const size_t n = std::min(count - done, kMaxCount);
      if (int rc = MPI_Allreduce(MPI_IN_PLACE, p + done * ir::dtypeSize(dtype), static_cast<int>(n),
                                 t, MPI_SUM, MPI_COMM_WORLD);
          rc != MPI_SUCCESS)
        return internalError(mpiError("MPI_Allreduce", rc));
      done += n;
    }
    return Status::ok();
  }

  Expected<int> startAllReduceSum(void* data, size_t count, ir::DType dtype) override {
    KILN_ASSIGN_OR_RETURN(MPI_Datatype t, mpiType(dtype));
    if (count > kMaxCount)
      return invalidArgument("an all-reduce of " + std::to_string(count) +
                             " elements: buckets hold at most " + std::to_string(kMaxCount));
    MPI_Request r;
    if (int rc = MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), t, MPI_SUM,
                                MPI_COMM_WORLD, &r);
        rc != MPI_SUCCESS)
      return internalError(mpiError("MPI_Iallreduce", rc));
    const int id = next_++;
    pending_.emplace(id, r);
    return id;
  }

  Expected<bool> test(int request) override {
    auto it = pending_.find(request);
    if (it == pending_.end())
      return internalError("MPI collectives: no request " + std::to_string(request) + " pending");
    int done = 0;
    if (int rc = MPI_Test(&it->second, &done, MPI_STATUS_IGNORE); rc != MPI_SUCCESS)
      return internalError(mpiError("MPI_Test", rc));
    if (done) pending_.erase(it);
    return done != 0;
  }

  Status wait(int request) override {
    auto it = pending_.find(request);
    if (it == pending_.end())
      return internalError("MPI collectives: no request " + std::to_string(request) + " pending");
    const int rc = MPI_Wait(&it->second, MPI_STATUS_IGNORE);
    pending_.erase(it);
    if (rc != MPI_SUCCESS) return internalError(mpiError("MPI_Wait", rc));
    return Status::ok();
  }

  [[noreturn]] void abort(const std::string& message, int exitCode) override {
    std::fprintf(stderr, "kiln: rank %d of %d failed, stopping every rank: %s\n", rank_, size_,
                 message.c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, exitCode);
    std::_Exit(exitCode);  // MPI_Abort does not return; in case an implementation does.
  }

 private:
  int rank_ = 0, size_ = 1;
  int next_ = 0;
  std::map<int, MPI_Request> pending_;
};

void finalize() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

Expected<std::shared_ptr<Collectives>> mpiCollectives(int* argc, char*** argv) {
  static std::mutex mu;
  std::lock_guard lock(mu);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided); rc != MPI_SUCCESS)
      return internalError(mpiError("MPI_Init_thread", rc));
    if (provided < MPI_THREAD_FUNNELED)
      return unimplemented("this MPI library does not support MPI_THREAD_FUNNELED");
    // Errors come back as codes (turned into Status), not as MPI's default abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    std::atexit(finalize);
  }
  return std::shared_ptr<Collectives>(std::make_shared<MpiCollectives>());
}

}  // namespace kiln::runtime
