#include "tracee/ptrace_session.h"

#include <dirent.h>
#include <elf.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "tracee/proc_info.h"

namespace probefs::tracee {
namespace {

using Clock = std::chrono::steady_clock;

// The System V ABI lets a function use 128 bytes below its stack pointer without moving
// it; nothing of ours may land there.
constexpr uintptr_t kRedZone = 128;
constexpr uintptr_t kMaxScratch = 64 * 1024;
// Large enough for any XSAVE layout the kernel reports (AMX tiles included); the kernel
// trims the transfer to the real size, which the restore must then give back exactly.
constexpr size_t kMaxXstate = 64 * 1024;
constexpr size_t kFxsaveSize = 512;
constexpr uint64_t kUserCs64 = 0x33;  // __USER_CS: 64-bit user code
constexpr unsigned long long kFlagTf = 0x100;
constexpr unsigned long long kFlagDf = 0x400;
// The kernel's restart codes (include/linux/errno.h), which never reach user space:
// restart unless a handler runs, and restart through restart_syscall and the thread's
// restart block.
constexpr long kErestartNoHand = 514;
constexpr long kErestartRestartBlock = 516;
// How many threads of a process the choice looks at, so a huge one cannot keep us busy.
constexpr size_t kMaxThreadsScanned = 4096;

std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return buf;
}

std::string errno_name(int err) { return std::error_code(err, std::generic_category()).message(); }

int fail(PtraceError* error, int err, std::string message) {
  if (error != nullptr) {
    error->err = err;
    error->message = std::move(message);
  }
  return err;
}

long ptrace_call(__ptrace_request request, pid_t tid, uintptr_t addr, uintptr_t data) {
  errno = 0;
  long r = ptrace(request, tid, reinterpret_cast<void*>(addr), reinterpret_cast<void*>(data));
  return r < 0 && errno != 0 ? -errno : r;
}

long ptrace_call(__ptrace_request request, pid_t tid, uintptr_t addr, void* data) {
  return ptrace_call(request, tid, addr, reinterpret_cast<uintptr_t>(data));
}

std::string sig_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : strf("signal %d", sig);
}

// One thread's scheduler state letter (R, S, D, T, t, Z, X, ...); 0 when unreadable.
char thread_state(pid_t pid, pid_t tid) { return proc_state(pid, tid); }

// The system call a thread is blocked in (/proc/PID/task/TID/syscall): its number, -1 in
// user code, -2 when unknown (no permission to look, or the thread is gone).
long thread_syscall(pid_t pid, pid_t tid) {
  std::string text;
  if (read_proc_file(pid, tid, "syscall", &text) != 0 || text.empty()) return -2;
  if (text.compare(0, 7, "running") == 0) return -1;
  return std::strtol(text.c_str(), nullptr, 10);
}

// The system calls that return -EINTR, never a restart code, when a stop interrupts them
// (signal(7), "Interruption of system calls and library functions by stop signals"), and
// that did nothing yet when they do: restarting them is what the program would have got
// had it not been stopped.
bool eintr_on_stop(long nr) {
  switch (nr) {
    case SYS_epoll_wait:
    case SYS_epoll_pwait:
    case SYS_epoll_pwait2:
    case SYS_rt_sigtimedwait:
    case SYS_semop:
    case SYS_semtimedop:
    case SYS_io_getevents:
    case SYS_io_pgetevents:
    // With SO_RCVTIMEO / SO_SNDTIMEO set; without, they restart by themselves.
    case SYS_accept:
    case SYS_accept4:
    case SYS_recvfrom:
    case SYS_recvmsg:
    case SYS_recvmmsg:
    case SYS_sendto:
    case SYS_sendmsg:
    case SYS_sendmmsg:
      return true;
    default:
      return false;
  }
}

// How little a stop of this thread disturbs: 0 in user code, 1 in a system call that
// restarts by itself, 2 in one that returns EINTR when stopped (the session restarts it,
// but a relative timeout starts over), 3 where PTRACE_INTERRUPT may not stop it in time
// (uninterruptible sleep; a vfork parent, which only a fatal signal wakes).
int stop_cost(char state, long nr) {
  if (state == 'D' || nr == SYS_vfork) return 3;
  if (nr >= 0 && eintr_on_stop(nr)) return 2;
  if (nr >= 0) return 1;
  return 0;
}

bool thread_is_dead(char state) { return state == 'Z' || state == 'X' || state == 'x'; }

std::vector<pid_t> list_threads(pid_t pid) {
  std::vector<pid_t> tids;
  DIR* d = opendir(proc_path(pid, 0, "task").c_str());
  if (d == nullptr) return tids;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long tid = std::strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && tid > 0) tids.push_back(static_cast<pid_t>(tid));
    if (tids.size() >= kMaxThreadsScanned) break;
  }
  closedir(d);
  std::sort(tids.begin(), tids.end());
  return tids;
}

bool has_cap_sys_ptrace() {
  std::string text;
  if (read_proc_text("/proc/self/status", &text) != 0) return false;
  uint64_t caps = 0;
  if (!ProcStatus(std::move(text)).number("CapEff", &caps, 0, 16)) return false;
  constexpr int kCapSysPtrace = 19;
  return (caps >> kCapSysPtrace) & 1;
}

pid_t parent_of(pid_t pid) {
  ProcStatus status;
  uint64_t ppid = 0;
  if (status.read(pid) != 0 || !status.number("PPid", &ppid)) return 0;
  return static_cast<pid_t>(ppid);
}

// The real, effective and saved ids of a "Uid:" or "Gid:" field; 0 where one is missing.
void parse_ids(const ProcStatus& status, std::string_view name, unsigned ids[3]) {
  for (int i = 0; i < 3; ++i) {
    uint64_t v = 0;
    ids[i] = status.number(name, &v, i) ? static_cast<unsigned>(v) : 0;
  }
}

PtraceRefusal gather_refusal(pid_t pid, pid_t tid) {
  PtraceRefusal f;
  f.pid = pid;
  ProcStatus status;
  if (status.read(pid, tid) == 0) {
    uint64_t tracer = 0;
    if (status.number("TracerPid", &tracer)) f.tracer = static_cast<pid_t>(tracer);
    unsigned ids[3];
    parse_ids(status, "Uid", ids);
    for (int i = 0; i < 3; ++i) f.target_uids[i] = ids[i];
    parse_ids(status, "Gid", ids);
    for (int i = 0; i < 3; ++i) f.target_gids[i] = ids[i];
  }
  if (f.tracer != 0) {
    std::string comm;
    if (read_proc_comm(f.tracer, 0, &comm) == 0) f.tracer_name = comm;
  }
  f.our_uid = getuid();
  f.our_gid = getgid();
  f.cap_sys_ptrace = has_cap_sys_ptrace();
  // The kernel gives a non-dumpable process's /proc files to root.
  struct stat st;
  if (stat(proc_path(pid, 0, "").c_str(), &st) == 0 && st.st_uid == 0 && f.target_uids[1] != 0) {
    f.target_dumpable = false;
  }
  std::string scope;
  if (read_proc_text("/proc/sys/kernel/yama/ptrace_scope", &scope) == 0) {
    f.yama_scope = std::atoi(scope.c_str());
  }
  const pid_t self = getpid();
  pid_t p = pid;
  for (int depth = 0; depth < 4096 && p > 1; ++depth) {
    p = parent_of(p);
    if (p == self) {
      f.we_are_ancestor = true;
      break;
    }
  }
  return f;
}

// Waits for the held thread ------------------------------------------------------------

struct Stop {
  enum Kind { kExited, kSignal, kGroupStop, kInterrupt, kExec, kEvent } kind = kExited;
  int sig = 0;
  int event = 0;  // kEvent: PTRACE_EVENT_CLONE, ...
};

bool is_stop_signal(int sig) {
  return sig == SIGSTOP || sig == SIGTSTP || sig == SIGTTIN || sig == SIGTTOU;
}

// One look for a report about `tid`: 1 with *out filled in, 0 when there is none yet, or
// waitpid's error (-ECHILD: not our tracee any more).
int check_stop(pid_t tid, Stop* out) {
  for (;;) {
    int status = 0;
    pid_t r = waitpid(tid, &status, __WALL | WNOHANG);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r != tid) return 0;
    if (WIFEXITED(status) || WIFSIGNALED(status)) {
      out->kind = Stop::kExited;
      out->sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      return 1;
    }
    if (!WIFSTOPPED(status)) continue;
    const int event = status >> 16;
    out->sig = WSTOPSIG(status);
    out->event = event;
    if (event == PTRACE_EVENT_STOP) {
      out->kind = is_stop_signal(out->sig) ? Stop::kGroupStop : Stop::kInterrupt;
    } else if (event != 0) {
      out->kind = event == PTRACE_EVENT_EXEC ? Stop::kExec : Stop::kEvent;
    } else {
      out->kind = Stop::kSignal;
    }
    return 1;
  }
}

// The pause between two looks at something another process does: sleeps that double
// from 20 us up to 250 us, never past `deadline`. Sleeps, not sched_yield: on a loaded
// machine a yield gives the CPU away for a time slice (milliseconds) each time, and a
// thread woken from a sleep runs again soon.
class Backoff {
 public:
  void pause(Clock::time_point deadline) {
    const long left_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - Clock::now()).count();
    if (left_ns <= 0) return;
    timespec ts{0, std::min(delay_ns_, left_ns)};
    nanosleep(&ts, nullptr);
    delay_ns_ = std::min(delay_ns_ * 2, 250'000L);
  }

 private:
  long delay_ns_ = 20'000;
};

// Waits for the next report about `tid` until `deadline`. There is no waitpid with a
// timeout, and a signal to interrupt one would be the caller's process's business, so it
// polls. 0, -ETIMEDOUT, or waitpid's error (-ECHILD: not our tracee any more).
int wait_stop(pid_t tid, Clock::time_point deadline, Stop* out) {
  Backoff backoff;
  for (;;) {
    const int r = check_stop(tid, out);
    if (r != 0) return r < 0 ? r : 0;
    if (Clock::now() >= deadline) return -ETIMEDOUT;
    backoff.pause(deadline);
  }
}

// Runs every ptrace request of one session on one thread: the tracee is tied to it.
class TracerThread {
 public:
  TracerThread() : thread_([this] { loop(); }) {}
  ~TracerThread() { stop(); }
  TracerThread(const TracerThread&) = delete;
  TracerThread& operator=(const TracerThread&) = delete;

  // Runs `job` there and returns when it is done. False once the thread has ended.
  bool run(const std::function<void()>& job) {
    std::unique_lock lock(mu_);
    if (quit_) return false;
    job_ = &job;
    done_ = false;
    cv_.notify_all();
    cv_.wait(lock, [&] { return done_; });
    return true;
  }

  // Ends the thread; the kernel detaches any tracee it still has, without a signal.
  void stop() {
    {
      std::lock_guard lock(mu_);
      if (quit_ && !thread_.joinable()) return;
      quit_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return quit_ || job_ != nullptr; });
      if (job_ == nullptr) return;
      const std::function<void()>* job = job_;
      lock.unlock();
      (*job)();
      lock.lock();
      job_ = nullptr;
      done_ = true;
      cv_.notify_all();
    }
  }

  std::mutex mu_;  // guards job_, done_, quit_ (the caller and the tracer thread)
  std::condition_variable cv_;
  const std::function<void()>* job_ = nullptr;
  bool done_ = false;
  bool quit_ = false;
  std::thread thread_;  // last: it starts running in the constructor
};

}  // namespace

std::string explain_ptrace_refusal(const PtraceRefusal& f) {
  const std::string head = strf("cannot attach to process %d: ", static_cast<int>(f.pid));
  if (f.tracer != 0) {
    return head + strf(
                      "it is already traced by process %d%s%s%s, and a thread has one "
                      "tracer at a time",
                      static_cast<int>(f.tracer), f.tracer_name.empty() ? "" : " (",
                      f.tracer_name.c_str(), f.tracer_name.empty() ? "" : ")");
  }
  bool same_user = true;
  for (uid_t u : f.target_uids) same_user &= u == f.our_uid;
  for (gid_t g : f.target_gids) same_user &= g == f.our_gid;
  if (!f.cap_sys_ptrace && !same_user) {
    return head + strf(
                      "it runs as uid %u (real/effective/saved %u/%u/%u, gid %u/%u/%u) and "
                      "we as uid %u gid %u; tracing another user's process needs "
                      "CAP_SYS_PTRACE",
                      f.target_uids[1], f.target_uids[0], f.target_uids[1], f.target_uids[2],
                      f.target_gids[0], f.target_gids[1], f.target_gids[2], f.our_uid, f.our_gid);
  }
  if (!f.cap_sys_ptrace && !f.target_dumpable) {
    return head +
           "it is not dumpable (a set-user-ID or file-capability program, or it "
           "called prctl(PR_SET_DUMPABLE, 0)); tracing it needs CAP_SYS_PTRACE";
  }
  switch (f.yama_scope) {
    case 3:
      return head +
             "Yama forbids every attach: kernel.yama.ptrace_scope is 3 (no attach), "
             "which stays until reboot";
    case 2:
      if (!f.cap_sys_ptrace) {
        return head +
               "kernel.yama.ptrace_scope is 2 (admin-only attach): only a process "
               "with CAP_SYS_PTRACE may attach";
      }
      break;
    case 1:
      if (!f.cap_sys_ptrace && !f.we_are_ancestor) {
        return head + strf(
                          "kernel.yama.ptrace_scope is 1 (restricted ptrace): only an "
                          "ancestor of process %d may attach, or a process it names with "
                          "prctl(PR_SET_PTRACER), or one with CAP_SYS_PTRACE (run as root, "
                          "or set the sysctl to 0)",
                          static_cast<int>(f.pid));
      }
      break;
    default:
      break;
  }
  return head +
         "the kernel refused ptrace (EPERM): a security module (SELinux, AppArmor), "
         "another user namespace, or a process that may not be traced";
}

struct PtraceSession::Impl {
  enum class State {
    kNone,    // not seized
    kSeized,  // seized, not stopped yet (a thread of ours: traced, running its routine)
    kHeld,    // stopped by us, state saved
    kIdle,    // between two threads of hold_another: none held, another may be
    kDetached,
    kLost,  // did not stop in time; the tracer thread's end lets it go
    kGone,  // the process or thread exited
  };

  explicit Impl(const PtraceOptions& o) : options(o) {}
  ~Impl() {
    if (mem_fd >= 0) close(mem_fd);
  }

  // All of these run on the tracer thread.
  int seize(pid_t requested, std::span<const pid_t> avoid, PtraceError* error);
  int stop_and_save(PtraceError* error);
  void forget_thread();
  int hold_another(std::span<const pid_t> avoid, PtraceError* error);
  int start_thread(const ThreadStart& start, PtraceError* error);
  int let_own_call_finish(uintptr_t fn, uintptr_t frame, PtraceError* error);
  int run_own_until(uintptr_t report, PtraceError* error);
  void let_go_own(bool known_stopped);
  void let_go_newborn(pid_t born, uintptr_t finish);
  int wait_own_end();
  bool took_over_by_exec(Clock::time_point deadline);
  std::string code_name(uintptr_t addr) const;
  int raw_call(uintptr_t fn, std::span<const uint64_t> args, uint64_t* result, PtraceError* error);
  int save_errno(PtraceError* error);
  int abandon_call(uintptr_t fn, uintptr_t frame, PtraceError* error);
  int exec_during_call(PtraceError* error);
  int restore_and_detach(PtraceError* error);
  void release_held_signals();

  int read_mem(uintptr_t addr, void* buf, size_t len) const;
  int write_mem(uintptr_t addr, const void* buf, size_t len) const;

  // Runs `f` on the tracer thread; ends that thread when the tracee was lost, so that the
  // kernel lets it go now rather than when the session is destroyed.
  int on_tracer(const std::function<int()>& f, PtraceError* error) {
    int rc = -EIO;
    if (!tracer.run([&] { rc = f(); })) {
      return fail(error, -EIO, "the session no longer holds a thread of the process");
    }
    if (state == State::kLost) tracer.stop();
    return rc;
  }

  PtraceOptions options;
  pid_t pid = 0;
  pid_t tid = 0;
  State state = State::kNone;
  std::unique_ptr<ProcessSymbols> symbols;
  int mem_fd = -1;

  user_regs_struct saved{};
  std::vector<uint8_t> fpu;  // the XSAVE image, or the 512-byte FXSAVE one
  bool fpu_is_xstate = false;
  bool call_fpu_ready = false;   // the ABI's FPU state is set for calls
  bool signals_blocked = false;  // the calls' signal mask is set
  bool exec_seen = false;        // the process executed a new program as we attached
  uint64_t saved_mask = 0;
  bool errno_saved = false;
  uintptr_t errno_addr = 0;
  int saved_errno = 0;
  bool rseq_saved = false;
  uintptr_t rseq_cs_addr = 0;
  uint64_t saved_rseq_cs = 0;
  StoppedAt stopped_at;
  uintptr_t scratch_top = 0;  // scratch strings grow down from below the red zone
  uintptr_t scratch_limit = 0;
  std::vector<siginfo_t> held_signals;  // sent meanwhile, to send again after detach
  // A call stopped other than at its return (a stop signal, our own interrupt): a timed
  // wait it was in (nanosleep, poll, a futex wait) may have left ITS restart block in
  // the thread, in place of the one the thread's own interrupted wait needs.
  bool restart_block_at_risk = false;
  // Threads the held thread's calls started (PTRACE_EVENT_CLONE), while clones are traced.
  std::vector<pid_t> cloned;
  // The thread is one start_thread() started: it runs our routine, and before it is let
  // go the word at finish_addr is set to 1, which ends it.
  bool own_thread = false;
  uintptr_t finish_addr = 0;
  uintptr_t call_return = 0;  // where a call it is let go in returns
  pid_t started = 0;  // what the last start_thread() started, 0 if nothing
  uint64_t program_mask = 0;  // the signal mask of the program's thread that started it

  Clock::time_point held_since;
  PtraceTimings timings;

  TracerThread tracer;  // last: destroyed (joined) first
};

// "NAME (0xADDR)" where the process's symbols name the function at addr, else "0xADDR".
std::string PtraceSession::Impl::code_name(uintptr_t addr) const {
  ResolvedSymbol sym;
  if (symbols != nullptr && symbols->describe(addr, &sym) == 0 && !sym.name.empty()) {
    return strf("%s (%#llx)", sym.name.c_str(), static_cast<unsigned long long>(addr));
  }
  return strf("%#llx", static_cast<unsigned long long>(addr));
}

int PtraceSession::Impl::read_mem(uintptr_t addr, void* buf, size_t len) const {
  if (mem_fd < 0) return -EIO;
  ssize_t n = pread(mem_fd, buf, len, static_cast<off_t>(addr));
  if (n < 0) return -errno;
  return static_cast<size_t>(n) == len ? 0 : -EIO;
}

int PtraceSession::Impl::write_mem(uintptr_t addr, const void* buf, size_t len) const {
  if (mem_fd < 0) return -EIO;
  ssize_t n = pwrite(mem_fd, buf, len, static_cast<off_t>(addr));
  if (n < 0) return -errno;
  return static_cast<size_t>(n) == len ? 0 : -EIO;
}

// Picks the thread to hold and seizes it. The main thread unless a stop would disturb it
// more than another thread (see stop_cost), it has exited or it is in `avoid`. -ENOENT
// when every live thread is in `avoid`.
int PtraceSession::Impl::seize(pid_t requested, std::span<const pid_t> avoid,
                               PtraceError* error) {
  if (requested <= 0)
    return fail(error, -ESRCH, strf("no process %d", static_cast<int>(requested)));
  ProcStatus status;
  int rc = status.read(requested);
  if (rc != 0) {
    return fail(error, -ESRCH,
                strf("no process %d (%s)", static_cast<int>(requested), errno_name(-rc).c_str()));
  }
  uint64_t tgid = 0;
  pid = status.number("Tgid", &tgid) ? static_cast<pid_t>(tgid) : 0;
  if (pid <= 0) pid = requested;
  if (pid == getpid()) {
    return fail(error, -EINVAL,
                strf("process %d is this process; it cannot trace itself", static_cast<int>(pid)));
  }
  if (status.field("Kthread") == "1") {
    return fail(error, -EPERM, strf("process %d is a kernel thread", static_cast<int>(pid)));
  }
  for (int attempt = 0; attempt < 3; ++attempt) {
    const char leader_state = thread_state(pid, pid);
    if (leader_state == 0) return fail(error, -ESRCH, strf("no process %d", static_cast<int>(pid)));
    pid_t best = 0;
    int best_cost = 4;
    bool any_live = false;
    bool stopped = false;
    auto consider = [&](pid_t t, char st) {
      if (thread_is_dead(st) || st == 0) return;
      any_live = true;
      if (st == 'T') stopped = true;
      if (std::find(avoid.begin(), avoid.end(), t) != avoid.end()) return;
      const int cost = stop_cost(st, thread_syscall(pid, t));
      if (cost < best_cost) {
        best_cost = cost;
        best = t;
      }
    };
    consider(pid, leader_state);
    if (best == 0 || best_cost > 1 || leader_state == 'T') {
      for (pid_t t : list_threads(pid)) {
        if (t != pid) consider(t, thread_state(pid, t));
      }
    }
    if (!any_live) {
      return fail(error, -ESRCH,
                  strf("process %d has exited: it is a zombie its parent has not reaped yet",
                       static_cast<int>(pid)));
    }
    if (stopped) {
      return fail(error, -EBUSY,
                  strf("process %d is stopped (job control, state T); it is not resumed for "
                       "an attach: send it SIGCONT first",
                       static_cast<int>(pid)));
    }
    if (best == 0) {
      return fail(error, -ENOENT,
                  strf("every thread of process %d was tried", static_cast<int>(pid)));
    }
    // PTRACE_O_TRACEEXEC: an exec must not pass unseen, since it replaces every address
    // we know (and, in another thread, the held thread itself).
    long r = ptrace_call(PTRACE_SEIZE, best, 0, uintptr_t{PTRACE_O_TRACEEXEC});
    if (r == 0) {
      tid = best;
      state = State::kSeized;
      return 0;
    }
    // The kernel refuses a thread that is exiting with EPERM, too.
    const bool exiting = thread_is_dead(thread_state(pid, best)) || thread_state(pid, best) == 0;
    if (r == -EPERM && !exiting) {
      return fail(error, -EPERM, explain_ptrace_refusal(gather_refusal(pid, best)));
    }
    if (r != -ESRCH && r != -EPERM) {
      return fail(
          error, static_cast<int>(r),
          strf("cannot attach to process %d: PTRACE_SEIZE of thread %d: %s", static_cast<int>(pid),
               static_cast<int>(best), errno_name(static_cast<int>(-r)).c_str()));
    }
    // That thread exited meanwhile; look again.
  }
  return fail(error, -ESRCH,
              strf("process %d exited, or its threads exit faster than we can attach",
                   static_cast<int>(pid)));
}

int PtraceSession::Impl::stop_and_save(PtraceError* error) {
  const Clock::time_point interrupt_time = Clock::now();
  const Clock::time_point deadline = interrupt_time + options.timeout;
  long r = ptrace_call(PTRACE_INTERRUPT, tid, 0, uintptr_t{0});
  for (;;) {
    if (r < 0) {
      state = State::kGone;
      return fail(error, -ESRCH,
                  strf("process %d exited while we attached", static_cast<int>(pid)));
    }
    Stop stop;
    int rc = wait_stop(tid, deadline, &stop);
    if (rc == -ETIMEDOUT) {
      state = State::kLost;
      if (own_thread && finish_addr != 0) {
        const uint32_t one = 1;
        (void)write_mem(finish_addr, &one, sizeof one);
      }
      return fail(error, -ETIMEDOUT,
                  strf("thread %d of process %d did not stop within %lld ms (uninterruptible "
                       "sleep, or a vfork parent waiting for its child); it was let go "
                       "without a signal",
                       static_cast<int>(tid), static_cast<int>(pid),
                       static_cast<long long>(options.timeout.count())));
    }
    if (rc != 0 || stop.kind == Stop::kExited) {
      state = State::kGone;
      return fail(error, -ESRCH,
                  strf("process %d exited while we attached", static_cast<int>(pid)));
    }
    if (stop.kind == Stop::kInterrupt) break;
    if (stop.kind == Stop::kGroupStop) {
      // Detaching puts it back into the group stop it is in; a thread of ours finishes
      // once the process is continued.
      if (own_thread && finish_addr != 0) {
        const uint32_t one = 1;
        (void)write_mem(finish_addr, &one, sizeof one);
      }
      ptrace_call(PTRACE_DETACH, tid, 0, uintptr_t{0});
      state = State::kDetached;
      return fail(error, -EBUSY,
                  strf("process %d is stopped (job control, %s); it is not resumed for an "
                       "attach: send it SIGCONT first",
                       static_cast<int>(pid), sig_name(stop.sig).c_str()));
    }
    // A signal on its way to the thread (a signal-delivery-stop takes the place of the
    // interrupt's stop): let it take its course, as it would have without us, and ask
    // again. Likewise after an exec, whose new image the symbols must be read from.
    if (stop.kind == Stop::kExec) exec_seen = true;
    const int pass = stop.kind == Stop::kSignal ? stop.sig : 0;
    r = ptrace_call(PTRACE_CONT, tid, 0, static_cast<uintptr_t>(pass));
    if (r == 0) r = ptrace_call(PTRACE_INTERRUPT, tid, 0, uintptr_t{0});
  }
  held_since = Clock::now();

  // Nothing of the thread changes before the first call: a failure lets it go as it is
  // (a thread of ours told to finish first).
  auto let_go = [&](int err) {
    if (own_thread && finish_addr != 0) {
      const uint32_t one = 1;
      (void)write_mem(finish_addr, &one, sizeof one);
    }
    state = ptrace_call(PTRACE_DETACH, tid, 0, uintptr_t{0}) == 0 ? State::kDetached : State::kGone;
    return err;
  };
  auto request_failed = [&](long g, const char* what) {
    fail(error, static_cast<int>(g),
         strf("%s of thread %d: %s", what, static_cast<int>(tid),
              errno_name(static_cast<int>(-g)).c_str()));
    return let_go(static_cast<int>(g));
  };
  if (long g = ptrace_call(PTRACE_GETREGS, tid, 0, &saved); g < 0) {
    return request_failed(g, "PTRACE_GETREGS");
  }
  if (saved.cs != kUserCs64) {
    return let_go(
        fail(error, -EINVAL,
             strf("thread %d of process %d runs 32-bit code (cs %#llx)", static_cast<int>(tid),
                  static_cast<int>(pid), static_cast<unsigned long long>(saved.cs))));
  }
  fpu.assign(kMaxXstate, 0);
  iovec iov{fpu.data(), fpu.size()};
  if (ptrace_call(PTRACE_GETREGSET, tid, NT_X86_XSTATE, &iov) == 0) {
    fpu.resize(iov.iov_len);
    fpu_is_xstate = true;
  } else {
    fpu.assign(kFxsaveSize, 0);
    if (long g = ptrace_call(PTRACE_GETFPREGS, tid, 0, fpu.data()); g < 0) {
      return request_failed(g, "PTRACE_GETFPREGS");
    }
  }
  if (long g = ptrace_call(PTRACE_GETSIGMASK, tid, sizeof saved_mask, &saved_mask); g < 0) {
    return request_failed(g, "PTRACE_GETSIGMASK");
  }
  // A thread stopped inside an rseq critical section must still be sent to its abort
  // handler when it runs again, but our calls return to user space outside the section,
  // and the kernel then clears rseq_cs. Putting the pointer back lets the kernel see the
  // preempted section at the final return.
  __ptrace_rseq_configuration rseq{};
  if (ptrace_call(PTRACE_GET_RSEQ_CONFIGURATION, tid, sizeof rseq, &rseq) > 0 &&
      rseq.rseq_abi_pointer != 0) {
    rseq_cs_addr = rseq.rseq_abi_pointer + 8;  // struct rseq: cpu_id_start, cpu_id, rseq_cs
    rseq_saved = read_mem(rseq_cs_addr, &saved_rseq_cs, sizeof saved_rseq_cs) == 0;
  }

  if (exec_seen) {
    if (int e = symbols->reload(); e != 0) {
      return let_go(fail(error, e,
                         strf("process %d executed a new program as we attached, and its "
                              "objects could not be read: %s",
                              static_cast<int>(pid), errno_name(-e).c_str())));
    }
  }
  state = State::kHeld;

  stopped_at.syscall = static_cast<long>(saved.orig_rax);
  stopped_at.result = static_cast<long>(saved.rax);
  if (stopped_at.syscall >= 0 && stopped_at.result == -EINTR && eintr_on_stop(stopped_at.syscall)) {
    uint8_t insn[2] = {0, 0};
    stopped_at.restart_instead_of_eintr =
        read_mem(saved.rip - 2, insn, sizeof insn) == 0 && insn[0] == 0x0f && insn[1] == 0x05;
  }
  scratch_top = (saved.rsp - kRedZone) & ~uintptr_t{15};
  scratch_limit = scratch_top - kMaxScratch;
  if (!own_thread) timings.to_stop = Clock::now() - interrupt_time;
  return 0;
}

// What the session knew of the thread it held, so that another can be held.
void PtraceSession::Impl::forget_thread() {
  saved = {};
  fpu.clear();
  fpu_is_xstate = false;
  call_fpu_ready = false;
  signals_blocked = false;
  exec_seen = false;
  saved_mask = 0;
  errno_saved = false;
  errno_addr = 0;
  saved_errno = 0;
  rseq_saved = false;
  rseq_cs_addr = 0;
  saved_rseq_cs = 0;
  stopped_at = {};
  scratch_top = 0;
  scratch_limit = 0;
  restart_block_at_risk = false;
  cloned.clear();
  own_thread = false;
  finish_addr = 0;
  call_return = 0;
}

int PtraceSession::Impl::hold_another(std::span<const pid_t> avoid, PtraceError* error) {
  if (state != State::kHeld && state != State::kIdle) {
    return fail(error, -EIO, "the session no longer holds a thread of the process");
  }
  if (own_thread) {
    return fail(error, -EINVAL, "the session holds a thread of its own, not one of the program");
  }
  if (state == State::kHeld) {
    // A thread that exited meanwhile needs no restoring; the process may live on.
    PtraceError ignored;
    (void)restore_and_detach(&ignored);
  }
  forget_thread();
  state = State::kIdle;
  const int rc = seize(pid, avoid, error);
  if (rc != 0) {
    // Idle when only `avoid` was left; else nothing more can be held.
    if (rc != -ENOENT) state = rc == -ESRCH ? State::kGone : State::kDetached;
    return rc;
  }
  return stop_and_save(error);
}

int PtraceSession::Impl::save_errno(PtraceError* error) {
  ResolvedSymbol sym;
  if (symbols == nullptr || (symbols->resolve("libc:__errno_location", &sym) != 0 &&
                             symbols->resolve("__errno_location", &sym) != 0)) {
    return fail(error, -ENOENT,
                strf("cannot save errno of thread %d: process %d has no __errno_location",
                     static_cast<int>(tid), static_cast<int>(pid)));
  }
  uint64_t addr = 0;
  int rc = raw_call(sym.addr, {}, &addr, error);
  if (rc != 0) return rc;
  int value = 0;
  if (int r = read_mem(addr, &value, sizeof value); r != 0) {
    return fail(error, r,
                strf("cannot read errno of thread %d at %#llx: %s", static_cast<int>(tid),
                     static_cast<unsigned long long>(addr), errno_name(-r).c_str()));
  }
  errno_addr = addr;
  saved_errno = value;
  errno_saved = true;
  return 0;
}

// One call in the held thread. The frame, on the thread's own stack:
//
//   saved rsp ->  | the program's stack                |
//                 | red zone, 128 bytes: untouched     |
//   scratch_top ->| strings from push_string, growing  |
//                 | down                               |
//                 | padding to 16                      |
//   frame + 8 --> +------------------------------------+  16-byte aligned: the call site
//                 | return address 0                   |
//   frame ------> +------------------------------------+  rsp at the function's entry
//
// The function returns to 0 and faults there: a SIGSEGV at ip 0 with rsp at frame + 8 is
// our return. orig_rax = -1 keeps the kernel's system call restart away from our
// registers; rax = 0 says no vector registers carry arguments (varargs).
int PtraceSession::Impl::raw_call(uintptr_t fn, std::span<const uint64_t> args, uint64_t* result,
                                  PtraceError* error) {
  if (state != State::kHeld) return fail(error, -EIO, "the session no longer holds the thread");
  if (args.size() > 6) return fail(error, -EINVAL, "a call takes at most 6 integer arguments");
  if (!signals_blocked) {
    // Nothing may be delivered into our calls; what arrives waits until detach. The
    // signals the kernel forces on a fault stay open: forcing a blocked one resets the
    // program's handler to SIG_DFL. We see those first anyway, as the tracer.
    uint64_t block = ~uint64_t{0};
    for (int s : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP, SIGSYS}) {
      block &= ~(uint64_t{1} << (s - 1));
    }
    if (long r = ptrace_call(PTRACE_SETSIGMASK, tid, sizeof block, &block); r < 0) {
      return fail(error, static_cast<int>(r),
                  strf("PTRACE_SETSIGMASK of thread %d: %s", static_cast<int>(tid),
                       errno_name(static_cast<int>(-r)).c_str()));
    }
    signals_blocked = true;
  }
  if (!call_fpu_ready) {
    // The ABI's state at a call: empty x87 stack, default control words. The thread may
    // have stopped in the middle of its own floating-point code.
    user_fpregs_struct f;
    std::memcpy(&f, fpu.data(), sizeof f);  // both images start with the FXSAVE area
    f.cwd = 0x37f;
    f.swd = 0;
    f.ftw = 0;
    f.mxcsr = 0x1f80;
    if (long r = ptrace_call(PTRACE_SETFPREGS, tid, 0, &f); r < 0) {
      return fail(error, static_cast<int>(r),
                  strf("PTRACE_SETFPREGS of thread %d: %s", static_cast<int>(tid),
                       errno_name(static_cast<int>(-r)).c_str()));
    }
    call_fpu_ready = true;
  }
  const uintptr_t frame = (scratch_top & ~uintptr_t{15}) - 8;
  const uint64_t zero = 0;
  if (int r = write_mem(frame, &zero, sizeof zero); r != 0) {
    return fail(
        error, r,
        strf("cannot write a call frame on thread %d's stack at %#llx: %s", static_cast<int>(tid),
             static_cast<unsigned long long>(frame), errno_name(-r).c_str()));
  }
  user_regs_struct regs = saved;
  regs.rip = fn;
  regs.rsp = frame;
  regs.rax = 0;
  regs.orig_rax = ~0ULL;
  regs.eflags &= ~(kFlagTf | kFlagDf);
  unsigned long long* arg_regs[6] = {&regs.rdi, &regs.rsi, &regs.rdx,
                                     &regs.rcx, &regs.r8,  &regs.r9};
  for (size_t i = 0; i < args.size(); ++i) *arg_regs[i] = args[i];
  if (long r = ptrace_call(PTRACE_SETREGS, tid, 0, &regs); r < 0) {
    return fail(error, static_cast<int>(r),
                strf("PTRACE_SETREGS of thread %d: %s", static_cast<int>(tid),
                     errno_name(static_cast<int>(-r)).c_str()));
  }
  const Clock::time_point deadline = Clock::now() + options.timeout;
  long r = ptrace_call(PTRACE_CONT, tid, 0, uintptr_t{0});
  for (;;) {
    if (r < 0) {
      state = State::kGone;
      return fail(error, -ESRCH, strf("process %d exited during a call", static_cast<int>(pid)));
    }
    Stop stop;
    int rc = wait_stop(tid, deadline, &stop);
    if (rc == -ETIMEDOUT) return abandon_call(fn, frame, error);
    if (rc != 0 || stop.kind == Stop::kExited) {
      if (took_over_by_exec(deadline)) return exec_during_call(error);
      state = State::kGone;
      return fail(error, -ESRCH,
                  strf("process %d exited during a call to %s", static_cast<int>(pid),
                       code_name(fn).c_str()));
    }
    if (stop.kind == Stop::kExec) return exec_during_call(error);
    if (stop.kind == Stop::kSignal) {
      user_regs_struct now{};
      if (long g = ptrace_call(PTRACE_GETREGS, tid, 0, &now); g < 0) {
        state = State::kGone;
        return fail(error, -ESRCH, strf("process %d exited during a call", static_cast<int>(pid)));
      }
      if (stop.sig == SIGSEGV && now.rip == 0 && now.rsp == frame + 8) {
        *result = now.rax;
        return 0;  // the SIGSEGV is never delivered: the next resume passes no signal
      }
      siginfo_t si{};
      ptrace_call(PTRACE_GETSIGINFO, tid, 0, &si);
      if (si.si_code <= 0) {
        // Sent by someone (kill, tgkill, sigqueue), not raised by our call.
        held_signals.push_back(si);
        restart_block_at_risk = true;
        r = ptrace_call(PTRACE_CONT, tid, 0, uintptr_t{0});
        continue;
      }
      return fail(
          error, -EFAULT,
          strf("the call to %s in thread %d faulted: %s (si_code %d) at ip %#llx, "
               "address %#llx; its registers were dropped, what it changed in memory "
               "stays",
               code_name(fn).c_str(), static_cast<int>(tid),
               sig_name(stop.sig).c_str(), si.si_code, static_cast<unsigned long long>(now.rip),
               static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(si.si_addr))));
    }
    if (stop.kind == Stop::kEvent && stop.event == PTRACE_EVENT_CLONE) {
      // The call started a thread (start_thread traces clones): ours from its first
      // instruction, stopped until we let it run.
      unsigned long born = 0;
      if (ptrace_call(PTRACE_GETEVENTMSG, tid, 0, &born) == 0 && born > 0) {
        cloned.push_back(static_cast<pid_t>(born));
      }
      r = ptrace_call(PTRACE_CONT, tid, 0, uintptr_t{0});
      continue;
    }
    // A group stop (SIGSTOP to another thread) or a stray trap: our call goes on; detach
    // puts the thread back into a group stop that is still in effect.
    restart_block_at_risk = true;
    r = ptrace_call(PTRACE_CONT, tid, 0, uintptr_t{0});
  }
}

// A call on a thread of ours that did not return in time: not stopped midway (what it
// took, a lock, would stay taken), but let go to run to its end. Its return address is
// changed to call_return, where our routine ends the thread.
int PtraceSession::Impl::let_own_call_finish(uintptr_t fn, uintptr_t frame, PtraceError* error) {
  const long long ms = static_cast<long long>(options.timeout.count());
  (void)write_mem(frame, &call_return, sizeof call_return);
  if (finish_addr != 0) {
    const uint32_t one = 1;
    (void)write_mem(finish_addr, &one, sizeof one);
  }
  const std::string message =
      strf("the call to %s in thread %d did not return within %lld ms; the thread is ours "
           "and was let go to finish the call: it ends when the call returns",
           code_name(fn).c_str(), static_cast<int>(tid), ms);
  Stop stop;
  const Clock::time_point deadline = Clock::now() + options.timeout;
  const int rc = ptrace_call(PTRACE_INTERRUPT, tid, 0, uintptr_t{0}) == 0
                     ? wait_stop(tid, deadline, &stop)
                     : -ESRCH;
  if (rc == -ETIMEDOUT) {
    state = State::kLost;  // the tracer thread's end lets it go
    return fail(error, -ETIMEDOUT, message);
  }
  if (rc != 0 || stop.kind == Stop::kExited) {
    state = State::kGone;
    return fail(error, -ESRCH, strf("process %d exited during a call", static_cast<int>(pid)));
  }
  if (stop.kind == Stop::kExec) return exec_during_call(error);
  int pass = 0;
  if (stop.kind == Stop::kSignal) {
    user_regs_struct now{};
    if (stop.sig == SIGSEGV && ptrace_call(PTRACE_GETREGS, tid, 0, &now) == 0 && now.rip == 0 &&
        now.rsp == frame + 8) {
      // It returned just now, to 0: on to call_return instead.
      now.rip = call_return;
      ptrace_call(PTRACE_SETREGS, tid, 0, &now);
    } else {
      pass = stop.sig;  // not ours to keep
    }
  }
  ptrace_call(PTRACE_DETACH, tid, 0, static_cast<uintptr_t>(pass));
  state = State::kDetached;
  release_held_signals();
  return fail(error, -ETIMEDOUT, message);
}

int PtraceSession::Impl::abandon_call(uintptr_t fn, uintptr_t frame, PtraceError* error) {
  if (own_thread && call_return != 0) return let_own_call_finish(fn, frame, error);
  const long long ms = static_cast<long long>(options.timeout.count());
  const Clock::time_point deadline = Clock::now() + options.timeout;
  restart_block_at_risk = true;
  Stop stop;
  int rc = ptrace_call(PTRACE_INTERRUPT, tid, 0, uintptr_t{0}) == 0
               ? wait_stop(tid, deadline, &stop)
               : -ESRCH;
  if (rc != -ETIMEDOUT) {
    if (rc != 0 || stop.kind == Stop::kExited) {
      if (took_over_by_exec(deadline)) return exec_during_call(error);
      state = State::kGone;
      return fail(error, -ESRCH, strf("process %d exited during a call", static_cast<int>(pid)));
    }
    if (stop.kind == Stop::kExec) return exec_during_call(error);
    if (stop.kind == Stop::kSignal) {
      siginfo_t si{};
      ptrace_call(PTRACE_GETSIGINFO, tid, 0, &si);
      if (si.si_code <= 0) held_signals.push_back(si);
    }
    user_regs_struct now{};
    const std::string where = ptrace_call(PTRACE_GETREGS, tid, 0, &now) == 0
                                  ? ", in " + code_name(static_cast<uintptr_t>(now.rip))
                                  : std::string();
    return fail(error, -ETIMEDOUT,
                strf("the call to %s in thread %d did not return within %lld ms; it was "
                     "stopped and abandoned midway%s, and what it changed in memory stays (a "
                     "lock it took, for one)",
                     code_name(fn).c_str(), static_cast<int>(tid), ms, where.c_str()));
  }
  state = State::kLost;
  return fail(error, -ETIMEDOUT,
              strf("the call to %s in thread %d did not return within %lld ms and the "
                   "thread did not stop either; it was let go and will fault at ip 0 when "
                   "the call returns",
                   code_name(fn).c_str(), static_cast<int>(tid), ms));
}

// The process executed a new program in a call: by the call itself, or by another thread,
// which then took the held thread's place. Nothing of the old thread is left to restore
// but the signal mask, which exec keeps and the new program should not get from us.
int PtraceSession::Impl::exec_during_call(PtraceError* error) {
  // A thread of ours runs with every signal blocked: the new image gets the mask of the
  // program's thread that started it.
  if (own_thread) {
    ptrace_call(PTRACE_SETSIGMASK, tid, sizeof program_mask, &program_mask);
  } else if (signals_blocked) {
    ptrace_call(PTRACE_SETSIGMASK, tid, sizeof saved_mask, &saved_mask);
  }
  ptrace_call(PTRACE_DETACH, tid, 0, uintptr_t{0});
  state = State::kGone;
  if (!own_thread) timings.held += Clock::now() - held_since;
  release_held_signals();
  return fail(error, -ESRCH,
              strf("process %d executed a new program during a call; it was let go in its "
                   "new image",
                   static_cast<int>(pid)));
}

int PtraceSession::Impl::restore_and_detach(PtraceError* error) {
  int first = 0;
  auto note = [&](long r, const char* what) {
    if (r < 0 && first == 0) {
      first = fail(error, static_cast<int>(r),
                   strf("restoring thread %d of process %d: %s: %s", static_cast<int>(tid),
                        static_cast<int>(pid), what, errno_name(static_cast<int>(-r)).c_str()));
    }
  };
  if (own_thread && finish_addr != 0) {
    const uint32_t one = 1;
    note(write_mem(finish_addr, &one, sizeof one), "the word that ends the thread");
  }
  if (errno_saved) note(write_mem(errno_addr, &saved_errno, sizeof saved_errno), "errno");
  if (rseq_saved) note(write_mem(rseq_cs_addr, &saved_rseq_cs, sizeof saved_rseq_cs), "rseq_cs");
  if (fpu_is_xstate) {
    iovec iov{fpu.data(), fpu.size()};
    note(ptrace_call(PTRACE_SETREGSET, tid, NT_X86_XSTATE, &iov), "PTRACE_SETREGSET NT_X86_XSTATE");
  } else {
    note(ptrace_call(PTRACE_SETFPREGS, tid, 0, fpu.data()), "PTRACE_SETFPREGS");
  }
  user_regs_struct regs = saved;
  // Restarting the thread's own system call from its arguments, in place of
  // restart_syscall, where the restart block may be another's: the same call, only a
  // relative timeout starts over.
  const bool own_block_lost = restart_block_at_risk && stopped_at.syscall >= 0 &&
                              stopped_at.result == -kErestartRestartBlock;
  if (stopped_at.restart_instead_of_eintr || own_block_lost) {
    regs.rax = static_cast<unsigned long long>(-kErestartNoHand);
  }
  note(ptrace_call(PTRACE_SETREGS, tid, 0, &regs), "PTRACE_SETREGS");
  // PTRACE_GETSIGMASK gave the program's own mask where a call like sigsuspend, ppoll or
  // epoll_pwait had put a temporary one in place. Setting it ends that call's claim to
  // restore it (TIF_RESTORE_SIGMASK), which is right because the call restarts and puts
  // its temporary mask in place again. Untouched when no call was made.
  if (signals_blocked) {
    note(ptrace_call(PTRACE_SETSIGMASK, tid, sizeof saved_mask, &saved_mask), "PTRACE_SETSIGMASK");
  }
  if (own_thread) {
    // Ours: it runs on to its end, where we see it go.
    if (ptrace_call(PTRACE_CONT, tid, 0, uintptr_t{0}) < 0) {
      state = State::kGone;
      return first;
    }
    (void)wait_own_end();
    release_held_signals();
    return first;
  }
  long d = ptrace_call(PTRACE_DETACH, tid, 0, uintptr_t{0});
  timings.held += Clock::now() - held_since;
  if (d < 0) {
    state = State::kGone;
    note(d, "PTRACE_DETACH");
    return first;
  }
  state = State::kDetached;
  release_held_signals();
  return first;
}

// The held thread, not the process's leader, is gone from waitpid's view: it may have
// executed a new program, which takes the leader's thread id (ptrace(2), "execve(2) under
// ptrace"). Then the leader's id reports the exec, and is the held thread from now on.
bool PtraceSession::Impl::took_over_by_exec(Clock::time_point deadline) {
  if (tid == pid) return false;
  Stop stop;
  if (wait_stop(pid, std::max(deadline, Clock::now() + std::chrono::milliseconds(100)),
                &stop) != 0 ||
      stop.kind != Stop::kExec) {
    return false;
  }
  tid = pid;
  return true;
}

// A thread of ours, resumed after its finish word was set: follows it until it has
// ended (its routine unmaps its pages and returns), within the timeout. Signals on their
// way to it are passed on; a process stopped by job control keeps it until continued.
int PtraceSession::Impl::wait_own_end() {
  const Clock::time_point deadline = Clock::now() + options.timeout;
  for (;;) {
    Stop stop;
    const int rc = wait_stop(tid, deadline, &stop);
    if (rc == -ETIMEDOUT) {
      state = State::kLost;  // the tracer thread's end lets it go on to its end
      return rc;
    }
    if (rc != 0 || stop.kind == Stop::kExited) {
      state = State::kDetached;
      return 0;
    }
    if (stop.kind == Stop::kExec || stop.kind == Stop::kGroupStop) {
      ptrace_call(PTRACE_DETACH, tid, 0, uintptr_t{0});
      state = stop.kind == Stop::kExec ? State::kGone : State::kDetached;
      return 0;
    }
    const int pass = stop.kind == Stop::kSignal ? stop.sig : 0;
    if (ptrace_call(PTRACE_CONT, tid, 0, static_cast<uintptr_t>(pass)) < 0) {
      state = State::kDetached;
      return 0;
    }
  }
}

// Lets a thread of ours go without holding it: told to finish, then detached from a stop
// (interrupted first unless `known_stopped`), or, if it does not stop in time, by the
// tracer thread's end. It ends by itself.
void PtraceSession::Impl::let_go_own(bool known_stopped) {
  if (finish_addr != 0) {
    const uint32_t one = 1;
    (void)write_mem(finish_addr, &one, sizeof one);
  }
  int pass = 0;
  if (!known_stopped) {
    Stop stop;
    const Clock::time_point deadline = Clock::now() + options.timeout;
    const int rc = ptrace_call(PTRACE_INTERRUPT, tid, 0, uintptr_t{0}) == 0
                       ? wait_stop(tid, deadline, &stop)
                       : -ESRCH;
    if (rc == -ETIMEDOUT) {
      state = State::kLost;
      return;
    }
    if (rc != 0 || stop.kind == Stop::kExited) {
      state = State::kGone;
      return;
    }
    if (stop.kind == Stop::kSignal) pass = stop.sig;  // not ours to keep
  }
  ptrace_call(PTRACE_DETACH, tid, 0, static_cast<uintptr_t>(pass));
  state = State::kDetached;
}

// A thread the held thread's call started although the call failed: told to finish
// before it ran a single instruction of its routine, and let go from its first stop.
void PtraceSession::Impl::let_go_newborn(pid_t born, uintptr_t finish) {
  const uint32_t one = 1;
  (void)write_mem(finish, &one, sizeof one);
  Stop stop;
  const int rc = wait_stop(born, Clock::now() + options.timeout, &stop);
  if (rc != 0 || stop.kind == Stop::kExited) return;  // gone, or the tracer thread's end
  const int pass = stop.kind == Stop::kSignal ? stop.sig : 0;
  ptrace_call(PTRACE_DETACH, born, 0, static_cast<uintptr_t>(pass));
}

// The new thread runs its routine, traced, until it reports (the word at `report` is not
// 0). Its stops meanwhile: its first (it starts stopped), signals (passed on), a job
// control stop of the process (it stays stopped, PTRACE_LISTEN). On any failure it is let
// go, told to finish.
int PtraceSession::Impl::run_own_until(uintptr_t report, PtraceError* error) {
  const Clock::time_point deadline = Clock::now() + options.timeout;
  bool options_set = false;
  bool in_stop = false;
  Backoff backoff;
  for (;;) {
    Stop stop;
    const int r = check_stop(tid, &stop);
    if (r < 0 || (r > 0 && stop.kind == Stop::kExited)) {
      if (took_over_by_exec(deadline)) return exec_during_call(error);
      state = State::kGone;
      return fail(error, -ESRCH,
                  strf("the thread we started in process %d ended before it reported (the "
                       "process exited, or executed a new program)",
                       static_cast<int>(pid)));
    }
    if (r > 0) {
      in_stop = true;
      if (!options_set) {
        // It inherited the held thread's options; its own calls start no thread of ours.
        ptrace_call(PTRACE_SETOPTIONS, tid, 0, uintptr_t{PTRACE_O_TRACEEXEC});
        options_set = true;
      }
      long c = 0;
      if (stop.kind == Stop::kExec) {
        return exec_during_call(error);
      } else if (stop.kind == Stop::kGroupStop) {
        c = ptrace_call(PTRACE_LISTEN, tid, 0, uintptr_t{0});
      } else {
        const int pass = stop.kind == Stop::kSignal ? stop.sig : 0;
        c = ptrace_call(PTRACE_CONT, tid, 0, static_cast<uintptr_t>(pass));
      }
      if (c < 0) {
        state = State::kGone;
        return fail(error, -ESRCH, strf("process %d exited", static_cast<int>(pid)));
      }
      in_stop = false;
      continue;
    }
    uint64_t word = 0;
    if (read_mem(report, &word, sizeof word) == 0 && word != 0) return 0;
    if (Clock::now() >= deadline) {
      let_go_own(in_stop);
      return fail(error, -ETIMEDOUT,
                  strf("the thread we started in process %d did not report within %lld ms; "
                       "it was let go to finish by itself",
                       static_cast<int>(pid), static_cast<long long>(options.timeout.count())));
    }
    backoff.pause(deadline);
  }
}

int PtraceSession::Impl::start_thread(const ThreadStart& start, PtraceError* error) {
  const uintptr_t finish = start.finish_word;
  if (state != State::kHeld) return fail(error, -EIO, "the session no longer holds the thread");
  if (own_thread) {
    return fail(error, -EINVAL, "the session holds a thread of its own already");
  }
  if (!errno_saved) {
    if (int rc = save_errno(error); rc != 0) return rc;
  }
  // create's first argument: where it stores the new thread's handle, below the strings.
  if (scratch_top - 16 < scratch_limit) {
    return fail(error, -E2BIG,
                strf("scratch space on thread %d's stack is limited to %zu bytes",
                     static_cast<int>(tid), static_cast<size_t>(kMaxScratch)));
  }
  scratch_top = (scratch_top - 16) & ~uintptr_t{15};
  const uintptr_t slot = scratch_top;
  const uintptr_t clone_options = PTRACE_O_TRACEEXEC | PTRACE_O_TRACECLONE;
  if (long o = ptrace_call(PTRACE_SETOPTIONS, tid, 0, clone_options); o < 0) {
    return fail(error, static_cast<int>(o),
                strf("PTRACE_SETOPTIONS of thread %d: %s", static_cast<int>(tid),
                     errno_name(static_cast<int>(-o)).c_str()));
  }
  cloned.clear();
  started = 0;
  uint64_t result = 0;
  const uint64_t args[4] = {slot, 0, start.routine, start.arg};
  const int rc = raw_call(start.create, args, &result, error);
  if (state == State::kHeld) {
    ptrace_call(PTRACE_SETOPTIONS, tid, 0, uintptr_t{PTRACE_O_TRACEEXEC});
  }
  const pid_t born = cloned.empty() ? 0 : cloned.front();
  started = born;
  if (rc != 0) {
    if (born != 0) let_go_newborn(born, finish);
    return rc;
  }
  const int create_err = static_cast<int32_t>(static_cast<uint32_t>(result));
  if (create_err != 0 || born == 0) {
    if (born != 0) let_go_newborn(born, finish);
    if (create_err == 0) {
      return fail(error, -EIO,
                  strf("the call to %s in thread %d returned 0 but started no thread",
                       code_name(start.create).c_str(), static_cast<int>(tid)));
    }
    return fail(error, -std::abs(create_err),
                strf("thread %d of process %d could not start a thread: %s",
                     static_cast<int>(tid), static_cast<int>(pid),
                     errno_name(std::abs(create_err)).c_str()));
  }
  // The program's thread goes back now: this was all it did for us.
  const pid_t program_thread = tid;
  program_mask = saved_mask;
  PtraceError give_back;
  const int back = restore_and_detach(&give_back);
  forget_thread();
  tid = born;
  own_thread = true;
  finish_addr = finish;
  call_return = start.call_return;
  state = State::kSeized;
  if (back != 0) {
    let_go_newborn(born, finish);
    state = State::kDetached;
    return fail(error, back,
                strf("thread %d started thread %d, but %s", static_cast<int>(program_thread),
                     static_cast<int>(born), give_back.message.c_str()));
  }
  if (int r = run_own_until(start.report_word, error); r != 0) return r;
  return stop_and_save(error);
}

// Sends again the signals our calls kept from the thread. The sender becomes us.
void PtraceSession::Impl::release_held_signals() {
  for (siginfo_t& si : held_signals) {
    if (si.si_code == SI_USER) {
      kill(pid, si.si_signo);
    } else if (si.si_code == SI_TKILL) {
      syscall(SYS_tgkill, pid, tid, si.si_signo);
    } else {
      syscall(SYS_rt_tgsigqueueinfo, pid, tid, si.si_signo, &si);
    }
  }
  held_signals.clear();
}

PtraceSession::PtraceSession(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PtraceSession::~PtraceSession() {
  if (impl_->state == Impl::State::kHeld) {
    PtraceError ignored;
    (void)detach(&ignored);
  }
}

std::unique_ptr<PtraceSession> PtraceSession::attach(pid_t pid, const PtraceOptions& options,
                                                     PtraceError* error) {
  PtraceError local;
  if (error == nullptr) error = &local;
  // Threads seized that ended before they stopped: a thread on its way out (an agent's
  // control thread just after a detach) is seized like any other, and its end is not the
  // process's. The process living on, another thread is taken, a few times.
  std::vector<pid_t> ended;
  for (int attempt = 0;; ++attempt) {
    *error = PtraceError{};
    auto impl = std::make_unique<Impl>(options);
    Impl* s = impl.get();
    if (s->on_tracer([&] { return s->seize(pid, ended, error); }, error) != 0) return nullptr;

    // While the thread still runs: what the calls need, read ahead. Through the held
    // thread's own /proc entries: those of a main thread that has exited show no memory.
    const std::string mem = proc_path(s->tid, 0, "mem");
    s->mem_fd = open(mem.c_str(), O_RDWR | O_CLOEXEC);
    if (s->mem_fd < 0) {
      int err = -errno;
      fail(error, err, strf("cannot open %s: %s", mem.c_str(), errno_name(-err).c_str()));
      return nullptr;  // the tracer thread's end lets the seized thread go
    }
    int err = 0;
    s->symbols = ProcessSymbols::load(s->tid, &err);
    if (s->symbols == nullptr) {
      fail(error, err,
           strf("cannot read the objects of process %d: %s", static_cast<int>(s->pid),
                errno_name(-err).c_str()));
      return nullptr;
    }

    // On failure the thread is let go as it was (nothing of it changed yet), or has exited.
    if (s->on_tracer([&] { return s->stop_and_save(error); }, error) == 0)
      return std::unique_ptr<PtraceSession>(new PtraceSession(std::move(impl)));
    const char leader = thread_state(s->pid, s->pid);
    if (s->state != Impl::State::kGone || s->tid == s->pid || attempt >= 3 || leader == 0 ||
        thread_is_dead(leader))
      return nullptr;
    ended.push_back(s->tid);
  }
}

int PtraceSession::hold_another(std::span<const pid_t> avoid, PtraceError* error) {
  PtraceError local;
  if (error == nullptr) error = &local;
  Impl* s = impl_.get();
  return s->on_tracer([&] { return s->hold_another(avoid, error); }, error);
}

int PtraceSession::start_thread(const ThreadStart& start, PtraceError* error) {
  PtraceError local;
  if (error == nullptr) error = &local;
  Impl* s = impl_.get();
  return s->on_tracer([&] { return s->start_thread(start, error); }, error);
}

pid_t PtraceSession::pid() const { return impl_->pid; }
pid_t PtraceSession::tid() const { return impl_->tid; }
const StoppedAt& PtraceSession::stopped_at() const { return impl_->stopped_at; }
const user_regs_struct& PtraceSession::registers() const { return impl_->saved; }
PtraceTimings PtraceSession::timings() const { return impl_->timings; }
bool PtraceSession::holds_own_thread() const {
  return impl_->own_thread && impl_->state == Impl::State::kHeld;
}
pid_t PtraceSession::started_thread() const { return impl_->started; }
ProcessSymbols& PtraceSession::symbols() { return *impl_->symbols; }
void PtraceSession::set_timeout(std::chrono::milliseconds timeout) {
  impl_->options.timeout = timeout;
}
std::chrono::milliseconds PtraceSession::timeout() const { return impl_->options.timeout; }

int PtraceSession::call(uintptr_t fn, std::span<const uint64_t> args, uint64_t* result,
                        PtraceError* error) {
  PtraceError local;
  if (error == nullptr) error = &local;
  Impl* s = impl_.get();
  return s->on_tracer(
      [&] {
        if (s->state != Impl::State::kHeld) {
          return fail(error, -EIO, "the session no longer holds a thread of the process");
        }
        // A thread of ours has no errno the program could see.
        if (!s->errno_saved && !s->own_thread) {
          if (int rc = s->save_errno(error); rc != 0) return rc;
        }
        return s->raw_call(fn, args, result, error);
      },
      error);
}

int PtraceSession::push_string(std::string_view str, uintptr_t* addr, PtraceError* error) {
  Impl* s = impl_.get();
  if (s->state != Impl::State::kHeld) {
    return fail(error, -EIO, "the session no longer holds a thread of the process");
  }
  if (str.size() + 1 + 64 > s->scratch_top - s->scratch_limit) {
    return fail(error, -E2BIG,
                strf("scratch space on thread %d's stack is limited to %zu bytes",
                     static_cast<int>(s->tid), static_cast<size_t>(kMaxScratch)));
  }
  const uintptr_t at = (s->scratch_top - str.size() - 1) & ~uintptr_t{15};
  std::string copy(str);
  if (int r = s->write_mem(at, copy.c_str(), copy.size() + 1); r != 0) {
    return fail(error, r,
                strf("cannot write to thread %d's stack at %#llx: %s", static_cast<int>(s->tid),
                     static_cast<unsigned long long>(at), errno_name(-r).c_str()));
  }
  s->scratch_top = at;
  *addr = at;
  return 0;
}

int PtraceSession::read_memory(uintptr_t addr, void* buf, size_t len) const {
  return impl_->read_mem(addr, buf, len);
}

int PtraceSession::write_memory(uintptr_t addr, const void* buf, size_t len) const {
  return impl_->write_mem(addr, buf, len);
}

int PtraceSession::read_string(uintptr_t addr, size_t max, std::string* out) const {
  out->clear();
  // Page by page: the string may end just before an unmapped page.
  constexpr uintptr_t kPage = 4096;
  while (out->size() < max) {
    char buf[kPage];
    size_t len = std::min<size_t>(kPage - (addr % kPage), max - out->size());
    if (int r = impl_->read_mem(addr, buf, len); r != 0) return r;
    const void* nul = std::memchr(buf, '\0', len);
    if (nul != nullptr) {
      out->append(buf, static_cast<const char*>(nul) - buf);
      return 0;
    }
    out->append(buf, len);
    addr += len;
  }
  return 0;
}

int PtraceSession::detach(PtraceError* error) {
  PtraceError local;
  if (error == nullptr) error = &local;
  Impl* s = impl_.get();
  if (s->state == Impl::State::kDetached || s->state == Impl::State::kIdle) {
    s->tracer.stop();
    return 0;
  }
  if (s->state != Impl::State::kHeld) {
    s->tracer.stop();
    if (s->state == Impl::State::kGone) {
      return fail(error, -ESRCH, strf("process %d exited", static_cast<int>(s->pid)));
    }
    return fail(error, -ETIMEDOUT,
                strf("thread %d of process %d was let go when it did not stop in time",
                     static_cast<int>(s->tid), static_cast<int>(s->pid)));
  }
  int rc = s->on_tracer([&] { return s->restore_and_detach(error); }, error);
  s->tracer.stop();
  return rc;
}

}  // namespace probefs::tracee
