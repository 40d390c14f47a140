#include "compiler/staged.h"

#include <algorithm>

#include "compiler/eager_kernels.h"
#include "compiler/made_once.h"
#include "runtime/reference/kernels.h"

namespace kiln::compiler {

namespace {

// The environment's values of `names`, in order; a name no stage computed is kiln's bug.
Expected<std::vector<runtime::Tensor>> valuesOf(
    const std::map<std::string, runtime::Tensor>& env, const std::vector<std::string>& names,
    const std::map<std::string, ir::TensorData>& constants = {}) {
  std::vector<runtime::Tensor> values;
  for (const std::string& name : names) {
    if (auto c = constants.find(name); c != constants.end()) {
      values.push_back(runtime::Tensor::fromData(c->second));
      continue;
    }
    auto it = env.find(name);
    if (it == env.end()) return internalError("no stage computed '" + name + "'");
    values.push_back(it->second);
  }
  return values;
}

}  // namespace

struct StagedModule::Entry {
  ir::Stage stage;
  std::unique_ptr<CompiledModel> compiled;  // Unless eager (or the stage has no graph).
  MadeOnce once;                            // By the first call that needs it.
};

StagedModule::StagedModule(ir::StagedModel model, CompileOptions options, bool eager,
                           size_t cacheLimit)
    : model_(std::move(model)),
      options_(std::move(options)),
      eager_(eager),
      limit_(std::max<size_t>(cacheLimit, 1)) {}

StagedModule::~StagedModule() = default;

int StagedModule::stagesMade() const {
  std::lock_guard<std::mutex> lock(mu_);
  return made_;
}

std::vector<std::string> StagedModule::log() const {
  std::lock_guard<std::mutex> lock(mu_);
  return log_;
}

Expected<std::shared_ptr<StagedModule::Entry>> StagedModule::stageFor(
    int64_t begin, const std::map<std::string, runtime::Tensor>& env,
    const std::map<std::string, int64_t>& sizes,
    const std::map<std::string, ir::TensorData>& known) {
  std::map<std::string, ir::TensorType> types;
  std::string key = std::to_string(begin);
  for (const auto& [name, t] : env) {
    types.emplace(name, ir::TensorType{t.dtype(), t.shape()});
    key += "|" + name + ":" + types.at(name).toString();
  }
  for (const auto& [name, size] : sizes) key += "|#" + name + "=" + std::to_string(size);
  std::shared_ptr<Entry> entry;
  bool mine = false;  // This call makes the stage.
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = cache_.find(key); it != cache_.end()) {
      entry = it->second;
      // The most recently used last: eviction takes the least recently used.
      auto at = std::find(order_.begin(), order_.end(), key);
      std::rotate(at, at + 1, order_.end());
    } else {
      entry = std::make_shared<Entry>();
      if (cache_.size() >= limit_) {  // An evicted entry lives on in the calls that hold it.
        cache_.erase(order_.front());
        order_.erase(order_.begin());
      }
      cache_.emplace(key, entry);
      order_.push_back(key);
      mine = true;
    }
  }
  if (!mine) {
    KILN_TRY(entry->once.wait());
    return entry;
  }
  // Made outside the module's lock (an import and compile take milliseconds to seconds):
  // stages of other sizes are made and cached stages run meanwhile.
  const Status made =
      MadeOnce::guarded("making the stage at node " + std::to_string(begin), [&]() -> Status {
        KILN_ASSIGN_OR_RETURN(entry->stage, model_.stage(begin, types, sizes, known));
        if (entry->stage.graph && !eager_) {
          KILN_ASSIGN_OR_RETURN(entry->compiled, compile(*entry->stage.graph, options_));
        }
        return Status::ok();
      });
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (made.isOk()) {
      ++made_;
      std::string line = "stage at node " + std::to_string(begin);
      for (const auto& [name, size] : sizes) line += ", " + name + " = " + std::to_string(size);
      line += entry->stage.graph
                  ? ": " + std::to_string(entry->stage.graph->nodes().size()) + " nodes"
                  : ": no nodes";
      if (entry->stage.cut)
        line += ", then " + entry->stage.cut->describe + " needs " + entry->stage.cut->need;
      log_.push_back(std::move(line));
    } else if (auto it = cache_.find(key); it != cache_.end() && it->second == entry) {
      cache_.erase(it);  // A later call tries again.
      order_.erase(std::find(order_.begin(), order_.end(), key));
    }
  }
  entry->once.finish(made);
  KILN_TRY(made);
  return entry;
}

Expected<std::vector<runtime::Tensor>> StagedModule::operator()(
    std::span<const runtime::Tensor> inputs) {
  if (inputs.size() != model_.inputs.size())
    return invalidArgument("the model takes " + std::to_string(model_.inputs.size()) +
                           " inputs, got " + std::to_string(inputs.size()));
  std::map<std::string, runtime::Tensor> env;
  for (size_t i = 0; i < inputs.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(runtime::Tensor t, inputs[i].contiguous());
    env.emplace(model_.inputs[i], std::move(t));
  }
  std::map<std::string, int64_t> sizes;
  std::map<std::string, ir::TensorData> known;
  int64_t begin = 0;
  for (;;) {
    KILN_ASSIGN_OR_RETURN(std::shared_ptr<Entry> entry, stageFor(begin, env, sizes, known));
    const ir::Stage& stage = entry->stage;
    if (stage.graph) {
      KILN_ASSIGN_OR_RETURN(std::vector<runtime::Tensor> in, valuesOf(env, stage.inputs));
      Expected<std::vector<runtime::Tensor>> out = internalError("not run");
      if (entry->compiled) {
        out = entry->compiled->run(in);
      } else {
        std::shared_ptr<runtime::Backend> backend =
            options_.backend ? options_.backend : runtime::defaultBackend();
        runtime::EagerExecutor exec(*stage.graph, backend);
        KILN_TRY(useDeviceKernels(exec, backend, options_));
        out = exec.run(in);
      }
      if (!out) return out.status();
      if (out->size() != stage.outputs.size())
        return internalError("a stage returned " + std::to_string(out->size()) + " values for " +
                             std::to_string(stage.outputs.size()) + " names");
      for (size_t i = 0; i < out->size(); ++i) env.insert_or_assign(stage.outputs[i], (*out)[i]);
    }
    for (const auto& [name, data] : stage.known) known.insert_or_assign(name, data);
    for (const auto& [name, value] : stage.decided) sizes.insert_or_assign(name, value);
    if (!stage.cut) break;
    const ir::StageCut& cut = *stage.cut;
    KILN_ASSIGN_OR_RETURN(std::vector<runtime::Tensor> values,
                          valuesOf(env, cut.inputs, cut.constants));
    Expected<int64_t> size = runtime::valueSizedCount(cut.op, cut.attrs, values);
    if (!size) return size.status().withContext(cut.describe);
    if (stage.next < begin || (stage.next == begin && sizes.count(cut.key)))
      return internalError(cut.describe + ": the model's stages do not advance");
    sizes[cut.key] = *size;
    begin = stage.next;
  }
  return valuesOf(env, model_.outputs);
}

}  // namespace kiln::compiler
