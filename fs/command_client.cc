// The subcommands that talk to a running daemon: through its mount's `targets` file, as
// any other client of the mount would (fs/control_files.cc describes the commands).
#include <errno.h>
#include <fcntl.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fs/command.h"

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

}  // namespace

std::string check_probefs_mount(const std::string& mnt) {
  struct statfs sf;
  if (statfs(mnt.c_str(), &sf) != 0) return mnt + ": " + strerror(errno);
  if (sf.f_type != kFuseSuperMagic || access((mnt + "/targets").c_str(), F_OK) != 0)
    return mnt + ": not a probefs mount";
  return {};
}

int exec_command(const std::string& mnt, const std::vector<std::string>& argv) {
  int fd = open_targets(mnt);
  if (fd < 0) return 1;
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
