// ONNX's control flow where its structure is known at import, since kiln's graphs have none:
// an If whose condition is known is its branch, inlined; a Scan is its body inlined once per
// step of the (static) sequence; a Loop is its body inlined once per iteration while its trip
// count and condition are known at import (each iteration's condition must fold to a
// constant). An If's condition, or a Loop's trip count or first condition, that the model
// computes at the top level of its graph is read at run time: the model runs in stages
// (docs/onnx.md), the import stopping at the node until a stage before it gives the value; where
// that node is inside the branch a top-level If took, the branch is spliced into the graph first
// (Importer::requestSize). One decided at run time inside a Loop or Scan body, or a body's
// condition computed from its values, is refused by name. Unrolling makes a graph as large as
// its loops (a body of n nodes run T times is n T nodes): at most kMaxIterations.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_map_util.h"
#include "frontends/onnx/onnx_tensor.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::OpKind;
using ir::Value;

constexpr int64_t kMaxIterations = 4096;

// A scope prefix for one inlining, readable (the node's first output and a tag); inlineGraph
// makes it unique.
std::string scopeOf(NodeContext& ctx, const std::string& tag) {
  return (ctx.numOutputs() > 0 ? ctx.proto().output(0) : ctx.opType()) + "/" + tag + "/";
}

// A bool scalar known at import, or nullopt.
Expected<std::optional<bool>> knownBool(const ir::TensorData* d) {
  if (!d) return std::optional<bool>();
  if (d->numElements() != 1) return invalidArgument("a condition must be one value");
  return std::optional<bool>(elementAsInt(*d, 0) != 0);
}

OnnxValue constantOf(ir::TensorData d) {
  OnnxValue v;
  v.constant = std::move(d);
  return v;
}

Status checkOutputs(NodeContext& ctx, const std::vector<OnnxValue>& outs) {
  for (const OnnxValue& v : outs)
    if (v.poisoned)
      return ctx.unsupported("a node of its subgraph cannot be imported (listed above)");
  return Status::ok();
}

// The values of each step of a scan output (or a Loop's), stacked along `axis`.
Expected<Value*> stack(NodeContext& ctx, const std::vector<OnnxValue>& steps, int64_t axis) {
  std::vector<Value*> parts;
  for (const OnnxValue& s : steps) {
    KILN_ASSIGN_OR_RETURN(Value * v, ctx.valueOf(s));
    KILN_ASSIGN_OR_RETURN(int a, ir::normalizeAxis(axis, v->type().shape.size() + 1, "axis"));
    KILN_ASSIGN_OR_RETURN(v,
                          ctx.emit(OpKind::kUnsqueeze, {v}, {{"axes", std::vector<int64_t>{a}}}));
    parts.push_back(v);
  }
  if (parts.size() == 1) return parts[0];
  KILN_ASSIGN_OR_RETURN(int a, ir::normalizeAxis(axis, parts[0]->type().shape.size(), "axis"));
  return ctx.emit(OpKind::kConcat, std::move(parts), {{"axis", int64_t{a}}});
}

// A one-value condition known at import, else computed at run time: the value a run in stages
// gives (NodeContext::runtimeValue), else the import stops for it.
Expected<bool> conditionOf(NodeContext& ctx, size_t i) {
  KILN_ASSIGN_OR_RETURN(const ir::TensorData* d, ctx.requireConstant(i));
  KILN_ASSIGN_OR_RETURN(std::optional<bool> known, knownBool(d));
  if (known) return *known;
  KILN_ASSIGN_OR_RETURN(int64_t v, ctx.runtimeValue(i, "its condition"));
  return v != 0;
}

Status mapIf(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const bool cond, conditionOf(ctx, 0));
  const char* branch = cond ? "then_branch" : "else_branch";
  KILN_ASSIGN_OR_RETURN(const ::onnx::GraphProto* g, ctx.attrGraph(branch));
  KILN_ASSIGN_OR_RETURN(std::vector<OnnxValue> outs,
                        ctx.inlineBranch(*g, scopeOf(ctx, branch), cond));
  if (ctx.splicePending()) {
    // A node of the branch needs a value known at run time: the branch is spliced into the graph
    // and imported again (SizeRequest::decided). Nothing here is a problem of its own.
    OnnxValue poisoned;
    poisoned.poisoned = true;
    for (size_t k = 0; k < ctx.numOutputs(); ++k) ctx.setOutputValue(k, poisoned);
    return Status::ok();
  }
  KILN_TRY(checkOutputs(ctx, outs));
  if (outs.size() != ctx.numOutputs())
    return ctx.invalid(std::string(branch) + " has " + std::to_string(outs.size()) +
                       " outputs, the node " + std::to_string(ctx.numOutputs()));
  for (size_t k = 0; k < outs.size(); ++k) ctx.setOutputValue(k, outs[k]);
  return Status::ok();
}

// Scan (9+): N state values and M scan inputs; the body takes the states and one slice of each
// scan input, and gives the new states and one element of each of K scan outputs.
Status mapScan(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const ::onnx::GraphProto* body, ctx.attrGraph("body"));
  KILN_ASSIGN_OR_RETURN(int64_t m, ctx.attrInt("num_scan_inputs"));
  const int64_t n = static_cast<int64_t>(ctx.numInputs()) - m;
  if (m < 1 || n < 0)
    return ctx.invalid("num_scan_inputs " + std::to_string(m) +
                       " is not 1 .. "
                       "the input count");
  const int64_t k = static_cast<int64_t>(ctx.numOutputs()) - n;
  if (k < 0 || body->output_size() != n + k || body->input_size() != n + m)
    return ctx.invalid("the body's inputs and outputs do not match the node's");
  auto axesAttr = [&](const char* name, int64_t count) -> Expected<std::vector<int64_t>> {
    return ctx.attrInts(name, std::vector<int64_t>(static_cast<size_t>(count), 0));
  };
  KILN_ASSIGN_OR_RETURN(auto inAxes, axesAttr("scan_input_axes", m));
  KILN_ASSIGN_OR_RETURN(auto inDirs, axesAttr("scan_input_directions", m));
  KILN_ASSIGN_OR_RETURN(auto outAxes, axesAttr("scan_output_axes", k));
  KILN_ASSIGN_OR_RETURN(auto outDirs, axesAttr("scan_output_directions", k));
  if (inAxes.size() != static_cast<size_t>(m) || inDirs.size() != static_cast<size_t>(m) ||
      outAxes.size() != static_cast<size_t>(k) || outDirs.size() != static_cast<size_t>(k))
    return ctx.invalid("scan_input_axes/directions must list " + std::to_string(m) +
                       " values and scan_output_axes/directions " + std::to_string(k));
  // The scan inputs, their axes, and the sequence length they share.
  std::vector<Value*> scanIn;
  std::vector<int> axes;
  int64_t steps = -1;
  for (int64_t j = 0; j < m; ++j) {
    KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(static_cast<size_t>(n + j)));
    KILN_ASSIGN_OR_RETURN(int a, ir::normalizeAxis(inAxes[static_cast<size_t>(j)], t.shape.size(),
                                                   "scan_input_axes"));
    const int64_t len = t.shape[static_cast<size_t>(a)];
    if (steps >= 0 && len != steps)
      return ctx.invalid("the scan inputs' lengths differ (" + std::to_string(steps) + " and " +
                         std::to_string(len) + ")");
    steps = len;
    KILN_ASSIGN_OR_RETURN(Value * v, ctx.value(static_cast<size_t>(n + j)));
    scanIn.push_back(v);
    axes.push_back(a);
  }
  if (steps < 1) return ctx.unsupported("a Scan over an empty sequence");
  if (steps > kMaxIterations)
    return ctx.unsupported("a Scan of " + std::to_string(steps) +
                           " steps (kiln unrolls scans; at most " + std::to_string(kMaxIterations) +
                           ")");
  std::vector<OnnxValue> state;
  for (int64_t i = 0; i < n; ++i) state.push_back(ctx.inputValue(static_cast<size_t>(i)));
  std::vector<std::vector<OnnxValue>> scanOut(static_cast<size_t>(k));
  for (int64_t t = 0; t < steps; ++t) {
    std::vector<OnnxValue> in = state;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t at = inDirs[static_cast<size_t>(j)] ? steps - 1 - t : t;
      const int64_t a = axes[static_cast<size_t>(j)];
      KILN_ASSIGN_OR_RETURN(Value * s, ctx.emit(OpKind::kSlice, {scanIn[static_cast<size_t>(j)]},
                                                {{"starts", std::vector<int64_t>{at}},
                                                 {"ends", std::vector<int64_t>{at + 1}},
                                                 {"axes", std::vector<int64_t>{a}}}));
      KILN_ASSIGN_OR_RETURN(s,
                            ctx.emit(OpKind::kSqueeze, {s}, {{"axes", std::vector<int64_t>{a}}}));
      OnnxValue v;
      v.value = s;
      in.push_back(v);
    }
    KILN_ASSIGN_OR_RETURN(std::vector<OnnxValue> outs,
                          ctx.inlineGraph(*body, in, scopeOf(ctx, "step" + std::to_string(t))));
    KILN_TRY(checkOutputs(ctx, outs));
    state.assign(outs.begin(), outs.begin() + n);
    for (int64_t j = 0; j < k; ++j)
      scanOut[static_cast<size_t>(j)].push_back(outs[static_cast<size_t>(n + j)]);
  }
  for (int64_t i = 0; i < n; ++i)
    ctx.setOutputValue(static_cast<size_t>(i), state[static_cast<size_t>(i)]);
  for (int64_t j = 0; j < k; ++j) {
    auto& seq = scanOut[static_cast<size_t>(j)];
    if (outDirs[static_cast<size_t>(j)]) std::reverse(seq.begin(), seq.end());
    KILN_ASSIGN_OR_RETURN(Value * y, stack(ctx, seq, outAxes[static_cast<size_t>(j)]));
    ctx.setOutput(static_cast<size_t>(n + j), y);
  }
  return Status::ok();
}

// A Loop's scan output after no iterations: shape [0, element shape], the element's shape and
// type as the body declares its output `k` (no iteration computed one).
Expected<ir::TensorData> emptyScanOutput(NodeContext& ctx, const ::onnx::GraphProto& body, int k) {
  const auto& t = body.output(k).type();
  std::optional<ir::DType> dtype;
  ir::Shape shape{0};
  bool known = t.has_tensor_type() && t.tensor_type().has_shape();
  if (known) {
    dtype = dtypeFromOnnx(t.tensor_type().elem_type());
    for (const auto& d : t.tensor_type().shape().dim()) {
      known &= d.has_dim_value();
      shape.push_back(d.dim_value());
    }
  }
  if (!known || !dtype)
    return ctx.unsupported("a Loop of no iterations with scan output '" + body.output(k).name() +
                           "', whose element type and shape the body does not declare");
  return ir::TensorData(*dtype, std::move(shape));
}

// Loop: the body (iteration number, condition, N loop-carried values) -> (condition, N values,
// K scan outputs), run while the iteration is below the trip count M and the condition holds,
// both known at import at every iteration.
Status mapLoop(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const ::onnx::GraphProto* body, ctx.attrGraph("body"));
  std::optional<int64_t> trips;
  if (ctx.hasInput(0)) {
    KILN_ASSIGN_OR_RETURN(const ir::TensorData* c, ctx.requireConstant(0));
    if (c) {
      if (c->numElements() != 1 || ir::isFloat(c->dtype()))
        return ctx.invalid("the trip count M must be one integer, got " + c->type().toString());
      trips = elementAsInt(*c, 0);
    } else {  // Computed: the value a run in stages gives, or the import stops for it.
      KILN_ASSIGN_OR_RETURN(trips, ctx.runtimeValue(0, "its trip count"));
    }
  }
  bool cond = true;
  if (ctx.hasInput(1)) {
    KILN_ASSIGN_OR_RETURN(cond, conditionOf(ctx, 1));
  }
  const int64_t n = static_cast<int64_t>(ctx.numInputs()) - 2;
  const int64_t k = static_cast<int64_t>(ctx.numOutputs()) - n;
  if (n < 0 || k < 0 || body->input_size() != n + 2 || body->output_size() != n + k + 1)
    return ctx.invalid("the body's inputs and outputs do not match the node's");
  std::vector<OnnxValue> state;
  for (int64_t i = 0; i < n; ++i) state.push_back(ctx.inputValue(static_cast<size_t>(i + 2)));
  std::vector<std::vector<OnnxValue>> scanOut(static_cast<size_t>(k));
  int64_t it = 0;
  for (; cond && (!trips || it < *trips); ++it) {
    if (it >= kMaxIterations)
      return ctx.unsupported("a Loop of more than " + std::to_string(kMaxIterations) +
                             " iterations (kiln unrolls loops)");
    ir::TensorData itData(ir::DType::kI64, {});
    *itData.as<int64_t>() = it;
    ir::TensorData condData(ir::DType::kBool, {});
    *condData.as<uint8_t>() = 1;
    std::vector<OnnxValue> in{constantOf(std::move(itData)), constantOf(std::move(condData))};
    in.insert(in.end(), state.begin(), state.end());
    KILN_ASSIGN_OR_RETURN(std::vector<OnnxValue> outs,
                          ctx.inlineGraph(*body, in, scopeOf(ctx, "iter" + std::to_string(it))));
    KILN_TRY(checkOutputs(ctx, outs));
    KILN_ASSIGN_OR_RETURN(std::optional<bool> next,
                          knownBool(outs[0].constant ? &*outs[0].constant : nullptr));
    if (!next)
      return ctx.unsupported("a Loop whose body computes its condition at run time (iteration " +
                             std::to_string(it) + ")");
    cond = *next;
    state.assign(outs.begin() + 1, outs.begin() + 1 + n);
    for (int64_t j = 0; j < k; ++j)
      scanOut[static_cast<size_t>(j)].push_back(outs[static_cast<size_t>(1 + n + j)]);
  }
  for (int64_t i = 0; i < n; ++i)
    ctx.setOutputValue(static_cast<size_t>(i), state[static_cast<size_t>(i)]);
  for (int64_t j = 0; j < k; ++j) {
    if (it == 0) {  // Empty: [0] and the element shape the body declares, which must be static.
      KILN_ASSIGN_OR_RETURN(ir::TensorData empty, emptyScanOutput(ctx, *body, 1 + n + j));
      ctx.setOutputValue(static_cast<size_t>(n + j), constantOf(std::move(empty)));
      continue;
    }
    KILN_ASSIGN_OR_RETURN(Value * y, stack(ctx, scanOut[static_cast<size_t>(j)], 0));
    ctx.setOutput(static_cast<size_t>(n + j), y);
  }
  return Status::ok();
}

}  // namespace

// Every version of the three over tensors (13 adds sequence types, 16 optional ones, which
// kiln does not import; the later ones more element types). Scan 8 (batched) is refused.
std::vector<MapperEntry> controlFlowMappers() {
  return {
      {"If", {1, 11, 13, 16, 19, 21, 23, 24, 25}, mapIf},
      {"Loop", {1, 11, 13, 16, 19, 21, 23, 24, 25}, mapLoop},
      {"Scan", {9, 11, 16, 19, 21, 23, 24, 25}, mapScan},
  };
}

}  // namespace kiln::frontends::onnx_import
