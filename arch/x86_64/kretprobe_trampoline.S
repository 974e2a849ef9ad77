/*
 * The return trampolines. A kretprobe's entry handler replaces a function's return address
 * with the plain trampoline (kretprobe_trampoline()); the function's `ret` lands there
 * with rsp = S, the caller's stack pointer.
 *
 * Every register but rsp is given back as it was (handlers may change the general-purpose
 * ones through PtRegs, e.g. the return value in ax): with interprocedural register
 * allocation (GCC's -fipa-ra, on at -O2) a caller may keep values in registers the ABI
 * calls scratch across a call to a function it knows does not touch them. Only the flags
 * are not restored: no compiler keeps them across a call, DF is clear, and popfq is slow.
 *
 * Frame (R = S - frame):
 *
 *   S            caller's stack (untouched)
 *   S-8          the real return address, on the way out
 *   S-128..S     red zone of S: a signal delivered here leaves it alone
 *   R+176..      the vector registers of the level (see optprobe_thunk.S)
 *   R+168..R+176 padding
 *   R ..R+168    struct PtRegs (r15 at R, ..., ss at R+160)
 * (frame_layout.h names these offsets: FRAME_VECTOR_AREA, FRAME_SPARE, PTREGS_*)
 *
 * probecore's function_return callback (regs, whose ip it fills) runs the return handlers
 * and returns the real return address A, which goes to S-8; registers are reloaded, rsp
 * goes back to S. The plain trampolines have a second entry, _twice, for functions that
 * return twice (setjmp: the hijacked address is saved in the jmp_buf, and longjmp comes
 * back through it): the callback tells the two apart by regs->ip, which holds the entry
 * the return came through.
 *
 *   probefs_kretprobe_trampoline_<level>       leaves with jmp *-8(%rsp): the function's
 *                                              ret already consumed the caller's return-
 *                                              stack entry; a jmp keeps the predictor in step
 *   probefs_kretprobe_trampoline_call_<level>  returns that arrive through a detour's call-
 *                                              mode block (optimize.cc): the detour's own
 *                                              call consumed its entry, the caller's is on
 *                                              top, and a ret to A is predicted. _gpr: for
 *                                              return handlers that touch general-purpose
 *                                              registers only
 */
#include "arch/x86_64/ptregs_frame.inc"

        /* name, leave by ret rather than jmp, vector level (0: none) */
        .macro  KRETPROBE_TRAMPOLINE name, by_ret, vector
        .if \vector
        .set    frame, FRAME_VECTOR_AREA + VECTOR_AREA_\vector + RED_ZONE
        .else
        .set    frame, FRAME_VECTOR_AREA + RED_ZONE
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
        .if !\by_ret
        lea     \name(%rip), %rax
1:      mov     %rax, PTREGS_IP(%rsp)   /* the entry this return came through */
        .endif
        VECTOR_SAVE \vector, FRAME_VECTOR_AREA
        pushfq
        popq    PTREGS_FLAGS(%rsp)      /* (address taken after the pop) */
        lea     frame(%rsp), %rax
        mov     %rax, PTREGS_SP(%rsp)   /* S */

        mov     %rsp, %rbx              /* rbx is callee-saved: the frame survives the call */
        and     $-16, %rsp
        mov     %rbx, %rdi
        call    *probefs_arch_function_return_cb(%rip)
        mov     %rbx, %rsp
        mov     %rax, (frame - 8)(%rsp) /* S-8: dead below the caller's sp since its call */

        VECTOR_RESTORE \vector, FRAME_VECTOR_AREA
        PTREGS_RESTORE_GPRS
        .if \by_ret
        lea     (frame - 8)(%rsp), %rsp
        ret
        .else
        lea     frame(%rsp), %rsp       /* S */
        jmp     *-8(%rsp)

        /* The second entry, for functions that return twice: the same, with its own
           address as ip. */
        .globl  \name\()_twice
        .type   \name\()_twice, @function
\name\()_twice:
        lea     -frame(%rsp), %rsp
        PTREGS_SAVE_GPRS
        lea     \name\()_twice(%rip), %rax
        jmp     1b
        .endif
        .cfi_endproc
        .size   \name, .-\name
        .endm

        KRETPROBE_TRAMPOLINE probefs_kretprobe_trampoline_sse, 0, 1
        KRETPROBE_TRAMPOLINE probefs_kretprobe_trampoline_avx, 0, 2
        KRETPROBE_TRAMPOLINE probefs_kretprobe_trampoline_avx512, 0, 3
        KRETPROBE_TRAMPOLINE probefs_kretprobe_trampoline_call_gpr, 1, 0
        KRETPROBE_TRAMPOLINE probefs_kretprobe_trampoline_call_sse, 1, 1
        KRETPROBE_TRAMPOLINE probefs_kretprobe_trampoline_call_avx, 1, 2
        KRETPROBE_TRAMPOLINE probefs_kretprobe_trampoline_call_avx512, 1, 3
        .section .note.GNU-stack,"",@progbits
