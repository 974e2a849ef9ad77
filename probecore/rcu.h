// Read-copy-update for the hit path: readers (probe hits on any thread) pay a store to a
// cache line of their own; the writer (the control plane, which unpublishes a probe and
// then frees it) waits for every reader that might still see the old data.
//
// The asymmetry comes from membarrier(PRIVATE_EXPEDITED): the writer makes every running
// thread execute a full barrier, so readers need only compiler barriers. A reader record per
// thread lives in a static array, claimed on a thread's first hit without allocating; the
// thread's slot pointer is initial-exec TLS.
//
// Threads: rcu_read_lock/unlock on any thread, inside signal handlers too (they nest);
// synchronize_rcu on the control plane only (callers may overlap), never inside a
// read-side section.
#pragma once

#include <atomic>
#include <cstdint>

namespace probefs::probecore {

struct alignas(64) RcuReader {
  // Low 32 bits: how deep the owner is in read-side sections (signal handlers nest them).
  // High 32 bits: outermost sections ended so far. Written by the owner only, with plain
  // stores; the writer reads it. (The shared overflow record counts its readers instead.)
  std::atomic<uint64_t> state;
  std::atomic<int32_t> tid;    // owner thread; 0 = free
};

namespace detail {
extern thread_local constinit RcuReader* t_rcu_reader __attribute__((tls_model("initial-exec")));
// Threads that found every record taken share this one; its state counts them instead.
extern RcuReader g_rcu_overflow;
RcuReader* rcu_claim_reader();
}  // namespace detail

inline void rcu_read_lock() {
  RcuReader* r = detail::t_rcu_reader;
  if (__builtin_expect(!r, 0)) r = detail::rcu_claim_reader();
  if (__builtin_expect(r == &detail::g_rcu_overflow, 0)) {
    r->state.fetch_add(1, std::memory_order_seq_cst);
    return;
  }
  r->state.store(r->state.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  std::atomic_signal_fence(std::memory_order_seq_cst);
}

inline void rcu_read_unlock() {
  RcuReader* r = detail::t_rcu_reader;
  if (__builtin_expect(r == &detail::g_rcu_overflow, 0)) {
    r->state.fetch_sub(1, std::memory_order_release);
    return;
  }
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const uint64_t s = r->state.load(std::memory_order_relaxed);
  // Leaving the outermost section counts it: depth 1 -> 0, and one more ended.
  const uint64_t step = (s & 0xffffffffu) == 1 ? (uint64_t{1} << 32) - 1 : ~uint64_t{0};
  r->state.store(s + step, std::memory_order_release);
}

// Waits until every read-side section that began before the call has ended.
void synchronize_rcu();

// In a fork child: the calling thread's record now belongs to its new tid.
void rcu_after_fork_child();

}  // namespace probefs::probecore
