// Hand-written functions for the jump-optimization checks, where the byte layout is the
// point of the test (see optimize_check_fixtures.h).
        .text
        .globl  optimize_check_loop_to_entry_plus_2
        .type   optimize_check_loop_to_entry_plus_2, @function
        .p2align 4
optimize_check_loop_to_entry_plus_2:
        xor     %eax, %eax      // 31 c0
1:      add     $1, %rax        // 48 83 c0 01   <- entry + 2: a branch target
        sub     $1, %rdi        // 48 83 ef 01
        jnz     1b              // 75 f6
        ret
        .size   optimize_check_loop_to_entry_plus_2, . - optimize_check_loop_to_entry_plus_2

        .section .note.GNU-stack, "", @progbits
