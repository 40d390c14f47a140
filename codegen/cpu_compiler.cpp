#include "codegen/cpu_compiler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include <clang/Basic/Diagnostic.h>
#include <clang/Basic/DiagnosticOptions.h>
#include <clang/Basic/Version.h>
#include <clang/CodeGen/CodeGenAction.h>
#include <clang/Driver/Compilation.h>
#include <clang/Driver/Driver.h>
#include <clang/Driver/Job.h>
#include <clang/Frontend/CompilerInstance.h>
#include <clang/Frontend/CompilerInvocation.h>
#include <clang/Frontend/TextDiagnosticPrinter.h>
#include <clang/Lex/PreprocessorOptions.h>
#include <llvm/ADT/SmallVector.h>
#include <llvm/ADT/StringMap.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/TargetParser/Host.h>
#include <llvm/TargetParser/X86TargetParser.h>

#ifndef KILN_CLANG_EXECUTABLE
#error "KILN_CLANG_EXECUTABLE must name clang 16's binary (set by codegen/CMakeLists.txt)"
#endif

namespace kiln::codegen {
namespace {

// Flags every kernel is compiled with. No -ffast-math: generated kernels must agree with the
// reference kernels, so only errno (which kernels never read) is given up, letting sqrtf and
// friends become single instructions. -fPIC makes references to symbols outside the object
// (libm, libc) go through the GOT/PLT, which the JIT linker can place anywhere in memory.
// Kernels never throw or use typeid, and dropping both shrinks the code and the compile time.
constexpr const char* kFixedFlags[] = {
    "-std=c++17", "-fPIC",      "-fno-math-errno",        "-fno-exceptions",
    "-fno-rtti",  "-fno-ident", "-fno-color-diagnostics", "-fmessage-length=0",
};

void initializeNativeTarget() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    llvm::InitializeNativeTargetAsmParser();
  });
}

std::vector<std::string> splitFeatures(std::string_view features) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= features.size()) {
    size_t comma = features.find(',', start);
    if (comma == std::string_view::npos) comma = features.size();
    std::string_view f = features.substr(start, comma - start);
    if (!f.empty()) out.emplace_back(f);
    start = comma + 1;
  }
  return out;
}

// Module names become file names in diagnostics; keep them to a portable character set.
std::string sanitizeName(std::string_view name) {
  std::string out = name.empty() ? std::string("kernel") : std::string(name);
  for (char& c : out) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == '.';
    if (!ok) c = '_';
  }
  return out;
}

std::vector<std::string> driverFlags(const CpuCompileOptions& options) {
  std::vector<std::string> flags(std::begin(kFixedFlags), std::end(kFixedFlags));
  flags.push_back("-O" + std::to_string(options.optLevel));
  flags.push_back(options.fpContract ? "-ffp-contract=on" : "-ffp-contract=off");
  flags.insert(flags.end(), options.extraArgs.begin(), options.extraArgs.end());
  return flags;
}

std::string trimTrailingNewlines(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

bool isKnownCpu(std::string_view cpu) {
  return llvm::X86::parseArchX86(llvm::StringRef(cpu.data(), cpu.size()), /*Only64Bit=*/true) !=
         llvm::X86::CK_None;
}

std::string knownCpusHint() {
  llvm::SmallVector<llvm::StringRef, 64> names;
  llvm::X86::fillValidCPUArchList(names, /*Only64Bit=*/true);
  std::string list;
  for (llvm::StringRef n : names) list += (list.empty() ? "" : ", ") + n.str();
  return "use 'native' or one of: " + list;
}

std::string joinSorted(std::vector<std::string> list) {
  // By feature name, not by sign, so that the string is stable.
  std::sort(list.begin(), list.end(),
            [](const std::string& a, const std::string& b) { return a.substr(1) < b.substr(1); });
  std::string joined;
  for (const std::string& f : list) joined += (joined.empty() ? "" : ",") + f;
  return joined;
}

// The names of the features a CPU implies, closed under LLVM's implications (x86-64-v3 lists
// avx2, which implies avx, sse4.2, ...).
std::vector<std::string> impliedFeatureNames(std::string_view cpu) {
  llvm::SmallVector<llvm::StringRef, 64> key;
  llvm::X86::getFeaturesForCPU(llvm::StringRef(cpu.data(), cpu.size()), key);
  llvm::StringMap<bool> all;
  for (llvm::StringRef f : key) {
    all[f] = true;
    llvm::X86::updateImpliedFeatures(f, true, all);
  }
  std::vector<std::string> names;
  for (const auto& entry : all)
    if (entry.second) names.push_back(entry.first().str());
  return names;
}

Status validateOptions(const CpuCompileOptions& options) {
  if (options.optLevel < 0 || options.optLevel > 3) {
    return invalidArgument("CPU compile: optLevel " + std::to_string(options.optLevel) +
                           " is out of range; use 0, 1, 2 or 3");
  }
  if (options.cpu.empty()) return invalidArgument("CPU compile: empty CPU name; use hostTarget()");
  if (!isKnownCpu(options.cpu))
    return invalidArgument("CPU compile: Clang 16 does not know the target CPU '" + options.cpu +
                           "'; " + knownCpusHint());
  for (const std::string& f : splitFeatures(options.features)) {
    if (f.size() < 2 || (f[0] != '+' && f[0] != '-')) {
      return invalidArgument("CPU compile: feature '" + f +
                             "' must start with '+' or '-' (as in \"+avx2,-avx512f\")");
    }
  }
  return Status::ok();
}

}  // namespace

const std::string& hostCpuName() {
  static const std::string name = [] {
    const char* simulated = std::getenv("KILN_SIMULATE_HOST_CPU");
    return simulated && *simulated ? std::string(simulated) : llvm::sys::getHostCPUName().str();
  }();
  return name;
}

std::string cpuImpliedFeatures(std::string_view cpu) {
  if (!isKnownCpu(cpu)) return {};
  std::vector<std::string> list;
  for (std::string& f : impliedFeatureNames(cpu)) list.push_back("+" + std::move(f));
  return joinSorted(std::move(list));
}

const CpuTarget& hostTarget() {
  static const CpuTarget target = [] {
    CpuTarget t;
    t.features = hostCpuFeatures();
    if (isKnownCpu(hostCpuName())) {
      t.cpu = t.tuneCpu = hostCpuName();
      t.note = "host CPU '" + t.cpu + "'";
      return t;
    }
    // LLVM does not know this CPU (it reports "generic", which Clang refuses as a target): take
    // the highest microarchitecture level the host's features cover as the base and add every
    // host feature on top, so no instruction the machine has is given up.
    llvm::StringMap<bool> host;
    const bool listed = llvm::sys::getHostCPUFeatures(host);
    t.cpu = "x86-64";
    for (const char* level : {"x86-64-v4", "x86-64-v3", "x86-64-v2"}) {
      bool covered = listed;
      for (const std::string& f : impliedFeatureNames(level)) {
        auto it = host.find(f);
        // Features LLVM does not report per host (x87, 64bit) are in every x86-64 CPU.
        if (it != host.end() && !it->second) covered = false;
      }
      if (covered) {
        t.cpu = level;
        break;
      }
    }
    t.tuneCpu = "generic";
    t.note = "host CPU '" + hostCpuName() + "' is unknown to LLVM 16: compiling for " + t.cpu +
             " with every feature of this CPU";
    return t;
  }();
  return target;
}

Expected<CpuTarget> resolveCpuTarget(std::string_view name) {
  std::string n(name);
  if (n.empty()) {
    const char* env = std::getenv("KILN_TARGET_CPU");
    n = env && *env ? env : "native";
  }
  if (n == "native" || n == "host") return hostTarget();
  if (!isKnownCpu(n))
    return invalidArgument("unknown target CPU '" + n + "' (from " +
                           (name.empty() ? "KILN_TARGET_CPU" : "--target-cpu") + "); " +
                           knownCpusHint());
  CpuTarget t;
  t.cpu = n;
  // The microarchitecture levels (x86-64-v3) name feature sets, not CPUs to tune for.
  t.tuneCpu = llvm::X86::parseTuneCPU(n, /*Only64Bit=*/true) != llvm::X86::CK_None ? n : "generic";
  t.features = cpuImpliedFeatures(n);
  t.note = "target CPU '" + n + "' (portable: exactly the features it implies)";
  return t;
}

const std::string& hostTriple() {
  static const std::string triple = llvm::sys::getDefaultTargetTriple();
  return triple;
}

const std::string& hostCpuFeatures() {
  static const std::string features = [] {
    llvm::StringMap<bool> map;
    if (!llvm::sys::getHostCPUFeatures(map)) return std::string();
    std::vector<std::string> list;
    for (const auto& entry : map) list.push_back((entry.second ? "+" : "-") + entry.first().str());
    // StringMap iterates in hash order; sorted by name the string is stable across runs.
    return joinSorted(std::move(list));
  }();
  return features;
}

Expected<CpuObject> compileCpp(std::string_view source, std::string_view moduleName,
                               const CpuCompileOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  KILN_TRY(validateOptions(options));
  initializeNativeTarget();

  const std::string name = sanitizeName(moduleName);
  const std::string fileName = name + ".cpp";
  const std::string triple = llvm::sys::getDefaultTargetTriple();

  // All diagnostics of this call (driver and compiler) are printed as text into `diagText`;
  // every call has its own engine, stream and context, which is what makes calls from several
  // threads safe.
  std::string diagText;
  llvm::raw_string_ostream diagStream(diagText);
  llvm::IntrusiveRefCntPtr<clang::DiagnosticOptions> driverDiagOpts(new clang::DiagnosticOptions);
  driverDiagOpts->ShowColors = false;
  clang::TextDiagnosticPrinter driverPrinter(diagStream, driverDiagOpts.get());
  clang::DiagnosticsEngine driverDiags(
      llvm::IntrusiveRefCntPtr<clang::DiagnosticIDs>(new clang::DiagnosticIDs), driverDiagOpts,
      &driverPrinter, /*ShouldOwnClient=*/false);

  // The driver turns ordinary clang flags into cc1 flags and finds the builtin and system
  // header directories. It is given the path of the real clang binary because it derives the
  // resource directory (stddef.h, immintrin.h) from it.
  clang::driver::Driver driver(KILN_CLANG_EXECUTABLE, triple, driverDiags, "kiln kernel compiler");
  driver.setCheckInputsExist(false);
  const std::vector<std::string> flags = driverFlags(options);
  std::vector<const char*> args = {KILN_CLANG_EXECUTABLE, "-c", "-x", "c++"};
  for (const std::string& f : flags) args.push_back(f.c_str());
  args.push_back("-o");
  args.push_back("kiln-kernel.o");  // Never written: the object goes to an in-memory stream.
  args.push_back(fileName.c_str());

  std::unique_ptr<clang::driver::Compilation> compilation(driver.BuildCompilation(args));
  if (!compilation || driverDiags.hasErrorOccurred()) {
    diagStream.flush();
    return invalidArgument("CPU compile of '" + name +
                           "': bad compiler flags: " + trimTrailingNewlines(diagText));
  }
  const clang::driver::JobList& jobs = compilation->getJobs();
  if (jobs.size() != 1 || !llvm::isa<clang::driver::Command>(*jobs.begin())) {
    return internalError("CPU compile of '" + name + "': the clang driver planned " +
                         std::to_string(jobs.size()) + " jobs instead of one cc1 job");
  }
  const auto& cc1 = llvm::cast<clang::driver::Command>(*jobs.begin());
  llvm::ArrayRef<const char*> cc1Args(cc1.getArguments().data(), cc1.getArguments().size());
  if (!cc1Args.empty() && std::strcmp(cc1Args.front(), "-cc1") == 0) cc1Args = cc1Args.drop_front();

  auto invocation = std::make_shared<clang::CompilerInvocation>();
  if (!clang::CompilerInvocation::CreateFromArgs(*invocation, cc1Args, driverDiags)) {
    diagStream.flush();
    return invalidArgument("CPU compile of '" + name +
                           "': bad compiler flags: " + trimTrailingNewlines(diagText));
  }
  // The driver asks cc1 to leak its AST, module and target machine at exit to save time in a
  // short-lived process; in a long-lived one that is a leak per kernel (~200 KB measured).
  invocation->getFrontendOpts().DisableFree = false;
  invocation->getCodeGenOpts().DisableFree = false;
  clang::TargetOptions& target = invocation->getTargetOpts();
  target.CPU = options.cpu;
  target.TuneCPU = options.tuneCpu.empty() ? options.cpu : options.tuneCpu;
  target.FeaturesAsWritten = splitFeatures(options.features);
  // The source never touches the disk: the file name resolves to this buffer. The source
  // manager takes ownership of the buffer.
  invocation->getPreprocessorOpts().addRemappedFile(
      fileName,
      llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(source.data(), source.size()), fileName)
          .release());

  clang::CompilerInstance compiler;
  compiler.setInvocation(invocation);
  clang::TextDiagnosticPrinter printer(diagStream, &compiler.getDiagnosticOpts());
  compiler.createDiagnostics(&printer, /*ShouldOwnClient=*/false);
  compiler.setVerboseOutputStream(diagStream);  // "N errors generated." goes here, not stderr.

  // EmitObjAction runs Clang's own -O<n> pipeline and then the host TargetMachine's
  // addPassesToEmitFile, with the target options Clang derives from the flags. Giving the
  // instance an output stream makes it write the object into memory instead of a file.
  llvm::SmallVector<char, 0> objectBuffer;
  compiler.setOutputStream(std::make_unique<llvm::raw_svector_ostream>(objectBuffer));
  llvm::LLVMContext context;
  clang::EmitObjAction action(&context);
  const bool ok = compiler.ExecuteAction(action);
  diagStream.flush();
  if (!ok || compiler.getDiagnostics().hasErrorOccurred()) {
    return invalidArgument("C++ kernel module '" + name + "' failed to compile:\n" +
                           trimTrailingNewlines(diagText));
  }
  if (objectBuffer.empty()) {
    return internalError("CPU compile of '" + name + "' produced an empty object file");
  }

  CpuObject object;
  object.bytes.resize(objectBuffer.size());
  std::memcpy(object.bytes.data(), objectBuffer.data(), objectBuffer.size());
  object.moduleName = name;
  object.triple = triple;
  object.cpu = options.cpu;
  object.features = options.features;
  object.warnings = trimTrailingNewlines(diagText);
  object.compileMs =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return object;
}

std::vector<Expected<CpuObject>> compileCppParallel(std::span<const CpuSource> sources,
                                                    const CpuCompileOptions& options, int threads) {
  size_t workers = threads > 0 ? static_cast<size_t>(threads)
                               : std::max(1u, std::thread::hardware_concurrency());
  workers = std::min(workers, sources.size());
  std::vector<std::optional<Expected<CpuObject>>> slots(sources.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < sources.size(); i = next.fetch_add(1)) {
      slots[i].emplace(compileCpp(sources[i].source, sources[i].moduleName, options));
    }
  };
  if (workers <= 1) {
    work();
  } else {
    std::vector<std::jthread> pool;
    pool.reserve(workers);
    for (size_t t = 0; t < workers; ++t) pool.emplace_back(work);
  }  // The jthreads join here.
  std::vector<Expected<CpuObject>> results;
  results.reserve(sources.size());
  for (auto& slot : slots) results.push_back(std::move(*slot));
  return results;
}

std::string compilerIdentity(const CpuCompileOptions& options) {
  std::string id = clang::getClangFullVersion();
  id += "|triple=" + llvm::sys::getDefaultTargetTriple();
  id += "|cpu=" + options.cpu;
  id += "|tune=" + (options.tuneCpu.empty() ? options.cpu : options.tuneCpu);
  id += "|features=" + options.features;
  id += "|flags=";
  for (const std::string& f : driverFlags(options)) id += f + " ";
  return id;
}

}  // namespace kiln::codegen
