/*
 * The shared thunks of jump-optimized probes. A probe's detour (optimize.cc) has blocks
 * that start with a header and a call into one of these thunks (frame_layout.h, DETOUR_*):
 *
 *   D+0   .quad ctx_cell       -> probecore's aggregate (0 while being removed)
 *   D+8   .quad thunk          the address of one of the thunks below
 *   D+16  .quad addr           the probe address
 *   D+24  .quad miss_back      0, or how far back the plain block's R lies (call mode)
 *   D+32  .quad trampoline     the call-mode return trampoline
 *   D+40  lea -128(%rsp),%rsp  step over the red zone of the interrupted code
 *   D+45  call *D+8(%rip)
 *   D+51  <- R (DETOUR_R), the return address the call pushes; a header field F is at
 *         (F - DETOUR_R)(R)
 *
 * Frame built here, with S the stack pointer at the probe:
 *
 *   S-128..S       red zone of the interrupted code (untouched)
 *   S-136          R                       (S = R's slot + DETOUR_S_ABOVE_R)
 *   below          the vector registers (handlers are C, and what they call may be libc's
 *                  AVX code, whose vzeroupper clears the upper halves of ymm0-15): xmm0-15,
 *                  ymm0-15, or zmm0-31 and k0-7, as the CPU has them (cpu_state.h); the
 *                  detour names the thunk of this machine's level
 *   lowest         struct PtRegs (r15 lowest), 168 bytes + 8 of padding
 *
 * probefs_optprobe_thunk_gpr leaves the vector registers out (its frame is PtRegs alone,
 * from S-312): it serves probes whose handlers all promise to touch general-purpose
 * registers only (KPROBE_FLAG_GPR_ONLY, handlers built with -mgeneral-regs-only, calling
 * nothing that touches vector registers).
 *
 * Registers are saved into the same PtRegs as the trap path fills, handlers run through
 * probecore's optimized_hit callback (D->ctx_cell, regs, what was saved), and everything
 * but ip and sp is reloaded from the frame (a handler's change of ip is ignored for
 * optimized probes, as in kprobes). Every register comes back: with interprocedural
 * register allocation (GCC's -fipa-ra) a caller may keep values in scratch registers
 * across a call.
 *
 * The _entry thunks serve call-mode blocks, which sit at function entries. Such a block
 * runs the function as a call of its own, which is right only when a handler of this hit
 * put the return trampoline into the return address at S. When none did, the thunk
 * returns to the plain block instead: R - miss_back. At a function entry the flags are
 * dead (no compiler keeps them across a call) and DF is clear: these thunks neither
 * restore the flags nor need a cld.
 */
#include "arch/x86_64/ptregs_frame.inc"

        /* probefs_arch_detour_depth, this thread's count of handler calls from detours,
           up or down (incq/decq), with r11 (saved) as scratch and the flags clobbered:
           after they are saved, before they are restored. */
        .macro  DETOUR_DEPTH op
        mov     probefs_arch_detour_depth@gottpoff(%rip), %r11
        \op    %fs:(%r11)
        .endm

        /* Before the handlers of a call-mode block: the return address at S, into the
           padding after PtRegs. */
        .macro  KEEP_RETURN_ADDRESS frame
        mov     (\frame + DETOUR_S_ABOVE_R)(%rsp), %rax
        mov     %rax, FRAME_SPARE(%rsp)
        .endm

        /* After them: stay in call mode (return to R) if a handler of this hit replaced
           the return address at S by the trampoline; else go back to the plain block. */
        .macro  CALL_MODE_OR_PLAIN frame
        mov     (\frame + DETOUR_S_ABOVE_R)(%rsp), %rax
        cmp     FRAME_SPARE(%rsp), %rax
        je      1f
        cmp     probefs_arch_plain_trampoline(%rip), %rax
        je      2f
1:      mov     \frame(%rsp), %rcx      /* R */
        mov     (DETOUR_MISS_BACK - DETOUR_R)(%rcx), %rdx
        sub     %rdx, \frame(%rsp)      /* nothing hijacked: the plain block */
2:
        .endm

        /* name, vector level (0: none), call-mode entry? */
        .macro  OPTPROBE_THUNK name, vector, entry
        .if \vector
        .set    frame, FRAME_VECTOR_AREA + VECTOR_AREA_\vector
        .else
        .set    frame, FRAME_VECTOR_AREA
        .endif
        .text
        .globl  \name
        .type   \name, @function
        .p2align 4
\name:
        .cfi_startproc
        .cfi_undefined rip
        lea     -frame(%rsp), %rsp
        PTREGS_SAVE_GPRS
        VECTOR_SAVE \vector, FRAME_VECTOR_AREA
        pushfq
        popq    PTREGS_FLAGS(%rsp)      /* (address taken after the pop) */
        DETOUR_DEPTH incq
        .if !\entry
        cld                             /* handlers are C: the ABI wants DF clear */
        .endif
        lea     (frame + DETOUR_S_ABOVE_R)(%rsp), %rax
        mov     %rax, PTREGS_SP(%rsp)   /* S */
        .if \entry
        KEEP_RETURN_ADDRESS frame
        .endif

        mov     frame(%rsp), %rdi       /* R */
        mov     (DETOUR_ADDR - DETOUR_R)(%rdi), %rax
        inc     %rax
        mov     %rax, PTREGS_IP(%rsp)   /* the probe address + 1, as on the int3 path */
        mov     (DETOUR_CTX_CELL - DETOUR_R)(%rdi), %rdi
        mov     %rsp, %rsi
        .if \vector
        mov     $(SAVED_ALL_REGS | SAVED_VECTOR), %edx
        .else
        mov     $SAVED_ALL_REGS, %edx
        .endif
        mov     %rsp, %rbx              /* callee-saved: the frame survives the call */
        and     $-16, %rsp
        call    *probefs_arch_optimized_hit_cb(%rip)
        mov     %rbx, %rsp
        DETOUR_DEPTH decq

        .if \entry
        CALL_MODE_OR_PLAIN frame
        .endif
        VECTOR_RESTORE \vector, FRAME_VECTOR_AREA
        .if !\entry
        /* The flags, without popfq (slow): DF by itself, OF through an add that overflows
           exactly when it was set, the low byte (SF ZF AF PF CF) with sahf. rax and rcx
           are reloaded after, by movs that leave the flags alone. */
        mov     PTREGS_FLAGS(%rsp), %rax
        test    $0x400, %eax
        jz      1f
        std
1:      bt      $11, %eax
        setc    %cl
        add     $0x7f, %cl
        mov     %al, %ah
        sahf
        .endif
        PTREGS_RESTORE_GPRS
        lea     frame(%rsp), %rsp
        ret
        .cfi_endproc
        .size   \name, .-\name
        .endm

        /* Every thunk lies in [probefs_optprobe_thunks_begin, probefs_optprobe_thunks_end):
           a thread there is on its way into or out of a detour (thread_fixup). */
        .text
        .globl  probefs_optprobe_thunks_begin
        .hidden probefs_optprobe_thunks_begin
probefs_optprobe_thunks_begin:
        OPTPROBE_THUNK probefs_optprobe_thunk_gpr, 0, 0
        OPTPROBE_THUNK probefs_optprobe_thunk_sse, 1, 0
        OPTPROBE_THUNK probefs_optprobe_thunk_avx, 2, 0
        OPTPROBE_THUNK probefs_optprobe_thunk_avx512, 3, 0
        OPTPROBE_THUNK probefs_optprobe_thunk_gpr_entry, 0, 1
        OPTPROBE_THUNK probefs_optprobe_thunk_sse_entry, 1, 1
        OPTPROBE_THUNK probefs_optprobe_thunk_avx_entry, 2, 1
        OPTPROBE_THUNK probefs_optprobe_thunk_avx512_entry, 3, 1

/*
 * The lean entry thunk, for call-mode blocks whose handlers need neither every register
 * nor the vector ones (DetourEntry::kCallLean: a return probe's own entry handler, which
 * reads sp). Its callback is engine code that touches no vector register and keeps the
 * callee-saved ones, so it saves the registers a C call may clobber, and rbx, which holds
 * the frame; PtRegs gets those and sp, and the rest of it stays unfilled. Frame: as
 * probefs_optprobe_thunk_gpr.
 */
        .text
        .globl  probefs_optprobe_thunk_lean_entry
        .type   probefs_optprobe_thunk_lean_entry, @function
        .p2align 4
probefs_optprobe_thunk_lean_entry:
        .cfi_startproc
        .cfi_undefined rip
        lea     -FRAME_VECTOR_AREA(%rsp), %rsp
        mov     %rbx, PTREGS_BX(%rsp)
        mov     %r11, PTREGS_R11(%rsp)
        mov     %r10, PTREGS_R10(%rsp)
        mov     %r9, PTREGS_R9(%rsp)
        mov     %r8, PTREGS_R8(%rsp)
        mov     %rax, PTREGS_AX(%rsp)
        mov     %rcx, PTREGS_CX(%rsp)
        mov     %rdx, PTREGS_DX(%rsp)
        mov     %rsi, PTREGS_SI(%rsp)
        mov     %rdi, PTREGS_DI(%rsp)
        DETOUR_DEPTH incq
        lea     (FRAME_VECTOR_AREA + DETOUR_S_ABOVE_R)(%rsp), %rax
        mov     %rax, PTREGS_SP(%rsp)   /* S */
        KEEP_RETURN_ADDRESS FRAME_VECTOR_AREA
        mov     FRAME_VECTOR_AREA(%rsp), %rdi   /* R */
        mov     (DETOUR_CTX_CELL - DETOUR_R)(%rdi), %rdi
        mov     %rsp, %rsi
        xor     %edx, %edx              /* saved: no more than that */
        mov     %rsp, %rbx
        and     $-16, %rsp
        call    *probefs_arch_optimized_lean_entry_cb(%rip)
        mov     %rbx, %rsp
        DETOUR_DEPTH decq
        CALL_MODE_OR_PLAIN FRAME_VECTOR_AREA
        mov     PTREGS_BX(%rsp), %rbx
        mov     PTREGS_R11(%rsp), %r11
        mov     PTREGS_R10(%rsp), %r10
        mov     PTREGS_R9(%rsp), %r9
        mov     PTREGS_R8(%rsp), %r8
        mov     PTREGS_AX(%rsp), %rax
        mov     PTREGS_CX(%rsp), %rcx
        mov     PTREGS_DX(%rsp), %rdx
        mov     PTREGS_SI(%rsp), %rsi
        mov     PTREGS_DI(%rsp), %rdi
        lea     FRAME_VECTOR_AREA(%rsp), %rsp
        ret
        .cfi_endproc
        .size   probefs_optprobe_thunk_lean_entry, .-probefs_optprobe_thunk_lean_entry
        .globl  probefs_optprobe_thunks_end
        .hidden probefs_optprobe_thunks_end
probefs_optprobe_thunks_end:

        .section .note.GNU-stack,"",@progbits
