// Helpers shared by the op mapper families: fold-or-emit, aliases, and checks on outputs that
// kiln does not compute.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "frontends/emitter.h"
#include "frontends/onnx/onnx_importer.h"

namespace kiln::frontends::onnx_import {

// Defines output `out` as kiln `op` over the ONNX inputs `inputs` (in that order): evaluated at
// import when they are all known and the evaluator handles the op and size, else emitted.
Status foldOrEmit(NodeContext& ctx, ir::OpKind op, const std::vector<size_t>& inputs,
                  ir::AttrMap attrs = {}, size_t out = 0);
// Output 0 as input 0 cast to `to` (Cast, CastLike): their saturate attribute (opset 19 on,
// default 1) says what an out-of-range value cast to an 8-bit float becomes, round_mode (24 on,
// default up) how a cast to FLOAT8E8M0 rounds.
Status emitCast(NodeContext& ctx, ir::DType to);
// Defines output k as input i (Identity, Dropout at inference, ...).
Status alias(NodeContext& ctx, size_t i, size_t k = 0);
// Output k must be absent or unread: kiln computes only the first output of ops like
// BatchNormalization (training statistics) or MaxPool (indices).
Status requireUnused(NodeContext& ctx, size_t k, const std::string& what);
// A scalar constant of `dtype` holding v (a parameter the mapping creates).
Expected<ir::Value*> scalarConstant(NodeContext& ctx, ir::DType dtype, double v);
// Input 0's type, which must be f32 or f64: the dtypes the compositions' float constants and
// kiln's float ops take (else kUnimplemented naming the op and type).
Expected<ir::TensorType> floatInput(NodeContext& ctx);
// The rank of input i.
Expected<int> inputRank(NodeContext& ctx, size_t i);
// What a shared lowering (frontends/window3d.h, sampling.h) emits becomes this node's
// intermediates and constants.
Emitter emitterOf(NodeContext& ctx);

// A normalization's stash_type (the precision of its statistics; default FLOAT) must be the
// input's dtype `x`: kiln computes the statistics in the input's dtype.
Status requireStashType(NodeContext& ctx, ir::DType x);

// The axes of a Reduce* node: an attribute before version `inputFrom` of the op, input 1 (known
// at import) from it on. Empty: every axis. nullopt: no axes with noop_with_empty_axes=1, the
// node is the identity.
Expected<std::optional<std::vector<int64_t>>> reduceAxes(NodeContext& ctx, int inputFrom);

}  // namespace kiln::frontends::onnx_import
