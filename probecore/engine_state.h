// probecore's private state and the functions its files share: the registry, the hit
// path, kretprobe instances, the optimizer, object tracking and the blacklist.
// Not a public header: probecore/kprobes.h is.
//
// Files: dispatch.cc and kretprobe_instances.cc are the hit path (no library calls,
// never instrumented); registry.cc, optimizer.cc, objects.cc and blacklist.cc are the
// control plane.
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
//   t_parked        this thread's instances whose frames the order of t_ri_head says are
//                   gone but which may live on another stack (a coroutine's): kept until
//                   they return or are proven gone (owner thread; kretprobe_instances.cc)
//   t_returned      where this thread's last returns of functions that return twice went
//                   (owner thread; kretprobe_instances.cc)
//   t_given_back    where the frames went whose instances an exception's give-back took
//                   out of t_ri_head (owner thread; kretprobe_instances.cc)
//   g_opt_queue     aggregates the optimizer thread retries                  (g_mu)
// Anything unpublished is retired and freed only after synchronize_rcu().
//
// No control operation costs time in proportion to the probe set or to a mapping: an
// operation settles only the aggregates it touched (g_dirty) and their neighbours, the
// table and g_aggrs change in O(1) and O(log n), unloaded objects are looked for only
// when the dynamic linker's unload counter moved, and the optimizer's checks look at one
// function (and a byte scan once per mapping for branches into it).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "arch/arch.h"
#include "arch/percpu.h"
#include "probecore/kprobes.h"

namespace probefs::probecore::detail {

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
  bool returns_twice = false;  // the probed function returns twice (setjmp, vfork); set
                               // before the probe is armed

  KretprobeInstance* at(uint32_t i) {
    return reinterpret_cast<KretprobeInstance*>(storage.get() + size_t{i} * stride);
  }

};

// Hidden from here on: nothing outside the engine's shared object refers to the state and
// functions below, and the hit path reaches hidden globals without a GOT load.
#pragma GCC visibility push(hidden)

// ---------------------------------------------------------------------------------------
// State (registry.cc defines it)

extern std::mutex g_mu;
// Aggregates by address (a gone one may share its address with a live one: then by
// pointer). Searched by a bare address, which sorts before every aggregate there.
struct ByAddress {
  using is_transparent = void;
  bool operator()(const Aggregate* a, const Aggregate* b) const {
    return a->addr != b->addr ? a->addr < b->addr : a < b;
  }
  bool operator()(const Aggregate* a, uintptr_t addr) const { return a->addr < addr; }
  bool operator()(uintptr_t addr, const Aggregate* b) const { return addr <= b->addr; }
};
extern std::set<Aggregate*, ByAddress>& g_aggrs;  // g_mu
// The hit path's address -> aggregate map: 2^kTableBits chains. Writers (g_mu) publish a
// link with a release store; readers follow links with acquire loads inside their
// read-side section; an unlinked aggregate is freed only after a grace period.
constexpr unsigned kTableBits = 12;
extern std::array<std::atomic<Aggregate*>, size_t{1} << kTableBits> g_table;
extern std::vector<Aggregate*>& g_dirty;  // g_mu
// Unregistered aggregates whose jmp is still written (its detour silenced): removed in one
// batch when the operation ends, before reclaim() frees them.                  (g_mu)
extern std::vector<Aggregate*>& g_unpatch;
extern bool g_all_disarmed;        // g_mu
extern SymbolResolver* g_resolver;  // g_mu
extern bool g_percpu;              // g_mu: kretprobe pools keep per-CPU stacks
extern uintptr_t g_trampoline;     // arch::kretprobe_trampoline(), set at init
extern uintptr_t g_trampoline_twice;  // arch::kretprobe_trampoline_returns_twice(), set at init
extern bool g_initialized;         // g_mu

// Unpublished and waiting for a grace period.                                  (g_mu)
extern std::vector<const Children*>& g_retired_children;
extern std::vector<Aggregate*>& g_retired_aggrs;
extern std::vector<InstancePool*>& g_retired_pools;  // freed once all are back

extern bool g_optimization;                  // g_mu: debug.kprobes_optimization
extern std::vector<Aggregate*>& g_opt_queue;  // g_mu
// With g_mu. Never destroyed (the optimizer thread may wait on it during exit), and
// replaced in a fork child: a condition variable that had waiters is unusable there.
extern std::condition_variable* g_opt_cv;
extern bool g_optimizer_running;  // g_mu: the thread exists (reset in fork)
// Nonzero once something was queued since the thread went to sleep (written under g_mu;
// the thread sleeps on it in arch::sleep_quietly_until, without g_mu).
extern uint32_t g_opt_kicked;
extern uint64_t g_opt_passes;     // g_mu: completed optimizer passes
// g_mu: changes of what kprobes_list() shows that the flags carry ([OPTIMIZED], [GONE]),
// and whom to tell of those an optimizer pass made (set_kprobes_list_notifier).
extern uint64_t g_list_changes;
extern void (*g_list_notifier)();

// This thread's running probe (the recursion guard), or &g_engine_mark.
extern thread_local constinit const void* t_current __attribute__((tls_model("initial-exec")));
// t_current of a thread that runs the engine's own code: the optimizer thread always, a
// thread inside a control operation for its duration. The engine calls libc (files,
// threads, memory), which users probe: such hits run no handler and are no one's miss.
extern char g_engine_mark;
// This thread's kretprobe instances in flight, newest first. Instances it takes for gone
// are parked (kretprobe_instances.cc), not given back, until proven gone: a pool's
// instances are all back once every frame that held one has returned or is known gone.
extern thread_local constinit KretprobeInstance* t_ri_head
    __attribute__((tls_model("initial-exec")));
// Handed to arch for a single-step taken on behalf of a missed (recursive) hit.
extern char g_missed_cookie;

inline bool probe_enabled(const Kprobe* p) {
  return !(__atomic_load_n(&p->flags, __ATOMIC_RELAXED) & (KPROBE_FLAG_DISABLED | KPROBE_FLAG_GONE));
}

inline size_t table_bucket(uintptr_t addr) {
  return static_cast<size_t>((addr * 0x9e3779b97f4a7c15ull) >> (64 - kTableBits));
}

// Hit path: lock-free, inside a read-side section.
inline Aggregate* table_lookup(uintptr_t addr) {
  for (Aggregate* ag = g_table[table_bucket(addr)].load(std::memory_order_acquire); ag;
       ag = ag->hash_next.load(std::memory_order_acquire))
    if (ag->addr == addr) return ag;
  return nullptr;
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

// ---------------------------------------------------------------------------------------
// Hit path (dispatch.cc, kretprobe_instances.cc): the arch callbacks.

bool on_breakpoint(PtRegs* regs);
void on_singlestep_done(void* cookie, PtRegs* regs);
void on_optimized_hit(void* const volatile* ctx, PtRegs* regs, unsigned saved);
void on_lean_entry_hit(void* const volatile* ctx, PtRegs* regs, unsigned saved);
uintptr_t on_function_return(PtRegs* regs);
// Before an exception unwinds this thread's stack (unwind.cc): gives every instance in
// flight back, putting the function's own return address back into each live slot above
// `frame`.
void give_back_hijacked_returns(const void* frame);
int pre_handler_kretprobe(Kprobe* p, PtRegs* regs);

// ---------------------------------------------------------------------------------------
// Registry and reclamation (registry.cc). g_mu held.

int init_locked();
void table_insert(Aggregate* ag);
void table_remove(Aggregate* ag);
void publish_children(Aggregate* ag, std::vector<Kprobe*> probes);
const std::vector<Kprobe*>& children_of(const Aggregate* ag);
bool any_enabled(const Aggregate* ag);
void mark_dirty(Aggregate* ag);
void retire_aggregate(Aggregate* ag);
// The live aggregates whose address lies in [lo, hi), in address order.
template <typename F>
void for_each_in(uintptr_t lo, uintptr_t hi, F f) {
  for (auto it = g_aggrs.lower_bound(lo); it != g_aggrs.end() && (*it)->addr < hi; ++it)
    if (!(*it)->gone) f(*it);
}
void reclaim();
// The end of every control operation.
void finish_control_op();

// ---------------------------------------------------------------------------------------
// The optimizer (optimizer.cc). g_mu held.

void dequeue_optimizer(Aggregate* ag);
std::string prepare_detour_or_unoptimize(Aggregate* ag);
void set_optimized_flag(const Aggregate* ag, bool on);
void unoptimize_aggregate(Aggregate* ag);
void unoptimize_covering(uintptr_t addr);
void mark_neighbours_dirty(uintptr_t addr);
void start_optimizer();
void settle_dirty();
void run_optimizer_pass();

// ---------------------------------------------------------------------------------------
// Objects code lives in, for [GONE] (objects.cc). g_mu held.

struct ObjectQuery {
  uintptr_t addr;
  uintptr_t base;
  std::string name;
  bool found;
};
ObjectQuery object_containing(uintptr_t addr);
void refresh_gone();

// ---------------------------------------------------------------------------------------
// The blacklist (blacklist.cc). g_mu held.

void build_blacklist();
bool blacklisted_locked(uintptr_t addr);
bool runs_with_signals_blocked(std::string_view module, std::string_view symbol);

}  // namespace probefs::probecore::detail

#pragma GCC visibility pop
