// arch wraps the instruction itself.
#pragma once

inline long raw_syscall(long nr) {
  long ret;
  asm volatile("syscall" : "=a"(ret) : "a"(nr) : "rcx", "r11", "memory");
  return ret;
}
