// Writing a CompiledModel as an AOT artifact (runtime/artifact.h, docs/artifact-format.md), and
// the recompiler that `kiln` hands to the loader for CPUs that cannot run an artifact's code.
#pragma once

#include <string>

#include "compiler/compile.h"
#include "runtime/artifact.h"

namespace kiln::compiler {

// Everything an artifact holds for `model`: plan, weights, object code, sources, PTX.
runtime::ArtifactContents artifactContents(const CompiledModel& model, std::string modelName);

// Writes `model` to `path` (atomically; nothing is left behind on error).
Status saveArtifact(const CompiledModel& model, const std::string& path, std::string modelName);

// Compiles a module's embedded source for this machine (Clang in-process, as compile() does):
// the LoadOptions::recompile of the `kiln` tool.
Expected<std::vector<std::byte>> recompileForHost(const runtime::ArtifactModule& module);

}  // namespace kiln::compiler
