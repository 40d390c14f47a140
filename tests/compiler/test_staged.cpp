// Models run in stages (compiler/staged.h): ONNX NonZero, Compress, NonMaxSuppression and Unique
// of computed values, whose output sizes only the values give, against direct loops, compiled
// and eagerly.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "compiler/staged.h"
#include "frontends/onnx/onnx_import.h"
#include "frontends/onnx_model_builder.h"
#include "runtime/tensor.h"

namespace kiln {
namespace {

using onnxtest::attrInt;
using onnxtest::Model;
using runtime::Tensor;

Tensor f32(ir::Shape shape, const std::vector<float>& v) {
  auto t = Tensor::empty(ir::DType::kF32, std::move(shape));
  REQUIRE(t.hasValue());
  if (!v.empty()) std::memcpy(t->rawData(), v.data(), v.size() * sizeof(float));
  return *t;
}

std::vector<float> floats(const Tensor& t) {
  REQUIRE(t.dtype() == ir::DType::kF32);
  std::vector<float> v(static_cast<size_t>(t.numElements()));
  if (!v.empty()) std::memcpy(v.data(), t.rawData(), v.size() * sizeof(float));
  return v;
}

// x [n, 5] -> s = ReduceSum(x) (before any cut); y = 2 * x[x > 0] (NonZero of the mask, its
// columns gathered); w = y[y > 1] (Compress: a second cut, after the first).
std::string maskModel() {
  Model m(13);
  m.input("x", {std::string("n"), 5});
  m.initializer(onnxtest::floatTensor("zero", {}, {0.0f}));
  m.initializer(onnxtest::floatTensor("one", {}, {1.0f}));
  m.initializer(onnxtest::floatTensor("two", {}, {2.0f}));
  m.node("ReduceSum", {"x"}, {"s"}, {attrInt("keepdims", 0)});
  m.node("Shape", {"x"}, {"shape"});  // Folded at import before the cut, read by a Reshape after.
  m.node("Greater", {"x", "zero"}, {"mask"});
  m.node("NonZero", {"mask"}, {"nz"}, {}, "nz");
  m.node("Transpose", {"nz"}, {"idx"});
  m.node("GatherND", {"x", "idx"}, {"picked"});
  m.node("Mul", {"picked", "two"}, {"y"});
  m.node("Greater", {"y", "one"}, {"big"});
  m.node("Compress", {"y", "big"}, {"w"}, {attrInt("axis", 0)}, "compress");
  m.node("Neg", {"x"}, {"negx"});
  m.node("Reshape", {"negx", "shape"}, {"r"});
  m.output("s").output("y").output("w").output("r");
  return m.bytes();
}

TEST_CASE("staged: NonZero and Compress of computed values, compiled and eager, every count") {
  const std::string bytes = maskModel();
  // The plain import says the model needs stages.
  auto plain = frontends::loadOnnxFromBytes(bytes, {.dimValues = {{"n", 2}}});
  REQUIRE_FALSE(plain.hasValue());
  CHECK(frontends::needsStages(plain.status()));
  CHECK_THAT(plain.status().message(), Catch::Contains("NonZero (opset 13) node 'nz'"));

  auto staged = frontends::onnxStagesFromBytes(bytes);
  REQUIRE(staged.hasValue());
  CHECK(staged->inputs == std::vector<std::string>{"x"});
  CHECK(staged->outputs == std::vector<std::string>{"s", "y", "w", "r"});
  compiler::CompileOptions co;
  co.autotune = false;
  compiler::StagedModule compiled(*staged, co, false);
  compiler::StagedModule eager(*staged, co, true);

  const std::vector<std::vector<float>> cases = {
      {0.5f, -1.0f, 2.0f, 0.0f, -0.0f, 3.0f, 0.25f, -2.0f, 1.0f, 4.0f},  // Some of each.
      {-1.0f, -2.0f, -3.0f, -4.0f, -5.0f},                               // None: empty outputs.
      {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f, 9.0f, 10.0f, 11.0f, 12.0f, 13.0f, 14.0f,
       15.0f},                                                           // All, 3 rows.
      {0.5f, -1.0f, 2.0f, 0.0f, -0.0f, 3.0f, 0.25f, -2.0f, 1.0f, 4.0f},  // The first again.
  };
  int made = 0;
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::vector<float>& x = cases[c];
    const int64_t rows = static_cast<int64_t>(x.size()) / 5;
    double sum = 0;
    std::vector<float> y, w;
    for (float v : x) {
      sum += v;
      if (v > 0) y.push_back(2 * v);
    }
    for (float v : y)
      if (v > 1) w.push_back(v);
    for (compiler::StagedModule* module : {&compiled, &eager}) {
      INFO("case " << c << (module == &eager ? " eager" : " compiled"));
      const Tensor in = f32({rows, 5}, x);
      auto out = (*module)(std::vector<Tensor>{in});
      INFO((out.hasValue() ? std::string() : out.status().message()));
      REQUIRE(out.hasValue());
      REQUIRE(out->size() == 4);
      CHECK((*out)[3].shape() == ir::Shape{rows, 5});
      CHECK((*out)[0].shape() == ir::Shape{});
      CHECK((*out)[1].shape() == ir::Shape{static_cast<int64_t>(y.size())});
      CHECK((*out)[2].shape() == ir::Shape{static_cast<int64_t>(w.size())});
      CHECK(floats((*out)[1]) == y);
      CHECK(floats((*out)[2]) == w);
      double got = 0;
      for (float v : floats((*out)[0])) got += v;
      CHECK(got == Approx(sum).margin(1e-5));
    }
    // Three stages per new count (before NonZero, between it and Compress, after), none for
    // counts seen before.
    made = compiled.stagesMade();
    CHECK(made == (c < 3 ? 3 * static_cast<int>(c + 1) : 9));
  }
  CHECK(eager.stagesMade() == made);
}

// In the sanitizer runs (tests/CMakeLists.txt: concurrency*).
TEST_CASE("concurrency: a model in stages called from many threads makes each stage once") {
  auto staged = frontends::onnxStagesFromBytes(maskModel());
  REQUIRE(staged.hasValue());
  compiler::CompileOptions co;
  co.autotune = false;
  co.runThreads = 1;
  compiler::StagedModule module(*staged, co, false);
  // Two inputs with different counts (3 stages each), first called from four threads at once.
  const std::vector<std::vector<float>> cases = {
      {0.5f, -1.0f, 2.0f, 0.0f, -0.0f, 3.0f, 0.25f, -2.0f, 1.0f, 4.0f},
      {1.0f, -2.0f, 3.0f, -4.0f, 5.0f}};
  std::vector<std::vector<float>> expected;
  for (const auto& x : cases) {
    std::vector<float> y;
    for (float v : x)
      if (v > 0) y.push_back(2 * v);
    expected.push_back(y);
  }
  constexpr int kThreads = 4, kCalls = 3;
  // No Catch assertion inside the threads (Catch is not thread-safe): inputs made here, outputs
  // checked after the join.
  std::vector<Tensor> inputs;
  for (const auto& x : cases) inputs.push_back(f32({static_cast<int64_t>(x.size()) / 5, 5}, x));
  std::vector<std::vector<Expected<std::vector<Tensor>>>> results(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int c = 0; c < kCalls; ++c)
        results[static_cast<size_t>(t)].push_back(
            module(std::vector<Tensor>{inputs[static_cast<size_t>(t % 2)]}));
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t)
    for (auto& out : results[static_cast<size_t>(t)]) {
      INFO("thread " << t << ": " << (out ? std::string() : out.status().message()));
      REQUIRE(out.hasValue());
      CHECK(floats((*out)[1]) == expected[static_cast<size_t>(t % 2)]);
    }
  CHECK(module.stagesMade() == 6);  // Made once each, however many callers waited on them.
}

TEST_CASE("staged: NonMaxSuppression of computed scores, its thresholds initializers") {
  // scores = Sigmoid(logits) per class; boxes 0 and 1 overlap with IoU 0.6, box 2 is apart.
  Model m(11);
  m.input("boxes", {1, 3, 4}).input("logits", {1, 1, 3});
  m.initializer(onnxtest::int64Tensor("most", {1}, {10}));
  m.initializer(onnxtest::floatTensor("iou", {1}, {0.5f}));
  m.initializer(onnxtest::floatTensor("above", {1}, {0.5f}));
  m.node("Sigmoid", {"logits"}, {"scores"});
  m.node("NonMaxSuppression", {"boxes", "scores", "most", "iou", "above"}, {"selected"}, {}, "nms");
  m.output("selected", onnxtest::kInt64);
  auto staged = frontends::onnxStagesFromBytes(m.bytes());
  REQUIRE(staged.hasValue());
  compiler::StagedModule module(*staged);
  const Tensor boxes = f32({1, 3, 4}, {0, 0, 1, 1, 0, 0.25f, 1, 1.25f, 5, 5, 6, 6});
  auto indices = [](const Tensor& t) {
    std::vector<int64_t> v(static_cast<size_t>(t.numElements()));
    if (!v.empty()) std::memcpy(v.data(), t.rawData(), v.size() * sizeof(int64_t));
    return v;
  };
  // Logits 2, 1, 3: box 2 first, then 0; 1 suppressed by 0. Logits 2, 1, -1: box 2's score is
  // below 0.5. All below: none.
  const std::vector<std::pair<std::vector<float>, std::vector<int64_t>>> cases = {
      {{2, 1, 3}, {0, 0, 2, 0, 0, 0}}, {{2, 1, -1}, {0, 0, 0}}, {{-1, -2, -3}, {}}};
  for (const auto& [logits, want] : cases) {
    auto out = module(std::vector<Tensor>{boxes, f32({1, 1, 3}, logits)});
    INFO((out.hasValue() ? std::string() : out.status().message()));
    REQUIRE(out.hasValue());
    CHECK((*out)[0].shape() == ir::Shape{static_cast<int64_t>(want.size() / 3), 3});
    CHECK(indices((*out)[0]) == want);
  }
}

std::vector<int64_t> int64s(const Tensor& t) {
  REQUIRE(t.dtype() == ir::DType::kI64);
  std::vector<int64_t> v(static_cast<size_t>(t.numElements()));
  if (!v.empty()) std::memcpy(v.data(), t.rawData(), v.size() * sizeof(int64_t));
  return v;
}

TEST_CASE("staged: Unique of computed values, its four outputs, sorted and in order, by axis") {
  // y = Unique(|x|) of the flattened [n, 2] (sorted, opset 11: libonnx checks the import), and
  // the rows of x in order of first occurrence (opset 11, sorted 0, axis 0).
  Model m(11);
  m.input("x", {std::string("n"), 2});
  m.node("Abs", {"x"}, {"a"});
  m.node("Unique", {"a"}, {"y", "first", "inverse", "counts"}, {}, "flat");
  m.node("Unique", {"x"}, {"rows", "row_first", "row_inverse", "row_counts"},
         {attrInt("axis", 0), attrInt("sorted", 0)}, "by_row");
  m.output("y").output("first", onnxtest::kInt64).output("inverse", onnxtest::kInt64);
  m.output("counts", onnxtest::kInt64).output("rows").output("row_first", onnxtest::kInt64);
  m.output("row_inverse", onnxtest::kInt64).output("row_counts", onnxtest::kInt64);
  auto staged = frontends::onnxStagesFromBytes(m.bytes());
  REQUIRE(staged.hasValue());
  compiler::StagedModule compiled(*staged), eager(*staged, {}, true);
  const std::vector<std::vector<float>> cases = {
      {3, -1, 1, 3, 0, -0.0f, -1, 1},  // |x|: 3 1 1 3 0 0 1 1; rows (3,-1) (1,3) (0,-0) (-1,1)
      {2, 2, 2, 2},                    // One value, one distinct row.
      {5, 4, -5, 4, 5, 4},             // Rows (5,4) twice.
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::vector<float>& x = cases[c];
    const size_t n = x.size() / 2;
    // Expected, by direct loops: sorted distinct |x| with first positions, inverse, counts.
    std::vector<float> a(x.size());
    for (size_t i = 0; i < x.size(); ++i) a[i] = std::fabs(x[i]);
    std::vector<float> y;
    for (float v : a)
      if (std::find(y.begin(), y.end(), v) == y.end()) y.push_back(v);
    std::sort(y.begin(), y.end());
    std::vector<int64_t> first(y.size()), inverse(a.size()), counts(y.size(), 0);
    for (size_t u = 0; u < y.size(); ++u)
      first[u] = std::find(a.begin(), a.end(), y[u]) - a.begin();
    for (size_t i = 0; i < a.size(); ++i) {
      inverse[i] = std::find(y.begin(), y.end(), a[i]) - y.begin();
      ++counts[static_cast<size_t>(inverse[i])];
    }
    // Rows in order of first occurrence (-0 equals 0).
    std::vector<float> rows;
    std::vector<int64_t> rowFirst, rowInverse, rowCounts;
    for (size_t i = 0; i < n; ++i) {
      size_t u = 0;
      while (u < rowFirst.size() && !(rows[2 * u] == x[2 * i] && rows[2 * u + 1] == x[2 * i + 1]))
        ++u;
      if (u == rowFirst.size()) {
        rows.insert(rows.end(), {x[2 * i], x[2 * i + 1]});
        rowFirst.push_back(static_cast<int64_t>(i));
        rowCounts.push_back(0);
      }
      rowInverse.push_back(static_cast<int64_t>(u));
      ++rowCounts[u];
    }
    for (compiler::StagedModule* module : {&compiled, &eager}) {
      INFO("case " << c << (module == &eager ? " eager" : " compiled"));
      auto out = (*module)(std::vector<Tensor>{f32({static_cast<int64_t>(n), 2}, x)});
      INFO((out.hasValue() ? std::string() : out.status().message()));
      REQUIRE(out.hasValue());
      REQUIRE(out->size() == 8);
      CHECK(floats((*out)[0]) == y);
      CHECK(int64s((*out)[1]) == first);
      CHECK(int64s((*out)[2]) == inverse);
      CHECK(int64s((*out)[3]) == counts);
      CHECK((*out)[4].shape() == ir::Shape{static_cast<int64_t>(rowFirst.size()), 2});
      CHECK(floats((*out)[4]) == rows);
      CHECK(int64s((*out)[5]) == rowFirst);
      CHECK(int64s((*out)[6]) == rowInverse);
      CHECK(int64s((*out)[7]) == rowCounts);
    }
  }
}

// x [n] -> c = sum(x) > 0; y = If(c, then: concat(x, x), else: -x) (branches of different
// sizes); m = ceil(max |x|) as int64; z = Loop(m) { acc + x } from acc = x, so (m + 1) x; and
// w = Loop(k) { acc * 2 } from x, its trip count k a model input.
std::string controlFlowModel() {
  Model m(13);
  m.input("x", {std::string("n")}).input("k", {}, onnxtest::kInt64);
  m.initializer(onnxtest::floatTensor("zero", {}, {0.0f}));
  m.initializer(onnxtest::floatTensor("two", {}, {2.0f}));
  Model then, otherwise, add, dbl;
  then.node("Concat", {"x", "x"}, {"t"}, {attrInt("axis", 0)}).output("t");
  otherwise.node("Neg", {"x"}, {"e"}).output("e");
  for (Model* body : {&add, &dbl}) {
    body->input("i", {}, onnxtest::kInt64).input("cond_in", {}, onnxtest::kBool);
    body->input("acc", {std::string("n")});
    body->node("Identity", {"cond_in"}, {"cond_out"});
    body->output("cond_out", onnxtest::kBool).output("acc_out");
  }
  add.node("Add", {"acc", "x"}, {"acc_out"});
  dbl.node("Mul", {"acc", "two"}, {"acc_out"});
  m.node("ReduceSum", {"x"}, {"s"}, {attrInt("keepdims", 0)});
  m.node("Greater", {"s", "zero"}, {"c"});
  m.node("If", {"c"}, {"y"},
         {onnxtest::attrGraph("then_branch", then.proto().graph()),
          onnxtest::attrGraph("else_branch", otherwise.proto().graph())},
         "pick");
  m.node("Abs", {"x"}, {"a"});
  m.node("ReduceMax", {"a"}, {"big"}, {attrInt("keepdims", 0)});
  m.node("Ceil", {"big"}, {"up"});
  m.node("Cast", {"up"}, {"trips"}, {attrInt("to", onnxtest::kInt64)});
  m.node("Loop", {"trips", "", "x"}, {"z"}, {onnxtest::attrGraph("body", add.proto().graph())},
         "repeat");
  m.node("Loop", {"k", "", "x"}, {"w"}, {onnxtest::attrGraph("body", dbl.proto().graph())},
         "double");
  m.output("y").output("z").output("w");
  return m.bytes();
}

TEST_CASE("staged: an If and Loops whose condition and trip counts the model computes") {
  const std::string bytes = controlFlowModel();
  auto plain = frontends::loadOnnxFromBytes(bytes, {.dimValues = {{"n", 4}}});
  REQUIRE_FALSE(plain.hasValue());
  CHECK(frontends::needsStages(plain.status()));
  CHECK_THAT(plain.status().message(),
             Catch::Contains("If (opset 13) node 'pick': its condition is computed at run time"));
  auto staged = frontends::onnxStagesFromBytes(bytes);
  REQUIRE(staged.hasValue());
  compiler::CompileOptions co;
  co.autotune = false;
  compiler::StagedModule compiled(*staged, co, false), eager(*staged, co, true);
  auto scalar = [](int64_t v) {
    auto t = Tensor::empty(ir::DType::kI64, {});
    REQUIRE(t.hasValue());
    *t->data<int64_t>() = v;
    return *t;
  };
  struct Case {
    std::vector<float> x;
    int64_t k;
  };
  const std::vector<Case> cases = {
      {{1, 2, -0.5f, 0.25f}, 2},  // Then; 2 trips; 2 doublings.
      {{-1, -3, 0.5f, 0}, 0},     // Else; 3 trips; none.
      {{0.5f, 0.25f}, -1},        // Then; 1 trip; a negative count runs none (as ONNX's).
      {{1, 2, -0.5f, 0.25f}, 2},  // The first again: no stage made.
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::vector<float>& x = cases[c].x;
    float sum = 0, most = 0;
    for (float v : x) {
      sum += v;
      most = std::max(most, std::fabs(v));
    }
    std::vector<float> y, z, w;
    if (sum > 0) {
      y = x;
      y.insert(y.end(), x.begin(), x.end());
    } else {
      for (float v : x) y.push_back(-v);
    }
    const float trips = std::ceil(most);
    for (float v : x) {
      z.push_back((trips + 1) * v);
      w.push_back(v * static_cast<float>(1 << std::max<int64_t>(cases[c].k, 0)));
    }
    for (compiler::StagedModule* module : {&compiled, &eager}) {
      INFO("case " << c << (module == &eager ? " eager" : " compiled"));
      auto out = (*module)(
          std::vector<Tensor>{f32({static_cast<int64_t>(x.size())}, x), scalar(cases[c].k)});
      INFO((out.hasValue() ? std::string() : out.status().message()));
      REQUIRE(out.hasValue());
      REQUIRE(out->size() == 3);
      CHECK(floats((*out)[0]) == y);
      CHECK(floats((*out)[1]) == z);
      CHECK(floats((*out)[2]) == w);
    }
  }
  // Per new condition and trip counts: the stage before the If, the If's (to the first Loop's
  // cut), then the first Loop's (its trip count read: to the second's) and the second's; the
  // second case shares the first's first stage (the same input sizes), the third makes its own.
  CHECK(compiled.stagesMade() == 4 + 3 + 4);
  const std::vector<std::string> log = compiled.log();
  REQUIRE(log.size() >= 2);
  CHECK_THAT(log[0], Catch::Contains("then If (opset 13) node 'pick' needs its condition 'c'"));

  // More iterations than kiln unrolls: the error names the Loop, the stages before it ran.
  auto many = compiled(std::vector<Tensor>{f32({2}, {5000.0f, 1.0f}), scalar(0)});
  REQUIRE_FALSE(many.hasValue());
  CHECK_THAT(many.status().message(), Catch::Contains("Loop (opset 13) node 'repeat'"));
  CHECK_THAT(many.status().message(), Catch::Contains("more than 4096 iterations"));
}

// x [n] -> y = If(sum(x) > 0, then: If(true, then: float(NonZero(x)), else: x), else: -x as [1,
// n]): NonZero two Ifs deep, the outer's condition computed, the inner's known at import.
std::string nonZeroInBranchesModel() {
  Model m(13);
  m.input("x", {std::string("n")});
  m.initializer(onnxtest::floatTensor("zero", {}, {0.0f}));
  ::onnx::TensorProto yes;
  yes.set_name("yes");
  yes.set_data_type(onnxtest::kBool);
  yes.add_int32_data(1);
  m.initializer(yes);
  m.initI64("row", {2}, {1, -1});
  Model inThen, inElse, then, otherwise;
  inThen.node("NonZero", {"x"}, {"nz"}, {}, "nz")
      .node("Cast", {"nz"}, {"f"}, {attrInt("to", onnxtest::kFloat)});
  inThen.output("f");
  inElse.node("Reshape", {"x", "row"}, {"g"}).output("g");
  then.node("If", {"yes"}, {"inner"},
            {onnxtest::attrGraph("then_branch", inThen.proto().graph()),
             onnxtest::attrGraph("else_branch", inElse.proto().graph())},
            "inner");
  then.output("inner");
  otherwise.node("Neg", {"x"}, {"negx"}).node("Reshape", {"negx", "row"}, {"e"}).output("e");
  m.node("ReduceSum", {"x"}, {"s"}, {attrInt("keepdims", 0)});
  m.node("Greater", {"s", "zero"}, {"c"});
  m.node("If", {"c"}, {"y"},
         {onnxtest::attrGraph("then_branch", then.proto().graph()),
          onnxtest::attrGraph("else_branch", otherwise.proto().graph())},
         "outer");
  m.node("Relu", {"y"}, {"r"});  // After the Ifs: reads their output.
  m.output("r");
  return m.bytes();
}

TEST_CASE("staged: a NonZero inside the branches Ifs take: the branches spliced into the graph") {
  auto staged = frontends::onnxStagesFromBytes(nonZeroInBranchesModel());
  REQUIRE(staged.hasValue());
  compiler::CompileOptions co;
  co.autotune = false;
  compiler::StagedModule compiled(*staged, co, false), eager(*staged, co, true);
  const std::vector<std::vector<float>> cases = {
      {0, 2, -1, 3},  // Then: the non-zeros' positions 1 2 3.
      {-2, 0, 1},     // Else: -x.
      {0, 0, 5},      // Then: one non-zero.
      {0, 2, -1, 3},  // Again: no stage made.
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::vector<float>& x = cases[c];
    float sum = 0;
    for (float v : x) sum += v;
    std::vector<float> want;
    for (size_t i = 0; i < x.size(); ++i) {
      if (sum > 0 && x[i] != 0) want.push_back(static_cast<float>(i));
      if (sum <= 0) want.push_back(std::max(-x[i], 0.0f));
    }
    for (compiler::StagedModule* module : {&compiled, &eager}) {
      INFO("case " << c << (module == &eager ? " eager" : " compiled"));
      auto out = (*module)(std::vector<Tensor>{f32({static_cast<int64_t>(x.size())}, x)});
      INFO((out.hasValue() ? std::string() : out.status().message()));
      REQUIRE(out.hasValue());
      CHECK((*out)[0].shape() == ir::Shape{1, static_cast<int64_t>(want.size())});
      CHECK(floats((*out)[0]) == want);
    }
  }
  // The first case: before the outer If, at it (both branches spliced: ends at the NonZero), after.
  const std::vector<std::string> log = compiled.log();
  REQUIRE(log.size() >= 3);
  CHECK_THAT(log[1], Catch::Contains("then NonZero (opset 13) node"));
  CHECK_THAT(log[2], Catch::Contains("branch of y = 1"));
  CHECK_THAT(log[2], Catch::Contains("branch of y/then/inner = 1"));
}

TEST_CASE(
    "staged: two NonZeros in either branch, a branch's own initializer, a computed Loop "
    "condition") {
  // x [n] -> (a, b) = If(sum(x) > 0, then: (NonZero(x), NonZero(-x)),
  //                      else: (NonZero(x * m), NonZero(x)) with m = -1 the branch's initializer);
  // w = Loop(3, max(x) > 0) { acc * 2 } from x.
  Model m(13);
  m.input("x", {std::string("n")});
  m.initializer(onnxtest::floatTensor("zero", {}, {0.0f}));
  m.initializer(onnxtest::floatTensor("two", {}, {2.0f}));
  m.initI64("three", {}, {3});
  Model then, otherwise, body;
  then.node("NonZero", {"x"}, {"ta"})
      .node("Neg", {"x"}, {"negx"})
      .node("NonZero", {"negx"}, {"tb"});
  then.output("ta", onnxtest::kInt64).output("tb", onnxtest::kInt64);
  otherwise.initializer(onnxtest::floatTensor("minus", {}, {-1.0f}));
  otherwise.node("Mul", {"x", "minus"}, {"xm"}).node("NonZero", {"xm"}, {"ea"});
  otherwise.node("NonZero", {"x"}, {"eb"});
  otherwise.output("ea", onnxtest::kInt64).output("eb", onnxtest::kInt64);
  body.input("i", {}, onnxtest::kInt64).input("cond_in", {}, onnxtest::kBool);
  body.input("acc", {std::string("n")});
  body.node("Identity", {"cond_in"}, {"cond_out"}).node("Mul", {"acc", "two"}, {"acc_out"});
  body.output("cond_out", onnxtest::kBool).output("acc_out");
  m.node("ReduceSum", {"x"}, {"s"}, {attrInt("keepdims", 0)});
  m.node("Greater", {"s", "zero"}, {"c"});
  m.node("If", {"c"}, {"a", "b"},
         {onnxtest::attrGraph("then_branch", then.proto().graph()),
          onnxtest::attrGraph("else_branch", otherwise.proto().graph())},
         "pick");
  m.node("ReduceMax", {"x"}, {"most"}, {attrInt("keepdims", 0)});
  m.node("Greater", {"most", "zero"}, {"go"});
  m.node("Loop", {"three", "go", "x"}, {"w"}, {onnxtest::attrGraph("body", body.proto().graph())});
  m.output("a", onnxtest::kInt64).output("b", onnxtest::kInt64).output("w");
  auto staged = frontends::onnxStagesFromBytes(m.bytes());
  REQUIRE(staged.hasValue());
  compiler::CompileOptions co;
  co.autotune = false;
  compiler::StagedModule compiled(*staged, co, false), eager(*staged, co, true);
  const std::vector<std::vector<float>> cases = {{1, -2, 3, 0}, {-1, -2, 0.5f}, {-1, -2, -3}};
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::vector<float>& x = cases[c];
    float sum = 0, most = x[0];
    for (float v : x) {
      sum += v;
      most = std::max(most, v);
    }
    // Both branches give (positions of x != 0 ... ): then (x, -x) and else (-x, x) non-zeros are
    // the same positions; what differs is nothing but which NonZero made them, so check both.
    std::vector<int64_t> nonZero;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i] != 0) nonZero.push_back(static_cast<int64_t>(i));
    std::vector<float> w;
    for (float v : x) w.push_back(most > 0 ? v * 8 : v);
    for (compiler::StagedModule* module : {&compiled, &eager}) {
      INFO("case " << c << (module == &eager ? " eager" : " compiled"));
      auto out = (*module)(std::vector<Tensor>{f32({static_cast<int64_t>(x.size())}, x)});
      INFO((out.hasValue() ? std::string() : out.status().message()));
      REQUIRE(out.hasValue());
      CHECK(int64s((*out)[0]) == nonZero);
      CHECK(int64s((*out)[1]) == nonZero);
      CHECK(floats((*out)[2]) == w);
    }
    const std::vector<std::string> log = compiled.log();
    CHECK_THAT(log.back(), Catch::Contains(sum > 0 ? "branch of a = 1" : "branch of a = 0"));
  }
}

TEST_CASE("staged: the stage cache evicts the least recently used stage") {
  Model m(13);
  m.input("x", {std::string("n")});
  m.node("Relu", {"x"}, {"y"});
  m.output("y");
  auto staged = frontends::onnxStagesFromBytes(m.bytes());
  REQUIRE(staged.hasValue());
  compiler::StagedModule module(*staged, {}, true, 3);  // One stage per size, 3 kept.
  auto call = [&](int64_t n) {
    auto out =
        module(std::vector<Tensor>{f32({n}, std::vector<float>(static_cast<size_t>(n), -1))});
    REQUIRE(out.hasValue());
    return module.stagesMade();
  };
  CHECK(call(1) == 1);
  CHECK(call(2) == 2);
  CHECK(call(3) == 3);
  CHECK(call(1) == 3);  // Used again: now the most recent.
  CHECK(call(4) == 4);  // Evicts size 2 (first-in-first-out would have evicted size 1).
  CHECK(call(1) == 4);
  CHECK(call(3) == 4);
  CHECK(call(2) == 5);  // Made again.
}

TEST_CASE("staged: a model without such nodes is one stage; a cut inside a loop body is an error") {
  Model m(13);
  m.input("x", {3});
  m.node("Relu", {"x"}, {"y"});
  m.output("y");
  auto staged = frontends::onnxStagesFromBytes(m.bytes());
  REQUIRE(staged.hasValue());
  compiler::StagedModule module(*staged);
  auto out = module(std::vector<Tensor>{f32({3}, {-1.0f, 2.0f, -3.0f})});
  REQUIRE(out.hasValue());
  CHECK(floats((*out)[0]) == std::vector<float>{0.0f, 2.0f, 0.0f});
  CHECK(module.stagesMade() == 1);
  // A wrong input count, and a wrong rank, are errors naming what the model takes.
  auto none = module(std::vector<Tensor>{});
  REQUIRE_FALSE(none.hasValue());
  CHECK_THAT(none.status().message(), Catch::Contains("takes 1 inputs, got 0"));
  auto rank = module(std::vector<Tensor>{f32({1, 3}, {1, 2, 3})});
  REQUIRE_FALSE(rank.hasValue());
  CHECK_THAT(rank.status().message(), Catch::Contains("input 'x' is declared f32 of rank 1"));
  // A fixed dim is the model's: a call of another size is an error, not a stage made for it.
  auto size = module(std::vector<Tensor>{f32({4}, {1, 2, 3, 4})});
  REQUIRE_FALSE(size.hasValue());
  CHECK_THAT(size.status().message(),
             Catch::Contains("input 'x' has dim 0 fixed at 3, the call gives f32[4]"));

  // NonZero inside a Loop body (two iterations, unrolled at import): stages cannot end inside a
  // loop's body (an If's branch is spliced into the graph instead, tested above).
  Model loop(13);
  loop.input("x", {3});
  loop.initI64("two", {}, {2});
  Model body;
  body.input("i", {}, onnxtest::kInt64).input("cond_in", {}, onnxtest::kBool);
  body.node("Identity", {"cond_in"}, {"cond_out"}).node("NonZero", {"x"}, {"nz"});
  body.output("cond_out", onnxtest::kBool).output("nz", onnxtest::kInt64);
  loop.node("Loop", {"two", ""}, {"r"}, {onnxtest::attrGraph("body", body.proto().graph())});
  loop.output("r", onnxtest::kInt64);
  auto inBody = frontends::loadOnnxFromBytes(loop.bytes());
  REQUIRE_FALSE(inBody.hasValue());
  CHECK_FALSE(frontends::needsStages(inBody.status()));
  CHECK_THAT(inBody.status().message(), Catch::Contains("inside a subgraph"));
}

}  // namespace
}  // namespace kiln
