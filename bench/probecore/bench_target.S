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
        .section .note.GNU-stack,"",@progbits
