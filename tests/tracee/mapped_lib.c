// The library mapped_prog.c opens; built twice like the program: _b is the library
// upgraded, its function at another offset.
#ifdef PROBEFS_MAPPED_REBUILT
__asm__(".text\n.skip 0x2000, 0x90\n");
#endif

__attribute__((noinline)) int probefs_mapped_lib_fn(int x) {
  volatile int acc = 0;
  for (int i = 0; i < x; ++i) acc += i ^ 5;
  return acc;
}
