// Lowering of one fusion group to kernel IR: the group's views become affine loads, its
// pointwise ops a scalar expression DAG, its reduction anchor one or more reduction stages;
// values needed outside the group become stores. Dims are coalesced at the end.
#pragma once

#include <string>
#include <unordered_set>

#include "codegen/kernel_ir.h"
#include "ir/fusion_group.h"

namespace kiln::codegen {

// `external` holds the values the kernel must store besides those read by nodes outside the
// group (the graph's outputs). Fails (kUnimplemented) for groups a kernel cannot express,
// e.g. a reduction whose reduced dims do not coalesce; the compiler then runs the group's
// nodes one by one.
Expected<Kernel> lowerGroup(const ir::FusionGroup& group,
                            const std::unordered_set<const ir::Value*>& graphOutputs,
                            std::string name);

}  // namespace kiln::codegen
