#include "tracee/elf_symbols.h"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <compare>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "tracee/eh_frame.h"
#include "tracee/elf_versions.h"
#include "tracee/ifunc.h"
#include "tracee/link_map.h"
#include "tracee/proc_maps.h"

namespace probefs::tracee {
namespace {

bool init_libelf() {
  static const bool ok = elf_version(EV_CURRENT) != EV_NONE;
  return ok;
}

std::string_view basename_of(std::string_view path) {
  size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

struct ElfSymbol {
  uintptr_t value = 0;  // ELF virtual address
  uint64_t size = 0;
  uint32_t name = 0;    // offset into SymbolTable::names
  uint8_t rank = 0;     // higher wins when several symbols share a name or an address
  bool ifunc = false;   // STT_GNU_IFUNC: value is the resolver
};

// The symbols of one kind that an object defines, from .symtab and .dynsym together. Each
// keeps its version in its name ("NAME@@VERSION", "NAME@VERSION"), which .symtab carries
// and .dynsym gets from its versioning sections.
struct SymbolTable {
  std::string names;                // NUL-separated symbol names
  std::vector<ElfSymbol> by_addr;   // sorted by value
  std::unordered_map<std::string_view, uint32_t> by_name;  // -> index in by_addr
  std::deque<std::string> version_keys;  // "NAME@VERSION" of default versions (by_name keys)
  // Names several local symbols have at different addresses (static functions of
  // different sources): where no global one has the name, it names no one function.
  std::unordered_set<std::string_view> ambiguous;
};

// Which symbols a SymbolTable keeps.
enum class SymbolKind : uint8_t {
  kFunction,  // STT_FUNC, STT_GNU_IFUNC
  // STT_OBJECT and STT_COMMON: variables with an address of their own. Not STT_TLS, whose
  // value is an offset into each thread's block: no one address names the variable.
  kData,
};

// One ELF object's file, or its bytes for an object given as bytes (load_image): what
// does not depend on where a process maps it. A file is shared by every ProcessSymbols
// whose process maps it (FileCache below); each process's view of it is an ElfObject.
// Its tables load on first use.
//
// Touched by any thread that calls a ProcessSymbols holding the file. The members above
// `mu` are set before the file is shared and never change; `mu` guards `elf` and
// everything below it, because libelf reads sections on demand and libdw's CFI readers
// keep caches, neither of them thread-safe, and the tables load lazily.
struct ElfFile {
  ~ElfFile() {
    if (elf != nullptr) elf_end(elf);
    if (fd >= 0) close(fd);
  }

  int fd = -1;
  dev_t dev = 0;                 // of the file opened (fstat), where there is one
  ino_t inode = 0;
  std::vector<char> image;       // the bytes elf reads, for objects given as bytes
  std::vector<GElf_Phdr> loads;  // the PT_LOAD program headers, in file order

  std::mutex mu;
  Elf* elf = nullptr;

  bool functions_loaded = false;
  SymbolTable functions;
  std::vector<uintptr_t> max_end;  // max_end[i]: highest value + size in functions.by_addr[0..i]

  // Variables, for `@SYM` fetch arguments only: a table of their own, read the first time
  // one is looked up, so that function lookups neither pay for them nor see them.
  bool data_loaded = false;
  SymbolTable data;

  EhFrame eh_frame;  // FDE ranges and landing pads, read on first use

  // Parts GCC split off a function ("foo.cold" for "foo"): the indexes in functions.by_addr
  // of the sized ones, by the name of the function they belong to. Built on first use.
  bool split_parts_loaded = false;
  std::unordered_map<std::string_view, std::vector<uint32_t>> split_parts;

  // Names for the local functions of an object without .symtab, from its separate debug
  // file (found by build-id): describe() only, where the object's own tables name
  // nothing. Read on first use; empty when no debug file is installed.
  bool has_symtab = false;  // set with `functions`
  bool debug_loaded = false;
  SymbolTable debug_functions;
  std::vector<uintptr_t> debug_max_end;

  // The slots that IFUNC resolution reads back (tracee/ifunc.h), read on first use.
  bool ifunc_slots_loaded = false;
  IfuncSlots ifunc_slots;

  // The USDT points of its SDT notes (.note.stapsdt), read on first use.
  bool sdt_loaded = false;
  std::vector<SdtNote> sdt;
};

// Takes `elf` (begun on f's fd or image) into f when it is an object a process maps
// (ET_EXEC or ET_DYN) and reads its program headers. Before f is shared: no lock.
bool begin_file(ElfFile& f, Elf* elf) {
  f.elf = elf;
  if (f.elf == nullptr || elf_kind(f.elf) != ELF_K_ELF) return false;
  GElf_Ehdr eh;
  if (gelf_getehdr(f.elf, &eh) == nullptr) return false;
  if (eh.e_type != ET_EXEC && eh.e_type != ET_DYN) return false;
  size_t count = 0;
  if (elf_getphdrnum(f.elf, &count) != 0) return false;
  for (size_t i = 0; i < count; ++i) {
    GElf_Phdr ph;
    if (gelf_getphdr(f.elf, static_cast<int>(i), &ph) == nullptr) continue;
    if (ph.p_type == PT_LOAD) f.loads.push_back(ph);
  }
  return true;
}

// What names the contents of an opened file: its inode, and its size and modification
// time, so that a file rewritten in place is another file to us.
struct FileKey {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  time_t mtime_sec = 0;
  long mtime_nsec = 0;
  auto operator<=>(const FileKey&) const = default;
};

// The object files the ProcessSymbols of this process use, by the identity of the file
// opened. Weak: a file is parsed once while any ProcessSymbols holds it (dozens of traced
// processes map the same libc, fork children the same executable) and closed with the
// last. Objects given as bytes are never in it.
//
// Lock order: a ProcessSymbols' mutex, then `mu`; an ElfFile's mutex is never held while
// `mu` is taken, nor the reverse.
struct FileCache {
  std::mutex mu;  // guards files; taken by scans of any thread
  std::map<FileKey, std::weak_ptr<ElfFile>> files;

  // For elf_file_cache_stats(): monotonic, read without mu.
  std::atomic<uint64_t> files_parsed{0};
  std::atomic<uint64_t> symbol_tables_read{0};
  std::atomic<uint64_t> data_tables_read{0};
};

FileCache& file_cache() {
  // Never destroyed: the process-wide self resolver may still scan while static
  // destructors run.
  static FileCache* const cache = new FileCache;
  return *cache;
}

// The parsed file behind `fd`, which it takes over: the one already shared when some
// ProcessSymbols holds the same file, else parsed now. nullptr when it is no object a
// process maps.
std::shared_ptr<ElfFile> shared_file(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return nullptr;
  }
  const FileKey key{st.st_dev, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec};
  FileCache& cache = file_cache();
  // Parsing under the lock keeps two scans from parsing one file twice; it reads only the
  // headers (the tables load on first use, under the file's own lock).
  std::lock_guard lock(cache.mu);
  if (auto it = cache.files.find(key); it != cache.files.end()) {
    if (std::shared_ptr<ElfFile> shared = it->second.lock()) {
      close(fd);
      return shared;
    }
  }
  auto f = std::make_shared<ElfFile>();
  f->fd = fd;
  f->dev = st.st_dev;
  f->inode = st.st_ino;
  // Read, not mapped: a mapping of the object file would show in /proc/PID/maps beside
  // the object's own and confuse the next scan of this very process.
  if (!begin_file(*f, elf_begin(fd, ELF_C_READ, nullptr))) return nullptr;
  // Files that no ProcessSymbols holds any more leave with the next newcomer.
  std::erase_if(cache.files, [](const auto& entry) { return entry.second.expired(); });
  cache.files[key] = f;
  cache.files_parsed.fetch_add(1, std::memory_order_relaxed);
  return f;
}

// Load bias (run-time address minus ELF virtual address) from the object's lowest mapping.
// The kernel and ld.so map a PT_LOAD segment so that file offset p_offset lands at
// bias + p_vaddr, both rounded down to a page; any mapping inside the segment's file range
// therefore gives bias = map_start - map_offset - (p_vaddr - p_offset). This holds whatever
// the first segment's p_vaddr and p_offset are (non-PIE executables, -Ttext-segment,
// prelinked objects).
bool compute_load_bias(const ElfFile& f, const Mapping& first, uintptr_t* bias) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (const GElf_Phdr& ph : f.loads) {
    if (ph.p_filesz == 0) continue;
    uint64_t file_lo = ph.p_offset & ~(page - 1);
    if (first.offset < file_lo || first.offset >= ph.p_offset + ph.p_filesz) continue;
    *bias = first.start - first.offset - (ph.p_vaddr - ph.p_offset);
    return true;
  }
  return false;
}

// One ELF object as one process maps it: where, and the file behind it.
struct ElfObject {
  bool contains(uintptr_t addr) const {
    for (const auto& [lo, hi] : ranges) {
      if (lo <= addr && addr < hi) return true;
    }
    return false;
  }
  bool contains_code(uintptr_t addr) const {
    for (const auto& [lo, hi] : code) {
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
  std::vector<std::pair<uintptr_t, uintptr_t>> code;    // those of them that are executable
  // The file, or none where the mapped inode cannot be read (`error`, from
  // open_mapped_file: -ESTALE when it was deleted or replaced). Such an object keeps its
  // place in the search order, so that a name it might define is refused, not looked up
  // in the objects after it.
  std::shared_ptr<ElfFile> file;
  int error = 0;
};

// Whether process pid has an ELF header at mapping m: the file's offset 0, "\177ELF".
bool maps_elf_header(pid_t pid, const Mapping& m) {
  if (m.offset != 0) return false;
  char file[64];
  std::snprintf(file, sizeof file, "/proc/%d/mem", static_cast<int>(pid));
  const int fd = open(file, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  unsigned char magic[SELFMAG];
  const bool read = pread(fd, magic, sizeof magic, static_cast<off_t>(m.start)) == SELFMAG;
  close(fd);
  return read && std::memcmp(magic, ELFMAG, SELFMAG) == 0;
}

// The object of mapping group g: with its file, or without one and the reason (`error`)
// where the mapped file cannot be read; nullptr where the file is no ELF object a process
// maps (nothing to resolve in it).
std::unique_ptr<ElfObject> open_object(pid_t pid, const MappingGroup& g) {
  const Mapping& first = g.maps.front();
  auto o = std::make_unique<ElfObject>();
  o->dev = first.dev;
  o->inode = first.inode;
  o->first_start = first.start;
  o->first_offset = first.offset;
  o->path = first.path;
  o->module.assign(basename_of(first.path));
  const int fd = open_mapped_file(pid, first);
  if (fd < 0) {
    // Kept, to refuse lookups, only where the process maps an ELF object there: its
    // header at offset 0. Code in memory of no object (a JIT's memfd, shared memory:
    // "deleted" too) is skipped, as an object that does not parse is.
    if (!maps_elf_header(pid, first)) return nullptr;
    o->error = fd;
    return o;
  }
  o->file = shared_file(fd);
  if (!o->file) return nullptr;
  if (!compute_load_bias(*o->file, first, &o->bias)) return nullptr;
  return o;
}
// From here to the ProcessSymbols methods, a function given an ElfFile reads or loads its
// lazily loaded members: the caller holds the file's mutex.

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

// The name of .dynsym entry i as ld writes it into .symtab: "NAME@@VERSION" for the default
// version, "NAME@VERSION" for a hidden one, the bare name when it has no version.
std::string versioned_name(const DynsymVersions& v, size_t i, const char* name) {
  bool hidden = false;
  const std::string* version = version_of(v, i, &hidden);
  if (version == nullptr) return name;
  return std::string(name) + (hidden ? "@" : "@@") + *version;
}

bool is_kind(unsigned type, SymbolKind kind) {
  switch (kind) {
    case SymbolKind::kFunction:
      return type == STT_FUNC || type == STT_GNU_IFUNC;
    case SymbolKind::kData:
      return type == STT_OBJECT || type == STT_COMMON;
  }
  return false;
}

// Appends the symbols of `kind` of one symbol table to t's by_addr and names. `dynamic`:
// the table is .dynsym, whose versions come from its versioning sections; `versioned_only`:
// only its versioned symbols.
void append_symbols(Elf* elf, Elf_Scn* table, SymbolKind kind, bool dynamic,
                    bool versioned_only, SymbolTable* t) {
  GElf_Shdr sh;
  if (gelf_getshdr(table, &sh) == nullptr || sh.sh_entsize == 0) return;
  Elf_Data* data = elf_getdata(table, nullptr);
  if (data == nullptr) return;
  // Section indexes beyond SHN_LORESERVE live in a companion SHT_SYMTAB_SHNDX section.
  Elf_Data* xdata = nullptr;
  const size_t table_index = elf_ndxscn(table);
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr xsh;
    if (gelf_getshdr(scn, &xsh) != nullptr && xsh.sh_type == SHT_SYMTAB_SHNDX &&
        xsh.sh_link == table_index) {
      xdata = elf_getdata(scn, nullptr);
      break;
    }
  }

  const DynsymVersions versions =
      dynamic ? read_dynsym_versions(elf, table_index) : DynsymVersions{};
  const size_t count = sh.sh_size / sh.sh_entsize;
  std::string decorated;
  for (size_t i = 1; i < count; ++i) {
    GElf_Sym sym;
    Elf32_Word xndx = 0;
    if (gelf_getsymshndx(data, xdata, static_cast<int>(i), &sym, &xndx) == nullptr) continue;
    if (!is_kind(GELF_ST_TYPE(sym.st_info), kind)) continue;
    // Undefined symbols (imports, and the canonical PLT entries a non-PIE executable gives
    // to functions whose address it takes) and absolute ones are not code or data of this
    // object, nor is a common symbol, which only a relocatable file has. A variable that
    // the executable copied out of a library (R_X86_64_COPY) is defined in the executable,
    // and that copy is the one the whole process uses.
    if (sym.st_shndx == SHN_UNDEF) continue;
    if (sym.st_shndx >= SHN_LORESERVE && sym.st_shndx != SHN_XINDEX) continue;
    const char* name = elf_strptr(elf, sh.sh_link, sym.st_name);
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
    ElfSymbol es;
    es.value = sym.st_value;
    es.size = sym.st_size;
    es.name = static_cast<uint32_t>(t->names.size());
    es.rank = static_cast<uint8_t>(binding_rank(GELF_ST_BIND(sym.st_info)) +
                                   (default_version ? 4 : 0));
    es.ifunc = GELF_ST_TYPE(sym.st_info) == STT_GNU_IFUNC;
    t->names.append(name);
    t->names.push_back('\0');
    t->by_addr.push_back(es);
  }
}

// Sorts t's symbols by address and indexes them by name.
void index_symbols(SymbolTable* t) {
  std::stable_sort(t->by_addr.begin(), t->by_addr.end(),
                   [](const ElfSymbol& a, const ElfSymbol& b) { return a.value < b.value; });
  // The names are complete, so views into them stay valid.
  auto local = [](const ElfSymbol& e) { return (e.rank & 3) == 1; };  // binding_rank's
  auto add_name = [&](std::string_view key, uint32_t index) {
    auto [it, inserted] = t->by_name.emplace(key, index);
    if (inserted) return;
    const ElfSymbol& have = t->by_addr[it->second];
    const ElfSymbol& now = t->by_addr[index];
    if (local(have) && local(now) && have.value != now.value) t->ambiguous.insert(key);
    if (now.rank > have.rank) it->second = index;
  };
  // Keys: "NAME" (the default version, as ld.so binds it), "NAME@VERSION" for every version,
  // and "NAME@@VERSION" for the default one, as it is spelled in .symtab.
  for (size_t i = 0; i < t->by_addr.size(); ++i) {
    std::string_view full(t->names.data() + t->by_addr[i].name);
    size_t at = full.find('@');
    add_name(full.substr(0, at), static_cast<uint32_t>(i));
    if (at == std::string_view::npos) continue;
    add_name(full, static_cast<uint32_t>(i));
    if (full.substr(at).starts_with("@@")) {
      // A deque never moves its strings, so the view stays valid.
      t->version_keys.push_back(std::string(full.substr(0, at)) +
                                std::string(full.substr(at + 1)));
      add_name(t->version_keys.back(), static_cast<uint32_t>(i));
    }
  }
}

// Reads the symbols of `kind` of .symtab and .dynsym into t, sorted by address and indexed
// by name. Whether the object has a .symtab.
bool read_symbols(Elf* elf, SymbolKind kind, SymbolTable* t) {
  Elf_Scn* symtab = nullptr;
  Elf_Scn* dynsym = nullptr;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr) continue;
    if (sh.sh_type == SHT_SYMTAB && symtab == nullptr) symtab = scn;
    if (sh.sh_type == SHT_DYNSYM && dynsym == nullptr) dynsym = scn;
  }
  if (symtab != nullptr) append_symbols(elf, symtab, kind, false, false, t);
  // .dynsym alone, or beside .symtab for the versions that only its versioning sections
  // record (ld writes "NAME@VERSION" into .symtab for .symver aliases, not for versions a
  // version script gives).
  if (dynsym != nullptr) append_symbols(elf, dynsym, kind, true, symtab != nullptr, t);
  index_symbols(t);
  return symtab != nullptr;
}

// How far the functions before each one in `t` reach: max_end[i] is the highest
// value + size of t.by_addr[0..i] (covering()).
std::vector<uintptr_t> reach_of(const SymbolTable& t) {
  std::vector<uintptr_t> max_end(t.by_addr.size());
  uintptr_t reach = 0;
  for (size_t i = 0; i < t.by_addr.size(); ++i) {
    const ElfSymbol& s = t.by_addr[i];
    reach = std::max<uintptr_t>(reach, s.value + s.size);
    max_end[i] = reach;
  }
  return max_end;
}

// The function table, and how far the functions before each one reach (covering_symbol).
void load_symbols(ElfFile& f) {
  if (f.functions_loaded) return;
  f.functions_loaded = true;
  if (f.fd >= 0) file_cache().symbol_tables_read.fetch_add(1, std::memory_order_relaxed);
  f.has_symtab = read_symbols(f.elf, SymbolKind::kFunction, &f.functions);
  f.max_end = reach_of(f.functions);
}

// The table of variables: only `@SYM` lookups (resolve_data) read it.
void load_data_symbols(ElfFile& f) {
  if (f.data_loaded) return;
  f.data_loaded = true;
  if (f.fd >= 0) file_cache().data_tables_read.fetch_add(1, std::memory_order_relaxed);
  read_symbols(f.elf, SymbolKind::kData, &f.data);
}

// The USDT points of f (SystemTap SDT notes: owner "stapsdt", type 3), at their link-time
// addresses moved by what .stapsdt.base moved when the object was prelinked. A note that
// does not read as one is skipped. Requires f.mu.
void load_sdt_notes(ElfFile& f) {
  if (f.sdt_loaded) return;
  f.sdt_loaded = true;
  constexpr uint32_t kStapsdtNote = 3;
  uint64_t base_now = 0;
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(f.elf, &shstrndx) == 0) {
    for (Elf_Scn* scn = elf_nextscn(f.elf, nullptr); scn; scn = elf_nextscn(f.elf, scn)) {
      GElf_Shdr sh;
      const char* name = gelf_getshdr(scn, &sh) ? elf_strptr(f.elf, shstrndx, sh.sh_name) : nullptr;
      if (name && std::strcmp(name, ".stapsdt.base") == 0) base_now = sh.sh_addr;
    }
  }
  for (Elf_Scn* scn = elf_nextscn(f.elf, nullptr); scn; scn = elf_nextscn(f.elf, scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr || sh.sh_type != SHT_NOTE) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data == nullptr || data->d_buf == nullptr) continue;
    const char* bytes = static_cast<const char*>(data->d_buf);
    GElf_Nhdr nh;
    size_t name_at = 0, desc_at = 0;
    for (size_t at = 0, next; (next = gelf_getnote(data, at, &nh, &name_at, &desc_at)) != 0;
         at = next) {
      if (nh.n_type != kStapsdtNote || nh.n_namesz != sizeof "stapsdt" ||
          std::memcmp(bytes + name_at, "stapsdt", sizeof "stapsdt") != 0 || nh.n_descsz < 24)
        continue;
      const char* desc = bytes + desc_at;
      SdtNote n;
      uint64_t base = 0;
      std::memcpy(&n.pc, desc, 8);
      std::memcpy(&base, desc + 8, 8);
      std::memcpy(&n.semaphore, desc + 16, 8);
      // Three NUL-terminated strings: provider, name, arguments.
      std::string* parts[] = {&n.provider, &n.name, &n.args};
      size_t p = 24;
      bool whole = true;
      for (std::string* part : parts) {
        const void* nul = p < nh.n_descsz ? std::memchr(desc + p, '\0', nh.n_descsz - p) : nullptr;
        if (nul == nullptr) {
          whole = false;
          break;
        }
        const size_t len = static_cast<size_t>(static_cast<const char*>(nul) - (desc + p));
        part->assign(desc + p, len);
        p += len + 1;
      }
      if (!whole) continue;
      if (base_now != 0 && base != 0) {
        n.pc += base_now - base;
        if (n.semaphore != 0) n.semaphore += base_now - base;
      }
      f.sdt.push_back(std::move(n));
    }
  }
}

// The separate debug file of an object, where distributions install them by build-id
// (/usr/lib/debug/.build-id/xx/yyyy.debug), or "" when it has no build-id. Debian's -dbg
// and -dbgsym packages put the symbol table that stripping removed there, local
// functions included, at the object's own addresses.
std::string debug_file_path(Elf* elf) {
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr sh;
    if (gelf_getshdr(scn, &sh) == nullptr || sh.sh_type != SHT_NOTE) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data == nullptr || data->d_buf == nullptr) continue;
    GElf_Nhdr nh;
    size_t name_at = 0, desc_at = 0;
    for (size_t at = 0, next; (next = gelf_getnote(data, at, &nh, &name_at, &desc_at)) != 0;
         at = next) {
      const auto* bytes = static_cast<const unsigned char*>(data->d_buf);
      if (nh.n_type != NT_GNU_BUILD_ID || nh.n_namesz != 4 ||
          std::memcmp(bytes + name_at, "GNU", 4) != 0 || nh.n_descsz < 2 || nh.n_descsz > 64)
        continue;
      static constexpr char kHex[] = "0123456789abcdef";
      std::string path = "/usr/lib/debug/.build-id/";
      for (size_t i = 0; i < nh.n_descsz; ++i) {
        if (i == 1) path += '/';
        path += kHex[bytes[desc_at + i] >> 4];
        path += kHex[bytes[desc_at + i] & 15];
      }
      return path + ".debug";
    }
  }
  return {};
}

// The functions of f's debug file (describe()'s names for a stripped object's local code).
void load_debug_names(ElfFile& f) {
  if (f.debug_loaded) return;
  f.debug_loaded = true;
  load_symbols(f);
  // An object with .symtab names its local functions itself; one given as bytes is read
  // alone.
  if (f.has_symtab || f.fd < 0) return;
  const std::string path = debug_file_path(f.elf);
  if (path.empty()) return;
  // A root-owned tree, but never a wait or an unbounded read: a regular file of bounded
  // size only (distributions link .build-id entries to the files, so links are followed).
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > kMaxMappedFileBytes) {
    close(fd);
    return;
  }
  if (Elf* elf = elf_begin(fd, ELF_C_READ, nullptr)) {
    if (elf_kind(elf) == ELF_K_ELF) {
      for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
        GElf_Shdr sh;
        if (gelf_getshdr(scn, &sh) == nullptr || sh.sh_type != SHT_SYMTAB) continue;
        append_symbols(elf, scn, SymbolKind::kFunction, false, false, &f.debug_functions);
        break;
      }
      index_symbols(&f.debug_functions);
      f.debug_max_end = reach_of(f.debug_functions);
    }
    elf_end(elf);
  }
  close(fd);
}

// The slots IFUNC resolution reads back (tracee/ifunc.h).
void load_ifunc_slots(ElfFile& f) {
  if (f.ifunc_slots_loaded) return;
  f.ifunc_slots_loaded = true;
  f.ifunc_slots = read_ifunc_slots(f.elf);
}

// The symbol that `name` (bare or with a version) stands for in t, or nullptr.
const ElfSymbol* named(const SymbolTable& t, std::string_view name) {
  auto it = t.by_name.find(name);
  return it == t.by_name.end() ? nullptr : &t.by_addr[it->second];
}

// Whether `name` stands for no one function of t: local symbols of several addresses
// have it, and no global one.
bool ambiguous(const SymbolTable& t, std::string_view name) {
  if (!t.ambiguous.count(name)) return false;
  const ElfSymbol* s = named(t, name);
  return s != nullptr && (s->rank & 3) == 1;
}

// How a symbol is named to a reader (describe, `kprobes/list`): the default version by its
// bare name, as `SYM` resolves it; another version keeps "@VERSION", which resolves back.
std::string display_name(std::string_view full) {
  // Only a default version's "@@VERSION" goes; any other '@' stays, as the name is indexed.
  const size_t at = full.find('@');
  if (at != std::string_view::npos && full.compare(at, 2, "@@") == 0)
    return std::string(full.substr(0, at));
  return std::string(full);
}

// The best sized symbol of t covering `vaddr` (max_end: reach_of(t)): the innermost one,
// then the one with the strongest binding (a global FUNC over its local aliases).
const ElfSymbol* covering(const SymbolTable& t, const std::vector<uintptr_t>& max_end,
                          uintptr_t vaddr) {
  auto it = std::upper_bound(t.by_addr.begin(), t.by_addr.end(), vaddr,
                             [](uintptr_t a, const ElfSymbol& s) { return a < s.value; });
  const ElfSymbol* best = nullptr;
  for (size_t i = static_cast<size_t>(it - t.by_addr.begin()); i-- > 0;) {
    if (max_end[i] <= vaddr) break;  // nothing at or before i reaches vaddr
    const ElfSymbol& s = t.by_addr[i];
    if (s.size == 0 || s.value + s.size <= vaddr) continue;
    if (best == nullptr || s.value > best->value ||
        (s.value == best->value &&
         (s.size < best->size || (s.size == best->size && s.rank > best->rank)))) {
      best = &s;
    }
  }
  return best;
}

const ElfSymbol* covering_symbol(const ElfFile& f, uintptr_t vaddr) {
  return covering(f.functions, f.max_end, vaddr);
}

// A symbol of t that starts exactly at `vaddr`, to name code bounded by an FDE.
const ElfSymbol* starting_at(const SymbolTable& t, uintptr_t vaddr) {
  auto it = std::lower_bound(t.by_addr.begin(), t.by_addr.end(), vaddr,
                             [](const ElfSymbol& s, uintptr_t a) { return s.value < a; });
  const ElfSymbol* best = nullptr;
  for (; it != t.by_addr.end() && it->value == vaddr; ++it) {
    if (best == nullptr || it->rank > best->rank) best = &*it;
  }
  return best;
}

const ElfSymbol* symbol_at(const ElfFile& f, uintptr_t vaddr) {
  return starting_at(f.functions, vaddr);
}

const FdeRange* covering_fde(ElfFile& f, uintptr_t vaddr) {
  f.eh_frame.load(f.elf);
  return f.eh_frame.covering(vaddr);
}

// GCC moves the unlikely blocks of `foo` into `foo.cold` (older GCCs: `foo.cold.N`), which
// may jump back into foo. The stem of such a name, or npos.
size_t split_suffix(std::string_view name) {
  for (size_t at = name.find(".cold"); at != std::string_view::npos;
       at = name.find(".cold", at + 1)) {
    const size_t after = at + 5;
    if (at > 0 && (after == name.size() || name[after] == '.')) return at;
  }
  return std::string_view::npos;
}

void load_split_parts(ElfFile& f) {
  if (f.split_parts_loaded) return;
  f.split_parts_loaded = true;
  for (size_t i = 0; i < f.functions.by_addr.size(); ++i) {
    const ElfSymbol& s = f.functions.by_addr[i];
    std::string_view name(f.functions.names.data() + s.name);
    const size_t at = split_suffix(name);
    if (at != std::string_view::npos && s.size > 0) {
      f.split_parts[name.substr(0, at)].push_back(static_cast<uint32_t>(i));
    }
  }
}

// The other parts of the function `sym` belongs to: foo's cold parts, or foo and its other
// cold parts for a cold part. Static functions of the same name in several sources make
// this a superset, which only adds code to check.
std::vector<const ElfSymbol*> related_parts(ElfFile& f, const ElfSymbol& sym) {
  load_split_parts(f);
  std::vector<const ElfSymbol*> out;
  std::string_view name(f.functions.names.data() + sym.name);
  name = name.substr(0, name.find('@'));
  std::string_view stem = name;
  if (const size_t at = split_suffix(name); at != std::string_view::npos) {
    stem = name.substr(0, at);
    auto hot = f.functions.by_name.find(stem);
    if (hot != f.functions.by_name.end() && f.functions.by_addr[hot->second].size > 0) {
      out.push_back(&f.functions.by_addr[hot->second]);
    }
  }
  if (auto it = f.split_parts.find(stem); it != f.split_parts.end()) {
    for (uint32_t i : it->second) {
      if (&f.functions.by_addr[i] != &sym) out.push_back(&f.functions.by_addr[i]);
    }
  }
  return out;
}

// [lo, hi) (ELF virtual addresses) at run time, with the ways into it that its own code
// does not show: the landing pads inside it and the parts split off from it.
void function_bounds(ElfFile& f, uintptr_t bias, uintptr_t lo, uintptr_t hi,
                     const ElfSymbol* sym, FunctionBounds* out) {
  *out = FunctionBounds{};
  out->start = lo + bias;
  out->end = hi + bias;
  if (lo >= hi) return;
  f.eh_frame.load(f.elf);
  std::vector<uint64_t> pads;
  f.eh_frame.landing_pads_in(lo, hi, &pads);
  for (uint64_t pad : pads) out->landing_pads.push_back(static_cast<uintptr_t>(pad) + bias);
  if (sym == nullptr) return;
  for (const ElfSymbol* part : related_parts(f, *sym)) {
    out->related.push_back({part->value + bias, part->value + part->size + bias});
  }
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

// The index of one process's objects; it answers IFUNC resolution (tracee/ifunc.h) for
// them.
struct ProcessSymbols::Impl : IfuncObjects {
  pid_t pid = 0;
  // Guards objects and each object's own members; any thread. The files behind the
  // objects have their own locks, taken after this one.
  mutable std::mutex mu;
  std::vector<std::unique_ptr<ElfObject>> objects;  // search order

  int scan(const std::vector<Mapping>* given = nullptr);
  // Offers each object that `mod` names (any object when empty) in search order to
  // found(object, file), with the file's mutex held, until found returns true. With a
  // module, objects that carry exactly that basename go before those that only match
  // without their version suffix. An object whose file cannot be read ends the search
  // where it stands, unanswered: *blocked is its error. Requires mu.
  template <class Found>
  bool search(std::string_view mod, Found&& found, int* blocked) const {
    *blocked = 0;
    const int passes = mod.empty() ? 1 : 2;
    for (int pass = 0; pass < passes; ++pass) {
      for (const auto& o : objects) {
        if (!mod.empty() && module_match(o->module, mod) != 2 - pass) continue;
        if (!o->file) {
          *blocked = o->error;
          return false;
        }
        ElfFile& f = *o->file;
        std::lock_guard file_lock(f.mu);
        if (found(*o, f)) return true;
      }
    }
    return false;
  }
  // Names the code at vaddr (by sym) and bounds its function: by `bounded_by` when given,
  // else by sym's size, else by the FDE around vaddr. Requires o.file->mu.
  void fill(const ElfObject& o, const ElfSymbol* sym, uintptr_t vaddr, ResolvedSymbol* out,
            const FdeRange* bounded_by = nullptr) const;
  // describe() in one object that contains addr. Requires o.file->mu.
  bool describe_in(const ElfObject& o, uintptr_t addr, ResolvedSymbol* out) const;
  // describe() of any object. Requires mu, not the files' mutexes.
  bool describe_any(uintptr_t addr, ResolvedSymbol* out) const;
  // IfuncObjects, over `objects`. Each requires mu, not the files' mutexes.
  size_t count() const override { return objects.size(); }
  bool slots(size_t i,
             const std::function<void(uintptr_t bias, const IfuncSlots&)>& use) const override;
  bool function_at(uintptr_t addr, ResolvedSymbol* out) const override;
  // resolve() of the IFUNC symbol `sym` (its full name `full`) of `def`, asked as
  // `asked`: its implementation (find_ifunc_implementation), else its resolver. Requires
  // mu, not the files' mutexes.
  void resolve_ifunc(const ElfObject& def, const ElfSymbol& sym, const std::string& full,
                     std::string_view asked, ResolvedSymbol* out) const;
};

// Reads the mappings and orders the objects: executable, link map, then the rest in address
// order. Objects unchanged since the previous scan are kept with their parsed tables.
int ProcessSymbols::Impl::scan(const std::vector<Mapping>* given) {
  std::vector<Mapping> maps;
  if (given) maps = *given;
  else if (int err = read_maps(pid, &maps); err != 0) return err;
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
      if (prev && prev->file && prev->dev == first.dev && prev->inode == first.inode &&
          prev->first_start == first.start && prev->first_offset == first.offset &&
          prev->path == first.path) {
        o = std::move(prev);
        break;
      }
    }
    if (!o) o = open_object(pid, g);
    if (!o) continue;
    o->ranges.clear();
    o->code.clear();
    for (const Mapping& m : g.maps) {
      o->ranges.emplace_back(m.start, m.end);
      if (m.exec) o->code.emplace_back(m.start, m.end);
    }
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
    std::vector<uintptr_t> lds;
    if (exe->file) {
      std::lock_guard file_lock(exe->file->mu);  // read_link_map reads the ELF headers
      lds = read_link_map(pid, exe->file->elf, exe->bias);
    }
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

void ProcessSymbols::Impl::fill(const ElfObject& o, const ElfSymbol* sym, uintptr_t vaddr,
                                ResolvedSymbol* out, const FdeRange* bounded_by) const {
  ElfFile& f = *o.file;
  out->module = o.executable ? std::string() : o.module;
  out->path = o.path;
  out->addr = vaddr + o.bias;
  out->name = sym != nullptr ? display_name(f.functions.names.data() + sym->name) : std::string();
  if (bounded_by == nullptr && (sym == nullptr || sym->size == 0)) {
    bounded_by = covering_fde(f, vaddr);
  }
  if (bounded_by != nullptr) {
    function_bounds(f, o.bias, bounded_by->start, bounded_by->end, sym, &out->function);
  } else if (sym != nullptr && sym->size > 0) {
    function_bounds(f, o.bias, sym->value, sym->value + sym->size, sym, &out->function);
  } else {
    out->function = {out->addr, out->addr};
  }
  out->ifunc = IfuncChoice::kNone;
  out->resolver = 0;
  out->asked.clear();
}

bool ProcessSymbols::Impl::describe_in(const ElfObject& o, uintptr_t addr,
                                       ResolvedSymbol* out) const {
  const uintptr_t vaddr = addr - o.bias;
  ElfFile& f = *o.file;
  load_symbols(f);
  if (const ElfSymbol* s = covering_symbol(f, vaddr)) {
    fill(o, s, s->value, out);
    return true;
  }
  // No sized symbol (stripped object, or assembly without .size): the FDE bounds the
  // function; a symbol that starts exactly there still names it, one of the object's own
  // or, for a stripped object, one of its debug file.
  if (const FdeRange* fde = covering_fde(f, vaddr)) {
    fill(o, symbol_at(f, fde->start), fde->start, out, fde);
    if (out->name.empty()) {
      load_debug_names(f);
      if (const ElfSymbol* d = starting_at(f.debug_functions, fde->start))
        out->name = display_name(f.debug_functions.names.data() + d->name);
    }
    return true;
  }
  // Code no FDE covers either: a sized function of the debug file bounds it.
  load_debug_names(f);
  if (const ElfSymbol* d = covering(f.debug_functions, f.debug_max_end, vaddr)) {
    fill(o, nullptr, d->value, out);
    out->name = display_name(f.debug_functions.names.data() + d->name);
    function_bounds(f, o.bias, d->value, d->value + d->size, nullptr, &out->function);
    return true;
  }
  return false;
}

bool ProcessSymbols::Impl::describe_any(uintptr_t addr, ResolvedSymbol* out) const {
  for (const auto& o : objects) {
    if (!o->contains(addr)) continue;
    if (!o->file) return false;
    std::lock_guard file_lock(o->file->mu);
    return describe_in(*o, addr, out);
  }
  return false;
}

bool ProcessSymbols::Impl::function_at(uintptr_t addr, ResolvedSymbol* out) const {
  for (const auto& o : objects) {
    if (!o->contains_code(addr)) continue;
    if (!o->file) return false;
    std::lock_guard file_lock(o->file->mu);
    return describe_in(*o, addr, out) && out->addr == addr && out->function.start == addr;
  }
  return false;
}

bool ProcessSymbols::Impl::slots(
    size_t i, const std::function<void(uintptr_t bias, const IfuncSlots&)>& use) const {
  const ElfObject& o = *objects[i];
  if (!o.file) return false;
  std::lock_guard file_lock(o.file->mu);
  load_ifunc_slots(*o.file);
  use(o.bias, o.file->ifunc_slots);
  return true;
}

void ProcessSymbols::Impl::resolve_ifunc(const ElfObject& def, const ElfSymbol& sym,
                                         const std::string& full, std::string_view asked,
                                         ResolvedSymbol* out) const {
  IfuncSymbol s;
  s.full = full;
  s.resolver = sym.value;
  s.object = static_cast<size_t>(
      std::find_if(objects.begin(), objects.end(), [&](const auto& o) { return o.get() == &def; }) -
      objects.begin());
  s.bias = def.bias;
  s.dev = def.file->dev;
  s.inode = def.file->inode;
  s.code = def.code;
  ResolvedSymbol impl;
  const IfuncChoice how = find_ifunc_implementation(pid, s, *this, &impl);
  if (how != IfuncChoice::kUnknown) {
    *out = std::move(impl);
  } else {
    // Not known (a library mapped but not relocated yet, an implementation outside every
    // object, such as the vDSO's): the resolver, which ifunc_note says.
    std::lock_guard file_lock(def.file->mu);
    fill(def, &sym, sym.value, out);
    out->name.assign(asked);
  }
  out->ifunc = how;
  out->resolver = def.bias + sym.value;
  out->asked.assign(asked);
}

ProcessSymbols::ProcessSymbols(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ProcessSymbols::~ProcessSymbols() = default;

std::unique_ptr<ProcessSymbols> ProcessSymbols::load(pid_t pid, int* err,
                                                     const std::vector<Mapping>* maps) {
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
  {
    // Nobody else sees impl yet; the lock states what scan() requires.
    std::lock_guard lock(impl->mu);
    if (int r = impl->scan(maps); r != 0) {
      *err = r;
      return nullptr;
    }
  }
  *err = 0;
  return std::unique_ptr<ProcessSymbols>(new ProcessSymbols(std::move(impl)));
}

std::unique_ptr<ProcessSymbols> ProcessSymbols::fork_of(const ProcessSymbols& parent,
                                                        pid_t child) {
  if (child <= 0 || parent.impl_->pid <= 0) return nullptr;  // load_image's have no process
  auto impl = std::make_unique<Impl>();
  impl->pid = child;
  {
    std::lock_guard lock(parent.impl_->mu);
    for (const auto& o : parent.impl_->objects)
      impl->objects.push_back(std::make_unique<ElfObject>(*o));
  }
  return std::unique_ptr<ProcessSymbols>(new ProcessSymbols(std::move(impl)));
}

pid_t ProcessSymbols::pid() const { return impl_->pid; }

int ProcessSymbols::reload(const std::vector<Mapping>* maps) {
  std::lock_guard lock(impl_->mu);
  return impl_->scan(maps);
}

int ProcessSymbols::resolve(std::string_view name, ResolvedSymbol* out) const {
  std::string_view mod, sym;
  if (int err = split_name(name, &mod, &sym); err != 0) return err;
  std::lock_guard lock(impl_->mu);
  if (sym == kResolverSuffix) {
    // The resolver of no name: malformed, unless a nameless symbol has a version so named.
    const int err = resolve_locked(mod, sym, sym, false, out);
    return err == -ENOENT ? -EINVAL : err;
  }
  if (sym.ends_with(kResolverSuffix)) {
    // An IFUNC's resolver; else, where SYM is no IFUNC, a version named "resolver".
    std::string_view bare = sym.substr(0, sym.size() - kResolverSuffix.size());
    if (resolve_locked(mod, bare, sym, true, out) == 0) return 0;
    *out = ResolvedSymbol{};
  }
  return resolve_locked(mod, sym, sym, false, out);
}

int ProcessSymbols::resolve_locked(std::string_view mod, std::string_view sym,
                                   std::string_view asked, bool want_resolver,
                                   ResolvedSymbol* out) const {
  if (sym.empty()) return -EINVAL;
  // The first object that defines SYM, as for any symbol; an IFUNC found there is
  // resolved further once its file's lock is released (resolve_ifunc reads other files).
  const ElfObject* ifunc_object = nullptr;
  ElfSymbol ifunc_symbol;
  std::string ifunc_name;
  bool not_ifunc = false;
  bool not_unique = false;
  int blocked = 0;
  // The objects' own tables first, in search order; only a name none of them has is
  // looked for among the local functions of their debug files (a stripped library's
  // static functions: libc's foo.isra.0), as the kernel finds any function of kallsyms.
  bool debug = false;
  auto find = [&](const ElfObject& o, ElfFile& f) {
    load_symbols(f);
    if (debug) load_debug_names(f);
    const SymbolTable& table = debug ? f.debug_functions : f.functions;
    const ElfSymbol* s = named(table, sym);
    if (s == nullptr) return false;
    if (ambiguous(table, sym)) {
      not_unique = true;
      return true;
    }
    if (!s->ifunc || want_resolver || o.file->fd < 0) {
      impl_->fill(o, s, s->value, out);
      out->name.assign(sym);
    }
    if (!s->ifunc) {
      not_ifunc = want_resolver;
    } else if (want_resolver) {
      out->ifunc = IfuncChoice::kResolver;
      out->resolver = out->addr;
      out->asked.assign(asked);
    } else if (o.file->fd < 0) {
      // An object given as bytes: no process, no implementation.
      out->ifunc = IfuncChoice::kUnknown;
      out->resolver = out->addr;
      out->asked.assign(asked);
    } else {
      ifunc_object = &o;
      ifunc_symbol = *s;
      ifunc_name = table.names.data() + s->name;
    }
    return true;
  };
  bool found = impl_->search(mod, find, &blocked);
  if (!found && blocked == 0 && !want_resolver) {
    debug = true;
    found = impl_->search(mod, find, &blocked);
  }
  if (blocked != 0) return blocked;
  if (not_unique) return -EADDRNOTAVAIL;
  if (!found || not_ifunc) return -ENOENT;  // `SYM@resolver` of a plain function: none
  if (ifunc_object != nullptr)
    impl_->resolve_ifunc(*ifunc_object, ifunc_symbol, ifunc_name, sym, out);
  return 0;
}

int ProcessSymbols::resolve_data(std::string_view name, uint64_t* addr) const {
  std::string_view mod, sym;
  if (int err = split_name(name, &mod, &sym); err != 0) return err;
  std::unique_lock lock(impl_->mu);
  bool ifunc = false;
  int blocked = 0;
  const bool found = impl_->search(mod, [&](const ElfObject& o, ElfFile& f) {
    load_data_symbols(f);
    load_symbols(f);
    const ElfSymbol* s = named(f.data, sym);
    // One name for a variable and a function in one object: static ones of different
    // sources in .symtab. The stronger binding wins, as among functions; a tie goes to the
    // variable, which is what `@SYM` is for.
    const ElfSymbol* fn = named(f.functions, sym);
    if (fn != nullptr && (s == nullptr || fn->rank > s->rank)) s = fn;
    if (s == nullptr) return false;
    ifunc = s == fn && fn->ifunc;
    *addr = s->value + o.bias;
    return true;
  }, &blocked);
  if (blocked != 0) return blocked;
  if (!found) return -ENOENT;
  if (ifunc) {
    // The address the program has for it, as resolve() finds it.
    lock.unlock();
    ResolvedSymbol r;
    if (int err = resolve(name, &r); err != 0) return err;
    *addr = r.addr;
  }
  return 0;
}

int ProcessSymbols::sdt_points(std::string_view mod, std::string_view provider,
                               std::string_view name, std::vector<SdtPoint>* out) const {
  out->clear();
  std::lock_guard lock(impl_->mu);
  int blocked = 0;
  const bool found = impl_->search(mod, [&](const ElfObject& o, ElfFile& f) {
    load_sdt_notes(f);
    for (const SdtNote& n : f.sdt) {
      if (n.provider != provider || n.name != name) continue;
      SdtPoint pt;
      pt.addr = n.pc + o.bias;
      pt.semaphore = n.semaphore != 0 ? n.semaphore + o.bias : 0;
      pt.args = n.args;
      out->push_back(std::move(pt));
    }
    return !out->empty();
  }, &blocked);
  if (blocked != 0) return blocked;
  return found ? 0 : -ENOENT;
}

int ProcessSymbols::describe(uintptr_t addr, ResolvedSymbol* out) const {
  std::lock_guard lock(impl_->mu);
  return impl_->describe_any(addr, out) ? 0 : -ENOENT;
}

std::vector<MappedObject> ProcessSymbols::objects() const {
  std::lock_guard lock(impl_->mu);
  std::vector<MappedObject> out;
  for (const auto& o : impl_->objects) {
    MappedObject m;
    m.path = o->path;
    m.module = o->module;
    m.executable = o->executable;
    m.error = o->error;
    m.load_bias = o->bias;
    m.start = o->ranges.empty() ? 0 : o->ranges.front().first;
    m.end = o->ranges.empty() ? 0 : o->ranges.back().second;
    out.push_back(std::move(m));
  }
  return out;
}

bool ProcessSymbols::has_module(std::string_view mod) const {
  std::lock_guard lock(impl_->mu);
  for (const auto& o : impl_->objects) {
    if (module_match(o->module, mod) != 0) return true;
  }
  return false;
}

// An object given as bytes: one ElfObject with no mappings of its own, over a file of its
// own that no other ProcessSymbols shares.
std::unique_ptr<ProcessSymbols> ProcessSymbols::load_image(std::string_view bytes,
                                                           std::string_view path, int* err) {
  int ignored;
  if (err == nullptr) err = &ignored;
  if (!init_libelf()) {
    *err = -ENOSYS;
    return nullptr;
  }
  *err = -ENOEXEC;
  if (bytes.empty()) return nullptr;
  auto f = std::make_shared<ElfFile>();
  // libelf may convert the image in place, so it reads a private copy.
  f->image.assign(bytes.begin(), bytes.end());
  if (!begin_file(*f, elf_memory(f->image.data(), f->image.size()))) return nullptr;
  auto o = std::make_unique<ElfObject>();
  o->path.assign(path);
  o->module.assign(basename_of(path));
  for (const GElf_Phdr& ph : f->loads) {
    if (ph.p_memsz == 0 || ph.p_vaddr + ph.p_memsz < ph.p_vaddr) continue;
    o->ranges.emplace_back(ph.p_vaddr, ph.p_vaddr + ph.p_memsz);
    if (ph.p_flags & PF_X) o->code.emplace_back(ph.p_vaddr, ph.p_vaddr + ph.p_memsz);
  }
  o->file = std::move(f);
  auto impl = std::make_unique<Impl>();
  impl->objects.push_back(std::move(o));
  *err = 0;
  return std::unique_ptr<ProcessSymbols>(new ProcessSymbols(std::move(impl)));
}

ElfFileCacheStats elf_file_cache_stats() {
  FileCache& cache = file_cache();
  ElfFileCacheStats s;
  {
    std::lock_guard lock(cache.mu);
    for (const auto& [key, file] : cache.files) {
      if (!file.expired()) ++s.files;
    }
  }
  s.files_parsed = cache.files_parsed.load(std::memory_order_relaxed);
  s.symbol_tables_read = cache.symbol_tables_read.load(std::memory_order_relaxed);
  s.data_tables_read = cache.data_tables_read.load(std::memory_order_relaxed);
  return s;
}

}  // namespace probefs::tracee
