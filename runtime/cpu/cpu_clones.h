// KILN_CPU_CLONES: AVX-512, AVX2 and baseline copies of a hot loop of the runtime's kernels
// (library and reference), the loader picking the one this CPU runs (the runtime is compiled
// for every x86-64).
#pragma once

// Off under ThreadSanitizer, whose
// runtime is not up yet when the loader runs the clones' resolvers (every TSan binary crashed
// at start).
#if defined(__SANITIZE_THREAD__)
#define KILN_NO_CPU_CLONES 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KILN_NO_CPU_CLONES 1
#endif
#endif
#if defined(KILN_NO_CPU_CLONES) || !defined(__x86_64__)
#define KILN_CPU_CLONES
#else
#define KILN_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
