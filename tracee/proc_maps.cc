#include "tracee/proc_maps.h"

#include <elf.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "tracee/unique_fd.h"

namespace probefs::tracee {

namespace {

// Fields of a maps line, in the kernel's fixed format (hex, a separator), parsed by hand:
// this runs for every new target, and sscanf costs more than the read.
bool take_hex(std::string_view* s, unsigned long long* out, char sep) {
  unsigned long long v = 0;
  size_t i = 0;
  for (; i < s->size() && i < 17; ++i) {
    const char c = (*s)[i];
    unsigned d;
    if (c >= '0' && c <= '9') d = static_cast<unsigned>(c - '0');
    else if (c >= 'a' && c <= 'f') d = static_cast<unsigned>(c - 'a' + 10);
    else break;
    v = v << 4 | d;
  }
  if (i == 0 || i > 16 || i >= s->size() || (*s)[i] != sep) return false;
  *out = v;
  s->remove_prefix(i + 1);
  return true;
}

bool take_dec(std::string_view* s, unsigned long long* out) {
  unsigned long long v = 0;
  size_t i = 0;
  for (; i < s->size() && i < 20 && (*s)[i] >= '0' && (*s)[i] <= '9'; ++i)
    v = v * 10 + static_cast<unsigned>((*s)[i] - '0');
  if (i == 0 || i >= 20) return false;
  *out = v;
  s->remove_prefix(i);
  return true;
}

}  // namespace

// "start-end perms offset major:minor inode   path"
bool parse_maps_line(std::string_view line, Mapping* m) {
  unsigned long long start, end, offset, major_dev, minor_dev, inode;
  if (!take_hex(&line, &start, '-') || !take_hex(&line, &end, ' ')) return false;
  const size_t sp = line.find(' ');
  if (sp == std::string_view::npos || sp > 7) return false;
  const std::string_view perms = line.substr(0, sp);
  line.remove_prefix(sp + 1);
  if (!take_hex(&line, &offset, ' ') || !take_hex(&line, &major_dev, ':') ||
      !take_hex(&line, &minor_dev, ' ') || !take_dec(&line, &inode))
    return false;
  while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
  // Anonymous memory, [heap], [stack], [vdso] and [vvar] name no file we can open; the
  // vDSO is left out on purpose (nothing to probe there that a library does not offer).
  if (line.empty() || line.front() != '/' || inode == 0) return false;
  m->start = start;
  m->end = end;
  m->offset = offset;
  m->dev = makedev(static_cast<unsigned>(major_dev), static_cast<unsigned>(minor_dev));
  m->inode = static_cast<ino_t>(inode);
  m->exec = perms.size() >= 3 && perms[2] == 'x';
  m->write = perms.size() >= 2 && perms[1] == 'w';
  constexpr std::string_view kDeleted = " (deleted)";
  m->deleted = line.ends_with(kDeleted);
  if (m->deleted) line.remove_suffix(kDeleted.size());
  m->path.assign(line);
  return true;
}


int read_maps(pid_t pid, std::vector<Mapping>* out) {
  char file[64];
  std::snprintf(file, sizeof file, "/proc/%d/maps", static_cast<int>(pid));
  const int fd = ::open(file, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? -ESRCH : -errno;
  // Whole reads into one buffer, lines split out of it: a line is at most a page (the
  // kernel's), so a line cut at the buffer's end moves to its front. The buffer is the
  // thread's, kept: a new one per call cost more (allocated, zeroed, its pages faulted in)
  // than the kernel's formatting of a new image's maps.
  constexpr size_t kBufBytes = 64 * 1024;
  thread_local std::unique_ptr<char[]> kept;
  if (!kept) kept.reset(new char[kBufBytes]);
  const std::span<char> buf(kept.get(), kBufBytes);
  size_t have = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data() + have, buf.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return -e;
    }
    have += static_cast<size_t>(n);
    size_t at = 0;
    for (size_t nl; (nl = std::string_view(buf.data() + at, have - at).find('\n')) !=
                    std::string_view::npos;
         at += nl + 1) {
      Mapping m;
      if (parse_maps_line(std::string_view(buf.data() + at, nl), &m)) out->push_back(std::move(m));
    }
    if (n == 0) {  // the end: a last line without a newline
      Mapping m;
      if (at < have && parse_maps_line(std::string_view(buf.data() + at, have - at), &m))
        out->push_back(std::move(m));
      break;
    }
    std::memmove(buf.data(), buf.data() + at, have - at);
    have -= at;
    if (have == buf.size()) have = 0;  // no newline in a whole buffer: not the kernel's
  }
  ::close(fd);
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

namespace {

// `path` under `dirfd` as an O_PATH descriptor, following no symlink in any component (nor
// the kernel's magic links), and with RESOLVE_IN_ROOT when `in_root`: `dirfd` is then the
// root that absolute paths and ".." stay under (the target's root, not the daemon's).
// Kernels before openat2 follow symlinks short of the last component; the inode check
// that every caller makes is what decides, this only spares following a target's links.
int open_path_strictly(int dirfd, const std::string& path, bool in_root) {
  open_how how{};
  how.flags = O_PATH | O_NOFOLLOW | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | (in_root ? RESOLVE_IN_ROOT : 0);
  const long fd = syscall(SYS_openat2, dirfd, path.c_str(), &how, sizeof how);
  if (fd >= 0 || errno != ENOSYS) return fd >= 0 ? static_cast<int>(fd) : -errno;
  std::string_view rel(path);
  while (in_root && rel.starts_with('/')) rel.remove_prefix(1);
  const int old = openat(dirfd, std::string(rel).c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
  return old >= 0 ? old : -errno;
}

bool pread_all(int fd, void* buf, size_t len, uint64_t at) {
  auto* p = static_cast<char*>(buf);
  while (len > 0) {
    const ssize_t n = pread(fd, p, len, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
    at += static_cast<uint64_t>(n);
  }
  return true;
}

// The GNU build-id of the ELF image that `fd` reads with file offset 0 at `base` (0 for a
// file; the address of a mapping of offset 0 for /proc/PID/mem), "" when it has none.
// Only what lies in [base, base + limit) is read (for memory: the mapping itself), and
// every length is bounded before it is used: both inputs are the target's to write.
std::string read_build_id(int fd, uint64_t base, uint64_t limit) {
  constexpr size_t kMaxPhdrs = 256;
  constexpr size_t kMaxNotes = 64 * 1024;
  Elf64_Ehdr eh;
  if (limit < sizeof eh || !pread_all(fd, &eh, sizeof eh, base)) return {};
  if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0 || eh.e_phnum > kMaxPhdrs ||
      eh.e_phoff > limit || limit - eh.e_phoff < uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr))
    return {};
  std::vector<Elf64_Phdr> phdrs(eh.e_phnum);
  if (!pread_all(fd, phdrs.data(), phdrs.size() * sizeof(Elf64_Phdr), base + eh.e_phoff))
    return {};
  std::vector<unsigned char> notes;
  for (const Elf64_Phdr& ph : phdrs) {
    if (ph.p_type != PT_NOTE || ph.p_filesz == 0 || ph.p_filesz > kMaxNotes ||
        ph.p_offset > limit || limit - ph.p_offset < ph.p_filesz)
      continue;
    notes.resize(ph.p_filesz);
    if (!pread_all(fd, notes.data(), notes.size(), base + ph.p_offset)) continue;
    // Note headers, each name and descriptor padded to the segment's alignment (4, or 8
    // for the segments of 8-aligned notes such as .note.gnu.property).
    const uint64_t pad = ph.p_align == 8 ? 7 : 3;
    size_t at = 0;
    while (notes.size() - at >= sizeof(Elf64_Nhdr)) {
      Elf64_Nhdr nh;
      std::memcpy(&nh, notes.data() + at, sizeof nh);
      at += sizeof nh;
      const size_t name_len = (uint64_t{nh.n_namesz} + pad) & ~pad;
      const size_t desc_len = (uint64_t{nh.n_descsz} + pad) & ~pad;
      if (name_len > notes.size() - at || desc_len > notes.size() - at - name_len) break;
      if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
          std::memcmp(notes.data() + at, "GNU", 4) == 0 && nh.n_descsz >= 8 &&
          nh.n_descsz <= 64) {
        const auto* d = notes.data() + at + name_len;
        return std::string(d, d + nh.n_descsz);
      }
      at += name_len + desc_len;
    }
  }
  return {};
}

// The build-id in the process's memory of the object mapped at `m` (offset 0: the ELF
// header and, in every layout the linkers emit, the notes after it). "" when unreadable.
std::string mapped_build_id(pid_t pid, const Mapping& m) {
  if (m.offset != 0) return {};
  char file[64];
  std::snprintf(file, sizeof file, "/proc/%d/mem", static_cast<int>(pid));
  UniqueFd mem(open(file, O_RDONLY | O_CLOEXEC));
  if (mem.get() < 0) return {};
  return read_build_id(mem.get(), m.start, m.end - m.start);
}

}  // namespace

// Every candidate is opened O_PATH and judged by fstat before anything reads it; only
// the one that is the mapped file is reopened for reading (through /proc/self/fd, which
// reopens that inode and looks up no name). O_NONBLOCK on that open: a regular file with
// a lease the target holds would otherwise keep the open waiting for the lease to break.
//
// The mapped file is the one with the device and inode that maps shows. Where the device
// differs, maps and the file may show one file by two sets of numbers: an overlay file
// (maps shows the overlay's numbers since Linux 6.x and the lower file's before, while
// map_files leads to the lower file), a btrfs subvolume; then the same GNU build-id as the
// process's own copy of the headers says it is the same object.
int open_mapped_file(pid_t pid, const Mapping& m) {
  UniqueFd found;
  struct stat st {};
  char buf[96];
  std::string build_id;  // of the mapping, read once, where device numbers disagree
  bool build_id_read = false;
  // Whether the O_PATH descriptor `cand`, of which `st` is the fstat, is the mapped file.
  auto is_mapped_file = [&](int cand) {
    if (st.st_dev == m.dev && st.st_ino == m.inode) return true;
    // Same device, another inode: another file.
    if (st.st_dev == m.dev || !S_ISREG(st.st_mode) || st.st_size > kMaxMappedFileBytes)
      return false;
    if (!build_id_read) {
      build_id = mapped_build_id(pid, m);
      build_id_read = true;
    }
    if (build_id.empty()) return false;
    std::snprintf(buf, sizeof buf, "/proc/self/fd/%d", cand);
    UniqueFd file(open(buf, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
    return file.get() >= 0 &&
           read_build_id(file.get(), 0, static_cast<uint64_t>(st.st_size)) == build_id;
  };

  std::snprintf(buf, sizeof buf, "/proc/%d/map_files/%lx-%lx", static_cast<int>(pid),
                static_cast<unsigned long>(m.start), static_cast<unsigned long>(m.end));
  // A magic link to the mapped file: O_PATH follows it (no O_NOFOLLOW) and opens nothing.
  UniqueFd cand(open(buf, O_PATH | O_CLOEXEC));
  if (cand.get() >= 0 && fstat(cand.get(), &st) == 0 && is_mapped_file(cand.get()))
    found.reset(cand.release());

  // The path, in the daemon's view and then in the target's root. A deleted mapping's
  // path names another file or none.
  for (int where = 0; found.get() < 0 && !m.deleted && where < 2; ++where) {
    UniqueFd root;
    if (where == 1) {
      std::snprintf(buf, sizeof buf, "/proc/%d/root", static_cast<int>(pid));
      root.reset(open(buf, O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (root.get() < 0) break;
    }
    const int fd = open_path_strictly(where == 0 ? AT_FDCWD : root.get(), m.path, where == 1);
    if (fd < 0) continue;
    cand.reset(fd);
    if (fstat(cand.get(), &st) == 0 && is_mapped_file(cand.get())) found.reset(cand.release());
  }
  // Nothing reachable is the file the process runs: say so rather than read another.
  if (found.get() < 0) return -ESTALE;
  if (fstat(found.get(), &st) != 0) return -errno;
  if (!S_ISREG(st.st_mode)) return -EINVAL;
  if (st.st_size > kMaxMappedFileBytes) return -EFBIG;

  std::snprintf(buf, sizeof buf, "/proc/self/fd/%d", found.get());
  const int fd = open(buf, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return -errno;
  // The same inode, whatever happened to the names since: a descriptor's link is its file.
  struct stat now;
  if (fstat(fd, &now) != 0 || now.st_dev != st.st_dev || now.st_ino != st.st_ino) {
    close(fd);
    return -ESTALE;
  }
  return fd;
}

}  // namespace probefs::tracee
