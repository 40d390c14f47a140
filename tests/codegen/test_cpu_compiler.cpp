// The in-process C++ compiler (Clang 16) and the runtime's object loader (ORC JIT): compile
// kernels, load them, call them, check the numbers; errors are Statuses with locations.
#include <catch2/catch.hpp>

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>
#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "codegen/cpu_compiler.h"
#include "codegen/kernel_cache.h"
#include "codegen/prelude.h"
#include "runtime/object_loader.h"
#include "x86_levels.h"

using kiln::ErrorCode;
using kiln::codegen::compileCpp;
using kiln::codegen::compileCppParallel;
using kiln::codegen::compilerIdentity;
using kiln::codegen::CpuCompileOptions;
using kiln::codegen::CpuObject;
using kiln::codegen::CpuSource;
using kiln::runtime::LoadedObjects;

namespace {

using UnaryKernel = void(const float*, float*, long);

// The shape of a generated kernel: extern "C", no includes, builtins for math.
const char* kAffineKernel = R"(
extern "C" void k(const float* a, float* b, long n) {
  for (long i = 0; i < n; ++i) b[i] = a[i] * 2.0f + 1.0f;
}
)";

std::vector<float> ramp(long n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (long i = 0; i < n; ++i) v[static_cast<size_t>(i)] = 0.01f * static_cast<float>(i) - 3.0f;
  return v;
}

CpuObject compileOrFail(const std::string& source, const std::string& name,
                        const CpuCompileOptions& options = {}) {
  auto object = compileCpp(source, name, options);
  INFO(object.status().message());
  REQUIRE(object.hasValue());
  return std::move(object).value();
}

template <class Signature>
Signature* lookupOrFail(LoadedObjects& objects, const std::string& symbol) {
  auto fn = objects.lookupFunction<Signature>(symbol);
  INFO(fn.status().message());
  REQUIRE(fn.hasValue());
  return *fn;
}

// Loads an object holding kAffineKernel and checks k(x) = 2x + 1 on 40 values.
void checkAffineRuns(const CpuObject& object, const std::string& name) {
  LoadedObjects objects;
  REQUIRE(objects.add(object.bytes, name).isOk());
  auto* k = lookupOrFail<UnaryKernel>(objects, "k");
  std::vector<float> a = ramp(40), b(40);
  k(a.data(), b.data(), 40);
  for (size_t i = 0; i < a.size(); ++i) CHECK(b[i] == a[i] * 2.0f + 1.0f);
}

}  // namespace

TEST_CASE("cpu compiler: a kernel compiles, loads through the runtime and computes") {
  CpuObject object = compileOrFail(kAffineKernel, "affine");
  CHECK(object.bytes.size() > 100);
  CHECK(object.triple.find("x86_64") != std::string::npos);
  CHECK(object.cpu == kiln::codegen::hostTarget().cpu);
  CHECK(object.warnings.empty());

  LoadedObjects objects;
  REQUIRE(objects.add(object.bytes, "affine").isOk());
  CHECK(objects.numObjects() == 1);
  auto* k = lookupOrFail<UnaryKernel>(objects, "k");

  const long n = 1003;  // Not a multiple of the vector width: the remainder loop runs too.
  std::vector<float> a = ramp(n), b(static_cast<size_t>(n), -1.0f);
  k(a.data(), b.data(), n);
  for (long i = 0; i < n; ++i) {
    REQUIRE(b[static_cast<size_t>(i)] == a[static_cast<size_t>(i)] * 2.0f + 1.0f);
  }
}

TEST_CASE("cpu compiler: several kernels in one module, calling libm through the process") {
  const char* source = R"(
extern "C" void relu(const float* a, float* b, long n) {
  for (long i = 0; i < n; ++i) b[i] = a[i] > 0.0f ? a[i] : 0.0f;
}
extern "C" void expo(const float* a, float* b, long n) {
  for (long i = 0; i < n; ++i) b[i] = __builtin_expf(a[i]);
}
extern "C" void root(const float* a, float* b, long n) {
  for (long i = 0; i < n; ++i) b[i] = __builtin_sqrtf(a[i] < 0.0f ? -a[i] : a[i]);
}
extern "C" float sum(const float* a, long n) {
  float s = 0.0f;
  for (long i = 0; i < n; ++i) s += a[i];  // No fast-math: stays a sequential sum.
  return s;
}
)";
  CpuObject object = compileOrFail(source, "multi");
  LoadedObjects objects;
  REQUIRE(objects.add(object.bytes, "multi").isOk());
  auto* relu = lookupOrFail<UnaryKernel>(objects, "relu");
  auto* expo = lookupOrFail<UnaryKernel>(objects, "expo");
  auto* root = lookupOrFail<UnaryKernel>(objects, "root");
  auto* sum = lookupOrFail<float(const float*, long)>(objects, "sum");

  const long n = 600;
  std::vector<float> a = ramp(n), b(static_cast<size_t>(n));
  relu(a.data(), b.data(), n);
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(b[i] == (a[i] > 0.0f ? a[i] : 0.0f));
  expo(a.data(), b.data(), n);
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(b[i] == std::exp(a[i]));
  root(a.data(), b.data(), n);
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(b[i] == std::sqrt(std::fabs(a[i])));
  float expected = 0.0f;
  for (float x : a) expected += x;
  CHECK(sum(a.data(), n) == expected);  // Bit-exact: the same order of additions.
}

// The prelude's exponentials as generated kernels call them (vectorized, with the kernels'
// flags): kiln_vexp within 2 ulp of exp (in double) over its range, 0 below it (flushed), inf
// above, NaN for NaN; kiln_vexp_nonpos (softmax's, sigmoid's) the same bits wherever x <= 88;
// kiln_sigmoid within 3 ulp of 1 / (1 + e^-x) (in double) wherever that is a normal float (the
// negative tail included; below e^x's flush bound, a number under 1.2e-38). Every 211th float
// pattern, 20 million in all.
TEST_CASE("cpu compiler: the prelude's exponentials, over float patterns") {
  const std::string source = std::string(kiln::codegen::kernelPrelude()) + R"(
extern "C" void vexp(const float* a, float* b, long n) {
  for (long i = 0; i < n; ++i) b[i] = kiln_vexp(a[i]);
}
extern "C" void vexp_nonpos(const float* a, float* b, long n) {
  for (long i = 0; i < n; ++i) b[i] = kiln_vexp_nonpos(a[i]);
}
extern "C" void sigmoid(const float* a, float* b, long n) {
  for (long i = 0; i < n; ++i) b[i] = kiln_sigmoid(a[i]);
}
)";
  CpuObject object = compileOrFail(source, "exps");
  LoadedObjects objects;
  REQUIRE(objects.add(object.bytes, "exps").isOk());
  auto* vexp = lookupOrFail<UnaryKernel>(objects, "vexp");
  auto* nonpos = lookupOrFail<UnaryKernel>(objects, "vexp_nonpos");
  auto* sigmoid = lookupOrFail<UnaryKernel>(objects, "sigmoid");
  constexpr long kChunk = 1 << 16;
  std::vector<float> x(kChunk), e(kChunk), f(kChunk), s(kChunk);
  uint64_t pattern = 0, checked = 0, worstUlps = 0, worstSigmoidUlps = 0, failures = 0;
  std::string firstFailure;
  auto fail = [&](const char* what, float v, float got) {
    if (failures++ == 0)
      firstFailure = std::string(what) + ": x = " + std::to_string(v) + " (" +
                     std::to_string(std::bit_cast<uint32_t>(v)) + "), got " + std::to_string(got);
  };
  auto ordered = [](float v) {  // Floats as integers in their order (for ulp distances).
    int32_t i;
    std::memcpy(&i, &v, 4);
    return i < 0 ? int64_t{INT32_MIN} - i : int64_t{i};
  };
  while (pattern < (uint64_t{1} << 32)) {
    long n = 0;
    for (; n < kChunk && pattern < (uint64_t{1} << 32); ++n, pattern += 211) {
      const auto bits = static_cast<uint32_t>(pattern);
      std::memcpy(&x[static_cast<size_t>(n)], &bits, 4);
    }
    vexp(x.data(), e.data(), n);
    nonpos(x.data(), f.data(), n);
    sigmoid(x.data(), s.data(), n);
    for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
      const float v = x[i];
      if (std::isnan(v)) {
        if (!std::isnan(e[i]) || !std::isnan(f[i]) || !std::isnan(s[i]))
          fail("NaN in, not NaN out", v, e[i]);
        continue;
      }
      if (v <= 88.0f && std::memcmp(&e[i], &f[i], 4) != 0)
        fail("kiln_vexp_nonpos differs from kiln_vexp", v, f[i]);
      const double exactSigmoid = 1.0 / (1.0 + std::exp(-static_cast<double>(v)));
      if (v >= -87.3365f && exactSigmoid >= 1.1754943508222875e-38) {
        const uint64_t ulps = static_cast<uint64_t>(
            std::llabs(ordered(s[i]) - ordered(static_cast<float>(exactSigmoid))));
        if (ulps > 3) fail("kiln_sigmoid more than 3 ulp from 1 / (1 + e^-x)", v, s[i]);
        worstSigmoidUlps = std::max(worstSigmoidUlps, ulps);
      } else if (!(s[i] >= 0.0f && s[i] < 1.2e-38f)) {
        fail("kiln_sigmoid's tail not in [0, 1.2e-38)", v, s[i]);
      }
      const double exact = std::exp(static_cast<double>(v));
      if (v < -87.3365f) {
        if (e[i] != 0.0f) fail("not flushed to 0", v, e[i]);
      } else if (v > 88.7228394f) {
        if (e[i] != INFINITY) fail("not inf", v, e[i]);
      } else if (exact >= 1.1754943508222875e-38) {  // Normal results: at most 2 ulp.
        const uint64_t ulps =
            static_cast<uint64_t>(std::llabs(ordered(e[i]) - ordered(static_cast<float>(exact))));
        if (ulps > 2) fail("more than 2 ulp from exp", v, e[i]);
        worstUlps = std::max(worstUlps, ulps);
      }
      ++checked;
    }
  }
  INFO(firstFailure);
  CHECK(failures == 0);
  CHECK(checked > 15'000'000);
  CHECK(worstUlps >= 1);  // The comparisons see rounding differences at all.
  CHECK(worstSigmoidUlps >= 1);
  const float inf = INFINITY;
  float ends[2] = {inf, -inf}, out[2];
  sigmoid(ends, out, 2);
  CHECK(out[0] == 1.0f);
  CHECK(out[1] == 0.0f);
}

TEST_CASE("cpu compiler: no FMA contraction by default, so results round as the reference's") {
  const char* source = R"(
extern "C" void axpb(const float* a, float* b, long n) {
  for (long i = 0; i < n; ++i) b[i] = a[i] * 1.1f + 0.3f;
}
)";
  const long n = 4096;
  std::vector<float> a = ramp(n), b(static_cast<size_t>(n));
  LoadedObjects objects;
  REQUIRE(objects.add(compileOrFail(source, "separate").bytes, "separate").isOk());
  lookupOrFail<UnaryKernel>(objects, "axpb")(a.data(), b.data(), n);
  for (size_t i = 0; i < a.size(); ++i) {
    volatile float product = a[i] * 1.1f;  // Rounded once here, then again after the add.
    REQUIRE(b[i] == product + 0.3f);
  }

  CpuCompileOptions fused;
  fused.fpContract = true;
  LoadedObjects fusedObjects;
  REQUIRE(fusedObjects.add(compileOrFail(source, "fused", fused).bytes, "fused").isOk());
  lookupOrFail<UnaryKernel>(fusedObjects, "axpb")(a.data(), b.data(), n);
  int differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(b[i] == std::fma(a[i], 1.1f, 0.3f));  // One rounding: a fused multiply-add.
    volatile float product = a[i] * 1.1f;
    differ += b[i] != product + 0.3f;
  }
  CHECK(differ > 0);  // Otherwise this test would not tell the two apart.
  CHECK(compilerIdentity(fused) != compilerIdentity());
}

TEST_CASE("cpu compiler: a kernel may include standard headers") {
  const char* source = R"(#include <cmath>
#include <cstddef>
extern "C" void th(const float* a, float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) b[i] = std::tanh(a[i]);
}
)";
  CpuObject object = compileOrFail(source, "with_includes");
  LoadedObjects objects;
  REQUIRE(objects.add(object.bytes, "with_includes").isOk());
  auto* th = lookupOrFail<void(const float*, float*, size_t)>(objects, "th");
  std::vector<float> a = ramp(100), b(100);
  th(a.data(), b.data(), a.size());
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(b[i] == std::tanh(a[i]));
}

TEST_CASE("cpu compiler: a compile error is a Status with file, line and column") {
  const char* source =
      "extern \"C\" void k(const float* a, float* b, long n) {\n"
      "  for (long i = 0; i < n; ++i)\n"
      "    b[i] = a[i] * undeclared_thing;\n"
      "}\n";
  auto object = compileCpp(source, "broken kernel");
  REQUIRE_FALSE(object.hasValue());
  const kiln::Status status = object.status();
  CHECK(status.code() == ErrorCode::kInvalidArgument);
  INFO(status.message());
  CHECK(status.message().find("broken_kernel.cpp:3:19: error:") != std::string::npos);
  CHECK(status.message().find("undeclared_thing") != std::string::npos);

  // A second error later in the file is reported too, and a warning does not fail a compile.
  auto two = compileCpp("int f() { return x; }\nint g() { return y; }\n", "two");
  REQUIRE_FALSE(two.hasValue());
  CHECK(two.status().message().find("two.cpp:1:") != std::string::npos);
  CHECK(two.status().message().find("two.cpp:2:") != std::string::npos);
  auto warned = compileCpp("extern \"C\" int w(int x) { int unused; return x; }\n", "warned",
                           CpuCompileOptions{.extraArgs = {"-Wunused-variable"}});
  REQUIRE(warned.hasValue());
  CHECK(warned->warnings.find("warned.cpp:1:") != std::string::npos);
}

TEST_CASE("cpu compiler: bad options are errors, not crashes") {
  CpuCompileOptions badLevel;
  badLevel.optLevel = 7;
  CHECK(compileCpp(kAffineKernel, "k", badLevel).status().code() == ErrorCode::kInvalidArgument);
  CpuCompileOptions badFeature;
  badFeature.features = "avx2";
  CHECK(compileCpp(kAffineKernel, "k", badFeature).status().code() == ErrorCode::kInvalidArgument);
  CpuCompileOptions badFlag;
  badFlag.extraArgs = {"-fno-such-flag-exists"};
  auto bad = compileCpp(kAffineKernel, "k", badFlag);
  REQUIRE_FALSE(bad.hasValue());
  CHECK(bad.status().message().find("no-such-flag") != std::string::npos);
}

TEST_CASE("cpu compiler: code for a portable CPU runs too, and the identity tells them apart") {
  CpuCompileOptions portable;
  portable.cpu = "x86-64";
  portable.features = "";
  portable.optLevel = 2;
  checkAffineRuns(compileOrFail(kAffineKernel, "portable", portable), "portable");

  const std::string host = compilerIdentity();
  CHECK(host == compilerIdentity());  // Stable within a process.
  CHECK(host != compilerIdentity(portable));
  CHECK(host.find("clang version 16") != std::string::npos);
  CHECK(host.find(kiln::codegen::hostTarget().cpu) != std::string::npos);
  CHECK(host.find("-O3") != std::string::npos);
}

TEST_CASE("cpu compiler: four modules compile in parallel and all load") {
  std::vector<CpuSource> sources;
  for (int m = 0; m < 4; ++m) {
    const std::string scale = std::to_string(m + 2) + ".0f";
    sources.push_back({"extern \"C\" void k" + std::to_string(m) +
                           "(const float* a, float* b, long n) {\n"
                           "  for (long i = 0; i < n; ++i) b[i] = a[i] * " +
                           scale + ";\n}\n",
                       "par" + std::to_string(m)});
  }
  sources[2].source += "int oops = ;\n";  // One failure does not affect the others.
  const auto start = std::chrono::steady_clock::now();
  auto results = compileCppParallel(sources, {}, 4);
  const double wallMs =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  REQUIRE(results.size() == 4);
  REQUIRE_FALSE(results[2].hasValue());
  CHECK(results[2].status().message().find("par2.cpp:4:") != std::string::npos);
  sources[2].source.resize(sources[2].source.find("int oops"));
  results[2] = compileCpp(sources[2].source, sources[2].moduleName);

  LoadedObjects objects;
  double sumMs = 0;
  for (int m = 0; m < 4; ++m) {
    INFO(results[m].status().message());
    REQUIRE(results[m].hasValue());
    sumMs += results[m]->compileMs;
    REQUIRE(objects.add(results[m]->bytes, results[m]->moduleName).isOk());
  }
  std::printf(
      "[codegen] parallel compile of 4 modules on 4 threads: %.1f ms wall "
      "(%.1f ms summed over modules)\n",
      wallMs, sumMs);
  std::vector<float> a = ramp(64), b(64);
  for (int m = 0; m < 4; ++m) {
    auto* k = lookupOrFail<UnaryKernel>(objects, "k" + std::to_string(m));
    k(a.data(), b.data(), 64);
    CHECK(b[10] == a[10] * static_cast<float>(m + 2));
  }
}

TEST_CASE("cpu compiler: compile time per kernel (printed, not asserted)") {
  // Distinct sources so nothing is shared between compiles; a typical fused pointwise kernel.
  auto kernel = [](int i) {
    return "extern \"C\" void fused" + std::to_string(i) +
           "(const float* a, const float* c, float* b, long begin, long end) {\n"
           "  for (long j = begin; j < end; ++j) {\n"
           "    float x = a[j] + c[j] * " +
           std::to_string(i) +
           ".5f;\n"
           "    x = x > 0.0f ? x : 0.0f;\n"
           "    b[j] = x / (1.0f + __builtin_expf(-x));\n"
           "  }\n}\n";
  };
  std::vector<double> ms;
  for (int i = 0; i < 6; ++i) {
    const auto start = std::chrono::steady_clock::now();
    CpuObject object = compileOrFail(kernel(i), "timing" + std::to_string(i));
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::string all;
  for (double t : ms) all += std::to_string(static_cast<int>(t + 0.5)) + " ";
  std::printf(
      "[codegen] C++ kernel compile (source -> object, -O3, host CPU) ms per kernel: %s"
      "(first includes this process's first-use setup only if no compile ran before)\n",
      all.c_str());

  const auto start = std::chrono::steady_clock::now();
  CpuObject heavy = compileOrFail("#include <cmath>\n" + kernel(99), "timing_cmath");
  std::printf(
      "[codegen] the same kernel with #include <cmath>: %.1f ms\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
}

TEST_CASE("cpu compiler: compiling many kernels does not leak memory") {
  // Regression: cc1's -disable-free (added by the driver) leaked ~200 KB per compile.
  auto source = [](int i) {
    return "extern \"C\" void k(const float* a, float* b, long n) {\n"
           "  for (long j = 0; j < n; ++j) b[j] = a[j] * " +
           std::to_string(i) + ".0f;\n}\n";
  };
  compileOrFail(source(0), "warmup");
  const size_t before = ::mallinfo2().uordblks;
  for (int i = 1; i <= 20; ++i) compileOrFail(source(i), "leak" + std::to_string(i));
  const size_t after = ::mallinfo2().uordblks;
  const double growthKb = (static_cast<double>(after) - static_cast<double>(before)) / 1024.0;
  INFO("heap growth over 20 compiles: " << growthKb << " KB");
  CHECK(growthKb < 1024.0);
}

TEST_CASE("object loader: errors are Statuses") {
  LoadedObjects objects;
  // Nothing loaded yet.
  CHECK(objects.lookup("k").status().code() == ErrorCode::kNotFound);

  // Garbage and truncated objects are rejected before the JIT sees them.
  std::vector<std::byte> garbage(256, std::byte{0x5a});
  kiln::Status status = objects.add(garbage, "garbage");
  CHECK(status.code() == ErrorCode::kInvalidArgument);
  CHECK(status.message().find("garbage") != std::string::npos);
  CpuObject object = compileOrFail(kAffineKernel, "affine");
  std::vector<std::byte> truncated(object.bytes.begin(), object.bytes.begin() + 40);
  CHECK(objects.add(truncated, "truncated").code() == ErrorCode::kInvalidArgument);

  REQUIRE(objects.add(object.bytes, "affine").isOk());
  auto missing = objects.lookup("not_a_kernel");
  CHECK(missing.status().code() == ErrorCode::kNotFound);
  CHECK(missing.status().message().find("not_a_kernel") != std::string::npos);

  // The same symbol twice in one namespace.
  status = objects.add(object.bytes, "affine again");
  CHECK(status.code() == ErrorCode::kInvalidArgument);
  CHECK(status.message().find("uplicate") != std::string::npos);

  // A kernel calling a function nobody defines fails at lookup, naming the function.
  CpuObject dangling = compileOrFail(
      "extern \"C\" float kiln_missing_helper(float);\n"
      "extern \"C\" float calls(float x) { return kiln_missing_helper(x) + 1.0f; }\n",
      "dangling");
  REQUIRE(objects.add(dangling.bytes, "dangling").isOk());
  auto unresolved = objects.lookup("calls");
  REQUIRE_FALSE(unresolved.hasValue());
  CHECK(unresolved.status().code() == ErrorCode::kInvalidArgument);
  CHECK(unresolved.status().message().find("kiln_missing_helper") != std::string::npos);

  // The first kernel is unaffected.
  CHECK(objects.lookup("k").hasValue());
}

TEST_CASE("object loader: host compatibility check") {
  CpuObject object = compileOrFail(kAffineKernel, "affine");
  CHECK(kiln::runtime::checkHostCompatible(object.triple, object.features).isOk());
  kiln::Status foreign = kiln::runtime::checkHostCompatible("aarch64-unknown-linux-gnu", "+neon");
  CHECK(foreign.code() == ErrorCode::kInvalidArgument);
  CHECK(foreign.message().find("aarch64") != std::string::npos);
  kiln::Status future =
      kiln::runtime::checkHostCompatible(object.triple, "+sse2,+kiln-future-extension");
  CHECK(future.code() == ErrorCode::kInvalidArgument);
  CHECK(future.message().find("kiln-future-extension") != std::string::npos);
}

TEST_CASE("cpu compiler + kernel cache: a cached object loads and runs without recompiling") {
  char dirTemplate[] = "/tmp/kiln-cg-cache-XXXXXX";
  REQUIRE(::mkdtemp(dirTemplate) != nullptr);
  const std::filesystem::path dir = dirTemplate;
  kiln::codegen::KernelCache cache(dir, true);
  const CpuCompileOptions options;
  const kiln::codegen::CacheKey key = kiln::codegen::CacheKeyBuilder()
                                          .add("cpu-object")
                                          .add(kAffineKernel)
                                          .add(compilerIdentity(options))
                                          .finish();
  REQUIRE(cache.lookup(key).reason == kiln::codegen::CacheMissReason::kAbsent);
  CpuObject object = compileOrFail(kAffineKernel, "affine", options);
  REQUIRE(cache.store(key, object.bytes).isOk());

  auto entry = cache.lookup(key);
  REQUIRE(entry.hit);
  CHECK(entry.payload == object.bytes);  // Compiling is deterministic; so is the cache.
  LoadedObjects objects;
  REQUIRE(objects.add(entry.payload, "affine (cached)").isOk());
  auto* k = lookupOrFail<UnaryKernel>(objects, "k");
  std::vector<float> a = ramp(33), b(33);
  k(a.data(), b.data(), 33);
  CHECK(b[32] == a[32] * 2.0f + 1.0f);
  CpuObject again = compileOrFail(kAffineKernel, "affine", options);
  CHECK(again.bytes == object.bytes);
  std::filesystem::remove_all(dir);
}

TEST_CASE("cpu target: the host is a CPU Clang accepts, even when LLVM cannot name it") {
  const auto& host = kiln::codegen::hostTarget();
  CHECK(host.cpu != "generic");
  CHECK_FALSE(host.features.empty());
  if (kiln::codegen::hostCpuName() == "generic" || std::getenv("KILN_SIMULATE_HOST_CPU")) {
    // An unknown CPU: a microarchitecture level as the base, every host feature on top.
    CHECK(host.cpu.rfind("x86-64", 0) == 0);
    CHECK(host.tuneCpu == "generic");
    CHECK(host.note.find("unknown to LLVM") != std::string::npos);
    CHECK(host.features == kiln::codegen::hostCpuFeatures());
  } else {
    CHECK(host.cpu == kiln::codegen::hostCpuName());
  }
  // The host target compiles and runs (the test above compiled with it as the default too).
  CpuObject object = compileOrFail(kAffineKernel, "host_target");
  CHECK(object.cpu == host.cpu);
  checkAffineRuns(object, "host_target");
}

TEST_CASE("cpu target: a named level gives exactly the features it guarantees") {
  auto v3 = kiln::codegen::resolveCpuTarget("x86-64-v3");
  INFO(v3.status().message());
  REQUIRE(v3.hasValue());
  CHECK(v3->cpu == "x86-64-v3");
  CHECK(v3->tuneCpu == "generic");  // Clang takes levels as -march only, never as -mtune.
  CHECK(kiln::test::beyondX86_64V3(v3->features).empty());
  CHECK(v3->features.find('-') == std::string::npos);  // Nothing is switched off either.
  for (const char* needed : {"+avx2,", "+fma,", "+avx,", "+sse4.2,"})
    CHECK((v3->features + ",").find(needed) != std::string::npos);

  // Code for it compiles and runs here (every machine of these tests has AVX2).
  CpuCompileOptions options;
  options.cpu = v3->cpu;
  options.features = v3->features;
  options.tuneCpu = v3->tuneCpu;
  checkAffineRuns(compileOrFail(kAffineKernel, "v3", options), "v3");
  CHECK(compilerIdentity(options) != compilerIdentity());

  // "native" and "host" are this machine; a CPU Clang knows keeps its own name for tuning.
  CHECK(kiln::codegen::resolveCpuTarget("native")->cpu == kiln::codegen::hostTarget().cpu);
  CHECK(kiln::codegen::resolveCpuTarget("host")->cpu == kiln::codegen::hostTarget().cpu);
  CHECK(kiln::codegen::resolveCpuTarget("haswell")->tuneCpu == "haswell");
}

TEST_CASE("cpu target: an unknown name is an error that lists the valid ones") {
  for (const char* bad : {"generic", "pentium-9000", "x86-64-v9"}) {
    auto t = kiln::codegen::resolveCpuTarget(bad);
    REQUIRE_FALSE(t.hasValue());
    CHECK(t.status().code() == ErrorCode::kInvalidArgument);
    CHECK(t.status().message().find(std::string("'") + bad + "'") != std::string::npos);
    CHECK(t.status().message().find("x86-64-v3") != std::string::npos);
  }
  CpuCompileOptions options;
  options.cpu = "generic";
  auto object = compileCpp(kAffineKernel, "k", options);
  REQUIRE_FALSE(object.hasValue());
  CHECK(object.status().message().find("does not know the target CPU 'generic'") !=
        std::string::npos);
}

TEST_CASE("object loader: a kernel reads its constants when free memory lies far apart") {
  // LLVM 16's default linker (RuntimeDyld) mapped an object's code and its constants separately:
  // with a page free high up and room for the code only far below (a process with PyTorch's and
  // CUDA's libraries), the constants took the page, and the code's 32-bit references to them
  // were truncated without an error (a crash, or another page's bytes). Here every gap above an
  // 8 GB reservation is filled but one page at its top and 1 MB at its bottom.
  const char* source = R"(
extern "C" double pick(int i) {
  static const double table[4] = {1.25, -2.5, 3.75, 1e300};
  __asm__ volatile(".rept 3000\n nop\n .endr");  // Code larger than a page.
  return table[i & 3];
}
)";
  CpuObject object = compileOrFail(source, "far");
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE)), size = size_t{8} << 30;
  void* r = mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  REQUIRE(r != MAP_FAILED);
  const auto lo = reinterpret_cast<uintptr_t>(r), hi = lo + size;
  // The mappings above it; the gaps between them (not the one below the stack, where the
  // stack grows and mmap does not place) are filled.
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    uintptr_t a = 0, b = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &a, &b) == 2 && a >= hi &&
        line.find("[stack]") == std::string::npos && line.find("[v") == std::string::npos)
      ranges.push_back({a, b});
  }
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<void*, size_t>> fillers;
  uintptr_t at = hi;
  for (const auto& [a, b] : ranges) {
    if (a > at) {
      void* f = mmap(reinterpret_cast<void*>(at), a - at, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
      if (f != MAP_FAILED) fillers.push_back({f, a - at});
    }
    at = std::max(at, b);
  }
  REQUIRE(munmap(reinterpret_cast<void*>(hi - page), page) == 0);  // A page at the top,
  REQUIRE(munmap(r, size_t{1} << 20) == 0);                        // 1 MB at the bottom.
  double got[4] = {};
  {
    LoadedObjects objects;
    REQUIRE(objects.add(object.bytes, "far").isOk());
    auto* pick = lookupOrFail<double(int)>(objects, "pick");
    for (int i = 0; i < 4; ++i) got[i] = pick(i);
  }
  for (const auto& [f, n] : fillers) munmap(f, n);
  munmap(reinterpret_cast<void*>(lo + (size_t{1} << 20)), size - (size_t{1} << 20) - page);
  CHECK(got[0] == 1.25);
  CHECK(got[1] == -2.5);
  CHECK(got[2] == 3.75);
  CHECK(got[3] == 1e300);
}
