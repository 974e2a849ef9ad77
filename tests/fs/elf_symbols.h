// Symbols of an ELF file on disk, for the end-to-end tests: where a function or a variable
// is (its address in the file's own address space) and at which file offset, read from the
// file itself (these tests link nothing of probefs).
#pragma once

#include <elf.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>

namespace probefs::fs::testing {

struct ElfSymbol {
  bool found = false;
  uint64_t vaddr = 0;        // st_value
  uint64_t size = 0;         // st_size
  uint64_t file_offset = 0;  // where vaddr lies in the file (through its PT_LOAD segment)
};

// `name` in .symtab (else .dynsym) of a 64-bit ELF file.
inline ElfSymbol find_elf_symbol(const std::string& path, std::string_view name) {
  ElfSymbol out;
  std::ifstream in(path, std::ios::binary);
  const std::string img((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (img.size() < sizeof(Elf64_Ehdr) || img.compare(0, 4, ELFMAG) != 0) return out;
  Elf64_Ehdr eh;
  std::memcpy(&eh, img.data(), sizeof eh);
  auto fits = [&](uint64_t off, uint64_t len) { return off <= img.size() && len <= img.size() - off; };
  if (!fits(eh.e_shoff, uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr)) ||
      !fits(eh.e_phoff, uint64_t{eh.e_phnum} * sizeof(Elf64_Phdr)))
    return out;
  auto section = [&](size_t i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, img.data() + eh.e_shoff + i * sizeof sh, sizeof sh);
    return sh;
  };
  for (uint32_t want : {uint32_t{SHT_SYMTAB}, uint32_t{SHT_DYNSYM}}) {
    for (size_t i = 0; i < eh.e_shnum && !out.found; ++i) {
      const Elf64_Shdr sh = section(i);
      if (sh.sh_type != want || sh.sh_link >= eh.e_shnum || !fits(sh.sh_offset, sh.sh_size))
        continue;
      const Elf64_Shdr strtab = section(sh.sh_link);
      if (!fits(strtab.sh_offset, strtab.sh_size)) continue;
      for (uint64_t at = 0; at + sizeof(Elf64_Sym) <= sh.sh_size; at += sizeof(Elf64_Sym)) {
        Elf64_Sym sym;
        std::memcpy(&sym, img.data() + sh.sh_offset + at, sizeof sym);
        if (sym.st_name >= strtab.sh_size || sym.st_shndx == SHN_UNDEF) continue;
        const char* s = img.data() + strtab.sh_offset + sym.st_name;
        if (std::string_view(s, strnlen(s, strtab.sh_size - sym.st_name)) != name) continue;
        out.found = true;
        out.vaddr = sym.st_value;
        out.size = sym.st_size;
        break;
      }
    }
    if (out.found) break;
  }
  if (!out.found) return out;
  for (size_t i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph;
    std::memcpy(&ph, img.data() + eh.e_phoff + i * sizeof ph, sizeof ph);
    if (ph.p_type == PT_LOAD && out.vaddr >= ph.p_vaddr && out.vaddr < ph.p_vaddr + ph.p_memsz) {
      out.file_offset = out.vaddr - ph.p_vaddr + ph.p_offset;
      return out;
    }
  }
  out.found = false;
  return out;
}

}  // namespace probefs::fs::testing
