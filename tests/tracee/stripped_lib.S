// Two functions with no symbol in the stripped library (hidden, so absent from .dynsym;
// strip removes .symtab), each with its own FDE. Their CFA rules change in the middle, so
// a lookup that returned only the CFA row around an address, rather than the whole FDE,
// would report narrower bounds than [start, end).
        .text

        .p2align 4
        .type probefs_hidden_a, @function
probefs_hidden_a:
        .cfi_startproc
        pushq %rbp
        .cfi_def_cfa_offset 16
        .cfi_offset %rbp, -16
        movq %rsp, %rbp
        .cfi_def_cfa_register %rbp
        leal (%rdi,%rdi), %eax
        nop; nop; nop; nop; nop; nop; nop; nop
        popq %rbp
        .cfi_def_cfa %rsp, 8
        ret
        .cfi_endproc
probefs_hidden_a_end:
        .size probefs_hidden_a, .-probefs_hidden_a

        // Directly after probefs_hidden_a: the two FDEs meet without a gap.
        .type probefs_hidden_b, @function
probefs_hidden_b:
        .cfi_startproc
        pushq %rbx
        .cfi_def_cfa_offset 16
        .cfi_offset %rbx, -16
        leal 1(%rdi), %eax
        nop; nop; nop; nop
        popq %rbx
        .cfi_def_cfa_offset 8
        ret
        .cfi_endproc
probefs_hidden_b_end:
        .size probefs_hidden_b, .-probefs_hidden_b

        // Exported but without .size: its .dynsym entry has size 0, so its bounds too must
        // come from the FDE, while the symbol still names it.
        .globl probefs_stripped_unsized
        .type probefs_stripped_unsized, @function
probefs_stripped_unsized:
probefs_stripped_unsized_local:  // a local alias: PC-relative, no GOT entry needed
        .cfi_startproc
        pushq %r12
        .cfi_def_cfa_offset 16
        .cfi_offset %r12, -16
        movl %edi, %eax
        nop; nop; nop; nop
        popq %r12
        .cfi_def_cfa_offset 8
        ret
        .cfi_endproc
probefs_stripped_unsized_end:

        // void probefs_stripped_hidden_ranges(uintptr_t out[6]):
        // out = {a start, a end, b start, b end, unsized start, unsized end}.
        .globl probefs_stripped_hidden_ranges
        .type probefs_stripped_hidden_ranges, @function
probefs_stripped_hidden_ranges:
        .cfi_startproc
        leaq probefs_hidden_a(%rip), %rax
        movq %rax, 0(%rdi)
        leaq probefs_hidden_a_end(%rip), %rax
        movq %rax, 8(%rdi)
        leaq probefs_hidden_b(%rip), %rax
        movq %rax, 16(%rdi)
        leaq probefs_hidden_b_end(%rip), %rax
        movq %rax, 24(%rdi)
        leaq probefs_stripped_unsized_local(%rip), %rax
        movq %rax, 32(%rdi)
        leaq probefs_stripped_unsized_end(%rip), %rax
        movq %rax, 40(%rdi)
        ret
        .cfi_endproc
        .size probefs_stripped_hidden_ranges, .-probefs_stripped_hidden_ranges

        .section .note.GNU-stack,"",@progbits
