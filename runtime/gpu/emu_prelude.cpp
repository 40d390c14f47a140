#include "runtime/gpu/emu_abi.h"
#include "runtime/gpu/emu_device.h"

namespace kiln::runtime::gpu {

std::string_view emuKernelPrelude() {
  static const std::string text =
      std::string(R"KILN(// kiln emu prelude: CUDA C on the host (runtime/gpu/simt.h).
#define KILN_EMU 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __restrict__ __restrict
extern "C" {
)KILN") +
      kEmuAbiText + R"KILN(
extern const struct kiln_emu_rt kiln_emu_runtime;
}
#define threadIdx (kiln_emu_runtime.ctx()->thread_idx)
#define blockIdx (kiln_emu_runtime.ctx()->block_idx)
#define blockDim (kiln_emu_runtime.ctx()->block_dim)
#define gridDim (kiln_emu_runtime.ctx()->grid_dim)
#define warpSize 32
static inline void __syncthreads() { kiln_emu_runtime.syncthreads(); }
static inline unsigned long long atomicMin(unsigned long long* a, unsigned long long v) {
  return __atomic_fetch_min(a, v, __ATOMIC_RELAXED);
}
static inline unsigned long long atomicAdd(unsigned long long* a, unsigned long long v) {
  return __atomic_fetch_add(a, v, __ATOMIC_RELAXED);
}
template <class T> static inline T kiln_emu_shfl(T v, int arg, int width, int mode) {
  static_assert(sizeof(T) <= 8, "shuffles move at most 8 bytes");
  unsigned long long bits = 0;
  __builtin_memcpy(&bits, &v, sizeof(T));
  bits = kiln_emu_runtime.shfl(bits, arg, width, mode);
  T r;
  __builtin_memcpy(&r, &bits, sizeof(T));
  return r;
}
template <class T> static inline T __shfl_down_sync(unsigned, T v, unsigned d, int w = 32) { return kiln_emu_shfl(v, (int)d, w, 0); }
template <class T> static inline T __shfl_up_sync(unsigned, T v, unsigned d, int w = 32) { return kiln_emu_shfl(v, (int)d, w, 1); }
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int m, int w = 32) { return kiln_emu_shfl(v, m, w, 2); }
template <class T> static inline T __shfl_sync(unsigned, T v, int l, int w = 32) { return kiln_emu_shfl(v, l, w, 3); }
// A block's __shared__ array: the same memory for every thread of the block.
#define KILN_SHARED(T, name, n) T* name = (T*)kiln_emu_runtime.shared(__COUNTER__, sizeof(T) * (n), alignof(T))
template <class T> struct kiln_emu_is_const { static constexpr bool value = false; };
template <class T> struct kiln_emu_is_const<const T> { static constexpr bool value = true; };
// A kernel's pointer argument: every access is checked against the bytes the launch gave it.
template <class T> struct kiln_gptr {
  T* p;
  const char* b;
  const char* e;
  int arg;
  T& operator[](long long i) const {
    const char* q = (const char*)(p + i);
    if (q < b || q + sizeof(T) > e)
      return *(T*)kiln_emu_runtime.bad_access(arg, (long long)(q - b), (int)sizeof(T), kiln_emu_is_const<T>::value ? 0 : 1);
    return p[i];
  }
  static kiln_gptr make(void* param, int arg) {
    kiln_gptr g;
    g.p = *(T**)param;
    g.arg = arg;
    char *b, *e;
    kiln_emu_runtime.arg_range(arg, &b, &e);
    g.b = b;
    g.e = e;
    if ((unsigned long long)g.p % alignof(T) != 0) kiln_emu_runtime.bad_access(arg, 0, (int)alignof(T), 2);
    return g;
  }
};
// float4 and the vector accesses of kiln's pointwise kernels: 16 bytes in bounds, and 16-byte
// aligned (a GPU faults on a misaligned vector access; emu names it).
struct alignas(16) float4 { float x, y, z, w; };
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
template <class T> static inline bool kiln_aligned16(const kiln_gptr<T>& g) {
  return (unsigned long long)g.p % 16 == 0;
}
template <class T> static inline float4* kiln_emu_vec(const kiln_gptr<T>& g, long long i, int write) {
  static_assert(sizeof(T) == 4, "float4 accesses of 4-byte elements");
  const char* q = (const char*)(g.p + i);
  if (q < g.b || q + 16 > g.e) return (float4*)kiln_emu_runtime.bad_access(g.arg, (long long)(q - g.b), 16, write);
  if ((unsigned long long)q % 16 != 0) return (float4*)kiln_emu_runtime.bad_access(g.arg, (long long)(q - g.b), 16, 2);
  return (float4*)q;
}
template <class T> static inline float4 kiln_ld4(const kiln_gptr<T>& g, long long i) { return *kiln_emu_vec(g, i, 0); }
template <class T> static inline void kiln_st4(const kiln_gptr<T>& g, long long i, float4 v) { *kiln_emu_vec(g, i, 1) = v; }
template <class A> struct kiln_emu_param { static A get(void* p, int) { return *(A*)p; } };
template <class T> struct kiln_emu_param<kiln_gptr<T>> { static kiln_gptr<T> get(void* p, int i) { return kiln_gptr<T>::make(p, i); } };
template <class T, T... I> struct kiln_emu_iseq {};
template <class... A, int... I> static inline void kiln_emu_call_(void (*k)(A...), void** p, kiln_emu_iseq<int, I...>) {
  k(kiln_emu_param<A>::get(p[I], I)...);
}
template <class... A> static inline void kiln_emu_call(void (*k)(A...), void** p) {
  kiln_emu_call_(k, p, __make_integer_seq<kiln_emu_iseq, int, sizeof...(A)>{});
}
// The entry the emu device launches for kernel `name` (cuLaunchKernel's parameter array).
#define KILN_EMU_ENTRY(name) extern "C" void kiln_emu_entry_##name(void** p) { kiln_emu_call(name, p); }
)KILN";
  return text;
}

}  // namespace kiln::runtime::gpu
