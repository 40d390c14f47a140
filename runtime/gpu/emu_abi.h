// The interface between kernels compiled for the emulation device and its SIMT runtime
// (simt.cpp): one C struct of functions that the emu prelude (emu_prelude.cpp) calls for
// threadIdx & co., __syncthreads, warp shuffles, __shared__ arrays and failed bound checks.
// Written once, as a macro that is both compiled here and stringified into the prelude, so the
// two sides cannot disagree.
#pragma once

#define KILN_EMU_ABI                                                                    \
  struct kiln_emu_dim3 {                                                                \
    unsigned x, y, z;                                                                   \
  };                                                                                    \
  /* The calling thread's coordinates. */                                               \
  struct kiln_emu_ctx {                                                                 \
    struct kiln_emu_dim3 thread_idx, block_idx, block_dim, grid_dim;                    \
  };                                                                                    \
  struct kiln_emu_rt {                                                                  \
    const struct kiln_emu_ctx* (*ctx)(void);                                            \
    /* A barrier of the whole block. */                                                 \
    void (*syncthreads)(void);                                                          \
    /* A shuffle among the lanes of the caller's warp: mode 0 down (arg: delta), 1 up   \
       (delta), 2 xor (lane mask), 3 idx (source lane); `width` lanes per segment. */   \
    unsigned long long (*shfl)(unsigned long long bits, int arg, int width, int mode);  \
    /* The block's __shared__ array number `id` (the same pointer for every thread). */ \
    void* (*shared)(int id, unsigned long long bytes, unsigned long long align);        \
    /* Kernel argument `arg` (a pointer) may touch [*begin, *end). */                   \
    void (*arg_range)(int arg, char** begin, char** end);                               \
    /* Records a failed check (kind 0 read, 1 read or write, 2 misaligned argument) of  \
       `bytes` bytes at `byte_offset` from argument `arg`'s start, and returns scratch  \
       memory the access may use instead. */                                            \
    void* (*bad_access)(int arg, long long byte_offset, int bytes, int kind);           \
  };

#define KILN_EMU_STR_(...) #__VA_ARGS__
#define KILN_EMU_STR(...) KILN_EMU_STR_(__VA_ARGS__)

extern "C" {
KILN_EMU_ABI
}

namespace kiln::runtime::gpu {

// The ABI above as source text, for the emu prelude.
inline constexpr const char* kEmuAbiText = KILN_EMU_STR(KILN_EMU_ABI);

}  // namespace kiln::runtime::gpu
