#include "arch/code_scan.h"

#include <cerrno>

#include "arch/x86_64/isa/insn.h"

namespace probefs::arch {

int instruction_in_section(const uint8_t* code, size_t n, uintptr_t start, uintptr_t addr,
                           size_t* len) {
  if (addr < start || addr - start >= n) return -EILSEQ;
  if (int rc = x86_64::check_boundary(code, start, start + n, addr); rc != 0) return rc;
  x86_64::Insn insn;
  const size_t at = addr - start;
  if (x86_64::decode(code + at, n - at, addr, &insn) != 0) return -EILSEQ;
  *len = insn.len;
  return 0;
}

}  // namespace probefs::arch
