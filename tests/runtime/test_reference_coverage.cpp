// Every op in ops.def has a reference kernel: the reference is the ground truth of every
// differential test, so a missing entry would silently shrink coverage.
#include <catch2/catch.hpp>

#include "runtime/reference/kernels.h"

using namespace kiln;

TEST_CASE("every op has a reference kernel", "[reference][coverage]") {
  for (int i = 0; i < ir::kNumOps; ++i) {
    const auto op = static_cast<ir::OpKind>(i);
    INFO("op " << ir::opName(op));
    CHECK(runtime::referenceKernel(op) != nullptr);
  }
}
