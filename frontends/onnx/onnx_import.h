// The ONNX importer: reads a ModelProto (IR versions 3 and up, opsets 7-28 of the default
// domain), checks it (with libonnx 1.12's checker and shape inference where they know the
// model's opset and IR version, else with kiln's own validation), and maps its nodes onto
// kiln's primitive ops, each by the version of its definition at the model's opset.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "ir/graph.h"
#include "ir/staging.h"

namespace kiln::frontends {

// The ONNX opsets of the default domain this importer reads: 7 (ONNX 1.2) to the newest the
// specification defines (onnx_op_versions.inc, generated from the pinned onnx package).
inline constexpr int kMinOnnxOpset = 7;
inline constexpr int kMaxOnnxOpset = 28;
// The newest opset and IR version libonnx 1.12 (Debian's) knows: its checker and shape
// inference run only on models within both.
inline constexpr int kLibOnnxMaxOpset = 17;
inline constexpr int kLibOnnxMaxIrVersion = 8;

struct OnnxImportOptions {
  // Values for symbolic dims (`dim_param`) of graph inputs, by name. The graph is specialized
  // for these sizes; the dims keep their names (ir::Value::dimNames, sanitized to identifiers)
  // so that kiln::jit with onnxSpecializer() imports again for other sizes.
  std::map<std::string, int64_t> dimValues;
  // The value of a symbolic (or unknown) first dim of a graph input whose name is not in
  // dimValues: the batch size. Unset: such dims are an error like any other.
  std::optional<int64_t> defaultBatch;
  // Values of graph inputs that a node needs to know at import: Reshape's shape, Reduce*'s
  // axes, Pad's pads, Slice's starts, Clip's bounds, Range's limits ... given as graph inputs,
  // as ONNX allows. kiln compiles for static shapes (as XLA does), so such an input is
  // specialized on its value here and is no longer an input of the kiln graph; inputs listed
  // here that no node needs as a constant stay inputs (their values are not used). Import
  // again for other values. Without a value, such a model is refused, naming the input.
  std::map<std::string, ir::TensorData> inputValues;
  // Output sizes known only at run time, by "size of OUT" (OUT the first output of the node whose
  // size it is: NonZero's count of non-zeros), values the import needs that the model computes
  // (an If's condition, a Loop's trip count) by "value of NAME", and the branches of Ifs spliced
  // into the graph by "branch of OUT" (1 for then; onnx_importer.h kSizeOf ..): what onnxStages
  // gives each stage's import. A node that needs one and has none stops the import
  // with an error that says so.
  std::map<std::string, int64_t> runtimeSizes;
};

// Imports the ONNX model at `path`. External-data tensors are read relative to the model's
// directory. Errors: kNotFound / kIo for the file, kInvalidArgument for a malformed model or
// missing dim values, kUnimplemented when the model uses ops, opsets or attribute values that
// kiln cannot express (one error listing every such node). Never returns a partial graph.
Expected<ir::Graph> loadOnnx(const std::string& path, const OnnxImportOptions& options = {});

// Imports a serialized ModelProto. `modelDir` is where external-data files are looked up
// (empty: external data is an error); `displayName` starts every error message.
Expected<ir::Graph> loadOnnxFromBytes(std::string_view bytes, const OnnxImportOptions& options = {},
                                      const std::string& modelDir = "",
                                      const std::string& displayName = "ONNX model");

// For kiln::jit and `kiln run`: imports the model at `path` again for new input types, every
// symbolic dim (and an unnamed unknown first dim, as defaultBatch) taking its size from them,
// so that shape arithmetic folded at import is redone. Reads the file once, now; `options`
// supplies everything else (its dim values are overridden).
Expected<ir::GraphSpecializer> onnxSpecializer(const std::string& path,
                                               const OnnxImportOptions& options = {});

// The model at `path` imported in stages (ir/staging.h), for models with nodes whose output size
// depends on run-time values (NonZero, Compress) or whose control flow does (an If's condition, a
// Loop's trip count or condition computed by the model): each stage ends before such a node (at
// the top level of the graph, where the branches of Ifs that hold one are spliced; one inside a
// Loop or Scan body is an error) and the next is imported from it with the size or value
// computed from the values. A model without such nodes is
// one stage, as loadOnnx imports it. Stages are made when compiler::StagedModule asks for them, for
// the types and sizes of each call; `options` apply to every stage (symbolic dims take the call's
// sizes).
Expected<ir::StagedModel> onnxStages(const std::string& path,
                                     const OnnxImportOptions& options = {});
// Whether `status`, from loadOnnx or loadOnnxFromBytes, says only that the model needs stages:
// every node imports but one that needs a size or value known only at run time.
bool needsStages(const Status& status);
Expected<ir::StagedModel> onnxStagesFromBytes(std::string_view bytes,
                                              const OnnxImportOptions& options = {},
                                              const std::string& modelDir = "",
                                              const std::string& displayName = "ONNX model");

}  // namespace kiln::frontends
