// The safe copy routines of arch/safe_copy.h, and their fix-up.
#include "arch/safe_copy.h"

#include <ucontext.h>

// Each routine is laid out as [start, fixup) = its body, any instruction of which may
// fault, then its error exit. The routines keep to caller-saved registers, so leaving
// through the error exit from any point of the body is safe. They use no string
// instructions, whose direction depends on the probed code's flags.
//
//   probefs_arch_safe_copy(dst=rdi, src=rsi, n=rdx)
//       if n == 8: one 8-byte load and store
//       else: byte loop
//       return 0
//   fixup: return -1
//
//   probefs_arch_safe_strncpy(dst=rdi, src=rsi, cap=rdx)
//       i = 0
//   loop: c = src[i]; dst[i++] = c
//       if c == 0: return i
//       if i < cap: goto loop
//       dst[cap - 1] = 0; return cap
//   fixup: return -1
asm(R"(
    .text
    .p2align 4
    .globl probefs_arch_safe_copy
    .type probefs_arch_safe_copy, @function
probefs_arch_safe_copy:
    cmpq $8, %rdx
    jne 1f
    movq (%rsi), %rcx
    movq %rcx, (%rdi)
    xorl %eax, %eax
    ret
1:  xorl %eax, %eax
    testq %rdx, %rdx
    jz 3f
2:  movzbl (%rsi,%rax), %ecx
    movb %cl, (%rdi,%rax)
    incq %rax
    cmpq %rdx, %rax
    jb 2b
3:  xorl %eax, %eax
    ret
.Lprobefs_copy_fixup:
    movq $-1, %rax
    ret
    .size probefs_arch_safe_copy, .-probefs_arch_safe_copy

    .p2align 4
    .globl probefs_arch_safe_strncpy
    .type probefs_arch_safe_strncpy, @function
probefs_arch_safe_strncpy:
    xorl %eax, %eax
1:  movzbl (%rsi,%rax), %ecx
    movb %cl, (%rdi,%rax)
    incq %rax
    testb %cl, %cl
    jz 2f
    cmpq %rdx, %rax
    jb 1b
    movb $0, -1(%rdi,%rax)
2:  ret
.Lprobefs_str_fixup:
    movq $-1, %rax
    ret
    .size probefs_arch_safe_strncpy, .-probefs_arch_safe_strncpy

    .section .data.rel.ro,"aw"
    .p2align 3
    .globl probefs_arch_safe_copy_table
    .hidden probefs_arch_safe_copy_table
probefs_arch_safe_copy_table:
    .quad probefs_arch_safe_copy, .Lprobefs_copy_fixup
    .quad probefs_arch_safe_strncpy, .Lprobefs_str_fixup
    .text
)");

extern "C" const uintptr_t probefs_arch_safe_copy_table[4];

namespace probefs::arch {

bool safe_copy_fixup(void* ucontext) {
  auto* uc = static_cast<ucontext_t*>(ucontext);
  auto rip = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
  for (int i = 0; i < 4; i += 2) {
    uintptr_t start = probefs_arch_safe_copy_table[i];
    uintptr_t fixup = probefs_arch_safe_copy_table[i + 1];
    if (rip >= start && rip < fixup) {
      uc->uc_mcontext.gregs[REG_RIP] = static_cast<greg_t>(fixup);
      return true;
    }
  }
  return false;
}

}  // namespace probefs::arch
