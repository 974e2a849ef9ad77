// Jump optimization: which form each aggregate takes (disarmed, a jmp, an int3), the
// detours it needs, the batch of jmps a control operation writes in one window, and the
// optimizer thread that retries what could not be written at once.
#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <algorithm>

#include "arch/signals.h"
#include "probecore/engine_state.h"
#include "probecore/rcu.h"

namespace probefs::probecore::detail {

namespace {
constexpr auto kRetrySoonDelay = std::chrono::milliseconds(2);
constexpr auto kRetryDelay = std::chrono::milliseconds(100);
constexpr unsigned kSoonRetries = 5;
// The bytes a jmp may replace from a probe address: no region reaches further.
constexpr uintptr_t kMaxRegionLen = 32;
}  // namespace

void dequeue_optimizer(Aggregate* ag) {
  if (!ag->opt_queued) return;
  ag->opt_queued = false;
  std::erase(g_opt_queue, ag);
}

namespace {

bool any_post_handler(const Aggregate* ag) {
  for (const Kprobe* p : children_of(ag))
    if (p->post_handler) return true;
  return false;
}

}  // namespace

// Gets ag's detour ready for what its enabled probes need, or says why it cannot have one
// (empty when it can): runs the optimizer's safety checks and builds the detour the first
// time, and unoptimizes a site whose detour is of the wrong kind (the probes' needs
// changed) before preparing the right one.
std::string prepare_detour_or_unoptimize(Aggregate* ag) {
  if (!g_optimization && !ag->no_int3) return "optimization is switched off";
  if (ag->gone) return "the code is gone";
  if (any_post_handler(ag)) return "a probe here has a post_handler";
  // The detour saves what the enabled probes' handlers need: the vector registers unless
  // every handler here promises not to use them. An enabled kretprobe makes it enter the
  // function in call mode, which keeps its return predicted, and lean when no handler but
  // the kretprobes' own entry needs registers (see arch::DetourEntry). A call-mode return
  // comes back through a trampoline that saves the vector registers unless every
  // kretprobe here promised its handlers do not use them.
  bool save_vector = false, call_mode = false, lean = true, return_vector = false;
  for (const Kprobe* p : children_of(ag)) {
    if (!probe_enabled(p)) continue;
    if (p->hit_needs_ & arch::kSavedVector) save_vector = true;
    if (p->hit_needs_ & arch::kSavedAllRegs) lean = false;
    if (p->is_kretprobe_) call_mode = true;
    if (p->is_kretprobe_ && !(p->flags & KPROBE_FLAG_GPR_ONLY)) return_vector = true;
  }
  const arch::DetourEntry entry = !call_mode ? arch::DetourEntry::kPlain
                                  : lean     ? arch::DetourEntry::kCallLean
                                             : arch::DetourEntry::kCall;
  if (ag->opt_checked && ag->opt_capable &&
      (ag->opt_save_vector != save_vector || ag->opt_entry != entry ||
       ag->opt_return_vector != return_vector)) {
    unoptimize_aggregate(ag);
    ag->opt_checked = false;
  }
  if (!ag->opt_checked) {
    const char* why = "";
    const arch::FunctionEntries outside{
        ag->bounds.landing_pads.data(), ag->bounds.landing_pads.size(),
        ag->bounds.related.data(), ag->bounds.related.size()};
    ag->opt_capable = arch::prepare_optimized(ag->site, ag->bounds.start, ag->bounds.end, outside,
                                              save_vector, entry, return_vector, &why) == 0;
    ag->opt_checked = true;
    ag->opt_save_vector = save_vector;
    ag->opt_entry = entry;
    ag->opt_return_vector = return_vector;
    if (!ag->opt_capable) ag->opt_reason = why;
  }
  if (!ag->opt_capable) return ag->opt_reason.empty() ? "cannot be optimized" : ag->opt_reason;
  bool crowded = false;
  for_each_in(ag->addr + 1, arch::site_region_end(ag->site), [&](Aggregate*) { crowded = true; });
  if (crowded) return "another probe lies in the replaced instructions";
  return {};
}

void set_optimized_flag(const Aggregate* ag, bool on) {
  for (Kprobe* p : children_of(ag)) {
    const uint32_t was =
        on ? __atomic_fetch_or(&p->flags, KPROBE_FLAG_OPTIMIZED, __ATOMIC_RELAXED)
           : __atomic_fetch_and(&p->flags, ~uint32_t{KPROBE_FLAG_OPTIMIZED}, __ATOMIC_RELAXED);
    if (((was & KPROBE_FLAG_OPTIMIZED) != 0) != on) ++g_list_changes;
  }
}

// Takes the jmp away: back to the int3, or, where an int3 is fatal, to the original bytes
// (the site is settled again when the operation ends).
void unoptimize_aggregate(Aggregate* ag) {
  if (!arch::site_optimized(ag->site)) return;
  if (ag->no_int3) {
    if (arch::disarm(ag->site) != 0) return;  // warned by arch: the jmp stays
    ag->armed = false;
    mark_dirty(ag);
  } else {
    arch::unoptimize(&ag->site, 1);
  }
  set_optimized_flag(ag, false);
}

// Before an int3 goes inside the jmp of an optimized probe, that probe goes back to int3.
void unoptimize_covering(uintptr_t addr) {
  for_each_in(addr - std::min(addr, kMaxRegionLen), addr, [&](Aggregate* ag) {
    if (addr < arch::site_region_end(ag->site)) {
      unoptimize_aggregate(ag);
      mark_dirty(ag);
    }
  });
}

// The probes just before addr, whose replaced instructions may reach it: a probe at addr
// came or went, so what they may be changed.
void mark_neighbours_dirty(uintptr_t addr) {
  for_each_in(addr - std::min(addr, kMaxRegionLen), addr, mark_dirty);
}

void optimizer_main();

// The optimizer's thread, started at the first probe that may be optimized. A process
// that cannot make one now (pthread_create's EAGAIN: a thread or process limit reached)
// runs on with its probes as int3, and the next kick tries again: never an exception in
// someone else's program.
void start_optimizer() {
  if (g_optimizer_running) return;
  g_optimizer_running = true;
  pthread_attr_t attr;
  if (pthread_attr_init(&attr) != 0) {
    g_optimizer_running = false;
    return;
  }
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t t;
  const int rc = pthread_create(
      &t, &attr,
      [](void*) -> void* {
        optimizer_main();
        return nullptr;
      },
      nullptr);
  pthread_attr_destroy(&attr);
  if (rc != 0) g_optimizer_running = false;
}

namespace {

void kick_optimizer() {
  if (g_opt_queue.empty()) return;
  start_optimizer();  // after fork, the child has none yet
  __atomic_store_n(&g_opt_kicked, 1u, __ATOMIC_RELEASE);
  arch::wake_quiet_sleeper(&g_opt_kicked);
  g_opt_cv->notify_all();
}

constexpr char kNotArmedNoInt3[] =
    "not armed: glibc runs this code with every signal blocked, where an int3 would kill "
    "the thread; waiting for the jmp";

// Writes the jmps of a batch of aggregates whose detours are ready, in one pass of the
// write protocol. A failure (a thread sat on a region, or was blocking signals while
// running) is retried twice at once, then left to the optimizer thread; meanwhile the
// probe fires through an int3, unless an int3 there is fatal.
void optimize_now(const std::vector<Aggregate*>& batch) {
  if (batch.empty()) return;
  std::vector<arch::Site*> sites;
  for (Aggregate* ag : batch) {
    arch::set_optimized_context(ag->site, ag);
    sites.push_back(ag->site);
  }
  // One window per kMaxWindowSites, so that the moves of a window stay within what arch
  // can hold (a few per site) however large the burst.
  constexpr size_t kMaxWindowSites = 1024;
  for (int attempt = 0; attempt < 3 && !sites.empty(); ++attempt) {
    if (attempt) sched_yield();
    for (size_t at = 0; at < sites.size(); at += kMaxWindowSites)
      arch::optimize(sites.data() + at, std::min(kMaxWindowSites, sites.size() - at),
                     synchronize_rcu);
    std::erase_if(sites, [](const arch::Site* s) { return arch::site_optimized(s); });
  }
  for (Aggregate* ag : batch) {
    if (arch::site_optimized(ag->site)) {
      ag->armed = true;
      set_optimized_flag(ag, true);
      ag->opt_reason.clear();
      ag->opt_retries = 0;
      continue;
    }
    ++ag->opt_retries;
    if (!ag->armed && !ag->no_int3 && arch::arm(ag->site) == 0) ag->armed = true;
    ag->opt_reason = ag->armed ? "a thread is inside the replaced instructions or blocks "
                                 "signals; retrying"
                               : kNotArmedNoInt3;
    if (!ag->opt_queued) {
      ag->opt_queued = true;
      g_opt_queue.push_back(ag);
    }
  }
}

// Brings one aggregate's form in line with what it may be: disarmed, a jmp, or an int3.
// A jmp it may have goes into `batch`, to be written with the others.
void settle(Aggregate* ag, std::vector<Aggregate*>* batch) {
  if (ag->gone || ag->retired) return;
  if (g_all_disarmed || !any_enabled(ag)) {
    if (ag->armed) {
      if (arch::disarm(ag->site) != 0) {  // from a jmp straight to the original bytes
        ag->opt_reason = "could not be disarmed (a write to code failed)";
        return;  // warned by arch; tried again when the aggregate is settled next
      }
      ag->armed = false;
    }
    dequeue_optimizer(ag);
    set_optimized_flag(ag, false);
    ag->opt_reason = "not armed";
    if (children_of(ag).empty()) retire_aggregate(ag);  // an orphan, disarmed at last
    return;
  }
  const std::string why = prepare_detour_or_unoptimize(ag);
  const bool optimized = arch::site_optimized(ag->site);
  if (why.empty()) {
    if (optimized) {
      set_optimized_flag(ag, true);  // children added since
      ag->opt_reason.clear();
    } else if (!ag->opt_queued) {
      batch->push_back(ag);
    }
    return;
  }
  if (optimized) unoptimize_aggregate(ag);
  set_optimized_flag(ag, false);  // also when disarming took the jmp away
  dequeue_optimizer(ag);
  if (!ag->armed && !ag->no_int3 && arch::arm(ag->site) == 0) ag->armed = true;
  ag->opt_reason = ag->armed || !ag->no_int3 ? why : why + "; " + kNotArmedNoInt3;
}

}  // namespace

// The end of a control operation: settles every aggregate it touched and writes their
// jmps in one batch.
void settle_dirty() {
  std::vector<Aggregate*> batch;
  // settle() may mark neighbours dirty (an unoptimized covering probe): index, not iterate.
  for (size_t i = 0; i < g_dirty.size(); ++i) {
    Aggregate* ag = g_dirty[i];
    ag->dirty = false;
    settle(ag, &batch);
  }
  g_dirty.clear();
  optimize_now(batch);
  kick_optimizer();
}

// One retry pass of the optimizer thread (or wait_for_kprobe_optimizer). g_mu held.
void run_optimizer_pass() {
  refresh_gone();  // never write a jmp into code that was unloaded since it was queued
  std::vector<Aggregate*> queued;
  queued.swap(g_opt_queue);
  std::vector<Aggregate*> batch;
  for (Aggregate* ag : queued) {
    ag->opt_queued = false;
    if (ag->retired || ag->gone) continue;
    if (prepare_detour_or_unoptimize(ag).empty() && !arch::site_optimized(ag->site))
      batch.push_back(ag);
    else
      mark_dirty(ag);  // something changed since: settle it afresh
  }
  settle_dirty();
  optimize_now(batch);
  ++g_opt_passes;
}

void optimizer_main() {
  t_current = &g_engine_mark;  // hits on this thread are the engine's, not the program's
  // The program's signals are not for this thread: it blocks the classic asynchronous
  // ones. Not the synchronous ones (a trap on a probe it runs into must reach the engine's
  // handler: blocked, it would kill the process), nor the real-time ones (arch's fixup
  // signal parks it like any thread while another writes code; glibc's own are never
  // blocked).
  sigset_t block;
  sigemptyset(&block);
  for (int sig = 1; sig < 32; ++sig) {
    switch (sig) {
      case SIGTRAP: case SIGSEGV: case SIGBUS: case SIGILL: case SIGFPE: case SIGSYS:
      case SIGABRT: case SIGKILL: case SIGSTOP:
        break;
      default:
        sigaddset(&block, sig);
    }
  }
  pthread_sigmask(SIG_BLOCK, &block, nullptr);
  std::unique_lock lock(g_mu);
  for (;;) {
    // Nothing to retry: sleep in the engine's own code, where write windows pass the
    // thread by, until something is queued (kick_optimizer, under g_mu: not before the
    // word is cleared here).
    while (g_opt_queue.empty() && g_optimizer_running) {
      __atomic_store_n(&g_opt_kicked, 0u, __ATOMIC_RELAXED);
      lock.unlock();
      arch::sleep_quietly_until(&g_opt_kicked);
      lock.lock();
    }
    if (!g_optimizer_running) return;
    // What could not be patched was in the way of a thread: retry soon a few times (glibc
    // blocks signals only for moments), then rarely.
    const bool soon = std::any_of(g_opt_queue.begin(), g_opt_queue.end(),
                                  [](const Aggregate* ag) { return ag->opt_retries < kSoonRetries; });
    g_opt_cv->wait_for(lock, soon ? kRetrySoonDelay : kRetryDelay);
    const uint64_t changes = g_list_changes;
    run_optimizer_pass();
    if (g_list_changes != changes && g_list_notifier) {
      void (*notify)() = g_list_notifier;
      lock.unlock();  // it may look at the list, or wait for its own locks
      notify();
      lock.lock();
    }
  }
}

}  // namespace probefs::probecore::detail

namespace probefs::probecore {

using namespace detail;

void set_kprobes_optimization(bool on) {
  EngineSection engine;
  std::lock_guard lock(g_mu);
  if (g_optimization != on)
    for (Aggregate* ag : g_aggrs) mark_dirty(ag);  // the one operation on every probe
  g_optimization = on;
  finish_control_op();
}

bool kprobes_optimization_enabled() {
  std::lock_guard lock(g_mu);
  return g_optimization;
}

void set_kprobes_list_notifier(void (*fn)()) {
  std::lock_guard lock(g_mu);
  g_list_notifier = fn;
}

void wait_for_kprobe_optimizer() {
  EngineSection engine;
  std::lock_guard lock(g_mu);
  refresh_gone();
  settle_dirty();
  if (!g_opt_queue.empty()) run_optimizer_pass();
  reclaim();
}

std::string kprobe_optimization_status(const Kprobe* p) {
  std::lock_guard lock(g_mu);
  const Aggregate* ag = p->aggr_;
  if (!ag) return "not registered";
  return ag->opt_reason;
}

}  // namespace probefs::probecore
