// Loads relocatable object files (generated CPU kernels, compiled in-process or read from the
// kernel cache or an AOT artifact) into an LLVM ORC JIT and hands out their extern "C"
// functions. Uses LLVM's object and ORC libraries only, never Clang.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "ir/status.h"

namespace kiln::runtime {

// Checks that code compiled for `triple` with the "+f,-g" `features` list can run here: the
// architecture matches and the host has every "+" feature. Run it before loading objects
// written on another machine (an AOT artifact), because the JIT cannot tell, and a missing
// instruction set is an illegal-instruction crash at the first call.
Status checkHostCompatible(std::string_view triple, std::string_view features);

// A set of loaded objects sharing one symbol namespace. Functions stay valid until the
// LoadedObjects is destroyed. All methods are safe to call from several threads.
class LoadedObjects {
 public:
  LoadedObjects();
  ~LoadedObjects();
  LoadedObjects(LoadedObjects&&) noexcept;
  LoadedObjects& operator=(LoadedObjects&&) noexcept;
  LoadedObjects(const LoadedObjects&) = delete;
  LoadedObjects& operator=(const LoadedObjects&) = delete;

  // Adds an ELF object for this machine's architecture (the bytes are copied). `name` labels
  // it in errors. A malformed object, one for another architecture, or one defining a symbol
  // that an earlier object defines is rejected. Undefined symbols are resolved at the first
  // lookup against earlier objects and the process (libc, libm).
  Status add(std::span<const std::byte> object, std::string name);

  // Defines `symbol` (extern "C") at `address` for the objects added after this call: a table
  // of host functions that generated code calls (the emu device's SIMT runtime).
  Status define(std::string_view symbol, const void* address);

  // The address of an extern "C" function or variable. kNotFound when no object defines it;
  // kInvalidArgument when it cannot be linked (e.g. it calls a function nobody defines).
  Expected<void*> lookup(std::string_view symbol);

  // Typed lookup, e.g. lookupFunction<void(const float*, float*, long)>("k").
  template <class Signature>
  Expected<Signature*> lookupFunction(std::string_view symbol) {
    Expected<void*> address = lookup(symbol);
    if (!address) return address.status();
    return reinterpret_cast<Signature*>(*address);
  }

  int numObjects() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::runtime
