/* A call chain for the unwind tables (unwind_tables_test.cc), built -O2 without frame
 * pointers: unw_top -> unw_mid (a frame of its own on the stack) -> unw_leaf, which
 * zeroes rbp (saving the caller's, as the ABI wants) so that no frame-pointer chain
 * leads anywhere, records the registers where it stands and its own backtrace(), and
 * lets the test walk its stack from those registers. */
#include <execinfo.h>
#include <stdint.h>

#include "unwind_chain.h"

/* Stores pc (its return address), sp (the caller's stack pointer once it returns) and
 * rbp: the state of the caller at the instruction after the call. */
__asm__(
    "  .text\n"
    "  .globl unw_capture\n"
    "  .type unw_capture, @function\n"
    "unw_capture:\n"
    "  .cfi_startproc\n"
    "  mov (%rsp), %rax\n"
    "  mov %rax, 0(%rdi)\n"
    "  lea 8(%rsp), %rax\n"
    "  mov %rax, 8(%rdi)\n"
    "  mov %rbp, 16(%rdi)\n"
    "  ret\n"
    "  .cfi_endproc\n"
    "  .size unw_capture, .-unw_capture\n");

__attribute__((noinline, noipa)) int unw_leaf(struct unw_seen* seen) {
  __asm__ volatile("xor %%ebp, %%ebp" ::: "rbp");
  unw_capture(&seen->regs);
  seen->frames = backtrace(seen->callers, UNW_MAX_FRAMES);
  seen->walk(seen);
  __asm__ volatile("" ::: "memory");
  return seen->frames;
}

__attribute__((noinline, noipa)) int unw_mid(struct unw_seen* seen, int k) {
  volatile char pad[300];
  pad[k % 300] = (char)k;
  int r = unw_leaf(seen);
  __asm__ volatile("" ::: "memory");
  return r + pad[k % 300] - (char)k;
}

__attribute__((noinline, noipa)) int unw_top(struct unw_seen* seen) {
  int r = unw_mid(seen, 7);
  __asm__ volatile("" ::: "memory");
  return r;
}
