/*
 * Functions written instruction by instruction so that tests can put probes on exact kinds
 * of instruction. Each probe point has a global label; each function ends with a *_end
 * label that gives its bounds.
 *
 * long pf_mix(long x): returns x * 3 + 7 + pf_mix_bias (+100 when x >= 10), through a push,
 * a rip-relative load, a relative call, a conditional jump, a pop and a ret.
 */
        .text
        .globl pf_mix, pf_mix_end, pf_mix_push, pf_mix_riprel, pf_mix_call, pf_mix_jcc
        .globl pf_mix_pop, pf_mix_ret, pf_mix_bias
        .type pf_mix, @function
        .p2align 4
pf_mix:
pf_mix_push:
        push    %rbx
        mov     %rdi, %rbx
pf_mix_riprel:
        mov     pf_mix_bias(%rip), %rax
        mov     %rbx, %rdi
        add     %rax, %rdi
pf_mix_call:
        call    pf_times3_plus7
        cmp     $10, %rbx
pf_mix_jcc:
        jl      1f
        add     $100, %rax
1:
pf_mix_pop:
        pop     %rbx
pf_mix_ret:
        ret
pf_mix_end:
        .size pf_mix, .-pf_mix

        .type pf_times3_plus7, @function
        .p2align 4
pf_times3_plus7:
        lea     (%rdi,%rdi,2), %rax
        add     $7, %rax
        ret
        .size pf_times3_plus7, .-pf_times3_plus7

/*
 * long pf_loop_sum(long n): 1 + 2 + ... + n with the `loop` instruction; also a jmp rel8
 * and an indirect call through a register.
 */
        .globl pf_loop_sum, pf_loop_sum_end, pf_loop_sum_loop, pf_loop_sum_jmp, pf_loop_sum_icall
        .type pf_loop_sum, @function
        .p2align 4
pf_loop_sum:
        xor     %eax, %eax
        mov     %rdi, %rcx
        test    %rcx, %rcx
        jz      2f
1:      add     %rcx, %rax
pf_loop_sum_loop:
        loop    1b
2:
pf_loop_sum_jmp:
        jmp     3f
        ud2
3:      lea     pf_identity(%rip), %rdx
        mov     %rax, %rdi
        sub     $8, %rsp
pf_loop_sum_icall:
        call    *%rdx
        add     $8, %rsp
        ret
pf_loop_sum_end:
        .size pf_loop_sum, .-pf_loop_sum

        .type pf_identity, @function
pf_identity:
        mov     %rdi, %rax
        ret
        .size pf_identity, .-pf_identity

/*
 * long pf_leaf_redzone(long x): a leaf that keeps a value in its red zone across a probe
 * point; returns x + 1 when the red zone survived.
 */
        .globl pf_leaf_redzone, pf_leaf_redzone_end, pf_leaf_redzone_mid
        .type pf_leaf_redzone, @function
        .p2align 4
pf_leaf_redzone:
        mov     %rdi, -8(%rsp)
        mov     %rdi, -64(%rsp)
        mov     %rdi, -120(%rsp)
pf_leaf_redzone_mid:
        nop
        mov     -8(%rsp), %rax
        cmp     -64(%rsp), %rax
        jne     1f
        cmp     -120(%rsp), %rax
        jne     1f
        add     $1, %rax
        ret
1:      xor     %eax, %eax
        ret
pf_leaf_redzone_end:
        .size pf_leaf_redzone, .-pf_leaf_redzone


/*
 * long pf_jump_into(long x): max(x + 1, 10), through a loop whose head is the second
 * instruction: a jump into the first five bytes, so the entry cannot be jump-optimized.
 */
        .text
        .globl pf_jump_into, pf_jump_into_end
        .type pf_jump_into, @function
        .p2align 4
pf_jump_into:
        mov     %rdi, %rax              /* 3 bytes */
1:      add     $1, %rax                /* 4 bytes: bytes 3..6, inside the jmp's 5 */
        cmp     $10, %rax
        jl      1b
        ret
pf_jump_into_end:
        .size pf_jump_into, .-pf_jump_into

/*
 * long pf_jtab(long x): 2 for x in {0, 1}, else x + 1. A jump table whose entry 0 is the
 * second instruction, inside the first five bytes.
 */
        .globl pf_jtab, pf_jtab_end
        .type pf_jtab, @function
        .p2align 4
pf_jtab:
        mov     %rdi, %rax              /* 3 bytes */
.Ljtab_case0:
        add     $1, %rax                /* 4 bytes */
        cmp     $1, %rdi
        ja      .Ljtab_done
        lea     .Ljtab_table(%rip), %rdx
        movslq  (%rdx,%rdi,4), %rcx
        add     %rdx, %rcx
        mov     $2, %rdi
        jmp     *%rcx
.Ljtab_done:
        ret
pf_jtab_end:
        .size pf_jtab, .-pf_jtab
        .section .rodata
        .p2align 2
.Ljtab_table:
        .long   .Ljtab_case0 - .Ljtab_table
        .long   .Ljtab_done - .Ljtab_table
        .text

/*
 * long pf_two_step(long x): x * 2 + 3 through a 3-byte and a 4-byte instruction, for the
 * test that parks a thread between them.
 */
        .globl pf_two_step, pf_two_step_end, pf_two_step_second
        .type pf_two_step, @function
        .p2align 4
pf_two_step:
        lea     (%rdi,%rdi), %rax       /* 4 bytes */
pf_two_step_second:
        add     $3, %rax                /* 4 bytes */
        nop
        ret
pf_two_step_end:
        .size pf_two_step, .-pf_two_step

/*
 * unsigned long pf_flags_keep(unsigned long flags): loads `flags` into rflags, passes a
 * probe point, and returns the flags it then sees (CF PF AF ZF SF DF OF), so a test can
 * check that a probe hit gave back every flag the program had, DF and OF included.
 */
        .globl pf_flags_keep, pf_flags_keep_end, pf_flags_keep_probe
        .type pf_flags_keep, @function
        .p2align 4
pf_flags_keep:
        push    %rdi
        popfq
pf_flags_keep_probe:
        lea     0(%rax), %rax           /* 4 bytes */
        nop                             /* 1 byte: the region is 5 bytes */
        pushfq
        pop     %rax
        cld
        and     $0xcd5, %rax
        ret
pf_flags_keep_end:
        .size pf_flags_keep, .-pf_flags_keep

/*
 * double pf_xmm_keep(double a): 2a, kept in xmm7 and xmm15 across a probe point (and in
 * xmm0 for the return), so a test can check that a hit gives back the vector registers.
 */
        .globl pf_xmm_keep, pf_xmm_keep_end, pf_xmm_keep_probe
        .type pf_xmm_keep, @function
        .p2align 4
pf_xmm_keep:
        movapd  %xmm0, %xmm7
        addsd   %xmm0, %xmm7
        movapd  %xmm7, %xmm15
pf_xmm_keep_probe:
        lea     0(%rax), %rax           /* 4 bytes */
        nop                             /* 1 byte */
        subsd   %xmm15, %xmm7           /* 0 when xmm7 and xmm15 both survived */
        addsd   %xmm15, %xmm7
        movapd  %xmm7, %xmm0
        ret
pf_xmm_keep_end:
        .size pf_xmm_keep, .-pf_xmm_keep

/*
 * long pf_load_second(const long* p): *p, through a 2-byte and a 3-byte instruction; the
 * load is the second, inside the first five bytes, where a test makes it fault.
 */
        .globl pf_load_second, pf_load_second_end, pf_load_second_load
        .type pf_load_second, @function
        .p2align 4
pf_load_second:
        xor     %eax, %eax              /* 2 bytes */
pf_load_second_load:
        mov     (%rdi), %rax            /* 3 bytes */
        ret
pf_load_second_end:
        .size pf_load_second, .-pf_load_second

/*
 * long pf_tail_outer(long x) = x + 3: adds 2, then tail-calls pf_tail_inner (x + 1) with a
 * jmp, so pf_tail_inner starts with the caller's return address still in place, hijacked
 * if pf_tail_outer has a return probe.
 */
        .globl pf_tail_outer, pf_tail_outer_end, pf_tail_inner, pf_tail_inner_end
        .type pf_tail_outer, @function
        .p2align 4
pf_tail_outer:
        lea     2(%rdi), %rdi           /* 4 bytes */
        jmp     pf_tail_inner           /* 5 bytes */
pf_tail_outer_end:
        .size pf_tail_outer, .-pf_tail_outer

        .type pf_tail_inner, @function
        .p2align 4
pf_tail_inner:
        mov     %rdi, %rax              /* 3 bytes */
        add     $1, %rax                /* 4 bytes */
        ret
pf_tail_inner_end:
        .size pf_tail_inner, .-pf_tail_inner

/*
 * long pf_call_with_r12(long (*fn)(long, long), long x, long r12): fn(x, 1) called with
 * r12 = the third argument, so that a handler at fn's entry can check the r12 it sees.
 */
        .globl pf_call_with_r12
        .type pf_call_with_r12, @function
        .p2align 4
pf_call_with_r12:
        push    %r12
        mov     %rdx, %r12
        mov     %rdi, %rax
        mov     %rsi, %rdi
        mov     $1, %esi
        call    *%rax
        pop     %r12
        ret
        .size pf_call_with_r12, .-pf_call_with_r12

/*
 * long pf_leaf_add1(long x) = x + 1, touching rax alone.
 */
        .globl pf_leaf_add1, pf_leaf_add1_end
        .type pf_leaf_add1, @function
        .p2align 4
pf_leaf_add1:
        lea     1(%rdi), %rax           /* 4 bytes */
        nop                             /* 1 byte: the region is 5 bytes */
        ret
pf_leaf_add1_end:
        .size pf_leaf_add1, .-pf_leaf_add1

/*
 * unsigned long pf_scratch_kept(long (*fn)(long)): calls fn(41) as a caller compiled with
 * interprocedural register allocation may call a function it knows: with values it still
 * needs in the registers the ABI calls scratch (rcx rdx rsi r8-r11, xmm1-15), because fn
 * does not touch them. Returns a mask of those that came back changed (bit 0..6: rcx rdx
 * rsi r8 r9 r10 r11; bit 7+k: xmm k), or 1 << 31 when fn's result is not 42.
 */
        .globl pf_scratch_kept
        .type pf_scratch_kept, @function
        .p2align 4
pf_scratch_kept:
        push    %rbx
        push    %r12
        sub     $8, %rsp
        mov     %rdi, %rax
        mov     $0x1111, %ecx
        mov     $0x2222, %edx
        mov     $0x3333, %esi
        mov     $0x4444, %r8d
        mov     $0x5555, %r9d
        mov     $0x6666, %r10d
        mov     $0x7777, %r11d
        .irp    n, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
        mov     $(0x100 + \n), %ebx
        movq    %rbx, %xmm\n
        .endr
        mov     $41, %edi
        call    *%rax
        xor     %r12d, %r12d
        cmp     $42, %rax
        je      1f
        bts     $31, %r12
1:      xor     %ebx, %ebx
        cmp     $0x1111, %rcx
        setne   %bl
        or      %rbx, %r12
        cmp     $0x2222, %rdx
        setne   %bl
        shl     $1, %rbx
        or      %rbx, %r12
        xor     %ebx, %ebx
        cmp     $0x3333, %rsi
        setne   %bl
        shl     $2, %rbx
        or      %rbx, %r12
        xor     %ebx, %ebx
        cmp     $0x4444, %r8
        setne   %bl
        shl     $3, %rbx
        or      %rbx, %r12
        xor     %ebx, %ebx
        cmp     $0x5555, %r9
        setne   %bl
        shl     $4, %rbx
        or      %rbx, %r12
        xor     %ebx, %ebx
        cmp     $0x6666, %r10
        setne   %bl
        shl     $5, %rbx
        or      %rbx, %r12
        xor     %ebx, %ebx
        cmp     $0x7777, %r11
        setne   %bl
        shl     $6, %rbx
        or      %rbx, %r12
        .irp    n, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15
        movq    %xmm\n, %rax
        xor     %ebx, %ebx
        cmp     $(0x100 + \n), %rax
        setne   %bl
        shl     $(7 + \n), %rbx
        or      %rbx, %r12
        .endr
        mov     %r12, %rax
        add     $8, %rsp
        pop     %r12
        pop     %rbx
        ret
        .size pf_scratch_kept, .-pf_scratch_kept

/*
 * unsigned long pf_wide_keep(long avx512): keeps all-ones in ymm8 and ymm15 (with avx512
 * nonzero: in zmm8, zmm15, zmm16, zmm31 and all 64 bits of k1) across a probe point, then
 * returns a mask of those that lost any bit (1: 8, 2: 15, 4: zmm16, 8: zmm31, 16: k1).
 * Needs AVX2 (and AVX-512 F and BW for avx512).
 * The AVX-512 instructions live in helpers (their own convention: they keep rdi and touch
 * nothing else but rax, rcx, ymm9-10, zmm17 and k2), since the disassembler that proves
 * instruction boundaries in a probed function does not know them.
 */
        .globl pf_wide_keep, pf_wide_keep_end, pf_wide_keep_probe
        .type pf_wide_keep, @function
        .p2align 4
pf_wide_keep:
        sub     $8, %rsp
        call    pf_wide_set
pf_wide_keep_probe:
        .byte   0x0f, 0x1f, 0x44, 0x00, 0x00  /* nopl 0(%rax,%rax,1), 5 bytes: the region */
        call    pf_wide_check
        add     $8, %rsp
        ret
pf_wide_keep_end:
        .size pf_wide_keep, .-pf_wide_keep

        .type pf_wide_set, @function
pf_wide_set:
        test    %rdi, %rdi
        jnz     1f
        vpcmpeqd %ymm8, %ymm8, %ymm8
        vpcmpeqd %ymm15, %ymm15, %ymm15
        ret
1:      vpternlogd $0xff, %zmm8, %zmm8, %zmm8
        vpternlogd $0xff, %zmm15, %zmm15, %zmm15
        vpternlogd $0xff, %zmm16, %zmm16, %zmm16
        vpternlogd $0xff, %zmm31, %zmm31, %zmm31
        kxnorq  %k1, %k1, %k1
        ret
        .size pf_wide_set, .-pf_wide_set

        /* The mask as above; with avx512 the all-ones checks of 8 and 15 cover 512 bits,
           and k1's all 64. */
        .type pf_wide_check, @function
pf_wide_check:
        xor     %eax, %eax
        test    %rdi, %rdi
        jnz     2f
        vpcmpeqd %ymm9, %ymm9, %ymm9
        vpxor   %ymm8, %ymm9, %ymm10
        vptest  %ymm10, %ymm10
        setnz   %al
        vpxor   %ymm15, %ymm9, %ymm10
        vptest  %ymm10, %ymm10
        setnz   %cl
        movzbl  %cl, %ecx
        shl     $1, %ecx
        or      %ecx, %eax
        vzeroupper
        ret
2:      vpternlogd $0xff, %zmm17, %zmm17, %zmm17
        vpcmpeqd %zmm8, %zmm17, %k2
        kortestw %k2, %k2
        setnc   %cl
        movzbl  %cl, %ecx
        or      %ecx, %eax
        vpcmpeqd %zmm15, %zmm17, %k2
        kortestw %k2, %k2
        setnc   %cl
        movzbl  %cl, %ecx
        shl     $1, %ecx
        or      %ecx, %eax
        vpcmpeqd %zmm16, %zmm17, %k2
        kortestw %k2, %k2
        setnc   %cl
        movzbl  %cl, %ecx
        shl     $2, %ecx
        or      %ecx, %eax
        vpcmpeqd %zmm31, %zmm17, %k2
        kortestw %k2, %k2
        setnc   %cl
        movzbl  %cl, %ecx
        shl     $3, %ecx
        or      %ecx, %eax
        kortestq %k1, %k1
        setnc   %cl
        movzbl  %cl, %ecx
        shl     $4, %ecx
        or      %ecx, %eax
        vzeroupper
        ret
        .size pf_wide_check, .-pf_wide_check

/*
 * unsigned long pf_wide_across_call(long (*fn)(long), long avx512): the wide registers of
 * pf_wide_keep kept across a call of fn(41), as a caller that knows fn leaves them alone
 * may keep them; the same mask, or 1 << 31 when fn's result is not 42.
 */
        .globl pf_wide_across_call
        .type pf_wide_across_call, @function
        .p2align 4
pf_wide_across_call:
        push    %rbx
        push    %r12
        sub     $8, %rsp
        mov     %rdi, %rbx
        mov     %rsi, %r12
        mov     %rsi, %rdi
        call    pf_wide_set
        mov     $41, %edi
        call    *%rbx
        mov     %rax, %rbx
        mov     %r12, %rdi
        call    pf_wide_check
        cmp     $42, %rbx
        je      1f
        bts     $31, %rax
1:      add     $8, %rsp
        pop     %r12
        pop     %rbx
        ret
        .size pf_wide_across_call, .-pf_wide_across_call

        /* Keeps the last *_end label off the first function of the next object: lookups by
           address (dladdr) would find the label instead of the function. */
        int3

        .data
        .p2align 3
pf_mix_bias:
        .quad   5
        .section .note.GNU-stack,"",@progbits
