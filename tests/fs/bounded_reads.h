// Reading trace_pipe-like files without ever hanging: non-blocking reads behind poll with
// a deadline, blocking reads done by a child process that is killed at the end, and
// a check that a thread or process sits blocked in a given system call (from
// /proc/.../syscall, which names the call only while the task is blocked in it).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <initializer_list>
#include <fstream>
#include <string>

#include "tests/fs/mount_fixture.h"

namespace probefs::fs::testing {

// Whether poll() says `fd` is readable within `timeout_ms`.
inline bool wait_readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, timeout_ms) > 0 && (p.revents & POLLIN);
}

// From a non-blocking fd, lines until `count` whole lines were read or `timeout_ms`
// passed (the text read, which may end in a partial line then).
inline std::string read_lines(int fd, size_t count, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string text;
  size_t lines = 0;
  while (lines < count) {
    char b[65536];
    ssize_t n = ::read(fd, b, sizeof b);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) lines += b[i] == '\n';
      text.append(b, static_cast<size_t>(n));
      continue;
    }
    if (n == 0 || errno != EAGAIN) break;
    int left = ms_left(deadline);
    if (left == 0) break;
    wait_readable(fd, left);
  }
  return text;
}

// What a non-blocking fd has now: reads until EAGAIN (or end of file, or an error).
inline std::string read_available(int fd) {
  std::string text;
  char b[65536];
  ssize_t n;
  while ((n = ::read(fd, b, sizeof b)) > 0) text.append(b, static_cast<size_t>(n));
  return text;
}

// Waits (bounded) until the task `proc` ("PID" or "PID/task/TID" under /proc) is blocked
// in one of the system calls `nrs`.
inline bool blocked_in(const std::string& proc, std::initializer_list<long> nrs, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    std::ifstream in("/proc/" + proc + "/syscall");
    long nr = -1;
    if (in >> nr && std::find(nrs.begin(), nrs.end(), nr) != nrs.end()) return true;
    if (ms_left(deadline) == 0) return false;
    // Nothing to wait on but the task's progress: look again shortly.
    pollfd none{-1, 0, 0};
    poll(&none, 0, 2);
  }
}

// Blocking read() calls on one open file of `path`, made by a child process when the
// parent says so; the parent learns each outcome through a pipe. The child is killed at
// destruction, so a read that never returns never holds the test.
class ChildReader {
 public:
  struct Outcome {
    bool answered = false;  // false: no outcome within the deadline (the read still blocks)
    int err = 0;            // the read's errno, 0 when it returned bytes (or end of file)
    std::string data;
  };

  explicit ChildReader(const std::string& path, size_t size = 65536) {
    int ctl[2], rep[2];
    if (pipe2(ctl, O_CLOEXEC) != 0) return;
    if (pipe2(rep, O_CLOEXEC) != 0) {
      close(ctl[0]);
      close(ctl[1]);
      return;
    }
    pid_ = fork();
    if (pid_ == 0) {
      close(ctl[1]);
      close(rep[0]);
      int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      send(rep[1], fd < 0 ? errno : 0, {});
      char go;
      while (fd >= 0 && ::read(ctl[0], &go, 1) == 1) {
        std::string buf(size, '\0');
        ssize_t n = ::read(fd, buf.data(), size);
        send(rep[1], n < 0 ? errno : 0, buf.substr(0, n < 0 ? 0 : static_cast<size_t>(n)));
      }
      _exit(0);
    }
    close(ctl[0]);
    close(rep[1]);
    to_ = ctl[1];
    from_ = rep[0];
    open_ = outcome(20000);
  }
  ~ChildReader() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      wait_child(pid_, 10000);
    }
    if (to_ >= 0) close(to_);
    if (from_ >= 0) close(from_);
  }
  ChildReader(const ChildReader&) = delete;
  ChildReader& operator=(const ChildReader&) = delete;

  pid_t pid() const { return pid_; }
  // The open's outcome (err 0: opened).
  const Outcome& opened() const { return open_; }

  // Asks for one more read().
  void read() { (void)!::write(to_, "g", 1); }

  // The next read's outcome, waiting at most `timeout_ms` for it.
  Outcome outcome(int timeout_ms) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      Outcome o;
      if (take(&o)) return o;
      int left = ms_left(deadline);
      if (left == 0 || from_ < 0) return {};
      pollfd p{from_, POLLIN, 0};
      if (poll(&p, 1, left) <= 0) continue;
      char b[65536];
      ssize_t n = ::read(from_, b, sizeof b);
      if (n <= 0) return {};
      buf_.append(b, static_cast<size_t>(n));
    }
  }

 private:
  // A report: "ERRNO LENGTH\n" and the bytes read.
  static void send(int fd, int err, const std::string& data) {
    std::string r = std::to_string(err) + " " + std::to_string(data.size()) + "\n" + data;
    (void)!::write(fd, r.data(), r.size());
  }
  bool take(Outcome* o) {
    size_t nl = buf_.find('\n');
    if (nl == std::string::npos) return false;
    int err = 0;
    size_t len = 0;
    if (sscanf(buf_.c_str(), "%d %zu", &err, &len) != 2 || buf_.size() < nl + 1 + len) return false;
    o->answered = true;
    o->err = err;
    o->data = buf_.substr(nl + 1, len);
    buf_.erase(0, nl + 1 + len);
    return true;
  }

  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  Outcome open_;
  std::string buf_;
};

}  // namespace probefs::fs::testing
