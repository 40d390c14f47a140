#include "compiler/compile.h"

#include <chrono>
#include <iostream>
#include <unordered_map>
#include <unordered_set>

#include "codegen/cpu_compiler.h"
#include "codegen/kernel_cache.h"
#include "codegen/lower.h"
#include "codegen/nvrtc_compiler.h"
#include "codegen/render.h"
#include "compiler/memory_plan.h"
#include "ir/printer.h"
#include "ir/timing.h"
#include "passes/pipeline.h"
#include "runtime/library/kernels.h"
#include "runtime/library_info.h"
#include "runtime/reference/kernels.h"

namespace kiln::compiler {

namespace {

using Clock = std::chrono::steady_clock;

// One step of the schedule before buffers are assigned.
struct StepDraft {
  StepDraft(runtime::PlanStep::Kind k, std::string n, const ir::Node* nd = nullptr)
      : kind(k), name(std::move(n)), node(nd) {}
  runtime::PlanStep::Kind kind;
  std::string name;
  std::vector<const ir::Value*> inputs;  // For a library call: its inputs, then `extra`.
  std::vector<const ir::Value*> outputs;
  int kernel = -1;  // Index into kernels.
  const ir::Node* node = nullptr;
  // Library calls:
  bool library = false;
  std::vector<runtime::PostOp> postOps;
  std::vector<const ir::Value*> extra;
  int numExtra = 0;
  bool channelsLast = false;
  runtime::ConvAlgo algo = runtime::ConvAlgo::kAuto;
};

// Where a value's bytes live: a storage id, shared by a reshape and its input.
struct Storage {
  runtime::BufferRef::Kind kind;
  int index = 0;  // Input/parameter/output number, or the arena request.
  int firstStep = 0;
  int lastStep = 0;
  int64_t bytes = 0;
};

bool isAliasGroup(const passes::FusionGroup& g) {
  for (const ir::Node* n : g.nodes)
    if (!n->info().has(ir::kReshapeLike)) return false;
  return true;
}

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
    KILN_TRY(runPasses());
    auto tf = Clock::now();
    passes::FusionOptions fo = opts_.fusion;
    fo.libraryEpilogues = libraryFusion_;
    fusion_ = passes::planFusion(graph_, fo);
    report_.fusionExplanation = passes::explainFusion(fusion_);
    report_.fusionMs = msSince(tf);
    auto tc = Clock::now();
    KILN_TRY(buildSteps());
    report_.codegenMs = msSince(tc);
    KILN_TRY(compileKernels());
    auto tp = Clock::now();
    KILN_TRY(buildPlan());
    report_.planMs = msSince(tp);
    report_.totalMs = msSince(t0);
    auto model = std::make_unique<CompiledModel>(
        plan_, std::move(report_), opts_.runThreads, std::move(code_info_),
        std::make_shared<const ir::Graph>(std::move(graph_)));
    KILN_TRY(model->limitMemory(opts_.maxMemoryBytes));
    return model;
  }

 private:
  Status runPasses() {
    const auto t = Clock::now();
    passes::PassContext ctx;
    ctx.inference = opts_.inference;
    ctx.evaluate = runtime::evaluateNode;  // Constant folding runs reference kernels.
    ctx.disabled = opts_.disabledPasses;
    ctx.dumpAfter = opts_.dumpAfter;
    ctx.timePasses = opts_.timePasses;
    ctx.verifyAfterEach = opts_.verifyEachPass;
    ctx.log = opts_.log;
    ctx.channelsLast = libraryFusion_;
    ctx.hasLibraryKernel = [b = backend_](ir::OpKind op, ir::DType dtype, ir::Layout layout) {
      return b->hasLibraryKernel(op, dtype, layout);
    };
    ctx.chooseConvAlgorithm = [this](const ir::Node& n) { return chooseConvAlgorithm(n); };
    KILN_TRY(passes::Pipeline::standard().run(graph_, ctx));
    report_.remarks = ctx.remarks;
    report_.algorithmChoices = ctx.algorithmChoices;
    report_.layoutConversions = ctx.layoutConversions;
    report_.nodesOptimized = static_cast<int>(graph_.numNodes());
    report_.passesMs = msSince(t);
    return Status::ok();
  }

  // Times each candidate algorithm of one conv on random data of its real shape and layout,
  // or asks the disk cache for an earlier answer.
  Expected<passes::AlgorithmChoice> chooseConvAlgorithm(const ir::Node& n) {
    const ir::Shape& xs = n.input(0)->type().shape;
    const ir::Shape& ws = n.input(1)->type().shape;
    const ir::TensorType& yt = n.output()->type();
    if (!backend_->hasLibraryKernel(n.op(), yt.dtype, yt.layout))
      return passes::AlgorithmChoice{
          "auto", "backend '" + std::string(backend_->name()) + "' has no library convolution"};
    const auto candidates = runtime::convAlgorithms(n.attr(), xs, ws);
    if (!opts_.autotune || candidates.size() < 2 || yt.dtype != ir::DType::kF32)
      return passes::AlgorithmChoice{"auto", "heuristic: the library's default"};
    const bool nhwc = n.input(0)->type().layout == ir::Layout::kNHWC;
    std::string attrs;
    for (const auto& [k, v] : n.attrs())
      if (k != "algo") attrs += k + "=" + ir::printAttrValue(v) + ";";
    const codegen::CacheKey key = codegen::CacheKeyBuilder()
                                      .add("conv-algo")
                                      .add(ir::shapeToString(xs))
                                      .add(ir::shapeToString(ws))
                                      .add(attrs)
                                      .add(nhwc ? "nhwc" : "nchw")
                                      .add(n.numInputs() > 2 ? "bias" : "nobias")
                                      .add(codegen::hostCpuName() + codegen::hostCpuFeatures())
                                      .add(runtime::libraryIdentity())
                                      .finish();
    codegen::KernelCache& cache = kernelCache();
    if (auto hit = cache.lookup(key); hit.hit) {
      const std::string payload = hit.payloadString();
      const size_t bar = payload.find('|');
      return passes::AlgorithmChoice{payload.substr(0, bar), "cached: " + payload.substr(bar + 1)};
    }
    std::vector<runtime::Tensor> ins;
    for (const ir::Value* v : n.inputs()) {
      KILN_ASSIGN_OR_RETURN(runtime::Tensor t,
                            runtime::Tensor::empty(v->type().dtype, v->type().shape));
      for (int64_t i = 0; i < t.numElements(); ++i)
        t.data<float>()[i] = static_cast<float>((i * 7919) % 97) * 0.01f - 0.5f;
      ins.push_back(t);
    }
    KILN_ASSIGN_OR_RETURN(runtime::Tensor out, runtime::Tensor::empty(n.output()->type().dtype,
                                                                      n.output()->type().shape));
    std::string best = "auto", explanation;
    double bestMs = 1e300;
    for (runtime::ConvAlgo algo : candidates) {
      runtime::LibraryOptions lo;
      lo.algo = algo;
      lo.channelsLast = nhwc;
      runtime::LibraryCache weights;
      lo.cache = &weights;
      std::vector<double> ms;
      Status st;
      for (int rep = 0; rep < 4 && st.isOk(); ++rep) {
        const auto t0 = Clock::now();
        st = runtime::runLibraryWithPostOps(ir::OpKind::kConv2d, n.attr(), ins, {}, {}, out, lo);
        if (rep > 0) ms.push_back(msSince(t0));  // The first run reorders weights.
      }
      if (!st.isOk()) continue;
      std::sort(ms.begin(), ms.end());
      const double median = ms[ms.size() / 2];
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s%s %.3f ms", explanation.empty() ? "" : ", ",
                    std::string(runtime::convAlgoName(algo)).c_str(), median);
      explanation += buf;
      if (median < bestMs) {
        bestMs = median;
        best = std::string(runtime::convAlgoName(algo));
      }
    }
    cacheStored(cache, cache.store(key, best + "|" + explanation));
    return passes::AlgorithmChoice{best, "timed: " + explanation};
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

  // One library call: the group's first node, with the rest of the group as post-ops.
  Status addLibraryStep(const passes::FusionGroup& g) {
    const ir::Node* head = g.nodes.front();
    const ir::OpKind op = head->op();
    StepDraft s(runtime::PlanStep::Kind::kOp, head->describe(), head);
    s.inputs.assign(head->inputs().begin(), head->inputs().end());
    const ir::TensorType& yt = head->output()->type();
    s.library = backend_->hasLibraryKernel(op, yt.dtype, yt.layout);
    const ir::Value* current = head->output();
    for (size_t i = 1; i < g.nodes.size(); ++i) {
      const ir::Node* n = g.nodes[i];
      runtime::PostOp p;
      switch (n->op()) {
        case ir::OpKind::kRelu:
          p.kind = runtime::PostOp::Kind::kRelu;
          break;
        case ir::OpKind::kLeakyRelu:
          p.kind = runtime::PostOp::Kind::kLeakyRelu;
          p.alpha = n->attr().getFloat("alpha");
          break;
        case ir::OpKind::kClip:
          p.kind = runtime::PostOp::Kind::kClip;
          p.alpha = n->attr().getFloat("min");
          p.beta = n->attr().getFloat("max");
          break;
        case ir::OpKind::kSigmoid:
          p.kind = runtime::PostOp::Kind::kSigmoid;
          break;
        case ir::OpKind::kTanh:
          p.kind = runtime::PostOp::Kind::kTanh;
          break;
        case ir::OpKind::kGelu:
          p.kind = n->attr().getString("approximate") == "tanh" ? runtime::PostOp::Kind::kGeluTanh
                                                                : runtime::PostOp::Kind::kGeluErf;
          break;
        case ir::OpKind::kAdd:
          p.kind = runtime::PostOp::Kind::kAdd;
          p.input = s.numExtra++;
          s.extra.push_back(n->input(0) == current ? n->input(1) : n->input(0));
          break;
        default:
          return internalError("group " + std::to_string(g.id) + ": " + n->describe() +
                               " is not a post-op");
      }
      s.postOps.push_back(p);
      current = n->output();
    }
    if (!s.library && !s.postOps.empty())
      return internalError(head->describe() + " has post-ops but no library kernel");
    for (const ir::Value* e : s.extra) s.inputs.push_back(e);
    s.outputs.push_back(current);
    s.channelsLast = head->output()->type().layout == ir::Layout::kNHWC;
    if (s.channelsLast && !s.library)
      return internalError(head->describe() + " is channels-last but has no library kernel");
    if (op == ir::OpKind::kConv2d) {
      const std::string& algo = head->attr().getString("algo");
      for (auto a : {runtime::ConvAlgo::kDirect, runtime::ConvAlgo::kWinograd,
                     runtime::ConvAlgo::kIm2colGemm})
        if (runtime::convAlgoName(a) == algo) s.algo = a;
    }
    steps_.push_back(std::move(s));
    return Status::ok();
  }

  Status addReferenceSteps(const passes::FusionGroup& g) {
    for (const ir::Node* n : g.nodes) {
      for (const ir::Value* v : n->inputs())
        if (v->type().layout == ir::Layout::kNHWC)
          return internalError(n->describe() +
                               " would run on a reference kernel with a channels-last input");
      for (const ir::Value* v : n->outputs())
        if (v->type().layout == ir::Layout::kNHWC)
          return internalError(n->describe() +
                               " would run on a reference kernel with a channels-last output");
      StepDraft s(runtime::PlanStep::Kind::kOp, n->describe(), n);
      s.inputs.assign(n->inputs().begin(), n->inputs().end());
      s.outputs.assign(n->outputs().begin(), n->outputs().end());
      steps_.push_back(std::move(s));
    }
    return Status::ok();
  }

  Status buildSteps() {
    for (const ir::Value* v : graph_.outputs()) graphOutputs_.insert(v);
    for (const auto& g : fusion_.groups) {
      switch (g.kind) {
        case passes::GroupKind::kLibrary:
          KILN_TRY(addLibraryStep(g));
          break;
        case passes::GroupKind::kOther:
          KILN_TRY(addReferenceSteps(g));
          break;
        case passes::GroupKind::kView:
          if (isAliasGroup(g)) {
            for (const ir::Node* n : g.nodes) aliasOf_[n->output()] = n->input(0);
            report_.aliases += static_cast<int>(g.nodes.size());
            break;
          }
          [[fallthrough]];
        case passes::GroupKind::kPointwise:
        case passes::GroupKind::kReduction: {
          if (backend_->caps().kernelCode.empty()) {
            KILN_TRY(addReferenceSteps(g));  // The backend runs no generated code.
            break;
          }
          const std::string name = "kiln_k" + std::to_string(kernels_.size());
          auto k = codegen::lowerGroup(g, graphOutputs_, name);
          if (!k) {
            report_.remarks.push_back("group " + std::to_string(g.id) +
                                      " runs op by op: " + k.status().message());
            KILN_TRY(addReferenceSteps(g));
            break;
          }
          StepDraft s(runtime::PlanStep::Kind::kKernel, name);
          s.kernel = static_cast<int>(kernels_.size());
          bool sawOutput = false;
          for (const auto& a : k->args) {
            const ir::Value* v = graph_.findValue(a.value);
            if (!v) return internalError("kernel " + name + " names unknown value " + a.value);
            if (a.output) {
              s.outputs.push_back(v);
              sawOutput = true;
            } else {
              if (sawOutput) return internalError("kernel " + name + ": inputs after outputs");
              s.inputs.push_back(v);
            }
          }
          kernelGroup_.push_back(std::string(passes::groupKindName(g.kind)));
          kernels_.push_back(std::move(*k));
          steps_.push_back(std::move(s));
          break;
        }
      }
    }
    return Status::ok();
  }

  Status compileKernels() {
    const auto t = Clock::now();
    report_.generatedKernels = static_cast<int>(kernels_.size());
    if (kernels_.empty()) return Status::ok();
    if (backend_->caps().kernelCode != "host-object")
      return unimplemented("backend '" + std::string(backend_->name()) + "' runs kernels as '" +
                           backend_->caps().kernelCode +
                           "' code; kiln compiles generated kernels to host objects only");
    KILN_ASSIGN_OR_RETURN(const codegen::CpuTarget target,
                          codegen::resolveCpuTarget(opts_.targetCpu));
    if (target.cpu != codegen::hostCpuName()) report_.remarks.push_back(target.note);
    codegen::CpuCompileOptions copts;
    copts.cpu = target.cpu;
    copts.features = target.features;
    copts.tuneCpu = target.tuneCpu;
    const std::string identity = codegen::compilerIdentity(copts);
    codegen::KernelCache& cache = kernelCache();
    const int per = std::max(1, opts_.kernelsPerModule);
    std::vector<codegen::CpuSource> sources;
    std::vector<codegen::CacheKey> keys;
    for (size_t b = 0; b < kernels_.size(); b += per) {
      const size_t e = std::min(kernels_.size(), b + per);
      std::span<const codegen::Kernel> chunk(kernels_.data() + b, e - b);
      const std::string module = "kiln_module" + std::to_string(sources.size());
      std::string src = codegen::renderModule(chunk, codegen::Dialect::kCpu);
      for (size_t i = b; i < e; ++i)
        report_.kernels.push_back({kernels_[i].name, module, kernelGroup_[i],
                                   codegen::renderKernel(kernels_[i], codegen::Dialect::kCpu), ""});
      keys.push_back(codegen::CacheKeyBuilder().add("cpu-object").add(src).add(identity).finish());
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
        *opts_.log << "compiling " << misses.size() << " kernel module(s) (" << kernels_.size()
                   << " kernels)...\n";
      auto results = codegen::compileCppParallel(misses, copts, opts_.compileThreads);
      for (size_t j = 0; j < results.size(); ++j) {
        if (!results[j]) return results[j].status().withContext("compiling generated kernels");
        objects[missIndex[j]] = std::move(results[j]->bytes);
        cacheStored(cache, cache.store(keys[missIndex[j]], objects[missIndex[j]]));
      }
    }
    std::vector<runtime::KernelObject> loadable;
    for (size_t i = 0; i < objects.size(); ++i)
      loadable.push_back({sources[i].moduleName, objects[i]});
    KILN_ASSIGN_OR_RETURN(code_, backend_->loadKernels(loadable));
    code_info_->triple = codegen::hostTriple();
    code_info_->cpu = copts.cpu;
    code_info_->features = copts.features;
    for (size_t i = 0; i < objects.size(); ++i)
      code_info_->modules.push_back(
          {sources[i].moduleName, std::move(sources[i].source), std::move(objects[i])});
    for (size_t i = 0; i < kernels_.size(); ++i) {
      KILN_ASSIGN_OR_RETURN(const void* entry, code_->entry(kernels_[i].name));
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
    const std::string src = codegen::renderModule(kernels_, codegen::Dialect::kCuda);
    for (size_t i = 0; i < kernels_.size(); ++i)
      report_.kernels[i].cuda = codegen::renderKernel(kernels_[i], codegen::Dialect::kCuda);
    for (int arch : {80, 90}) {
      auto ptx = codegen::compileCuda(src, "kiln_kernels.cu", arch);
      if (!ptx)
        report_.cudaErrors.push_back("sm_" + std::to_string(arch) + ": " + ptx.status().message());
      else
        code_info_->ptx.emplace_back("sm_" + std::to_string(arch), std::move(ptx->ptx));
    }
    report_.cudaKernelsChecked = static_cast<int>(kernels_.size());
    return Status::ok();
  }

  const ir::Value* root(const ir::Value* v) const {
    for (auto it = aliasOf_.find(v); it != aliasOf_.end(); it = aliasOf_.find(v)) v = it->second;
    return v;
  }

  // Whether step `writer`, which produces `v`, may write it over parameter `p`: same type, p has
  // data, no later step and no graph output reads p (or a view of it), and the producing step reads
  // p, if at all, only as a generated kernel reading each element where it writes its outputs.
  bool canWriteOver(const ir::Value* v, int writer, const ir::Value* p) const {
    if (v->type().dtype != p->type().dtype || v->type().shape != p->type().shape ||
        p->data().byteSize() != v->type().byteSize())
      return false;
    for (const ir::Value* o : graph_.outputs())
      if (root(o) == p) return false;
    for (size_t si = static_cast<size_t>(writer); si < steps_.size(); ++si) {
      const StepDraft& s = steps_[si];
      for (size_t a = 0; a < s.inputs.size(); ++a) {
        if (root(s.inputs[a]) != p) continue;
        if (static_cast<int>(si) > writer) return false;
        // The writer itself: each element of p is loaded in the iteration that stores that
        // element of every output (a fused SGD or Adam update stores a parameter and its state
        // together).
        if (s.kind != runtime::PlanStep::Kind::kKernel || s.inputs[a] != p) return false;
        const codegen::Kernel& k = kernels_[s.kernel];
        for (const auto& l : k.loads)
          for (const auto& st : k.stores)
            if (l.arg == static_cast<int>(a) &&
                (l.offset != st.access.offset || l.strides != st.access.strides))
              return false;
      }
    }
    return true;
  }

  Status buildPlan() {
    auto plan = std::make_shared<runtime::Plan>();
    for (const ir::Value* v : graph_.inputs()) {
      plan->inputs.push_back(v->type());
      plan->inputNames.push_back(v->name());
    }
    std::unordered_map<const ir::Value*, int> storageOf;
    std::vector<Storage> storages;
    auto addStorage = [&](const ir::Value* v, runtime::BufferRef::Kind kind, int index, int step) {
      storageOf[v] = static_cast<int>(storages.size());
      storages.push_back({kind, index, step, step, static_cast<int64_t>(v->type().byteSize())});
    };
    for (size_t i = 0; i < graph_.inputs().size(); ++i)
      addStorage(graph_.inputs()[i], runtime::BufferRef::Kind::kInput, static_cast<int>(i), -1);
    for (size_t i = 0; i < graph_.parameters().size(); ++i) {
      addStorage(graph_.parameters()[i], runtime::BufferRef::Kind::kParameter, static_cast<int>(i),
                 -1);
      plan->parameters.push_back(graph_.parameters()[i]->data());
      report_.parameterBytes += static_cast<int64_t>(graph_.parameters()[i]->data().byteSize());
    }
    // Graph outputs produced by a step are written straight into the result tensors; any
    // other output (an input, a parameter, a reshape, a repeated output) is copied at the end.
    std::vector<const ir::Value*> copyToOutput(graph_.outputs().size(), nullptr);
    std::unordered_map<const ir::Value*, int> producedByStep;  // Value -> its step.
    for (size_t si = 0; si < steps_.size(); ++si)
      for (const ir::Value* v : steps_[si].outputs) producedByStep[v] = static_cast<int>(si);
    std::unordered_map<size_t, const ir::Value*> inPlaceTarget;  // Output -> its parameter.
    for (const auto& [index, name] : opts_.inPlaceOutputs)
      for (const ir::Value* p : graph_.parameters())
        if (p->name() == name && index < graph_.outputs().size()) inPlaceTarget[index] = p;
    plan->outputParameter.assign(graph_.outputs().size(), -1);
    for (size_t i = 0; i < graph_.outputs().size(); ++i) {
      const ir::Value* v = graph_.outputs()[i];
      plan->outputs.push_back(v->type());
      if (producedByStep.count(v) && !storageOf.count(v)) {
        auto target = inPlaceTarget.find(i);
        if (target != inPlaceTarget.end() &&
            canWriteOver(v, producedByStep.at(v), target->second)) {
          storageOf[v] = storageOf.at(target->second);
          plan->outputParameter[i] = storages[storageOf[v]].index;
          continue;
        }
        addStorage(v, runtime::BufferRef::Kind::kOutput, static_cast<int>(i), 0);
      } else {
        copyToOutput[i] = v;
      }
    }
    const int numSteps = static_cast<int>(steps_.size());
    for (int si = 0; si < numSteps; ++si)
      for (const ir::Value* v : steps_[si].outputs)
        if (!storageOf.count(v)) addStorage(v, runtime::BufferRef::Kind::kArena, 0, si);
    auto storageFor = [&](const ir::Value* v) { return storageOf.at(root(v)); };
    {
      // The schedule must be topological: every step reads what earlier steps produced.
      std::unordered_set<const ir::Value*> ready;
      for (const ir::Value* v : graph_.inputs()) ready.insert(v);
      for (const ir::Value* v : graph_.parameters()) ready.insert(v);
      for (const auto& s : steps_) {
        for (const ir::Value* v : s.inputs)
          if (!ready.count(root(v)))
            return internalError("step '" + s.name + "' reads %" + v->name() +
                                 " before any step produces it");
        for (const ir::Value* v : s.outputs) ready.insert(v);
      }
    }
    for (int si = 0; si < numSteps; ++si)
      for (const ir::Value* v : steps_[si].inputs) {
        Storage& s = storages[storageFor(v)];
        s.lastStep = std::max(s.lastStep, si);
      }
    for (const ir::Value* v : copyToOutput) {
      if (!v) continue;
      if (!storageOf.count(root(v)))
        return internalError("graph output %" + v->name() + " is not produced by any step");
      storages[storageFor(v)].lastStep = numSteps;
    }

    // Arena requests, with in-place hints for kernels that read and write one index map.
    std::vector<BufferRequest> requests;
    std::vector<int> requestOf(storages.size(), -1);
    for (size_t i = 0; i < storages.size(); ++i)
      if (storages[i].kind == runtime::BufferRef::Kind::kArena) {
        requestOf[i] = static_cast<int>(requests.size());
        requests.push_back({storages[i].bytes, storages[i].firstStep, storages[i].lastStep, -1});
      }
    for (int si = 0; si < numSteps; ++si) {
      const StepDraft& s = steps_[si];
      if (s.kind != runtime::PlanStep::Kind::kKernel || s.outputs.size() != 1) continue;
      const codegen::Kernel& k = kernels_[s.kernel];
      // Reduction kernels too: they read a row in every stage before their element loop writes
      // it. (They once ran 3.5x slower in place: LLVM's run-time overlap check sent the loop
      // to its scalar version; the renderer's assume_safety pragma removed that.)
      const int out = requestOf[storageFor(s.outputs[0])];
      if (out < 0 || k.stores.size() != 1) continue;
      for (size_t a = 0; a < s.inputs.size(); ++a) {
        const int in = requestOf[storageFor(s.inputs[a])];
        if (in < 0 || requests[in].lastStep != si || requests[in].bytes != requests[out].bytes)
          continue;
        if (root(s.inputs[a]) != s.inputs[a]) continue;  // Shared with a reshape: keep it.
        bool shared = false;  // Another argument reading the same bytes would see the writes.
        for (size_t b = 0; b < s.inputs.size(); ++b)
          shared = shared || (b != a && storageFor(s.inputs[b]) == storageFor(s.inputs[a]));
        if (shared) continue;
        int loadsOfArg = 0;
        bool sameMap = false;
        for (const auto& l : k.loads)
          if (l.arg == static_cast<int>(a)) {
            ++loadsOfArg;
            sameMap =
                l.offset == k.stores[0].access.offset && l.strides == k.stores[0].access.strides;
          }
        if (loadsOfArg == 1 && sameMap) {
          requests[out].inplaceOf = in;
          break;
        }
      }
    }
    MemoryPlan mp = planMemory(requests);
    KILN_TRY(checkMemoryPlan(requests, mp).withContext("internal memory plan check"));
    plan->arenaBytes = mp.arenaBytes;
    report_.arenaBytes = mp.arenaBytes;
    report_.arenaLowerBound = mp.lowerBound;
    report_.inplaceReuses = mp.inplaceReuses;

    auto ref = [&](const ir::Value* v) {
      const Storage& s = storages[storageFor(v)];
      runtime::BufferRef b;
      b.kind = s.kind;
      b.index = s.index;
      if (s.kind == runtime::BufferRef::Kind::kArena)
        b.offset = mp.offsets[requestOf[storageFor(v)]];
      b.type = v->type();
      return b;
    };
    for (const auto& d : steps_) {
      runtime::PlanStep s;
      s.kind = d.kind;
      s.name = d.name;
      for (const ir::Value* v : d.inputs) s.inputs.push_back(ref(v));
      for (const ir::Value* v : d.outputs) s.outputs.push_back(ref(v));
      if (d.kind == runtime::PlanStep::Kind::kKernel) {
        s.kernel = kernelEntries_[d.kernel];
        s.units = kernels_[d.kernel].numUnits();
        s.elements = kernels_[d.kernel].numElements();
      } else {
        s.op = d.node->op();
        s.attrs = d.node->attrs();
        s.library = d.library;
        s.postOps = d.postOps;
        s.numExtra = d.numExtra;
        s.libraryOptions.algo = d.algo;
        s.libraryOptions.channelsLast = d.channelsLast;
        ++report_.referenceSteps;
      }
      plan->steps.push_back(std::move(s));
    }
    for (size_t i = 0; i < copyToOutput.size(); ++i) {
      if (!copyToOutput[i]) continue;
      runtime::PlanStep s;
      s.kind = runtime::PlanStep::Kind::kCopy;
      s.name = "copy to output " + std::to_string(i);
      s.inputs.push_back(ref(copyToOutput[i]));
      runtime::BufferRef o;
      o.kind = runtime::BufferRef::Kind::kOutput;
      o.index = static_cast<int>(i);
      o.type = graph_.outputs()[i]->type();
      s.outputs.push_back(o);
      plan->steps.push_back(std::move(s));
      ++report_.copySteps;
    }
    plan->backend = backend_;
    plan->code = code_;
    plan_ = std::move(plan);
    return Status::ok();
  }

  const CompileOptions& opts_;
  std::shared_ptr<runtime::Backend> backend_;
  bool libraryFusion_;  // Library epilogues and channels-last: asked for and supported.
  CompileReport report_;
  ir::Graph graph_;
  passes::FusionPlan fusion_;
  std::unordered_set<const ir::Value*> graphOutputs_;
  std::unordered_map<const ir::Value*, const ir::Value*> aliasOf_;
  std::vector<StepDraft> steps_;
  std::vector<codegen::Kernel> kernels_;
  std::vector<std::string> kernelGroup_;
  std::vector<const void*> kernelEntries_;
  std::shared_ptr<runtime::KernelModule> code_;
  std::shared_ptr<CompiledCode> code_info_ = std::make_shared<CompiledCode>();
  std::shared_ptr<runtime::Plan> plan_;
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

Expected<std::vector<runtime::Tensor>> CompiledModel::run(std::span<const runtime::Tensor> inputs,
                                                          runtime::PlanRunStats* stats) {
  return exec_.run(inputs, stats);
}

Expected<std::unique_ptr<CompiledModel>> compile(const ir::Graph& graph,
                                                 const CompileOptions& options) {
  return Driver(options).run(graph);
}

}  // namespace kiln::compiler
