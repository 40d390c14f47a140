// Replays the fuzz targets' inputs (tests/fuzz) through the normal build, with the same checks
// as the fuzzers: every seed must be accepted and survive its round trip, and every input under
// tests/fuzz/regressions/<target>/ (each once crashed, hung or broke a check) must now give a
// value or a clean error.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/fuzz_checks.h"

namespace fs = std::filesystem;

namespace {

const fs::path kFuzzDir = fs::path(KILN_TEST_DATA_DIR).parent_path() / "fuzz";

// The files of `dir`, sorted; none when it does not exist. Dot files (.gitkeep) are skipped.
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

TEST_CASE("fuzz seeds: every seed is accepted and round trips", "[fuzz]") {
  for (const kiln::fuzz::Target& target : kiln::fuzz::kTargets) {
    const fs::path dir = kFuzzDir / "corpus" / target.name;
    const auto seeds = inputsIn(dir);
    INFO(dir.string());
    CHECK_FALSE(seeds.empty());
    for (const fs::path& seed : seeds) {
      INFO(seed.string());
      const kiln::fuzz::Outcome outcome = target.check(contents(seed));
      CHECK(outcome.violation.value_or("") == "");
      CHECK(outcome.accepted);
    }
  }
}

TEST_CASE("fuzz regressions: inputs that once failed give a value or a clean error", "[fuzz]") {
  for (const kiln::fuzz::Target& target : kiln::fuzz::kTargets) {
    for (const fs::path& input : inputsIn(kFuzzDir / "regressions" / target.name)) {
      INFO(input.string());
      const kiln::fuzz::Outcome outcome = target.check(contents(input));
      CHECK(outcome.violation.value_or("") == "");
    }
  }
}
