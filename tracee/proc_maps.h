// /proc/PID/maps: the file mappings of a process, grouped into loaded objects, and a way to
// open the very file behind a mapping. Daemon side.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace probefs::tracee {

// One line of /proc/PID/maps that maps a file.
struct Mapping {
  uintptr_t start = 0;
  uintptr_t end = 0;
  uint64_t offset = 0;
  dev_t dev = 0;
  ino_t inode = 0;
  bool exec = false;
  bool deleted = false;  // the file was unlinked or replaced after mapping
  std::string path;
};

// The file mappings of `pid`, in address order. Anonymous memory, [heap], [stack], [vdso]
// and [vvar] are left out. 0, -ESRCH (no such process) or a negative errno.
int read_maps(pid_t pid, std::vector<Mapping>* out);

// The mappings of one loaded object: consecutive mappings of one file with non-decreasing
// file offsets (two segments can share a file page, so offsets may repeat). A second load of
// the same file (dlmopen) starts over at a lower offset.
struct MappingGroup {
  std::vector<Mapping> maps;  // address order
  bool has_exec = false;
};

std::vector<MappingGroup> group_mappings(std::vector<Mapping> maps);

// Opens the file behind a mapping (O_RDONLY | O_CLOEXEC): by its path, else through
// /proc/PID/map_files or /proc/PID/root when the path no longer names the mapped inode.
// A file descriptor, or -1.
int open_mapped_file(pid_t pid, const Mapping& m);

}  // namespace probefs::tracee
