// Per-CPU stacks of 32-bit values whose owner side uses no locked instruction: the hit
// path's free lists (probecore's kretprobe instance pools) keep one stack per CPU.
//
// A thread pushes to and pops from the stack of the CPU it runs on, inside a restartable
// sequence (rseq): the kernel restarts the sequence if the thread is preempted, migrated
// or signalled in the middle, so two threads never interleave on one stack. Another CPU's
// stack is reached only by stealing: the thief locks it, makes the kernel restart any
// sequence in flight on that CPU (membarrier), and then owns it until it unlocks.
//
// percpu_pop/percpu_push fail, and the caller falls back to its own shared list, when
// per-CPU operation is not available (libc did not register rseq for the thread, or the
// kernel lacks membarrier's rseq command), the CPU's stack is empty, full or locked, or
// the sequence was interrupted (preempted, migrated, signalled, single-stepped).
#pragma once

#include <cstdint>

namespace probefs::arch {

constexpr uint32_t kPercpuSlots = 14;

struct alignas(64) PercpuStack {
  uint32_t lock;   // nonzero while a thief owns the stack
  uint32_t count;  // values in slots[0, count)
  uint32_t slots[kPercpuSlots];
};
static_assert(sizeof(PercpuStack) == 64);

// Sets up per-CPU operation for the process (idempotent; again in a fork child). Returns
// whether it is available; when it is not, every percpu_* call fails.
bool percpu_init();

// The number of stacks an array needs: one per possible CPU.
uint32_t percpu_count();

// The calling thread's CPU's stack, in stacks[0, n). Inside the engine's shared object,
// the hit path uses the inline forms percpu_pop_inline/percpu_push_inline (which read a
// hidden variable, and so do not link elsewhere).
// A push fails once the stack holds `capacity` values (at most kPercpuSlots).
bool percpu_pop(PercpuStack* stacks, uint32_t n, uint32_t* value);
bool percpu_push(PercpuStack* stacks, uint32_t n, uint32_t value,
                 uint32_t capacity = kPercpuSlots);

// Takes one value from the stack of CPU `cpu`, from any thread. Fails when it is empty or
// another thief holds it (never waits: a thief may be the interrupted thread itself).
// Costs a system call.
bool percpu_steal(PercpuStack* stacks, uint32_t cpu, uint32_t* value);

}  // namespace probefs::arch

#include "arch/x86_64/percpu_inl.h"
