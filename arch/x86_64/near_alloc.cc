#include "arch/x86_64/near_alloc.h"

#include <sys/mman.h>

#include <mutex>
#include <vector>

namespace probefs::arch::x86_64 {
namespace {

constexpr size_t kChunk = 64 * 1024;

struct Chunk {
  uintptr_t base;
  size_t used;
};

std::mutex g_mu;
std::vector<Chunk>& g_chunks = *new std::vector<Chunk>;  // guarded by g_mu; never destroyed
// The chunks' bases for readers without the lock: written under g_mu, each slot before the
// count that publishes it. Chunks are never unmapped, so a published base stays valid.
uintptr_t g_bases[kMaxTrackedChunks];
size_t g_nbases = 0;

bool within(uintptr_t a, uintptr_t b, size_t size) {
  const uintptr_t lo = a < b ? a : b, hi = a < b ? b + size : a;
  return hi - lo < kNearReach;
}

// Maps a chunk in a free gap near `near`, trying addresses outward from it.
uintptr_t map_chunk_near(uintptr_t near) {
  const uintptr_t step = 1ull << 20;
  const uintptr_t origin = near & ~(step - 1);
  for (uintptr_t d = step; d < kNearReach - kChunk; d += step) {
    for (int sign = -1; sign <= 1; sign += 2) {
      const uintptr_t hint = sign < 0 ? origin - d : origin + d;
      if (sign < 0 && origin < d + (1ull << 16)) continue;  // stay above the zero page
      void* p = mmap(reinterpret_cast<void*>(hint), kChunk, PROT_READ | PROT_EXEC,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
      if (p == MAP_FAILED) continue;
      if (reinterpret_cast<uintptr_t>(p) != hint) {  // old kernels treat the flag as a hint
        munmap(p, kChunk);
        continue;
      }
      return hint;
    }
  }
  return 0;
}

}  // namespace

void* alloc_near(uintptr_t near, size_t size) {
  size = (size + 15) & ~size_t{15};
  if (size > kChunk) return nullptr;
  std::lock_guard lock(g_mu);
  for (Chunk& c : g_chunks) {
    if (c.used + size <= kChunk && within(near, c.base + c.used, size)) {
      void* p = reinterpret_cast<void*>(c.base + c.used);
      c.used += size;
      return p;
    }
  }
  const uintptr_t base = map_chunk_near(near);
  if (!base) return nullptr;
  g_chunks.push_back({base, size});
  if (g_nbases < kMaxTrackedChunks) {
    __atomic_store_n(&g_bases[g_nbases], base, __ATOMIC_RELAXED);
    __atomic_store_n(&g_nbases, g_nbases + 1, __ATOMIC_RELEASE);
  }
  return reinterpret_cast<void*>(base);
}

bool near_alloc_contains(uintptr_t addr) {
  const size_t n = __atomic_load_n(&g_nbases, __ATOMIC_ACQUIRE);
  for (size_t i = 0; i < n; ++i) {
    const uintptr_t base = __atomic_load_n(&g_bases[i], __ATOMIC_RELAXED);
    if (addr - base < kChunk) return true;
  }
  return false;
}

}  // namespace probefs::arch::x86_64
