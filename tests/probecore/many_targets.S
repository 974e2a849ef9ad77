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
