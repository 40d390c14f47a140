// Something that the first caller to need it makes while later callers wait for it (a
// JitModule's compile for one signature, a StagedModule's stage): made outside the module's lock,
// so that other entries are made and used meanwhile.
#pragma once

#include <condition_variable>
#include <exception>
#include <mutex>
#include <new>
#include <string>

#include "ir/status.h"

namespace kiln::compiler {

class MadeOnce {
 public:
  // Runs `make` with its exceptions as errors naming `what` ("compiling for ..."): out of memory
  // (inside LLVM) is kResourceExhausted, anything else kInternal. An entry must end done whatever
  // happens, or its waiters wait forever.
  template <class Make>
  static Status guarded(const std::string& what, Make&& make) {
    try {
      return make();
    } catch (const std::bad_alloc&) {
      return resourceExhausted("out of memory while " + what);
    } catch (const std::exception& e) {
      return internalError(what + " threw: " + e.what());
    }
  }

  // Done, with how the making went: wakes every waiter. What was made must be stored before.
  void finish(Status status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = std::move(status);
      done_ = true;
    }
    cv_.notify_all();
  }

  // Blocks until finish; its status.
  Status wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_; });
    return status_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

}  // namespace kiln::compiler
