#include "compiler/machine_peak.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include "codegen/cpu_compiler.h"
#include "runtime/object_loader.h"

namespace kiln::compiler {

namespace {

bool hasFeature(const std::string& features, const std::string& f) {
  return ("," + features + ",").find(",+" + f + ",") != std::string::npos;
}

// kiln_peak_fma(state, iters): `chains` chains a = a * b + c over `lanes`-wide vectors, `iters`
// times; b and c are read from state too. b < 1 keeps every chain near c / (1 - b) (no
// overflow, no subnormals).
std::string peakSource(int lanes, int chains) {
  std::string s = "typedef float vf __attribute__((ext_vector_type(" + std::to_string(lanes) +
                  ")));\n"
                  "extern \"C\" void kiln_peak_fma(float* state, long iters) {\n"
                  "  vf b, c;\n"
                  "  __builtin_memcpy(&b, state, sizeof b);\n"
                  "  __builtin_memcpy(&c, state + " +
                  std::to_string(lanes) + ", sizeof c);\n";
  for (int i = 0; i < chains; ++i)
    s += "  vf a" + std::to_string(i) + ";\n  __builtin_memcpy(&a" + std::to_string(i) +
         ", state + " + std::to_string((i + 2) * lanes) + ", sizeof(vf));\n";
  s += "  for (long it = 0; it < iters; ++it) {\n";
  for (int i = 0; i < chains; ++i)
    s += "    a" + std::to_string(i) + " = a" + std::to_string(i) + " * b + c;\n";
  s += "  }\n";
  for (int i = 0; i < chains; ++i)
    s += "  __builtin_memcpy(state + " + std::to_string((i + 2) * lanes) + ", &a" +
         std::to_string(i) + ", sizeof(vf));\n";
  s += "}\n";
  // A plain copy loop, vectorized by Clang with ordinary stores (-fno-builtin: not a memcpy).
  s += "extern \"C\" void kiln_peak_copy(const float* __restrict src, float* __restrict dst,\n"
       "                               long n) {\n"
       "  for (long i = 0; i < n; ++i) dst[i] = src[i];\n"
       "}\n";
  return s;
}

double cpuinfoMHz() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("cpu MHz", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return std::atof(line.c_str() + colon + 1);
    }
  return 0;
}

// Runs f(t) on `threads` threads at once, `reps` times; the shortest wall time in seconds.
template <class F>
double bestParallelSeconds(int threads, int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    std::vector<std::thread> pool;
    const auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { f(t); });
    for (auto& th : pool) th.join();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

Expected<MachinePeak> measureMachinePeak(int threads) {
  MachinePeak p;
  p.threads = std::max(1, threads);
  const codegen::CpuTarget& target = codegen::hostTarget();
  // 16 chains of 16 lanes with AVX-512 (32 vector registers), 12 of 8 with AVX2 (16 registers:
  // 12 chains, b and c): at least latency (4) x FMA units (2) chains in flight either way.
  if (hasFeature(target.features, "avx512f"))
    p.lanes = 16, p.chains = 16, p.isa = "avx512f";
  else if (hasFeature(target.features, "avx2") && hasFeature(target.features, "fma"))
    p.lanes = 8, p.chains = 12, p.isa = "avx2+fma";
  else
    p.lanes = 4, p.chains = 12, p.isa = "sse";
  codegen::CpuCompileOptions options;
  options.fpContract = true;  // a * b + c as one FMA where the CPU has it.
  // The copy loop stays a loop: without this Clang turns it into a call of memcpy.
  options.extraArgs = {"-fno-builtin"};
  KILN_ASSIGN_OR_RETURN(codegen::CpuObject object,
                        codegen::compileCpp(peakSource(p.lanes, p.chains), "kiln_peak", options));
  runtime::LoadedObjects loaded;
  KILN_TRY(loaded.add(object.bytes, "kiln_peak"));
  KILN_ASSIGN_OR_RETURN(auto* fma, loaded.lookupFunction<void(float*, long)>("kiln_peak_fma"));
  KILN_ASSIGN_OR_RETURN(auto* copy,
                        loaded.lookupFunction<void(const float*, float*, long)>("kiln_peak_copy"));

  // Per thread: b, c, then the chains; a cache line apart from the other threads' state.
  const size_t stride = static_cast<size_t>((p.chains + 2) * p.lanes + 16);
  std::vector<float> state(stride * static_cast<size_t>(p.threads));
  auto reset = [&] {
    for (int t = 0; t < p.threads; ++t) {
      float* s = state.data() + stride * static_cast<size_t>(t);
      for (int l = 0; l < p.lanes; ++l) s[l] = 0.999999f, s[p.lanes + l] = 1e-6f;
      for (int i = 0; i < p.chains * p.lanes; ++i)
        s[2 * p.lanes + i] = 1.0f + 0.001f * static_cast<float>(i + t);
    }
  };
  // Iterations for about 0.1 s on one thread.
  reset();
  long iters = 1 << 16;
  for (;;) {
    const double s = bestParallelSeconds(1, 1, [&](int) { fma(state.data(), iters); });
    if (s > 0.05 || iters > (1L << 40)) {
      iters = static_cast<long>(static_cast<double>(iters) * 0.1 / std::max(s, 1e-9));
      break;
    }
    iters *= 4;
  }
  reset();
  const double fmaSeconds = bestParallelSeconds(
      p.threads, 3, [&](int t) { fma(state.data() + stride * static_cast<size_t>(t), iters); });
  p.gflops = 2.0 * p.lanes * p.chains * static_cast<double>(iters) * p.threads / fmaSeconds / 1e9;
  p.impliedGHz = p.gflops / (p.threads * 2.0 * 2.0 * p.lanes);
  p.cpuinfoMHz = cpuinfoMHz();

  // A copy far larger than the caches, split into one slice per thread.
  p.copyBytes = int64_t{256} << 20;
  std::unique_ptr<char[]> src(new char[static_cast<size_t>(p.copyBytes)]);
  std::unique_ptr<char[]> dst(new char[static_cast<size_t>(p.copyBytes)]);
  std::memset(src.get(), 1, static_cast<size_t>(p.copyBytes));
  std::memset(dst.get(), 0, static_cast<size_t>(p.copyBytes));  // Pages mapped before timing.
  const size_t slice = static_cast<size_t>(p.copyBytes) / static_cast<size_t>(p.threads);
  const double memcpySeconds = bestParallelSeconds(p.threads, 3, [&](int t) {
    const size_t begin = slice * static_cast<size_t>(t);
    std::memcpy(dst.get() + begin, src.get() + begin, slice);
  });
  const double loopSeconds = bestParallelSeconds(p.threads, 3, [&](int t) {
    const size_t begin = slice * static_cast<size_t>(t);
    copy(reinterpret_cast<const float*>(src.get() + begin),
         reinterpret_cast<float*>(dst.get() + begin), static_cast<long>(slice / sizeof(float)));
  });
  p.copyGBps =
      2.0 * static_cast<double>(slice) * p.threads / std::min(memcpySeconds, loopSeconds) / 1e9;
  return p;
}

}  // namespace kiln::compiler
