// One ELF object on disk as the helper needs it without DWARF: its symbol tables, its
// program headers (link-time address -> file offset, as uprobe_events takes it), its
// build-id and .gnu_debuglink. libelf only.
//
// Symbols are the defined functions (STT_FUNC, STT_GNU_IFUNC) and data objects (STT_OBJECT)
// of .symtab, else of .dynsym. Thread-local symbols are left out: their values are offsets
// in the TLS block, not addresses. A version comes from .gnu.version with .gnu.version_d
// (definitions, "@@" unless hidden) and .gnu.version_r (references such as a copy-relocated
// "stdin@GLIBC_2.2.5"), or, in .symtab, from the name itself ("name@VER", "name@@VER").
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tools/result.h"

struct Elf;  // libelf's handle, opaque here

namespace probefs::tools {

struct ElfSymbol {
  std::string name;     // without a version suffix
  std::string version;  // "GLIBC_2.2.5" for a versioned .dynsym entry; "" otherwise
  bool default_version = true;  // @@ rather than @
  uint64_t value = 0;   // link-time address
  uint64_t size = 0;
  bool function = false;  // STT_FUNC or STT_GNU_IFUNC (else an object)
  bool ifunc = false;
  bool global = false;    // STB_GLOBAL/STB_WEAK rather than STB_LOCAL
};

class ElfImage {
 public:
  // Opens and reads PATH (resolved to an absolute path, symbolic links followed, as perf
  // does for -x). -ENOENT, -EACCES, or -ENOEXEC for a file that is not a 64-bit
  // little-endian x86-64 ELF object (a directory, a script, a 32-bit object ...).
  static Result<std::unique_ptr<ElfImage>> open(const std::string& path);
  ~ElfImage();
  ElfImage(const ElfImage&) = delete;
  ElfImage& operator=(const ElfImage&) = delete;

  const std::string& path() const { return path_; }  // absolute
  int fd() const { return fd_; }
  Elf* elf() const { return elf_; }
  bool is_shared_object() const;  // ET_DYN (PIE executables too)

  // .symtab where there is one, else .dynsym; sorted by address, duplicates removed.
  const std::vector<ElfSymbol>& symbols() const { return symbols_; }
  // Function symbols named NAME (exact; a "NAME@VERSION" picks that version).
  std::vector<const ElfSymbol*> find_functions(const std::string& name) const;
  // The function symbol that contains ADDR, or nullptr.
  const ElfSymbol* function_at(uint64_t addr) const;
  // A data symbol (STT_OBJECT) named NAME ("NAME@VERSION" as above), or nullptr.
  const ElfSymbol* find_object(const std::string& name) const;

  // perf probe -F's names, as perf 6.1 loads an object's symbols: every function, object
  // and label (a typeless symbol in a section whose name has "text" or "data") defined in
  // a section, of .symtab and then of .dynsym again (perf reads both), and a "NAME@plt"
  // for each entry of .rela.plt; C++ names demangled without their parameters unless
  // `demangle` is false. Sorted by name, repeats kept (perf prints them). The symbols come
  // from the object, or from DEBUG_ELF (its separate debug file, DebugInfo::debug_elf())
  // when only that one has a .symtab; the PLT always from the object.
  // With PARAMS (perf's -v), demangled names keep their parameters and return types.
  std::vector<std::string> listed_names(bool demangle, Elf* debug_elf = nullptr,
                                        bool params = false) const;

  // Link-time address -> offset in the file, through the PT_LOAD that maps it; nullopt when
  // no segment maps it. An address in a segment's zero-filled tail (.bss) gets the offset it
  // would have if the file went on, which is where uprobe_events' offsets reach it too.
  std::optional<uint64_t> file_offset(uint64_t addr) const;

  // The NT_GNU_BUILD_ID note as lowercase hex, "" if none.
  const std::string& build_id() const { return build_id_; }
  // .gnu_debuglink's file name, "" if none (its CRC is checked by the debuginfo finder).
  const std::string& debuglink() const { return debuglink_; }
  uint32_t debuglink_crc() const { return debuglink_crc_; }
  // Whether the object carries DWARF itself (.debug_info with content).
  bool has_debug_info() const { return has_debug_info_; }

 private:
  ElfImage() = default;
  std::string path_;
  int fd_ = -1;
  Elf* elf_ = nullptr;
  std::vector<ElfSymbol> symbols_;
  struct Load { uint64_t vaddr, memsz, offset, filesz; };
  std::vector<Load> loads_;
  std::string build_id_, debuglink_;
  uint32_t debuglink_crc_ = 0;
  bool has_debug_info_ = false;
  bool shared_object_ = false;
};

// The NT_GNU_BUILD_ID note of ELF's SHT_NOTE sections as lowercase hex, "" if none.
std::string elf_build_id(Elf* elf);

// The CRC-32 that .gnu_debuglink records for a file (zlib's crc32), over all of FD's bytes
// from offset 0. A read error ends the sum early, which can only make it mismatch.
uint32_t debuglink_crc32(int fd);

}  // namespace probefs::tools
