// Shape inference for pointwise ops: unary, NumPy-broadcasting binary, where, cast.
#include "ir/infer.h"
#include "ir/narrow.h"

namespace kiln::ir {

std::vector<TensorType> one(TensorType t) {
  return {std::move(t)};
}

Status requireFloat(const TensorType& t, const char* what) {
  if (!isFloat(t.dtype))
    return invalidArgument(std::string(what) + " must be a floating-point tensor, got " +
                           t.toString());
  return Status::ok();
}

Status requireNumeric(const TensorType& t, const char* what) {
  if (t.dtype == DType::kBool)
    return invalidArgument(std::string(what) + " must be numeric, got " + t.toString());
  return Status::ok();
}

Status requireRank(const TensorType& t, int rank, const char* what) {
  if (t.rank() != rank)
    return invalidArgument(std::string(what) + " must have rank " + std::to_string(rank) +
                           ", got " + t.toString());
  return Status::ok();
}

Expected<std::vector<TensorType>> inferUnaryNumeric(std::span<const TensorType> in,
                                                    const AttrView&) {
  KILN_TRY(requireNumeric(in[0], "input"));
  return one(in[0]);
}

Expected<std::vector<TensorType>> inferUnaryFloat(std::span<const TensorType> in,
                                                  const AttrView& a) {
  KILN_TRY(requireFloat(in[0], "input"));
  if (a.op().findAttr("axis"))
    KILN_TRY(normalizeAxis(a.getInt("axis"), in[0].shape.size(), "axis").status());
  return one(in[0]);
}

Expected<std::vector<TensorType>> inferGelu(std::span<const TensorType> in, const AttrView& a) {
  const std::string& approx = a.getString("approximate");
  if (approx != "none" && approx != "tanh")
    return invalidArgument("attribute approximate must be \"none\" or \"tanh\", got \"" + approx +
                           "\"");
  return inferUnaryFloat(in, a);
}

Expected<std::vector<TensorType>> inferCast(std::span<const TensorType> in, const AttrView& a) {
  auto to = parseDType(a.getString("to"));
  if (!to) return invalidArgument("attribute to: unknown dtype '" + a.getString("to") + "'");
  const std::string& round = a.getString("round_mode");
  if (!parseE8M0Round(round))
    return invalidArgument("attribute round_mode must be up, down or nearest, got '" + round + "'");
  TensorType t = in[0];
  t.dtype = *to;
  return one(t);
}

Expected<std::vector<TensorType>> inferBitcast(std::span<const TensorType> in, const AttrView& a) {
  auto to = parseDType(a.getString("to"));
  if (!to) return invalidArgument("attribute to: unknown dtype '" + a.getString("to") + "'");
  const DType from = in[0].dtype;
  auto subByte = [](DType t) { return isNarrow(t) && narrowFileBits(t) < 8; };
  if (dtypeSize(from) != dtypeSize(*to) || subByte(from) || subByte(*to))
    return invalidArgument("cannot reinterpret " + in[0].toString() + " as " +
                           std::string(dtypeName(*to)) +
                           ": the element sizes must be equal (kiln holds 4- and 2-bit elements "
                           "one a byte)");
  if (*to == DType::kBool && from != DType::kBool)
    return invalidArgument("cannot reinterpret " + in[0].toString() +
                           " as bool: bytes other than 0 and 1 are no bools (compare with 0 "
                           "instead)");
  TensorType t = in[0];
  t.dtype = *to;
  return one(t);
}

Expected<std::vector<TensorType>> inferRelayout(std::span<const TensorType> in, const AttrView& a) {
  auto from = parseLayout(a.getString("from"));
  auto to = parseLayout(a.getString("to"));
  if (!from || !to)
    return invalidArgument("layouts must be plain, nchw or nhwc, got from=\"" +
                           a.getString("from") + "\" to=\"" + a.getString("to") + "\"");
  const bool isNchw = *from == Layout::kNCHW || *from == Layout::kPlain;
  const bool inNchw = in[0].layout == Layout::kNCHW || in[0].layout == Layout::kPlain;
  if (*from != in[0].layout && !(isNchw && inNchw))
    return invalidArgument("from=\"" + a.getString("from") + "\" but the input is " +
                           in[0].toString());
  if ((*to == Layout::kNHWC || *from == Layout::kNHWC) && in[0].rank() != 4)
    return invalidArgument("nhwc needs a rank-4 tensor, got " + in[0].toString());
  TensorType t = in[0];
  t.layout = *to;
  return one(t);
}

namespace {
Expected<TensorType> broadcastBinary(const TensorType& x, const TensorType& y) {
  if (x.dtype != y.dtype)
    return invalidArgument("inputs must have the same dtype, got " + x.toString() + " and " +
                           y.toString() + " (insert a cast)");
  KILN_ASSIGN_OR_RETURN(Shape s, broadcastShapes(x.shape, y.shape));
  TensorType t{x.dtype, std::move(s), Layout::kPlain};
  // Keep a layout only when both operands agree on it and the shape is unchanged.
  if (x.layout == y.layout && t.shape == x.shape) t.layout = x.layout;
  return t;
}
}  // namespace

Expected<std::vector<TensorType>> inferBinaryNumeric(std::span<const TensorType> in,
                                                     const AttrView&) {
  KILN_TRY(requireNumeric(in[0], "first input"));
  KILN_ASSIGN_OR_RETURN(TensorType t, broadcastBinary(in[0], in[1]));
  return one(t);
}

Expected<std::vector<TensorType>> inferBinaryFloat(std::span<const TensorType> in,
                                                   const AttrView&) {
  KILN_TRY(requireFloat(in[0], "first input"));
  KILN_ASSIGN_OR_RETURN(TensorType t, broadcastBinary(in[0], in[1]));
  return one(t);
}

Expected<std::vector<TensorType>> inferCompare(std::span<const TensorType> in, const AttrView&) {
  KILN_TRY(requireNumeric(in[0], "first input"));
  KILN_ASSIGN_OR_RETURN(TensorType t, broadcastBinary(in[0], in[1]));
  t.dtype = DType::kBool;
  t.layout = Layout::kPlain;
  return one(t);
}

Expected<std::vector<TensorType>> inferBitwise(std::span<const TensorType> in, const AttrView&) {
  if (!isInteger(in[0].dtype))
    return invalidArgument("inputs must be integers, got " + in[0].toString());
  TensorType t = in[0];
  if (in.size() == 2) {
    KILN_ASSIGN_OR_RETURN(t, broadcastBinary(in[0], in[1]));
  }
  t.layout = Layout::kPlain;
  return one(t);
}

Expected<std::vector<TensorType>> inferLogical(std::span<const TensorType> in, const AttrView&) {
  for (const TensorType& t : in)
    if (t.dtype != DType::kBool) return invalidArgument("inputs must be bool, got " + t.toString());
  TensorType t = in[0];
  if (in.size() == 2) {
    KILN_ASSIGN_OR_RETURN(t, broadcastBinary(in[0], in[1]));
  }
  t.layout = Layout::kPlain;
  return one(t);
}

Expected<std::vector<TensorType>> inferWhere(std::span<const TensorType> in, const AttrView&) {
  if (in[0].dtype != DType::kBool)
    return invalidArgument("condition must be bool, got " + in[0].toString());
  KILN_ASSIGN_OR_RETURN(TensorType t, broadcastBinary(in[1], in[2]));
  KILN_ASSIGN_OR_RETURN(t.shape, broadcastShapes(in[0].shape, t.shape));
  t.layout = Layout::kPlain;
  return one(t);
}

Expected<std::vector<TensorType>> inferTernaryFloat(std::span<const TensorType> in,
                                                    const AttrView&) {
  KILN_TRY(requireFloat(in[0], "first input"));
  KILN_ASSIGN_OR_RETURN(TensorType t, broadcastBinary(in[0], in[1]));
  KILN_ASSIGN_OR_RETURN(t, broadcastBinary(t, in[2]));
  return one(t);
}

}  // namespace kiln::ir
