// System calls in inline asm are arch's (arch::raw_syscall); register variables and
// assembly that enters no kernel are anyone's.
#include "arch/syscall.h"

long by_hand(long nr) {
  long ret;
  asm volatile("syscall" : "=a"(ret) : "a"(nr) : "rcx", "r11", "memory");
  return ret;
}

long over_lines(long nr) {
  long ret;
  register long r10 asm("r10") = 0;
  __asm__ __volatile__(
      "mov %1, %%rax\n\t"
      "syscall"
      : "=a"(ret)
      : "r"(nr), "r"(r10)
      : "rcx", "r11", "memory");
  return ret;
}

void the_old_way() { asm("int $0x80"); }

// asm volatile("syscall") in a comment is no code, nor is the name in a string:
const char* const kName = "syscall";
void pause_only() { asm volatile("pause" ::: "memory"); }
