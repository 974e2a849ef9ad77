// Raw system calls: the one way the engine and the fetch interpreter enter the kernel on
// the hit path, in signal handlers, and wherever libc must not run (its functions may be
// the very ones being probed). No libc call, errno untouched.
//
//   long raw_syscall(long nr, long a1 = 0, ..., long a6 = 0)
//       the kernel's return value: >= 0, or -errno
//
// Call numbers are the kernel's names from <asm/unistd.h> (__NR_getpid, __NR_tgkill, ...),
// never bare numbers. A second architecture provides its own arch/<arch>/syscall_inl.h.
#pragma once

#include <asm/unistd.h>

#include "arch/x86_64/syscall_inl.h"
