// Return probes on functions that are left without a return (longjmp, siglongjmp,
// setcontext, from a signal handler on another stack) and on functions that return twice
// (setjmp, sigsetjmp, getcontext, vfork), on libc's own code, with and without jump
// optimization. Each case runs in a child process with an alarm: a lost return kills the
// process, and must not take the test runner with it.
#include "probecore/kprobes.h"

#include <setjmp.h>
#include <signal.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "tests/probecore/probe_test_util.h"
#include "tracee/self_symbols.h"

// Every setjmp below is taken again on each round of its loop, so a longjmp finds the loop
// counters as they were at the latest setjmp: GCC's -Wclobbered cannot see that at -O2.
#pragma GCC diagnostic ignored "-Wclobbered"

namespace probefs::probecore {
namespace {

// ---- running a case in a child ----

using test_util::g_failures;

enum class Mode { kInt3, kOptimized };

int count_nothing(Kprobe*, PtRegs*) { return 0; }

// glibc runs _setjmp at every thread start with all signals blocked, where an int3 is
// fatal. The engine starts its thread before it arms any probe; here a probe of its own
// also has the thread started first (ReturnProbeOnSetjmpOptimizerStartedLate leaves it
// to the engine).
void start_optimizer_thread() {
  Kprobe k;
  k.symbol_name = "libc:labs";
  k.pre_handler = count_nothing;
  if (register_kprobe(&k) == 0) {
    wait_for_kprobe_optimizer();
    CHILD_EXPECT_EQ(unregister_kprobe(&k), 0);
  }
}

// Runs body(mode) in a child with optimization set as `mode` asks; the child ends with 0
// when body found nothing wrong, 1 when it did, or by the signal that killed it.
template <typename Body>
void run_in_child(Mode mode, Body body, bool optimizer_first = true) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(60);  // a hang ends as SIGALRM
    set_symbol_resolver(&tracee::self_symbol_resolver());
    set_kprobes_optimization(mode == Mode::kOptimized);
    if (mode == Mode::kOptimized && optimizer_first) start_optimizer_thread();
    body(mode);
    if (!g_failures.empty()) std::fputs(g_failures.c_str(), stderr);
    std::fflush(nullptr);
    _exit(g_failures.empty() ? 0 : 1);
  }
  test_util::expect_child_succeeded(pid);
}

void for_each_mode(void (*body)(Mode)) {
  for (Mode m : {Mode::kInt3, Mode::kOptimized}) {
    SCOPED_TRACE(m == Mode::kInt3 ? "int3" : "optimized");
    run_in_child(m, body);
  }
}

// Registers, and in optimized mode waits until the optimizer took the probe.
bool arm(Kretprobe* rp, Mode mode) {
  if (int rc = register_kretprobe(rp); rc) {
    char m[128];
    std::snprintf(m, sizeof m, "register_kretprobe(%s) = %d\n", rp->kp.symbol_name, rc);
    g_failures += m;
    return false;
  }
  if (mode == Mode::kOptimized) {
    wait_for_kprobe_optimizer();
    if (!(rp->kp.flags & KPROBE_FLAG_OPTIMIZED)) {
      g_failures += std::string(rp->kp.symbol_name) + " not optimized: " +
                    kprobe_optimization_status(&rp->kp) + "\n";
    }
  }
  return true;
}

struct Counter : Kretprobe {
  std::atomic<long> entries{0}, returns{0};
};

int count_entry(KretprobeInstance* ri, PtRegs*) {
  static_cast<Counter*>(get_kretprobe(ri))->entries.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

int count_return(KretprobeInstance* ri, PtRegs*) {
  static_cast<Counter*>(get_kretprobe(ri))->returns.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

Counter* counter(Counter* c, const char* sym) {
  c->kp.symbol_name = sym;
  c->entry_handler = count_entry;
  c->handler = count_return;
  return c;
}

// ---- qsort whose comparator leaves ----

jmp_buf g_env;
sigjmp_buf g_sigenv;
ucontext_t g_uc;
volatile int g_leave = 0;  // how the comparator leaves: 0 returns, 1 longjmp, 2 siglongjmp via
                           // a signal, 3 setcontext

int cmp_long(const void* a, const void* b) {
  const long x = *static_cast<const long*>(a), y = *static_cast<const long*>(b);
  return (x > y) - (x < y);
}

void on_usr1(int) { siglongjmp(g_sigenv, 1); }

int cmp_leaving(const void* a, const void* b) {
  switch (g_leave) {
    case 1: longjmp(g_env, 1);
    case 2: raise(SIGUSR1); break;
    case 3: setcontext(&g_uc); break;
  }
  return cmp_long(a, b);
}

void (*volatile v_qsort)(void*, size_t, size_t, int (*)(const void*, const void*)) = qsort;

bool sorted_ok() {
  long a[] = {5, 3, 9, 1, 7, 2, 8};
  v_qsort(a, 7, sizeof(long), cmp_long);
  for (int i = 1; i < 7; ++i)
    if (a[i - 1] > a[i]) return false;
  return true;
}

// 10 calls leave through `leave`, then 20 return: every instance came back.
void qsort_left_then_returns(Mode mode, int leave) {
  Counter rp;
  if (!arm(counter(&rp, "libc:qsort"), mode)) return;
  long a[] = {3, 1, 2};
  for (int i = 0; i < 10; ++i) {
    g_leave = leave;
    volatile bool left = false;
    if (leave == 1) {
      if (setjmp(g_env) == 0) v_qsort(a, 3, sizeof(long), cmp_leaving);
      else left = true;
    } else if (leave == 2) {
      if (sigsetjmp(g_sigenv, 1) == 0) v_qsort(a, 3, sizeof(long), cmp_leaving);
      else left = true;
    } else {
      volatile bool again = false;
      getcontext(&g_uc);
      if (!again) {
        again = true;
        v_qsort(a, 3, sizeof(long), cmp_leaving);
      } else {
        left = true;
      }
    }
    g_leave = 0;
    CHILD_EXPECT_EQ(left, true);
  }
  CHILD_EXPECT_EQ(rp.entries.load(), 10);
  CHILD_EXPECT_EQ(rp.returns.load(), 0);
  for (int i = 0; i < 20; ++i) CHILD_EXPECT_EQ(sorted_ok(), true);
  CHILD_EXPECT_EQ(rp.entries.load(), 30);
  CHILD_EXPECT_EQ(rp.returns.load(), 20);
  CHILD_EXPECT_EQ(rp.nmissed.load(), 0);
  CHILD_EXPECT_EQ(unregister_kretprobe(&rp), 0);
}

TEST(KretprobeUnwind, QsortLeftByLongjmpLeaksNoInstance) {
  for_each_mode([](Mode m) { qsort_left_then_returns(m, 1); });
}

TEST(KretprobeUnwind, QsortLeftBySiglongjmpFromAHandlerLeaksNoInstance) {
  for_each_mode([](Mode m) {
    struct sigaction sa {};
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, nullptr);
    qsort_left_then_returns(m, 2);
  });
}

TEST(KretprobeUnwind, QsortLeftBySetcontextLeaksNoInstance) {
  for_each_mode([](Mode m) { qsort_left_then_returns(m, 3); });
}

// Instances of a frame left on a signal stack are gone once the thread is back on its
// own; instances on its own stack stay while a handler runs on a signal stack that lies
// above them (here: a buffer in a caller's frame).
volatile int g_nested_leave = 0;

void on_usr2(int) {
  CHILD_EXPECT_EQ(sorted_ok(), true);  // a probed entry on the signal stack
  if (g_nested_leave) siglongjmp(g_sigenv, 1);
}

int cmp_raising(const void* a, const void* b) {
  raise(SIGUSR2);
  return cmp_long(a, b);
}

__attribute__((noinline)) void sort_with_handler_on(char* stack, size_t size, Mode mode) {
  stack_t ss{};
  ss.ss_sp = stack;
  ss.ss_size = size;
  sigaltstack(&ss, nullptr);
  struct sigaction sa {};
  sa.sa_handler = on_usr2;
  sa.sa_flags = SA_ONSTACK;
  sigaction(SIGUSR2, &sa, nullptr);
  Counter rp;
  if (!arm(counter(&rp, "libc:qsort"), mode)) return;
  long a[] = {3, 1, 2};
  // The handler returns: the interrupted qsort keeps its instance.
  g_nested_leave = 0;
  v_qsort(a, 3, sizeof(long), cmp_raising);
  const long calls = rp.entries.load();
  CHILD_EXPECT_EQ(rp.returns.load(), calls);
  CHILD_EXPECT_EQ(a[0], 1);
  // The handler leaves: what it left on the signal stack and below is gone.
  for (int i = 0; i < 10; ++i) {
    g_nested_leave = 1;
    if (sigsetjmp(g_sigenv, 1) == 0) v_qsort(a, 3, sizeof(long), cmp_raising);
  }
  g_nested_leave = 0;
  const long before = rp.returns.load();
  for (int i = 0; i < 20; ++i) CHILD_EXPECT_EQ(sorted_ok(), true);
  CHILD_EXPECT_EQ(rp.returns.load(), before + 20);
  CHILD_EXPECT_EQ(rp.nmissed.load(), 0);
  CHILD_EXPECT_EQ(unregister_kretprobe(&rp), 0);
  ss.ss_flags = SS_DISABLE;
  sigaltstack(&ss, nullptr);
}

TEST(KretprobeUnwind, SignalStackAboveTheProbedFrame) {
  for_each_mode([](Mode m) {
    char stack[256 * 1024];  // above every frame sort_with_handler_on makes
    sort_with_handler_on(stack, sizeof stack, m);
  });
}

TEST(KretprobeUnwind, SignalStackElsewhere) {
  for_each_mode([](Mode m) {
    static char stack[256 * 1024];
    sort_with_handler_on(stack, sizeof stack, m);
  });
}

// A C++ exception thrown by the comparator through a return-probed qsort. glibc builds
// qsort with unwind tables, so unprobed it is caught. Probed, the unwinder would find the
// return trampoline (or a call-mode detour's return point) as qsort's return address, with
// no frame description to go on from, and std::terminate would abort the process: the
// engine puts the real return addresses back before the exception unwinds.
int cmp_throwing(const void*, const void*) { throw 42; }

TEST(KretprobeUnwind, ExceptionThroughAReturnProbedQsortIsCaught) {
  for_each_mode([](Mode m) {
    Counter rp;
    if (!arm(counter(&rp, "libc:qsort"), m)) return;
    long a[] = {3, 1, 2};
    for (int i = 0; i < 10; ++i) {
      int caught = 0;
      try {
        v_qsort(a, 3, sizeof(long), cmp_throwing);
      } catch (int e) {
        caught = e;
      }
      CHILD_EXPECT_EQ(caught, 42);
    }
    for (int i = 0; i < 20; ++i) CHILD_EXPECT_EQ(sorted_ok(), true);
    CHILD_EXPECT_EQ(rp.returns.load(), 20);
    CHILD_EXPECT_EQ(rp.nmissed.load(), 0);
    CHILD_EXPECT_EQ(unregister_kretprobe(&rp), 0);
  });
}

// The exception is thrown and caught inside the comparator of an outer qsort, through an
// inner one: the outer frame lies above the catch and goes on sorting. It returns to its
// caller without its return handler (its address was put back with the inner one's), and
// later calls are seen again.
int cmp_catching(const void* a, const void* b) {
  long pair[] = {2, 1};
  try {
    v_qsort(pair, 2, sizeof(long), cmp_throwing);
  } catch (int) {
  }
  return cmp_long(a, b);
}

TEST(KretprobeUnwind, ExceptionCaughtInsideAReturnProbedFrame) {
  for_each_mode([](Mode m) {
    Counter rp;
    if (!arm(counter(&rp, "libc:qsort"), m)) return;
    long a[] = {5, 3, 4, 1, 2};
    v_qsort(a, 5, sizeof(long), cmp_catching);
    for (int i = 0; i < 5; ++i) CHILD_EXPECT_EQ(a[i], i + 1);
    const long before = rp.returns.load();
    for (int i = 0; i < 20; ++i) CHILD_EXPECT_EQ(sorted_ok(), true);
    CHILD_EXPECT_EQ(rp.returns.load(), before + 20);
    CHILD_EXPECT_EQ(rp.nmissed.load(), 0);
    CHILD_EXPECT_EQ(unregister_kretprobe(&rp), 0);
  });
}

// ---- functions that return twice ----

void back_to_a_setjmp_once() {
  volatile bool back = false;
  if (setjmp(g_env) == 0) longjmp(g_env, 1);
  else back = true;
  CHILD_EXPECT_EQ(back, true);
}

// setjmp returns 10 times through longjmp: the hijacked address it saved in the jmp_buf
// brings each second return back to where the first went.
TEST(KretprobeUnwind, ReturnProbeOnSetjmp) {
  for_each_mode([](Mode m) {
    Counter rp;
    if (!arm(counter(&rp, "libc:_setjmp"), m)) return;
    volatile int jumps = 0;
    if (setjmp(g_env) < 10) {
      jumps = jumps + 1;
      if (jumps <= 10) longjmp(g_env, jumps);
    }
    CHILD_EXPECT_EQ(jumps, 10);
    CHILD_EXPECT_EQ(rp.entries.load(), 1);
    CHILD_EXPECT_EQ(rp.returns.load(), 1);  // a second return runs no handler
    for (int i = 0; i < 20; ++i) back_to_a_setjmp_once();
    CHILD_EXPECT_EQ(rp.entries.load(), 21);
    CHILD_EXPECT_EQ(rp.returns.load(), 21);
    CHILD_EXPECT_EQ(rp.nmissed.load(), 0);
    CHILD_EXPECT_EQ(unregister_kretprobe(&rp), 0);
  });
}

// A program keeps an outer jmp_buf for errors while setjmp is called from many other
// places in between: each of those call sites' returns is remembered, and a longjmp to the
// outer one still finds where it goes (the records of one frame replace each other).
template <int kSite>
[[gnu::noinline]] int setjmp_from_site() {
  jmp_buf env;
  volatile int r = setjmp(env);
  return r + kSite;
}

template <int... kSites>
int setjmp_from_sites(std::integer_sequence<int, kSites...>) {
  return (setjmp_from_site<kSites>() + ...);
}

TEST(KretprobeUnwind, AnOuterSetjmpOutlivesManyInnerCallSites) {
  for_each_mode([](Mode m) {
    Counter rp;
    if (!arm(counter(&rp, "libc:_setjmp"), m)) return;
    static jmp_buf outer;
    static volatile int rounds = 0;
    if (setjmp(outer) < 3) {
      // 40 call sites, two rounds each, all at one depth: more than any record ring holds.
      for (int i = 0; i < 2; ++i)
        CHILD_EXPECT_EQ(setjmp_from_sites(std::make_integer_sequence<int, 40>{}), 780);
      rounds = rounds + 1;
      longjmp(outer, rounds);
    }
    CHILD_EXPECT_EQ(rounds, 3);
    CHILD_EXPECT_EQ(rp.returns.load(), 1 + 3 * 80);
    CHILD_EXPECT_EQ(unregister_kretprobe(&rp), 0);
  });
}

// The same as a new user would write it, with no probe to start the optimizer thread first:
// the engine starts its threads before arming, so no thread start runs _setjmp (every
// signal blocked) on an int3.
TEST(KretprobeUnwind, ReturnProbeOnSetjmpOptimizerStartedLate) {
  run_in_child(
      Mode::kOptimized,
      [](Mode m) {
        Counter rp;
        if (!arm(counter(&rp, "libc:_setjmp"), m)) return;
        for (int i = 0; i < 20; ++i) back_to_a_setjmp_once();
        CHILD_EXPECT_EQ(rp.returns.load(), 20);
        CHILD_EXPECT_EQ(unregister_kretprobe(&rp), 0);
      },
      false);
}

// The longjmp comes from inside another probed function called from the same frame, whose
// return slot is the one setjmp had: that is not its return.
TEST(KretprobeUnwind, SetjmpAndALongjmpingQsortShareASlot) {
  for_each_mode([](Mode m) {
    Counter sj, qs;
    if (!arm(counter(&sj, "libc:_setjmp"), m) || !arm(counter(&qs, "libc:qsort"), m)) return;
    long a[] = {3, 1, 2};
    for (int i = 0; i < 10; ++i) {
      g_leave = 1;
      volatile bool left = false;
      if (setjmp(g_env) == 0) v_qsort(a, 3, sizeof(long), cmp_leaving);
      else left = true;
      CHILD_EXPECT_EQ(left, true);
    }
    g_leave = 0;
    for (int i = 0; i < 20; ++i) CHILD_EXPECT_EQ(sorted_ok(), true);
    CHILD_EXPECT_EQ(sj.entries.load(), 10);
    CHILD_EXPECT_EQ(sj.returns.load(), 10);
    CHILD_EXPECT_EQ(qs.entries.load(), 30);
    CHILD_EXPECT_EQ(qs.returns.load(), 20);
    CHILD_EXPECT_EQ(sj.nmissed.load() + qs.nmissed.load(), 0);
    CHILD_EXPECT_EQ(unregister_kretprobe(&sj), 0);
    CHILD_EXPECT_EQ(unregister_kretprobe(&qs), 0);
  });
}

TEST(KretprobeUnwind, ReturnProbeOnSigsetjmp) {
  for_each_mode([](Mode m) {
    Counter rp;
    if (!arm(counter(&rp, "libc:__sigsetjmp"), m)) return;
    struct sigaction sa {};
    sa.sa_handler = on_usr1;
    sigaction(SIGUSR1, &sa, nullptr);
    for (int i = 0; i < 10; ++i) {
      volatile bool back = false;
      if (sigsetjmp(g_sigenv, 1) == 0) raise(SIGUSR1);
      else back = true;
      CHILD_EXPECT_EQ(back, true);
    }
    CHILD_EXPECT_EQ(rp.entries.load(), 10);
    CHILD_EXPECT_EQ(rp.returns.load(), 10);
    CHILD_EXPECT_EQ(rp.nmissed.load(), 0);
    CHILD_EXPECT_EQ(unregister_kretprobe(&rp), 0);
  });
}

TEST(KretprobeUnwind, ReturnProbeOnGetcontext) {
  for_each_mode([](Mode m) {
    Counter rp;
    if (!arm(counter(&rp, "libc:getcontext"), m)) return;
    for (int i = 0; i < 10; ++i) {
      volatile int passes = 0;
      getcontext(&g_uc);
      passes = passes + 1;
      if (passes < 3) setcontext(&g_uc);
      CHILD_EXPECT_EQ(passes, 3);
    }
    CHILD_EXPECT_EQ(rp.entries.load(), 10);
    CHILD_EXPECT_EQ(rp.returns.load(), 10);
    CHILD_EXPECT_EQ(rp.nmissed.load(), 0);
    CHILD_EXPECT_EQ(unregister_kretprobe(&rp), 0);
  });
}

// vfork returns in the child, then in the parent, on one stack and one thread's memory.
TEST(KretprobeUnwind, ReturnProbeOnVfork) {
  for_each_mode([](Mode m) {
    Counter rp;
    if (!arm(counter(&rp, "libc:vfork"), m)) return;
    for (int i = 0; i < 5; ++i) {
      const pid_t pid = vfork();
      if (pid == 0) _exit(7);
      int status = 0;
      CHILD_EXPECT_EQ(waitpid(pid, &status, 0), pid);
      CHILD_EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 7);
    }
    CHILD_EXPECT_EQ(rp.entries.load(), 5);
    CHILD_EXPECT_EQ(rp.returns.load(), 5);  // the child's returns; the parent's are second
    CHILD_EXPECT_EQ(rp.nmissed.load(), 0);
    CHILD_EXPECT_EQ(unregister_kretprobe(&rp), 0);
  });
}

}  // namespace
}  // namespace probefs::probecore
