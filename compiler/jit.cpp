#include "compiler/jit.h"

#include <unordered_map>

#include "compiler/made_once.h"

namespace kiln::compiler {

Expected<ir::Graph> respecialize(const ir::Graph& g, std::span<const ir::TensorType> inputs) {
  if (inputs.size() != g.inputs().size())
    return invalidArgument("graph '" + g.name() + "' takes " + std::to_string(g.inputs().size()) +
                           " inputs, got " + std::to_string(inputs.size()));
  ir::Graph out(g.name());
  std::unordered_map<const ir::Value*, ir::Value*> map;
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(map[g.inputs()[i]], out.addInput(g.inputs()[i]->name(), inputs[i]));
    if (g.inputs()[i]->hasDimNames())
      KILN_TRY(out.setDimNames(map[g.inputs()[i]], g.inputs()[i]->dimNames()));
  }
  for (const ir::Value* p : g.parameters()) {
    KILN_ASSIGN_OR_RETURN(ir::Value * q, out.addParameter(p->name(), p->type(), p->trainable()));
    q->setData(p->data());
    if (p->isState()) KILN_TRY(out.markState(q));
    map[p] = q;
  }
  for (const ir::Node* n : g.nodes()) {
    std::vector<ir::Value*> ins;
    for (const ir::Value* v : n->inputs()) ins.push_back(map.at(v));
    std::vector<std::string> names;
    for (const ir::Value* o : n->outputs()) names.push_back(o->name());
    auto node = out.addNode(n->op(), std::move(ins), n->attrs(), names);
    if (!node)
      return node.status().withContext("cannot specialize for the new input shapes: " +
                                       n->describe());
    (*node)->setName(n->name());
    for (size_t i = 0; i < n->outputs().size(); ++i) map[n->output(i)] = (*node)->output(i);
  }
  std::vector<ir::Value*> outs;
  for (const ir::Value* o : g.outputs()) outs.push_back(map.at(o));
  out.setOutputs(outs);
  return out;
}

Status checkSignature(const ir::Graph& g, std::span<const ir::TensorType> inputs) {
  if (inputs.size() != g.inputs().size())
    return invalidArgument("graph '" + g.name() + "' takes " + std::to_string(g.inputs().size()) +
                           " inputs, got " + std::to_string(inputs.size()));
  std::map<std::string, std::pair<int64_t, std::string>> named;  // name -> size, where.
  for (size_t i = 0; i < inputs.size(); ++i) {
    const ir::Value* in = g.inputs()[i];
    const std::string where = "input '" + in->name() + "'";
    if (!in->hasDimNames()) continue;
    if (inputs[i].dtype != in->type().dtype)
      return invalidArgument(where + " has dtype " + std::string(ir::dtypeName(in->type().dtype)) +
                             ", got " + inputs[i].toString());
    const ir::Shape& want = in->type().shape;
    const ir::Shape& got = inputs[i].shape;
    if (got.size() != want.size())
      return invalidArgument(where + " has rank " + std::to_string(want.size()) + " (" +
                             in->type().toString() + "), got " + inputs[i].toString());
    for (size_t d = 0; d < want.size(); ++d) {
      const std::string& name = in->dimNames()[d];
      const std::string dim = where + " dim " + std::to_string(d);
      if (name.empty()) {
        if (got[d] != want[d])
          return invalidArgument(dim + " is fixed at " + std::to_string(want[d]) +
                                 " by the model, got " + std::to_string(got[d]) + " (" +
                                 inputs[i].toString() + "); only its symbolic dims may change");
        continue;
      }
      auto [it, fresh] = named.emplace(name, std::make_pair(got[d], dim));
      if (!fresh && it->second.first != got[d])
        return invalidArgument("symbolic dim '" + name + "' is " +
                               std::to_string(it->second.first) + " at " + it->second.second +
                               " but " + std::to_string(got[d]) + " at " + dim);
    }
  }
  return Status::ok();
}

namespace {
std::string signatureOf(std::span<const runtime::Tensor> inputs) {
  std::string s;
  for (const auto& t : inputs) s += (s.empty() ? "" : ", ") + t.type().toString();
  return "(" + s + ")";
}
}  // namespace

struct JitModule::Entry {
  MadeOnce once;
  std::unique_ptr<CompiledModel> model;
};

JitModule::JitModule(const ir::Graph& graph, CompileOptions options, int recompileLimit,
                     ir::GraphSpecializer specializer)
    : graph_(graph.clone()),
      options_(std::move(options)),
      specializer_(std::move(specializer)),
      limit_(recompileLimit) {}

JitModule::~JitModule() = default;

int JitModule::compiles() const {
  std::lock_guard lock(mu_);
  return compiles_;
}

std::vector<std::string> JitModule::log() const {
  std::lock_guard lock(mu_);
  return log_;
}

Expected<std::vector<runtime::Tensor>> JitModule::operator()(
    std::span<const runtime::Tensor> inputs, runtime::PlanRunStats* stats) {
  const std::string sig = signatureOf(inputs);
  std::vector<ir::TensorType> types;
  for (const auto& t : inputs) types.push_back(t.type());
  std::shared_ptr<Entry> entry;
  bool mine = false;  // This call compiles the signature.
  std::string why = "first call";
  {
    std::lock_guard lock(mu_);
    auto it = bySignature_.find(sig);
    if (it != bySignature_.end()) {
      entry = it->second;
    } else {
      if (!lastTypes_.empty()) {
        for (size_t i = 0; i < inputs.size() && i < lastTypes_.size(); ++i)
          if (inputs[i].type() != lastTypes_[i]) {
            why = "guard failed: input '" + graph_.inputs()[i]->name() + "' is " +
                  inputs[i].describe() + ", compiled for " + lastTypes_[i].toString();
            break;
          }
      }
      // Compiles in flight count too: their entries are in the table.
      if (static_cast<int>(bySignature_.size()) > limit_)
        return invalidArgument(
            "recompile limit (" + std::to_string(limit_) + ") reached: " + why +
            "; the model has been compiled for " + std::to_string(compiles_) +
            " input signatures. Pad inputs to a few fixed shapes, or raise the limit");
      KILN_TRY(checkSignature(graph_, types));
      entry = std::make_shared<Entry>();
      bySignature_.emplace(sig, entry);
      mine = true;
    }
    lastTypes_ = types;
  }
  if (mine) {
    // Compiled outside the module's lock: other signatures compile and run meanwhile, and
    // callers of this one wait on the entry.
    std::unique_ptr<CompiledModel> model;
    const Status compiled = MadeOnce::guarded("compiling for " + sig, [&]() -> Status {
      KILN_ASSIGN_OR_RETURN(model, compileFor(types));
      return Status::ok();
    });
    {
      std::lock_guard lock(mu_);
      if (compiled.isOk()) {
        ++compiles_;
        log_.push_back("compile " + std::to_string(compiles_) + " for " + sig + ": " + why);
        if (options_.log) *options_.log << "kiln jit: " << log_.back() << "\n";
      } else {
        bySignature_.erase(sig);  // A later call tries again.
      }
    }
    entry->model = std::move(model);
    entry->once.finish(compiled);
  }
  KILN_TRY(entry->once.wait());
  last_.store(entry->model.get(), std::memory_order_release);
  return entry->model->run(inputs, stats);
}

Expected<std::unique_ptr<CompiledModel>> JitModule::compileFor(
    const std::vector<ir::TensorType>& types) const {
  bool same = types.size() == graph_.inputs().size();
  for (size_t i = 0; same && i < types.size(); ++i)
    same = types[i].dtype == graph_.inputs()[i]->type().dtype &&
           types[i].shape == graph_.inputs()[i]->type().shape;
  if (same) return compile(graph_, options_);
  KILN_ASSIGN_OR_RETURN(ir::Graph specialized,
                        specializer_ ? specializer_(types) : respecialize(graph_, types));
  for (size_t i = 0; i < types.size(); ++i)
    if (i >= specialized.inputs().size() ||
        specialized.inputs()[i]->type().shape != types[i].shape ||
        specialized.inputs()[i]->type().dtype != types[i].dtype)
      return internalError("the graph specializer did not make input " + std::to_string(i) + " " +
                           types[i].toString());
  return compile(specialized, options_);
}

}  // namespace kiln::compiler
