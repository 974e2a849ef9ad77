// Helpers of the tests that take a running program's files away (mapped_files_test.cc,
// tracer_mapped_test.cc): a scratch directory, files put in place as a linker or a package
// manager does, and checks run in a forked child that may drop to an ordinary user.
#pragma once

#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>

namespace probefs::tracee::testing {

inline constexpr uid_t kNobody = 65534;

// What a checker child found wrong, one line each.
#define MAPPED_CHECK(cond)                                                                \
  do {                                                                                    \
    if (!(cond)) fails += std::string(__FILE__ ":") + std::to_string(__LINE__) + ": " #cond \
                          " is false\n";                                                  \
  } while (0)
#define MAPPED_CHECK_EQ(a, b)                                                           \
  do {                                                                                  \
    const long long va_ = static_cast<long long>(a), vb_ = static_cast<long long>(b);   \
    if (va_ != vb_)                                                                     \
      fails += std::string(__FILE__ ":") + std::to_string(__LINE__) + ": " #a " = " +   \
               std::to_string(va_) + ", expected " #b " = " + std::to_string(vb_) + "\n"; \
  } while (0)

// A directory of its own under /tmp, removed with all it holds when the test ends, failed
// or not. Readable by everyone: a target of uid 65534 runs the files in it.
class Scratch {
 public:
  Scratch() {
    char t[] = "/tmp/probefs-mapped-XXXXXX";
    if (mkdtemp(t) != nullptr) dir_ = t;
    if (!dir_.empty()) chmod(dir_.c_str(), 0755);
  }
  ~Scratch() {
    if (dir_.empty()) return;
    nftw(
        dir_.c_str(),
        [](const char* p, const struct stat*, int, FTW*) {
          remove(p);
          return 0;  // on with the rest whatever one removal says
        },
        16, FTW_DEPTH | FTW_PHYS);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  bool ok() const { return !dir_.empty(); }
  // Gives the directory to `uid`, for a test child of that uid that changes it.
  bool give_to(uid_t uid) const { return chown(dir_.c_str(), uid, uid) == 0; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

 private:
  std::string dir_;
};

// Copies `from` to a new file `to` (a new inode), executable and readable by everyone.
inline bool copy_file(const std::string& from, const std::string& to) {
  const int in = open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return false;
  const int out = open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
  bool ok = out >= 0;
  char buf[65536];
  ssize_t n;
  while (ok && (n = read(in, buf, sizeof buf)) > 0) ok = write(out, buf, static_cast<size_t>(n)) == n;
  close(in);
  if (out >= 0 && close(out) != 0) ok = false;
  return ok && fchmodat(AT_FDCWD, to.c_str(), 0755, 0) == 0;
}

// The way a linker or a package manager puts a new build in place: a new file renamed
// over the old path (the old inode lives on, unlinked, in what maps it).
inline bool replace_with(const std::string& from, const std::string& path) {
  const std::string tmp = path + ".new";
  return copy_file(from, tmp) && rename(tmp.c_str(), path.c_str()) == 0;
}

// Reads one line from `fd` within `timeout_ms`; "" on timeout or end.
inline std::string read_line(int fd, int timeout_ms) {
  std::string line;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (line.empty() || line.back() != '\n') {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) return "";
    char c;
    if (read(fd, &c, 1) != 1) return "";
    line += c;
  }
  return line;
}

// Drops to `uid` for good (its own group, no supplementary groups). In a forked child.
inline bool become(uid_t uid) {
  if (uid == 0) return true;
  return setgroups(0, nullptr) == 0 && setgid(uid) == 0 && setuid(uid) == 0;
}

// Runs `check` in a child of `uid`, which returns what it found wrong; fails the test with
// that, or when the child does not finish within a minute (it is killed then).
inline void run_checker(uid_t uid, const std::function<std::string()>& check) {
  int p[2];
  ASSERT_EQ(pipe2(p, O_CLOEXEC), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(p[0]);
    alarm(90);  // the parent gives up first; this only keeps a lost child from lingering
    std::string fails;
    if (!become(uid)) fails = "cannot become uid " + std::to_string(uid) + "\n";
    else fails = check();
    if (fails.empty()) fails = "ok\n";
    (void)!write(p[1], fails.data(), fails.size());
    _exit(0);
  }
  close(p[1]);
  std::string report;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  bool ended = false;
  while (!ended) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    pollfd pf{p[0], POLLIN, 0};
    if (left <= 0 || poll(&pf, 1, static_cast<int>(left)) <= 0) break;
    char buf[4096];
    const ssize_t n = read(p[0], buf, sizeof buf);
    if (n <= 0) ended = true;
    else report.append(buf, static_cast<size_t>(n));
  }
  close(p[0]);
  if (!ended) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(ended) << "the checker (uid " << uid << ") did not finish: killed";
  EXPECT_EQ(report, "ok\n") << "as uid " << uid;
}

}  // namespace probefs::tracee::testing
