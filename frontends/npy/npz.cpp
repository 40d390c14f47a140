// NumPy .npz archives through libzip: each .npy member read into memory, then parsed by readNpy.
#include <zip.h>

#include <filesystem>
#include <memory>
#include <streambuf>
#include <vector>

#include "frontends/npy/npy.h"

namespace kiln::frontends {

namespace {

// An istream over bytes in memory (no copy).
struct MemoryBuffer : std::streambuf {
  MemoryBuffer(char* begin, char* end) { setg(begin, begin, end); }
};

// A member's stated size beyond this is refused before anything is allocated (a corrupt or
// hostile archive); no dataset kiln trains on comes near it.
constexpr zip_uint64_t kMaxMember = zip_uint64_t{64} << 30;
constexpr zip_uint64_t kMaxDeflateRatio = 1032;

}  // namespace

Expected<std::map<std::string, ir::TensorData>> readNpz(const std::string& path) {
  const std::string where = "npz file '" + path + "'";
  int error = 0;
  std::unique_ptr<zip_t, decltype(&zip_discard)> archive(zip_open(path.c_str(), ZIP_RDONLY, &error),
                                                         &zip_discard);
  if (!archive) {
    zip_error_t e;
    zip_error_init_with_code(&e, error);
    const std::string why = zip_error_strerror(&e);
    zip_error_fini(&e);
    if (error == ZIP_ER_NOENT || error == ZIP_ER_OPEN) return notFound(where + ": " + why);
    return invalidArgument(where + ": not a readable .npz (zip) archive: " + why);
  }
  std::error_code ec;
  const auto archiveBytes = static_cast<zip_uint64_t>(std::filesystem::file_size(path, ec));
  if (ec) return ioError(where + ": " + ec.message());
  std::map<std::string, ir::TensorData> arrays;
  const zip_int64_t entries = zip_get_num_entries(archive.get(), 0);
  for (zip_int64_t i = 0; i < entries; ++i) {
    zip_stat_t st;
    zip_stat_init(&st);
    if (zip_stat_index(archive.get(), static_cast<zip_uint64_t>(i), 0, &st) != 0 || !st.name)
      return invalidArgument(where + ": member " + std::to_string(i) +
                             " cannot be read: " + zip_strerror(archive.get()));
    const std::string name = st.name;
    if (name.size() <= 4 || name.compare(name.size() - 4, 4, ".npy") != 0) continue;
    const std::string member = where + ", member '" + name + "'";
    if (!(st.valid & ZIP_STAT_SIZE) || !(st.valid & ZIP_STAT_COMP_SIZE) || st.size > kMaxMember)
      return invalidArgument(member + ": no size, or a size beyond 64 GiB (corrupt archive?)");
    // Deflate expands at most 1032:1, stored members not at all, and no member is larger than
    // the archive: a larger stated size is a lie, refused before its memory is allocated.
    if (st.comp_size > archiveBytes || st.size > st.comp_size * kMaxDeflateRatio + 64)
      return invalidArgument(member + ": its header says " + std::to_string(st.size) +
                             " bytes from " + std::to_string(st.comp_size) +
                             " compressed, in an archive of " + std::to_string(archiveBytes) +
                             " bytes: more than deflate can expand to (corrupt archive)");
    std::unique_ptr<zip_file_t, decltype(&zip_fclose)> file(
        zip_fopen_index(archive.get(), static_cast<zip_uint64_t>(i), 0), &zip_fclose);
    if (!file)
      return invalidArgument(member + ": cannot be opened: " + zip_strerror(archive.get()) +
                             " (kiln reads stored and deflated members, as NumPy writes them)");
    std::vector<char> bytes(static_cast<size_t>(st.size));
    zip_uint64_t got = 0;
    while (got < st.size) {
      const zip_int64_t n = zip_fread(file.get(), bytes.data() + got, st.size - got);
      if (n <= 0) break;
      got += static_cast<zip_uint64_t>(n);
    }
    if (got != st.size)
      return invalidArgument(member + ": " + std::to_string(got) + " of " +
                             std::to_string(st.size) + " bytes could be read: " +
                             zip_file_strerror(file.get()) + " (truncated or corrupt archive)");
    MemoryBuffer buffer(bytes.data(), bytes.data() + bytes.size());
    std::istream in(&buffer);
    KILN_ASSIGN_OR_RETURN(ir::TensorData t, readNpy(in, st.size, member));
    arrays.emplace(name.substr(0, name.size() - 4), std::move(t));
  }
  return arrays;
}

}  // namespace kiln::frontends
