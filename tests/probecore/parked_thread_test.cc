// A thread parked between the instructions that a jmp is about to replace. A child process
// runs the engine; this test ptrace-stops the child's main thread right after the first
// instruction of pf_two_step (the int3 path runs it from its boosted copy and returns into
// the function's middle), asks the child's other thread to optimize, and checks that the
// engine refuses to write the jmp under the parked thread, that the thread then resumes
// correctly, and that the optimization happens once it has left.
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <thread>

#include "probecore/kprobes.h"
#include "tests/probecore/targets.h"

namespace probefs::probecore {
namespace {

long (*volatile v_two_step)(long) = pf_two_step;
std::atomic<long> g_hits{0};
int count_hit(Kprobe*, PtRegs*) {
  g_hits.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

// A pass of the optimizer that finds a thread where it cannot move it (on the region while
// stopped, or running the trap handler's own code when the fixup signal lands, or not
// scheduled in time to answer it) leaves the probe queued to be retried. While the thread
// is parked, every pass must refuse; once it is released, one of a few passes must succeed.
// A released thread is caught in the trap handler by a pass only now and then, so 50
// passes in a row that all fail mean the engine no longer moves it.
constexpr int kPassesOnceReleased = 50;

// Child: main thread calls pf_two_step in a loop; a control thread serves commands:
// 'o' runs one optimizer pass, 'w' runs passes until the probe is optimized (at most
// kPassesOnceReleased); each answers '1' if the probe is then optimized, else '0'.
[[noreturn]] void child_main(int cmd_fd, int report_fd) {
  alarm(60);  // never outlive a broken parent
  set_kprobes_optimization(false);
  Kprobe k;
  k.addr = reinterpret_cast<uintptr_t>(pf_two_step);
  k.bounds = {k.addr, reinterpret_cast<uintptr_t>(pf_two_step_end)};
  k.pre_handler = count_hit;
  if (register_kprobe(&k) != 0) _exit(10);
  std::atomic<bool> stop{false};
  std::thread control([&] {
    char c;
    while (read(cmd_fd, &c, 1) == 1) {
      if (c == 'q') break;
      set_kprobes_optimization(true);
      const int passes = c == 'w' ? kPassesOnceReleased : 1;
      for (int i = 0; i < passes && !(k.flags & KPROBE_FLAG_OPTIMIZED); ++i)
        wait_for_kprobe_optimizer();
      const char verdict = (k.flags & KPROBE_FLAG_OPTIMIZED) ? '1' : '0';
      if (verdict == '0') fprintf(stderr, "child: %s\n", kprobe_optimization_status(&k).c_str());
      if (write(report_fd, &verdict, 1) != 1) _exit(11);
    }
    stop = true;
  });
  const char ready = 'r';
  if (write(report_fd, &ready, 1) != 1) _exit(12);
  long calls = 0;
  while (!stop.load(std::memory_order_relaxed)) {
    if (v_two_step(calls) != calls * 2 + 3) _exit(13);
    ++calls;
  }
  control.join();
  if (g_hits.load() != calls)
    fprintf(stderr, "child: %ld hits, %ld calls, %lu missed\n", g_hits.load(), calls,
            k.nmissed.load());
  _exit(g_hits.load() == calls ? 0 : 14);
}

// Single-steps the stopped thread until its ip is `where`, passing through the SIGTRAPs of
// int3 probes (they belong to the child's own handler).
bool step_until(pid_t tid, uintptr_t where, int deliver) {
  for (int i = 0; i < 2000000; ++i) {
    user_regs_struct regs{};
    if (ptrace(PTRACE_GETREGS, tid, nullptr, &regs) != 0) return false;
    if (regs.rip == where) return true;
    if (ptrace(PTRACE_SINGLESTEP, tid, nullptr, reinterpret_cast<void*>(long{deliver})) != 0)
      return false;
    int status = 0;
    if (waitpid(tid, &status, __WALL) != tid || !WIFSTOPPED(status)) return false;
    deliver = 0;
    if (status >> 16 == PTRACE_EVENT_STOP) continue;  // the interrupt, late: nothing to pass
    const int sig = WSTOPSIG(status);
    if (sig == SIGTRAP) {
      siginfo_t si{};
      ptrace(PTRACE_GETSIGINFO, tid, nullptr, &si);
      if (si.si_code == SI_KERNEL) deliver = SIGTRAP;  // an int3: the child's to handle
    } else {
      deliver = sig;
    }
  }
  return false;
}

TEST(ParkedThread, JmpWaitsUntilNoThreadIsInsideTheReplacedInstructions) {
  int cmd[2], report[2];
  ASSERT_EQ(pipe(cmd), 0);
  ASSERT_EQ(pipe(report), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(cmd[1]);
    close(report[0]);
    child_main(cmd[0], report[1]);
  }
  struct Reaper {  // the child never outlives the test, whatever fails
    pid_t pid;
    ~Reaper() {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, __WALL);
      }
    }
  } reaper{pid};
  close(cmd[0]);
  close(report[1]);
  char c = 0;
  ASSERT_EQ(read(report[0], &c, 1), 1);
  ASSERT_EQ(c, 'r');

  ASSERT_EQ(ptrace(PTRACE_SEIZE, pid, nullptr, nullptr), 0) << errno;
  ASSERT_EQ(ptrace(PTRACE_INTERRUPT, pid, nullptr, nullptr), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, __WALL), pid);
  ASSERT_TRUE(WIFSTOPPED(status));
  // The first stop may be the delivery of a signal (the SIGTRAP of an int3 the thread had
  // just hit) rather than the interrupt: that signal must still reach the child.
  const int pending = status >> 16 == PTRACE_EVENT_STOP ? 0 : WSTOPSIG(status);
  ASSERT_TRUE(step_until(pid, reinterpret_cast<uintptr_t>(pf_two_step_second), pending));

  // Parked on the second instruction: the jmp must not be written.
  ASSERT_EQ(write(cmd[1], "o", 1), 1);
  ASSERT_EQ(read(report[0], &c, 1), 1);
  EXPECT_EQ(c, '0');

  // Parked, it holds the jmp back on every pass, not just the first.
  ASSERT_EQ(write(cmd[1], "o", 1), 1);
  ASSERT_EQ(read(report[0], &c, 1), 1);
  EXPECT_EQ(c, '0');

  // Released, the thread finishes the call in place and leaves; now the jmp goes in. It
  // goes on calling pf_two_step, so a pass may still meet it where it cannot be moved
  // (see kPassesOnceReleased): the jmp must go in within a few passes.
  ASSERT_EQ(ptrace(PTRACE_DETACH, pid, nullptr, nullptr), 0);
  ASSERT_EQ(write(cmd[1], "w", 1), 1);
  ASSERT_EQ(read(report[0], &c, 1), 1);
  EXPECT_EQ(c, '1');

  ASSERT_EQ(write(cmd[1], "q", 1), 1);
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  reaper.pid = -1;
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "13: wrong result, 14: hits != calls";
}

}  // namespace
}  // namespace probefs::probecore
