#include "arch/x86_64/thread_fixup.h"

#include "arch/self_memory.h"
#include "arch/signals.h"
#include "arch/syscall.h"
#include "arch/testing.h"
#include "arch/x86_64/foreign_signals.h"
#include "arch/x86_64/site.h"

#include <dirent.h>
#include <linux/futex.h>
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace probefs::arch::x86_64 {
namespace {

// One park at a time (the caller serializes). The handler reads these. The moves are
// copied into storage that is never freed, so a handler that runs late reads valid memory;
// they are sorted by `from` so that a handler finds its ip by bisection.
constexpr size_t kMaxMoves = 1 << 15;
IpMove g_move_storage[kMaxMoves];
std::atomic<const IpMove*> g_moves{nullptr};
std::atomic<size_t> g_nmoves{0};
std::atomic<int> g_generation{0};
std::atomic<int> g_acks{0};
std::atomic<int> g_busy{0};  // threads that were in the trap path: the batch must wait
constexpr size_t kMaxHazards = 1 << 12;
CodeRange g_hazard_storage[kMaxHazards];  // sorted by start
std::atomic<size_t> g_nhazards{0};
// The last generation released. Parked handlers sleep on it (a futex word).
std::atomic<int> g_released{0};
static_assert(sizeof(std::atomic<int>) == sizeof(int));

long raw_futex(std::atomic<int>* word, int op, int val) {
  return raw_syscall(__NR_futex, reinterpret_cast<long>(word), op, val, 0 /* no timeout */);
}

// Quiet sleepers (sleep_quietly_until). A window and a sleeper agree as Dekker's two
// threads do, each storing its word and then loading the other's (sequentially
// consistent): the window sets g_window and then reads a sleeper's state; the sleeper,
// woken, says it leaves and then reads g_window. A window that saw kAsleep is one the
// sleeper sees open, and it sleeps again, in our code, until the window closes.
std::atomic<int> g_window{0};  // 1 while a park is in force (a futex word)
// The process whose park it is: a child forked meanwhile (a raw clone, without the
// engine's fork handlers) has none in force.
std::atomic<long> g_window_pid{0};
enum SleeperState : int { kFree = 0, kAsleep = 1, kLeaving = 2 };
struct QuietSleeper {
  std::atomic<long> tid{0};  // 0: a free slot
  std::atomic<long> pid{0};  // the process that claimed it (a fork child's slots are stale)
  std::atomic<int> state{kFree};
};
constexpr int kMaxQuietSleepers = 4;
QuietSleeper g_sleepers[kMaxQuietSleepers];

bool asleep_quietly(long tid) {
  const long pid = self_memory_pid();
  for (QuietSleeper& q : g_sleepers)
    if (q.tid.load() == tid && q.pid.load() == pid) return q.state.load() == kAsleep;
  return false;
}

void open_window() {
  g_window_pid.store(self_memory_pid());
  g_window.store(1);
}

bool window_open() { return g_window.load() != 0 && g_window_pid.load() == self_memory_pid(); }

void close_window() {
  g_window.store(0);
  raw_futex(&g_window, FUTEX_WAKE_PRIVATE, 0x7fffffff);
}

// Reads this process's memory without faulting (this also runs inside the fixup signal
// handler). Returns the bytes read.
size_t safe_read(uintptr_t addr, void* buf, size_t n) {
  const long ret = read_self_memory(self_memory_pid(), addr, buf, n);
  return ret > 0 ? static_cast<size_t>(ret) : 0;
}

const IpMove* find_move(const IpMove* moves, size_t n, uintptr_t pc);
bool in_hazard(const CodeRange* hazards, size_t n, uintptr_t pc);
bool listed(const IpMove* moves, size_t n, uintptr_t pc);

// Does a signal frame on the stack above `sp` hold a context that will resume on one of
// the listed addresses? A thread interrupted on the region and parked in a signal handler
// (its own, or one it blocks in) resumes there when the handler returns, so the region
// must not change under it. Frames are found by their first word, the restorer; a stray
// word of that value can only make us wait, never move anything. Reads the stack in
// chunks of `chunk` words through `words` (small in a signal handler, large elsewhere: one
// system call per chunk).
bool frames_resume_on(uintptr_t sp, const IpMove* moves, size_t n, size_t nhazards,
                      uintptr_t* words, size_t chunk) {
  const uintptr_t restorer = arch::signal_restorer();
  if (!restorer || (n == 0 && nhazards == 0)) return false;
  constexpr size_t kScan = 64 * 1024;
  constexpr size_t kRipOffset = 8 + offsetof(ucontext_t, uc_mcontext.gregs) + REG_RIP * 8;
  for (uintptr_t at = sp & ~uintptr_t{7}; at < sp + kScan; at += chunk * 8) {
    const size_t got = safe_read(at, words, chunk * 8) / 8;
    for (size_t i = 0; i < got; ++i) {
      if (words[i] != restorer) continue;
      uintptr_t rip = 0;
      // rip - 1: a trap on an int3 there whose handler has not run yet (the kernel built
      // the SIGTRAP frame, and ours interrupted the handler's first instruction); with its
      // probe gone, the handler resumes on that address.
      if (safe_read(at + i * 8 + kRipOffset, &rip, 8) == 8 &&
          (listed(moves, n, rip) || listed(moves, n, rip - 1) ||
           in_hazard(g_hazard_storage, nhazards, rip)))
        return true;
    }
    if (got < chunk) return false;  // the end of the stack's mapping
  }
  return false;
}

// Is pc in one of the hazards (sorted by start, never overlapping)?
bool in_hazard(const CodeRange* hazards, size_t n, uintptr_t pc) {
  size_t lo = 0, hi = n;
  while (lo < hi) {  // the first range that starts after pc
    const size_t mid = lo + (hi - lo) / 2;
    if (hazards[mid].start <= pc) lo = mid + 1;
    else hi = mid;
  }
  return lo > 0 && pc < hazards[lo - 1].end;
}

const IpMove* find_move(const IpMove* moves, size_t n, uintptr_t pc) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (moves[mid].from < pc) lo = mid + 1;
    else hi = mid;
  }
  return lo < n && moves[lo].from == pc ? &moves[lo] : nullptr;
}

// The upper half of the value our fixup signals carry (the lower half is the generation),
// so that a program's own signal of this number is told from ours and passed on.
constexpr uint64_t kFixupMagic = 0x70665846;  // "FXfp"

// Runs in the parked thread: no library call (the library may be what is being patched).
void on_fixup_signal(int sig, siginfo_t* info, void* ucv) {
  const auto value = reinterpret_cast<uint64_t>(info->si_value.sival_ptr);
  if (info->si_code != SI_QUEUE || value >> 32 != kFixupMagic ||
      info->si_pid != self_pid()) {
    x86_64::pass_on_foreign(sig, info, ucv);
    return;
  }
  // A signal of an older batch that was blocked until now: the batch is over.
  const int generation = static_cast<int>(static_cast<uint32_t>(value));
  if (generation != g_generation.load()) return;
  auto* uc = static_cast<ucontext_t*>(ucv);
  const auto ip = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
  const IpMove* moves = g_moves.load(std::memory_order_acquire);
  const size_t n = g_nmoves.load(std::memory_order_acquire);
  const size_t nhazards = g_nhazards.load(std::memory_order_acquire);
  uintptr_t words[64];
  if (arch::thread_in_trap_path(ip) ||
      (moves && frames_resume_on(static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RSP]), moves,
                                 n, nhazards, words, 64))) {
    // A resume address in a frame below us, out of reach: try the batch again later.
    g_busy.fetch_add(1, std::memory_order_acq_rel);
    g_acks.fetch_add(1, std::memory_order_acq_rel);
    return;
  }
  const IpMove* m = moves ? find_move(moves, n, ip) : nullptr;
  const bool hazard = !m && nhazards != 0 &&
                      (probefs_arch_detour_depth != 0 || in_hazard(g_hazard_storage, nhazards, ip));
  if ((m && !m->to) || hazard) {  // on code whose way out the batch changes, with no copy to go to
    g_busy.fetch_add(1, std::memory_order_acq_rel);
    g_acks.fetch_add(1, std::memory_order_acq_rel);
    return;
  }
  if (m) uc->uc_mcontext.gregs[REG_RIP] = static_cast<greg_t>(m->to);
  g_acks.fetch_add(1, std::memory_order_acq_rel);
  // Parked until the writer is done. The kernel's return from this handler (sigreturn)
  // serializes the core, so the thread sees the new text.
  for (int r; (r = g_released.load(std::memory_order_acquire)) < generation;)
    raw_futex(&g_released, FUTEX_WAIT_PRIVATE, r);
}

// From the engine's parking (under its lock) or install_thread_fixup_handler() (the
// agent's install): the two may race once.
bool install_handler() {
  static std::atomic<int> state{0};  // 1 installed, -1 failed
  static std::mutex mu;
  if (state.load() != 0) return state.load() == 1;
  std::lock_guard lock(mu);
  if (state.load() == 0) {
    struct sigaction sa {};
    sa.sa_sigaction = on_fixup_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    // Every signal waits while a thread is parked here: a program's handler run on top of
    // it could reach the region being written, often with SIGTRAP blocked.
    sigfillset(&sa.sa_mask);
    struct sigaction previous {};
    state = sigaction(thread_fixup_signal(), &sa, &previous) == 0 ? 1 : -1;
    if (state.load() == 1) x86_64::remember_actions(thread_fixup_signal(), sa, previous);
  }
  return state.load() == 1;
}

// Parsers of our own: the libc ones may be the very functions being probed.
long parse_decimal(const char* s) {
  long v = 0;
  for (; *s >= '0' && *s <= '9'; ++s) v = v * 10 + (*s - '0');
  return v;
}

uintptr_t parse_hex(const char* s) {
  if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s += 2;
  uintptr_t v = 0;
  for (;; ++s) {
    const char c = *s;
    if (c >= '0' && c <= '9') v = v * 16 + (c - '0');
    else if (c >= 'a' && c <= 'f') v = v * 16 + (c - 'a' + 10);
    else if (c >= 'A' && c <= 'F') v = v * 16 + (c - 'A' + 10);
    else return v;
  }
}

std::string read_small_file(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char buf[512];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  return n > 0 ? std::string(buf, n) : std::string();
}

// The state letter of /proc/self/task/TID/stat (after the command's closing paren).
char thread_state(long tid) {
  const std::string s = read_small_file("/proc/self/task/" + std::to_string(tid) + "/stat");
  const size_t paren = s.rfind(')');
  return paren != std::string::npos && paren + 2 < s.size() ? s[paren + 2] : '?';
}

// Where a thread that is not running will resume in user space, and its stack pointer;
// false when it is running or unknown. /proc/self/task/TID/syscall ends with "... SP PC".
bool resume_point(long tid, uintptr_t* sp, uintptr_t* pc) {
  const std::string s = read_small_file("/proc/self/task/" + std::to_string(tid) + "/syscall");
  if (s.empty() || s.rfind("running", 0) == 0) return false;
  const size_t pc_at = s.find_last_of(' ', s.find_last_not_of(" \n"));
  if (pc_at == std::string::npos || pc_at == 0) return false;
  const size_t sp_at = s.find_last_of(' ', pc_at - 1);
  if (sp_at == std::string::npos) return false;
  *pc = parse_hex(s.c_str() + pc_at + 1);
  *sp = parse_hex(s.c_str() + sp_at + 1);
  return true;
}

// Does the thread block the fixup signal? (/proc/self/task/TID/status, "SigBlk:")
bool blocks_fixup_signal(long tid) {
  const std::string s = read_small_file("/proc/self/task/" + std::to_string(tid) + "/status");
  const size_t at = s.find("SigBlk:");
  if (at == std::string::npos) return false;
  const uintptr_t mask = parse_hex(s.c_str() + s.find_first_not_of(" \t", at + 7));
  return mask & (uintptr_t{1} << (thread_fixup_signal() - 1));
}

bool listed(const IpMove* moves, size_t n, uintptr_t pc) { return find_move(moves, n, pc) != nullptr; }

// 0 or -errno.
int queue_signal(long tid, int generation) {
  siginfo_t info{};
  info.si_signo = thread_fixup_signal();
  info.si_code = SI_QUEUE;
  info.si_pid = static_cast<pid_t>(self_pid());
  info.si_uid = getuid();
  info.si_value.sival_ptr =
      reinterpret_cast<void*>(kFixupMagic << 32 | static_cast<uint32_t>(generation));
  return static_cast<int>(raw_syscall(__NR_rt_tgsigqueueinfo, info.si_pid, tid,
                                      thread_fixup_signal(), reinterpret_cast<long>(&info)));
}

}  // namespace

int thread_fixup_signal() { return SIGRTMAX - 1; }

int park_threads(const IpMove* caller_moves, size_t n, const CodeRange* hazards,
                 size_t nhazards) {
  if (n > kMaxMoves || nhazards > kMaxHazards) return -E2BIG;
  if (!install_handler()) return -EAGAIN;
  g_moves.store(nullptr, std::memory_order_release);
  g_nhazards.store(0, std::memory_order_release);
  if (nhazards) std::memcpy(g_hazard_storage, hazards, nhazards * sizeof(CodeRange));
  std::sort(g_hazard_storage, g_hazard_storage + nhazards,
            [](const CodeRange& a, const CodeRange& b) { return a.start < b.start; });
  std::memcpy(g_move_storage, caller_moves, n * sizeof(IpMove));
  // Where one address has a move and a refusal, the refusal sorts first and wins.
  std::sort(g_move_storage, g_move_storage + n, [](const IpMove& a, const IpMove& b) {
    return a.from != b.from ? a.from < b.from : a.to < b.to;
  });
  const IpMove* moves = g_move_storage;
  const long self = raw_syscall(__NR_gettid);
  open_window();  // from here, a quiet sleeper that sleeps on stays asleep

  // Look at every thread first (this reads files and allocates), signal after: once the
  // first thread is parked, nothing here may take a lock it could hold.
  std::vector<long> running;
  if (DIR* d = opendir("/proc/self/task")) {
    int rc = 0;
    while (dirent* e = readdir(d)) {
      const long tid = parse_decimal(e->d_name);
      if (tid <= 0 || tid == self || asleep_quietly(tid)) continue;
      const char state = thread_state(tid);
      if (state == 'Z' || state == 'X') continue;
      uintptr_t sp = 0, pc = 0;
      if (state != 'R' && resume_point(tid, &sp, &pc)) {
        // Asleep or stopped: not disturbed. On the region, or above a signal frame that
        // resumes on it: this batch must wait.
        static uintptr_t stack_words[8192];  // the caller serializes
        if (listed(moves, n, pc) || in_hazard(g_hazard_storage, nhazards, pc) ||
            frames_resume_on(sp, moves, n, nhazards, stack_words, 8192))
          rc = -EAGAIN;
        continue;
      }
      // Running where we cannot look, and a signal would only pile up: glibc blocks every
      // signal for a moment at thread start and exit and around clone, which is also when
      // a trap would kill the thread.
      if (blocks_fixup_signal(tid)) rc = -EAGAIN;
      else running.push_back(tid);
    }
    closedir(d);
    if (rc) {
      close_window();
      return rc;
    }
  } else {
    close_window();
    return -EAGAIN;
  }

  const int generation = g_generation.fetch_add(1) + 1;
  g_acks.store(0);
  g_busy.store(0);
  g_nmoves.store(n, std::memory_order_release);
  g_nhazards.store(nhazards, std::memory_order_release);
  g_moves.store(moves, std::memory_order_release);
  int sent = 0;
  bool failed = false;
  for (long tid : running) {
    const int sig_rc = queue_signal(tid, generation);
    if (sig_rc == 0) ++sent;
    else if (sig_rc != -ESRCH) failed = true;
  }

  // Every signalled thread runs the handler as soon as it is scheduled, unless it blocked
  // the signal since we looked. Those already parked wait for the slowest, so give up
  // after a short while (the caller retries later) rather than stall the whole program.
  constexpr long kParkDeadlineNs = 200'000'000;
  timespec start;
  clock_gettime(CLOCK_MONOTONIC, &start);
  while (!failed && g_acks.load(std::memory_order_acquire) < sent) {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    const long waited =
        (now.tv_sec - start.tv_sec) * 1'000'000'000L + (now.tv_nsec - start.tv_nsec);
    if (waited > kParkDeadlineNs) failed = true;
    else sched_yield();
  }
  if (failed || g_busy.load(std::memory_order_acquire) != 0) {
    unpark_threads();
    return -EAGAIN;
  }
  return 0;
}

void unpark_threads() {
  g_moves.store(nullptr, std::memory_order_release);
  g_nhazards.store(0, std::memory_order_release);
  g_released.store(g_generation.load(), std::memory_order_release);
  raw_futex(&g_released, FUTEX_WAKE_PRIVATE, 0x7fffffff);
  g_generation.fetch_add(1);  // late handlers of this batch now ignore it
  close_window();
}

}  // namespace probefs::arch::x86_64

namespace probefs::arch {

int install_thread_fixup_handler() { return x86_64::install_handler() ? 0 : -EINVAL; }

void sleep_quietly_until(const uint32_t* word) {
  using namespace x86_64;
  auto* w = reinterpret_cast<std::atomic<int>*>(const_cast<uint32_t*>(word));
  const long tid = raw_syscall(__NR_gettid), pid = self_memory_pid();
  QuietSleeper* me = nullptr;
  for (QuietSleeper& q : g_sleepers) {  // a free slot, or one a fork left behind
    long held = q.tid.load();
    if (held != 0 && q.pid.load() == pid) continue;
    if (q.tid.compare_exchange_strong(held, tid)) {
      q.pid.store(pid);
      me = &q;
      break;
    }
  }
  for (;;) {
    if (me) me->state.store(kAsleep);
    while (w->load(std::memory_order_acquire) == 0) raw_futex(w, FUTEX_WAIT_PRIVATE, 0);
    if (!me) return;  // no slot: windows look at this thread as at any other
    me->state.store(kLeaving);
    if (!window_open()) break;
    // A window is open, and may have passed us by: not a step out of our code until it
    // closes.
    me->state.store(kAsleep);
    while (window_open()) raw_futex(&g_window, FUTEX_WAIT_PRIVATE, 1);
  }
  me->state.store(kFree);
  me->tid.store(0);
}

int testing::open_window_listing(uintptr_t listed_pc) {
  const x86_64::IpMove refuse{listed_pc, 0};
  return x86_64::park_threads(&refuse, 1);
}

void testing::close_window() { x86_64::unpark_threads(); }

void wake_quiet_sleeper(const uint32_t* word) {
  auto* w = reinterpret_cast<std::atomic<int>*>(const_cast<uint32_t*>(word));
  x86_64::raw_futex(w, FUTEX_WAKE_PRIVATE, 0x7fffffff);
}

}  // namespace probefs::arch
