// JIT at first run: kiln::jit(graph) returns a callable that compiles on the first call for
// each input signature (dtypes and shapes are the guards), reuses the compiled model on later
// calls, says which guard failed when it recompiles, and stops past a recompile limit.
#pragma once

#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "compiler/compile.h"

namespace kiln::compiler {

// The same graph with new input types: every node's output type is inferred again. Fails,
// naming the node, when an attribute pins a shape the new inputs contradict (e.g. a reshape
// to a fixed batch).
Expected<ir::Graph> respecialize(const ir::Graph& g, std::span<const ir::TensorType> inputs);

// Whether `inputs` may run `g` after specialization: the count matches, and an input with
// symbolic dims (Value::dimNames) keeps its dtype, rank and every static dim, and each dim name
// has one size across the inputs. Inputs without dim names (builder graphs) may change any dim
// and dtype that shape inference accepts.
// Errors name the input and dim, expected vs actual.
Status checkSignature(const ir::Graph& g, std::span<const ir::TensorType> inputs);

class JitModule {
 public:
  // `specializer` makes the graph for new input shapes (e.g. the ONNX importer again); without
  // one, respecialize() infers the node types again.
  JitModule(const ir::Graph& graph, CompileOptions options = {}, int recompileLimit = 8,
            ir::GraphSpecializer specializer = {});

  Expected<std::vector<runtime::Tensor>> operator()(std::span<const runtime::Tensor> inputs);

  int compiles() const { return compiles_; }
  int recompiles() const { return compiles_ > 0 ? compiles_ - 1 : 0; }
  // One line per compile: the signature and, for recompiles, which guard failed.
  const std::vector<std::string>& log() const { return log_; }
  // The model compiled for the most recent call.
  const CompiledModel* last() const { return last_; }

 private:
  ir::Graph graph_;
  CompileOptions options_;
  ir::GraphSpecializer specializer_;
  int limit_;
  int compiles_ = 0;
  std::map<std::string, std::unique_ptr<CompiledModel>> bySignature_;
  std::string lastSignature_;
  std::vector<ir::TensorType> lastTypes_;
  std::vector<std::string> log_;
  CompiledModel* last_ = nullptr;
};

}  // namespace kiln::compiler

namespace kiln {
inline compiler::JitModule jit(const ir::Graph& graph, compiler::CompileOptions options = {},
                               ir::GraphSpecializer specializer = {}) {
  return compiler::JitModule(graph, std::move(options), 8, std::move(specializer));
}
}  // namespace kiln
