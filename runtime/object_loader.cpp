#include "runtime/object_loader.h"

#include <mutex>
#include <vector>

#include <llvm/ADT/StringMap.h>
#include <llvm/ExecutionEngine/JITLink/JITLinkMemoryManager.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ObjectLinkingLayer.h>
#include <llvm/Object/ObjectFile.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/TargetParser/Host.h>
#include <llvm/TargetParser/Triple.h>
#include <llvm/TargetParser/X86TargetParser.h>

#include "runtime/object_check.h"

namespace kiln::runtime {
namespace {

void initializeNativeTarget() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
}

std::string errorText(llvm::Error error) {
  return llvm::toString(std::move(error));
}

}  // namespace

Status checkHostCompatible(std::string_view triple, std::string_view features) {
  const llvm::Triple host(llvm::sys::getProcessTriple());
  const llvm::Triple target{llvm::StringRef(triple.data(), triple.size())};
  if (target.getArch() != host.getArch()) {
    return invalidArgument("code compiled for '" + std::string(triple) +
                           "' cannot run on this machine ('" + host.str() +
                           "'); recompile the model here");
  }
  llvm::StringMap<bool> hostFeatures;
  // Where LLVM cannot list the host's features there is nothing to check against.
  if (!llvm::sys::getHostCPUFeatures(hostFeatures)) return Status::ok();
  if (host.getArch() == llvm::Triple::x86_64) {
    // LLVM does not report the baseline every x86-64 CPU has (x87, ...) as host features;
    // a portable target ("x86-64-v3") lists it.
    llvm::SmallVector<llvm::StringRef, 8> baseline;
    llvm::X86::getFeaturesForCPU("x86-64", baseline);
    for (llvm::StringRef f : baseline) hostFeatures.try_emplace(f, true);
  }
  std::string missing;
  size_t start = 0;
  while (start < features.size()) {
    size_t comma = features.find(',', start);
    if (comma == std::string_view::npos) comma = features.size();
    std::string_view f = features.substr(start, comma - start);
    if (f.size() > 1 && f[0] == '+') {
      auto it = hostFeatures.find(llvm::StringRef(f.data() + 1, f.size() - 1));
      if (it == hostFeatures.end() || !it->second) {
        missing += (missing.empty() ? "" : ", ") + std::string(f.substr(1));
      }
    }
    start = comma + 1;
  }
  if (!missing.empty()) {
    return invalidArgument("code was compiled for a CPU with features this CPU ('" +
                           llvm::sys::getHostCPUName().str() + "') lacks: " + missing +
                           "; recompile the model on this machine");
  }
  return Status::ok();
}

struct LoadedObjects::Impl {
  std::mutex mu;
  std::unique_ptr<llvm::orc::LLJIT> jit;  // Created by the first add().
  int numObjects = 0;
  // Errors ORC reports outside any call (e.g. an unresolved symbol while linking an object
  // for a lookup); lookup() attaches them to its error so the cause is not lost to stderr.
  std::shared_ptr<std::vector<std::string>> sessionErrors =
      std::make_shared<std::vector<std::string>>();
  std::shared_ptr<std::mutex> sessionErrorsMu = std::make_shared<std::mutex>();

  Status ensureJit() {
    if (jit) return Status::ok();
    initializeNativeTarget();
    auto builder = llvm::orc::JITTargetMachineBuilder::detectHost();
    if (!builder)
      return internalError("JIT: cannot detect the host: " + errorText(builder.takeError()));
    // JITLink, not LLVM 16's default RuntimeDyld on x86-64: RuntimeDyld's memory manager maps
    // an object's code and its constants separately, and where they land over 2 GB apart (a
    // process with PyTorch's and CUDA's libraries, a large machine) it truncates the code's
    // 32-bit PC-relative references to them without an error: a kernel then read another
    // page (a crash, or wrong constants). JITLink's in-process manager maps each object's
    // segments in one slab, and reaches other objects and libraries through GOT/PLT stubs.
    auto created =
        llvm::orc::LLJITBuilder()
            .setJITTargetMachineBuilder(std::move(*builder))
            .setObjectLinkingLayerCreator(
                [](llvm::orc::ExecutionSession& session,
                   const llvm::Triple&) -> llvm::Expected<std::unique_ptr<llvm::orc::ObjectLayer>> {
                  auto memory = llvm::jitlink::InProcessMemoryManager::Create();
                  if (!memory) return memory.takeError();
                  return std::make_unique<llvm::orc::ObjectLinkingLayer>(session,
                                                                         std::move(*memory));
                })
            .create();
    if (!created) return internalError("JIT: cannot create: " + errorText(created.takeError()));
    jit = std::move(*created);
    // Kernels call libm/libc (expf, memset); resolve them against what this process loaded.
    auto generator = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(
        jit->getDataLayout().getGlobalPrefix());
    if (!generator) {
      jit.reset();
      return internalError("JIT: cannot search the process's libraries: " +
                           errorText(generator.takeError()));
    }
    jit->getMainJITDylib().addGenerator(std::move(*generator));
    jit->getExecutionSession().setErrorReporter(
        [errors = sessionErrors, mu = sessionErrorsMu](llvm::Error error) {
          std::string text = errorText(std::move(error));
          std::lock_guard lock(*mu);
          errors->push_back(std::move(text));
        });
    return Status::ok();
  }

  std::string takeSessionErrors() {
    std::lock_guard lock(*sessionErrorsMu);
    std::string all;
    for (const std::string& e : *sessionErrors) all += (all.empty() ? "" : "; ") + e;
    sessionErrors->clear();
    return all;
  }
};

LoadedObjects::LoadedObjects() : impl_(std::make_unique<Impl>()) {}
LoadedObjects::~LoadedObjects() = default;
LoadedObjects::LoadedObjects(LoadedObjects&&) noexcept = default;
LoadedObjects& LoadedObjects::operator=(LoadedObjects&&) noexcept = default;

Status LoadedObjects::add(std::span<const std::byte> object, std::string name) {
  if (!impl_) impl_ = std::make_unique<Impl>();  // Reusing a moved-from instance.
  auto buffer = llvm::MemoryBuffer::getMemBufferCopy(
      llvm::StringRef(reinterpret_cast<const char*>(object.data()), object.size()), name);

  // Check before handing the bytes to the JIT: its linker trusts its input, and a truncated,
  // foreign or malformed object must be an error, not a crash or an abort inside LLVM.
  KILN_TRY(checkKernelObject(object, name));
  auto parsed = llvm::object::ObjectFile::createObjectFile(buffer->getMemBufferRef());
  if (!parsed) {
    return invalidArgument("object '" + name + "' (" + std::to_string(object.size()) +
                           " bytes) is not a valid object file: " + errorText(parsed.takeError()));
  }
  const llvm::object::ObjectFile& file = **parsed;
  if (!file.isELF() || !file.isRelocatableObject()) {
    return invalidArgument("object '" + name + "' is not a relocatable ELF object (" +
                           file.getFileFormatName().str() + ")");
  }
  const llvm::Triple host(llvm::sys::getProcessTriple());
  if (file.getArch() != host.getArch()) {
    return invalidArgument("object '" + name + "' is for " +
                           llvm::Triple::getArchTypeName(file.getArch()).str() +
                           ", this machine is " + host.getArchName().str());
  }

  std::lock_guard lock(impl_->mu);
  KILN_TRY(impl_->ensureJit());
  if (llvm::Error error = impl_->jit->addObjectFile(std::move(buffer))) {
    return invalidArgument("cannot load object '" + name + "': " + errorText(std::move(error)));
  }
  ++impl_->numObjects;
  return Status::ok();
}

Status LoadedObjects::define(std::string_view symbol, const void* address) {
  if (!impl_) impl_ = std::make_unique<Impl>();
  std::lock_guard lock(impl_->mu);
  KILN_TRY(impl_->ensureJit());
  llvm::orc::LLJIT& jit = *impl_->jit;
  llvm::orc::SymbolMap symbols;
  symbols[jit.mangleAndIntern(llvm::StringRef(symbol.data(), symbol.size()))] =
      llvm::JITEvaluatedSymbol(llvm::pointerToJITTargetAddress(address),
                               llvm::JITSymbolFlags::Exported);
  if (llvm::Error error = jit.getMainJITDylib().define(llvm::orc::absoluteSymbols(symbols)))
    return invalidArgument("cannot define symbol '" + std::string(symbol) +
                           "': " + errorText(std::move(error)));
  return Status::ok();
}

Expected<void*> LoadedObjects::lookup(std::string_view symbol) {
  llvm::orc::LLJIT* jit = nullptr;
  if (impl_) {
    std::lock_guard lock(impl_->mu);
    jit = impl_->jit.get();
  }
  if (!jit) return notFound("symbol '" + std::string(symbol) + "': no object is loaded");
  // LLJIT serializes linking itself; lookups may run concurrently with add().
  auto address = jit->lookup(llvm::StringRef(symbol.data(), symbol.size()));
  if (address) return address->toPtr<void*>();

  bool symbolMissing = false;
  std::string message;
  llvm::handleAllErrors(
      address.takeError(),
      [&](const llvm::orc::SymbolsNotFound& e) {
        for (const auto& name : e.getSymbols()) symbolMissing |= ((*name).str() == symbol);
        message = e.message();
      },
      [&](const llvm::ErrorInfoBase& e) { message = e.message(); });
  const std::string session = impl_->takeSessionErrors();
  if (symbolMissing) {
    return notFound("symbol '" + std::string(symbol) + "' is not defined by any loaded object");
  }
  return invalidArgument("symbol '" + std::string(symbol) + "' cannot be linked: " + message +
                         (session.empty() ? "" : " (" + session + ")"));
}

int LoadedObjects::numObjects() const {
  if (!impl_) return 0;
  std::lock_guard lock(impl_->mu);
  return impl_->numObjects;
}

}  // namespace kiln::runtime
