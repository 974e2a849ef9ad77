// Handlers built with -mgeneral-regs-only, for probes that carry KPROBE_FLAG_GPR_ONLY.
#include "tests/probecore/gpr_only_handlers.h"

namespace probefs::probecore::test_util {

std::atomic<long> g_gpr_only_hits{0};

int gpr_only_count(Kprobe*, PtRegs*) {
  g_gpr_only_hits.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

void clobber_scratch_gprs() {
  asm volatile("mov $-1, %%rcx\n\tmov $-1, %%rdx\n\tmov $-1, %%rsi\n\tmov $-1, %%rdi\n\t"
               "mov $-1, %%r8\n\tmov $-1, %%r9\n\tmov $-1, %%r10\n\tmov $-1, %%r11"
               ::: "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11");
}

int gpr_only_clobber_return(KretprobeInstance*, PtRegs*) {
  g_gpr_only_hits.fetch_add(1, std::memory_order_relaxed);
  clobber_scratch_gprs();
  return 0;
}

int gpr_only_clobber_entry(KretprobeInstance*, PtRegs*) {
  clobber_scratch_gprs();
  return 0;
}

}  // namespace probefs::probecore::test_util
