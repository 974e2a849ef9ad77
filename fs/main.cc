// The probefs command (fs/command.h): argument parsing and the daemon's life.
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "events/kstrto.h"
#include "events/ring.h"
#include "fs/command.h"
#include "fs/fuse_server.h"
#include "fs/tracefs.h"
#include "tracee/tracer.h"

#ifndef PROBEFS_VERSION
#define PROBEFS_VERSION "0"
#endif
// Defined where libtracefs was found (tools/tracefs_shim).
#ifndef PROBEFS_TRACEFS_SHIM_BUILD_PATH
#define PROBEFS_TRACEFS_SHIM_BUILD_PATH ""
#endif

namespace probefs::fs {

namespace {

constexpr const char* kUsage =
    "usage: probefs [-f] [-d] [-o OPTIONS] MOUNTPOINT\n"
    "       probefs exec [--strict] MOUNTPOINT [--] CMD [ARGS...]\n"
    "       probefs attach MOUNTPOINT PID...\n"
    "       probefs detach MOUNTPOINT PID...\n"
    "       probefs run [--shim] MOUNTPOINT [--] CMD [ARGS...]\n"
    "\n"
    "Mounts a tracefs for user-space processes: define probes in kprobe_events,\n"
    "uprobe_events or dynamic_events, enable them under events/, read trace_pipe.\n"
    "\n"
    "  -f              stay in the foreground (the daemon's messages go to stderr)\n"
    "  -d              foreground, with FUSE's request log\n"
    "  -o OPTIONS      mount options, comma-separated: FUSE's (e.g. allow_other) and\n"
    "                  max_targets=N (traced processes at once, 4096 by default),\n"
    "                  threads_per_target=N (threads of a process that record at once,\n"
    "                  1024 by default, at most 4096), gid=GID (the group of every\n"
    "                  file, as tracefs's gid=; modes stay)\n"
    "  -h, --help      this text\n"
    "  -V, --version   the version\n"
    "\n"
    "  exec    runs CMD with its stdio, in the foreground, as a traced process;\n"
    "          probefs exits with CMD's status. A program probefs cannot enter\n"
    "          (static, set-user-ID for another user, 32-bit) runs untraced, said on\n"
    "          stderr, in targets and in error_log; --strict refuses it (status 126)\n"
    "  attach  injects the probefs agent into running processes (ptrace)\n"
    "  detach  removes every probe from them; they run on\n"
    "  run     runs CMD, a tracefs client (trace-cmd, a libtracefs program, perf),\n"
    "          with MOUNTPOINT as its tracefs: as root in a mount namespace of its own\n"
    "          where MOUNTPOINT covers /sys/kernel/tracing; otherwise, or with --shim,\n"
    "          with libprobefs-tracefs.so preloaded; probefs exits with CMD's status\n"
    "\n"
    "Unmount with `fusermount3 -u MOUNTPOINT` (or umount): every probe goes, the\n"
    "traced processes run on, and the daemon ends. See probefs(8).\n";

void say(const std::string& line) { fprintf(stderr, "probefs: %s\n", line.c_str()); }

std::string self_dir() {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string p(buf, static_cast<size_t>(n));
  return p.substr(0, p.rfind('/'));
}

// One of probefs's libraries, `name`: the path in the variable `env`, where an installed
// probefs keeps them (PREFIX/libexec/probefs, relative to the executable), or in the build
// tree (`build_dir` beside fs/, or where the build put it).
std::string find_library(const char* env, const std::string& name, const std::string& build_dir,
                         const std::string& build_path) {
  if (const char* v = getenv(env); v && *v) return v;
  const std::string dir = self_dir();
  for (const std::string& c :
       {dir + "/" PROBEFS_LIBEXECDIR_FROM_BINDIR "/" + name, dir + "/../" + build_dir + "/" + name,
        build_path}) {
    char real[PATH_MAX];
    if (!c.empty() && access(c.c_str(), R_OK) == 0 && realpath(c.c_str(), real)) return real;
  }
  return {};
}

std::string find_agent() {
  return find_library("PROBEFS_AGENT", "libprobefs-agent.so", "agent", PROBEFS_AGENT_BUILD_PATH);
}

// The preloaded library of `probefs run` (tools/tracefs_shim).
std::string find_tracefs_shim() {
  return find_library("PROBEFS_TRACEFS_SHIM", "libprobefs-tracefs.so", "tools/tracefs_shim",
                      PROBEFS_TRACEFS_SHIM_BUILD_PATH);
}

// A probefs mount at `mnt` already (compared by the mount point's real path).
bool probefs_mounted_at(const std::string& real_mnt) {
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string id, parent, dev, root, point, opts, field;
    f >> id >> parent >> dev >> root >> point >> opts;
    while (f >> field && field != "-") {
    }
    std::string type;
    f >> type;
    if (point == real_mnt && type == "fuse.probefs") return true;
  }
  return false;
}

struct MountArgs {
  std::string mountpoint;
  std::vector<std::string> options;  // FUSE's
  uint32_t max_targets = 4096;
  uint32_t threads_per_target = 1024;
  std::optional<gid_t> gid;  // tracefs's gid=
  bool foreground = false;
  bool debug = false;
};

// Takes probefs's own options out of one -o argument, leaving FUSE's. false (and *bad)
// for a value that is not one.
bool take_own_options(const std::string& arg, MountArgs* a, std::string* bad) {
  std::string rest;
  size_t start = 0;
  while (start <= arg.size()) {
    size_t comma = arg.find(',', start);
    if (comma == std::string::npos) comma = arg.size();
    const std::string opt = arg.substr(start, comma - start);
    start = comma + 1;
    if (opt.rfind("max_targets=", 0) == 0) {
      uint64_t v = 0;
      if (!events::kstrtoull(opt.substr(12), 10, &v) || v == 0 || v > (1u << 20)) {
        *bad = opt;
        return false;
      }
      a->max_targets = static_cast<uint32_t>(v);
      continue;
    }
    if (opt.rfind("threads_per_target=", 0) == 0) {
      uint64_t v = 0;
      if (!events::kstrtoull(opt.substr(19), 10, &v) || v == 0 || v > events::kRingMaxCount) {
        *bad = opt;
        return false;
      }
      a->threads_per_target = static_cast<uint32_t>(v);
      continue;
    }
    if (opt.rfind("gid=", 0) == 0) {  // as tracefs's: a number
      uint64_t v = 0;
      if (!events::kstrtoull(opt.substr(4), 10, &v) || v >= UINT32_MAX) {
        *bad = opt;
        return false;
      }
      a->gid = static_cast<gid_t>(v);
      continue;
    }
    if (opt.empty()) continue;
    if (!rest.empty()) rest.push_back(',');
    rest += opt;
  }
  if (!rest.empty()) a->options.push_back(rest);
  return true;
}

// Checks what can be checked before anything starts: one line of what is wrong.
std::string preflight(const MountArgs& a, std::string* real_mnt) {
  struct stat st;
  if (stat(a.mountpoint.c_str(), &st) != 0) return a.mountpoint + ": " + strerror(errno);
  if (!S_ISDIR(st.st_mode)) return a.mountpoint + ": not a directory";
  char real[PATH_MAX];
  if (!realpath(a.mountpoint.c_str(), real)) return a.mountpoint + ": " + strerror(errno);
  *real_mnt = real;
  if (probefs_mounted_at(*real_mnt)) return a.mountpoint + ": already mounted (probefs)";
  // Not access(): without root, fusermount3 (setuid) opens /dev/fuse for us.
  struct stat fuse_dev;
  if (stat("/dev/fuse", &fuse_dev) != 0 || !S_ISCHR(fuse_dev.st_mode))
    return std::string("/dev/fuse: ") + strerror(errno ? errno : ENODEV) +
           " (FUSE is not available here)";
  return {};
}

// The daemon proper: builds the tracer and the tree, mounts, reports readiness on
// `ready_fd` (one line: "ok" or the error), then serves until the mount goes.
int serve(const MountArgs& a, const std::string& real_mnt, int ready_fd) {
  auto report = [&](const std::string& msg) {
    if (ready_fd < 0) {
      if (msg != "ok") say(msg);
      return;
    }
    std::string line = msg + "\n";
    (void)!write(ready_fd, line.data(), line.size());
    close(ready_fd);
    ready_fd = -1;
  };
  std::string agent = find_agent();
  if (agent.empty()) {
    report("cannot find libprobefs-agent.so (set PROBEFS_AGENT to its path)");
    return 1;
  }
  tracee::Tracer::Options topts;
  topts.agent_path = agent;
  topts.max_targets = a.max_targets;  // the tracer raises RLIMIT_NOFILE to serve them
  topts.rings_per_target = a.threads_per_target;
  std::string err;
  std::unique_ptr<tracee::Tracer> tracer = tracee::Tracer::create(topts, &err);
  if (!tracer) {
    report("cannot start the tracer: " + err);
    return 1;
  }
  Tracefs::Options fopts;
  fopts.agent_path = agent;
  auto fs = std::make_unique<Tracefs>(*tracer, fopts);
  FuseServer::Options sopts;
  sopts.mountpoint = real_mnt;
  sopts.mount_options = a.options;
  sopts.debug = a.debug;
  sopts.gid = a.gid;
  std::unique_ptr<FuseServer> server = FuseServer::mount(*fs, sopts, &err);
  if (!server) {
    report(a.mountpoint + ": " + err);
    return 1;
  }
  report("ok");
  if (!a.foreground) {
    // Detached from the terminal: nothing may write to it any more.
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
      dup2(null, STDIN_FILENO);
      dup2(null, STDOUT_FILENO);
      dup2(null, STDERR_FILENO);
      close(null);
    }
    if (chdir("/") != 0) {
    }
  }
  int rc = server->run();
  if (rc != 0 && a.foreground) say(std::string("the FUSE loop failed: ") + strerror(-rc));
  // The mount is taken down if it still is up (and the files left open with it), then
  // every probe leaves every target, then the tracer lets the targets go.
  server.reset();
  fs.reset();
  tracer.reset();
  return rc == 0 ? 0 : 1;
}

int mount_main(const MountArgs& a) {
  std::string real_mnt;
  std::string problem = preflight(a, &real_mnt);
  if (!problem.empty()) {
    say(problem);
    return 1;
  }
  if (a.foreground) return serve(a, real_mnt, -1);
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) {
    say(std::string("pipe: ") + strerror(errno));
    return 1;
  }
  pid_t pid = fork();
  if (pid < 0) {
    say(std::string("fork: ") + strerror(errno));
    return 1;
  }
  if (pid == 0) {
    close(pipefd[0]);
    setsid();
    // Targets the daemon launches must not inherit a terminal's job-control signals.
    signal(SIGTTOU, SIG_IGN);
    signal(SIGTTIN, SIG_IGN);
    _exit(serve(a, real_mnt, pipefd[1]));
  }
  close(pipefd[1]);
  // The daemon says "ok" once the mount is ready, or why it is not.
  std::string answer;
  char buf[512];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof(buf))) > 0) answer.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  while (!answer.empty() && answer.back() == '\n') answer.pop_back();
  if (answer == "ok") return 0;
  say(answer.empty() ? "the daemon ended before the mount was ready" : answer);
  return 1;
}

}  // namespace

int probefs_main(int argc, char** argv) {
  if (argc >= 2) {
    std::string sub = argv[1];
    if (sub == "exec") {
      // probefs exec [--strict] MOUNTPOINT [--] CMD [ARGS...]
      int mnt = 2;
      const bool strict = mnt < argc && std::string(argv[mnt]) == "--strict";
      if (strict) ++mnt;
      int first = mnt + 1;
      if (first < argc && std::string(argv[first]) == "--") ++first;
      if (first >= argc || argv[mnt][0] == '-') {
        fputs(kUsage, stderr);
        return 2;
      }
      return exec_command(argv[mnt], std::vector<std::string>(argv + first, argv + argc),
                          strict);
    }
    if (sub == "run") {
      // probefs run [--shim] MOUNTPOINT [--] CMD [ARGS...]
      int i = 2;
      bool force_shim = i < argc && std::string(argv[i]) == "--shim";
      if (force_shim) ++i;
      if (i < argc && argv[i][0] == '-') {
        say(std::string("run: unknown option ") + argv[i]);
        return 2;
      }
      const int mnt = i++;
      if (i < argc && std::string(argv[i]) == "--") ++i;
      if (i >= argc) {
        say("usage: probefs run [--shim] MOUNTPOINT [--] CMD [ARGS...]");
        return 2;
      }
      return run_command(argv[mnt], std::vector<std::string>(argv + i, argv + argc),
                         find_tracefs_shim(), force_shim);
    }
    if (sub == "attach" || sub == "detach") {
      if (argc < 4) {
        fputs(kUsage, stderr);
        return 2;
      }
      return attach_command(argv[2], std::vector<std::string>(argv + 3, argv + argc),
                            sub == "attach");
    }
  }
  static const option longopts[] = {{"help", no_argument, nullptr, 'h'},
                                    {"version", no_argument, nullptr, 'V'},
                                    {nullptr, 0, nullptr, 0}};
  MountArgs a;
  int c;
  while ((c = getopt_long(argc, argv, "+fdo:hV", longopts, nullptr)) != -1) {
    switch (c) {
      case 'f': a.foreground = true; break;
      case 'd': a.foreground = a.debug = true; break;
      case 'o': {
        std::string bad;
        if (!take_own_options(optarg, &a, &bad)) {
          say("bad option: " + bad);
          return 2;
        }
        break;
      }
      case 'h': fputs(kUsage, stdout); return 0;
      case 'V': printf("probefs %s\n", PROBEFS_VERSION); return 0;
      default: fputs(kUsage, stderr); return 2;
    }
  }
  if (optind != argc - 1) {
    fputs(kUsage, stderr);
    return 2;
  }
  a.mountpoint = argv[optind];
  return mount_main(a);
}

}  // namespace probefs::fs

int main(int argc, char** argv) { return probefs::fs::probefs_main(argc, argv); }
