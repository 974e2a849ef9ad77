#pragma once

#include <atomic>

#include "probecore/kprobes.h"

namespace probefs::probecore::test_util {
extern std::atomic<long> g_gpr_only_hits;
int gpr_only_count(Kprobe*, PtRegs*);
// Count a return / do nothing at entry, after writing -1 into every scratch GPR.
int gpr_only_clobber_return(KretprobeInstance*, PtRegs*);
int gpr_only_clobber_entry(KretprobeInstance*, PtRegs*);
void clobber_scratch_gprs();
}  // namespace probefs::probecore::test_util
