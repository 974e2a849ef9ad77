// ElfImage: an object's symbols, segments, build-id and debuglink read with libelf.
#include "tools/elf_image.h"

#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string_view>
#include <tuple>

#include "tools/demangle.h"
#include "tools/probe_spec.h"

namespace probefs::tools {
namespace {

// What .gnu.version, .gnu.version_d and .gnu.version_r say about .dynsym's entries.
struct Versions {
  Elf_Data* versym = nullptr;
  std::map<unsigned, std::string> names;  // version index -> name; the base version is absent
  std::set<unsigned> referenced;          // indices from .gnu.version_r: another object's
};

const char* section_string(Elf* elf, size_t section, size_t offset) {
  const char* s = elf_strptr(elf, section, offset);
  return s != nullptr ? s : "";
}

void read_verdef(Elf* elf, Elf_Scn* scn, Versions& v) {
  GElf_Shdr shdr;
  Elf_Data* data = elf_getdata(scn, nullptr);
  if (gelf_getshdr(scn, &shdr) == nullptr || data == nullptr) return;
  GElf_Verdef def;
  // Each step moves forward by a non-zero vd_next, so a corrupt chain ends at the data's end.
  for (size_t off = 0; gelf_getverdef(data, static_cast<int>(off), &def) != nullptr;
       off += def.vd_next) {
    GElf_Verdaux aux;
    if ((def.vd_flags & VER_FLG_BASE) == 0 &&
        gelf_getverdaux(data, static_cast<int>(off + def.vd_aux), &aux) != nullptr)
      v.names[def.vd_ndx] = section_string(elf, shdr.sh_link, aux.vda_name);
    if (def.vd_next == 0) break;
  }
}

void read_verneed(Elf* elf, Elf_Scn* scn, Versions& v) {
  GElf_Shdr shdr;
  Elf_Data* data = elf_getdata(scn, nullptr);
  if (gelf_getshdr(scn, &shdr) == nullptr || data == nullptr) return;
  GElf_Verneed need;
  for (size_t off = 0; gelf_getverneed(data, static_cast<int>(off), &need) != nullptr;
       off += need.vn_next) {
    GElf_Vernaux aux;
    size_t aoff = off + need.vn_aux;
    for (unsigned k = 0;
         k < need.vn_cnt && gelf_getvernaux(data, static_cast<int>(aoff), &aux) != nullptr;
         ++k, aoff += aux.vna_next) {
      const unsigned index = aux.vna_other & 0x7fff;
      v.names[index] = section_string(elf, shdr.sh_link, aux.vna_name);
      v.referenced.insert(index);
      if (aux.vna_next == 0) break;
    }
    if (need.vn_next == 0) break;
  }
}

// Calls FN(index, symbol, name) for every entry of symbol table SCN of ELF, in order.
template <class Fn>
void for_each_symbol(Elf* elf, Elf_Scn* scn, Fn&& fn) {
  GElf_Shdr shdr;
  Elf_Data* data = elf_getdata(scn, nullptr);
  if (gelf_getshdr(scn, &shdr) == nullptr || data == nullptr || shdr.sh_entsize == 0) return;
  const size_t count = shdr.sh_size / shdr.sh_entsize;
  for (size_t i = 0; i < count; ++i) {
    GElf_Sym sym;
    if (gelf_getsym(data, static_cast<int>(i), &sym) == nullptr) break;
    fn(i, sym, std::string_view(section_string(elf, shdr.sh_link, sym.st_name)));
  }
}

void read_symbols(Elf* elf, Elf_Scn* scn, const Versions* versions,
                  std::vector<ElfSymbol>& out) {
  for_each_symbol(elf, scn, [&](size_t i, const GElf_Sym& sym, std::string_view raw) {
    const int type = GELF_ST_TYPE(sym.st_info);
    if ((type != STT_FUNC && type != STT_GNU_IFUNC && type != STT_OBJECT) ||
        sym.st_shndx == SHN_UNDEF || raw.empty())
      return;
    ElfSymbol s;
    if (const size_t at = raw.find('@'); at != std::string_view::npos) {
      s.name = raw.substr(0, at);
      s.default_version = raw.substr(at).starts_with("@@");
      s.version = raw.substr(at + (s.default_version ? 2 : 1));
    } else {
      s.name = raw;
      GElf_Versym vs;
      if (versions != nullptr && versions->versym != nullptr &&
          gelf_getversym(versions->versym, static_cast<int>(i), &vs) != nullptr) {
        const unsigned index = vs & 0x7fff;
        if (auto it = versions->names.find(index); it != versions->names.end()) {
          s.version = it->second;
          s.default_version = (vs & 0x8000) == 0 && !versions->referenced.contains(index);
        }
      }
    }
    s.value = sym.st_value;
    s.size = sym.st_size;
    s.function = type != STT_OBJECT;
    s.ifunc = type == STT_GNU_IFUNC;
    s.global = GELF_ST_BIND(sym.st_info) != STB_LOCAL;
    out.push_back(std::move(s));
  });
}

// .gnu_debuglink: the file name, NUL-terminated and padded to 4 bytes, then the CRC-32.
void read_debuglink(Elf_Scn* scn, std::string& name, uint32_t& crc) {
  Elf_Data* data = elf_getdata(scn, nullptr);
  if (data == nullptr || data->d_buf == nullptr) return;
  const auto* bytes = static_cast<const unsigned char*>(data->d_buf);
  const size_t len = strnlen(reinterpret_cast<const char*>(bytes), data->d_size);
  const size_t crc_at = (len + 4) & ~size_t{3};
  if (len == 0 || crc_at + 4 > data->d_size) return;
  name.assign(reinterpret_cast<const char*>(bytes), len);
  // Only little-endian objects are opened.
  crc = uint32_t{bytes[crc_at]} | uint32_t{bytes[crc_at + 1]} << 8 |
        uint32_t{bytes[crc_at + 2]} << 16 | uint32_t{bytes[crc_at + 3]} << 24;
}

bool symbol_named(const ElfSymbol& s, std::string_view spec) {
  const size_t at = spec.find('@');
  if (at == std::string_view::npos) return s.name == spec;
  std::string_view version = spec.substr(at + 1);
  if (version.starts_with('@')) version.remove_prefix(1);
  return s.name == spec.substr(0, at) && s.version == version;
}

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? 0xedb88320u ^ (c >> 1) : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

}  // namespace

Result<std::unique_ptr<ElfImage>> ElfImage::open(const std::string& path) {
  char* real = realpath(path.c_str(), nullptr);
  if (real == nullptr) {
    const int err = errno;
    return make_error(-err, "Failed to get the absolute path of " + path + ": " + strerror(err));
  }
  std::unique_ptr<ElfImage> image(new ElfImage);
  image->path_ = real;
  free(real);
  const std::string& abs = image->path_;
  image->fd_ = ::open(abs.c_str(), O_RDONLY | O_CLOEXEC);
  if (image->fd_ < 0) {
    const int err = errno;
    return make_error(-err, "Failed to open " + abs + ": " + strerror(err));
  }
  struct stat st;
  const bool regular = fstat(image->fd_, &st) == 0 && S_ISREG(st.st_mode);
  if (elf_version(EV_CURRENT) == EV_NONE)
    return make_error(-EINVAL, std::string("libelf: ") + elf_errmsg(-1));
  if (regular) image->elf_ = elf_begin(image->fd_, ELF_C_READ_MMAP, nullptr);
  GElf_Ehdr ehdr;
  if (image->elf_ == nullptr || elf_kind(image->elf_) != ELF_K_ELF ||
      gelf_getehdr(image->elf_, &ehdr) == nullptr)
    return make_error(-ENOEXEC, "Failed to open " + abs + ": cannot get elf header.");
  if (ehdr.e_ident[EI_CLASS] != ELFCLASS64 || ehdr.e_ident[EI_DATA] != ELFDATA2LSB ||
      ehdr.e_machine != EM_X86_64)
    return make_error(-ENOEXEC, "Failed to open " + abs + ": not an x86-64 ELF object.");
  image->shared_object_ = ehdr.e_type == ET_DYN;

  size_t phnum = 0;
  if (elf_getphdrnum(image->elf_, &phnum) == 0) {
    for (size_t i = 0; i < phnum; ++i) {
      GElf_Phdr ph;
      if (gelf_getphdr(image->elf_, static_cast<int>(i), &ph) != nullptr && ph.p_type == PT_LOAD)
        image->loads_.push_back({ph.p_vaddr, ph.p_memsz, ph.p_offset, ph.p_filesz});
    }
  }

  size_t shstrndx = 0;
  const bool have_names = elf_getshdrstrndx(image->elf_, &shstrndx) == 0;
  Elf_Scn* symtab = nullptr;
  Elf_Scn* dynsym = nullptr;
  Versions versions;
  for (Elf_Scn* scn = elf_nextscn(image->elf_, nullptr); scn != nullptr;
       scn = elf_nextscn(image->elf_, scn)) {
    GElf_Shdr shdr;
    if (gelf_getshdr(scn, &shdr) == nullptr) continue;
    const std::string_view name =
        have_names ? section_string(image->elf_, shstrndx, shdr.sh_name) : "";
    switch (shdr.sh_type) {
      case SHT_SYMTAB: symtab = scn; break;
      case SHT_DYNSYM: dynsym = scn; break;
      case SHT_GNU_versym: versions.versym = elf_getdata(scn, nullptr); break;
      case SHT_GNU_verdef: read_verdef(image->elf_, scn, versions); break;
      case SHT_GNU_verneed: read_verneed(image->elf_, scn, versions); break;
      default: break;
    }
    if (name == ".gnu_debuglink") read_debuglink(scn, image->debuglink_, image->debuglink_crc_);
    // Compressed DWARF (SHF_COMPRESSED or the older .zdebug_*) counts: libdw reads it.
    if ((name == ".debug_info" || name == ".zdebug_info") && shdr.sh_type != SHT_NOBITS &&
        shdr.sh_size > 0)
      image->has_debug_info_ = true;
  }
  if (symtab != nullptr)
    read_symbols(image->elf_, symtab, nullptr, image->symbols_);
  else if (dynsym != nullptr)
    read_symbols(image->elf_, dynsym, &versions, image->symbols_);
  auto key = [](const ElfSymbol& s) {
    return std::tie(s.value, s.name, s.version, s.default_version, s.function, s.global, s.size);
  };
  std::sort(image->symbols_.begin(), image->symbols_.end(),
            [&](const ElfSymbol& a, const ElfSymbol& b) { return key(a) < key(b); });
  image->symbols_.erase(
      std::unique(image->symbols_.begin(), image->symbols_.end(),
                  [&](const ElfSymbol& a, const ElfSymbol& b) { return key(a) == key(b); }),
      image->symbols_.end());
  image->build_id_ = elf_build_id(image->elf_);
  return image;
}

ElfImage::~ElfImage() {
  if (elf_ != nullptr) elf_end(elf_);
  if (fd_ >= 0) close(fd_);
}

bool ElfImage::is_shared_object() const { return shared_object_; }

std::vector<const ElfSymbol*> ElfImage::find_functions(const std::string& name) const {
  std::vector<const ElfSymbol*> out;
  for (const ElfSymbol& s : symbols_)
    if (s.function && symbol_named(s, name)) out.push_back(&s);
  return out;
}

const ElfSymbol* ElfImage::function_at(uint64_t addr) const {
  // Aliases and size-less labels (_init) may share an address: a sized symbol that spans
  // ADDR wins over a label at it, a global one over a local one.
  const ElfSymbol* best = nullptr;
  auto rank = [](const ElfSymbol& s) { return (s.size > 0 ? 2 : 0) + (s.global ? 1 : 0); };
  for (const ElfSymbol& s : symbols_) {
    if (s.value > addr) break;
    const bool spans = addr - s.value < s.size || (s.size == 0 && addr == s.value);
    if (s.function && spans && (best == nullptr || rank(s) > rank(*best))) best = &s;
  }
  return best;
}

const ElfSymbol* ElfImage::find_object(const std::string& name) const {
  for (const ElfSymbol& s : symbols_)
    if (!s.function && symbol_named(s, name)) return &s;
  return nullptr;
}

namespace {

// The sections of ELF that -F's listing reads: the symbol tables, and the PLT's relocations.
struct ListedTables {
  Elf_Scn* symtab = nullptr;
  Elf_Scn* dynsym = nullptr;
  Elf_Scn* rela_plt = nullptr;
};

ListedTables listed_tables(Elf* elf) {
  ListedTables t;
  size_t shstrndx = 0;
  if (elf == nullptr || elf_getshdrstrndx(elf, &shstrndx) != 0) return t;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr shdr;
    if (gelf_getshdr(scn, &shdr) == nullptr) continue;
    if (shdr.sh_type == SHT_SYMTAB) t.symtab = scn;
    if (shdr.sh_type == SHT_DYNSYM) t.dynsym = scn;  // a debug file's is NOBITS: not this
    if (shdr.sh_type == SHT_RELA &&
        std::string_view(section_string(elf, shstrndx, shdr.sh_name)) == ".rela.plt")
      t.rela_plt = scn;
  }
  return t;
}

}  // namespace

std::vector<std::string> ElfImage::listed_names(bool demangle_names, Elf* debug_elf,
                                               bool params) const {
  std::vector<std::string> out;
  auto shown = [&](std::string_view raw) {
    if (demangle_names)
      if (std::optional<std::string> d = demangle(raw, params)) return *d;
    return std::string(raw);
  };
  const ListedTables own = listed_tables(elf_);
  const ListedTables debug = own.symtab == nullptr ? listed_tables(debug_elf) : ListedTables{};
  Elf* const syms_elf = debug.symtab != nullptr ? debug_elf : elf_;
  const ListedTables& syms = debug.symtab != nullptr ? debug : own;
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(syms_elf, &shstrndx) != 0) return out;
  // The name of a section that is part of the loaded image, nullopt for one that is not
  // (the .gnu.warning.* notes of libc: perf leaves their symbols out).
  auto section_name = [&](size_t index) -> std::optional<std::string_view> {
    Elf_Scn* scn = elf_getscn(syms_elf, index);
    GElf_Shdr shdr;
    if (scn == nullptr || gelf_getshdr(scn, &shdr) == nullptr || !(shdr.sh_flags & SHF_ALLOC))
      return std::nullopt;
    return std::string_view(section_string(syms_elf, shstrndx, shdr.sh_name));
  };
  auto read_table = [&](Elf_Scn* scn) {
    for_each_symbol(syms_elf, scn, [&](size_t, const GElf_Sym& sym, std::string_view name) {
      if (sym.st_shndx == SHN_UNDEF || sym.st_shndx >= SHN_LORESERVE || name.empty()) return;
      const int type = GELF_ST_TYPE(sym.st_info);
      if (type != STT_NOTYPE && type != STT_FUNC && type != STT_GNU_IFUNC && type != STT_OBJECT)
        return;
      const std::optional<std::string_view> sec = section_name(sym.st_shndx);
      if (!sec) return;
      if (type == STT_NOTYPE && sec->find("text") == std::string_view::npos &&
          sec->find("data") == std::string_view::npos)
        return;
      out.push_back(shown(name));
    });
  };
  if (syms.symtab != nullptr) read_table(syms.symtab);
  if (syms.dynsym != nullptr) read_table(syms.dynsym);
  // The PLT's entries, named after the symbols their relocations bind.
  GElf_Shdr rshdr, dshdr;
  Elf_Data* relocs = own.rela_plt != nullptr ? elf_getdata(own.rela_plt, nullptr) : nullptr;
  Elf_Data* dyn = own.dynsym != nullptr ? elf_getdata(own.dynsym, nullptr) : nullptr;
  if (relocs != nullptr && dyn != nullptr && gelf_getshdr(own.rela_plt, &rshdr) != nullptr &&
      gelf_getshdr(own.dynsym, &dshdr) != nullptr && rshdr.sh_entsize != 0) {
    const size_t count = rshdr.sh_size / rshdr.sh_entsize;
    for (size_t i = 0; i < count; ++i) {
      GElf_Rela rela;
      GElf_Sym sym;
      if (gelf_getrela(relocs, static_cast<int>(i), &rela) == nullptr) break;
      // An IRELATIVE entry binds symbol 0, whose name is empty: perf lists it as "@plt".
      const size_t index = GELF_R_SYM(rela.r_info);
      if (gelf_getsym(dyn, static_cast<int>(index), &sym) == nullptr) continue;
      out.push_back(shown(section_string(elf_, dshdr.sh_link, sym.st_name)) + "@plt");
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<uint64_t> ElfImage::file_offset(uint64_t addr) const {
  for (const Load& l : loads_)
    if (addr >= l.vaddr && addr - l.vaddr < l.memsz) return addr - l.vaddr + l.offset;
  return std::nullopt;
}

std::string elf_build_id(Elf* elf) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr shdr;
    if (gelf_getshdr(scn, &shdr) == nullptr || shdr.sh_type != SHT_NOTE) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data == nullptr || data->d_buf == nullptr) continue;
    GElf_Nhdr note;
    size_t name_at = 0, desc_at = 0;
    for (size_t off = 0, next = 0;
         (next = gelf_getnote(data, off, &note, &name_at, &desc_at)) > 0; off = next) {
      const auto* bytes = static_cast<const unsigned char*>(data->d_buf);
      if (note.n_type != NT_GNU_BUILD_ID || note.n_namesz != 4 ||
          memcmp(bytes + name_at, "GNU", 4) != 0 || note.n_descsz == 0)
        continue;
      std::string hex;
      for (size_t i = 0; i < note.n_descsz; ++i) {
        hex += kHex[bytes[desc_at + i] >> 4];
        hex += kHex[bytes[desc_at + i] & 0xf];
      }
      return hex;
    }
  }
  return "";
}

uint32_t debuglink_crc32(int fd) {
  uint32_t crc = 0xffffffffu;
  std::vector<unsigned char> buf(1 << 16);
  for (off_t off = 0;;) {
    const ssize_t n = pread(fd, buf.data(), buf.size(), off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) crc = kCrcTable[(crc ^ buf[i]) & 0xff] ^ (crc >> 8);
    off += n;
  }
  return ~crc;
}

}  // namespace probefs::tools
