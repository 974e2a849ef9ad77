#include "tracee/ifunc.h"

#include <fcntl.h>
#include <gelf.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "tracee/elf_versions.h"

namespace probefs::tracee {
namespace {

// The slots of one SHT_RELA section.
void read_rela(Elf* elf, Elf_Scn* scn, const GElf_Shdr& sh, IfuncSlots* out) {
  Elf_Data* data = elf_getdata(scn, nullptr);
  if (data == nullptr) return;
  Elf_Scn* sym_scn = elf_getscn(elf, sh.sh_link);
  GElf_Shdr sym_sh;
  Elf_Data* syms = nullptr;
  DynsymVersions versions;
  if (sym_scn != nullptr && gelf_getshdr(sym_scn, &sym_sh) != nullptr &&
      sym_sh.sh_type == SHT_DYNSYM) {
    syms = elf_getdata(sym_scn, nullptr);
    versions = read_reference_versions(elf, sh.sh_link);
  }
  const size_t count = sh.sh_size / sh.sh_entsize;
  for (size_t i = 0; i < count; ++i) {
    GElf_Rela r;
    if (gelf_getrela(data, static_cast<int>(i), &r) == nullptr) break;
    const auto type = static_cast<unsigned>(GELF_R_TYPE(r.r_info));
    if (type == R_X86_64_IRELATIVE) {
      out->irelative.emplace_back(r.r_offset, static_cast<uint64_t>(r.r_addend));
      continue;
    }
    // Slots that receive a symbol's address as it is: a GOT entry, a PLT slot, a function
    // pointer in data.
    const bool whole_address = type == R_X86_64_GLOB_DAT || type == R_X86_64_JUMP_SLOT ||
                               (type == R_X86_64_64 && r.r_addend == 0);
    if (!whole_address || syms == nullptr) continue;
    const auto index = static_cast<size_t>(GELF_R_SYM(r.r_info));
    GElf_Sym sym;
    if (index == 0 || gelf_getsym(syms, static_cast<int>(index), &sym) == nullptr) continue;
    const unsigned st = GELF_ST_TYPE(sym.st_info);
    if (st != STT_FUNC && st != STT_GNU_IFUNC && st != STT_NOTYPE) continue;
    const char* name = elf_strptr(elf, sym_sh.sh_link, sym.st_name);
    if (name == nullptr || name[0] == '\0') continue;
    IfuncSlots::SymbolSlot slot;
    slot.slot = r.r_offset;
    bool hidden = false;
    if (const std::string* version = version_of(versions, index, &hidden))
      slot.version = *version;
    out->by_name.emplace(name, std::move(slot));
  }
}

// 8-byte words of a process's memory, through /proc/PID/mem (which the daemon, the
// process's tracer or owner, may read; a process may always read its own).
class ProcessMemory {
 public:
  explicit ProcessMemory(pid_t pid) {
    if (pid <= 0) return;
    char file[64];
    std::snprintf(file, sizeof file, "/proc/%d/mem", static_cast<int>(pid));
    fd_ = open(file, O_RDONLY | O_CLOEXEC);
  }
  ~ProcessMemory() {
    if (fd_ >= 0) close(fd_);
  }
  ProcessMemory(const ProcessMemory&) = delete;
  ProcessMemory& operator=(const ProcessMemory&) = delete;

  bool word(uintptr_t addr, uintptr_t* out) const {
    return fd_ >= 0 && pread(fd_, out, sizeof *out, static_cast<off_t>(addr)) ==
                           static_cast<ssize_t>(sizeof *out);
  }

 private:
  int fd_ = -1;
};

// Where this process maps the file (dev, inode, as stat gives them: /proc/PID/maps may
// give an overlay's lower device) through the dynamic linker, which relocated it, so that
// its code may run here: the load bias of its link-map entry (the executable's included);
// with `at`, only the entry loaded at that bias. A file mapped some other way (mmap) is
// not there.
bool own_load_bias(dev_t dev, ino_t inode, std::optional<uintptr_t> at, uintptr_t* bias) {
  struct Search {
    dev_t dev;
    ino_t inode;
    std::optional<uintptr_t> at;
    uintptr_t bias = 0;
    bool found = false;
  } search{dev, inode, at};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto* s = static_cast<Search*>(data);
        if (s->at && info->dlpi_addr != *s->at) return 0;
        const char* path = info->dlpi_name;
        if (path == nullptr || path[0] == '\0') path = "/proc/self/exe";  // the executable
        struct stat st;
        if (stat(path, &st) != 0 || st.st_dev != s->dev || st.st_ino != s->inode) return 0;
        s->bias = info->dlpi_addr;
        s->found = true;
        return 1;
      },
      &search);
  *bias = search.bias;
  return search.found;
}

// Whether `pid` started with this process's GLIBC_TUNABLES (neither having any counts as
// the same): the tunables are what can make one resolver choose differently on one
// machine (glibc.cpu.hwcaps masks CPU features out).
bool same_tunables(pid_t pid) {
  char file[64];
  std::snprintf(file, sizeof file, "/proc/%d/environ", static_cast<int>(pid));
  const int fd = open(file, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::string env;
  char buf[4096];
  for (ssize_t n; env.size() < (1u << 20) && (n = read(fd, buf, sizeof buf)) > 0;)
    env.append(buf, static_cast<size_t>(n));
  close(fd);
  constexpr std::string_view kName = "GLIBC_TUNABLES=";
  std::optional<std::string_view> theirs;
  for (size_t at = 0; at < env.size();) {
    size_t end = env.find('\0', at);
    if (end == std::string::npos) end = env.size();
    const std::string_view entry(env.data() + at, end - at);
    if (entry.starts_with(kName)) theirs = entry.substr(kName.size());
    at = end + 1;
  }
  const char* mine = std::getenv("GLIBC_TUNABLES");
  if (mine == nullptr || !theirs) return mine == nullptr && !theirs;
  return *theirs == mine;
}

// Runs an IFUNC resolver of this process as the x86-64 dynamic linker does: no arguments
// (glibc's x86 resolvers read the CPU features ld.so recorded).
uintptr_t run_resolver(uintptr_t addr) {
  using Resolver = uintptr_t (*)();
  return reinterpret_cast<Resolver>(addr)();
}

// Whether a reference to (name, version) binds to the definition `def` (its full name:
// "memcpy@@GLIBC_2.14", "memcpy@GLIBC_2.2.5", "foo"): the same name, and the version the
// reference asks for, or none for a default (or unversioned) definition.
bool binds_to(std::string_view def, std::string_view version) {
  const size_t at = def.find('@');
  if (at == std::string_view::npos) return true;
  const bool is_default = def.substr(at).starts_with("@@");
  const std::string_view def_version = def.substr(at + (is_default ? 2 : 1));
  return version.empty() ? is_default : version == def_version;
}

bool in_ranges(std::span<const std::pair<uintptr_t, uintptr_t>> ranges, uintptr_t addr) {
  return std::any_of(ranges.begin(), ranges.end(), [&](const auto& range) {
    return range.first <= addr && addr < range.second;
  });
}

}  // namespace

IfuncSlots read_ifunc_slots(Elf* elf) {
  IfuncSlots out;
  GElf_Ehdr eh;
  if (gelf_getehdr(elf, &eh) == nullptr || eh.e_machine != EM_X86_64) return out;
  size_t shstrndx = 0;
  const bool named = elf_getshdrstrndx(elf, &shstrndx) == 0;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr) continue;
    if (named && (sh.sh_flags & SHF_EXECINSTR)) {
      const char* n = elf_strptr(elf, shstrndx, sh.sh_name);
      if (n != nullptr && (std::strcmp(n, ".plt") == 0 || std::strcmp(n, ".plt.sec") == 0 ||
                           std::strcmp(n, ".plt.got") == 0))
        out.plt.emplace_back(sh.sh_addr, sh.sh_addr + sh.sh_size);
    }
    // The dynamic linker's relocations are the allocated ones.
    if (sh.sh_type == SHT_RELA && (sh.sh_flags & SHF_ALLOC) && sh.sh_entsize != 0)
      read_rela(elf, scn, sh, &out);
  }
  return out;
}

IfuncChoice find_ifunc_implementation(pid_t pid, const IfuncSymbol& sym,
                                      const IfuncObjects& objects, ResolvedSymbol* impl) {
  const uintptr_t resolver = sym.bias + sym.resolver;
  IfuncChoice how = IfuncChoice::kUnknown;
  auto take = [&](uintptr_t value, IfuncChoice source) {
    if (how != IfuncChoice::kUnknown || value == 0 || value == resolver) return;
    if (objects.function_at(value, impl)) how = source;
  };
  const ProcessMemory mem(pid);
  uintptr_t value = 0;
  // What the dynamic linker stored. First the defining object's own IRELATIVE slots for
  // this resolver (libc calls its string functions through them): filled at load time.
  std::vector<uintptr_t> slots;
  (void)objects.slots(sym.object, [&](uintptr_t bias, const IfuncSlots& s) {
    for (const auto& [slot, res] : s.irelative)
      if (res == sym.resolver) slots.push_back(bias + slot);
  });
  for (uintptr_t slot : slots)
    if (mem.word(slot, &value)) take(value, IfuncChoice::kRelocation);
  // Then any object's slot bound to the symbol; a lazy JUMP_SLOT not called through yet
  // still points at the object's own PLT.
  const std::string bare(sym.full.substr(0, sym.full.find('@')));
  for (size_t i = 0; i < objects.count(); ++i) {
    if (how != IfuncChoice::kUnknown || pid <= 0) break;
    std::vector<uintptr_t> bound;
    std::vector<std::pair<uintptr_t, uintptr_t>> plt;
    const bool readable = objects.slots(i, [&](uintptr_t bias, const IfuncSlots& s) {
      auto [lo, hi] = s.by_name.equal_range(bare);
      for (auto it = lo; it != hi; ++it)
        if (binds_to(sym.full, it->second.version)) bound.push_back(bias + it->second.slot);
      for (const auto& [a, b] : s.plt) plt.emplace_back(bias + a, bias + b);
    });
    if (!readable) continue;
    for (uintptr_t slot : bound) {
      if (!mem.word(slot, &value)) continue;
      // Bound to this definition: into its object's code, where an interposer (a
      // preloaded memcpy, a sanitizer's) would have taken the slot elsewhere.
      if (!in_ranges(plt, value) && in_ranges(sym.code, value))
        take(value, IfuncChoice::kBinding);
    }
  }
  // Nothing holds it yet: what the resolver returns, run as the dynamic linker will run
  // it. In this very process, where the dynamic linker loaded the object; or in this
  // process's own copy of the same file, which the same CPU features and tunables make
  // choose the same code, moved by the difference of the load biases. Code of another
  // process is never run.
  if (how == IfuncChoice::kUnknown && pid > 0) {
    const bool ours = pid == getpid();
    uintptr_t own_bias = 0;
    if ((ours || same_tunables(pid)) &&
        own_load_bias(sym.dev, sym.inode, ours ? std::optional(sym.bias) : std::nullopt,
                      &own_bias)) {
      take(run_resolver(own_bias + sym.resolver) - own_bias + sym.bias, IfuncChoice::kCalled);
    }
  }
  return how;
}

std::string ifunc_note(const ResolvedSymbol& r) {
  switch (r.ifunc) {
    case IfuncChoice::kNone:
      return {};
    case IfuncChoice::kUnknown:
      return r.asked + std::string(kResolverSuffix) + ": implementation unknown";
    default:
      return r.asked;
  }
}

}  // namespace probefs::tracee
