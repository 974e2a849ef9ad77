// The agent's signal guards (agent/signal_guard.h) in real processes: every scenario runs
// in a forked child with a time limit, which installs the guards itself (or, as a
// control, does not, and shows the harm the guards prevent).
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>

#include "agent/signal_guard.h"
#include "arch/safe_copy.h"
#include "probecore/kprobes.h"
#include "tests/agent/signal_test_util.h"

extern char** environ;

// Probe targets of the test program's own (exported: bounds from .dynsym).
extern "C" [[gnu::noinline]] long pf_sig_target(long x) {
  asm volatile("" : "+r"(x));
  return x * 3 + 1;
}
extern "C" [[gnu::noinline]] long pf_sig_reader(const void* p) {
  asm volatile("" : "+r"(p));
  return p != nullptr;
}

namespace {

using namespace probefs;
using namespace probefs::agent;
using namespace probefs::agent::test_util;
using probecore::Kprobe;

std::atomic<long> g_hits{0};
int count_hit(Kprobe*, PtRegs*) {
  g_hits.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

long (*volatile v_target)(long) = pf_sig_target;

int install_ok() {
  const int rc = install_signal_guards();
  if (rc != 0) {
    std::fprintf(stderr, "install_signal_guards: %d\n", rc);
    return rc;
  }
  if (!signal_guards_armed()) {
    std::fprintf(stderr, "guards not armed:\n%s", signal_guard_status().c_str());
    return -1;
  }
  return 0;
}

#define INSTALL_OR_FAIL() CHILD_CHECK_EQ(install_ok(), 0)

int rtmax1() { return SIGRTMAX - 1; }

// ---------------------------------------------------------------------------------------
// Actions

void handler_a(int) {}
void handler_b(int, siginfo_t*, void*) {}

struct Seen {
  uint64_t handler, flags, mask, restorer;
  bool operator==(const Seen&) const = default;
};
Seen seen(const struct sigaction& sa) {
  return {reinterpret_cast<uint64_t>(sa.sa_handler), static_cast<uint32_t>(sa.sa_flags),
          word0(sa.sa_mask), reinterpret_cast<uint64_t>(sa.sa_restorer)};
}

// A sequence of sigaction and signal calls; what each read back.
std::vector<Seen> action_sequence(int sig) {
  std::vector<Seen> out;
  struct sigaction a {}, old {};
  a.sa_sigaction = handler_b;
  // Flags the kernel keeps and one it clears (SA_UNSUPPORTED); a mask with SIGKILL and
  // SIGSTOP, which the kernel drops.
  a.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_ONSTACK | 0x400;
  sigfillset(&a.sa_mask);
  sigdelset(&a.sa_mask, SIGUSR2);
  CHILD_CHECK_EQ(sigaction(sig, &a, &old), 0);
  out.push_back(seen(old));
  CHILD_CHECK_EQ(sigaction(sig, nullptr, &old), 0);
  out.push_back(seen(old));
  const auto prev = signal(sig, handler_a);
  out.push_back({reinterpret_cast<uint64_t>(prev), 0, 0, 0});
  CHILD_CHECK_EQ(sigaction(sig, nullptr, &old), 0);
  out.push_back(seen(old));
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  CHILD_CHECK_EQ(sigaction(sig, &ign, &old), 0);
  out.push_back(seen(old));
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  CHILD_CHECK_EQ(sigaction(sig, &dfl, &old), 0);
  out.push_back(seen(old));
  CHILD_CHECK_EQ(sigaction(sig, nullptr, &old), 0);
  out.push_back(seen(old));
  return out;
}

TEST(SignalGuards, SigactionReadsBackWhatTheKernelWould) {
  const int status = run_child([] {
    INSTALL_OR_FAIL();
    const std::vector<Seen> reference = action_sequence(SIGUSR1);
    for (int sig : {SIGTRAP, SIGSEGV, SIGBUS, rtmax1()}) {
      const KernelAction ours = real_action(sig);
      const std::vector<Seen> got = action_sequence(sig);
      CHILD_CHECK_EQ(got.size(), reference.size());
      for (size_t i = 0; i < got.size(); ++i) {
        CHILD_CHECK_EQ(got[i].handler, reference[i].handler);
        CHILD_CHECK_EQ(got[i].flags, reference[i].flags);
        // signal() blocks the signal itself while its handler runs: each its own bit.
        const uint64_t both = bit(sig) | bit(SIGUSR1);
        CHILD_CHECK_EQ(got[i].mask & ~both, reference[i].mask & ~both);
        CHILD_CHECK_EQ(!!(got[i].mask & bit(sig)), !!(reference[i].mask & bit(SIGUSR1)));
        CHILD_CHECK_EQ(got[i].restorer, reference[i].restorer);
      }
      // The kernel kept the agent's or the engine's handler all along.
      CHILD_CHECK_EQ(real_action(sig).handler, ours.handler);
      CHILD_CHECK(ours.handler != 0 && ours.handler != 1);
    }
    // Signals that are not owned, and glibc's refusals, are untouched.
    CHILD_CHECK_EQ(real_action(SIGUSR1).handler, 0u);
    CHILD_CHECK_EQ(sigaction(32, nullptr, nullptr), -1);
    CHILD_CHECK_EQ(errno, EINVAL);
    struct sigaction kill_act {};
    kill_act.sa_handler = handler_a;
    CHILD_CHECK_EQ(sigaction(SIGKILL, &kill_act, nullptr), -1);
    CHILD_CHECK_EQ(errno, EINVAL);
    return 0;
  });
  EXPECT_TRUE(exited_ok(status)) << describe_status(status);
}

TEST(SignalGuards, ProgramActionsFromBeforeInstallAreAdopted) {
  const int status = run_child([] {
    signal(SIGSEGV, handler_a);
    signal(rtmax1(), handler_a);
    struct sigaction b {};
    b.sa_sigaction = handler_b;
    b.sa_flags = SA_SIGINFO;
    sigaction(SIGBUS, &b, nullptr);
    INSTALL_OR_FAIL();
    CHILD_CHECK(signal(SIGSEGV, SIG_DFL) == handler_a);
    CHILD_CHECK(signal(rtmax1(), SIG_DFL) == handler_a);
    struct sigaction old {};
    CHILD_CHECK_EQ(sigaction(SIGBUS, nullptr, &old), 0);
    CHILD_CHECK(old.sa_sigaction == handler_b);
    CHILD_CHECK(old.sa_flags & SA_SIGINFO);
    return 0;
  });
  EXPECT_TRUE(exited_ok(status)) << describe_status(status);
}

// ---------------------------------------------------------------------------------------
// Masks

TEST(SignalGuards, MasksRoundTripAndOwnedSignalsStayUnblocked) {
  const int status = run_child([] {
    INSTALL_OR_FAIL();
    const uint64_t owned = owned_signal_mask();
    CHILD_CHECK_EQ(owned, bit(SIGTRAP) | bit(SIGSEGV) | bit(SIGBUS) | bit(rtmax1()));
    sigset_t set, old, now;
    sigemptyset(&set);
    sigaddset(&set, SIGTRAP);
    sigaddset(&set, SIGSEGV);
    sigaddset(&set, SIGUSR1);
    CHILD_CHECK_EQ(sigprocmask(SIG_BLOCK, &set, &old), 0);
    CHILD_CHECK_EQ(word0(old), 0u);
    CHILD_CHECK_EQ(sigprocmask(SIG_BLOCK, nullptr, &now), 0);
    CHILD_CHECK_EQ(word0(now), word0(set));
    CHILD_CHECK_EQ(real_blocked(), bit(SIGUSR1));
    // pthread_sigmask sees the same, and unblocks.
    sigset_t trap;
    sigemptyset(&trap);
    sigaddset(&trap, SIGTRAP);
    CHILD_CHECK_EQ(pthread_sigmask(SIG_UNBLOCK, &trap, &old), 0);
    CHILD_CHECK_EQ(word0(old), word0(set));
    CHILD_CHECK_EQ(pthread_sigmask(SIG_BLOCK, nullptr, &now), 0);
    CHILD_CHECK_EQ(word0(now), bit(SIGSEGV) | bit(SIGUSR1));
    // Everything, as sigfillset gives it; back exactly.
    sigset_t all;
    sigfillset(&all);
    CHILD_CHECK_EQ(sigprocmask(SIG_SETMASK, &all, &old), 0);
    CHILD_CHECK_EQ(word0(old), bit(SIGSEGV) | bit(SIGUSR1));
    CHILD_CHECK_EQ(real_blocked() & owned, 0u);
    CHILD_CHECK_EQ(sigprocmask(SIG_SETMASK, &old, &now), 0);
    // What the kernel reads back of sigfillset: without SIGKILL and SIGSTOP.
    CHILD_CHECK_EQ(word0(now), word0(all) & ~(bit(SIGKILL) | bit(SIGSTOP)));
    CHILD_CHECK_EQ(sigprocmask(SIG_BLOCK, nullptr, &now), 0);
    CHILD_CHECK_EQ(word0(now), bit(SIGSEGV) | bit(SIGUSR1));
    // The same buffer as set and oldset.
    sigset_t same = trap;
    sigset_t* in = &same;
    sigset_t* out = &same;
    asm volatile("" : "+r"(in), "+r"(out));  // one buffer for both, hidden from the compiler
    CHILD_CHECK_EQ(sigprocmask(SIG_BLOCK, in, out), 0);
    CHILD_CHECK_EQ(word0(same), bit(SIGSEGV) | bit(SIGUSR1));
    CHILD_CHECK_EQ(sigprocmask(SIG_BLOCK, nullptr, &now), 0);
    CHILD_CHECK_EQ(word0(now), bit(SIGSEGV) | bit(SIGUSR1) | bit(SIGTRAP));
    // The kernel's errors: a bad `how` changes nothing and writes no oldset; a bad oldset
    // fails with EFAULT after the mask changed.
    sigset_t untouched;
    std::memset(&untouched, 0x5a, sizeof untouched);
    CHILD_CHECK_EQ(sigprocmask(77, &set, &untouched), -1);
    CHILD_CHECK_EQ(errno, EINVAL);
    CHILD_CHECK_EQ(word0(untouched), 0x5a5a5a5a5a5a5a5aull);
    CHILD_CHECK_EQ(sigprocmask(SIG_UNBLOCK, &set, reinterpret_cast<sigset_t*>(8)), -1);
    CHILD_CHECK_EQ(errno, EFAULT);
    CHILD_CHECK_EQ(sigprocmask(SIG_BLOCK, nullptr, &now), 0);
    CHILD_CHECK_EQ(word0(now), 0u);
    CHILD_CHECK_EQ(real_blocked(), 0u);
    CHILD_CHECK_EQ(sigprocmask(SIG_BLOCK, &trap, nullptr), 0);
    // sigsetjmp/siglongjmp keep the mask the program saw.
    sigjmp_buf env;
    if (sigsetjmp(env, 1) == 0) {
      CHILD_CHECK_EQ(sigprocmask(SIG_SETMASK, &all, nullptr), 0);
      siglongjmp(env, 1);
    }
    CHILD_CHECK_EQ(sigprocmask(SIG_BLOCK, nullptr, &now), 0);
    CHILD_CHECK_EQ(word0(now), bit(SIGTRAP));
    return 0;
  });
  EXPECT_TRUE(exited_ok(status)) << describe_status(status);
}

// ---------------------------------------------------------------------------------------
// A thread that blocks SIGTRAP hits an int3 probe

int hit_int3_with_sigtrap_blocked(bool guarded) {
  if (guarded) INSTALL_OR_FAIL();
  probecore::set_kprobes_optimization(false);  // an int3 probe
  Kprobe k;
  CHILD_CHECK_EQ(probe_function(&k, reinterpret_cast<void*>(pf_sig_target), count_hit), 0);
  CHILD_CHECK(!probecore::kprobe_optimization_status(&k).empty());
  pthread_t th;
  CHILD_CHECK_EQ(pthread_create(
                     &th, nullptr,
                     [](void*) -> void* {
                       sigset_t all;
                       sigfillset(&all);
                       pthread_sigmask(SIG_BLOCK, &all, nullptr);
                       long sum = 0;
                       for (long i = 0; i < 100; ++i) sum += v_target(i);
                       sigset_t now;
                       pthread_sigmask(SIG_BLOCK, nullptr, &now);
                       const bool still_blocked = sigismember(&now, SIGTRAP);
                       return reinterpret_cast<void*>(sum == 3 * 4950 + 100 && still_blocked);
                     },
                     nullptr),
                 0);
  void* ok = nullptr;
  pthread_join(th, &ok);
  CHILD_CHECK(ok != nullptr);
  CHILD_CHECK_EQ(g_hits.load(), 100);
  return 0;
}

TEST(SignalGuards, ThreadThatBlocksSigtrapSurvivesAnInt3Probe) {
  const int status = run_child([] { return hit_int3_with_sigtrap_blocked(true); });
  EXPECT_TRUE(exited_ok(status)) << describe_status(status);
}

TEST(SignalGuards, WithoutGuardsThatThreadDies) {
  const int status = run_child([] { return hit_int3_with_sigtrap_blocked(false); });
  EXPECT_TRUE(killed_by(status, SIGTRAP)) << describe_status(status);
}

// ---------------------------------------------------------------------------------------
// SIGTRAP of the program's own

std::atomic<int> g_program_traps{0};
std::atomic<int> g_last_code{0};
std::atomic<uint64_t> g_mask_in_handler{0};
std::atomic<uint64_t> g_real_in_handler{0};
std::atomic<uint64_t> g_uc_mask{0};
void program_trap_handler(int, siginfo_t* info, void* uc) {
  g_program_traps.fetch_add(1);
  g_last_code = info->si_code;
  sigset_t now;
  sigprocmask(SIG_BLOCK, nullptr, &now);
  g_mask_in_handler = word0(now);
  g_real_in_handler = real_blocked();
  g_uc_mask = word0(static_cast<ucontext_t*>(uc)->uc_sigmask);
  pf_sig_target(1);  // an int3 probe inside the program's SIGTRAP handler
}

TEST(SignalGuards, ProgramsSigtrapReachesItsHandler) {
  const int status = run_child([] {
    INSTALL_OR_FAIL();
    probecore::set_kprobes_optimization(false);
    Kprobe k;
    CHILD_CHECK_EQ(probe_function(&k, reinterpret_cast<void*>(pf_sig_target), count_hit), 0);
    struct sigaction sa {};
    sa.sa_sigaction = program_trap_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGUSR2);
    sigaddset(&sa.sa_mask, SIGSEGV);
    CHILD_CHECK_EQ(sigaction(SIGTRAP, &sa, nullptr), 0);
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, nullptr);

    asm volatile("int3");  // the program's own breakpoint
    CHILD_CHECK_EQ(g_program_traps.load(), 1);
    CHILD_CHECK_EQ(g_last_code.load(), SI_KERNEL);
    // While its handler ran: SIGTRAP (no SA_NODEFER) and the action's mask blocked, as the
    // program sees it; for real, only what is not owned; the ucontext shows the
    // interrupted mask.
    CHILD_CHECK_EQ(g_mask_in_handler.load(),
                   bit(SIGUSR1) | bit(SIGUSR2) | bit(SIGSEGV) | bit(SIGTRAP));
    CHILD_CHECK_EQ(g_real_in_handler.load(), bit(SIGUSR1) | bit(SIGUSR2));
    CHILD_CHECK_EQ(g_uc_mask.load(), bit(SIGUSR1));
    sigset_t now;
    sigprocmask(SIG_BLOCK, nullptr, &now);
    CHILD_CHECK_EQ(word0(now), bit(SIGUSR1));
    CHILD_CHECK_EQ(real_blocked(), bit(SIGUSR1));

    raise(SIGTRAP);  // sent, not trapped
    CHILD_CHECK_EQ(g_program_traps.load(), 2);
    CHILD_CHECK_EQ(g_last_code.load(), SI_TKILL);
    CHILD_CHECK_EQ(v_target(20), 61);
    CHILD_CHECK_EQ(g_hits.load(), 3);  // 2 from inside the handler
    CHILD_CHECK_EQ(g_program_traps.load(), 2);  // the probe's traps did not leak

    // SA_RESETHAND: delivered once, then the default.
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    CHILD_CHECK_EQ(sigaction(SIGTRAP, &sa, nullptr), 0);
    raise(SIGTRAP);
    CHILD_CHECK_EQ(g_program_traps.load(), 3);
    struct sigaction cur {};
    sigaction(SIGTRAP, nullptr, &cur);
    CHILD_CHECK(cur.sa_handler == SIG_DFL);
    return 0;
  });
  EXPECT_TRUE(exited_ok(status)) << describe_status(status);
}

TEST(SignalGuards, ProgramsSigtrapWithTheDefaultActionEndsItAsUnprobed) {
  auto scenario = [](int how) {
    return [how] {
      INSTALL_OR_FAIL();
      probecore::set_kprobes_optimization(false);
      Kprobe k;
      CHILD_CHECK_EQ(probe_function(&k, reinterpret_cast<void*>(pf_sig_target), count_hit), 0);
      CHILD_CHECK_EQ(v_target(1), 4);
      switch (how) {
        case 0: asm volatile("int3"); break;  // default action
        case 1: raise(SIGTRAP); break;
        case 2:  // ignored: a breakpoint is not ignorable
          signal(SIGTRAP, SIG_IGN);
          asm volatile("int3");
          break;
        case 3:  // ignored and sent: nothing happens
          signal(SIGTRAP, SIG_IGN);
          raise(SIGTRAP);
          CHILD_CHECK_EQ(v_target(1), 4);
          return 42;
        case 4: {  // blocked: a breakpoint is not blockable either
          signal(SIGTRAP, handler_a);
          sigset_t t;
          sigemptyset(&t);
          sigaddset(&t, SIGTRAP);
          sigprocmask(SIG_BLOCK, &t, nullptr);
          asm volatile("int3");
          break;
        }
      }
      return 0;
    };
  };
  EXPECT_TRUE(killed_by(run_child(scenario(0)), SIGTRAP));
  EXPECT_TRUE(killed_by(run_child(scenario(1)), SIGTRAP));
  EXPECT_TRUE(killed_by(run_child(scenario(2)), SIGTRAP));
  const int ignored = run_child(scenario(3));
  EXPECT_TRUE(WIFEXITED(ignored) && WEXITSTATUS(ignored) == 42) << describe_status(ignored);
  EXPECT_TRUE(killed_by(run_child(scenario(4)), SIGTRAP));
}

TEST(SignalGuards, SentSignalWaitsWhileBlockedAndArrivesWhenUnblocked) {
  const int status = run_child([] {
    INSTALL_OR_FAIL();
    struct sigaction sa {};
    sa.sa_sigaction = program_trap_handler;
    sa.sa_flags = SA_SIGINFO;
    CHILD_CHECK_EQ(sigaction(SIGTRAP, &sa, nullptr), 0);
    sigset_t t;
    sigemptyset(&t);
    sigaddset(&t, SIGTRAP);
    sigprocmask(SIG_BLOCK, &t, nullptr);
    union sigval v;
    v.sival_int = 1234;
    CHILD_CHECK_EQ(sigqueue(getpid(), SIGTRAP, v), 0);
    CHILD_CHECK_EQ(g_program_traps.load(), 0);
    raise(SIGTRAP);  // one of each waits, as for the kernel's classic signals
    CHILD_CHECK_EQ(g_program_traps.load(), 0);
    sigprocmask(SIG_UNBLOCK, &t, nullptr);
    CHILD_CHECK_EQ(g_program_traps.load(), 1);
    CHILD_CHECK_EQ(g_last_code.load(), SI_QUEUE);
    // Kept the same way through a handler: blocked by the action's mask while it runs.
    return 0;
  });
  EXPECT_TRUE(exited_ok(status)) << describe_status(status);
}

// ---------------------------------------------------------------------------------------
// Children between clone and exec

Kprobe g_dup2_probe, g_execve_probe;

int spawn_with_int3_probes(bool guarded) {
  if (guarded) INSTALL_OR_FAIL();
  probecore::set_kprobes_optimization(false);
  // What glibc's spawned child runs after it restored its mask and before exec: dup2 for a
  // file action, and execve. Placed by address, so the engine does not know execve by name
  // here: both are int3 probes.
  CHILD_CHECK_EQ(probe_function(&g_dup2_probe, reinterpret_cast<void*>(&dup2), count_hit), 0);
  CHILD_CHECK_EQ(probe_function(&g_execve_probe, reinterpret_cast<void*>(&execve), count_hit), 0);
  CHILD_CHECK(!probecore::kprobe_optimization_status(&g_dup2_probe).empty());
  CHILD_CHECK(!probecore::kprobe_optimization_status(&g_execve_probe).empty());

  // system(): /bin/sh through posix_spawn.
  const int sys = system("exit 7");
  CHILD_CHECK(WIFEXITED(sys));
  CHILD_CHECK_EQ(WEXITSTATUS(sys), 7);
  CHILD_CHECK(g_hits.load() >= 1);  // the child's execve, in memory it shared

  // posix_spawn with a file action.
  const long before = g_hits.load();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, 2, 1);
  pid_t pid = 0;
  char sh[] = "/bin/sh", c[] = "-c", cmd[] = "exit 9";
  char* argv[] = {sh, c, cmd, nullptr};
  CHILD_CHECK_EQ(posix_spawn(&pid, "/bin/sh", &fa, nullptr, argv, environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  int st = 0;
  CHILD_CHECK_EQ(waitpid(pid, &st, 0), pid);
  if (!WIFEXITED(st)) std::fprintf(stderr, "spawned: %s\n", describe_status(st).c_str());
  CHILD_CHECK(WIFEXITED(st));
  CHILD_CHECK_EQ(WEXITSTATUS(st), 9);
  CHILD_CHECK(g_hits.load() >= before + 2);  // dup2 and execve

  // popen.
  FILE* f = popen("echo probed", "r");
  CHILD_CHECK(f != nullptr);
  char line[64] = {};
  CHILD_CHECK(std::fgets(line, sizeof line, f) != nullptr);
  CHILD_CHECK_EQ(pclose(f), 0);
  CHILD_CHECK(std::string(line) == "probed\n");
  return 0;
}

TEST(SignalGuards, SpawnedChildrenSurviveInt3ProbesBeforeExec) {
  const int status = run_child([] { return spawn_with_int3_probes(true); });
  EXPECT_TRUE(exited_ok(status)) << describe_status(status);
}

TEST(SignalGuards, WithoutGuardsTheSpawnedChildDies) {
  const int status = run_child([] {
    probecore::set_kprobes_optimization(false);
    CHILD_CHECK_EQ(probe_function(&g_execve_probe, reinterpret_cast<void*>(&execve), count_hit), 0);
    const int sys = system("exit 7");
    // The child took the default action of SIGTRAP (its handlers were reset).
    return WIFSIGNALED(sys) && WTERMSIG(sys) == SIGTRAP ? 0 : 1;
  });
  EXPECT_TRUE(exited_ok(status)) << describe_status(status);
}

// ---------------------------------------------------------------------------------------
// Fetch reads and the program's own faults

std::atomic<long> g_reads_ok{0}, g_reads_failed{0};
int read_argument(Kprobe*, PtRegs* regs) {
  // A fetch argument: the pointer in arg1, read in process.
  uint64_t word = 0;
  const long rc = probefs_arch_safe_copy(&word, reinterpret_cast<const void*>(regs->di), 8);
  char s[16];
  const long rs = probefs_arch_safe_strncpy(s, reinterpret_cast<const char*>(regs->di), sizeof s);
  if (rc == 0 && rs > 0) g_reads_ok.fetch_add(1);
  if (rc == -1 && rs == -1) g_reads_failed.fetch_add(1);
  return 0;
}

void store_to_bad_address() {
  auto* bad = reinterpret_cast<volatile int*>(40);
  asm volatile("" : "+r"(bad));
  *bad = 1;
}

sigjmp_buf g_fault_env;
std::atomic<uintptr_t> g_fault_addr{0};
void program_segv_handler(int, siginfo_t* info, void*) {
  g_fault_addr = reinterpret_cast<uintptr_t>(info->si_addr);
  siglongjmp(g_fault_env, 1);
}

TEST(SignalGuards, FetchReadOfABadPointerFailsAndTheProgramKeepsItsFaults) {
  const int status = run_child([] {
    struct sigaction sa {};
    sa.sa_sigaction = program_segv_handler;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, nullptr);  // before the agent: adopted
    INSTALL_OR_FAIL();
    for (bool optimized : {true, false}) {
      probecore::set_kprobes_optimization(optimized);
      Kprobe k;
      CHILD_CHECK_EQ(probe_function(&k, reinterpret_cast<void*>(pf_sig_reader), read_argument), 0);
      probecore::wait_for_kprobe_optimizer();
      if (!optimized) CHILD_CHECK(!probecore::kprobe_optimization_status(&k).empty());
      g_reads_ok = 0;
      g_reads_failed = 0;
      const char text[] = "hello";
      pf_sig_reader(text);
      pf_sig_reader(reinterpret_cast<const void*>(16));
      pf_sig_reader(reinterpret_cast<const void*>(0xffff800000000000ull));
      CHILD_CHECK_EQ(g_reads_ok.load(), 1);
      CHILD_CHECK_EQ(g_reads_failed.load(), 2);
      CHILD_CHECK_EQ(probecore::unregister_kprobe(&k), 0);
      // A fault of the program's own still reaches its handler.
      g_fault_addr = 0;
      if (sigsetjmp(g_fault_env, 1) == 0) {
        store_to_bad_address();
        CHILD_CHECK(false);
      }
      CHILD_CHECK_EQ(g_fault_addr.load(), 40u);
    }
    // With the default action it ends the program, as unprobed.
    signal(SIGSEGV, SIG_DFL);
    store_to_bad_address();
    return 3;
  });
  EXPECT_TRUE(killed_by(status, SIGSEGV)) << describe_status(status);
}

// ---------------------------------------------------------------------------------------
// Install, uninstall, fork, vfork

TEST(SignalGuards, UninstallGivesBackTheProgramsActionsAndMask) {
  const int status = run_child([] {
    INSTALL_OR_FAIL();
    signal(SIGSEGV, handler_a);
    struct sigaction sa {};
    sa.sa_sigaction = program_trap_handler;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGTRAP, &sa, nullptr);
    sigset_t t;
    sigemptyset(&t);
    sigaddset(&t, SIGBUS);
    sigprocmask(SIG_BLOCK, &t, nullptr);
    CHILD_CHECK_EQ(real_blocked(), 0u);
    const uint64_t ours = real_action(SIGSEGV).handler;
    CHILD_CHECK(ours != reinterpret_cast<uint64_t>(&handler_a));

    uninstall_signal_guards();
    CHILD_CHECK(!signal_guards_installed());
    CHILD_CHECK_EQ(owned_signal_mask(), 0u);
    CHILD_CHECK_EQ(real_action(SIGSEGV).handler, reinterpret_cast<uint64_t>(&handler_a));
    CHILD_CHECK_EQ(real_blocked(), bit(SIGBUS));
    raise(SIGTRAP);  // the engine's handler passes it to the program's action
    CHILD_CHECK_EQ(g_program_traps.load(), 1);
    // The program's calls go to the kernel as they are now.
    sigprocmask(SIG_UNBLOCK, &t, nullptr);
    CHILD_CHECK_EQ(real_blocked(), 0u);

    // And again.
    INSTALL_OR_FAIL();
    CHILD_CHECK(signal(SIGSEGV, SIG_DFL) == handler_a);
    CHILD_CHECK_EQ(real_action(SIGSEGV).handler, ours);
    uninstall_signal_guards();
    return 0;
  });
  EXPECT_TRUE(exited_ok(status)) << describe_status(status);
}

TEST(SignalGuards, ForkChildKeepsTheGuards) {
  const int status = run_child([] {
    INSTALL_OR_FAIL();
    probecore::set_kprobes_optimization(false);
    Kprobe k;
    CHILD_CHECK_EQ(probe_function(&k, reinterpret_cast<void*>(pf_sig_target), count_hit), 0);
    sigset_t t;
    sigemptyset(&t);
    sigaddset(&t, SIGTRAP);
    sigprocmask(SIG_BLOCK, &t, nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
      sigset_t all;
      sigfillset(&all);
      sigprocmask(SIG_SETMASK, &all, nullptr);
      if ((real_blocked() & bit(SIGTRAP)) || v_target(2) != 7 || g_hits.load() != 1) _exit(5);
      sigset_t now;
      sigprocmask(SIG_BLOCK, nullptr, &now);
      _exit(sigismember(&now, SIGTRAP) ? 0 : 6);
    }
    int st = 0;
    CHILD_CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHILD_CHECK(WIFEXITED(st));
    CHILD_CHECK_EQ(WEXITSTATUS(st), 0);
    CHILD_CHECK_EQ(g_hits.load(), 0);
    return 0;
  });
  EXPECT_TRUE(exited_ok(status)) << describe_status(status);
}

TEST(SignalGuards, VforkChildLeavesTheParentsVirtualStateAlone) {
  const int status = run_child([] {
    INSTALL_OR_FAIL();
    signal(SIGSEGV, handler_a);
    sigset_t t;
    sigemptyset(&t);
    sigaddset(&t, SIGBUS);
    sigprocmask(SIG_BLOCK, &t, nullptr);
    const pid_t pid = vfork();
    if (pid == 0) {
      signal(SIGSEGV, SIG_DFL);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      _exit(0);
    }
    int st = 0;
    CHILD_CHECK_EQ(waitpid(pid, &st, 0), pid);
    CHILD_CHECK(WIFEXITED(st));
    struct sigaction cur {};
    sigaction(SIGSEGV, nullptr, &cur);
    CHILD_CHECK(cur.sa_handler == handler_a);
    sigset_t now;
    sigprocmask(SIG_BLOCK, nullptr, &now);
    CHILD_CHECK_EQ(word0(now), bit(SIGBUS));
    return 0;
  });
  EXPECT_TRUE(exited_ok(status)) << describe_status(status);
}

// ---------------------------------------------------------------------------------------
// Guards inside another probe's handler, and waits

std::atomic<uint64_t> g_real_in_usr1{~0ull};
std::atomic<uint64_t> g_view_in_usr1{0};
void usr1_blocks_trap(int) {
  sigset_t t;
  sigemptyset(&t);
  sigaddset(&t, SIGTRAP);
  sigprocmask(SIG_BLOCK, &t, nullptr);
  g_real_in_usr1 = real_blocked();
  sigset_t now;
  sigprocmask(SIG_BLOCK, nullptr, &now);
  g_view_in_usr1 = word0(now);
  sigprocmask(SIG_UNBLOCK, &t, nullptr);
}
int raise_usr1(Kprobe*, PtRegs*) {
  // A signal that interrupts this handler: its program handler runs with this probe's
  // hit in flight.
  syscall(SYS_tgkill, getpid(), syscall(SYS_gettid), SIGUSR1);
  return 0;
}

TEST(SignalGuards, GuardsRunInsideAnotherProbesHandler) {
  const int status = run_child([] {
    INSTALL_OR_FAIL();
    signal(SIGUSR1, usr1_blocks_trap);
    Kprobe k;
    CHILD_CHECK_EQ(probe_function(&k, reinterpret_cast<void*>(pf_sig_target), raise_usr1), 0);
    probecore::wait_for_kprobe_optimizer();
    CHILD_CHECK_EQ(v_target(3), 10);
    CHILD_CHECK_EQ(g_real_in_usr1.load() & bit(SIGTRAP), 0u);
    CHILD_CHECK(g_view_in_usr1.load() & bit(SIGTRAP));
    CHILD_CHECK_EQ(real_blocked() & bit(SIGTRAP), 0u);
    return 0;
  });
  EXPECT_TRUE(exited_ok(status)) << describe_status(status);
}

std::atomic<int> g_usr1_calls{0};
void usr1_calls_probed(int) {
  g_usr1_calls.fetch_add(1);
  pf_sig_target(5);  // an int3 probe, with the wait's mask in force
}

TEST(SignalGuards, MasksOfWaitsDoNotBlockSigtrap) {
  const int status = run_child([] {
    INSTALL_OR_FAIL();
    probecore::set_kprobes_optimization(false);
    Kprobe k;
    CHILD_CHECK_EQ(probe_function(&k, reinterpret_cast<void*>(pf_sig_target), count_hit), 0);
    signal(SIGUSR1, usr1_calls_probed);
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, nullptr);
    sigset_t all_but_usr1;
    sigfillset(&all_but_usr1);
    sigdelset(&all_but_usr1, SIGUSR1);
    // sigsuspend: the handler of the signal that ends it runs under the wait's mask.
    raise(SIGUSR1);
    CHILD_CHECK_EQ(sigsuspend(&all_but_usr1), -1);
    CHILD_CHECK_EQ(errno, EINTR);
    // ppoll and pselect the same.
    raise(SIGUSR1);
    // (The signal waiting ends them at once; the time limit only bounds a failure.)
    timespec limit{30, 0};
    CHILD_CHECK_EQ(ppoll(nullptr, 0, &limit, &all_but_usr1), -1);
    raise(SIGUSR1);
    CHILD_CHECK_EQ(pselect(0, nullptr, nullptr, nullptr, &limit, &all_but_usr1), -1);
    CHILD_CHECK_EQ(g_usr1_calls.load(), 3);
    CHILD_CHECK_EQ(g_hits.load(), 3);
    return 0;
  });
  EXPECT_TRUE(exited_ok(status)) << describe_status(status);
}

// ---------------------------------------------------------------------------------------
// The engine's fixup signal used by the program

std::atomic<int> g_rt_value{0};
void rt_handler(int, siginfo_t* info, void*) { g_rt_value = info->si_value.sival_int; }

TEST(SignalGuards, ProgramsOwnFixupSignalReachesItsHandlerAndParkingStillWorks) {
  const int status = run_child([] {
    INSTALL_OR_FAIL();
    struct sigaction sa {};
    sa.sa_sigaction = rt_handler;
    sa.sa_flags = SA_SIGINFO;
    CHILD_CHECK_EQ(sigaction(rtmax1(), &sa, nullptr), 0);
    union sigval v;
    v.sival_int = 77;
    CHILD_CHECK_EQ(sigqueue(getpid(), rtmax1(), v), 0);
    CHILD_CHECK_EQ(g_rt_value.load(), 77);
    // A thread that blocks every signal is still parked for an optimization.
    struct Flags {
      std::atomic<bool> blocked{false}, stop{false};
    } flags;
    pthread_t th;
    CHILD_CHECK_EQ(pthread_create(
                       &th, nullptr,
                       [](void* arg) -> void* {
                         auto* f = static_cast<Flags*>(arg);
                         sigset_t all;
                         sigfillset(&all);
                         pthread_sigmask(SIG_BLOCK, &all, nullptr);
                         f->blocked = true;
                         while (!f->stop.load()) v_target(1);
                         return nullptr;
                       },
                       &flags),
                   0);
    while (!flags.blocked.load()) sched_yield();
    Kprobe k;
    CHILD_CHECK_EQ(probe_function(&k, reinterpret_cast<void*>(pf_sig_target), count_hit), 0);
    // A pass fails when the park times out on a loaded machine: a few passes.
    std::string why;
    for (int pass = 0; pass < 200; ++pass) {
      probecore::wait_for_kprobe_optimizer();
      why = probecore::kprobe_optimization_status(&k);
      if (why.empty()) break;
    }
    // The thread runs through the jmp.
    const long hits = g_hits.load();
    while (g_hits.load() < hits + 100) sched_yield();
    flags.stop = true;
    pthread_join(th, nullptr);
    CHILD_CHECK(why.empty());
    CHILD_CHECK_EQ(g_rt_value.load(), 77);  // the engine's own signals did not leak
    return 0;
  });
  EXPECT_TRUE(exited_ok(status)) << describe_status(status);
}

TEST(SignalGuards, GuardsAreJmpsAlsoWithOptimizationOff) {
  const int status = run_child([] {
    INSTALL_OR_FAIL();
    probecore::set_kprobes_optimization(false);
    CHILD_CHECK(signal_guards_armed());
    uintptr_t addrs[16];
    const size_t n = signal_guard_addresses(addrs, 16);
    CHILD_CHECK(n >= 2);
    const std::string status_text = signal_guard_status();
    CHILD_CHECK(status_text.find("pthread_sigmask") != std::string::npos);
    return 0;
  });
  EXPECT_TRUE(exited_ok(status)) << describe_status(status);
}

}  // namespace
