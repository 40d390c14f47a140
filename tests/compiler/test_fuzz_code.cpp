// Replays the corpora and regressions of the fuzz targets for compiled code (artifacts, kernel
// cache entries: tests/fuzz/fuzz_checks_code.h) through the normal build, as
// tests/frontends/test_fuzz_regressions.cpp does for the readers: every seed must be accepted,
// and every input under tests/fuzz/regressions/<target>/ must give a value or a clean error.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "fuzz/fuzz_checks_code.h"

namespace fs = std::filesystem;

namespace {

const fs::path kFuzzDir = fs::path(KILN_TEST_DATA_DIR).parent_path() / "fuzz";

std::vector<fs::path> inputsIn(const fs::path& dir) {
  std::vector<fs::path> files;
  if (!fs::is_directory(dir)) return files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename().string()[0] != '.') files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::string contents(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

TEST_CASE("fuzz seeds (compiled code): every seed is accepted", "[fuzz]") {
  for (const kiln::fuzz::Target& target : kiln::fuzz::kCodeTargets) {
    const auto seeds = inputsIn(kFuzzDir / "corpus" / target.name);
    CHECK_FALSE(seeds.empty());
    for (const fs::path& seed : seeds) {
      INFO(seed.string());
      const kiln::fuzz::Outcome outcome = target.check(contents(seed));
      CHECK(outcome.violation.value_or("") == "");
      CHECK(outcome.accepted);
    }
  }
}

TEST_CASE("fuzz regressions (compiled code): a value or a clean error", "[fuzz]") {
  for (const kiln::fuzz::Target& target : kiln::fuzz::kCodeTargets)
    for (const fs::path& input : inputsIn(kFuzzDir / "regressions" / target.name)) {
      INFO(input.string());
      CHECK(target.check(contents(input)).violation.value_or("") == "");
    }
}
