// A model run in stages: where an op's output size depends on values (ONNX NonZero), kiln's
// static shapes end, and where its control flow does (an If's condition computed by the model),
// kiln's graphs without control flow do. The frontend cuts the model there: each stage is a graph
// of static shapes over values named in the run's environment, the size is computed from the values
// the stage produced (runtime::valueSizedCount), and the next stage is made for it.
// compiler::StagedModule runs them, each compiled for its input types and sizes and cached.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "ir/tensor_data.h"

namespace kiln::ir {

// The size (or value: an If's condition, a Loop's trip count) the next stage needs: op `op`
// (with `attrs`) over the values `inputs` gives it (kCast: the one element of its input, as an
// i64).
struct StageCut {
  OpKind op{};
  AttrMap attrs;
  std::vector<std::string> inputs;  // Names in the environment.
  std::string key;                  // The size's name, for the next stage (StageMaker's sizes).
  std::string describe;             // The node that needs it, for messages.
  std::string need;                 // What it needs: "its size", "its condition 'c'".
  // Inputs the model holds as initializers (a threshold), which no stage computes.
  std::map<std::string, TensorData> constants;
};

struct Stage {
  // The stage's nodes as a graph; absent when the stage computes nothing (the cut is its first
  // node). Its inputs and outputs are the environment's values named below, in order.
  std::optional<Graph> graph;
  std::vector<std::string> inputs, outputs;
  // Absent: the last stage, whose outputs include every model output not computed earlier.
  std::optional<StageCut> cut;
  int64_t next = 0;  // Where the next stage begins (StageMaker's `begin`).
  // Outputs whose values the import knew (shape arithmetic folded to constants): later stages are
  // made with them (StageMaker's `known`), so that a node there that needs one at import (a
  // Reshape's shape) has it. They follow from the types and sizes alone.
  std::map<std::string, TensorData> known;
  // What the import decided for the stages after this one, as sizes: the branch of a top-level
  // If that holds a stage's end ("branch of OUT" = 1 for then), spliced into the graph for them.
  std::map<std::string, int64_t> decided;
};

// Makes the stage that begins at `begin` (0: the model's start) for the environment's value
// types so far (the model's inputs, then every stage's outputs), the sizes computed so far and
// the values earlier stages knew at import (Stage::known).
using StageMaker = std::function<Expected<Stage>(
    int64_t begin, const std::map<std::string, TensorType>& env,
    const std::map<std::string, int64_t>& sizes, const std::map<std::string, TensorData>& known)>;

struct StagedModel {
  std::vector<std::string> inputs;  // The model's inputs, in the order a call gives them.
  // Their declared types, a symbolic dim at the size the options give it (1 without one): what
  // seeded inputs take; a call may give other sizes.
  std::vector<TensorType> inputTypes;
  std::vector<std::string> outputs;  // The model's outputs, in the order a call returns them.
  StageMaker stage;
};

}  // namespace kiln::ir
