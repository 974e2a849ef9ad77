// Functions of the arch_test binary itself that the jump-optimization checks look at.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

#define OPTIMIZE_CHECK_SWITCH_CASES 12  // cases 0..11 of optimize_check_switch

int optimize_check_switch(unsigned op, int x);
long optimize_check_sum(const long* a, long n);
unsigned optimize_check_mix(unsigned a, unsigned b);

// optimize_check_fixtures_asm.S: the loop head is at entry + 2, inside the first 5 bytes.
//   0: xor %eax,%eax ; 2: add $1,%rax ; 6: sub $1,%rdi ; 10: jnz 2 ; 12: ret
// Returns n for n >= 1.
long optimize_check_loop_to_entry_plus_2(long n);

#ifdef __cplusplus
}
#endif
