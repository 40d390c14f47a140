#include "compiler/plan_builder.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "codegen/render.h"
#include "compiler/memory_plan.h"

namespace kiln::compiler {

namespace {

// Where a value's bytes live: a storage id, shared by a reshape and its input.
struct Storage {
  runtime::BufferRef::Kind kind;
  int index = 0;  // Input/parameter/output number, or the arena request.
  int firstStep = 0;
  int lastStep = 0;
  int64_t bytes = 0;
};

class PlanBuilder {
 public:
  PlanBuilder(const PlanBuildInputs& in, CompileReport& report)
      : graph_(in.graph),
        s_(in.schedule),
        entries_(in.kernelEntries),
        code_(in.code),
        backend_(in.backend),
        inPlaceOutputs_(in.inPlaceOutputs),
        tf32_(in.tf32),
        report_(report) {}

  // Whether step `writer`, which produces `v`, may write it over parameter `p`: same type, p has
  // data, no later step and no graph output reads p (or a view of it), and the producing step reads
  // p, if at all, only as a generated kernel reading each element where it writes its outputs.
  bool canWriteOver(const ir::Value* v, int writer, const ir::Value* p) const {
    if (v->type().dtype != p->type().dtype || v->type().shape != p->type().shape ||
        p->data().byteSize() != v->type().byteSize())
      return false;
    for (const ir::Value* o : graph_.outputs())
      if (s_.root(o) == p) return false;
    for (size_t si = static_cast<size_t>(writer); si < s_.steps.size(); ++si) {
      const StepDraft& s = s_.steps[si];
      for (size_t a = 0; a < s.inputs.size(); ++a) {
        if (s_.root(s.inputs[a]) != p) continue;
        if (static_cast<int>(si) > writer) return false;
        // The writer itself: each element of p is loaded in the iteration that stores that
        // element of every output (a fused SGD or Adam update stores a parameter and its state
        // together).
        if (s.kind != runtime::PlanStep::Kind::kKernel || s.inputs[a] != p) return false;
        const auto out = std::find(s.outputs.begin(), s.outputs.end(), v);
        if (out == s.outputs.end()) return false;
        if (!readsOnlyWhereStored(s_.kernels[s.kernel], static_cast<int>(a),
                                  static_cast<int>(s.inputs.size() + (out - s.outputs.begin()))))
          return false;
      }
    }
    return true;
  }

  // Whether kernel `k` loads argument `a` only in the iterations that store, at the same element,
  // every output of the kernel (of a horizontal kernel: of the part that writes argument `out`;
  // no other part may read `a`, as they run at the same time).
  static bool readsOnlyWhereStored(const codegen::Kernel& k, int a, int out) {
    if (k.isOpKernel()) return false;  // Its accesses are its source's: nothing to compare.
    auto sameMaps = [](const codegen::Kernel& part, int arg) {
      for (const auto& l : part.loads)
        for (const auto& st : part.stores)
          if (l.arg == arg && (l.offset != st.access.offset || l.strides != st.access.strides))
            return false;
      return true;
    };
    if (!k.isHorizontal()) return sameMaps(k, a);
    for (size_t i = 0; i < k.parts.size(); ++i) {
      const std::vector<int>& args = k.partArgs[i];
      const bool writesOut = std::find(args.begin(), args.end(), out) != args.end();
      for (size_t j = 0; j < args.size(); ++j)
        if (args[j] == a && (!writesOut || !sameMaps(k.parts[i], static_cast<int>(j))))
          return false;
    }
    return true;
  }

  Expected<std::shared_ptr<runtime::Plan>> build() {
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
    for (size_t si = 0; si < s_.steps.size(); ++si)
      for (const ir::Value* v : s_.steps[si].outputs) producedByStep[v] = static_cast<int>(si);
    std::unordered_map<size_t, const ir::Value*> inPlaceTarget;  // Output -> its parameter.
    for (const auto& [index, name] : inPlaceOutputs_)
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
    const int numSteps = static_cast<int>(s_.steps.size());
    for (int si = 0; si < numSteps; ++si)
      for (const ir::Value* v : s_.steps[si].outputs)
        if (!storageOf.count(v)) addStorage(v, runtime::BufferRef::Kind::kArena, 0, si);
    auto storageFor = [&](const ir::Value* v) { return storageOf.at(s_.root(v)); };
    {
      // The schedule must be topological: every step reads what earlier steps produced.
      std::unordered_set<const ir::Value*> ready;
      for (const ir::Value* v : graph_.inputs()) ready.insert(v);
      for (const ir::Value* v : graph_.parameters()) ready.insert(v);
      for (const auto& s : s_.steps) {
        for (const ir::Value* v : s.inputs)
          if (!ready.count(s_.root(v)))
            return internalError("step '" + s.name + "' reads %" + v->name() +
                                 " before any step produces it");
        for (const ir::Value* v : s.outputs) ready.insert(v);
      }
    }
    for (int si = 0; si < numSteps; ++si)
      for (const ir::Value* v : s_.steps[si].inputs) {
        Storage& s = storages[storageFor(v)];
        s.lastStep = std::max(s.lastStep, si);
      }
    for (const ir::Value* v : copyToOutput) {
      if (!v) continue;
      if (!storageOf.count(s_.root(v)))
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
    // A library convolution whose first post-op adds a residual that nothing reads later writes
    // its output over that residual: the libraries add it in place (oneDNN's sum post-op,
    // cuDNN's beta = 1) instead of first copying it into the output (resnet50 batch 32: 705 MB
    // a run). Library paths that cannot read it in place copy it aside first
    // (runLibraryWithPostOps's detachAliasedExtras), as they would for any aliased operand.
    auto residualInPlace = [&](const StepDraft& s, int si) {
      if (s.kind != runtime::PlanStep::Kind::kOp || !s.library || !s.node ||
          s.node->op() != ir::OpKind::kConv2d || s.postOps.empty() ||
          s.postOps[0].kind != runtime::PostOp::Kind::kAdd || s.outputs.size() != 1)
        return false;
      const ir::Value* r = s.extra[static_cast<size_t>(s.postOps[0].input)];
      const int out = requestOf[storageFor(s.outputs[0])];
      const int in = requestOf[storageFor(r)];
      if (out < 0 || in < 0 || requests[in].lastStep != si ||
          requests[in].bytes != requests[out].bytes || s_.root(r) != r ||
          r->type() != s.outputs[0]->type())
        return false;
      int readers = 0;  // The residual's bytes reach the call through this operand alone.
      for (const ir::Value* v : s.inputs) readers += storageFor(v) == storageFor(r);
      if (readers != 1) return false;
      requests[out].inplaceOf = in;
      return true;
    };
    for (int si = 0; si < numSteps; ++si) {
      const StepDraft& s = s_.steps[si];
      if (residualInPlace(s, si)) continue;
      if (s.kind != runtime::PlanStep::Kind::kKernel) continue;
      const codegen::Kernel& k = s_.kernels[s.kernel];
      if (k.isHorizontal()) continue;
      // Reduction kernels too: they read a row in every stage before their element loop writes
      // it. (They once ran 3.5x slower in place: LLVM's run-time overlap check sent the loop
      // to its scalar version; the renderer's assume_safety pragma removed that.) A reduction's
      // row outputs (squeeze-excite's mean beside the activation it averages) are other buffers:
      // its one element output may still go over its input. Written elsewhere, those writes were
      // most of the kernel: mobilenet_v3_small's hardswish + mean over 7 x 7 x 576 took 18-100 us
      // a run on 2 threads where the same call repeated at once took 3-5, and 4.5 after a loop
      // had written one float of each of its output's lines; a loop reading its input first left
      // it at 18-26 us in three of four launches.
      int element = -1, elements = 0;
      for (size_t i = 0; i < k.stores.size(); ++i)
        if (!k.stores[i].row) element = static_cast<int>(i), ++elements;
      if (elements != 1) continue;
      const codegen::Store& store = k.stores[static_cast<size_t>(element)];
      const int outIndex = store.access.arg - static_cast<int>(s.inputs.size());
      if (outIndex < 0 || outIndex >= static_cast<int>(s.outputs.size()) ||
          k.args[static_cast<size_t>(store.access.arg)].value !=
              s.outputs[static_cast<size_t>(outIndex)]->name())
        continue;
      const int out = requestOf[storageFor(s.outputs[static_cast<size_t>(outIndex)])];
      if (out < 0) continue;
      for (size_t a = 0; a < s.inputs.size(); ++a) {
        const int in = requestOf[storageFor(s.inputs[a])];
        if (in < 0 || requests[in].lastStep != si || requests[in].bytes != requests[out].bytes)
          continue;
        if (s_.root(s.inputs[a]) != s.inputs[a]) continue;  // Shared with a reshape: keep it.
        bool shared = false;  // Another argument reading the same bytes would see the writes.
        for (size_t b = 0; b < s.inputs.size(); ++b)
          shared = shared || (b != a && storageFor(s.inputs[b]) == storageFor(s.inputs[a]));
        if (shared) continue;
        int loadsOfArg = 0;
        bool sameMap = false;
        for (const auto& l : k.loads)
          if (l.arg == static_cast<int>(a)) {
            ++loadsOfArg;
            sameMap = l.offset == store.access.offset && l.strides == store.access.strides;
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
    plan->indexChecks = s_.indexChecks;
    // After the buffers: the op kernels' workspace (one, as large as the largest: steps run one
    // after another), then the device index checks' words (Plan::indexWordsOffset).
    int64_t workspace = 0;
    for (const StepDraft& d : s_.steps) workspace = std::max(workspace, d.workspace);
    const int64_t workspaceOffset = (mp.arenaBytes + 255) / 256 * 256;
    if (workspace > 0) plan->arenaBytes = workspaceOffset + workspace;
    plan->deviceIndexChecks = s_.deviceIndexChecks;
    if (!s_.deviceIndexChecks.empty()) {
      plan->indexWordsOffset = (plan->arenaBytes + 63) / 64 * 64;
      plan->arenaBytes =
          plan->indexWordsOffset + static_cast<int64_t>(8 * s_.deviceIndexChecks.size());
    }
    report_.arenaBytes = plan->arenaBytes;
    report_.arenaLowerBound = mp.lowerBound;
    report_.inplaceReuses = mp.inplaceReuses;

    auto ref = [&](const ir::Value* v) {
      const Storage& s = storages[storageFor(v)];
      runtime::BufferRef b;
      b.kind = s.kind;
      b.index = s.index;
      if (s.kind == runtime::BufferRef::Kind::kArena)
        b.offset = mp.offsets[requestOf[storageFor(v)]] + s_.rootOffset(v);
      b.type = v->type();
      return b;
    };
    std::map<std::string, int> hostOps;  // Op name -> steps run on the host.
    for (const auto& d : s_.steps) {
      runtime::PlanStep s;
      s.kind = d.kind;
      s.name = d.name;
      for (const ir::Value* v : d.inputs) s.inputs.push_back(ref(v));
      for (const ir::Value* v : d.outputs) s.outputs.push_back(ref(v));
      if (d.workspace > 0) {  // After the output: its workspace.
        runtime::BufferRef w;
        w.offset = workspaceOffset;
        w.type = ir::TensorType{ir::DType::kU8, {d.workspace}};
        s.outputs.push_back(w);
      }
      if (d.indexWord >= 0) {  // The last argument: its index word.
        runtime::BufferRef w;
        w.offset = plan->indexWordsOffset + 8 * int64_t{d.indexWord};
        w.type = ir::TensorType{ir::DType::kI64, {1}};
        s.outputs.push_back(w);
      }
      if (d.kind == runtime::PlanStep::Kind::kKernel) {
        s.kernel = entries_[d.kernel];
        s.units = s_.kernels[d.kernel].numUnits();
        s.elements = s_.kernels[d.kernel].numElements();
        const runtime::BackendCaps::Cuda& cuda = backend_->caps().cuda;
        if (backend_->caps().runsCudaKernels()) {
          const codegen::CudaLaunchGeometry g = codegen::cudaLaunchGeometry(
              s_.kernels[d.kernel], cuda.multiProcessors, cuda.maxThreadsPerBlock);
          s.block = g.block;
          s.grid = g.grid;
        } else if (const codegen::CpuRowSplit split = codegen::cpuRowSplit(s_.kernels[d.kernel]);
                   split.chunks > 0) {  // The CPU dialect renders it split (compile.cpp).
          s.units = split.chunks;
          s.scratchBytes = split.scratchBytes;
        }
      } else {
        s.op = d.node->op();
        s.attrs = d.node->attrs();
        s.library = d.library;
        s.postOps = d.postOps;
        s.numExtra = d.numExtra;
        s.libraryOptions.algo = d.algo;
        s.libraryOptions.channelsLast = d.channelsLast;
        s.libraryOptions.tf32 = tf32_ && s.library;
        ++report_.referenceSteps;
        // On a GPU backend an op that is neither a generated kernel nor a device library call
        // runs on the host, with copies each way (runtime/gpu/gpu_backend.h): say which.
        if (backend_->caps().runsCudaKernels() && !s.library) {
          ++report_.hostSteps;
          ++hostOps[std::string(ir::opName(s.op))];
        }
      }
      plan->steps.push_back(std::move(s));
      StepWork w;
      if (!d.nodes.empty()) w.firstNode = d.nodes.front()->name();
      for (const ir::Node* n : d.nodes) {
        const std::string op(ir::opName(n->op()));
        if (("+" + w.ops + "+").find("+" + op + "+") == std::string::npos)
          w.ops += (w.ops.empty() ? "" : "+") + op;
        w.work += ir::countWork(*n);
      }
      report_.stepWork.push_back(std::move(w));
    }
    if (!hostOps.empty()) {
      std::string list;
      for (const auto& [op, n] : hostOps)
        list += (list.empty() ? "" : ", ") + op + (n > 1 ? " x" + std::to_string(n) : "");
      report_.remarks.push_back(std::to_string(report_.hostSteps) + " op(s) run on the host (no " +
                                std::string(backend_->name()) + " kernel yet): " + list);
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
      report_.stepWork.push_back({"copy", {}, {}});
      ++report_.copySteps;
    }
    plan->backend = std::move(backend_);
    plan->code = std::move(code_);
    return plan;
  }

 private:
  const ir::Graph& graph_;
  const Schedule& s_;
  std::span<const void* const> entries_;
  std::shared_ptr<runtime::KernelModule> code_;
  std::shared_ptr<runtime::Backend> backend_;
  const std::vector<std::pair<size_t, std::string>>& inPlaceOutputs_;
  bool tf32_;
  CompileReport& report_;
};

}  // namespace

Expected<std::shared_ptr<runtime::Plan>> buildPlan(const PlanBuildInputs& in,
                                                   CompileReport& report) {
  return PlanBuilder(in, report).build();
}

}  // namespace kiln::compiler
