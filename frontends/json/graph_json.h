// kiln's JSON graph format: the graph structure in model.json and its weights (parameters and
// tensor attributes) in model.safetensors beside it. docs/graph-format.md is the specification.
#pragma once

#include <string>
#include <string_view>

#include "frontends/json/safetensors.h"
#include "ir/graph.h"

namespace kiln::frontends {

// The only version this build reads and writes; another version is reported as unsupported.
inline constexpr int kGraphJsonVersion = 1;
// Weights-file keys of tensor attributes start with this ("@attr/<node index>/<attribute>").
// A value name cannot contain '@', so these keys never collide with parameter names.
inline constexpr std::string_view kTensorAttrPrefix = "@attr/";

// Writes `graph` to `jsonPath` (which must end in .json) and its weights to
// weightsPathFor(jsonPath). The graph must pass ir::verify and every parameter must have data.
// Both files are written to temporaries first and renamed only when both are complete, so a
// failed save leaves no partial or temporary file behind.
Status saveGraphJson(const ir::Graph& graph, const std::string& jsonPath);

// Loads and validates a graph written by saveGraphJson (or by hand, following the format doc):
// every field's JSON type, dtypes, layouts, value names (defined before use, unique), ops,
// arity, attribute names and kinds against the op table, declared output types against shape
// inference, and the weights file (present, every parameter and tensor attribute found with
// the declared dtype and shape, no stray tensors). Ends with ir::verify. Errors name the JSON
// file, the element (e.g. "node 3 (conv2d 'conv1')") and expected vs actual.
Expected<ir::Graph> loadGraphJson(const std::string& jsonPath);

// The weights file of `jsonPath`: same directory and stem, extension .safetensors.
std::string weightsPathFor(const std::string& jsonPath);

// One attribute in the format's encoding, e.g. {"ints":[1,1]} or {"float":"-inf"}. A tensor
// attribute is put into `weights` under `tensorKey` (which must start with kTensorAttrPrefix),
// and the JSON names that key. saveGraphJson and loadGraphJson use the same encoding; these
// let tests cover attribute kinds that no op in ops.def takes yet (floats, tensor).
Expected<std::string> encodeAttribute(const ir::AttrValue& value, const std::string& tensorKey,
                                      TensorMap& weights);
Expected<ir::AttrValue> decodeAttribute(std::string_view json, const TensorMap& weights);

}  // namespace kiln::frontends
