/*
 * The return trampoline. A kretprobe's entry handler replaces a function's return address
 * with this code; the function's `ret` lands here with rsp = S, the caller's stack pointer.
 *
 * Frame, built below the caller's 128-byte red zone:
 *
 *   S            caller's stack (untouched)
 *   S-8          the real return address, written just before the final `ret`
 *   S-128..S     red zone of the caller (left alone, but for S-8 at the very end)
 *   R+168..R+176 padding
 *   R ..R+168    struct PtRegs (r15 at R, ..., ss at R+160)      R = S - 304
 *
 * probefs_arch_function_return(regs) runs the return handlers and returns the real return
 * address; registers are then reloaded from the frame (a handler may change them, e.g. the
 * return value in ax) and `ret` goes back to the caller with rsp = S.
 */
        .text
        .globl  probefs_kretprobe_trampoline
        .type   probefs_kretprobe_trampoline, @function
        .p2align 4
probefs_kretprobe_trampoline:
        .cfi_startproc
        .cfi_undefined rip
        lea     -304(%rsp), %rsp
        mov     %r15, 0(%rsp)
        mov     %r14, 8(%rsp)
        mov     %r13, 16(%rsp)
        mov     %r12, 24(%rsp)
        mov     %rbp, 32(%rsp)
        mov     %rbx, 40(%rsp)
        mov     %r11, 48(%rsp)
        mov     %r10, 56(%rsp)
        mov     %r9, 64(%rsp)
        mov     %r8, 72(%rsp)
        mov     %rax, 80(%rsp)
        mov     %rcx, 88(%rsp)
        mov     %rdx, 96(%rsp)
        mov     %rsi, 104(%rsp)
        mov     %rdi, 112(%rsp)
        movq    $-1, 120(%rsp)          /* orig_ax */
        movq    $0, 128(%rsp)           /* ip: the handler learns it */
        movq    $0x33, 136(%rsp)        /* cs */
        pushfq
        popq    144(%rsp)               /* flags (address taken after the pop) */
        lea     304(%rsp), %rax
        mov     %rax, 152(%rsp)         /* sp = S */
        movq    $0x2b, 160(%rsp)        /* ss */

        mov     %rsp, %rbx              /* rbx is callee-saved: the frame survives the call */
        and     $-16, %rsp
        mov     %rbx, %rdi
        call    probefs_arch_function_return
        mov     %rbx, %rsp
        mov     %rax, 128(%rsp)
        mov     %rax, 296(%rsp)         /* the real return address at S-8 */

        pushq   144(%rsp)               /* flags (address taken before the push) */
        popfq
        mov     0(%rsp), %r15
        mov     8(%rsp), %r14
        mov     16(%rsp), %r13
        mov     24(%rsp), %r12
        mov     32(%rsp), %rbp
        mov     40(%rsp), %rbx
        mov     48(%rsp), %r11
        mov     56(%rsp), %r10
        mov     64(%rsp), %r9
        mov     72(%rsp), %r8
        mov     80(%rsp), %rax
        mov     88(%rsp), %rcx
        mov     96(%rsp), %rdx
        mov     104(%rsp), %rsi
        mov     112(%rsp), %rdi
        lea     296(%rsp), %rsp         /* S-8, where the real return address is */
        ret
        .cfi_endproc
        .size   probefs_kretprobe_trampoline, .-probefs_kretprobe_trampoline
        .section .note.GNU-stack,"",@progbits
