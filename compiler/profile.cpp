#include "compiler/profile.h"

#include <algorithm>
#include <map>

#include "ir/flops.h"

namespace kiln::compiler {

namespace {

using RowKey = std::pair<std::string, std::string>;  // (ops, kind)

Profile finish(std::map<RowKey, ProfileRow>& rows, Profile p) {
  for (auto& [key, row] : rows) {
    p.stepMs += row.ms;
    p.rows.push_back(std::move(row));
  }
  std::stable_sort(p.rows.begin(), p.rows.end(),
                   [](const ProfileRow& a, const ProfileRow& b) { return a.ms > b.ms; });
  return p;
}

}  // namespace

std::string_view stepKind(const runtime::PlanStep& s) {
  return s.kind == runtime::PlanStep::Kind::kKernel ? "kernel"
         : s.kind == runtime::PlanStep::Kind::kCopy ? "copy"
         : s.library                                ? "library"
                                                    : "reference";
}

Profile profileCompiled(const CompiledModel& model, std::span<const runtime::PlanRunStats> runs) {
  const runtime::Plan& plan = model.plan();
  const std::vector<StepWork>& work = model.report().stepWork;
  const bool haveWork = work.size() == plan.steps.size();
  Profile p;
  p.runs = static_cast<int>(runs.size());
  std::map<RowKey, ProfileRow> rows;
  for (size_t r = 0; r < runs.size(); ++r) {
    const runtime::PlanRunStats& st = runs[r];
    for (size_t i = 0; i < st.stepMs.size() && i < plan.steps.size(); ++i) {
      const runtime::PlanStep& s = plan.steps[i];
      const std::string kind(stepKind(s));
      const std::string ops = haveWork ? work[i].ops
                              : s.kind == runtime::PlanStep::Kind::kOp
                                  ? std::string(ir::opName(s.op))
                                  : s.name;
      int64_t bytes = 0;
      for (const auto* list : {&s.inputs, &s.outputs})
        for (const runtime::BufferRef& b : *list) bytes += static_cast<int64_t>(b.type.byteSize());
      ProfileRow& row = rows[{ops, kind}];
      row.ops = ops;
      row.kind = kind;
      ++row.calls;
      row.ms += st.stepMs[i];
      row.flops += haveWork ? work[i].work.flops() : 0;
      row.bytes += bytes;
      p.events.push_back({s.name, ops, kind, static_cast<int>(r),
                          i < st.stepStartMs.size() ? st.stepStartMs[i] : 0.0, st.stepMs[i]});
    }
  }
  return finish(rows, std::move(p));
}

Profile profileEager(std::span<const runtime::EagerStats> runs) {
  Profile p;
  p.runs = static_cast<int>(runs.size());
  std::map<RowKey, ProfileRow> rows;
  for (size_t r = 0; r < runs.size(); ++r) {
    for (const runtime::EagerNodeTiming& t : runs[r].nodes) {
      const std::string op(ir::opName(t.node->op()));
      int64_t bytes = 0;
      for (const ir::Value* v : t.node->inputs())
        bytes += static_cast<int64_t>(v->type().byteSize());
      for (const ir::Value* v : t.node->outputs())
        bytes += static_cast<int64_t>(v->type().byteSize());
      ProfileRow& row = rows[{op, "eager"}];
      row.ops = op;
      row.kind = "eager";
      ++row.calls;
      row.ms += t.ms;
      row.flops += ir::countWork(*t.node).flops();
      row.bytes += bytes;
      p.events.push_back({t.node->describe(), op, "eager", static_cast<int>(r), t.startMs, t.ms});
    }
  }
  return finish(rows, std::move(p));
}

}  // namespace kiln::compiler
