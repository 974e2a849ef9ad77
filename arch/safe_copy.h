// Copies of this process's memory that may fault, and the fix-up that turns the fault into
// an error return, like the kernel's exception tables. The fast way to read a pointer a
// probe handler was given (no system call), for whoever owns the process's SIGSEGV/SIGBUS
// disposition.
//
// The copy routines are a few instructions of assembly (arch/x86_64/safe_copy.cc). When
// one of them touches a bad address, the process gets SIGSEGV or SIGBUS with the
// instruction pointer inside the routine; the signal handler of the process (the agent
// owns it and chains to the program's own handler for anything else) calls
// safe_copy_fixup(), which moves the instruction pointer to the routine's error exit.
// Nothing here installs a handler: the process has one SIGSEGV disposition.
//
// Without such a handler a bad pointer kills the process: where none is installed, read
// with arch/self_memory.h instead.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {
// 0, or -1 when a byte could not be read (nothing is guaranteed about dst then).
long probefs_arch_safe_copy(void* dst, const void* src, size_t n);
// Bytes stored including the NUL (at most cap, cap > 0; a string cut at cap still ends in
// NUL), or -1 when a byte before the NUL could not be read.
long probefs_arch_safe_strncpy(char* dst, const char* src, size_t cap);
}

namespace probefs::arch {

// From a SIGSEGV/SIGBUS handler (ucontext is its third argument): if the fault happened
// inside a safe copy routine, redirects it to the routine's error exit and returns true;
// otherwise returns false and the handler treats the fault as its own. Async-signal-safe.
bool safe_copy_fixup(void* ucontext);

}  // namespace probefs::arch
