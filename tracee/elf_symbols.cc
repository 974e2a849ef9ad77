#include "tracee/elf_symbols.h"

#include <elfutils/libdw.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <link.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace probefs::tracee {
namespace {

// Pointer encodings of .eh_frame (the LSB's DW_EH_PE_*); dwarf.h names only some of them.
constexpr uint8_t kPeAbsptr = 0x00;
constexpr uint8_t kPeOmit = 0xff;
constexpr uint8_t kPeFormatMask = 0x0f;
constexpr uint8_t kPeApplyMask = 0x70;
constexpr uint8_t kPePcrel = 0x10;

// Bounds on what we read from a target's memory, so a corrupt or hostile link map cannot
// keep us looping.
constexpr size_t kMaxDynamicEntries = 4096;
constexpr size_t kMaxLinkMapEntries = 65536;

bool init_libelf() {
  static const bool ok = elf_version(EV_CURRENT) != EV_NONE;
  return ok;
}

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

// The mappings of one loaded object: consecutive mappings of one file with non-decreasing
// file offsets (two segments can share a file page, so offsets may repeat). A second load of
// the same file (dlmopen) starts over at a lower offset.
struct MappingGroup {
  std::vector<Mapping> maps;  // address order
  bool has_exec = false;
};

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

std::string_view basename_of(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// Opens the file behind a mapping. The path in maps may no longer name that file (a library
// upgraded on disk, a deleted executable) or may live in another mount namespace, so when the
// inode does not match we try the kernel's handles on the mapped file itself.
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

// Load bias (run-time address minus ELF virtual address) from the object's lowest mapping.
// The kernel and ld.so map a PT_LOAD segment so that file offset p_offset lands at
// bias + p_vaddr, both rounded down to a page; any mapping inside the segment's file range
// therefore gives bias = map_start - map_offset - (p_vaddr - p_offset). This holds whatever
// the first segment's p_vaddr and p_offset are (non-PIE executables, -Ttext-segment,
// prelinked objects).
bool compute_load_bias(Elf* elf, const Mapping& first, uintptr_t* bias) {
  size_t count = 0;
  if (elf_getphdrnum(elf, &count) != 0) return false;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (size_t i = 0; i < count; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(elf, static_cast<int>(i), &ph) == nullptr) continue;
    if (ph.p_type != PT_LOAD || ph.p_filesz == 0) continue;
    uint64_t file_lo = ph.p_offset & ~(page - 1);
    if (first.offset < file_lo || first.offset >= ph.p_offset + ph.p_filesz) continue;
    *bias = first.start - first.offset - (ph.p_vaddr - ph.p_offset);
    return true;
  }
  return false;
}

struct FuncSymbol {
  uintptr_t value = 0;  // ELF virtual address
  uint64_t size = 0;
  uint32_t name = 0;    // offset into ElfObject::names
  uint8_t rank = 0;     // higher wins when several symbols share a name or an address
};

struct FdeRange {
  uintptr_t start = 0;  // ELF virtual addresses, [start, end)
  uintptr_t end = 0;
};

// One mapped ELF object. Its tables load on first use.
struct ElfObject {
  ~ElfObject() {
    if (elf != nullptr) elf_end(elf);
    if (fd >= 0) close(fd);
  }

  bool contains(uintptr_t addr) const {
    for (const auto& [lo, hi] : ranges) {
      if (lo <= addr && addr < hi) return true;
    }
    return false;
  }

  // Identity across reloads: the same file mapped at the same place.
  dev_t dev = 0;
  ino_t inode = 0;
  uintptr_t first_start = 0;
  uint64_t first_offset = 0;

  std::string path;
  std::string module;  // basename
  bool executable = false;
  uintptr_t bias = 0;
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges;  // run-time mappings
  int fd = -1;
  Elf* elf = nullptr;

  bool symbols_loaded = false;
  std::string names;                   // NUL-separated symbol names
  std::vector<FuncSymbol> by_addr;     // sorted by value
  std::vector<uintptr_t> max_end;      // max_end[i]: highest value + size in by_addr[0..i]
  std::unordered_map<std::string_view, uint32_t> by_name;  // -> index in by_addr
  std::deque<std::string> version_keys;  // "NAME@VERSION" of default versions (by_name keys)

  bool fdes_loaded = false;
  std::vector<FdeRange> fdes;  // sorted by start
};

std::unique_ptr<ElfObject> open_object(pid_t pid, const MappingGroup& g) {
  const Mapping& first = g.maps.front();
  auto o = std::make_unique<ElfObject>();
  o->dev = first.dev;
  o->inode = first.inode;
  o->first_start = first.start;
  o->first_offset = first.offset;
  o->path = first.path;
  o->module.assign(basename_of(first.path));
  for (const Mapping& m : g.maps) o->ranges.emplace_back(m.start, m.end);
  o->fd = open_mapped_file(pid, first);
  if (o->fd < 0) return nullptr;
  // Read, not mapped: a mapping of the object file would show in /proc/PID/maps beside
  // the object's own and confuse the next scan of this very process.
  o->elf = elf_begin(o->fd, ELF_C_READ, nullptr);
  if (o->elf == nullptr || elf_kind(o->elf) != ELF_K_ELF) return nullptr;
  GElf_Ehdr eh;
  if (gelf_getehdr(o->elf, &eh) == nullptr) return nullptr;
  if (eh.e_type != ET_EXEC && eh.e_type != ET_DYN) return nullptr;
  if (!compute_load_bias(o->elf, first, &o->bias)) return nullptr;
  return o;
}

uint8_t binding_rank(unsigned bind) {
  switch (bind) {
    case STB_GLOBAL:
    case STB_GNU_UNIQUE:
      return 3;
    case STB_WEAK:
      return 2;
    default:
      return 1;
  }
}

// Symbol versions of .dynsym (the GNU versioning sections): one 16-bit word per symbol in
// .gnu.version (SHT_GNU_versym, linked to the table), whose low 15 bits index a definition
// in .gnu.version_d (SHT_GNU_verdef) and whose top bit marks a hidden, non-default
// version: ld.so binds a new reference to `pthread_cond_signal` to the one version without
// it (GLIBC_2.3.2), while GLIBC_2.2.5 is kept for programs linked before. Indexes 0 (local)
// and 1 (global, unversioned) and the definition flagged VER_FLG_BASE (the object's own
// name) carry no version.
struct DynsymVersions {
  Elf_Data* versym = nullptr;
  std::unordered_map<unsigned, std::string> names;  // definition index -> version name
};

DynsymVersions read_dynsym_versions(Elf* elf, size_t dynsym_index) {
  DynsymVersions v;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr) continue;
    if (sh.sh_type == SHT_GNU_versym && sh.sh_link == dynsym_index) {
      v.versym = elf_getdata(scn, nullptr);
    } else if (sh.sh_type == SHT_GNU_verdef) {
      Elf_Data* data = elf_getdata(scn, nullptr);
      if (data == nullptr) continue;
      // A chain of Verdef records, each with its names (Verdaux) after it; the first name
      // is the version's. Bounded by the section's declared count and its size.
      size_t off = 0;
      for (size_t n = 0; n < sh.sh_info && off < data->d_size; ++n) {
        GElf_Verdef def;
        if (gelf_getverdef(data, static_cast<int>(off), &def) == nullptr) break;
        GElf_Verdaux aux;
        if (!(def.vd_flags & VER_FLG_BASE) && def.vd_cnt > 0 &&
            gelf_getverdaux(data, static_cast<int>(off + def.vd_aux), &aux) != nullptr) {
          if (const char* name = elf_strptr(elf, sh.sh_link, aux.vda_name))
            v.names.emplace(def.vd_ndx, name);
        }
        if (def.vd_next == 0) break;
        off += def.vd_next;
      }
    }
  }
  return v;
}

// The name of .dynsym entry i as ld writes it into .symtab: "NAME@@VERSION" for the default
// version, "NAME@VERSION" for a hidden one, the bare name when it has no version.
std::string versioned_name(const DynsymVersions& v, size_t i, const char* name) {
  GElf_Versym word;
  if (v.versym == nullptr || gelf_getversym(v.versym, static_cast<int>(i), &word) == nullptr)
    return name;
  auto it = v.names.find(word & 0x7fff);
  if (it == v.names.end()) return name;
  return std::string(name) + ((word & 0x8000) ? "@" : "@@") + it->second;
}

// Appends the function symbols of one symbol table to o.by_addr and o.names. `dynamic`:
// the table is .dynsym, whose versions come from its versioning sections; `versioned_only`:
// only its versioned symbols.
void append_function_symbols(ElfObject& o, Elf_Scn* table, bool dynamic, bool versioned_only) {
  GElf_Shdr sh;
  if (gelf_getshdr(table, &sh) == nullptr || sh.sh_entsize == 0) return;
  Elf_Data* data = elf_getdata(table, nullptr);
  if (data == nullptr) return;
  // Section indexes beyond SHN_LORESERVE live in a companion SHT_SYMTAB_SHNDX section.
  Elf_Data* xdata = nullptr;
  const size_t table_index = elf_ndxscn(table);
  for (Elf_Scn* scn = elf_nextscn(o.elf, nullptr); scn != nullptr; scn = elf_nextscn(o.elf, scn)) {
    GElf_Shdr xsh;
    if (gelf_getshdr(scn, &xsh) != nullptr && xsh.sh_type == SHT_SYMTAB_SHNDX &&
        xsh.sh_link == table_index) {
      xdata = elf_getdata(scn, nullptr);
      break;
    }
  }

  const DynsymVersions versions =
      dynamic ? read_dynsym_versions(o.elf, table_index) : DynsymVersions{};
  const size_t count = sh.sh_size / sh.sh_entsize;
  std::string decorated;
  for (size_t i = 1; i < count; ++i) {
    GElf_Sym sym;
    Elf32_Word xndx = 0;
    if (gelf_getsymshndx(data, xdata, static_cast<int>(i), &sym, &xndx) == nullptr) continue;
    const unsigned type = GELF_ST_TYPE(sym.st_info);
    if (type != STT_FUNC && type != STT_GNU_IFUNC) continue;
    // Undefined symbols (imports, and the canonical PLT entries a non-PIE executable gives
    // to functions whose address it takes) and absolute ones are not code of this object.
    if (sym.st_shndx == SHN_UNDEF) continue;
    if (sym.st_shndx >= SHN_LORESERVE && sym.st_shndx != SHN_XINDEX) continue;
    const char* name = elf_strptr(o.elf, sh.sh_link, sym.st_name);
    if (name == nullptr || name[0] == '\0') continue;
    if (dynamic) {
      decorated = versioned_name(versions, i, name);
      name = decorated.c_str();
    }
    // "memcpy@@GLIBC_2.14" is the default version and answers to "memcpy"; "memcpy@GLIBC_2.2.5"
    // is an old one and only wins if it is alone.
    const char* at = std::strchr(name, '@');
    if (versioned_only && at == nullptr) continue;
    const bool default_version = at == nullptr || at[1] == '@';
    FuncSymbol f;
    f.value = sym.st_value;
    f.size = sym.st_size;
    f.name = static_cast<uint32_t>(o.names.size());
    f.rank = static_cast<uint8_t>(binding_rank(GELF_ST_BIND(sym.st_info)) +
                                  (default_version ? 4 : 0));
    o.names.append(name);
    o.names.push_back('\0');
    o.by_addr.push_back(f);
  }
}

// Reads the function symbols of .symtab and .dynsym. Each keeps its version in its name
// ("NAME@@VERSION", "NAME@VERSION"), which .symtab carries and .dynsym gets from its
// versioning sections.
void load_symbols(ElfObject& o) {
  if (o.symbols_loaded) return;
  o.symbols_loaded = true;
  Elf_Scn* symtab = nullptr;
  Elf_Scn* dynsym = nullptr;
  for (Elf_Scn* scn = elf_nextscn(o.elf, nullptr); scn != nullptr; scn = elf_nextscn(o.elf, scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr) continue;
    if (sh.sh_type == SHT_SYMTAB && symtab == nullptr) symtab = scn;
    if (sh.sh_type == SHT_DYNSYM && dynsym == nullptr) dynsym = scn;
  }
  if (symtab != nullptr) append_function_symbols(o, symtab, false, false);
  // .dynsym alone, or beside .symtab for the versions that only its versioning sections
  // record (ld writes "NAME@VERSION" into .symtab for .symver aliases, not for versions a
  // version script gives).
  if (dynsym != nullptr) append_function_symbols(o, dynsym, true, symtab != nullptr);

  std::stable_sort(o.by_addr.begin(), o.by_addr.end(),
                   [](const FuncSymbol& a, const FuncSymbol& b) { return a.value < b.value; });
  o.max_end.resize(o.by_addr.size());
  uintptr_t reach = 0;
  for (size_t i = 0; i < o.by_addr.size(); ++i) {
    reach = std::max<uintptr_t>(reach, o.by_addr[i].value + o.by_addr[i].size);
    o.max_end[i] = reach;
  }
  // The names are complete, so views into them stay valid.
  auto add_name = [&o](std::string_view key, uint32_t index) {
    auto [it, inserted] = o.by_name.emplace(key, index);
    if (!inserted && o.by_addr[index].rank > o.by_addr[it->second].rank) it->second = index;
  };
  // Keys: "NAME" (the default version, as ld.so binds it), "NAME@VERSION" for every version,
  // and "NAME@@VERSION" for the default one, as it is spelled in .symtab.
  for (size_t i = 0; i < o.by_addr.size(); ++i) {
    std::string_view full(o.names.data() + o.by_addr[i].name);
    size_t at = full.find('@');
    add_name(full.substr(0, at), static_cast<uint32_t>(i));
    if (at == std::string_view::npos) continue;
    add_name(full, static_cast<uint32_t>(i));
    if (full.substr(at).starts_with("@@")) {
      // A deque never moves its strings, so the view stays valid.
      o.version_keys.push_back(std::string(full.substr(0, at)) + std::string(full.substr(at + 1)));
      add_name(o.version_keys.back(), static_cast<uint32_t>(i));
    }
  }
}

// How a symbol is named to a reader (describe, `kprobes/list`): the default version by its
// bare name, as `SYM` resolves it; another version keeps "@VERSION", which resolves back.
std::string display_name(std::string_view full) {
  const size_t at = full.find("@@");
  return std::string(full.substr(0, at));
}

// The best sized function symbol covering `vaddr`: the innermost one, then the one with the
// strongest binding (a global FUNC over its local aliases).
const FuncSymbol* covering_symbol(const ElfObject& o, uintptr_t vaddr) {
  auto it = std::upper_bound(o.by_addr.begin(), o.by_addr.end(), vaddr,
                             [](uintptr_t a, const FuncSymbol& s) { return a < s.value; });
  const FuncSymbol* best = nullptr;
  for (size_t i = static_cast<size_t>(it - o.by_addr.begin()); i-- > 0;) {
    if (o.max_end[i] <= vaddr) break;  // nothing at or before i reaches vaddr
    const FuncSymbol& s = o.by_addr[i];
    if (s.size == 0 || s.value + s.size <= vaddr) continue;
    if (best == nullptr || s.value > best->value ||
        (s.value == best->value &&
         (s.size < best->size || (s.size == best->size && s.rank > best->rank)))) {
      best = &s;
    }
  }
  return best;
}

// A function symbol that starts exactly at `vaddr`, to name code bounded by an FDE.
const FuncSymbol* symbol_at(const ElfObject& o, uintptr_t vaddr) {
  auto it = std::lower_bound(o.by_addr.begin(), o.by_addr.end(), vaddr,
                             [](const FuncSymbol& s, uintptr_t a) { return s.value < a; });
  const FuncSymbol* best = nullptr;
  for (; it != o.by_addr.end() && it->value == vaddr; ++it) {
    if (best == nullptr || it->rank > best->rank) best = &*it;
  }
  return best;
}

// Reads a value in one of the DW_EH_PE formats; returns false for formats code addresses
// never use. Byte order follows the object (`msb`).
bool read_encoded(const uint8_t*& p, const uint8_t* end, uint8_t format, bool elf64, bool msb,
                  uint64_t* out) {
  auto fixed = [&](size_t n, bool is_signed) {
    if (static_cast<size_t>(end - p) < n) return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) {
      uint64_t byte = p[msb ? i : n - 1 - i];
      v = (v << 8) | byte;
    }
    if (is_signed && n < 8 && (v >> (8 * n - 1)) != 0) v |= ~uint64_t{0} << (8 * n);
    p += n;
    *out = v;
    return true;
  };
  auto leb = [&](bool is_signed) {
    uint64_t v = 0;
    unsigned shift = 0;
    uint8_t byte = 0;
    do {
      if (p >= end || shift >= 64) return false;
      byte = *p++;
      v |= uint64_t{byte & 0x7fu} << shift;
      shift += 7;
    } while (byte & 0x80);
    if (is_signed && shift < 64 && (byte & 0x40)) v |= ~uint64_t{0} << shift;
    *out = v;
    return true;
  };
  switch (format) {
    case 0x00: return fixed(elf64 ? 8 : 4, false);  // absptr
    case 0x01: return leb(false);                   // uleb128
    case 0x02: return fixed(2, false);
    case 0x03: return fixed(4, false);
    case 0x04: return fixed(8, false);
    case 0x09: return leb(true);                    // sleb128
    case 0x0a: return fixed(2, true);
    case 0x0b: return fixed(4, true);
    case 0x0c: return fixed(8, true);
    default: return false;
  }
}

// The encoding of an FDE's initial_location, from its CIE's augmentation ('R').
uint8_t fde_pointer_encoding(const Dwarf_CIE& cie, bool elf64, bool msb) {
  const char* aug = cie.augmentation;
  if (aug == nullptr || aug[0] == '\0') return kPeAbsptr;
  if (aug[0] != 'z' || cie.augmentation_data == nullptr) return kPeOmit;
  const uint8_t* p = cie.augmentation_data;
  const uint8_t* end = p + cie.augmentation_data_size;
  for (const char* a = aug + 1; *a != '\0'; ++a) {
    switch (*a) {
      case 'R':
        return p < end ? *p : kPeOmit;
      case 'L':  // LSDA encoding byte
        ++p;
        break;
      case 'P': {  // personality: encoding byte, then a pointer in that encoding
        if (p >= end) return kPeOmit;
        uint8_t enc = *p++;
        uint64_t ignored;
        if (!read_encoded(p, end, enc & kPeFormatMask, elf64, msb, &ignored)) return kPeOmit;
        break;
      }
      case 'S':  // signal frame
      case 'B':  // AArch64 BTI
        break;
      default:
        return kPeOmit;
    }
  }
  return kPeAbsptr;
}

// Builds the table of FDE ranges of .eh_frame. We decode the FDEs' own initial_location and
// address_range because libdw's frame queries (dwarf_frame_info) narrow [start, end) to the
// CFA row around the address, not to the whole function.
void load_fdes(ElfObject& o) {
  if (o.fdes_loaded) return;
  o.fdes_loaded = true;
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(o.elf, &shstrndx) != 0) return;
  Elf_Scn* eh_frame = nullptr;
  GElf_Shdr sh;
  for (Elf_Scn* scn = elf_nextscn(o.elf, nullptr); scn != nullptr; scn = elf_nextscn(o.elf, scn)) {
    if (gelf_getshdr(scn, &sh) == nullptr || sh.sh_type != SHT_PROGBITS) continue;
    const char* name = elf_strptr(o.elf, shstrndx, sh.sh_name);
    if (name != nullptr && std::strcmp(name, ".eh_frame") == 0) {
      eh_frame = scn;
      break;
    }
  }
  if (eh_frame == nullptr) return;
  Elf_Data* data = elf_getdata(eh_frame, nullptr);
  const unsigned char* ident = reinterpret_cast<const unsigned char*>(elf_getident(o.elf, nullptr));
  if (data == nullptr || data->d_buf == nullptr || ident == nullptr) return;
  const bool elf64 = ident[EI_CLASS] == ELFCLASS64;
  const bool msb = ident[EI_DATA] == ELFDATA2MSB;
  const auto* base = static_cast<const uint8_t*>(data->d_buf);
  const uint8_t* section_end = base + data->d_size;

  std::unordered_map<Dwarf_Off, uint8_t> cie_encoding;
  auto encoding_of = [&](Dwarf_Off cie_offset) -> uint8_t {
    auto it = cie_encoding.find(cie_offset);
    if (it != cie_encoding.end()) return it->second;
    Dwarf_CFI_Entry entry;
    Dwarf_Off next;
    uint8_t enc = kPeOmit;
    if (dwarf_next_cfi(ident, data, true, cie_offset, &next, &entry) == 0 &&
        dwarf_cfi_cie_p(&entry)) {
      enc = fde_pointer_encoding(entry.cie, elf64, msb);
    }
    cie_encoding.emplace(cie_offset, enc);
    return enc;
  };

  Dwarf_Off offset = 0;
  while (offset != static_cast<Dwarf_Off>(-1) && offset < data->d_size) {
    Dwarf_CFI_Entry entry;
    Dwarf_Off next = static_cast<Dwarf_Off>(-1);
    int r = dwarf_next_cfi(ident, data, true, offset, &next, &entry);
    if (r > 0) break;
    if (r < 0) {
      if (next == static_cast<Dwarf_Off>(-1) || next <= offset) break;
      offset = next;
      continue;
    }
    offset = next;
    if (dwarf_cfi_cie_p(&entry)) continue;  // decoded on demand by encoding_of
    const uint8_t enc = encoding_of(entry.fde.CIE_pointer);
    if (enc == kPeOmit) continue;
    const uint8_t* p = entry.fde.start;
    if (p < base || p >= section_end) continue;
    const uint64_t field_vaddr = sh.sh_addr + static_cast<uint64_t>(p - base);
    uint64_t start, range;
    if (!read_encoded(p, section_end, enc & kPeFormatMask, elf64, msb, &start)) continue;
    if (!read_encoded(p, section_end, enc & kPeFormatMask, elf64, msb, &range)) continue;
    switch (enc & kPeApplyMask) {
      case 0:
        break;
      case kPePcrel:
        start += field_vaddr;
        break;
      default:
        continue;  // datarel and friends are not used for code addresses in .eh_frame
    }
    if (!elf64) start &= 0xffffffffu;
    if (range == 0) continue;
    o.fdes.push_back({static_cast<uintptr_t>(start), static_cast<uintptr_t>(start + range)});
  }
  std::sort(o.fdes.begin(), o.fdes.end(),
            [](const FdeRange& a, const FdeRange& b) { return a.start < b.start; });
}

const FdeRange* covering_fde(ElfObject& o, uintptr_t vaddr) {
  load_fdes(o);
  auto it = std::upper_bound(o.fdes.begin(), o.fdes.end(), vaddr,
                             [](uintptr_t a, const FdeRange& f) { return a < f.start; });
  if (it == o.fdes.begin()) return nullptr;
  --it;
  return vaddr < it->end ? &*it : nullptr;
}

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

// The l_ld (address of the object's dynamic section) of every entry of the dynamic
// linker's link map, in load order: the executable's DT_DEBUG points to r_debug, whose
// r_map heads the list. Empty when the list cannot be read (a static executable, another
// ELF class, no permission); the caller then keeps the order of the mappings.
std::vector<uintptr_t> read_link_map(pid_t pid, const ElfObject& exe) {
  std::vector<uintptr_t> out;
  if (gelf_getclass(exe.elf) != (sizeof(void*) == 8 ? ELFCLASS64 : ELFCLASS32)) return out;
  size_t count = 0;
  if (elf_getphdrnum(exe.elf, &count) != 0) return out;
  uintptr_t dynamic = 0;
  size_t dyn_entries = 0;
  for (size_t i = 0; i < count; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(exe.elf, static_cast<int>(i), &ph) != nullptr && ph.p_type == PT_DYNAMIC) {
      dynamic = exe.bias + ph.p_vaddr;
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

// "libc.so.6" answers to "libc.so.6" (2: exact), and to "libc.so" and "libc" (1);
// "libfoo-1.2.so" also to "libfoo". 0: no match.
int module_match(std::string_view basename, std::string_view mod) {
  if (basename == mod) return 2;
  size_t so = basename.find(".so");
  while (so != std::string_view::npos) {
    size_t after = so + 3;
    if (after == basename.size() || basename[after] == '.') break;
    so = basename.find(".so", after);
  }
  if (so == std::string_view::npos) return 0;
  std::string_view stem = basename.substr(0, so);
  if (mod == basename.substr(0, so + 3) || mod == stem) return 1;
  size_t dash = stem.rfind('-');
  if (dash != std::string_view::npos && dash + 1 < stem.size() &&
      stem[dash + 1] >= '0' && stem[dash + 1] <= '9' &&
      stem.find('.', dash) != std::string_view::npos && mod == stem.substr(0, dash)) {
    return 1;
  }
  return 0;
}

// SYM or MOD:SYM. Blanks, control characters and a second ':' never occur in a symbol or
// object name, so they mark a malformed request rather than an unknown symbol.
int split_name(std::string_view name, std::string_view* mod, std::string_view* sym) {
  for (char c : name) {
    auto u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u == 0x7f) return -EINVAL;
  }
  size_t colon = name.find(':');
  if (colon == std::string_view::npos) {
    *mod = {};
    *sym = name;
  } else {
    *mod = name.substr(0, colon);
    *sym = name.substr(colon + 1);
    if (mod->empty()) return -EINVAL;
  }
  if (sym->empty() || sym->find(':') != std::string_view::npos) return -EINVAL;
  return 0;
}

}  // namespace

struct ProcessSymbols::Impl {
  pid_t pid = 0;
  mutable std::mutex mu;  // guards objects and their lazily loaded tables; any thread
  std::vector<std::unique_ptr<ElfObject>> objects;  // search order

  int scan();
  void fill(ElfObject& o, const FuncSymbol* sym, uintptr_t vaddr, ResolvedSymbol* out) const;
};

// Reads the mappings and orders the objects: executable, link map, then the rest in address
// order. Objects unchanged since the previous scan are kept with their parsed tables.
int ProcessSymbols::Impl::scan() {
  std::vector<Mapping> maps;
  if (int err = read_maps(pid, &maps); err != 0) return err;
  std::vector<MappingGroup> groups = group_mappings(std::move(maps));

  char exe_link[64];
  std::snprintf(exe_link, sizeof exe_link, "/proc/%d/exe", static_cast<int>(pid));
  struct stat exe_st;
  const bool have_exe_st = stat(exe_link, &exe_st) == 0;
  char exe_path[4096];
  ssize_t exe_len = readlink(exe_link, exe_path, sizeof exe_path - 1);
  std::string_view exe_name;
  if (exe_len > 0) {
    exe_name = std::string_view(exe_path, static_cast<size_t>(exe_len));
    if (exe_name.ends_with(" (deleted)")) exe_name.remove_suffix(10);
  }

  std::vector<std::unique_ptr<ElfObject>> old = std::move(objects);
  std::vector<std::unique_ptr<ElfObject>> found;
  for (const MappingGroup& g : groups) {
    // Only objects with code matter; this also skips data files such as locale archives.
    if (!g.has_exec) continue;
    const Mapping& first = g.maps.front();
    std::unique_ptr<ElfObject> o;
    for (auto& prev : old) {
      if (prev && prev->dev == first.dev && prev->inode == first.inode &&
          prev->first_start == first.start && prev->first_offset == first.offset &&
          prev->path == first.path) {
        o = std::move(prev);
        break;
      }
    }
    if (!o) o = open_object(pid, g);
    if (!o) continue;
    o->ranges.clear();
    for (const Mapping& m : g.maps) o->ranges.emplace_back(m.start, m.end);
    o->executable = false;
    found.push_back(std::move(o));
  }

  // The executable: same file as /proc/PID/exe; by path where device numbers disagree.
  ElfObject* exe = nullptr;
  for (auto& o : found) {
    if (have_exe_st && o->dev == exe_st.st_dev && o->inode == exe_st.st_ino) {
      exe = o.get();
      break;
    }
  }
  if (exe == nullptr && !exe_name.empty()) {
    for (auto& o : found) {
      if (o->path == exe_name) {
        exe = o.get();
        break;
      }
    }
  }

  // Search order keys: 0 executable, 1 + link-map position, then after all of those the
  // position in the mappings.
  std::vector<size_t> key(found.size(), 0);
  const size_t unlinked = kMaxLinkMapEntries + 2;
  for (size_t i = 0; i < found.size(); ++i) key[i] = unlinked + i;
  if (exe != nullptr) {
    exe->executable = true;
    std::vector<uintptr_t> lds = read_link_map(pid, *exe);
    for (size_t n = 0; n < lds.size(); ++n) {
      for (size_t i = 0; i < found.size(); ++i) {
        if (key[i] >= unlinked && found[i]->contains(lds[n])) {
          key[i] = 1 + n;
          break;
        }
      }
    }
    for (size_t i = 0; i < found.size(); ++i) {
      if (found[i].get() == exe) key[i] = 0;
    }
  }
  std::vector<size_t> order(found.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key[a] < key[b]; });
  objects.clear();
  for (size_t i : order) objects.push_back(std::move(found[i]));
  return 0;
}

void ProcessSymbols::Impl::fill(ElfObject& o, const FuncSymbol* sym, uintptr_t vaddr,
                                ResolvedSymbol* out) const {
  out->module = o.executable ? std::string() : o.module;
  out->path = o.path;
  out->addr = vaddr + o.bias;
  out->name = sym != nullptr ? display_name(o.names.data() + sym->name) : std::string();
  if (sym != nullptr && sym->size > 0) {
    out->function = {sym->value + o.bias, sym->value + sym->size + o.bias};
  } else if (const FdeRange* fde = covering_fde(o, vaddr)) {
    out->function = {fde->start + o.bias, fde->end + o.bias};
  } else {
    out->function = {out->addr, out->addr};
  }
}

ProcessSymbols::ProcessSymbols(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessSymbols::~ProcessSymbols() = default;

std::unique_ptr<ProcessSymbols> ProcessSymbols::load(pid_t pid, int* err) {
  int ignored;
  if (err == nullptr) err = &ignored;
  if (!init_libelf()) {
    *err = -ENOSYS;
    return nullptr;
  }
  if (pid <= 0) {
    *err = -ESRCH;
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  impl->pid = pid;
  if (int r = impl->scan(); r != 0) {
    *err = r;
    return nullptr;
  }
  *err = 0;
  return std::unique_ptr<ProcessSymbols>(new ProcessSymbols(std::move(impl)));
}

pid_t ProcessSymbols::pid() const { return impl_->pid; }

int ProcessSymbols::reload() {
  std::lock_guard lock(impl_->mu);
  return impl_->scan();
}

int ProcessSymbols::resolve(std::string_view name, ResolvedSymbol* out) const {
  std::string_view mod, sym;
  if (int err = split_name(name, &mod, &sym); err != 0) return err;
  std::lock_guard lock(impl_->mu);
  // With a module, objects that carry exactly that basename go before those that only
  // match without their version suffix.
  const int passes = mod.empty() ? 1 : 2;
  for (int pass = 0; pass < passes; ++pass) {
    for (auto& o : impl_->objects) {
      if (!mod.empty() && module_match(o->module, mod) != 2 - pass) continue;
      load_symbols(*o);
      auto it = o->by_name.find(sym);
      if (it == o->by_name.end()) continue;
      const FuncSymbol& s = o->by_addr[it->second];
      // For a GNU_IFUNC symbol this is the resolver's address, as the kernel's kallsyms
      // lookup gives the symbol's own address: the implementation the resolver picks is
      // only known after it runs and would be a different function.
      impl_->fill(*o, &s, s.value, out);
      out->name.assign(sym);
      return 0;
    }
  }
  return -ENOENT;
}

int ProcessSymbols::describe(uintptr_t addr, ResolvedSymbol* out) const {
  std::lock_guard lock(impl_->mu);
  for (auto& o : impl_->objects) {
    if (!o->contains(addr)) continue;
    const uintptr_t vaddr = addr - o->bias;
    load_symbols(*o);
    if (const FuncSymbol* s = covering_symbol(*o, vaddr)) {
      impl_->fill(*o, s, s->value, out);
      return 0;
    }
    // No sized symbol (stripped object, or assembly without .size): the FDE bounds the
    // function; a symbol that starts exactly there still names it.
    if (const FdeRange* fde = covering_fde(*o, vaddr)) {
      impl_->fill(*o, symbol_at(*o, fde->start), fde->start, out);
      out->function = {fde->start + o->bias, fde->end + o->bias};
      return 0;
    }
    return -ENOENT;
  }
  return -ENOENT;
}

std::vector<MappedObject> ProcessSymbols::objects() const {
  std::lock_guard lock(impl_->mu);
  std::vector<MappedObject> out;
  for (const auto& o : impl_->objects) {
    MappedObject m;
    m.path = o->path;
    m.module = o->module;
    m.executable = o->executable;
    m.load_bias = o->bias;
    m.start = o->ranges.empty() ? 0 : o->ranges.front().first;
    m.end = o->ranges.empty() ? 0 : o->ranges.back().second;
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace probefs::tracee
