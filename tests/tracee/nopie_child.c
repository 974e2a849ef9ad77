// A non-PIE program inspected from outside: prints the run-time addresses the test checks,
// then waits until the test closes its standard input.
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

__attribute__((noinline)) int probefs_child_fn(int x) {
  volatile int acc = 0;
  for (int i = 0; i < x; ++i) acc += i * 7;
  return acc;
}

int main(void) {
  // Looked up in libc itself: in a non-PIE program, &getpid could be a PLT address.
  void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  void* getpid_addr = libc != NULL ? dlsym(libc, "getpid") : NULL;
  printf("%lx %lx\n", (unsigned long)&probefs_child_fn, (unsigned long)getpid_addr);
  fflush(stdout);
  char buf[16];
  while (read(0, buf, sizeof buf) > 0) {
  }
  return probefs_child_fn(0);
}
