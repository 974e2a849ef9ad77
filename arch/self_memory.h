// Reading this process's own memory without faulting, by system call: a bad address comes
// back as an error, never as SIGSEGV, and no signal handler is needed. The fetch
// interpreter's default reader (events::LiveMemoryReader) and the engine's patching path
// (reading code, scanning stacks from inside a signal handler) both read through it.
//
// Raw (arch/syscall.h): no libc call and errno untouched, so it is safe on the hit path
// and in signal handlers. About one system call per read (~1 µs); where a SIGSEGV handler
// with the fixup exists, arch/safe_copy.h is the faster way.
#pragma once

#include <cstddef>
#include <cstdint>

#include "arch/syscall.h"

namespace probefs::arch {

// The calling process's id (changes across fork: readers that cache it must be remade).
inline long self_pid() { return raw_syscall(__NR_getpid); }

// Copies n bytes at addr into dst. Bytes copied (fewer when the range runs into an
// unmapped page: nothing is copied past it), or -errno (-EFAULT: nothing readable).
[[nodiscard]] inline long read_self_memory(long pid, uintptr_t addr, void* dst, size_t n) {
  struct IoVec {  // struct iovec, without libc's headers
    void* base;
    size_t len;
  };
  IoVec local{dst, n};
  IoVec remote{reinterpret_cast<void*>(addr), n};
  return raw_syscall(__NR_process_vm_readv, pid, reinterpret_cast<long>(&local), 1,
                     reinterpret_cast<long>(&remote), 1, 0);
}

// All n bytes, or false.
[[nodiscard]] inline bool read_self_memory_all(uintptr_t addr, void* dst, size_t n) {
  return read_self_memory(self_pid(), addr, dst, n) == static_cast<long>(n);
}

// Gives the private file mapping that holds addr a page of its own: the byte at addr is
// written back unchanged through /proc/self/mem, which copies its page. The kernel copies
// the page table entries of a mapping with such pages into every fork child, so a child
// runs the code there without a page fault per 64 KB of it (faults cost tens of
// microseconds on some virtual machines). 0 or -errno; protections never change. Not for
// the hit path.
[[nodiscard]] int own_a_page_of(uintptr_t addr);

}  // namespace probefs::arch
