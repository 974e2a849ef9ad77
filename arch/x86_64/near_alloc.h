// Executable memory within reach of a rel32 from a given address, for out-of-line copies,
// detours and trampolines. Chunks are mapped read+exec and filled through text_poke, so no
// page is ever writable. Memory is handed out once and never returned: callers intern what
// they build (an out-of-line copy depends only on the address and the bytes it copies), so
// a thread still running an old copy always finds it intact.
#pragma once

#include <cstddef>
#include <cstdint>

namespace probefs::arch::x86_64 {

constexpr uintptr_t kNearReach = (1ull << 31) - (1ull << 24);  // rel32 reach, with margin

// `size` bytes, 16-byte aligned, within kNearReach of `near`. nullptr when nothing is free
// within reach. Control plane only (takes a lock, may map memory).
void* alloc_near(uintptr_t near, size_t size);

// Does `addr` lie in memory alloc_near() handed out? Any thread, lock-free, no library
// call. Only the first kMaxTrackedChunks chunks are known (256 MiB of near memory: more than
// any process gets).
constexpr size_t kMaxTrackedChunks = 4096;
bool near_alloc_contains(uintptr_t addr);

}  // namespace probefs::arch::x86_64
