#pragma once

#include <atomic>

#include "probecore/kprobes.h"

namespace probefs::probecore::test_util {
extern std::atomic<long> g_gpr_only_hits;
int gpr_only_count(Kprobe*, PtRegs*);
}  // namespace probefs::probecore::test_util
