// The hit path of kretprobes: instances taken from a kretprobe's pool at the function's
// entry (kretprobe_entry, from an int3 or a detour) and given back at its return
// (on_function_return, from the return trampoline). No allocation, no locks, no library
// call (DESIGN.md §3); the build checks the last from this file's object
// (tests/probecore/check_hit_path.sh). Pools are made and reclaimed in registry.cc.
#include <signal.h>

#include "arch/syscall.h"
#include "arch/warn.h"
#include "probecore/hit_path.h"

namespace probefs::probecore::detail {

namespace {

// The shared free list: a tagged Treiber stack of indices.
KretprobeInstance* shared_get(InstancePool* pool) {
  uint64_t h = pool->head.load(std::memory_order_acquire);
  for (;;) {
    const uint32_t i = static_cast<uint32_t>(h);
    if (i == 0) return nullptr;
    const uint32_t next = __atomic_load_n(&pool->next_free[i - 1], __ATOMIC_RELAXED);
    const uint64_t nh = (((h >> 32) + 1) << 32) | next;
    if (pool->head.compare_exchange_weak(h, nh, std::memory_order_acq_rel,
                                         std::memory_order_acquire))
      return pool->at(i - 1);
  }
}

void shared_put(InstancePool* pool, uint32_t i) {
  uint64_t h = pool->head.load(std::memory_order_relaxed);
  uint64_t nh;
  do {
    __atomic_store_n(&pool->next_free[i], static_cast<uint32_t>(h), __ATOMIC_RELAXED);
    nh = (((h >> 32) + 1) << 32) | (i + 1);
  } while (!pool->head.compare_exchange_weak(h, nh, std::memory_order_release,
                                             std::memory_order_relaxed));
}

__attribute__((noinline)) KretprobeInstance* pool_get_slow(InstancePool* pool) {
  if (KretprobeInstance* ri = shared_get(pool)) return ri;
  if (!pool->cpus) return nullptr;
  for (uint32_t c = 0; c < pool->ncpus; ++c) {
    uint32_t i;
    if (arch::percpu_steal(pool->cpus.get(), c, &i)) return pool->at(i);
  }
  return nullptr;
}

inline KretprobeInstance* pool_get(InstancePool* pool) {
  uint32_t i;
  if (pool->cpus && arch::percpu_pop_inline(pool->cpus.get(), pool->ncpus, &i)) return pool->at(i);
  return pool_get_slow(pool);
}

// A retired pool takes its instances back on the shared list only, where reclaim counts
// them (a put that saw it live ends within the grace period that follows retirement).
// `live`: the caller saw pool->rp set inside its current read-side section.
inline void pool_put(InstancePool* pool, KretprobeInstance* ri, bool live) {
  if (pool->cpus && live &&
      arch::percpu_push_inline(pool->cpus.get(), pool->ncpus, ri->index, pool->cpu_capacity))
    return;
  shared_put(pool, ri->index);
}

inline void pool_put(InstancePool* pool, KretprobeInstance* ri) {
  pool_put(pool, ri, pool->rp.load(std::memory_order_relaxed) != nullptr);
}

// A kretprobe's entry: takes an instance and hijacks the return address.
[[gnu::always_inline]] inline void kretprobe_entry(Kretprobe* rp, PtRegs* regs) {
  // Unregistration clears pool_ before its grace period: a hit that read the children
  // list earlier may still get here, and then takes nothing.
  InstancePool* pool = __atomic_load_n(&rp->pool_, __ATOMIC_ACQUIRE);
  if (!pool) return;
  KretprobeInstance* ri = pool_get(pool);
  if (__builtin_expect(!ri, 0)) {
    rp->nmissed.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  ri->ret_slot = reinterpret_cast<uintptr_t*>(regs->sp);
  ri->ret_addr = *ri->ret_slot;
  if (rp->entry_handler && rp->entry_handler(ri, regs)) {
    pool_put(pool, ri, true);  // the caller saw rp among the children
    return;
  }
  *ri->ret_slot = g_trampoline;
  ri->next = t_ri_head;
  t_ri_head = ri;
}

}  // namespace

// The pre_handler of every kretprobe's entry probe.
int pre_handler_kretprobe(Kprobe* p, PtRegs* regs) {
  kretprobe_entry(reinterpret_cast<Kretprobe*>(p), regs);  // kp is Kretprobe's first member
  return 0;
}

// A lean call-mode detour fired (arch::DetourEntry::kCallLean): regs holds sp and the
// registers a call clobbers, which is all a kretprobe's own entry reads. Probes that need
// more joined while the hit was on its way, and do not see it.
void on_lean_entry_hit(void* const volatile* ctx, PtRegs* regs, unsigned) {
  on_optimized_aggregate(ctx, [&](Kprobe* p) {
    if (p->is_kretprobe_ && p->hit_needs_ == 0 && probe_enabled(p))
      kretprobe_entry(reinterpret_cast<Kretprobe*>(p), regs);
  });
}

namespace {

[[noreturn]] void die_lost_return() {
  // A return through the trampoline that no instance accounts for: there is no address
  // to go back to. Stop the process the way an assertion would.
  PROBEFS_WARN_ON_ONCE(true, "a return through the trampoline that no instance accounts for");
  arch::raw_syscall(__NR_tgkill, arch::raw_syscall(__NR_getpid), arch::raw_syscall(__NR_gettid),
                    SIGABRT);
  for (;;) __builtin_trap();
}

// The instance whose return address lay in `slot`, unlinked from the thread's list, when
// it is not the newest. Newer ones lying below it on the stack belong to frames that were
// skipped (longjmp, exceptions caught above them): they are recycled. Newer ones above it
// are on another stack (a coroutine, a signal stack) and stay.
__attribute__((noinline)) KretprobeInstance* unlink_older_instance(uintptr_t* slot) {
  KretprobeInstance* ri = t_ri_head;
  while (ri && ri->ret_slot != slot) ri = ri->next;
  if (!ri) die_lost_return();
  KretprobeInstance** link = &t_ri_head;
  while (*link != ri) {
    KretprobeInstance* newer = *link;
    if (newer->ret_slot < slot) {
      *link = newer->next;
      pool_put(newer->pool, newer);
    } else {
      link = &newer->next;
    }
  }
  *link = ri->next;
  return ri;
}

}  // namespace

uintptr_t on_function_return(PtRegs* regs) {
  auto* slot = reinterpret_cast<uintptr_t*>(regs->sp - 8);
  rcu_read_lock();
  // Ours is normally the newest instance.
  KretprobeInstance* ri = t_ri_head;
  if (__builtin_expect(ri && ri->ret_slot == slot, 1)) t_ri_head = ri->next;
  else ri = unlink_older_instance(slot);
  const uintptr_t ret = ri->ret_addr;
  regs->ip = ret;
  Kretprobe* rp = ri->pool->rp.load(std::memory_order_acquire);
  if (__builtin_expect(rp && rp->handler && !t_current, 1)) {
    t_current = rp;
    rp->handler(ri, regs);
    t_current = nullptr;
  }
  pool_put(ri->pool, ri, rp != nullptr);
  rcu_read_unlock();
  return ret;
}

}  // namespace probefs::probecore::detail

namespace probefs::probecore {

Kretprobe* get_kretprobe(KretprobeInstance* ri) {
  return ri->pool->rp.load(std::memory_order_acquire);
}

}  // namespace probefs::probecore
