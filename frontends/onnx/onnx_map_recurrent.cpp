// ONNX's recurrent layers (RNN, GRU, LSTM) composed from kiln's ops, the recurrence unrolled
// over the (static) sequence length. Each direction first projects the whole sequence at once,
// X W^T + biases: one [T*B, I] x [I, gates*H] matmul, as cuDNN and ONNX Runtime do; each step
// then adds H_{t-1} R^T and applies the gates' activations, which fusion merges into a few
// kernels per step. ONNX Runtime's semantics where the specification is silent: `clip` bounds
// every gate's input to its activation (not the cell state before h); activation_alpha/beta are
// consumed in order by the activations that take them, the others' defaults being the ONNX
// operators'; with sequence_lens, steps at or past a sequence's length leave its state as it
// was and write zeros to Y (a reverse direction thus starts at its sequence's last element),
// and a sequence of length 0 has Y_h and Y_c 0. LSTM's input_forget couples the gates as
// ONNX Runtime does, f = 1 - i.
#include <algorithm>
#include <cctype>
#include <optional>
#include <string>
#include <vector>

#include "frontends/onnx/onnx_fold.h"
#include "frontends/onnx/onnx_map_util.h"
#include "frontends/onnx/onnx_tensor.h"

namespace kiln::frontends::onnx_import {

namespace {

using ir::OpKind;

enum class Cell { kRnn, kGru, kLstm };

constexpr int64_t kMaxSteps = 4096;  // Steps unrolled per direction.

constexpr int64_t numGates(Cell c) {
  return c == Cell::kRnn ? 1 : c == Cell::kGru ? 3 : 4;
}

// Activations per direction: RNN f; GRU f, g; LSTM f, g, h.
constexpr size_t numActivations(Cell c) {
  return c == Cell::kRnn ? 1 : c == Cell::kGru ? 2 : 3;
}

struct Activation {
  std::string name;  // Lower case.
  double alpha = 0, beta = 0;
};

// The activations of every direction, with their alpha and beta.
Expected<std::vector<Activation>> readActivations(NodeContext& ctx, Cell cell, int64_t dirs) {
  std::vector<std::string> defaults;
  for (int64_t d = 0; d < dirs; ++d) {
    if (cell == Cell::kRnn) defaults.push_back("Tanh");
    if (cell == Cell::kGru) defaults.insert(defaults.end(), {"Sigmoid", "Tanh"});
    if (cell == Cell::kLstm) defaults.insert(defaults.end(), {"Sigmoid", "Tanh", "Tanh"});
  }
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> names, ctx.attrStrings("activations", defaults));
  if (names.size() != defaults.size())
    return ctx.invalid("activations lists " + std::to_string(names.size()) + " functions; " +
                       ctx.opType() + " with " + std::to_string(dirs) + " direction(s) takes " +
                       std::to_string(defaults.size()));
  std::vector<double> alphas, betas;
  if (ctx.hasAttr("activation_alpha")) {
    KILN_ASSIGN_OR_RETURN(alphas, ctx.attrFloats("activation_alpha"));
  }
  if (ctx.hasAttr("activation_beta")) {
    KILN_ASSIGN_OR_RETURN(betas, ctx.attrFloats("activation_beta"));
  }
  // Which of alpha and beta each function takes, and their defaults (the ONNX operators'; none
  // for Affine and ScaledTanh, which have no operator).
  struct Takes {
    const char* name;
    bool alpha, beta;
    std::optional<double> alphaDefault, betaDefault;
  };
  static const Takes kTable[] = {
      {"relu", false, false, {}, {}},
      {"tanh", false, false, {}, {}},
      {"sigmoid", false, false, {}, {}},
      {"softsign", false, false, {}, {}},
      {"softplus", false, false, {}, {}},
      {"affine", true, true, {}, {}},
      {"scaledtanh", true, true, {}, {}},
      {"leakyrelu", true, false, 0.01, {}},
      {"thresholdedrelu", true, false, 1.0, {}},
      {"elu", true, false, 1.0, {}},
      {"hardsigmoid", true, true, 0.2, 0.5},
  };
  size_t nextAlpha = 0, nextBeta = 0;
  std::vector<Activation> out;
  for (const std::string& given : names) {
    Activation a;
    for (char c : given) a.name += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const Takes* t = nullptr;
    for (const Takes& row : kTable)
      if (a.name == row.name) t = &row;
    if (!t)
      return ctx.unsupported(
          "activation '" + given +
          "' (ONNX's are Relu, Tanh, Sigmoid, Affine, LeakyRelu, ThresholdedRelu, ScaledTanh, "
          "HardSigmoid, Elu, Softsign and Softplus)");
    auto take = [&](bool takes, const std::vector<double>& values, size_t& next,
                    const std::optional<double>& def, double& v, const char* what) -> Status {
      if (!takes) return Status::ok();
      if (next < values.size()) {
        v = values[next++];
        return Status::ok();
      }
      if (!def)
        return ctx.invalid("activation '" + given + "' needs its " + what + " from activation_" +
                           what + " (ONNX gives it no default)");
      v = *def;
      return Status::ok();
    };
    KILN_TRY(take(t->alpha, alphas, nextAlpha, t->alphaDefault, a.alpha, "alpha"));
    KILN_TRY(take(t->beta, betas, nextBeta, t->betaDefault, a.beta, "beta"));
    out.push_back(std::move(a));
  }
  if (nextAlpha != alphas.size() || nextBeta != betas.size())
    return ctx.invalid("activation_alpha holds " + std::to_string(alphas.size()) +
                       " values and activation_beta " + std::to_string(betas.size()) +
                       "; the activations take " + std::to_string(nextAlpha) + " and " +
                       std::to_string(nextBeta));
  return out;
}

// Emits kiln ops for one ONNX recurrent layer.
class Unroller {
 public:
  Unroller(NodeContext& ctx, Cell cell, ir::DType dtype) : ctx_(ctx), cell_(cell), dt_(dtype) {}

  Expected<ir::Value*> op(OpKind k, std::vector<ir::Value*> in, ir::AttrMap attrs = {}) {
    return ctx_.emit(k, std::move(in), std::move(attrs));
  }
  Expected<ir::Value*> scalar(double v) { return scalarConstant(ctx_, dt_, v); }
  // v[start:end] along `axis`.
  Expected<ir::Value*> slice(ir::Value* v, int64_t axis, int64_t start, int64_t end) {
    return op(OpKind::kSlice, {v},
              {{"starts", std::vector<int64_t>{start}},
               {"ends", std::vector<int64_t>{end}},
               {"axes", std::vector<int64_t>{axis}}});
  }
  // v[i] along `axis`, that dim removed.
  Expected<ir::Value*> pick(ir::Value* v, int64_t axis, int64_t i) {
    KILN_ASSIGN_OR_RETURN(ir::Value * s, slice(v, axis, i, i + 1));
    return op(OpKind::kSqueeze, {s}, {{"axes", std::vector<int64_t>{axis}}});
  }
  Expected<ir::Value*> unsqueeze(ir::Value* v, int64_t axis) {
    return op(OpKind::kUnsqueeze, {v}, {{"axes", std::vector<int64_t>{axis}}});
  }
  // a + b where either may be absent (a zero).
  Expected<ir::Value*> add(ir::Value* a, ir::Value* b) {
    if (!a) return b;
    if (!b) return a;
    return op(OpKind::kAdd, {a, b});
  }
  Expected<ir::Value*> mul(ir::Value* a, ir::Value* b) { return op(OpKind::kMul, {a, b}); }

  // f(clip(x)).
  Expected<ir::Value*> activate(const Activation& a, ir::Value* x) {
    if (clip_) {
      KILN_ASSIGN_OR_RETURN(x, op(OpKind::kClip, {x}, {{"min", -*clip_}, {"max", *clip_}}));
    }
    const std::string& n = a.name;
    if (n == "relu") return op(OpKind::kRelu, {x});
    if (n == "tanh") return op(OpKind::kTanh, {x});
    if (n == "sigmoid") return op(OpKind::kSigmoid, {x});
    if (n == "softplus") return op(OpKind::kSoftplus, {x});
    if (n == "leakyrelu") return op(OpKind::kLeakyRelu, {x}, {{"alpha", a.alpha}});
    if (n == "thresholdedrelu") return op(OpKind::kThresholdedRelu, {x}, {{"alpha", a.alpha}});
    if (n == "elu") return op(OpKind::kElu, {x}, {{"alpha", a.alpha}});
    if (n == "softsign") {
      KILN_ASSIGN_OR_RETURN(ir::Value * one, scalar(1.0));
      KILN_ASSIGN_OR_RETURN(ir::Value * ax, op(OpKind::kAbs, {x}));
      KILN_ASSIGN_OR_RETURN(ir::Value * d, op(OpKind::kAdd, {one, ax}));
      return op(OpKind::kDiv, {x, d});
    }
    if (n == "hardsigmoid" || n == "affine") {
      KILN_ASSIGN_OR_RETURN(ir::Value * al, scalar(a.alpha));
      KILN_ASSIGN_OR_RETURN(ir::Value * be, scalar(a.beta));
      KILN_ASSIGN_OR_RETURN(ir::Value * ax, mul(x, al));
      KILN_ASSIGN_OR_RETURN(ir::Value * y, op(OpKind::kAdd, {ax, be}));
      if (n == "affine") return y;
      return op(OpKind::kClip, {y}, {{"min", 0.0}, {"max", 1.0}});
    }
    // scaledtanh: alpha tanh(beta x).
    KILN_ASSIGN_OR_RETURN(ir::Value * al, scalar(a.alpha));
    KILN_ASSIGN_OR_RETURN(ir::Value * be, scalar(a.beta));
    KILN_ASSIGN_OR_RETURN(ir::Value * bx, mul(x, be));
    KILN_ASSIGN_OR_RETURN(ir::Value * t, op(OpKind::kTanh, {bx}));
    return mul(t, al);
  }

  // Reads the node and emits it.
  Status run();

 private:
  struct Direction {
    bool reverse = false;
    ir::Value* xw = nullptr;          // [T, B, gates*H]: X W^T plus the biases summed into it.
    ir::Value* rT = nullptr;          // [H, gates*H] (GRU without linear_before_reset: z and r).
    ir::Value* rhT = nullptr;         // GRU without linear_before_reset: [H, H], h's.
    ir::Value* rbh = nullptr;         // GRU with linear_before_reset: h's recurrence bias [H].
    ir::Value* peep[3] = {};          // LSTM: P's i, o, f, each [H].
    ir::Value* h = nullptr;           // The state, [B, H]; null while zero.
    ir::Value* c = nullptr;           // LSTM's cell.
    std::vector<ir::Value*> ys;       // Each step's output, in time order.
    const Activation* act = nullptr;  // This direction's f (g, h follow).
  };

  Status prepare(Direction& d, int64_t index, ir::Value* x, ir::Value* w, ir::Value* r,
                 ir::Value* b, ir::Value* p);
  Status step(Direction& d, int64_t t);

  NodeContext& ctx_;
  Cell cell_;
  ir::DType dt_;
  std::optional<double> clip_;
  bool linearBeforeReset_ = false, inputForget_ = false;
  int64_t hidden_ = 0;
  ir::Value* lens_ = nullptr;  // sequence_lens as i64 [B, 1], when it can cut a sequence.
};

Status Unroller::prepare(Direction& d, int64_t index, ir::Value* x, ir::Value* w, ir::Value* r,
                         ir::Value* b, ir::Value* p) {
  const int64_t H = hidden_, G = numGates(cell_);
  const ir::AttrMap swap{{"perm", std::vector<int64_t>{1, 0}}};
  KILN_ASSIGN_OR_RETURN(ir::Value * wd, pick(w, 0, index));
  KILN_ASSIGN_OR_RETURN(ir::Value * wT, op(OpKind::kTranspose, {wd}, swap));
  KILN_ASSIGN_OR_RETURN(d.xw, op(OpKind::kMatMul, {x, wT}));
  KILN_ASSIGN_OR_RETURN(ir::Value * rd, pick(r, 0, index));
  const bool splitR = cell_ == Cell::kGru && !linearBeforeReset_;
  if (splitR) {
    KILN_ASSIGN_OR_RETURN(ir::Value * rzr, slice(rd, 0, 0, 2 * H));
    KILN_ASSIGN_OR_RETURN(ir::Value * rh, slice(rd, 0, 2 * H, 3 * H));
    KILN_ASSIGN_OR_RETURN(d.rT, op(OpKind::kTranspose, {rzr}, swap));
    KILN_ASSIGN_OR_RETURN(d.rhT, op(OpKind::kTranspose, {rh}, swap));
  } else {
    KILN_ASSIGN_OR_RETURN(d.rT, op(OpKind::kTranspose, {rd}, swap));
  }
  if (b) {
    KILN_ASSIGN_OR_RETURN(ir::Value * bd, pick(b, 0, index));
    KILN_ASSIGN_OR_RETURN(ir::Value * wb, slice(bd, 0, 0, G * H));
    KILN_ASSIGN_OR_RETURN(ir::Value * rb, slice(bd, 0, G * H, 2 * G * H));
    if (cell_ == Cell::kGru && linearBeforeReset_) {
      // h's recurrence bias is added to H R_h^T before the reset gate scales it; z's and r's
      // join the input's.
      KILN_ASSIGN_OR_RETURN(d.rbh, slice(rb, 0, 2 * H, 3 * H));
      KILN_ASSIGN_OR_RETURN(rb, slice(rb, 0, 0, 2 * H));
      KILN_ASSIGN_OR_RETURN(ir::Value * zero, ctx_.constantValue(filledTensor(dt_, {H}, 0.0)));
      KILN_ASSIGN_OR_RETURN(rb, op(OpKind::kConcat, {rb, zero}, {{"axis", int64_t{0}}}));
    }
    KILN_ASSIGN_OR_RETURN(ir::Value * bias, op(OpKind::kAdd, {wb, rb}));
    KILN_ASSIGN_OR_RETURN(d.xw, op(OpKind::kAdd, {d.xw, bias}));
  }
  if (p) {
    KILN_ASSIGN_OR_RETURN(ir::Value * pd, pick(p, 0, index));
    for (int64_t k = 0; k < 3; ++k) {
      KILN_ASSIGN_OR_RETURN(d.peep[k], slice(pd, 0, k * H, (k + 1) * H));
    }
  }
  return Status::ok();
}

Status Unroller::step(Direction& d, int64_t t) {
  const int64_t H = hidden_;
  const Activation* f = d.act;
  KILN_ASSIGN_OR_RETURN(ir::Value * x, pick(d.xw, 0, t));  // [B, gates*H]
  ir::Value* hr = nullptr;                                 // H_{t-1} R^T
  if (d.h) {
    KILN_ASSIGN_OR_RETURN(hr, op(OpKind::kMatMul, {d.h, d.rT}));
  }
  auto gate = [&](ir::Value* v, int64_t k) { return slice(v, 1, k * H, (k + 1) * H); };
  ir::Value* h = nullptr;  // H_t
  ir::Value* c = nullptr;  // C_t
  switch (cell_) {
    case Cell::kRnn: {
      KILN_ASSIGN_OR_RETURN(ir::Value * pre, add(x, hr));
      KILN_ASSIGN_OR_RETURN(h, activate(f[0], pre));
      break;
    }
    case Cell::kGru: {
      // hr holds z's and r's recurrences, and h's with linear_before_reset.
      ir::Value* pre[2];
      for (int64_t k = 0; k < 2; ++k) {
        KILN_ASSIGN_OR_RETURN(ir::Value * xk, gate(x, k));
        ir::Value* rk = nullptr;
        if (hr) {
          KILN_ASSIGN_OR_RETURN(rk, gate(hr, k));
        }
        KILN_ASSIGN_OR_RETURN(pre[k], add(xk, rk));
      }
      KILN_ASSIGN_OR_RETURN(ir::Value * z, activate(f[0], pre[0]));
      KILN_ASSIGN_OR_RETURN(ir::Value * r, activate(f[0], pre[1]));
      KILN_ASSIGN_OR_RETURN(ir::Value * xh, gate(x, 2));
      ir::Value* rec = nullptr;  // h's recurrence term
      if (linearBeforeReset_) {
        // r * (H R_h^T + Rb_h)
        ir::Value* hh = nullptr;
        if (hr) {
          KILN_ASSIGN_OR_RETURN(hh, gate(hr, 2));
        }
        KILN_ASSIGN_OR_RETURN(hh, add(hh, d.rbh));
        if (hh) {
          KILN_ASSIGN_OR_RETURN(rec, mul(r, hh));
        }
      } else if (d.h) {
        // (r * H) R_h^T
        KILN_ASSIGN_OR_RETURN(ir::Value * rh, mul(r, d.h));
        KILN_ASSIGN_OR_RETURN(rec, op(OpKind::kMatMul, {rh, d.rhT}));
      }
      KILN_ASSIGN_OR_RETURN(ir::Value * preH, add(xh, rec));
      KILN_ASSIGN_OR_RETURN(ir::Value * hCand, activate(f[1], preH));
      // H_t = (1 - z) * h~ + z * H_{t-1}
      KILN_ASSIGN_OR_RETURN(ir::Value * one, scalar(1.0));
      KILN_ASSIGN_OR_RETURN(ir::Value * oneMinusZ, op(OpKind::kSub, {one, z}));
      KILN_ASSIGN_OR_RETURN(h, mul(oneMinusZ, hCand));
      if (d.h) {
        KILN_ASSIGN_OR_RETURN(ir::Value * zh, mul(z, d.h));
        KILN_ASSIGN_OR_RETURN(h, add(h, zh));
      }
      break;
    }
    case Cell::kLstm: {
      KILN_ASSIGN_OR_RETURN(ir::Value * pre, add(x, hr));
      // Gate order i, o, f, c; peepholes i, o, f.
      auto peephole = [&](ir::Value* v, int64_t k, ir::Value* state) -> Expected<ir::Value*> {
        if (!d.peep[k] || !state) return v;
        KILN_ASSIGN_OR_RETURN(ir::Value * pc, mul(d.peep[k], state));
        return add(v, pc);
      };
      KILN_ASSIGN_OR_RETURN(ir::Value * preI, gate(pre, 0));
      KILN_ASSIGN_OR_RETURN(preI, peephole(preI, 0, d.c));
      KILN_ASSIGN_OR_RETURN(ir::Value * i, activate(f[0], preI));
      ir::Value* fg = nullptr;
      if (inputForget_) {
        KILN_ASSIGN_OR_RETURN(ir::Value * one, scalar(1.0));
        KILN_ASSIGN_OR_RETURN(fg, op(OpKind::kSub, {one, i}));
      } else {
        KILN_ASSIGN_OR_RETURN(ir::Value * preF, gate(pre, 2));
        KILN_ASSIGN_OR_RETURN(preF, peephole(preF, 2, d.c));
        KILN_ASSIGN_OR_RETURN(fg, activate(f[0], preF));
      }
      KILN_ASSIGN_OR_RETURN(ir::Value * preC, gate(pre, 3));
      KILN_ASSIGN_OR_RETURN(ir::Value * cand, activate(f[1], preC));
      KILN_ASSIGN_OR_RETURN(c, mul(i, cand));
      if (d.c) {
        KILN_ASSIGN_OR_RETURN(ir::Value * kept, mul(fg, d.c));
        KILN_ASSIGN_OR_RETURN(c, add(kept, c));
      }
      KILN_ASSIGN_OR_RETURN(ir::Value * preO, gate(pre, 1));
      KILN_ASSIGN_OR_RETURN(preO, peephole(preO, 1, c));
      KILN_ASSIGN_OR_RETURN(ir::Value * o, activate(f[0], preO));
      // h(C_t) without the clip: ONNX Runtime bounds only the gates' inputs.
      const std::optional<double> clip = clip_;
      clip_.reset();
      auto hc = activate(f[2], c);
      clip_ = clip;
      if (!hc) return hc.status();
      KILN_ASSIGN_OR_RETURN(h, mul(o, *hc));
      break;
    }
  }
  ir::Value* y = h;
  if (lens_) {
    // Step t counts for the sequences longer than t; the others keep their state, and Y is 0.
    ir::TensorData tData(ir::DType::kI64, {});
    *tData.as<int64_t>() = t;
    KILN_ASSIGN_OR_RETURN(ir::Value * tv, ctx_.constantValue(std::move(tData)));
    KILN_ASSIGN_OR_RETURN(ir::Value * live, op(OpKind::kLess, {tv, lens_}));
    KILN_ASSIGN_OR_RETURN(ir::Value * zero, scalar(0.0));
    KILN_ASSIGN_OR_RETURN(y, op(OpKind::kWhere, {live, h, zero}));
    KILN_ASSIGN_OR_RETURN(h, op(OpKind::kWhere, {live, h, d.h ? d.h : zero}));
    if (c) {
      KILN_ASSIGN_OR_RETURN(c, op(OpKind::kWhere, {live, c, d.c ? d.c : zero}));
    }
  }
  d.h = h;
  d.c = c;
  d.ys[static_cast<size_t>(t)] = y;
  return Status::ok();
}

Status Unroller::run() {
  NodeContext& ctx = ctx_;
  const std::string& op = ctx.opType();
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  KILN_ASSIGN_OR_RETURN(ir::TensorType wt, ctx.inputType(1));
  KILN_ASSIGN_OR_RETURN(ir::TensorType rt, ctx.inputType(2));
  int64_t layout = 0;
  if (ctx.version() >= 14) {
    KILN_ASSIGN_OR_RETURN(layout, ctx.attrInt("layout", 0));
    if (layout != 0 && layout != 1)
      return ctx.invalid("layout must be 0 or 1, got " + std::to_string(layout));
  }
  KILN_ASSIGN_OR_RETURN(std::string direction, ctx.attrString("direction", "forward"));
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional")
    return ctx.invalid("direction must be forward, reverse or bidirectional, got '" + direction +
                       "'");
  const int64_t dirs = direction == "bidirectional" ? 2 : 1;
  if (xt.rank() != 3 || wt.rank() != 3 || rt.rank() != 3)
    return ctx.invalid("X " + xt.toString() + ", W " + wt.toString() + " and R " + rt.toString() +
                       " must have rank 3");
  const int64_t T = xt.shape[layout == 0 ? 0 : 1], B = xt.shape[layout == 0 ? 1 : 0];
  const int64_t I = xt.shape[2], G = numGates(cell_);
  const int64_t H = rt.shape[2];
  if (ctx.hasAttr("hidden_size")) {
    KILN_ASSIGN_OR_RETURN(int64_t hs, ctx.attrInt("hidden_size"));
    if (hs != H)
      return ctx.invalid("hidden_size " + std::to_string(hs) + " differs from R " + rt.toString() +
                         "'s " + std::to_string(H));
  }
  hidden_ = H;
  const ir::Shape wantW{dirs, G * H, I}, wantR{dirs, G * H, H};
  if (wt.shape != wantW || rt.shape != wantR || wt.dtype != xt.dtype || rt.dtype != xt.dtype)
    return ctx.invalid("W " + wt.toString() + " and R " + rt.toString() + " must be " +
                       ir::TensorType{xt.dtype, wantW}.toString() + " and " +
                       ir::TensorType{xt.dtype, wantR}.toString() + " for X " + xt.toString() +
                       ", " + std::to_string(dirs) + " direction(s) and hidden size " +
                       std::to_string(H));
  if (T == 0) return ctx.unsupported("an empty sequence (X " + xt.toString() + ")");
  if (T > kMaxSteps)
    return ctx.unsupported("a sequence of " + std::to_string(T) + " steps (kiln unrolls the " +
                           "recurrence; at most " + std::to_string(kMaxSteps) + ")");
  // Each input's expected type, checked where it is given.
  auto check = [&](size_t i, const char* name, ir::Shape want) -> Status {
    if (!ctx.hasInput(i)) return Status::ok();
    KILN_ASSIGN_OR_RETURN(ir::TensorType t, ctx.inputType(i));
    const ir::TensorType expect{i == 4 ? t.dtype : xt.dtype, std::move(want)};
    if (t != expect || (i == 4 && t.dtype != ir::DType::kI32 && t.dtype != ir::DType::kI64))
      return ctx.invalid(std::string(name) + " is " + t.toString() + ", expected " +
                         (i == 4 ? "i32" + ir::shapeToString(expect.shape) : expect.toString()));
    return Status::ok();
  };
  const ir::Shape stateShape = layout == 0 ? ir::Shape{dirs, B, H} : ir::Shape{B, dirs, H};
  KILN_TRY(check(3, "B", {dirs, 2 * G * H}));
  KILN_TRY(check(4, "sequence_lens", {B}));
  KILN_TRY(check(5, "initial_h", stateShape));
  if (cell_ == Cell::kLstm) {
    KILN_TRY(check(6, "initial_c", stateShape));
    KILN_TRY(check(7, "P", {dirs, 3 * H}));
  }
  KILN_TRY(floatInput(ctx).status());
  if (ctx.hasAttr("clip")) {
    KILN_ASSIGN_OR_RETURN(double clip, ctx.attrFloat("clip"));
    if (!(clip > 0)) return ctx.invalid("clip must be positive, got " + std::to_string(clip));
    clip_ = clip;
  }
  if (cell_ == Cell::kGru) {
    KILN_ASSIGN_OR_RETURN(linearBeforeReset_, ctx.attrBool("linear_before_reset", false));
  }
  if (cell_ == Cell::kLstm) {
    KILN_ASSIGN_OR_RETURN(inputForget_, ctx.attrBool("input_forget", false));
  }
  KILN_ASSIGN_OR_RETURN(std::vector<Activation> acts, readActivations(ctx, cell_, dirs));

  // X, initial states time-major / direction-major.
  KILN_ASSIGN_OR_RETURN(ir::Value * x, ctx.value(0));
  if (layout == 1) {
    KILN_ASSIGN_OR_RETURN(
        x, this->op(OpKind::kTranspose, {x}, {{"perm", std::vector<int64_t>{1, 0, 2}}}));
  }
  auto stateInput = [&](size_t i) -> Expected<ir::Value*> {
    if (!ctx.hasInput(i)) return nullptr;
    KILN_ASSIGN_OR_RETURN(ir::Value * v, ctx.value(i));
    if (layout == 1)
      return this->op(OpKind::kTranspose, {v}, {{"perm", std::vector<int64_t>{1, 0, 2}}});
    return v;
  };
  KILN_ASSIGN_OR_RETURN(ir::Value * h0, stateInput(5));
  ir::Value* c0 = nullptr;
  if (cell_ == Cell::kLstm) {
    KILN_ASSIGN_OR_RETURN(c0, stateInput(6));
  }
  // sequence_lens: masks only where some length may be below T (a constant all T needs none).
  ir::Value* lensFlat = nullptr;
  if (ctx.hasInput(4)) {
    KILN_ASSIGN_OR_RETURN(const ir::TensorData* known, ctx.constant(4));
    bool full = false;
    if (known) {
      const ir::TensorData* k = known;
      full = true;
      for (int64_t b = 0; b < B; ++b) {
        const int64_t len =
            k->dtype() == ir::DType::kI32 ? k->as<int32_t>()[b] : k->as<int64_t>()[b];
        if (len < 0 || len > T)
          return ctx.invalid("sequence_lens[" + std::to_string(b) + "] is " + std::to_string(len) +
                             ", outside 0.." + std::to_string(T));
        full &= len == T;
      }
    }
    if (!full) {
      KILN_ASSIGN_OR_RETURN(ir::Value * lens, ctx.value(4, /*trainable=*/false));
      if (lens->type().dtype != ir::DType::kI64) {
        KILN_ASSIGN_OR_RETURN(lens, this->op(OpKind::kCast, {lens}, {{"to", std::string("i64")}}));
      }
      lensFlat = lens;
      KILN_ASSIGN_OR_RETURN(lens_, unsqueeze(lens, 1));  // [B, 1]
    }
  }
  ir::Value* w = nullptr;
  ir::Value* r = nullptr;
  ir::Value* b = nullptr;
  ir::Value* p = nullptr;
  KILN_ASSIGN_OR_RETURN(w, ctx.value(1));
  KILN_ASSIGN_OR_RETURN(r, ctx.value(2));
  if (ctx.hasInput(3)) {
    KILN_ASSIGN_OR_RETURN(b, ctx.value(3));
  }
  if (cell_ == Cell::kLstm && ctx.hasInput(7)) {
    KILN_ASSIGN_OR_RETURN(p, ctx.value(7));
  }

  std::vector<Direction> ds(static_cast<size_t>(dirs));
  for (int64_t di = 0; di < dirs; ++di) {
    Direction& d = ds[static_cast<size_t>(di)];
    d.reverse = direction == "reverse" || di == 1;
    d.act = &acts[static_cast<size_t>(di) * numActivations(cell_)];
    d.ys.resize(static_cast<size_t>(T));
    KILN_TRY(prepare(d, di, x, w, r, b, p));
    if (h0) {
      KILN_ASSIGN_OR_RETURN(d.h, pick(h0, 0, di));
    }
    if (c0) {
      KILN_ASSIGN_OR_RETURN(d.c, pick(c0, 0, di));
    }
    for (int64_t k = 0; k < T; ++k) KILN_TRY(step(d, d.reverse ? T - 1 - k : k));
  }

  // Outputs. Y: [T, D, B, H] (layout 1: [B, T, D, H]); Y_h, Y_c: [D, B, H] ([B, D, H]).
  if (ctx.outputUsed(0)) {
    std::vector<ir::Value*> perDir;
    for (Direction& d : ds) {
      std::vector<ir::Value*> steps;
      for (ir::Value* y : d.ys) {
        KILN_ASSIGN_OR_RETURN(ir::Value * y1, unsqueeze(y, 0));
        steps.push_back(y1);
      }
      KILN_ASSIGN_OR_RETURN(
          ir::Value * seq,
          steps.size() == 1 ? Expected<ir::Value*>(steps[0])
                            : this->op(OpKind::kConcat, std::move(steps), {{"axis", int64_t{0}}}));
      KILN_ASSIGN_OR_RETURN(ir::Value * seq4, unsqueeze(seq, 1));
      perDir.push_back(seq4);
    }
    ir::Value* y = perDir[0];
    if (perDir.size() == 2) {
      KILN_ASSIGN_OR_RETURN(y, this->op(OpKind::kConcat, perDir, {{"axis", int64_t{1}}}));
    }
    if (layout == 1) {
      KILN_ASSIGN_OR_RETURN(
          y, this->op(OpKind::kTranspose, {y}, {{"perm", std::vector<int64_t>{2, 0, 1, 3}}}));
    }
    ctx.setOutput(0, y);
  }
  auto finalState = [&](size_t k, bool cell, ir::Value* initial) -> Status {
    if (!ctx.outputUsed(k)) return Status::ok();
    std::vector<ir::Value*> perDir;
    for (Direction& d : ds) {
      ir::Value* s = cell ? d.c : d.h;
      if (!s) return internalError(op + ": a final state is missing");
      KILN_ASSIGN_OR_RETURN(ir::Value * s1, unsqueeze(s, 0));
      perDir.push_back(s1);
    }
    ir::Value* v = perDir[0];
    if (perDir.size() == 2) {
      KILN_ASSIGN_OR_RETURN(v, this->op(OpKind::kConcat, perDir, {{"axis", int64_t{0}}}));
    }
    if (lensFlat && initial) {
      // A sequence of length 0 ends in 0, not in its initial state (ONNX Runtime).
      ir::TensorData zeroData(ir::DType::kI64, {});
      *zeroData.as<int64_t>() = 0;
      KILN_ASSIGN_OR_RETURN(ir::Value * z64, ctx.constantValue(std::move(zeroData)));
      KILN_ASSIGN_OR_RETURN(ir::Value * nonEmpty, this->op(OpKind::kLess, {z64, lens_}));
      KILN_ASSIGN_OR_RETURN(ir::Value * zero, scalar(0.0));
      KILN_ASSIGN_OR_RETURN(v, this->op(OpKind::kWhere, {nonEmpty, v, zero}));
    }
    if (layout == 1) {
      KILN_ASSIGN_OR_RETURN(
          v, this->op(OpKind::kTranspose, {v}, {{"perm", std::vector<int64_t>{1, 0, 2}}}));
    }
    ctx.setOutput(k, v);
    return Status::ok();
  };
  KILN_TRY(finalState(1, false, h0));
  if (cell_ == Cell::kLstm) KILN_TRY(finalState(2, true, c0));
  return Status::ok();
}

template <Cell kCell>
Status mapRecurrent(NodeContext& ctx) {
  KILN_ASSIGN_OR_RETURN(ir::TensorType xt, ctx.inputType(0));
  Unroller u(ctx, kCell, xt.dtype);
  return u.run();
}

}  // namespace

// Versions, checked against the specification: 7 removed output_sequence (before it, opsets
// below kiln's range); 14 adds layout; 22 adds bfloat16 (refused: kiln composes these for f32 and
// f64).
std::vector<MapperEntry> recurrentMappers() {
  return {
      {"RNN", {7, 14, 22}, mapRecurrent<Cell::kRnn>},
      {"GRU", {7, 14, 22}, mapRecurrent<Cell::kGru>},
      {"LSTM", {7, 14, 22}, mapRecurrent<Cell::kLstm>},
  };
}

}  // namespace kiln::frontends::onnx_import
