// The register set every probe handler sees: the kernel's x86-64 `struct pt_regs`, field
// for field, so that handlers, fetch programs and documentation written for kprobes read
// the same here. Both entry paths (the int3 trap and the jump detour) fill this structure.
#pragma once

#include <cstddef>
#include <cstdint>

namespace probefs {

struct PtRegs {
  uint64_t r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
  uint64_t ax, cx, dx, si, di;
  uint64_t orig_ax;  // not a machine register; kept for layout, always ~0 here
  uint64_t ip, cs, flags, sp, ss;
};
static_assert(sizeof(PtRegs) == 21 * 8, "layout of the kernel's x86-64 pt_regs");
static_assert(offsetof(PtRegs, ip) == 16 * 8);

// System V x86-64 argument registers, in order ($arg1..$arg6 of the events language).
inline uint64_t regs_get_argument(const PtRegs& r, unsigned n /* 1-based */) {
  switch (n) {
    case 1: return r.di;
    case 2: return r.si;
    case 3: return r.dx;
    case 4: return r.cx;
    case 5: return r.r8;
    case 6: return r.r9;
    default: return 0;
  }
}

inline uint64_t regs_return_value(const PtRegs& r) { return r.ax; }

}  // namespace probefs
