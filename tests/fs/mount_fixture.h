// End-to-end tests on a real mount: runs the probefs command in the foreground on a fresh
// directory, waits (event-driven, bounded) until the mount is there, and takes everything
// down again even when a test fails: the mount, the daemon, the programs a test started.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace probefs::fs::testing {

using Clock = std::chrono::steady_clock;

inline int ms_left(Clock::time_point deadline) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

// Waits for a child at most `timeout_ms`; kills it (SIGKILL) after that. Its wait status,
// or -1 when it had to be killed.
inline int wait_child(pid_t pid, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  int pfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (pfd >= 0) close(pfd);
      return status;
    }
    if (r < 0) {
      if (pfd >= 0) close(pfd);
      return -1;
    }
    int left = ms_left(deadline);
    if (left == 0 || pfd < 0) break;
    pollfd p{pfd, POLLIN, 0};
    poll(&p, 1, left);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  if (pfd >= 0) close(pfd);
  return -1;
}

// Reads two pipes (a child's stdout and stderr) until both end or `deadline`, then closes
// them.
inline void collect_output(int out_fd, int err_fd, Clock::time_point deadline, std::string* out,
                           std::string* err) {
  pollfd p[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0 && ms_left(deadline) > 0) {
    if (poll(p, 2, ms_left(deadline)) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP))) continue;
      char b[4096];
      ssize_t n = read(p[i].fd, b, sizeof b);
      if (n <= 0) {
        close(p[i].fd);
        p[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? out : err)->append(b, static_cast<size_t>(n));
      }
    }
  }
  for (auto& q : p)
    if (q.fd >= 0) close(q.fd);
}

struct CommandResult {
  int status = -1;  // wait status; -1: timed out (killed)
  std::string out, err;
  int exit_code() const { return status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
};

// Runs argv with stdout and stderr captured, at most `timeout_ms`.
inline CommandResult run_command(const std::vector<std::string>& argv, int timeout_ms = 30000,
                                 const std::string& input = "") {
  CommandResult res;
  int out[2], err[2], in[2];
  if (pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) || pipe2(in, O_CLOEXEC)) return res;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    std::vector<char*> a;
    for (const std::string& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execvp(a[0], a.data());
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  close(in[0]);
  if (!input.empty()) (void)!write(in[1], input.data(), input.size());
  close(in[1]);
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  collect_output(out[0], err[0], deadline, &res.out, &res.err);
  res.status = wait_child(pid, ms_left(deadline) + 1000);
  return res;
}

// Whether `dir` is a mount point of type fuse.probefs (from /proc/self/mountinfo).
inline bool probefs_mounted(const std::string& dir) {
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

// Waits until probefs_mounted(dir) == want, woken by mount table changes. Bounded.
inline bool wait_mounted(const std::string& dir, bool want, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  int fd = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
  for (;;) {
    if (probefs_mounted(dir) == want) break;
    int left = ms_left(deadline);
    if (left == 0) break;
    pollfd p{fd, POLLPRI, 0};
    // A change marks the file; reading it again re-arms the notification.
    if (poll(&p, 1, std::min(left, 200)) > 0) {
      char b[4096];
      lseek(fd, 0, SEEK_SET);
      while (read(fd, b, sizeof b) > 0) {
      }
    }
  }
  if (fd >= 0) close(fd);
  return probefs_mounted(dir) == want;
}

inline std::string slurp_fd(int fd) {
  std::string s;
  char b[65536];
  ssize_t n;
  while ((n = read(fd, b, sizeof b)) > 0) s.append(b, static_cast<size_t>(n));
  return s;
}

// A directory of the test's own under /tmp, removed with everything in it at the end.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/probefs-test-XXXXXX";
    if (mkdtemp(tmpl)) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A probefs daemon in the foreground on a fresh directory.
class Mount {
 public:
  explicit Mount(std::vector<std::string> extra_args = {}) {
    char tmpl[] = "/tmp/probefs-mnt-XXXXXX";
    if (!mkdtemp(tmpl)) return;
    dir_ = tmpl;
    std::vector<std::string> argv = {PROBEFS_BIN, "-f"};
    for (auto& a : extra_args) argv.push_back(a);
    argv.push_back(dir_);
    int errp[2];
    if (pipe2(errp, O_CLOEXEC) != 0) return;
    daemon_ = fork();
    if (daemon_ == 0) {
      dup2(errp[1], 2);
      std::vector<char*> a;
      for (std::string& s : argv) a.push_back(s.data());
      a.push_back(nullptr);
      execv(a[0], a.data());
      _exit(127);
    }
    close(errp[1]);
    stderr_fd_ = errp[0];
    fcntl(stderr_fd_, F_SETFL, O_NONBLOCK);
    ok_ = wait_mounted(dir_, true, 20000);
  }

  ~Mount() { unmount(); }

  bool ok() const { return ok_; }
  const std::string& dir() const { return dir_; }
  std::string path(const std::string& rel) const { return dir_ + "/" + rel; }
  pid_t daemon() const { return daemon_; }

  // fusermount3 -u, then the daemon must end by itself (bounded; killed otherwise).
  // Returns the daemon's wait status (-1: it had to be killed).
  int unmount() {
    int status = -1;
    if (daemon_ > 0) {
      if (probefs_mounted(dir_)) run_command({"fusermount3", "-u", dir_}, 20000);
      if (probefs_mounted(dir_)) umount2(dir_.c_str(), MNT_DETACH);
      status = wait_child(daemon_, 20000);
      daemon_ = -1;
    }
    if (!dir_.empty()) {
      if (probefs_mounted(dir_)) umount2(dir_.c_str(), MNT_DETACH);
      rmdir(dir_.c_str());
    }
    if (stderr_fd_ >= 0) {
      daemon_stderr_ += slurp_fd(stderr_fd_);
      close(stderr_fd_);
      stderr_fd_ = -1;
    }
    dir_.clear();
    return status;
  }

  // What the daemon wrote to stderr so far.
  std::string daemon_stderr() {
    if (stderr_fd_ >= 0) daemon_stderr_ += slurp_fd(stderr_fd_);
    return daemon_stderr_;
  }

  // The whole text of a file (one open, reads until EOF), or "<errno N>" on failure.
  std::string read(const std::string& rel) const {
    int fd = open(path(rel).c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return "<errno " + std::to_string(errno) + ">";
    std::string s;
    char b[65536];
    ssize_t n;
    while ((n = ::read(fd, b, sizeof b)) > 0) s.append(b, static_cast<size_t>(n));
    int e = errno;
    close(fd);
    if (n < 0 && e != EAGAIN) return "<errno " + std::to_string(e) + ">";
    return s;
  }

  // One write() of `text` to a file opened with `flags`: 0 or the errno.
  int write(const std::string& rel, const std::string& text, int flags = O_WRONLY | O_APPEND) const {
    int fd = open(path(rel).c_str(), flags | O_CLOEXEC);
    if (fd < 0) return errno;
    ssize_t n = ::write(fd, text.data(), text.size());
    int e = n < 0 ? errno : 0;
    close(fd);
    return e;
  }

 private:
  std::string dir_;
  pid_t daemon_ = -1;
  int stderr_fd_ = -1;
  std::string daemon_stderr_;
  bool ok_ = false;
};

}  // namespace probefs::fs::testing
