// The dynamic-events tests' driver for the traced program (tests/tracee/traced_prog.c):
// launched through the tracer with its stdin and stdout on pipes, one command line in, one
// answer line out, every wait bounded, killed at the end whatever the test did.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include "tests/fs/line_reader.h"

#include "tracee/tracer.h"

namespace probefs::fs::testing {

class TracedProgram {
 public:
  TracedProgram() {
    if (pipe2(in_, O_CLOEXEC) != 0 || pipe2(out_, O_CLOEXEC) != 0) in_[0] = -1;
  }
  ~TracedProgram() {
    // The tracer reaps what it launched.
    if (pid_ > 0) kill(pid_, SIGKILL);
    for (int* fd : {&in_[0], &in_[1], &out_[0], &out_[1]}) close_fd(*fd);
  }
  TracedProgram(const TracedProgram&) = delete;
  TracedProgram& operator=(const TracedProgram&) = delete;

  // Launches `path` under `tracer`; true once it said "ready".
  bool start(tracee::Tracer& tracer, const std::string& path, std::string* error) {
    if (in_[0] < 0) return false;
    tracee::Tracer::LaunchSpec s;
    s.argv = {path};
    s.stdin_fd = in_[0];
    s.stdout_fd = out_[1];
    if (tracer.launch(s, &pid_, error) != 0) {
      pid_ = 0;
      return false;
    }
    close_fd(in_[0]);
    close_fd(out_[1]);
    return line() == "ready";
  }

  pid_t pid() const { return pid_; }

  // Sends one command; its answer line, or "" after `timeout_ms` or at EOF.
  std::string ask(const std::string& cmd, int timeout_ms = 30000) {
    std::string l = cmd + "\n";
    if (::write(in_[1], l.data(), l.size()) != static_cast<ssize_t>(l.size())) return "";
    return line(timeout_ms);
  }

  // traced_add(i, 2*i) for i in [0, n); the program checks every result itself.
  bool call(long n) {
    return ask("call " + std::to_string(n)) == "ok " + std::to_string(3 * (n * (n - 1) / 2));
  }

 private:
  static void close_fd(int& fd) {
    if (fd >= 0) close(fd);
    fd = -1;
  }

  std::string line(int timeout_ms = 30000) { return read_line(out_[0], &buf_, timeout_ms); }

  int in_[2] = {-1, -1};   // the program's stdin
  int out_[2] = {-1, -1};  // its stdout
  pid_t pid_ = 0;
  std::string buf_;
};

}  // namespace probefs::fs::testing
