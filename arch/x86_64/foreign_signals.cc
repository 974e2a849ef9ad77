// Signals that reach the engine's handlers without being the engine's (arch/signals.h):
// passed on to the program's action for them, or to the foreign handler the agent set.
// pass_on_foreign() runs inside those signal handlers: no library call, no lock.
#include "arch/x86_64/foreign_signals.h"

#include <ucontext.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

#include "arch/signals.h"
#include "arch/syscall.h"
#include "arch/x86_64/thread_fixup.h"

namespace probefs::arch {

namespace x86_64 {

namespace {

// The program's action for SIGTRAP (slot 0) and the fixup signal (slot 1), as it was when
// the engine installed its handler. Written on the control plane before `known` is set.
struct Actions {
  struct sigaction program;
  struct sigaction engine;
  std::atomic<bool> known;
};
Actions g_program[2];

std::atomic<ForeignSignalHandler> g_foreign{nullptr};

int slot_of(int sig) {
  if (sig == SIGTRAP) return 0;
  if (sig == thread_fixup_signal()) return 1;
  return -1;
}

// The kernel's struct sigaction for rt_sigaction(2).
struct KernelSigaction {
  unsigned long handler;
  unsigned long flags;
  unsigned long restorer;
  uint64_t mask;
};

// What the kernel does with a signal the program leaves at its default action (for these
// two: end the process, with a core for SIGTRAP): the default goes back in place and the
// signal is sent again, unblocked once this handler returns.
void take_default_action(int sig, void* ucontext) {
  KernelSigaction dfl{};
  raw_syscall(__NR_rt_sigaction, sig, reinterpret_cast<long>(&dfl), 0, 8);
  auto* uc = static_cast<ucontext_t*>(ucontext);
  reinterpret_cast<uint64_t*>(&uc->uc_sigmask)[0] &= ~(uint64_t{1} << (sig - 1));
  raw_syscall(__NR_tgkill, raw_syscall(__NR_getpid), raw_syscall(__NR_gettid), sig);
}

}  // namespace

void remember_actions(int sig, const struct sigaction& engine, const struct sigaction& program) {
  const int s = slot_of(sig);
  if (s < 0) return;
  g_program[s].program = program;
  g_program[s].engine = engine;
  g_program[s].known.store(true, std::memory_order_release);
}

void pass_on_foreign(int sig, siginfo_t* info, void* ucontext) {
  if (ForeignSignalHandler h = g_foreign.load(std::memory_order_acquire))
    return h(sig, info, ucontext);
  const int s = slot_of(sig);
  const struct sigaction* a = s >= 0 && g_program[s].known.load(std::memory_order_acquire)
                                  ? &g_program[s].program
                                  : nullptr;
  if (a && a->sa_handler != SIG_DFL && a->sa_handler != SIG_IGN) {
    if (a->sa_flags & SA_SIGINFO) a->sa_sigaction(sig, info, ucontext);
    else a->sa_handler(sig);
    return;
  }
  // Ignored: a signal that was sent is dropped; a trap the kernel raised is not ignorable
  // (it forces the default action on an ignored or blocked synchronous signal).
  if (a && a->sa_handler == SIG_IGN && info->si_code <= 0) return;
  take_default_action(sig, ucontext);
}

}  // namespace x86_64

int fixup_signal() { return x86_64::thread_fixup_signal(); }

int program_signal_action(int sig, struct sigaction* out) {
  const int s = x86_64::slot_of(sig);
  if (s < 0) return -EINVAL;
  if (!x86_64::g_program[s].known.load(std::memory_order_acquire)) return -EAGAIN;
  *out = x86_64::g_program[s].program;
  return 0;
}

int engine_signal_action(int sig, struct sigaction* out) {
  const int s = x86_64::slot_of(sig);
  if (s < 0) return -EINVAL;
  if (!x86_64::g_program[s].known.load(std::memory_order_acquire)) return -EAGAIN;
  *out = x86_64::g_program[s].engine;
  return 0;
}

int set_program_signal_action(int sig, const struct sigaction& act) {
  const int s = x86_64::slot_of(sig);
  if (s < 0) return -EINVAL;
  if (!x86_64::g_program[s].known.load(std::memory_order_acquire)) return -EAGAIN;
  x86_64::g_program[s].program = act;
  return 0;
}

void set_foreign_signal_handler(ForeignSignalHandler handler) {
  x86_64::g_foreign.store(handler, std::memory_order_release);
}

}  // namespace probefs::arch
