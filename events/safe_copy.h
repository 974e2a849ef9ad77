// A faster safe reader for the hit path: copies that may fault, and a fix-up that turns
// the fault into an error return, like the kernel's exception tables.
//
// The copy routines are a few instructions of assembly (safe_copy.cc). When one of them
// touches a bad address, the process gets SIGSEGV or SIGBUS with the instruction pointer
// inside the routine; the signal handler of the process (the agent owns it and chains to
// the program's own handler for anything else) calls safe_copy_fixup(), which moves the
// instruction pointer to the routine's error exit. Nothing here installs a handler: the
// process has one SIGSEGV disposition and it belongs to the agent.
//
// Without such a handler a bad pointer kills the process, so FaultTolerantReader is
// opt-in; LiveMemoryReader (memory_reader.h) needs nothing and is the default.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {
// 0, or -1 when a byte could not be read (nothing is guaranteed about dst then).
long probefs_events_safe_copy(void* dst, const void* src, size_t n);
// Bytes stored including the NUL (at most cap, cap > 0; a string cut at cap still ends in
// NUL), or -1 when a byte before the NUL could not be read.
long probefs_events_safe_strncpy(char* dst, const char* src, size_t cap);
}

namespace probefs::events {

// From a SIGSEGV/SIGBUS handler (ucontext is its third argument): if the fault happened
// inside a safe copy routine, redirects it to the routine's error exit and returns true;
// otherwise returns false and the handler treats the fault as its own.
bool safe_copy_fixup(void* ucontext);

class FaultTolerantReader {
 public:
  bool read(uint64_t addr, void* dst, size_t n) const {
    return probefs_events_safe_copy(dst, reinterpret_cast<const void*>(addr), n) == 0;
  }
  long read_string(uint64_t addr, char* dst, size_t cap) const {
    if (cap == 0) return -1;
    return probefs_events_safe_strncpy(dst, reinterpret_cast<const char*>(addr), cap);
  }
};

}  // namespace probefs::events
