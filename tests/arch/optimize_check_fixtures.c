// Real compiled code for the jump-optimization checks. Built at -O2 into arch_test, whose
// symbols are exported, so dladdr1 gives each function's bounds as an ELF symbol does.
#include "tests/arch/optimize_check_fixtures.h"

// Dense cases with different arithmetic: GCC keeps a jump table (cmp/ja, lea table(%rip),
// movslq, add, jmp *) instead of a branch tree or a table of constants.
int optimize_check_switch(unsigned op, int x) {
  switch (op) {
    case 0: return x + 3;
    case 1: return x * 7;
    case 2: return x - 11;
    case 3: return x ^ 0x55;
    case 4: return x << 3;
    case 5: return x / 3;
    case 6: return x % 5;
    case 7: return ~x;
    case 8: return x + 100;
    case 9: return x * x;
    case 10: return x >> 2;
    case 11: return x | 0x100;
    default: return -1;
  }
}

long optimize_check_sum(const long* a, long n) {
  long s = 0;
  for (long i = 0; i < n; ++i) s += a[i] * (i + 1);
  return s;
}

unsigned optimize_check_mix(unsigned a, unsigned b) {
  return (a * 2654435761u) ^ (b >> 3) ^ (a + b);
}
