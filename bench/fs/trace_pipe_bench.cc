// trace_pipe over FUSE beside a plain pipe and the kernel's tracefs: one table per
// measure, each figure with its baselines measured in the same run and the ratio to them.
//
//   1. throughput  a cat-style reader (a read() loop with cat's 128 KiB buffer) counts the
//                  lines and the LOST events of N records while a target calls
//                  bench_hit(a, b) at 2 M calls/s, keeping that pace busy on its CPU or
//                  asleep between bursts; then of all the calls it makes as fast as it
//                  can for 1.5 s. Beside them, the CPU the reader and the daemon used.
//   2. latency     the target takes CLOCK_MONOTONIC and calls bench_hit(that time, n); the
//                  reader, blocked in read(), takes CLOCK_MONOTONIC when the line arrives
//   3. first hit   the definition is written to kprobe_events (and enabled) while the
//                  target calls bench_hit in a loop, until its first line is read
//   4. raw         the unthrottled run of table 1 with a binary reader: the target kept on
//                  CPU 1, the reader on per_cpu/cpu1/trace_pipe_raw reading the kernel's
//                  ring-buffer pages as trace-cmd does, beside table 1's text reader; then
//                  the same reader with the target at 21 M calls/s, the budget's run:
//                  with the mount's buffer_size_kb, and with each thread's ring 8 MiB
//                  (trace-cmd record -b 8192), which outlasts a scheduler tick at that
//                  rate (a 1410 KiB ring lasts 1.7 ms; see the budget line)
//   5. python      a Python script's calls of one function, CPython's USDT points
//                  function__entry and line enabled (file, function and line fetched as
//                  strings): probefs by name (`python3.11:%python:line`), the kernel's
//                  uprobes at the same places with the same semaphores (perf's
//                  definitions of them, from probefs-probe --cache -l -v), and the script
//                  without probes; the cost of an event is the time a run gained over
//                  the plain run, divided by the events it recorded
//
// The probefs event is `p:bench/hit trace_pipe_target:bench_hit a=%di b=%si` on a mount of
// its own (probefs -f on a fresh directory), the target run with `probefs exec`. The
// baselines: a plain pipe between two processes carrying the same lines (the target
// writes them itself, at the same pace; tables 1 and 2), and the kernel's tracefs with a
// uprobe event on the same function with the same arguments (every table). The kernel's
// tracefs is asked only through a worker with a deadline on every answer
// (bench/common/kernel_uprobe.h): when it does not answer, its cells say "kernel tracefs not
// answering" and the run goes on.
//
// Each run has its own marker (the target's ID): the target calls bench_hit(kWarm, ID)
// until the reader has seen one (the probe is in place), then bench_hit(kFence, ID) and
// the N calls, then bench_hit(kEnd, ID) until the reader has seen that. The reader counts
// the lines between fence and end, and the events LOST lines report.
//
// Everything this program waits for has a deadline; a watchdog ends a run that still
// takes too long. Ctrl-C, SIGTERM, SIGHUP and the watchdog kill the targets and readers,
// detach the mount and end the daemon; should this program be killed outright, its
// children get a parent-death signal instead (the daemon SIGTERM, its clean end). The
// kernel's worker removes its events, its instance and its mount by itself once this
// program is gone.
//
//   trace_pipe_bench [--records N] [--rate R] [--samples S] [--reps K] [--read-kb KB]
//                    [--buffer-kb KB]
//                    [--no-kernel] [--only throughput|latency|first|raw|python]
//                    [--python-calls N]
//
// (defaults: 4000000 records, 2000000 calls/s, 300 samples, 5 reps, reads of 128 KiB)
//
// Threads: one. The readers are processes, forked, not executed.
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "bench/common/kernel_uprobe.h"
#include "tracee/probe_places.h"

namespace {

using probefs::bench::KernelUprobes;

// The marker calls' a (trace_pipe_target.c).
constexpr uint64_t kWarm = 0x5741524d;
constexpr uint64_t kFence = 0x46454e4345;
constexpr uint64_t kEnd = 0x454e44;

constexpr size_t kMaxReadSize = 1 << 20;
constexpr size_t kRawPage = 4096;       // the kernel's ring-buffer page
constexpr int kRawCpu = 1;              // where a raw run's target is kept
constexpr long kRawPacedRate = 21000000;  // a raw run's pace for the budget: 20 M and a margin
constexpr unsigned long kRawTickRingKb = 8192;  // 10 ms of records at that pace
constexpr unsigned long kRawRecordBytes = 32;    // at most a bench_hit record's ring bytes
size_t g_read_size = 128 * 1024;  // the reader's read(): cat's buffer unless --read-kb
constexpr int kWatchdogS = 90;            // the whole run, at most
constexpr int kReaderMaxS = 85;           // a reader's own end, should this program vanish
constexpr int kMountMs = 20000;
constexpr int kWarmMs = 10000;            // until the probe's first line
constexpr int kProduceSlackMs = 15000;    // past the producer's own schedule
constexpr int kEndMs = 15000;             // from the producer's end to the reader's
constexpr int kKernelRecordsDivisor = 4;  // the kernel's uprobes cost more: fewer records
constexpr long kUnthrottledMs = 1500;     // an unthrottled target's calls, at most

const char* const kProbefsEvent = "p:bench/hit trace_pipe_target:bench_hit a=%di b=%si";

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int ms_until(int64_t deadline_ns) {
  const int64_t left = (deadline_ns - now_ns()) / 1000000;
  return left < 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

// The deadline `ms` from now.
int64_t after_ms(int64_t ms) { return now_ns() + ms * 1000000; }

void pause_ms(int ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

std::string strprintf(const char* fmt, ...) {
  char b[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(b, sizeof b, fmt, ap);
  va_end(ap);
  return b;
}

// ---- what a signal must undo (async-signal-safe: fixed arrays, plain system calls) ------

struct Emergency {
  pid_t kill[64] = {};         // targets and readers: SIGKILL
  volatile pid_t daemon = -1;  // SIGTERM: it removes its probes and ends
  char mount[256] = {};        // detached, then removed
};
Emergency g_em;

void track(pid_t pid) {
  for (pid_t& p : g_em.kill)
    if (p == 0) {
      p = pid;
      return;
    }
}

void untrack(pid_t pid) {
  for (pid_t& p : g_em.kill)
    if (p == pid) p = 0;
}

extern "C" void on_fatal_signal(int sig) {
  for (pid_t p : g_em.kill)
    if (p > 0) kill(p, SIGKILL);
  if (g_em.daemon > 0) kill(g_em.daemon, SIGTERM);
  if (g_em.mount[0]) {
    umount2(g_em.mount, MNT_DETACH);
    rmdir(g_em.mount);
  }
  const char* msg = sig == SIGALRM ? "trace_pipe_bench: the watchdog ended the run; cleaned up\n"
                                   : "trace_pipe_bench: interrupted; cleaned up\n";
  (void)!write(2, msg, strlen(msg));
  _exit(sig == SIGALRM ? 3 : 128 + sig);
}

void install_signals() {
  struct sigaction sa {};
  sa.sa_handler = on_fatal_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGALRM}) sigaddset(&sa.sa_mask, sig);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGALRM}) sigaction(sig, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  alarm(kWatchdogS);
}

// Children start with the signals as they were before this program changed them, and get
// `on_parent_death` should this program end without its cleanup (SIGKILL).
void child_signals(int on_parent_death = SIGKILL) {
  prctl(PR_SET_PDEATHSIG, on_parent_death);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGALRM, SIGPIPE, SIGUSR1}) signal(sig, SIG_DFL);
  alarm(0);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

// ---- processes ------------------------------------------------------------------------

// Waits at most `ms` for `pid` to end: its wait status, or -1 after it had to be killed
// (then it is waited for at most 2 s more: one asleep in the kernel is left behind).
// `cpu_s`, when given, gets the CPU time it used (user and system).
int wait_exit(pid_t pid, int ms, double* cpu_s = nullptr) {
  if (pid <= 0) return -1;
  int pfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  auto reap = [&](int within_ms) {
    const int64_t deadline = after_ms(within_ms);
    for (;;) {
      int st = 0;
      rusage ru{};
      pid_t r = wait4(pid, &st, WNOHANG, &ru);
      if (r == pid) {
        if (cpu_s)
          *cpu_s = static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                   static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
        return st;
      }
      if (r < 0) return -2;
      if (ms_until(deadline) == 0 || pfd < 0) return -3;
      pollfd p{pfd, POLLIN, 0};
      poll(&p, 1, ms_until(deadline));
    }
  };
  int st = reap(ms);
  if (st < 0) {
    kill(pid, SIGKILL);
    (void)reap(2000);
    st = -1;
  }
  if (pfd >= 0) close(pfd);
  untrack(pid);
  return st;
}

// The CPU time a running process used so far (all its threads), in seconds.
double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t at = stat.rfind(')');
  if (at == std::string::npos) return 0;
  std::istringstream f(stat.substr(at + 2));
  std::string field;
  double utime = 0, stime = 0;
  // Fields 3.. after the name: utime and stime are the 14th and 15th of the line.
  for (int i = 3; i <= 15 && f >> field; ++i) {
    if (i == 14) utime = std::atof(field.c_str());
    if (i == 15) stime = std::atof(field.c_str());
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Lines from a descriptor, each awaited until a deadline.
class LineIn {
 public:
  explicit LineIn(int fd = -1) : fd_(fd) {}
  // The next line (without its '\n'); false at the deadline or at the end.
  bool next(std::string* line, int64_t deadline_ns) {
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        *line = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return true;
      }
      if (fd_ < 0 || ended_) return false;
      pollfd p{fd_, POLLIN, 0};
      int r = poll(&p, 1, ms_until(deadline_ns));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return false;
      char b[4096];
      ssize_t n = read(fd_, b, sizeof b);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        ended_ = true;
        return false;
      }
      buf_.append(b, static_cast<size_t>(n));
    }
  }
  // The next line that starts with `prefix` (the others are passed over).
  bool next_with(const char* prefix, std::string* line, int64_t deadline_ns) {
    while (next(line, deadline_ns))
      if (line->rfind(prefix, 0) == 0) return true;
    return false;
  }
  bool ended() const { return ended_; }
  int fd() const { return fd_; }

 private:
  int fd_;
  std::string buf_;
  bool ended_ = false;
};

// A program this benchmark runs: commands on its stdin, status lines on its stderr.
struct Proc {
  pid_t pid = -1;
  int in = -1;
  LineIn err;
  std::string last_err;  // its last status line, for a failure's message

  bool send(char c) { return in >= 0 && write(in, &c, 1) == 1; }
  // Its stdin ends, then it must end within `ms` (killed otherwise).
  void finish(int ms) {
    if (in >= 0) close(in);
    in = -1;
    if (pid > 0) wait_exit(pid, ms);
    pid = -1;
    if (err.fd() >= 0) close(err.fd());
    err = LineIn();
  }
};

// Runs argv (found on PATH) with stdin and stderr on pipes and stdout on `out_fd` (or
// /dev/null).
bool spawn(const std::vector<std::string>& argv, int out_fd, Proc* p) {
  int in[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0) return false;
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(in[0]);
    close(in[1]);
    return false;
  }
  pid_t pid = fork();
  if (pid == 0) {
    child_signals();
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    dup2(in[0], 0);
    dup2(out_fd >= 0 ? out_fd : null, 1);
    dup2(err[1], 2);
    std::vector<char*> a;
    for (const std::string& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execvp(a[0], a.data());
    _exit(127);
  }
  close(in[0]);
  close(err[1]);
  if (pid < 0) {
    close(in[1]);
    close(err[0]);
    return false;
  }
  track(pid);
  p->pid = pid;
  p->in = in[1];
  p->err = LineIn(err[0]);
  return true;
}

// Runs a command to its end (at most `ms`): its exit code, or -1.
int run_command(const std::vector<std::string>& argv, int ms) {
  Proc p;
  if (!spawn(argv, -1, &p)) return -1;
  close(p.in);
  p.in = -1;
  int st = wait_exit(p.pid, ms);
  p.pid = -1;
  p.finish(0);
  return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

// ---- the probefs mount --------------------------------------------------------------------

bool probefs_mounted(const std::string& dir) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string id, parent, dev, root, point, opts, field, type;
    f >> id >> parent >> dev >> root >> point >> opts;
    while (f >> field && field != "-") {
    }
    f >> type;
    if (point == dir && type == "fuse.probefs") return true;
  }
  return false;
}

// Until `dir` is a probefs mount, woken by changes of the mount table; at most `ms`.
bool wait_mounted(const std::string& dir, int ms) {
  const int64_t deadline = after_ms(ms);
  int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
  bool up = false;
  while (!(up = probefs_mounted(dir)) && ms_until(deadline) > 0) {
    pollfd p{fd, POLLPRI, 0};
    if (poll(&p, 1, std::min(ms_until(deadline), 200)) > 0) {
      char b[4096];
      lseek(fd, 0, SEEK_SET);
      while (read(fd, b, sizeof b) > 0) {
      }
    }
  }
  if (fd >= 0) close(fd);
  return up;
}

class ProbefsMount {
 public:
  ~ProbefsMount() { stop(); }

  bool start(std::string* why) {
    char tmpl[] = "/tmp/probefs-bench-mnt-XXXXXX";
    if (!mkdtemp(tmpl)) {
      *why = std::string("mkdtemp: ") + strerror(errno);
      return false;
    }
    dir_ = tmpl;
    log_ = memfd_create("probefs-daemon-log", MFD_CLOEXEC);
    pid_t pid = fork();
    if (pid == 0) {
      child_signals(SIGTERM);  // the daemon's clean end: probes removed, unmounted
      int null = open("/dev/null", O_RDWR | O_CLOEXEC);
      dup2(null, 0);
      dup2(null, 1);
      dup2(log_ >= 0 ? log_ : null, 2);
      execl(PROBEFS_BIN, PROBEFS_BIN, "-f", dir_.c_str(), nullptr);
      _exit(127);
    }
    if (pid < 0) {
      *why = std::string("fork: ") + strerror(errno);
      return false;
    }
    daemon_ = pid;
    g_em.daemon = pid;
    snprintf(g_em.mount, sizeof g_em.mount, "%s", dir_.c_str());
    if (!wait_mounted(dir_, kMountMs)) {
      *why = "the mount did not come up: " + log();
      return false;
    }
    return true;
  }

  // fusermount3 -u, then the daemon must end by itself; bounded, forced otherwise.
  void stop() {
    if (daemon_ > 0) {
      if (probefs_mounted(dir_)) run_command({"fusermount3", "-u", dir_}, 10000);
      if (probefs_mounted(dir_)) umount2(dir_.c_str(), MNT_DETACH);
      if (wait_exit(daemon_, 10000) < 0) std::fprintf(stderr, "probefs daemon had to be killed\n");
      daemon_ = -1;
      g_em.daemon = -1;
    }
    if (!dir_.empty()) {
      if (probefs_mounted(dir_)) umount2(dir_.c_str(), MNT_DETACH);
      rmdir(dir_.c_str());
      dir_.clear();
      g_em.mount[0] = 0;
    }
    if (log_ >= 0) close(log_);
    log_ = -1;
  }

  const std::string& dir() const { return dir_; }
  std::string path(const std::string& rel) const { return dir_ + "/" + rel; }
  pid_t daemon() const { return daemon_; }

  // One write() of `text`: 0 or the errno.
  int write(const std::string& rel, const std::string& text,
            int flags = O_WRONLY | O_APPEND) const {
    int fd = open(path(rel).c_str(), flags | O_CLOEXEC);
    if (fd < 0) return errno;
    ssize_t n = ::write(fd, text.data(), text.size());
    int e = n < 0 ? errno : 0;
    close(fd);
    return e;
  }
  std::string read_line(const std::string& rel) const {
    std::ifstream in(path(rel));
    std::string s;
    std::getline(in, s);
    return s;
  }
  // Empties the buffer, as `echo > trace` does.
  void clear_buffer() const { (void)write("trace", "", O_WRONLY | O_TRUNC); }
  // What the daemon said on stderr.
  std::string log() const {
    if (log_ < 0) return {};
    char b[4096];
    ssize_t n = pread(log_, b, sizeof b - 1, 0);
    return n > 0 ? std::string(b, static_cast<size_t>(n)) : std::string();
  }

 private:
  std::string dir_;
  pid_t daemon_ = -1;
  int log_ = -1;
};

// ---- the reader: a process, blocked in read() ----------------------------------------------

enum class ReadMode {
  kThroughput,  // counts lines between the fence and the end marker
  kLatency,     // for each request line, the time from its call to its arrival
  kFirst,       // the arrival of the first line that holds `needle`
};

struct ReaderSpec {
  ReadMode mode = ReadMode::kThroughput;
  std::string path;  // the file to open, or
  int fd = -1;       // a descriptor to read
  uint64_t id = 0;   // the run's marker
  std::string needle;
  bool raw = false;  // pages of trace_pipe_raw, not lines
};

// The reader child's side. It reports on `out`, one line each:
//   S                 opened, about to read
//   E <errno>         could not open
//   W                 saw the run's warm-up line
//   F                 saw the fence (kThroughput)
//   R <lines> <lost events> <LOST lines> <reads> <bytes> <fence ns> <last line ns> <partial>
//     (reads and bytes: those after the read that brought the fence)
//   L <request number> <ns from the call to the arrival>
//   T <arrival ns>
class ReaderChild {
 public:
  ReaderChild(const ReaderSpec& s, int out) : s_(s), out_(out) {}

  [[noreturn]] void run(int fd) {
    say("S");
    static char buf[kMaxReadSize];
    for (;;) {
      if (stop_) break;
      ssize_t n = read(fd, buf, g_read_size);
      const int64_t t = now_ns();
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      if (fenced_) {
        ++reads_;
        bytes_ += static_cast<uint64_t>(n);
      }
      t_ = t;
      if (s_.raw) {
        for (size_t at = 0; at + kRawPage <= static_cast<size_t>(n) && !done_; at += kRawPage)
          page(reinterpret_cast<const uint8_t*>(buf) + at);
      } else {
        split(buf, static_cast<size_t>(n));
      }
      if (done_) break;
    }
    if (s_.mode == ReadMode::kThroughput)
      say(strprintf("R %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRId64
                    " %" PRId64 " %d",
                    lines_, lost_, lost_lines_, reads_, bytes_, t_fence_, t_last_, done_ ? 0 : 1));
    _exit(0);
  }

  static volatile sig_atomic_t stop_;

 private:
  void say(const std::string& s) {
    std::string line = s + "\n";
    (void)!write(out_, line.data(), line.size());
  }

  // Whole lines to line(); a line cut by the end of a read waits for the next.
  void split(const char* b, size_t n) {
    size_t at = 0;
    if (!partial_.empty()) {
      const void* nl = memchr(b, '\n', n);
      if (!nl) {
        partial_.append(b, n);
        return;
      }
      const size_t len = static_cast<size_t>(static_cast<const char*>(nl) - b);
      partial_.append(b, len);
      line(partial_);
      partial_.clear();
      at = len + 1;
    }
    while (at < n && !done_) {
      const char* nl = static_cast<const char*>(memchr(b + at, '\n', n - at));
      if (!nl) {
        partial_.assign(b + at, n - at);
        return;
      }
      line(std::string_view(b + at, static_cast<size_t>(nl - (b + at))));
      at = static_cast<size_t>(nl - b) + 1;
    }
  }

  // A page of the kernel's ring buffer (events/header_page, header_event): the records'
  // a and b (both events lay a record out as 8 bytes of common fields, the probe's
  // address, a, b), and the count of records lost before the page.
  void page(const uint8_t* p) {
    uint64_t commit;
    std::memcpy(&commit, p + 8, 8);
    const size_t size = std::min<size_t>(commit & ((1u << 27) - 1), kRawPage - 16);
    const uint8_t* d = p + 16;
    if ((commit & (1ull << 31)) && fenced_) {
      uint64_t missed = 0;
      if ((commit & (1ull << 30)) && size + 24 <= kRawPage) std::memcpy(&missed, d + size, 8);
      lost_ += missed;
      ++lost_lines_;
    }
    for (size_t at = 0; at + 4 <= size && !done_;) {
      uint32_t h, len;
      std::memcpy(&h, d + at, 4);
      at += 4;
      const uint32_t type = h & 31;
      if (type == 0 || type == 29) {  // a length word; padding: the bytes to skip
        if (at + 4 > size || (type == 29 && (h >> 5) == 0)) break;
        std::memcpy(&len, d + at, 4);
        if (type == 0) {
          at += 4;
          len -= 4;
        }
      } else if (type >= 30) {  // a time extend or stamp: one word
        len = 4;
      } else {
        len = type * 4;
      }
      if (len > size - at) break;
      if (type != 29 && type < 30 && len >= 32) {
        uint64_t a, b;
        std::memcpy(&a, d + at + 16, 8);
        std::memcpy(&b, d + at + 24, 8);
        record(a, b);
      }
      at += len;
    }
  }

  void record(uint64_t a, uint64_t b) {
    if (fenced_ && b < 16) {  // the run's own records: b is one hex digit
      ++lines_;
      t_last_ = t_;
    } else if (a == kWarm && b == s_.id) {
      if (!warm_seen_) say("W");
      warm_seen_ = true;
    } else if (b == s_.id && a == kFence && !fenced_) {
      fenced_ = true;
      t_fence_ = t_;
      say("F");
    } else if (fenced_ && b == s_.id && a == kEnd) {
      done_ = true;
    }
  }

  static bool parse_ab(std::string_view l, uint64_t* a, uint64_t* b) {
    size_t pa = l.find(" a=0x"), pb = l.find(" b=0x");
    if (pa == std::string_view::npos || pb == std::string_view::npos) return false;
    *a = std::strtoull(std::string(l.substr(pa + 5, 20)).c_str(), nullptr, 16);
    *b = std::strtoull(std::string(l.substr(pb + 5, 20)).c_str(), nullptr, 16);
    return true;
  }

  void line(std::string_view l) {
    if (s_.mode == ReadMode::kThroughput && fenced_) {
      // The run's own lines end in "b=0xN", one hex digit: nothing else to look at.
      if (l.size() > 2 && l[l.size() - 2] == 'x') {
        ++lines_;
        t_last_ = t_;
        return;
      }
      if (l.rfind("CPU:", 0) == 0) {
        size_t p = l.find("[LOST ");
        if (p != std::string_view::npos) {
          lost_ += std::strtoull(std::string(l.substr(p + 6, 24)).c_str(), nullptr, 10);
          ++lost_lines_;
        }
        return;
      }
    }
    if (s_.mode == ReadMode::kFirst && l.find(s_.needle) != std::string_view::npos) {
      say(strprintf("T %" PRId64, t_));
      done_ = true;
      return;
    }
    uint64_t a, b;
    if (!parse_ab(l, &a, &b)) return;
    if (a == kWarm && b == s_.id) {
      if (!warm_seen_) say("W");
      warm_seen_ = true;
    } else if (s_.mode == ReadMode::kThroughput && b == s_.id && a == kFence && !fenced_) {
      fenced_ = true;
      t_fence_ = t_;
      say("F");
    } else if (s_.mode == ReadMode::kThroughput && fenced_ && b == s_.id && a == kEnd) {
      done_ = true;
    } else if (s_.mode == ReadMode::kLatency && (b >> 20) == s_.id) {
      say(strprintf("L %" PRIu64 " %" PRId64, b & 0xfffff, t_ - static_cast<int64_t>(a)));
    }
  }

  const ReaderSpec& s_;
  int out_;
  std::string partial_;
  int64_t t_ = 0;
  bool warm_seen_ = false, fenced_ = false, done_ = false;
  uint64_t lines_ = 0, lost_ = 0, lost_lines_ = 0, reads_ = 0, bytes_ = 0;
  int64_t t_fence_ = 0, t_last_ = 0;
};
volatile sig_atomic_t ReaderChild::stop_ = 0;

extern "C" void on_reader_stop(int) { ReaderChild::stop_ = 1; }

struct Reader {
  pid_t pid = -1;
  LineIn out;

  // Until it says it reads; false if it could not open its file.
  bool started(int ms, std::string* why) {
    std::string l;
    if (!out.next(&l, after_ms(ms)) || l != "S") {
      *why = l.rfind("E ", 0) == 0 ? "open: " + std::string(strerror(atoi(l.c_str() + 2)))
                                   : "the reader did not start";
      return false;
    }
    return true;
  }
  // Asks it to end (SIGUSR1, again and again: a signal between two reads is only seen
  // before the next) and waits for its last line with `prefix`, if any; kills it after `ms`.
  std::string stop(const char* prefix, int ms) {
    std::string l;
    bool found = false;
    const int64_t deadline = after_ms(ms);
    while (pid > 0 && !found && !out.ended() && ms_until(deadline) > 0) {
      kill(pid, SIGUSR1);
      const int64_t slice = std::min(deadline, after_ms(200));
      if (prefix)
        found = out.next_with(prefix, &l, slice);
      else
        while (out.next(&l, slice)) {
        }
    }
    finish();
    return found ? l : std::string();
  }
  double cpu_s = 0;  // the CPU time it used, once it ended
  void finish() {
    if (pid > 0) wait_exit(pid, 2000, &cpu_s);
    pid = -1;
    if (out.fd() >= 0) close(out.fd());
    out = LineIn();
  }
};

Reader start_reader(const ReaderSpec& s) {
  Reader r;
  int res[2];
  if (pipe2(res, O_CLOEXEC) != 0) return r;
  pid_t pid = fork();
  if (pid == 0) {
    child_signals();
    struct sigaction sa {};
    sa.sa_handler = on_reader_stop;  // no SA_RESTART: a blocked read() returns EINTR
    sigaction(SIGUSR1, &sa, nullptr);
    sigaction(SIGALRM, &sa, nullptr);
    alarm(kReaderMaxS);
    // Its report pipe as 3, its data (a pipe's end) as 4, and nothing else of this
    // program's: a pipe end kept here would hide another child's end from it.
    int out = fcntl(res[1], F_DUPFD, 10);
    int in = s.fd >= 0 ? fcntl(s.fd, F_DUPFD, 10) : -1;
    dup2(out, 3);
    if (in >= 0) dup2(in, 4);
    int null = open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; ++fd) dup2(null, fd);
    close_range(5, ~0U, 0);
    int fd = 4;
    if (in < 0) {
      fd = open(s.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        std::string e = "E " + std::to_string(errno) + "\n";
        (void)!write(3, e.data(), e.size());
        _exit(1);
      }
    }
    ReaderChild(s, 3).run(fd);
  }
  close(res[1]);
  if (pid < 0) {
    close(res[0]);
    return r;
  }
  track(pid);
  r.pid = pid;
  r.out = LineIn(res[0]);
  return r;
}

// The target calls bench_hit(kWarm, ID) every 5 ms until the reader has seen one.
bool warm_up(Proc& target, Reader& r, int ms) {
  const int64_t deadline = after_ms(ms);
  std::string l;
  while (ms_until(deadline) > 0) {
    if (!target.send('w')) return false;
    if (r.out.next_with("W", &l, std::min(deadline, after_ms(5)))) return true;
    if (r.out.ended()) return false;
  }
  return false;
}

// ---- the runs ----------------------------------------------------------------------------

enum class Source { kPipe, kProbefs, kKernel };

struct Setup {
  ProbefsMount* mount = nullptr;
  KernelUprobes* kernel = nullptr;  // null with --no-kernel
  std::string target = PROBEFS_TRACE_PIPE_TARGET;
  std::string kernel_body;          // PATH:0xOFF a=%di b=%si
  uint64_t next_id = 0x100;
  // A source whose probe never gave a line is not tried again (each try costs kWarmMs).
  std::string broken[3];
};

std::string raw_file() { return "per_cpu/cpu" + std::to_string(kRawCpu) + "/trace_pipe_raw"; }

// Why a source cannot run now ("" when it can).
std::string unavailable(const Setup& s, Source src) {
  if (!s.broken[static_cast<int>(src)].empty()) return s.broken[static_cast<int>(src)];
  if (src != Source::kKernel) return {};
  if (!s.kernel) return "not measured (--no-kernel)";
  if (!s.kernel->available()) return s.kernel->why_not();
  return {};
}

// The reader (on the source's trace_pipe, or on a pipe whose other end the target writes)
// and the target, started in that order; for the kernel, its event first (end_run()
// removes it).
bool start_run(Setup& s, Source src, ReaderSpec spec, const std::vector<std::string>& args,
               Reader* r, Proc* target, std::string* why) {
  std::vector<std::string> argv;
  int pipefd[2] = {-1, -1};
  switch (src) {
    case Source::kPipe:
      if (pipe2(pipefd, O_CLOEXEC) != 0) {
        *why = std::string("pipe: ") + strerror(errno);
        return false;
      }
      spec.fd = pipefd[0];
      argv = {s.target, "pipe"};
      break;
    case Source::kProbefs:
      s.mount->clear_buffer();
      spec.path = s.mount->path(spec.raw ? raw_file() : "trace_pipe");
      argv = {PROBEFS_BIN, "exec", s.mount->dir(), "--", s.target, "hit"};
      break;
    case Source::kKernel:
      // Only for this run: a uprobe on the file is in every process that maps it, the
      // probefs targets' bench_hit included.
      if (!s.kernel->add("hit", false, s.kernel_body)) {
        *why = s.kernel->why_not();
        s.broken[static_cast<int>(src)] = *why;
        return false;
      }
      spec.path = s.kernel->instance() + "/" + (spec.raw ? raw_file() : "trace_pipe");
      argv = {s.target, "hit"};
      break;
  }
  argv.push_back(std::to_string(spec.id));
  argv.insert(argv.end(), args.begin(), args.end());
  *r = start_reader(spec);
  bool ok = r->pid > 0 && r->started(5000, why);
  // A raw run's target on kRawCpu, so that its records are that CPU's (the reader's
  // file); its children inherit the affinity this program has while it spawns them.
  cpu_set_t before, one;
  CPU_ZERO(&one);
  CPU_SET(kRawCpu, &one);
  const bool pin = spec.raw && sched_getaffinity(0, sizeof before, &before) == 0 &&
                   sched_setaffinity(0, sizeof one, &one) == 0;
  if (ok) ok = spawn(argv, pipefd[1], target);
  if (pin) sched_setaffinity(0, sizeof before, &before);
  if (pipefd[0] >= 0) {
    close(pipefd[0]);
    close(pipefd[1]);
  }
  if (!ok && why->empty()) *why = "cannot start the target";
  return ok;
}

void end_run(Setup& s, Source src, Reader& r, Proc& target) {
  target.send('q');
  target.finish(5000);
  r.stop(nullptr, 2000);
  if (src == Source::kKernel && s.kernel->available()) s.kernel->remove("hit");
}

struct Throughput {
  std::string why;  // not measured: why
  uint64_t records = 0;
  double producer = 0;  // calls per second the target made
  uint64_t lines = 0, lost = 0, lost_lines = 0, reads = 0, bytes = 0;
  double seconds = 0;
  bool partial = false;
  double reader_cpu = 0;  // of one CPU, while the records came
  double daemon_cpu = -1;  // probefs only
  double rate() const { return seconds > 0 ? static_cast<double>(lines) / seconds : 0; }
};

// `records` calls at `rate` per second (0: as fast as the target can), or fewer when `ms`
// milliseconds pass first; the target keeps its pace busy on its CPU, or asleep between
// bursts of calls (`sleep`).
Throughput run_throughput(Setup& s, Source src, uint64_t records, long rate, long ms,
                          bool sleep = false, bool raw = false, uint64_t prime = 0) {
  Throughput t;
  if ((t.why = unavailable(s, src)) != "") return t;
  ReaderSpec spec;
  spec.raw = raw;
  spec.mode = ReadMode::kThroughput;
  spec.id = s.next_id++;
  Reader r;
  Proc target;
  if (!start_run(s, src, spec,
                 {std::to_string(records), std::to_string(rate), std::to_string(ms),
                  sleep ? "sleep" : "spin", std::to_string(prime)},
                 &r, &target, &t.why)) {
    end_run(s, src, r, target);
    return t;
  }
  std::string l;
  if (!warm_up(target, r, kWarmMs)) {
    t.why = "no line of the probe";
    if (target.err.next(&l, after_ms(100))) t.why += ": " + l;
    s.broken[static_cast<int>(src)] = t.why;
  } else {
    const int64_t w0 = now_ns();
    const double d0 = src == Source::kProbefs ? cpu_seconds(s.mount->daemon()) : 0;
    target.send('g');
    if (!target.err.next_with("done ", &l, after_ms(ms + kProduceSlackMs)) ||
        std::sscanf(l.c_str(), "done %" SCNu64 " %lf", &t.records, &t.producer) != 2)
      t.why = "the target did not finish in time";
    // The end marker, until the reader has it (the first ones may be lost to a full
    // buffer; a LOST line comes only before a record that made it).
    const int64_t deadline = after_ms(kEndMs);
    bool ended = false;
    while (t.why.empty() && ms_until(deadline) > 0) {
      target.send('e');
      if (r.out.next_with("R ", &l, std::min(deadline, after_ms(100)))) {
        ended = true;
        break;
      }
      if (r.out.ended()) break;
    }
    if (!ended) l = r.stop("R ", 3000);
    if (src == Source::kProbefs)
      t.daemon_cpu = (cpu_seconds(s.mount->daemon()) - d0) / (static_cast<double>(now_ns() - w0) / 1e9);
    int64_t t0 = 0, t1 = 0;
    int partial = 1;
    if (std::sscanf(l.c_str(), "R %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64
                               " %" SCNd64 " %" SCNd64 " %d",
                    &t.lines, &t.lost, &t.lost_lines, &t.reads, &t.bytes, &t0, &t1, &partial) == 8) {
      t.seconds = static_cast<double>(t1 - t0) / 1e9;
      t.partial = partial != 0;
    } else if (t.why.empty()) {
      t.why = "the reader gave no count";
    }
  }
  end_run(s, src, r, target);
  if (t.seconds > 0) t.reader_cpu = r.cpu_s / t.seconds;
  return t;
}

struct Latency {
  std::string why;
  std::vector<double> us;
  int missed = 0;
  double pct(double p) const {
    if (us.empty()) return 0;
    std::vector<double> v = us;
    std::sort(v.begin(), v.end());
    return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
  }
};

Latency run_latency(Setup& s, Source src, int samples) {
  Latency lat;
  if ((lat.why = unavailable(s, src)) != "") return lat;
  ReaderSpec spec;
  spec.mode = ReadMode::kLatency;
  spec.id = s.next_id++;
  Reader r;
  Proc target;
  if (start_run(s, src, spec, {}, &r, &target, &lat.why)) {
    std::string l;
    if (!warm_up(target, r, kWarmMs)) {
      lat.why = "no line of the probe";
      s.broken[static_cast<int>(src)] = lat.why;
    } else {
      // Late warm-up lines go by first.
      while (r.out.next(&l, after_ms(20))) {
      }
      for (int i = 1; i <= samples && lat.missed < 10; ++i) {
        pause_ms(2);  // the reader is blocked in read() again
        if (!target.send('r')) break;
        const int64_t deadline = after_ms(1000);
        bool got = false;
        while (r.out.next_with("L ", &l, deadline)) {
          unsigned long seq = 0;
          long long ns = 0;
          if (std::sscanf(l.c_str(), "L %lu %lld", &seq, &ns) == 2 &&
              seq == static_cast<unsigned long>(i)) {
            lat.us.push_back(static_cast<double>(ns) / 1000.0);
            got = true;
            break;
          }
        }
        if (!got) ++lat.missed;
      }
      if (lat.us.empty()) lat.why = "no request line arrived";
    }
  }
  end_run(s, src, r, target);
  return lat;
}

struct FirstHit {
  std::string why;
  std::vector<double> ms;         // the write until the first line
  std::vector<double> define_ms;  // the definition's write, alone (probefs)
  std::vector<double> enable_ms;  // the enable's write, alone (probefs)
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

FirstHit run_first_hit(Setup& s, Source src, int reps) {
  FirstHit f;
  if ((f.why = unavailable(s, src)) != "") return f;
  const uint64_t id = s.next_id++;
  Proc target;
  std::string l;
  if (src == Source::kProbefs) {
    // A target the daemon knows: one line of bench/hit proves the agent is linked. Then
    // bench/hit goes, so that only the definitions under test fire.
    ReaderSpec spec;
    spec.mode = ReadMode::kFirst;
    spec.id = id;
    spec.needle = "\x01";  // never: this reader only reports the warm-up
    Reader r;
    bool ok = start_run(s, src, spec, {}, &r, &target, &f.why) && warm_up(target, r, kWarmMs);
    r.stop(nullptr, 2000);
    s.mount->write("events/bench/hit/enable", "0", O_WRONLY | O_TRUNC);
    s.mount->write("kprobe_events", "-:bench/hit");
    if (!ok) {
      if (f.why.empty()) f.why = "no line of the probe";
      target.finish(2000);
      return f;
    }
  } else {
    if (!spawn({s.target, "hit", std::to_string(id)}, -1, &target)) {
      f.why = "cannot start the target";
      return f;
    }
  }
  target.send('l');
  for (int k = 1; k <= reps && f.why.empty(); ++k) {
    const std::string name = "first" + std::to_string(k);
    ReaderSpec spec;
    spec.mode = ReadMode::kFirst;
    spec.id = id;
    spec.needle = " " + name + ": ";
    if (src == Source::kProbefs) {
      s.mount->clear_buffer();
      spec.path = s.mount->path("trace_pipe");
    } else {
      spec.path = s.kernel->instance() + "/trace_pipe";
    }
    Reader r = start_reader(spec);
    if (r.pid < 0 || !r.started(5000, &f.why)) break;
    pause_ms(20);  // blocked in read()
    int64_t t0 = 0;
    if (src == Source::kProbefs) {
      t0 = now_ns();
      int e1 = s.mount->write("kprobe_events",
                              "p:bench/" + name + " trace_pipe_target:bench_hit a=%di b=%si");
      const int64_t t1 = now_ns();
      int e2 = e1 ? e1 : s.mount->write("events/bench/" + name + "/enable", "1", O_WRONLY | O_TRUNC);
      const int64_t t2 = now_ns();
      if (e1 || e2) f.why = std::string("definition refused: ") + strerror(e1 ? e1 : e2);
      f.define_ms.push_back(static_cast<double>(t1 - t0) / 1e6);
      f.enable_ms.push_back(static_cast<double>(t2 - t1) / 1e6);
    } else {
      KernelUprobes::AddTimes at;
      if (s.kernel->add(name, false, s.kernel_body, &at)) {
        t0 = at.started;
        f.define_ms.push_back(static_cast<double>(at.defined - at.started) / 1e6);
        f.enable_ms.push_back(static_cast<double>(at.enabled - at.defined) / 1e6);
      } else {
        f.why = s.kernel->why_not();
      }
    }
    if (f.why.empty()) {
      if (r.out.next_with("T ", &l, after_ms(10000)))
        f.ms.push_back(static_cast<double>(std::atoll(l.c_str() + 2) - t0) / 1e6);
      else
        f.why = "no first line within 10 s";
    }
    r.stop(nullptr, 2000);
    if (src == Source::kProbefs) {
      s.mount->write("events/bench/" + name + "/enable", "0", O_WRONLY | O_TRUNC);
      s.mount->write("kprobe_events", "-:bench/" + name);
    } else {
      s.kernel->remove(name);
    }
  }
  target.send('q');
  target.finish(5000);
  return f;
}

// ---- the tables --------------------------------------------------------------------------

std::string ratio(double v, double base) {
  return base > 0 && v > 0 ? strprintf("%.2fx", v / base) : "-";
}

std::string ratio_or_why(double v, double base, const std::string& base_why) {
  return base_why.empty() ? ratio(v, base) : base_why;
}

void throughput_row(const char* what, const Throughput& t, const Throughput& pipe,
                    const Throughput& kernel) {
  if (!t.why.empty()) {
    std::printf("  %-31s %s\n", what, t.why.c_str());
    return;
  }
  const std::string daemon = t.daemon_cpu < 0 ? "-" : strprintf("%.0f%%", 100 * t.daemon_cpu);
  std::printf("  %-31s %9.0f %9.0f %9" PRIu64 " %9" PRIu64 " %7.0f %6.0f%% %6s %7s  %s%s\n",
              what, t.producer, t.rate(), t.lost, t.records - std::min(t.records, t.lines),
              t.reads ? static_cast<double>(t.bytes) / static_cast<double>(t.reads) : 0.0,
              100 * t.reader_cpu, daemon.c_str(), ratio(t.rate(), pipe.rate()).c_str(),
              ratio_or_why(t.rate(), kernel.rate(), kernel.why).c_str(),
              t.partial ? "  (ended by its deadline)" : "");
}

void latency_row(const char* what, const Latency& l, const Latency& pipe, const Latency& kernel) {
  if (!l.why.empty()) {
    std::printf("  %-34s %s\n", what, l.why.c_str());
    return;
  }
  std::printf("  %-34s %9.1f %9.1f %9.1f %7zu %7d %8s  %s\n", what, l.pct(0.5), l.pct(0.99),
              l.pct(0), l.us.size(), l.missed, ratio(l.pct(0.5), pipe.pct(0.5)).c_str(),
              ratio_or_why(l.pct(0.5), kernel.pct(0.5), kernel.why).c_str());
}

void first_row(const char* what, const FirstHit& f, const FirstHit& kernel) {
  if (!f.why.empty()) {
    std::printf("  %-26s %s\n", what, f.why.c_str());
    return;
  }
  auto mm = [](const std::vector<double>& v) {
    return v.empty() ? std::string("-") : strprintf("%.2f", median(v));
  };
  std::printf("  %-26s %9.2f %9.2f %9.2f %10s %10s  %s\n", what, median(f.ms),
              *std::min_element(f.ms.begin(), f.ms.end()),
              *std::max_element(f.ms.begin(), f.ms.end()), mm(f.define_ms).c_str(),
              mm(f.enable_ms).c_str(),
              ratio_or_why(median(f.ms), median(kernel.ms), kernel.why).c_str());
}

// ---- 5. Python's USDT points -------------------------------------------------------------

constexpr const char* kPython = "/usr/bin/python3.11";
constexpr const char* kPythonPoints[] = {"function__entry", "line"};

struct PythonRuns {
  std::string why;      // not measured: why
  double ms = 0;        // the median run's wall time
  double events = 0;    // events recorded per run (probefs: its kprobe_profile)
};

// The median wall time of `reps` runs of argv, each to a clean exit within a minute.
PythonRuns time_runs(const std::vector<std::string>& argv, int reps) {
  PythonRuns r;
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const int64_t t0 = now_ns();
    if (run_command(argv, 60000) != 0) {
      r.why = "the script did not run";
      return r;
    }
    ms.push_back(static_cast<double>(now_ns() - t0) / 1e6);
  }
  r.ms = median(ms);
  return r;
}

// perf's uprobe definitions of Python's points ("p:sdt_python/line PATH:0xOFF(0xSEM)
// arg1=%r14:u64 ..."), by point name, with the arguments fetched as the probefs events
// fetch them: arg1 and arg2 as strings, arg3 as s32; and each point's semaphore's file
// offset.
bool kernel_python_bodies(std::vector<std::string>* bodies, std::vector<std::string>* sems,
                          std::string* why) {
  const int out = memfd_create("probefs-probe-out", MFD_CLOEXEC);
  Proc p;
  if (out < 0 || !spawn({PROBEFS_PROBE_BIN, "--cache", "-l", "-v", "-x", kPython}, out, &p)) {
    *why = "cannot run probefs-probe";
    if (out >= 0) close(out);
    return false;
  }
  p.finish(60000);
  std::string text(1 << 16, '\0');
  const ssize_t n = pread(out, text.data(), text.size(), 0);
  close(out);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  for (const char* point : kPythonPoints) {
    const size_t at = text.find(std::string("p:sdt_python/") + point + " ");
    if (at == std::string::npos) {
      *why = std::string("no ") + point + " point in " + kPython;
      return false;
    }
    std::istringstream words(text.substr(at, text.find('\n', at) - at));
    std::string word, body;
    words >> word >> body;
    const size_t open = body.find('('), close = body.find(')');
    if (open == std::string::npos || close == std::string::npos) {
      *why = std::string("no semaphore for ") + point;
      return false;
    }
    sems->push_back(body.substr(open + 1, close - open - 1));
    const char* names[] = {"file", "func", "line"};
    for (int i = 0; i < 3 && words >> word; ++i) {
      const size_t eq = word.find('='), colon = word.rfind(':');
      const std::string op = word.substr(eq + 1, colon - eq - 1);
      body += std::string(" ") + names[i] + "=" + (i < 2 ? "+0(" + op + "):string" : op + ":s32");
    }
    bodies->push_back(body);
  }
  return true;
}

// The script: N calls of f in a loop; with semaphore file offsets after N, it first sets
// those semaphores itself (found through /proc/self/maps), so that CPython takes the path
// its points are on with no tracer at all: Python's own cost of its points.
const char kPythonScript[] = R"(import sys

def f(n):
    return n + 1

if len(sys.argv) > 2:
    import ctypes
    exe = sys.executable
    with open('/proc/self/maps') as maps:
        for m in maps:
            f_ = m.split()
            if len(f_) < 6 or f_[5] != exe or 'w' not in f_[1]:
                continue
            lo, hi = (int(x, 16) for x in f_[0].split('-'))
            off = int(f_[2], 16)
            for s in sys.argv[2:]:
                at = int(s, 16) - off
                if 0 <= at < hi - lo:
                    ctypes.c_ushort.from_address(lo + at).value += 1
for i in range(int(sys.argv[1])):
    f(i)
)";

void run_python(Setup& s, long calls, int reps) {
  std::printf("5. Python's USDT points: %ld calls of a Python function, function__entry and "
              "line enabled (file, function, line as strings), %d reps\n",
              calls, reps);
  if (access(kPython, X_OK) != 0) {
    std::printf("  not measured: no %s\n\n", kPython);
    return;
  }
  std::vector<std::string> bodies, sems;
  std::string kwhy;
  if (!kernel_python_bodies(&bodies, &sems, &kwhy)) {
    std::printf("  not measured: %s\n\n", kwhy.c_str());
    return;
  }
  char dir[] = "/tmp/probefs-bench-py-XXXXXX";
  if (!mkdtemp(dir)) {
    std::printf("  not measured: mkdtemp: %s\n\n", strerror(errno));
    return;
  }
  const std::string script = std::string(dir) + "/calls.py";
  std::ofstream(script) << kPythonScript;
  const std::vector<std::string> plain = {kPython, "-S", script, std::to_string(calls)};
  std::vector<std::string> held = plain;
  held.insert(held.end(), sems.begin(), sems.end());
  std::vector<std::string> traced = {PROBEFS_BIN, "exec", s.mount->dir(), "--"};
  traced.insert(traced.end(), plain.begin(), plain.end());
  PythonRuns base = time_runs(plain, reps);
  PythonRuns own = time_runs(held, reps);
  PythonRuns exec_only = time_runs(traced, reps);

  // probefs: by name, waiting for python3.11 to be mapped.
  PythonRuns ours;
  for (const char* point : kPythonPoints) {
    const std::string def = std::string("p:py/") + point + " python3.11:%python:" + point +
                            " file=+0($arg1):string func=+0($arg2):string line=$arg3:s32\n";
    if (int e = s.mount->write("kprobe_events", def); e != 0) ours.why = strerror(e);
  }
  if (ours.why.empty()) {
    s.mount->write("events/py/enable", "1", O_WRONLY | O_TRUNC);
    ours = time_runs(traced, reps);
    // The events of all the runs, from the hits kprobe_profile counts.
    std::ifstream profile(s.mount->path("kprobe_profile"));
    std::string event;
    uint64_t hits = 0, missed = 0;
    while (profile >> event >> hits >> missed)
      for (const char* point : kPythonPoints)
        if (event == point || event == std::string("py/") + point)
          ours.events += static_cast<double>(hits);
    ours.events /= reps;
    s.mount->write("events/py/enable", "0", O_WRONLY | O_TRUNC);
    s.mount->write("kprobe_events", "-:py/function__entry\n-:py/line\n");
  }

  PythonRuns kern;
  kern.why = unavailable(s, Source::kKernel);
  if (kern.why.empty()) {
    for (size_t i = 0; i < bodies.size() && kern.why.empty(); ++i)
      if (!s.kernel->add(kPythonPoints[i], false, bodies[i])) kern.why = s.kernel->why_not();
    if (kern.why.empty()) kern = time_runs(plain, reps);
    s.kernel->clear();
  }
  std::remove(script.c_str());
  rmdir(dir);

  // An event's cost: what a run gained over the run with the semaphores held and no
  // tracer (and, for probefs, over probefs exec with nothing defined: the agent's start).
  auto per_event = [&](const PythonRuns& r, double start_ms) {
    return r.why.empty() && own.why.empty() && ours.events > 0
               ? (r.ms - own.ms - start_ms) * 1e6 / ours.events
               : -1.0;
  };
  std::printf("  %-44s %9s %12s %9s  %s\n", "", "run ms", "ns per event", "x plain",
              "x probefs");
  auto row = [&](const char* what, const PythonRuns& r, double pe) {
    if (!r.why.empty()) {
      std::printf("  %-44s %s\n", what, r.why.c_str());
      return;
    }
    std::printf("  %-44s %9.1f %12s %9s  %s\n", what, r.ms,
                pe >= 0 ? strprintf("%.0f", pe).c_str() : "-", ratio(r.ms, base.ms).c_str(),
                pe >= 0 ? ratio(pe, per_event(ours, exec_only.ms - base.ms)).c_str() : "");
  };
  row("python3.11 -S, no probes", base, -1);
  row("  its semaphores held by itself, no tracer", own, -1);
  row("  under probefs exec, nothing defined", exec_only, -1);
  row("probefs, python3.11:%python:POINT", ours, per_event(ours, exec_only.ms - base.ms));
  row("kernel uprobes, the same places", kern, per_event(kern, 0));
  std::printf("  (%.0f events per run: each call's function__entry and line, the loop's "
              "lines. An event's cost is what its run took over the run with the semaphores "
              "held by the script itself, which is CPython's own cost of the path its points "
              "are on; and, for probefs, over probefs exec's start)\n\n",
              ours.events);
}

struct Options {
  uint64_t records = 4000000;
  long rate = 2000000;
  int samples = 300;
  int reps = 5;
  size_t read_kb = 128;
  unsigned long buffer_kb = 0;  // 0: the mount's default (the kernel's 1410)
  bool kernel = true;
  std::string only;
  long python_calls = 50000;
};

bool parse_options(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--no-kernel") o->kernel = false;
    else if (a == "--records" && (v = value())) o->records = std::strtoull(v, nullptr, 0);
    else if (a == "--rate" && (v = value())) o->rate = std::atol(v);
    else if (a == "--samples" && (v = value())) o->samples = std::atoi(v);
    else if (a == "--reps" && (v = value())) o->reps = std::atoi(v);
    else if (a == "--read-kb" && (v = value())) o->read_kb = std::strtoul(v, nullptr, 0);
    else if (a == "--buffer-kb" && (v = value())) o->buffer_kb = std::strtoul(v, nullptr, 0);
    else if (a == "--only" && (v = value())) o->only = v;
    else if (a == "--python-calls" && (v = value())) o->python_calls = std::atol(v);
    else return false;
  }
  return o->records > 0 && o->rate > 0 && o->python_calls > 0 && o->samples > 0 && o->reps > 0 && o->read_kb > 0 &&
         o->read_kb * 1024 <= kMaxReadSize;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse_options(argc, argv, &o)) {
    std::fprintf(stderr,
                 "usage: trace_pipe_bench [--records N] [--rate R] [--samples S] [--reps K]\n"
                 "                        [--read-kb KB] [--buffer-kb KB] [--no-kernel]\n"
                 "                        [--only throughput|latency|first|raw|python]\n"
                 "                        [--python-calls N]\n");
    return 2;
  }
  g_read_size = o.read_kb * 1024;
  setvbuf(stdout, nullptr, _IOLBF, 0);
  install_signals();
  Setup s;
  ProbefsMount mount;
  std::string why;
  if (!mount.start(&why)) {
    std::fprintf(stderr, "trace_pipe_bench: probefs: %s\n", why.c_str());
    return 1;
  }
  s.mount = &mount;
  std::fprintf(stderr, "probefs daemon pid %d on %s\n", mount.daemon(), mount.dir().c_str());
  // Each thread's ring, as `trace-cmd record -b KB` sets each CPU's buffer.
  if (o.buffer_kb != 0) {
    if (int e = mount.write("buffer_size_kb", std::to_string(o.buffer_kb), O_WRONLY | O_TRUNC);
        e != 0) {
      std::fprintf(stderr, "trace_pipe_bench: buffer_size_kb: %s\n", strerror(e));
      return 1;
    }
  }
  // Defined before its target exists: MOD:SYM waits for the executable to appear.
  if (int e = mount.write("kprobe_events", kProbefsEvent); e != 0) {
    std::fprintf(stderr, "trace_pipe_bench: kprobe_events: %s\n", strerror(e));
    return 1;
  }
  mount.write("events/bench/hit/enable", "1", O_WRONLY | O_TRUNC);

  uint64_t off = 0;
  if (probefs::tracee::symbol_file_offset(s.target, "bench_hit", &off) != 0) {
    std::fprintf(stderr, "trace_pipe_bench: no bench_hit in %s\n", s.target.c_str());
    return 1;
  }
  s.kernel_body = strprintf("%s:0x%" PRIx64 " a=%%di b=%%si", s.target.c_str(), off);
  std::unique_ptr<KernelUprobes> kernel;
  if (o.kernel) {
    kernel = std::make_unique<KernelUprobes>();
    s.kernel = kernel.get();
  }
  const std::string kwhy = unavailable(s, Source::kKernel);
  const std::string kstate = kwhy.empty() ? "a private tracefs mount, an instance" : kwhy;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  std::printf("probefs trace_pipe: %ld CPUs; probefs buffer_size_kb %s; kernel tracefs: %s\n",
              cpus, mount.read_line("buffer_size_kb").c_str(), kstate.c_str());
  std::printf("  probefs: %s (probefs exec)\n  kernel:  p:%s/hit %s\n\n", kProbefsEvent,
              KernelUprobes::kGroup, s.kernel_body.c_str());

  const bool all = o.only.empty();
  if (all || o.only == "throughput") {
    const uint64_t n = o.records, kn = std::max<uint64_t>(1, n / kKernelRecordsDivisor);
    // Throttled: the records at the rate, with room for a producer that cannot keep it;
    // unthrottled: as many as the target makes in kUnthrottledMs.
    const long ms = static_cast<long>(n * 1000 / static_cast<uint64_t>(o.rate)) + 5000;
    const uint64_t many = 1ULL << 40;
    Throughput pipe = run_throughput(s, Source::kPipe, n, o.rate, ms);
    Throughput fuse = run_throughput(s, Source::kProbefs, n, o.rate, ms);
    Throughput kern = run_throughput(s, Source::kKernel, kn, o.rate, ms);
    Throughput pipe_sleep = run_throughput(s, Source::kPipe, n, o.rate, ms, true);
    Throughput fuse_sleep = run_throughput(s, Source::kProbefs, n, o.rate, ms, true);
    Throughput kern_sleep = run_throughput(s, Source::kKernel, kn, o.rate, ms, true);
    Throughput pipe_max = run_throughput(s, Source::kPipe, many, 0, kUnthrottledMs);
    Throughput fuse_max = run_throughput(s, Source::kProbefs, many, 0, kUnthrottledMs);
    Throughput kern_max = run_throughput(s, Source::kKernel, many, 0, kUnthrottledMs);
    std::printf("1. trace_pipe throughput: read() of %zu KiB in a loop; %" PRIu64
                " records (kernel: %" PRIu64 "), unthrottled: %ld ms of calls\n",
                g_read_size / 1024, n, kn, kUnthrottledMs);
    std::printf("  %-31s %9s %9s %9s %9s %7s %7s %6s %7s  %s\n", "", "calls/s", "lines/s",
                "lost", "missing", "B/read", "reader", "daemon", "x pipe", "x kernel");
    const std::string r = strprintf("%.1f M/s", static_cast<double>(o.rate) / 1e6);
    throughput_row(("plain pipe, " + r).c_str(), pipe, pipe, kern);
    throughput_row(("probefs, " + r).c_str(), fuse, pipe, kern);
    throughput_row(("kernel tracefs, " + r).c_str(), kern, pipe, kern);
    throughput_row(("plain pipe, " + r + ", sleeps").c_str(), pipe_sleep, pipe_sleep, kern_sleep);
    throughput_row(("probefs, " + r + ", sleeps").c_str(), fuse_sleep, pipe_sleep, kern_sleep);
    throughput_row(("kernel tracefs, " + r + ", sleeps").c_str(), kern_sleep, pipe_sleep,
                   kern_sleep);
    throughput_row("plain pipe, unthrottled", pipe_max, pipe_max, kern_max);
    throughput_row("probefs, unthrottled", fuse_max, pipe_max, kern_max);
    throughput_row("kernel tracefs, unthrottled", kern_max, pipe_max, kern_max);
    auto met = [](const Throughput& t) {
      return !t.why.empty() ? "not measured"
             : t.rate() >= 2e6 && t.lost == 0 && t.lines == t.records ? "met" : "MISSED";
    };
    std::printf("  budget >= 2 M lines/s, 0 lost, at 2 M calls/s: target busy on its CPU: %s; "
                "target asleep between bursts: %s\n",
                met(fuse), met(fuse_sleep));
    std::printf("  (sleeps: the target makes its calls in bursts of 2048 and sleeps between "
                "them; otherwise it keeps its pace busy on its CPU. reader, daemon: the CPU "
                "they used while the records came, %% of one CPU)\n");
    std::printf("\n");
  }
  if ((all || o.only == "raw") && cpus > kRawCpu) {
    const uint64_t many = 1ULL << 40;
    Throughput pipe_max = run_throughput(s, Source::kPipe, many, 0, kUnthrottledMs);
    Throughput text = run_throughput(s, Source::kProbefs, many, 0, kUnthrottledMs);
    Throughput raw = run_throughput(s, Source::kProbefs, many, 0, kUnthrottledMs, false, true);
    // The budget's runs: the target writes its ring once over first, at the same pace
    // (the first write of each of its pages is a page fault in the target, tens of
    // microseconds on some virtual machines; the kernel's buffers are allocated before
    // tracing starts).
    const std::string ring_kb = s.mount->read_line("buffer_size_kb");
    auto prime_calls = [](unsigned long kb) { return uint64_t{kb} * 1024 / kRawRecordBytes; };
    Throughput paced = run_throughput(s, Source::kProbefs, many, kRawPacedRate, kUnthrottledMs,
                                      false, true,
                                      prime_calls(std::strtoul(ring_kb.c_str(), nullptr, 10)));
    // Again with rings that outlast a scheduler tick (trace-cmd -b), when the mount's are
    // smaller.
    Throughput paced_tick;
    const bool tick_row = std::strtoul(ring_kb.c_str(), nullptr, 10) < kRawTickRingKb;
    if (tick_row) {
      if (int e = s.mount->write("buffer_size_kb", std::to_string(kRawTickRingKb),
                                 O_WRONLY | O_TRUNC);
          e != 0) {
        paced_tick.why = std::string("buffer_size_kb: ") + strerror(e);
      } else {
        paced_tick = run_throughput(s, Source::kProbefs, many, kRawPacedRate, kUnthrottledMs,
                                    false, true, prime_calls(kRawTickRingKb));
        if (int r = s.mount->write("buffer_size_kb", ring_kb, O_WRONLY | O_TRUNC); r != 0)
          std::fprintf(stderr, "trace_pipe_bench: buffer_size_kb back to %s: %s\n",
                       ring_kb.c_str(), strerror(r));
      }
    }
    Throughput kraw = run_throughput(s, Source::kKernel, many, 0, kUnthrottledMs, false, true);
    std::printf("4. trace_pipe_raw: the kernel's ring-buffer pages, read() of %zu KiB in a loop "
                "on per_cpu/cpu%d/trace_pipe_raw; the target on CPU %d, unthrottled: %ld ms "
                "of calls\n",
                g_read_size / 1024, kRawCpu, kRawCpu, kUnthrottledMs);
    std::printf("  %-31s %9s %9s %9s %9s %7s %7s %6s %7s  %s\n", "", "calls/s", "records/s",
                "lost", "missing", "B/read", "reader", "daemon", "x pipe", "x kernel");
    throughput_row("plain pipe, text lines", pipe_max, pipe_max, kraw);
    throughput_row("probefs trace_pipe (text)", text, pipe_max, kraw);
    throughput_row("probefs trace_pipe_raw", raw, pipe_max, kraw);
    const std::string paced_name =
        strprintf("  the same at %ld M calls/s", kRawPacedRate / 1000000);
    throughput_row(paced_name.c_str(), paced, pipe_max, kraw);
    const std::string tick_name = strprintf("    with %lu KiB rings", kRawTickRingKb);
    if (tick_row) throughput_row(tick_name.c_str(), paced_tick, pipe_max, kraw);
    throughput_row("kernel tracefs trace_pipe_raw", kraw, pipe_max, kraw);
    auto frac = [](const Throughput& t) {
      return t.why.empty() && t.records > 0
                 ? strprintf("%.1f%%", 100.0 * static_cast<double>(t.lines) /
                                           static_cast<double>(t.records))
                 : std::string("-");
    };
    std::printf("  delivered of the calls made: raw %s, text %s (%s raw/text)\n",
                frac(raw).c_str(), frac(text).c_str(), ratio(raw.rate(), text.rate()).c_str());
    auto met = [](const Throughput& t) {
      return !t.why.empty() ? "not measured"
             : t.rate() >= 20e6 && t.lost == 0 && t.lines == t.records ? "met"
                                                                        : "MISSED";
    };
    std::printf("  budget >= 20 M records/s, 0 lost (the run at %ld M calls/s): %s KiB rings: %s",
                kRawPacedRate / 1000000, ring_kb.c_str(), met(paced));
    if (tick_row) std::printf("; %lu KiB rings: %s", kRawTickRingKb, met(paced_tick));
    std::printf("\n");
    if (tick_row)
      std::printf("  (a reader-side thread the scheduler puts behind the busy target can wait "
                  "up to a scheduler tick, 4 ms at HZ=250, for that CPU: a ring must outlast "
                  "it)\n");
    std::printf("\n");
  }
  if (all || o.only == "latency") {
    Latency pipe = run_latency(s, Source::kPipe, o.samples);
    Latency fuse = run_latency(s, Source::kProbefs, o.samples);
    Latency kern = run_latency(s, Source::kKernel, o.samples);
    std::printf("2. latency from a hit to its line in a blocked trace_pipe reader (CLOCK_MONOTONIC), "
                "%d requests\n",
                o.samples);
    std::printf("  %-34s %9s %9s %9s %7s %7s %8s  %s\n", "", "median us", "p99 us", "min us",
                "samples", "missed", "x pipe", "x kernel");
    latency_row("plain pipe: write -> blocked read", pipe, pipe, kern);
    latency_row("probefs", fuse, pipe, kern);
    latency_row("kernel tracefs (uprobe)", kern, pipe, kern);
    std::printf("\n");
  }
  if (all || o.only == "first") {
    FirstHit fuse = run_first_hit(s, Source::kProbefs, o.reps);
    FirstHit kern = run_first_hit(s, Source::kKernel, o.reps);
    std::printf("3. echo of a definition (and enable) until its first line is read, %d reps; "
                "the target calls bench_hit every 10 us\n",
                o.reps);
    std::printf("  %-26s %9s %9s %9s %10s %10s  %s\n", "", "median ms", "min ms", "max ms",
                "define ms", "enable ms", "x kernel");
    first_row("probefs kprobe_events", fuse, kern);
    first_row("kernel uprobe_events", kern, kern);
    std::printf("\n");
  }
  if (all || o.only == "python") run_python(s, o.python_calls, o.reps);
  kernel.reset();
  mount.stop();
  return 0;
}
