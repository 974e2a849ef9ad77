// Tables the daemon builds from the file behind a target's executable mapping and hands
// to every traced process that maps the same file range, as sealed memfds: the branch
// tables (arch/branch_targets.h) and the unwind tables (arch/unwind_table.h). Each is
// built once per file range and cached; the file is opened and its identity checked at
// every request (a file rewritten in place keeps its inode).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <ctime>
#include <functional>
#include <list>
#include <mutex>
#include <vector>

#include "tracee/proc_maps.h"

namespace probefs::tracee {

class MappingTables {
 public:
  // What a target can make the daemon spend (its files are the target's to choose): the
  // largest mapping a table is built for, and the tables kept at once, in number and in
  // bytes (the least recently used goes first).
  struct Limits {
    uint64_t max_mapping_bytes = 0;
    size_t max_tables = 0;
    uint64_t max_cached_bytes = 0;
  };
  // Builds the table of mapping m from `file` (the file m maps, opened for reading):
  // its bytes into *table, or a negative errno.
  using Build = std::function<int(int file, const Mapping& m, std::vector<uint8_t>* table)>;

  MappingTables(const char* name, Limits limits, Build build);
  MappingTables(const MappingTables&) = delete;
  MappingTables& operator=(const MappingTables&) = delete;
  ~MappingTables();

  // The table of executable mapping m of process pid: a memfd sealed against writing,
  // growing and shrinking, for the caller to close, or a negative errno: -EINVAL (not an
  // executable file mapping), -EFBIG (past the limits), open_mapped_file()'s or the
  // builder's. Any thread.
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
  const char* name_;
  Limits limits_;
  Build build_;
  std::mutex mu_;
  std::list<Entry> entries_;  // most recently used first
  uint64_t cached_bytes_ = 0;
};

}  // namespace probefs::tracee
