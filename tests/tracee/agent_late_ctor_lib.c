// Loaded with dlopen after the probes were defined: its constructor calls the probed
// function, so a probe placed when the library is mapped (before its constructors run)
// sees that call too.
__attribute__((noinline)) long probefs_late_ctor_fn(long x) {
  __asm__ volatile("" ::: "memory");
  return 3 * x;
}

__attribute__((constructor)) static void late_ctor_init(void) {
  if (probefs_late_ctor_fn(7) != 21) __builtin_trap();
}
