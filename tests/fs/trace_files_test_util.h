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

#include "events/compile.h"
#include "events/parse.h"
#include "fs/tracefs.h"
#include "tests/fs/line_reader.h"
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

}  // namespace probefs::fs::testing
