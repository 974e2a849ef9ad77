// The subcommands that talk to a running daemon: through its mount's `targets` file, as
// any other client of the mount would (fs/control_files.cc describes the commands).
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fs/command.h"
#include "tracee/untraceable.h"

namespace probefs::fs {

namespace {

constexpr long kFuseSuperMagic = 0x65735546;

void say(const std::string& line) { fprintf(stderr, "probefs: %s\n", line.c_str()); }

std::string read_answer(int fd) {
  char buf[4096];
  ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return {};
  std::string s(buf, static_cast<size_t>(n));
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

int open_targets(const std::string& mnt) {
  std::string problem = check_probefs_mount(mnt);
  if (!problem.empty()) {
    say(problem);
    return -1;
  }
  int fd = open((mnt + "/targets").c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) say(mnt + "/targets: " + strerror(errno));
  return fd;
}

// What execvp would run for argv[0]: a name with a '/' as it is, else the first
// executable file of that name in PATH (the name itself when there is none: execvp's
// error says so).
std::string command_path(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = getenv("PATH");
  const std::string dirs = path ? path : "/usr/local/bin:/bin:/usr/bin";
  for (size_t at = 0; at <= dirs.size();) {
    size_t colon = dirs.find(':', at);
    if (colon == std::string::npos) colon = dirs.size();
    const std::string dir = colon > at ? dirs.substr(at, colon - at) : ".";
    const std::string candidate = dir + "/" + name;
    struct stat st;
    if (access(candidate.c_str(), X_OK) == 0 && stat(candidate.c_str(), &st) == 0 &&
        S_ISREG(st.st_mode))
      return candidate;
    at = colon + 1;
  }
  return name;
}

}  // namespace

std::string check_probefs_mount(const std::string& mnt) {
  struct statfs sf;
  if (statfs(mnt.c_str(), &sf) != 0) return mnt + ": " + strerror(errno);
  if (sf.f_type != kFuseSuperMagic || access((mnt + "/targets").c_str(), F_OK) != 0)
    return mnt + ": not a probefs mount";
  return {};
}

int exec_command(const std::string& mnt, const std::vector<std::string>& argv, bool strict) {
  int fd = open_targets(mnt);
  if (fd < 0) return 1;
  // A program the agent cannot enter: said here and to the daemon (for `targets` and
  // error_log), then run untraced, or refused.
  const std::string program = command_path(argv[0]);
  const tracee::Untraceable u = tracee::untraceable_program(program, getuid(), getgid());
  if (!u.state.empty()) {
    say("exec: " + u.why + (strict ? "; not run (--strict)" : "; it runs untraced"));
    if (strict) {
      close(fd);
      return 126;
    }
    const std::string cmd = "untraceable " + u.state + " " + program;
    if (write(fd, cmd.data(), cmd.size()) != static_cast<ssize_t>(cmd.size()))
      say("exec: the daemon was not told: " + read_answer(fd));
    close(fd);
    return exec_or_status(argv);
  }
  if (write(fd, "exec", 4) != 4) {
    int err = errno;
    std::string why = read_answer(fd);
    say("exec: " + (why.empty() ? std::string(strerror(err)) : why));
    close(fd);
    return 1;
  }
  // "LINK AGENT_PATH"
  std::string answer = read_answer(fd);
  close(fd);
  size_t sp = answer.find(' ');
  if (sp == std::string::npos) {
    say("exec: the daemon gave no link");
    return 1;
  }
  std::string link = answer.substr(0, sp);
  std::string agent = answer.substr(sp + 1);
  preload_first(agent);
  setenv("PROBEFS_AGENT_LINK", link.c_str(), 1);
  return exec_or_status(argv);
}

void preload_first(const std::string& library) {
  const char* old = getenv("LD_PRELOAD");
  const std::string preload = library + (old && *old ? ":" + std::string(old) : "");
  setenv("LD_PRELOAD", preload.c_str(), 1);
}

int exec_or_status(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execvp(args[0], args.data());
  int err = errno;
  say(argv[0] + ": " + strerror(err));
  // The shell's convention: 127 for a command not found, 126 for one that cannot run.
  return err == ENOENT ? 127 : 126;
}

int attach_command(const std::string& mnt, const std::vector<std::string>& pids,
                   bool attach) {
  int fd = open_targets(mnt);
  if (fd < 0) return 1;
  int status = 0;
  const char* verb = attach ? "attach" : "detach";
  for (const std::string& pid : pids) {
    std::string cmd = std::string(verb) + " " + pid;
    if (write(fd, cmd.data(), cmd.size()) != static_cast<ssize_t>(cmd.size())) {
      int err = errno;
      std::string why = read_answer(fd);
      say(std::string(verb) + " " + pid + ": " + (why.empty() ? strerror(err) : why));
      status = 1;
    }
  }
  close(fd);
  return status;
}

}  // namespace probefs::fs
