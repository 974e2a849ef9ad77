/* A program with ucontext coroutines for the tracer's tests (tracer_coroutine_test.cc):
 * a scheduler on the main stack runs three coroutines (makecontext, swapcontext) whose
 * stacks lie above the main stack (mapped at a hint above it), in the heap (malloc'd) and
 * among the mappings below it (mmap'd). The coroutines' bodies call co_step, which yields
 * on odd rounds, and yield after each step; coroutines 0 and 1 end by returning (uc_link:
 * glibc's __start_context calls setcontext), coroutine 2 by calling setcontext itself.
 * Driven line by line over stdin, as traced_prog, so that every phase of a test is
 * synchronised by the program's answers:
 *
 *   run N    runs the coroutines N times over, on fresh stacks each time (those of a run
 *            are freed before the next): "ok SWAPS STEPS TRANSCRIPT", where SWAPS counts
 *            the swapcontext calls (each returns once), STEPS the co_step calls, and
 *            TRANSCRIPT lists what each step returned, in the order the steps ran
 *   quit     exits 0
 *
 * Every result is checked against its expected value; a wrong one prints "WRONG" and
 * exits 3, so a probe that corrupted a computation or a switch fails the test.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

enum { kCoroutines = 3, kRounds = 6, kMaxRuns = 16 };

struct coroutine {
  ucontext_t ctx;
  int done;
  long result;
};

static ucontext_t g_sched;
static struct coroutine g_co[kCoroutines];
static long g_swaps, g_steps;
static char g_transcript[32768];
static size_t g_transcript_len;

static void wrong(const char *what, long got, long want) {
  printf("WRONG %s got %ld want %ld\n", what, got, want);
  fflush(stdout);
  _exit(3);
}

__attribute__((format(printf, 1, 2))) static void note(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(g_transcript + g_transcript_len, sizeof g_transcript - g_transcript_len,
                    fmt, ap);
  va_end(ap);
  if (n > 0) g_transcript_len += (size_t)n;
  if (g_transcript_len >= sizeof g_transcript) wrong("transcript length", (long)n, 0);
}

static long step_value(long id, long round) { return id * 1000 + round * 7; }

static long body_value(long id) {
  long acc = 0;
  for (long r = 0; r < kRounds + id; r++) acc += step_value(id, r);
  return acc + id;
}

__attribute__((noinline, noipa)) long co_yield(struct coroutine *co) {
  g_swaps++;
  return swapcontext(&co->ctx, &g_sched);
}

__attribute__((noinline, noipa)) long co_step(long id, long round) {
  g_steps++;
  if (round % 2) {
    long r = co_yield(&g_co[id]);
    if (r != 0) wrong("swapcontext in co_step", r, 0);
  }
  return step_value(id, round);
}

__attribute__((noinline, noipa)) long co_body(long id) {
  long acc = 0;
  for (long r = 0; r < kRounds + id; r++) {
    long v = co_step(id, r);
    if (v != step_value(id, r)) wrong("co_step", v, step_value(id, r));
    note(" %ld:%ld=%ld", id, r, v);
    acc += v;
    long y = co_yield(&g_co[id]);
    if (y != 0) wrong("swapcontext in co_body", y, 0);
  }
  return acc + id;
}

__attribute__((noinline, noipa)) void co_entry(int id) {
  long r = co_body(id);
  if (r != body_value(id)) wrong("co_body", r, body_value(id));
  g_co[id].result = r;
  g_co[id].done = 1;
  if (id == 2) setcontext(&g_sched);
}

__attribute__((noinline, noipa)) long co_schedule(void) {
  long switches = 0;
  for (int any = 1; any;) {
    any = 0;
    for (int i = 0; i < kCoroutines; i++) {
      if (g_co[i].done) continue;
      any = 1;
      g_swaps++;
      long r = swapcontext(&g_sched, &g_co[i].ctx);
      if (r != 0) wrong("swapcontext in co_schedule", r, 0);
      switches++;
    }
  }
  return switches;
}

/* ---- stacks ---- */

enum place { kAboveMainStack, kHeap, kMapped };

struct stack {
  enum place place;
  char *base;
  size_t size;
};

static uintptr_t main_stack_end(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (!f) return 0;
  char line[512];
  uintptr_t end = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (strstr(line, "[stack]") && sscanf(line, "%lx-%lx", &lo, &hi) == 2) end = hi;
  }
  fclose(f);
  return end;
}

/* The first free place at hints going up from just past the main stack, 64 KiB apart:
 * ASLR may put the main stack within a few MiB of the top of the address space, and a
 * coarser step found no room there (the run then said "no stack"). */
static char *map_above_main_stack(size_t size) {
  const uintptr_t step = (uintptr_t)64 << 10, top = (uintptr_t)0x7fffffff << 16;
  uintptr_t end = main_stack_end();
  if (!end) return NULL;
  for (uintptr_t hint = (end + step) & ~(step - 1); hint + size < top; hint += step) {
    void *p = mmap((void *)hint, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (p == MAP_FAILED) continue;
    if ((uintptr_t)p == hint) return p;
    munmap(p, size);
  }
  return NULL;
}

static void make_stack(struct stack *s) {
  void *p;
  switch (s->place) {
    case kAboveMainStack:
      s->size = 256 * 1024;
      s->base = map_above_main_stack(s->size);
      break;
    case kHeap:
      s->size = 96 * 1024; /* under malloc's mmap threshold: from the heap */
      s->base = malloc(s->size);
      break;
    case kMapped:
      s->size = 256 * 1024;
      p = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      s->base = p == MAP_FAILED ? NULL : p;
      break;
  }
  if (!s->base) wrong("no stack", (long)s->place, 0);
}

static void release_stack(struct stack *s) {
  if (s->place == kHeap) {
    memset(s->base, 0, s->size);
    free(s->base);
  } else {
    munmap(s->base, s->size);
  }
}

/* One run: the stacks' places rotate with the run's number, so that each coroutine's
 * stack lies above the main stack in some run and below it in others. */
static void run_once(int run) {
  static const enum place kPlaces[kCoroutines] = {kAboveMainStack, kHeap, kMapped};
  struct stack stacks[kCoroutines];
  uintptr_t here = (uintptr_t)__builtin_frame_address(0);
  for (int i = 0; i < kCoroutines; i++) {
    stacks[i].place = kPlaces[(i + run) % kCoroutines];
    make_stack(&stacks[i]);
    if (((uintptr_t)stacks[i].base > here) != (stacks[i].place == kAboveMainStack))
      wrong("stack placement", (long)stacks[i].place, 0);
    g_co[i].done = 0;
    g_co[i].result = 0;
    getcontext(&g_co[i].ctx);
    g_co[i].ctx.uc_stack.ss_sp = stacks[i].base;
    g_co[i].ctx.uc_stack.ss_size = stacks[i].size;
    g_co[i].ctx.uc_link = &g_sched;
    makecontext(&g_co[i].ctx, (void (*)(void))co_entry, 1, i);
  }
  long switches = co_schedule();
  long want_switches = 0;
  for (int i = 0; i < kCoroutines; i++) {
    if (g_co[i].result != body_value(i)) wrong("result", g_co[i].result, body_value(i));
    want_switches += 1 + (kRounds + i) + (kRounds + i) / 2; /* start, yields after and in steps */
  }
  if (switches != want_switches) wrong("switches", switches, want_switches);
  for (int i = 0; i < kCoroutines; i++) release_stack(&stacks[i]);
}

int main(void) {
  char line[256];
  setvbuf(stdout, NULL, _IOLBF, 0);
  printf("ready\n");
  while (fgets(line, sizeof line, stdin)) {
    long n = 0;
    if (sscanf(line, "run %ld", &n) == 1 && n > 0 && n <= kMaxRuns) {
      g_swaps = g_steps = 0;
      g_transcript_len = 0;
      g_transcript[0] = 0;
      for (int r = 0; r < n; r++) run_once(r);
      printf("ok %ld %ld%s\n", g_swaps, g_steps, g_transcript);
    } else if (strncmp(line, "quit", 4) == 0) {
      return 0;
    } else {
      printf("WRONG command %s", line);
    }
  }
  return 0;
}
