// Traps that are not ours reach the handler the program installed before probecore. A
// binary of its own: the program's handler must be in place before the engine starts.
#include <signal.h>

#include <gtest/gtest.h>

#include <atomic>

#include "probecore/kprobes.h"
#include "tests/probecore/probe_test_util.h"
#include "tests/probecore/targets.h"

namespace {

std::atomic<int> g_program_traps{0};
std::atomic<int> g_last_code{0};

void program_handler(int, siginfo_t* info, void*) {
  g_program_traps.fetch_add(1);
  g_last_code = info->si_code;
}

std::atomic<long> g_hits{0};
int count(probefs::probecore::Kprobe*, probefs::PtRegs*) {
  g_hits.fetch_add(1);
  return 0;
}

long (*volatile v_add_o2)(long, long) = add_o2;

TEST(Chain, TrapsThatAreNotOursReachTheProgramsHandler) {
  using namespace probefs::probecore;
  g_program_traps = 0;  // from zero on every run (--gtest_repeat)
  g_hits = 0;
  Kprobe k;
  k.addr = reinterpret_cast<uintptr_t>(add_o2);
  k.bounds = test_util::bounds_of(reinterpret_cast<void*>(add_o2));
  k.pre_handler = count;
  test_util::KprobeGuard g{&k};
  ASSERT_EQ(register_kprobe(&k), 0);

  asm volatile("int3");  // the program's own breakpoint
  EXPECT_EQ(g_program_traps, 1);
  EXPECT_EQ(g_last_code, SI_KERNEL);
  raise(SIGTRAP);  // a SIGTRAP sent, not trapped
  EXPECT_EQ(g_program_traps, 2);

  EXPECT_EQ(v_add_o2(20, 22), 42);
  EXPECT_EQ(g_hits, 1);
  EXPECT_EQ(g_program_traps, 2);  // our trap did not leak to the program
}

}  // namespace

int main(int argc, char** argv) {
  struct sigaction sa {};
  sa.sa_sigaction = program_handler;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTRAP, &sa, nullptr);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
