// The machine's own tracefs, to compare probefs with: a private mount of it under a new
// temporary directory, with an instance of its own there (instances/NAME: a buffer no one
// else writes to).
//
// A kernel whose tracefs is wedged (a lock left held) makes every process that touches it
// hang in an uninterruptible sleep, which no signal ends. So every step that touches the
// kernel's tracefs runs as a child process with a deadline; a child that does not end in
// time is sent SIGKILL and then left alone, never waited for, and from then on nothing
// more is tried: the caller skips. Such a kernel stays so until it reboots, so the finding
// is kept for this boot (a mark in the temporary directory holding the boot id): later
// runs skip at once instead of leaving one more unkillable child behind. The probes a test defined are
// disabled and removed at the end, the instance removed, the mount detached.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/fs/mount_fixture.h"

namespace probefs::fs::testing {

class KernelTracefs {
 public:
  struct Step {
    bool answered = false;  // false: the child did not end in time (it was abandoned)
    int exit_code = -1;
    std::string out, err;
  };

  KernelTracefs() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "probefs-ktr-XXXXXX").string();
    if (mkdtemp(tmpl.data())) dir_ = tmpl;
    group_ = "probefs_" + std::to_string(getpid());
    instance_ = dir_ + "/instances/" + group_;
  }
  ~KernelTracefs() { stop(); }
  KernelTracefs(const KernelTracefs&) = delete;
  KernelTracefs& operator=(const KernelTracefs&) = delete;

  // Mounts the kernel's tracefs and makes the instance: "" once ready, else the reason
  // (the caller skips).
  std::string start(int timeout_ms) {
    if (wedged().load() || marked_this_boot())
      return "the kernel's tracefs did not answer earlier (since this boot)";
    if (dir_.empty()) return "no temporary directory";
    if (geteuid() != 0) return "not root: the kernel's tracefs needs root";
    Step s = run("mount -t tracefs nodev \"$1\"", {dir_}, timeout_ms);
    if (!s.answered) return "mounting the kernel's tracefs did not answer";
    if (s.exit_code != 0) return "the kernel's tracefs cannot be mounted: " + s.err;
    mounted_ = true;
    if (access((dir_ + "/uprobe_events").c_str(), F_OK) != 0)
      return "the kernel has no uprobe events";
    // The first step that takes the kernel's event locks: the test of its health.
    s = run("mkdir \"$1\"", {instance_}, timeout_ms);
    if (!s.answered)
      return "the kernel's tracefs does not answer (making an instance did not end in " +
             std::to_string(timeout_ms) + " ms)";
    if (s.exit_code != 0) return "the kernel's tracefs has no instances: " + s.err;
    has_instance_ = true;
    return {};
  }

  const std::string& dir() const { return dir_; }
  // instances/NAME of this object, a full path.
  const std::string& instance() const { return instance_; }
  // A group name of this process's own for the probes a test defines.
  const std::string& group() const { return group_; }

  // Runs `bash -c SCRIPT bash ARGS...` with a deadline (see the header comment).
  Step run(const std::string& script, const std::vector<std::string>& args, int timeout_ms) {
    Step st;
    if (wedged().load()) return st;
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0) return st;
    if (pipe2(err, O_CLOEXEC) != 0) {
      close(out[0]);
      close(out[1]);
      return st;
    }
    std::vector<std::string> argv = {"bash", "-c", script, "bash"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> a;
    for (const std::string& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      int null = open("/dev/null", O_RDONLY);
      dup2(null, 0);
      dup2(out[1], 1);
      dup2(err[1], 2);
      execvp(a[0], a.data());
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    collect_output(out[0], err[0], deadline, &st.out, &st.err);
    int status = 0;
    if (pid > 0 && reap(pid, ms_left(deadline), &status)) {
      st.answered = true;
      st.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      return st;
    }
    // No answer: SIGKILL, and if even that does not end it (an uninterruptible sleep),
    // the child is left alone.
    if (pid > 0) {
      kill(pid, SIGKILL);
      reap(pid, 1000, &status);
    }
    wedged().store(true);
    mark_this_boot();
    return st;
  }

  // A probe to disable and remove at the end ("GROUP/EVENT").
  void remember_probe(const std::string& group_event) { probes_.push_back(group_event); }

  // Removes what start() and the test made. Called by the destructor.
  void stop() {
    const int t = 10000;
    for (const std::string& ge : probes_) {
      run("echo 0 > \"$1/events/$2/enable\"; echo 0 > \"$3/events/$2/enable\"; "
          "echo \"-:$2\" >> \"$3/uprobe_events\"",
          {instance_, ge, dir_}, t);
    }
    probes_.clear();
    if (has_instance_) run("rmdir \"$1\"", {instance_}, t);
    has_instance_ = false;
    if (mounted_) {
      // A lazy unmount never waits for the kernel's event locks; a child that still
      // holds a file of the mount keeps it alive alone.
      umount2(dir_.c_str(), MNT_DETACH);
      mounted_ = false;
    }
    if (!dir_.empty()) rmdir(dir_.c_str());
    dir_.clear();
  }

 private:
  // Once a step did not answer, for the rest of this process.
  static std::atomic<bool>& wedged() {
    static std::atomic<bool> w{false};
    return w;
  }

  static std::string mark_path() {
    return (std::filesystem::temp_directory_path() / "probefs-kernel-tracefs-wedged").string();
  }
  static std::string boot_id() {
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::string id;
    in >> id;
    return id;
  }
  static bool marked_this_boot() {
    std::ifstream in(mark_path());
    std::string id;
    in >> id;
    return !id.empty() && id == boot_id();
  }
  static void mark_this_boot() { std::ofstream(mark_path()) << boot_id() << "\n"; }

  // waitpid with a deadline, woken by the child's pidfd; false when it did not end.
  static bool reap(pid_t pid, int timeout_ms, int* status) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    int pfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
    bool done = false;
    for (;;) {
      pid_t r = waitpid(pid, status, WNOHANG);
      if (r == pid || r < 0) {
        done = r == pid;
        break;
      }
      int left = ms_left(deadline);
      if (left == 0 || pfd < 0) break;
      pollfd p{pfd, POLLIN, 0};
      poll(&p, 1, left);
    }
    if (pfd >= 0) close(pfd);
    return done;
  }

  std::string dir_, group_, instance_;
  bool mounted_ = false, has_instance_ = false;
  std::vector<std::string> probes_;
};

}  // namespace probefs::fs::testing
