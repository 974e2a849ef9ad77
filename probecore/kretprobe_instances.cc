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

// The last first returns of functions that return twice on this thread: a second return
// (longjmp to a jmp_buf that setjmp filled) comes back through the hijacked address that
// setjmp saved, long after its instance went back to the pool, and goes where the first
// went. One record per slot; a new one takes the place of the record of the same slot, of
// one whose frame is gone (its slot lies below the new one's), or of the oldest.
struct ReturnedTwice {
  uintptr_t* slot;
  uintptr_t ret_addr;
};
constexpr unsigned kReturnedTwice = 32;
thread_local ReturnedTwice t_returned[kReturnedTwice] __attribute__((tls_model("initial-exec")));
thread_local unsigned t_returned_next __attribute__((tls_model("initial-exec"))) = 0;

// This thread's alternate signal stack, [lo, hi); empty when it has none.
struct AltStack {
  uintptr_t lo = 0, hi = 0;
  bool contains(const void* p) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    return lo <= a && a < hi;
  }
};

AltStack alt_stack() {
  stack_t ss{};
  long rc;
  asm volatile("syscall"  // sigaltstack(NULL, &ss)
               : "=a"(rc)
               : "a"(131L), "D"(0L), "S"(&ss)
               : "rcx", "r11", "memory");
  if (rc != 0 || (ss.ss_flags & SS_DISABLE)) return {};
  const auto lo = reinterpret_cast<uintptr_t>(ss.ss_sp);
  return {lo, lo + ss.ss_size};
}

// Is the frame of `ri`, whose return slot is where a new entry's is, gone? A tail call
// from a live frame enters with the slot as that frame left it: holding a trampoline, or,
// from a call-mode detour, the detour's own return point (which we cannot name here). A
// call from the same frame again, after longjmp left the first, pushed the very address
// the instance keeps. Another call site's address there would also mean the frame is
// gone, but cannot be told from a detour's return point: such an instance stays until the
// stack pointer passes it.
inline bool slot_reused(const KretprobeInstance* ri, const uintptr_t* slot) {
  const uintptr_t now = *slot;
  return now == ri->ret_addr && now != g_trampoline && now != g_trampoline_twice;
}

// A new entry on this thread whose return slot `sp` lies at or above the newest
// instance's: instances whose frames the stack pointer has passed are gone (longjmp,
// siglongjmp, setcontext, or an exception caught above them left them) and go back to
// their pools, newest first, until one is alive, as kernel uretprobes drop theirs. An
// instance is alive when its slot lies above sp on the same stack, or at sp for a tail
// call (slot_reused). Stacks are told apart only for the signal stack (one system call,
// on this rare path): an instance made there is gone once the thread runs elsewhere, and
// one made elsewhere stays while a handler runs there. Other stacks (coroutines) are taken
// for this one: a coroutine's instance lying below the running one's stack is dropped,
// and its return then finds none.
__attribute__((noinline)) void recycle_passed_instances(uintptr_t* sp) {
  const AltStack alt = alt_stack();
  const bool on_alt = alt.contains(sp);
  while (KretprobeInstance* ri = t_ri_head) {
    const bool ri_alt = alt.contains(ri->ret_slot);
    bool gone;
    if (ri_alt != on_alt) gone = ri_alt;
    else if (ri->ret_slot != sp) gone = ri->ret_slot < sp;
    else gone = slot_reused(ri, sp);
    if (!gone) break;
    t_ri_head = ri->next;
    pool_put(ri->pool, ri);
  }
}

// A kretprobe's entry: takes an instance and hijacks the return address.
[[gnu::always_inline]] inline void kretprobe_entry(Kretprobe* rp, PtRegs* regs) {
  auto* slot = reinterpret_cast<uintptr_t*>(regs->sp);
  // Nested calls lie below every instance in flight; an instance whose slot lies below
  // this one, or at it when no tail call or other return probe here entered, belongs to
  // a frame that is gone (recycled before taking, so that the instances it held serve this entry).
  if (const KretprobeInstance* newest = t_ri_head;
      __builtin_expect(newest && (newest->ret_slot < slot ||
                                  (newest->ret_slot == slot && slot_reused(newest, slot))), 0))
    recycle_passed_instances(slot);
  // Unregistration clears pool_ before its grace period: a hit that read the children
  // list earlier may still get here, and then takes nothing.
  InstancePool* pool = __atomic_load_n(&rp->pool_, __ATOMIC_ACQUIRE);
  if (!pool) return;
  KretprobeInstance* ri = pool_get(pool);
  if (__builtin_expect(!ri, 0)) {
    rp->nmissed.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  ri->ret_slot = slot;
  ri->ret_addr = *slot;
  if (rp->entry_handler && rp->entry_handler(ri, regs)) {
    pool_put(pool, ri, true);  // the caller saw rp among the children
    return;
  }
  // A function that returns twice gets the trampoline's other entry: the address it saves
  // (setjmp into its jmp_buf) then marks its second return.
  *slot = __builtin_expect(pool->returns_twice, 0) ? g_trampoline_twice : g_trampoline;
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

// The second return of a function that returns twice, at `slot`: where its first return
// went, or 0 when this thread has no record of it.
uintptr_t returned_before(uintptr_t* slot) {
  for (const ReturnedTwice& r : t_returned)
    if (r.slot == slot) return r.ret_addr;
  return 0;
}

void remember_return(uintptr_t* slot, uintptr_t ret_addr) {
  ReturnedTwice* gone = nullptr;
  for (ReturnedTwice& r : t_returned) {
    if (r.slot == slot) {  // the same frame again
      r.ret_addr = ret_addr;
      return;
    }
    if (!gone && r.slot < slot) gone = &r;  // a deeper frame's (or an empty record)
  }
  if (!gone) {
    gone = &t_returned[t_returned_next];
    t_returned_next = (t_returned_next + 1) % kReturnedTwice;
  }
  *gone = {slot, ret_addr};
}

// The instance whose return address lay in `slot`, unlinked from the thread's list, when
// it is not the newest, or nullptr for the second return of a function that returns twice
// (`twice`: it came through the trampoline's entry for those). Newer ones lying below it
// on the stack belong to frames that were skipped (longjmp, exceptions caught above them):
// they are recycled. Newer ones above it are on another stack (a coroutine, a signal
// stack) and stay.
__attribute__((noinline)) KretprobeInstance* unlink_older_instance(uintptr_t* slot, bool twice) {
  KretprobeInstance* ri = t_ri_head;
  while (ri && ri->ret_slot != slot) ri = ri->next;
  // Through the entry for functions that return twice, only such a function's own
  // instance is a first return; an instance of another function at the same slot (called
  // later from the same frame, and left by the longjmp that brings us here) is gone.
  if (twice && ri && !ri->pool->returns_twice) ri = nullptr;
  if (!ri) {
    if (!twice || !returned_before(slot)) die_lost_return();
    // Every instance at or below the slot belongs to a frame the longjmp left.
    while (t_ri_head && t_ri_head->ret_slot <= slot) {
      KretprobeInstance* gone = t_ri_head;
      t_ri_head = gone->next;
      pool_put(gone->pool, gone);
    }
    return nullptr;
  }
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
  const bool twice = regs->ip == g_trampoline_twice;
  rcu_read_lock();
  // Ours is normally the newest instance.
  KretprobeInstance* ri = t_ri_head;
  if (__builtin_expect(ri && ri->ret_slot == slot && !twice, 1)) {
    t_ri_head = ri->next;
  } else if (!(ri = unlink_older_instance(slot, twice))) {
    // A second return: it goes where the first went, without an instance, so without
    // the return handler.
    const uintptr_t ret = returned_before(slot);
    regs->ip = ret;
    rcu_read_unlock();
    return ret;
  }
  const uintptr_t ret = ri->ret_addr;
  if (__builtin_expect(ri->pool->returns_twice, 0)) remember_return(slot, ret);
  regs->ip = ret;
  // Another return probe entered this frame first, so what this instance saved is that
  // one's trampoline, where the return goes on to. The handler is shown the caller's
  // address, as kernel kretprobes show it: the one the outer instance of the slot holds.
  if (__builtin_expect(ret == g_trampoline || ret == g_trampoline_twice, 0)) {
    for (const KretprobeInstance* o = t_ri_head; o && o->ret_slot == slot; o = o->next) {
      if (o->ret_addr != g_trampoline && o->ret_addr != g_trampoline_twice) {
        ri->ret_addr = o->ret_addr;
        regs->ip = o->ret_addr;
        break;
      }
    }
  }
  Kretprobe* rp = ri->pool->rp.load(std::memory_order_acquire);
  if (__builtin_expect(rp && rp->handler && !t_current, 1)) {
    t_current = rp;
    rp->handler(ri, regs);
    t_current = nullptr;
  }
  // A vfork child takes the first return of vfork on its parent's thread state, whose
  // rseq area does not guard it: such pools take their instances back on the shared list.
  pool_put(ri->pool, ri, rp != nullptr && !ri->pool->returns_twice);
  rcu_read_unlock();
  return ret;
}

// Before an exception unwinds this thread's stack (unwind.cc): the instances whose slots
// lie above `frame` (the unwinder's entry) return to their pools, and those whose slot
// still holds one of our return points put the function's return address back, so the
// unwinder walks the program's own frames. Without that mark the frame is gone (left by
// longjmp, not yet recycled) and live frames may use the slot now. Instances below
// `frame` are on another stack (a coroutine's) and stay.
void give_back_hijacked_returns(const void* frame) {
  const auto above = reinterpret_cast<uintptr_t>(frame);
  rcu_read_lock();
  KretprobeInstance** link = &t_ri_head;
  while (KretprobeInstance* ri = *link) {
    uintptr_t* slot = ri->ret_slot;
    if (reinterpret_cast<uintptr_t>(slot) <= above) {
      link = &ri->next;
      continue;
    }
    *link = ri->next;
    if (arch::is_hijacked_return(*slot)) *slot = ri->ret_addr;
    pool_put(ri->pool, ri);
  }
  rcu_read_unlock();
}

}  // namespace probefs::probecore::detail

namespace probefs::probecore {

Kretprobe* get_kretprobe(KretprobeInstance* ri) {
  return ri->pool->rp.load(std::memory_order_acquire);
}

}  // namespace probefs::probecore
