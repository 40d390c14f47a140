// JIT at first run: kiln::jit(graph) returns a callable that compiles on the first call for
// each input signature (dtypes and shapes are the guards), reuses the compiled model on later
// calls, says which guard failed when it recompiles, and stops past a recompile limit.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
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

// Thread-safe: calls may come from many threads at once. Concurrent first calls of one
// signature compile it once (the others wait for that compile and share its result or its
// error); calls of different signatures compile concurrently; compiled models run calls
// concurrently (see CompiledModel).
class JitModule {
 public:
  // `specializer` makes the graph for new input shapes (e.g. the ONNX importer again); without
  // one, respecialize() infers the node types again.
  JitModule(const ir::Graph& graph, CompileOptions options = {}, int recompileLimit = 8,
            ir::GraphSpecializer specializer = {});
  ~JitModule();

  // `stats`, when given, receives this call's run statistics.
  Expected<std::vector<runtime::Tensor>> operator()(std::span<const runtime::Tensor> inputs,
                                                    runtime::PlanRunStats* stats = nullptr);

  int compiles() const;
  int recompiles() const {
    const int c = compiles();
    return c > 0 ? c - 1 : 0;
  }
  // One line per compile: the signature and, for recompiles, which guard failed (a copy).
  std::vector<std::string> log() const;
  // The model compiled for the most recent call (any thread's); it lives as long as the module.
  const CompiledModel* last() const { return last_.load(std::memory_order_acquire); }

 private:
  struct Entry;  // One signature: its compile, once.
  Expected<std::unique_ptr<CompiledModel>> compileFor(
      const std::vector<ir::TensorType>& types) const;
  ir::Graph graph_;
  CompileOptions options_;
  ir::GraphSpecializer specializer_;
  int limit_;
  mutable std::mutex mu_;  // Guards everything below but last_.
  int compiles_ = 0;
  std::map<std::string, std::shared_ptr<Entry>> bySignature_;
  std::vector<ir::TensorType> lastTypes_;
  std::vector<std::string> log_;
  std::atomic<CompiledModel*> last_{nullptr};
};

}  // namespace kiln::compiler

namespace kiln {
inline compiler::JitModule jit(const ir::Graph& graph, compiler::CompileOptions options = {},
                               ir::GraphSpecializer specializer = {}) {
  return compiler::JitModule(graph, std::move(options), 8, std::move(specializer));
}
}  // namespace kiln
