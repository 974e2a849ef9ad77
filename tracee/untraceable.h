// Why a program cannot become a target. The agent goes into a process through its dynamic
// loader (LD_PRELOAD), so a program escapes it when:
//
//   static       no dynamic loader runs at all (gcc -static, static-pie, most Go programs);
//   secure-exec  the loader runs in secure-execution mode (AT_SECURE: a set-user-ID or
//                set-group-ID program run by another user, a program with file
//                capabilities run by a non-root user), where glibc ignores a preloaded
//                path with a '/';
//   foreign      it is no x86-64 ELF64 program (a 32-bit one), which the agent cannot
//                enter;
//   no-agent     (a process only) its loader ran but no agent joined: the program
//                cleared LD_PRELOAD or PROBEFS_AGENT_LINK from its environment, or the
//                agent could not reach the daemon.
//
// Judged from the file before it runs (`probefs exec`) and from a process after it exec'd.
// Daemon side and the probefs command; reads files and /proc only.
#pragma once

#include <sys/types.h>

#include <string>

namespace probefs::tracee {

struct Untraceable {
  std::string state;  // "" when the agent can enter it; else one of the words above
  std::string why;    // one line, for the user: what it is, and why that keeps the agent out
  // untraceable_process: false while the process is still inside its exec (its new
  // image's auxiliary vector not written yet): nothing is judged then but the file.
  bool settled = true;
};

// The program at `path` as execve would run it for a process with real ids uid and gid: an
// interpreter script ("#!") is judged by its interpreter (as deep as the kernel follows
// them). A file that cannot be read, or is neither ELF nor a script, is not judged ("").
Untraceable untraceable_program(const std::string& path, uid_t uid, gid_t gid);

// Process `pid` as it runs now, after an exec: its executable (/proc/PID/exe), whether its
// exec was a secure one (AT_SECURE in /proc/PID/auxv), and whether the environment it was
// started with
// (/proc/PID/environ) still carries the agent (`agent_path` first or anywhere in
// LD_PRELOAD, by name, and PROBEFS_AGENT_LINK): no-agent when it does not. A process whose
// /proc files the caller may not read is judged secure-exec (an exec that changed ids
// leaves it undumpable). "" when none of these holds: its agent should join.
Untraceable untraceable_process(pid_t pid, const std::string& agent_path);

// The line for a program at `path` in one of the states untraceable_program() finds
// ("static", "secure-exec", "foreign"), as untraceable_program() words it; "" for any other
// state. `path` is any text (a client's): cut to 256 bytes, control characters shown as '?'.
std::string untraceable_text(const std::string& state, const std::string& path);

}  // namespace probefs::tracee
