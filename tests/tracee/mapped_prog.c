// A program whose files the tests take away while it runs (mapped_files_test.cc): prints
// the run-time address of its function and of a library's, dlopened from the path given
// (or, given "memfd", maps code from a memfd instead), then waits until its standard input
// closes. Built twice: the _b build stands for the
// same program rebuilt, its function at another address.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef PROBEFS_MAPPED_REBUILT
// Code ahead of the function moves it (the build keeps top-level order).
__asm__(".text\n.skip 0x2000, 0x90\n");
#endif

__attribute__((noinline)) int probefs_mapped_fn(int x) {
  volatile int acc = 0;
  for (int i = 0; i < x; ++i) acc += i * 3;
  return acc;
}

int main(int argc, char** argv) {
  void* lib_fn = NULL;
  if (argc > 1 && strcmp(argv[1], "memfd") == 0) {
    // Code in memory of no file on disk, as a JIT keeps it: executable, not an ELF object.
    int fd = memfd_create("jit", 0);
    static const unsigned char code[4096] = {0xc3};
    void* at = fd >= 0 && write(fd, code, sizeof code) == (ssize_t)sizeof code
                   ? mmap(NULL, sizeof code, PROT_READ | PROT_EXEC, MAP_SHARED, fd, 0)
                   : MAP_FAILED;
    if (at == MAP_FAILED) {
      printf("error memfd\n");
      return 1;
    }
    close(fd);
  } else if (argc > 1) {
    void* lib = dlopen(argv[1], RTLD_NOW);
    if (lib == NULL) {
      printf("error %s\n", dlerror());
      return 1;
    }
    lib_fn = dlsym(lib, "probefs_mapped_lib_fn");
  }
  printf("%lx %lx\n", (unsigned long)&probefs_mapped_fn, (unsigned long)lib_fn);
  fflush(stdout);
  char buf[16];
  while (read(0, buf, sizeof buf) > 0) {
  }
  return probefs_mapped_fn(0);
}
