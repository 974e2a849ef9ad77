// Functions the probecore tests probe (targets.inc, asm_targets.S).
#pragma once

#include <cstdint>

#define PF_DECLARE(sfx)                                           \
  long add_##sfx(long a, long b);                                 \
  long mul_##sfx(long a, long b);                                 \
  long depth_##sfx(long n);                                       \
  int classify_##sfx(int x);                                      \
  unsigned long count_char_##sfx(const char* s, char c);

extern "C" {
PF_DECLARE(o2)
PF_DECLARE(o0)

long pf_mix(long x);
extern char pf_mix_end[], pf_mix_push[], pf_mix_riprel[], pf_mix_call[], pf_mix_jcc[],
    pf_mix_pop[], pf_mix_ret[];
extern long pf_mix_bias;
long pf_loop_sum(long n);
extern char pf_loop_sum_end[], pf_loop_sum_loop[], pf_loop_sum_jmp[], pf_loop_sum_icall[];
long pf_jump_into(long x);
extern char pf_jump_into_end[];
long pf_jtab(long x);
extern char pf_jtab_end[];
long pf_two_step(long x);
extern char pf_two_step_end[], pf_two_step_second[];
unsigned long pf_flags_keep(unsigned long flags);
extern char pf_flags_keep_end[], pf_flags_keep_probe[];
double pf_xmm_keep(double a);
extern char pf_xmm_keep_end[], pf_xmm_keep_probe[];
long pf_load_second(const long* p);
extern char pf_load_second_end[], pf_load_second_load[];
long pf_leaf_redzone(long x);
extern char pf_leaf_redzone_end[], pf_leaf_redzone_mid[];
long pf_tail_outer(long x);
extern char pf_tail_outer_end[];
long pf_tail_inner(long x);
long pf_call_with_r12(long (*fn)(long, long), long x, long r12);
long pf_leaf_add1(long x);
extern char pf_leaf_add1_end[];
unsigned long pf_scratch_kept(long (*fn)(long));
unsigned long pf_wide_keep(long avx512);
extern char pf_wide_keep_end[], pf_wide_keep_probe[];
unsigned long pf_wide_across_call(long (*fn)(long), long avx512);
extern char pf_tail_inner_end[];
}
