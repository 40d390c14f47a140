// Helpers of the emu tests: hand-written CUDA C compiled for the emu device (its SIMT prelude
// and kiln's kernel prelude, as generated kernels are), buffers, and synchronous launches.
#pragma once

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "codegen/cpu_compiler.h"
#include "codegen/prelude.h"
#include "runtime/gpu/emu_device.h"
#include "runtime/gpu/gpu_backend.h"

namespace kiln::testing {

// The device under test: emu, or $KILN_TEST_DEVICE (scripts/gpu-check.sh sets cuda).
inline std::shared_ptr<runtime::Backend> testDevice() {
  const char* env = std::getenv("KILN_TEST_DEVICE");
  auto b = runtime::gpu::backendForDevice(env && *env ? env : "emu");
  INFO(b.status().message());
  REQUIRE(b.hasValue());
  return *b;
}

class EmuModule {
 public:
  struct Buffer {
    runtime::gpu::DevicePtr p = 0;
    size_t bytes = 0;
  };

  EmuModule(const std::string& source, const std::vector<std::string>& kernels,
            runtime::gpu::EmuOptions options = {})
      : dev_(runtime::gpu::makeEmuDevice(options)) {
    std::string src = std::string(runtime::gpu::emuKernelPrelude()) +
                      std::string(codegen::kernelPrelude()) + source;
    for (const std::string& k : kernels) src += "KILN_EMU_ENTRY(" + k + ")\n";
    auto obj = codegen::compileCpp(src, "emu_test", {});
    INFO(obj.status().message());
    REQUIRE(obj.hasValue());
    auto m = dev_->loadModule(obj->bytes, "emu_test");
    INFO(m.status().message());
    REQUIRE(m.hasValue());
    module_ = *m;
    for (const std::string& k : kernels) {
      auto f = dev_->function(module_, k);
      INFO(f.status().message());
      REQUIRE(f.hasValue());
      functions_[k] = *f;
    }
    auto s = dev_->createStream();
    REQUIRE(s.hasValue());
    stream_ = *s;
  }

  runtime::gpu::DeviceApi& device() const { return *dev_; }
  runtime::gpu::StreamHandle stream() const { return stream_; }

  template <class T>
  Buffer upload(const std::vector<T>& host) const {
    const size_t bytes = host.size() * sizeof(T);
    auto p = dev_->malloc(bytes);
    REQUIRE(p.hasValue());
    REQUIRE(dev_->copyToDevice(*p, host.data(), bytes, stream_).isOk());
    REQUIRE(dev_->synchronize(stream_).isOk());
    return {*p, bytes};
  }
  template <class T>
  void download(const Buffer& b, std::vector<T>& host) const {
    REQUIRE(host.size() * sizeof(T) == b.bytes);
    REQUIRE(dev_->copyToHost(host.data(), b.p, b.bytes, stream_).isOk());
    REQUIRE(dev_->synchronize(stream_).isOk());
  }
  // A kernel parameter holding the buffer's address (plus `offset` bytes).
  void* arg(const Buffer& b) const { return argAt(b, 0); }
  void* argAt(const Buffer& b, size_t offset) const {
    values_.push_back(b.p + offset);
    return &values_.back();
  }
  static int64_t bytes(const Buffer& b) { return static_cast<int64_t>(b.bytes); }

  // Enqueues a launch on `stream` (default: the module's).
  Status launchAsync(const std::string& kernel, uint32_t grid, uint32_t block,
                     std::vector<void*> params, std::vector<int64_t> argBytes,
                     runtime::gpu::StreamHandle stream = nullptr) const {
    return dev_->launch(functions_.at(kernel), {grid, 1, 1}, {block, 1, 1}, 0,
                        stream ? stream : stream_, params.data(), argBytes);
  }
  // Launches and waits; the launch's status, or the asynchronous error of the kernel.
  Status launch(const std::string& kernel, uint32_t grid, uint32_t block, std::vector<void*> params,
                std::vector<int64_t> argBytes) const {
    KILN_TRY(launchAsync(kernel, grid, block, std::move(params), std::move(argBytes)));
    return dev_->synchronize(stream_);
  }

 private:
  std::shared_ptr<runtime::gpu::DeviceApi> dev_;
  runtime::gpu::ModuleHandle module_ = nullptr;
  runtime::gpu::StreamHandle stream_ = nullptr;
  std::map<std::string, runtime::gpu::FunctionHandle> functions_;
  mutable std::deque<runtime::gpu::DevicePtr> values_;
};

}  // namespace kiln::testing
