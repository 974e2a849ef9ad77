// The dynamic linker's link map of another process: which objects it loaded, in load order.
// Daemon side; reads the process's memory through /proc/PID/mem.
#pragma once

#include <libelf.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace probefs::tracee {

// At most this many link-map entries are read, so a corrupt or hostile list cannot keep us
// looping.
constexpr size_t kMaxLinkMapEntries = 65536;

// The l_ld (run-time address of the object's dynamic section) of every entry of the link
// map of `pid`, in load order: the executable's DT_DEBUG points to r_debug, whose r_map
// heads the list. `exe` is the executable's ELF, `exe_bias` its load bias. Empty when the
// list cannot be read (a static executable, another ELF class, no permission, ld.so not
// started yet).
std::vector<uintptr_t> read_link_map(pid_t pid, Elf* exe, uintptr_t exe_bias);

}  // namespace probefs::tracee
