// The kprobes registry: register/unregister/enable/disable for kprobes and kretprobes,
// aggregation of the probes on one address, the global arm switch, the `kprobes/list`
// text, init and fork, kretprobe pools, and reclamation of what was unpublished.
//
// The state and who touches it: probecore/engine_state.h.
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <unordered_map>

#include "probecore/engine_state.h"
#include "probecore/rcu.h"

namespace probefs::probecore::detail {

// ---------------------------------------------------------------------------------------
// State

std::mutex g_mu;
// Containers are never destroyed: the optimizer thread may still use them while static
// destructors run at exit.
std::set<Aggregate*, ByAddress>& g_aggrs = *new std::set<Aggregate*, ByAddress>;
std::array<std::atomic<Aggregate*>, size_t{1} << kTableBits> g_table{};
std::vector<Aggregate*>& g_dirty = *new std::vector<Aggregate*>;
std::vector<Aggregate*>& g_unpatch = *new std::vector<Aggregate*>;
bool g_all_disarmed = false;
SymbolResolver* g_resolver = nullptr;
bool g_percpu = false;
uintptr_t g_trampoline = 0;
uintptr_t g_trampoline_twice = 0;
bool g_initialized = false;
std::vector<const Children*>& g_retired_children = *new std::vector<const Children*>;
std::vector<Aggregate*>& g_retired_aggrs = *new std::vector<Aggregate*>;
std::vector<InstancePool*>& g_retired_pools = *new std::vector<InstancePool*>;
bool g_optimization = true;
std::vector<Aggregate*>& g_opt_queue = *new std::vector<Aggregate*>;
std::condition_variable* g_opt_cv = new std::condition_variable;
bool g_optimizer_running = false;
uint32_t g_opt_kicked = 0;
uint64_t g_opt_passes = 0;
uint64_t g_list_changes = 0;
void (*g_list_notifier)() = nullptr;
thread_local constinit const void* t_current __attribute__((tls_model("initial-exec"))) = nullptr;
char g_engine_mark;
thread_local constinit KretprobeInstance* t_ri_head __attribute__((tls_model("initial-exec"))) =
    nullptr;
char g_missed_cookie;

// ---------------------------------------------------------------------------------------
// The table, children, the dirty set

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

// An aggregate with no probes left and no patch: out of the table, freed after a grace
// period.
void retire_aggregate(Aggregate* ag) {
  dequeue_optimizer(ag);
  if (!ag->gone) table_remove(ag);
  g_aggrs.erase(ag);
  ag->retired = true;
  g_retired_aggrs.push_back(ag);
}

// ---------------------------------------------------------------------------------------
// kretprobe pools

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

namespace {

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

}  // namespace

// ---------------------------------------------------------------------------------------
// Reclamation

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

// ---------------------------------------------------------------------------------------
// Init, fork

namespace {

void atfork_prepare() { g_mu.lock(); }
void atfork_parent() { g_mu.unlock(); }
void atfork_child() {
  rcu_after_fork_child();
  // The child is one thread: a thief that held a CPU's stack in the parent is gone. (Its
  // membarrier registrations, per-CPU ones included, came with the memory: g_percpu holds.)
  // Only a lock that is held is written: every page written here is a copy in the child.
  auto unlock_stacks = [](InstancePool* pool) {
    for (uint32_t c = 0; pool && pool->cpus && c < pool->ncpus; ++c)
      if (pool->cpus[c].lock != 0) pool->cpus[c].lock = 0;
  };
  for (Aggregate* ag : g_aggrs)
    for (Kprobe* p : children_of(ag))
      if (p->is_kretprobe_) unlock_stacks(reinterpret_cast<Kretprobe*>(p)->pool_);
  for (InstancePool* pool : g_retired_pools) unlock_stacks(pool);
  g_optimizer_running = false;  // threads do not survive fork; restarted by the next
                                // registration (init_locked), or when something is queued
  g_opt_cv = new std::condition_variable;
  g_opt_kicked = 0;
  g_mu.unlock();
}

}  // namespace

int init_locked() {
  if (g_initialized) {
    start_optimizer();  // in a fork child, where the thread did not survive
    return 0;
  }
  const arch::Callbacks cb{on_breakpoint, on_singlestep_done, on_function_return,
                          on_optimized_hit, on_lean_entry_hit};
  if (int rc = arch::install(cb); rc) return rc;
  g_percpu = arch::percpu_init();
  g_trampoline = arch::kretprobe_trampoline();
  g_trampoline_twice = arch::kretprobe_trampoline_returns_twice();
  build_blacklist();
  pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
  // The engine's own thread starts before any probe is armed: glibc runs code at thread
  // start with every signal blocked, where a probe's trap would be fatal.
  start_optimizer();
  g_initialized = true;
  return 0;
}

// ---------------------------------------------------------------------------------------
// Registration

namespace {

// GCC's list of functions that return twice (it gives them returns_twice): the name,
// without a version, a leading "__x", "__" or "_" and glibc's "libc_", is setjmp, sigsetjmp,
// savectx, vfork or getcontext. Their return probes hijack through the trampoline's entry
// for them.
bool returns_twice_name(std::string_view name) {
  name = name.substr(0, name.find('@'));
  if (name.starts_with("__x")) name.remove_prefix(3);
  else if (name.starts_with("__")) name.remove_prefix(2);
  else if (name.starts_with("_")) name.remove_prefix(1);
  if (name.starts_with("libc_")) name.remove_prefix(5);  // glibc's internal aliases
  return name == "setjmp" || name == "sigsetjmp" || name == "savectx" || name == "vfork" ||
         name == "getcontext";
}

// What `kprobes/list` adds after the line of a probe whose symbol_name resolved to code
// that name does not say (SymbolLocation::note), by probe: per probe, since the probes of
// one aggregate may have been asked for by different names (memcpy and memmove resolve to
// one implementation). g_mu; never destroyed, as the containers above.
std::unordered_map<const Kprobe*, std::string>& g_list_notes =
    *new std::unordered_map<const Kprobe*, std::string>;

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
  if (p->is_kretprobe_) {
    reinterpret_cast<Kretprobe*>(p)->pool_->returns_twice = returns_twice_name(where.name);
  }

  // What the caller may ask for.
  p->flags &= KPROBE_FLAG_DISABLED | KPROBE_FLAG_GPR_ONLY | KPROBE_FLAG_NO_INT3 |
              KPROBE_FLAG_NESTED;
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
  const bool asks_no_int3 = p->flags & KPROBE_FLAG_NO_INT3;
  if (asks_no_int3 && p->post_handler) return -EINVAL;  // it would need an int3
  Aggregate* ag = table_lookup(addr);
  if (ag) {
    if (ag->no_int3 && p->post_handler) return -EINVAL;  // it would need an int3
    if (asks_no_int3 && std::any_of(children_of(ag).begin(), children_of(ag).end(),
                                     [](const Kprobe* q) { return q->post_handler; }))
      return -EINVAL;
    if (p->post_handler) unoptimize_aggregate(ag);  // detours run no post handlers
    const bool was_no_int3 = ag->no_int3;
    ag->no_int3 = was_no_int3 || asks_no_int3;
    std::vector<Kprobe*> probes = children_of(ag);
    probes.push_back(p);
    publish_children(ag, std::move(probes));
    if (refused_without_jmp(ag)) {
      std::vector<Kprobe*> back = children_of(ag);
      std::erase(back, p);
      publish_children(ag, std::move(back));
      ag->no_int3 = was_no_int3;
      prepare_detour_or_unoptimize(ag);  // the detour the others need
      return -EINVAL;
    }
    // An int3 standing here for the probes before must go: the jmp replaces it when the
    // operation settles, or nothing stands until it can.
    if (ag->no_int3 && !was_no_int3 && ag->armed && !arch::site_optimized(ag->site)) {
      if (arch::disarm(ag->site) == 0) ag->armed = false;
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
    ag->no_int3 = asks_no_int3 || runs_with_signals_blocked(ag->module, ag->symbol);
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
  if (!where.note.empty()) g_list_notes[p] = where.note;
  return 0;
}

int unregister_locked(Kprobe* p) {
  Aggregate* ag = p->aggr_;
  if (!ag) return -EINVAL;
  g_list_notes.erase(p);
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
    // A refusal can come after the probe joined a live aggregate, where a hit may already
    // hold one of its instances: the pool goes the way of an unregistered one (freed once
    // a grace period has passed and every instance is back).
    retire_pool(rp);
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
  // After the kernel's columns, so that a reader of them finds them where they were.
  if (auto it = g_list_notes.find(p); it != g_list_notes.end()) {
    out->append(" (");
    out->append(it->second);
    out->push_back(')');
  }
  out->push_back('\n');
}

}  // namespace

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

int set_all_disarmed(bool disarmed) {
  return control_op([&] {
    g_all_disarmed = disarmed;
    for (Aggregate* ag : g_aggrs) mark_dirty(ag);  // the one operation on every probe
    return 0;
  });
}

}  // namespace

}  // namespace probefs::probecore::detail

// ---------------------------------------------------------------------------------------
// Public API

namespace probefs::probecore {

using namespace detail;

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

int enable_kprobes(Kprobe** ps, int num) {
  if (num <= 0) return -EINVAL;
  return control_op([&] {
    int first = 0;
    for (int i = 0; i < num; ++i)
      if (int rc = set_disabled_locked(ps[i], false); rc && !first) first = rc;
    return first;
  });
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

bool set_engine_thread(bool on) {
  const bool was = t_current == &g_engine_mark;
  if (on && !t_current) t_current = &g_engine_mark;
  if (!on && was) t_current = nullptr;
  return was;
}

void set_kprobes_boost(bool on) {
  std::lock_guard lock(g_mu);
  arch::set_boost_enabled(on);
}

}  // namespace probefs::probecore
