// Reading this process's own memory without faulting, by system call: a bad address comes
// back as an error, never as SIGSEGV, and no signal handler is needed. The fetch
// interpreter's default reader (events::LiveMemoryReader) and the engine's patching path
// (reading code, scanning stacks from inside a signal handler) both read through it.
//
// Raw (arch/syscall.h): no libc call and errno untouched, so it is safe on the hit path
// and in signal handlers. About one system call per read (~1 µs); where a SIGSEGV handler
// with the fixup exists, arch/safe_copy.h is the faster way.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>

#include "arch/syscall.h"

namespace probefs::arch {

// The calling process's id (changes across fork: readers that cache it must be remade).
inline long self_pid() { return raw_syscall(__NR_getpid); }

// The id of a process whose memory is the caller's, for reading and writing it (not for
// telling who we are): this process's, asked once and kept in a page the kernel empties in
// a fork child (MADV_WIPEONFORK), where it is asked again. A vfork child shares the page
// and the memory: its parent's id reads the same memory. Every read of our own code and
// every write to it used to ask the kernel first: a system call each, about 1 µs here.
inline long self_memory_pid() {
  static long* page = nullptr;  // set once (CAS), never unmapped
  long* p = __atomic_load_n(&page, __ATOMIC_ACQUIRE);
  if (__builtin_expect(p == nullptr, 0)) {
    constexpr long kMadvWipeOnFork = 18;  // MADV_WIPEONFORK, Linux 4.14
    const long m = raw_syscall(__NR_mmap, 0, 4096, PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m < 0 && m > -4096) return self_pid();
    if (raw_syscall(__NR_madvise, m, 4096, kMadvWipeOnFork) != 0) {
      (void)raw_syscall(__NR_munmap, m, 4096);
      return self_pid();  // an older kernel: ask every time
    }
    long* expected = nullptr;
    if (__atomic_compare_exchange_n(&page, &expected, reinterpret_cast<long*>(m), false,
                                    __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
      p = reinterpret_cast<long*>(m);
    } else {
      (void)raw_syscall(__NR_munmap, m, 4096);  // another thread's came first
      p = expected;
    }
  }
  long pid = __atomic_load_n(p, __ATOMIC_RELAXED);
  if (__builtin_expect(pid == 0, 0)) {
    pid = self_pid();
    __atomic_store_n(p, pid, __ATOMIC_RELAXED);
  }
  return pid;
}

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
  return read_self_memory(self_memory_pid(), addr, dst, n) == static_cast<long>(n);
}

// Writes the n bytes at src to addr, all or (a range not writable) none of them at
// best: true when all were written. Data only (a writable mapping): code is patched
// through the engine's text_poke.
[[nodiscard]] inline bool write_self_memory_all(uintptr_t addr, const void* src, size_t n) {
  struct IoVec {
    const void* base;
    size_t len;
  };
  IoVec local{src, n};
  IoVec remote{reinterpret_cast<void*>(addr), n};
  return raw_syscall(__NR_process_vm_writev, self_memory_pid(), reinterpret_cast<long>(&local),
                     1, reinterpret_cast<long>(&remote), 1, 0) == static_cast<long>(n);
}

// Gives the private file mapping that holds addr a page of its own: the byte at addr is
// written back unchanged through /proc/self/mem, which copies its page. The kernel copies
// the page table entries of a mapping with such pages into every fork child, so a child
// runs the code there without a page fault per 64 KB of it (faults cost tens of
// microseconds on some virtual machines). 0 or -errno; protections never change. Not for
// the hit path.
[[nodiscard]] int own_a_page_of(uintptr_t addr);

}  // namespace probefs::arch
