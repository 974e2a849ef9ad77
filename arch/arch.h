// The narrow contract between probecore and the machine. probecore calls only these verbs
// and never looks inside a Site; everything that knows instruction bytes lives behind them
// (arch/x86_64, the only code that includes Capstone).
#pragma once

#include <cstddef>
#include <cstdint>

#include "arch/regs.h"

namespace probefs::arch {

struct Site;  // the prepared instruction at one probe address (arch-private)

struct TextRange {
  uintptr_t start = 0, end = 0;
};

// ---- control plane: the caller serializes these calls ----

// Proves `addr` is an instruction boundary by decoding [func_start, func_end) from its start
// (seeing through our own patches), decodes the instruction and plans how it will run once
// the int3 is there: emulated, boosted (an out-of-line copy that jumps back), or
// single-stepped. -EILSEQ: not an instruction boundary; -EINVAL: an instruction that cannot
// be probed (int3, ud2, privileged, ...); -EFAULT: not mapped; -ENOMEM.
int prepare(uintptr_t addr, uintptr_t func_start, uintptr_t func_end, Site** out);

// Frees what prepare() made. The caller guarantees that no thread can still be using it.
void release(Site* site);

int arm(Site* site);     // writes the int3
int disarm(Site* site);  // puts the original byte back
// The code around the site is gone (its object was unloaded): never write to it again.
void mark_gone(Site* site);

uintptr_t site_address(const Site* site);
bool site_can_boost(const Site* site);

// Reads code as it would be with no probe armed. 0 or -EFAULT.
int read_text(uintptr_t addr, void* buf, size_t n);

// Code that must never be probed: the signal-return path and the return trampoline.
size_t blacklist(TextRange* out, size_t max);

// Turns boosting on or off for sites prepared from now on (off: every probed instruction
// that is not emulated is single-stepped). For measurement and debugging.
void set_boost_enabled(bool on);

// ---- entry points ----

struct Callbacks {
  // An int3 fired; regs->ip is one past it, as the kernel shows kprobe handlers. Returns
  // false when no probe is there. When it returns true it has either set regs->ip itself
  // (a pre_handler changed the execution path) or called resume_out_of_line().
  bool (*breakpoint)(PtRegs* regs);
  // The single-step that resume_out_of_line() started is done; regs->ip is past the
  // probed instruction.
  void (*singlestep_done)(void* cookie, PtRegs* regs);
  // A function whose return address resume was hijacked returned to the trampoline.
  // Returns the real return address.
  uintptr_t (*function_return)(PtRegs* regs);
};

// Installs the SIGTRAP handler (chaining to the program's handler for traps that are not
// ours). Idempotent. 0 or -errno.
int install(const Callbacks& callbacks);

enum class Resume {
  kEmulated,   // regs->ip is past the instruction: a post handler may run now
  kOutOfLine,  // regs->ip is at the boosted copy, which jumps back by itself
  kStepping,   // regs->ip is at a copy run under the trap flag; singlestep_done follows
};

// From Callbacks::breakpoint: makes the probed instruction run. With `step` (a post_handler
// wants to run after it) the instruction is emulated or single-stepped; otherwise emulated,
// boosted, or single-stepped when nothing else can run it.
Resume resume_out_of_line(const Site* site, PtRegs* regs, void* cookie, bool step);

// Where a hijacked return address points.
uintptr_t kretprobe_trampoline();

}  // namespace probefs::arch
