// Where a model's time goes: per-step timings of profiled runs (runtime::PlanRunStats::stepMs
// for a compiled model, runtime::EagerStats::nodes for eager) grouped like PyTorch profiler's
// key_averages(): one row per (ops, kind) with calls, time, FLOPs and bytes, and every executed
// step as an event for a trace. `kiln profile` prints and writes these.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "compiler/compile.h"
#include "runtime/eager.h"

namespace kiln::compiler {

struct ProfileRow {
  std::string ops;    // "conv2d+add+relu": the step's ops in order, each once (eager: the op).
  std::string kind;   // "kernel" (generated), "library", "reference", "copy"; eager: "eager".
  int64_t calls = 0;  // Over all profiled runs.
  double ms = 0;      // Total over all profiled runs.
  // Totals over all calls: ir::countWork's FLOPs (0 where unknown: a loaded artifact's plan)
  // and the bytes of every input and output buffer the steps touched.
  int64_t flops = 0, bytes = 0;
};

struct ProfileEvent {
  std::string name;  // The plan step's name (kernel symbol, node description) or the node's.
  std::string ops, kind;
  int run = 0;         // Which profiled run.
  double startMs = 0;  // From the start of that run's first step.
  double ms = 0;
};

struct Profile {
  int runs = 0;
  double stepMs = 0;             // Sum of every step's time over the runs.
  std::vector<ProfileRow> rows;  // Slowest first.
  std::vector<ProfileEvent> events;
};

// A plan step's kind as profiles name it: "kernel" (generated), "copy", "library" or
// "reference".
std::string_view stepKind(const runtime::PlanStep& s);

// `runs`: the statistics of profiled runs of `model` (CompiledModel::setProfiling(true)).
Profile profileCompiled(const CompiledModel& model, std::span<const runtime::PlanRunStats> runs);
Profile profileEager(std::span<const runtime::EagerStats> runs);

}  // namespace kiln::compiler
