// trace-cmd end to end on a real mount, run unmodified through `probefs run` (a private
// mount namespace as root, the preloaded library otherwise, and with --shim in one test):
// record of a program launched under the mount (an entry and a return event, a filter,
// -P, -F and -c, trace_marker's writes), start/extract/stop and show, stream, record sent
// to a listener on loopback; each recording read back with `trace-cmd report`, whose
// values must be those the calls print on the mount's own trace_pipe. Every child
// (trace-cmd with its per-CPU readers, the programs, the listener) runs bounded in a
// process group of its own, killed at the end whatever the test did; what trace-cmd
// writes goes in a directory removed at the end.
//
// trace-cmd 3.1.6. record and start take -d: without it trace-cmd turns the function
// tracer on through /proc/sys/kernel/ftrace_enabled, which is the kernel's, not a mount's.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fs/mount_fixture.h"
#include "tests/fs/program_process.h"
#include "tests/fs/tracefs_clients.h"

namespace probefs::fs {
namespace {

using testing::Clock;
using testing::CommandResult;
using testing::host_tracing_mounts;
using testing::Mount;
using testing::ms_left;
using testing::TempDir;
using testing::ProgramProcess;

// What one trace-cmd command may take at most.
constexpr int kCommandMs = 60000;


// A command in a process group of its own (trace-cmd forks a reader per CPU), its stdin
// on a pipe the test writes to and closes, its stdout and stderr on pipes read as it
// runs. At the end the whole group is killed and the command reaped, whatever state it
// is in.
class Group {
 public:
  explicit Group(const std::vector<std::string>& argv) {
    int in[2], out[2], err[2];
    if (pipe2(in, O_CLOEXEC) != 0) return;
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) return;
    std::vector<char*> a;
    for (const std::string& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);
      dup2(in[0], 0);
      dup2(out[1], 1);
      dup2(err[1], 2);
      execvp(a[0], a.data());
      _exit(127);
    }
    if (pid_ > 0) setpgid(pid_, pid_);  // as the child does: whichever runs first
    close(in[0]);
    close(out[1]);
    close(err[1]);
    in_fd_ = in[1];
    out_fd_ = out[0];
    err_fd_ = err[0];
    if (pid_ > 0) pidfd_ = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
  }

  ~Group() { finish(0); }
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& out() const { return out_; }

  // Writes `text` to its stdin (a few lines: the pipe holds them). A command that is gone
  // makes it fail (EPIPE), not end the test: SIGPIPE is held back for the write.
  bool send(const std::string& text) {
    if (in_fd_ < 0) return false;
    sigset_t pipe_sig, old;
    sigemptyset(&pipe_sig);
    sigaddset(&pipe_sig, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_sig, &old);
    const ssize_t n = write(in_fd_, text.data(), text.size());
    const timespec now{0, 0};
    if (n < 0 && errno == EPIPE) sigtimedwait(&pipe_sig, nullptr, &now);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return n == static_cast<ssize_t>(text.size());
  }
  // Its stdin ends.
  void close_input() {
    if (in_fd_ >= 0) close(in_fd_);
    in_fd_ = -1;
  }
  const std::string& err() const { return err_; }

  // Reads its output until `until` says done, it ended, or `timeout_ms` passed; whether
  // `until` said done.
  template <typename Until>
  bool read_until(Until until, int timeout_ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      if (until()) return true;
      if (ms_left(deadline) == 0 || (out_fd_ < 0 && err_fd_ < 0)) return false;
      pump(ms_left(deadline));
    }
  }

  // Until stdout has `text` (bounded).
  bool wait_out(const std::string& text, int timeout_ms) {
    return read_until([&] { return out_.find(text) != std::string::npos; }, timeout_ms);
  }

  // Whether it ended within `timeout_ms` (it is not reaped yet); reads its output meanwhile.
  bool ended(int timeout_ms) {
    if (status_ != kRunning) return true;
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      siginfo_t info{};
      if (pid_ <= 0 || waitid(P_PID, pid_, &info, WEXITED | WNOHANG | WNOWAIT) != 0) return true;
      if (info.si_pid == pid_) return true;
      if (ms_left(deadline) == 0) return false;
      pump(ms_left(deadline));
    }
  }

  // Waits at most `timeout_ms` for it to end, kills what is left of its group, reaps it,
  // and reads the rest of its output. Its wait status, -1 when it had to be killed.
  int finish(int timeout_ms) {
    if (status_ != kRunning) return status_;
    const bool by_itself = ended(timeout_ms);
    if (pid_ > 0) {
      kill(-pid_, SIGKILL);  // the group's id stays reserved until the leader is reaped
      int st = -1;
      if (waitpid(pid_, &st, 0) == pid_ && by_itself) status_ = st;
    }
    if (status_ == kRunning) status_ = -1;
    read_until([] { return false; }, 5000);  // what is in the pipes, up to their end
    close_input();
    for (int* fd : {&out_fd_, &err_fd_, &pidfd_})
      if (*fd >= 0) close(*fd), *fd = -1;
    return status_;
  }

 private:
  static constexpr int kRunning = -2;

  // One wait for output or its end (at most `timeout_ms`), and what came.
  void pump(int timeout_ms) {
    pollfd p[3] = {{out_fd_, POLLIN, 0}, {err_fd_, POLLIN, 0}, {pidfd_, POLLIN, 0}};
    if (poll(p, 3, timeout_ms) <= 0) return;
    for (int i = 0; i < 2; ++i) {
      if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char b[4096];
      ssize_t n = read(p[i].fd, b, sizeof b);
      int* fd = i == 0 ? &out_fd_ : &err_fd_;
      if (n <= 0) {
        close(*fd);
        *fd = -1;
      } else {
        (i == 0 ? out_ : err_).append(b, static_cast<size_t>(n));
      }
    }
    // Its end, once seen, needs no more waiting on the pidfd.
    if (p[2].fd >= 0 && (p[2].revents & POLLIN)) {
      close(pidfd_);
      pidfd_ = -1;
    }
  }

  pid_t pid_ = -1;
  int in_fd_ = -1, out_fd_ = -1, err_fd_ = -1, pidfd_ = -1;
  int status_ = kRunning;
  std::string out_, err_;
};

// A command run to its end (at most `timeout_ms`) in a group of its own.
CommandResult run_group(const std::vector<std::string>& argv, const std::string& input = "",
                        int timeout_ms = kCommandMs) {
  Group g(argv);
  g.send(input);
  g.close_input();
  CommandResult r;
  r.status = g.finish(timeout_ms);
  r.out = g.out();
  r.err = g.err();
  return r;
}

// The children of `pid`, from /proc.
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream f(stat.substr(paren + 1));
    std::string state;
    long ppid = 0;
    if (f >> state >> ppid && ppid == pid) out.push_back(static_cast<pid_t>(std::stol(name)));
  }
  return out;
}

// Whether trace-cmd `pid` has a reader waiting on per_cpu/cpuN/trace_pipe_raw for every
// CPU N: a child with that file open, sleeping in select() or poll() (x86-64's numbers in
// /proc/PID/syscall), which it calls only in its recording loop.
bool readers_waiting(pid_t pid) {
  const long cpus = sysconf(_SC_NPROCESSORS_CONF);
  std::vector<bool> waiting(static_cast<size_t>(cpus), false);
  for (pid_t child : children_of(pid)) {
    const std::string proc = "/proc/" + std::to_string(child);
    std::ifstream sc(proc + "/syscall");
    std::string nr;
    sc >> nr;
    if (nr != "7" && nr != "23" && nr != "270" && nr != "271") continue;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(proc + "/fd", ec)) {
      const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
      const size_t at = target.rfind("/per_cpu/cpu");
      if (ec || at == std::string::npos) continue;
      const std::string tail = target.substr(at + 12);
      const size_t slash = tail.find('/');
      if (slash == std::string::npos || tail.substr(slash) != "/trace_pipe_raw") continue;
      const long cpu = std::strtol(tail.c_str(), nullptr, 10);
      if (cpu >= 0 && cpu < cpus) waiting[static_cast<size_t>(cpu)] = true;
    }
  }
  return std::find(waiting.begin(), waiting.end(), false) == waiting.end();
}

// trace-cmd 3.1.6 forks a reader per CPU and goes on without waiting for them: a reader
// told to stop before it entered its recording loop never reads its CPU (trace-record.c:
// create_recorder()), or dies of the signal, and trace-cmd empties the buffer as it ends.
// So a program whose calls are recorded makes them only once every reader waits on its
// trace_pipe_raw (bounded; re-checked every few ms: nothing to wait on but their progress).
bool wait_readers(pid_t pid, int timeout_ms = kCommandMs) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!readers_waiting(pid)) {
    if (ms_left(deadline) == 0) return false;
    pollfd none{-1, 0, 0};
    poll(&none, 0, 5);
  }
  return true;
}

// One record as `trace-cmd report`, `show`, `stream` and the mount's trace print it:
// "COMM-PID [CPU] (flags) TIME: EVENT: (PLACE) ARGS".
struct Record {
  std::string comm;
  long pid = -1;
  std::string event;
  std::string args;
};

// The records of a text; `others` gets the lines that are neither records nor headers.
std::vector<Record> records_of(const std::string& text, std::string* others = nullptr) {
  static const std::regex kLine(
      R"(^\s*(.*)-(\d+)\s+\[\d+\].*?\s\d+\.\d+:\s+(\w+):\s+\(([^)]*)\)\s*(.*)$)");
  std::vector<Record> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_match(line, m, kLine)) {
      out.push_back({m[1], std::stol(m[2]), m[3], m[5]});
    } else if (others && !line.empty() && line[0] != '#' && line.rfind("cpus=", 0) != 0) {
      *others += line + "\n";
    }
  }
  return out;
}

// What the calls traced_add(i, 2i), i in [first, first + n) print: "a=0x.. b=0x.." of
// the entry event, "v=0x.." of the return event.
std::vector<std::string> add_args(long n, long first = 0) {
  std::vector<std::string> out;
  for (long i = first; i < first + n; ++i) {
    char b[64];
    snprintf(b, sizeof b, "a=0x%lx b=0x%lx", i, 2 * i);
    out.push_back(b);
  }
  return out;
}
std::vector<std::string> ret_args(long n) {
  std::vector<std::string> out;
  for (long i = 0; i < n; ++i) {
    char b[64];
    snprintf(b, sizeof b, "v=0x%lx", 3 * i);
    out.push_back(b);
  }
  return out;
}

// The arguments of `event`'s records, in order.
std::vector<std::string> args_of(const std::vector<Record>& records, const std::string& event) {
  std::vector<std::string> out;
  for (const Record& r : records)
    if (r.event == event) out.push_back(r.args);
  return out;
}

// traced_prog's answer to "pid", its first after "ready" ("ok PID"); -1 if none.
long answered_pid(const std::string& out) {
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("ok ", 0) == 0) return std::stol(line.substr(3));
  return -1;
}

// A free TCP port of this machine, for the listener (it may be taken before the listener
// binds it: the caller tries again).
int free_tcp_port() {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof a;
  int port = -1;
  if (bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(s);
  return port;
}

// Whether a socket listens on TCP `port` (IPv4 or IPv6), from /proc/net/tcp{,6}.
bool listening_on(int port) {
  char want[8];
  snprintf(want, sizeof want, ":%04X", port);
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string slot, local, remote, state;
      f >> slot >> local >> remote >> state;
      if (state == "0A" && local.size() > 5 && local.compare(local.size() - 5, 5, want) == 0)
        return true;
    }
  }
  return false;
}

// The names in `dir`.
std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    names.push_back(e.path().filename().string());
  return names;
}

// Waits (woken by inotify, bounded) until `dir` holds a file of trace-cmd listen put
// together: a NAME.dat, and no NAME.cpuN left (the listener deletes them once the .dat is
// written). That .dat's path, or "".
std::string wait_collected(const std::string& dir, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd >= 0) inotify_add_watch(fd, dir.c_str(), IN_CREATE | IN_DELETE | IN_CLOSE_WRITE);
  std::string found;
  for (;;) {
    std::string dat;
    bool parts = false;
    for (const std::string& n : names_in(dir)) {
      if (n.find(".cpu") != std::string::npos) parts = true;
      if (n.size() > 4 && n.compare(n.size() - 4, 4, ".dat") == 0) dat = dir + "/" + n;
    }
    if (!dat.empty() && !parts) {
      found = dat;
      break;
    }
    if (ms_left(deadline) == 0 || fd < 0) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, ms_left(deadline)) > 0) {
      char b[4096];
      while (read(fd, b, sizeof b) > 0) {
      }
    }
  }
  if (fd >= 0) close(fd);
  return found;
}

// A mount with an entry and a return event on traced_prog's traced_add, and a directory
// for trace-cmd's files. The host's tracing mounts must be as they were at the end.
class TraceCmd : public ::testing::Test {
 protected:
  void SetUp() override {
    SKIP_WITHOUT_TRACE_CMD();
    host_mounts_ = host_tracing_mounts();
    host_taken_ = true;
    ASSERT_TRUE(m_.ok()) << m_.daemon_stderr();
    ASSERT_FALSE(dir_.path().empty());
    ASSERT_EQ(m_.write("kprobe_events", "p:tc/add traced_prog:traced_add a=%di b=%si\n"), 0);
    ASSERT_EQ(m_.write("kprobe_events", "r:tc/ret traced_prog:traced_add v=$retval\n"), 0);
  }

  void TearDown() override {
    if (!host_taken_) return;  // skipped before
    EXPECT_EQ(host_tracing_mounts(), host_mounts_);
  }

  // probefs run MOUNT -- CMD...: the way probefs chooses (the namespace as root).
  std::vector<std::string> on_mount(const std::vector<std::string>& cmd) const {
    std::vector<std::string> argv = {PROBEFS_BIN, "run", m_.dir(), "--"};
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    return argv;
  }
  CommandResult run(const std::vector<std::string>& cmd, const std::string& input = "") {
    return run_group(on_mount(cmd), input);
  }

  // probefs exec MOUNT -- traced_prog: a program launched as a target, for trace-cmd to run.
  std::vector<std::string> launched() const {
    return {PROBEFS_BIN, "exec", m_.dir(), "--", PROBEFS_TRACED_PROG};
  }

  // A trace-cmd record that runs traced_prog (launched()) through `argv`: the program's
  // stdin is `input`, given once every reader of trace-cmd waits, then closed (the
  // program ends at its end).
  CommandResult record_launched(const std::vector<std::string>& argv, const std::string& input) {
    Group g(argv);
    EXPECT_TRUE(wait_readers(g.pid())) << "trace-cmd's readers never waited\n" << g.err();
    g.send(input);
    g.close_input();
    CommandResult r;
    r.status = g.finish(kCommandMs);
    r.out = g.out();
    r.err = g.err();
    return r;
  }

  // `trace-cmd report -i FILE`: its records; a line it prints that is not one fails.
  std::vector<Record> report(const std::string& file) {
    CommandResult r = run_group({"trace-cmd", "report", "-i", file});
    EXPECT_EQ(r.exit_code(), 0) << r.err;
    std::string others;
    std::vector<Record> records = records_of(r.out, &others);
    EXPECT_EQ(others, "") << r.out;
    return records;
  }

  Mount m_;
  TempDir dir_;
  std::vector<std::string> host_mounts_;
  bool host_taken_ = false;
};

TEST_F(TraceCmd, RecordOfALaunchedProgramReportsEachCallAndReturnWithItsPidCommAndValues) {
  const std::string file = dir_.file("launched.dat");
  std::vector<std::string> cmd = {"trace-cmd", "record", "-d", "-e", "tc", "-o", file};
  for (const std::string& a : launched()) cmd.push_back(a);
  CommandResult r = record_launched(on_mount(cmd), "pid\ncall 50\n");
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  const long pid = answered_pid(r.out);
  ASSERT_GT(pid, 0) << r.out;
  EXPECT_NE(r.out.find("\nok 3675\n"), std::string::npos) << r.out;

  const std::vector<Record> records = report(file);
  std::vector<std::string> got, want;
  for (const Record& rec : records) {
    EXPECT_EQ(rec.pid, pid) << rec.comm << " " << rec.event << " " << rec.args;
    EXPECT_EQ(rec.comm, "traced_prog") << rec.pid << " " << rec.event << " " << rec.args;
    got.push_back(rec.event + " " + rec.args);
  }
  // Each call's entry, then its return.
  const std::vector<std::string> adds = add_args(50), rets = ret_args(50);
  for (size_t i = 0; i < adds.size(); ++i) {
    want.push_back("add " + adds[i]);
    want.push_back("ret " + rets[i]);
  }
  EXPECT_EQ(got, want);

  // The same calls print the same values on the mount's trace_pipe (read to its end).
  ASSERT_EQ(m_.write("trace", "", O_WRONLY | O_TRUNC), 0);
  ASSERT_EQ(m_.write("events/tc/enable", "1"), 0);
  CommandResult again = run_group(launched(), "call 50\n");
  ASSERT_EQ(again.exit_code(), 0) << again.err;
  const std::vector<Record> piped = records_of(m_.read("trace_pipe"));
  EXPECT_EQ(args_of(piped, "add"), args_of(records, "add"));
  EXPECT_EQ(args_of(piped, "ret"), args_of(records, "ret"));
}

TEST_F(TraceCmd, RecordWithAFilterKeepsOnlyItsEventsMatchingRecordsAndEveryOneOfTheOther) {
  const std::string file = dir_.file("filtered.dat");
  std::vector<std::string> cmd = {"trace-cmd", "record", "-d",      "-e", "tc:add", "-f",
                                  "a < 10",    "-e",     "tc:ret", "-o", file};
  for (const std::string& a : launched()) cmd.push_back(a);
  CommandResult r = record_launched(on_mount(cmd), "call 20\n");
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(r.out, "ready\nok 570\n");
  const std::vector<Record> records = report(file);
  EXPECT_EQ(args_of(records, "add"), add_args(10));
  EXPECT_EQ(args_of(records, "ret"), ret_args(20));
  EXPECT_EQ(records.size(), 30u);
}

// -B: the events after it go into an instance trace-cmd makes (instances/NAME), with
// their filter, beside the top level's; report names that buffer's records, and the
// instance is gone once the record ends.
TEST_F(TraceCmd, RecordIntoAnInstanceBesideTheTopLevel) {
  const std::string file = dir_.file("instance.dat");
  std::vector<std::string> cmd = {"trace-cmd", "record", "-d", "-e", "tc:add", "-B", "inst",
                                  "-e",        "tc:ret", "-f", "v < 30", "-o", file};
  for (const std::string& a : launched()) cmd.push_back(a);
  CommandResult r = record_launched(on_mount(cmd), "call 20\n");
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  std::vector<std::string> top_adds, top_rets, inst_adds, inst_rets;
  for (const Record& rec : report(file)) {
    const bool in_instance = rec.comm.rfind("inst:", 0) == 0;
    std::string comm = in_instance ? rec.comm.substr(5) : rec.comm;
    comm.erase(0, comm.find_first_not_of(' '));
    EXPECT_EQ(comm, "traced_prog") << rec.comm;
    auto& list = rec.event == "add" ? (in_instance ? inst_adds : top_adds)
                                    : (in_instance ? inst_rets : top_rets);
    list.push_back(rec.args);
  }
  EXPECT_EQ(top_adds, add_args(20));
  EXPECT_EQ(inst_rets, ret_args(10));
  EXPECT_TRUE(top_rets.empty());
  EXPECT_TRUE(inst_adds.empty());
  EXPECT_TRUE(std::filesystem::is_empty(m_.path("instances")));
}

// start turns the event and tracing on and returns; extract takes what the buffers hold
// into a file, stop turns tracing off. show is `cat trace`: after a start again, the
// next program's calls and nothing of what extract took.
TEST_F(TraceCmd, StartExtractStopGiveAFileOfTheRecordsAndShowPrintsTheNextProgramsCalls) {
  CommandResult r = run({"trace-cmd", "start", "-d", "-e", "tc:add"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(m_.read("events/tc/add/enable"), "1\n");
  EXPECT_EQ(m_.read("tracing_on"), "1\n");
  CommandResult first = run_group(launched(), "pid\ncall 5\n");
  ASSERT_EQ(first.exit_code(), 0) << first.err;
  const long first_pid = answered_pid(first.out);
  ASSERT_GT(first_pid, 0) << first.out;

  const std::string file = dir_.file("extracted.dat");
  r = run({"trace-cmd", "extract", "-o", file});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  r = run({"trace-cmd", "stop"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  EXPECT_EQ(m_.read("tracing_on"), "0\n");
  std::vector<Record> records = report(file);
  EXPECT_EQ(args_of(records, "add"), add_args(5));
  for (const Record& rec : records) EXPECT_EQ(rec.pid, first_pid) << rec.args;

  r = run({"trace-cmd", "start", "-d", "-e", "tc:add"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  CommandResult second = run_group(launched(), "pid\ncall 3\n");
  ASSERT_EQ(second.exit_code(), 0) << second.err;
  const long second_pid = answered_pid(second.out);
  r = run({"trace-cmd", "show"});
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  records = records_of(r.out);
  EXPECT_EQ(args_of(records, "add"), add_args(3)) << r.out;
  for (const Record& rec : records) {
    EXPECT_EQ(rec.pid, second_pid) << rec.args;
    EXPECT_EQ(rec.comm, "traced_prog") << rec.args;
  }
  r = run({"trace-cmd", "stop"});
  EXPECT_EQ(r.exit_code(), 0) << r.err;
}

// stream prints each record as it comes (its stdout line-buffered by stdbuf: a pipe would
// keep trace-cmd's lines in its stdio buffer until it ends), and ends on SIGINT.
TEST_F(TraceCmd, StreamPrintsRecordsAsTheyComeAndEndsOnSigint) {
  ProgramProcess prog(ProgramProcess::under_probefs(m_.dir()));
  ASSERT_TRUE(prog.ready());
  Group stream(on_mount({"stdbuf", "-oL", "trace-cmd", "stream", "-d", "-e", "tc:add"}));
  ASSERT_TRUE(stream.wait_out("Hit Ctrl^C to stop recording\n", kCommandMs))
      << stream.out() << stream.err();
  ASSERT_TRUE(wait_readers(stream.pid())) << stream.err();
  auto streamed = [&] { return !records_of(stream.out()).empty(); };
  const auto deadline = Clock::now() + std::chrono::milliseconds(kCommandMs);
  while (!streamed() && ms_left(deadline) > 0) {
    ASSERT_TRUE(prog.call(1));
    stream.read_until(streamed, 200);
  }
  ASSERT_TRUE(streamed()) << stream.out() << stream.err();

  // Interrupted, trace-cmd 3.1.6's stream flushes its per-CPU readers' pipes one last
  // time, waiting without a timeout: it ends once one more record comes through them,
  // or on a second SIGINT. So, as at a terminal: Ctrl-C, and again, calls meanwhile.
  while (!stream.ended(0) && ms_left(deadline) > 0) {
    kill(-stream.pid(), SIGINT);
    ASSERT_TRUE(prog.call(1));
    stream.ended(300);
  }
  const int status = stream.finish(0);
  EXPECT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << status << "\n" << stream.err();
  std::string others;
  const std::vector<Record> records = records_of(stream.out(), &others);
  EXPECT_EQ(others, "Hit Ctrl^C to stop recording\n");
  for (const Record& rec : records) {
    EXPECT_EQ(rec.pid, prog.pid()) << rec.args;
    EXPECT_EQ(rec.event, "add");
    EXPECT_EQ(rec.args, "a=0x0 b=0x0");
  }
  EXPECT_EQ(prog.quit(), 0);
}

// -P PID: the records of that process only, while another calls beside it; the recording
// ends when that process does.
TEST_F(TraceCmd, RecordOfOnePidKeepsOnlyTheRecordsOfThatProcess) {
  ProgramProcess traced(ProgramProcess::under_probefs(m_.dir()));
  ProgramProcess other(ProgramProcess::under_probefs(m_.dir()));
  ASSERT_TRUE(traced.ready() && other.ready());
  const std::string file = dir_.file("one-pid.dat");
  Group record(on_mount({"stdbuf", "-oL", "trace-cmd", "record", "-d", "-P",
                         std::to_string(traced.pid()), "-e", "tc:add", "-o", file}));
  ASSERT_TRUE(record.wait_out("Hit Ctrl^C to stop recording\n", kCommandMs))
      << record.out() << record.err();
  ASSERT_TRUE(wait_readers(record.pid())) << record.err();
  ASSERT_TRUE(other.call(7));
  ASSERT_TRUE(traced.call(5));
  ASSERT_TRUE(other.call(3));
  const pid_t traced_pid = traced.pid();
  EXPECT_EQ(traced.quit(), 0);
  const int status = record.finish(kCommandMs);
  ASSERT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << status << "\n" << record.err();

  const std::vector<Record> records = report(file);
  EXPECT_EQ(args_of(records, "add"), add_args(5));
  for (const Record& rec : records) EXPECT_EQ(rec.pid, traced_pid) << rec.args;
  EXPECT_EQ(other.quit(), 0);
}

// -F keeps the records of the command's process; with -c (options/event-fork) those of
// the processes it forks too.
TEST_F(TraceCmd, RecordOfACommandFollowsItsForkChildrenOnlyWithDashC) {
  for (const bool children : {false, true}) {
    SCOPED_TRACE(children ? "-F -c" : "-F");
    const std::string file = dir_.file(children ? "children.dat" : "command.dat");
    std::vector<std::string> cmd = {"trace-cmd", "record", "-d", "-F", "-e", "tc:add", "-o", file};
    if (children) cmd.push_back("-c");
    for (const std::string& a : launched()) cmd.push_back(a);
    CommandResult r = record_launched(on_mount(cmd), "pid\ncall 2\nfork 3\n");
    ASSERT_EQ(r.exit_code(), 0) << r.err;
    const long pid = answered_pid(r.out);
    // "ok CHILD_PID STATUS", the last answer.
    const size_t last = r.out.rfind("\nok ");
    ASSERT_NE(last, std::string::npos) << r.out;
    const long child = std::atol(r.out.c_str() + last + 4);
    ASSERT_GT(pid, 0) << r.out;
    ASSERT_GT(child, 0) << r.out;

    std::vector<Record> parent_records, child_records;
    for (const Record& rec : report(file)) {
      if (rec.pid == pid) {
        parent_records.push_back(rec);
      } else if (rec.pid == child) {
        child_records.push_back(rec);
      } else {
        ADD_FAILURE() << "a record of " << rec.comm << "-" << rec.pid << ": " << rec.args;
      }
    }
    EXPECT_EQ(args_of(parent_records, "add"), add_args(2));
    EXPECT_EQ(args_of(child_records, "add"), children ? add_args(3) : std::vector<std::string>{});
  }
}

// trace_marker's writes are the kernel's ftrace print event in the recording; report
// prints them as the mount's trace does (and the kernel's recording does): the writer's
// function, then the text.
TEST_F(TraceCmd, RecordedMarkerWritesReportAsTheMountsTracePrintsThem) {
  const std::string file = dir_.file("marker.dat");
  const std::string marker = m_.path("trace_marker");
  CommandResult r = record_launched(
      on_mount({"trace-cmd", "record", "-d", "-e", "tc:add", "-o", file, "sh", "-c",
                "read -r line && printf '%s\\n' \"$line\" > \"$1\"", "sh", marker}),
      "hello-marker\n");
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  CommandResult rep = run_group({"trace-cmd", "report", "-i", file});
  ASSERT_EQ(rep.exit_code(), 0) << rep.err;
  static const std::regex kPrint(R"(^\s*sh-\d+\s+\[\d+\]\s+\d+\.\d+:\s+print:\s+(.*)$)");
  std::vector<std::string> printed;
  std::istringstream lines(rep.out);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_match(line, m, kPrint)) printed.push_back(m[1]);
  }
  EXPECT_EQ(printed, std::vector<std::string>{"tracing_mark_write: hello-marker"}) << rep.out;

  // The mount's own text of such a write.
  ASSERT_EQ(m_.write("trace_marker", "again\n", O_WRONLY), 0);
  EXPECT_NE(m_.read("trace").find(": tracing_mark_write: again\n"), std::string::npos)
      << m_.read("trace");
}

// record -N sends the mount's records to `trace-cmd listen` on loopback; the collector's
// file, put together from its per-CPU parts, reports them.
TEST_F(TraceCmd, RecordSentToAListenerOnLoopbackIsReportedFromTheCollectorsFile) {
  const std::string collected = dir_.file("collector");
  ASSERT_EQ(mkdir(collected.c_str(), 0700), 0);
  // The port: one free a moment ago; taken meanwhile, the listener fails and another is
  // tried.
  std::unique_ptr<Group> listener;
  int port = -1;
  for (int attempt = 0; attempt < 5 && !listener; ++attempt) {
    port = free_tcp_port();
    ASSERT_GT(port, 0);
    // On the mount too: libtracefs in the listener mounts the host's tracefs when it finds
    // none.
    auto l = std::make_unique<Group>(
        on_mount({"trace-cmd", "listen", "-p", std::to_string(port), "-d", collected}));
    // Re-checked every 20 ms (the listener says nothing when it listens), and at its end.
    const auto deadline = Clock::now() + std::chrono::milliseconds(20000);
    while (!listening_on(port) && !l->ended(20) && ms_left(deadline) > 0) {
    }
    if (listening_on(port) && !l->ended(0)) listener = std::move(l);
  }
  ASSERT_TRUE(listener) << "trace-cmd listen never listened";

  std::vector<std::string> cmd = {"trace-cmd", "record", "-N",
                                  "localhost:" + std::to_string(port), "-d", "-e", "tc:add"};
  for (const std::string& a : launched()) cmd.push_back(a);
  CommandResult r = record_launched(on_mount(cmd), "pid\ncall 8\n");
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  const long pid = answered_pid(r.out);
  ASSERT_GT(pid, 0) << r.out;

  const std::string file = wait_collected(collected, kCommandMs);
  ASSERT_NE(file, "") << listener->out() << listener->err();
  kill(-listener->pid(), SIGINT);
  const int status = listener->finish(20000);
  EXPECT_TRUE(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << status << "\n" << listener->err();

  const std::vector<Record> records = report(file);
  EXPECT_EQ(args_of(records, "add"), add_args(8));
  for (const Record& rec : records) EXPECT_EQ(rec.pid, pid) << rec.args;
}

// --shim: libtracefs in trace-cmd is pointed at the mount by the preloaded library. The
// debugfs trace-cmd record mounts stays in a mount namespace of the test's own where one
// can be made.
TEST_F(TraceCmd, RecordAndReportThroughThePreloadedLibrary) {
  // The preloaded library comes before everything else in the processes trace-cmd starts,
  // probefs exec among them; an ASan build of probefs would refuse to run behind it.
  const char* asan = getenv("ASAN_OPTIONS");
  std::vector<std::string> argv = {
      "env", "ASAN_OPTIONS=" + std::string(asan ? asan : "") + ":verify_asan_link_order=0"};
  if (testing::can_unshare_mounts()) {
    for (const char* a : {"unshare", "-m", "--propagation", "private"}) argv.push_back(a);
  }
  const std::string file = dir_.file("shim.dat");
  const std::vector<std::string> run = {PROBEFS_BIN, "run",    "--shim", m_.dir(), "--",
                                        "trace-cmd", "record", "-d",     "-e",     "tc",
                                        "-o",        file};
  argv.insert(argv.end(), run.begin(), run.end());
  for (const std::string& a : launched()) argv.push_back(a);
  CommandResult r = record_launched(argv, "pid\ncall 10\n");
  ASSERT_EQ(r.exit_code(), 0) << r.err;
  const long pid = answered_pid(r.out);
  ASSERT_GT(pid, 0) << r.out;

  const std::vector<Record> records = report(file);
  EXPECT_EQ(args_of(records, "add"), add_args(10));
  EXPECT_EQ(args_of(records, "ret"), ret_args(10));
  for (const Record& rec : records) {
    EXPECT_EQ(rec.pid, pid) << rec.args;
    EXPECT_EQ(rec.comm, "traced_prog") << rec.args;
  }
}

}  // namespace
}  // namespace probefs::fs
