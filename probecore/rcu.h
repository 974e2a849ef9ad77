// Read-copy-update for the hit path: readers (probe hits on any thread) pay two stores to a
// cache line of their own; the writer (the control plane, which unpublishes a probe and
// then frees it) waits for every reader that might still see the old data.
//
// The asymmetry comes from membarrier(PRIVATE_EXPEDITED): the writer makes every running
// thread execute a full barrier, so readers need only compiler barriers. A reader record per
// thread lives in a static array, claimed on a thread's first hit without allocating; the
// thread's slot pointer is initial-exec TLS.
//
// Threads: rcu_read_lock/unlock on any thread, inside signal handlers too (they nest);
// synchronize_rcu on the control plane only, never inside a read-side section.
#pragma once

#include <atomic>
#include <cstdint>

namespace probefs::probecore {

struct alignas(64) RcuReader {
  std::atomic<uint64_t> ctr;   // odd while the owner is inside a read-side section
  std::atomic<int32_t> tid;    // owner thread; 0 = free
  uint32_t nesting;            // owner only
};

namespace detail {
extern thread_local constinit RcuReader* t_rcu_reader __attribute__((tls_model("initial-exec")));
// Threads that found every record taken share this one; its ctr counts them instead.
extern RcuReader g_rcu_overflow;
RcuReader* rcu_claim_reader();
}  // namespace detail

inline void rcu_read_lock() {
  RcuReader* r = detail::t_rcu_reader;
  if (__builtin_expect(!r, 0)) r = detail::rcu_claim_reader();
  if (__builtin_expect(r == &detail::g_rcu_overflow, 0)) {
    r->ctr.fetch_add(1, std::memory_order_seq_cst);
    return;
  }
  if (__builtin_expect(r->nesting++ == 0, 1)) {
    r->ctr.store(r->ctr.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    std::atomic_signal_fence(std::memory_order_seq_cst);
  }
}

inline void rcu_read_unlock() {
  RcuReader* r = detail::t_rcu_reader;
  if (__builtin_expect(r == &detail::g_rcu_overflow, 0)) {
    r->ctr.fetch_sub(1, std::memory_order_release);
    return;
  }
  if (__builtin_expect(--r->nesting == 0, 1)) {
    std::atomic_signal_fence(std::memory_order_seq_cst);
    r->ctr.store(r->ctr.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
}

// Waits until every read-side section that began before the call has ended.
void synchronize_rcu();

// In a fork child: the calling thread's record now belongs to its new tid.
void rcu_after_fork_child();

}  // namespace probefs::probecore
