// The safety checks for jump optimization: may the probe at `addr` be replaced by a 5-byte
// `jmp` to a detour? Pure functions over byte buffers, no live patching.
//
// The jump overwrites whole instructions from addr, at least 5 bytes of them: the region
// (the kernel's "DCR", detoured code region). The detour runs relocated copies of those
// instructions and jumps back to addr + len. That is safe only if control never arrives at
// a byte strictly inside the region, where it would find the middle of the jump:
//
//   addr          addr+len
//   | e9 r0 r1 r2 r3 | ...     a branch to addr is fine (it takes the jump);
//     ^^^^^^^^^^^^^^           a branch to any of these bytes executes garbage.
//
// So, as the kernel's optimizer does, the whole function is decoded from its start and
// every transfer in it is looked at: direct jumps, calls and loops by their targets, jump
// tables by their decoded entries; an indirect jump whose destinations cannot be bounded
// refuses. A return address is never inside the region because the region holds no call.
//
// Bytes after an unconditional transfer (jmp, ret) are reached only by a way the function's
// straight-line code does not show: a branch, a table entry, or one of the entries below.
// The region must not go on past such a transfer; whatever can only be reached that way is
// refused even when no way in is known.
//
// What these checks cannot see unless the caller tells them (OutsideEntries) are ways in
// from outside the function's bytes: GCC splits unlikely blocks into `foo.cold`, which
// jumps back into foo, and the unwinder lands on exception landing pads. Another probe
// inside the region is the caller's business too, as are computed jumps in other
// functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "arch/x86_64/isa/insn.h"

namespace probefs::arch::x86_64 {

// Why a probe cannot be jump-optimized; kNone when it can.
enum class OptimizeRefusal : uint8_t {
  kNone,
  kOutsideFunction,   // addr not in [func_start, func_end), or the region runs past the end
  kDecodeFailed,      // some bytes of the function do not decode: its boundaries are unknown
  kNotBoundary,       // addr falls inside an instruction
  kCallInRegion,      // the return address would be inside the region (or the detour)
  kSyscallInRegion,   // a thread may block in the detour for ever, and restarts see its ip
  kNotRelocatable,    // trap, privileged, unsupported, or relocate() refuses it
  kJumpIntoRegion,    // a branch or a jump-table entry targets bytes addr+1 .. addr+len-1
  kIndirectJump,      // an indirect jump whose destinations could not be bounded
  kCodeAfterTransfer, // the region goes on after a jmp or ret: those bytes are reached only
                      // from elsewhere (a landing pad, a cold part, a table), maybe unseen
};

// A short text for introspection ("jump into the region", ...). Never nullptr.
const char* refusal_text(OptimizeRefusal r);

// The region the 5-byte jmp replaces: whole instructions from addr, len >= kJmpRel32Len bytes.
// Each instruction is at least one byte, so kJmpRel32Len instructions always suffice.
struct OptimizeRegion {
  uintptr_t addr = 0;
  uint8_t len = 0;
  uint8_t count = 0;
  Insn insns[kJmpRel32Len];

  uintptr_t end() const { return addr + len; }
};

// Reads n bytes at addr in the probed process (jump tables live in .rodata, outside the
// function's bytes). Returns false when the memory is not readable.
using ReadMemory = bool (*)(void* ctx, uintptr_t addr, void* buf, size_t n);

// Code outside the function that may branch into it: the parts the compiler split off
// (`foo.cold`, `foo.part.0`). Its direct branches into the function count like the
// function's own; it must decode too. Its indirect jumps are not looked at.
struct RelatedCode {
  const uint8_t* code = nullptr;  // the bytes of [start, end), no probe armed
  uintptr_t start = 0, end = 0;
};

// Ways into the function that its own code does not show.
struct OutsideEntries {
  const RelatedCode* related = nullptr;
  size_t n_related = 0;
  // Addresses control arrives at without a branch: exception landing pads (from the
  // LSDA in .gcc_except_table), longjmp-style resumption points. Each one inside the
  // function must be an instruction boundary.
  const uintptr_t* addrs = nullptr;
  size_t n_addrs = 0;
};

// Decides whether the probe at `addr` in the function [func_start, func_end) may be
// jump-optimized. `code` holds the function's bytes as they are with no probe armed (see
// through int3s and earlier jumps, as site.cc reads code). `read` serves memory outside them.
//
// *out is filled as soon as the region is known (every refusal from kCallInRegion on, and
// kNone), so introspection can show what would have been replaced; otherwise out->len is 0.
//
// Control plane: allocates (one pass over the whole function), may be slow on large
// functions, safe to call from any thread.
OptimizeRefusal check_optimizable(const uint8_t* code, uintptr_t func_start, uintptr_t func_end,
                                  uintptr_t addr, ReadMemory read, void* ctx,
                                  OptimizeRegion* out);

// The same, with the ways in from outside counted like the function's own branches.
OptimizeRefusal check_optimizable(const uint8_t* code, uintptr_t func_start, uintptr_t func_end,
                                  uintptr_t addr, ReadMemory read, void* ctx,
                                  const OutsideEntries& outside, OptimizeRegion* out);

}  // namespace probefs::arch::x86_64
