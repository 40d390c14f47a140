// C++ source -> relocatable ELF object bytes, compiled in-process with Clang/LLVM 16 for the
// host CPU. The bytes are loaded by runtime/object_loader.h or stored in the kernel cache.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/status.h"

namespace kiln::codegen {

// LLVM's name for the CPU of this machine ("rocketlake") and its feature list as LLVM writes
// it ("+avx2,+avx512f,...,-amx-tile"), sorted so that it is stable for cache keys. The name is
// what LLVM reports: "generic" for a CPU that LLVM 16 does not know (a newer generation), which
// Clang refuses as a target; hostTarget() is what code is compiled for. The environment
// variable KILN_SIMULATE_HOST_CPU replaces the name (tests simulate an unknown CPU with it).
const std::string& hostCpuName();
const std::string& hostCpuFeatures();
// LLVM's target triple for this machine ("x86_64-pc-linux-gnu"), which compiled objects target.
const std::string& hostTriple();

// What generated code is compiled for: a CPU name Clang accepts, the features on top of its
// defaults, and the CPU to tune for.
struct CpuTarget {
  std::string cpu;       // e.g. "znver4", "x86-64-v3"
  std::string features;  // "+f,-g" list, sorted; for a named CPU every feature it implies.
  std::string tuneCpu;   // Usually `cpu`; "generic" for a host LLVM does not know.
  // How the target was chosen, for logs ("host CPU 'generic' is unknown to LLVM 16: ...").
  std::string note;
};

// The target for this machine. Where LLVM knows the host CPU, its name and the host's feature
// list; otherwise the highest x86-64 microarchitecture level (x86-64-v4, -v3, -v2, x86-64)
// whose features the host has, plus every host feature, tuned for "generic": the code uses
// every instruction the machine has even when LLVM cannot name it.
const CpuTarget& hostTarget();

// The target a user names: "" takes $KILN_TARGET_CPU, else "native"; "native" (or "host") is
// hostTarget(); any other name must be a CPU Clang 16 knows for x86-64 ("x86-64-v3",
// "skylake-avx512", "znver3", ...) and gives exactly the features that CPU implies, so that
// the code runs on every machine that has them (e.g. one x86-64-v3 artifact for all AVX2
// machines). An unknown name is kInvalidArgument listing the accepted ones.
Expected<CpuTarget> resolveCpuTarget(std::string_view name);

// The full "+f,..." list implied by a CPU name Clang knows (sorted), or empty for an unknown
// name.
std::string cpuImpliedFeatures(std::string_view cpu);

struct CpuCompileOptions {
  // LLVM CPU name; code is tuned for `tuneCpu` and may use every instruction `cpu` has.
  std::string cpu = hostTarget().cpu;
  // Comma-separated "+feature"/"-feature" list applied on top of the CPU's defaults; empty
  // means the CPU's defaults. The host list includes "-" entries for what this machine lacks.
  std::string features = hostTarget().features;
  std::string tuneCpu = hostTarget().tuneCpu;  // Empty: `cpu`.
  int optLevel = 3;                            // 0..3, as -O0..-O3.
  // Fuse a*b+c into one FMA instruction. Off by default so that generated kernels round
  // exactly as the reference kernels do (compiled without FMA); turn on for compute-bound
  // kernels where the last bit does not matter.
  bool fpContract = false;
  // More Clang driver flags (e.g. "-ffp-contract=off", "-DKILN_DEBUG"). They are part of
  // compilerIdentity(), hence of the cache key.
  std::vector<std::string> extraArgs;
};

// One compiled module: the object file and what it was compiled for.
struct CpuObject {
  std::vector<std::byte> bytes;  // A relocatable ELF object.
  std::string moduleName;
  std::string triple;    // e.g. "x86_64-pc-linux-gnu"
  std::string cpu;       // Options::cpu as used.
  std::string features;  // Options::features as used.
  std::string warnings;  // Clang's warnings (file:line:col: warning: ...), empty when none.
  double compileMs = 0;  // Wall time of this compile (frontend + optimizer + codegen).
};

// Compiles one translation unit. `source` is complete C++17 (it may #include system
// headers, though kernels compile ~4x faster with __builtin_* and no includes); exported
// kernels must be `extern "C"`. `moduleName` names the module in diagnostics
// ("<moduleName>.cpp:3:7: error: ..."). A compile error returns kInvalidArgument with all of
// Clang's diagnostics. Safe to call from several threads at once.
Expected<CpuObject> compileCpp(std::string_view source, std::string_view moduleName,
                               const CpuCompileOptions& options = {});

struct CpuSource {
  std::string source;
  std::string moduleName;
};

// Compiles every source on `threads` worker threads (<= 0: one per hardware thread, capped at
// the number of sources). Results are in the order of `sources`; one failure does not stop
// the others.
std::vector<Expected<CpuObject>> compileCppParallel(std::span<const CpuSource> sources,
                                                    const CpuCompileOptions& options = {},
                                                    int threads = 0);

// Everything besides the source that determines the object bytes: Clang's full version,
// target triple, CPU, features, optimization level and every flag. Cache keys hash it.
std::string compilerIdentity(const CpuCompileOptions& options = {});

}  // namespace kiln::codegen
