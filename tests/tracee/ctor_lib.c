// A library the traced program opens after probes on it were defined: its constructor
// calls ctor_lib_fn, so a probe placed only after the constructors ran would miss a hit.
__attribute__((noinline)) long ctor_lib_fn(long x) {
  __asm__ volatile("" ::: "memory");
  return 2 * x;
}

static long g_from_ctor;

__attribute__((constructor)) static void ctor_lib_init(void) { g_from_ctor = ctor_lib_fn(21); }

long ctor_lib_entry(long x) { return g_from_ctor + ctor_lib_fn(x); }
