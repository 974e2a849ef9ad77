/* A call chain of known shape for stacktrace keys: main calls via_a or via_b, both call
 * middle, which calls inner (the probed function). Built twice: with frame pointers and
 * without. Exported (-rdynamic) so that dladdr names its own functions.
 *
 * Commands on stdin, one answer line each on stdout ("ready" first):
 *   run A B   A calls of inner through via_a, then B through via_b: "ok SUM"
 *   where     one more call through each, with backtrace() taken inside inner:
 *             "ok F1 F2 F3 | G1 G2 G3", the return addresses of inner's three callers
 *             (middle, via_a or via_b, main) as NAME+0xOFFSET
 *   quit      exits 0
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <stdio.h>
#include <string.h>

static int g_where;          /* inner takes a backtrace */
static char g_frames[512];   /* what it found */

static void name_of(void* addr, char* out, size_t cap) {
  Dl_info info;
  if (dladdr(addr, &info) != 0 && info.dli_sname != NULL) {
    snprintf(out, cap, "%s+0x%lx", info.dli_sname,
             (unsigned long)((char*)addr - (char*)info.dli_saddr));
  } else {
    snprintf(out, cap, "%p", addr);
  }
}

__attribute__((noinline, noipa)) long inner(long x) {
  if (g_where) {
    void* frames[8];
    const int n = backtrace(frames, 8);
    g_frames[0] = 0;
    for (int i = 1; i < 4 && i < n; ++i) {
      char one[128];
      name_of(frames[i], one, sizeof one);
      if (i > 1) strcat(g_frames, " ");
      strcat(g_frames, one);
    }
  }
  return x * 3 + 1;
}

__attribute__((noinline, noipa)) long middle(long x) {
  long r = inner(x + 1);
  __asm__ volatile("" ::: "memory"); /* not a tail call */
  return r - 1;
}

__attribute__((noinline, noipa)) long via_a(long x) {
  long r = middle(x);
  __asm__ volatile("" ::: "memory");
  return r;
}

__attribute__((noinline, noipa)) long via_b(long x) {
  long r = middle(x * 2);
  __asm__ volatile("" ::: "memory");
  return r + 5;
}

int main(void) {
  char line[256];
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("ready\n");
  while (fgets(line, sizeof line, stdin) != NULL) {
    long a = 0, b = 0;
    if (sscanf(line, "run %ld %ld", &a, &b) == 2 && a >= 0 && b >= 0) {
      long sum = 0;
      for (long i = 0; i < a; ++i) sum += via_a(i);
      for (long i = 0; i < b; ++i) sum += via_b(i);
      printf("ok %ld\n", sum);
    } else if (strncmp(line, "where", 5) == 0) {
      char first[512];
      g_where = 1;
      via_a(1);
      snprintf(first, sizeof first, "%s", g_frames);
      via_b(1);
      g_where = 0;
      printf("ok %s | %s\n", first, g_frames);
    } else if (strncmp(line, "quit", 4) == 0) {
      return 0;
    } else {
      printf("?\n");
    }
  }
  return 0;
}
