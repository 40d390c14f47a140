#include "compiler/compile.h"

#include <chrono>
#include <iostream>
#include <unordered_map>

#include "codegen/cpu_compiler.h"
#include "codegen/kernel_cache.h"
#include "codegen/nvrtc_compiler.h"
#include "codegen/render.h"
#include "compiler/conv_autotune.h"
#include "compiler/plan_builder.h"
#include "compiler/schedule.h"
#include "ir/timing.h"
#include "passes/pipeline.h"
#include "runtime/reference/kernels.h"

namespace kiln::compiler {

namespace {
constexpr std::pair<Precision, std::string_view> kPrecisions[] = {{Precision::kFp32, "fp32"},
                                                                  {Precision::kTf32, "tf32"},
                                                                  {Precision::kBf16, "bf16"},
                                                                  {Precision::kFp16, "fp16"}};
}  // namespace

std::string_view precisionName(Precision p) {
  for (const auto& [precision, name] : kPrecisions)
    if (precision == p) return name;
  return "?";
}

bool usesTensorCores(Precision p) {
  return p != Precision::kFp32;
}

ir::DType autocastDType(Precision p) {
  return p == Precision::kBf16   ? ir::DType::kBF16
         : p == Precision::kFp16 ? ir::DType::kF16
                                 : ir::DType::kF32;
}

Status checkPrecision(Precision p, const runtime::Backend& backend) {
  if (p == Precision::kTf32 && !backend.caps().tf32)
    return invalidArgument("--precision tf32: backend '" + std::string(backend.name()) +
                           "' has no TF32 arithmetic (the tensor cores of an NVIDIA GPU since "
                           "Ampere); use --device cuda (or emu, which emulates it), or fp32");
  if (autocastDType(p) != ir::DType::kF32 && !backend.caps().lowPrecision)
    return invalidArgument("--precision " + std::string(precisionName(p)) + ": backend '" +
                           std::string(backend.name()) +
                           "' has no low-precision products; use fp32");
  return Status::ok();
}

Expected<Precision> parsePrecision(std::string_view name) {
  for (const auto& [precision, known] : kPrecisions)
    if (known == name) return precision;
  return invalidArgument("unknown precision '" + std::string(name) +
                         "' (fp32, tf32, bf16 or fp16)");
}

Status applyPrecision(ir::Graph& g, Precision p) {
  if (autocastDType(p) == ir::DType::kF32) return Status::ok();
  passes::PassContext ctx;
  ctx.autocast = autocastDType(p);
  return passes::Pipeline({"autocast"}).run(g, ctx);
}

Expected<ir::Graph> withPrecision(const ir::Graph& g, Precision p) {
  ir::Graph out = g.clone();
  KILN_TRY(applyPrecision(out, p));
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;
using BackendCudaCaps = runtime::BackendCaps::Cuda;

class Driver {
 public:
  Driver(const CompileOptions& o)
      : opts_(o),
        backend_(o.backend ? o.backend : runtime::defaultBackend()),
        libraryFusion_(o.libraryFusion && backend_->caps().libraryEpilogues) {}

  Expected<std::unique_ptr<CompiledModel>> run(const ir::Graph& input) {
    const auto t0 = Clock::now();
    report_.nodesIn = static_cast<int>(input.numNodes());
    graph_ = input.clone();
    KILN_TRY(checkPrecision(opts_.precision, *backend_));
    report_.precision = std::string(precisionName(opts_.precision));
    KILN_TRY(runPasses());
    auto tf = Clock::now();
    passes::FusionOptions fo = opts_.fusion;
    fo.libraryEpilogues = libraryFusion_;
    fo.acceptsEpilogue = [b = backend_](const ir::Node& head,
                                        std::span<const ir::Node* const> post) {
      Expected<std::vector<runtime::PostOp>> ops = postOpsOf(post);
      return ops && b->runsPostOps(head.op(), *ops);
    };
    fusion_ = passes::planFusion(graph_, fo);
    report_.fusionExplanation = passes::explainFusion(fusion_);
    report_.fusionMs = msSince(tf);
    auto tc = Clock::now();
    KILN_ASSIGN_OR_RETURN(schedule_,
                          scheduleGroups(graph_, fusion_.groups, *backend_, fo.horizontal));
    report_.aliases = schedule_.aliases;
    report_.remarks.insert(report_.remarks.end(), schedule_.remarks.begin(),
                           schedule_.remarks.end());
    report_.codegenMs = msSince(tc);
    KILN_TRY(compileKernels());
    auto tp = Clock::now();
    KILN_ASSIGN_OR_RETURN(std::shared_ptr<runtime::Plan> plan,
                          buildPlan({graph_, schedule_, kernelEntries_, std::move(code_), backend_,
                                     opts_.inPlaceOutputs, opts_.precision == Precision::kTf32},
                                    report_));
    plan->parametersVary = !opts_.inference;  // Trained: updated between runs.
    report_.planMs = msSince(tp);
    report_.totalMs = msSince(t0);
    auto model = std::make_unique<CompiledModel>(
        std::move(plan), std::move(report_), opts_.runThreads, std::move(code_info_),
        std::make_shared<const ir::Graph>(std::move(graph_)));
    KILN_TRY(model->limitMemory(opts_.maxMemoryBytes));
    model->setGraphs(opts_.cudaGraphs);
    KILN_TRY(model->prepare());
    return model;
  }

 private:
  Status runPasses() {
    const auto t = Clock::now();
    passes::PassContext ctx;
    ctx.inference = opts_.inference;
    ctx.recompute = opts_.recompute;
    ctx.evaluate = runtime::evaluateNode;  // Constant folding runs reference kernels.
    ctx.disabled = opts_.disabledPasses;
    ctx.dumpAfter = opts_.dumpAfter;
    ctx.timePasses = opts_.timePasses;
    ctx.verifyAfterEach = opts_.verifyEachPass;
    ctx.log = opts_.log;
    using CL = runtime::BackendCaps::ChannelsLast;
    const CL cl = backend_->caps().channelsLast;
    ctx.channelsLast =
        libraryFusion_ &&
        (cl == CL::kAlways || (cl == CL::kTensorCores && usesTensorCores(opts_.precision)));
    ctx.channelsLastFilters = backend_->caps().channelsLastFilters;
    ctx.lowerForDevice = backend_->caps().runsCudaKernels();
    ctx.autocast = autocastDType(opts_.precision);
    ctx.hasLibraryKernel = [b = backend_](ir::OpKind op, ir::DType dtype, ir::Layout layout) {
      return b->hasLibraryKernel(op, dtype, layout);
    };
    ctx.chooseConvAlgorithm = [this](const ir::Node& n) {
      return chooseConvAlgorithm(n, {*backend_, opts_.autotune, kernelCache(),
                                     [this](const Status& st) { cacheStored(kernelCache(), st); },
                                     opts_.precision == Precision::kTf32});
    };
    KILN_TRY(passes::Pipeline::standard().run(graph_, ctx));
    report_.remarks = ctx.remarks;
    if (ctx.autocast != ir::DType::kF32 && !backend_->caps().lowPrecisionNote.empty())
      report_.remarks.push_back("--precision " + std::string(precisionName(opts_.precision)) +
                                " on backend '" + std::string(backend_->name()) +
                                "': " + backend_->caps().lowPrecisionNote);
    report_.algorithmChoices = ctx.algorithmChoices;
    report_.layoutConversions = ctx.layoutConversions;
    report_.nodesOptimized = static_cast<int>(graph_.numNodes());
    report_.passesMs = msSince(t);
    return Status::ok();
  }

  // The cache only saves time: a failed store is a remark, and a warning once per process and
  // directory (a read-only or non-directory cache would otherwise recompile every kernel in
  // every process without a word).
  void cacheStored(const codegen::KernelCache& cache, const Status& st) {
    if (st.isOk()) return;
    report_.remarks.push_back(st.message());
    if (codegen::KernelCache::firstFailure(cache.directory()))
      (opts_.log ? *opts_.log : std::cerr)
          << "kiln: warning: " << st.message() << "; kernels are compiled again in every process\n";
  }

  codegen::KernelCache& kernelCache() {
    if (!cache_)
      cache_ = opts_.cacheDir.empty()
                   ? std::make_unique<codegen::KernelCache>(opts_.useCache)
                   : std::make_unique<codegen::KernelCache>(opts_.cacheDir, opts_.useCache);
    return *cache_;
  }

  Status compileKernels() {
    const auto t = Clock::now();
    report_.generatedKernels = static_cast<int>(schedule_.kernels.size());
    if (schedule_.kernels.empty()) return Status::ok();
    const std::string& format = backend_->caps().kernelCode;
    // CUDA C for a GPU (NVRTC to cubin) or for the emu device (Clang for this machine, with the
    // device's SIMT prelude); C++ for the CPU.
    const bool cuda = backend_->caps().runsCudaKernels();
    if (format != "host-object" && !cuda)
      return unimplemented("backend '" + std::string(backend_->name()) + "' runs kernels as '" +
                           format + "' code, which kiln does not generate");
    const BackendCudaCaps& cudaCaps = backend_->caps().cuda;
    KILN_ASSIGN_OR_RETURN(const codegen::CpuTarget target,
                          codegen::resolveCpuTarget(opts_.targetCpu));
    if (target.cpu != codegen::hostCpuName()) report_.remarks.push_back(target.note);
    codegen::CpuCompileOptions copts;
    copts.cpu = target.cpu;
    copts.features = target.features;
    copts.tuneCpu = target.tuneCpu;
    const std::string identity = format == "cubin" ? codegen::cudaCompilerIdentity() + " sm_" +
                                                         std::to_string(cudaCaps.smArch)
                                                   : codegen::compilerIdentity(copts);
    const codegen::Dialect dialect = cuda ? codegen::Dialect::kCuda : codegen::Dialect::kCpu;
    codegen::KernelCache& cache = kernelCache();
    shareKernels(dialect);
    const int per = std::max(1, opts_.kernelsPerModule);
    std::vector<codegen::CpuSource> sources;
    std::vector<codegen::CacheKey> keys;
    for (size_t b = 0; b < unique_.size(); b += per) {
      const size_t e = std::min(unique_.size(), b + per);
      std::vector<codegen::Kernel> chunk;
      for (size_t u = b; u < e; ++u) chunk.push_back(schedule_.kernels[unique_[u]]);
      const std::string module = "kiln_module" + std::to_string(sources.size());
      std::string src = cudaCaps.sourcePrefix + codegen::renderModule(chunk, dialect);
      for (size_t u = b; u < e; ++u) {
        const codegen::Kernel& k = schedule_.kernels[unique_[u]];
        const std::string text = codegen::renderKernel(k, dialect);
        report_.kernels.push_back({k.name, module, schedule_.kernelGroup[unique_[u]],
                                   cuda ? "" : text, cuda ? text : "", stepsOf_[unique_[u]]});
        if (!cudaCaps.entryLine.empty()) {
          std::string entry = cudaCaps.entryLine;
          entry.replace(entry.find("{name}"), 6, k.name);
          src += entry + "\n";
        }
      }
      keys.push_back(codegen::CacheKeyBuilder()
                         .add(format == "host-object" ? "cpu-object" : format)
                         .add(src)
                         .add(identity)
                         .finish());
      sources.push_back({std::move(src), module});
    }
    report_.modules = static_cast<int>(sources.size());
    // Look every module up; compile the misses in parallel.
    std::vector<std::vector<std::byte>> objects(sources.size());
    std::vector<codegen::CpuSource> misses;
    std::vector<size_t> missIndex;
    for (size_t i = 0; i < sources.size(); ++i) {
      codegen::CacheLookup l = cache.lookup(keys[i]);
      report_.cacheExplanations.push_back(sources[i].moduleName + ": " + l.explain());
      if (l.hit) {
        ++report_.cacheHits;
        objects[i] = std::move(l.payload);
      } else {
        ++report_.cacheMisses;
        misses.push_back(sources[i]);
        missIndex.push_back(i);
      }
    }
    if (!misses.empty()) {
      if (opts_.log)
        *opts_.log << "compiling " << misses.size() << " kernel module(s) ("
                   << schedule_.kernels.size() << " kernels)...\n";
      if (format == "cubin") {
        for (size_t j = 0; j < misses.size(); ++j) {
          codegen::CudaCompileOptions nopts;
          nopts.resourceUsage = true;  // ptxas: the cubin for the device's architecture.
          auto ptx = codegen::compileCuda(misses[j].source, misses[j].moduleName + ".cu",
                                          cudaCaps.smArch, nopts);
          if (!ptx) return ptx.status().withContext("compiling generated CUDA kernels");
          const auto* b = reinterpret_cast<const std::byte*>(ptx->cubin.data());
          objects[missIndex[j]].assign(b, b + ptx->cubin.size());
          cacheStored(cache, cache.store(keys[missIndex[j]], objects[missIndex[j]]));
        }
      } else {
        auto results = codegen::compileCppParallel(misses, copts, opts_.compileThreads);
        for (size_t j = 0; j < results.size(); ++j) {
          if (!results[j]) return results[j].status().withContext("compiling generated kernels");
          objects[missIndex[j]] = std::move(results[j]->bytes);
          cacheStored(cache, cache.store(keys[missIndex[j]], objects[missIndex[j]]));
        }
      }
    }
    std::vector<runtime::KernelObject> loadable;
    for (size_t i = 0; i < objects.size(); ++i)
      loadable.push_back({sources[i].moduleName, objects[i]});
    KILN_ASSIGN_OR_RETURN(code_, backend_->loadKernels(loadable));
    if (format == "cubin") {  // GPU code: what an artifact's loader checks is the device.
      code_info_->triple = "nvptx64-nvidia-cuda";
      code_info_->cpu = "sm_" + std::to_string(cudaCaps.smArch);
    } else {
      code_info_->triple = codegen::hostTriple();
      code_info_->cpu = copts.cpu;
      code_info_->features = copts.features;
    }
    for (size_t i = 0; i < objects.size(); ++i)
      code_info_->modules.push_back(
          {sources[i].moduleName, std::move(sources[i].source), std::move(objects[i])});
    for (size_t i = 0; i < schedule_.kernels.size(); ++i) {
      KILN_ASSIGN_OR_RETURN(const void* entry,
                            code_->entry(schedule_.kernels[sharedFunction_[i]].name));
      kernelEntries_.push_back(entry);
    }
    if (opts_.cudaCheck) KILN_TRY(checkCuda());
    report_.compileMs = msSince(t);
    return Status::ok();
  }

  Status checkCuda() {
    if (!codegen::cudaCompilerAvailable()) {
      report_.remarks.push_back("CUDA check skipped: kiln was built without the CUDA toolkit");
      return Status::ok();
    }
    std::vector<codegen::Kernel> functions;
    for (size_t i : unique_) functions.push_back(schedule_.kernels[i]);
    const std::string src = codegen::renderModule(functions, codegen::Dialect::kCuda);
    for (size_t u = 0; u < functions.size(); ++u)
      report_.kernels[u].cuda = codegen::renderKernel(functions[u], codegen::Dialect::kCuda);
    // On a GPU, ptxas also makes each architecture's cubin (an artifact's code for GPUs other
    // than this one); elsewhere PTX alone checks the kernels.
    const runtime::BackendCaps& caps = backend_->caps();
    for (int arch : {80, 90}) {
      codegen::CudaCompileOptions nopts;
      nopts.resourceUsage = caps.kernelCode == "cubin" && arch != caps.cuda.smArch;
      auto ptx = codegen::compileCuda(src, "kiln_kernels.cu", arch, nopts);
      if (!ptx) {
        report_.cudaErrors.push_back("sm_" + std::to_string(arch) + ": " + ptx.status().message());
        continue;
      }
      code_info_->ptx.emplace_back("sm_" + std::to_string(arch), std::move(ptx->ptx));
      if (nopts.resourceUsage) {
        const auto* b = reinterpret_cast<const std::byte*>(ptx->cubin.data());
        code_info_->cubins.emplace_back("sm_" + std::to_string(arch),
                                        std::vector<std::byte>(b, b + ptx->cubin.size()));
      }
    }
    report_.cudaKernelsChecked = static_cast<int>(functions.size());
    return Status::ok();
  }

  // Kernels that render the same text once renamed alike (a repeated layer, an unrolled
  // recurrence) share one compiled function: the first of them. sharedFunction_[i] is kernel
  // i's, unique_ the kernels compiled (in order), and the plan steps of a shared kernel call the
  // function by its name (an artifact's loader resolves steps by name). Op kernels are not
  // shared: their sources carry their node's description.
  void shareKernels(codegen::Dialect dialect) {
    const size_t n = schedule_.kernels.size();
    sharedFunction_.resize(n);
    stepsOf_.assign(n, 0);
    std::unordered_map<std::string, size_t> byText;
    for (size_t i = 0; i < n; ++i) {
      const codegen::Kernel& k = schedule_.kernels[i];
      sharedFunction_[i] = i;
      if (!k.isOpKernel()) {
        const std::string text =
            codegen::renderKernel(codegen::renamedKernel(k, "kiln_shared"), dialect);
        sharedFunction_[i] = byText.emplace(text, i).first->second;
      }
      if (sharedFunction_[i] == i) unique_.push_back(i);
      ++stepsOf_[sharedFunction_[i]];
    }
    for (StepDraft& d : schedule_.steps)
      if (d.kernel >= 0)
        d.name = schedule_.kernels[sharedFunction_[static_cast<size_t>(d.kernel)]].name;
    report_.compiledKernels = static_cast<int>(unique_.size());
  }

  const CompileOptions& opts_;
  std::shared_ptr<runtime::Backend> backend_;
  bool libraryFusion_;  // Library epilogues and channels-last: asked for and supported.
  CompileReport report_;
  ir::Graph graph_;
  passes::FusionPlan fusion_;
  Schedule schedule_;
  std::vector<const void*> kernelEntries_;
  std::vector<size_t> sharedFunction_, unique_;
  std::vector<int> stepsOf_;  // Per compiled kernel: the steps calling it.
  std::shared_ptr<runtime::KernelModule> code_;
  std::shared_ptr<CompiledCode> code_info_ = std::make_shared<CompiledCode>();
  std::unique_ptr<codegen::KernelCache> cache_;
};

}  // namespace

Status checkTargetCpu(std::string_view name) {
  return codegen::resolveCpuTarget(name).status();
}

CompiledModel::CompiledModel(std::shared_ptr<const runtime::Plan> plan, CompileReport report,
                             int threads, std::shared_ptr<const CompiledCode> code,
                             std::shared_ptr<const ir::Graph> optimized)
    : plan_(plan),
      report_(std::move(report)),
      code_(code ? std::move(code) : std::make_shared<const CompiledCode>()),
      optimized_(optimized ? std::move(optimized) : std::make_shared<const ir::Graph>()),
      exec_(plan, threads) {}

Status CompiledModel::prepare() {
  const auto t = Clock::now();
  KILN_TRY(exec_.prepare());
  report_.prepareMs = msSince(t);
  return Status::ok();
}

Expected<std::vector<runtime::Tensor>> CompiledModel::run(std::span<const runtime::Tensor> inputs,
                                                          runtime::PlanRunStats* stats,
                                                          const runtime::StepHook* afterStep) {
  return exec_.run(inputs, stats, afterStep);
}

Expected<std::unique_ptr<CompiledModel>> compile(const ir::Graph& graph,
                                                 const CompileOptions& options) {
  return Driver(options).run(graph);
}

}  // namespace kiln::compiler
