// The computation the injection tests' targets run in hot loops. The test computes it again
// from the seed and the step count a target reports: a held thread whose registers (vector
// registers included) came back other than they were gives another result.
#pragma once

#include <stdint.h>

#define PROBEFS_INJECT_LANES 4
#define PROBEFS_INJECT_DECAY 0.9990234375

struct probefs_inject_work {
  uint64_t x;
  uint64_t steps;
  double acc[PROBEFS_INJECT_LANES];
};

static inline void probefs_inject_work_init(struct probefs_inject_work* w, uint64_t seed) {
  w->x = 0x9e3779b97f4a7c15ULL * (seed + 1);
  w->steps = 0;
  for (int i = 0; i < PROBEFS_INJECT_LANES; ++i) w->acc[i] = (double)i;
}

// One step, lane by lane: a target computes the lanes in one vector register.
static inline void probefs_inject_work_step(struct probefs_inject_work* w) {
  w->x ^= w->x << 13;
  w->x ^= w->x >> 7;
  w->x ^= w->x << 17;
  for (int i = 0; i < PROBEFS_INJECT_LANES; ++i) {
    w->acc[i] = w->acc[i] * PROBEFS_INJECT_DECAY + (double)((w->x >> (8 * i)) & 0xff);
  }
  ++w->steps;
}

// What the targets and the library under test share with the test.
#define PROBEFS_INJECT_REPORT_FD_ENV "PROBEFS_INJECT_REPORT_FD"
// A pipe whose data ends probefs_inject_nap's wait.
#define PROBEFS_INJECT_NAP_FD_ENV "PROBEFS_INJECT_NAP_FD"
// The library of mode "dlopen_slow" (tests/tracee/inject_slow_lib.c).
#define PROBEFS_INJECT_SLOW_LIB_ENV "PROBEFS_INJECT_SLOW_LIB"
#define PROBEFS_INJECT_HOT_THREADS 4

// The memory a test shares with a busy target (a memfd the target maps).
struct probefs_inject_shared {
  volatile uint32_t stop;
  volatile uint64_t progress[PROBEFS_INJECT_HOT_THREADS];
};
