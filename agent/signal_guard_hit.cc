// The signal guards' hit path: the pre_handlers of the guard probes on libc's signal
// functions, and the delivery of owned signals to the program's virtual actions. All of it
// runs inside the traced process on the program's threads, inside probe detours and signal
// handlers: no allocation, no lock, no library call (raw system calls only), errno left
// alone; program memory is read and written through the safe-copy routines, so a bad
// pointer the program passed fails like the kernel's copy would, instead of crashing here.
// Built -O2 -mgeneral-regs-only, never instrumented; its object is checked to call no
// library (tests/agent/check_hit_path.sh).
#include <linux/kcmp.h>
#include <signal.h>
#include <ucontext.h>

#include <cstddef>

#include "agent/signal_guard_state.h"
#include "arch/safe_copy.h"
#include "arch/syscall.h"

namespace probefs::agent::detail {

int g_owned_sig[kOwnedCount] = {0, 0, 0, 0};
std::atomic<uint64_t> g_owned_mask{0};
std::atomic<long> g_pid{0};
uintptr_t g_libc_restorer = 0;
ActionCell g_actions[kOwnedCount];
thread_local constinit ThreadSignals t_signals __attribute__((tls_model("initial-exec"))) = {};

namespace {

using arch::raw_syscall;

// ---------------------------------------------------------------------------------------
// Small helpers (no library: loops the compiler must not turn into memset or memcpy; this
// file is built with -fno-tree-loop-distribute-patterns)

bool read_program(void* dst, uintptr_t src, size_t n) {
  return probefs_arch_safe_copy(dst, reinterpret_cast<const void*>(src), n) == 0;
}

bool write_program(uintptr_t dst, const void* src, size_t n) {
  return probefs_arch_safe_copy(reinterpret_cast<void*>(dst), src, n) == 0;
}

uint64_t real_mask() {
  uint64_t m = 0;
  raw_syscall(__NR_rt_sigprocmask, SIG_BLOCK, 0, reinterpret_cast<long>(&m), 8);
  return m;
}

void set_real_mask(int how, uint64_t m) {
  raw_syscall(__NR_rt_sigprocmask, how, reinterpret_cast<long>(&m), 0, 8);
}

uint64_t& uc_mask_word(void* ucontext) {
  return reinterpret_cast<uint64_t*>(&static_cast<ucontext_t*>(ucontext)->uc_sigmask)[0];
}

// ---------------------------------------------------------------------------------------
// The program's actions

void read_slot(const ActionCell::Slot& s, KernelAction* out) {
  out->handler = __atomic_load_n(&s.words[0], __ATOMIC_RELAXED);
  out->flags = __atomic_load_n(&s.words[1], __ATOMIC_RELAXED);
  out->restorer = __atomic_load_n(&s.words[2], __ATOMIC_RELAXED);
  out->mask = __atomic_load_n(&s.words[3], __ATOMIC_RELAXED);
}

// The action in the slot `cur` names, if no writer touched it meanwhile.
bool read_current(const ActionCell& c, uint64_t cur, KernelAction* out) {
  const ActionCell::Slot& s = c.slots[cur & (ActionCell::kSlots - 1)];
  const uint32_t seq = s.seq.load(std::memory_order_acquire);
  if (seq & 1) return false;
  read_slot(s, out);
  std::atomic_thread_fence(std::memory_order_acquire);
  return s.seq.load(std::memory_order_relaxed) == seq;
}

// ---------------------------------------------------------------------------------------
// Delivery

void default_action(int sig, void* ucontext) {
  // The kernel's default for every owned signal ends the process (with a core, but for
  // the real-time one). The default goes back in place and the signal is sent again: it
  // arrives at once (the agent's and the engine's SIGTRAP handlers do not block their
  // signal) or as soon as this handler returns, with the bit cleared from the mask the
  // return restores.
  KernelAction dfl{};
  raw_syscall(__NR_rt_sigaction, sig, reinterpret_cast<long>(&dfl), 0, 8);
  uc_mask_word(ucontext) &= ~sig_bit(sig);
  set_real_mask(SIG_UNBLOCK, sig_bit(sig));
  raw_syscall(__NR_tgkill, raw_syscall(__NR_getpid), raw_syscall(__NR_gettid), sig);
}

void keep_pending(ThreadSignals& t, int idx, const siginfo_t* info) {
  const uint64_t bit = sig_bit(g_owned_sig[idx]);
  if (t.pending & bit) return;  // one of each, as for the classic signals
  PendingInfo& p = t.info[idx];
  p.code = info->si_code;
  p.pid = info->si_pid;
  p.uid = info->si_uid;
  p.value = reinterpret_cast<uint64_t>(info->si_value.sival_ptr);
  t.pending |= bit;
}

// What the kernel does when it delivers to a handler: reset if SA_RESETHAND, block the
// action's mask and the signal (unless SA_NODEFER) while it runs, show the interrupted
// mask in the ucontext, restore that mask when the handler returns. Owned bits live in
// the thread's virtual mask, the others in the real one.
void run_program_handler(int sig, int idx, const KernelAction& a, siginfo_t* info,
                         void* ucontext, ThreadSignals& t, bool child) {
  const uint64_t owned = g_owned_mask.load(std::memory_order_relaxed);
  if ((a.flags & SA_RESETHAND) && !child) {
    KernelAction reset = a;
    reset.handler = reinterpret_cast<uint64_t>(SIG_DFL);
    exchange_action(idx, reset);
  }
  uint64_t& uc_mask = uc_mask_word(ucontext);
  const uint64_t real_owned = uc_mask & owned;  // normally none: glibc's own brief blocks
  const uint64_t interrupted_virtual = t.blocked;
  // The real mask while the handler runs: the interrupted one and the action's, never an
  // owned signal (the handler may hit int3 probes and read through the fault fixup).
  set_real_mask(SIG_SETMASK, ((uc_mask | a.mask) & ~owned) & ~kUnblockable);
  uc_mask = (uc_mask & ~owned) | interrupted_virtual;
  const uint64_t during = interrupted_virtual | (a.mask & owned) |
                          ((a.flags & SA_NODEFER) ? 0 : sig_bit(sig));
  if (!child) t.blocked = during;

  if (a.flags & SA_SIGINFO)
    reinterpret_cast<void (*)(int, siginfo_t*, void*)>(a.handler)(sig, info, ucontext);
  else
    reinterpret_cast<void (*)(int)>(a.handler)(sig);

  // Back from the program's handler (it may also never come back: longjmp, which leaves
  // the handler's masks in place, as it would without the agent). The handler may have
  // changed the mask to restore in the ucontext.
  const uint64_t after = uc_mask & owned;
  uc_mask = (uc_mask & ~owned) | real_owned;
  if (child) return;
  t.blocked = after;
  if (const uint64_t ready = t.pending & ~after) requeue_pending(t, ready);
}

}  // namespace

KernelAction load_action(int idx) {
  const ActionCell& c = g_actions[idx];
  KernelAction a{};
  // A slot is rewritten only after kSlots later stores; bounded, so that a handler that
  // interrupted a writer on this thread can never spin.
  for (int tries = 0; tries < 1000; ++tries)
    if (read_current(c, c.current.load(std::memory_order_acquire), &a)) return a;
  return a;
}

KernelAction exchange_action(int idx, const KernelAction& a) {
  ActionCell& c = g_actions[idx];
  unsigned slot = c.next.fetch_add(1, std::memory_order_relaxed) & (ActionCell::kSlots - 1);
  if (slot == (c.current.load(std::memory_order_acquire) & (ActionCell::kSlots - 1)))
    slot = (slot + 1) & (ActionCell::kSlots - 1);
  ActionCell::Slot& s = c.slots[slot];
  s.seq.fetch_add(1, std::memory_order_acq_rel);  // odd
  __atomic_store_n(&s.words[0], a.handler, __ATOMIC_RELAXED);
  __atomic_store_n(&s.words[1], a.flags, __ATOMIC_RELAXED);
  __atomic_store_n(&s.words[2], a.restorer, __ATOMIC_RELAXED);
  __atomic_store_n(&s.words[3], a.mask, __ATOMIC_RELAXED);
  s.seq.fetch_add(1, std::memory_order_release);  // even
  for (;;) {
    uint64_t cur = c.current.load(std::memory_order_acquire);
    KernelAction old{};
    if (!read_current(c, cur, &old)) continue;
    const uint64_t next = (((cur >> 8) + 1) << 8) | slot;
    if (c.current.compare_exchange_weak(cur, next, std::memory_order_acq_rel)) return old;
  }
}

bool in_vm_sharing_child() {
  const long pid = raw_syscall(__NR_getpid);
  const long owner = g_pid.load(std::memory_order_relaxed);
  if (pid == owner) return false;
  const long cmp = raw_syscall(__NR_kcmp, pid, owner, KCMP_VM, 0, 0);
  if (cmp > 0) {  // memory of its own: a fork child that nobody told
    g_pid.store(pid, std::memory_order_relaxed);
    return false;
  }
  return true;  // the same memory, or no way to tell (then write nothing)
}

void requeue_pending(ThreadSignals& t, uint64_t bits, bool block_first) {
  const long pid = raw_syscall(__NR_getpid);
  const long tid = raw_syscall(__NR_gettid);
  for (int idx = 0; idx < kOwnedCount; ++idx) {
    const int sig = g_owned_sig[idx];
    if (!(bits & t.pending & sig_bit(sig))) continue;
    t.pending &= ~sig_bit(sig);
    if (block_first) set_real_mask(SIG_BLOCK, sig_bit(sig));
    // siginfo_t as the kernel lays it out for a sent signal.
    uint64_t info[16];
    for (uint64_t& w : info) w = 0;
    auto* si = reinterpret_cast<siginfo_t*>(info);
    si->si_signo = sig;
    si->si_code = t.info[idx].code;
    si->si_pid = t.info[idx].pid;
    si->si_uid = t.info[idx].uid;
    si->si_value.sival_ptr = reinterpret_cast<void*>(t.info[idx].value);
    raw_syscall(__NR_rt_tgsigqueueinfo, pid, tid, sig, reinterpret_cast<long>(info));
  }
}

void deliver(int sig, siginfo_t* info, void* ucontext) {
  const int idx = owned_index(sig);
  if (idx < 0) return;
  ThreadSignals& t = t_signals;
  const bool child = in_vm_sharing_child();
  const KernelAction a = load_action(idx);
  const auto handler = reinterpret_cast<__sighandler_t>(a.handler);
  const bool blocked = t.blocked & sig_bit(sig);
  // Raised by the kernel for what this thread executed (a breakpoint, a fault), not sent:
  // such a signal cannot be ignored or blocked; the kernel forces the default action then.
  const bool synchronous = sig != g_owned_sig[3] && info->si_code > 0;
  if (synchronous) {
    if (handler == SIG_DFL || handler == SIG_IGN || blocked) return default_action(sig, ucontext);
  } else {
    if (handler == SIG_IGN) return;
    if (blocked) {
      if (!child) keep_pending(t, idx, info);
      return;
    }
    if (handler == SIG_DFL) return default_action(sig, ucontext);
  }
  run_program_handler(sig, idx, a, info, ucontext, t, child);
}

void on_fault_signal(int sig, siginfo_t* info, void* ucontext) {
  if (arch::safe_copy_fixup(ucontext)) return;  // a fetch read a bad pointer
  deliver(sig, info, ucontext);
}

// ---------------------------------------------------------------------------------------
// The guards. Each runs before the first instruction of a libc function (a jmp detour:
// the changes to the argument registers are what the function goes on with) and rewrites
// the call so that the kernel never sees the program displace or block an owned signal,
// while the program sees what it would have seen. Where the kernel would fail the call
// (a bad pointer, a bad `how`), the call goes on as the program made it and fails there.

// __libc_sigaction(sig, act, oact), which sigaction, signal, sigset, bsd_signal and glibc's
// posix_spawn child all reach. For an owned signal: `act` becomes the program's action,
// `oact` gets the one it replaces, and the real call is left with neither.
int guard_sigaction(probecore::Kprobe*, PtRegs* r) {
  const int sig = static_cast<int>(r->di);
  const int idx = g_owned_mask.load(std::memory_order_acquire) ? owned_index(sig) : -1;
  if (idx < 0) return 0;
  const uintptr_t act = r->si, oact = r->dx;
  KernelAction incoming{};
  if (act) {
    // What glibc reads of a struct sigaction: the handler, the mask, the flags.
    struct sigaction sa;
    if (!read_program(&sa, act, offsetof(struct sigaction, sa_flags) + sizeof sa.sa_flags))
      return 0;  // libc's own read faults, as it would without the agent
    incoming.handler = reinterpret_cast<uint64_t>(sa.sa_handler);
    incoming.flags = (static_cast<uint32_t>(sa.sa_flags) | kSaRestorer) & kKernelSaFlags;
    incoming.restorer = g_libc_restorer;
    incoming.mask = reinterpret_cast<const uint64_t*>(&sa.sa_mask)[0] & ~kUnblockable;
  }
  // A vfork or posix_spawn child resetting its handlers before exec keeps the agent's (the
  // kernel resets them at exec anyway), and leaves the parent's virtual actions alone.
  const bool store = act && !in_vm_sharing_child();
  const KernelAction previous = store ? exchange_action(idx, incoming) : load_action(idx);
  if (store && incoming.handler == reinterpret_cast<uint64_t>(SIG_IGN) &&
      (t_signals.pending & sig_bit(sig)))
    t_signals.pending &= ~sig_bit(sig);  // ignoring a signal discards it
  if (oact) {
    // glibc's struct sigaction as glibc fills it from the kernel's: the handler, the
    // mask (the kernel's 64 bits; the rest of the set zero), the flags, the restorer.
    static const uint64_t kZeros[16] = {};
    const uint64_t head[2] = {previous.handler, previous.mask};
    const int flags = static_cast<int>(previous.flags);
    if (write_program(oact, head, sizeof head) &&
        write_program(oact + sizeof head, kZeros,
                      offsetof(struct sigaction, sa_flags) - sizeof head) &&
        write_program(oact + offsetof(struct sigaction, sa_flags), &flags, sizeof flags) &&
        write_program(oact + offsetof(struct sigaction, sa_restorer), &previous.restorer,
                      sizeof previous.restorer))
      r->dx = 0;
    // else: libc's own write of oact faults after the query, as it would have.
  }
  r->si = 0;
  return 0;
}

// pthread_sigmask(how, set, oldset), which sigprocmask, sigblock, sigsetmask, sigsetjmp
// and siglongjmp, and glibc's posix_spawn child reach. The program's owned bits go to the
// thread's virtual mask; the kernel gets the set without them, and oldset gets the
// virtual view (the real mask with the owned bits the program blocked).
//
// Where the real mask has an owned signal blocked (glibc blocks every signal with a raw
// system call around clone: the posix_spawn child runs its file actions so, after asking
// for the mask), the call also lifts that block, when it read the real mask anyway.
int guard_sigmask(probecore::Kprobe*, PtRegs* r) {
  const uint64_t owned = g_owned_mask.load(std::memory_order_acquire);
  if (!owned) return 0;
  const int how = static_cast<int>(r->di);
  const uintptr_t set = r->si, oset = r->dx;
  uint64_t want = 0;
  if (set) {
    if (!read_program(&want, set, sizeof want)) return 0;  // libc faults on it
    if (how != SIG_BLOCK && how != SIG_UNBLOCK && how != SIG_SETMASK) return 0;  // EINVAL
  }
  ThreadSignals& t = t_signals;
  const uint64_t was = t.blocked;
  uint64_t real = 0;
  bool real_known = false;
  if (oset) {
    real = real_mask();
    real_known = true;
    const uint64_t view = (real & ~owned) | was;
    if (write_program(oset, &view, sizeof view)) r->dx = 0;
    // else the kernel fails the call with EFAULT, after changing the mask, as it would.
  }
  // A copy of the set (also when nothing is stripped: oldset may be the same buffer).
  uint64_t& copy = t.scratch[t.scratch_next++ & 3];
  const bool lift = real_known && (real & owned) && r->dx == 0;
  if (!set) {
    if (lift) {
      copy = real & owned;
      r->di = SIG_UNBLOCK;
      r->si = reinterpret_cast<uint64_t>(&copy);
    }
    return 0;
  }
  const uint64_t now = how == SIG_BLOCK     ? was | (want & owned)
                       : how == SIG_UNBLOCK ? was & ~want
                                            : want & owned;
  if (lift) {
    // The whole new mask, computed here, without the owned signals.
    const uint64_t next = how == SIG_BLOCK     ? real | want
                          : how == SIG_UNBLOCK ? real & ~want
                                               : want;
    copy = next & ~owned & ~kGlibcInternal;
    r->di = SIG_SETMASK;
  } else {
    // Unblocking an owned signal for real is harmless; blocking one never happens.
    copy = (how == SIG_UNBLOCK ? want : want & ~owned) & ~kGlibcInternal;
  }
  r->si = reinterpret_cast<uint64_t>(&copy);
  if (now != was && !in_vm_sharing_child()) {
    t.blocked = now;
    // Signals kept while blocked arrive when this call unblocks them: blocked for real
    // until the call's own system call lifts the block.
    if (const uint64_t ready = t.pending & was & ~now) requeue_pending(t, ready);
  }
  return 0;
}

namespace {

// The mask-taking waits (sigsuspend, ppoll, pselect, epoll_pwait): the mask they install
// for the wait does not block an owned signal. The thread's virtual mask is left as it
// was (no hook at their return to put it back).
void strip_wait_mask(uint64_t* reg) {
  const uint64_t owned = g_owned_mask.load(std::memory_order_acquire);
  if (!owned || !*reg) return;
  uint64_t want = 0;
  if (!read_program(&want, *reg, sizeof want) || !(want & owned)) return;
  ThreadSignals& t = t_signals;
  uint64_t& copy = t.scratch[t.scratch_next++ & 3];
  copy = want & ~owned;
  *reg = reinterpret_cast<uint64_t>(&copy);
}

}  // namespace

int guard_wait_mask_arg1(probecore::Kprobe*, PtRegs* r) {
  strip_wait_mask(&r->di);
  return 0;
}
int guard_wait_mask_arg4(probecore::Kprobe*, PtRegs* r) {
  strip_wait_mask(&r->cx);
  return 0;
}
int guard_wait_mask_arg5(probecore::Kprobe*, PtRegs* r) {
  strip_wait_mask(&r->r8);
  return 0;
}
int guard_wait_mask_arg6(probecore::Kprobe*, PtRegs* r) {
  strip_wait_mask(&r->r9);
  return 0;
}

}  // namespace probefs::agent::detail
