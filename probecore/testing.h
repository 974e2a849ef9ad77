// Verbs for tests only: not part of the engine's API (probecore/kprobes.h), and nothing but
// tests/ includes this header. Implemented by the hit path's kretprobe_instances.cc: they
// only read, and call no library.
#pragma once

#include <cstddef>

#include "probecore/kprobes.h"

namespace probefs::probecore::testing {

// The instances of a registered kretprobe that are not free: in flight on some thread or
// parked by one. 0 when rp is not registered. Exact only while no hit runs.
size_t kretprobe_instances_out(const Kretprobe* rp);

// The kretprobe instances the calling thread holds, of every kretprobe, registered or not:
// in flight (its list) and parked (taken for gone here, but perhaps alive on another stack).
size_t thread_kretprobe_instances();
size_t thread_parked_kretprobe_instances();

}  // namespace probefs::probecore::testing
