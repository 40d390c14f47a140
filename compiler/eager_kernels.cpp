#include "compiler/eager_kernels.h"

#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>

#include "ir/printer.h"

namespace kiln::compiler {

namespace {

// KILN_LOG=fallback: say which nodes run as op calls.
bool logFallbacks() {
  const char* env = std::getenv("KILN_LOG");
  return env && std::string_view(env).find("fallback") != std::string_view::npos;
}

struct Cache {
  std::shared_ptr<runtime::Backend> backend;
  CompileOptions options;
  std::mutex mu;
  struct Entry {
    std::unique_ptr<CompiledModel> model;  // Keeps the kernel's code loaded.
    std::optional<runtime::NodeKernel> kernel;
  };
  std::map<std::string, Entry> entries;

  static std::string key(const ir::Node& n) {
    std::string k(ir::opName(n.op()));
    for (const ir::Value* v : n.inputs()) k += " " + v->type().toString();
    for (const auto& [name, value] : n.attrs()) k += " " + name + "=" + ir::printAttrValue(value);
    return k;
  }

  Expected<std::optional<runtime::NodeKernel>> get(const ir::Node& n) {
    const std::string k = key(n);
    std::lock_guard lock(mu);
    if (auto it = entries.find(k); it != entries.end()) return it->second.kernel;
    // The node alone, each input position a graph input of its own.
    ir::Graph g("eager_" + std::string(ir::opName(n.op())));
    std::vector<ir::Value*> ins;
    for (size_t i = 0; i < n.inputs().size(); ++i) {
      KILN_ASSIGN_OR_RETURN(ir::Value * v,
                            g.addInput("x" + std::to_string(i), n.inputs()[i]->type()));
      ins.push_back(v);
    }
    KILN_ASSIGN_OR_RETURN(ir::Node * node, g.addNode(n.op(), ins, n.attrs()));
    g.setOutputs({node->output()});
    CompileOptions o = options;
    o.backend = backend;
    o.inference = false;  // The node as it is: no training-mode rewrites, nothing folded.
    o.cudaGraphs = false;
    o.log = nullptr;
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<CompiledModel> model, compile(g, o));
    std::optional<runtime::NodeKernel> kernel;
    const runtime::Plan& plan = model->plan();
    // An op kernel reading indices unchecked (a loss, a gather) relies on the plan's host check,
    // which eager calls do not run: the op runs as an op call, whose kernel checks them.
    if (plan.steps.size() == 1 && plan.arenaBytes == 0 && plan.indexChecks.empty()) {
      const runtime::PlanStep& s = plan.steps[0];
      if (s.kind == runtime::PlanStep::Kind::kKernel || s.kind == runtime::PlanStep::Kind::kCopy) {
        runtime::NodeKernel nk;
        bool ok = true;
        for (const runtime::BufferRef& b : s.inputs)
          ok = ok && b.kind == runtime::BufferRef::Kind::kInput;
        for (const runtime::BufferRef& b : s.outputs)
          ok = ok && b.kind == runtime::BufferRef::Kind::kOutput;
        if (ok && s.kind == runtime::PlanStep::Kind::kKernel) {
          nk.entry = s.kernel;
          nk.units = s.units, nk.elements = s.elements, nk.block = s.block, nk.grid = s.grid;
          nk.scratchBytes = s.scratchBytes;
          for (const auto& b : s.inputs) nk.args.push_back(b.index);
          for (const auto& b : s.outputs) nk.args.push_back(-1 - b.index);
        } else if (ok && (s.inputs.size() != 1 || s.inputs[0].index != 0)) {
          ok = false;  // A copy of something else than input 0.
        }
        if (ok) kernel = nk;
      }
    }
    if (!kernel && logFallbacks()) {
      std::string steps;
      for (const auto& st : plan.steps) steps += (steps.empty() ? "" : ", ") + st.name;
      std::cerr << "kiln: eager on " << backend->name() << ": " << k
                << " has no single kernel (its plan: " << steps << "); it runs as an op call\n";
    }
    auto [it, inserted] = entries.emplace(k, Entry{std::move(model), kernel});
    return it->second.kernel;
  }
};

}  // namespace

runtime::NodeKernelFn eagerKernels(std::shared_ptr<runtime::Backend> backend,
                                   const CompileOptions& options) {
  auto cache = std::make_shared<Cache>();
  cache->backend = std::move(backend);
  cache->options = options;
  return [cache](const ir::Node& n) { return cache->get(n); };
}

Status useDeviceKernels(runtime::EagerExecutor& exec,
                        const std::shared_ptr<runtime::Backend>& backend,
                        const CompileOptions& options) {
  KILN_TRY(checkPrecision(options.precision, *backend));
  runtime::LibraryOptions calls;
  calls.tf32 = options.precision == Precision::kTf32;
  exec.setCallOptions(calls);
  if (backend->caps().runsCudaKernels()) exec.setNodeKernels(eagerKernels(backend, options));
  return Status::ok();
}

}  // namespace kiln::compiler
