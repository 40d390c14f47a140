// The pass pipeline: the one place that orders passes and owns their instrumentation
// (verifier after each pass, --dump-after, --disable-pass, --time-passes).
#pragma once

#include "passes/pass.h"

namespace kiln::passes {

class Pipeline {
 public:
  // kiln's standard inference pipeline (pipeline.cpp lists it with a why per entry).
  static Pipeline standard();
  explicit Pipeline(std::vector<std::string> passNames) : names_(std::move(passNames)) {}

  // Runs the passes in order. Fails when a pass name is unknown or the verifier rejects the
  // graph after a pass (the message names the pass).
  Status run(ir::Graph& g, PassContext& ctx) const;
  const std::vector<std::string>& passNames() const { return names_; }

 private:
  std::vector<std::string> names_;
};

// Checks user-given pass names (--disable-pass, --dump-after); "all" is accepted for dumps.
Status checkPassNames(const std::set<std::string>& names, bool allowAll);

}  // namespace kiln::passes
