/*
 * The shared thunks of jump-optimized probes. A probe's detour (optimize.cc) has blocks
 * that start with
 *
 *   D+0   .quad ctx_cell       -> probecore's aggregate (0 while being removed)
 *   D+8   .quad thunk          the address of one of the thunks below
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

        /* Before the handlers of a call-mode block: the return address at S, into the
           padding after PtRegs. */
        .macro  KEEP_RETURN_ADDRESS frame
        mov     (\frame + 136)(%rsp), %rax
        mov     %rax, 168(%rsp)
        .endm

        /* After them: stay in call mode (return to R) if a handler of this hit replaced
           the return address at S by the trampoline; else go back to the plain block. */
        .macro  CALL_MODE_OR_PLAIN frame
        mov     (\frame + 136)(%rsp), %rax
        cmp     168(%rsp), %rax
        je      1f
        cmp     probefs_arch_plain_trampoline(%rip), %rax
        je      2f
1:      mov     \frame(%rsp), %rcx      /* R */
        mov     -27(%rcx), %rdx         /* D->miss_back */
        sub     %rdx, \frame(%rsp)      /* nothing hijacked: the plain block */
2:
        .endm

        /* name, vector level (0: none), call-mode entry? */
        .macro  OPTPROBE_THUNK name, vector, entry
        .if \vector
        .set    frame, 176 + VECTOR_AREA_\vector
        .else
        .set    frame, 176
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
        VECTOR_SAVE \vector, 176
        pushfq
        popq    144(%rsp)               /* flags (address taken after the pop) */
        .if !\entry
        cld                             /* handlers are C: the ABI wants DF clear */
        .endif
        lea     (frame + 136)(%rsp), %rax
        mov     %rax, 152(%rsp)         /* sp = S */
        .if \entry
        KEEP_RETURN_ADDRESS frame
        .endif

        mov     frame(%rsp), %rdi       /* R */
        mov     -35(%rdi), %rax         /* D->addr (D = R - 51) */
        inc     %rax
        mov     %rax, 128(%rsp)         /* ip: the probe address + 1, as on the int3 path */
        mov     -51(%rdi), %rdi         /* D->ctx_cell */
        mov     %rsp, %rsi
        .if \vector
        mov     $3, %edx                /* saved: kSavedAllRegs | kSavedVector */
        .else
        mov     $2, %edx                /* saved: kSavedAllRegs */
        .endif
        mov     %rsp, %rbx              /* callee-saved: the frame survives the call */
        and     $-16, %rsp
        call    *probefs_arch_optimized_hit_cb(%rip)
        mov     %rbx, %rsp

        .if \entry
        CALL_MODE_OR_PLAIN frame
        .endif
        VECTOR_RESTORE \vector, 176
        .if !\entry
        /* The flags, without popfq (slow): DF by itself, OF through an add that overflows
           exactly when it was set, the low byte (SF ZF AF PF CF) with sahf. rax and rcx
           are reloaded after, by movs that leave the flags alone. */
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
        lea     frame(%rsp), %rsp
        ret
        .cfi_endproc
        .size   \name, .-\name
        .endm

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
        KEEP_RETURN_ADDRESS 176
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
