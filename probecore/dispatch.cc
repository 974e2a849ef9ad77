// The hit path of kprobes: an int3 trapped (on_breakpoint, and on_singlestep_done after a
// single-step), or a jump-optimized probe's detour called in (on_optimized_hit). No
// allocation, no locks, no library call (DESIGN.md §3); the build checks the last from
// this file's object (tests/probecore/check_hit_path.sh).
#include "probecore/hit_path.h"

namespace probefs::probecore::detail {

namespace {

void run_post_handlers(const Aggregate* ag, PtRegs* regs) {
  const Children* ch = ag->children.load(std::memory_order_acquire);
  for (Kprobe* p : ch->probes)
    if (p->post_handler && probe_enabled(p)) p->post_handler(p, regs, 0);
}

}  // namespace

bool on_breakpoint(PtRegs* regs) {
  const uintptr_t addr = regs->ip - 1;
  rcu_read_lock();
  Aggregate* ag = table_lookup(addr);
  if (!ag) {
    rcu_read_unlock();
    return false;
  }
  if (t_current) {  // a handler hit a probe: run the instruction, count the miss
    if (t_current != &g_engine_mark &&
        run_nested(ag, [&](Kprobe* p) { return p->pre_handler && p->pre_handler(p, regs); })) {
      rcu_read_unlock();  // a nested probe's handler changed the execution path
      return true;
    }
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

// A jump-optimized probe fired (from the detour thunk). Pre handlers' return values are
// ignored: the relocated instructions always run next, as in kprobes. A probe that needs
// more than this detour saved joined while the hit was on its way (the detour is about
// to change kind): to it, the hit came before it did.
void on_optimized_hit(void* const volatile* ctx, PtRegs* regs, unsigned saved) {
  // By value: captured by reference, regs and saved would go through the stack for each
  // probe.
  on_optimized_aggregate(ctx, [regs, saved](Kprobe* p) {
    if (p->pre_handler && probe_enabled(p) && !(p->hit_needs_ & ~saved)) p->pre_handler(p, regs);
  });
}

}  // namespace probefs::probecore::detail
