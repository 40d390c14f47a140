// File helpers shared by every frontend reader and writer (safetensors, npy, JSON graphs):
// atomic multi-file writes, checked input opening, overflow-checked sizes and strict JSON parsing.
#pragma once

#include <cstdint>
#include <fstream>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ir/status.h"

namespace kiln::frontends {

// One file to write: `write` streams its contents into the (temporary) file.
struct OutputFile {
  std::string path;
  std::function<Status(std::ostream&)> write;
};

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

// The path of a file that a model file names (ONNX external data, a JSON graph's weights):
// `relative` must be a relative path without '..', and what it names, with every symlink
// resolved, must be a regular file inside `directory` (resolved too), so that a model can never
// make kiln read a file elsewhere on the machine (a symlink to /etc/passwd), a FIFO or a
// device. `what` starts every error ("external data of initializer 'w'"), `place` names the
// directory in them ("the model's directory"). Returns the resolved path; not found is
// kNotFound, anything else kInvalidArgument.
Expected<std::string> resolveInsideDirectory(const std::string& directory,
                                             const std::string& relative, const std::string& what,
                                             const std::string& place = "the model's directory");

// Bytes of a dense tensor with `dims` of `elementSize` bytes each, or nullopt when it exceeds
// INT64_MAX (the dims then cannot be an ir::Shape). The product of the non-zero dims is what
// is bounded, so a later ir::numElements cannot overflow whatever the order of the dims.
std::optional<uint64_t> checkedByteSize(std::span<const uint64_t> dims, size_t elementSize);

// The outcome of parseStrictJson. At most one of parseError and duplicateKey is set; the caller
// turns them into errors in its own words.
template <class Json>
struct StrictJson {
  Json value;  // Meaningful only when neither error is set.
  // nlohmann's message without its "[json.exception.parse_error.N] " prefix.
  std::optional<std::string> parseError;
  // The first key that appears twice in one object.
  std::optional<std::string> duplicateKey;
};

// Parses `text` as JSON, rejecting keys repeated within one object: nlohmann keeps the last of
// duplicate keys silently, and in kiln's files a duplicate is always a mistake. A syntax error
// takes precedence over a duplicate key found before it. Json is nlohmann::json or
// nlohmann::ordered_json (the instantiations file_io.cpp provides), so that this header does not
// need nlohmann's.
template <class Json>
StrictJson<Json> parseStrictJson(const std::string& text);

}  // namespace kiln::frontends
