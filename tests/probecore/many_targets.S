/*
 * 256 small functions, one every 16 bytes, each long f(long x) = x + 1 with a frame, so
 * that every one can be jump-optimized: targets for the control-plane test of the
 * sanitizer build, which must probe code the sanitizers did not instrument.
 */
        .text
        .globl pf_many, pf_many_end
        .p2align 4
pf_many:
        .rept 256
        .p2align 4
        push    %rbp
        mov     %rsp, %rbp
        lea     1(%rdi), %rax
        pop     %rbp
        ret
        .endr
        .p2align 4
pf_many_end:
        .section .note.GNU-stack,"",@progbits

/*
 * Jumps from other functions into a function's first five bytes, which the function's own
 * checks cannot see. Each target is long f(long x) = x + 1: mov (3 bytes), then add (4
 * bytes, the jump lands on it), ret. Each source returns x + 101 through the target's add.
 *   pf_cross_short: reached by a short jmp (rel8) from pf_cross_short_src just before it
 *   pf_cross_long:  reached by a near jmp (rel32) from pf_cross_long_src, 512 bytes after
 *   pf_cross_decoy: reached by nothing; pf_cross_decoy_src holds a movabs whose immediate
 *                   reads as a jmp rel32 into its add (from inside another instruction)
 */
        .section .text.pf_cross, "ax", @progbits
        .globl pf_cross_short_src, pf_cross_short, pf_cross_short_end
        .globl pf_cross_long, pf_cross_long_end, pf_cross_long_src
        .globl pf_cross_decoy, pf_cross_decoy_end, pf_cross_decoy_src
        .p2align 4
pf_cross_short_src:
        mov     %rdi, %rax
        add     $100, %rax
        jmp     .Lcross_short_in
        .p2align 4
pf_cross_short:
        mov     %rdi, %rax
.Lcross_short_in:
        add     $1, %rax
        ret
pf_cross_short_end:

        .p2align 4
pf_cross_long:
        mov     %rdi, %rax
.Lcross_long_in:
        add     $1, %rax
        ret
pf_cross_long_end:
        .p2align 4
        .skip   512, 0xcc
pf_cross_long_src:
        mov     %rdi, %rax
        add     $100, %rax
        jmp     .Lcross_long_in
        .p2align 4
pf_cross_decoy:
        mov     %rdi, %rax
        add     $1, %rax
        ret
pf_cross_decoy_end:
        .p2align 4
pf_cross_decoy_src:
        .byte   0x48, 0xb8, 0xe9          /* movabs $imm64, %rax: the imm64 starts e9 */
        .long   pf_cross_decoy + 2 - (. + 4)
        .byte   0, 0, 0
        lea     101(%rdi), %rax
        ret
        .section .note.GNU-stack,"",@progbits
