// For the tests of unmodified tracefs clients (trace-cmd, libtracefs programs) on a real
// mount through `probefs run`: whether a program is installed, whether this process may
// make a mount namespace, and the host's tracing mounts, which a run must leave as they
// were.
#pragma once

#include <sched.h>
#include <stdlib.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fs/mount_fixture.h"

namespace probefs::fs::testing {

inline constexpr const char* kTracingDir = "/sys/kernel/tracing";

// The non-empty lines of `text`.
inline std::set<std::string> lines_of(const std::string& text) {
  std::set<std::string> lines;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) lines.insert(line);
  return lines;
}

inline bool on_path(const std::string& prog) {
  const char* path = getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':'))
    if (access((dir + "/" + prog).c_str(), X_OK) == 0) return true;
  return false;
}

// Whether this process may make a mount namespace (root, and not refused by a container).
inline bool can_unshare_mounts() {
  pid_t pid = fork();
  if (pid == 0) _exit(unshare(CLONE_NEWNS) == 0 ? 0 : 1);
  int status = wait_child(pid, 10000);
  return status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// The host's mounts that a namespace gone wrong would change: those under /sys/kernel/
// (tracing, debug) and every tracefs, as "POINT TYPE" lines of /proc/self/mountinfo.
inline std::vector<std::string> host_tracing_mounts() {
  std::vector<std::string> found;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string id, parent, dev, root, point, opts, field, type;
    f >> id >> parent >> dev >> root >> point >> opts;
    while (f >> field && field != "-") {
    }
    f >> type;
    if (point.rfind("/sys/kernel/", 0) == 0 || type == "tracefs" || type == "debugfs")
      found.push_back(point + " " + type);
  }
  return found;
}

inline long fs_type(const std::string& path) {
  struct statfs sf;
  return statfs(path.c_str(), &sf) == 0 ? static_cast<long>(sf.f_type) : -1;
}

}  // namespace probefs::fs::testing

// trace-cmd is a package of the system (scripts/bootstrap installs it): without it the
// tests that run it skip, saying so.
#define SKIP_WITHOUT_TRACE_CMD()                  \
  if (!::probefs::fs::testing::on_path("trace-cmd")) \
  GTEST_SKIP() << "no trace-cmd on PATH (the trace-cmd package)"
