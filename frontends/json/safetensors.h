// Reading and writing safetensors files: an 8-byte header length, a JSON header, and raw
// little-endian tensor data.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "frontends/file_io.h"
#include "ir/status.h"
#include "ir/tensor_data.h"

namespace kiln::frontends {

// Tensors by name. std::map so that files are written in a deterministic order.
using TensorMap = std::map<std::string, ir::TensorData>;
// The optional "__metadata__" entry of a safetensors header: free-form string pairs.
using SafetensorsMetadata = std::map<std::string, std::string>;

struct SafetensorsContents {
  TensorMap tensors;
  SafetensorsMetadata metadata;  // Empty when the file has no "__metadata__".
};

// The safetensors dtype names ("F32", "BF16", "BOOL", ...) of the dtypes kiln supports.
std::string_view safetensorsDTypeName(ir::DType t);
std::optional<ir::DType> parseSafetensorsDType(std::string_view name);

// Reads and validates a whole file: header length vs file size, JSON, dtypes, shapes, and
// data offsets that are in range, do not overlap and exactly cover the data. Tensor storage is
// allocated only after validation, so a hostile header cannot allocate more than the file
// holds. Errors name the file and, where one is at fault, the tensor.
Expected<SafetensorsContents> readSafetensorsFile(const std::string& path);
// The tensors of readSafetensorsFile, without the metadata.
Expected<TensorMap> readSafetensors(const std::string& path);

// Writes `tensors` atomically (see writeFilesAtomically). Tensors are laid out largest element
// size first, so that every tensor's data is aligned to its element size in the file.
Status writeSafetensors(const std::string& path, const TensorMap& tensors,
                        const SafetensorsMetadata& metadata = {});

// Validates `tensors` and `metadata` and returns the OutputFile that writes them as
// safetensors; writeSafetensors is this plus writeFilesAtomically. The tensors' bytes are
// shared, not copied.
Expected<OutputFile> safetensorsOutput(const std::string& path, const TensorMap& tensors,
                                       const SafetensorsMetadata& metadata = {});

}  // namespace kiln::frontends
