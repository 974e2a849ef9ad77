#include "bench/tracee/kernel_uprobe.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

namespace probefs::bench {

namespace {
constexpr const char* kGroup = "probefs_bench";
}

KernelUprobes::KernelUprobes() {
  char dir[] = "/tmp/probefs-bench-tracefs-XXXXXX";
  if (mkdtemp(dir) == nullptr) {
    why_not_ = std::string("mkdtemp: ") + strerror(errno);
    return;
  }
  if (mount("nodev", dir, "tracefs", 0, nullptr) != 0) {
    why_not_ = std::string("mount tracefs: ") + strerror(errno);
    rmdir(dir);
    return;
  }
  mount_ = dir;
  std::string inst = mount_ + "/instances/probefs_bench";
  if (mkdir(inst.c_str(), 0755) != 0 && errno != EEXIST) {
    why_not_ = std::string("tracefs instance: ") + strerror(errno);
    return;
  }
  root_ = inst;
}

KernelUprobes::~KernelUprobes() {
  clear();
  if (!root_.empty()) rmdir(root_.c_str());
  if (!mount_.empty()) {
    umount2(mount_.c_str(), MNT_DETACH);
    rmdir(mount_.c_str());
  }
}

bool KernelUprobes::write(const std::string& file, const std::string& text, bool append) {
  int fd = open(file.c_str(), O_WRONLY | (append ? O_APPEND : O_TRUNC));
  if (fd < 0) return false;
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  return ok;
}

bool KernelUprobes::add(const std::string& name, bool ret, const std::string& body) {
  if (!available()) return false;
  std::string line = std::string(ret ? "r:" : "p:") + kGroup + "/" + name + " " + body + "\n";
  if (!write(mount_ + "/uprobe_events", line, true)) {
    why_not_ = "uprobe_events refused: " + line;
    return false;
  }
  events_.push_back(name);
  return write(root_ + "/events/" + kGroup + "/" + name + "/enable", "1", false);
}

void KernelUprobes::clear() {
  for (const std::string& e : events_)
    write(root_ + "/events/" + kGroup + "/" + e + "/enable", "0", false);
  for (const std::string& e : events_)
    write(mount_ + "/uprobe_events", std::string("-:") + kGroup + "/" + e + "\n", true);
  events_.clear();
}

unsigned long file_offset_of_symbol(const std::string& path, const std::string& symbol) {
  std::ifstream in(path, std::ios::binary);
  std::string img((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (img.size() < sizeof(Elf64_Ehdr)) return 0;
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(img.data());
  if (memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64) return 0;
  auto in_image = [&](uint64_t off, uint64_t len) { return off <= img.size() && len <= img.size() - off; };
  if (!in_image(eh->e_shoff, uint64_t{eh->e_shnum} * sizeof(Elf64_Shdr))) return 0;
  const auto* sh = reinterpret_cast<const Elf64_Shdr*>(img.data() + eh->e_shoff);
  uint64_t vaddr = 0;
  for (unsigned i = 0; i < eh->e_shnum && vaddr == 0; ++i) {
    if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_link >= eh->e_shnum) continue;
    const Elf64_Shdr& strs = sh[sh[i].sh_link];
    if (!in_image(sh[i].sh_offset, sh[i].sh_size) || !in_image(strs.sh_offset, strs.sh_size))
      return 0;
    const auto* syms = reinterpret_cast<const Elf64_Sym*>(img.data() + sh[i].sh_offset);
    for (size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); ++k) {
      if (syms[k].st_name >= strs.sh_size) continue;
      if (symbol == img.c_str() + strs.sh_offset + syms[k].st_name) {
        vaddr = syms[k].st_value;
        break;
      }
    }
  }
  if (vaddr == 0 || !in_image(eh->e_phoff, uint64_t{eh->e_phnum} * sizeof(Elf64_Phdr))) return 0;
  const auto* ph = reinterpret_cast<const Elf64_Phdr*>(img.data() + eh->e_phoff);
  for (unsigned i = 0; i < eh->e_phnum; ++i) {
    if (ph[i].p_type == PT_LOAD && ph[i].p_vaddr <= vaddr && vaddr < ph[i].p_vaddr + ph[i].p_filesz)
      return vaddr - ph[i].p_vaddr + ph[i].p_offset;
  }
  return 0;
}

}  // namespace probefs::bench
