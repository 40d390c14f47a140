// What the fuzz targets check on one input, shared by the libFuzzer entry point (fuzz_main.cpp)
// and the replay of corpora and regressions in the normal build (test_fuzz_regressions.cpp).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "frontends/data/dataset.h"
#include "frontends/data/images.h"
#include "frontends/json/graph_json.h"
#include "frontends/json/safetensors.h"
#include "frontends/npy/npy.h"
#include "frontends/onnx/onnx_import.h"
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
      path = std::filesystem::temp_directory_path() / ("kiln-fuzz-" + std::to_string(::getpid()));
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

// Removes a directory and everything in it when it goes out of scope.
struct RemoveOnExit {
  const std::filesystem::path& dir;
  ~RemoveOnExit() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

// The inputs in `dir` (a target's seeds or regressions), sorted; none when it does not exist.
// Dot files (.gitkeep) are skipped. For the replays of the normal build.
inline std::vector<std::filesystem::path> inputsIn(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> files;
  if (!std::filesystem::is_directory(dir)) return files;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename().string()[0] != '.') files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

inline std::string readInput(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
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

// A graph a reader returned must verify, and its text IR must read back as the same graph:
// printGraph(parseGraph(printGraph(g))) == printGraph(g).
inline Outcome checkGraph(const ir::Graph& g) {
  if (Status st = ir::verify(g); !st)
    return violated("the reader returned a graph that does not verify: " + st.message());
  const std::string printed = ir::printGraph(g);
  auto again = ir::parseGraph(printed);
  if (!again)
    return violated("the graph's text IR does not parse: " + again.status().message() +
                    "\n--- printed:\n" + printed);
  const std::string reprinted = ir::printGraph(*again);
  if (reprinted != printed)
    return violated("print/parse/print changed the text IR\n--- first:\n" + printed +
                    "\n--- second:\n" + reprinted);
  return {true, std::nullopt};
}
inline Outcome checkGraph(const Expected<ir::Graph>& g) {
  if (!g) return rejected(g.status());
  return checkGraph(*g);
}

// ---- text_ir: parseGraph, in memory.
inline Outcome checkTextIr(std::string_view bytes) {
  return checkGraph(ir::parseGraph(bytes));
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

// Accepted graphs must pass checkGraph, and save and load back as the same graph with the same
// weights.
inline Outcome checkJsonGraph(std::string_view bytes) {
  const JsonGraphInput input = splitJsonGraphInput(bytes);
  const std::string jsonPath = scratchFile("model.json");
  writeFile(jsonPath, input.json);
  writeFile(scratchFile("model.safetensors"), input.weights);
  auto g = frontends::loadGraphJson(jsonPath);
  if (Outcome o = checkGraph(g); !o.accepted || o.violation) return o;
  const std::string printed = ir::printGraph(*g);

  // Written into a directory of its own and removed again, so that a later input's "weights"
  // can never name a file an earlier input left behind.
  const std::filesystem::path roundTripDir = scratchDir() / "round-trip";
  std::filesystem::create_directories(roundTripDir);
  const RemoveOnExit remove{roundTripDir};
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

// ---- npz: an archive (libzip: stored or deflated members); every accepted array must write and
// read back bit for bit.
inline Outcome checkNpz(std::string_view bytes) {
  const std::string path = scratchFile("input.npz");
  writeFile(path, bytes);
  auto arrays = frontends::readNpz(path);
  if (!arrays) return rejected(arrays.status());
  const std::string copy = scratchFile("member.npy");
  for (const auto& [name, t] : *arrays) {
    if (Status st = frontends::writeNpy(copy, t); !st)
      return violated("member '" + name + "' does not write: " + st.message());
    auto again = frontends::readNpy(copy);
    if (!again || !(*again == t)) return violated("write/read changed member '" + name + "'");
  }
  return {true, std::nullopt};
}

// ---- idx: an MNIST-format pair, the images file, the separator, then the labels file. What is
// accepted must be consistent: f32 [M, 1, H, W] with values in [0, 1], M labels below 256.
inline constexpr std::string_view kIdxSeparator = "\n#kiln-fuzz: labels follow#\n";
inline Outcome checkIdx(std::string_view bytes) {
  const size_t cut = bytes.find(kIdxSeparator);
  const std::string images = scratchFile("images-idx3-ubyte"),
                    labels = scratchFile("labels-idx1-ubyte");
  writeFile(images, bytes.substr(0, cut));
  writeFile(labels, cut == std::string_view::npos ? std::string_view()
                                                  : bytes.substr(cut + kIdxSeparator.size()));
  auto d = frontends::readIdx(images, labels);
  if (!d) return rejected(d.status());
  const ir::Shape& s = d->x.shape();
  if (s.size() != 4 || s[1] != 1 || d->labels.shape() != ir::Shape{s[0]} || d->size() < 1)
    return violated("accepted images of " + d->x.type().toString() + " with labels " +
                    d->labels.type().toString());
  for (int64_t i = 0; i < d->x.numElements(); ++i)
    if (!(d->x.as<float>()[i] >= 0.f && d->x.as<float>()[i] <= 1.f))
      return violated("a pixel outside [0, 1]");
  for (int64_t i = 0; i < d->size(); ++i)
    if (d->labels.as<int64_t>()[i] < 0 || d->labels.as<int64_t>()[i] > 255)
      return violated("a label outside [0, 255]");
  return {true, std::nullopt};
}

// ---- image: a PNG or JPEG file, decoded to RGB and to grey: what decodes holds width x height
// pixels of that many channels, and resizes into a fixed input without reading outside it.
inline Outcome checkImage(std::string_view bytes) {
  const std::string path = scratchFile("input.image");
  writeFile(path, bytes);
  bool accepted = false;
  for (const int channels : {3, 1}) {
    auto im = frontends::decodeImage(path, channels);
    if (!im) {
      if (im.status().code() == ErrorCode::kInternal) return violated(im.status().message());
      continue;
    }
    accepted = true;
    if (im->width < 1 || im->height < 1 || im->channels != channels ||
        im->pixels.size() != static_cast<size_t>(im->width * im->height * channels))
      return violated("decoded " + std::to_string(im->width) + "x" + std::to_string(im->height) +
                      " with " + std::to_string(im->pixels.size()) + " bytes");
    std::vector<float> out(static_cast<size_t>(channels) * 7 * 5);
    frontends::imageToTensor(*im, 7, 5, out.data());
    for (float v : out)
      if (!(v >= 0.f && v <= 1.f)) return violated("a resized value outside [0, 1]");
  }
  return {accepted, std::nullopt};
}

// ---- onnx: loadOnnxFromBytes, in memory, with no model directory (external data is an error),
// and a batch for symbolic first dims so that such models import. Accepted graphs must pass
// checkGraph.
// A model that needs stages (NonZero of computed values) is made stage by stage, each cut given
// the size 0 (always valid: nothing runs here), the environment typed by the stages' graphs;
// each stage's graph must pass checkGraph.
inline Outcome checkOnnx(std::string_view bytes) {
  frontends::OnnxImportOptions options;
  options.defaultBatch = 2;
  Expected<ir::Graph> plain = frontends::loadOnnxFromBytes(bytes, options);
  if (plain || !frontends::needsStages(plain.status())) return checkGraph(plain);
  auto staged = frontends::onnxStagesFromBytes(bytes, options);
  if (!staged) return rejected(staged.status());
  std::map<std::string, ir::TensorType> env;
  for (size_t i = 0; i < staged->inputs.size(); ++i)
    env.emplace(staged->inputs[i], staged->inputTypes[i]);
  std::map<std::string, int64_t> sizes;
  std::map<std::string, ir::TensorData> known;
  int64_t begin = 0;
  for (int k = 0; k < 16; ++k) {
    auto stage = staged->stage(begin, env, sizes, known);
    if (!stage) return rejected(stage.status());
    if (stage->graph) {
      if (Outcome o = checkGraph(*stage->graph); !o.accepted || o.violation) return o;
      if (stage->graph->outputs().size() != stage->outputs.size())
        return violated("a stage's graph has " + std::to_string(stage->graph->outputs().size()) +
                        " outputs for " + std::to_string(stage->outputs.size()) + " names");
      for (size_t i = 0; i < stage->outputs.size(); ++i)
        env.insert_or_assign(stage->outputs[i], stage->graph->outputs()[i]->type());
    }
    for (const auto& [name, data] : stage->known) known.insert_or_assign(name, data);
    if (!stage->cut) return {true, std::nullopt};
    if (stage->next < begin || (stage->next == begin && sizes.count(stage->cut->key)))
      return violated("the stages do not advance at " + stage->cut->describe);
    sizes[stage->cut->key] = 0;
    begin = stage->next;
  }
  return {true, std::nullopt};  // Accepted so far: more stages than the check makes.
}

// Every fuzz target, by the name of its seed directory tests/fuzz/corpus/<name>/ (CMake builds
// fuzz_<name> for each such directory). A new reader is one line here plus its seeds.
struct Target {
  std::string_view name;
  Outcome (*check)(std::string_view bytes);
};
inline constexpr Target kTargets[] = {
    {"text_ir", checkTextIr},
    {"json_graph", checkJsonGraph},
    {"safetensors", checkSafetensors},
    {"npy", checkNpy},
    {"npz", checkNpz},
    {"onnx", checkOnnx},
    {"idx", checkIdx},
    {"image", checkImage},
};

// The index of `name` in kTargets, or -1.
constexpr int findTarget(std::string_view name) {
  for (size_t i = 0; i < std::size(kTargets); ++i)
    if (kTargets[i].name == name) return static_cast<int>(i);
  return -1;
}

}  // namespace kiln::fuzz
