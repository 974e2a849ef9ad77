// membarrier(2), the one wrapper: raw (arch/syscall.h), so that the hit path (a per-CPU
// steal, arch/percpu.h) may call it and errno is untouched. 0 (or the command's result),
// or -errno.
//
// The commands probefs uses (<linux/membarrier.h>):
//   MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, MEMBARRIER_CMD_PRIVATE_EXPEDITED
//       probecore's RCU: order every running thread's memory accesses against ours
//   MEMBARRIER_CMD_GLOBAL
//       its fallback where expedited barriers are refused
//   MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE, ..._PRIVATE_EXPEDITED_SYNC_CORE
//       cross-modifying code: every thread serializes its core before its next user
//       instruction (text patching)
//   MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ, MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ
//       with MEMBARRIER_CMD_FLAG_CPU: restart the rseq critical section running on one CPU
//       (per-CPU stacks, arch/percpu.h)
#pragma once

#include <linux/membarrier.h>

#include "arch/syscall.h"

namespace probefs::arch {

[[nodiscard]] inline long membarrier(int cmd, unsigned flags = 0, int cpu_id = 0) {
  return raw_syscall(__NR_membarrier, cmd, static_cast<long>(flags), cpu_id);
}

}  // namespace probefs::arch
