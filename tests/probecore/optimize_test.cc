// Jump optimization on real code: libc's string and memory functions, this binary's own
// functions at -O2 and -O0, hand-written assembly that must be refused, threads calling
// while the form of a probe changes under them.
#include <dlfcn.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <csignal>
#include <mutex>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "probecore/kprobes.h"
#include "tracee/self_symbols.h"
#include "tests/probecore/counting_probe.h"
#include "tests/probecore/gpr_only_handlers.h"
#include "tests/probecore/probe_test_util.h"
#include "tests/probecore/targets.h"

// pthread_create as this binary's code and the engine's calls reach it: refused with
// EAGAIN (a thread or process limit reached) while g_refuse_threads is set.
std::atomic<bool> g_refuse_threads{false};

extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attr,
                              void* (*start)(void*), void* arg) {
  using Fn = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "pthread_create"));
  if (g_refuse_threads.load()) return EAGAIN;
  return real(thread, attr, start, arg);
}

namespace probefs::probecore {
namespace {

using test_util::KprobeGuard;
using test_util::KretprobeGuard;

using test_util::bounds_at;
using test_util::count_hit;
using test_util::Counter;

template <typename F>
uintptr_t addr_of(F* f) {
  return reinterpret_cast<uintptr_t>(f);
}

Counter* counter_at(Counter* k, uintptr_t addr, FunctionBounds b) {
  k->addr = addr;
  k->bounds = b;
  k->pre_handler = count_hit;
  return k;
}

bool optimized(const Kprobe& k) { return k.flags & KPROBE_FLAG_OPTIMIZED; }

class Optimize : public ::testing::Test {
 protected:
  void SetUp() override { set_symbol_resolver(&tracee::self_symbol_resolver()); }
  void TearDown() override {
    set_kprobes_optimization(true);
    EXPECT_EQ(kprobes_list(), "") << "a test left probes registered";
  }
};

// Volatile pointers: no call is folded or inlined.
size_t (*volatile v_strlen)(const char*) = strlen;
void* (*volatile v_memcpy)(void*, const void*, size_t) = memcpy;
void* (*volatile v_memset)(void*, int, size_t) = memset;
int (*volatile v_strcmp)(const char*, const char*) = strcmp;
int (*volatile v_memcmp)(const void*, const void*, size_t) = memcmp;
const char* (*volatile v_strchr)(const char*, int) = strchr;
long (*volatile v_strtol)(const char*, char**, int) = strtol;
int (*volatile v_atoi)(const char*) = atoi;
void* (*volatile v_memmove)(void*, const void*, size_t) = memmove;
int (*volatile v_strncmp)(const char*, const char*, size_t) = strncmp;
long (*volatile v_add_o2)(long, long) = add_o2;
long (*volatile v_add_o0)(long, long) = add_o0;
long (*volatile v_mul_o2)(long, long) = mul_o2;
long (*volatile v_mul_o0)(long, long) = mul_o0;
unsigned long (*volatile v_count_o2)(const char*, char) = count_char_o2;
unsigned long (*volatile v_count_o0)(const char*, char) = count_char_o0;
long (*volatile v_depth_o0)(long) = depth_o0;
long (*volatile v_jump_into)(long) = pf_jump_into;
long (*volatile v_jtab)(long) = pf_jtab;
long (*volatile v_leaf_redzone)(long) = pf_leaf_redzone;
long (*volatile v_two_step)(long) = pf_two_step;

// Runs every function once and checks every result.
bool all_results_right() {
  char buf[64];
  const char* hello = "hello, probes";
  bool ok = v_strlen(hello) == 13;
  v_memset(buf, 'x', sizeof buf);
  ok = ok && buf[0] == 'x' && buf[63] == 'x';
  v_memcpy(buf, hello, 14);
  ok = ok && v_strcmp(buf, hello) == 0 && v_memcmp(buf, hello, 14) == 0;
  ok = ok && v_strcmp("abc", "abd") < 0 && v_strchr(hello, 'p') == hello + 7;
  ok = ok && v_strtol("-1234", nullptr, 10) == -1234 && v_atoi("77") == 77;
  v_memmove(buf + 1, buf, 8);
  ok = ok && std::memcmp(buf + 1, hello, 8) == 0 && v_strncmp("abcx", "abcy", 3) == 0;
  ok = ok && v_add_o2(40, 2) == 42 && v_add_o0(-1, 1) == 0;
  ok = ok && v_mul_o2(6, 7) == 42 && v_mul_o0(-3, 3) == -9;
  ok = ok && v_count_o2("banana", 'a') == 3 && v_count_o0("banana", 'n') == 2;
  ok = ok && v_depth_o0(5) == 5;
  return ok;
}

TEST_F(Optimize, FunctionEntriesOfLibcAndThisBinaryBecomeOptimized) {
  struct Target {
    const char* name;
    uintptr_t addr;
  };
  // dlsym gives the implementation an IFUNC resolved to, as calls reach it.
  auto libc = [](const char* name) {
    return reinterpret_cast<uintptr_t>(dlsym(RTLD_DEFAULT, name));
  };
  // [0, 8): libc's string and memory functions, as the IFUNCs resolved them here;
  // [8, 10): libc's plain C functions; [10, 17): this binary's own.
  const Target targets[] = {
      {"strlen", libc("strlen")},   {"memcpy", libc("memcpy")},   {"memset", libc("memset")},
      {"memmove", libc("memmove")}, {"strcmp", libc("strcmp")},   {"memcmp", libc("memcmp")},
      {"strchr", libc("strchr")},   {"strncmp", libc("strncmp")},
      {"strtol", libc("strtol")},   {"atoi", libc("atoi")},
      {"add_o2", addr_of(add_o2)},  {"add_o0", addr_of(add_o0)},
      {"mul_o2", addr_of(mul_o2)},  {"mul_o0", addr_of(mul_o0)},
      {"count_char_o2", addr_of(count_char_o2)}, {"count_char_o0", addr_of(count_char_o0)},
      {"depth_o0", addr_of(depth_o0)},
  };
  ASSERT_TRUE(all_results_right());
  std::vector<std::unique_ptr<Counter>> probes;
  struct UnregisterAll {
    std::vector<std::unique_ptr<Counter>>& probes;
    ~UnregisterAll() {
      for (auto& p : probes)
        if (p->aggr_) {
          EXPECT_EQ(unregister_kprobe(p.get()), 0);
        }
    }
  } cleanup{probes};
  for (const Target& t : targets) {
    ASSERT_NE(t.addr, 0u) << t.name;
    probes.push_back(std::make_unique<Counter>());
    counter_at(probes.back().get(), t.addr, bounds_at(t.addr));
    ASSERT_TRUE(probes.back()->bounds.known()) << t.name << std::hex << " at 0x" << t.addr;
    ASSERT_EQ(register_kprobe(probes.back().get()), 0) << t.name;
  }
  wait_for_kprobe_optimizer();
  for (size_t i = 0; i < probes.size(); ++i) {
    const std::string status = kprobe_optimization_status(probes[i].get());
    // Two refusals are right for some libc implementations on some processors: the
    // AVX-512 variants (__strlen_evex, __memset_avx512_*) hold instructions Capstone 4
    // cannot decode, so they cannot be proven safe; and __mempcpy_* jumps into the middle
    // of __memmove_*'s first five bytes. Such probes stay int3 probes.
    if (i < 8 && (status == "function does not decode" ||
                   status == "a jump from other code lands in the replaced instructions"))
      continue;
    EXPECT_TRUE(optimized(*probes[i])) << targets[i].name << ": " << status;
  }
  EXPECT_NE(kprobes_list().find("[OPTIMIZED]"), std::string::npos);
  for (auto& p : probes) p->hits = 0;
  EXPECT_TRUE(all_results_right());
  for (size_t i = 10; i < probes.size(); ++i)  // this binary's functions: exact counts
    EXPECT_GE(probes[i]->hits.load(), 1) << targets[i].name;
  EXPECT_EQ(probes[10]->hits.load(), 1);  // add_o2
  EXPECT_EQ(probes[16]->hits.load(), 6);  // depth_o0(5): 6 calls
  for (auto& p : probes) ASSERT_EQ(unregister_kprobe(p.get()), 0);
  EXPECT_TRUE(all_results_right());
}

// A process that cannot start the optimizer's thread (pthread_create says EAGAIN) runs on,
// its probes firing, and optimizes as ever once a thread can be made: it never dies of
// it. In a fork child, which has no optimizer thread yet.
TEST_F(Optimize, AProcessThatCannotMakeTheOptimizerThreadRunsOn) {
  EXPECT_EXIT(
      {
        g_refuse_threads = true;
        Counter k;
        counter_at(&k, addr_of(add_o2), bounds_at(addr_of(add_o2)));
        if (register_kprobe(&k) != 0) _exit(10);
        if (v_add_o2(40, 2) != 42 || k.hits.load() != 1) _exit(11);
        g_refuse_threads = false;
        Counter k2;
        counter_at(&k2, addr_of(mul_o2), bounds_at(addr_of(mul_o2)));
        if (register_kprobe(&k2) != 0) _exit(13);
        wait_for_kprobe_optimizer();
        if (!optimized(k) || !optimized(k2)) _exit(14);
        if (v_add_o2(1, 2) != 3 || v_mul_o2(6, 7) != 42) _exit(15);
        if (k.hits.load() != 2 || k2.hits.load() != 1) _exit(16);
        _exit(0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST_F(Optimize, JumpIntoTheFirstFiveBytesRefusesAndStillFires) {
  Counter k;
  KprobeGuard g{counter_at(&k, addr_of(pf_jump_into), {addr_of(pf_jump_into), addr_of(pf_jump_into_end)})};
  ASSERT_EQ(register_kprobe(&k), 0);
  wait_for_kprobe_optimizer();
  EXPECT_FALSE(optimized(k));
  EXPECT_NE(kprobe_optimization_status(&k).find("jump"), std::string::npos)
      << kprobe_optimization_status(&k);
  EXPECT_EQ(v_jump_into(3), 10);
  EXPECT_EQ(v_jump_into(20), 21);
  EXPECT_EQ(k.hits, 2);
}

TEST_F(Optimize, JumpTableIntoTheRegionRefusesAndStillFires) {
  Counter k;
  KprobeGuard g{counter_at(&k, addr_of(pf_jtab), {addr_of(pf_jtab), addr_of(pf_jtab_end)})};
  ASSERT_EQ(register_kprobe(&k), 0);
  wait_for_kprobe_optimizer();
  EXPECT_FALSE(optimized(k)) << kprobe_optimization_status(&k);
  EXPECT_FALSE(kprobe_optimization_status(&k).empty());
  EXPECT_EQ(v_jtab(0), 2);
  EXPECT_EQ(v_jtab(1), 2);
  EXPECT_EQ(v_jtab(7), 8);
  EXPECT_EQ(k.hits, 3);
}

TEST_F(Optimize, CompiledJumpTableStillFiresWhateverTheVerdict) {
  int (*volatile classify)(int) = classify_o2;
  Counter k;
  KprobeGuard g{counter_at(&k, addr_of(classify_o2), bounds_at(addr_of(classify_o2)))};
  ASSERT_EQ(register_kprobe(&k), 0);
  wait_for_kprobe_optimizer();
  const int want[] = {11, 23, 37, 41, 59, 61, 73, 89, -1};
  for (int i = 0; i <= 8; ++i) EXPECT_EQ(classify(i), want[i]);
  EXPECT_EQ(k.hits, 9);
}

TEST_F(Optimize, RedZoneOfALeafSurvivesAMidFunctionOptimizedHit) {
  Counter k;
  KprobeGuard g{counter_at(&k, addr_of(pf_leaf_redzone_mid),
                           {addr_of(pf_leaf_redzone), addr_of(pf_leaf_redzone_end)})};
  ASSERT_EQ(register_kprobe(&k), 0);
  wait_for_kprobe_optimizer();
  ASSERT_TRUE(optimized(k)) << kprobe_optimization_status(&k);
  for (long x : {0L, 1L, 99L, -5L}) EXPECT_EQ(v_leaf_redzone(x), x + 1);
  EXPECT_EQ(k.hits, 4);
}

TEST_F(Optimize, EveryFlagSurvivesAnOptimizedHitAndATrap) {
  unsigned long (*volatile flags_keep)(unsigned long) = pf_flags_keep;
  // CF PF AF ZF SF DF OF, alone and together; bit 1 is always set in rflags.
  const unsigned long patterns[] = {0x0, 0x1, 0x4, 0x10, 0x40, 0x80, 0x400, 0x800, 0xcd5, 0x8c1};
  for (bool optimize : {true, false}) {
    set_kprobes_optimization(optimize);
    Counter k;
    KprobeGuard g{counter_at(&k, addr_of(pf_flags_keep_probe),
                             {addr_of(pf_flags_keep), addr_of(pf_flags_keep_end)})};
    ASSERT_EQ(register_kprobe(&k), 0);
    wait_for_kprobe_optimizer();
    ASSERT_EQ(optimized(k), optimize) << kprobe_optimization_status(&k);
    for (unsigned long f : patterns) EXPECT_EQ(flags_keep(f | 0x2), f) << std::hex << f;
    EXPECT_EQ(k.hits, static_cast<long>(std::size(patterns)));
  }
}

struct RetCounterBase : Kretprobe {
  std::atomic<long> returns{0};
};

// Handlers are ordinary C++: nothing stops them using vector registers.
int clobber_vector_registers(Kprobe* p, PtRegs*) {
  static_cast<Counter*>(p)->hits.fetch_add(1);
  asm volatile(
      "pcmpeqd %%xmm0, %%xmm0\n\tpcmpeqd %%xmm1, %%xmm1\n\tpcmpeqd %%xmm7, %%xmm7\n\t"
      "pcmpeqd %%xmm15, %%xmm15" ::: "xmm0", "xmm1", "xmm7", "xmm15");
  return 0;
}

TEST_F(Optimize, VectorRegistersSurviveAHandlerThatUsesThem) {
  double (*volatile xmm_keep)(double) = pf_xmm_keep;
  for (bool optimize : {true, false}) {
    set_kprobes_optimization(optimize);
    Counter k;
    counter_at(&k, addr_of(pf_xmm_keep_probe), {addr_of(pf_xmm_keep), addr_of(pf_xmm_keep_end)});
    k.pre_handler = clobber_vector_registers;
    KprobeGuard g{&k};
    ASSERT_EQ(register_kprobe(&k), 0);
    wait_for_kprobe_optimizer();
    ASSERT_EQ(optimized(k), optimize) << kprobe_optimization_status(&k);
    EXPECT_EQ(xmm_keep(1.5), 3.0);
    EXPECT_EQ(xmm_keep(-4.25), -8.5);
    EXPECT_EQ(k.hits, 2);
  }
}

// What a handler does when it calls libc's AVX string functions: they end in vzeroupper,
// which clears the upper halves of ymm0-15. AVX-512 code also has zmm16-31 and k0-7.
int clobber_wide_registers(Kprobe* p, PtRegs*) {
  static_cast<Counter*>(p)->hits.fetch_add(1);
  asm volatile("vzeroupper" ::: "memory");
  if (__builtin_cpu_supports("avx512f"))
    asm volatile("vpxord %%zmm16, %%zmm16, %%zmm16\n\tvpxord %%zmm31, %%zmm31, %%zmm31\n\t"
                 "kxorw %%k1, %%k1, %%k1" ::: "memory");
  return 0;
}

TEST_F(Optimize, WideVectorRegistersSurviveAHandlerThatClearsThem) {
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "no AVX2 here";
  const long avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  for (bool optimize : {false, true}) {
    SCOPED_TRACE(optimize ? "optimized" : "int3");
    set_kprobes_optimization(optimize);
    Counter k;
    counter_at(&k, addr_of(pf_wide_keep_probe), {addr_of(pf_wide_keep), addr_of(pf_wide_keep_end)});
    k.pre_handler = clobber_wide_registers;
    KprobeGuard g{&k};
    ASSERT_EQ(register_kprobe(&k), 0);
    wait_for_kprobe_optimizer();
    ASSERT_EQ(optimized(k), optimize) << kprobe_optimization_status(&k);
    EXPECT_EQ(pf_wide_keep(avx512), 0u);
    EXPECT_EQ(k.hits, 1);
  }
}

void clear_wide_registers() {
  asm volatile("vzeroupper" ::: "memory");
  if (__builtin_cpu_supports("avx512f"))
    asm volatile("vpxord %%zmm16, %%zmm16, %%zmm16\n\tvpxord %%zmm31, %%zmm31, %%zmm31\n\t"
                 "kxorw %%k1, %%k1, %%k1" ::: "memory");
}

struct WideRet : Kretprobe {
  std::atomic<long> returns{0};
};

int clear_wide_on_return(KretprobeInstance* ri, PtRegs*) {
  static_cast<WideRet*>(get_kretprobe(ri))->returns.fetch_add(1);
  clear_wide_registers();
  return 0;
}

int clear_wide_on_entry(KretprobeInstance*, PtRegs*) {
  clear_wide_registers();
  return 0;
}

// The same across a call to a return-probed function, whose entry and return handlers
// clear them: the entry thunks and both kinds of return trampoline.
TEST_F(Optimize, WideVectorRegistersSurviveReturnProbeHandlersThatClearThem) {
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "no AVX2 here";
  const long avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  const FunctionBounds b{addr_of(pf_leaf_add1), addr_of(pf_leaf_add1_end)};
  for (bool with_entry_handler : {false, true}) {
    for (bool optimize : {false, true}) {
      SCOPED_TRACE(std::string(optimize ? "optimized" : "int3") +
                   (with_entry_handler ? ", entry handler" : ""));
      set_kprobes_optimization(optimize);
      WideRet rp;
      rp.kp.addr = addr_of(pf_leaf_add1);
      rp.kp.bounds = b;
      rp.handler = clear_wide_on_return;
      if (with_entry_handler) rp.entry_handler = clear_wide_on_entry;
      KretprobeGuard g{&rp};
      ASSERT_EQ(register_kretprobe(&rp), 0);
      wait_for_kprobe_optimizer();
      ASSERT_EQ(optimized(rp.kp), optimize) << kprobe_optimization_status(&rp.kp);
      EXPECT_EQ(pf_wide_across_call(pf_leaf_add1, avx512), 0u);
      EXPECT_EQ(rp.returns, 1);
    }
  }
}

TEST_F(Optimize, GprOnlyProbesTakeTheLeanDetourAndSwitchBackWhenJoined) {
  double (*volatile xmm_keep)(double) = pf_xmm_keep;
  unsigned long (*volatile flags_keep)(unsigned long) = pf_flags_keep;
  const FunctionBounds xb{addr_of(pf_xmm_keep), addr_of(pf_xmm_keep_end)};
  Kprobe lean;
  lean.addr = addr_of(pf_xmm_keep_probe);
  lean.bounds = xb;
  lean.pre_handler = test_util::gpr_only_count;
  lean.flags = KPROBE_FLAG_GPR_ONLY;
  Kprobe flags_probe = {};
  flags_probe.addr = addr_of(pf_flags_keep_probe);
  flags_probe.bounds = {addr_of(pf_flags_keep), addr_of(pf_flags_keep_end)};
  flags_probe.pre_handler = test_util::gpr_only_count;
  flags_probe.flags = KPROBE_FLAG_GPR_ONLY;
  KprobeGuard g1{&lean}, g2{&flags_probe};
  ASSERT_EQ(register_kprobe(&lean), 0);
  ASSERT_EQ(register_kprobe(&flags_probe), 0);
  wait_for_kprobe_optimizer();
  ASSERT_TRUE(optimized(lean)) << kprobe_optimization_status(&lean);
  ASSERT_TRUE(optimized(flags_probe)) << kprobe_optimization_status(&flags_probe);
  const long before = test_util::g_gpr_only_hits;
  EXPECT_EQ(xmm_keep(1.25), 2.5);
  for (unsigned long f : {0x0ul, 0xcd5ul, 0x801ul}) EXPECT_EQ(flags_keep(f | 0x2), f);
  EXPECT_EQ(test_util::g_gpr_only_hits - before, 4);

  // A handler that uses vector registers joins: the detour becomes the saving kind.
  Counter full;
  counter_at(&full, addr_of(pf_xmm_keep_probe), xb);
  full.pre_handler = clobber_vector_registers;
  KprobeGuard g3{&full};
  ASSERT_EQ(register_kprobe(&full), 0);
  wait_for_kprobe_optimizer();
  ASSERT_TRUE(optimized(full)) << kprobe_optimization_status(&full);
  EXPECT_EQ(xmm_keep(3.0), 6.0);
  EXPECT_EQ(full.hits, 1);
  ASSERT_EQ(unregister_kprobe(&full), 0);
  wait_for_kprobe_optimizer();
  EXPECT_TRUE(optimized(lean));
  EXPECT_EQ(xmm_keep(-1.0), -2.0);
}

// A probe that needs more saved than the detour in place saves (here: vector registers)
// joins and leaves while another thread keeps hitting the site. A hit already on its way
// through the lean detour must not run the newcomer's handler.
TEST_F(Optimize, AJoiningHandlerNeverRunsOnADetourThatSavesTooLittle) {
  double (*volatile xmm_keep)(double) = pf_xmm_keep;
  const FunctionBounds xb{addr_of(pf_xmm_keep), addr_of(pf_xmm_keep_end)};
  Kprobe lean;
  lean.addr = addr_of(pf_xmm_keep_probe);
  lean.bounds = xb;
  lean.pre_handler = test_util::gpr_only_count;
  lean.flags = KPROBE_FLAG_GPR_ONLY;
  KprobeGuard g1{&lean};
  ASSERT_EQ(register_kprobe(&lean), 0);
  wait_for_kprobe_optimizer();
  ASSERT_TRUE(optimized(lean)) << kprobe_optimization_status(&lean);
  std::atomic<bool> stop{false};
  std::atomic<long> wrong{0}, calls{0};
  std::thread caller([&] {
    for (long i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      const double x = static_cast<double>(i % 1000);
      if (xmm_keep(x) != 2 * x) wrong.fetch_add(1);
      calls.fetch_add(1, std::memory_order_relaxed);
    }
  });
  for (int round = 0; round < 300; ++round) {
    Counter full;
    counter_at(&full, addr_of(pf_xmm_keep_probe), xb);
    full.pre_handler = clobber_vector_registers;
    KprobeGuard g{&full};
    ASSERT_EQ(register_kprobe(&full), 0);
    // Let hits run the newcomer before the detour changes kind.
    for (long seen = calls.load(); calls.load() < seen + 20;) std::this_thread::yield();
    ASSERT_EQ(unregister_kprobe(&full), 0);
    wait_for_kprobe_optimizer();
  }
  stop = true;
  caller.join();
  EXPECT_EQ(wrong.load(), 0);
}

int clobber_on_return(KretprobeInstance* ri, PtRegs*) {
  static_cast<RetCounterBase*>(get_kretprobe(ri))->returns.fetch_add(1);
  asm volatile("pcmpeqd %%xmm0, %%xmm0\n\tpcmpeqd %%xmm1, %%xmm1" ::: "xmm0", "xmm1");
  return 0;
}

TEST_F(Optimize, FloatingPointReturnValueSurvivesTheReturnHandler) {
  double (*volatile xmm_keep)(double) = pf_xmm_keep;
  RetCounterBase rp;
  rp.kp.addr = addr_of(pf_xmm_keep);
  rp.kp.bounds = {addr_of(pf_xmm_keep), addr_of(pf_xmm_keep_end)};
  rp.handler = clobber_on_return;
  KretprobeGuard g{&rp};
  ASSERT_EQ(register_kretprobe(&rp), 0);
  wait_for_kprobe_optimizer();
  EXPECT_EQ(xmm_keep(2.5), 5.0);
  EXPECT_EQ(rp.returns, 1);
}

struct RetCounter : Kretprobe {
  std::atomic<long> returns{0};
  std::atomic<long> last{0};
};

int count_return(KretprobeInstance* ri, PtRegs* regs) {
  auto* rp = static_cast<RetCounter*>(get_kretprobe(ri));
  rp->last = static_cast<long>(regs->ax);
  rp->returns.fetch_add(1);
  return 0;
}

// A return probe on the entry of the function at addr that counts returns.
RetCounter* ret_counter_at(RetCounter* rp, uintptr_t addr) {
  rp->kp.addr = addr;
  rp->kp.bounds = bounds_at(addr);
  rp->handler = count_return;
  return rp;
}

TEST_F(Optimize, ReturnProbeEntryIsOptimizedAndReturnsNeedNoTrap) {
  RetCounter rp;
  ret_counter_at(&rp, addr_of(mul_o2));
  KretprobeGuard g{&rp};
  ASSERT_EQ(register_kretprobe(&rp), 0);
  wait_for_kprobe_optimizer();
  ASSERT_TRUE(optimized(rp.kp)) << kprobe_optimization_status(&rp.kp);
  for (long i = 0; i < 100; ++i) EXPECT_EQ(v_mul_o2(i, 3), i * 3);
  EXPECT_EQ(rp.returns, 100);
  EXPECT_EQ(rp.last, 99 * 3);
  EXPECT_NE(kprobes_list().find("  r  mul_o2+0x0    [OPTIMIZED]"), std::string::npos)
      << kprobes_list();
}

// The rest of the return probes' tests run the detour's call mode: a hit that hijacked the
// return address runs the function as a call of the detour's; one that hijacked nothing
// goes the plain way. Either way the function computes what it computes unprobed.

TEST_F(Optimize, ReturnProbeHitsWithoutAnInstanceTakeThePlainPath) {
  RetCounter rp;
  ret_counter_at(&rp, addr_of(depth_o0));
  rp.maxactive = 2;
  KretprobeGuard g{&rp};
  ASSERT_EQ(register_kretprobe(&rp), 0);
  wait_for_kprobe_optimizer();
  ASSERT_TRUE(optimized(rp.kp)) << kprobe_optimization_status(&rp.kp);
  // Six calls in flight, two instances: the two outermost returns are seen.
  EXPECT_EQ(v_depth_o0(5), 5);
  EXPECT_EQ(rp.returns, 2);
  EXPECT_EQ(rp.last, 5);
  EXPECT_EQ(rp.nmissed, 4u);
  EXPECT_EQ(v_depth_o0(1), 1);
  EXPECT_EQ(rp.returns, 4);
  EXPECT_EQ(rp.nmissed, 4u);
}

int decline_odd(KretprobeInstance*, PtRegs* regs) { return regs->si & 1; }

TEST_F(Optimize, ReturnProbeHitsAnEntryHandlerDeclinesTakeThePlainPath) {
  RetCounter rp;
  ret_counter_at(&rp, addr_of(mul_o2));
  rp.entry_handler = decline_odd;
  KretprobeGuard g{&rp};
  ASSERT_EQ(register_kretprobe(&rp), 0);
  wait_for_kprobe_optimizer();
  ASSERT_TRUE(optimized(rp.kp)) << kprobe_optimization_status(&rp.kp);
  for (long i = 0; i < 100; ++i) EXPECT_EQ(v_mul_o2(7, i), 7 * i);
  EXPECT_EQ(rp.returns, 50);
  EXPECT_EQ(rp.last, 7 * 98);
  EXPECT_EQ(rp.nmissed, 0u);
}

int set_return_value(KretprobeInstance* ri, PtRegs* regs) {
  static_cast<RetCounter*>(get_kretprobe(ri))->returns.fetch_add(1);
  regs->ax = 1234;
  return 0;
}

TEST_F(Optimize, ReturnHandlerChangesTheReturnValue) {
  RetCounter rp;
  rp.kp.addr = addr_of(add_o2);
  rp.kp.bounds = bounds_at(rp.kp.addr);
  rp.handler = set_return_value;
  KretprobeGuard g{&rp};
  ASSERT_EQ(register_kretprobe(&rp), 0);
  wait_for_kprobe_optimizer();
  ASSERT_TRUE(optimized(rp.kp)) << kprobe_optimization_status(&rp.kp);
  EXPECT_EQ(v_add_o2(1, 2), 1234);
  ASSERT_EQ(unregister_kretprobe(&rp), 0);
  EXPECT_EQ(v_add_o2(1, 2), 3);
  EXPECT_EQ(rp.returns, 1);
}

TEST_F(Optimize, KprobeAndReturnProbeShareTheDetourWhileTheReturnProbeComesAndGoes) {
  Counter k;
  KprobeGuard gk{counter_at(&k, addr_of(mul_o2), bounds_at(addr_of(mul_o2)))};
  RetCounter rp;
  ret_counter_at(&rp, addr_of(mul_o2));
  KretprobeGuard gr{&rp};
  ASSERT_EQ(register_kprobe(&k), 0);
  ASSERT_EQ(register_kretprobe(&rp), 0);
  wait_for_kprobe_optimizer();
  ASSERT_TRUE(optimized(k)) << kprobe_optimization_status(&k);
  auto calls = [](long n) {
    bool right = true;
    for (long i = 0; i < n; ++i) right = right && v_mul_o2(i, 5) == i * 5;
    return right;
  };
  EXPECT_TRUE(calls(10));
  EXPECT_EQ(k.hits, 10);
  EXPECT_EQ(rp.returns, 10);

  ASSERT_EQ(disable_kretprobe(&rp), 0);
  wait_for_kprobe_optimizer();
  EXPECT_TRUE(optimized(k)) << kprobe_optimization_status(&k);
  EXPECT_TRUE(calls(10));
  EXPECT_EQ(k.hits, 20);
  EXPECT_EQ(rp.returns, 10);

  ASSERT_EQ(enable_kretprobe(&rp), 0);
  wait_for_kprobe_optimizer();
  EXPECT_TRUE(optimized(k)) << kprobe_optimization_status(&k);
  EXPECT_TRUE(calls(10));
  EXPECT_EQ(k.hits, 30);
  EXPECT_EQ(rp.returns, 20);
  EXPECT_EQ(rp.last, 9 * 5);
}

int decline_all(KretprobeInstance*, PtRegs*) { return 1; }

// pf_tail_outer jumps to pf_tail_inner, whose return address is then the one the outer
// return probe hijacked: the inner entry sees the trampoline there whether or not it
// hijacked anything itself.
TEST_F(Optimize, TailCallIntoAReturnProbedFunctionKeepsEveryReturn) {
  long (*volatile tail)(long) = pf_tail_outer;
  RetCounter outer, inner, declining;
  outer.kp.addr = addr_of(pf_tail_outer);
  outer.kp.bounds = {addr_of(pf_tail_outer), addr_of(pf_tail_outer_end)};
  outer.handler = count_return;
  for (RetCounter* rp : {&inner, &declining}) {
    rp->kp.addr = addr_of(pf_tail_inner);
    rp->kp.bounds = {addr_of(pf_tail_inner), addr_of(pf_tail_inner_end)};
    rp->handler = count_return;
  }
  declining.entry_handler = decline_all;
  KretprobeGuard go{&outer}, gi{&inner}, gd{&declining};
  ASSERT_EQ(register_kretprobe(&outer), 0);
  ASSERT_EQ(register_kretprobe(&inner), 0);
  wait_for_kprobe_optimizer();
  ASSERT_TRUE(optimized(inner.kp)) << kprobe_optimization_status(&inner.kp);
  EXPECT_EQ(tail(4), 7);
  EXPECT_EQ(outer.returns, 1);
  EXPECT_EQ(inner.returns, 1);
  EXPECT_EQ(outer.last, 7);
  EXPECT_EQ(inner.last, 7);

  ASSERT_EQ(unregister_kretprobe(&inner), 0);
  ASSERT_EQ(register_kretprobe(&declining), 0);
  wait_for_kprobe_optimizer();
  ASSERT_TRUE(optimized(declining.kp)) << kprobe_optimization_status(&declining.kp);
  EXPECT_EQ(tail(10), 13);
  EXPECT_EQ(outer.returns, 2);
  EXPECT_EQ(outer.last, 13);
  EXPECT_EQ(declining.returns, 0);
  EXPECT_EQ(v_mul_o2(3, 3), 9);  // and the stack is as it was
}

TEST_F(Optimize, TwoReturnProbesShareTheLeanEntry) {
  RetCounter a, b;
  for (RetCounter* rp : {&a, &b}) {
    rp->kp.addr = addr_of(mul_o2);
    rp->kp.bounds = bounds_at(rp->kp.addr);
    rp->handler = count_return;
  }
  b.kp.flags = KPROBE_FLAG_DISABLED;
  KretprobeGuard ga{&a}, gb{&b};
  ASSERT_EQ(register_kretprobe(&a), 0);
  ASSERT_EQ(register_kretprobe(&b), 0);
  wait_for_kprobe_optimizer();
  ASSERT_TRUE(optimized(a.kp)) << kprobe_optimization_status(&a.kp);
  EXPECT_EQ(v_mul_o2(3, 4), 12);
  ASSERT_EQ(enable_kretprobe(&b), 0);
  wait_for_kprobe_optimizer();
  ASSERT_TRUE(optimized(b.kp)) << kprobe_optimization_status(&b.kp);
  EXPECT_EQ(v_mul_o2(5, 4), 20);
  EXPECT_EQ(a.returns, 2);
  EXPECT_EQ(b.returns, 1);
  EXPECT_EQ(b.last, 20);
}

constexpr long kR12Mark = 0x5eed5eed5eedL;
std::atomic<long> g_r12_wrong{0};
int check_r12(Kprobe* p, PtRegs* regs) {
  static_cast<Counter*>(p)->hits.fetch_add(1);
  if (static_cast<long>(regs->r12) != kR12Mark) g_r12_wrong.fetch_add(1);
  return 0;
}

// A return probe's lean entry saves too little for a kprobe that reads every register:
// one that joins while hits are in flight sees only hits that saved them all.
TEST_F(Optimize, AJoiningKprobeSeesEveryRegisterBesideALeanReturnProbe) {
  RetCounter rp;
  ret_counter_at(&rp, addr_of(add_o2));
  KretprobeGuard gr{&rp};
  ASSERT_EQ(register_kretprobe(&rp), 0);
  wait_for_kprobe_optimizer();
  ASSERT_TRUE(optimized(rp.kp)) << kprobe_optimization_status(&rp.kp);
  g_r12_wrong = 0;
  std::atomic<bool> stop{false};
  std::atomic<long> wrong{0}, calls{0};
  std::thread caller([&] {
    for (long i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      if (pf_call_with_r12(v_add_o2, i, kR12Mark) != i + 1) wrong.fetch_add(1);
      calls.fetch_add(1, std::memory_order_relaxed);
    }
  });
  long kprobe_hits = 0;
  for (int round = 0; round < 200; ++round) {
    Counter k;
    counter_at(&k, addr_of(add_o2), bounds_at(addr_of(add_o2)));
    k.pre_handler = check_r12;
    KprobeGuard g{&k};
    ASSERT_EQ(register_kprobe(&k), 0);
    for (long seen = calls.load(); calls.load() < seen + 20;) std::this_thread::yield();
    ASSERT_EQ(unregister_kprobe(&k), 0);
    kprobe_hits += k.hits;
    wait_for_kprobe_optimizer();
  }
  stop = true;
  caller.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(g_r12_wrong.load(), 0);
  EXPECT_GT(kprobe_hits, 0);
  EXPECT_EQ(rp.returns.load(), calls.load()) << "nmissed " << rp.nmissed;
}

void clobber_scratch_and_vector() {
  test_util::clobber_scratch_gprs();
  asm volatile(
      "pcmpeqd %%xmm0, %%xmm0\n\tpcmpeqd %%xmm1, %%xmm1\n\tpcmpeqd %%xmm2, %%xmm2\n\t"
      "pcmpeqd %%xmm3, %%xmm3\n\tpcmpeqd %%xmm4, %%xmm4\n\tpcmpeqd %%xmm5, %%xmm5\n\t"
      "pcmpeqd %%xmm6, %%xmm6\n\tpcmpeqd %%xmm7, %%xmm7\n\tpcmpeqd %%xmm8, %%xmm8\n\t"
      "pcmpeqd %%xmm9, %%xmm9\n\tpcmpeqd %%xmm10, %%xmm10\n\tpcmpeqd %%xmm11, %%xmm11\n\t"
      "pcmpeqd %%xmm12, %%xmm12\n\tpcmpeqd %%xmm13, %%xmm13\n\tpcmpeqd %%xmm14, %%xmm14\n\t"
      "pcmpeqd %%xmm15, %%xmm15" ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6",
      "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
}

int clobbering_return(KretprobeInstance* ri, PtRegs*) {
  static_cast<RetCounter*>(get_kretprobe(ri))->returns.fetch_add(1);
  clobber_scratch_and_vector();
  return 0;
}

int clobbering_entry(KretprobeInstance*, PtRegs*) {
  clobber_scratch_and_vector();
  return 0;
}

int clobbering_pre(Kprobe* p, PtRegs*) {
  static_cast<Counter*>(p)->hits.fetch_add(1);
  clobber_scratch_and_vector();
  return 0;
}

// Compilers that see the callee (GCC's -fipa-ra, on at -O2) keep values in scratch
// registers across a call that does not touch them: a probe's entry and return must give
// back every register, whatever its handlers do, on every path and detour kind.
TEST_F(Optimize, ScratchRegistersSurviveEntryAndReturnHandlersThatClobberThem) {
  const FunctionBounds b{addr_of(pf_leaf_add1), addr_of(pf_leaf_add1_end)};
  struct Setup {
    const char* what;
    kretprobe_handler_t handler, entry_handler;
    bool gpr_only, with_kprobe;
  };
  const Setup setups[] = {
      {"return handler", clobbering_return, nullptr, false, false},
      {"return handler, gpr only", test_util::gpr_only_clobber_return, nullptr, true, false},
      {"entry and return handlers", clobbering_return, clobbering_entry, false, false},
      {"entry and return handlers, gpr only", test_util::gpr_only_clobber_return,
       test_util::gpr_only_clobber_entry, true, false},
      {"return handler beside a kprobe", clobbering_return, nullptr, false, true},
  };
  for (const Setup& s : setups) {
    for (bool optimize : {false, true}) {
      SCOPED_TRACE(std::string(s.what) + (optimize ? ", optimized" : ", int3"));
      set_kprobes_optimization(optimize);
      RetCounter rp;
      rp.kp.addr = addr_of(pf_leaf_add1);
      rp.kp.bounds = b;
      rp.kp.flags = s.gpr_only ? uint32_t{KPROBE_FLAG_GPR_ONLY} : 0u;
      rp.handler = s.handler;
      rp.entry_handler = s.entry_handler;
      Counter k;
      counter_at(&k, addr_of(pf_leaf_add1), b);
      k.pre_handler = clobbering_pre;
      KretprobeGuard gr{&rp};
      KprobeGuard gk{&k};
      ASSERT_EQ(register_kretprobe(&rp), 0);
      if (s.with_kprobe) {
        ASSERT_EQ(register_kprobe(&k), 0);
      }
      wait_for_kprobe_optimizer();
      ASSERT_EQ(optimized(rp.kp), optimize) << kprobe_optimization_status(&rp.kp);
      const long before = rp.returns + test_util::g_gpr_only_hits;
      EXPECT_EQ(pf_scratch_kept(pf_leaf_add1), 0u);
      EXPECT_EQ(pf_scratch_kept(pf_leaf_add1), 0u);
      EXPECT_EQ(rp.returns + test_util::g_gpr_only_hits - before, 2);
      EXPECT_EQ(k.hits, s.with_kprobe ? 2 : 0);
    }
  }
}

int redirect_attempt(Kprobe* p, PtRegs* r) {
  static_cast<Counter*>(p)->hits.fetch_add(1);
  r->ip = 0;  // ignored on an optimized probe
  return 1;
}

void noop_post(Kprobe*, PtRegs*, unsigned long) {}

TEST_F(Optimize, ObstaclesUnoptimizeAndTheirRemovalReoptimizes) {
  Counter k;
  KprobeGuard g{counter_at(&k, addr_of(pf_two_step), {addr_of(pf_two_step), addr_of(pf_two_step_end)})};
  ASSERT_EQ(register_kprobe(&k), 0);
  wait_for_kprobe_optimizer();
  ASSERT_TRUE(optimized(k)) << kprobe_optimization_status(&k);

  // A probe inside the replaced instructions.
  Counter inner;
  {
    KprobeGuard gi{counter_at(&inner, addr_of(pf_two_step_second), {addr_of(pf_two_step), addr_of(pf_two_step_end)})};
    ASSERT_EQ(register_kprobe(&inner), 0);
    EXPECT_FALSE(optimized(k));
    wait_for_kprobe_optimizer();
    EXPECT_FALSE(optimized(k)) << kprobe_optimization_status(&k);
    EXPECT_EQ(v_two_step(5), 13);
    EXPECT_EQ(k.hits, 1);
    EXPECT_EQ(inner.hits, 1);
    ASSERT_EQ(unregister_kprobe(&inner), 0);
  }
  wait_for_kprobe_optimizer();
  EXPECT_TRUE(optimized(k)) << kprobe_optimization_status(&k);

  // A post handler on the same address.
  Counter with_post;
  counter_at(&with_post, addr_of(pf_two_step), {addr_of(pf_two_step), addr_of(pf_two_step_end)});
  with_post.post_handler = noop_post;
  {
    KprobeGuard gp{&with_post};
    ASSERT_EQ(register_kprobe(&with_post), 0);
    wait_for_kprobe_optimizer();
    EXPECT_FALSE(optimized(k));
    EXPECT_EQ(v_two_step(1), 5);
    EXPECT_EQ(with_post.hits, 1);
    ASSERT_EQ(unregister_kprobe(&with_post), 0);
  }
  wait_for_kprobe_optimizer();
  EXPECT_TRUE(optimized(k));

  // The switch.
  set_kprobes_optimization(false);
  EXPECT_FALSE(optimized(k));
  EXPECT_EQ(kprobe_optimization_status(&k), "optimization is switched off");
  EXPECT_EQ(v_two_step(2), 7);
  set_kprobes_optimization(true);
  wait_for_kprobe_optimizer();
  EXPECT_TRUE(optimized(k));

  // Disabled: the jmp goes, and comes back when enabled.
  ASSERT_EQ(disable_kprobe(&k), 0);
  EXPECT_FALSE(optimized(k));
  ASSERT_EQ(enable_kprobe(&k), 0);
  wait_for_kprobe_optimizer();
  EXPECT_TRUE(optimized(k));
  const long before = k.hits;
  EXPECT_EQ(v_two_step(3), 9);
  EXPECT_EQ(k.hits, before + 1);
}

// What the notifier heard (set_kprobes_list_notifier): the optimizer thread calls it.
std::mutex g_notice_mu;
std::condition_variable g_notice_cv;
int g_notices = 0;
void on_list_changed() {
  std::lock_guard l(g_notice_mu);
  ++g_notices;
  g_notice_cv.notify_all();
}

// A probe that cannot become a jmp at once (a running thread blocks the signal that would
// move it) is retried by the optimizer thread, which tells the list notifier when it made
// the jmp: the list changed outside any control operation.
TEST_F(Optimize, TheOptimizerThreadTellsTheListNotifierOfAJmpItMade) {
  set_kprobes_list_notifier(on_list_changed);
  struct Unset {
    ~Unset() { set_kprobes_list_notifier(nullptr); }
  } unset;
  std::atomic<bool> blocking{false}, release{false};
  std::thread blocker([&] {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, nullptr);
    blocking = true;
    while (!release.load(std::memory_order_relaxed)) {
    }  // running, with every signal blocked: no jmp can be written meanwhile
  });
  while (!blocking.load()) std::this_thread::yield();
  Counter k;
  KprobeGuard g{counter_at(&k, addr_of(add_o2), bounds_at(addr_of(add_o2)))};
  {
    struct Release {  // the blocker ends whatever fails
      std::atomic<bool>& r;
      std::thread& t;
      ~Release() {
        r = true;
        if (t.joinable()) t.join();
      }
    } rel{release, blocker};
    ASSERT_EQ(register_kprobe(&k), 0);
    EXPECT_FALSE(optimized(k)) << "a running thread blocks the fixup signal";
    {
      std::lock_guard l(g_notice_mu);
      g_notices = 0;
    }
  }
  std::unique_lock l(g_notice_mu);
  EXPECT_TRUE(g_notice_cv.wait_for(l, std::chrono::seconds(30),
                                   [&] { return g_notices > 0 && optimized(k); }))
      << kprobe_optimization_status(&k);
  l.unlock();
  EXPECT_NE(kprobes_list().find("[OPTIMIZED]"), std::string::npos) << kprobes_list();
  EXPECT_EQ(v_add_o2(1, 2), 3);
  EXPECT_EQ(k.hits, 1);
}

TEST_F(Optimize, PreHandlerIpChangeIsIgnoredWhenOptimized) {
  Counter k;
  k.addr = addr_of(add_o2);
  k.bounds = bounds_at(k.addr);
  k.pre_handler = redirect_attempt;
  KprobeGuard g{&k};
  ASSERT_EQ(register_kprobe(&k), 0);
  wait_for_kprobe_optimizer();
  ASSERT_TRUE(optimized(k)) << kprobe_optimization_status(&k);
  EXPECT_EQ(v_add_o2(2, 2), 4);
  EXPECT_EQ(k.hits, 1);
}

// Two threads call a probed function while the probe goes from int3 to jmp and back. A
// thread left on the replaced instructions when the jmp goes in crashes or computes
// garbage; a hit lost or doubled at a change of form breaks the count.
//
// Each round waits until the workers have made calls through each form, so that every
// change of form meets threads running through the site however the scheduler treats
// them. Without that wait, on a loaded 2-CPU machine the workers went without the CPU for
// long stretches of rounds, and an engine that wrote the jmp without moving threads off the
// region survived 2 of 5 runs of 3,000 rounds. With it, that engine crashed in all 5 runs
// within 20 rounds, and one that wrote the int3 back after the jmp's tail (instead of
// before) within 30. kRounds is ten times that and takes about 15 s there; 10,000 rounds
// without the wait took up to 300 s.
TEST_F(Optimize, CallsAreCountedExactlyWhileTheProbeFlipsForm) {
  constexpr int kRounds = 200;
  constexpr long kCallsPerForm = 20;
  Counter k;
  KprobeGuard g{counter_at(&k, addr_of(add_o2), bounds_at(addr_of(add_o2)))};
  ASSERT_EQ(register_kprobe(&k), 0);
  std::atomic<bool> stop{false}, wrong{false};
  std::atomic<long> calls{0};
  auto worker = [&](long id) {
    for (long i = 0; !stop.load(std::memory_order_relaxed); ++i) {
      if (v_add_o2(i, id) != i + id) wrong = true;
      calls.fetch_add(1, std::memory_order_relaxed);
    }
  };
  std::thread t0(worker, 0), t1(worker, 1);
  auto calls_through_this_form = [&] {
    for (long seen = calls.load(); calls.load() < seen + kCallsPerForm;)
      std::this_thread::yield();
  };
  int optimized_rounds = 0;
  for (int round = 0; round < kRounds; ++round) {
    set_kprobes_optimization(true);
    wait_for_kprobe_optimizer();
    optimized_rounds += optimized(k);
    calls_through_this_form();
    set_kprobes_optimization(false);
    calls_through_this_form();
  }
  stop = true;
  t0.join();
  t1.join();
  EXPECT_FALSE(wrong.load());
  EXPECT_EQ(k.hits.load(), calls.load());
  EXPECT_GT(optimized_rounds, 0);
}

}  // namespace
}  // namespace probefs::probecore
