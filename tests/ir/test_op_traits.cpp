// The op table's traits are consistent with each other: the traits passes read instead of lists
// of op names (views, reductions, epilogues) imply the broader traits they refine.
#include <catch2/catch.hpp>

#include "ir/op_table.h"

using namespace kiln::ir;

TEST_CASE("op traits: refinements imply what they refine") {
  int views = 0, epilogues = 0, heads = 0, channelsLast = 0, channelwise = 0, rowBroadcast = 0;
  for (int i = 0; i < kNumOps; ++i) {
    const OpInfo& op = opInfo(static_cast<OpKind>(i));
    INFO(op.name);
    if (op.has(kReshapeLike) || op.has(kStridedView)) {
      ++views;
      CHECK(op.has(kMovement));
      CHECK_FALSE((op.has(kReshapeLike) && op.has(kStridedView)));
      CHECK(op.numOutputs == 1);
    }
    if (op.has(kEpilogue)) {
      ++epilogues;
      CHECK(op.has(kPointwise));
      CHECK(op.numOutputs == 1);
    }
    if (op.has(kEpilogueHead)) {
      ++heads;
      CHECK(op.has(kLibrary));
    }
    if (op.has(kChannelsLast)) {
      ++channelsLast;
      CHECK(op.has(kLibrary));
      CHECK(op.numOutputs == 1);
    }
    if (op.has(kFilterInput1) || op.has(kFilterGradient)) {
      CHECK(op.has(kChannelsLast));
      CHECK_FALSE((op.has(kFilterInput1) && op.has(kFilterGradient)));
    }
    if (op.has(kChannelwise)) {
      ++channelwise;
      CHECK_FALSE(op.has(kPointwise));  // Its operands do not broadcast NumPy-style.
      CHECK(op.numOutputs == 1);
    }
    if (op.has(kRowBroadcast)) {
      ++rowBroadcast;
      CHECK(op.has(kReduction));
    }
    CHECK_FALSE((op.has(kPointwise) && op.has(kReduction)));
  }
  CHECK(views == 7);      // reshape, flatten, squeeze, unsqueeze; transpose, expand, slice.
  CHECK(epilogues == 7);  // relu, leaky_relu, clip, sigmoid, tanh, gelu, add.
  CHECK(heads == 4);      // conv2d, linear, gemm, matmul.
  // conv2d, conv_transpose2d, max_pool2d, avg_pool2d, concat; conv2d_backward_data,
  // conv2d_backward_weight, conv2d_backward_bias, max_pool2d_backward, batch_norm_stats,
  // batch_norm_backward_reduce, batch_norm_backward.
  CHECK(channelsLast == 12);
  CHECK(channelwise == 2);   // batch_norm, batch_norm_train.
  CHECK(rowBroadcast == 3);  // softmax, log_softmax, layer_norm.
}

TEST_CASE("op traits: a row-broadcast reduction keeps its input's shape, others reduce it") {
  const TensorType x{DType::kF32, {4, 8}};
  for (int i = 0; i < kNumOps; ++i) {
    const OpInfo& op = opInfo(static_cast<OpKind>(i));
    if (!op.has(kReduction) || op.minInputs != 1 || op.name == "global_avg_pool") continue;
    INFO(op.name);
    const TensorType in[] = {x};
    auto out = inferTypes(op.kind, in, {});
    REQUIRE(out.hasValue());
    CHECK((out.value()[0].shape == x.shape) == op.has(kRowBroadcast));
  }
}
