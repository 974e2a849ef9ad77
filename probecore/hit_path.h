// What the hit path's files share (dispatch.cc, kretprobe_instances.cc): code that runs
// on every hit, inline, and calls no library (DESIGN.md §3).
#pragma once

#include "probecore/engine_state.h"
#include "probecore/rcu.h"

namespace probefs::probecore::detail {

inline void count_missed(const Aggregate* ag) {
  const Children* ch = ag->children.load(std::memory_order_acquire);
  for (Kprobe* p : ch->probes)
    if (probe_enabled(p)) p->nmissed.fetch_add(1, std::memory_order_relaxed);
}

// The frame of an optimized hit: the aggregate behind the detour's context, read inside
// a read-side section, and the recursion guard around run(child) for each of its probes.
template <typename Run>
[[gnu::always_inline]] inline void on_optimized_aggregate(void* const volatile* ctx, Run run) {
  rcu_read_lock();
  const auto* ag = static_cast<const Aggregate*>(__atomic_load_n(ctx, __ATOMIC_ACQUIRE));
  if (__builtin_expect(ag != nullptr, 1)) {
    if (__builtin_expect(t_current != nullptr, 0)) {
      if (t_current != &g_engine_mark) count_missed(ag);
    } else {
      t_current = ag;
      for (Kprobe* p : ag->children.load(std::memory_order_acquire)->probes) run(p);
      t_current = nullptr;
    }
  }
  rcu_read_unlock();
}

}  // namespace probefs::probecore::detail
