/*
 * The probed function of the overhead benchmark: long bench_target(long x) = x + 1.
 * Its first instruction is an `lea`, which the int3 path must run out of line (boosted) or
 * single-step; it is not one the trap handler can emulate.
 */
        .text
        .globl bench_target, bench_target_end
        .type bench_target, @function
        .p2align 4
bench_target:
        lea     1(%rdi), %rax
        ret
bench_target_end:
        .size bench_target, .-bench_target

/*
 * The registration benchmark's targets: 2600 small functions, one every 16 bytes, each
 * long f(long x) = x + 1 with a frame, so that every one can be jump-optimized.
 */
        .globl bench_reg_targets, bench_reg_targets_end
        .p2align 4
bench_reg_targets:
        .rept 2600
        .p2align 4
        push    %rbp
        mov     %rsp, %rbp
        lea     1(%rdi), %rax
        pop     %rbp
        ret
        .endr
        .p2align 4
bench_reg_targets_end:
        .section .note.GNU-stack,"",@progbits
