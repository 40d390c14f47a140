// Replaying fuzz targets' committed inputs in the normal build (Catch2): every seed under
// tests/fuzz/corpus/<target>/ must be accepted and pass the target's check, and every input
// under tests/fuzz/regressions/<target>/ (each once crashed, hung or broke a check) must now give
// a value or a clean error. Used by test_fuzz_regressions.cpp (the readers) and
// test_fuzz_code.cpp (compiled code read back).
#pragma once

#include <catch2/catch.hpp>
#include <filesystem>
#include <span>

#include "fuzz/fuzz_checks.h"

namespace kiln::fuzz {

inline std::filesystem::path fuzzDir() {
  return std::filesystem::path(KILN_TEST_DATA_DIR).parent_path() / "fuzz";
}

inline void replaySeeds(std::span<const Target> targets) {
  for (const Target& target : targets) {
    const auto dir = fuzzDir() / "corpus" / target.name;
    INFO(dir.string());
    const auto seeds = inputsIn(dir);
    CHECK_FALSE(seeds.empty());
    for (const auto& seed : seeds) {
      INFO(seed.string());
      const Outcome outcome = target.check(readInput(seed));
      CHECK(outcome.violation.value_or("") == "");
      CHECK(outcome.accepted);
    }
  }
}

inline void replayRegressions(std::span<const Target> targets) {
  for (const Target& target : targets)
    for (const auto& input : inputsIn(fuzzDir() / "regressions" / target.name)) {
      INFO(input.string());
      CHECK(target.check(readInput(input)).violation.value_or("") == "");
    }
}

}  // namespace kiln::fuzz
