// What the trace files' tests need around a traced program: the program's stdin and
// stdout as pipes (one command line in, one answer line out, every wait bounded), a
// guard that kills it whatever the test did, and events defined straight through the
// tracer (the definition files are not involved).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "events/compile.h"
#include "events/parse.h"
#include "fs/tracefs.h"
#include "tests/fs/line_reader.h"
#include "tracee/probe_places.h"
#include "tracee/tracer.h"

namespace probefs::fs::testing {

class ProgramPipes {
 public:
  ProgramPipes() {
    if (pipe2(in_, O_CLOEXEC) != 0 || pipe2(out_, O_CLOEXEC) != 0) in_[0] = -1;
  }
  ~ProgramPipes() {
    for (int* fd : {&in_[0], &in_[1], &out_[0], &out_[1]}) close_fd(*fd);
  }
  ProgramPipes(const ProgramPipes&) = delete;
  ProgramPipes& operator=(const ProgramPipes&) = delete;

  bool ok() const { return in_[0] >= 0; }
  int child_stdin() const { return in_[0]; }
  int child_stdout() const { return out_[1]; }
  // Once the program runs, the parent keeps only its own ends.
  void parent_side() {
    close_fd(in_[0]);
    close_fd(out_[1]);
  }

  // The answer to `cmd` (without its newline), or "" after `timeout_ms` or at EOF.
  std::string ask(const std::string& cmd, int timeout_ms = 30000) {
    std::string l = cmd + "\n";
    if (write(in_[1], l.data(), l.size()) != static_cast<ssize_t>(l.size())) return "";
    return line(timeout_ms);
  }

  std::string line(int timeout_ms = 30000) { return read_line(out_[0], &buf_, timeout_ms); }

 private:
  static void close_fd(int& fd) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  int in_[2] = {-1, -1};
  int out_[2] = {-1, -1};
  std::string buf_;
};

// Defines `line` (uprobe syntax when it names a file offset, else kprobe syntax) as an
// enabled probe of a new event, published in the EventTable as the definition files
// publish one. The event's id; *out, when given, gets the compiled event.
inline uint16_t define_event(Tracefs& fs, tracee::Tracer& tracer, const std::string& line,
                             events::CompiledEvent* out = nullptr) {
  events::ParseResult r = line.find(":0x") != std::string::npos
                              ? events::parse_uprobe_command(line)
                              : events::parse_kprobe_command(line);
  EXPECT_EQ(r.status, events::ParseStatus::kDefine) << line;
  events::CompiledEvent c;
  events::Diagnostic d;
  auto any_address = [](std::string_view, uint64_t* addr) {
    *addr = 0;
    return true;
  };
  EXPECT_TRUE(events::compile(r.def, any_address, &c, &d)) << line;
  const uint16_t id = fs.events().allocate_id();
  auto v = std::make_shared<EventView>();
  v->id = id;
  v->system = r.def.group;
  v->name = r.def.event;
  v->compiled = c;
  v->kprobe_style = r.def.syntax == events::ProbeSyntax::kKprobe;
  fs.events().publish(v);
  tracee::ProbeSpec s;
  s.def = r.def;
  s.compiled = c;
  s.event_id = id;
  s.enabled = true;
  tracee::ProbeId pid = 0;
  EXPECT_EQ(tracer.define_probe(s, &pid, &d), 0) << line << ": " << d.message();
  if (out) *out = c;
  return id;
}

class KillOnExit {
 public:
  ~KillOnExit() {
    if (pid_ > 0) kill(pid_, SIGKILL);
  }
  void set(pid_t pid) { pid_ = pid; }

 private:
  pid_t pid_ = 0;
};

#if defined(PROBEFS_TRACED_PROG) && defined(PROBEFS_AGENT_PATH)
// The trace files' tests: a Tracer with the real agent, a Tracefs over it, the bundled
// traced_prog run under it on pipes (launch()), and every file opened through the tree.
class TracedProgramTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(make()); }

  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      int st;
      (void)tracer_->wait_exit(pid_, 10000, &st);
    }
    fs_.reset();
    tracer_.reset();
  }

  // A new tracer and Tracefs: `cpus` CPUs (0: the machine's), each thread's ring
  // `buffer_kb` (0: the default).
  bool make(int cpus = 0, uint32_t buffer_kb = 0) {
    fs_.reset();
    tracer_.reset();
    tracee::Tracer::Options o;
    o.agent_path = PROBEFS_AGENT_PATH;
    if (buffer_kb != 0) o.buffer_size_kb = buffer_kb;
    std::string err;
    tracer_ = tracee::Tracer::create(o, &err);
    EXPECT_NE(tracer_, nullptr) << err;
    if (!tracer_) return false;
    Tracefs::Options fo;
    fo.cpus = cpus;
    fo.agent_path = PROBEFS_AGENT_PATH;
    fs_ = std::make_unique<Tracefs>(*tracer_, fo);
    return true;
  }

  // Defines `line` as an enabled probe of a new event (define_event): its id.
  uint16_t define(const std::string& line) { return define_event(*fs_, *tracer_, line); }

  // p:t/add PROG:0xOFF a=%di b=%si, on traced_add (uprobe syntax): its event id.
  uint16_t define_add() {
    uint64_t off = 0;
    EXPECT_EQ(tracee::symbol_file_offset(PROBEFS_TRACED_PROG, "traced_add", &off), 0);
    char line[1024];
    snprintf(line, sizeof line, "p:t/add %s:0x%llx a=%%di b=%%si", PROBEFS_TRACED_PROG,
             static_cast<unsigned long long>(off));
    return define(line);
  }

  // traced_prog (or another program that speaks on stdin and stdout the same way), until
  // it says it is ready.
  bool launch(const std::string& program = PROBEFS_TRACED_PROG) {
    tracee::Tracer::LaunchSpec s;
    s.argv = {program};
    s.stdin_fd = pipes_.child_stdin();
    s.stdout_fd = pipes_.child_stdout();
    std::string err;
    int rc = tracer_->launch(s, &pid_, &err);
    EXPECT_EQ(rc, 0) << err;
    if (rc != 0) return false;
    guard_.set(pid_);
    pipes_.parent_side();
    return pipes_.line() == "ready";
  }

  // traced_add(i, 2i) for i in [0, n), answered with their sum.
  void call(long n) {
    ASSERT_EQ(pipes_.ask("call " + std::to_string(n)),
              "ok " + std::to_string(3 * (n * (n - 1) / 2)));
  }

  Request request(int flags) const {
    Request rq;
    rq.pid = static_cast<pid_t>(gettid());
    rq.flags = flags;
    return rq;
  }

  // An open file of the tree: with `err`, the open's errno goes there; else it must open.
  std::unique_ptr<Handle> open(const std::string& path, int flags, int* err = nullptr) {
    std::unique_ptr<Handle> h;
    const int rc = fs_->tree().open(path, request(flags), flags, &h);
    if (err) *err = rc;
    else EXPECT_EQ(rc, 0) << path;
    return h;
  }

  // One open and one write(): the bytes taken, or the open's or the write's errno.
  int64_t write(const std::string& path, std::string_view data, int flags = O_WRONLY) {
    int err = 0;
    std::unique_ptr<Handle> h = open(path, flags, &err);
    if (err != 0) return err;
    return h->write(request(flags), 0, data);
  }

  // Every read of a non-blocking pipe file (trace_pipe, trace_pipe_raw) until EAGAIN, each
  // read's bytes apart, each read `size` bytes at most.
  std::vector<std::string> drain(const std::string& path, size_t size = 1 << 20) {
    auto h = open(path, O_RDONLY | O_NONBLOCK);
    std::vector<std::string> reads;
    if (!h) return reads;
    const Request rq = request(O_RDONLY | O_NONBLOCK);
    for (;;) {
      std::string part;
      const int rc = h->read(rq, 0, size, &part);
      if (rc == -EAGAIN) return reads;
      EXPECT_EQ(rc, 0);
      EXPECT_FALSE(part.empty());
      if (rc != 0 || part.empty()) return reads;
      reads.push_back(part);
    }
  }

  std::unique_ptr<tracee::Tracer> tracer_;
  std::unique_ptr<Tracefs> fs_;
  ProgramPipes pipes_;
  KillOnExit guard_;
  pid_t pid_ = 0;
};
#endif

}  // namespace probefs::fs::testing
