// The hit path of kretprobes: instances taken from a kretprobe's pool at the function's
// entry (kretprobe_entry, from an int3 or a detour) and given back at its return
// (on_function_return, from the return trampoline). No allocation, no locks, no library
// call (DESIGN.md §3); the build checks the last from this file's object
// (tests/probecore/check_hit_path.sh). Pools are made and reclaimed in registry.cc.
//
// Each thread keeps its instances in flight in a list, newest first (t_ri_head), which is
// the call chain of the stack it runs on as long as it runs on one: an entry pushes, a
// return pops the newest. Where the order says a frame is gone (an entry above it, a
// return from a frame older than it), it may instead live on another stack: the thread
// switched stacks (swapcontext, setcontext, makecontext coroutines) and will come back.
// Such an instance is parked (t_parked) rather than given back: a return that does not
// find its instance in the list finds it there, and runs its handler. An instance leaves
// the park only when its frame returns, or when its frame is proven gone:
//   - a later entry took its slot (the call found no return point of ours there), or
//   - its slot no longer holds one of our return points, or lies in memory that is no
//     longer mapped (looked at without faulting, when an entry finds its pool empty or
//     the instance's kretprobe was unregistered).
// An instance is never given back while its frame may still return through our return
// point: that return would have nowhere to go. The park holds no more than the pools
// lent, maxactive each; a frame that lives on forever (a coroutine never resumed, its
// stack kept) keeps its instance, as a thread blocked inside a probed function does.
// The one exception is an exception: before it unwinds, the instances in the list above
// the thrower go back to their pools with the function's address back in their slots,
// as they always did; for one of them whose frame lives on another stack and returns
// through a copy of our return point (a context swapcontext saved), the thread keeps
// where it returns to (t_given_back).
#include <signal.h>

#include <cerrno>

#include "arch/self_memory.h"
#include "arch/syscall.h"
#include "arch/warn.h"
#include "probecore/hit_path.h"
#include "probecore/testing.h"

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

// Where the last instances that an exception's give-back took out of the list returned to
// (give_back_hijacked_returns puts the return address back into the slot, which serves a
// frame that returns through its slot). A frame whose return address a context switch had
// saved (swapcontext saves its caller's, with our return point in it) lives on another
// stack and comes back through the copy after its instance went back to its pool: it goes
// where the record says, without the handler. One record per slot, used once; a new one
// takes the place of the oldest.
constexpr unsigned kGivenBack = 8;
thread_local ReturnedTwice t_given_back[kGivenBack] __attribute__((tls_model("initial-exec")));
thread_local unsigned t_given_back_next __attribute__((tls_model("initial-exec"))) = 0;

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
  const long rc = arch::raw_syscall(__NR_sigaltstack, 0, reinterpret_cast<long>(&ss));
  if (rc != 0 || (ss.ss_flags & SS_DISABLE)) return {};
  const auto lo = reinterpret_cast<uintptr_t>(ss.ss_sp);
  return {lo, lo + ss.ss_size};
}

// ---- the park ----

// This thread's parked instances (linked by next), most recently parked first: instances
// whose frames the order of the list says are gone, but which may live on another stack.
// Whenever instances move from the list to the park they go in front, in their order: an
// instance in the list is newer than every parked one at its slot, and the park is newest
// first at each slot, so that a return finds the newest instance of its slot first.
thread_local constinit KretprobeInstance* t_parked __attribute__((tls_model("initial-exec"))) =
    nullptr;
// Looking at parked frames costs a system call each (sweep_parked): after a look that found
// nothing gone, the next t_sweep_skip chances are let pass, twice as many each time.
thread_local constinit uint32_t t_sweep_skip __attribute__((tls_model("initial-exec"))) = 0;
thread_local constinit uint32_t t_sweep_backoff __attribute__((tls_model("initial-exec"))) = 0;
constexpr uint32_t kMaxSweepBackoff = 255;

// t_current while the hit path rearranges this thread's instances outside a handler: a
// probe that a signal handler hits meanwhile is missed, as inside a handler, rather than
// taking an instance from the lists half-way through a change.
char g_rearranging;

// A return address that is the caller's, not one of our return points (the trampolines, a
// call-mode detour's). Only the slow paths ask: it may look at the detours' chunks.
inline bool real_return(uintptr_t addr) { return !arch::is_hijacked_return(addr); }

// Marks a parked instance carries in the low bits of ret_slot (slots are 8-byte aligned)
// while it is parked; never in the list.
//   kRestored  the unwinder's give-back (give_back_hijacked_returns) put the function's
//              return address back into its slot: its frame, if alive, no longer holds
//              one of our return points there
//   kBatchEnd  the oldest of the instances parked together (park()), which came out of
//              the list as one chain
constexpr uintptr_t kRestored = 1, kBatchEnd = 2, kMarks = kRestored | kBatchEnd;

inline uintptr_t marks(const KretprobeInstance* ri) {
  return reinterpret_cast<uintptr_t>(ri->ret_slot) & kMarks;
}

inline uintptr_t* slot_of(const KretprobeInstance* ri) {
  return reinterpret_cast<uintptr_t*>(reinterpret_cast<uintptr_t>(ri->ret_slot) & ~kMarks);
}

inline void add_mark(KretprobeInstance* ri, uintptr_t mark) {
  ri->ret_slot = reinterpret_cast<uintptr_t*>(reinterpret_cast<uintptr_t>(ri->ret_slot) | mark);
}

inline bool restored(const KretprobeInstance* ri) { return marks(ri) & kRestored; }
inline bool batch_end(const KretprobeInstance* ri) { return marks(ri) & kBatchEnd; }

// Unlinks `ri` (at *link, behind `prev`, nullptr for the first) from the list or the park;
// in the park its batch then ends at the instance before it.
inline void unlink(KretprobeInstance** link, KretprobeInstance* prev, KretprobeInstance* ri) {
  *link = ri->next;
  if (batch_end(ri) && prev && !batch_end(prev)) add_mark(prev, kBatchEnd);
}

// Gives back every instance at `slot` in the list or park whose first link is *link.
void drop_at(KretprobeInstance** link, const uintptr_t* slot) {
  KretprobeInstance* prev = nullptr;
  while (KretprobeInstance* ri = *link) {
    if (slot_of(ri) == slot) {
      unlink(link, prev, ri);
      pool_put(ri->pool, ri);
    } else {
      prev = ri;
      link = &ri->next;
    }
  }
}

// Is the frame of a parked instance provably gone? Its slot is read without faulting (the
// stack it lies on may have been unmapped since): a slot that can no longer be read, or
// that holds no return point of ours (nor, after a give-back, the function's own return
// address), was taken by other data or a later call. A failed read that is not a fault (a
// seccomp filter) proves nothing.
bool frame_gone(const KretprobeInstance* ri, long pid) {
  uintptr_t v = 0;
  const long n = arch::read_self_memory(pid, reinterpret_cast<uintptr_t>(slot_of(ri)), &v,
                                        sizeof v);
  if (n == -EFAULT || n == 0) return true;
  if (n != static_cast<long>(sizeof v)) return false;
  return real_return(v) && !(restored(ri) && v == ri->ret_addr);
}

// Does the park hold an instance that a sweep for `want` looks at?
inline bool sweep_candidate(const KretprobeInstance* ri, const InstancePool* want) {
  return ri->pool == want || ri->pool->rp.load(std::memory_order_relaxed) == nullptr;
}

// Gives back the parked instances of `want` (nullptr: none) and of unregistered kretprobes
// whose frames are provably gone. An unregistered kretprobe's pool is freed only once all
// its instances are back: its parked ones are looked at whenever the park changes.
void sweep_parked(const InstancePool* want) {
  bool any = false;
  for (const KretprobeInstance* ri = t_parked; ri && !any; ri = ri->next)
    any = sweep_candidate(ri, want);
  if (!any) return;
  if (t_sweep_skip) {
    --t_sweep_skip;
    return;
  }
  const long pid = arch::self_memory_pid();
  bool freed = false;
  KretprobeInstance* prev = nullptr;
  for (KretprobeInstance** link = &t_parked; KretprobeInstance* ri = *link;) {
    if (sweep_candidate(ri, want) && frame_gone(ri, pid)) {
      unlink(link, prev, ri);
      pool_put(ri->pool, ri);
      freed = true;
    } else {
      prev = ri;
      link = &ri->next;
    }
  }
  if (freed) {
    t_sweep_backoff = 0;
  } else {
    t_sweep_backoff = t_sweep_backoff * 2 + 1 < kMaxSweepBackoff ? t_sweep_backoff * 2 + 1
                                                                  : kMaxSweepBackoff;
    t_sweep_skip = t_sweep_backoff;
  }
}

// Parks `chain` (instances linked by next, newest first, taken out of the list) in front of
// the park. An instance of it whose return address is the caller's was entered when its
// slot held no return point of ours: every instance older than it at that slot (later in
// the chain, in what is left of the list, in the park) belongs to a frame that was gone by
// then, and goes back to its pool.
void park(KretprobeInstance* chain) {
  if (!chain) return;
  KretprobeInstance* last = chain;
  for (KretprobeInstance* ri = chain; ri; ri = ri->next) {
    if (real_return(ri->ret_addr)) {
      drop_at(&ri->next, ri->ret_slot);
      drop_at(&t_ri_head, ri->ret_slot);
      drop_at(&t_parked, ri->ret_slot);
    }
    last = ri;
  }
  add_mark(last, kBatchEnd);
  last->next = t_parked;
  t_parked = chain;
  sweep_parked(nullptr);
}

// Is there a parked instance at `slot` before `end` in the park (a newer one)?
bool parked_before(const KretprobeInstance* end, const uintptr_t* slot) {
  for (const KretprobeInstance* p = t_parked; p != end; p = p->next)
    if (slot_of(p) == slot) return true;
  return false;
}

// The newest parked instance at `slot` (through the entry for functions that return twice,
// only such a function's own), taken out of the park; nullptr when there is none.
//
// The thread is back on the stack of that instance's frame, whose older frames were most
// likely parked with it (they follow it in its batch, each slot above the one before):
// they go into *chain (newest first, linked by next), to be the list again, so that their
// returns are found at once and an unwind here sees them as this stack's. Where that guess
// takes in another stack's instances, they are parked again when that shows. It stops at
// the batch's end, at an instance whose slot the unwinder's give-back restored (its return
// comes back through a saved copy, if at all) and at one that a newer parked instance
// shares its slot with (the list must hold the newest of each slot).
KretprobeInstance* unpark(const uintptr_t* slot, bool twice, KretprobeInstance** chain) {
  *chain = nullptr;
  KretprobeInstance* prev = nullptr;
  for (KretprobeInstance** link = &t_parked; KretprobeInstance* ri = *link;
       prev = ri, link = &ri->next) {
    if (slot_of(ri) != slot || (twice && !ri->pool->returns_twice)) continue;
    KretprobeInstance* last = ri;
    while (!batch_end(last) && last->next) {
      const KretprobeInstance* older = last->next;
      if (restored(older) || slot_of(older) <= slot_of(last) ||
          parked_before(ri, slot_of(older)))
        break;
      last = last->next;
    }
    // [ri, last] leaves the park; when last ended its batch, the batch now ends before ri.
    if (batch_end(last) && prev && !batch_end(prev)) add_mark(prev, kBatchEnd);
    *link = last->next;
    last->next = nullptr;
    *chain = ri->next;
    for (KretprobeInstance* c = ri; c; c = c->next) c->ret_slot = slot_of(c);
    return ri;
  }
  return nullptr;
}

// An entry found its pool empty: parked instances of it may be gone. Those at the entry's
// own slot are, when it holds the caller's address (a new call took the slot); the others
// are looked at (sweep_parked).
__attribute__((noinline)) KretprobeInstance* pool_get_parked(InstancePool* pool,
                                                             uintptr_t* slot) {
  if (!t_parked) return nullptr;
  if (real_return(*slot)) drop_at(&t_parked, slot);
  if (KretprobeInstance* ri = pool_get(pool)) return ri;
  sweep_parked(pool);
  return pool_get(pool);
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
// siglongjmp, setcontext, or an exception caught above them left them), or live on
// another stack that lies below this one (a coroutine's: the thread switched to this one
// and will switch back). Newest first, until one is alive, they are parked; an instance at
// sp whose slot the new call reused (slot_reused) is gone for certain and goes back to its
// pool, as kernel uretprobes drop theirs. An instance is alive when its slot lies above sp
// on the same stack, or at sp for a tail call. Stacks are told apart only for the signal
// stack (one system call, on this rare path): an instance made there is taken for gone once
// the thread runs elsewhere, and one made elsewhere stays while a handler runs there. Other
// stacks are taken for this one, which the park makes harmless.
__attribute__((noinline)) void recycle_passed_instances(uintptr_t* sp) {
  const AltStack alt = alt_stack();
  const bool on_alt = alt.contains(sp);
  KretprobeInstance* chain = nullptr;
  KretprobeInstance** tail = &chain;
  while (KretprobeInstance* ri = t_ri_head) {
    const bool ri_alt = alt.contains(ri->ret_slot);
    bool gone, reused = false;
    if (ri_alt != on_alt) gone = ri_alt;
    else if (ri->ret_slot != sp) gone = ri->ret_slot < sp;
    else gone = reused = slot_reused(ri, sp);
    if (!gone) break;
    t_ri_head = ri->next;
    if (reused) {
      pool_put(ri->pool, ri);
    } else {
      *tail = ri;
      tail = &ri->next;
    }
  }
  *tail = nullptr;
  // Parked ones at sp are gone when the new call left the caller's address there.
  if (t_parked && real_return(*sp)) drop_at(&t_parked, sp);
  park(chain);
}

// A kretprobe's entry: takes an instance and hijacks the return address.
[[gnu::always_inline]] inline void kretprobe_entry(Kretprobe* rp, PtRegs* regs) {
  auto* slot = reinterpret_cast<uintptr_t*>(regs->sp);
  // Nested calls lie below every instance in flight; an instance whose slot lies below
  // this one, or at it when no tail call or other return probe here entered, belongs to
  // a frame that is gone or on another stack (dealt with before taking, so that the
  // instances it held serve this entry).
  if (const KretprobeInstance* newest = t_ri_head;
      __builtin_expect(newest && (newest->ret_slot < slot ||
                                  (newest->ret_slot == slot && slot_reused(newest, slot))), 0))
    recycle_passed_instances(slot);
  // Unregistration clears pool_ before its grace period: a hit that read the children
  // list earlier may still get here, and then takes nothing.
  InstancePool* pool = __atomic_load_n(&rp->pool_, __ATOMIC_ACQUIRE);
  if (!pool) return;
  KretprobeInstance* ri = pool_get(pool);
  if (__builtin_expect(!ri, 0) && !(ri = pool_get_parked(pool, slot))) {
    count_miss(&rp->kp, &rp->nmissed);
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
  // A return through the trampoline that this thread holds no instance for, in flight or
  // parked: its frame was entered on another thread (a coroutine resumed by a thread
  // other than the one it ran on when it entered: per-thread state does not see that
  // thread's instances), or its slot was copied away and back while the park took it for
  // gone (coroutines that copy their stacks in and out). The return address is known
  // nowhere this thread can look; going on at any guess would run the program on wrong
  // state. Stop the process the way an assertion would.
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

void remember_given_back(uintptr_t* slot, uintptr_t ret_addr) {
  for (ReturnedTwice& r : t_given_back) {
    if (r.slot == slot) {
      r.ret_addr = ret_addr;
      return;
    }
  }
  t_given_back[t_given_back_next] = {slot, ret_addr};
  t_given_back_next = (t_given_back_next + 1) % kGivenBack;
}

// The record of a give-back at `slot`, taken: where that frame returns; 0 when there is none.
uintptr_t take_given_back(const uintptr_t* slot) {
  for (ReturnedTwice& r : t_given_back) {
    if (r.slot == slot) {
      r.slot = nullptr;
      return r.ret_addr;
    }
  }
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

// The instance whose return address lay in `slot`, when it is not the newest in the list,
// taken out of the list or the park; nullptr, with where the return goes in *to, for the
// second return of a function that returns twice (`twice`: it came through the
// trampoline's entry for those) and for the return of a frame whose instance an
// exception's give-back took (t_given_back).
//
// Found in the list: the newer ones belong to frames that were skipped on this stack
// (longjmp, exceptions caught above them) or that live on another stack (the thread
// switched here from a coroutine, whose frames lie below or above): they are parked.
// Found in the park or in a give-back's record: the thread came back to a stack it had
// left, and what the list holds is the chain of the stack it leaves: parked too. Found
// nowhere: see die_lost_return().
__attribute__((noinline)) KretprobeInstance* unlink_returning_instance(uintptr_t* slot,
                                                                     bool twice, uintptr_t* to) {
  KretprobeInstance* ri = t_ri_head;
  while (ri && ri->ret_slot != slot) ri = ri->next;
  // Through the entry for functions that return twice, only such a function's own
  // instance is a first return; an instance of another function at the same slot (called
  // later from the same frame, and left by the longjmp that brings us here) is gone.
  if (twice && ri && !ri->pool->returns_twice) ri = nullptr;
  if (ri) {
    KretprobeInstance* newer = nullptr;
    if (t_ri_head != ri) {
      newer = t_ri_head;
      KretprobeInstance* last = newer;
      while (last->next != ri) last = last->next;
      last->next = nullptr;
    }
    t_ri_head = ri->next;
    park(newer);
    return ri;
  }
  KretprobeInstance* chain = nullptr;
  if ((ri = unpark(slot, twice, &chain)) || (!twice && (*to = take_given_back(slot)))) {
    KretprobeInstance* left = t_ri_head;
    t_ri_head = chain;
    park(left);  // after the list changed: what it parks is newer than the chain
    return ri;
  }
  if (!twice) die_lost_return();
  if (!(*to = returned_before(slot))) die_lost_return();
  // Every instance at or below the slot on this stack belongs to a frame the longjmp left:
  // one at the slot itself for certain (its memory is the caller's return slot again),
  // one below it unless it lies on another stack (parked).
  KretprobeInstance** tail = &chain;
  while (t_ri_head && t_ri_head->ret_slot <= slot) {
    KretprobeInstance* gone = t_ri_head;
    t_ri_head = gone->next;
    if (gone->ret_slot == slot) {
      pool_put(gone->pool, gone);
    } else {
      *tail = gone;
      tail = &gone->next;
    }
  }
  *tail = nullptr;
  park(chain);
  return nullptr;
}

// For an instance that saved another return probe's return point (that one entered the
// frame first): the caller's address, which the oldest instance of the slot keeps, in the
// list (right behind it) or in the park.
uintptr_t outer_return_address(const uintptr_t* slot) {
  for (const KretprobeInstance* o = t_ri_head; o && o->ret_slot == slot; o = o->next)
    if (o->ret_addr != g_trampoline && o->ret_addr != g_trampoline_twice) return o->ret_addr;
  for (const KretprobeInstance* o = t_parked; o; o = o->next)
    if (slot_of(o) == slot && o->ret_addr != g_trampoline && o->ret_addr != g_trampoline_twice)
      return o->ret_addr;
  return 0;
}

// Writes one word of this process's memory without faulting (process_vm_writev, as
// arch::read_self_memory reads). True when it was written.
bool write_self_word(long pid, uintptr_t addr, uintptr_t value) {
  struct IoVec {  // struct iovec, without libc's headers
    const void* base;
    size_t len;
  };
  IoVec local{&value, sizeof value};
  IoVec remote{reinterpret_cast<void*>(addr), sizeof value};
  return arch::raw_syscall(__NR_process_vm_writev, pid, reinterpret_cast<long>(&local), 1,
                           reinterpret_cast<long>(&remote), 1, 0) ==
         static_cast<long>(sizeof value);
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
  } else {
    const void* was = t_current;
    if (!was) t_current = &g_rearranging;
    uintptr_t to = 0;
    ri = unlink_returning_instance(slot, twice, &to);
    t_current = was;
    if (!ri) {
      // A second return, or one whose instance an exception's give-back took: it goes
      // where the record says, without an instance, so without the return handler.
      regs->ip = to;
      rcu_read_unlock();
      return to;
    }
  }
  const uintptr_t ret = ri->ret_addr;
  if (__builtin_expect(ri->pool->returns_twice, 0)) remember_return(slot, ret);
  regs->ip = ret;
  // Another return probe entered this frame first, so what this instance saved is that
  // one's trampoline, where the return goes on to. The handler is shown the caller's
  // address, as kernel kretprobes show it: the one the outer instance of the slot holds.
  if (__builtin_expect(ret == g_trampoline || ret == g_trampoline_twice, 0)) {
    if (const uintptr_t caller = outer_return_address(slot)) {
      ri->ret_addr = caller;
      regs->ip = caller;
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

// Before an exception unwinds this thread's stack (unwind.cc): the instances in the list
// whose slots lie above `frame` (the unwinder's entry) return to their pools, and those
// whose slot still holds one of our return points put the function's return address back,
// so the unwinder walks the program's own frames; that address is also kept in
// t_given_back, for a frame among them that lives on another stack and returns through a
// copy of our return point. Without that mark the frame is gone (left by longjmp, not yet
// recycled) and live frames may use the slot now. Instances below `frame` are on another
// stack (a coroutine's) and stay.
//
// Parked instances above `frame` may be this thread's own older frames (parked when it
// came back from another stack), which the unwind walks, or frames that live on another
// stack: their slots get the return address back in the same way (read and written
// without faulting: their stacks may be gone), and they stay parked, so that a return
// through a copy of our return point that a context switch saved (swapcontext keeps the
// return address of its caller's context) still finds its instance.
void give_back_hijacked_returns(const void* frame) {
  const auto above = reinterpret_cast<uintptr_t>(frame);
  rcu_read_lock();
  const void* was = t_current;
  if (!was) t_current = &g_rearranging;
  KretprobeInstance** link = &t_ri_head;
  while (KretprobeInstance* ri = *link) {
    uintptr_t* slot = ri->ret_slot;
    if (reinterpret_cast<uintptr_t>(slot) <= above) {
      link = &ri->next;
      continue;
    }
    *link = ri->next;
    if (arch::is_hijacked_return(*slot)) {
      *slot = ri->ret_addr;
      remember_given_back(slot, ri->ret_addr);
    }
    pool_put(ri->pool, ri);
  }
  if (t_parked) {
    const long pid = arch::self_memory_pid();
    for (KretprobeInstance* ri = t_parked; ri; ri = ri->next) {
      const auto slot = reinterpret_cast<uintptr_t>(slot_of(ri));
      uintptr_t v = 0;
      if (slot <= above ||
          arch::read_self_memory(pid, slot, &v, sizeof v) != static_cast<long>(sizeof v) ||
          !arch::is_hijacked_return(v) || !write_self_word(pid, slot, ri->ret_addr))
        continue;
      add_mark(ri, kRestored);
    }
  }
  t_current = was;
  rcu_read_unlock();
}

}  // namespace probefs::probecore::detail

namespace probefs::probecore {

Kretprobe* get_kretprobe(KretprobeInstance* ri) {
  return ri->pool->rp.load(std::memory_order_acquire);
}

uintptr_t kretprobe_slot_return(const uintptr_t* slot, uintptr_t value) {
  for (const KretprobeInstance* ri = detail::t_ri_head; ri != nullptr; ri = ri->next)
    if (ri->ret_slot == slot) return ri->ret_addr;
  return value;
}

}  // namespace probefs::probecore

// ---- introspection for tests (probecore/testing.h) ----

namespace probefs::probecore::testing {

size_t kretprobe_instances_out(const Kretprobe* rp) {
  const detail::InstancePool* pool = __atomic_load_n(&rp->pool_, __ATOMIC_ACQUIRE);
  if (!pool) return 0;
  size_t free = 0;
  for (uint32_t c = 0; pool->cpus && c < pool->ncpus; ++c)
    free += __atomic_load_n(&pool->cpus[c].count, __ATOMIC_ACQUIRE);
  for (uint32_t i = static_cast<uint32_t>(pool->head.load(std::memory_order_acquire));
       i != 0 && free <= pool->count;
       i = __atomic_load_n(&pool->next_free[i - 1], __ATOMIC_ACQUIRE))
    ++free;
  return free < pool->count ? pool->count - free : 0;
}

size_t thread_kretprobe_instances() {
  size_t n = thread_parked_kretprobe_instances();
  for (const KretprobeInstance* ri = detail::t_ri_head; ri; ri = ri->next) ++n;
  return n;
}

size_t thread_parked_kretprobe_instances() {
  size_t n = 0;
  for (const KretprobeInstance* ri = detail::t_parked; ri; ri = ri->next) ++n;
  return n;
}

}  // namespace probefs::probecore::testing
