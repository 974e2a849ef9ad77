// Loaded with dlopen only after the resolver was first used.
__attribute__((noinline)) int probefs_late_fn(int x) {
  volatile int acc = 0;
  for (int i = 0; i < x; ++i) acc += i ^ x;
  return acc;
}
