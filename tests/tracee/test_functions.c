#include "test_functions.h"

// Loops keep the functions large enough that "an address in the middle" is well inside.
__attribute__((noinline)) int probefs_test_fn_a(int x) {
  volatile int acc = 0;
  for (int i = 0; i < x; ++i) acc += i * x + 3;
  return acc;
}

__attribute__((noinline)) int probefs_test_fn_b(int x) {
  volatile int acc = 1;
  for (int i = 0; i < x; ++i) acc *= i + x;
  return acc;
}

static int probefs_test_ifunc_impl(void) { return 42; }

// Runs while the dynamic linker relocates the executable, before any sanitizer runtime is
// ready, so it must not be instrumented.
__attribute__((no_sanitize("address", "undefined"))) int (*probefs_test_ifunc_resolver(void))(void) {
  return probefs_test_ifunc_impl;
}

int probefs_test_ifunc(void) __attribute__((ifunc("probefs_test_ifunc_resolver")));
