// ONNX Attention (23, 24, 25) composed from kiln's ops, as its function body defines it: Q and K
// each scaled by sqrt(scale), QK^T, softcap, the additive bias (attn_mask, causal and sliding
// window masks aligned to the end of the cache, the padding of nonpad_kv_seqlen), softmax with
// fully masked rows zeroed, times V. 3-D inputs are split into heads; grouped-query attention
// repeats each KV head; past_key/past_value are concatenated in front of K and V. f16 and bf16
// are computed in f32 and rounded once at the end.
#include <cmath>
#include <limits>
#include <string>

#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_map_util.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::DType;
using ir::OpKind;
using ir::Shape;
using ir::Value;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

struct AttentionBuilder {
  NodeContext& ctx;
  DType dtype;  // The compute dtype: f32 or f64.

  Expected<Value*> scalar(double v) { return scalarConstant(ctx, dtype, v); }
  Expected<Value*> emit(OpKind op, std::vector<Value*> in, ir::AttrMap attrs = {}) {
    return ctx.emit(op, std::move(in), std::move(attrs));
  }
  // Input i in the compute dtype.
  Expected<Value*> input(size_t i) {
    KILN_ASSIGN_OR_RETURN(Value * v, ctx.value(i));
    if (v->type().dtype == dtype || !ir::isFloat(v->type().dtype)) return v;
    return emit(OpKind::kCast, {v}, {{"to", std::string(ir::dtypeName(dtype))}});
  }
  // [B, S, H * D] -> [B, H, S, D].
  Expected<Value*> splitHeads(Value* x, int64_t heads, const char* what) {
    const Shape& s = x->type().shape;
    if (heads <= 0 || s[2] % heads != 0)
      return ctx.invalid(std::string(what) + "'s hidden size " + std::to_string(s[2]) +
                         " is not a multiple of its " + std::to_string(heads) + " heads");
    KILN_ASSIGN_OR_RETURN(Value * r, emit(OpKind::kReshape, {x},
                                          {{"shape", Shape{s[0], s[1], heads, s[2] / heads}}}));
    return emit(OpKind::kTranspose, {r}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  }
  // 0 where `allowed`, -inf elsewhere.
  Expected<Value*> biasOf(Value* allowed) {
    KILN_ASSIGN_OR_RETURN(Value * zero, scalar(0));
    KILN_ASSIGN_OR_RETURN(Value * ninf, scalar(kNegInf));
    return emit(OpKind::kWhere, {allowed, zero, ninf});
  }
  Expected<Value*> add(Value* a, Value* b) {
    if (!a) return b;
    return emit(OpKind::kAdd, {a, b});
  }
};

// A [q, kv] table of `f(i, j)` as a constant of `dtype` (bool or i64).
template <class F>
ir::TensorData table(DType dtype, int64_t q, int64_t kv, F f) {
  ir::TensorData t(dtype, {q, kv});
  for (int64_t i = 0; i < q; ++i)
    for (int64_t j = 0; j < kv; ++j) {
      if (dtype == DType::kBool)
        t.as<uint8_t>()[i * kv + j] = f(i, j) ? 1 : 0;
      else
        t.as<int64_t>()[i * kv + j] = f(i, j);
    }
  return t;
}

Status mapAttention(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType qt, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(ir::TensorType kt, ctx.inputType(1));
  KILN_ASSIGN_OR_RETURN(ir::TensorType vt, ctx.inputType(2));
  if (!ir::isFloat(qt.dtype)) return ctx.invalid("Q must be a float tensor, got " + qt.toString());
  if (qt.rank() != kt.rank() || qt.rank() != vt.rank() || (qt.rank() != 3 && qt.rank() != 4))
    return ctx.invalid("Q, K and V must all have rank 3 or all rank 4, got " + qt.toString() +
                       ", " + kt.toString() + " and " + vt.toString());
  const DType outType = qt.dtype;
  AttentionBuilder b{ctx, outType == DType::kF64 ? DType::kF64 : DType::kF32};

  KILN_ASSIGN_OR_RETURN(bool causal, ctx.attrBool("is_causal", false));
  KILN_ASSIGN_OR_RETURN(int64_t mode, ctx.attrInt("qk_matmul_output_mode", 0));
  if (mode < 0 || mode > 3)
    return ctx.invalid("qk_matmul_output_mode must be 0 to 3, got " + std::to_string(mode));
  KILN_ASSIGN_OR_RETURN(double softcap, ctx.attrFloat("softcap", 0.0));
  int64_t left = -1, right = -1;
  if (ctx.version() >= 25) {
    KILN_ASSIGN_OR_RETURN(left, ctx.attrInt("left_window_size", -1));
    KILN_ASSIGN_OR_RETURN(right, ctx.attrInt("right_window_size", -1));
    if (left < -1 || right < -1)
      return ctx.invalid("left_window_size and right_window_size must be -1 or nonnegative");
  }
  const bool window = left >= 0 || right >= 0;

  KILN_ASSIGN_OR_RETURN(Value * q, b.input(0));
  KILN_ASSIGN_OR_RETURN(Value * k, b.input(1));
  KILN_ASSIGN_OR_RETURN(Value * v, b.input(2));
  if (qt.rank() == 3) {
    if (!ctx.hasAttr("q_num_heads") || !ctx.hasAttr("kv_num_heads"))
      return ctx.invalid("3-D Q, K and V need the q_num_heads and kv_num_heads attributes");
    KILN_ASSIGN_OR_RETURN(int64_t qh, ctx.attrInt("q_num_heads"));
    KILN_ASSIGN_OR_RETURN(int64_t kvh, ctx.attrInt("kv_num_heads"));
    KILN_ASSIGN_OR_RETURN(q, b.splitHeads(q, qh, "Q"));
    KILN_ASSIGN_OR_RETURN(k, b.splitHeads(k, kvh, "K"));
    KILN_ASSIGN_OR_RETURN(v, b.splitHeads(v, kvh, "V"));
  } else if (ctx.version() >= 25 && (ctx.hasAttr("q_num_heads") || ctx.hasAttr("kv_num_heads"))) {
    return ctx.invalid("q_num_heads and kv_num_heads must not be given for 4-D inputs");
  }
  const Shape qs = q->type().shape;  // [B, Hq, Sq, D]
  const int64_t batch = qs[0], qHeads = qs[1], qLen = qs[2];

  // The cache: present = concat(past, new) along the sequence.
  const bool past = ctx.hasInput(4) || ctx.hasInput(5);
  if (past && !(ctx.hasInput(4) && ctx.hasInput(5)))
    return ctx.invalid("past_key and past_value must be given together");
  const bool nonpad = ctx.hasInput(6);
  if (nonpad && past) return ctx.invalid("nonpad_kv_seqlen cannot be combined with past_key");
  int64_t pastLen = 0;
  if (past) {
    KILN_ASSIGN_OR_RETURN(Value * pk, b.input(4));
    KILN_ASSIGN_OR_RETURN(Value * pv, b.input(5));
    pastLen = pk->type().shape.size() == 4 ? pk->type().shape[2] : 0;
    KILN_ASSIGN_OR_RETURN(k, b.emit(OpKind::kConcat, {pk, k}, {{"axis", int64_t{2}}}));
    KILN_ASSIGN_OR_RETURN(v, b.emit(OpKind::kConcat, {pv, v}, {{"axis", int64_t{2}}}));
  }
  auto narrow = [&](Value* x) -> Expected<Value*> {
    if (x->type().dtype == outType) return x;
    return b.emit(OpKind::kCast, {x}, {{"to", std::string(ir::dtypeName(outType))}});
  };
  for (size_t out : {size_t{1}, size_t{2}})
    if (ctx.outputUsed(out)) {
      KILN_ASSIGN_OR_RETURN(Value * present, narrow(out == 1 ? k : v));
      ctx.setOutput(out, present);
    }
  const int64_t kvHeads = k->type().shape[1], kvLen = k->type().shape[2];

  // The additive bias, a sum of parts broadcasting to [B, Hq, Sq, KV]; nullptr: none.
  Value* bias = nullptr;
  if (ctx.hasInput(3)) {
    KILN_ASSIGN_OR_RETURN(Value * mask, ctx.value(3));
    if (mask->type().rank() < 1)
      return ctx.invalid("attn_mask must have rank 1 or more, got " + mask->type().toString());
    Value* m = nullptr;
    if (mask->type().dtype == DType::kBool) {
      KILN_ASSIGN_OR_RETURN(m, b.biasOf(mask));
    } else {
      KILN_ASSIGN_OR_RETURN(m, b.input(3));
    }
    // A mask shorter than the keys is padded with -inf (masked).
    Shape ms = m->type().shape;
    if (ms.back() > kvLen)
      return ctx.invalid("attn_mask's last dim " + std::to_string(ms.back()) +
                         " exceeds the key length " + std::to_string(kvLen));
    if (ms.back() < kvLen) {
      ms.back() = kvLen - ms.back();
      KILN_ASSIGN_OR_RETURN(Value * fill, ctx.constantValue(filledTensor(b.dtype, ms, kNegInf)));
      KILN_ASSIGN_OR_RETURN(
          m, b.emit(OpKind::kConcat, {m, fill}, {{"axis", static_cast<int64_t>(ms.size()) - 1}}));
    }
    bias = m;
  }
  // Causal and window masks: query i (of this block) attends key j by j - i against the
  // offset of the block's end in the cache: the past length, or per batch nonpad - Sq.
  if (causal || window) {
    if (!nonpad) {
      const int64_t off = pastLen;
      auto allowed = [&](int64_t i, int64_t j) {
        const int64_t diff = i + off - j;
        bool ok = true;
        if (causal) ok = ok && diff >= 0;
        if (left >= 0) ok = ok && diff <= left;
        if (right >= 0) ok = ok && -diff <= right;
        return ok;
      };
      KILN_ASSIGN_OR_RETURN(Value * a,
                            ctx.constantValue(table(DType::kBool, qLen, kvLen, allowed)));
      KILN_ASSIGN_OR_RETURN(Value * part, b.biasOf(a));
      KILN_ASSIGN_OR_RETURN(bias, b.add(bias, part));
    } else {
      // d[i, j] = j - i; allowed when d <= off (causal), -left <= off - d ..., per batch.
      KILN_ASSIGN_OR_RETURN(Value * d,
                            ctx.constantValue(table(DType::kI64, qLen, kvLen,
                                                    [](int64_t i, int64_t j) { return j - i; })));
      KILN_ASSIGN_OR_RETURN(Value * lens, ctx.value(6));
      if (lens->type().dtype != DType::kI64)
        return ctx.invalid("nonpad_kv_seqlen must be int64, got " + lens->type().toString());
      KILN_ASSIGN_OR_RETURN(Value * qn,
                            ctx.constantValue(filledTensor(DType::kI64, {}, double(qLen))));
      KILN_ASSIGN_OR_RETURN(Value * o, b.emit(OpKind::kSub, {lens, qn}));
      KILN_ASSIGN_OR_RETURN(o, b.emit(OpKind::kReshape, {o}, {{"shape", Shape{batch, 1, 1, 1}}}));
      Value* allowed = nullptr;
      auto both = [&](Value* c) -> Expected<Value*> {
        if (!allowed) return c;
        return b.emit(OpKind::kLogicalAnd, {allowed, c});
      };
      if (causal) {  // d <= off
        KILN_ASSIGN_OR_RETURN(Value * c, b.emit(OpKind::kLessEqual, {d, o}));
        KILN_ASSIGN_OR_RETURN(allowed, both(c));
      }
      if (left >= 0) {  // off - d <= left, i.e. d >= off - left
        KILN_ASSIGN_OR_RETURN(Value * l,
                              ctx.constantValue(filledTensor(DType::kI64, {}, double(left))));
        KILN_ASSIGN_OR_RETURN(Value * lo, b.emit(OpKind::kSub, {o, l}));
        KILN_ASSIGN_OR_RETURN(Value * c, b.emit(OpKind::kGreaterEqual, {d, lo}));
        KILN_ASSIGN_OR_RETURN(allowed, both(c));
      }
      if (right >= 0) {  // d - off <= right, i.e. d <= off + right
        KILN_ASSIGN_OR_RETURN(Value * r,
                              ctx.constantValue(filledTensor(DType::kI64, {}, double(right))));
        KILN_ASSIGN_OR_RETURN(Value * hi, b.emit(OpKind::kAdd, {o, r}));
        KILN_ASSIGN_OR_RETURN(Value * c, b.emit(OpKind::kLessEqual, {d, hi}));
        KILN_ASSIGN_OR_RETURN(allowed, both(c));
      }
      KILN_ASSIGN_OR_RETURN(Value * part, b.biasOf(allowed));
      KILN_ASSIGN_OR_RETURN(bias, b.add(bias, part));
    }
  }
  if (nonpad) {  // Keys at or past nonpad_kv_seqlen[b] are padding.
    ir::TensorData iota(DType::kI64, {1, 1, 1, kvLen});
    for (int64_t j = 0; j < kvLen; ++j) iota.as<int64_t>()[j] = j;
    KILN_ASSIGN_OR_RETURN(Value * idx, ctx.constantValue(std::move(iota)));
    KILN_ASSIGN_OR_RETURN(Value * lens, ctx.value(6));
    KILN_ASSIGN_OR_RETURN(Value * l4,
                          b.emit(OpKind::kReshape, {lens}, {{"shape", Shape{batch, 1, 1, 1}}}));
    KILN_ASSIGN_OR_RETURN(Value * c, b.emit(OpKind::kLess, {idx, l4}));
    KILN_ASSIGN_OR_RETURN(Value * part, b.biasOf(c));
    KILN_ASSIGN_OR_RETURN(bias, b.add(bias, part));
  }

  // Grouped-query attention: each KV head serves qHeads / kvHeads query heads, in order.
  if (qHeads != kvHeads) {
    if (kvHeads <= 0 || qHeads % kvHeads != 0 || v->type().shape[1] != kvHeads)
      return ctx.invalid("Q's " + std::to_string(qHeads) +
                         " heads are not a multiple of K's and "
                         "V's " +
                         std::to_string(kvHeads));
    const int64_t rep = qHeads / kvHeads;
    auto repeat = [&](Value* x) -> Expected<Value*> {
      const Shape s = x->type().shape;
      KILN_ASSIGN_OR_RETURN(Value * u,
                            b.emit(OpKind::kUnsqueeze, {x}, {{"axes", std::vector<int64_t>{2}}}));
      KILN_ASSIGN_OR_RETURN(
          Value * e, b.emit(OpKind::kExpand, {u}, {{"shape", Shape{s[0], s[1], rep, s[2], s[3]}}}));
      return b.emit(OpKind::kReshape, {e}, {{"shape", Shape{s[0], s[1] * rep, s[2], s[3]}}});
    };
    KILN_ASSIGN_OR_RETURN(k, repeat(k));
    KILN_ASSIGN_OR_RETURN(v, repeat(v));
  }

  // Scores: (Q sqrt(scale)) (K sqrt(scale))^T, as the function body scales both.
  double scale = 1.0 / std::sqrt(static_cast<double>(qs[3]));
  if (ctx.hasAttr("scale")) {
    KILN_ASSIGN_OR_RETURN(scale, ctx.attrFloat("scale"));
  }
  KILN_ASSIGN_OR_RETURN(Value * s, b.scalar(static_cast<float>(std::sqrt(scale))));
  KILN_ASSIGN_OR_RETURN(Value * qsc, b.emit(OpKind::kMul, {q, s}));
  KILN_ASSIGN_OR_RETURN(Value * ksc, b.emit(OpKind::kMul, {k, s}));
  KILN_ASSIGN_OR_RETURN(
      Value * kT, b.emit(OpKind::kTranspose, {ksc}, {{"perm", std::vector<int64_t>{0, 1, 3, 2}}}));
  KILN_ASSIGN_OR_RETURN(Value * scores, b.emit(OpKind::kMatMul, {qsc, kT}));
  if (softcap > 0) {
    KILN_ASSIGN_OR_RETURN(Value * cap, b.scalar(softcap));
    KILN_ASSIGN_OR_RETURN(Value * d, b.emit(OpKind::kDiv, {scores, cap}));
    KILN_ASSIGN_OR_RETURN(Value * t, b.emit(OpKind::kTanh, {d}));
    KILN_ASSIGN_OR_RETURN(scores, b.emit(OpKind::kMul, {t, cap}));
  }
  Value* biased = scores;
  if (bias) {
    KILN_ASSIGN_OR_RETURN(biased, b.emit(OpKind::kAdd, {scores, bias}));
  }
  KILN_ASSIGN_OR_RETURN(Value * probs, b.emit(OpKind::kSoftmax, {biased}, {{"axis", int64_t{-1}}}));
  if (bias) {
    // A row whose bias is -inf everywhere attends nothing: its probabilities are 0.
    KILN_ASSIGN_OR_RETURN(Value * rowMax,
                          b.emit(OpKind::kReduceMax, {bias},
                                 {{"axes", std::vector<int64_t>{-1}}, {"keepdims", int64_t{1}}}));
    KILN_ASSIGN_OR_RETURN(Value * ninf, b.scalar(kNegInf));
    KILN_ASSIGN_OR_RETURN(Value * masked, b.emit(OpKind::kEqual, {rowMax, ninf}));
    KILN_ASSIGN_OR_RETURN(Value * zero, b.scalar(0));
    KILN_ASSIGN_OR_RETURN(probs, b.emit(OpKind::kWhere, {masked, zero, probs}));
  }
  if (ctx.outputUsed(3)) {
    Value* qk = mode == 3 ? probs : mode == 2 ? biased : scores;
    KILN_ASSIGN_OR_RETURN(Value * out, narrow(qk));
    ctx.setOutput(3, out);
  }
  KILN_ASSIGN_OR_RETURN(Value * y, b.emit(OpKind::kMatMul, {probs, v}));
  if (qt.rank() == 3) {
    const Shape ys = y->type().shape;
    KILN_ASSIGN_OR_RETURN(
        Value * t, b.emit(OpKind::kTranspose, {y}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}}));
    KILN_ASSIGN_OR_RETURN(
        y, b.emit(OpKind::kReshape, {t}, {{"shape", Shape{ys[0], ys[2], ys[1] * ys[3]}}}));
  }
  KILN_ASSIGN_OR_RETURN(y, narrow(y));
  ctx.setOutput(0, y);
  return Status::ok();
}

// LinearAttention (27): the recurrence over the (static) sequence unrolled, in f32 as ONNX's
// reference (halves widened, the results rounded once). Per step t, per KV head: S *= exp(g_t)
// (gated), v_t = beta_t (v_t - S^T k_t) (delta), S += k_t v_t^T, and each query head reads its KV
// head's state (heads grouped: query head h reads KV head h / (q_num_heads / kv_num_heads)),
// o_t = scale q_t^T S. Inputs [B, T, heads * dim]; the state [B, H_kv, d_k, d_v].
Status mapLinearAttention(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType qt, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(ir::TensorType kt, ctx.inputType(1));
  KILN_ASSIGN_OR_RETURN(ir::TensorType vt, ctx.inputType(2));
  KILN_ASSIGN_OR_RETURN(std::string rule, ctx.attrString("update_rule", "gated_delta"));
  if (rule != "linear" && rule != "gated" && rule != "delta" && rule != "gated_delta")
    return ctx.invalid("update_rule must be linear, gated, delta or gated_delta, got '" + rule +
                       "'");
  const bool gated = rule == "gated" || rule == "gated_delta";
  const bool delta = rule == "delta" || rule == "gated_delta";
  KILN_ASSIGN_OR_RETURN(int64_t hq, ctx.attrInt("q_num_heads"));
  KILN_ASSIGN_OR_RETURN(int64_t hkv, ctx.attrInt("kv_num_heads"));
  KILN_ASSIGN_OR_RETURN(double scale, ctx.attrFloat("scale", 0.0));
  if (!ir::isFloat(qt.dtype) || qt.rank() != 3 || kt.rank() != 3 || vt.rank() != 3 ||
      kt.dtype != qt.dtype || vt.dtype != qt.dtype)
    return ctx.invalid("query " + qt.toString() + ", key " + kt.toString() + " and value " +
                       vt.toString() + " must be [B, T, heads * dim] of one float type");
  if (hq <= 0 || hkv <= 0 || hq % hkv != 0 || qt.shape[2] % hq != 0 || vt.shape[2] % hkv != 0 ||
      kt.shape[2] != qt.shape[2] / hq * hkv)
    return ctx.invalid("q_num_heads " + std::to_string(hq) + " and kv_num_heads " +
                       std::to_string(hkv) + " do not divide query " + qt.toString() + ", key " +
                       kt.toString() + " and value " + vt.toString());
  if (gated != ctx.hasInput(4) || delta != ctx.hasInput(5))
    return ctx.invalid("update_rule '" + rule + "' " + (gated ? "needs" : "takes no") +
                       " decay and " + (delta ? "needs" : "takes no") + " beta");
  const int64_t b = qt.shape[0], t = qt.shape[1], dk = qt.shape[2] / hq, dv = vt.shape[2] / hkv;
  const int64_t group = hq / hkv;
  if (kt.shape[0] != b || kt.shape[1] != t || vt.shape[0] != b || vt.shape[1] != t)
    return ctx.invalid("query, key and value must share B and T");
  if (t > 4096)
    return ctx.unsupported("a sequence of " + std::to_string(t) +
                           " steps (kiln unrolls the recurrence; at most 4096)");
  const Shape stateShape{b, hkv, dk, dv};
  const DType f32 = DType::kF32;
  auto emit = [&](OpKind k, std::vector<Value*> in, ir::AttrMap a = {}) {
    return ctx.emit(k, std::move(in), std::move(a));
  };
  auto widen = [&](Value* v) -> Expected<Value*> {
    if (v->type().dtype == f32) return v;
    return emit(OpKind::kCast, {v}, {{"to", std::string("f32")}});
  };
  // [B, T, H * D] -> [B, H, T, D] in f32.
  auto heads = [&](size_t i, int64_t h) -> Expected<Value*> {
    KILN_ASSIGN_OR_RETURN(Value * v, ctx.value(i));
    KILN_ASSIGN_OR_RETURN(v, widen(v));
    const int64_t d = v->type().shape[2] / h;
    KILN_ASSIGN_OR_RETURN(v, emit(OpKind::kReshape, {v}, {{"shape", Shape{b, t, h, d}}}));
    return emit(OpKind::kTranspose, {v}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  };
  KILN_ASSIGN_OR_RETURN(Value * q, heads(0, hq));
  KILN_ASSIGN_OR_RETURN(Value * k, heads(1, hkv));
  KILN_ASSIGN_OR_RETURN(Value * v, heads(2, hkv));
  Value* decay = nullptr;  // [B, H_kv, T, 1 or d_k]
  if (gated) {
    KILN_ASSIGN_OR_RETURN(ir::TensorType gt, ctx.inputType(4));
    if (gt.rank() != 3 || gt.shape[0] != b || gt.shape[1] != t ||
        (gt.shape[2] != hkv && gt.shape[2] != hkv * dk))
      return ctx.invalid("decay " + gt.toString() + " must be [B, T, kv_num_heads] or [B, T, " +
                         "kv_num_heads * d_k]");
    KILN_ASSIGN_OR_RETURN(decay, heads(4, hkv));
  }
  Value* beta = nullptr;  // [B, H_kv or 1, T, 1]
  if (delta) {
    KILN_ASSIGN_OR_RETURN(ir::TensorType bt, ctx.inputType(5));
    if (bt.rank() != 3 || bt.shape[0] != b || bt.shape[1] != t ||
        (bt.shape[2] != hkv && bt.shape[2] != 1))
      return ctx.invalid("beta " + bt.toString() + " must be [B, T, kv_num_heads] or [B, T, 1]");
    KILN_ASSIGN_OR_RETURN(beta, heads(5, bt.shape[2]));
  }
  Value* state = nullptr;  // Null while zero.
  DType stateType = qt.dtype;
  if (ctx.hasInput(3)) {
    KILN_ASSIGN_OR_RETURN(ir::TensorType st, ctx.inputType(3));
    if (st.shape != stateShape || !ir::isFloat(st.dtype))
      return ctx.invalid("past_state " + st.toString() + " must be [B, kv_num_heads, d_k, d_v] " +
                         ir::shapeToString(stateShape));
    stateType = st.dtype;
    KILN_ASSIGN_OR_RETURN(state, ctx.value(3, /*trainable=*/false));
    KILN_ASSIGN_OR_RETURN(state, widen(state));
  }
  const double scaleValue = scale == 0.0 ? 1.0 / std::sqrt(static_cast<double>(dk)) : scale;
  KILN_ASSIGN_OR_RETURN(Value * scaleV, ctx.constantValue(filledTensor(f32, {}, scaleValue)));
  auto step = [&](Value* x, int64_t i) -> Expected<Value*> {  // [B, H, 1, D]
    return emit(OpKind::kSlice, {x},
                {{"starts", std::vector<int64_t>{i}},
                 {"ends", std::vector<int64_t>{i + 1}},
                 {"axes", std::vector<int64_t>{2}}});
  };
  const ir::AttrMap swapLast{{"perm", std::vector<int64_t>{0, 1, 3, 2}}};
  std::vector<Value*> outs;
  for (int64_t i = 0; i < t; ++i) {
    KILN_ASSIGN_OR_RETURN(Value * kI, step(k, i));  // [B, H_kv, 1, d_k]
    KILN_ASSIGN_OR_RETURN(Value * vI, step(v, i));  // [B, H_kv, 1, d_v]
    if (gated && state) {
      KILN_ASSIGN_OR_RETURN(Value * g, step(decay, i));  // [B, H_kv, 1, 1 or d_k]
      KILN_ASSIGN_OR_RETURN(g, emit(OpKind::kExp, {g}));
      KILN_ASSIGN_OR_RETURN(g, emit(OpKind::kTranspose, {g}, swapLast));  // [.., 1 or d_k, 1]
      KILN_ASSIGN_OR_RETURN(state, emit(OpKind::kMul, {state, g}));
    }
    if (delta) {
      if (state) {
        KILN_ASSIGN_OR_RETURN(Value * got, emit(OpKind::kMatMul, {kI, state}));  // k^T S
        KILN_ASSIGN_OR_RETURN(vI, emit(OpKind::kSub, {vI, got}));
      }
      KILN_ASSIGN_OR_RETURN(Value * bI, step(beta, i));
      KILN_ASSIGN_OR_RETURN(vI, emit(OpKind::kMul, {bI, vI}));
    }
    KILN_ASSIGN_OR_RETURN(Value * kCol, emit(OpKind::kTranspose, {kI}, swapLast));
    KILN_ASSIGN_OR_RETURN(Value * outer, emit(OpKind::kMul, {kCol, vI}));  // [.., d_k, d_v]
    if (state) {
      KILN_ASSIGN_OR_RETURN(state, emit(OpKind::kAdd, {state, outer}));
    } else {
      state = outer;
    }
    // Query heads grouped by their KV head: [B, H_kv, group, d_k] x S -> [B, H_kv, group, d_v].
    KILN_ASSIGN_OR_RETURN(Value * qI, step(q, i));  // [B, H_q, 1, d_k]
    KILN_ASSIGN_OR_RETURN(qI, emit(OpKind::kReshape, {qI}, {{"shape", Shape{b, hkv, group, dk}}}));
    KILN_ASSIGN_OR_RETURN(Value * o, emit(OpKind::kMatMul, {qI, state}));
    KILN_ASSIGN_OR_RETURN(o, emit(OpKind::kMul, {o, scaleV}));
    KILN_ASSIGN_OR_RETURN(o, emit(OpKind::kReshape, {o}, {{"shape", Shape{b, hq, 1, dv}}}));
    outs.push_back(o);
  }
  KILN_ASSIGN_OR_RETURN(Value * o, outs.size() == 1
                                       ? Expected<Value*>(outs[0])
                                       : emit(OpKind::kConcat, outs, {{"axis", int64_t{2}}}));
  KILN_ASSIGN_OR_RETURN(
      o, emit(OpKind::kTranspose, {o}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}}));
  KILN_ASSIGN_OR_RETURN(o, emit(OpKind::kReshape, {o}, {{"shape", Shape{b, t, hq * dv}}}));
  if (qt.dtype != f32) {
    KILN_ASSIGN_OR_RETURN(o,
                          emit(OpKind::kCast, {o}, {{"to", std::string(ir::dtypeName(qt.dtype))}}));
  }
  ctx.setOutput(0, o);
  if (ctx.outputUsed(1)) {
    if (stateType != f32) {
      KILN_ASSIGN_OR_RETURN(
          state, emit(OpKind::kCast, {state}, {{"to", std::string(ir::dtypeName(stateType))}}));
    }
    ctx.setOutput(1, state);
  }
  return Status::ok();
}

}  // namespace

std::vector<MapperEntry> attentionMappers() {
  return {{"Attention", {23, 24, 25}, mapAttention}, {"LinearAttention", {27}, mapLinearAttention}};
}

}  // namespace kiln::frontends::onnx_import
