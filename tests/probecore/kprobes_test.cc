// probecore on real code: functions of this binary built -O2 and -O0, hand-written
// assembly with every kind of instruction, and libc.
#include "probecore/kprobes.h"

#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <csetjmp>
#include <cerrno>
#include <cstdlib>
#include <regex>
#include <thread>
#include <vector>

#include "arch/arch.h"
#include "arch/testing.h"
#include "tests/probecore/probe_test_util.h"
#include "tests/probecore/targets.h"

namespace probefs::probecore {
namespace {

using test_util::bounds_of;
using test_util::KprobeGuard;
using test_util::KretprobeGuard;

// Calls go through volatile pointers so that the compiler cannot fold them.
long (*volatile v_add_o2)(long, long) = add_o2;
long (*volatile v_add_o0)(long, long) = add_o0;
long (*volatile v_mul_o2)(long, long) = mul_o2;
long (*volatile v_mul_o0)(long, long) = mul_o0;
long (*volatile v_depth_o0)(long) = depth_o0;
long (*volatile v_pf_mix)(long) = pf_mix;
long (*volatile v_pf_loop_sum)(long) = pf_loop_sum;
long (*volatile v_pf_leaf_redzone)(long) = pf_leaf_redzone;
long (*volatile v_strtol)(const char*, char**, int) = strtol;

struct Recorder : Kprobe {
  std::atomic<long> hits{0}, posts{0};
  std::atomic<uint64_t> di{0}, si{0}, dx{0}, ip_pre{0}, ip_post{0}, ax_post{0};
};

int record_pre(Kprobe* p, PtRegs* r) {
  auto* k = static_cast<Recorder*>(p);
  k->di = r->di;
  k->si = r->si;
  k->dx = r->dx;
  k->ip_pre = r->ip;
  k->hits.fetch_add(1);
  return 0;
}

void record_post(Kprobe* p, PtRegs* r, unsigned long) {
  auto* k = static_cast<Recorder*>(p);
  k->ip_post = r->ip;
  k->ax_post = r->ax;
  k->posts.fetch_add(1);
}

Recorder* at(Recorder* k, uintptr_t addr, FunctionBounds b, bool post = false) {
  k->addr = addr;
  k->bounds = b;
  k->pre_handler = record_pre;
  if (post) k->post_handler = record_post;
  return k;
}

template <typename F>
uintptr_t addr_of(F* f) {
  return reinterpret_cast<uintptr_t>(f);
}

FunctionBounds mix_bounds() { return {addr_of(pf_mix), addr_of(pf_mix_end)}; }
FunctionBounds loop_bounds() { return {addr_of(pf_loop_sum), addr_of(pf_loop_sum_end)}; }

class Probecore : public ::testing::Test {
 protected:
  void SetUp() override { set_symbol_resolver(&resolver_); }
  void TearDown() override {
    set_kprobes_boost(true);
    set_kprobes_optimization(true);
    EXPECT_EQ(arm_all_kprobes(), 0);
    EXPECT_EQ(kprobes_list(), "") << "a test left probes registered";
  }
  test_util::DlResolver resolver_;
};

// ---- handlers see the machine state ----

TEST_F(Probecore, PreHandlerSeesArgumentRegisters) {
  for (auto fn : {add_o2, add_o0}) {
    Recorder k;
    KprobeGuard g{at(&k, addr_of(fn), bounds_of(reinterpret_cast<void*>(fn)))};
    ASSERT_EQ(register_kprobe(&k), 0);
    long (*volatile call)(long, long) = fn;
    EXPECT_EQ(call(3, 4), 7);
    EXPECT_EQ(k.hits, 1);
    EXPECT_EQ(k.di, 3u);
    EXPECT_EQ(k.si, 4u);
    EXPECT_EQ(k.ip_pre, addr_of(fn) + 1);  // one past the int3, as on the kernel
  }
}

TEST_F(Probecore, LibcFunctionBySymbolName) {
  for (const char* name : {"strtol", "libc.so.6:strtol"}) {
    Recorder k;
    k.symbol_name = name;
    k.pre_handler = record_pre;
    KprobeGuard g{&k};
    ASSERT_EQ(register_kprobe(&k), 0) << name;
    EXPECT_EQ(k.addr, addr_of(strtol));
    const char* text = "12345";
    EXPECT_EQ(v_strtol(text, nullptr, 10), 12345);
    EXPECT_EQ(k.hits, 1);
    EXPECT_EQ(k.di, reinterpret_cast<uintptr_t>(text));
    EXPECT_EQ(k.dx, 10u);
  }
}

struct RetRecorder : Kretprobe {
  std::atomic<long> returns{0}, entries{0};
  std::atomic<uint64_t> ax{0}, data_seen{0};
};

int record_return(KretprobeInstance* ri, PtRegs* r) {
  auto* rp = static_cast<RetRecorder*>(get_kretprobe(ri));
  rp->ax = r->ax;
  uint64_t d;
  memcpy(&d, ri->data, sizeof d);
  rp->data_seen = d;
  rp->returns.fetch_add(1);
  return 0;
}

// Keeps the first argument in the instance data; skips the instance when it is 13.
int record_entry(KretprobeInstance* ri, PtRegs* r) {
  auto* rp = static_cast<RetRecorder*>(get_kretprobe(ri));
  rp->entries.fetch_add(1);
  const uint64_t arg = r->di;
  memcpy(ri->data, &arg, sizeof arg);
  return arg == 13;
}

RetRecorder* ret_at(RetRecorder* rp, uintptr_t addr, FunctionBounds b) {
  rp->kp.addr = addr;
  rp->kp.bounds = b;
  rp->handler = record_return;
  return rp;
}

TEST_F(Probecore, ReturnHandlerSeesReturnValue) {
  for (auto fn : {mul_o2, mul_o0}) {
    RetRecorder rp;
    KretprobeGuard g{ret_at(&rp, addr_of(fn), bounds_of(reinterpret_cast<void*>(fn)))};
    ASSERT_EQ(register_kretprobe(&rp), 0);
    long (*volatile call)(long, long) = fn;
    EXPECT_EQ(call(6, 7), 42);
    EXPECT_EQ(rp.returns, 1);
    EXPECT_EQ(rp.ax, 42u);
  }
  RetRecorder rp;
  rp.kp.symbol_name = "strtol";
  rp.handler = record_return;
  KretprobeGuard g{&rp};
  ASSERT_EQ(register_kretprobe(&rp), 0);
  EXPECT_EQ(v_strtol("-99", nullptr, 10), -99);
  EXPECT_EQ(rp.returns, 1);
  EXPECT_EQ(static_cast<long>(rp.ax.load()), -99);
}

TEST_F(Probecore, EntryHandlerDataAndSkip) {
  RetRecorder rp;
  ret_at(&rp, addr_of(mul_o2), bounds_of(reinterpret_cast<void*>(mul_o2)));
  rp.entry_handler = record_entry;
  rp.data_size = sizeof(uint64_t);
  KretprobeGuard g{&rp};
  ASSERT_EQ(register_kretprobe(&rp), 0);
  EXPECT_EQ(v_mul_o2(2, 3), 6);
  EXPECT_EQ(rp.returns, 1);
  EXPECT_EQ(rp.data_seen, 2u);
  EXPECT_EQ(v_mul_o2(13, 1), 13);  // entry handler says skip: no return handler
  EXPECT_EQ(rp.entries, 2);
  EXPECT_EQ(rp.returns, 1);
}

TEST_F(Probecore, PostHandlerRunsAfterTheInstruction) {
  for (bool boost : {true, false}) {
    set_kprobes_boost(boost);
    Recorder k;
    KprobeGuard g{at(&k, addr_of(pf_mix_riprel), mix_bounds(), /*post=*/true)};
    ASSERT_EQ(register_kprobe(&k), 0);
    EXPECT_EQ(v_pf_mix(1), 3 * (1 + 5) + 7);
    EXPECT_EQ(k.hits, 1);
    EXPECT_EQ(k.posts, 1);
    EXPECT_EQ(k.ax_post, static_cast<uint64_t>(pf_mix_bias));  // the load has happened
    EXPECT_EQ(k.ip_post, addr_of(pf_mix_riprel) + 7);         // past the 7-byte mov
  }
}

// ---- every kind of instruction still computes the same thing ----

struct Site {
  const char* name;
  uintptr_t addr;
  FunctionBounds bounds;
};

long expected_mix(long x) { return 3 * (x + pf_mix_bias) + 7 + (x >= 10 ? 100 : 0); }

TEST_F(Probecore, EveryKindOfInstructionStillComputesTheSame) {
  const Site sites[] = {
      {"push", addr_of(pf_mix_push), mix_bounds()},
      {"rip-relative load", addr_of(pf_mix_riprel), mix_bounds()},
      {"relative call", addr_of(pf_mix_call), mix_bounds()},
      {"conditional jump", addr_of(pf_mix_jcc), mix_bounds()},
      {"pop", addr_of(pf_mix_pop), mix_bounds()},
      {"ret", addr_of(pf_mix_ret), mix_bounds()},
      {"loop", addr_of(pf_loop_sum_loop), loop_bounds()},
      {"jmp rel8", addr_of(pf_loop_sum_jmp), loop_bounds()},
      {"indirect call", addr_of(pf_loop_sum_icall), loop_bounds()},
      {"leaf red zone", addr_of(pf_leaf_redzone_mid),
       {addr_of(pf_leaf_redzone), addr_of(pf_leaf_redzone_end)}},
  };
  for (const Site& s : sites) {
    for (int mode = 0; mode < 3; ++mode) {  // boosted, single-stepped, with post handler
      SCOPED_TRACE(std::string(s.name) + " mode " + std::to_string(mode));
      set_kprobes_boost(mode != 1);
      Recorder k;
      KprobeGuard g{at(&k, s.addr, s.bounds, mode == 2)};
      ASSERT_EQ(register_kprobe(&k), 0);
      long expected_hits = 0;
      for (long x : {0L, 3L, 9L, 10L, 25L}) {
        EXPECT_EQ(v_pf_mix(x), expected_mix(x));
        EXPECT_EQ(v_pf_loop_sum(x), x * (x + 1) / 2);
        EXPECT_EQ(v_pf_leaf_redzone(x), x + 1);
        if (s.bounds.start == addr_of(pf_loop_sum) && s.addr == addr_of(pf_loop_sum_loop))
          expected_hits += x;  // once per iteration
        else
          expected_hits += 1;
      }
      EXPECT_EQ(k.hits, expected_hits);
      if (mode == 2) {
        EXPECT_EQ(k.posts, expected_hits);
      }
    }
  }
}

// ---- execution-path change ----

int fail_with_enomem(Kprobe*, PtRegs* r) {
  // At the entry: return -ENOMEM to the caller without running the function.
  r->ax = static_cast<uint64_t>(-ENOMEM);
  r->ip = *reinterpret_cast<uint64_t*>(r->sp);
  r->sp += 8;
  return 1;
}

TEST_F(Probecore, PreHandlerRedirectInjectsAFault) {
  set_kprobes_optimization(false);  // an optimized probe ignores the ip change, as in kprobes
  Kprobe k;
  k.addr = addr_of(add_o2);
  k.bounds = bounds_of(reinterpret_cast<void*>(add_o2));
  k.pre_handler = fail_with_enomem;
  KprobeGuard g{&k};
  ASSERT_EQ(register_kprobe(&k), 0);
  EXPECT_EQ(v_add_o2(1, 2), -ENOMEM);
  ASSERT_EQ(unregister_kprobe(&k), 0);
  EXPECT_EQ(v_add_o2(1, 2), 3);
}

// ---- concurrency ----

// Two threads call a function while its probe is registered, disabled, enabled and
// unregistered under them. A hit happens inside a call, so a worker counts each call twice:
// `started` before it (a hit can never outnumber the calls started before it was read) and
// `calls` after it returned (when both workers are parked between calls, every call of an
// enabled phase must be a hit).
TEST_F(Probecore, HammeredWhileRegisteredUnregisteredEnabledDisabled) {
  std::atomic<bool> stop{false}, pause{false};
  std::atomic<int> paused{0};
  std::atomic<long> started[2] = {0, 0}, calls[2] = {0, 0};
  std::atomic<bool> wrong{false};
  Recorder k;
  auto worker = [&](int id) {
    long i = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      if (pause.load(std::memory_order_acquire)) {
        paused.fetch_add(1);
        while (pause.load(std::memory_order_acquire) && !stop.load()) std::this_thread::yield();
        paused.fetch_sub(1);
        continue;
      }
      started[id].fetch_add(1, std::memory_order_seq_cst);
      if (v_add_o2(i, id) != i + id) wrong = true;
      calls[id].fetch_add(1, std::memory_order_release);
      ++i;
    }
  };
  std::thread t0(worker, 0), t1(worker, 1);
  auto total_started = [&] { return started[0].load() + started[1].load(); };
  auto total_calls = [&] { return calls[0].load() + calls[1].load(); };
  auto quiesce = [&] {
    pause = true;
    while (paused.load() != 2) std::this_thread::yield();
  };
  auto resume = [&] { pause = false; };

  for (int round = 0; round < 1000; ++round) {
    at(&k, addr_of(add_o2), bounds_of(reinterpret_cast<void*>(add_o2)));
    k.flags = 0;
    ASSERT_EQ(register_kprobe(&k), 0);
    if (round % 50 == 0) {
      // A phase in which the probe stays enabled: every call is a hit.
      quiesce();
      const long c0 = total_calls(), h0 = k.hits.load();
      resume();
      const long target = c0 + 200;
      while (total_calls() < target) std::this_thread::yield();
      quiesce();
      EXPECT_EQ(k.hits.load() - h0, total_calls() - c0) << "round " << round;
      resume();
    }
    ASSERT_EQ(disable_kprobe(&k), 0);
    ASSERT_EQ(enable_kprobe(&k), 0);
    ASSERT_EQ(unregister_kprobe(&k), 0);
    // The workers run on, so `calls` cannot bound the hits (a worker may be between a hit
    // and its `calls` increment). Every hit comes after its call's `started` increment:
    // read the hits first, then `started`.
    const long hits_seen = k.hits.load();
    EXPECT_LE(hits_seen, total_started()) << "round " << round;
  }
  stop = true;
  t0.join();
  t1.join();
  EXPECT_FALSE(wrong.load());
  // Both workers have left: every started call has returned.
  EXPECT_EQ(total_started(), total_calls());
  EXPECT_LE(k.hits.load(), total_calls());
  EXPECT_GT(total_calls(), 0);
}

TEST_F(Probecore, ThreadsStartedAfterRegistrationAreCovered) {
  Recorder k;
  KprobeGuard g{at(&k, addr_of(add_o0), bounds_of(reinterpret_cast<void*>(add_o0)))};
  ASSERT_EQ(register_kprobe(&k), 0);
  std::vector<std::thread> ts;
  for (int i = 0; i < 4; ++i)
    ts.emplace_back([] {
      for (int j = 0; j < 100; ++j) v_add_o0(j, 1);
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(k.hits, 400);
}

TEST_F(Probecore, ForkChildrenKeepWorking) {
  Recorder k;
  RetRecorder rp;
  KprobeGuard g{at(&k, addr_of(add_o2), bounds_of(reinterpret_cast<void*>(add_o2)))};
  KretprobeGuard g2{ret_at(&rp, addr_of(mul_o2), bounds_of(reinterpret_cast<void*>(mul_o2)))};
  ASSERT_EQ(register_kprobe(&k), 0);
  ASSERT_EQ(register_kretprobe(&rp), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(30);  // never outlive a hang
    const long h = k.hits, r = rp.returns;
    bool ok = v_add_o2(2, 2) == 4 && v_mul_o2(3, 3) == 9 && k.hits == h + 1 && rp.returns == r + 1;
    // The child can change its own probes: its copy of the engine is its own.
    ok = ok && unregister_kprobe(&k) == 0 && v_add_o2(1, 1) == 2 && k.hits == h + 1;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(v_add_o2(5, 5), 10);  // the parent's probe is untouched by the child
  EXPECT_EQ(k.hits, 1);
}

// ---- nmissed ----

// Misses a miss_handler heard of (each probe's handler counts into its own).
std::atomic<long> g_misses_heard{0};
void hear_miss(Kprobe*) { g_misses_heard.fetch_add(1, std::memory_order_relaxed); }

TEST_F(Probecore, MaxactiveExhaustionCountsExactlyTheMissedReturns) {
  RetRecorder rp;
  ret_at(&rp, addr_of(depth_o0), bounds_of(reinterpret_cast<void*>(depth_o0)));
  rp.maxactive = 4;
  rp.kp.miss_handler = hear_miss;  // hears the kretprobe's misses as they happen
  g_misses_heard = 0;
  KretprobeGuard g{&rp};
  ASSERT_EQ(register_kretprobe(&rp), 0);
  EXPECT_EQ(v_depth_o0(9), 9);  // 10 calls in flight at the deepest point
  EXPECT_EQ(rp.returns, 4);
  EXPECT_EQ(rp.nmissed, 6u);
  EXPECT_EQ(g_misses_heard.load(), 6);
  EXPECT_EQ(v_depth_o0(2), 2);  // every instance came back
  EXPECT_EQ(rp.returns, 7);
  EXPECT_EQ(rp.nmissed, 6u);
  EXPECT_EQ(g_misses_heard.load(), 6);
}

// A returned instance may stay on the stack of the CPU that returned it, where the next
// entry on that CPU takes it without a locked instruction. An entry on another CPU that
// finds nothing anywhere else steals it: no return is missed while an instance is free.
TEST_F(Probecore, AnInstanceFreedOnOneCpuServesAnEntryOnAnother) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if (cpus.size() < 2) GTEST_SKIP() << "needs two CPUs";
  RetRecorder rp;
  ret_at(&rp, addr_of(depth_o0), bounds_of(reinterpret_cast<void*>(depth_o0)));
  // Two per CPU the process may use: each CPU's stack keeps one returned instance, the
  // rest go back to the shared list.
  const long n = 2 * CPU_COUNT(&allowed);
  rp.maxactive = static_cast<int>(n);
  KretprobeGuard g{&rp};
  ASSERT_EQ(register_kretprobe(&rp), 0);
  // Recursion n deep takes every instance; the returns leave one on this CPU's stack.
  auto all_in_flight_on = [&](int cpu) {
    long result = -1;
    std::thread([&] {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0)
        result = v_depth_o0(n - 1);
    }).join();
    return result;
  };
  for (int round = 0; round < 4; ++round)
    EXPECT_EQ(all_in_flight_on(cpus[round % 2]), n - 1);
  EXPECT_EQ(rp.returns, 4 * n);
  EXPECT_EQ(rp.nmissed, 0u);
}

int call_mul_from_handler(Kprobe*, PtRegs*) {
  v_mul_o2(2, 3);
  return 0;
}

TEST_F(Probecore, AProbeHitInsideAHandlerIsMissedNotRecursed) {
  Kprobe outer;
  outer.addr = addr_of(add_o2);
  outer.bounds = bounds_of(reinterpret_cast<void*>(add_o2));
  outer.pre_handler = call_mul_from_handler;
  Recorder inner;
  RetRecorder inner_ret;
  KprobeGuard g1{&outer};
  KprobeGuard g2{at(&inner, addr_of(mul_o2), bounds_of(reinterpret_cast<void*>(mul_o2)))};
  inner.miss_handler = hear_miss;
  g_misses_heard = 0;
  ASSERT_EQ(register_kprobe(&outer), 0);
  ASSERT_EQ(register_kprobe(&inner), 0);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(v_add_o2(i, 1), i + 1);
  EXPECT_EQ(inner.nmissed, 5u);
  EXPECT_EQ(g_misses_heard.load(), 5);
  EXPECT_EQ(inner.hits, 0);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(v_mul_o2(i, 2), i * 2);
  EXPECT_EQ(inner.hits, 3);
  EXPECT_EQ(inner.nmissed, 5u);
  EXPECT_EQ(outer.nmissed, 0u);
}

// ---- frames skipped by longjmp ----

}  // namespace
}  // namespace probefs::probecore

extern "C" {
std::jmp_buf pf_skip_env;
__attribute__((noinline)) void pf_jumps_out(long x) {
  if (x >= 0) std::longjmp(pf_skip_env, 1);
}
// Calls pf_jumps_out, which never returns normally, and then returns itself.
__attribute__((noinline)) long pf_skips_a_frame(long x) {
  void (*volatile jump)(long) = pf_jumps_out;
  if (setjmp(pf_skip_env) == 0) jump(x);
  return x + 1;
}
}

namespace probefs::probecore {
namespace {

TEST_F(Probecore, InstancesOfFramesSkippedByLongjmpAreRecycled) {
  long (*volatile skips)(long) = pf_skips_a_frame;
  RetRecorder inner, outer;
  ret_at(&inner, addr_of(pf_jumps_out), bounds_of(reinterpret_cast<void*>(pf_jumps_out)));
  ret_at(&outer, addr_of(pf_skips_a_frame), bounds_of(reinterpret_cast<void*>(pf_skips_a_frame)));
  inner.maxactive = 2;
  KretprobeGuard g1{&inner}, g2{&outer};
  ASSERT_EQ(register_kretprobe(&inner), 0);
  ASSERT_EQ(register_kretprobe(&outer), 0);
  for (long i = 0; i < 10; ++i) EXPECT_EQ(skips(i), i + 1);
  EXPECT_EQ(outer.returns, 10);
  EXPECT_EQ(inner.returns, 0);    // never returned
  EXPECT_EQ(inner.nmissed, 0u);   // yet its instances came back each time
}

// ---- registration errors ----

TEST_F(Probecore, BadInputsGetTheKernelsErrno) {
  const uintptr_t add = addr_of(add_o2);
  const FunctionBounds b = bounds_of(reinterpret_cast<void*>(add_o2));
  Kprobe both;
  both.addr = add;
  both.symbol_name = "add_o2";
  EXPECT_EQ(register_kprobe(&both), -EINVAL);
  Kprobe neither;
  EXPECT_EQ(register_kprobe(&neither), -EINVAL);
  Kprobe unknown;
  unknown.symbol_name = "no_such_function_anywhere";
  EXPECT_EQ(register_kprobe(&unknown), -ENOENT);
  Kprobe mid;
  mid.addr = addr_of(pf_mix_riprel) + 2;
  mid.bounds = mix_bounds();
  EXPECT_EQ(register_kprobe(&mid), -EILSEQ);
  Kprobe ud2;  // the ud2 after pf_loop_sum's jmp: never probed
  ud2.addr = addr_of(pf_loop_sum_jmp) + 2;
  ud2.bounds = loop_bounds();
  EXPECT_EQ(register_kprobe(&ud2), -EINVAL);
  Kprobe engine;
  engine.addr = addr_of(register_kprobe);
  engine.bounds = {engine.addr, engine.addr + 16};
  EXPECT_EQ(register_kprobe(&engine), -EINVAL);
  EXPECT_TRUE(within_kprobe_blacklist(addr_of(unregister_kprobe)));
  Kprobe trampoline;
  trampoline.addr = arch::kretprobe_trampoline();
  trampoline.bounds = {trampoline.addr, trampoline.addr + 16};
  EXPECT_EQ(register_kprobe(&trampoline), -EINVAL);

  Kprobe twice;
  twice.addr = add;
  twice.bounds = b;
  ASSERT_EQ(register_kprobe(&twice), 0);
  EXPECT_EQ(register_kprobe(&twice), -EINVAL);
  EXPECT_EQ(unregister_kprobe(&twice), 0);
  EXPECT_EQ(unregister_kprobe(&twice), -EINVAL);

  RetRecorder not_entry;
  ret_at(&not_entry, addr_of(pf_mix_riprel), mix_bounds());
  EXPECT_EQ(register_kretprobe(&not_entry), -EINVAL);
  EXPECT_EQ(v_add_o2(1, 1), 2);
}

TEST_F(Probecore, BatchWithOneBadEntryLeavesNothingRegistered) {
  Recorder a, m, bad;
  at(&a, addr_of(add_o2), bounds_of(reinterpret_cast<void*>(add_o2)));
  at(&m, addr_of(mul_o2), bounds_of(reinterpret_cast<void*>(mul_o2)));
  at(&bad, addr_of(pf_mix_riprel) + 1, mix_bounds());
  Kprobe* batch[] = {&a, &m, &bad};
  EXPECT_EQ(register_kprobes(batch, 3), -EILSEQ);
  EXPECT_EQ(a.aggr_, nullptr);
  EXPECT_EQ(m.aggr_, nullptr);
  EXPECT_EQ(kprobes_list(), "");
  EXPECT_EQ(v_add_o2(1, 2), 3);
  EXPECT_EQ(v_mul_o2(2, 2), 4);
  EXPECT_EQ(a.hits + m.hits, 0);
  uint8_t byte;
  ASSERT_EQ(arch::testing::read_text(addr_of(add_o2), &byte, 1), 0);
  EXPECT_EQ(byte, *reinterpret_cast<const uint8_t*>(addr_of(add_o2)));  // no int3 left

  RetRecorder r1, r2;
  ret_at(&r1, addr_of(add_o0), bounds_of(reinterpret_cast<void*>(add_o0)));
  ret_at(&r2, addr_of(pf_mix_riprel), mix_bounds());
  Kretprobe* rbatch[] = {&r1, &r2};
  EXPECT_EQ(register_kretprobes(rbatch, 2), -EINVAL);
  EXPECT_EQ(r1.kp.aggr_, nullptr);
  EXPECT_EQ(kprobes_list(), "");
}

// ---- aggregation, enable/disable, the global switch, the list ----

TEST_F(Probecore, ProbesOnOneAddressAreAggregated) {
  Recorder k1, k2;
  KprobeGuard g1{at(&k1, addr_of(add_o2), bounds_of(reinterpret_cast<void*>(add_o2)))};
  KprobeGuard g2{at(&k2, addr_of(add_o2), bounds_of(reinterpret_cast<void*>(add_o2)), true)};
  ASSERT_EQ(register_kprobe(&k1), 0);
  ASSERT_EQ(register_kprobe(&k2), 0);
  EXPECT_EQ(v_add_o2(1, 1), 2);
  EXPECT_EQ(k1.hits, 1);
  EXPECT_EQ(k2.hits, 1);
  EXPECT_EQ(k2.posts, 1);
  ASSERT_EQ(disable_kprobe(&k1), 0);
  EXPECT_EQ(v_add_o2(1, 1), 2);
  EXPECT_EQ(k1.hits, 1);
  EXPECT_EQ(k2.hits, 2);
  const std::string list = kprobes_list();
  EXPECT_NE(list.find("[DISABLED]"), std::string::npos) << list;
  EXPECT_EQ(std::count(list.begin(), list.end(), '\n'), 2) << list;
  ASSERT_EQ(disable_kprobe(&k2), 0);  // the last enabled child disarms the address
  uint8_t byte;
  ASSERT_EQ(arch::testing::read_text(addr_of(add_o2), &byte, 1), 0);
  EXPECT_EQ(*reinterpret_cast<const volatile uint8_t*>(addr_of(add_o2)), byte);
  EXPECT_EQ(v_add_o2(1, 1), 2);
  EXPECT_EQ(k2.hits, 2);
  ASSERT_EQ(enable_kprobe(&k2), 0);
  ASSERT_EQ(unregister_kprobe(&k1), 0);
  EXPECT_EQ(v_add_o2(1, 1), 2);
  EXPECT_EQ(k2.hits, 3);
}

TEST_F(Probecore, GlobalDisarmKeepsEachProbesOwnState) {
  Recorder on, off;
  KprobeGuard g1{at(&on, addr_of(add_o2), bounds_of(reinterpret_cast<void*>(add_o2)))};
  KprobeGuard g2{at(&off, addr_of(mul_o2), bounds_of(reinterpret_cast<void*>(mul_o2)))};
  off.flags = KPROBE_FLAG_DISABLED;  // registered disabled
  ASSERT_EQ(register_kprobe(&on), 0);
  ASSERT_EQ(register_kprobe(&off), 0);
  ASSERT_EQ(disarm_all_kprobes(), 0);
  EXPECT_TRUE(kprobes_all_disarmed());
  v_add_o2(1, 1);
  v_mul_o2(1, 1);
  EXPECT_EQ(on.hits + off.hits, 0);
  ASSERT_EQ(arm_all_kprobes(), 0);
  EXPECT_FALSE(kprobes_all_disarmed());
  v_add_o2(1, 1);
  v_mul_o2(1, 1);
  EXPECT_EQ(on.hits, 1);
  EXPECT_EQ(off.hits, 0);
}

TEST_F(Probecore, ListIsInTheKernelsFormat) {
  set_kprobes_optimization(false);  // no [OPTIMIZED] appearing mid-test (TearDown restores)
  Recorder k;
  RetRecorder r;
  Recorder libc;
  libc.symbol_name = "strtol";
  libc.pre_handler = record_pre;
  KprobeGuard g1{at(&k, addr_of(add_o2) , bounds_of(reinterpret_cast<void*>(add_o2)))};
  KretprobeGuard g2{ret_at(&r, addr_of(mul_o0), bounds_of(reinterpret_cast<void*>(mul_o0)))};
  KprobeGuard g3{&libc};
  ASSERT_EQ(register_kprobe(&k), 0);
  ASSERT_EQ(register_kretprobe(&r), 0);
  ASSERT_EQ(register_kprobe(&libc), 0);
  ASSERT_EQ(disable_kprobe(&k), 0);
  const std::string list = kprobes_list();
  char want_k[128], want_r[128], want_libc[128];
  snprintf(want_k, sizeof want_k, "%016lx  k  add_o2+0x0    [DISABLED]\n", addr_of(add_o2));
  snprintf(want_r, sizeof want_r, "%016lx  r  mul_o0+0x0    \n", addr_of(mul_o0));
  snprintf(want_libc, sizeof want_libc, "%016lx  k  strtol+0x0  libc.so.6 \n", addr_of(strtol));
  EXPECT_NE(list.find(want_k), std::string::npos) << list;
  EXPECT_NE(list.find(want_r), std::string::npos) << list;
  EXPECT_NE(list.find(want_libc), std::string::npos) << list;
}

// ---- unloaded code ----

TEST_F(Probecore, ProbeInAnUnloadedLibraryIsGone) {
  void* lib = dlopen(PF_GONE_LIB, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << dlerror();
  auto fn = reinterpret_cast<long (*)(long)>(dlsym(lib, "pf_gone_twice"));
  ASSERT_NE(fn, nullptr);
  Recorder k;
  KprobeGuard g{at(&k, addr_of(fn), bounds_of(reinterpret_cast<void*>(fn)))};
  ASSERT_EQ(register_kprobe(&k), 0);
  EXPECT_EQ(fn(21), 42);
  EXPECT_EQ(k.hits, 1);
  ASSERT_EQ(dlclose(lib), 0);
  const std::string list = kprobes_list();
  EXPECT_NE(list.find("[GONE]"), std::string::npos) << list;
  EXPECT_EQ(enable_kprobe(&k), -EINVAL);
  EXPECT_EQ(unregister_kprobe(&k), 0);
}

}  // namespace
}  // namespace probefs::probecore
