#include "passes/pass.h"

namespace kiln::passes {

const std::vector<PassInfo>& allPasses() {
  static const std::vector<PassInfo> passes = {
#define KILN_PASS(Class, passName, description) \
  {passName, description, []() -> std::unique_ptr<Pass> { return std::make_unique<Class>(); }},
#include "passes/passes.def"
#undef KILN_PASS
  };
  return passes;
}

std::unique_ptr<Pass> createPass(std::string_view name) {
  for (const auto& p : allPasses())
    if (p.name == name) return p.create();
  return nullptr;
}

}  // namespace kiln::passes
