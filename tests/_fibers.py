"""The C++ emulators' GPU threads as cooperative fibers on the calling OS thread (tests/_kernel_emulator.py's
HARNESS and tests/test_attention_kernels_emulated.py's HEADER include FIBERS).

A launch's threads were one std::thread each, meeting at std::barrier for every threadgroup barrier, warp sync and
warp shuffle: on a 2-core CI machine, hundreds of OS threads context-switching at every shuffle. Here each GPU
thread is a fiber with its own stack; `VqBarrier::arrive_and_wait` (the std::barrier call the preludes make) marks
the fiber arrived and switches to the next runnable one, and the last of the barrier's members to arrive makes all of
them runnable again. Between two barriers a fiber runs alone, so a launch is one sequentially consistent
interleaving, picked by `vq_fiber_reverse`: members resume in lane order (0) or against it (1), so a missing
barrier or a read of another lane's slot before it is written shows the same way on every run instead of by chance.
A barrier that can never complete (threads of one group waiting at different counts) aborts with a message; the
std::barrier version hung.

x86-64 switches with a few instructions (the System V callee-saved registers and the stack pointer); elsewhere, or
with -DVQ_FIBER_UCONTEXT, POSIX swapcontext, which also saves the signal mask (a syscall per switch). Per-thread
state (the preludes' thread_local vq_tid, vq_lane, vq_bx...) is a plain int registered with vq_fiber_vars, saved
and restored on every switch. A launch's stacks are one mapping, unmapped after it; a canary word at the low end of each
stack is checked then (an overflow aborts with a message; -DVQ_FIBER_PEAK measures the deepest use).
"""

FIBERS = r"""
#include <sys/mman.h>
#include <algorithm>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>
#if !defined(__x86_64__) || defined(VQ_FIBER_UCONTEXT)
#define VQ_FIBER_UCONTEXT 1
#include <ucontext.h>
#endif
#ifndef VQ_FIBER_STACK
#define VQ_FIBER_STACK (256 << 10)
#endif

struct VqFiber {
#ifdef VQ_FIBER_UCONTEXT
  ucontext_t uc;
#else
  void* sp;
#endif
  int vars[8];
};
static std::vector<VqFiber> vq_fibers;
static std::vector<int> vq_ready;                 // runnable fibers, a ring of vq_fibers.size() + 1 slots
static size_t vq_rhead, vq_rtail;
static int vq_fcur = -1, vq_fdone;
static int* vq_fvar[8];
static int vq_nfvar;
static int vq_fiber_reverse = 0;
static void (*vq_fbody)(void*, int);
static void* vq_fctx;
#ifdef VQ_FIBER_UCONTEXT
static ucontext_t vq_fmain;
#else
static void* vq_fmain;
// vq_ctx_switch(save, to): push the callee-saved registers, save the stack pointer to *save, load `to`, pop them
asm(R"(
.text
.p2align 4
.type vq_ctx_switch, @function
vq_ctx_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size vq_ctx_switch, .-vq_ctx_switch
)");
extern "C" void vq_ctx_switch(void** save, void* to);
#endif

// the per-thread ints of the prelude (vq_tid, vq_lane, ...): saved and restored on every switch
static void vq_fiber_vars(std::initializer_list<int*> vars) {
  vq_nfvar = 0;
  for (int* v : vars) vq_fvar[vq_nfvar++] = v;
}
static inline void vq_push(int f) { vq_ready[vq_rtail] = f; vq_rtail = (vq_rtail + 1) % vq_ready.size(); }

// switch from the running fiber (or, from < 0, the launching context) to fiber `to` (< 0: back to the launcher)
static void vq_switch(int from, int to) {
  if (from == to) return;
  if (from >= 0) for (int i = 0; i < vq_nfvar; ++i) vq_fibers[from].vars[i] = *vq_fvar[i];
  if (to >= 0) for (int i = 0; i < vq_nfvar; ++i) *vq_fvar[i] = vq_fibers[to].vars[i];
  vq_fcur = to;
#ifdef VQ_FIBER_UCONTEXT
  swapcontext(from < 0 ? &vq_fmain : &vq_fibers[from].uc, to < 0 ? &vq_fmain : &vq_fibers[to].uc);
#else
  vq_ctx_switch(from < 0 ? &vq_fmain : &vq_fibers[from].sp, to < 0 ? vq_fmain : vq_fibers[to].sp);
#endif
}

// the running fiber waits: the next runnable one runs; none runnable with fibers unfinished is a deadlock
static void vq_yield_blocked() {
  if (vq_rhead == vq_rtail) {
    if (vq_fdone == (int)vq_fibers.size()) { vq_switch(vq_fcur, -1); return; }
    std::fprintf(stderr, "vq fibers: deadlock, %d of %d threads wait at a barrier that cannot complete\n",
                 (int)vq_fibers.size() - vq_fdone, (int)vq_fibers.size());
    std::abort();
  }
  const int next = vq_ready[vq_rhead];
  vq_rhead = (vq_rhead + 1) % vq_ready.size();
  vq_switch(vq_fcur, next);
}

// std::barrier's arrive_and_wait over the fibers first .. first + count - 1 (a warp, or the launch's threads)
struct VqBarrier {
  int first, count, arrived = 0;
  VqBarrier(int f, int n) : first(f), count(n) {}
  void arrive_and_wait() {
    if (++arrived == count) {
      arrived = 0;
      for (int i = 0; i < count; ++i) vq_push(first + (vq_fiber_reverse ? count - 1 - i : i));
    }
    vq_yield_blocked();
  }
};

static void vq_fiber_entry() {
  vq_fbody(vq_fctx, vq_fcur);
  ++vq_fdone;
  vq_yield_blocked();
  std::abort();                                   // a finished fiber is never resumed
}

// the launch's stacks: one mapping (a mapping per stack, kept per library, ran into vm.max_map_count in one pytest
// process), a PROT_NONE page below the lowest, a canary word at the low end of each, checked after the launch
static const uint64_t vq_canary = 0x5a17c0de5a17c0deull;
static char* vq_fiber_stacks(int n, size_t* bytes) {
  const size_t guard = 4096;
  *bytes = guard + (size_t)n * VQ_FIBER_STACK;
  void* p = mmap(nullptr, *bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) { std::perror("vq fibers: mmap"); std::abort(); }
  mprotect(p, guard, PROT_NONE);
  char* base = (char*)p + guard;
  for (int i = 0; i < n; ++i) std::memcpy(base + (size_t)i * VQ_FIBER_STACK, &vq_canary, 8);
  return base;
}
#ifdef VQ_FIBER_PEAK
// the most stack any fiber used (the deepest byte written: stacks start zero), for sizing VQ_FIBER_STACK
static long vq_fiber_peak = 0;
extern "C" long vq_fiber_stack_peak() { return vq_fiber_peak; }
#endif
static void vq_fiber_unmap(char* base, int n, size_t bytes) {
  for (int i = 0; i < n; ++i) {
    const char* s = base + (size_t)i * VQ_FIBER_STACK;
    if (std::memcmp(s, &vq_canary, 8) != 0) {
      std::fprintf(stderr, "vq fibers: thread %d overflowed its %d-byte stack (VQ_FIBER_STACK)\n", i, VQ_FIBER_STACK);
      std::abort();
    }
#ifdef VQ_FIBER_PEAK
    long k = 8;
    while (k < VQ_FIBER_STACK && s[k] == 0) ++k;
    vq_fiber_peak = std::max(vq_fiber_peak, (long)VQ_FIBER_STACK - k);
#endif
  }
  munmap(base - 4096, bytes);
}

// run body(ctx, i) for i = 0 .. n - 1 as fibers, to completion; the first runs first (the last, reversed)
static void vq_fibers_run(int n, void (*body)(void*, int), void* ctx) {
  size_t bytes;
  char* stacks = vq_fiber_stacks(n, &bytes);
  vq_fibers.assign(n, VqFiber{});
  vq_ready.assign(n + 1, 0);
  vq_rhead = vq_rtail = 0;
  vq_fdone = 0; vq_fbody = body; vq_fctx = ctx;
  for (int i = 0; i < n; ++i) {
    VqFiber& f = vq_fibers[i];
    for (int k = 0; k < vq_nfvar; ++k) f.vars[k] = 0;
#ifdef VQ_FIBER_UCONTEXT
    getcontext(&f.uc);
    f.uc.uc_stack.ss_sp = stacks + (size_t)i * VQ_FIBER_STACK;
    f.uc.uc_stack.ss_size = VQ_FIBER_STACK;
    f.uc.uc_link = nullptr;
    makecontext(&f.uc, vq_fiber_entry, 0);
#else
    // a stack as if vq_ctx_switch had saved it: six registers, then vq_fiber_entry as the return address, then a
    // (never used) return address of vq_fiber_entry's own, so that it starts with the stack aligned as after a call
    void** sp = (void**)(stacks + (size_t)(i + 1) * VQ_FIBER_STACK);
    *--sp = nullptr;
    *--sp = (void*)&vq_fiber_entry;
    for (int k = 0; k < 6; ++k) *--sp = nullptr;
    f.sp = sp;
#endif
    vq_push(vq_fiber_reverse ? n - 1 - i : i);
  }
  vq_fcur = -1;
  const int first = vq_ready[vq_rhead];
  vq_rhead = (vq_rhead + 1) % vq_ready.size();
  vq_switch(-1, first);
  vq_fiber_unmap(stacks, n, bytes);
}
template <typename F>
static void vq_fibers_run(int n, F& f) { vq_fibers_run(n, [](void* c, int i) { (*(F*)c)(i); }, (void*)&f); }
"""
