// What the hit path's files share (dispatch.cc, kretprobe_instances.cc): code that runs
// on every hit, inline, and calls no library (DESIGN.md §3).
#pragma once

#include "probecore/engine_state.h"
#include "probecore/rcu.h"

namespace probefs::probecore::detail {

// A hit that `p` did not handle: its nmissed grows (or `rp`'s, a kretprobe out of
// instances), and its miss_handler hears of it.
[[gnu::always_inline]] inline void count_miss(Kprobe* p, std::atomic<unsigned long>* nmissed) {
  nmissed->fetch_add(1, std::memory_order_relaxed);
  if (kprobe_miss_handler_t h = p->miss_handler) h(p);
}

// A hit inside another probe's handler (a signal handler interrupted it) on a program
// thread: the KPROBE_FLAG_NESTED probes run, with this aggregate as the running one for
// their duration; the others count a miss. run(p) returns true when p's handler changed
// the execution path (the rest do not run then).
template <typename Run>
[[gnu::noinline]] bool run_nested(const Aggregate* ag, Run run) {
  const void* outer = t_current;
  bool moved = false;
  t_current = ag;
  for (Kprobe* p : ag->children.load(std::memory_order_acquire)->probes) {
    if (!probe_enabled(p)) continue;
    if (!(__atomic_load_n(&p->flags, __ATOMIC_RELAXED) & KPROBE_FLAG_NESTED))
      count_miss(p, &p->nmissed);
    else if (!moved && run(p))
      moved = true;
  }
  t_current = outer;
  return moved;
}

// The frame of an optimized hit: the aggregate behind the detour's context, read inside
// a read-side section, and the recursion guard around run(child) for each of its probes.
template <typename Run>
[[gnu::always_inline]] inline void on_optimized_aggregate(void* const volatile* ctx, Run run) {
  rcu_read_lock();
  const auto* ag = static_cast<const Aggregate*>(__atomic_load_n(ctx, __ATOMIC_ACQUIRE));
  if (__builtin_expect(ag != nullptr, 1)) {
    if (__builtin_expect(t_current != nullptr, 0)) {
      if (t_current != &g_engine_mark) run_nested(ag, [&](Kprobe* p) {
        run(p);
        return false;
      });
    } else {
      t_current = ag;
      for (Kprobe* p : ag->children.load(std::memory_order_acquire)->probes) run(p);
      t_current = nullptr;
    }
  }
  rcu_read_unlock();
}

}  // namespace probefs::probecore::detail
