// The `probefs` command: the daemon (mount) and the subcommands that talk to a running
// daemon through its mount (exec, attach, detach), and run.
//
//   probefs [-f] [-d] [-o OPTIONS] MOUNTPOINT   mount; go to the background once the mount
//                                               is ready (-f: stay in the foreground)
//   probefs exec [--strict] MOUNTPOINT [--] CMD [ARGS...]
//                                               run CMD as a target, in the foreground
//   probefs attach MOUNTPOINT PID...            trace running processes
//   probefs detach MOUNTPOINT PID...            stop tracing them (they run on)
//   probefs run [--shim] MOUNTPOINT [--] CMD... run a tracefs client (trace-cmd) with the
//                                               mount as its tracefs
//
// Unmounting (fusermount3 -u, umount) removes every probe from every target, leaves the
// targets running, and ends the daemon.
#pragma once

#include <string>
#include <vector>

namespace probefs::fs {

// main() of the probefs command; returns the exit status.
int probefs_main(int argc, char** argv);

// The subcommands (fs/command_client.cc). Each prints its own one-line errors.
// exec: a program the agent cannot enter (tracee/untraceable.h) is said on stderr and to
// the daemon, then run untraced, or with `strict` refused (126).
int exec_command(const std::string& mountpoint, const std::vector<std::string>& argv,
                 bool strict = false);
int attach_command(const std::string& mountpoint, const std::vector<std::string>& pids,
                   bool attach);

// probefs run (fs/run_command.cc): execs CMD with `mountpoint` as its tracefs, in a mount
// namespace of its own where it can make one and `force_shim` is false, else with `shim`
// (libprobefs-tracefs.so's path, "" when there is none) preloaded. Returns only on failure:
// 2 when `mountpoint` is not a probefs mount.
int run_command(const std::string& mountpoint, const std::vector<std::string>& argv,
                const std::string& shim, bool force_shim);

// Puts `library` first in LD_PRELOAD, before what the environment has there.
void preload_first(const std::string& library);

// execvp(argv[0], argv): returns only when that failed, after a line on stderr, with the
// shell's status (127: not found, 126: found and cannot run).
int exec_or_status(const std::vector<std::string>& argv);

// A one-line check that `mountpoint` is a probefs mount; "" when it is.
std::string check_probefs_mount(const std::string& mountpoint);

}  // namespace probefs::fs
