// Drives tests/tracee/traced_prog.c over pipes: one command line in, one answer line out,
// every wait bounded.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string>

namespace probefs::tracee::testing {

class ProgPipes {
 public:
  ProgPipes() {
    if (pipe2(in_, O_CLOEXEC) != 0 || pipe2(out_, O_CLOEXEC) != 0) in_[0] = -1;
  }
  ~ProgPipes() { close_all(); }
  ProgPipes(const ProgPipes&) = delete;
  ProgPipes& operator=(const ProgPipes&) = delete;

  bool ok() const { return in_[0] >= 0; }
  // The ends the program gets as stdin and stdout.
  int child_stdin() const { return in_[0]; }
  int child_stdout() const { return out_[1]; }
  // Once the program runs, the parent keeps only its own ends (so that EOF is seen).
  void parent_side() {
    close_fd(in_[0]);
    close_fd(out_[1]);
  }

  bool send(const std::string& line) {
    std::string l = line + "\n";
    return write(in_[1], l.data(), l.size()) == static_cast<ssize_t>(l.size());
  }

  // The next line (without its newline), or "" after `timeout_ms` or at EOF.
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

  std::string ask(const std::string& cmd, int timeout_ms = 30000) {
    return send(cmd) ? line(timeout_ms) : "";
  }

 private:
  static void close_fd(int& fd) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  void close_all() {
    close_fd(in_[0]);
    close_fd(in_[1]);
    close_fd(out_[0]);
    close_fd(out_[1]);
  }
  int in_[2] = {-1, -1};
  int out_[2] = {-1, -1};
  std::string buf_;
};

// Kills a process at scope exit, whatever the test did. Whoever started it (the tracer,
// for a launched target) reaps it.
class KillGuard {
 public:
  explicit KillGuard(pid_t pid = 0) : pid_(pid) {}
  ~KillGuard() {
    if (pid_ > 0) kill(pid_, SIGKILL);
  }
  void set(pid_t pid) { pid_ = pid; }
  void release() { pid_ = 0; }

 private:
  pid_t pid_;
};

// Waits at most `timeout_ms` for process `pid` (any process, not only a child) to end.
inline bool wait_gone(pid_t pid, int timeout_ms) {
  int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;
  pollfd p{fd, POLLIN, 0};
  int r = poll(&p, 1, timeout_ms);
  close(fd);
  return r == 1;
}

}  // namespace probefs::tracee::testing
