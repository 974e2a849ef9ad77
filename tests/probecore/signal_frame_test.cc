// Signal frames and the engine: a thread parked in a signal handler whose interrupted
// context lies inside the instructions a jmp would replace; a kretprobe unregistered while
// a hit on its address is under way; a post handler on a syscall instruction.
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "arch/x86_64/isa/insn.h"
#include "probecore/kprobes.h"
#include "tracee/self_symbols.h"
#include "tests/probecore/probe_test_util.h"
#include "tests/probecore/targets.h"

namespace probefs::probecore {
namespace {

template <typename F>
uintptr_t addr_of(F* f) {
  return reinterpret_cast<uintptr_t>(f);
}

std::atomic<int> g_parked{0};
std::atomic<bool> g_release{false};

void park_on_fault(int, siginfo_t*, void*) {
  if (g_release.load()) {
    // A second fault: the thread resumed into a rewritten region. Fail now, not hang.
    static const char msg[] = "fault after release: the region changed under a parked thread\n";
    if (write(2, msg, sizeof msg - 1) < 0) {}
    _exit(3);
  }
  g_parked = 1;
  while (!g_release.load()) std::this_thread::yield();
}

std::atomic<long> g_hits{0};
int count_hit(Kprobe*, PtRegs*) {
  g_hits.fetch_add(1);
  return 0;
}

TEST(SignalFrames, AThreadParkedInAHandlerOnTheRegionPostponesTheJmp) {
  long (*volatile load_second)(const long*) = pf_load_second;
  const long page = sysconf(_SC_PAGESIZE);
  void* mem = mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  struct sigaction sa {}, old {};
  sa.sa_sigaction = park_on_fault;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGSEGV, &sa, &old), 0);

  set_kprobes_optimization(false);
  Kprobe k;
  k.addr = addr_of(pf_load_second);
  k.bounds = {addr_of(pf_load_second), addr_of(pf_load_second_end)};
  k.pre_handler = count_hit;
  test_util::KprobeGuard g{&k};
  ASSERT_EQ(register_kprobe(&k), 0);

  // The load faults inside the region; the thread waits in its SIGSEGV handler, whose
  // frame holds a context that resumes on pf_load_second_load.
  g_parked = 0;
  g_release = false;
  long loaded = 0;
  std::thread t([&] { loaded = load_second(static_cast<const long*>(mem)); });
  while (!g_parked.load()) std::this_thread::yield();

  set_kprobes_optimization(true);
  wait_for_kprobe_optimizer();
  EXPECT_FALSE(k.flags & KPROBE_FLAG_OPTIMIZED) << kprobe_optimization_status(&k);

  // Released, the thread runs the load again, in place, and returns.
  ASSERT_EQ(mprotect(mem, page, PROT_READ | PROT_WRITE), 0);
  *static_cast<long*>(mem) = 4242;
  g_release = true;
  t.join();
  EXPECT_EQ(loaded, 4242);
  sigaction(SIGSEGV, &old, nullptr);

  wait_for_kprobe_optimizer();
  EXPECT_TRUE(k.flags & KPROBE_FLAG_OPTIMIZED) << kprobe_optimization_status(&k);
  EXPECT_EQ(load_second(static_cast<const long*>(mem)), 4242);
  munmap(mem, page);
}

// The first probe on the address holds the hit until the kretprobe behind it has been
// taken out of service by an unregistration running on another thread.
Kretprobe* g_going;
int wait_for_retirement(Kprobe*, PtRegs*) {
  while (__atomic_load_n(&g_going->pool_, __ATOMIC_ACQUIRE) != nullptr) std::this_thread::yield();
  return 0;
}
int ret_noop(KretprobeInstance*, PtRegs*) { return 0; }

TEST(SignalFrames, KretprobeUnregisteredDuringAHitOnItsAddress) {
  long (*volatile mul)(long, long) = mul_o0;
  set_kprobes_optimization(false);
  Kprobe first;
  first.addr = addr_of(mul_o0);
  first.bounds = test_util::bounds_of(reinterpret_cast<void*>(mul_o0));
  first.pre_handler = wait_for_retirement;
  Kretprobe going;
  going.kp.addr = first.addr;
  going.kp.bounds = first.bounds;
  going.handler = ret_noop;
  g_going = &going;
  test_util::KprobeGuard g1{&first};
  ASSERT_EQ(register_kprobe(&first), 0);
  ASSERT_EQ(register_kretprobe(&going), 0);
  std::thread control;
  std::atomic<bool> started{false};
  control = std::thread([&] {
    started = true;
    EXPECT_EQ(unregister_kretprobe(&going), 0);
  });
  while (!started.load()) std::this_thread::yield();
  EXPECT_EQ(mul(6, 7), 42);  // the kretprobe's handler finds no pool and takes nothing
  control.join();
  set_kprobes_optimization(true);
}

std::atomic<long> g_posts{0};
void count_post(Kprobe*, PtRegs*, unsigned long) { g_posts.fetch_add(1); }

TEST(SignalFrames, PostHandlerOnASyscallInstruction) {
  // getppid's syscall instruction: found by decoding the function.
  set_symbol_resolver(&tracee::self_symbol_resolver());
  SymbolLocation loc;
  ASSERT_EQ(tracee::self_symbol_resolver().resolve("libc:getppid", &loc), 0);
  uintptr_t at = 0;
  for (uintptr_t pc = loc.bounds.start; pc < loc.bounds.end;) {
    arch::x86_64::Insn insn;
    ASSERT_EQ(arch::x86_64::decode(reinterpret_cast<const uint8_t*>(pc), loc.bounds.end - pc, pc,
                                   &insn), 0);
    if (insn.kind == arch::x86_64::InsnKind::kSyscall) {
      at = pc;
      break;
    }
    pc += insn.len;
  }
  ASSERT_NE(at, 0u);
  pid_t (*volatile ppid)() = getppid;
  const long want = syscall(SYS_getppid);
  for (bool boost : {true, false}) {
    set_kprobes_boost(boost);
    Kprobe k;
    k.addr = at;
    k.bounds = loc.bounds;
    k.pre_handler = count_hit;
    k.post_handler = count_post;
    test_util::KprobeGuard g{&k};
    ASSERT_EQ(register_kprobe(&k), 0);
    EXPECT_EQ(ppid(), want);
    EXPECT_EQ(ppid(), want);
  }
  // syscall masks the trap flag, so it is never single-stepped: it runs boosted, and a
  // post handler does not run after it.
  EXPECT_EQ(g_posts, 0);
  set_kprobes_boost(true);
}

}  // namespace
}  // namespace probefs::probecore
