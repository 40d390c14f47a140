// Replays the fuzz targets' inputs (tests/fuzz) through the normal build, with the same checks
// as the fuzzers: every seed must be accepted and survive its round trip, and every input under
// tests/fuzz/regressions/<target>/ (each once crashed, hung or broke a check) must now give a
// value or a clean error.
#include "fuzz/replay.h"

TEST_CASE("fuzz seeds: every seed is accepted and round trips", "[fuzz]") {
  kiln::fuzz::replaySeeds(kiln::fuzz::kTargets);
}

TEST_CASE("fuzz regressions: inputs that once failed give a value or a clean error", "[fuzz]") {
  kiln::fuzz::replayRegressions(kiln::fuzz::kTargets);
}
