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
//   session->push_string(link_name, &name, &error);                 // on the thread's stack
//   uint64_t rc;
//   session->call(entry, std::array<uint64_t, 1>{name}, &rc, &error);
//   session->detach(&error);                                        // all state put back
//
// Every step returns 0 or a negative errno with a sentence in `error`. The held thread is
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

// Calls dlopen(path, RTLD_NOW) in the held thread: libc's dlopen (glibc >= 2.34), else
// libdl's, else glibc's private __libc_dlopen_mode (older glibc without libdl loaded).
// `path` is a path as the target sees it (its root and mount namespace). Loading it
// again gives the same handle (dlopen counts references). Then the process's objects are
// read again (session.symbols().reload()) and `out` names the object. 0, or:
//   -ENOENT   no dlopen in the process (a static executable); or dlopen failed because
//             the file does not exist; or the object is not found in /proc/PID/maps
//   -EACCES   dlopen failed: permission denied
//   -ENOEXEC  dlopen failed: not a loadable object for this process
//   -ELIBBAD  dlopen failed otherwise; the message carries dlerror()'s text
//   and the errors of PtraceSession::call.
[[nodiscard]] int inject_library(PtraceSession& session, std::string_view path,
                                 InjectedLibrary* out, PtraceError* error);

// attach + inject_library + detach. The thread stops only for the calls; the objects of
// the process are read before.
[[nodiscard]] int inject_library(pid_t pid, std::string_view path, const PtraceOptions& options,
                                 InjectedLibrary* out, PtraceError* error);

// Run-time address of a function the injected object defines. `symbols` must have been
// read after the injection (inject_library does it for the session's). 0 or -ENOENT.
[[nodiscard]] int resolve_injected_symbol(const ProcessSymbols& symbols,
                                          const InjectedLibrary& library, std::string_view name,
                                          uintptr_t* addr);

}  // namespace probefs::tracee
