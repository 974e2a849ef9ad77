// The benchmark's counting handlers, built with -mgeneral-regs-only so that their probes
// may carry KPROBE_FLAG_GPR_ONLY (optimized hits then skip saving vector registers).
#include "bench/probecore/counting_handlers.h"

namespace probefs::bench {

// One thread calls: a plain load and store count every hit, as a counting handler in the
// kernel's measurements does, without a locked instruction.
std::atomic<long> g_hits{0};

namespace {
void count_hit() { g_hits.store(g_hits.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }
}  // namespace

int count_pre(probecore::Kprobe*, PtRegs*) {
  count_hit();
  return 0;
}

int count_ret(probecore::KretprobeInstance*, PtRegs*) {
  count_hit();
  return 0;
}

}  // namespace probefs::bench
