// The libFuzzer entry point of every fuzz target. CMake compiles it once per seed directory
// tests/fuzz/corpus/<name>/, with KILN_FUZZ_TARGET="<name>" selecting the check in kTargets.
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#ifdef KILN_FUZZ_CODE
#include "fuzz/fuzz_checks_code.h"
#else
#include "fuzz/fuzz_checks.h"
#endif

namespace {

#ifdef KILN_FUZZ_CODE
constexpr int kTarget = kiln::fuzz::findCodeTarget(KILN_FUZZ_TARGET);
constexpr const kiln::fuzz::Target* kTable = kiln::fuzz::kCodeTargets;
static_assert(kTarget >= 0, "tests/fuzz/corpus/" KILN_FUZZ_TARGET
                            " has no entry in kCodeTargets (fuzz_checks_code.h)");
#else
constexpr int kTarget = kiln::fuzz::findTarget(KILN_FUZZ_TARGET);
constexpr const kiln::fuzz::Target* kTable = kiln::fuzz::kTargets;
static_assert(kTarget >= 0,
              "tests/fuzz/corpus/" KILN_FUZZ_TARGET " has no entry in kTargets (fuzz_checks.h)");
#endif

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const kiln::fuzz::Outcome outcome =
      kTable[kTarget].check(std::string_view(reinterpret_cast<const char*>(data), size));
  if (outcome.violation) {
    // A broken property is a bug like a crash: abort, so that libFuzzer saves the input.
    std::fprintf(stderr, "fuzz_%s: %s\n", KILN_FUZZ_TARGET, outcome.violation->c_str());
    std::abort();
  }
  return 0;
}
