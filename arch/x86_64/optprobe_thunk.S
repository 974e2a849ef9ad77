/*
 * The shared thunks of jump-optimized probes. A probe's detour (optimize.cc) has blocks
 * that start with
 *
 *   D+0   .quad ctx_cell       -> probecore's aggregate (0 while being removed)
 *   D+8   .quad thunk          the address of one of the two thunks below
 *   D+16  .quad addr           the probe address
 *   D+24  .quad miss_back      0, or how far back the plain block's R lies (call mode)
 *   D+32  .quad trampoline     the call-mode return trampoline
 *   D+40  lea -128(%rsp),%rsp  step over the red zone of the interrupted code
 *   D+45  call *D+8(%rip)
 *   D+51  <- R, the return address the call pushes
 *
 * Frame built here, with S the stack pointer at the probe:
 *
 *   S-128..S       red zone of the interrupted code (untouched)
 *   S-136          R
 *   S-392..S-136   xmm0..xmm15 (handlers are C: every xmm register is theirs to clobber)
 *   S-568..S-392   struct PtRegs (r15 lowest), 168 bytes + 8 of padding
 *
 * probefs_optprobe_thunk_gpr leaves the vector registers out (its frame is PtRegs alone,
 * from S-312): it serves probes whose handlers all promise to touch general-purpose
 * registers only (KPROBE_FLAG_GPR_ONLY, handlers built with -mgeneral-regs-only).
 *
 * Registers are saved into the same PtRegs as the trap path fills, handlers run through
 * probecore's optimized_hit callback (D->ctx_cell, regs), and everything but ip and sp is
 * reloaded from the frame (a handler's change of ip is ignored for optimized probes, as
 * in kprobes).
 *
 * The _entry thunks serve call-mode blocks, which sit at function entries: a block that
 * runs the function as a call of its own, which is right only when a handler put the
 * return trampoline into the return address at S. When none did, the thunk returns to
 * the plain block instead: R - miss_back. At a function entry the ABI makes the flags
 * and xmm8-15 dead and DF clear: these thunks do not restore the flags, leave xmm8-15
 * alone, and need no cld.
 */
#include "arch/x86_64/ptregs_frame.inc"

        /* After the handlers of a call-mode block: stay in call mode (return to R) if a
           handler hijacked the return address at S, else go back to the plain block. */
        .macro  CALL_MODE_OR_PLAIN frame
        lea     probefs_kretprobe_trampoline(%rip), %rax
        cmp     %rax, (\frame + 136)(%rsp)
        je      2f
        mov     \frame(%rsp), %rcx      /* R */
        mov     -27(%rcx), %rdx         /* D->miss_back */
        sub     %rdx, \frame(%rsp)      /* nothing hijacked: the plain block */
2:
        .endm

        /* name, frame size below R, save the vector registers?, call-mode entry? */
        .macro  OPTPROBE_THUNK name, frame, vector, entry
        .text
        .globl  \name
        .type   \name, @function
        .p2align 4
\name:
        .cfi_startproc
        .cfi_undefined rip
        lea     -\frame(%rsp), %rsp
        PTREGS_SAVE_GPRS
        .if \vector
        movups  %xmm0, 176(%rsp)
        movups  %xmm1, 192(%rsp)
        movups  %xmm2, 208(%rsp)
        movups  %xmm3, 224(%rsp)
        movups  %xmm4, 240(%rsp)
        movups  %xmm5, 256(%rsp)
        movups  %xmm6, 272(%rsp)
        movups  %xmm7, 288(%rsp)
        .if !\entry             /* at a function entry only xmm0-7 carry values */
        movups  %xmm8, 304(%rsp)
        movups  %xmm9, 320(%rsp)
        movups  %xmm10, 336(%rsp)
        movups  %xmm11, 352(%rsp)
        movups  %xmm12, 368(%rsp)
        movups  %xmm13, 384(%rsp)
        movups  %xmm14, 400(%rsp)
        movups  %xmm15, 416(%rsp)
        .endif
        .endif
        pushfq
        popq    144(%rsp)               /* flags (address taken after the pop) */
        .if !\entry                     /* (at a function entry the ABI has DF clear) */
        cld                             /* handlers are C: the ABI wants DF clear */
        .endif
        lea     (\frame + 136)(%rsp), %rax
        mov     %rax, 152(%rsp)         /* sp = S */

        mov     \frame(%rsp), %rdi      /* R */
        mov     -35(%rdi), %rax         /* D->addr (D = R - 51) */
        inc     %rax
        mov     %rax, 128(%rsp)         /* ip: the probe address + 1, as on the int3 path */
        mov     -51(%rdi), %rdi         /* D->ctx_cell */
        mov     %rsp, %rsi
        mov     $(2 + \vector), %edx    /* saved: kSavedAllRegs, kSavedVector */
        mov     %rsp, %rbx              /* callee-saved: the frame survives the call */
        and     $-16, %rsp
        call    *probefs_arch_optimized_hit_cb(%rip)
        mov     %rbx, %rsp

        .if \entry
        CALL_MODE_OR_PLAIN \frame
        .endif

        .if \vector
        movups  176(%rsp), %xmm0
        movups  192(%rsp), %xmm1
        movups  208(%rsp), %xmm2
        movups  224(%rsp), %xmm3
        movups  240(%rsp), %xmm4
        movups  256(%rsp), %xmm5
        movups  272(%rsp), %xmm6
        movups  288(%rsp), %xmm7
        .if !\entry             /* at a function entry only xmm0-7 carry values */
        movups  304(%rsp), %xmm8
        movups  320(%rsp), %xmm9
        movups  336(%rsp), %xmm10
        movups  352(%rsp), %xmm11
        movups  368(%rsp), %xmm12
        movups  384(%rsp), %xmm13
        movups  400(%rsp), %xmm14
        movups  416(%rsp), %xmm15
        .endif
        .endif
        /* The flags, without popfq (slow): DF by itself, OF through an add that overflows
           exactly when it was set, the low byte (SF ZF AF PF CF) with sahf. rax and rcx
           are reloaded after, by movs that leave the flags alone. At a function entry
           they are dead (the ABI keeps none across a call). */
        .if !\entry
        mov     144(%rsp), %rax
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
        lea     \frame(%rsp), %rsp
        ret
        .cfi_endproc
        .size   \name, .-\name
        .endm

        OPTPROBE_THUNK probefs_optprobe_thunk, 432, 1, 0
        OPTPROBE_THUNK probefs_optprobe_thunk_gpr, 176, 0, 0
        OPTPROBE_THUNK probefs_optprobe_thunk_entry, 432, 1, 1
        OPTPROBE_THUNK probefs_optprobe_thunk_gpr_entry, 176, 0, 1


/*
 * The lean entry thunk, for call-mode blocks whose handlers need neither every register
 * nor the vector ones (DetourEntry::kCallLean: a return probe's own entry handler, which
 * reads sp). It saves what a C call clobbers, and rbx, which holds the frame; PtRegs gets
 * those and sp, and the rest of it stays unfilled. Frame: as probefs_optprobe_thunk_gpr.
 */
        .text
        .globl  probefs_optprobe_thunk_lean_entry
        .type   probefs_optprobe_thunk_lean_entry, @function
        .p2align 4
probefs_optprobe_thunk_lean_entry:
        .cfi_startproc
        .cfi_undefined rip
        lea     -176(%rsp), %rsp
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
        lea     (176 + 136)(%rsp), %rax
        mov     %rax, 152(%rsp)         /* sp = S */
        mov     176(%rsp), %rdi         /* R */
        mov     -51(%rdi), %rdi         /* D->ctx_cell */
        mov     %rsp, %rsi
        xor     %edx, %edx              /* saved: no more than that */
        mov     %rsp, %rbx
        and     $-16, %rsp
        call    *probefs_arch_optimized_lean_entry_cb(%rip)
        mov     %rbx, %rsp
        CALL_MODE_OR_PLAIN 176
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
        lea     176(%rsp), %rsp
        ret
        .cfi_endproc
        .size   probefs_optprobe_thunk_lean_entry, .-probefs_optprobe_thunk_lean_entry

        .section .note.GNU-stack,"",@progbits
