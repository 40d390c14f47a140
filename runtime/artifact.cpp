#include "runtime/artifact.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <span>
#include <utility>

#include "ir/op_table.h"
#include "ir/timing.h"
#include "runtime/object_loader.h"

namespace kiln::runtime {

namespace {

namespace fs = std::filesystem;

// ---- Layout (docs/artifact-format.md).
constexpr size_t kHeaderBytes = 64;
constexpr size_t kHeaderChecksumAt = 56;   // XXH3-64 of bytes [0, 56).
constexpr size_t kSectionEntryBytes = 40;  // name[16], offset, size, checksum.
constexpr size_t kSectionNameBytes = 16;
constexpr uint32_t kMaxSections = 32;
constexpr uint64_t kSectionAlign = 64;
constexpr uint64_t kWeightsAlign = 4096;  // The weights start on a page.

const char* const kRequiredSections[] = {"meta", "graph", "plan", "objects", "sources", "weights"};

uint64_t checksum(std::span<const std::byte> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

uint64_t alignUp(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

// ---- Little-endian writer and bounds-checked reader.
class ByteWriter {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void i64(int64_t v) { raw(&v, 8); }
  void f64(double v) { raw(&v, 8); }
  void str(std::string_view s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  void bytes(std::span<const std::byte> b) {
    u64(b.size());
    raw(b.data(), b.size());
  }
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  void padTo(uint64_t align) { out_.resize(alignUp(out_.size(), align)); }
  size_t size() const { return out_.size(); }
  std::vector<std::byte>& out() { return out_; }

 private:
  std::vector<std::byte> out_;
};

class ByteReader {
 public:
  ByteReader(std::span<const std::byte> in, std::string section)
      : in_(in), section_(std::move(section)) {}

  uint8_t u8() { return take<uint8_t>(); }
  uint32_t u32() { return take<uint32_t>(); }
  uint64_t u64() { return take<uint64_t>(); }
  int64_t i64() { return take<int64_t>(); }
  double f64() { return take<double>(); }
  std::string str() {
    std::span<const std::byte> b = bytes();
    return std::string(reinterpret_cast<const char*>(b.data()), b.size());
  }
  std::span<const std::byte> bytes() {
    const uint64_t n = u64();
    if (!need(n)) return {};
    auto b = in_.subspan(pos_, n);
    pos_ += n;
    return b;
  }
  // A count of items that each take at least `minBytes`: bounded by what is left, so that a
  // corrupt count cannot ask for a huge allocation.
  size_t count(size_t minBytes = 1) {
    const uint64_t n = u64();
    if (ok_ && n > (in_.size() - pos_) / std::max<size_t>(minBytes, 1))
      fail("a count of " + std::to_string(n));
    return ok_ ? static_cast<size_t>(n) : 0;
  }
  void fail(const std::string& what) {
    if (ok_)
      error_ =
          "section '" + section_ + "' is malformed at byte " + std::to_string(pos_) + ": " + what;
    ok_ = false;
  }
  bool ok() const { return ok_; }
  bool atEnd() const { return pos_ == in_.size(); }
  Status status() const { return ok_ ? Status::ok() : invalidArgument(error_); }

 private:
  template <class T>
  T take() {
    T v{};
    if (!need(sizeof(T))) return v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  bool need(uint64_t n) {
    if (ok_ && n > in_.size() - pos_)
      fail("it ends early (" + std::to_string(n) + " bytes wanted)");
    return ok_;
  }

  std::span<const std::byte> in_;
  size_t pos_ = 0;
  std::string section_;
  bool ok_ = true;
  std::string error_;
};

// ---- Types and attributes.
void writeType(ByteWriter& w, const ir::TensorType& t) {
  w.u8(static_cast<uint8_t>(t.dtype));
  w.u8(static_cast<uint8_t>(t.layout));
  w.u64(t.shape.size());
  for (int64_t d : t.shape) w.i64(d);
}

// Bytes of `t`, or -1 when the size does not fit in 63 bits.
int64_t checkedBytes(const ir::TensorType& t) {
  int64_t bytes = static_cast<int64_t>(ir::dtypeSize(t.dtype));
  for (int64_t d : t.shape)
    if (d < 0 || __builtin_mul_overflow(bytes, d, &bytes)) return -1;
  return bytes;
}

ir::TensorType readType(ByteReader& r) {
  ir::TensorType t;
  const uint8_t dtype = r.u8(), layout = r.u8();
  if (dtype >= ir::kNumDTypes) r.fail("dtype " + std::to_string(dtype));
  if (layout > static_cast<uint8_t>(ir::Layout::kNHWC)) r.fail("layout " + std::to_string(layout));
  t.dtype = static_cast<ir::DType>(dtype < ir::kNumDTypes ? dtype : 0);
  t.layout = static_cast<ir::Layout>(layout <= 2 ? layout : 0);
  const size_t rank = r.count(8);
  if (rank > 8) r.fail("rank " + std::to_string(rank));
  for (size_t i = 0; r.ok() && i < rank; ++i) t.shape.push_back(r.i64());
  if (r.ok() && checkedBytes(t) < 0) r.fail("type " + t.toString() + " is too large");
  return t;
}

void writeAttrs(ByteWriter& w, const ir::AttrMap& attrs) {
  w.u64(attrs.size());
  for (const auto& [name, v] : attrs) {
    w.str(name);
    w.u8(static_cast<uint8_t>(ir::kindOf(v)));
    switch (ir::kindOf(v)) {
      case ir::AttrKind::kInt:
        w.i64(std::get<int64_t>(v));
        break;
      case ir::AttrKind::kFloat:
        w.f64(std::get<double>(v));
        break;
      case ir::AttrKind::kString:
        w.str(std::get<std::string>(v));
        break;
      case ir::AttrKind::kInts:
        w.u64(std::get<std::vector<int64_t>>(v).size());
        for (int64_t x : std::get<std::vector<int64_t>>(v)) w.i64(x);
        break;
      case ir::AttrKind::kFloats:
        w.u64(std::get<std::vector<double>>(v).size());
        for (double x : std::get<std::vector<double>>(v)) w.f64(x);
        break;
      case ir::AttrKind::kTensor: {
        const auto& t = std::get<ir::TensorData>(v);
        writeType(w, t.type());
        w.bytes(t.bytes());
        break;
      }
    }
  }
}

ir::AttrMap readAttrs(ByteReader& r) {
  ir::AttrMap attrs;
  const size_t n = r.count(10);
  for (size_t i = 0; r.ok() && i < n; ++i) {
    std::string name = r.str();
    const uint8_t kind = r.u8();
    switch (static_cast<ir::AttrKind>(kind)) {
      case ir::AttrKind::kInt:
        attrs[name] = r.i64();
        break;
      case ir::AttrKind::kFloat:
        attrs[name] = r.f64();
        break;
      case ir::AttrKind::kString:
        attrs[name] = r.str();
        break;
      case ir::AttrKind::kInts: {
        std::vector<int64_t> v(r.count(8));
        for (auto& x : v) x = r.i64();
        attrs[name] = std::move(v);
        break;
      }
      case ir::AttrKind::kFloats: {
        std::vector<double> v(r.count(8));
        for (auto& x : v) x = r.f64();
        attrs[name] = std::move(v);
        break;
      }
      case ir::AttrKind::kTensor: {
        const ir::TensorType t = readType(r);
        const auto b = r.bytes();
        if (!r.ok()) break;
        if (static_cast<int64_t>(b.size()) != checkedBytes(t)) {
          r.fail("tensor attribute '" + name + "' holds " + std::to_string(b.size()) + " bytes");
          break;
        }
        ir::TensorData d(t.dtype, t.shape);
        if (!b.empty()) std::memcpy(d.data(), b.data(), b.size());
        attrs[name] = std::move(d);
        break;
      }
      default:
        r.fail("attribute kind " + std::to_string(kind));
    }
  }
  return attrs;
}

void writeBuffer(ByteWriter& w, const BufferRef& b) {
  w.u8(static_cast<uint8_t>(b.kind));
  w.i64(b.index);
  w.i64(b.offset);
  writeType(w, b.type);
}

// ---- Sections.
struct Section {
  std::string name;
  std::vector<std::byte> bytes;
  uint64_t align = kSectionAlign;
};

std::vector<std::byte> metaSection(const ArtifactContents& c) {
  ByteWriter w;
  w.str(c.modelName);
  w.str(c.producer);
  w.str(c.triple);
  w.str(c.cpu);
  w.str(c.features);
  w.u64(c.algorithmChoices.size());
  for (const auto& a : c.algorithmChoices) w.str(a);
  w.u64(c.outputNames.size());
  for (const auto& n : c.outputNames) w.str(n);
  return std::move(w.out());
}

// The plan; parameters are (type, offset into the weights section), whose layout this
// computes into `weightOffsets`.
std::vector<std::byte> planSection(const ArtifactContents& c,
                                   std::vector<uint64_t>& weightOffsets) {
  const Plan& p = *c.plan;
  ByteWriter w;
  w.u64(p.inputs.size());
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    w.str(p.inputNames[i]);
    writeType(w, p.inputs[i]);
    const std::vector<std::string> none;
    const auto& names = i < c.inputDimNames.size() ? c.inputDimNames[i] : none;
    w.u64(names.size());
    for (const auto& n : names) w.str(n);
  }
  w.u64(p.outputs.size());
  for (const auto& t : p.outputs) writeType(w, t);
  w.i64(p.arenaBytes);
  uint64_t offset = 0;
  w.u64(p.parameters.size());
  for (const auto& t : p.parameters) {
    offset = alignUp(offset, 64);
    weightOffsets.push_back(offset);
    writeType(w, t.type());
    w.u64(offset);
    offset += t.byteSize();
  }
  w.u64(p.steps.size());
  for (const PlanStep& s : p.steps) {
    w.u8(static_cast<uint8_t>(s.kind));
    w.str(s.name);
    w.u64(s.inputs.size());
    for (const auto& b : s.inputs) writeBuffer(w, b);
    w.u64(s.outputs.size());
    for (const auto& b : s.outputs) writeBuffer(w, b);
    w.i64(s.units);
    w.i64(s.elements);
    w.i64(s.scratchBytes);
    w.str(ir::opName(s.op));
    writeAttrs(w, s.attrs);
    w.u8(s.library);
    w.u64(s.postOps.size());
    for (const PostOp& po : s.postOps) {
      w.u8(static_cast<uint8_t>(po.kind));
      w.f64(po.alpha);
      w.f64(po.beta);
      w.i64(po.input);
    }
    w.i64(s.numExtra);
    w.u8(static_cast<uint8_t>(s.libraryOptions.algo));
    w.u8(s.libraryOptions.channelsLast);
    w.u8(static_cast<uint8_t>(s.libraryOptions.gemm));
  }
  return std::move(w.out());
}

// The temporary file an artifact is written to before it is renamed into place: beside the
// target, named ".NAME.tmp.PID.RANDOM" (not guessable, so another user cannot plant a symlink
// there; created exclusively, so an existing file is never followed or truncated), synced
// before the rename so that a crash never leaves a renamed but empty artifact, and removed on
// every way out. Temporaries of processes that no longer exist (a compile killed with SIGKILL)
// are removed by the next write into that directory.
class TempFile {
 public:
  static Expected<TempFile> create(const std::string& target) {
    const fs::path t(target);
    const fs::path dir = t.parent_path().empty() ? fs::path(".") : t.parent_path();
    removeStale(dir);
    std::random_device random;
    const uint64_t tag = (uint64_t{random()} << 32) ^ random();
    TempFile f;
    f.target_ = target;
    f.path_ = (dir / ("." + t.filename().string() + ".tmp." + hostTag() + "." +
                      std::to_string(::getpid()) + "." + std::to_string(tag)))
                  .string();
    f.fd_ = ::open(f.path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (f.fd_ < 0)
      return ioError("cannot write '" + target + "': creating a temporary file in '" +
                     dir.string() + "' failed: " + std::strerror(errno) +
                     " (is the directory writable?)");
    return f;
  }

  TempFile() = default;
  TempFile(TempFile&& o) noexcept
      : target_(std::move(o.target_)), path_(std::move(o.path_)), fd_(std::exchange(o.fd_, -1)) {}
  ~TempFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(path_.c_str());
    }
  }

  Status write(std::span<const std::byte> bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        return ioError("writing '" + target_ + "' failed: " + std::strerror(errno) +
                       (errno == ENOSPC ? " (the disk is full)" : ""));
      done += static_cast<size_t>(n);
    }
    return Status::ok();
  }

  // fsync, close, rename onto the target. On error the temporary is removed.
  Status commit() {
    if (::fsync(fd_) != 0)
      return ioError("writing '" + target_ + "' failed: syncing: " + std::strerror(errno));
    const int fd = std::exchange(fd_, -1);
    if (::close(fd) != 0) {
      ::unlink(path_.c_str());
      return ioError("writing '" + target_ + "' failed: " + std::strerror(errno));
    }
    if (::rename(path_.c_str(), target_.c_str()) != 0) {
      const int err = errno;
      ::unlink(path_.c_str());
      return ioError("cannot move the artifact into place at '" + target_ +
                     "': " + std::strerror(err));
    }
    return Status::ok();
  }

 private:
  // This machine and boot, so that a temporary written by a process in another PID namespace
  // or on another host sharing the directory (whose PID means nothing here) is never judged
  // stale: the host name and the boot id, hashed.
  static const std::string& hostTag() {
    static const std::string tag = [] {
      char host[256] = {};
      ::gethostname(host, sizeof(host) - 1);
      std::string id = host;
      std::ifstream boot("/proc/sys/kernel/random/boot_id");
      std::string bootId;
      std::getline(boot, bootId);
      id += "|" + bootId;
      char hex[17];
      std::snprintf(hex, sizeof(hex), "%016llx",
                    static_cast<unsigned long long>(XXH3_64bits(id.data(), id.size())));
      return std::string(hex);
    }();
    return tag;
  }

  // Removes the artifact temporaries in `dir` (".X.kiln.tmp.HOST.PID.N" of this host and boot,
  // and "X.kiln.tmpPID" of older kilns) whose process is gone, whatever artifact they were for.
  static void removeStale(const fs::path& dir) {
    std::error_code ec;
    const std::string mine = ".kiln.tmp." + hostTag() + ".";
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string f = it->path().filename().string();
      std::string pid;
      if (const size_t at = f.find(mine); f[0] == '.' && at != std::string::npos)
        pid = f.substr(at + mine.size(), f.find('.', at + mine.size()) - (at + mine.size()));
      else if (const size_t old = f.find(".kiln.tmp"); f[0] != '.' && old != std::string::npos)
        pid = f.substr(old + 9);
      else
        continue;
      if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
      const long id = std::strtol(pid.c_str(), nullptr, 10);
      if (id <= 0 || id == ::getpid()) continue;
      if (::kill(static_cast<pid_t>(id), 0) != 0 && errno == ESRCH) {
        std::error_code rm;
        fs::remove(it->path(), rm);
      }
    }
  }

  std::string target_;
  std::string path_;
  int fd_ = -1;
};

Status writeFileAtomically(const std::string& path, const std::vector<Section>& sections) {
  // Layout: header, table, then each section aligned.
  std::vector<ArtifactSection> table;
  uint64_t offset = alignUp(kHeaderBytes + sections.size() * kSectionEntryBytes, kSectionAlign);
  for (const Section& s : sections) {
    offset = alignUp(offset, s.align);
    table.push_back({s.name, offset, s.bytes.size(), checksum(s.bytes)});
    offset += s.bytes.size();
  }
  const uint64_t fileBytes = offset;

  ByteWriter tableBytes;
  for (const ArtifactSection& t : table) {
    char name[kSectionNameBytes] = {};
    std::memcpy(name, t.name.data(), std::min(t.name.size(), kSectionNameBytes - 1));
    tableBytes.raw(name, kSectionNameBytes);
    tableBytes.u64(t.offset);
    tableBytes.u64(t.size);
    tableBytes.u64(t.checksum);
  }
  ByteWriter header;
  header.raw(kArtifactMagic, sizeof(kArtifactMagic));
  header.u32(kArtifactVersion);
  header.u32(static_cast<uint32_t>(sections.size()));
  header.u64(fileBytes);
  header.u64(kHeaderBytes);  // Where the section table starts.
  header.u64(checksum(tableBytes.out()));
  header.padTo(kHeaderChecksumAt);
  header.u64(checksum(header.out()));

  KILN_ASSIGN_OR_RETURN(TempFile temp, TempFile::create(path));
  {
    auto put = [&](std::span<const std::byte> b) { return temp.write(b); };
    KILN_TRY(put(header.out()));
    KILN_TRY(put(tableBytes.out()));
    uint64_t at = header.size() + tableBytes.size();
    const std::vector<std::byte> zeros(kWeightsAlign);
    for (size_t i = 0; i < sections.size(); ++i) {
      KILN_TRY(put(std::span(zeros).first(table[i].offset - at)));
      KILN_TRY(put(sections[i].bytes));
      at = table[i].offset + table[i].size;
    }
  }
  return temp.commit();
}

// ---- Reading.
struct Mapping {
  std::byte* data = nullptr;
  size_t size = 0;
  ~Mapping() {
    if (data) ::munmap(data, size);
  }
};

Expected<std::shared_ptr<Mapping>> mapFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT
               ? notFound("artifact '" + path + "' does not exist")
               : ioError("cannot open artifact '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return invalidArgument("'" + path + "' is not a regular file");
  }
  auto m = std::make_shared<Mapping>();
  m->size = static_cast<size_t>(st.st_size);
  if (m->size > 0) {
    // Private and writable: the weights are copy-on-write, so nothing can change the file.
    void* p = ::mmap(nullptr, m->size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return ioError("cannot map artifact '" + path + "': " + std::strerror(errno));
    }
    m->data = static_cast<std::byte*>(p);
  }
  ::close(fd);
  return m;
}

struct Opened {
  std::shared_ptr<Mapping> map;
  ArtifactInfo info;
  std::map<std::string, std::span<const std::byte>> sections;
};

Status bad(const std::string& path, const std::string& what) {
  return invalidArgument("artifact '" + path + "': " + what);
}

// Header, table and every checksum.
Expected<Opened> openArtifact(const std::string& path) {
  Opened o;
  KILN_ASSIGN_OR_RETURN(o.map, mapFile(path));
  const std::span<const std::byte> file(o.map->data, o.map->size);
  o.info.path = path;
  o.info.fileBytes = file.size();
  if (file.size() < sizeof(kArtifactMagic) ||
      std::memcmp(file.data(), kArtifactMagic, sizeof(kArtifactMagic)) != 0)
    return bad(path,
               "not a kiln artifact (no KILNAOT header; make one with `kiln compile MODEL "
               "-o FILE.kiln`)");
  if (file.size() < kHeaderBytes)
    return bad(path, "truncated: " + std::to_string(file.size()) + " bytes, fewer than its " +
                         std::to_string(kHeaderBytes) + "-byte header");
  ByteReader h(file.first(kHeaderBytes), "header");
  h.u64();  // Magic.
  const uint32_t version = h.u32();
  const uint32_t numSections = h.u32();
  const uint64_t fileBytes = h.u64();
  const uint64_t tableAt = h.u64();
  const uint64_t tableChecksum = h.u64();
  // The version first: it says how the rest of the header is laid out.
  o.info.version = version;
  if (version < kArtifactOldestVersion || version > kArtifactVersion)
    return bad(path, "format version " + std::to_string(version) +
                         ", but this kiln reads versions " +
                         std::to_string(kArtifactOldestVersion) + " to " +
                         std::to_string(kArtifactVersion) +
                         "; compile the model again with this kiln (`kiln compile MODEL -o FILE`)");
  uint64_t headerChecksum = 0;
  std::memcpy(&headerChecksum, file.data() + kHeaderChecksumAt, 8);
  if (headerChecksum != checksum(file.first(kHeaderChecksumAt)))
    return bad(path, "header checksum mismatch: the file is corrupt");
  if (fileBytes != file.size())
    return bad(path, "the header says " + std::to_string(fileBytes) + " bytes but the file has " +
                         std::to_string(file.size()) +
                         (file.size() < fileBytes ? " (truncated)" : " (extra bytes)"));
  if (numSections > kMaxSections || tableAt != kHeaderBytes ||
      kHeaderBytes + numSections * kSectionEntryBytes > file.size())
    return bad(path, "malformed section table");
  const auto tableBytes = file.subspan(tableAt, numSections * kSectionEntryBytes);
  if (checksum(tableBytes) != tableChecksum)
    return bad(path, "section table checksum mismatch: the file is corrupt");
  ByteReader t(tableBytes, "table");
  for (uint32_t i = 0; i < numSections; ++i) {
    char name[kSectionNameBytes];
    for (char& c : name) c = static_cast<char>(t.u8());
    name[kSectionNameBytes - 1] = '\0';
    ArtifactSection s{name, t.u64(), t.u64(), t.u64()};
    if (s.offset > file.size() || s.size > file.size() - s.offset)
      return bad(path, "section '" + s.name + "' lies outside the file");
    const auto bytes = file.subspan(s.offset, s.size);
    if (checksum(bytes) != s.checksum)
      return bad(path, "section '" + s.name + "' checksum mismatch: the file is corrupt");
    o.sections[s.name] = bytes;
    o.info.sections.push_back(std::move(s));
  }
  for (const char* required : kRequiredSections)
    if (!o.sections.count(required)) return bad(path, "no '" + std::string(required) + "' section");
  return o;
}

struct ParsedPlan {
  std::shared_ptr<Plan> plan;
  std::vector<uint64_t> weightOffsets;
};

Status checkBuffer(ByteReader& r, const BufferRef& b, const Plan& p) {
  const int64_t bytes = checkedBytes(b.type);
  auto limit = [&]() -> int64_t {
    switch (b.kind) {
      case BufferRef::Kind::kInput:
        return b.index >= 0 && static_cast<size_t>(b.index) < p.inputs.size()
                   ? checkedBytes(p.inputs[b.index])
                   : -1;
      case BufferRef::Kind::kParameter:
        return b.index >= 0 && static_cast<size_t>(b.index) < p.parameters.size()
                   ? static_cast<int64_t>(p.parameters[b.index].byteSize())
                   : -1;
      case BufferRef::Kind::kOutput:
        return b.index >= 0 && static_cast<size_t>(b.index) < p.outputs.size()
                   ? checkedBytes(p.outputs[b.index])
                   : -1;
      case BufferRef::Kind::kArena:
        return b.offset >= 0 && b.offset <= p.arenaBytes ? p.arenaBytes - b.offset : -1;
    }
    return -1;
  }();
  if (r.ok() && (bytes < 0 || limit < 0 || bytes > limit))
    r.fail("a buffer (" + b.type.toString() + ") outside its input, parameter, output or arena");
  return Status::ok();
}

BufferRef readBuffer(ByteReader& r) {
  BufferRef b;
  const uint8_t kind = r.u8();
  if (kind > static_cast<uint8_t>(BufferRef::Kind::kOutput)) r.fail("buffer kind");
  b.kind = static_cast<BufferRef::Kind>(kind);
  const int64_t index = r.i64();
  if (index < 0 || index > std::numeric_limits<int>::max()) r.fail("buffer index");
  b.index = static_cast<int>(index);
  b.offset = r.i64();
  b.type = readType(r);
  return b;
}

Expected<ParsedPlan> parsePlan(std::span<const std::byte> bytes, ArtifactInfo& info) {
  ByteReader r(bytes, "plan");
  auto plan = std::make_shared<Plan>();
  ParsedPlan out;
  const size_t numInputs = r.count(16);
  for (size_t i = 0; r.ok() && i < numInputs; ++i) {
    plan->inputNames.push_back(r.str());
    plan->inputs.push_back(readType(r));
    std::vector<std::string> names(r.count(8));
    for (auto& n : names) n = r.str();
    info.inputDimNames.push_back(std::move(names));
  }
  const size_t numOutputs = r.count(10);
  for (size_t i = 0; r.ok() && i < numOutputs; ++i) plan->outputs.push_back(readType(r));
  plan->arenaBytes = r.i64();
  if (plan->arenaBytes < 0 || plan->arenaBytes > (int64_t{1} << 40)) r.fail("arena size");
  const size_t numParams = r.count(18);
  std::vector<ir::TensorType> paramTypes;
  for (size_t i = 0; r.ok() && i < numParams; ++i) {
    paramTypes.push_back(readType(r));
    out.weightOffsets.push_back(r.u64());
  }
  // Placeholders with the right sizes, for the buffer checks; the data is mapped later.
  for (const auto& t : paramTypes)
    plan->parameters.push_back(ir::TensorData::wrap(t.dtype, t.shape, nullptr, nullptr));
  const size_t numSteps = r.count(32);
  for (size_t i = 0; r.ok() && i < numSteps; ++i) {
    PlanStep s;
    const uint8_t kind = r.u8();
    if (kind > static_cast<uint8_t>(PlanStep::Kind::kCopy)) r.fail("step kind");
    s.kind = static_cast<PlanStep::Kind>(kind);
    s.name = r.str();
    const size_t ni = r.count(11);
    for (size_t k = 0; r.ok() && k < ni; ++k) s.inputs.push_back(readBuffer(r));
    const size_t no = r.count(11);
    for (size_t k = 0; r.ok() && k < no; ++k) s.outputs.push_back(readBuffer(r));
    s.units = r.i64();
    s.elements = r.i64();
    if (info.version >= 2) s.scratchBytes = r.i64();
    const std::string op = r.str();
    const ir::OpInfo* info = r.ok() ? ir::findOp(op) : nullptr;
    if (r.ok() && !info) r.fail("unknown op '" + op + "'");
    if (info) s.op = info->kind;
    s.attrs = readAttrs(r);
    s.library = r.u8() != 0;
    const size_t npo = r.count(25);
    for (size_t k = 0; r.ok() && k < npo; ++k) {
      PostOp po;
      const uint8_t pk = r.u8();
      if (pk > static_cast<uint8_t>(PostOp::Kind::kAdd)) r.fail("post-op kind");
      po.kind = static_cast<PostOp::Kind>(pk);
      po.alpha = r.f64();
      po.beta = r.f64();
      const int64_t in = r.i64();
      if (in < -1 || in > 1024) r.fail("post-op input");
      po.input = static_cast<int>(in);
      s.postOps.push_back(po);
    }
    const int64_t extra = r.i64();
    if (extra < 0 || static_cast<size_t>(extra) > s.inputs.size()) r.fail("extra input count");
    s.numExtra = static_cast<int>(extra);
    const uint8_t algo = r.u8(), channelsLast = r.u8(), gemm = r.u8();
    if (algo > static_cast<uint8_t>(ConvAlgo::kLast)) r.fail("conv algorithm");
    if (gemm > static_cast<uint8_t>(GemmBackend::kOneDnn)) r.fail("gemm backend");
    s.libraryOptions.algo = static_cast<ConvAlgo>(algo);
    s.libraryOptions.channelsLast = channelsLast != 0;
    s.libraryOptions.gemm = static_cast<GemmBackend>(gemm);
    if (s.kind == PlanStep::Kind::kKernel && s.units < 0) r.fail("kernel work units");
    if (s.scratchBytes < 0 || s.scratchBytes > (int64_t{1} << 30) ||
        (s.scratchBytes > 0 && s.kind != PlanStep::Kind::kKernel))
      r.fail("kernel scratch size");
    for (const auto& b : s.inputs) KILN_TRY(checkBuffer(r, b, *plan));
    for (const auto& b : s.outputs) KILN_TRY(checkBuffer(r, b, *plan));
    plan->steps.push_back(std::move(s));
  }
  if (r.ok() && !r.atEnd()) r.fail("bytes after the last step");
  // The arena is what its buffers span (the memory planner's, each rounded up to 64 bytes):
  // load prepares the plan and so allocates it, and a damaged size must not ask for terabytes.
  int64_t spanned = 0;
  for (const PlanStep& s : plan->steps)
    for (const auto* list : {&s.inputs, &s.outputs})
      for (const BufferRef& b : *list)
        if (b.kind == BufferRef::Kind::kArena)
          spanned = std::max(spanned, b.offset + (checkedBytes(b.type) + 63) / 64 * 64);
  if (r.ok() && plan->arenaBytes > spanned)
    r.fail("arena size " + std::to_string(plan->arenaBytes) + " beyond the " +
           std::to_string(spanned) + " bytes its buffers span");
  KILN_TRY(r.status());
  info.inputNames = plan->inputNames;
  info.inputs = plan->inputs;
  info.outputs = plan->outputs;
  info.arenaBytes = plan->arenaBytes;
  info.numSteps = plan->steps.size();
  for (const auto& t : paramTypes) info.parameterBytes += checkedBytes(t);
  for (const auto& s : plan->steps)
    if (s.kind == PlanStep::Kind::kKernel) info.kernels.push_back(s.name);
  out.plan = std::move(plan);
  return out;
}

Status parseMeta(std::span<const std::byte> bytes, ArtifactInfo& info) {
  ByteReader r(bytes, "meta");
  info.modelName = r.str();
  info.producer = r.str();
  info.triple = r.str();
  info.cpu = r.str();
  info.features = r.str();
  const size_t n = r.count(8);
  for (size_t i = 0; r.ok() && i < n; ++i) info.algorithmChoices.push_back(r.str());
  const size_t numOutputs = r.count(8);
  for (size_t i = 0; r.ok() && i < numOutputs; ++i) info.outputNames.push_back(r.str());
  if (r.ok() && !r.atEnd()) r.fail("bytes after the output names");
  return r.status();
}

// (name, bytes) pairs: the objects, sources and ptx sections.
Expected<std::vector<std::pair<std::string, std::span<const std::byte>>>> parseNamedBlobs(
    std::span<const std::byte> bytes, const std::string& section) {
  ByteReader r(bytes, section);
  std::vector<std::pair<std::string, std::span<const std::byte>>> out;
  const size_t n = r.count(16);
  for (size_t i = 0; r.ok() && i < n; ++i) {
    std::string name = r.str();
    out.emplace_back(std::move(name), r.bytes());
  }
  if (r.ok() && !r.atEnd()) r.fail("bytes after the last entry");
  KILN_TRY(r.status());
  return out;
}

// 90 for "sm_90"; nullopt for anything else.
std::optional<int> parseSmArch(const std::string& arch) {
  if (arch.size() < 5 || arch.size() > 7 || arch.compare(0, 3, "sm_") != 0) return std::nullopt;
  int v = 0;
  for (size_t i = 3; i < arch.size(); ++i) {
    if (arch[i] < '0' || arch[i] > '9') return std::nullopt;
    v = v * 10 + (arch[i] - '0');
  }
  return v;
}

Expected<ArtifactInfo> readInfo(Opened& o, ParsedPlan* planOut) {
  ArtifactInfo& info = o.info;
  const std::string& path = info.path;
  KILN_TRY(parseMeta(o.sections.at("meta"), info).withContext("artifact '" + path + "'"));
  const auto graph = o.sections.at("graph");
  info.optimizedGraph.assign(reinterpret_cast<const char*>(graph.data()), graph.size());
  auto plan = parsePlan(o.sections.at("plan"), info);
  if (!plan) return plan.status().withContext("artifact '" + path + "'");
  if (info.outputNames.size() != info.outputs.size())
    return bad(path, "the meta section names " + std::to_string(info.outputNames.size()) +
                         " outputs, the plan has " + std::to_string(info.outputs.size()));
  KILN_ASSIGN_OR_RETURN(auto objects, parseNamedBlobs(o.sections.at("objects"), "objects"));
  for (const auto& [name, b] : objects) info.moduleNames.push_back(name);
  if (o.sections.count("ptx")) {
    KILN_ASSIGN_OR_RETURN(auto ptx, parseNamedBlobs(o.sections.at("ptx"), "ptx"));
    for (const auto& [arch, b] : ptx) info.ptxArchs.push_back(arch);
  }
  if (o.sections.count("cubins")) {  // Absent before multi-architecture artifacts.
    KILN_ASSIGN_OR_RETURN(auto cubins, parseNamedBlobs(o.sections.at("cubins"), "cubins"));
    for (const auto& [arch, b] : cubins) {
      if (!parseSmArch(arch))
        return bad(path, "the cubins section names architecture '" + arch + "'");
      info.cubinArchs.push_back(arch);
    }
  }
  if (o.sections.count("device")) {
    ByteReader r(o.sections.at("device"), "device");
    info.kernelCode = r.str();
    info.deviceArch = r.str();
    const size_t n = r.count(16);
    std::vector<PlanStep*> kernels;
    for (PlanStep& s : plan->plan->steps)
      if (s.kind == PlanStep::Kind::kKernel) kernels.push_back(&s);
    if (r.ok() && n != kernels.size())
      r.fail("launch geometry for " + std::to_string(n) + " kernels, the plan has " +
             std::to_string(kernels.size()));
    for (size_t i = 0; r.ok() && i < n; ++i) {
      const int64_t block = r.i64(), grid = r.i64();
      if (block < 32 || block > 1024 || block % 32 != 0 || grid < 1 || grid > 0x7fffffff)
        r.fail("launch geometry of kernel " + std::to_string(i));
      kernels[i]->block = static_cast<int>(block);
      kernels[i]->grid = grid;
    }
    if (r.ok() && !isCudaKernelCode(info.kernelCode))
      r.fail("kernel code '" + info.kernelCode + "'");
    // The library calls' precision (absent before it existed: fp32).
    if (r.ok() && !r.atEnd()) info.precision = r.str();
    // bf16/fp16: the autocast's casts and low-precision products are in the plan itself.
    if (r.ok() && info.precision != "fp32" && info.precision != "tf32" &&
        info.precision != "bf16" && info.precision != "fp16")
      r.fail("precision '" + info.precision + "'");
    for (PlanStep& s : plan->plan->steps)
      s.libraryOptions.tf32 =
          info.precision == "tf32" && s.kind == PlanStep::Kind::kOp && s.library;
    // The indices its op kernels read unchecked (absent before op kernels): class indices, then
    // (absent before gathers' op kernels) every check tagged with its kind, in the plan's order.
    const auto& inputs = plan->plan->inputs;
    // Indices are i64 or i32; a divisor (`divisor`) any integer dtype.
    auto indexInput = [&](int64_t input, int64_t limit, const std::string& what,
                          bool divisor = false) {
      if (r.ok() && (input < 0 || static_cast<uint64_t>(input) >= inputs.size() || limit < 1))
        r.fail(what);
      if (r.ok()) {
        const ir::DType t = inputs[static_cast<size_t>(input)].dtype;
        if (divisor ? !ir::isInteger(t) : t != ir::DType::kI64 && t != ir::DType::kI32)
          r.fail(what);
      }
      return r.ok() ? static_cast<int>(input) : 0;
    };
    if (r.ok() && !r.atEnd()) {
      const size_t checks = r.count(32);
      for (size_t i = 0; r.ok() && i < checks; ++i) {
        IndexCheck k;
        const int64_t input = r.i64();
        k.limit = r.i64();
        k.ignore = r.i64();
        k.op = r.str();
        k.input = indexInput(input, k.limit, "class-index check " + std::to_string(i));
        plan->plan->indexChecks.push_back(std::move(k));
      }
    }
    // A tagged check (the writer's `tagged`): a host check's input, a device check's node.
    auto tagged = [&](bool onHost, const std::string& what) {
      IndexCheck k;
      const int64_t kind = r.i64();
      const int64_t input = onHost ? r.i64() : 0;
      k.limit = r.i64();
      k.ignore = r.i64();
      const int64_t axis = r.i64();
      k.op = r.str();
      k.data = r.str();
      if (!onHost) k.where = r.str();
      if (r.ok() && (kind < 0 || kind > 3 || axis < 0 || axis > 64 || k.limit < 1)) r.fail(what);
      k.kind = static_cast<IndexCheck::Kind>(r.ok() ? kind : 0);
      k.axis = r.ok() ? static_cast<int>(axis) : 0;
      if (onHost) k.input = indexInput(input, k.limit, what, k.kind == IndexCheck::Kind::kNonZero);
      if (r.ok() && k.kind == IndexCheck::Kind::kResolved) {
        const size_t n = r.count(16);
        for (size_t c = 0; r.ok() && c < n; ++c) {
          const int64_t limit = r.i64(), dim = r.i64();
          if (r.ok() && (limit < 1 || dim < 0 || dim > 64)) r.fail(what);
          k.limits.push_back(limit);
          k.dims.push_back(static_cast<int>(dim));
        }
        if (r.ok() && (n == 0 || n > 64)) r.fail(what);
      }
      return k;
    };
    if (r.ok() && !r.atEnd()) {
      const size_t checks = r.count(56);
      for (size_t i = 0; r.ok() && i < checks; ++i)
        plan->plan->indexChecks.push_back(tagged(true, "index check " + std::to_string(i)));
    }
    if (r.ok() && !r.atEnd()) {
      const int64_t offset = r.i64();
      const size_t checks = r.count(56);
      if (r.ok() && (offset < 0 || offset % 8 != 0 || offset > plan->plan->arenaBytes ||
                     static_cast<uint64_t>(plan->plan->arenaBytes - offset) / 8 < checks))
        r.fail("device index words at " + std::to_string(offset));
      plan->plan->indexWordsOffset = r.ok() ? offset : 0;
      for (size_t i = 0; r.ok() && i < checks; ++i)
        plan->plan->deviceIndexChecks.push_back(
            tagged(false, "device index check " + std::to_string(i)));
    }
    if (r.ok() && !r.atEnd()) r.fail("bytes after the index checks");
    KILN_TRY(r.status().withContext("artifact '" + path + "'"));
  }
  const auto weights = o.sections.at("weights");
  for (size_t i = 0; i < plan->weightOffsets.size(); ++i) {
    const uint64_t off = plan->weightOffsets[i];
    const uint64_t size = plan->plan->parameters[i].byteSize();
    if (off > weights.size() || size > weights.size() - off || off % 64 != 0)
      return bad(path, "parameter " + std::to_string(i) + " lies outside the weights section");
  }
  if (planOut) *planOut = std::move(*plan);
  return info;
}

}  // namespace

std::optional<CudaCodeChoice> chooseCudaCode(int smArch, const std::string& deviceArch,
                                             std::span<const std::string> cubinArchs,
                                             std::span<const std::string> ptxArchs) {
  using Kind = CudaCodeChoice::Kind;
  if (parseSmArch(deviceArch) == smArch) return CudaCodeChoice{Kind::kObjects, deviceArch};
  // A cubin runs on GPUs of its major architecture with an equal or higher minor one.
  std::optional<CudaCodeChoice> best;
  int bestArch = -1;
  for (const std::string& a : cubinArchs)
    if (auto v = parseSmArch(a); v && *v / 10 == smArch / 10 && *v <= smArch && *v > bestArch)
      best = CudaCodeChoice{Kind::kCubin, a}, bestArch = *v;
  if (best) return best;
  // PTX of any architecture up to the GPU's is compiled for it.
  for (const std::string& a : ptxArchs)
    if (auto v = parseSmArch(a); v && *v <= smArch && *v > bestArch)
      best = CudaCodeChoice{Kind::kPtx, a}, bestArch = *v;
  return best;
}

Status writeArtifact(const std::string& path, const ArtifactContents& c) {
  if (!c.plan) return invalidArgument("writeArtifact: no plan");
  std::vector<Section> sections;
  sections.push_back({"meta", metaSection(c)});
  sections.push_back(
      {"graph", std::vector<std::byte>(reinterpret_cast<const std::byte*>(c.optimizedGraph.data()),
                                       reinterpret_cast<const std::byte*>(c.optimizedGraph.data()) +
                                           c.optimizedGraph.size())});
  std::vector<uint64_t> weightOffsets;
  sections.push_back({"plan", planSection(c, weightOffsets)});
  ByteWriter objects, sources, ptx;
  objects.u64(c.modules.size());
  sources.u64(c.modules.size());
  for (const ArtifactModule& m : c.modules) {
    objects.str(m.name);
    objects.bytes(m.object);
    sources.str(m.name);
    sources.str(m.source);
  }
  ptx.u64(c.ptx.size());
  for (const auto& [arch, text] : c.ptx) {
    ptx.str(arch);
    ptx.str(text);
  }
  ByteWriter cubins;
  cubins.u64(c.cubins.size());
  for (const auto& [arch, bytes] : c.cubins) {
    cubins.str(arch);
    cubins.bytes(bytes);
  }
  sections.push_back({"objects", std::move(objects.out())});
  sections.push_back({"sources", std::move(sources.out())});
  sections.push_back({"ptx", std::move(ptx.out())});
  if (!c.cubins.empty()) sections.push_back({"cubins", std::move(cubins.out())});
  if (!c.kernelCode.empty() && c.kernelCode != "host-object") {
    // CUDA kernels: their format, architecture and every kernel step's launch geometry.
    ByteWriter device;
    device.str(c.kernelCode);
    device.str(c.deviceArch);
    std::vector<const PlanStep*> kernels;
    for (const PlanStep& s : c.plan->steps)
      if (s.kind == PlanStep::Kind::kKernel) kernels.push_back(&s);
    device.u64(kernels.size());
    for (const PlanStep* s : kernels) {
      device.i64(s->block);
      device.i64(s->grid);
    }
    bool tf32 = false;
    for (const PlanStep& s : c.plan->steps) tf32 = tf32 || s.libraryOptions.tf32;
    device.str(tf32 ? "tf32" : "fp32");
    // The inputs its op kernels read unchecked, in the order the plan checks them (the first
    // bad one is the error): class indices alone as they were written before positions existed;
    // with positions, an empty list of those, then every check tagged with its kind. A reader
    // that does not know them refuses the artifact (bytes after what it knows) rather than run
    // without the checks.
    const auto& checks = c.plan->indexChecks;
    const auto& onDevice = c.plan->deviceIndexChecks;
    // Then (absent before them) the device index checks: both lists above written, then the
    // words' offset and each check.
    // The tagged list is written where any check is more than class indices, or any is on the
    // device (whose list comes after it).
    const bool taggedList =
        !onDevice.empty() || std::any_of(checks.begin(), checks.end(), [](const IndexCheck& k) {
          return k.kind != IndexCheck::Kind::kClass;
        });
    if (!checks.empty() || taggedList) device.u64(taggedList ? 0 : checks.size());
    for (const IndexCheck& k : taggedList ? std::span<const IndexCheck>() : checks) {
      device.i64(k.input);
      device.i64(k.limit);
      device.i64(k.ignore);
      device.str(k.op);
    }
    // A tagged check: a host check names its input, a device check its node.
    // Kind 2 (a scatter's resolved indices; absent before them) adds its (limit, dim) pairs.
    auto tagged = [&](const IndexCheck& k, bool onHost) {
      device.i64(static_cast<int64_t>(k.kind));
      if (onHost) device.i64(k.input);
      device.i64(k.limit);
      device.i64(k.ignore);
      device.i64(k.axis);
      device.str(k.op);
      device.str(k.data);
      if (!onHost) device.str(k.where);
      if (k.kind != IndexCheck::Kind::kResolved) return;
      device.u64(k.limits.size());
      for (size_t i = 0; i < k.limits.size(); ++i) {
        device.i64(k.limits[i]);
        device.i64(k.dims[i]);
      }
    };
    if (taggedList) {
      device.u64(checks.size());
      for (const IndexCheck& k : checks) tagged(k, true);
    }
    if (!onDevice.empty()) {
      device.i64(c.plan->indexWordsOffset);
      device.u64(onDevice.size());
      for (const IndexCheck& k : onDevice) tagged(k, false);
    }
    sections.push_back({"device", std::move(device.out())});
  }
  ByteWriter weights;
  for (size_t i = 0; i < c.plan->parameters.size(); ++i) {
    weights.out().resize(weightOffsets[i]);
    weights.raw(c.plan->parameters[i].data(), c.plan->parameters[i].byteSize());
  }
  sections.push_back({"weights", std::move(weights.out()), kWeightsAlign});
  return writeFileAtomically(path, sections);
}

Status resealArtifact(std::span<std::byte> image) {
  if (image.size() < kHeaderBytes || std::memcmp(image.data(), kArtifactMagic, 8) != 0)
    return invalidArgument("not an artifact image");
  uint32_t numSections = 0;
  uint64_t tableAt = 0;
  std::memcpy(&numSections, image.data() + 12, 4);
  std::memcpy(&tableAt, image.data() + 24, 8);
  if (numSections > kMaxSections || tableAt > image.size() ||
      image.size() - tableAt < uint64_t{numSections} * kSectionEntryBytes)
    return invalidArgument("the artifact image's section table lies outside it");
  for (uint32_t i = 0; i < numSections; ++i) {
    std::byte* entry = image.data() + tableAt + i * kSectionEntryBytes;
    uint64_t offset = 0, size = 0;
    std::memcpy(&offset, entry + kSectionNameBytes, 8);
    std::memcpy(&size, entry + kSectionNameBytes + 8, 8);
    if (offset > image.size() || size > image.size() - offset) continue;  // Left broken.
    const uint64_t sum = checksum(image.subspan(offset, size));
    std::memcpy(entry + kSectionNameBytes + 16, &sum, 8);
  }
  const uint64_t fileBytes = image.size();
  std::memcpy(image.data() + 16, &fileBytes, 8);
  const uint64_t tableSum = checksum(image.subspan(tableAt, numSections * kSectionEntryBytes));
  std::memcpy(image.data() + 32, &tableSum, 8);
  const uint64_t headerSum = checksum(image.first(kHeaderChecksumAt));
  std::memcpy(image.data() + kHeaderChecksumAt, &headerSum, 8);
  return Status::ok();
}

Expected<ArtifactInfo> inspectArtifact(const std::string& path) {
  KILN_ASSIGN_OR_RETURN(Opened o, openArtifact(path));
  return readInfo(o, nullptr);
}

LoadedModel::LoadedModel(std::shared_ptr<const Plan> plan, ArtifactInfo info, int threads,
                         double loadMs, bool recompiled)
    : plan_(plan),
      info_(std::move(info)),
      exec_(plan, threads),
      loadMs_(loadMs),
      recompiled_(recompiled) {}

Status LoadedModel::prepare() {
  const auto start = std::chrono::steady_clock::now();
  KILN_TRY(exec_.prepare());
  prepareMs_ = msSince(start);
  return Status::ok();
}

Status LoadedModel::warmUp() {
  const auto start = std::chrono::steady_clock::now();
  std::vector<Tensor> zeros;
  for (const ir::TensorType& t : info_.inputs) {
    KILN_ASSIGN_OR_RETURN(Tensor z, Tensor::zeros(t.dtype, t.shape));
    zeros.push_back(std::move(z));
  }
  auto outputs = exec_.run(zeros);
  // Zeros are not every model's valid input (an integer division by an input, which the run
  // rejects as an invalid argument): the model still loads, and its first real run warms it up.
  // Any other error (memory, a missing library) fails the load as before.
  if (!outputs && outputs.status().code() == ErrorCode::kInvalidArgument) return Status::ok();
  if (!outputs) return outputs.status().withContext("the warm-up run on zero inputs");
  warmupMs_ = msSince(start);
  return Status::ok();
}

Expected<std::vector<Tensor>> LoadedModel::run(std::span<const Tensor> inputs,
                                               PlanRunStats* stats) {
  return exec_.run(inputs, stats);
}

Expected<std::unique_ptr<LoadedModel>> loadArtifact(const std::string& path,
                                                    const LoadOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(Opened o, openArtifact(path));
  ParsedPlan parsed;
  KILN_ASSIGN_OR_RETURN(ArtifactInfo info, readInfo(o, &parsed));
  Plan& plan = *parsed.plan;

  // The weights: views of the mapping, which they keep alive.
  std::byte* weights = o.map->data + (o.sections.at("weights").data() - o.map->data);
  for (size_t i = 0; i < plan.parameters.size(); ++i) {
    const ir::TensorData& p = plan.parameters[i];
    plan.parameters[i] =
        ir::TensorData::wrap(p.dtype(), p.shape(), weights + parsed.weightOffsets[i], o.map);
  }

  // The code: this CPU must run it, or it is compiled again from the sources.
  KILN_ASSIGN_OR_RETURN(auto objects, parseNamedBlobs(o.sections.at("objects"), "objects"));
  KILN_ASSIGN_OR_RETURN(auto sources, parseNamedBlobs(o.sections.at("sources"), "sources"));
  if (sources.size() != objects.size())
    return bad(path, "the objects and sources sections list different modules");
  bool recompiled = false;
  std::vector<std::vector<std::byte>> rebuilt;
  std::shared_ptr<Backend> backend = options.backend ? options.backend : defaultBackend();
  const std::string format = info.kernelCode.empty() ? "host-object" : info.kernelCode;
  if (!objects.empty() && backend->caps().kernelCode != format)
    return invalidArgument(
        "artifact '" + path + "' holds " +
        (format == "host-object" ? std::string("CPU kernels") : "CUDA kernels (" + format + ")") +
        "; backend '" + std::string(backend->name()) + "' cannot run them" +
        (format == "cuda-emu-object" ? " (run it with --device emu)"
         : format == "cubin"         ? " (run it with --device cuda)"
                                     : " (run it with --device cpu)"));
  // Cubins for another GPU: the artifact's cubins for its architecture, else the PTX it carries,
  // linked for this GPU by nvJitLink (or JIT-compiled by the driver where nvJitLink is missing).
  std::vector<KernelObject> otherGpu;
  std::vector<std::byte> ptxText;
  if (format == "cubin" && !objects.empty()) {
    const int sm = backend->caps().cuda.smArch;
    auto choice = chooseCudaCode(sm, info.deviceArch, info.cubinArchs, info.ptxArchs);
    if (!choice)
      return invalidArgument("artifact '" + path + "' holds cubins for " + info.deviceArch +
                             (info.cubinArchs.empty() ? "" : " and other GPUs") +
                             " and no code this GPU (sm_" + std::to_string(sm) +
                             ") can run; compile it again with --device cuda on it");
    using Kind = CudaCodeChoice::Kind;
    if (choice->kind != Kind::kObjects) {
      const char* section = choice->kind == Kind::kCubin ? "cubins" : "ptx";
      KILN_ASSIGN_OR_RETURN(auto blobs, parseNamedBlobs(o.sections.at(section), section));
      for (const auto& [arch, bytes] : blobs) {
        if (arch != choice->arch) continue;
        if (choice->kind == Kind::kCubin) {
          otherGpu.push_back({arch, bytes});
        } else {
          ptxText.assign(bytes.begin(), bytes.end());
          ptxText.push_back(std::byte{0});  // The driver takes PTX as a C string.
          otherGpu.push_back({"ptx", ptxText});
        }
        break;
      }
      if (options.log)
        *options.log << "kiln: " << path << ": cubins for " << info.deviceArch
                     << ", this GPU is sm_" << sm << "; loading the " << choice->arch << " "
                     << (choice->kind == Kind::kCubin ? "cubin" : "PTX") << " instead\n";
    }
  }
  if (!objects.empty() && format != "cubin") {  // Host code (CPU kernels or emu's): this CPU's.
    Status host = checkHostCompatible(info.triple, info.features);
    if (!host) {
      if (!options.recompile)
        return bad(path, host.message() + " (kiln run recompiles from the sources embedded in " +
                             "the artifact unless --no-recompile is given)");
      if (options.log)
        *options.log << "kiln: " << path << ": " << host.message()
                     << "; recompiling its kernels from the embedded sources\n";
      for (size_t i = 0; i < sources.size(); ++i) {
        ArtifactModule m;
        m.name = sources[i].first;
        m.source.assign(reinterpret_cast<const char*>(sources[i].second.data()),
                        sources[i].second.size());
        KILN_ASSIGN_OR_RETURN(auto bytes, options.recompile(m));
        rebuilt.push_back(std::move(bytes));
      }
      recompiled = true;
    }
  }
  std::vector<KernelObject> loadable = otherGpu;
  if (otherGpu.empty())
    for (size_t i = 0; i < objects.size(); ++i)
      loadable.push_back({objects[i].first,
                          recompiled ? std::span<const std::byte>(rebuilt[i]) : objects[i].second});
  auto code = backend->loadKernels(loadable);
  if (!code) return code.status().withContext("artifact '" + path + "'");
  for (PlanStep& s : plan.steps) {
    if (s.kind != PlanStep::Kind::kKernel) continue;
    auto entry = (*code)->entry(s.name);
    if (!entry)
      return entry.status().withContext("artifact '" + path + "': kernel '" + s.name + "'");
    s.kernel = *entry;
  }
  plan.backend = std::move(backend);
  plan.code = std::move(*code);
  const double ms = msSince(start);
  auto model = std::make_unique<LoadedModel>(std::move(parsed.plan), std::move(info),
                                             options.threads, ms, recompiled);
  KILN_TRY(model->limitMemory(options.maxMemoryBytes).withContext("artifact '" + path + "'"));
  KILN_TRY(model->prepare().withContext("artifact '" + path + "'"));
  if (options.warmup) KILN_TRY(model->warmUp().withContext("artifact '" + path + "'"));
  return model;
}

}  // namespace kiln::runtime
