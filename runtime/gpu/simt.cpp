#include "runtime/gpu/simt.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <vector>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

// Sanitizers must be told about stack switches (else ASan checks a fiber's frames against the
// thread's stack bounds and keeps the poison of an abandoned fiber's frames, and TSan sees one
// thread's stack jump): the fiber annotations of their public interfaces.
#if defined(__SANITIZE_ADDRESS__)
#define KILN_ASAN_FIBERS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KILN_ASAN_FIBERS 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define KILN_TSAN_FIBERS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KILN_TSAN_FIBERS 1
#endif
#endif
#if KILN_ASAN_FIBERS
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if KILN_TSAN_FIBERS
#include <sanitizer/tsan_interface.h>
#endif

namespace kiln::runtime::gpu {

namespace {

// ---- Fiber stacks and context switches -------------------------------------------------------

constexpr size_t kStackBytes = 64 * 1024;  // Per thread; kernels use a few hundred bytes.

// A stack with a guard page below it: an overflow faults instead of corrupting a neighbour.
struct Stack {
  std::byte* base = nullptr;  // The guard page.
  size_t bytes = 0;
  std::byte* top() const { return base + bytes; }
};

size_t pageSize() {
  static const size_t p = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

// Stacks are kept per OS thread and reused by every launch on it.
struct StackPool {
  std::vector<Stack> stacks;
  ~StackPool() {
    for (const Stack& s : stacks) ::munmap(s.base, s.bytes);
  }
  Expected<std::byte*> top(size_t i) {
    while (stacks.size() <= i) {
      const size_t total = kStackBytes + pageSize();
      void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED)
        return resourceExhausted("emu: cannot map a " + std::to_string(total) +
                                 "-byte stack for a GPU thread");
      ::mprotect(p, pageSize(), PROT_NONE);
      stacks.push_back({static_cast<std::byte*>(p), total});
    }
    return stacks[i].top();
  }
};

thread_local StackPool tlsStacks;

struct Fiber;
void fiberMain(Fiber* f);

#if defined(__x86_64__)
// kiln_emu_switch(void** save, void* to): saves the callee-saved registers and the SSE/x87
// control words on the current stack, stores its stack pointer in *save and resumes the stack
// `to` saved the same way (or prepared by prepareStack).
extern "C" void kiln_emu_switch(void** save, void* to);
extern "C" void kiln_emu_fiber_start();
asm(R"(
  .text
  .p2align 4
  .globl kiln_emu_switch
  .type kiln_emu_switch,@function
kiln_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size kiln_emu_switch, .-kiln_emu_switch

  .p2align 4
  .globl kiln_emu_fiber_start
  .type kiln_emu_fiber_start,@function
kiln_emu_fiber_start:
  movq %rbx, %rdi
  call kiln_emu_fiber_main
  ud2
  .size kiln_emu_fiber_start, .-kiln_emu_fiber_start
)");

extern "C" void kiln_emu_fiber_main(Fiber* f) {
  fiberMain(f);
}

struct MachineContext {
  void* sp = nullptr;
};

// A stack that kiln_emu_switch resumes into kiln_emu_fiber_start with `f` in rbx.
void prepareMachine(MachineContext& c, std::byte* top, Fiber* f) {
  auto* s = reinterpret_cast<uint64_t*>(top - 80);  // 16-aligned after the return.
  uint32_t mxcsr;
  uint16_t fpcw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpcw));
  s[0] = mxcsr | (static_cast<uint64_t>(fpcw) << 32);
  s[1] = s[2] = s[3] = s[4] = 0;         // r15 r14 r13 r12
  s[5] = reinterpret_cast<uint64_t>(f);  // rbx
  s[6] = 0;                              // rbp
  s[7] = reinterpret_cast<uint64_t>(&kiln_emu_fiber_start);
  c.sp = s;
}

void switchMachine(MachineContext& from, MachineContext& to) {
  kiln_emu_switch(&from.sp, to.sp);
}
#else
struct MachineContext {
  ucontext_t uc;
};

void trampoline(unsigned hi, unsigned lo) {
  fiberMain(reinterpret_cast<Fiber*>((static_cast<uintptr_t>(hi) << 32) | lo));
}

void prepareMachine(MachineContext& c, std::byte* top, Fiber* f) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = top - kStackBytes;
  c.uc.uc_stack.ss_size = kStackBytes;
  c.uc.uc_link = nullptr;
  const auto p = reinterpret_cast<uintptr_t>(f);
  makecontext(&c.uc, reinterpret_cast<void (*)()>(&trampoline), 2, static_cast<unsigned>(p >> 32),
              static_cast<unsigned>(p));
}

void switchMachine(MachineContext& from, MachineContext& to) {
  swapcontext(&from.uc, &to.uc);
}
#endif

// A context to switch to: the machine state, and for the sanitizers the stack it runs on (a
// fiber's: set by prepare; the scheduler's, the OS thread's: learnt at a fiber's first entry)
// and TSan's fiber.
struct Context {
  MachineContext m;
  const void* stackBottom = nullptr;
  size_t stackSize = 0;
#if KILN_TSAN_FIBERS
  void* tsan = nullptr;  // Created by prepare, destroyed by release; the scheduler's: current.
#endif
};

void prepare(Context& c, std::byte* top, Fiber* f) {
#if KILN_ASAN_FIBERS
  // A fiber abandoned mid-kernel (a failed block) left its frames' redzones poisoned.
  __asan_unpoison_memory_region(top - kStackBytes, kStackBytes);
#endif
  c.stackBottom = top - kStackBytes;
  c.stackSize = kStackBytes;
#if KILN_TSAN_FIBERS
  if (!c.tsan) c.tsan = __tsan_create_fiber(0);
#endif
  prepareMachine(c.m, top, f);
}

void release(Context& c) {
#if KILN_TSAN_FIBERS
  if (c.tsan) __tsan_destroy_fiber(c.tsan);
  c.tsan = nullptr;
#endif
  (void)c;
}

// Switches from `from` (the running context) to `to`; returns when something switches back.
// `last`: `from` never runs again (a finished fiber), so ASan can drop its fake stack.
void switchTo(Context& from, Context& to, bool last = false) {
#if KILN_ASAN_FIBERS
  void* fakeStack = nullptr;
  __sanitizer_start_switch_fiber(last ? nullptr : &fakeStack, to.stackBottom, to.stackSize);
#endif
#if KILN_TSAN_FIBERS
  __tsan_switch_to_fiber(to.tsan, 0);
#endif
  switchMachine(from.m, to.m);
#if KILN_ASAN_FIBERS
  __sanitizer_finish_switch_fiber(fakeStack, nullptr, nullptr);
#endif
  (void)last;
}

// The first instructions of a fiber: ASan learns the stack it came from (the scheduler's).
void enterFiber(Context& scheduler) {
#if KILN_ASAN_FIBERS
  __sanitizer_finish_switch_fiber(nullptr, &scheduler.stackBottom, &scheduler.stackSize);
#endif
  (void)scheduler;
}

// ---- Blocks -----------------------------------------------------------------------------------

enum class State : uint8_t { kRunnable, kBlockBarrier, kWarpBarrier, kDone };

struct Block;

struct Fiber {
  Block* block = nullptr;
  Context ctx;
  kiln_emu_ctx coords{};
  State state = State::kRunnable;
  int linear = 0;  // Thread number in the block.
  alignas(16) unsigned char scratch[64];
};

struct Warp {
  int lanes = 32;
  int arrived = 0;
  uint64_t gen = 0;
  unsigned long long slots[2][32] = {};
};

struct Block {
  const SimtLaunch* launch = nullptr;
  Context scheduler;
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  int arrived = 0;  // At the block barrier.
  // __shared__ arrays by id: offsets into `shared`.
  std::map<int, size_t> sharedOffsets;
  std::vector<std::byte> shared;
  size_t sharedUsed = 0;
  bool failed = false;
  Status error;
};

thread_local Block* tlsBlock = nullptr;
thread_local Fiber* tlsFiber = nullptr;

std::string dim(const kiln_emu_dim3& d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

std::string where(const Fiber& f) {
  return "kernel '" + f.block->launch->kernel + "' block " + dim(f.coords.block_idx) + " thread " +
         dim(f.coords.thread_idx);
}

void fail(Block& b, Status s) {
  if (!b.failed) b.error = std::move(s);
  b.failed = true;
}

// Back to the scheduler; returns when the scheduler resumes this fiber.
void yield(Fiber& f) {
  switchTo(f.ctx, f.block->scheduler);
}

void fiberMain(Fiber* f) {
  enterFiber(f->block->scheduler);
  tlsFiber = f;
  f->block->launch->entry(f->block->launch->params);
  f->state = State::kDone;
  switchTo(f->ctx, f->block->scheduler, /*last=*/true);
  __builtin_trap();  // A finished fiber is never resumed.
}

// ---- The table kernels call ---------------------------------------------------------------

const kiln_emu_ctx* ctxFn() {
  return &tlsFiber->coords;
}

void syncthreadsFn() {
  Fiber& f = *tlsFiber;
  Block& b = *f.block;
  f.state = State::kBlockBarrier;
  if (++b.arrived == static_cast<int>(b.fibers.size())) {
    b.arrived = 0;
    for (Fiber& o : b.fibers) o.state = State::kRunnable;
    return;
  }
  yield(f);
  tlsFiber = &f;
}

unsigned long long shflFn(unsigned long long bits, int arg, int width, int mode) {
  Fiber& f = *tlsFiber;
  Block& b = *f.block;
  Warp& w = b.warps[static_cast<size_t>(f.linear / 32)];
  const int lane = f.linear % 32;
  const uint64_t gen = w.gen;
  w.slots[gen & 1][lane] = bits;
  f.state = State::kWarpBarrier;
  if (++w.arrived == w.lanes) {
    w.arrived = 0;
    ++w.gen;
    for (int l = 0; l < w.lanes; ++l)
      b.fibers[static_cast<size_t>(f.linear - lane + l)].state = State::kRunnable;
  } else {
    yield(f);
    tlsFiber = &f;
  }
  if (width <= 0 || width > 32 || (width & (width - 1)) != 0) {
    fail(b, invalidArgument(where(f) + ": shuffle width " + std::to_string(width) +
                            " is not a power of two up to 32"));
    return bits;
  }
  const int segment = lane / width * width;
  int src = lane;
  switch (mode) {
    case 0:
      src = lane + arg;
      if (src >= segment + width) src = lane;
      break;
    case 1:
      src = lane - arg;
      if (src < segment) src = lane;
      break;
    case 2:
      src = lane ^ arg;
      if (src < segment || src >= segment + width) src = lane;
      break;
    default:
      src = segment + ((arg % width) + width) % width;
      break;
  }
  if (src >= w.lanes) {
    fail(b, invalidArgument(where(f) + ": shuffle reads lane " + std::to_string(src) +
                            ", which this partial warp of " + std::to_string(w.lanes) +
                            " lanes does not have"));
    return bits;
  }
  return w.slots[gen & 1][src];
}

void* sharedFn(int id, unsigned long long bytes, unsigned long long align) {
  Fiber& f = *tlsFiber;
  Block& b = *f.block;
  auto it = b.sharedOffsets.find(id);
  if (it != b.sharedOffsets.end()) return b.shared.data() + it->second;
  const size_t a = std::max<size_t>(align, 16);
  const size_t offset = (b.sharedUsed + a - 1) / a * a;
  if (offset + bytes > b.shared.size()) {
    fail(b,
         invalidArgument(where(f) + ": __shared__ arrays need " + std::to_string(offset + bytes) +
                         " bytes; a block has " + std::to_string(b.shared.size())));
    return f.scratch;
  }
  b.sharedUsed = offset + bytes;
  b.sharedOffsets.emplace(id, offset);
  return b.shared.data() + offset;
}

void argRangeFn(int arg, char** begin, char** end) {
  const auto& ranges = tlsFiber->block->launch->ranges;
  if (arg < 0 || static_cast<size_t>(arg) >= ranges.size()) {
    *begin = *end = nullptr;
    return;
  }
  *begin = ranges[static_cast<size_t>(arg)].first;
  *end = ranges[static_cast<size_t>(arg)].second;
}

void* badAccessFn(int arg, long long byteOffset, int bytes, int kind) {
  Fiber& f = *tlsFiber;
  Block& b = *f.block;
  const auto& ranges = b.launch->ranges;
  const long long size =
      arg >= 0 && static_cast<size_t>(arg) < ranges.size()
          ? ranges[static_cast<size_t>(arg)].second - ranges[static_cast<size_t>(arg)].first
          : 0;
  if (kind == 2)
    fail(b, invalidArgument(where(f) + ": argument " + std::to_string(arg) +
                            (byteOffset ? " at byte offset " + std::to_string(byteOffset) : "") +
                            " is not aligned to " + std::to_string(bytes) + " bytes"));
  else
    fail(b, invalidArgument(where(f) + ": out-of-bounds " + (kind == 0 ? "read" : "access") +
                            " of " + std::to_string(bytes) + " bytes at byte offset " +
                            std::to_string(byteOffset) + " of argument " + std::to_string(arg) +
                            " (its buffer has " + std::to_string(size) + " bytes)"));
  std::memset(f.scratch, 0, sizeof f.scratch);
  return f.scratch;
}

const kiln_emu_rt kTable = {&ctxFn, &syncthreadsFn, &shflFn, &sharedFn, &argRangeFn, &badAccessFn};

// Why no fiber can run although some have not finished.
Status stuck(const Block& b) {
  int done = 0, atBarrier = 0, atShuffle = 0;
  const Fiber* exited = nullptr;
  const Fiber* waiting = nullptr;
  for (const Fiber& f : b.fibers) {
    if (f.state == State::kDone) {
      ++done;
      if (!exited) exited = &f;
    } else if (f.state == State::kBlockBarrier) {
      ++atBarrier;
      if (!waiting) waiting = &f;
    } else if (f.state == State::kWarpBarrier) {
      ++atShuffle;
      if (!waiting) waiting = &f;
    }
  }
  const int n = static_cast<int>(b.fibers.size());
  std::string s =
      "kernel '" + b.launch->kernel + "' block " + dim(b.fibers.front().coords.block_idx) + ": ";
  if (atBarrier > 0 && atShuffle == 0)
    s += "__syncthreads reached by " + std::to_string(atBarrier) + " of " + std::to_string(n) +
         " threads" +
         (exited ? " (thread " + dim(exited->coords.thread_idx) + " had exited)" : "") +
         "; a barrier must be reached by every thread of the block";
  else if (atShuffle > 0 && atBarrier == 0)
    s += "a warp shuffle waits for lanes that exited (thread " + dim(waiting->coords.thread_idx) +
         " waits" + (exited ? ", thread " + dim(exited->coords.thread_idx) + " had exited" : "") +
         "); every lane named in the mask must take part";
  else
    s += "deadlock: " + std::to_string(atBarrier) + " threads at __syncthreads, " +
         std::to_string(atShuffle) + " at a warp shuffle, " + std::to_string(done) +
         " exited (thread " + dim(waiting->coords.thread_idx) + " waits)";
  return invalidArgument(s);
}

Status runBlock(Block& b, const kiln_emu_dim3& blockIdx) {
  const SimtLaunch& l = *b.launch;
  const size_t n = b.fibers.size();
  for (size_t i = 0; i < n; ++i) {
    Fiber& f = b.fibers[i];
    f.block = &b;
    f.state = State::kRunnable;
    f.linear = static_cast<int>(i);
    f.coords.thread_idx = {static_cast<unsigned>(i % l.block.x),
                           static_cast<unsigned>(i / l.block.x % l.block.y),
                           static_cast<unsigned>(i / (uint64_t{l.block.x} * l.block.y))};
    f.coords.block_idx = blockIdx;
    f.coords.block_dim = {l.block.x, l.block.y, l.block.z};
    f.coords.grid_dim = {l.grid.x, l.grid.y, l.grid.z};
    KILN_ASSIGN_OR_RETURN(std::byte * top, tlsStacks.top(i));
    prepare(f.ctx, top, &f);
  }
  for (Warp& w : b.warps) {
    w.arrived = 0;
    w.gen = 0;
  }
  b.arrived = 0;
  b.sharedOffsets.clear();
  b.sharedUsed = l.dynamicSharedBytes;
  size_t done = 0;
  while (done < n && !b.failed) {
    bool progress = false;
    for (Fiber& f : b.fibers) {
      if (f.state != State::kRunnable) continue;
      progress = true;
      tlsFiber = &f;
      switchTo(b.scheduler, f.ctx);
      if (f.state == State::kDone) ++done;
      if (b.failed) break;
    }
    if (!progress && done < n) fail(b, stuck(b));
  }
  tlsFiber = nullptr;
  return b.failed ? b.error : Status::ok();
}

}  // namespace

const kiln_emu_rt& emuRuntime() {
  return kTable;
}

Status runGrid(const SimtLaunch& l) {
  const uint64_t threads = l.block.count();
  if (threads == 0 || l.grid.count() == 0)
    return invalidArgument("kernel '" + l.kernel + "': empty launch (grid " +
                           std::to_string(l.grid.count()) + " blocks of " +
                           std::to_string(threads) + " threads)");
  if (threads > static_cast<uint64_t>(l.maxThreadsPerBlock))
    return invalidArgument("kernel '" + l.kernel + "': " + std::to_string(threads) +
                           " threads per block; the device allows " +
                           std::to_string(l.maxThreadsPerBlock));
  if (static_cast<int64_t>(l.dynamicSharedBytes) > l.sharedLimit)
    return invalidArgument("kernel '" + l.kernel + "': " + std::to_string(l.dynamicSharedBytes) +
                           " bytes of dynamic shared memory; a block has " +
                           std::to_string(l.sharedLimit));
  if (tlsBlock) return internalError("emu: a kernel launched another kernel");
  Block b;
  b.launch = &l;
  b.fibers.resize(threads);
  b.warps.resize((threads + 31) / 32);
  for (size_t w = 0; w < b.warps.size(); ++w)
    b.warps[w].lanes = static_cast<int>(std::min<uint64_t>(32, threads - w * 32));
  b.shared.resize(static_cast<size_t>(l.sharedLimit));
#if KILN_TSAN_FIBERS
  b.scheduler.tsan = __tsan_get_current_fiber();
#endif
  tlsBlock = &b;
  Status s;
  for (uint32_t z = 0; z < l.grid.z && s.isOk(); ++z)
    for (uint32_t y = 0; y < l.grid.y && s.isOk(); ++y)
      for (uint32_t x = 0; x < l.grid.x && s.isOk(); ++x) s = runBlock(b, {x, y, z});
  tlsBlock = nullptr;
  for (Fiber& f : b.fibers) release(f.ctx);  // Their stacks stay in the thread's pool.
  return s;
}

}  // namespace kiln::runtime::gpu
