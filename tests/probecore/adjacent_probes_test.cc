// Probes side by side: one at every instruction boundary of several functions at once
// (-O0 and -O2 code, hand-written assembly, libc), all enabled, called from threads. A
// jmp may never cover another probe's address, and a probe registered inside a jmp's
// replaced instructions takes the jmp away first; whatever the order the probes arrive
// in, nothing crashes, every result is the unprobed one and every probe counts exactly
// what the same calls count through int3s alone.
//
// Each case runs in a forked child: a wrong byte in code ends a process, and it must end
// the case, not the suite.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "arch/testing.h"
#include "probecore/kprobes.h"
#include "tests/probecore/counting_probe.h"
#include "tests/probecore/probe_test_util.h"
#include "tests/probecore/targets.h"
#include "tracee/self_symbols.h"

namespace probefs::probecore {
namespace {

using test_util::expect_child_succeeded;
using test_util::g_failures;

struct Counter : test_util::Counter {
  std::string where;  // function+offset, for messages
};

using test_util::bounds_at;
using test_util::count_hit;

// Every instruction start of [b.start, b.end) that takes a probe, as the engine decides:
// a disabled probe is registered at each byte and kept where it is accepted (inside an
// instruction it is refused with EILSEQ, a ud2 with EINVAL).
std::vector<uintptr_t> boundaries(const FunctionBounds& b) {
  std::vector<uintptr_t> out;
  for (uintptr_t pc = b.start; pc < b.end; ++pc) {
    Kprobe k;
    k.addr = pc;
    k.bounds = b;
    k.pre_handler = count_hit;
    k.flags = KPROBE_FLAG_DISABLED;
    if (register_kprobe(&k) != 0) continue;
    out.push_back(pc);
    if (unregister_kprobe(&k) != 0) g_failures += "could not unregister a probe\n";
  }
  return out;
}

long (*volatile v_add_o0)(long, long) = add_o0;
long (*volatile v_add_o2)(long, long) = add_o2;
long (*volatile v_mul_o0)(long, long) = mul_o0;
int (*volatile v_classify_o0)(int) = classify_o0;
int (*volatile v_classify_o2)(int) = classify_o2;
unsigned long (*volatile v_count_char_o0)(const char*, char) = count_char_o0;
unsigned long (*volatile v_count_char_o2)(const char*, char) = count_char_o2;
long (*volatile v_depth_o0)(long) = depth_o0;
long (*volatile v_two_step)(long) = pf_two_step;
long (*volatile v_mix)(long) = pf_mix;
long (*volatile v_loop_sum)(long) = pf_loop_sum;
int (*volatile v_atoi)(const char*) = atoi;
long (*volatile v_labs)(long) = labs;
int (*volatile v_abs)(int) = abs;

// One round of calls into every probed function; the checksum of their results.
long call_all(long i) {
  static const char* const kWords[] = {"banana", "abracadabra", "", "aaaa", "probefs"};
  char num[32];
  std::snprintf(num, sizeof num, "%ld", i * 7 - 50);
  long sum = v_add_o0(i, 3) + v_add_o2(i, 5) + v_mul_o0(i, 3);
  sum += v_classify_o0(static_cast<int>(i % 10)) + v_classify_o2(static_cast<int>(i % 11));
  sum += static_cast<long>(v_count_char_o0(kWords[i % 5], 'a') + v_count_char_o2(kWords[i % 5], 'a'));
  sum += v_depth_o0(i % 4) + v_two_step(i) + v_mix(i) + v_loop_sum(i % 9);
  sum += v_atoi(num) + v_labs(-i) + v_abs(static_cast<int>(-i));
  return sum;
}

struct Target {
  const char* name;
  uintptr_t start;
  uintptr_t end;  // 0: from the symbol table
};

std::vector<Target> targets() {
  auto a = [](auto* f) { return reinterpret_cast<uintptr_t>(f); };
  return {
      {"add_o0", a(add_o0), 0},         {"add_o2", a(add_o2), 0},
      {"mul_o0", a(mul_o0), 0},         {"classify_o0", a(classify_o0), 0},
      {"classify_o2", a(classify_o2), 0}, {"count_char_o0", a(count_char_o0), 0},
      {"count_char_o2", a(count_char_o2), 0}, {"depth_o0", a(depth_o0), 0},
      {"pf_two_step", a(pf_two_step), a(pf_two_step_end)},
      {"pf_mix", a(pf_mix), a(pf_mix_end)},
      {"pf_loop_sum", a(pf_loop_sum), a(pf_loop_sum_end)},
      {"atoi", a(atoi), 0},             {"labs", a(labs), 0},
      {"abs", reinterpret_cast<uintptr_t>(v_abs), 0},
  };
}

// A probe at every boundary of every target, not yet registered.
std::vector<std::unique_ptr<Counter>> make_probes() {
  std::vector<std::unique_ptr<Counter>> out;
  for (const Target& t : targets()) {
    FunctionBounds b = t.end ? FunctionBounds{t.start, t.end} : bounds_at(t.start);
    if (!b.known()) {
      g_failures += std::string("no bounds for ") + t.name + "\n";
      continue;
    }
    for (uintptr_t pc : boundaries(b)) {
      auto k = std::make_unique<Counter>();
      k->addr = pc;
      k->where = std::string(t.name) + "+" + std::to_string(pc - b.start);
      k->bounds = b;
      k->pre_handler = count_hit;
      k->flags = KPROBE_FLAG_GPR_ONLY;
      out.push_back(std::move(k));
    }
  }
  return out;
}

constexpr int kThreads = 3;
constexpr long kCallsPerThread = 300;

// kThreads threads, each making kCallsPerThread rounds; the sum of every checksum.
long run_threads() {
  std::atomic<long> total{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      long s = 0;
      for (long i = 0; i < kCallsPerThread; ++i) s += call_all(i);
      total += s;
    });
  for (auto& th : threads) th.join();
  return total;
}

// Runs body in a child bounded by an alarm; the case fails if the child does.
template <typename F>
void in_child(F body) {
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(120);
    set_symbol_resolver(&tracee::self_symbol_resolver());
    body();
    if (!g_failures.empty()) {
      std::fputs(g_failures.c_str(), stderr);
      _exit(1);
    }
    _exit(0);
  }
  expect_child_succeeded(pid);
}

// Registers every probe in `order`, one control operation each, then settles the jmps.
void register_in(const std::vector<Counter*>& order) {
  for (Counter* k : order) {
    const int rc = register_kprobe(k);
    if (rc) {
      char m[128];
      std::snprintf(m, sizeof m, "register at %s: %d\n", k->where.c_str(), rc);
      g_failures += m;
    }
  }
  wait_for_kprobe_optimizer();
}

void check_counts_and_results(const std::vector<std::unique_ptr<Counter>>& probes,
                              const std::vector<long>& expected_hits, long expected_sum) {
  CHILD_EXPECT_EQ(run_threads(), expected_sum);
  long optimized = 0;
  for (size_t i = 0; i < probes.size(); ++i) {
    CHILD_EXPECT_EQ(probes[i]->hits.load(), expected_hits[i]);
    if (probes[i]->flags & KPROBE_FLAG_OPTIMIZED) ++optimized;
  }
  // Some jmps fit between the probes (a long instruction, a tail of the function).
  CHILD_EXPECT_TRUE(optimized > 0);
}

// The reference: the same calls with every probe an int3 (optimization off).
std::vector<long> reference_hits(const std::vector<std::unique_ptr<Counter>>& probes) {
  set_kprobes_optimization(false);
  std::vector<Counter*> order;
  for (auto& k : probes) order.push_back(k.get());
  register_in(order);
  run_threads();
  std::vector<long> hits;
  for (auto& k : probes) hits.push_back(k->hits.exchange(0));
  unregister_kprobes(reinterpret_cast<Kprobe**>(order.data()), static_cast<int>(order.size()));
  set_kprobes_optimization(true);
  return hits;
}

std::vector<Counter*> in_order(const std::vector<std::unique_ptr<Counter>>& probes, int how) {
  std::vector<Counter*> order;
  for (auto& k : probes) order.push_back(k.get());
  if (how == 1) std::reverse(order.begin(), order.end());
  if (how == 2) std::shuffle(order.begin(), order.end(), std::mt19937(12345));
  return order;
}

class AdjacentProbes : public ::testing::TestWithParam<int> {};

// Forward, backward and shuffled registration: each new probe lands beside, before or
// inside what is already optimized.
TEST_P(AdjacentProbes, AProbeAtEveryBoundaryCountsExactlyAndChangesNothing) {
  in_child([] {
    const long expected_sum = run_threads();
    auto probes = make_probes();
    CHILD_EXPECT_TRUE(probes.size() > 150);
    const std::vector<long> hits = reference_hits(probes);
    auto order = in_order(probes, GetParam());
    register_in(order);
    check_counts_and_results(probes, hits, expected_sum);
    unregister_kprobes(reinterpret_cast<Kprobe**>(order.data()), static_cast<int>(order.size()));
    CHILD_EXPECT_EQ(run_threads(), expected_sum);
  });
}

INSTANTIATE_TEST_SUITE_P(Orders, AdjacentProbes, ::testing::Values(0, 1, 2),
                         [](const auto& info) {
                           return std::string(info.param == 0   ? "Forward"
                                              : info.param == 1 ? "Backward"
                                                                : "Shuffled");
                         });

// Every probe registered disabled in a shuffled order, then enabled by `enable`; then the
// counts and results checked as when they are registered enabled.
template <typename Enable>
void enable_later(Enable enable) {
  in_child([enable] {
    const long expected_sum = run_threads();
    auto probes = make_probes();
    const std::vector<long> hits = reference_hits(probes);
    auto order = in_order(probes, 2);
    for (Counter* k : order) k->flags |= KPROBE_FLAG_DISABLED;
    register_in(order);
    enable(order);
    wait_for_kprobe_optimizer();
    check_counts_and_results(probes, hits, expected_sum);
    unregister_kprobes(reinterpret_cast<Kprobe**>(order.data()), static_cast<int>(order.size()));
  });
}

// One by one: a probe that becomes enabled beside an optimized one.
TEST(AdjacentProbesEnable, EnablingOneByOneBesideOptimizedProbes) {
  enable_later([](const std::vector<Counter*>& order) {
    for (Counter* k : order) CHILD_EXPECT_EQ(enable_kprobe(k), 0);
  });
}

// All at once (enable_kprobes: one control operation, their jmps in one window).
TEST(AdjacentProbesEnable, EnablingAllAtOnceInOneOperation) {
  enable_later([](std::vector<Counter*> order) {
    CHILD_EXPECT_EQ(enable_kprobes(reinterpret_cast<Kprobe**>(order.data()),
                                   static_cast<int>(order.size())),
                    0);
  });
}

// Probes come and go at every boundary while threads call the functions: nothing
// crashes and every result stays the unprobed one.
TEST(AdjacentProbesChurn, ProbesComeAndGoWhileThreadsCall) {
  in_child([] {
    const long expected_sum = run_threads();
    auto probes = make_probes();
    std::atomic<bool> done{false};
    std::atomic<long> refused{0};
    std::thread churn([&] {
      std::mt19937 rng(777);
      std::vector<bool> in(probes.size(), false);
      for (int round = 0; round < 3000; ++round) {
        const size_t i = rng() % probes.size();
        const int rc = in[i] ? unregister_kprobe(probes[i].get()) : register_kprobe(probes[i].get());
        if (rc) ++refused;
        in[i] = !in[i];
        if (round % 64 == 0) wait_for_kprobe_optimizer();
      }
      for (size_t i = 0; i < probes.size(); ++i)
        if (in[i] && unregister_kprobe(probes[i].get()) != 0) ++refused;
      done = true;
    });
    long rounds = 0;
    while (!done) {
      CHILD_EXPECT_EQ(run_threads(), expected_sum);
      ++rounds;
    }
    churn.join();
    CHILD_EXPECT_EQ(refused.load(), 0);
    CHILD_EXPECT_TRUE(rounds > 0);
    CHILD_EXPECT_EQ(run_threads(), expected_sum);
  });
}

}  // namespace
}  // namespace probefs::probecore
