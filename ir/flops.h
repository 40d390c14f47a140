// Work counts per node: multiply-accumulates of library ops and elementwise operations, as
// reported by `kiln info` and used for achieved-GFLOP/s figures.
#pragma once

#include "ir/graph.h"

namespace kiln::ir {

struct WorkCount {
  int64_t macs = 0;        // Multiply-accumulates in conv, matmul, gemm, linear.
  int64_t otherFlops = 0;  // Elementwise, normalization, pooling and reduction operations.
  int64_t flops() const { return 2 * macs + otherFlops; }
  WorkCount& operator+=(const WorkCount& o) {
    macs += o.macs;
    otherFlops += o.otherFlops;
    return *this;
  }
};

WorkCount countWork(const Node& n);
WorkCount countWork(const Graph& g);

}  // namespace kiln::ir
