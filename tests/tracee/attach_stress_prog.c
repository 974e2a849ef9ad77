/* The program the attach stress test attaches to and detaches from, again and again:
 * `attach_stress_prog LIB`. Threads that never stop allocate and free (malloc, calloc,
 * realloc, free, in every size class and past the mmap threshold) and load and unload LIB
 * (dlopen, dlsym, dlclose), checking every result. The main thread is one of them, so that
 * the thread an attach looks at first is inside malloc most of the time; another thread
 * answers the test on stdin/stdout:
 *
 *   progress   waits until every worker has finished one more round of its work (at most
 *              30 s): "progress ok", or "progress stuck NAME" for the first that did not
 *   quit       stops the workers, joins them: "done ALLOC_ROUNDS LOAD_ROUNDS", exits 0
 *
 * A wrong result (a block that does not hold what was written into it, calloc's memory
 * not zero, a value from LIB other than expected, a failed dlopen) prints "WRONG ..." on
 * stderr and exits 3 at once, so that an attach that corrupted the program fails the test.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ALLOC_THREADS 2
#define LOAD_THREADS 1
#define WORKERS (ALLOC_THREADS + LOAD_THREADS)
#define LIVE_BLOCKS 48

static const char* lib_path;
static atomic_int stop;
static atomic_ullong rounds[WORKERS];
static pthread_mutex_t progress_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t progress_cv = PTHREAD_COND_INITIALIZER;

static void wrong(const char* what, long a, long b) {
  fprintf(stderr, "WRONG %s: %ld, expected %ld\n", what, a, b);
  fflush(stderr);
  _exit(3);
}

/* One round done: wakes a "progress" that waits for it. */
static void round_done(int who) {
  atomic_fetch_add(&rounds[who], 1);
  pthread_mutex_lock(&progress_mu);
  pthread_cond_broadcast(&progress_cv);
  pthread_mutex_unlock(&progress_mu);
}

static uint64_t next(uint64_t* s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return *s >> 33;
}

struct block {
  unsigned char* p;
  size_t size;
  unsigned char fill;
};

static void check_block(const struct block* b) {
  for (size_t i = 0; i < b->size; i += 1 + i / 8) {
    if (b->p[i] != b->fill) wrong("block byte", b->p[i], b->fill);
  }
  if (b->size > 0 && b->p[b->size - 1] != b->fill) wrong("last block byte", b->p[b->size - 1], b->fill);
}

static size_t pick_size(uint64_t* s) {
  switch (next(s) % 8) {
    case 0: return 1 + next(s) % 24;               /* tcache, smallest bins */
    case 1: case 2: return 16 + next(s) % 1024;    /* small bins */
    case 3: case 4: return 1024 + next(s) % 16384; /* large bins */
    case 5: return 140000 + next(s) % 60000;       /* past the mmap threshold */
    default: return 64 + next(s) % 256;
  }
}

static void* alloc_worker(void* arg) {
  const int who = (int)(intptr_t)arg;
  uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(who + 1);
  struct block live[LIVE_BLOCKS];
  memset(live, 0, sizeof live);
  while (!atomic_load(&stop)) {
    for (int n = 0; n < 256; ++n) {
      struct block* b = &live[next(&seed) % LIVE_BLOCKS];
      if (b->p != NULL) {
        check_block(b);
        if (next(&seed) % 4 == 0) {
          /* realloc keeps the old bytes */
          const size_t old = b->size;
          const size_t size = pick_size(&seed);
          unsigned char* p = realloc(b->p, size);
          if (p == NULL) wrong("realloc", 0, (long)size);
          for (size_t i = 0; i < (old < size ? old : size); i += 1 + i / 8) {
            if (p[i] != b->fill) wrong("realloc'ed byte", p[i], b->fill);
          }
          memset(p, b->fill, size);
          b->p = p;
          b->size = size;
          continue;
        }
        free(b->p);
        b->p = NULL;
        continue;
      }
      b->size = pick_size(&seed);
      b->fill = (unsigned char)(1 + next(&seed) % 255);
      if (next(&seed) % 3 == 0) {
        b->p = calloc(1, b->size);
        if (b->p == NULL) wrong("calloc", 0, (long)b->size);
        for (size_t i = 0; i < b->size; i += 1 + i / 8) {
          if (b->p[i] != 0) wrong("calloc'ed byte", b->p[i], 0);
        }
      } else {
        b->p = malloc(b->size);
        if (b->p == NULL) wrong("malloc", 0, (long)b->size);
      }
      memset(b->p, b->fill, b->size);
    }
    round_done(who);
  }
  for (int i = 0; i < LIVE_BLOCKS; ++i) {
    if (live[i].p != NULL) check_block(&live[i]);
    free(live[i].p);
  }
  return NULL;
}

static void* load_worker(void* arg) {
  const int who = (int)(intptr_t)arg;
  long x = who;
  while (!atomic_load(&stop)) {
    void* h = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
      fprintf(stderr, "WRONG dlopen: %s\n", dlerror());
      _exit(3);
    }
    long (*value)(long) = (long (*)(long))dlsym(h, "attach_stress_value");
    if (value == NULL) wrong("dlsym", 0, 1);
    for (int i = 0; i < 16; ++i, ++x) {
      const long v = value(x);
      const long expected = x * x + 7 + 64 * 64 * 0x5a;
      if (v != expected) wrong("attach_stress_value", v, expected);
    }
    char* copy = strdup(lib_path);
    if (copy == NULL || strcmp(copy, lib_path) != 0) wrong("strdup", 0, 1);
    free(copy);
    if (dlclose(h) != 0) wrong("dlclose", 1, 0);
    round_done(who);
  }
  return NULL;
}

static const char* worker_name(int who) { return who < ALLOC_THREADS ? "alloc" : "load"; }

/* Waits until every worker's count passes the one it had on entry. */
static void progress(void) {
  unsigned long long base[WORKERS];
  for (int i = 0; i < WORKERS; ++i) base[i] = atomic_load(&rounds[i]);
  struct timespec deadline;
  clock_gettime(CLOCK_REALTIME, &deadline);
  deadline.tv_sec += 30;
  pthread_mutex_lock(&progress_mu);
  int stuck = -1;
  for (;;) {
    stuck = -1;
    for (int i = 0; i < WORKERS && stuck < 0; ++i) {
      if (atomic_load(&rounds[i]) == base[i]) stuck = i;
    }
    if (stuck < 0) break;
    if (pthread_cond_timedwait(&progress_cv, &progress_mu, &deadline) == ETIMEDOUT) break;
  }
  pthread_mutex_unlock(&progress_mu);
  if (stuck < 0) printf("progress ok\n");
  else printf("progress stuck %s %d\n", worker_name(stuck), stuck);
  fflush(stdout);
}

/* Answers the test until "quit" (or the end of stdin), then stops the workers. */
static void* commands(void* arg) {
  (void)arg;
  char line[64];
  while (fgets(line, sizeof line, stdin) != NULL) {
    if (strncmp(line, "progress", 8) == 0) {
      progress();
    } else if (strncmp(line, "quit", 4) == 0) {
      break;
    }
  }
  atomic_store(&stop, 1);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: attach_stress_prog LIB\n");
    return 2;
  }
  lib_path = argv[1];
  /* Worker 0 is the main thread itself. */
  pthread_t threads[WORKERS], reader;
  for (int i = 1; i < WORKERS; ++i) {
    void* (*fn)(void*) = i < ALLOC_THREADS ? alloc_worker : load_worker;
    if (pthread_create(&threads[i], NULL, fn, (void*)(intptr_t)i) != 0) return 2;
  }
  if (pthread_create(&reader, NULL, commands, NULL) != 0) return 2;
  printf("ready\n");
  fflush(stdout);
  alloc_worker((void*)(intptr_t)0);
  pthread_join(reader, NULL);
  unsigned long long alloc_rounds = rounds[0], load_rounds = 0;
  for (int i = 1; i < WORKERS; ++i) {
    pthread_join(threads[i], NULL);
    if (i < ALLOC_THREADS) alloc_rounds += rounds[i];
    else load_rounds += rounds[i];
  }
  printf("done %llu %llu\n", alloc_rounds, load_rounds);
  fflush(stdout);
  return 0;
}
