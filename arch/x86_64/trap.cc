// The int3 trap entry: a SIGTRAP handler that runs probecore's handlers and then makes the
// probed instruction run — emulated, from its boosted out-of-line copy, or single-stepped
// with the trap flag. Everything here runs on the hit path inside the probed process: no
// allocation, no locks, no libc calls (DESIGN.md §3). Per-thread state is initial-exec TLS,
// reached through %fs with no call.
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "arch/syscall.h"
#include "arch/x86_64/cpu_state.h"
#include "arch/x86_64/foreign_signals.h"
#include "arch/x86_64/isa/relocate.h"
#include "arch/x86_64/near_alloc.h"
#include "arch/x86_64/site.h"

extern "C" {
void probefs_kretprobe_trampoline_sse();
void probefs_kretprobe_trampoline_avx();
void probefs_kretprobe_trampoline_avx512();
void probefs_kretprobe_trampoline_sse_twice();
void probefs_kretprobe_trampoline_avx_twice();
void probefs_kretprobe_trampoline_avx512_twice();
// The plain return trampoline of this CPU's vector level; the entry thunks compare with it.
__attribute__((visibility("hidden"))) uintptr_t probefs_arch_plain_trampoline = 0;
}
// The callbacks the assembly entry paths call directly (no C glue in between).
extern "C" {
__attribute__((visibility("hidden"))) uintptr_t (*probefs_arch_function_return_cb)(
    probefs::PtRegs*) = nullptr;
__attribute__((visibility("hidden"))) void (*probefs_arch_optimized_hit_cb)(
    void* const volatile*, probefs::PtRegs*, unsigned) = nullptr;
__attribute__((visibility("hidden"))) void (*probefs_arch_optimized_lean_entry_cb)(
    void* const volatile*, probefs::PtRegs*, unsigned) = nullptr;
__attribute__((visibility("hidden"))) thread_local constinit unsigned long
    probefs_arch_detour_depth __attribute__((tls_model("initial-exec"))) = 0;
}

namespace probefs::arch {

using namespace x86_64;

Callbacks g_callbacks{};

namespace {

// The plain trampoline's entry for functions that return twice.
uintptr_t g_trampoline_twice = 0;

constexpr uint64_t kTrapFlag = 1u << 8;
constexpr unsigned kMaxNestedSteps = 8;

// One single-step in flight. A signal handler that interrupts a step may start another on
// the same thread, hence a small stack. Values, not a Site pointer, so that finishing a
// step never reads a Site.
struct StepFrame {
  uintptr_t slot;  // where the copy runs
  uintptr_t addr;  // the probed instruction
  uint8_t len;
  bool fix_return_address;  // call r/m pushed slot+len instead of addr+len
  bool fix_pushed_flags;    // pushf pushed our trap flag
  bool trap_flag_was_set;   // the program itself was single-stepping (a debugger)
  void* cookie;
};

struct ThreadTrapState {
  StepFrame steps[kMaxNestedSteps];
  unsigned depth;
  unsigned in_handler;  // nesting of on_sigtrap on this thread
};

thread_local ThreadTrapState t_trap __attribute__((tls_model("initial-exec")));

std::atomic<uintptr_t> g_restorer{0};  // where our handler returns to: the sigreturn stub
std::atomic<bool> g_installed{false};

void load_regs(const mcontext_t& m, PtRegs* r) {
  const greg_t* g = m.gregs;
  r->r15 = g[REG_R15]; r->r14 = g[REG_R14]; r->r13 = g[REG_R13]; r->r12 = g[REG_R12];
  r->bp = g[REG_RBP]; r->bx = g[REG_RBX]; r->r11 = g[REG_R11]; r->r10 = g[REG_R10];
  r->r9 = g[REG_R9]; r->r8 = g[REG_R8]; r->ax = g[REG_RAX]; r->cx = g[REG_RCX];
  r->dx = g[REG_RDX]; r->si = g[REG_RSI]; r->di = g[REG_RDI];
  r->orig_ax = ~0ull;
  r->ip = g[REG_RIP]; r->flags = g[REG_EFL]; r->sp = g[REG_RSP];
  r->cs = static_cast<uint64_t>(g[REG_CSGSFS]) & 0xffff;
  r->ss = 0x2b;  // the user data segment selector of x86-64 Linux
}

void store_regs(const PtRegs& r, mcontext_t* m) {
  greg_t* g = m->gregs;
  g[REG_R15] = r.r15; g[REG_R14] = r.r14; g[REG_R13] = r.r13; g[REG_R12] = r.r12;
  g[REG_RBP] = r.bp; g[REG_RBX] = r.bx; g[REG_R11] = r.r11; g[REG_R10] = r.r10;
  g[REG_R9] = r.r9; g[REG_R8] = r.r8; g[REG_RAX] = r.ax; g[REG_RCX] = r.cx;
  g[REG_RDX] = r.dx; g[REG_RSI] = r.si; g[REG_RDI] = r.di;
  g[REG_RIP] = r.ip; g[REG_EFL] = r.flags; g[REG_RSP] = r.sp;
}

void emulate(const Insn& in, PtRegs* r) {
  switch (in.kind) {
    case InsnKind::kJmpRel:
      r->ip = in.target;
      return;
    case InsnKind::kJccRel:
      r->ip = condition_holds(in.cond, r->flags) ? in.target : in.next();
      return;
    case InsnKind::kCallRel:
      r->sp -= 8;
      *reinterpret_cast<uint64_t*>(r->sp) = in.next();
      r->ip = in.target;
      return;
    case InsnKind::kLoopRel: {
      bool taken;
      const bool zf = r->flags & (1u << 6);
      switch (in.loop) {
        case LoopOp::kJrcxz: taken = r->cx == 0; break;
        case LoopOp::kJecxz: taken = static_cast<uint32_t>(r->cx) == 0; break;
        default:
          r->cx -= 1;
          taken = r->cx != 0 && (in.loop == LoopOp::kLoop || (in.loop == LoopOp::kLoope) == zf);
          break;
      }
      r->ip = taken ? in.target : in.next();
      return;
    }
    case InsnKind::kRet:
      r->ip = *reinterpret_cast<const uint64_t*>(r->sp);
      r->sp += 8 + in.ret_imm;
      return;
    default:  // nop, endbr64
      r->ip = in.next();
      return;
  }
}

bool finish_step(PtRegs* r) {
  ThreadTrapState& ts = t_trap;
  if (ts.depth == 0) return false;
  StepFrame& f = ts.steps[ts.depth - 1];
  if (r->ip == f.slot + f.len) {
    r->ip = f.addr + f.len;
  } else if (f.fix_return_address) {
    *reinterpret_cast<uint64_t*>(r->sp) = f.addr + f.len;
  }
  if (f.fix_pushed_flags) *reinterpret_cast<uint64_t*>(r->sp) &= ~kTrapFlag;
  if (!f.trap_flag_was_set) r->flags &= ~kTrapFlag;
  void* cookie = f.cookie;
  --ts.depth;
  g_callbacks.singlestep_done(cookie, r);
  return true;
}

// Returns true when the trap is none of ours: the caller passes it on to the program.
bool handle_sigtrap(siginfo_t* info, void* ucv);

// The whole handler counts as "in the trap path" for thread_in_trap_path(): a thread in it
// may be about to resume at an address it chose before an optimization began. A trap that
// is none of ours goes on to the program outside that bracket: the program's handler is
// the program's code (and may leave by longjmp).
void on_sigtrap(int sig, siginfo_t* info, void* ucv) {
  ++t_trap.in_handler;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  const bool foreign = handle_sigtrap(info, ucv);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  --t_trap.in_handler;
  if (foreign) pass_on_foreign(sig, info, ucv);
}

bool handle_sigtrap(siginfo_t* info, void* ucv) {
  auto* uc = static_cast<ucontext_t*>(ucv);
  PtRegs regs;
  load_regs(uc->uc_mcontext, &regs);

  if ((regs.flags & kTrapFlag) && t_trap.depth > 0 && info->si_code != SI_KERNEL) {
    if (finish_step(&regs)) store_regs(regs, &uc->uc_mcontext);
    return false;
  }
  if (info->si_code != SI_KERNEL) return true;  // not an int3

  if (g_callbacks.breakpoint(&regs)) {
    store_regs(regs, &uc->uc_mcontext);
    return false;
  }
  // No probe here. If the int3 is gone too, a probe was removed between the trap and this
  // lookup: run the original instruction, which is back in place.
  const uintptr_t addr = regs.ip - 1;
  if (*reinterpret_cast<const volatile uint8_t*>(addr) != kInt3) {
    uc->uc_mcontext.gregs[REG_RIP] = static_cast<greg_t>(addr);
    return false;
  }
  return true;
}

}  // namespace

Resume run_probed_insn(const Site* site, PtRegs* regs, void* cookie, bool step) {
  // Being optimized, or optimized and hit by a thread that trapped just before the jmp was
  // written: run the detour's copy of the whole region.
  if (const uintptr_t d = site->detour_resume.load(std::memory_order_acquire)) {
    regs->ip = d;
    return Resume::kOutOfLine;
  }
  if (site->mode == RunMode::kEmulate) {
    emulate(site->insn, regs);
    return Resume::kEmulated;
  }
  if (!step && site->mode == RunMode::kBoost) {
    regs->ip = reinterpret_cast<uintptr_t>(site->boost_slot);
    return Resume::kOutOfLine;
  }
  ThreadTrapState& ts = t_trap;
  if (site->boost_slot && (!site->step_slot || ts.depth == kMaxNestedSteps)) {
    // Cannot step here: run the copy without the post handler rather than not at all.
    regs->ip = reinterpret_cast<uintptr_t>(site->boost_slot);
    return Resume::kOutOfLine;
  }
  // With every frame in use (signal handlers nested kMaxNestedSteps deep, each interrupting
  // a step) and no copy to boost, the innermost frame is reused: the step it tracked loses
  // its fix-ups, which is the least harm available.
  if (ts.depth == kMaxNestedSteps) --ts.depth;
  StepFrame& f = ts.steps[ts.depth++];
  f.slot = reinterpret_cast<uintptr_t>(site->step_slot);
  f.addr = site->addr;
  f.len = site->insn.len;
  f.fix_return_address = site->insn.kind == InsnKind::kCallIndirect;
  f.fix_pushed_flags = site->insn.bytes[site->insn.opcode_offset] == 0x9c;  // pushf
  f.trap_flag_was_set = regs->flags & kTrapFlag;
  f.cookie = cookie;
  regs->ip = f.slot;
  regs->flags |= kTrapFlag;
  return Resume::kStepping;
}

int install(const Callbacks& callbacks) {
  if (g_installed.load(std::memory_order_acquire)) return 0;
  g_callbacks = callbacks;
  probefs_arch_function_return_cb = callbacks.function_return;
  probefs_arch_optimized_hit_cb = callbacks.optimized_hit;
  probefs_arch_optimized_lean_entry_cb = callbacks.optimized_lean_entry_hit;
  using Code = void (*)();
  static const Code kTrampolines[] = {probefs_kretprobe_trampoline_sse,
                                      probefs_kretprobe_trampoline_avx,
                                      probefs_kretprobe_trampoline_avx512};
  probefs_arch_plain_trampoline = reinterpret_cast<uintptr_t>(kTrampolines[vector_level() - 1]);
  static const Code kTwice[] = {probefs_kretprobe_trampoline_sse_twice,
                                probefs_kretprobe_trampoline_avx_twice,
                                probefs_kretprobe_trampoline_avx512_twice};
  g_trampoline_twice = reinterpret_cast<uintptr_t>(kTwice[vector_level() - 1]);
  struct sigaction sa {};
  sa.sa_sigaction = on_sigtrap;
  // SA_NODEFER: a handler that hits another probe traps again instead of being killed by
  // a blocked synchronous signal; probecore counts such a hit as missed.
  sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  struct sigaction previous {};
  if (sigaction(SIGTRAP, &sa, &previous) != 0) return -errno;
  remember_actions(SIGTRAP, sa, previous);
  TextRange r[1];
  if (blacklist(r, 1) == 1) g_restorer.store(r[0].start, std::memory_order_release);
  g_installed.store(true, std::memory_order_release);
  return 0;
}

uintptr_t signal_restorer() { return g_restorer.load(std::memory_order_acquire); }

bool thread_in_trap_path(uintptr_t interrupted_ip) {
  const uintptr_t restorer = g_restorer.load(std::memory_order_acquire);
  // A thread between a single-step copy and its trap resumes at the probed instruction's
  // successor, decided before any optimization could see it.
  return t_trap.in_handler != 0 || t_trap.depth != 0 ||
         (restorer && interrupted_ip >= restorer && interrupted_ip < restorer + 16);
}

uintptr_t kretprobe_trampoline() { return probefs_arch_plain_trampoline; }
uintptr_t kretprobe_trampoline_returns_twice() { return g_trampoline_twice; }

bool is_hijacked_return(uintptr_t addr) {
  // A call-mode detour's return point is the only code address of ours that a call pushes:
  // copies and detours hold no call (the optimizer refuses one in a region; boosting
  // emulates calls).
  return addr == probefs_arch_plain_trampoline || addr == g_trampoline_twice ||
         near_alloc_contains(addr);
}

size_t blacklist(TextRange* out, size_t max) {
  size_t n = 0;
  // The signal return path: the restorer the kernel jumps to when our handler returns.
  struct {
    void* handler;
    unsigned long flags;
    void* restorer;
    uint64_t mask;
  } k{};
  if (raw_syscall(__NR_rt_sigaction, SIGTRAP, 0, reinterpret_cast<long>(&k), 8) == 0 &&
      k.restorer && n < max) {
    const auto r = reinterpret_cast<uintptr_t>(k.restorer);
    out[n++] = {r, r + 16};
  }
  return n;
}

}  // namespace probefs::arch

