// /proc/PID/maps: the file mappings of a process, grouped into loaded objects, and a way to
// open the very file behind a mapping. Daemon side.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
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
  bool write = false;
  bool deleted = false;  // the file was unlinked or replaced after mapping
  std::string path;
};

// One line of /proc/PID/maps ("start-end perms offset major:minor inode   path"), without
// its newline, into *m: false for a line that maps no file (anonymous memory, [heap],
// [stack], [vdso], [vvar]) or that does not read as a maps line.
bool parse_maps_line(std::string_view line, Mapping* m);

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

// The largest object file open_mapped_file() hands out. libelf allocates a section's size
// when it reads a table, bounded only by the file's size, and a target chooses what it maps:
// a sparse file of a few bytes on disk could claim terabytes. Far above any real program
// with its debug information in it.
inline constexpr off_t kMaxMappedFileBytes = off_t{4} << 30;

// Opens, for reading, the very file behind mapping `m` of process `pid`: the inode the
// process mapped (the device and inode in maps), a regular file, at most
// kMaxMappedFileBytes. A file descriptor (O_RDONLY | O_NONBLOCK | O_CLOEXEC), or:
//   -ESTALE  nothing the daemon can reach is that inode any more: the file was deleted or
//            replaced (a program rebuilt while it runs, a library upgraded under it), or
//            something else now stands at its path (a FIFO, a directory, a symlink), and
//            /proc/PID/map_files is not open to this daemon
//   -EINVAL  the mapped inode is no regular file (a device)
//   -EFBIG   it is larger than kMaxMappedFileBytes
//   or the errno of the open that failed (-EACCES: the daemon may not read it).
//
// Where it looks, first to last:
//   /proc/PID/map_files/START-END  the mapped inode itself, even deleted or replaced; the
//          kernel opens it only to CAP_SYS_ADMIN (or CAP_CHECKPOINT_RESTORE) in the initial
//          user namespace, so a root daemon, not an ordinary user's
//   PATH, then PATH under /proc/PID/root (a target in another mount namespace or chroot),
//          looked up without following any symlink: maps names a file by its canonical
//          path, so a symlink anywhere in it is something swapped in since.
// A candidate is the mapped file when it has the mapping's device and inode or, where the
// devices differ (an overlay file, a btrfs subvolume: one file under two sets of numbers),
// when its GNU build-id is the one in the process's own copy of the object's headers.
// That copy is the target's to forge, but what a forged one can name is only a file of
// another device at the very path the kernel gives for the mapping, reached without links:
// on the same device (where a hard link could put any file) the inode must match.
// Each is first opened with O_PATH, which opens nothing (no FIFO to wait on, no device's
// open to run, no lease to break) and checked, and only then reopened for reading.
[[nodiscard]] int open_mapped_file(pid_t pid, const Mapping& m);

}  // namespace probefs::tracee
