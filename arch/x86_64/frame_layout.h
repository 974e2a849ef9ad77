/*
 * The layouts the assembly entry paths and the C++ share: PtRegs on the stack, the frames
 * of the thunks and trampolines, and the blocks of a jump-optimized probe's detour. One
 * header for both sides: the .S files (optprobe_thunk.S, kretprobe_trampoline.S,
 * ptregs_frame.inc) use these names for their offsets, and the C++ that lays out a
 * detour (optimize.cc) uses the same names and checks them against its structs with
 * static_assert. Plain #defines, so that the assembler's preprocessor reads them.
 */
#ifndef PROBEFS_ARCH_X86_64_FRAME_LAYOUT_H
#define PROBEFS_ARCH_X86_64_FRAME_LAYOUT_H

/* struct PtRegs (arch/regs.h), the kernel's x86-64 pt_regs. */
#define PTREGS_R15 0
#define PTREGS_R14 8
#define PTREGS_R13 16
#define PTREGS_R12 24
#define PTREGS_BP 32
#define PTREGS_BX 40
#define PTREGS_R11 48
#define PTREGS_R10 56
#define PTREGS_R9 64
#define PTREGS_R8 72
#define PTREGS_AX 80
#define PTREGS_CX 88
#define PTREGS_DX 96
#define PTREGS_SI 104
#define PTREGS_DI 112
#define PTREGS_ORIG_AX 120
#define PTREGS_IP 128
#define PTREGS_CS 136
#define PTREGS_FLAGS 144
#define PTREGS_SP 152
#define PTREGS_SS 160
#define PTREGS_SIZE 168

/*
 * The frame every entry path builds from its stack pointer up:
 *   +0            PtRegs
 *   +168          one spare word (the call-mode thunks keep the return address at S there)
 *   +176          the vector registers of the level, if saved (ptregs_frame.inc)
 */
#define FRAME_SPARE PTREGS_SIZE
#define FRAME_VECTOR_AREA 176

/* The red zone of the interrupted code, which the entry paths step over. */
#define RED_ZONE 128

/*
 * A detour block (optimize.cc). Each block of a detour starts with a header of five
 * words, then the call into the shared thunk; R is the return address that call pushes,
 * which is how the thunk finds the header (at R - DETOUR_R).
 *
 *   +0   ctx_cell        -> probecore's context (nullptr while being removed)
 *   +8   thunk           the thunk the block calls
 *   +16  addr            the probe address
 *   +24  miss_back       call-mode blocks: how far back the plain block's R lies; else 0
 *   +32  call_trampoline call-mode blocks: the return trampoline; else 0
 *   +40  lea -RED_ZONE(%rsp),%rsp            (5 bytes)
 *   +45  call *(DETOUR_THUNK - DETOUR_R)(%rip)  (6 bytes)
 *   +51  R
 */
#define DETOUR_CTX_CELL 0
#define DETOUR_THUNK 8
#define DETOUR_ADDR 16
#define DETOUR_MISS_BACK 24
#define DETOUR_CALL_TRAMPOLINE 32
#define DETOUR_HEADER_LEN 40
#define DETOUR_CALL_THUNK DETOUR_HEADER_LEN
#define DETOUR_R 51

/*
 * After R, the plain block (P, the first of a detour):
 *   R+0  lea RED_ZONE(%rsp),%rsp             (8 bytes)
 *   R+8  the relocated region ; jmp back to addr + region length
 * A call-mode block (C or L), the entry of a function with a return probe:
 *   R+0  lea (RED_ZONE + 8)(%rsp),%rsp        (8 bytes) drop the return address too
 *   R+8  call P + DETOUR_REGION_COPY         (5 bytes) run the function as a call of ours
 *   R+13 jmp *(DETOUR_CALL_TRAMPOLINE - DETOUR_CALL_BLOCK_LEN)(%rip)  (6 bytes)
 */
#define DETOUR_REGION_COPY (DETOUR_R + 8)
#define DETOUR_CALL_COPY (DETOUR_R + 8)
#define DETOUR_CALL_JMP_TRAMPOLINE (DETOUR_CALL_COPY + 5)
#define DETOUR_CALL_BLOCK_LEN (DETOUR_CALL_JMP_TRAMPOLINE + 6)

/* The thunk's frame: the interrupted stack pointer S lies this far above R's slot. */
#define DETOUR_S_ABOVE_R (RED_ZONE + 8)

/* What a detour saved (arch.h: kSavedVector, kSavedAllRegs). */
#define SAVED_VECTOR 1
#define SAVED_ALL_REGS 2

#ifdef __cplusplus
#include <cstddef>
#include <cstdint>

#include "arch/arch.h"
#include "arch/regs.h"

namespace probefs::arch::x86_64 {

static_assert(offsetof(PtRegs, r15) == PTREGS_R15 && offsetof(PtRegs, bp) == PTREGS_BP &&
              offsetof(PtRegs, bx) == PTREGS_BX && offsetof(PtRegs, r11) == PTREGS_R11 &&
              offsetof(PtRegs, r8) == PTREGS_R8 && offsetof(PtRegs, ax) == PTREGS_AX &&
              offsetof(PtRegs, cx) == PTREGS_CX && offsetof(PtRegs, dx) == PTREGS_DX &&
              offsetof(PtRegs, si) == PTREGS_SI && offsetof(PtRegs, di) == PTREGS_DI &&
              offsetof(PtRegs, orig_ax) == PTREGS_ORIG_AX && offsetof(PtRegs, ip) == PTREGS_IP &&
              offsetof(PtRegs, cs) == PTREGS_CS && offsetof(PtRegs, flags) == PTREGS_FLAGS &&
              offsetof(PtRegs, sp) == PTREGS_SP && offsetof(PtRegs, ss) == PTREGS_SS &&
              sizeof(PtRegs) == PTREGS_SIZE);
static_assert(FRAME_SPARE + 8 == FRAME_VECTOR_AREA && FRAME_VECTOR_AREA % 16 == 0);
static_assert(kSavedVector == SAVED_VECTOR && kSavedAllRegs == SAVED_ALL_REGS);

// A detour block's header, as the thunks read it.
struct DetourHeader {
  void* volatile* ctx_cell;
  uint64_t thunk;
  uint64_t addr;
  uint64_t miss_back;
  uint64_t call_trampoline;
};
static_assert(offsetof(DetourHeader, ctx_cell) == DETOUR_CTX_CELL &&
              offsetof(DetourHeader, thunk) == DETOUR_THUNK &&
              offsetof(DetourHeader, addr) == DETOUR_ADDR &&
              offsetof(DetourHeader, miss_back) == DETOUR_MISS_BACK &&
              offsetof(DetourHeader, call_trampoline) == DETOUR_CALL_TRAMPOLINE &&
              sizeof(DetourHeader) == DETOUR_HEADER_LEN);

}  // namespace probefs::arch::x86_64
#endif

#endif
