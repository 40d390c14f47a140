#include "frontends/file_io.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

namespace kiln::frontends {

namespace fs = std::filesystem;

namespace {

Status syncFile(const fs::path& path, const std::string& target) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return ioError("cannot write '" + target +
                   "': reopening the temporary file failed: " + std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0)
    return ioError("cannot write '" + target + "': syncing failed: " + std::strerror(err));
  return Status::ok();
}

}  // namespace

std::optional<uint64_t> checkedByteSize(std::span<const uint64_t> dims, size_t elementSize) {
  constexpr uint64_t kMax = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  uint64_t nonZero = elementSize;
  bool hasZero = false;
  for (uint64_t d : dims) {
    if (d == 0) {
      hasZero = true;
      continue;
    }
    if (__builtin_mul_overflow(nonZero, d, &nonZero) || nonZero > kMax) return std::nullopt;
  }
  return hasZero ? 0 : nonZero;
}

Expected<InputFile> openInputFile(const std::string& path, const std::string& kind) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found)
    return notFound(kind + " '" + path + "' does not exist");
  if (ec) return ioError("cannot open " + kind + " '" + path + "': " + ec.message());
  if (fs::is_directory(st))
    return invalidArgument(kind + " '" + path + "' is a directory, not a file");
  if (!fs::is_regular_file(st))
    return invalidArgument(kind + " '" + path + "' is not a regular file");
  InputFile f;
  f.stream.open(path, std::ios::binary);
  if (!f.stream) return ioError("cannot open " + kind + " '" + path + "': " + std::strerror(errno));
  f.stream.seekg(0, std::ios::end);
  const std::streamoff size = f.stream.tellg();
  f.stream.seekg(0, std::ios::beg);
  if (size < 0 || !f.stream)
    return ioError("cannot read " + kind + " '" + path + "': cannot determine its size");
  f.size = static_cast<uint64_t>(size);
  return f;
}

Expected<std::string> resolveInsideDirectory(const std::string& directory,
                                             const std::string& relative, const std::string& what,
                                             const std::string& place) {
  const fs::path rel(relative);
  if (relative.empty()) return invalidArgument(what + ": the file name is empty");
  if (rel.is_absolute())
    return invalidArgument(what + ": '" + relative + "' must be relative to " + place);
  for (const auto& part : rel)
    if (part == "..")
      return invalidArgument(what + ": '" + relative + "' must stay inside " + place +
                             " (no '..')");
  const fs::path joined = (directory.empty() ? fs::path(".") : fs::path(directory)) / rel;
  std::error_code ec;
  const fs::path dir = fs::canonical(directory.empty() ? fs::path(".") : fs::path(directory), ec);
  if (ec)
    return ioError(what + ": cannot resolve " + place + " '" + directory + "': " + ec.message());
  const fs::path target = fs::canonical(joined, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory)
      return notFound(what + ": '" + joined.string() + "' does not exist" +
                      (fs::is_symlink(fs::symlink_status(joined)) ? " (a dangling symlink)" : ""));
    return invalidArgument(what + ": cannot resolve '" + joined.string() + "': " + ec.message());
  }
  const fs::path inside = target.lexically_relative(dir);
  if (inside.empty() || *inside.begin() == "..")
    return invalidArgument(what + ": '" + joined.string() + "' resolves to '" + target.string() +
                           "', outside " + place + " '" + dir.string() +
                           "' (through a symlink); copy the file into the directory");
  const fs::file_status st = fs::status(target, ec);
  if (ec) return ioError(what + ": cannot read '" + joined.string() + "': " + ec.message());
  if (!fs::is_regular_file(st))
    return invalidArgument(what + ": '" + joined.string() + "' is " +
                           (fs::is_directory(st) ? "a directory" : "not a regular file") +
                           ", not a data file");
  return target.string();
}

Status writeFilesAtomically(const std::vector<OutputFile>& files) {
  struct Temp {
    fs::path target;
    fs::path temp;
    bool exists = false;
  };
  std::vector<Temp> temps(files.size());
  // Removes every temporary not yet renamed onto its target, on every way out (errors and
  // exceptions alike).
  struct Cleanup {
    std::vector<Temp>& temps;
    ~Cleanup() {
      for (const Temp& t : temps) {
        std::error_code ec;
        if (t.exists) fs::remove(t.temp, ec);
      }
    }
  } cleanup{temps};
  // Unique per process and call, so that concurrent writers never share a temporary.
  static std::atomic<uint64_t> counter{0};

  std::set<fs::path> targets;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string& path = files[i].path;
    const fs::path target(path);
    if (path.empty() || !target.has_filename())
      return invalidArgument("cannot write '" + path + "': not a file name");
    if (!targets.insert(target.lexically_normal()).second)
      return internalError("cannot write '" + path + "': it is named twice in one write");
    const fs::path dir = target.parent_path();
    std::error_code ec;
    if (!dir.empty() && !fs::is_directory(dir, ec))
      return notFound("cannot write '" + path + "': directory '" + dir.string() +
                      "' does not exist");
    if (fs::is_directory(target, ec))
      return invalidArgument("cannot write '" + path + "': it is a directory");
    temps[i].target = target;
    temps[i].temp = dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()) +
                           "." + std::to_string(counter++));
    std::ofstream out(temps[i].temp, std::ios::binary | std::ios::trunc);
    if (!out)
      return ioError("cannot write '" + path + "': creating a temporary file in '" +
                     (dir.empty() ? std::string(".") : dir.string()) +
                     "' failed: " + std::strerror(errno));
    temps[i].exists = true;
    KILN_TRY(files[i].write(out));
    out.flush();
    if (!out)
      return ioError("cannot write '" + path + "': writing failed: " + std::strerror(errno) +
                     " (is the disk full?)");
    out.close();
    if (out.fail())
      return ioError("cannot write '" + path + "': closing failed: " + std::strerror(errno));
    KILN_TRY(syncFile(temps[i].temp, path));
  }
  for (Temp& t : temps) {
    std::error_code ec;
    fs::rename(t.temp, t.target, ec);
    if (ec)
      return ioError("cannot write '" + t.target.string() +
                     "': renaming the finished temporary file onto it failed: " + ec.message());
    t.exists = false;
  }
  return Status::ok();
}

template <class Json>
StrictJson<Json> parseStrictJson(const std::string& text) {
  StrictJson<Json> out;
  // One set of keys per object being parsed, innermost last.
  std::vector<std::set<std::string>> openObjects;
  auto callback = [&](int, typename Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) {
      openObjects.emplace_back();
    } else if (event == Json::parse_event_t::object_end) {
      if (!openObjects.empty()) openObjects.pop_back();
    } else if (event == Json::parse_event_t::key && !out.duplicateKey && !openObjects.empty()) {
      const auto& key = parsed.template get_ref<const std::string&>();
      if (!openObjects.back().insert(key).second) out.duplicateKey = key;
    }
    return true;
  };
  try {
    out.value = Json::parse(text, callback);
  } catch (const typename Json::exception& e) {
    // parse_error for bad syntax; out_of_range (406) for numbers like 1e400 that overflow.
    std::string msg = e.what();
    if (auto pos = msg.find("] "); pos != std::string::npos) msg = msg.substr(pos + 2);
    out.parseError = std::move(msg);
    out.duplicateKey.reset();
  }
  return out;
}

template StrictJson<nlohmann::json> parseStrictJson(const std::string&);
template StrictJson<nlohmann::ordered_json> parseStrictJson(const std::string&);

}  // namespace kiln::frontends
