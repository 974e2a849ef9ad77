// The `probefs` command: the daemon (mount) and the subcommands that talk to a running
// daemon through its mount (exec, attach, detach).
//
//   probefs [-f] [-d] [-o OPTIONS] MOUNTPOINT   mount; go to the background once the mount
//                                               is ready (-f: stay in the foreground)
//   probefs exec MOUNTPOINT [--] CMD [ARGS...]  run CMD as a target, in the foreground
//   probefs attach MOUNTPOINT PID...            trace running processes
//   probefs detach MOUNTPOINT PID...            stop tracing them (they run on)
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
int exec_command(const std::string& mountpoint, const std::vector<std::string>& argv);
int attach_command(const std::string& mountpoint, const std::vector<std::string>& pids,
                   bool attach);

// A one-line check that `mountpoint` is a probefs mount; "" when it is.
std::string check_probefs_mount(const std::string& mountpoint);

}  // namespace probefs::fs
