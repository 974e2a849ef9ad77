// x86-64 restartable sequences for arch/percpu.h.
//
// The thread's struct rseq (registered by glibc) lies at %fs:offset: cpu_id at +4, the
// rseq_cs pointer at +8. Each sequence arms rseq_cs with its descriptor {version 0,
// flags 0, start, post-commit offset, abort}, reads the CPU, and commits with one store.
// The abort handler, preceded by the signature glibc registered (0x53053053, inside a
// `ud1` so that disassemblers stay in step), gives up rather than starting over: the
// caller falls back to its shared list, which is rare after a preemption and keeps a
// debugger that single-steps through a sequence (every step aborts it) from looping.
#pragma once

#include <cstddef>
#include <cstdint>

namespace probefs::arch {
namespace detail {
// The offset of the thread's struct rseq from the thread pointer; 0 when per-CPU
// operation is unavailable (glibc's rseq area never sits at offset 0, where the TCB is).
// Hidden: code outside the engine's shared object would see a copy of its own.
extern long g_rseq_offset __attribute__((visibility("hidden")));
}  // namespace detail

#define PROBEFS_RSEQ_DESCRIPTOR(start, commit, abort)                   \
  ".pushsection __rseq_cs, \"aw\"\n\t"                                   \
  ".balign 32\n\t"                                                       \
  ".Lrseq_cs%=:\n\t"                                                     \
  ".long 0, 0\n\t"                                                       \
  ".quad " start ", " commit " - " start ", " abort "\n\t"               \
  ".popsection\n\t"

#define PROBEFS_RSEQ_ABORT(label, fail)                                  \
  ".byte 0x0f, 0xb9, 0x3d\n\t"                                           \
  ".long 0x53053053\n\t"                                                 \
  label ":\n\t"                                                          \
  "jmp " fail "\n\t"

// Internal linkage and always inlined: an out-of-line copy folded away by the linker would
// leave its descriptors in __rseq_cs pointing at discarded code.
[[gnu::always_inline]] static inline bool percpu_pop_inline(PercpuStack* stacks, uint32_t n, uint32_t* value) {
  const long off = detail::g_rseq_offset;
  if (__builtin_expect(off == 0, 0)) return false;
  uint32_t ok, v;
  asm volatile(
      PROBEFS_RSEQ_DESCRIPTOR(".Lpop_start%=", ".Lpop_commit%=", ".Lpop_abort%=")
      "lea .Lrseq_cs%=(%%rip), %%rax\n\t"
      "mov %%rax, %%fs:8(%[off])\n\t"
      ".Lpop_start%=:\n\t"
      "mov %%fs:4(%[off]), %%eax\n\t"      // cpu_id: -1 or -2 when not registered
      "cmp %[n], %%eax\n\t"
      "jae .Lpop_fail%=\n\t"
      "shl $6, %%rax\n\t"
      "add %[stacks], %%rax\n\t"
      "cmpl $0, (%%rax)\n\t"               // a thief holds it
      "jne .Lpop_fail%=\n\t"
      "mov 4(%%rax), %%edx\n\t"
      "test %%edx, %%edx\n\t"
      "jz .Lpop_fail%=\n\t"
      "mov 4(%%rax,%%rdx,4), %[v]\n\t"     // slots[count - 1]
      "dec %%edx\n\t"
      "mov %%edx, 4(%%rax)\n\t"            // commit: count - 1
      ".Lpop_commit%=:\n\t"
      "mov $1, %[ok]\n\t"
      "jmp .Lpop_done%=\n\t"
      PROBEFS_RSEQ_ABORT(".Lpop_abort%=", ".Lpop_fail%=")
      ".Lpop_fail%=:\n\t"
      "xor %[ok], %[ok]\n\t"
      ".Lpop_done%=:"
      : [ok] "=&r"(ok), [v] "=&r"(v)
      : [off] "r"(off), [n] "r"(n), [stacks] "r"(stacks)
      : "rax", "rdx", "memory", "cc");
  *value = v;
  return ok;
}

[[gnu::always_inline]] static inline bool percpu_push_inline(PercpuStack* stacks, uint32_t n,
                                                             uint32_t value, uint32_t capacity) {
  const long off = detail::g_rseq_offset;
  if (__builtin_expect(off == 0, 0)) return false;
  uint32_t ok;
  asm volatile(
      PROBEFS_RSEQ_DESCRIPTOR(".Lpush_start%=", ".Lpush_commit%=", ".Lpush_abort%=")
      "lea .Lrseq_cs%=(%%rip), %%rax\n\t"
      "mov %%rax, %%fs:8(%[off])\n\t"
      ".Lpush_start%=:\n\t"
      "mov %%fs:4(%[off]), %%eax\n\t"
      "cmp %[n], %%eax\n\t"
      "jae .Lpush_fail%=\n\t"
      "shl $6, %%rax\n\t"
      "add %[stacks], %%rax\n\t"
      "cmpl $0, (%%rax)\n\t"
      "jne .Lpush_fail%=\n\t"
      "mov 4(%%rax), %%edx\n\t"
      "cmp %[capacity], %%edx\n\t"
      "jae .Lpush_fail%=\n\t"
      "mov %[value], 8(%%rax,%%rdx,4)\n\t"  // above count: invisible until the commit
      "inc %%edx\n\t"
      "mov %%edx, 4(%%rax)\n\t"             // commit: count + 1
      ".Lpush_commit%=:\n\t"
      "mov $1, %[ok]\n\t"
      "jmp .Lpush_done%=\n\t"
      PROBEFS_RSEQ_ABORT(".Lpush_abort%=", ".Lpush_fail%=")
      ".Lpush_fail%=:\n\t"
      "xor %[ok], %[ok]\n\t"
      ".Lpush_done%=:"
      : [ok] "=&r"(ok)
      : [off] "r"(off), [n] "r"(n), [stacks] "r"(stacks), [value] "r"(value),
        [capacity] "r"(capacity)
      : "rax", "rdx", "memory", "cc");
  return ok;
}

#undef PROBEFS_RSEQ_DESCRIPTOR
#undef PROBEFS_RSEQ_ABORT

}  // namespace probefs::arch
