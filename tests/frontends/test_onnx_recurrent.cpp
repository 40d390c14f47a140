// ONNX's RNN, GRU and LSTM, unrolled by the importer: an LSTM against a loop over the ONNX
// equations written here in double precision, and the errors a malformed node gets. ONNX
// Runtime's outputs on 15 configurations of the three ops are compared in
// python/tests/test_onnx_recurrent.py; the conformance suite's 18 cases run in ctest too.
#include <algorithm>
#include <cmath>

#include "tests/frontends/test_onnx_model.h"

using namespace kiln;
using namespace kiln::onnxtest;

namespace {

double sigmoid(double x) {
  return 1 / (1 + std::exp(-x));
}

// A bidirectional LSTM with biases, peepholes, initial states, clip and sequence lengths, by
// the ONNX equations (ONNX Runtime's reading: clip bounds each gate's input; steps past a
// sequence's length keep its state and write 0; a reverse direction starts at its last element;
// a sequence of length 0 ends in 0).
struct LstmCase {
  int64_t T = 4, B = 3, I = 2, H = 3;
  std::vector<int32_t> lens{4, 2, 0};
  double clip = 0.8;
  std::vector<float> x, w, r, b, h0, c0, p;
  std::vector<double> y, yh, yc;  // [T, 2, B, H], [2, B, H], [2, B, H]

  LstmCase() {
    x = randomValues(static_cast<size_t>(T * B * I), 1);
    w = randomValues(static_cast<size_t>(2 * 4 * H * I), 2);
    r = randomValues(static_cast<size_t>(2 * 4 * H * H), 3);
    b = randomValues(static_cast<size_t>(2 * 8 * H), 4);
    h0 = randomValues(static_cast<size_t>(2 * B * H), 5);
    c0 = randomValues(static_cast<size_t>(2 * B * H), 6);
    p = randomValues(static_cast<size_t>(2 * 3 * H), 7);
    y.assign(static_cast<size_t>(T * 2 * B * H), 0);
    yh.assign(static_cast<size_t>(2 * B * H), 0);
    yc = yh;
    for (int64_t d = 0; d < 2; ++d)
      for (int64_t n = 0; n < B; ++n) {
        std::vector<double> h(static_cast<size_t>(H)), c(h.size());
        for (int64_t j = 0; j < H; ++j) {
          h[j] = h0[(d * B + n) * H + j];
          c[j] = c0[(d * B + n) * H + j];
        }
        const int64_t len = lens[n];
        for (int64_t k = 0; k < len; ++k) {
          const int64_t t = d == 0 ? k : len - 1 - k;
          std::vector<double> g(static_cast<size_t>(4 * H));  // i, o, f, c
          for (int64_t q = 0; q < 4 * H; ++q) {
            double s = b[d * 8 * H + q] + b[d * 8 * H + 4 * H + q];
            for (int64_t e = 0; e < I; ++e)
              s += x[(t * B + n) * I + e] * w[(d * 4 * H + q) * I + e];
            for (int64_t e = 0; e < H; ++e) s += h[e] * r[(d * 4 * H + q) * H + e];
            g[q] = s;
          }
          auto bound = [&](double v) { return std::clamp(v, -clip, clip); };
          for (int64_t j = 0; j < H; ++j) {
            const double P_i = p[d * 3 * H + j], P_o = p[d * 3 * H + H + j],
                         P_f = p[d * 3 * H + 2 * H + j];
            const double i = sigmoid(bound(g[j] + P_i * c[j]));
            const double f = sigmoid(bound(g[2 * H + j] + P_f * c[j]));
            const double cand = std::tanh(bound(g[3 * H + j]));
            c[j] = f * c[j] + i * cand;
            const double o = sigmoid(bound(g[H + j] + P_o * c[j]));
            h[j] = o * std::tanh(c[j]);
            y[((t * 2 + d) * B + n) * H + j] = h[j];
          }
        }
        for (int64_t j = 0; j < H; ++j) {
          yh[(d * B + n) * H + j] = len == 0 ? 0 : h[j];
          yc[(d * B + n) * H + j] = len == 0 ? 0 : c[j];
        }
      }
  }
};

std::vector<float> toFloats(const std::vector<double>& v) {
  return std::vector<float>(v.begin(), v.end());
}

}  // namespace

TEST_CASE("onnx: a bidirectional LSTM with peepholes, clip and sequence lengths") {
  const LstmCase c;
  const int64_t T = c.T, B = c.B, I = c.I, H = c.H;
  Model m;
  m.input("x", {T, B, I}).input("lens", {B}, ::onnx::TensorProto::INT32);
  m.init("w", {2, 4 * H, I}, c.w).init("r", {2, 4 * H, H}, c.r).init("b", {2, 8 * H}, c.b);
  m.init("h0", {2, B, H}, c.h0).init("c0", {2, B, H}, c.c0).init("p", {2, 3 * H}, c.p);
  m.node("LSTM", {"x", "w", "r", "b", "lens", "h0", "c0", "p"}, {"y", "yh", "yc"},
         {attrInt("hidden_size", H), attrString("direction", "bidirectional"),
          attrFloat("clip", static_cast<float>(c.clip))},
         "lstm");
  m.output("y").output("yh").output("yc");
  auto lens = Tensor::empty(DType::kI32, {B});
  REQUIRE(lens.hasValue());
  std::copy(c.lens.begin(), c.lens.end(), lens->data<int32_t>());
  const auto out = run(m, {makeF32({T, B, I}, c.x), *lens});
  REQUIRE(out.size() == 3);
  checkClose(out[0], {T, 2, B, H}, toFloats(c.y));
  checkClose(out[1], {2, B, H}, toFloats(c.yh));
  checkClose(out[2], {2, B, H}, toFloats(c.yc));
}

TEST_CASE("onnx: recurrent nodes with a wrong weight, activation or length are errors") {
  auto rnn = [](std::vector<::onnx::AttributeProto> attrs, Shape w = {1, 4, 2},
                std::vector<int64_t> lens = {}) {
    Model m;
    m.input("x", {int64_t{3}, int64_t{2}, int64_t{2}});
    m.init("w", w, std::vector<float>(static_cast<size_t>(ir::numElements(w)), 0.1f));
    m.init("r", {1, 4, 4}, std::vector<float>(16, 0.1f));
    std::vector<std::string> ins{"x", "w", "r"};
    if (!lens.empty()) {
      ::onnx::TensorProto t;
      t.set_name("lens");
      t.set_data_type(::onnx::TensorProto::INT32);
      t.add_dims(static_cast<int64_t>(lens.size()));
      for (int64_t v : lens) t.add_int32_data(static_cast<int32_t>(v));
      m.initializer(t);
      ins.insert(ins.end(), {"", "lens"});
    }
    m.node("RNN", ins, {"y"}, std::move(attrs), "rnn").output("y");
    return importError(m);
  };
  Status s = rnn({attrInt("hidden_size", 4)}, {1, 4, 3});
  CHECK(s.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("RNN (opset 17) node 'rnn': W f32[1,4,3] and R "
                                          "f32[1,4,4] must be f32[1,4,2] and f32[1,4,4]"));
  s = rnn({attrStrings("activations", {"Gelu"})});
  CHECK(s.code() == ErrorCode::kUnimplemented);
  CHECK_THAT(s.message(), Catch::Contains("activation 'Gelu' (ONNX's are Relu, Tanh"));
  s = rnn({attrStrings("activations", {"Affine"}), attrFloats("activation_alpha", {2})});
  CHECK_THAT(s.message(), Catch::Contains("activation 'Affine' needs its beta"));
  s = rnn({attrStrings("activations", {"Tanh", "Tanh"})});
  CHECK_THAT(s.message(), Catch::Contains("activations lists 2 functions; RNN with 1 "
                                          "direction(s) takes 1"));
  s = rnn({}, {1, 4, 2}, {3, 4});
  CHECK(s.code() == ErrorCode::kInvalidArgument);
  CHECK_THAT(s.message(), Catch::Contains("sequence_lens[1] is 4, outside 0..3"));
}
