#pragma once

#include <atomic>

#include "probecore/kprobes.h"

namespace probefs::bench {
extern std::atomic<long> g_hits;
int count_pre(probecore::Kprobe*, PtRegs*);
int count_ret(probecore::KretprobeInstance*, PtRegs*);
}  // namespace probefs::bench
