// What the signal guards' control plane (signal_guard.cc) and hit path
// (signal_guard_hit.cc) share: the program's virtual actions and masks for the signals the
// agent owns, and the handlers. Not a public header: agent/signal_guard.h is.
//
// Who touches what:
//   g_owned_*          set by install before the guards are enabled, cleared by uninstall
//                      after they are gone                         (control plane, g_mu)
//   g_actions          the program's action for each owned signal: read by every delivery,
//                      written by the sigaction guard and SA_RESETHAND (any thread, lock-free)
//   t_signals          each thread's virtual blocked bits and pending owned signals
//                      (the owner thread only, from its guards and signal handlers)
//   g_pid              the process whose memory this is (fork children update it)
#pragma once

#include <signal.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "arch/regs.h"
#include "probecore/kprobes.h"

namespace probefs::agent::detail {

// The owned signals, by index: SIGTRAP, SIGSEGV, SIGBUS, the engine's fixup signal.
constexpr int kOwnedCount = 4;
extern int g_owned_sig[kOwnedCount];
// Their bits in a kernel sigset word (bit sig-1); 0 while the guards are not installed.
extern std::atomic<uint64_t> g_owned_mask;
extern std::atomic<long> g_pid;
// Where libc's signal handlers return (its sa_restorer): part of every action installed
// through libc, so part of what the program's sigaction reads back.
extern uintptr_t g_libc_restorer;

inline uint64_t sig_bit(int sig) { return uint64_t{1} << (sig - 1); }

inline int owned_index(int sig) {
  for (int i = 0; i < kOwnedCount; ++i)
    if (g_owned_sig[i] == sig) return i;
  return -1;
}

// The kernel's struct sigaction (rt_sigaction(2) on x86-64): what the kernel stores for a
// signal, and so what the program's sigaction reads back.
struct KernelAction {
  uint64_t handler;
  uint64_t flags;
  uint64_t restorer;
  uint64_t mask;
};

// Flags the kernel keeps (UAPI_SA_FLAGS: SA_NOCLDSTOP SA_NOCLDWAIT SA_SIGINFO
// SA_EXPOSE_TAGBITS SA_RESTORER SA_ONSTACK SA_RESTART SA_NODEFER SA_RESETHAND); it clears
// the others when it stores an action, so that programs can probe for support.
constexpr uint64_t kKernelSaFlags = 0xdc000807;
constexpr uint64_t kSaRestorer = 0x04000000;
// SIGKILL and SIGSTOP are never part of a stored action's mask.
constexpr uint64_t kUnblockable = (uint64_t{1} << (SIGKILL - 1)) | (uint64_t{1} << (SIGSTOP - 1));
// glibc's own signals (SIGCANCEL 32, SIGSETXID 33): its pthread_sigmask never blocks them,
// and copies the whole set first when one of them is in it.
constexpr uint64_t kGlibcInternal = (uint64_t{1} << 31) | (uint64_t{1} << 32);

// The program's actions, one cell per owned signal. Lock-free and safe in signal handlers:
// each cell keeps a few slots, a writer fills a slot that is not the current one and
// swings `current` to it (its generation in the upper bits makes the swap ABA-free), a
// reader validates a slot by its sequence number.
struct ActionCell {
  static constexpr unsigned kSlots = 8;
  std::atomic<uint64_t> current;  // (generation << 8) | slot
  std::atomic<uint32_t> next;     // slot allocator
  struct Slot {
    std::atomic<uint32_t> seq;    // odd while being written
    uint64_t words[4];            // a KernelAction, accessed atomically word by word
  } slots[kSlots];
};
extern ActionCell g_actions[kOwnedCount];

KernelAction load_action(int idx);
// Stores `a`; returns the action it replaced (atomically with respect to other writers).
KernelAction exchange_action(int idx, const KernelAction& a);

// A signal sent (not raised by a fault) while the thread blocked it, kept until the thread
// unblocks it: what the program's handler will see of its siginfo.
struct PendingInfo {
  int32_t code;
  int32_t pid;
  uint32_t uid;
  uint32_t unused;
  uint64_t value;
};

// Initial-exec TLS: reached through %fs, with no call. Kept small: the agent is loaded by
// dlopen at attach, into the static TLS that glibc keeps spare.
struct ThreadSignals {
  uint64_t blocked;  // owned signals the program blocks on this thread (bit sig-1)
  uint64_t pending;  // owned signals sent while blocked
  // Copies of sets passed on to libc in place of the program's (without the owned bits),
  // a few in turn so that a signal handler's guarded call between a guard and its system
  // call does not overwrite the copy that call is about to read.
  uint64_t scratch[4];
  uint32_t scratch_next;
  uint32_t unused;
  PendingInfo info[kOwnedCount];
};
extern thread_local constinit ThreadSignals t_signals __attribute__((tls_model("initial-exec")));

// Is this a child that shares the memory of the process that owns the state (a vfork or
// posix_spawn child before exec, which runs on its parent thread's TLS)? It must not write
// the program's virtual state then. A fork child whose fork skipped the atfork handlers
// is recognised here as owning its memory (kcmp), and updates g_pid.
bool in_vm_sharing_child();

// The guard probes' pre_handlers.
int guard_sigaction(probecore::Kprobe* p, PtRegs* regs);      // __libc_sigaction
int guard_sigmask(probecore::Kprobe* p, PtRegs* regs);        // pthread_sigmask
int guard_wait_mask_arg1(probecore::Kprobe* p, PtRegs* regs);  // sigsuspend
int guard_wait_mask_arg4(probecore::Kprobe* p, PtRegs* regs);  // ppoll
int guard_wait_mask_arg5(probecore::Kprobe* p, PtRegs* regs);  // epoll_pwait, epoll_pwait2
int guard_wait_mask_arg6(probecore::Kprobe* p, PtRegs* regs);  // pselect

// An owned signal that no one in the agent or engine claimed: delivered to the program as
// the kernel would deliver it with the program's virtual action and mask. Runs inside the
// signal handler that received it.
void deliver(int sig, siginfo_t* info, void* ucontext);
// The agent's SIGSEGV/SIGBUS handler: the safe-copy fixup, else deliver().
void on_fault_signal(int sig, siginfo_t* info, void* ucontext);

// Sends the calling thread's pending owned signals in `bits` again. With block_first they
// are blocked for real first: the system call that follows (one that unblocks them, or
// the return from a signal handler) lets the kernel deliver them then.
void requeue_pending(ThreadSignals& t, uint64_t bits, bool block_first = true);

}  // namespace probefs::agent::detail
