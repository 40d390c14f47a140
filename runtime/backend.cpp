#include "runtime/backend.h"

#include <map>
#include <mutex>

#include "runtime/cpu/cpu_backend.h"

namespace kiln::runtime {

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = std::exchange(o.owner_, nullptr);
    handle_ = std::exchange(o.handle_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void* DeviceBuffer::detach() noexcept {
  owner_ = nullptr;
  bytes_ = 0;
  return std::exchange(handle_, nullptr);
}

void DeviceBuffer::reset() noexcept {
  if (owner_ && handle_) owner_->release(handle_, bytes_);
  owner_ = nullptr;
  handle_ = nullptr;
  bytes_ = 0;
}

namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<Backend>, std::less<>> backends;
};

Registry& registry() {
  static Registry* r = [] {
    auto* p = new Registry;  // Never destroyed: plans may outlive static destruction order.
    std::shared_ptr<Backend> cpu = makeCpuBackend();
    p->backends.emplace(std::string(cpu->name()), std::move(cpu));
    return p;
  }();
  return *r;
}

}  // namespace

Status registerBackend(std::shared_ptr<Backend> backend) {
  if (!backend) return invalidArgument("registerBackend: no backend");
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::string name(backend->name());
  if (r.backends.count(name))
    return invalidArgument("a backend named '" + name + "' is already registered");
  r.backends.emplace(std::move(name), std::move(backend));
  return Status::ok();
}

Expected<std::shared_ptr<Backend>> findBackend(std::string_view name) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  auto it = r.backends.find(name);
  if (it != r.backends.end()) return it->second;
  std::string names;
  for (const auto& [n, b] : r.backends) names += (names.empty() ? "" : ", ") + n;
  return notFound("no backend named '" + std::string(name) + "' (registered: " + names + ")");
}

std::vector<std::string> backendNames() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [n, b] : r.backends) names.push_back(n);
  return names;
}

std::shared_ptr<Backend> defaultBackend() {
  static const std::shared_ptr<Backend> cpu = *findBackend("cpu");
  return cpu;
}

}  // namespace kiln::runtime
