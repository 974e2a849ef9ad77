// Per-CPU stacks (arch/percpu.h): setup and the thief's side.
#include "arch/percpu.h"

#include "arch/membarrier.h"

#include <sys/sysinfo.h>
#include <unistd.h>

#include <cstddef>

// glibc 2.35 and later export where it put the thread's struct rseq. Weak: on a libc
// without them, per-CPU operation is simply unavailable.
extern "C" {
extern const ptrdiff_t __rseq_offset __attribute__((weak));
extern const unsigned int __rseq_size __attribute__((weak));
}

namespace probefs::arch {

namespace detail {
long g_rseq_offset = 0;
}  // namespace detail

bool percpu_pop(PercpuStack* stacks, uint32_t n, uint32_t* value) {
  return percpu_pop_inline(stacks, n, value);
}

bool percpu_push(PercpuStack* stacks, uint32_t n, uint32_t value, uint32_t capacity) {
  return percpu_push_inline(stacks, n, value, capacity < kPercpuSlots ? capacity : kPercpuSlots);
}

namespace {

uint32_t g_count = 0;

}  // namespace

bool percpu_init() {
  if (g_count == 0) {
    const int n = get_nprocs_conf();
    g_count = n > 0 ? static_cast<uint32_t>(n) : 1;
  }
  detail::g_rseq_offset = 0;
  if (&__rseq_offset == nullptr || &__rseq_size == nullptr || __rseq_size == 0 ||
      __rseq_offset == 0)
    return false;
  // Stealing needs the kernel to restart other CPUs' sequences on request.
  if (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ, 0, 0) != 0) return false;
  detail::g_rseq_offset = __rseq_offset;
  return true;
}

uint32_t percpu_count() { return g_count; }

bool percpu_steal(PercpuStack* stacks, uint32_t cpu, uint32_t* value) {
  PercpuStack& s = stacks[cpu];
  if (detail::g_rseq_offset == 0 || __atomic_load_n(&s.count, __ATOMIC_RELAXED) == 0)
    return false;
  uint32_t unlocked = 0;
  if (!__atomic_compare_exchange_n(&s.lock, &unlocked, 1, false, __ATOMIC_ACQUIRE,
                                   __ATOMIC_RELAXED))
    return false;
  // A sequence on that CPU that read the lock before we took it is restarted, and sees it
  // taken; one that committed before is visible to us once the call returns.
  bool got = false;
  if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ, MEMBARRIER_CMD_FLAG_CPU,
                 static_cast<int>(cpu)) == 0) {
    const uint32_t n = __atomic_load_n(&s.count, __ATOMIC_ACQUIRE);
    if (n > 0) {
      *value = s.slots[n - 1];
      __atomic_store_n(&s.count, n - 1, __ATOMIC_RELAXED);
      got = true;
    }
  }
  __atomic_store_n(&s.lock, 0, __ATOMIC_RELEASE);
  return got;
}

}  // namespace probefs::arch
