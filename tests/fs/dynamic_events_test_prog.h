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

  std::string line(int timeout_ms = 30000) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        std::string l = buf_.substr(0, nl);
        buf_.erase(0, nl + 1);
        return l;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      deadline - std::chrono::steady_clock::now())
                      .count();
      if (left <= 0) return "";
      pollfd p{out_[0], POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char b[4096];
      ssize_t n = read(out_[0], b, sizeof b);
      if (n <= 0) return "";
      buf_.append(b, static_cast<size_t>(n));
    }
  }

  int in_[2] = {-1, -1};   // the program's stdin
  int out_[2] = {-1, -1};  // its stdout
  pid_t pid_ = 0;
  std::string buf_;
};

}  // namespace probefs::fs::testing
