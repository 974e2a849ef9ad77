// The exported part of the stripped library: .dynsym keeps this one after strip --strip-all.
__attribute__((noinline)) int probefs_stripped_exported(int x) {
  volatile int acc = 0;
  for (int i = 0; i < x; ++i) acc += i + x;
  return acc;
}
