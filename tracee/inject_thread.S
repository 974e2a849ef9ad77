/*
 * The routine of the thread that attach starts in a target (tracee/inject.cc explains the
 * two pages, the block and the stack): copied into the target's memory, never run here.
 * Machine code of its own, so it sits in an assembly file, with the block's offsets from
 * tracee/inject_thread.h.
 */
#include "tracee/inject_thread.h"

.pushsection .rodata.probefs_inject_thread,"a",@progbits
.globl probefs_inject_thread_code
.hidden probefs_inject_thread_code
.globl probefs_inject_thread_code_end
.hidden probefs_inject_thread_code_end
.globl probefs_inject_thread_return
.hidden probefs_inject_thread_return
probefs_inject_thread_code:
  push %rbx                              /* rsp 16-aligned from here on */
  mov %rdi, %rbx
  cmpl $0, PROBEFS_BLOCK_FINISH(%rbx)    /* let go before it began: nothing to do */
  jne 9f
  mov %rbx, %rdi                         /* mprotect(block, 4096, PROT_READ|PROT_WRITE) */
  mov $4096, %esi
  mov $3, %edx
  mov $10, %eax
  syscall
  test %rax, %rax
  jnz 9f
  call *PROBEFS_BLOCK_SELF(%rbx)         /* pthread_detach(pthread_self()): no one */
  mov %rax, %rdi                         /* joins this thread */
  call *PROBEFS_BLOCK_DETACH(%rbx)
  lea PROBEFS_BLOCK_PATH(%rbx), %rdi     /* handle = dlopen(path, mode) */
  mov PROBEFS_BLOCK_MODE(%rbx), %rsi
  call *PROBEFS_BLOCK_DLOPEN(%rbx)
  mov %rax, PROBEFS_BLOCK_HANDLE(%rbx)
  test %rax, %rax
  jnz 1f
  mov PROBEFS_BLOCK_DLERROR(%rbx), %rax  /* error = dlerror(), where there is one */
  test %rax, %rax
  jz 1f
  call *%rax
  mov %rax, PROBEFS_BLOCK_ERROR(%rbx)
1:
  mov %rsp, PROBEFS_BLOCK_RSP(%rbx)
  movq $1, PROBEFS_BLOCK_REPORTED(%rbx)
2:
  cmpl $0, PROBEFS_BLOCK_FINISH(%rbx)
  jne 9f
  lea PROBEFS_BLOCK_FINISH(%rbx), %rdi   /* futex(&finish, FUTEX_WAIT_PRIVATE, 0, */
  mov $128, %esi                         /* &timeout, NULL, 0) */
  xor %edx, %edx
  lea PROBEFS_BLOCK_TIMEOUT(%rbx), %r10
  xor %r8d, %r8d
  xor %r9d, %r9d
  mov $202, %eax
  syscall
  test %rax, %rax                        /* woken, or the word changed, or */
  jz 2b                                  /* interrupted: look again */
  cmp $-11, %rax                         /* -EAGAIN */
  je 2b
  cmp $-4, %rax                          /* -EINTR */
  je 2b
9:                                       /* -ETIMEDOUT (no daemon any more), or */
                                         /* no futex to wait with: end */
  mov PROBEFS_BLOCK_MUNMAP(%rbx), %rax   /* return munmap(pages, 8192) */
  lea -4096(%rbx), %rdi
  mov $8192, %esi
  pop %rbx
  jmp *%rax
probefs_inject_thread_return:            /* a call let go midway returned */
  mov PROBEFS_BLOCK_RSP(%rbx), %rsp
  jmp 9b
probefs_inject_thread_code_end:
.popsection

        .section .note.GNU-stack,"",@progbits
