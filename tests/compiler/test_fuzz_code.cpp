// Replays the corpora and regressions of the fuzz targets for compiled code (artifacts, kernel
// cache entries: tests/fuzz/fuzz_checks_code.h) through the normal build, as
// tests/frontends/test_fuzz_regressions.cpp does for the readers.
#include "fuzz/fuzz_checks_code.h"
#include "fuzz/replay.h"

TEST_CASE("fuzz seeds (compiled code): every seed is accepted", "[fuzz]") {
  kiln::fuzz::replaySeeds(kiln::fuzz::kCodeTargets);
}

TEST_CASE("fuzz regressions (compiled code): a value or a clean error", "[fuzz]") {
  kiln::fuzz::replayRegressions(kiln::fuzz::kCodeTargets);
}
