#include "probecore/rcu.h"

#include <sched.h>
#include <signal.h>
#include <time.h>

#include <cerrno>

#include "arch/membarrier.h"
#include "arch/syscall.h"
#include "arch/warn.h"

namespace probefs::probecore {
namespace detail {

constinit thread_local RcuReader* t_rcu_reader __attribute__((tls_model("initial-exec"))) = nullptr;
RcuReader g_rcu_overflow;

namespace {
constexpr int kMaxReaders = 4096;
RcuReader g_readers[kMaxReaders];
// Records [0, g_readers_used) were ever claimed: a grace period looks at those alone, so
// that the rest stay untouched zero pages (a process start faulted in all 4096 of them
// at its first grace period). Raised before a record is claimed, so that a grace period
// that misses the raise also misses the section that follows the claim.
std::atomic<int> g_readers_used{0};
std::atomic<bool> g_expedited{false};  // membarrier PRIVATE_EXPEDITED registered
}  // namespace

// Hit path (a thread's first probe hit): a bounded scan with no call into libc. When all
// records are taken (thousands of live threads), the thread uses the shared overflow
// record for good.
RcuReader* rcu_claim_reader() {
  const int32_t tid = static_cast<int32_t>(arch::raw_syscall(__NR_gettid));
  for (int i = 0; i < kMaxReaders; ++i) {
    int32_t expected = 0;
    if (g_readers[i].tid.load(std::memory_order_relaxed) != 0) continue;
    for (int used = g_readers_used.load(std::memory_order_relaxed); used < i + 1 &&
         !g_readers_used.compare_exchange_weak(used, i + 1, std::memory_order_seq_cst);) {
    }
    if (g_readers[i].tid.compare_exchange_strong(expected, tid, std::memory_order_acq_rel)) {
      g_readers[i].state.store(0, std::memory_order_relaxed);
      t_rcu_reader = &g_readers[i];
      return t_rcu_reader;
    }
  }
  t_rcu_reader = &g_rcu_overflow;
  return t_rcu_reader;
}

}  // namespace detail

namespace {

using arch::membarrier;

// Orders every running thread's memory accesses against ours.
void barrier_all_threads() {
  using detail::g_expedited;
  if (!g_expedited.load(std::memory_order_acquire)) {
    if (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) == 0)
      g_expedited.store(true, std::memory_order_release);
  }
  if (g_expedited.load(std::memory_order_acquire) &&
      membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0)
    return;
  PROBEFS_WARN_ON_ONCE(membarrier(MEMBARRIER_CMD_GLOBAL) != 0,
                       "no membarrier: RCU grace periods do not order other threads");
}

bool thread_alive(int32_t tid) {
  return arch::raw_syscall(__NR_tgkill, arch::raw_syscall(__NR_getpid), tid, 0) != -ESRCH;
}

void pause_briefly() {
  timespec ts{0, 50 * 1000};
  nanosleep(&ts, nullptr);
}

}  // namespace

void synchronize_rcu() {
  using detail::g_readers;
  using detail::kMaxReaders;
  barrier_all_threads();
  const int used = detail::g_readers_used.load(std::memory_order_seq_cst);
  for (int i = 0; i < used; ++i) {
    RcuReader& r = g_readers[i];
    const int32_t tid = r.tid.load(std::memory_order_acquire);
    if (tid == 0) continue;
    const uint64_t seen = r.state.load(std::memory_order_acquire);
    if ((seen & 0xffffffffu) == 0) continue;
    // Inside a section that may predate our unpublish: wait for it to end (the depth
    // drops to 0, or an outermost section ends), unless its thread is gone (then the
    // record is recycled).
    auto still_inside = [&] {
      const uint64_t now = r.state.load(std::memory_order_acquire);
      return (now >> 32) == (seen >> 32) && (now & 0xffffffffu) != 0;
    };
    for (unsigned spins = 0; still_inside(); ++spins) {
      if (tid != arch::raw_syscall(__NR_gettid) && !thread_alive(tid)) break;
      if (spins < 64) sched_yield();
      else pause_briefly();
    }
  }
  for (unsigned spins = 0; detail::g_rcu_overflow.state.load(std::memory_order_acquire) != 0;
       ++spins) {
    if (spins < 64) sched_yield();
    else pause_briefly();
  }
  // Recycle the records of threads that have exited. Only the owner field changes, with a
  // compare-and-swap, so that two writers may wait at once (the engine's control plane and
  // a control server's thread): a record that one of them freed and a new thread claimed
  // is never freed again by the other. The claimer clears the state word itself.
  for (int i = 0; i < used; ++i) {
    int32_t tid = g_readers[i].tid.load(std::memory_order_relaxed);
    if (tid != 0 && !thread_alive(tid))
      g_readers[i].tid.compare_exchange_strong(tid, 0, std::memory_order_acq_rel);
  }
  barrier_all_threads();
}

void rcu_after_fork_child() {
  // The child has one thread: every other record is free, and no other thread counts on
  // the overflow record (one inside a section at the fork would hold it up for good).
  RcuReader* own = detail::t_rcu_reader;
  const int used = detail::g_readers_used.load(std::memory_order_relaxed);
  for (int i = 0; i < used; ++i) {  // the others were never claimed: zero, untouched
    RcuReader& r = detail::g_readers[i];
    if (&r == own) continue;
    // Written only where not free already: each page written is a copy in the child.
    if (r.state.load(std::memory_order_relaxed) != 0) r.state.store(0, std::memory_order_relaxed);
    if (r.tid.load(std::memory_order_relaxed) != 0) r.tid.store(0, std::memory_order_relaxed);
  }
  if (detail::g_rcu_overflow.state.load(std::memory_order_relaxed) != 0)
    detail::g_rcu_overflow.state.store(0, std::memory_order_relaxed);
  if (own && own != &detail::g_rcu_overflow)
    own->tid.store(static_cast<int32_t>(arch::raw_syscall(__NR_gettid)),
                   std::memory_order_release);
}

}  // namespace probefs::probecore
