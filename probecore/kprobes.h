// probecore: the kprobes engine for the process it runs in. The API follows the kernel's
// (Documentation/trace/kprobes.rst) so that a reader can map one onto the other:
// register/unregister/enable/disable for kprobes and kretprobes, batch forms that roll back,
// pre/post handlers, aggregation of many probes on one address, kretprobe maxactive,
// nmissed, entry_handler and per-instance data, a blacklist, a global arm switch, and the
// `kprobes/list` text.
//
// Errors are the kernel's: functions return 0 or a negative errno, which callers must
// look at ([[nodiscard]]).
//
// Threads: the control functions may be called from any thread and serialize on one lock;
// they must not be called from a handler. Handlers run on the thread that hit the probe,
// inside a signal handler (int3 path) or a detour: they may not take locks that the
// interrupted code could hold. A probe that a handler hits does not recurse; its nmissed
// grows instead. Hits from the engine's own threads (its optimizer thread, and a thread
// while it is inside a control function) run no handler and are no probe's miss.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "arch/regs.h"
#include "probecore/symbol_resolver.h"

namespace probefs::probecore {

struct Kprobe;
struct Kretprobe;
struct KretprobeInstance;

// Returns nonzero after changing regs->ip to resume there instead (execution path change);
// the probed instruction is then skipped. regs->ip is the probe address + 1 on entry, as the
// kernel shows it on x86.
using kprobe_pre_handler_t = int (*)(Kprobe*, PtRegs*);
// Runs after the probed instruction; regs->ip is past it.
using kprobe_post_handler_t = void (*)(Kprobe*, PtRegs*, unsigned long flags);
using kretprobe_handler_t = int (*)(KretprobeInstance*, PtRegs*);
// Runs each time a probe's nmissed grows (see Kprobe::miss_handler).
using kprobe_miss_handler_t = void (*)(Kprobe*);

enum KprobeFlags : uint32_t {
  KPROBE_FLAG_GONE = 1u << 0,       // the code under the probe was unloaded
  KPROBE_FLAG_DISABLED = 1u << 1,   // registered but not firing
  KPROBE_FLAG_OPTIMIZED = 1u << 2,  // reached through a jump detour (no trap)
  // The handlers touch general-purpose registers only (built with -mgeneral-regs-only):
  // an optimized hit need not save the vector registers. Set before registration.
  KPROBE_FLAG_GPR_ONLY = 1u << 3,
  // An int3 here would be fatal (code that runs with SIGTRAP blocked or in a spawned child
  // before exec, which the engine knows by name only where a resolver names it): the
  // site is only ever a jmp, as on the functions the engine knows (see
  // set_kprobes_optimization). Set before registration.
  KPROBE_FLAG_NO_INT3 = 1u << 4,
  // The pre_handler runs also on a hit inside another probe's handler (a signal handler
  // that interrupted one), where other probes count a miss; never on the engine's own
  // threads. For guards that must not be skipped; the handler must be async-signal-safe
  // and reentrant. Set before registration.
  KPROBE_FLAG_NESTED = 1u << 5,
};

namespace detail {
struct Aggregate;
struct InstancePool;
}  // namespace detail

struct Kprobe {
  // Where: symbol_name (+ offset) or addr; giving both or neither is -EINVAL.
  const char* symbol_name = nullptr;  // "SYM" or "MOD:SYM"
  uintptr_t offset = 0;
  uintptr_t addr = 0;                 // filled in when resolved from symbol_name
  // The function around addr, for the instruction-boundary check. Optional where a symbol
  // resolver is installed; required otherwise (as in a traced process, where the daemon
  // supplies it). Bounds given here are used as they are: without landing pads or related
  // code, the optimizer checks the function's own code only.
  FunctionBounds bounds;

  kprobe_pre_handler_t pre_handler = nullptr;
  kprobe_post_handler_t post_handler = nullptr;

  // KPROBE_FLAG_DISABLED before registration registers the probe disabled.
  uint32_t flags = 0;
  // Hits not handled because the thread was already inside a handler.
  std::atomic<unsigned long> nmissed{0};
  // Optional: runs right after nmissed grows, and for a kretprobe's kp also after the
  // kretprobe's nmissed grows, on the thread that missed, as a handler runs (the hit
  // path's rules; a probe it hits is a miss of that probe's). For a server that keeps the
  // count elsewhere as it happens. Set before registration.
  kprobe_miss_handler_t miss_handler = nullptr;

  // ---- private to probecore ----
  detail::Aggregate* aggr_ = nullptr;
  bool is_kretprobe_ = false;
  uint8_t hit_needs_ = 0;  // what an optimized hit must have saved to run pre_handler
};

struct Kretprobe {
  Kprobe kp;  // where: a function's entry (offset 0)
  kretprobe_handler_t handler = nullptr;        // at return
  kretprobe_handler_t entry_handler = nullptr;  // at entry; nonzero skips this instance
  int maxactive = 0;     // instances in flight at once; 0: max(10, 2 x CPUs)
  size_t data_size = 0;  // bytes of per-instance data (KretprobeInstance::data)
  // Returns missed because every instance was in use.
  std::atomic<unsigned long> nmissed{0};

  // ---- private to probecore ----
  detail::InstancePool* pool_ = nullptr;
};

// One call of the probed function in flight.
struct KretprobeInstance {
  detail::InstancePool* pool;
  uintptr_t ret_addr;    // the real return address
  uintptr_t* ret_slot;   // where it was on the stack
  KretprobeInstance* next;
  uint32_t index;        // in its pool (no division on the hit path)
  alignas(16) unsigned char data[];
};

// The kretprobe an instance belongs to; nullptr once it is unregistered.
Kretprobe* get_kretprobe(KretprobeInstance* ri);

// For a stack walk in a handler: what the stack slot `slot`, which holds `value` now, held
// before a return probe of this thread took it (the function's own return address), or
// `value` when no instance of this thread in flight took that slot.
uintptr_t kretprobe_slot_return(const uintptr_t* slot, uintptr_t value);

[[nodiscard]] int register_kprobe(Kprobe* p);
[[nodiscard]] int unregister_kprobe(Kprobe* p);  // -EINVAL when p is not registered
[[nodiscard]] int register_kprobes(Kprobe** ps, int num);  // all or nothing
void unregister_kprobes(Kprobe** ps, int num);
[[nodiscard]] int enable_kprobe(Kprobe* p);
// enable_kprobe of each of ps[0..num) in one control operation: their jmps are written in
// one window. 0, or the first failure (the others are enabled all the same).
[[nodiscard]] int enable_kprobes(Kprobe** ps, int num);
[[nodiscard]] int disable_kprobe(Kprobe* p);

[[nodiscard]] int register_kretprobe(Kretprobe* rp);
[[nodiscard]] int unregister_kretprobe(Kretprobe* rp);
[[nodiscard]] int register_kretprobes(Kretprobe** rps, int num);
void unregister_kretprobes(Kretprobe** rps, int num);
[[nodiscard]] int enable_kretprobe(Kretprobe* rp);
[[nodiscard]] int disable_kretprobe(Kretprobe* rp);

// The global switch (the kernel's debugfs kprobes/enabled): disarming leaves every probe
// registered with its own enabled state, and arming restores them.
[[nodiscard]] int arm_all_kprobes();
[[nodiscard]] int disarm_all_kprobes();
bool kprobes_all_disarmed();

// The kernel's `kprobes/list`: one line per probe, "ADDR  k|r  SYM+0xOFF  MOD [FLAGS]",
// and " (NOTE)" after them for a probe whose symbol_name the resolver placed on code of
// another name (SymbolLocation::note: "memcpy" beside an IFUNC's implementation).
std::string kprobes_list();

// Where symbol_name is resolved and function bounds come from. Not owned. nullptr removes.
void set_symbol_resolver(SymbolResolver* resolver);

// Is addr inside probefs's own code or another place that must never be probed?
bool within_kprobe_blacklist(uintptr_t addr);
// The ranges within_kprobe_blacklist() refuses, [start, end) each: the engine's own text,
// then arch's (the kernel's debugfs kprobes/blacklist).
std::vector<arch::TextRange> kprobe_blacklist();

// Jump optimization (the kernel's debug.kprobes_optimization): a probe that passes the
// safety checks is armed as a 5-byte jmp into a detour, written from the original bytes
// by the control operation that armed it (all of that operation's probes in one window).
// When a thread is in the way (on the replaced instructions, or running with signals
// blocked), the probe fires through an int3 meanwhile and the engine's optimizer thread
// retries. Off unoptimizes every probe, except on code glibc runs with every signal
// blocked, where an int3 would be fatal (see README): those stay jmps, and a probe there
// that cannot be one is refused with -EINVAL. On by default. A pre_handler's change of
// ip is ignored on optimized probes, as in kprobes; a probe with a post_handler is never
// optimized.
void set_kprobes_optimization(bool on);
bool kprobes_optimization_enabled();
// Runs the optimizer now on everything waiting for it (the kernel's
// wait_for_kprobe_optimizer()).
void wait_for_kprobe_optimizer();
// Called after a pass of the optimizer thread changed what kprobes_list() shows (a probe
// it optimized on a retry, unoptimized, or found [GONE]): on that thread, with no lock of
// the engine's held, so it may call kprobes_list(). Changes a control operation makes are
// not told: its caller knows of them. For a server that keeps a copy of the list
// elsewhere. nullptr: none.
void set_kprobes_list_notifier(void (*fn)());

// Why p is not jump-optimized: empty when it is, else the reason (a refused safety check,
// "optimization is switched off", a thread in the way, "not armed: ..." where an int3
// would be fatal and the jmp waits for a window, ...). Such a probe is an int3: a thread
// that hits it with SIGTRAP blocked dies.
std::string kprobe_optimization_status(const Kprobe* p);

// Marks the calling thread as one of the engine's own (on) or the program's again (off),
// and returns what it was: hits on an engine thread run no handler and are no probe's
// miss, as on the optimizer thread. For the threads of a control server inside a traced
// process, which call libc functions that users probe between control operations. Not
// from a handler.
bool set_engine_thread(bool on);

// Boosting (running the probed instruction out of line without a trap flag) for probes
// registered from now on. On by default; off makes every non-emulated hit single-step.
void set_kprobes_boost(bool on);

}  // namespace probefs::probecore
