/*
 * The return trampoline. A kretprobe's entry handler replaces a function's return address
 * with this code; the function's `ret` lands here with rsp = S, the caller's stack pointer.
 *
 * Frame, built below the caller's 128-byte red zone:
 *
 *   S            caller's stack (untouched)
 *   S-128..S     red zone of the caller (left alone)
 *   R+176..R+208 xmm0, xmm1: the floating-point return value, which C handlers may clobber
 *   R+168..R+176 padding
 *   R ..R+168    struct PtRegs (r15 at R, ..., ss at R+160)      R = S - 336
 *
 * Only what a return leaves live is saved and reloaded: the return value (ax, dx, xmm0,
 * xmm1) and the callee-saved registers; the fields of the dead ones (cx, si, di, r8-r11)
 * stay unfilled. probecore's function_return callback (regs) runs the return handlers and
 * returns the real return address; the live registers are reloaded from the frame (a
 * handler may change them, e.g. the return value in ax), and a jmp goes back to the
 * caller with rsp = S.
 *
 * probefs_kretprobe_trampoline_call is the same for returns that arrive through a
 * detour's call-mode block (optimize.cc): it goes back to the caller with a ret.
 */
#include "arch/x86_64/ptregs_frame.inc"

        /* name, leave by ret (call mode) rather than jmp */
        .macro  KRETPROBE_TRAMPOLINE name, by_ret
        .text
        .globl  \name
        .type   \name, @function
        .p2align 4
\name:
        .cfi_startproc
        .cfi_undefined rip
        lea     -336(%rsp), %rsp
        movups  %xmm0, 176(%rsp)
        movups  %xmm1, 192(%rsp)
        PTREGS_SAVE_RETURN_GPRS
        movq    $0, 128(%rsp)           /* ip: the handler learns it */
        pushfq
        popq    144(%rsp)               /* flags (address taken after the pop) */
        lea     336(%rsp), %rax
        mov     %rax, 152(%rsp)         /* sp = S */

        mov     %rsp, %rbx              /* rbx is callee-saved: the frame survives the call */
        and     $-16, %rsp
        mov     %rbx, %rdi
        call    *probefs_arch_function_return_cb(%rip)
        mov     %rbx, %rsp
        .if \by_ret
        mov     %rax, 328(%rsp)         /* S-8: dead below the caller's sp since its call */
        .else
        mov     %rax, 128(%rsp)
        .endif

        /* Flags are not restored: at a function's return they are dead (the System V ABI
           keeps none across a call, and DF is clear), and popfq is slow. */
        movups  176(%rsp), %xmm0
        movups  192(%rsp), %xmm1
        PTREGS_RESTORE_RETURN_GPRS
        .if \by_ret
        /* Call mode: the detour's own call consumed its return-stack entry, so the
           caller's entry is on top, and a ret to the caller is predicted. */
        lea     328(%rsp), %rsp
        ret
        .else
        /* r11 is dead at a return (scratch in the ABI, carries no return value). A jmp
           rather than a ret keeps the return-stack predictor in step with the calls: the
           probed function's ret already consumed its entry. */
        mov     128(%rsp), %r11
        lea     336(%rsp), %rsp         /* S */
        jmp     *%r11
        .endif
        .cfi_endproc
        .size   \name, .-\name
        .endm

        KRETPROBE_TRAMPOLINE probefs_kretprobe_trampoline, 0
        KRETPROBE_TRAMPOLINE probefs_kretprobe_trampoline_call, 1
        .section .note.GNU-stack,"",@progbits
