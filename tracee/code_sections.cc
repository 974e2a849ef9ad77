#include "tracee/code_sections.h"

#include <elf.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "arch/code_scan.h"

namespace probefs::tracee {

int section_instruction(const FileBytes& file, uint64_t offset, size_t* len) {
  Elf64_Ehdr eh;
  if (!file(0, &eh, sizeof eh) || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
      eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_shentsize != sizeof(Elf64_Shdr))
    return -ENOEXEC;
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh;
    if (!file(eh.e_shoff + uint64_t{i} * sizeof sh, &sh, sizeof sh)) return -ENOEXEC;
    if (sh.sh_type == SHT_NOBITS || !(sh.sh_flags & SHF_EXECINSTR)) continue;
    if (offset < sh.sh_offset || offset - sh.sh_offset >= sh.sh_size) continue;
    if (sh.sh_size > kMaxCodeSectionBytes) return -EFBIG;
    uint8_t last;  // the section ends inside the file before anything is allocated for it
    if (!file(sh.sh_offset + sh.sh_size - 1, &last, 1)) return -ENOEXEC;
    std::vector<uint8_t> code(sh.sh_size);
    if (!file(sh.sh_offset, code.data(), code.size())) return -ENOEXEC;
    return arch::instruction_in_section(code.data(), code.size(), sh.sh_offset, offset, len);
  }
  return -ENOENT;
}

}  // namespace probefs::tracee
