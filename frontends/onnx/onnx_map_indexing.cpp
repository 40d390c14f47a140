// ONNX's index ops composed from kiln's gathers and scatters: GatherND (one gather on the
// indexed dims flattened), ReverseSequence (gather_elements along the time axis), MaxUnpool
// (scatter_elements into the flattened output) and Col2Im (a gather of each image element's
// column entries by an import-time table, summed). Indices read at run time are checked where
// kiln's gathers check theirs: each GatherND component goes through a gather of its dim's
// positions, which wraps a negative index and makes one out of range an error naming it, so an
// invalid component never lands on another element.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_map_util.h"
#include "frontends/onnx/onnx_tensor.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::OpKind;
using ir::Shape;
using ir::Value;

Expected<Value*> i64Constant(NodeContext& ctx, Shape shape, const std::vector<int64_t>& v) {
  return ctx.constantValue(intTensor(v, std::move(shape)));
}

// GatherND (11, 12, 13): data [b..., d_b .. d_{b+k-1}, rest...], indices [b..., m..., k] ->
// [b..., m..., rest...]. The batch dims and the k indexed dims are flattened into one; each
// index component j, checked and wrapped by a gather of 0 .. d_j - 1, times its stride, plus the
// batch's offset, selects a row of the flattened data.
Status mapGatherNd(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType dt, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(ir::TensorType it, ctx.inputType(1));
  int64_t b = 0;
  if (ctx.version() >= 12) {
    KILN_ASSIGN_OR_RETURN(b, ctx.attrInt("batch_dims", 0));
  }
  if (it.dtype != ir::DType::kI64 && it.dtype != ir::DType::kI32)
    return ctx.invalid("indices " + it.toString() + " must be i64 (or i32)");
  const int64_t r = dt.rank(), q = it.rank();
  if (q < 1 || b < 0 || b >= std::min(r, q))
    return ctx.invalid("batch_dims " + std::to_string(b) + " must be below the ranks of data " +
                       dt.toString() + " and indices " + it.toString());
  const int64_t k = it.shape.back();
  if (k < 1 || k > r - b)
    return ctx.invalid("indices " + it.toString() + " index " + std::to_string(k) + " dims; data " +
                       dt.toString() + " has " + std::to_string(r - b) + " after its " +
                       std::to_string(b) + " batch dims");
  for (int64_t d = 0; d < b; ++d)
    if (dt.shape[static_cast<size_t>(d)] != it.shape[static_cast<size_t>(d)])
      return ctx.invalid("batch dim " + std::to_string(d) + " differs: data " + dt.toString() +
                         ", indices " + it.toString());
  KILN_ASSIGN_OR_RETURN(Value * data, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * idx, ctx.value(1, /*trainable=*/false));
  if (it.dtype != ir::DType::kI64) {
    KILN_ASSIGN_OR_RETURN(idx, ctx.emit(OpKind::kCast, {idx}, {{"to", std::string("i64")}}));
  }
  // The flattened row: sum over j of index_j * stride_j, strides over the k indexed dims.
  const Shape compShape(it.shape.begin(), it.shape.end() - 1);
  Value* flat = nullptr;
  int64_t stride = 1;
  for (int64_t j = k - 1; j >= 0; --j) {
    const int64_t dim = dt.shape[static_cast<size_t>(b + j)];
    if (dim > kMaxFoldElements)
      return ctx.unsupported("GatherND over a dim of " + std::to_string(dim) +
                             " (kiln checks indices through a table of its positions)");
    KILN_ASSIGN_OR_RETURN(Value * c, ctx.emit(OpKind::kSlice, {idx},
                                              {{"starts", std::vector<int64_t>{j}},
                                               {"ends", std::vector<int64_t>{j + 1}},
                                               {"axes", std::vector<int64_t>{q - 1}}}));
    KILN_ASSIGN_OR_RETURN(c,
                          ctx.emit(OpKind::kSqueeze, {c}, {{"axes", std::vector<int64_t>{q - 1}}}));
    std::vector<int64_t> positions(static_cast<size_t>(dim));
    std::iota(positions.begin(), positions.end(), int64_t{0});
    KILN_ASSIGN_OR_RETURN(Value * table, i64Constant(ctx, {dim}, positions));
    KILN_ASSIGN_OR_RETURN(c, ctx.emit(OpKind::kGather, {table, c}, {{"axis", int64_t{0}}}));
    if (stride != 1) {
      KILN_ASSIGN_OR_RETURN(Value * s, i64Constant(ctx, {}, {stride}));
      KILN_ASSIGN_OR_RETURN(c, ctx.emit(OpKind::kMul, {c, s}));
    }
    if (flat) {
      KILN_ASSIGN_OR_RETURN(flat, ctx.emit(OpKind::kAdd, {flat, c}));
    } else {
      flat = c;
    }
    stride *= dim;
  }
  // Each batch's first row: batch position (row-major over the b batch dims) times `stride`.
  int64_t batches = 1;
  for (int64_t d = 0; d < b; ++d) batches *= dt.shape[static_cast<size_t>(d)];
  if (b > 0) {
    Shape offShape(it.shape.begin(), it.shape.begin() + b);
    offShape.resize(compShape.size(), 1);
    std::vector<int64_t> offsets(static_cast<size_t>(batches));
    for (int64_t i = 0; i < batches; ++i) offsets[static_cast<size_t>(i)] = i * stride;
    KILN_ASSIGN_OR_RETURN(Value * off, i64Constant(ctx, offShape, offsets));
    KILN_ASSIGN_OR_RETURN(flat, ctx.emit(OpKind::kAdd, {flat, off}));
  }
  Shape rows{batches * stride};
  Shape rest(dt.shape.begin() + b + k, dt.shape.end());
  rows.insert(rows.end(), rest.begin(), rest.end());
  KILN_ASSIGN_OR_RETURN(Value * table, ctx.emit(OpKind::kReshape, {data}, {{"shape", rows}}));
  return ctx.emit(OpKind::kGather, {table, flat}, {{"axis", int64_t{0}}}, 0).status();
}

// ReverseSequence (10): out[t, b] = in[len_b - 1 - t, b] for t < len_b, else in[t, b], by
// gather_elements along the time axis (a length above the time dim reads out of range: an
// error). Lengths below 0 reverse nothing.
Status mapReverseSequence(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(ir::TensorType lt, ctx.inputType(1));
  KILN_ASSIGN_OR_RETURN(int64_t timeAxis, ctx.attrInt("time_axis", 0));
  KILN_ASSIGN_OR_RETURN(int64_t batchAxis, ctx.attrInt("batch_axis", 1));
  if (xt.rank() < 2 || !((timeAxis == 0 && batchAxis == 1) || (timeAxis == 1 && batchAxis == 0)))
    return ctx.invalid(
        "time_axis and batch_axis must be 0 and 1 (either way) of an input of rank "
        "2 or more, got " +
        std::to_string(timeAxis) + " and " + std::to_string(batchAxis) + " for " + xt.toString());
  const int64_t t = xt.shape[static_cast<size_t>(timeAxis)];
  const int64_t bsz = xt.shape[static_cast<size_t>(batchAxis)];
  if (lt.shape != Shape{bsz} || (lt.dtype != ir::DType::kI64 && lt.dtype != ir::DType::kI32))
    return ctx.invalid("sequence_lens " + lt.toString() + " must be i64[" + std::to_string(bsz) +
                       "] (the batch dim)");
  KILN_ASSIGN_OR_RETURN(Value * lens, ctx.value(1, /*trainable=*/false));
  if (lt.dtype != ir::DType::kI64) {
    KILN_ASSIGN_OR_RETURN(lens, ctx.emit(OpKind::kCast, {lens}, {{"to", std::string("i64")}}));
  }
  // Steps [T, 1] or [1, T] against lengths [1, B] or [B, 1].
  if (t > kMaxFoldElements)
    return ctx.unsupported("a time dim of " + std::to_string(t) + " (too large)");
  std::vector<int64_t> steps(static_cast<size_t>(t));
  std::iota(steps.begin(), steps.end(), int64_t{0});
  const Shape stepShape = timeAxis == 0 ? Shape{t, 1} : Shape{1, t};
  const Shape lenShape = timeAxis == 0 ? Shape{1, bsz} : Shape{bsz, 1};
  KILN_ASSIGN_OR_RETURN(Value * step, i64Constant(ctx, stepShape, steps));
  KILN_ASSIGN_OR_RETURN(lens, ctx.emit(OpKind::kReshape, {lens}, {{"shape", lenShape}}));
  KILN_ASSIGN_OR_RETURN(Value * inside, ctx.emit(OpKind::kLess, {step, lens}));
  KILN_ASSIGN_OR_RETURN(Value * one, i64Constant(ctx, {}, {1}));
  KILN_ASSIGN_OR_RETURN(Value * lastOne, ctx.emit(OpKind::kSub, {lens, one}));
  KILN_ASSIGN_OR_RETURN(Value * mirrored, ctx.emit(OpKind::kSub, {lastOne, step}));
  KILN_ASSIGN_OR_RETURN(Value * src, ctx.emit(OpKind::kWhere, {inside, mirrored, step}));
  // Over the remaining dims.
  Shape full = xt.shape;
  Shape keep{full[0], full[1]};
  keep.resize(full.size(), 1);
  KILN_ASSIGN_OR_RETURN(src, ctx.emit(OpKind::kReshape, {src}, {{"shape", keep}}));
  KILN_ASSIGN_OR_RETURN(src, ctx.emit(OpKind::kExpand, {src}, {{"shape", full}}));
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  return ctx.emit(OpKind::kGatherElements, {x, src}, {{"axis", timeAxis}}, 0).status();
}

// MaxUnpool (9, 11, 22): zeros of the unpooled shape ((in - 1) stride - pads + kernel per dim)
// with each X value scattered to its index (flat in that shape, as MaxPool's Indices; a repeated
// index keeps its last value), then, given output_shape, placed at its start and padded with
// zeros to it.
Status mapMaxUnpool(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(ir::TensorType it, ctx.inputType(1));
  const size_t spatial = xt.shape.size() < 3 ? 0 : xt.shape.size() - 2;
  KILN_ASSIGN_OR_RETURN(auto kernel, ctx.attrInts("kernel_shape"));
  KILN_ASSIGN_OR_RETURN(auto strides, ctx.attrInts("strides", std::vector<int64_t>(spatial, 1)));
  KILN_ASSIGN_OR_RETURN(auto pads, ctx.attrInts("pads", std::vector<int64_t>(2 * spatial, 0)));
  if (spatial == 0 || kernel.size() != spatial || strides.size() != spatial ||
      pads.size() != 2 * spatial || it.shape != xt.shape || it.dtype != ir::DType::kI64)
    return ctx.invalid("X " + xt.toString() + ", I " + it.toString() + ", kernel_shape " +
                       ir::shapeToString(kernel) + ", strides " + ir::shapeToString(strides) +
                       " and pads " + ir::shapeToString(pads) + " do not match");
  Shape unpooled{xt.shape[0], xt.shape[1]};
  for (size_t d = 0; d < spatial; ++d)
    unpooled.push_back((xt.shape[d + 2] - 1) * strides[d] - (pads[d] + pads[d + spatial]) +
                       kernel[d]);
  Shape out = unpooled;
  if (ctx.hasInput(2)) {
    KILN_ASSIGN_OR_RETURN(out, ctx.constInts(2, "output_shape"));
    if (out.size() != unpooled.size())
      return ctx.invalid("output_shape " + ir::shapeToString(out) + " must have rank " +
                         std::to_string(unpooled.size()));
    for (size_t d = 0; d < out.size(); ++d)
      if (out[d] < unpooled[d] || (d < 2 && out[d] != unpooled[d]))
        return ctx.invalid("output_shape " + ir::shapeToString(out) +
                           " is smaller than the unpooled shape " + ir::shapeToString(unpooled) +
                           " (or changes N or C)");
  }
  const int64_t total = ir::numElements(unpooled);
  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(Value * idx, ctx.value(1, /*trainable=*/false));
  KILN_ASSIGN_OR_RETURN(Value * zero, scalarConstant(ctx, xt.dtype, 0));
  KILN_ASSIGN_OR_RETURN(Value * zeros,
                        ctx.emit(OpKind::kExpand, {zero}, {{"shape", Shape{total}}}));
  const Shape flatShape{ir::numElements(xt.shape)};
  KILN_ASSIGN_OR_RETURN(Value * xf, ctx.emit(OpKind::kReshape, {x}, {{"shape", flatShape}}));
  KILN_ASSIGN_OR_RETURN(Value * idf, ctx.emit(OpKind::kReshape, {idx}, {{"shape", flatShape}}));
  KILN_ASSIGN_OR_RETURN(
      Value * y, ctx.emit(OpKind::kScatterElements, {zeros, idf, xf}, {{"axis", int64_t{0}}}));
  KILN_ASSIGN_OR_RETURN(y, ctx.emit(OpKind::kReshape, {y}, {{"shape", unpooled}}));
  // Zeros after the unpooled extent of each spatial dim that output_shape makes larger.
  Shape cur = unpooled;
  for (size_t d = 2; d < out.size(); ++d) {
    if (out[d] == cur[d]) continue;
    Shape padShape = cur;
    padShape[d] = out[d] - cur[d];
    KILN_ASSIGN_OR_RETURN(Value * pad, ctx.emit(OpKind::kExpand, {zero}, {{"shape", padShape}}));
    KILN_ASSIGN_OR_RETURN(y,
                          ctx.emit(OpKind::kConcat, {y, pad}, {{"axis", static_cast<int64_t>(d)}}));
    cur[d] = out[d];
  }
  ctx.setOutput(0, y);
  return Status::ok();
}

// Col2Im (18): input [N, C * prod(block), L] (each column one block's values, channel-major,
// the L blocks in row-major order over the block grid) summed into the image [N, C, image...]:
// column entry (k, l) lands at grid(l) * strides + position(k) * dilations - pads_begin per dim,
// or in the padding, where it is dropped. The entries form a flat [K * L] row per channel, with
// a zero appended; an import-time table lists, for each image element, the entries landing on
// it in (k, l) order (the reference's summation order), padded with the zero to the most any
// element has; a gather by that table and a sum over its last dim give the image (so infinities
// and NaN add as the reference adds them: no product with 0). image_shape and block_shape must
// be known at import.
Status mapCol2Im(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(auto image, ctx.constInts(1, "image_shape"));
  KILN_ASSIGN_OR_RETURN(auto block, ctx.constInts(2, "block_shape"));
  const size_t sd = image.size();
  KILN_ASSIGN_OR_RETURN(auto dil, ctx.attrInts("dilations", std::vector<int64_t>(sd, 1)));
  KILN_ASSIGN_OR_RETURN(auto strides, ctx.attrInts("strides", std::vector<int64_t>(sd, 1)));
  KILN_ASSIGN_OR_RETURN(auto pads, ctx.attrInts("pads", std::vector<int64_t>(2 * sd, 0)));
  auto describe = [&] {
    return "input " + xt.toString() + ", image_shape " + ir::shapeToString(image) +
           ", block_shape " + ir::shapeToString(block) + ", dilations " + ir::shapeToString(dil) +
           ", strides " + ir::shapeToString(strides) + " and pads " + ir::shapeToString(pads);
  };
  bool ok = sd >= 1 && xt.rank() == 3 && block.size() == sd && dil.size() == sd &&
            strides.size() == sd && pads.size() == 2 * sd;
  // The import-time table's bound, on the image, the column entries and the table itself.
  constexpr int64_t kMaxTable = int64_t{1} << 24;
  int64_t blockSize = 1, blocks = 1, pixels = 1;
  std::vector<int64_t> grid(sd);
  for (size_t d = 0; ok && d < sd; ++d) {
    ok = image[d] >= 1 && block[d] >= 1 && dil[d] >= 1 && strides[d] >= 1 && pads[d] >= 0 &&
         pads[d + sd] >= 0;
    int64_t span = 0, padded = 0;
    ok = ok && !__builtin_mul_overflow(dil[d], block[d] - 1, &span) &&
         !__builtin_add_overflow(span, 1, &span) &&
         !__builtin_add_overflow(image[d], pads[d], &padded) &&
         !__builtin_add_overflow(padded, pads[d + sd], &padded) && padded >= span;
    grid[d] = ok ? (padded - span) / strides[d] + 1 : 0;
    ok = ok && !__builtin_mul_overflow(blockSize, block[d], &blockSize) &&
         !__builtin_mul_overflow(blocks, grid[d], &blocks) &&
         !__builtin_mul_overflow(pixels, image[d], &pixels);
  }
  if (ok && (pixels > kMaxTable || blockSize > kMaxTable || blocks > kMaxTable ||
             blockSize * blocks > kMaxTable))
    return ctx.unsupported(
        describe() + ": kiln builds an index table of the image's " + std::to_string(pixels) +
        " elements and the " + std::to_string(blockSize) + " x " + std::to_string(blocks) +
        " column entries at import (at most " + std::to_string(kMaxTable) + " each)");
  if (!ok || xt.shape[1] % blockSize != 0 || xt.shape[2] != blocks)
    return ctx.invalid(describe() + " do not match: the input must be [N, C * " +
                       std::to_string(blockSize) + " (the block's size), " +
                       std::to_string(blocks) + " (the blocks that fit the padded image)]");
  const int64_t n = xt.shape[0], c = xt.shape[1] / blockSize, entries = blockSize * blocks;
  // Which entries land on each image element, in (k, l) order.
  std::vector<std::vector<int64_t>> landing(static_cast<size_t>(pixels));
  std::vector<int64_t> kpos(sd), gpos(sd);
  auto unravel = [sd](int64_t flat, const std::vector<int64_t>& dims, std::vector<int64_t>& at) {
    for (size_t d = sd; d-- > 0; flat /= dims[d]) at[d] = flat % dims[d];
  };
  for (int64_t k = 0; k < blockSize; ++k) {
    unravel(k, block, kpos);
    for (int64_t l = 0; l < blocks; ++l) {
      unravel(l, grid, gpos);
      int64_t flat = 0;
      bool inside = true;
      for (size_t d = 0; d < sd; ++d) {
        const int64_t at = gpos[d] * strides[d] + kpos[d] * dil[d] - pads[d];
        inside = inside && at >= 0 && at < image[d];
        flat = flat * image[d] + at;
      }
      if (inside) landing[static_cast<size_t>(flat)].push_back(k * blocks + l);
    }
  }
  size_t most = 1;
  for (const auto& v : landing) most = std::max(most, v.size());
  if (pixels * static_cast<int64_t>(most) > kMaxTable)
    return ctx.unsupported(describe() + ": kiln builds an index table of " +
                           std::to_string(pixels) + " x " + std::to_string(most) +
                           " entries at import (at most " + std::to_string(kMaxTable) + ")");
  std::vector<int64_t> table(static_cast<size_t>(pixels) * most, entries);  // `entries`: the 0.
  for (size_t p = 0; p < landing.size(); ++p)
    std::copy(landing[p].begin(), landing[p].end(),
              table.begin() + static_cast<ptrdiff_t>(p * most));

  KILN_ASSIGN_OR_RETURN(Value * x, ctx.value(0));
  KILN_ASSIGN_OR_RETURN(x, ctx.emit(OpKind::kReshape, {x}, {{"shape", Shape{n, c, entries}}}));
  KILN_ASSIGN_OR_RETURN(Value * zero, scalarConstant(ctx, xt.dtype, 0));
  KILN_ASSIGN_OR_RETURN(Value * zeros,
                        ctx.emit(OpKind::kExpand, {zero}, {{"shape", Shape{n, c, 1}}}));
  KILN_ASSIGN_OR_RETURN(x, ctx.emit(OpKind::kConcat, {x, zeros}, {{"axis", int64_t{2}}}));
  KILN_ASSIGN_OR_RETURN(Value * idx,
                        i64Constant(ctx, Shape{pixels, static_cast<int64_t>(most)}, table));
  KILN_ASSIGN_OR_RETURN(Value * y, ctx.emit(OpKind::kGather, {x, idx}, {{"axis", int64_t{2}}}));
  if (most > 1) {
    KILN_ASSIGN_OR_RETURN(y,
                          ctx.emit(OpKind::kReduceSum, {y},
                                   {{"axes", std::vector<int64_t>{3}}, {"keepdims", int64_t{0}}}));
  }
  Shape out{n, c};
  out.insert(out.end(), image.begin(), image.end());
  return ctx.emit(OpKind::kReshape, {y}, {{"shape", out}}, 0).status();
}

// TensorScatter (24): the past cache with `update` written along `axis` at each batch's
// write_indices[b] + s (mod the cache's length in circular mode), by scatter_elements (a linear
// write past the cache's end is an out-of-range error).
Status mapTensorScatter(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType ct, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(ir::TensorType ut, ctx.inputType(1));
  KILN_ASSIGN_OR_RETURN(std::string mode, ctx.attrString("mode", "linear"));
  if (mode != "linear" && mode != "circular")
    return ctx.invalid("mode must be linear or circular, got '" + mode + "'");
  KILN_ASSIGN_OR_RETURN(int64_t axisAttr, ctx.attrInt("axis", -2));
  KILN_ASSIGN_OR_RETURN(int axis, ir::normalizeAxis(axisAttr, ct.shape.size(), "axis"));
  bool fits = ut.rank() == ct.rank() && ut.dtype == ct.dtype && axis >= 1;
  for (size_t d = 0; fits && d < ct.shape.size(); ++d)
    fits = static_cast<int>(d) == axis ? ut.shape[d] <= ct.shape[d] : ut.shape[d] == ct.shape[d];
  if (!fits)
    return ctx.invalid("update " + ut.toString() + " must match past_cache " + ct.toString() +
                       " but along axis " + std::to_string(axis) + " (after the batch dim)");
  const int64_t b = ct.shape[0], maxLen = ct.shape[static_cast<size_t>(axis)],
                s = ut.shape[static_cast<size_t>(axis)];
  // Positions [1, .., S, .., 1] along the axis, plus each batch's start [B, 1, ..].
  Shape posShape(ct.shape.size(), 1);
  posShape[static_cast<size_t>(axis)] = s;
  std::vector<int64_t> pos(static_cast<size_t>(s));
  std::iota(pos.begin(), pos.end(), int64_t{0});
  KILN_ASSIGN_OR_RETURN(Value * idx, i64Constant(ctx, posShape, pos));
  if (ctx.hasInput(2)) {
    KILN_ASSIGN_OR_RETURN(ir::TensorType wt, ctx.inputType(2));
    if (wt.shape != Shape{b} || (wt.dtype != ir::DType::kI64 && wt.dtype != ir::DType::kI32))
      return ctx.invalid("write_indices " + wt.toString() + " must be i64[" + std::to_string(b) +
                         "]");
    KILN_ASSIGN_OR_RETURN(Value * w, ctx.value(2, /*trainable=*/false));
    if (wt.dtype != ir::DType::kI64) {
      KILN_ASSIGN_OR_RETURN(w, ctx.emit(OpKind::kCast, {w}, {{"to", std::string("i64")}}));
    }
    Shape startShape(ct.shape.size(), 1);
    startShape[0] = b;
    KILN_ASSIGN_OR_RETURN(w, ctx.emit(OpKind::kReshape, {w}, {{"shape", startShape}}));
    KILN_ASSIGN_OR_RETURN(idx, ctx.emit(OpKind::kAdd, {idx, w}));
  }
  if (mode == "circular") {
    KILN_ASSIGN_OR_RETURN(Value * len, i64Constant(ctx, {}, {maxLen}));
    KILN_ASSIGN_OR_RETURN(idx, ctx.emit(OpKind::kMod, {idx, len}));
  }
  KILN_ASSIGN_OR_RETURN(idx, ctx.emit(OpKind::kExpand, {idx}, {{"shape", ut.shape}}));
  KILN_ASSIGN_OR_RETURN(Value * past, ctx.value(0, /*trainable=*/false));
  KILN_ASSIGN_OR_RETURN(Value * update, ctx.value(1));
  return ctx
      .emit(OpKind::kScatterElements, {past, idx, update}, {{"axis", static_cast<int64_t>(axis)}},
            0)
      .status();
}

}  // namespace

// GatherND 12 adds batch_dims; ReverseSequence 28 only more element types; MaxUnpool 11 adds
// nothing kiln reads differently (output_shape's semantics were clarified).
std::vector<MapperEntry> indexingMappers() {
  return {
      {"GatherND", {11, 12, 13}, mapGatherNd},
      {"ReverseSequence", {10, 28}, mapReverseSequence},
      {"MaxUnpool", {9, 11, 22}, mapMaxUnpool},
      {"TensorScatter", {24}, mapTensorScatter},
      {"Col2Im", {18}, mapCol2Im},
  };
}

}  // namespace kiln::frontends::onnx_import
