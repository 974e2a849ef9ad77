// Attach: loading a shared library into a running process through ptrace. Daemon side.
//
// The daemon loads libprobefs-agent.so this way and then calls one function of it:
//
//   PtraceError error;
//   auto session = PtraceSession::attach(pid, {}, &error);          // one thread held
//   InjectedLibrary agent;
//   inject_library(*session, agent_path, &agent, &error);           // dlopen in the target
//   uintptr_t entry, name;
//   resolve_injected_symbol(session->symbols(), agent, "probefs_agent_attach", &entry);
//   session->push_string(link_name, &name, &error);                 // on our thread's stack
//   uint64_t rc;
//   session->call(entry, std::array<uint64_t, 1>{name}, &rc, &error);
//   session->detach(&error);                                        // our thread ends
//
// Attach in two steps. A thread of the program, held wherever it stopped, must not run
// the loader: it may be inside malloc or the loader itself, holding their locks, and a
// dlopen that does not return would leave them held. So the held thread does one thing:
// it starts a thread of ours (pthread_create) and is given back at once. That thread runs
// a routine of ours, from two pages the held thread mapped (mmap): dlopen, dlerror's text
// when it fails, a report in its pages, then a wait. The session then holds it, there,
// for the calls that follow (the agent's entry point): code of ours, in a known state,
// with every asynchronous signal blocked. Told to finish at detach, it unmaps its pages
// and ends. A dlopen that does not return in time is no longer stopped midway: our thread
// is let go to finish it and end by itself, and the program's threads were never held.
//
//   program thread T          daemon                          our thread N
//   ----------------          ------                          ------------
//   (stopped anywhere)        unwind T's stack; T unusable?
//                             -> give T back, hold another
//   mmap(2 pages)      <----- call
//   pthread_create     <----- call (clones traced)  ---------> born, traced
//   given back, runs on <---- restore, detach
//                             poll N's report word            dlopen(path); dlerror()
//                                                             report; futex wait
//                             hold N (PTRACE_INTERRUPT) ----> held at its wait
//                             calls on N (agent entry) -----> ...
//                             finish = 1, let N run --------> munmap(pages) and return
//
// Where T may not start a thread (see inject.cc): inside the C library's allocator, the
// dynamic loader, thread creation and exit, fork, exit; owning the loader's lock; running
// only C library code. Then each thread in turn, and again after a pause, within the
// session's timeout.
//
// Every step returns 0 or a negative errno with a sentence in `error`. A program thread is
// given back as it was in every case (see tracee/ptrace_session.h for what that covers).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string_view>

#include "tracee/elf_symbols.h"
#include "tracee/ptrace_session.h"

namespace probefs::tracee {

struct InjectedLibrary {
  uintptr_t handle = 0;  // dlopen's handle in the target (glibc: the object's link_map)
  MappedObject object;   // where the object is mapped, from /proc/PID/maps
  // The pid form of inject_library only: attach to detach, and the session's own times.
  std::chrono::nanoseconds total{0};
  PtraceTimings timings;
};

// Calls dlopen(path, RTLD_NOW) in a thread of ours that a thread of the program starts
// (above): libc's dlopen (glibc >= 2.34), else libdl's, else glibc's private
// __libc_dlopen_mode (older glibc without libdl loaded). `session` must hold a thread of
// the program; on success it holds ours instead, for the calls that follow, and its
// detach ends ours. `path` is a path as the target sees it (its root and mount
// namespace). Loading it again gives the same handle (dlopen counts references). Then the
// process's objects are read again (session.symbols().reload()) and `out` names the
// object. 0, or:
//   -ENOENT   no dlopen in the process (a static executable); or dlopen failed because
//             the file does not exist; or the object is not found in /proc/PID/maps
//   -EACCES   dlopen failed: permission denied
//   -ENOEXEC  dlopen failed: not a loadable object for this process
//   -ELIBBAD  dlopen failed otherwise; the message carries dlerror()'s text
//   -EAGAIN   no thread of the program was at a point where it may start a thread within
//             the session's timeout; the message says where each one was
//   -ETIMEDOUT  dlopen did not return within the session's timeout; our thread goes on
//             with it and ends when it returns
//   -ENOSYS   the process has no pthread_create in its C library (older glibc without
//             libpthread)
//   -ENAMETOOLONG  `path` is longer than our thread's block holds (about 4000 bytes)
//   and the errors of PtraceSession::call and start_thread (mmap's errno where the
//   process may not map executable memory).
[[nodiscard]] int inject_library(PtraceSession& session, std::string_view path,
                                 InjectedLibrary* out, PtraceError* error);

// attach + inject_library + detach. The thread stops only for the calls; the objects of
// the process are read before.
[[nodiscard]] int inject_library(pid_t pid, std::string_view path, const PtraceOptions& options,
                                 InjectedLibrary* out, PtraceError* error);

// Whether process `pid` can load the agent at `agent_path` and reach the daemon's link
// `link_name` (a socket file, or an abstract name without '/') as the daemon sees them,
// judged from /proc before anything is done to the process, so that an attach that cannot
// work is refused at once with the reason rather than after the agent's silence:
//   - another PID namespace: refused. The agent checks that the peer of its link is the
//     daemon and traces it (SO_PEERCRED, TracerPid); there those name other processes.
//   - another mount namespace, or another root directory: the agent's file and the link's
//     socket file, looked up in the process's own root (/proc/PID/root, symlinks resolved
//     there), must be the daemon's very files (device and inode). A container that
//     shares them (a bind mount) works; one with its own /run or /tmp is refused.
//   - another network namespace: a socket file works across it; an abstract name, which
//     lives in one network namespace, is refused.
// What /proc does not show (another user's process, without the rights to look) is left
// to ptrace to refuse. 0, -ESRCH (no such process) or -EOPNOTSUPP with a message that
// names the namespace and what the process cannot reach.
[[nodiscard]] int check_namespaces(pid_t pid, std::string_view agent_path,
                                   std::string_view link_name, PtraceError* error);

// Run-time address of a function the injected object defines. `symbols` must have been
// read after the injection (inject_library does it for the session's). 0 or -ENOENT.
[[nodiscard]] int resolve_injected_symbol(const ProcessSymbols& symbols,
                                          const InjectedLibrary& library, std::string_view name,
                                          uintptr_t* addr);

}  // namespace probefs::tracee
