// Reading and writing safetensors files (an 8-byte header length, a JSON header, raw
// little-endian tensor data), and the file helpers that every frontend reader and writer shares.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

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

// ---- File helpers shared by the frontends (npy, JSON graphs).

// One file to write: `write` streams its contents into the (temporary) file.
struct OutputFile {
  std::string path;
  std::function<Status(std::ostream&)> write;
};

// Validates `tensors` and `metadata` and returns the OutputFile that writes them as
// safetensors; writeSafetensors is this plus writeFilesAtomically. The tensors' bytes are
// shared, not copied.
Expected<OutputFile> safetensorsOutput(const std::string& path, const TensorMap& tensors,
                                       const SafetensorsMetadata& metadata = {});

// Writes every file to a temporary file in its target's directory, flushes and syncs them,
// then renames each onto its target, in order. On any error every temporary file is removed,
// so no partial output is ever left behind; a target is replaced only once all files are
// completely written.
Status writeFilesAtomically(const std::vector<OutputFile>& files);

// An open input file and its size. `kind` ("safetensors file", "npy file") starts every error.
struct InputFile {
  std::ifstream stream;
  uint64_t size = 0;
};
Expected<InputFile> openInputFile(const std::string& path, const std::string& kind);

// Bytes of a dense tensor with `dims` of `elementSize` bytes each, or nullopt when it exceeds
// INT64_MAX (the dims then cannot be an ir::Shape). The product of the non-zero dims is what
// is bounded, so a later ir::numElements cannot overflow whatever the order of the dims.
std::optional<uint64_t> checkedByteSize(std::span<const uint64_t> dims, size_t elementSize);

}  // namespace kiln::frontends
