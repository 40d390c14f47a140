// What the fuzz targets check on one input, shared by the libFuzzer entry point (fuzz_main.cpp)
// and the replay of corpora and regressions in the normal build (test_fuzz_regressions.cpp).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>

#include "frontends/json/graph_json.h"
#include "frontends/json/safetensors.h"
#include "frontends/npy/npy.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"

namespace kiln::fuzz {

// What a reader did with one input. A reader may accept or reject any input; a violation is a
// bug even when nothing crashed (fuzz_main aborts on it, so that libFuzzer keeps the input):
// an internal error, or an accepted input that does not survive a write and read back.
struct Outcome {
  bool accepted = false;
  std::optional<std::string> violation;
};

// A directory for the files that path-based readers need, unique to this process, under
// $TMPDIR (scripts/fuzz.sh points it at /dev/shm when it can), removed at exit.
inline const std::filesystem::path& scratchDir() {
  struct Dir {
    std::filesystem::path path;
    Dir() {
      path = std::filesystem::temp_directory_path() /
             ("kiln-fuzz-" + std::to_string(::getpid()));
      std::filesystem::create_directories(path);
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

inline std::string scratchFile(std::string_view name) {
  return (scratchDir() / name).string();
}

inline void writeFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A reader's error: fine unless it says kiln itself is at fault.
inline Outcome rejected(const Status& error) {
  if (error.code() == ErrorCode::kInternal)
    return {false, "internal error on malformed input: " + error.message()};
  return {};
}

inline Outcome violated(std::string what) {
  return {true, std::move(what)};
}

// ---- text_ir: parseGraph, then printGraph(parseGraph(printGraph(g))) == printGraph(g).
inline Outcome checkTextIr(std::string_view bytes) {
  auto g = ir::parseGraph(bytes);
  if (!g) return rejected(g.status());
  if (Status st = ir::verify(*g); !st)
    return violated("parseGraph returned a graph that does not verify: " + st.message());
  const std::string printed = ir::printGraph(*g);
  auto again = ir::parseGraph(printed);
  if (!again)
    return violated("the printed graph does not parse: " + again.status().message() +
                    "\n--- printed:\n" + printed);
  const std::string reprinted = ir::printGraph(*again);
  if (reprinted != printed)
    return violated("print/parse/print changed the text\n--- first:\n" + printed +
                    "\n--- second:\n" + reprinted);
  return {true, std::nullopt};
}

// ---- json_graph: a kiln JSON graph and its weights. An input is the JSON text, then
// kJsonGraphSeparator, then the bytes of the weights file, which is model.safetensors beside
// model.json (the seeds' "weights" field names it). Without the separator, every byte is JSON
// and the weights file is empty.
inline constexpr std::string_view kJsonGraphSeparator = "\n#kiln-fuzz: weights follow#\n";

struct JsonGraphInput {
  std::string_view json;
  std::string_view weights;
};

inline JsonGraphInput splitJsonGraphInput(std::string_view bytes) {
  const size_t sep = bytes.find(kJsonGraphSeparator);
  if (sep == std::string_view::npos) return {bytes, {}};
  return {bytes.substr(0, sep), bytes.substr(sep + kJsonGraphSeparator.size())};
}

// Accepted graphs must save, load back as the same graph with the same weights, and print as
// text IR that parses to the same text.
inline Outcome checkJsonGraph(std::string_view bytes) {
  const JsonGraphInput input = splitJsonGraphInput(bytes);
  const std::string jsonPath = scratchFile("model.json");
  writeFile(jsonPath, input.json);
  writeFile(scratchFile("model.safetensors"), input.weights);
  auto g = frontends::loadGraphJson(jsonPath);
  if (!g) return rejected(g.status());

  const std::string printed = ir::printGraph(*g);
  auto parsed = ir::parseGraph(printed);
  if (!parsed)
    return violated("the loaded graph's text IR does not parse: " + parsed.status().message() +
                    "\n--- printed:\n" + printed);
  if (ir::printGraph(*parsed) != printed)
    return violated("the loaded graph's text IR does not read back as the same graph\n" + printed);

  // Written into a directory of its own and removed again, so that a later input's "weights"
  // can never name a file an earlier input left behind.
  const std::filesystem::path roundTripDir = scratchDir() / "round-trip";
  std::filesystem::create_directories(roundTripDir);
  struct Remove {
    const std::filesystem::path& dir;
    ~Remove() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } remove{roundTripDir};
  const std::string savedPath = (roundTripDir / "saved.json").string();
  if (Status st = frontends::saveGraphJson(*g, savedPath); !st)
    return violated("a loaded graph does not save: " + st.message());
  auto again = frontends::loadGraphJson(savedPath);
  if (!again) return violated("a saved graph does not load: " + again.status().message());
  if (ir::printGraph(*again) != printed)
    return violated("save/load changed the graph\n--- loaded:\n" + printed +
                    "\n--- after save/load:\n" + ir::printGraph(*again));
  for (size_t i = 0; i < g->parameters().size(); ++i)
    if (!(g->parameters()[i]->data() == again->parameters()[i]->data()))
      return violated("save/load changed the data of parameter '" + g->parameters()[i]->name() +
                      "'");
  return {true, std::nullopt};
}

// ---- safetensors: accepted files must write and read back as the same tensors and metadata.
inline Outcome checkSafetensors(std::string_view bytes) {
  const std::string path = scratchFile("input.safetensors");
  writeFile(path, bytes);
  auto contents = frontends::readSafetensorsFile(path);
  if (!contents) return rejected(contents.status());
  const std::string copy = scratchFile("round-trip.safetensors");
  if (Status st = frontends::writeSafetensors(copy, contents->tensors, contents->metadata); !st)
    return violated("accepted tensors do not write: " + st.message());
  auto again = frontends::readSafetensorsFile(copy);
  if (!again) return violated("a written file does not read: " + again.status().message());
  if (again->tensors != contents->tensors || again->metadata != contents->metadata)
    return violated("write/read changed the tensors or the metadata");
  return {true, std::nullopt};
}

// ---- npy: accepted arrays must write and read back bit for bit.
inline Outcome checkNpy(std::string_view bytes) {
  const std::string path = scratchFile("input.npy");
  writeFile(path, bytes);
  auto t = frontends::readNpy(path);
  if (!t) return rejected(t.status());
  const std::string copy = scratchFile("round-trip.npy");
  if (Status st = frontends::writeNpy(copy, *t); !st)
    return violated("an accepted array does not write: " + st.message());
  auto again = frontends::readNpy(copy);
  if (!again) return violated("a written array does not read: " + again.status().message());
  if (!(*again == *t)) return violated("write/read changed the array");
  return {true, std::nullopt};
}

// For a reader with no writer to round trip through: `read(path)` returns an Expected, and
// must only ever give a value or a user error. `suffix` is the file name's extension.
template <class Read>
Outcome checkFileReader(std::string_view bytes, std::string_view suffix, Read read) {
  const std::string path = scratchFile("input" + std::string(suffix));
  writeFile(path, bytes);
  auto result = read(path);
  if (!result) return rejected(result.status());
  return {true, std::nullopt};
}

// Every fuzz target, by the name of its seed directory tests/fuzz/corpus/<name>/ (CMake builds
// fuzz_<name> for each such directory). A new reader is one line here, e.g.
//   {"onnx", [](std::string_view b) { return checkFileReader(b, ".onnx", frontends::loadOnnx); }},
// plus its seeds.
struct Target {
  std::string_view name;
  Outcome (*check)(std::string_view bytes);
};
inline constexpr Target kTargets[] = {
    {"text_ir", checkTextIr},
    {"json_graph", checkJsonGraph},
    {"safetensors", checkSafetensors},
    {"npy", checkNpy},
};

constexpr const Target* findTarget(std::string_view name) {
  for (const Target& t : kTargets)
    if (t.name == name) return &t;
  return nullptr;
}

}  // namespace kiln::fuzz
