/* The traced program of the event benchmarks: a loop calling one small function, timed in
 * the program itself, so that the daemon's work never counts.
 *
 *   bench_target N MODE [REPS]
 *     MODE add:  bench_add(i, s & 7)          (two integer arguments, a return value)
 *     MODE str:  bench_str(name, i)           (a string argument)
 *     MODE deep: bench_add(i, s & 7) under 15 frames of bench_deep (frame pointers): a
 *                stack of depth 16 at bench_add's first instruction
 *     MODE deepnofp: the same under bench_deep_nofp (no frame pointers: rbp is clobbered
 *                in each frame, which only the unwind tables can see past)
 *     MODE spin: bench_add in a loop until killed (attach latency)
 *   prints one line per rep: "ns_per_call=<x>", then "done <checksum>"
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

__attribute__((noinline)) long bench_add(long a, long b) {
  __asm__ volatile("" ::: "memory");
  return a * 3 + b;
}

/* Kept as frames: not inlined, not a tail call, with a frame pointer. */
__attribute__((noinline, optimize("no-omit-frame-pointer"))) long bench_deep(int d, long a,
                                                                            long b) {
  long r = d > 0 ? bench_deep(d - 1, a, b) : bench_add(a, b);
  __asm__ volatile("" ::: "memory");
  return r;
}

/* The same without frame pointers: each frame saves rbp and uses it for something else. */
__attribute__((noinline, optimize("omit-frame-pointer"))) long bench_deep_nofp(int d, long a,
                                                                              long b) {
  __asm__ volatile("xor %%ebp, %%ebp" ::: "rbp");
  long r = d > 0 ? bench_deep_nofp(d - 1, a, b) : bench_add(a, b);
  __asm__ volatile("" ::: "memory");
  return r;
}

__attribute__((noinline)) long bench_str(const char *s, long n) {
  __asm__ volatile("" ::: "memory");
  return s[0] + n;
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 1000000;
  const char *mode = argc > 2 ? argv[2] : "add";
  int reps = argc > 3 ? atoi(argv[3]) : 5;
  static const char name[] = "bench-string-argument";
  long s = 0;
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (strcmp(mode, "spin") == 0) {
    printf("spinning\n");
    for (long i = 0;; i++) s += bench_add(i, s & 7);
  }
  int str = strcmp(mode, "str") == 0;
  int deep = strcmp(mode, "deep") == 0;
  int deep_nofp = strcmp(mode, "deepnofp") == 0;
  for (int r = 0; r < reps; r++) {
    double t0 = now_ns();
    if (str)
      for (long i = 0; i < n; i++) s += bench_str(name, i);
    else if (deep)
      for (long i = 0; i < n; i++) s += bench_deep(14, i, s & 7);
    else if (deep_nofp)
      for (long i = 0; i < n; i++) s += bench_deep_nofp(14, i, s & 7);
    else
      for (long i = 0; i < n; i++) s += bench_add(i, s & 7);
    printf("ns_per_call=%.2f\n", (now_ns() - t0) / (double)n);
  }
  printf("done %ld\n", s);
  return 0;
}
