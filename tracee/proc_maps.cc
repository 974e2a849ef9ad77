#include "tracee/proc_maps.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace probefs::tracee {

int read_maps(pid_t pid, std::vector<Mapping>* out) {
  char file[64];
  std::snprintf(file, sizeof file, "/proc/%d/maps", static_cast<int>(pid));
  FILE* f = std::fopen(file, "re");
  if (f == nullptr) return errno == ENOENT ? -ESRCH : -errno;
  char* line = nullptr;
  size_t cap = 0;
  ssize_t len;
  while ((len = getline(&line, &cap, f)) > 0) {
    if (line[len - 1] == '\n') line[--len] = '\0';
    unsigned long start, end;
    unsigned long long offset, inode;
    unsigned major_dev, minor_dev;
    char perms[8];
    int consumed = 0;
    if (std::sscanf(line, "%lx-%lx %7s %llx %x:%x %llu %n", &start, &end, perms, &offset,
                    &major_dev, &minor_dev, &inode, &consumed) < 7 ||
        consumed == 0) {
      continue;
    }
    const char* path = line + consumed;
    // Anonymous memory, [heap], [stack], [vdso] and [vvar] name no file we can open; the
    // vDSO is left out on purpose (nothing to probe there that a library does not offer).
    if (path[0] != '/' || inode == 0) continue;
    Mapping m;
    m.start = start;
    m.end = end;
    m.offset = offset;
    m.dev = makedev(major_dev, minor_dev);
    m.inode = static_cast<ino_t>(inode);
    m.exec = std::strlen(perms) >= 3 && perms[2] == 'x';
    std::string_view p(path);
    constexpr std::string_view kDeleted = " (deleted)";
    if (p.ends_with(kDeleted)) {
      m.deleted = true;
      p.remove_suffix(kDeleted.size());
    }
    m.path.assign(p);
    out->push_back(std::move(m));
  }
  std::free(line);
  std::fclose(f);
  return 0;
}

std::vector<MappingGroup> group_mappings(std::vector<Mapping> maps) {
  std::vector<MappingGroup> groups;
  std::unordered_map<std::string, size_t> last_group;  // path -> index of its latest group
  for (Mapping& m : maps) {
    auto it = last_group.find(m.path);
    if (it != last_group.end()) {
      MappingGroup& g = groups[it->second];
      const Mapping& prev = g.maps.back();
      if (prev.dev == m.dev && prev.inode == m.inode && m.offset >= prev.offset) {
        g.has_exec |= m.exec;
        g.maps.push_back(std::move(m));
        continue;
      }
    }
    last_group[m.path] = groups.size();
    MappingGroup g;
    g.has_exec = m.exec;
    g.maps.push_back(std::move(m));
    groups.push_back(std::move(g));
  }
  return groups;
}

// The path in maps may no longer name that file (a library upgraded on disk, a deleted
// executable) or may live in another mount namespace, so when the inode does not match we
// try the kernel's handles on the mapped file itself.
int open_mapped_file(pid_t pid, const Mapping& m) {
  std::vector<std::string> candidates;
  if (!m.deleted) candidates.push_back(m.path);
  char buf[96];
  std::snprintf(buf, sizeof buf, "/proc/%d/map_files/%lx-%lx", static_cast<int>(pid),
                static_cast<unsigned long>(m.start), static_cast<unsigned long>(m.end));
  candidates.push_back(buf);
  std::snprintf(buf, sizeof buf, "/proc/%d/root", static_cast<int>(pid));
  candidates.push_back(buf + m.path);
  int fallback = -1;
  for (const std::string& c : candidates) {
    int fd = open(c.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    if (fstat(fd, &st) == 0 && st.st_ino == m.inode && st.st_dev == m.dev) {
      if (fallback >= 0) close(fallback);
      return fd;
    }
    // Overlay filesystems report different device numbers in maps and stat; keep the first
    // file that opened in case nothing matches exactly.
    if (fallback < 0) {
      fallback = fd;
    } else {
      close(fd);
    }
  }
  return fallback;
}

}  // namespace probefs::tracee
