#include "tracee/link_map.h"

#include <fcntl.h>
#include <gelf.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace probefs::tracee {
namespace {

// Bounds the dynamic section we read, like kMaxLinkMapEntries the list.
constexpr size_t kMaxDynamicEntries = 4096;

// Reads the process's memory through /proc/PID/mem.
class MemoryReader {
 public:
  explicit MemoryReader(pid_t pid) {
    char file[64];
    std::snprintf(file, sizeof file, "/proc/%d/mem", static_cast<int>(pid));
    fd_ = open(file, O_RDONLY | O_CLOEXEC);
  }
  ~MemoryReader() {
    if (fd_ >= 0) close(fd_);
  }
  MemoryReader(const MemoryReader&) = delete;
  MemoryReader& operator=(const MemoryReader&) = delete;

  bool read(uintptr_t addr, void* buf, size_t len) const {
    if (fd_ < 0) return false;
    return pread(fd_, buf, len, static_cast<off_t>(addr)) == static_cast<ssize_t>(len);
  }

 private:
  int fd_ = -1;
};

}  // namespace

std::vector<uintptr_t> read_link_map(pid_t pid, Elf* exe, uintptr_t exe_bias) {
  std::vector<uintptr_t> out;
  if (gelf_getclass(exe) != (sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32)) return out;
  size_t count = 0;
  if (elf_getphdrnum(exe, &count) != 0) return out;
  uintptr_t dynamic = 0;
  size_t dyn_entries = 0;
  for (size_t i = 0; i < count; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(exe, static_cast<int>(i), &ph) != nullptr && ph.p_type == PT_DYNAMIC) {
      dynamic = exe_bias + ph.p_vaddr;
      dyn_entries = std::min(kMaxDynamicEntries, ph.p_memsz / sizeof(ElfW(Dyn)));
      break;
    }
  }
  if (dynamic == 0 || dyn_entries == 0) return out;
  MemoryReader mem(pid);
  std::vector<ElfW(Dyn)> dyn(dyn_entries);
  if (!mem.read(dynamic, dyn.data(), dyn.size() * sizeof(ElfW(Dyn)))) return out;
  uintptr_t debug = 0;
  for (const ElfW(Dyn)& d : dyn) {
    if (d.d_tag == DT_NULL) break;
    if (d.d_tag == DT_DEBUG) debug = d.d_un.d_ptr;
  }
  if (debug == 0) return out;  // ld.so fills DT_DEBUG in at start-up
  r_debug rd;
  if (!mem.read(debug, &rd, sizeof rd)) return out;
  auto lm = reinterpret_cast<uintptr_t>(rd.r_map);
  // Only the public head of struct link_map is read; glibc's private fields follow it.
  for (size_t n = 0; lm != 0 && n < kMaxLinkMapEntries; ++n) {
    link_map entry;
    if (!mem.read(lm, &entry, sizeof entry)) break;
    out.push_back(reinterpret_cast<uintptr_t>(entry.l_ld));
    lm = reinterpret_cast<uintptr_t>(entry.l_next);
  }
  return out;
}

}  // namespace probefs::tracee
