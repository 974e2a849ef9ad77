/*
 * A function with a part split off the way GCC does it (`NAME.cold` in .text.unlikely),
 * which jumps back into the middle of the function: a way in that the function's own
 * bytes do not show.
 *
 *   long pf_split(long x): |x| + 1
 *
 *   pf_split:      mov  %rdi,%rax          +0
 *   pf_split_join: add  $1,%rax            +3   <- pf_split.cold jumps here
 *                  test %rdi,%rdi          +7
 *                  js   pf_split.cold      +10
 *                  ret
 */
        .text
        .globl pf_split, pf_split_join
        .type pf_split, @function
        .p2align 4
pf_split:
        mov     %rdi, %rax
pf_split_join:
        add     $1, %rax
        test    %rdi, %rdi
        js      pf_split.cold
        ret
        .size pf_split, .-pf_split

        .section .text.unlikely,"ax",@progbits
        .type pf_split.cold, @function
pf_split.cold:
        neg     %rdi
        mov     %rdi, %rax
        jmp     pf_split_join
        .size pf_split.cold, .-pf_split.cold

        .section .note.GNU-stack,"",@progbits
