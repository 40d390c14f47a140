// This machine's peaks, measured: the fp32 FMA rate of `threads` cores and the bandwidth of a
// multi-threaded copy. Every "% of peak" kiln prints (kiln profile, kiln bench-kernels --peak)
// comes from here, measured in the same run as what it is compared with.
#pragma once

#include <string>

#include "ir/status.h"

namespace kiln::compiler {

struct MachinePeak {
  int threads = 0;
  // fp32: a kernel of `chains` independent FMA chains of `lanes`-wide vectors per thread,
  // compiled for this CPU by kiln's Clang; each chain's start is read from memory and its end
  // written back, so that the compiler can neither fold chains together nor drop them.
  double gflops = 0;
  int lanes = 0, chains = 0;
  std::string isa;  // "avx512f", "avx2+fma", "sse" (the vectors the kernel used).
  // A check against cores x clock x FLOPs per cycle: the clock at which `threads` cores with
  // two FMA units of `lanes` lanes would give `gflops`, beside the clock /proc/cpuinfo reports
  // (0 when it reports none; in a VM often the nominal one, below the boost clock).
  double impliedGHz = 0;
  double cpuinfoMHz = 0;
  // A copy of `copyBytes` split over the threads, the better of memcpy and a plain vectorized
  // loop (memcpy's non-temporal stores are slower on some machines): bytes read plus bytes
  // written per second.
  double copyGBps = 0;
  int64_t copyBytes = 0;
};

// About 0.3 s of work per figure, best of three repetitions.
Expected<MachinePeak> measureMachinePeak(int threads);

}  // namespace kiln::compiler
