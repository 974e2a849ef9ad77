// Relocation and code emission: turn one instruction into code that does the same thing
// from another address. Pure functions over byte buffers.
//
// Out-of-line forms (what relocate() writes for each kind):
//   plain, syscall, ret    the bytes as they are
//   rip-relative           the bytes, disp32 re-aimed at the same absolute address
//   jmp rel                jmp rel32 (or the 14-byte absolute form) to the same target
//   jcc rel                jcc rel32, or: j!cc over an absolute jmp
//   loop/jrcxz rel8        loop +2 ; jmp short over ; jmp target
//   call rel32             push [rip+k] ; jmp target ; k: .quad return address
//   call r/m               push [rip+k] ; jmp r/m   ; k: .quad return address
//   jmp r/m                the bytes (rip-relative operand re-aimed)
#pragma once

#include <cstddef>
#include <cstdint>

#include "arch/x86_64/isa/insn.h"

namespace probefs::arch::x86_64 {

constexpr size_t kJmpAbsLen = 14;      // jmp *0(%rip) ; .quad target
constexpr size_t kMaxRelocatedLen = 48;

// Does a rel32 at an instruction ending at `from_next` reach `to`?
bool fits_rel32(uintptr_t from_next, uintptr_t to);

// jmp from `at` to `to`: 5 bytes when rel32 reaches, else 14. Returns bytes written.
size_t emit_jmp(uint8_t* out, uintptr_t at, uintptr_t to);

// Code that, placed at `new_pc`, behaves like `insn` at insn.addr and falls through to its
// own end where insn falls through. Returns its length, -ERANGE when a rip-relative operand
// cannot reach from new_pc, -EINVAL for an instruction that cannot be relocated.
int relocate(const Insn& insn, uintptr_t new_pc, uint8_t* out, size_t cap);

// A copy of the same length for single-stepping at `new_pc` (only rip-relative operands
// re-aimed). Returns the length, -ERANGE or -EINVAL.
int copy_for_singlestep(const Insn& insn, uintptr_t new_pc, uint8_t* out);

// Would the condition `cond` (0..15, as in jcc) hold with these rflags?
bool condition_holds(uint8_t cond, uint64_t rflags);

}  // namespace probefs::arch::x86_64
