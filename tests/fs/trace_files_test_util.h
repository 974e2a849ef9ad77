// What the trace files' tests need around a traced program: the program's stdin and
// stdout as pipes (one command line in, one answer line out, every wait bounded) and a
// guard that kills it whatever the test did.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>

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

 private:
  static void close_fd(int& fd) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  int in_[2] = {-1, -1};
  int out_[2] = {-1, -1};
  std::string buf_;
};

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
