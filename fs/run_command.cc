// probefs run: an unmodified tracefs client (trace-cmd, a program using libtracefs, perf)
// with a mount as its tracefs. libtracefs finds tracefs only as the first /proc/mounts
// entry of type `tracefs`, never by environment, and a FUSE mount is `fuse.probefs`. So:
//
//   namespace (root)  CMD runs in a mount namespace of its own (private: nothing done
//                     there reaches the host) in which the mount covers a tracefs at
//                     /sys/kernel/tracing, the only tracefs left there. libtracefs takes
//                     that entry's path and the lookup reaches the mount on top; perf,
//                     whose magic check fails on FUSE, falls back to the same entry.
//   shim (anyone)     LD_PRELOAD=libprobefs-tracefs.so (tools/tracefs_shim) with
//                     PROBEFS_TRACING_DIR=MNT: its constructor calls libtracefs's own
//                     tracefs_set_tracing_dir(); TRACEFS_PATH=MNT is perf's override.
//
// Either way CMD replaces probefs, so its exit status (or its signal) is the command's.
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "fs/command.h"

namespace probefs::fs {

namespace {

constexpr const char* kTracingDir = "/sys/kernel/tracing";

void say(const std::string& line) { fprintf(stderr, "probefs: %s\n", line.c_str()); }

// A path as /proc/self/mountinfo writes it: space, tab, newline and backslash as \ooo.
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3') {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 +
                                      (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

struct MountEntry {
  std::string point;
  std::string type;
};

// This namespace's mounts, oldest first: the order of /proc/mounts.
std::vector<MountEntry> read_mounts() {
  std::vector<MountEntry> mounts;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string id, parent, dev, root, point, opts, field, type;
    f >> id >> parent >> dev >> root >> point >> opts;
    while (f >> field && field != "-") {
    }
    f >> type;
    mounts.push_back({unescape(point), type});
  }
  return mounts;
}

std::string failed(const std::string& what) { return what + ": " + strerror(errno); }

// In a fresh mount namespace (after unshare): makes mount propagation private, takes every
// tracefs mount away but those at /sys/kernel/tracing (mounting one there if there is
// none), and binds `mnt` on top of it. Other tracefs mounts go rather than being covered
// too: CMD should not find the kernel's tracefs by another path. One the kernel automounts
// later (debugfs's tracing/) comes after ours in /proc/mounts, and clients take the first.
// "" when done, else the step that failed.
std::string cover_tracing_dir(const std::string& mnt) {
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    return failed("making / private");
  // Unmounting a path takes its top mount: tracefs mounts stacked under others need rounds.
  for (int round = 0;; ++round) {
    bool left = false;
    for (const MountEntry& m : read_mounts()) {
      if (m.type != "tracefs" || m.point == kTracingDir) continue;
      if (round == 16) return "unmounting " + m.point + ": still a tracefs";
      if (umount2(m.point.c_str(), MNT_DETACH) != 0) return failed("unmounting " + m.point);
      left = true;
    }
    if (!left) break;
  }
  bool have_tracefs = false;
  for (const MountEntry& m : read_mounts())
    if (m.type == "tracefs" && m.point == kTracingDir) have_tracefs = true;
  if (!have_tracefs && mount("nodev", kTracingDir, "tracefs", 0, nullptr) != 0)
    return failed(std::string("mounting tracefs on ") + kTracingDir);
  if (mount(mnt.c_str(), kTracingDir, nullptr, MS_BIND, nullptr) != 0)
    return failed(std::string("binding the mount on ") + kTracingDir);
  // CMD must never reach the kernel's tracefs believing it is the mount.
  std::string problem = check_probefs_mount(kTracingDir);
  return problem.empty() ? "" : "after the bind, " + problem;
}

}  // namespace

int run_command(const std::string& mnt, const std::vector<std::string>& argv,
                const std::string& shim, bool force_shim) {
  std::string problem = check_probefs_mount(mnt);
  if (!problem.empty()) {
    say(problem);
    return 2;
  }
  char real[PATH_MAX];
  if (!realpath(mnt.c_str(), real)) {
    say(mnt + ": " + strerror(errno));
    return 2;
  }
  // Without CAP_SYS_ADMIN unshare fails (EPERM): the shim's case, taken without a word.
  bool in_namespace = false;
  if (!force_shim && unshare(CLONE_NEWNS) == 0) {
    std::string why = cover_tracing_dir(real);
    if (why.empty())
      in_namespace = true;
    else
      say("run: " + why + "; preloading libprobefs-tracefs.so instead");
  }
  if (!in_namespace) {
    if (shim.empty()) {
      say("run: cannot find libprobefs-tracefs.so (set PROBEFS_TRACEFS_SHIM to its path; it "
          "is built where libtracefs is installed)");
      return 1;
    }
    preload_first(shim);
    setenv("PROBEFS_TRACING_DIR", real, 1);
    setenv("TRACEFS_PATH", real, 1);
  }
  return exec_or_status(argv);
}

}  // namespace probefs::fs
