// Starting a program as a target: the agent is preloaded (LD_PRELOAD) and its constructor
// holds the program before main until the daemon has sent its definitions and GO, so that
// every event defined before the launch fires from main's first instruction on.
//
//   auto l = AgentListener::create(&err);
//   Launched t;
//   launch(*l, {.argv = {"./prog", "arg"}, .agent_path = AGENT}, &t, &msg);
//   t.link->setup(memfd, size, clock);  t.link->define(d);  ...  t.link->go();
//   ... waitpid(t.pid, ...)   // the caller owns the child
//
// The child's environment is the daemon's (or opts.env_replace), plus opts.env_add, plus
// LD_PRELOAD with the agent first and PROBEFS_AGENT_LINK=<listener name>. Both stay in the
// program's environment, so an image it execs (and a fork child's) loads the agent too and
// connects with HELLO kExec from the same pid: the daemon sees the old link end and the new
// one arrive as a kConnected event, and the new image waits for GO like the first.
//
// Threads: any thread; launch() forks (only async-signal-safe calls run in the child before
// execve) and waits at most opts.timeout for the agent's HELLO.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tracee/agent_link.h"

namespace probefs::tracee {

struct LaunchOptions {
  // The program and its arguments; argv[0] without a '/' is looked up in the child's PATH.
  std::vector<std::string> argv;
  // Path of libprobefs-agent.so (absolute, as the dynamic linker will open it).
  std::string agent_path;
  // "NAME=VALUE" entries set in the child's environment (replacing the same NAME).
  std::vector<std::string> env_add;
  // When set, the child's environment starts from this instead of the daemon's.
  bool replace_env = false;
  std::vector<std::string> env_replace;
  // Working directory of the child; empty: the daemon's.
  std::string cwd;
  // The child's stdin, stdout and stderr; -1 inherits the daemon's.
  int stdin_fd = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  // How long the agent may take to say HELLO after the fork (exec, dynamic linking,
  // constructors that run before the agent's).
  std::chrono::milliseconds timeout{10000};
  // The soft RLIMIT_NOFILE the program starts with; 0 keeps the daemon's (which raises
  // its own to serve thousands of targets: a program must not find select() limits
  // broken because of that).
  uint64_t nofile_soft = 0;
};

struct Launched {
  pid_t pid = -1;
  // Open, HELLO kLaunch received; the program waits in the agent's constructor for GO.
  std::shared_ptr<AgentLink> link;
};

// Starts opts.argv with the agent preloaded and waits for its link. 0, or a negative errno
// with *error saying what went wrong (the child is killed and reaped on failure):
// -ENOENT/-EACCES/... from execve, -ETIMEDOUT when the agent did not connect (a static
// program, a dynamic linker that ignores LD_PRELOAD, a setuid program), -ECHILD when the
// child died first.
[[nodiscard]] int launch(AgentListener& listener, const LaunchOptions& opts, Launched* out,
                         std::string* error);

// The launcher sets link::kLinkEnv (PROBEFS_AGENT_LINK) to the listener's name.

// The two environment entries that make a program load the agent and connect to the link
// `link_name`: "LD_PRELOAD=<agent_path>[:<ld_preload>]" (the agent first, before what the
// environment preloads already: `ld_preload`, null or empty for nothing) and
// "PROBEFS_AGENT_LINK=<link_name>". For launch() and `probefs exec`
// (Tracer::prepare_exec).
std::vector<std::string> agent_environment(const std::string& agent_path,
                                           const std::string& link_name,
                                           const char* ld_preload);

}  // namespace probefs::tracee
