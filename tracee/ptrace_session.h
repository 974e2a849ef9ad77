// Holding one thread of a running process with ptrace, making it call functions, and
// giving it back exactly as it was. Daemon side: attach (tracee/inject.h) is built on it.
//
// A session seizes ONE thread of the target (PTRACE_SEIZE, then PTRACE_INTERRUPT), saves
// everything of it that a call could change, runs calls on its stack with its signals
// blocked and, on detach, puts every register back so that a system call the thread was
// blocked in restarts as though nothing happened:
//
//   saved                        how                               restored
//   general registers, orig_rax  PTRACE_GETREGS                    PTRACE_SETREGS
//   x87/SSE/AVX/AVX-512 state    PTRACE_GETREGSET NT_X86_XSTATE    PTRACE_SETREGSET
//                                (NT_PRFPREG where XSAVE is absent)
//   signal mask                  PTRACE_GETSIGMASK                 PTRACE_SETSIGMASK
//   errno                        __errno_location() called in the  written back through
//                                target, the int read              /proc/TID/mem
//   rseq critical section        PTRACE_GET_RSEQ_CONFIGURATION,    written back, so that
//                                rseq_cs read                      the kernel still aborts
//                                                                  a section we preempted
//
// The other threads of the process run on the whole time; only the held thread stops.
//
// Attach in two steps (tracee/inject.h): the held thread only starts a thread of ours
// (start_thread) and is given back at once; the session then holds that new thread, which
// runs code of ours and the calls that follow, never the program's own code.
//
// Threads: a tracee belongs to the THREAD that attached, and only that thread's exit
// detaches a tracee that has not stopped (PTRACE_DETACH needs a stopped tracee). So every
// session runs its ptrace work on a thread of its own; when a thread does not stop within
// the timeout, that thread ends and the kernel detaches the target without a signal. Use
// one session from one thread at a time. While a session is open the caller's process must
// not reap arbitrary children (wait(), waitpid(-1, ...)): such a wait can take the held
// thread's stop reports. Each stop also sends SIGCHLD to the caller's process.
//
// Limits, all of ptrace's making:
// - Nothing of the held thread changes before the first call. A caller that dies while
//   it holds a thread after that lets the thread go in our frame (inside the call, or at
//   our return's SIGSEGV): the process dies of SIGSEGV. Nothing can put its registers
//   back without us, so keep sessions short.
// - Our return is a SIGSEGV the kernel forces; a program that set SIGSEGV to SIG_IGN
//   finds it back at SIG_DFL afterwards (force_sig resets an ignored handler).
// - While a thread is held, signals its process ignores by default (SIGCHLD, SIGWINCH,
//   SIGURG, SIGCONT) are queued rather than dropped, as for any traced thread, and may
//   wake another thread of the process from epoll_wait with EINTR.
// - A call runs on the stack the thread was on. A thread stopped inside a signal handler
//   on a small sigaltstack may overflow it: the call then faults (-EFAULT).
#pragma once

#include <sys/types.h>
#include <sys/user.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "tracee/elf_symbols.h"

namespace probefs::tracee {

// Why an operation failed: a negative errno for the program and a sentence for the user.
struct PtraceError {
  int err = 0;
  std::string message;
};

struct PtraceOptions {
  // Bound on each wait for the target: the thread's stop, and each call's return.
  std::chrono::milliseconds timeout{2000};
};

// What the held thread was doing when it stopped, from its saved registers.
struct StoppedAt {
  long syscall = -1;  // orig_rax: the system call it was in, -1 in user code
  long result = 0;    // rax: the call's result so far (-ERESTARTSYS, -EINTR, ...)
  // The call returned -EINTR only because the thread stopped, and it is one that the
  // kernel never restarts (epoll_wait, sigtimedwait, semop, socket calls with a timeout):
  // the session gives it -ERESTARTNOHAND instead, so the kernel restarts it unless a
  // signal handler runs first, as it does for the calls it restarts itself.
  bool restart_instead_of_eintr = false;
};

// The program's threads only: a thread the session started is not the program's.
struct PtraceTimings {
  std::chrono::nanoseconds to_stop{0};  // PTRACE_INTERRUPT until the thread's state is saved
  std::chrono::nanoseconds held{0};     // threads stopped until given back, summed (0 while
                                        // the first is held)
};

class PtraceSession {
 public:
  // Seizes one thread of process `pid` and stops it. The thread is the main thread unless
  // it has exited (pthread_exit from main) or a stop would disturb it more than another
  // (a call that returns EINTR when stopped, uninterruptible sleep, vfork); then the
  // thread of /proc/PID/task a stop disturbs least, one in user code first. A thread id
  // given as `pid` stands for its process. The objects of the process are read after the
  // seize and before the stop. On failure nullptr, with error->err:
  //   -ESRCH      no such process, or it has exited (a zombie) or exits meanwhile
  //   -EPERM      ptrace refused; the message says why: another user and no
  //               CAP_SYS_PTRACE, already traced (by whom), not dumpable, Yama's
  //               ptrace_scope (named), a kernel thread, or a security module
  //   -EBUSY      the process is stopped by job control (state T): it is refused rather
  //               than resumed for the call; send it SIGCONT first
  //   -ETIMEDOUT  the thread did not stop within the timeout (uninterruptible sleep, a
  //               vfork parent); it was let go without a signal
  //   -EINVAL     the thread runs 32-bit code, or `pid` is the caller's own process
  static std::unique_ptr<PtraceSession> attach(pid_t pid, const PtraceOptions& options,
                                               PtraceError* error);
  // Detaches as detach() does when still attached; its errors are dropped.
  ~PtraceSession();
  PtraceSession(const PtraceSession&) = delete;
  PtraceSession& operator=(const PtraceSession&) = delete;

  pid_t pid() const;  // the process (thread group id)
  pid_t tid() const;  // the held thread
  const StoppedAt& stopped_at() const;
  // The held thread's registers as it stopped (not those of a call).
  const user_regs_struct& registers() const;
  PtraceTimings timings() const;
  // Whether the held thread is one start_thread() started, not one of the program's.
  bool holds_own_thread() const;
  // The thread the last start_thread() started, held or not; 0 when it started none.
  pid_t started_thread() const;

  // The process's ELF objects, loaded at attach (before the thread was stopped) through
  // the held thread's /proc entries, which still show the memory when the main thread
  // has exited (symbols().pid() is then tid()).
  ProcessSymbols& symbols();

  // Changes the bound on the waits that follow.
  void set_timeout(std::chrono::milliseconds timeout);
  std::chrono::milliseconds timeout() const;

  // Gives the held thread back, as detach() does, and holds another thread of the
  // process, chosen as attach() chooses but none of `avoid`. Used when the held thread
  // stopped where it must not be used (tracee/inject.h). 0, or:
  //   -ENOENT     every live thread is in `avoid`: the session holds no thread now, and
  //               the next hold_another() may take any
  //   and the errors of attach(), after which the session holds no thread.
  [[nodiscard]] int hold_another(std::span<const pid_t> avoid, PtraceError* error);

  // The first step of attach in two steps. The held thread calls
  //   start.create(&slot, NULL, start.routine, start.arg)   (pthread_create's signature)
  // with the thread it starts traced from its first instruction, and is given back at
  // once, as detach() gives it back. The new thread runs its routine freely until the
  // 64-bit word at start.report_word is nonzero; then the session holds it, as attach()
  // holds a thread, and calls, push_string and detach apply to it. Before the session lets
  // it go (detach, or any failure after it started) it sets the 32-bit word at
  // start.finish_word to 1: the routine must then end the thread, and must end it by
  // itself if the word stays 0 for long (the session never writes to the process once it
  // has let the thread go). detach() waits, within the timeout, for the thread to end.
  //
  // A call on that thread is never stopped midway: one that does not return in time goes
  // on, the thread let go, and returns to start.call_return (with rbx, and every register
  // the ABI has a callee keep, as the thread had them where it was held), where the
  // routine ends the thread. So a call that took a lock gives it back when it returns.
  // 0, or:
  //   -ETIMEDOUT  the report word stayed 0 for the timeout: the thread was let go to finish
  //               its work and end by itself, and the session holds no thread
  //   -ESRCH      the process exited or executed a new program meanwhile
  //   -EAGAIN, -ENOMEM, ...: create's own failure (nothing started)
  //   and the errors of call() (the program's thread is given back whatever happens).
  struct ThreadStart {
    uintptr_t create = 0;
    uintptr_t routine = 0;
    uint64_t arg = 0;
    uintptr_t report_word = 0;
    uintptr_t finish_word = 0;
    uintptr_t call_return = 0;
  };
  [[nodiscard]] int start_thread(const ThreadStart& start, PtraceError* error);

  // Calls `fn` in the held thread with up to 6 integer arguments (rdi, rsi, rdx, rcx, r8,
  // r9) and gives its rax. The frame lies below the stack's 128-byte red zone and below
  // the scratch strings, 16-byte aligned at the call, and returns to address 0: the
  // SIGSEGV at ip 0 tells the return, and is never delivered. The call runs with every
  // signal blocked but the synchronous ones (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP,
  // SIGSYS: the kernel resets a program's handler of a blocked one to SIG_DFL when it
  // forces it on a fault); threads the call starts inherit that mask. A signal sent to the
  // thread that gets through meanwhile (SIGSTOP, a SIGSEGV from kill) is kept and sent
  // again after detach. Such a stop inside a call may replace the thread's restart block
  // (a timed wait the call was in); a thread that was itself in nanosleep or poll then
  // restarts its call from its arguments rather than through restart_syscall: the same
  // call, with its relative timeout started over. 0, or:
  //   -EFAULT     the call faulted (the message names signal, ip and address); its
  //               registers are dropped, but what it changed in memory stays (a lock it
  //               took, for one)
  //   -ETIMEDOUT  it did not return in time; it was stopped and abandoned midway, with
  //               the same caveat. When it could not even be stopped, the session lets
  //               the thread go: it then runs the call to its end and faults at ip 0.
  //               On a thread of start_thread(): let go to finish the call (see there)
  //   -ESRCH      the process exited, or executed a new program (the session then lets
  //               it go in its new image, with its own signal mask)
  //   -ENOENT     errno cannot be saved: no __errno_location in the process
  //   -EINVAL     more than 6 arguments; -EIO the session is no longer holding the thread
  [[nodiscard]] int call(uintptr_t fn, std::span<const uint64_t> args, uint64_t* result,
                         PtraceError* error);

  // Copies `s` and a NUL onto the held thread's stack (below the red zone, below strings
  // pushed before) for the calls that follow; *addr is its address in the target. Valid
  // until detach. -E2BIG past 64 KiB of scratch in all, -EIO when not holding the thread.
  [[nodiscard]] int push_string(std::string_view s, uintptr_t* addr, PtraceError* error);

  // The target's memory, through /proc/PID/mem (the held thread stays stopped). 0 or a
  // negative errno; a short transfer is -EIO.
  [[nodiscard]] int read_memory(uintptr_t addr, void* buf, size_t len) const;
  [[nodiscard]] int write_memory(uintptr_t addr, const void* buf, size_t len) const;
  // A NUL-terminated string of at most `max` bytes (longer ones are cut).
  [[nodiscard]] int read_string(uintptr_t addr, size_t max, std::string* out) const;

  // Restores errno, the rseq section, the vector and general registers and the signal
  // mask, then PTRACE_DETACH with no signal: signals that arrived meanwhile are delivered
  // now, and a system call the thread was blocked in restarts. 0, or the first failure
  // (the thread is detached in every case: by the session's thread ending if need be).
  // A thread of start_thread() is told to finish and followed until it has ended.
  [[nodiscard]] int detach(PtraceError* error);

 private:
  struct Impl;
  explicit PtraceSession(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What /proc says about a process that ptrace refused, and the sentence made of it. A
// pure function, so that every reason can be checked on any kernel (this one may have no
// Yama, for one).
struct PtraceRefusal {
  pid_t pid = 0;
  pid_t tracer = 0;                  // TracerPid of the thread, 0 when none
  std::string tracer_name;           // its comm, when readable
  uid_t our_uid = 0;                 // our real uid
  uid_t target_uids[3] = {0, 0, 0};  // real, effective, saved
  gid_t our_gid = 0;
  gid_t target_gids[3] = {0, 0, 0};
  bool cap_sys_ptrace = false;   // in our effective set
  bool target_dumpable = true;   // false when /proc/PID is owned by root for a non-root
                                 // process (the kernel's sign of a non-dumpable one)
  int yama_scope = -1;           // /proc/sys/kernel/yama/ptrace_scope; -1 without Yama
  bool we_are_ancestor = false;  // what Yama's scope 1 allows without a declaration
};
std::string explain_ptrace_refusal(const PtraceRefusal& facts);

}  // namespace probefs::tracee
