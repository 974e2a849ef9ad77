// The daemon's half of arch/branch_targets.h: the branch table of each executable file
// mapping a target has, built once from the file and kept as a sealed memfd, which every
// traced process that maps the same file range is handed (events/link.h, BRANCHES). A
// process start then costs the agent a mmap where it cost a sweep of libc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tracee/mapping_tables.h"

namespace probefs::tracee {

class BranchTables : public MappingTables {
 public:
  // The largest mapping a table is built for, the most candidates one may hold (past
  // either the agent sweeps for itself), and the tables kept at once.
  static constexpr uint64_t kMaxMappingBytes = uint64_t{256} << 20;
  static constexpr size_t kMaxCandidates = size_t{4} << 20;
  static constexpr size_t kMaxTables = 64;
  static constexpr uint64_t kMaxCachedBytes = uint64_t{128} << 20;

  BranchTables();
};

}  // namespace probefs::tracee
