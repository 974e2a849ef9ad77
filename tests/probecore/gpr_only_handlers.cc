// Handlers built with -mgeneral-regs-only, for probes that carry KPROBE_FLAG_GPR_ONLY.
#include "tests/probecore/gpr_only_handlers.h"

namespace probefs::probecore::test_util {

std::atomic<long> g_gpr_only_hits{0};

int gpr_only_count(Kprobe*, PtRegs*) {
  g_gpr_only_hits.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

}  // namespace probefs::probecore::test_util
