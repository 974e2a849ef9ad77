// The narrow contract between probecore and the machine. probecore calls only these verbs
// and never looks inside a Site; everything that knows instruction bytes lives behind them
// (arch/x86_64, the only code that includes Capstone).
#pragma once

#include <cstddef>
#include <cstdint>

#include "arch/regs.h"
#include "arch/text_range.h"

namespace probefs::arch {

struct Site;  // the prepared instruction at one probe address (arch-private)

// ---- control plane: the caller serializes these calls ----

// Proves `addr` is an instruction boundary by decoding [func_start, func_end) from its start
// (seeing through our own patches), decodes the instruction and plans how it will run once
// the int3 is there: emulated, boosted (an out-of-line copy that jumps back), or
// single-stepped. -EILSEQ: not an instruction boundary; -EINVAL: an instruction that cannot
// be probed (int3, ud2, privileged, ...); -EFAULT: not mapped; -ENOMEM.
[[nodiscard]] int prepare(uintptr_t addr, uintptr_t func_start, uintptr_t func_end,
                        Site** out);

// Frees what prepare() made. The caller guarantees that no thread can still be using it.
void release(Site* site);

// 0 or -errno; on failure the site stays as it was. disarm() also warns (arch/warn.h) when
// code that is still there (not gone) could not be written: its int3 stays, and a hit on
// it after the probe is gone would end the program.
[[nodiscard]] int arm(Site* site);     // writes the int3
[[nodiscard]] int disarm(Site* site);  // puts the original byte back (from an int3 or a jmp)
// disarm() on many sites, with one guarded window for all the jmps among them.
void disarm_batch(Site* const* sites, size_t n);
// The code around the site is gone (its object was unloaded): never write to it again.
void mark_gone(Site* site);

// Code that must never be probed: the signal-return path and the return trampoline.
size_t blacklist(TextRange* out, size_t max);

// Turns boosting on or off for sites prepared from now on (off: every probed instruction
// that is not emulated is single-stepped). For measurement and debugging.
void set_boost_enabled(bool on);

// ---- entry points ----

struct Callbacks {
  // An int3 fired; regs->ip is one past it, as the kernel shows kprobe handlers. Returns
  // false when no probe is there. When it returns true it has either set regs->ip itself
  // (a pre_handler changed the execution path) or called run_probed_insn().
  bool (*breakpoint)(PtRegs* regs);
  // The single-step that run_probed_insn() started is done; regs->ip is past the
  // probed instruction.
  void (*singlestep_done)(void* cookie, PtRegs* regs);
  // A function whose return address resume was hijacked returned to the trampoline.
  // Returns the real return address. regs->ip is the trampoline entry the return came
  // through (kretprobe_trampoline() or kretprobe_trampoline_returns_twice(); from a
  // call-mode detour, neither); the callback sets it to the real return address.
  uintptr_t (*function_return)(PtRegs* regs);
  // A jump-optimized probe fired. *ctx is what set_optimized_context() stored (load it
  // only inside the caller's read-side section; nullptr: the probe is going away).
  // regs->ip is the probe address + 1, as on the int3 path; changes to ip are ignored.
  // `saved` (kSaved* bits) tells what the detour saved: a handler that needs more must
  // not run on this hit (it joined while the hit was on its way).
  void (*optimized_hit)(void* const volatile* ctx, PtRegs* regs, unsigned saved);
  // The same for a DetourEntry::kCallLean block (saved is 0): only sp and the registers a
  // C call clobbers are in regs, and only handlers that need no more may run.
  void (*optimized_lean_entry_hit)(void* const volatile* ctx, PtRegs* regs, unsigned saved);
};

// What an optimized hit's detour saved before calling the handlers.
enum : unsigned {
  kSavedVector = 1u << 0,   // the vector registers: handlers may use them
  kSavedAllRegs = 1u << 1,  // every general-purpose register is in PtRegs (otherwise only
                            // sp and the registers a C call clobbers)
};

// Ways into a function that its own instructions do not show (see prepare_optimized).
struct FunctionEntries {
  const uintptr_t* landing_pads = nullptr;  // where the unwinder resumes the function
  size_t n_landing_pads = 0;
  const TextRange* related = nullptr;  // code split off it (foo.cold) or it was split from
  size_t n_related = 0;
};

// How a detour's jmp enters it (see prepare_optimized).
enum class DetourEntry : uint8_t {
  kPlain,     // the handlers run, then the relocated instructions
  kCall,      // a function entry with a return probe: call mode
  kCallLean,  // call mode for handlers that need neither all registers nor the vector
              // ones (a return probe's own entry handler): the detour saves only sp and
              // what a C call clobbers
};

// Installs the SIGTRAP handler (chaining to the program's handler for traps that are not
// ours). Idempotent. 0 or -errno.
[[nodiscard]] int install(const Callbacks& callbacks);

enum class Resume {
  kEmulated,   // regs->ip is past the instruction: a post handler may run now
  kOutOfLine,  // regs->ip is at the boosted copy, which jumps back by itself
  kStepping,   // regs->ip is at a copy run under the trap flag; singlestep_done follows
};

// From Callbacks::breakpoint: makes the probed instruction run. With `step` (a post_handler
// wants to run after it) the instruction is emulated or single-stepped; otherwise emulated,
// boosted, or single-stepped when nothing else can run it.
Resume run_probed_insn(const Site* site, PtRegs* regs, void* cookie, bool step);

// Where a hijacked return address points.
uintptr_t kretprobe_trampoline();
// The same trampoline entered at another address, for functions that return twice (setjmp,
// vfork): a second return, through a saved copy of the hijacked address, can be told from
// an ordinary one. A call-mode detour never takes it (its entry thunk sees no
// kretprobe_trampoline() and runs the plain block).
uintptr_t kretprobe_trampoline_returns_twice();

// Is `addr` where a hijacked return goes: a return trampoline's entry, or the return point
// of a call-mode detour (the address its call into the function pushed)? Any thread, no
// lock, no library call: the unwinder's path asks it of return slots on the stack.
bool is_hijacked_return(uintptr_t addr);

// ---- jump optimization (control plane; the caller serializes) ----

// Runs the optimizer's safety checks on the function around the site and builds the
// detour. `save_vector`: the detour saves and restores the vector registers around the
// handlers (needed unless every handler touches general-purpose registers only).
// `entry`: kCall and kCallLean are for function entries with a return probe; when a
// handler hijacked the return address (stored kretprobe_trampoline() in it), the detour
// runs the function as a call of its own, so that the function's ret is predicted, and
// the return reaches Callbacks::function_return all the same. A hit that hijacked nothing
// takes the plain path (correct either way, only slower). 0, or -EINVAL with *why set to
// the reason it cannot be optimized; -EBUSY when the site is optimized with another kind
// of detour or entry (unoptimize it first). `return_saves_vector` (call mode): the return
// handlers of the probes here may use vector registers.
//
// `outside`: the ways into [func_start, func_end) that its own branches do not show, as the
// symbol side knows them (landing pads, split-off parts); no region may have one strictly
// inside it.
[[nodiscard]] int prepare_optimized(Site* site, uintptr_t func_start, uintptr_t func_end,
                                    const FunctionEntries& outside, bool save_vector, DetourEntry entry,
                                    bool return_saves_vector, const char** why);

// The end of the bytes the jmp replaces, [the probe address, site_region_end). Valid after
// prepare_optimized() succeeded; the probe address + 1 before.
uintptr_t site_region_end(const Site* site);

// What the detour hands to Callbacks::optimized_hit. nullptr silences it.
void set_optimized_context(Site* site, void* ctx);

// Writes a jmp to its detour on each prepared site, in one window for the whole batch: an
// armed site's int3 becomes the jmp, and a site not armed yet goes from its original bytes
// to the jmp (armed by it), with an int3 standing only inside the window:
//   int3 hits resume in the detour's copy; wait_for_handlers() (every int3 handler that
//   started before has finished; only when some site was armed); every other running
//   thread is parked in a signal handler (moved to the copy when it was on a region);
//   int3 on the sites not armed; barrier; the jmps' tails; barrier; their first bytes;
//   barrier; the threads go on.
// A batch in which some thread could not be moved or parked (it blocks signals while
// running: glibc does so for moments, when a trap would kill it) is left as it was.
// Returns how many sites are optimized now.
size_t optimize(Site* const* sites, size_t n, void (*wait_for_handlers)());

// Puts the int3 back: int3 on the first byte, barrier, the original tail, barrier.
void unoptimize(Site* const* sites, size_t n);

bool site_optimized(const Site* site);

}  // namespace probefs::arch
