// The agent's signal guards: inside a traced process, the program can no longer displace
// or block the signals the probes need, and still sees its own.
//
// The agent owns four signals in the process it is loaded into:
//   SIGTRAP          int3 probes (the engine's handler, arch/x86_64/trap.cc)
//   SIGSEGV, SIGBUS  the fault fixup of in-process reads of fetch arguments
//                    (arch/safe_copy.h): a bad pointer yields the kernel's fault values
//   SIGRTMAX - 1     the engine's thread-fixup signal (arch/signals.h)
// For each, the kernel keeps the agent's or the engine's handler, and no thread blocks it
// for real. The program keeps a virtual action per signal and a virtual blocked bit per
// thread instead, through guard probes that the agent places on libc's entry points
// (the same way at launch and at attach, whatever libc the program calls through):
//
//   __libc_sigaction   (sigaction, signal, sigset, bsd_signal, sysv_signal, glibc's
//                      posix_spawn/system/popen child)  the program's action is stored and
//                      its previous one returned, exactly as the kernel would store and
//                      return it; the real call is left a query
//   pthread_sigmask    (sigprocmask, sigblock, sigsetmask, sigsetjmp/siglongjmp, the
//                      spawned child)  owned bits go to the thread's virtual mask, the
//                      rest to the kernel; oldset reads back what the program set
//   sigsuspend, ppoll, pselect, epoll_pwait, epoll_pwait2
//                      the mask installed for the wait does not block an owned signal
//
// The two first are jump-optimized probes that are never an int3 (KPROBE_FLAG_NO_INT3:
// glibc calls them with every signal blocked) and run also inside another probe's
// handler (KPROBE_FLAG_NESTED), so that no program call is ever missed.
//
// What reaches the agent's or the engine's handler without being theirs (a breakpoint or
// a SIGTRAP of the program's own, a fault outside the fixup, a fixup signal the engine did
// not send) is delivered as the kernel would deliver it with the program's virtual action
// and mask: its handler (SA_SIGINFO or not, SA_RESETHAND, SA_NODEFER, the action's mask,
// the interrupted mask in the ucontext and restored on return), ignored, or the default
// action (the process ends as it would have without the agent). A trap or fault that the
// program ignores or blocks takes the default action, as the kernel forces it. A signal
// sent to a thread that blocks it virtually waits on that thread (one of each signal, with
// its sender's pid, uid, code and value) and arrives when the thread unblocks it.
//
// Limits (see README): sigwait, sigwaitinfo, sigtimedwait and signalfd never see an owned
// signal (the kernel delivers it to the handler first); sigpending does not show the ones
// waiting virtually; a process-directed signal that lands on a thread blocking it waits
// for that thread; getcontext/setcontext/swapcontext carry no virtual bits; a thread
// starts with no owned signal blocked whatever its creator blocked; a signal the program
// blocks is unblocked across exec; SA_ONSTACK of the program's SIGTRAP and fixup-signal
// actions is not honoured (SIGSEGV/SIGBUS always run on the alternate stack where the
// thread has one); SA_RESTART is the agent's (system calls restart). Calls through raw
// system calls (syscall(2), a libc other than the one guarded) bypass the guards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "probecore/kprobes.h"

namespace probefs::agent {

// A function `name` (of `version`, or the default one when null) in the object dlopen'ed
// as `handle`, and its bounds from its dynamic symbol's size: what the agent's own guard
// probes are placed on. false when it is not there, or has no size.
bool resolve_own_guard_site(void* handle, const char* name, const char* version,
                            uintptr_t* addr, probecore::FunctionBounds* bounds);

// Takes ownership of the signals: installs the agent's SIGSEGV/SIGBUS handler (safe-copy
// fixup, then the program's action), makes sure the engine's SIGTRAP and fixup-signal
// handlers are in place, adopts the program's current actions and the calling thread's
// mask as the virtual ones, and registers and arms the guard probes (waiting for their
// jmps up to a second; signal_guards_armed() tells whether they are). Idempotent: when
// installed already it only reconciles (below). A fork child keeps everything. The other
// threads at attach keep what they blocked before until their next pthread_sigmask call.
// 0 or -errno: -ENOENT when libc or its __libc_sigaction/pthread_sigmask cannot be found,
// or the engine's error for their probes (nothing is left installed then). `also`: other
// registered, disabled probes enabled in the same write window as the guards (a process
// that starts: its own probes and the spawn guards), whatever the outcome.
[[nodiscard]] int install_signal_guards(probecore::Kprobe* const* also = nullptr, int n_also = 0);

// Gives the program back its virtual actions as the real ones (where the real action is
// still the agent's or the engine's) and the calling thread's virtual mask, re-sends the
// calling thread's waiting signals, and removes the guard probes. The engine's own
// handlers stay (they pass foreign signals on to the program's actions from then on).
// Call after every other probe is gone: a fetch read of a bad pointer is fatal without the
// agent's SIGSEGV handler. The other threads' virtual masks and waiting signals are lost.
void uninstall_signal_guards();

// Takes the signals back where the guards could not see the program change them: while
// the guards were not armed (the global kprobes switch, a window in which their jmp was
// being rewritten). A real action that is not the agent's or the engine's becomes the
// program's virtual one and the agent's goes back; the calling thread's real owned bits
// move to its virtual mask. 0 or -errno (-EINVAL: not installed).
[[nodiscard]] int reconcile_signal_guards();

bool signal_guards_installed();
// Are the essential guards (__libc_sigaction, pthread_sigmask) armed as jmps now?
bool signal_guards_armed();
// One line per guard: "SYMBOL ADDR armed" or "SYMBOL ADDR <why not>".
std::string signal_guard_status();
// The guard probes' addresses (for hiding them from a kprobes list); how many there are.
size_t signal_guard_addresses(uintptr_t* out, size_t max);
// The owned signals as a kernel sigset word (bit sig-1); 0 when not installed.
uint64_t owned_signal_mask();

}  // namespace probefs::agent
