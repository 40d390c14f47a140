#include "compiler/artifact.h"

#include "codegen/cpu_compiler.h"
#include "ir/printer.h"
#include "runtime/library_info.h"

namespace kiln::compiler {

runtime::ArtifactContents artifactContents(const CompiledModel& model, std::string modelName) {
  runtime::ArtifactContents c;
  c.modelName = std::move(modelName);
  c.producer = "kiln; " + runtime::libraryIdentity();
  c.optimizedGraph = ir::printGraph(model.optimizedGraph());
  for (const ir::Value* out : model.optimizedGraph().outputs())
    c.outputNames.push_back(out->name());
  for (const ir::Value* in : model.optimizedGraph().inputs())
    c.inputDimNames.push_back(in->dimNames());
  c.plan = std::shared_ptr<const runtime::Plan>(&model.plan(), [](const runtime::Plan*) {});
  const CompiledCode& code = model.code();
  c.triple = code.triple;
  c.cpu = code.cpu;
  c.features = code.features;
  c.modules = code.modules;
  c.ptx = code.ptx;
  c.cubins = code.cubins;
  c.algorithmChoices = model.report().algorithmChoices;
  if (const auto& b = model.plan().backend; b && b->caps().kernelCode != "host-object") {
    c.kernelCode = b->caps().kernelCode;
    if (c.kernelCode == "cubin") c.deviceArch = "sm_" + std::to_string(b->caps().cuda.smArch);
  }
  return c;
}

Status saveArtifact(const CompiledModel& model, const std::string& path, std::string modelName) {
  for (int p : model.plan().outputParameter)
    if (p >= 0)
      return invalidArgument(
          "this compiled model writes its parameters in place (a training step); AOT artifacts "
          "hold inference models");
  return runtime::writeArtifact(path, artifactContents(model, std::move(modelName)));
}

Expected<std::vector<std::byte>> recompileForHost(const runtime::ArtifactModule& module) {
  KILN_ASSIGN_OR_RETURN(
      codegen::CpuObject object,
      codegen::compileCpp(module.source, module.name, codegen::CpuCompileOptions{}));
  return std::move(object.bytes);
}

}  // namespace kiln::compiler
