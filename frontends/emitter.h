// What the lowerings shared by the frontends (window3d.h, sampling.h) emit into a graph.
#pragma once

#include <functional>
#include <vector>

#include "ir/attributes.h"
#include "ir/graph.h"
#include "ir/status.h"
#include "ir/tensor_data.h"

namespace kiln::frontends {

// How a frontend adds what a lowering emits: a node (returning its one output), named and
// placed as that frontend names its nodes, and a constant (a non-trainable parameter).
struct Emitter {
  std::function<Expected<ir::Value*>(ir::OpKind, std::vector<ir::Value*>, ir::AttrMap)> node;
  std::function<Expected<ir::Value*>(ir::TensorData)> constant;
};

}  // namespace kiln::frontends
