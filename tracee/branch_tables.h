// The daemon's half of arch/branch_targets.h: the branch table of each executable file
// mapping a target has, built once from the file and kept as a sealed memfd, which every
// traced process that maps the same file range is handed (events/link.h, BRANCHES). A
// process start then costs the agent a mmap where it cost a sweep of libc.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <ctime>
#include <list>
#include <mutex>

#include "tracee/proc_maps.h"

namespace probefs::tracee {

class BranchTables {
 public:
  // What a target can make the daemon spend (its files are the target's to choose): the
  // largest mapping a table is built for, the most candidates one may hold (past either
  // the agent sweeps for itself), and the tables kept at once, in number and in bytes
  // (the least recently used goes first).
  static constexpr uint64_t kMaxMappingBytes = uint64_t{256} << 20;
  static constexpr size_t kMaxCandidates = size_t{4} << 20;
  static constexpr size_t kMaxTables = 64;
  static constexpr uint64_t kMaxCachedBytes = uint64_t{128} << 20;

  BranchTables() = default;
  BranchTables(const BranchTables&) = delete;
  BranchTables& operator=(const BranchTables&) = delete;
  ~BranchTables();

  // The table of executable mapping m of process pid (arch::build_branch_table()'s): a
  // memfd sealed against writing, growing and shrinking, for the caller to close, or a
  // negative errno:
  // -EINVAL (not an executable file mapping), -EFBIG (past the limits above), or
  // open_mapped_file()'s. The
  // file is opened and its identity checked every time (a file rewritten in place keeps
  // its inode); only the table is cached. Any thread.
  int fd_for(pid_t pid, const Mapping& m);

 private:
  struct Entry {
    dev_t dev = 0;
    ino_t inode = 0;
    uint64_t offset = 0, length = 0;
    off_t size = 0;
    timespec mtime{}, ctime{};
    int fd = -1;
    uint64_t bytes = 0;  // the table's
  };
  std::mutex mu_;
  std::list<Entry> entries_;  // most recently used first
  uint64_t cached_bytes_ = 0;
};

}  // namespace probefs::tracee
