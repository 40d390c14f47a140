#include "tools/checkpoint.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "frontends/file_io.h"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kFormat = "kiln-checkpoint";
constexpr int kVersion = 1;

std::string stem(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "ckpt-%08lld", static_cast<long long>(step));
  return buf;
}

Expected<nlohmann::json> readJson(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(frontends::InputFile f, frontends::openInputFile(path, "checkpoint"));
  std::stringstream text;
  text << f.stream.rdbuf();
  const auto parsed = frontends::parseStrictJson<nlohmann::json>(text.str());
  if (parsed.parseError)
    return invalidArgument("checkpoint '" + path + "': not JSON (" + *parsed.parseError + ")");
  if (parsed.duplicateKey)
    return invalidArgument("checkpoint '" + path + "': key '" + *parsed.duplicateKey + "' twice");
  return parsed.value;
}

}  // namespace

Status saveCheckpoint(const std::string& dir, const CheckpointInfo& info,
                      const frontends::TensorMap& state) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return ioError("--checkpoint '" + dir + "': cannot create it (" + ec.message() + ")");
  const std::string base = (fs::path(dir) / stem(info.step)).string();
  nlohmann::json meta{{"format", kFormat},
                      {"version", kVersion},
                      {"step", info.step},
                      {"tensors", fs::path(base + ".safetensors").filename().string()},
                      {"settings", info.settings}};
  KILN_ASSIGN_OR_RETURN(frontends::OutputFile tensors,
                        frontends::safetensorsOutput(base + ".safetensors", state));
  const std::string metaText = meta.dump(2) + "\n";
  KILN_TRY(
      frontends::writeFilesAtomically({tensors, {base + ".json", [&](std::ostream& out) -> Status {
                                                   out << metaText;
                                                   return Status::ok();
                                                 }}}));
  // Only now, with both files complete, does latest.json name the new checkpoint.
  const std::string latest =
      nlohmann::json{{"format", kFormat}, {"latest", fs::path(base).filename().string()}}.dump() +
      "\n";
  KILN_TRY(frontends::writeFilesAtomically(
      {{(fs::path(dir) / "latest.json").string(), [&](std::ostream& out) -> Status {
          out << latest;
          return Status::ok();
        }}}));
  // Keep this checkpoint and the one before it.
  std::vector<std::string> old;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ckpt-", 0) == 0 && name.size() > 13 && name.substr(0, 13) < stem(info.step))
      old.push_back(name.substr(0, 13));
  }
  std::sort(old.begin(), old.end());
  old.erase(std::unique(old.begin(), old.end()), old.end());
  for (size_t i = 0; i + 1 < old.size(); ++i) {
    fs::remove(fs::path(dir) / (old[i] + ".safetensors"), ec);
    fs::remove(fs::path(dir) / (old[i] + ".json"), ec);
  }
  // Temporary files of a save that was killed (frontends::writeFilesAtomically names them
  // ".<target>.tmp.<pid>.<n>"): this save's own are renamed by now.
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if ((name.rfind(".ckpt-", 0) == 0 || name.rfind(".latest.json", 0) == 0) &&
        name.find(".tmp.") != std::string::npos)
      stale.push_back(e.path());
  }
  for (const fs::path& p : stale) fs::remove(p, ec);
  return Status::ok();
}

Expected<Checkpoint> loadCheckpoint(const std::string& path) {
  if (!fs::exists(path))
    return notFound("checkpoint '" + path + "' does not exist (nothing saved there yet)");
  std::string base;
  if (fs::is_directory(path)) {
    const std::string latest = (fs::path(path) / "latest.json").string();
    if (!fs::exists(latest))
      return notFound("checkpoint directory '" + path + "' has no latest.json (nothing saved yet)");
    KILN_ASSIGN_OR_RETURN(nlohmann::json l, readJson(latest));
    if (!l.is_object() || l.value("format", "") != kFormat || !l.contains("latest") ||
        !l["latest"].is_string())
      return invalidArgument("checkpoint '" + latest + "': not a kiln latest.json");
    const std::string name = l["latest"].get<std::string>();
    if (name.find('/') != std::string::npos || name.find("..") != std::string::npos)
      return invalidArgument("checkpoint '" + latest + "': names '" + name +
                             "', not a file of its directory");
    base = (fs::path(path) / name).string();
  } else {
    const std::string p = path;
    const std::string ext = ".safetensors";
    if (p.size() <= ext.size() || p.compare(p.size() - ext.size(), ext.size(), ext) != 0)
      return invalidArgument("checkpoint '" + path +
                             "': expected a checkpoint directory or a ckpt-*.safetensors file");
    base = p.substr(0, p.size() - ext.size());
  }
  KILN_ASSIGN_OR_RETURN(nlohmann::json meta, readJson(base + ".json"));
  if (!meta.is_object() || meta.value("format", "") != kFormat)
    return invalidArgument("checkpoint '" + base + ".json': not a kiln checkpoint");
  if (meta.value("version", 0) != kVersion)
    return invalidArgument("checkpoint '" + base + ".json': version " +
                           meta.value("version", nlohmann::json()).dump() + ", kiln reads " +
                           std::to_string(kVersion));
  Checkpoint c;
  if (!meta.contains("step") || !meta["step"].is_number_integer() ||
      meta["step"].get<int64_t>() < 0)
    return invalidArgument("checkpoint '" + base + ".json': no valid \"step\"");
  c.info.step = meta["step"].get<int64_t>();
  if (meta.contains("settings") && meta["settings"].is_object())
    for (const auto& [k, v] : meta["settings"].items())
      if (v.is_string()) c.info.settings[k] = v.get<std::string>();
  c.path = base + ".safetensors";
  KILN_ASSIGN_OR_RETURN(c.tensors, frontends::readSafetensors(c.path));
  return c;
}

Status applyWeights(ir::Graph& g, const std::string& path) {
  frontends::TensorMap tensors;
  const bool checkpoint =
      fs::is_directory(path) ||
      (path.size() > 12 && fs::exists(path.substr(0, path.size() - 12) + ".json") &&
       path.compare(path.size() - 12, 12, ".safetensors") == 0);
  if (checkpoint) {
    KILN_ASSIGN_OR_RETURN(Checkpoint c, loadCheckpoint(path));
    tensors = std::move(c.tensors);
  } else {
    KILN_ASSIGN_OR_RETURN(tensors, frontends::readSafetensors(path));
  }
  std::vector<std::string> missing;
  for (ir::Value* p : g.parameters()) {
    if (p->name().rfind("const:", 0) == 0) continue;  // The builder's constants, not weights.
    auto it = tensors.find(p->name());
    if (it == tensors.end()) {
      missing.push_back(p->name());
      continue;
    }
    if (it->second.dtype() != p->type().dtype || it->second.shape() != p->type().shape)
      return invalidArgument("--weights '" + path + "': '" + p->name() + "' is " +
                             it->second.type().toString() + ", the model's is " +
                             p->type().toString());
    p->setData(it->second);
  }
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 5; ++i) list += (i ? ", " : "") + missing[i];
    if (missing.size() > 5) list += ", ...";
    return invalidArgument("--weights '" + path + "': no tensor for " +
                           std::to_string(missing.size()) + " parameter(s) of the model: " + list);
  }
  return Status::ok();
}

}  // namespace kiln::cli
