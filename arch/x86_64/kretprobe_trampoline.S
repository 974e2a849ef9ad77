/*
 * The return trampolines. A kretprobe's entry handler replaces a function's return address
 * with probefs_kretprobe_trampoline; the function's `ret` lands here with rsp = S, the
 * caller's stack pointer.
 *
 * Every register but rsp is given back as it was (handlers may change them through PtRegs,
 * e.g. the return value in ax): with interprocedural register allocation (GCC's -fipa-ra,
 * on at -O2) a caller may keep values in registers the ABI calls scratch across a call to
 * a function it knows does not touch them. Only the flags are not restored: no compiler
 * keeps them across a call, DF is clear, and popfq is slow.
 *
 * Frame (R = S - 560):
 *
 *   S            caller's stack (untouched)
 *   S-8          the real return address, on the way out
 *   S-128..S     red zone of S: a signal delivered here leaves it alone
 *   R+176..R+432 xmm0-15 (vector variants)
 *   R+168..R+176 padding
 *   R ..R+168    struct PtRegs (r15 at R, ..., ss at R+160)
 *
 * probecore's function_return callback (regs, whose ip it fills) runs the return handlers
 * and returns the real return address A, which goes to S-8; registers are reloaded, rsp
 * goes back to S.
 *
 *   probefs_kretprobe_trampoline            leaves with jmp *-8(%rsp): the function's ret
 *                                           already consumed the caller's return-stack
 *                                           entry, and a jmp keeps the predictor in step
 *   probefs_kretprobe_trampoline_call       returns that arrive through a detour's
 *                                           call-mode block (optimize.cc): the detour's own
 *                                           call consumed its entry, the caller's is on top,
 *                                           and a ret to A is predicted
 *   probefs_kretprobe_trampoline_call_gpr   the same for return handlers that touch
 *                                           general-purpose registers only (no xmm saved)
 */
#include "arch/x86_64/ptregs_frame.inc"

        /* name, leave by ret rather than jmp, save the vector registers? */
        .macro  KRETPROBE_TRAMPOLINE name, by_ret, vector
        .text
        .globl  \name
        .type   \name, @function
        .p2align 4
\name:
        .cfi_startproc
        .cfi_undefined rip
        lea     -560(%rsp), %rsp
        PTREGS_SAVE_GPRS
        .if \vector
        PTREGS_SAVE_XMM 176
        .endif
        pushfq
        popq    144(%rsp)               /* flags (address taken after the pop) */
        lea     560(%rsp), %rax
        mov     %rax, 152(%rsp)         /* sp = S */

        mov     %rsp, %rbx              /* rbx is callee-saved: the frame survives the call */
        and     $-16, %rsp
        mov     %rbx, %rdi
        call    *probefs_arch_function_return_cb(%rip)
        mov     %rbx, %rsp
        mov     %rax, 552(%rsp)         /* S-8: dead below the caller's sp since its call */

        .if \vector
        PTREGS_RESTORE_XMM 176
        .endif
        PTREGS_RESTORE_GPRS
        .if \by_ret
        lea     552(%rsp), %rsp
        ret
        .else
        lea     560(%rsp), %rsp         /* S */
        jmp     *-8(%rsp)
        .endif
        .cfi_endproc
        .size   \name, .-\name
        .endm

        KRETPROBE_TRAMPOLINE probefs_kretprobe_trampoline, 0, 1
        KRETPROBE_TRAMPOLINE probefs_kretprobe_trampoline_call, 1, 1
        KRETPROBE_TRAMPOLINE probefs_kretprobe_trampoline_call_gpr, 1, 0
        .section .note.GNU-stack,"",@progbits
