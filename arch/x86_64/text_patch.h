// Writing to code that other threads may be executing. Every write goes through
// /proc/self/mem (the kernel copies into the page whatever its protection, breaking
// copy-on-write for file pages), so no page ever becomes writable and no thread ever sees
// a page without execute permission. Where /proc/self/mem is refused, pages are made
// writable for the duration of the write instead (read+write+exec, never without exec).
#pragma once

#include <cstddef>
#include <cstdint>

namespace probefs::arch::x86_64 {

// Copies n bytes to addr. 0 or -errno (-EFAULT when addr is not mapped).
[[nodiscard]] int text_poke(uintptr_t addr, const void* src, size_t n);

// Copies n bytes to addr through /proc/self/mem only (no fallback). 0 or -errno.
[[nodiscard]] int text_poke_by_copy(uintptr_t addr, const void* src, size_t n);

// Cross-modifying-code barrier: every thread of this process executes a serializing
// instruction before its next user instruction (membarrier SYNC_CORE).
void text_sync();

}  // namespace probefs::arch::x86_64
