// The kprobes engine: registry, aggregation, dispatch, kretprobe instances, blacklist,
// global arming, and the `kprobes/list` text.
//
// Data structures and who touches them:
//   g_mu            serializes every control operation (any thread, never a handler) and
//                   the optimizer thread's passes
//   g_aggrs         every aggregate, gone ones included, by address          (g_mu)
//   g_table         address -> aggregate: a fixed array of hash chains whose links are
//                   RCU-published (insert and remove cost O(1)); read on every hit
//   Aggregate::children  the probes on one address, RCU-published; read on every hit
//   g_dirty         aggregates whose form (disarmed, int3, jmp) must be settled at the
//                   end of the control operation                              (g_mu)
//   t_current       this thread's running probe (recursion guard), or the engine's own
//                   mark on its threads while they run engine code           (owner thread)
//   t_ri_head       this thread's kretprobe instances in flight, newest first (owner thread)
//   g_opt_queue     aggregates the optimizer thread retries                  (g_mu)
// Anything unpublished is retired and freed only after synchronize_rcu().
//
// No control operation costs time in proportion to the probe set or to a mapping: an
// operation settles only the aggregates it touched (g_dirty) and their neighbours, the
// table and g_aggrs change in O(1) and O(log n), unloaded objects are looked for only
// when the dynamic linker's unload counter moved, and the optimizer's checks look at one
// function (the whole-mapping branch sweep runs once per mapping).
#include "probecore/kprobes.h"

#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>
#include <chrono>
#include <condition_variable>
#include <string>
#include <vector>

#include "arch/arch.h"
#include "arch/percpu.h"
#include "arch/syscall.h"
#include "arch/warn.h"
#include "probecore/rcu.h"

namespace probefs::probecore {
namespace detail {

// The probes on one address, enabled or not. Immutable once published.
struct Children {
  std::vector<Kprobe*> probes;
  bool any_post = false;  // an enabled probe has a post_handler
};

struct Aggregate {
  uintptr_t addr = 0;
  arch::Site* site = nullptr;
  std::atomic<const Children*> children{nullptr};
  // The next aggregate in this address's hash chain (g_table). Removal leaves it as it
  // was, so a reader standing on a removed aggregate still finds the rest of the chain.
  std::atomic<Aggregate*> hash_next{nullptr};
  bool armed = false;  // the site carries our patch: an int3 or a jmp
  bool gone = false;
  bool dirty = false;    // in g_dirty
  bool retired = false;  // unregistered; freed by reclaim()
  // Code that glibc runs with every signal blocked (see runs_with_signals_blocked()): an
  // int3 here would kill the thread, so the site is only ever a jmp or original bytes.
  bool no_int3 = false;
  // For `kprobes/list`.
  std::string symbol;
  uintptr_t symbol_offset = 0;
  std::string module;
  // The object the address belongs to, to notice when it is unloaded. Empty name: the
  // executable, which never goes away.
  uintptr_t object_base = 0;
  std::string object_name;
  // Jump optimization.
  FunctionBounds bounds;     // the function around addr
  bool opt_checked = false;  // arch::prepare_optimized() has run
  bool opt_capable = false;  // and succeeded
  bool opt_save_vector = true;  // the kind of detour it prepared
  arch::DetourEntry opt_entry = arch::DetourEntry::kPlain;  // and its entry
  bool opt_return_vector = true;  // and its return (call mode)
  std::string opt_reason;    // why it is not optimized (empty when it is)
  bool opt_queued = false;
  unsigned opt_retries = 0;  // passes that could not patch it (a thread sat on it)
};

// A kretprobe's maxactive instances. A free instance sits either in the stack of some
// CPU (taken and given back without a locked instruction, see arch/percpu.h) or in the
// shared free list (a tagged Treiber stack). An entry takes from its CPU's stack, then
// from the shared list, then steals from other CPUs' stacks: it misses when every
// instance is in flight, or when the free ones are in another thief's hands right then.
struct InstancePool {
  std::atomic<Kretprobe*> rp{nullptr};  // nullptr once unregistered
  size_t stride = 0;
  uint32_t count = 0;
  std::unique_ptr<unsigned char[]> storage;
  std::unique_ptr<uint32_t[]> next_free;  // free-list links, 1-based (0 ends the list)
  std::atomic<uint64_t> head{0};          // (ABA tag << 32) | first free index, 1-based
  std::unique_ptr<arch::PercpuStack[]> cpus;  // nullptr without per-CPU operation
  uint32_t ncpus = 0;
  uint32_t cpu_capacity = 0;  // instances a CPU's stack keeps; the rest go to the list
  bool grace_passed = false;              // retired, and a grace period has passed since

  KretprobeInstance* at(uint32_t i) {
    return reinterpret_cast<KretprobeInstance*>(storage.get() + size_t{i} * stride);
  }

};

}  // namespace detail

using detail::Aggregate;
using detail::Children;
using detail::InstancePool;

namespace {

// ---------------------------------------------------------------------------------------
// State

std::mutex g_mu;
// Containers are never destroyed: the optimizer thread may still use them while static
// destructors run at exit.
struct ByAddress {
  bool operator()(const Aggregate* a, const Aggregate* b) const {
    return a->addr != b->addr ? a->addr < b->addr : a < b;  // a gone one may share its address
  }
};
std::set<Aggregate*, ByAddress>& g_aggrs = *new std::set<Aggregate*, ByAddress>;  // g_mu
// The hit path's address -> aggregate map: 2^kTableBits chains. Writers (g_mu) publish a
// link with a release store; readers follow links with acquire loads inside their
// read-side section; an unlinked aggregate is freed only after a grace period.
constexpr unsigned kTableBits = 12;
std::array<std::atomic<Aggregate*>, size_t{1} << kTableBits> g_table{};
std::vector<Aggregate*>& g_dirty = *new std::vector<Aggregate*>;  // g_mu
// Unregistered aggregates whose jmp is still written (its detour silenced): removed in one
// batch when the operation ends, before reclaim() frees them.                  (g_mu)
std::vector<Aggregate*>& g_unpatch = *new std::vector<Aggregate*>;
bool g_all_disarmed = false;                     // g_mu
SymbolResolver* g_resolver = nullptr;            // g_mu
bool g_percpu = false;                           // g_mu: kretprobe pools keep per-CPU stacks
uintptr_t g_trampoline = 0;                      // arch::kretprobe_trampoline(), set at init
bool g_initialized = false;                      // g_mu

// Unpublished and waiting for a grace period.                                  (g_mu)
std::vector<const Children*>& g_retired_children = *new std::vector<const Children*>;
std::vector<Aggregate*>& g_retired_aggrs = *new std::vector<Aggregate*>;
std::vector<InstancePool*>& g_retired_pools = *new std::vector<InstancePool*>;  // freed once all are back

bool g_optimization = true;                      // g_mu: debug.kprobes_optimization
std::vector<Aggregate*>& g_opt_queue = *new std::vector<Aggregate*>;  // g_mu
// The optimizer thread retries what a control operation could not optimize at once (a
// thread sat on a region, or blocked signals while running): soon at first, then rarely.
constexpr auto kRetrySoonDelay = std::chrono::milliseconds(2);
constexpr auto kRetryDelay = std::chrono::milliseconds(100);
constexpr unsigned kSoonRetries = 5;
// With g_mu. Never destroyed (the optimizer thread may wait on it during exit), and
// replaced in a fork child: a condition variable that had waiters is unusable there.
std::condition_variable* g_opt_cv = new std::condition_variable;
bool g_optimizer_running = false;                // g_mu: the thread exists (reset in fork)
uint64_t g_opt_passes = 0;                       // g_mu: completed optimizer passes

thread_local const void* t_current __attribute__((tls_model("initial-exec"))) = nullptr;
// t_current of a thread that runs the engine's own code: the optimizer thread always, a
// thread inside a control operation for its duration. The engine calls libc (files,
// threads, memory), which users probe: such hits run no handler and are no one's miss.
char g_engine_mark;
thread_local KretprobeInstance* t_ri_head __attribute__((tls_model("initial-exec"))) = nullptr;

// Handed to arch for a single-step taken on behalf of a missed (recursive) hit.
char g_missed_cookie;

inline bool probe_enabled(const Kprobe* p) {
  return !(__atomic_load_n(&p->flags, __ATOMIC_RELAXED) & (KPROBE_FLAG_DISABLED | KPROBE_FLAG_GONE));
}

// ---------------------------------------------------------------------------------------
// Hit path: no allocation, no locks, no libc (DESIGN.md §3).

inline size_t table_bucket(uintptr_t addr) {
  return static_cast<size_t>((addr * 0x9e3779b97f4a7c15ull) >> (64 - kTableBits));
}

Aggregate* table_lookup(uintptr_t addr) {
  for (Aggregate* ag = g_table[table_bucket(addr)].load(std::memory_order_acquire); ag;
       ag = ag->hash_next.load(std::memory_order_acquire))
    if (ag->addr == addr) return ag;
  return nullptr;
}

void count_missed(const Aggregate* ag) {
  const Children* ch = ag->children.load(std::memory_order_acquire);
  for (Kprobe* p : ch->probes)
    if (probe_enabled(p)) p->nmissed.fetch_add(1, std::memory_order_relaxed);
}

void run_post_handlers(const Aggregate* ag, PtRegs* regs) {
  const Children* ch = ag->children.load(std::memory_order_acquire);
  for (Kprobe* p : ch->probes)
    if (p->post_handler && probe_enabled(p)) p->post_handler(p, regs, 0);
}

bool on_breakpoint(PtRegs* regs) {
  const uintptr_t addr = regs->ip - 1;
  rcu_read_lock();
  Aggregate* ag = table_lookup(addr);
  if (!ag) {
    rcu_read_unlock();
    return false;
  }
  if (t_current) {  // a handler hit a probe: run the instruction, count the miss
    if (t_current != &g_engine_mark) count_missed(ag);
    if (arch::run_probed_insn(ag->site, regs, &g_missed_cookie, false) !=
        arch::Resume::kStepping)
      rcu_read_unlock();
    return true;
  }
  t_current = ag;
  const Children* ch = ag->children.load(std::memory_order_acquire);
  for (Kprobe* p : ch->probes) {
    if (p->pre_handler && probe_enabled(p) && p->pre_handler(p, regs)) {
      // The handler moved ip: the probed instruction is skipped.
      t_current = nullptr;
      rcu_read_unlock();
      return true;
    }
  }
  switch (arch::run_probed_insn(ag->site, regs, ag, ch->any_post)) {
    case arch::Resume::kStepping:
      return true;  // singlestep_done() finishes
    case arch::Resume::kEmulated:
      if (ch->any_post) run_post_handlers(ag, regs);
      break;
    case arch::Resume::kOutOfLine:
      break;
  }
  t_current = nullptr;
  rcu_read_unlock();
  return true;
}

void on_singlestep_done(void* cookie, PtRegs* regs) {
  if (cookie != &g_missed_cookie) {
    run_post_handlers(static_cast<Aggregate*>(cookie), regs);
    t_current = nullptr;
  }
  rcu_read_unlock();
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

// A jump-optimized probe fired (from the detour thunk). Pre handlers' return values are
// ignored: the relocated instructions always run next, as in kprobes. A probe that needs
// more than this detour saved joined while the hit was on its way (the detour is about
// to change kind): to it, the hit came before it did.
void on_optimized_hit(void* const volatile* ctx, PtRegs* regs, unsigned saved) {
  on_optimized_aggregate(ctx, [&](Kprobe* p) {
    if (p->pre_handler && probe_enabled(p) && !(p->hit_needs_ & ~saved)) p->pre_handler(p, regs);
  });
}

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

// Control plane, on a retired pool (no instance can be taken any more: its entry probe is
// unregistered and a grace period has passed, so the free list only grows and the CPUs'
// stacks are still): are all its instances back? Walking from a snapshot of the head is
// stable, since nothing is popped.
bool pool_all_returned(InstancePool* pool) {
  uint32_t n = 0;
  for (uint32_t c = 0; pool->cpus && c < pool->ncpus; ++c)
    n += __atomic_load_n(&pool->cpus[c].count, __ATOMIC_ACQUIRE);
  for (uint32_t i = static_cast<uint32_t>(pool->head.load(std::memory_order_acquire)); i != 0;
       i = __atomic_load_n(&pool->next_free[i - 1], __ATOMIC_ACQUIRE)) {
    if (++n > pool->count) return false;  // cannot happen; never loop
  }
  return n == pool->count;
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

// ---------------------------------------------------------------------------------------
// Control plane (g_mu held)

void table_insert(Aggregate* ag) {
  std::atomic<Aggregate*>& head = g_table[table_bucket(ag->addr)];
  ag->hash_next.store(head.load(std::memory_order_relaxed), std::memory_order_relaxed);
  head.store(ag, std::memory_order_release);
}

// Unlinks ag; a reader standing on it still finds the rest of the chain through it.
void table_remove(Aggregate* ag) {
  std::atomic<Aggregate*>* link = &g_table[table_bucket(ag->addr)];
  for (Aggregate* cur; (cur = link->load(std::memory_order_relaxed)) != nullptr;
       link = &cur->hash_next) {
    if (cur == ag) {
      link->store(ag->hash_next.load(std::memory_order_relaxed), std::memory_order_release);
      return;
    }
  }
}

void publish_children(Aggregate* ag, std::vector<Kprobe*> probes) {
  auto* ch = new Children{std::move(probes), false};
  for (Kprobe* p : ch->probes)
    if (p->post_handler && probe_enabled(p)) ch->any_post = true;
  const Children* old = ag->children.exchange(ch, std::memory_order_acq_rel);
  if (old) g_retired_children.push_back(old);
}

const std::vector<Kprobe*>& children_of(const Aggregate* ag) {
  return ag->children.load(std::memory_order_relaxed)->probes;
}

bool any_enabled(const Aggregate* ag) {
  for (Kprobe* p : children_of(ag))
    if (probe_enabled(p)) return true;
  return false;
}

// The aggregate's form is settled at the end of the control operation.
void mark_dirty(Aggregate* ag) {
  if (ag->dirty || ag->retired) return;
  ag->dirty = true;
  g_dirty.push_back(ag);
}

void dequeue_optimizer(Aggregate* ag) {
  if (!ag->opt_queued) return;
  ag->opt_queued = false;
  std::erase(g_opt_queue, ag);
}

// An aggregate with no probes left and no patch: out of the table, freed after a grace
// period.
void retire_aggregate(Aggregate* ag) {
  dequeue_optimizer(ag);
  if (!ag->gone) table_remove(ag);
  g_aggrs.erase(ag);
  ag->retired = true;
  g_retired_aggrs.push_back(ag);
}

// The bytes a jmp may replace from a probe address: no region reaches further.
constexpr uintptr_t kMaxRegionLen = 32;

// The live aggregates whose address lies in [lo, hi), in address order.
template <typename F>
void for_each_in(uintptr_t lo, uintptr_t hi, F f) {
  Aggregate key;
  key.addr = lo;
  for (auto it = g_aggrs.lower_bound(&key); it != g_aggrs.end() && (*it)->addr < hi; ++it)
    if (!(*it)->gone) f(*it);
}

// Code glibc runs with every signal blocked, where a trap kills the thread at once (a
// synchronous SIGTRAP that is blocked is fatal): at thread start (__ctype_init, _setjmp),
// at thread exit (madvise, getpagesize), around clone in pthread_create and posix_spawn
// (clone, munmap; and sigaction, sigprocmask in the spawned child). glibc blocks with the
// raw system call, so no interposition can stop it. Such a site is jump-optimized or not
// armed at all; never an int3. Known only where the resolver names the function.
bool runs_with_signals_blocked(std::string_view module, std::string_view symbol) {
  if (module.substr(0, 7) != "libc.so") return false;
  static constexpr std::string_view kNames[] = {
      "__ctype_init", "_setjmp",   "__sigsetjmp", "setjmp",       "sigsetjmp",
      "madvise",      "__madvise", "getpagesize", "__getpagesize", "munmap",
      "__munmap",     "clone",     "__clone",     "sigaction",    "__sigaction",
      "sigprocmask",  "__sigprocmask", "pthread_sigmask", "__pthread_sigmask",
  };
  for (std::string_view name : kNames)
    if (symbol == name) return true;
  return false;
}

// Frees what was unpublished, once no thread can still see it.
void reclaim() {
  std::vector<InstancePool*> idle_pools;
  // A pool retired since the last grace period may still see an entry handler take an
  // instance; it waits for the next reclaim (retire_pool() runs before synchronize_rcu()).
  std::erase_if(g_retired_pools, [&](InstancePool* p) {
    if (!p->grace_passed || !pool_all_returned(p)) return false;
    idle_pools.push_back(p);
    return true;
  });
  const bool fresh_pools = std::any_of(g_retired_pools.begin(), g_retired_pools.end(),
                                       [](const InstancePool* p) { return !p->grace_passed; });
  if (g_retired_children.empty() && g_retired_aggrs.empty() && idle_pools.empty() &&
      !fresh_pools)
    return;
  synchronize_rcu();
  for (InstancePool* p : g_retired_pools) p->grace_passed = true;
  for (const Children* c : g_retired_children) delete c;
  for (Aggregate* ag : g_retired_aggrs) {
    arch::release(ag->site);
    delete ag->children.load(std::memory_order_relaxed);
    delete ag;
  }
  for (InstancePool* p : idle_pools) delete p;
  g_retired_children.clear();
  g_retired_aggrs.clear();
}

// ---- the objects code lives in, for [GONE] ----

struct ObjectQuery {
  uintptr_t addr;
  uintptr_t base;
  std::string name;
  bool found;
};

int find_object_cb(dl_phdr_info* info, size_t, void* data) {
  auto* q = static_cast<ObjectQuery*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type != PT_LOAD) continue;
    const uintptr_t lo = info->dlpi_addr + ph.p_vaddr, hi = lo + ph.p_memsz;
    if (q->addr >= lo && q->addr < hi) {
      q->base = info->dlpi_addr;
      q->name = info->dlpi_name ? info->dlpi_name : "";
      q->found = true;
      return 1;
    }
  }
  return 0;
}

ObjectQuery object_containing(uintptr_t addr) {
  ObjectQuery q{addr, 0, {}, false};
  dl_iterate_phdr(find_object_cb, &q);
  return q;
}

// The dynamic linker's count of objects unloaded so far (dl_iterate_phdr's dlpi_subs), or
// ~0 when this libc does not tell.
int unloads_cb(dl_phdr_info* info, size_t size, void* data) {
  if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof info->dlpi_subs)
    *static_cast<unsigned long long*>(data) = info->dlpi_subs;
  return 1;  // every entry carries it; the first is enough
}

unsigned long long g_unloads_seen = ~0ull;  // g_mu: dlpi_subs when refresh_gone last looked

void set_optimized_flag(const Aggregate* ag, bool on);

// Marks probes whose library was unloaded: their bytes are never touched again. Looks only
// when the dynamic linker unloaded something since it last looked.
void refresh_gone() {
  unsigned long long unloads = ~0ull;
  dl_iterate_phdr(unloads_cb, &unloads);
  if (unloads != ~0ull && unloads == g_unloads_seen) return;
  g_unloads_seen = unloads;
  for (Aggregate* ag : g_aggrs) {
    if (ag->gone || ag->object_name.empty()) continue;
    ObjectQuery q = object_containing(ag->addr);
    if (q.found && q.base == ag->object_base && q.name == ag->object_name) continue;
    ag->gone = true;
    ag->armed = false;
    arch::mark_gone(ag->site);
    arch::set_optimized_context(ag->site, nullptr);
    dequeue_optimizer(ag);
    set_optimized_flag(ag, false);
    for (Kprobe* p : children_of(ag)) __atomic_or_fetch(&p->flags, KPROBE_FLAG_GONE, __ATOMIC_RELAXED);
    table_remove(ag);
  }
}

// ---- jump optimization ----

bool any_post_handler(const Aggregate* ag) {
  for (const Kprobe* p : children_of(ag))
    if (p->post_handler) return true;
  return false;
}

void unoptimize_aggregate(Aggregate* ag);

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
    ag->opt_capable = arch::prepare_optimized(ag->site, ag->bounds.start, ag->bounds.end,
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
    if (on) __atomic_or_fetch(&p->flags, KPROBE_FLAG_OPTIMIZED, __ATOMIC_RELAXED);
    else __atomic_and_fetch(&p->flags, ~uint32_t{KPROBE_FLAG_OPTIMIZED}, __ATOMIC_RELAXED);
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

void start_optimizer() {
  if (g_optimizer_running) return;
  g_optimizer_running = true;
  std::thread(optimizer_main).detach();
}

void kick_optimizer() {
  if (g_opt_queue.empty()) return;
  start_optimizer();  // after fork, the child has none yet
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
  for (int attempt = 0; attempt < 3 && !sites.empty(); ++attempt) {
    if (attempt) sched_yield();
    arch::optimize(sites.data(), sites.size(), synchronize_rcu);
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
  std::unique_lock lock(g_mu);
  for (;;) {
    g_opt_cv->wait(lock, [] { return !g_opt_queue.empty() || !g_optimizer_running; });
    if (!g_optimizer_running) return;
    // What could not be patched was in the way of a thread: retry soon a few times (glibc
    // blocks signals only for moments), then rarely.
    const bool soon = std::any_of(g_opt_queue.begin(), g_opt_queue.end(),
                                  [](const Aggregate* ag) { return ag->opt_retries < kSoonRetries; });
    g_opt_cv->wait_for(lock, soon ? kRetrySoonDelay : kRetryDelay);
    run_optimizer_pass();
  }
}

// ---- blacklist ----

struct EngineText {
  std::vector<arch::TextRange> ranges;
};

int engine_text_cb(dl_phdr_info* info, size_t, void* data) {
  auto* out = static_cast<EngineText*>(data);
  const auto self = reinterpret_cast<uintptr_t>(&register_kprobe);
  bool ours = false;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && self >= lo && self < lo + ph.p_memsz) ours = true;
  }
  if (!ours) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X)) {
      const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
      out->ranges.push_back({lo, lo + ph.p_memsz});
    }
  }
  return 1;
}

std::vector<arch::TextRange>& g_blacklist = *new std::vector<arch::TextRange>;  // g_mu; init()

void build_blacklist() {
  EngineText text;
  dl_iterate_phdr(engine_text_cb, &text);
  g_blacklist = std::move(text.ranges);
  arch::TextRange extra[8];
  const size_t n = arch::blacklist(extra, 8);
  g_blacklist.insert(g_blacklist.end(), extra, extra + n);
}

bool blacklisted_locked(uintptr_t addr) {
  for (const auto& r : g_blacklist)
    if (addr >= r.start && addr < r.end) return true;
  return false;
}

// ---- init, fork ----

void atfork_prepare() { g_mu.lock(); }
void atfork_parent() { g_mu.unlock(); }
void atfork_child() {
  rcu_after_fork_child();
  // The child is one thread: a thief that held a CPU's stack in the parent is gone.
  g_percpu = arch::percpu_init();
  auto unlock_stacks = [](InstancePool* pool) {
    for (uint32_t c = 0; pool && pool->cpus && c < pool->ncpus; ++c) pool->cpus[c].lock = 0;
  };
  for (Aggregate* ag : g_aggrs)
    for (Kprobe* p : children_of(ag))
      if (p->is_kretprobe_) unlock_stacks(reinterpret_cast<Kretprobe*>(p)->pool_);
  for (InstancePool* pool : g_retired_pools) unlock_stacks(pool);
  g_optimizer_running = false;  // threads do not survive fork; restarted on demand
  g_opt_cv = new std::condition_variable;
  g_mu.unlock();
}

int init_locked() {
  if (g_initialized) return 0;
  const arch::Callbacks cb{on_breakpoint, on_singlestep_done, on_function_return,
                          on_optimized_hit, on_lean_entry_hit};
  if (int rc = arch::install(cb); rc) return rc;
  g_percpu = arch::percpu_init();
  g_trampoline = arch::kretprobe_trampoline();
  build_blacklist();
  pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
  // The engine's own thread starts before any probe is armed: glibc runs code at thread
  // start with every signal blocked, where a probe's trap would be fatal.
  start_optimizer();
  g_initialized = true;
  return 0;
}

// ---- registration ----

int resolve_location(Kprobe* p, uintptr_t* addr, FunctionBounds* bounds, SymbolLocation* where) {
  if ((p->symbol_name && p->addr) || (!p->symbol_name && !p->addr)) return -EINVAL;
  *bounds = p->bounds;
  if (p->symbol_name) {
    if (!g_resolver) return -ENOENT;
    SymbolLocation loc;
    if (int rc = g_resolver->resolve(p->symbol_name, &loc); rc) return rc;
    *addr = loc.addr + p->offset;
    if (!bounds->known()) *bounds = loc.bounds;
    *where = loc;
    where->addr = loc.addr;
    return 0;
  }
  *addr = p->addr;
  SymbolLocation loc;
  if (g_resolver && g_resolver->describe(p->addr, &loc) == 0) {
    if (!bounds->known()) *bounds = loc.bounds;
    *where = loc;
  } else if (bounds->known()) {
    where->addr = bounds->start;
  }
  return 0;
}

int register_locked(Kprobe* p) {
  if (int rc = init_locked(); rc) return rc;
  if (p->aggr_) return -EINVAL;  // already registered
  uintptr_t addr = 0;
  FunctionBounds bounds;
  SymbolLocation where;
  if (int rc = resolve_location(p, &addr, &bounds, &where); rc) return rc;
  if (blacklisted_locked(addr)) return -EINVAL;
  if (!bounds.known()) return -EILSEQ;  // cannot prove an instruction boundary
  if (p->is_kretprobe_ && addr != bounds.start) return -EINVAL;  // entries only

  p->flags &= KPROBE_FLAG_DISABLED | KPROBE_FLAG_GPR_ONLY;  // what the caller may ask for
  p->nmissed.store(0, std::memory_order_relaxed);
  // A kretprobe's own entry handler reads sp alone; any other handler may read every
  // register, and the vector ones unless it promised not to.
  const bool only_sp = p->is_kretprobe_ && !reinterpret_cast<Kretprobe*>(p)->entry_handler;
  unsigned needs = 0;
  if (!only_sp) needs |= arch::kSavedAllRegs;
  if (!only_sp && !(p->flags & KPROBE_FLAG_GPR_ONLY)) needs |= arch::kSavedVector;
  p->hit_needs_ = static_cast<uint8_t>(needs);

  // Where an int3 would be fatal, the probe is refused unless its site can take a jmp.
  auto refused_without_jmp = [](Aggregate* ag) {
    return ag->no_int3 && !prepare_detour_or_unoptimize(ag).empty();
  };
  Aggregate* ag = table_lookup(addr);
  if (ag) {
    if (ag->no_int3 && p->post_handler) return -EINVAL;  // it would need an int3
    if (p->post_handler) unoptimize_aggregate(ag);  // detours run no post handlers
    std::vector<Kprobe*> probes = children_of(ag);
    probes.push_back(p);
    publish_children(ag, std::move(probes));
    if (refused_without_jmp(ag)) {
      std::vector<Kprobe*> back = children_of(ag);
      std::erase(back, p);
      publish_children(ag, std::move(back));
      prepare_detour_or_unoptimize(ag);  // the detour the others need
      return -EINVAL;
    }
  } else {
    unoptimize_covering(addr);  // never an int3 inside a written jmp
    arch::Site* site = nullptr;
    if (int rc = arch::prepare(addr, bounds.start, bounds.end, &site); rc) return rc;
    auto owned = std::make_unique<Aggregate>();
    ag = owned.get();
    ag->addr = addr;
    ag->site = site;
    ag->bounds = bounds;
    if (!where.name.empty()) {
      ag->symbol = where.name;
      ag->symbol_offset = addr - where.addr;
      ag->module = where.module;
    }
    ag->no_int3 = runs_with_signals_blocked(ag->module, ag->symbol);
    ObjectQuery q = object_containing(addr);
    if (q.found) {
      ag->object_base = q.base;
      ag->object_name = q.name;
    }
    publish_children(ag, {p});
    if (refused_without_jmp(ag)) {
      arch::release(site);
      delete ag->children.load(std::memory_order_relaxed);
      return -EINVAL;
    }
    // Published before any byte is written, so that no thread ever traps on an int3 that
    // the table does not explain. Armed (or optimized) when the operation settles.
    owned.release();
    g_aggrs.insert(ag);
    table_insert(ag);
    mark_neighbours_dirty(addr);  // their jmps may no longer fit
  }
  mark_dirty(ag);
  p->addr = addr;
  p->aggr_ = ag;
  return 0;
}

int unregister_locked(Kprobe* p) {
  Aggregate* ag = p->aggr_;
  if (!ag) return -EINVAL;
  std::vector<Kprobe*> probes = children_of(ag);
  std::erase(probes, p);
  if (probes.empty()) {
    // The patch goes before the table entry: a thread that trapped on the int3 and then
    // finds no entry sees the original byte back and simply runs it. A jmp's detour is
    // silenced now, and the jmps of the operation go in one batch at its end, the table
    // entries after them (the batch stands an int3 on each for a moment).
    arch::set_optimized_context(ag->site, nullptr);
    bool unpatch_later = false;
    if (ag->armed && !ag->gone) {
      unpatch_later = arch::site_optimized(ag->site);
      if (unpatch_later) {
        g_unpatch.push_back(ag);
      } else if (arch::disarm(ag->site) != 0) {
        // The int3 stays (arch warned): without an entry a hit on it would end the
        // program. The aggregate stays as an orphan with no probes, whose hits run
        // nothing, and disarming is tried again whenever it is settled.
        publish_children(ag, {});
        set_optimized_flag(ag, false);
        mark_dirty(ag);
        p->aggr_ = nullptr;
        return 0;
      }
    }
    ag->armed = false;
    set_optimized_flag(ag, false);
    dequeue_optimizer(ag);
    if (!ag->gone && !unpatch_later) table_remove(ag);
    g_aggrs.erase(ag);
    ag->retired = true;
    g_retired_aggrs.push_back(ag);
    if (!ag->gone) mark_neighbours_dirty(ag->addr);  // they may take a jmp now
  } else {
    publish_children(ag, std::move(probes));
    mark_dirty(ag);
  }
  p->aggr_ = nullptr;
  return 0;
}

int set_disabled_locked(Kprobe* p, bool disabled) {
  Aggregate* ag = p->aggr_;
  if (!ag) return -EINVAL;
  if (ag->gone) return disabled ? 0 : -EINVAL;
  if (disabled) __atomic_or_fetch(&p->flags, KPROBE_FLAG_DISABLED, __ATOMIC_RELAXED);
  else __atomic_and_fetch(&p->flags, ~uint32_t{KPROBE_FLAG_DISABLED}, __ATOMIC_RELAXED);
  publish_children(ag, children_of(ag));  // recompute any_post
  mark_dirty(ag);
  return 0;
}

// ---- kretprobes ----

int make_pool(Kretprobe* rp) {
  int n = rp->maxactive;
  if (n <= 0) {
    const long cpus = sysconf(_SC_NPROCESSORS_CONF);
    n = static_cast<int>(std::max<long>(10, 2 * (cpus > 0 ? cpus : 1)));
  }
  if (n > (1 << 20)) return -E2BIG;
  auto pool = std::make_unique<InstancePool>();
  pool->stride = (sizeof(KretprobeInstance) + rp->data_size + 15) & ~size_t{15};
  pool->count = static_cast<uint32_t>(n);
  // operator new[] aligns to __STDCPP_DEFAULT_NEW_ALIGNMENT__ (16 on x86-64), which is
  // what the instances' data needs; delete[] matches it.
  pool->storage.reset(new unsigned char[pool->stride * n]());
  pool->next_free.reset(new uint32_t[n]);
  for (int i = 0; i < n; ++i) {
    pool->next_free[i] = i + 1 < n ? static_cast<uint32_t>(i + 2) : 0;
    pool->at(static_cast<uint32_t>(i))->index = static_cast<uint32_t>(i);
    pool->at(static_cast<uint32_t>(i))->pool = pool.get();
  }
  pool->head.store(1);
  // Each CPU in use (as the registering thread's affinity tells) keeps at most half its
  // fair share, so that the shared list keeps the rest and entries rarely have to steal (a
  // system call); a pool too small for that goes without per-CPU stacks. The array covers
  // every possible CPU.
  const uint32_t ncpus = arch::percpu_count();
  cpu_set_t allowed;
  const int usable = sched_getaffinity(0, sizeof allowed, &allowed) == 0 ? CPU_COUNT(&allowed) : 0;
  const uint32_t share_cpus = usable > 0 ? static_cast<uint32_t>(usable) : ncpus;
  const uint32_t capacity =
      std::min<uint32_t>(arch::kPercpuSlots, pool->count / (2 * share_cpus));
  if (g_percpu && capacity > 0) {
    pool->ncpus = ncpus;
    pool->cpu_capacity = capacity;
    pool->cpus.reset(new arch::PercpuStack[ncpus]());
  }
  pool->rp.store(rp);
  rp->pool_ = pool.release();
  return 0;
}

void retire_pool(Kretprobe* rp) {
  InstancePool* pool = rp->pool_;
  pool->rp.store(nullptr, std::memory_order_release);
  __atomic_store_n(&rp->pool_, nullptr, __ATOMIC_RELEASE);
  g_retired_pools.push_back(pool);
}

int register_kretprobe_locked(Kretprobe* rp) {
  if (rp->kp.aggr_) return -EINVAL;
  if (!rp->handler && !rp->entry_handler) return -EINVAL;
  if (int rc = init_locked(); rc) return rc;  // the pool's layout depends on it
  if (int rc = make_pool(rp); rc) return rc;
  rp->kp.pre_handler = pre_handler_kretprobe;
  rp->kp.post_handler = nullptr;
  rp->kp.is_kretprobe_ = true;
  rp->nmissed.store(0, std::memory_order_relaxed);
  if (int rc = register_locked(&rp->kp); rc) {
    delete rp->pool_;
    rp->pool_ = nullptr;
    return rc;
  }
  return 0;
}

int unregister_kretprobe_locked(Kretprobe* rp) {
  if (int rc = unregister_locked(&rp->kp); rc) return rc;
  retire_pool(rp);
  return 0;
}

void append_line(std::string* out, const Aggregate* ag, const Kprobe* p) {
  char buf[512];
  const char type = p->is_kretprobe_ ? 'r' : 'k';
  int n;
  if (!ag->symbol.empty()) {
    n = std::snprintf(buf, sizeof buf, "%016" PRIxPTR "  %c  %s+0x%" PRIxPTR "  %s ", ag->addr,
                      type, ag->symbol.c_str(), ag->symbol_offset,
                      ag->module.empty() ? " " : ag->module.c_str());
  } else {
    n = std::snprintf(buf, sizeof buf, "%016" PRIxPTR "  %c  0x%" PRIxPTR " ", ag->addr, type,
                      ag->addr);
  }
  out->append(buf, n > 0 ? std::min<size_t>(n, sizeof buf - 1) : 0);
  const uint32_t f = __atomic_load_n(&p->flags, __ATOMIC_RELAXED);
  if (f & KPROBE_FLAG_GONE) out->append("[GONE]");
  else if (f & KPROBE_FLAG_DISABLED) out->append("[DISABLED]");
  if (f & KPROBE_FLAG_OPTIMIZED) out->append("[OPTIMIZED]");
  out->push_back('\n');
}

// The end of every control operation: arm, optimize, unoptimize or disarm what changed,
// then free what was unpublished.
void finish_control_op() {
  if (!g_unpatch.empty()) {
    std::vector<arch::Site*> sites;
    for (Aggregate* ag : g_unpatch) sites.push_back(ag->site);
    arch::disarm_batch(sites.data(), sites.size());  // before their neighbours take jmps
    for (Aggregate* ag : g_unpatch) table_remove(ag);
    g_unpatch.clear();
  }
  settle_dirty();
  reclaim();
}

// Marks the calling thread as running the engine's own code for a control operation (see
// g_engine_mark). A handler never calls one, so t_current is normally clear here.
class EngineSection {
 public:
  EngineSection() : was_(t_current) {
    if (!was_) t_current = &g_engine_mark;
  }
  ~EngineSection() {
    if (!was_) t_current = nullptr;
  }
  EngineSection(const EngineSection&) = delete;
  EngineSection& operator=(const EngineSection&) = delete;

 private:
  const void* was_;
};

}  // namespace

// ---------------------------------------------------------------------------------------
// Public API

Kretprobe* get_kretprobe(KretprobeInstance* ri) {
  return ri->pool->rp.load(std::memory_order_acquire);
}

namespace {

// Every control operation: under the lock, with the view of unloaded code refreshed first
// and the optimizer and reclamation brought up to date after.
template <typename F>
int control_op(F&& op) {
  EngineSection engine;
  std::lock_guard lock(g_mu);
  refresh_gone();
  const int rc = op();
  finish_control_op();
  return rc;
}

// Registers each of ps[0..num) with reg, or none: a failure undoes the earlier ones.
template <typename T, typename Reg, typename Unreg>
int register_all(T** ps, int num, Reg reg, Unreg unreg) {
  if (num <= 0) return -EINVAL;
  return control_op([&] {
    for (int i = 0; i < num; ++i) {
      if (int rc = reg(ps[i]); rc) {
        while (--i >= 0) unreg(ps[i]);
        return rc;
      }
    }
    return 0;
  });
}

int register_kprobe_plain(Kprobe* p) {
  p->is_kretprobe_ = false;
  return register_locked(p);
}

}  // namespace

int register_kprobe(Kprobe* p) {
  return control_op([&] { return register_kprobe_plain(p); });
}

int unregister_kprobe(Kprobe* p) {
  return control_op([&] { return unregister_locked(p); });
}

int register_kprobes(Kprobe** ps, int num) {
  return register_all(ps, num, register_kprobe_plain, unregister_locked);
}

void unregister_kprobes(Kprobe** ps, int num) {
  control_op([&] {
    for (int i = 0; i < num; ++i) unregister_locked(ps[i]);
    return 0;
  });
}

int enable_kprobe(Kprobe* p) {
  return control_op([&] { return set_disabled_locked(p, false); });
}

int disable_kprobe(Kprobe* p) {
  return control_op([&] { return set_disabled_locked(p, true); });
}

int register_kretprobe(Kretprobe* rp) {
  return control_op([&] { return register_kretprobe_locked(rp); });
}

int unregister_kretprobe(Kretprobe* rp) {
  return control_op([&] { return unregister_kretprobe_locked(rp); });
}

int register_kretprobes(Kretprobe** rps, int num) {
  return register_all(rps, num, register_kretprobe_locked, unregister_kretprobe_locked);
}

void unregister_kretprobes(Kretprobe** rps, int num) {
  control_op([&] {
    for (int i = 0; i < num; ++i) unregister_kretprobe_locked(rps[i]);
    return 0;
  });
}

int enable_kretprobe(Kretprobe* rp) { return enable_kprobe(&rp->kp); }
int disable_kretprobe(Kretprobe* rp) { return disable_kprobe(&rp->kp); }

namespace {
int set_all_disarmed(bool disarmed) {
  return control_op([&] {
    g_all_disarmed = disarmed;
    for (Aggregate* ag : g_aggrs) mark_dirty(ag);  // the one operation on every probe
    return 0;
  });
}
}  // namespace

int arm_all_kprobes() { return set_all_disarmed(false); }
int disarm_all_kprobes() { return set_all_disarmed(true); }

bool kprobes_all_disarmed() {
  std::lock_guard lock(g_mu);
  return g_all_disarmed;
}

std::string kprobes_list() {
  EngineSection engine;
  std::lock_guard lock(g_mu);
  refresh_gone();
  std::string out;
  for (const Aggregate* ag : g_aggrs)
    for (const Kprobe* p : children_of(ag)) append_line(&out, ag, p);
  finish_control_op();
  return out;
}

void set_symbol_resolver(SymbolResolver* resolver) {
  std::lock_guard lock(g_mu);
  g_resolver = resolver;
}

bool within_kprobe_blacklist(uintptr_t addr) {
  EngineSection engine;
  std::lock_guard lock(g_mu);
  if (init_locked() != 0) return false;
  return blacklisted_locked(addr);
}

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

void set_kprobes_boost(bool on) {
  std::lock_guard lock(g_mu);
  arch::set_boost_enabled(on);
}

}  // namespace probefs::probecore
