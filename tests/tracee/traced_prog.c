/* A program for the tracer's tests to trace: known calls with known arguments and return
 * values, driven line by line over stdin so that every phase of a test is synchronised by
 * the program's answers, never by time.
 *
 *   call N          traced_add(i, 2*i) for i in [0, N): prints "ok SUM"
 *   str N           traced_str("name-<i % 10>", i) N times: "ok SUM"
 *   threads T N     T new threads, each calling traced_add N times: "ok SUM"
 *   crowd T N       T threads (at most 4096) alive at once, each calling traced_add N
 *                   times once every one has started: "ok SUM"
 *   waves K N       K threads one after another (each joined before the next starts),
 *                   each calling traced_add N times: "ok SUM"
 *   onethread N     one thread calling traced_add N times: "ok SUM TID" once it ended
 *   mix T N         T new threads, each calling traced_mix_o0 (straight-line code at -O0,
 *                   every instruction runs once a call) N times: "ok SUM"
 *   named T N NAME  the same, each thread first naming itself NAME-<i> (its comm)
 *   rename NAME     the main thread names itself NAME: "ok"
 *   pinned N        two threads at once, one pinned to CPU 0 and one to CPU 1, each
 *                   calling traced_add N times: "ok SUM"
 *   cpuseq N C...   one thread that, for each CPU C in turn (at most 8), pins itself there
 *                   and calls traced_add N times: "ok SUM"
 *   hot T           T threads calling traced_hot in a loop until "cool": "ok"
 *   cool            stops them: "ok CALLS" (the calls they made; their results are checked)
 *   fork N          a child calls traced_add N times and exits; "ok CHILD_PID STATUS"
 *   forks K N       K children one after another, each calling traced_add N times and
 *                   exiting: "ok K" once every one exited 0
 *   spawns K PATH   K children one after another, each exec'ing PATH with no arguments:
 *                   "ok K" once every one exited 0
 *   vfork N         a vfork child calls traced_add N times and exits: "ok CHILD_PID STATUS"
 *   pspawn PATH     posix_spawn PATH with no arguments: "ok CHILD_PID STATUS"
 *   hold            a child that calls traced_add once and waits until killed: "ok PID"
 *   exec            execs this program again ("exec'd" is printed first by the new image)
 *   run PATH        execs PATH with no arguments (what it prints follows)
 *   dlopen PATH SYM dlopen(PATH) and call SYM(7): "ok RESULT"
 *   env NAME        "ok VALUE" of the environment variable, "ok -" when it is unset
 *   recurse D       traced_rec(D): D + 1 calls of it in flight at the deepest point,
 *                   "ok D"
 *   sleeps N US...  traced_sleep(US) for each US given (at most 16), N times over: each
 *                   call sleeps US microseconds at least; "ok CALLS"
 *   spin            a thread that blocks every signal and runs (no system call) until
 *                   "unspin": "ok" once it runs so
 *   unspin          ends it: "ok"
 *   pid             "ok PID"
 *   quit            exits 0
 * Every result is also checked against its expected value; a wrong one prints "WRONG" and
 * exits 3, so a probe that corrupted a computation fails the test.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Read by @traced_global fetch arguments. */
volatile long traced_global = 4242;

__attribute__((noinline)) long traced_add(long a, long b) {
  __asm__ volatile("" ::: "memory");
  return a + b;
}

/* "vfork N": apart from main, whose code the tests read (vfork returns twice, which
 * changes how a compiler builds the function that calls it). The child shares this
 * thread's memory and TLS until it exits: calls of a leaf function and _exit only. */
__attribute__((noinline)) static void vfork_calls(long n) {
  pid_t c = vfork();
  if (c == 0) {
    for (long i = 0; i < n; i++) traced_add(i, 2 * i);
    _exit(0);
  }
  int st = -1;
  waitpid(c, &st, 0);
  printf("ok %d %d\n", (int)c, st);
}

__attribute__((noinline)) long traced_str(const char *s, long n) {
  __asm__ volatile("" ::: "memory");
  return (long)strlen(s) + n;
}

__attribute__((noinline)) long traced_hot(long who, long i) {
  __asm__ volatile("" ::: "memory");
  return who * 1000003 + i;
}

/* Recursive: traced_rec(d) has d + 1 calls of itself in flight at its deepest point (a
 * return probe with maxactive below that misses the rest). */
__attribute__((noinline)) long traced_rec(long d) {
  __asm__ volatile("" ::: "memory");
  if (d <= 0) return 0;
  long r = traced_rec(d - 1) + 1;
  __asm__ volatile("" ::: "memory"); /* not a tail call: every frame stays */
  return r;
}

/* Sleeps `us` microseconds at least (a function of known latency); returns us. */
__attribute__((noinline)) long traced_sleep(long us) {
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
  return us;
}

/* Straight-line at -O0: a probe on each instruction fires once a call. */
__attribute__((noinline, optimize("O0"))) long traced_mix_o0(long a, long b) {
  long c = a * 3 + b;
  c ^= a >> 1;
  return c - b / 2 + (a & 7);
}

static long mix_reference(long a, long b) { return ((a * 3 + b) ^ (a >> 1)) - b / 2 + (a & 7); }

static void wrong(const char *what, long got, long want) {
  printf("WRONG %s got %ld want %ld\n", what, got, want);
  fflush(stdout);
  _exit(3);
}

/* spin/unspin: 1 while the thread runs with every signal blocked, 2 to end it. */
static atomic_int g_spin_state;
static pthread_t g_spinner;

static void *spin_thread(void *p) {
  (void)p;
  /* Every signal, with the system call itself: a tracer may keep its own signals out
   * of what pthread_sigmask and sigprocmask block. */
  unsigned long all = ~0ul;
  long rc = syscall(SYS_rt_sigprocmask, SIG_BLOCK, &all, NULL, sizeof all);
  if (rc != 0) wrong("rt_sigprocmask", errno, 0);
  atomic_store(&g_spin_state, 1);
  while (atomic_load_explicit(&g_spin_state, memory_order_relaxed) == 1) {
  }
  return NULL;
}

static long run_calls(long n) {
  long sum = 0;
  for (long i = 0; i < n; i++) {
    long r = traced_add(i, 2 * i);
    if (r != 3 * i) wrong("traced_add", r, 3 * i);
    sum += r;
  }
  return sum;
}

struct thread_arg {
  long n;
  long sum;
  long tid;      /* the thread's id, set by the thread */
  int mix;       /* calls traced_mix_o0 rather than traced_add */
  char name[16]; /* the thread's name, if not empty */
};

static void *calls_thread(void *p) {
  struct thread_arg *a = p;
  a->tid = syscall(SYS_gettid);
  if (a->name[0] && prctl(PR_SET_NAME, a->name) != 0) wrong("PR_SET_NAME", errno, 0);
  if (a->mix) {
    a->sum = 0;
    for (long i = 0; i < a->n; i++) {
      long r = traced_mix_o0(i, 2 * i), want = mix_reference(i, 2 * i);
      if (r != want) wrong("traced_mix_o0", r, want);
      a->sum += r;
    }
  } else {
    a->sum = run_calls(a->n);
  }
  return NULL;
}

/* T threads each calling traced_add N times, named PREFIX-<i> when PREFIX is given. */
static long run_threads(long t, long n, const char *prefix, int mix) {
  pthread_t th[16];
  struct thread_arg a[16];
  long sum = 0;
  for (long i = 0; i < t; i++) {
    a[i].n = n;
    a[i].mix = mix;
    a[i].name[0] = 0;
    if (prefix) snprintf(a[i].name, sizeof a[i].name, "%s-%ld", prefix, i);
    pthread_create(&th[i], NULL, calls_thread, &a[i]);
  }
  for (long i = 0; i < t; i++) {
    pthread_join(th[i], NULL);
    sum += a[i].sum;
  }
  return sum;
}

static pthread_barrier_t g_crowd_barrier;

static void *crowd_thread(void *p) {
  struct thread_arg *a = p;
  pthread_barrier_wait(&g_crowd_barrier);
  a->sum = run_calls(a->n);
  return NULL;
}

/* T threads with small stacks, alive at once: each calls once every one has started. */
static long run_crowd(long t, long n) {
  pthread_t *th = calloc((size_t)t, sizeof *th);
  struct thread_arg *a = calloc((size_t)t, sizeof *a);
  if (!th || !a) wrong("calloc", 0, 1);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 * 1024);
  pthread_barrier_init(&g_crowd_barrier, NULL, (unsigned)t);
  for (long i = 0; i < t; i++) {
    a[i].n = n;
    if (pthread_create(&th[i], &attr, crowd_thread, &a[i]) != 0) wrong("pthread_create", i, t);
  }
  long sum = 0;
  for (long i = 0; i < t; i++) {
    pthread_join(th[i], NULL);
    sum += a[i].sum;
  }
  pthread_barrier_destroy(&g_crowd_barrier);
  pthread_attr_destroy(&attr);
  free(th);
  free(a);
  return sum;
}

/* K short-lived threads in sequence, N calls each. */
static long run_waves(long k, long n) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 * 1024);
  long sum = 0;
  for (long i = 0; i < k; i++) {
    struct thread_arg a = {.n = n};
    pthread_t th;
    if (pthread_create(&th, &attr, calls_thread, &a) != 0) wrong("pthread_create", i, k);
    pthread_join(th, NULL);
    sum += a.sum;
  }
  pthread_attr_destroy(&attr);
  return sum;
}

/* Moves the calling thread to CPU `cpu` (and keeps it there). */
static void pin_to(long cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET((int)cpu, &set);
  if (sched_setaffinity(0, sizeof set, &set) != 0) wrong("sched_setaffinity", errno, 0);
}

struct pinned_arg {
  long n;
  long ncpus;
  long cpus[8];
  long sum;
};

static void *pinned_thread(void *p) {
  struct pinned_arg *a = p;
  a->sum = 0;
  for (long i = 0; i < a->ncpus; i++) {
    pin_to(a->cpus[i]);
    a->sum += run_calls(a->n);
  }
  return NULL;
}

static atomic_int g_hot_stop;
static atomic_long g_hot_calls;
static pthread_t g_hot[16];
static int g_nhot;

static void *hot_thread(void *p) {
  long who = (long)p;
  long calls = 0;
  while (!atomic_load_explicit(&g_hot_stop, memory_order_relaxed)) {
    long r = traced_hot(who, calls);
    if (r != who * 1000003 + calls) wrong("traced_hot", r, who * 1000003 + calls);
    calls++;
  }
  atomic_fetch_add(&g_hot_calls, calls);
  return NULL;
}

int main(int argc, char **argv) {
  char line[512];
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc > 1 && strcmp(argv[1], "--after-exec") == 0) printf("exec'd\n");
  else printf("ready\n");
  while (fgets(line, sizeof line, stdin)) {
    char arg[400];
    long n = 0, t = 0;
    if (sscanf(line, "call %ld", &n) == 1) {
      printf("ok %ld\n", run_calls(n));
    } else if (sscanf(line, "str %ld", &n) == 1) {
      long sum = 0;
      for (long i = 0; i < n; i++) {
        char s[16];
        snprintf(s, sizeof s, "name-%ld", i % 10);
        long r = traced_str(s, i);
        if (r != 6 + i) wrong("traced_str", r, 6 + i);
        sum += r;
      }
      printf("ok %ld\n", sum);
    } else if (sscanf(line, "threads %ld %ld", &t, &n) == 2 && t > 0 && t <= 16) {
      printf("ok %ld\n", run_threads(t, n, NULL, 0));
    } else if (sscanf(line, "crowd %ld %ld", &t, &n) == 2 && t > 0 && t <= 4096) {
      printf("ok %ld\n", run_crowd(t, n));
    } else if (sscanf(line, "waves %ld %ld", &t, &n) == 2 && t > 0) {
      printf("ok %ld\n", run_waves(t, n));
    } else if (sscanf(line, "onethread %ld", &n) == 1) {
      struct thread_arg a = {.n = n};
      pthread_t th;
      if (pthread_create(&th, NULL, calls_thread, &a) != 0) wrong("pthread_create", 0, 1);
      pthread_join(th, NULL);
      printf("ok %ld %ld\n", a.sum, a.tid);
    } else if (sscanf(line, "mix %ld %ld", &t, &n) == 2 && t > 0 && t <= 16) {
      printf("ok %ld\n", run_threads(t, n, NULL, 1));
    } else if (sscanf(line, "named %ld %ld %10s", &t, &n, arg) == 3 && t > 0 && t <= 16) {
      printf("ok %ld\n", run_threads(t, n, arg, 0));
    } else if (sscanf(line, "rename %15s", arg) == 1) {
      if (prctl(PR_SET_NAME, arg) != 0) wrong("PR_SET_NAME", errno, 0);
      printf("ok\n");
    } else if (sscanf(line, "pinned %ld", &n) == 1) {
      pthread_t th[2];
      struct pinned_arg a[2];
      for (long i = 0; i < 2; i++) {
        a[i].n = n;
        a[i].ncpus = 1;
        a[i].cpus[0] = i;
        pthread_create(&th[i], NULL, pinned_thread, &a[i]);
      }
      for (long i = 0; i < 2; i++) pthread_join(th[i], NULL);
      printf("ok %ld\n", a[0].sum + a[1].sum);
    } else if (sscanf(line, "cpuseq %ld", &n) == 1) {
      struct pinned_arg a;
      pthread_t th;
      char *at = line + 7;
      strtol(at, &at, 10);  /* N */
      a.n = n;
      a.ncpus = 0;
      for (;;) {
        char *end;
        long c = strtol(at, &end, 10);
        if (end == at || a.ncpus == 8) break;
        a.cpus[a.ncpus++] = c;
        at = end;
      }
      pthread_create(&th, NULL, pinned_thread, &a);
      pthread_join(th, NULL);
      printf("ok %ld\n", a.sum);
    } else if (sscanf(line, "hot %ld", &t) == 1 && t > 0 && t <= 16 && g_nhot == 0) {
      atomic_store(&g_hot_stop, 0);
      atomic_store(&g_hot_calls, 0);
      for (long i = 0; i < t; i++) pthread_create(&g_hot[i], NULL, hot_thread, (void *)(i + 1));
      g_nhot = (int)t;
      printf("ok\n");
    } else if (strncmp(line, "cool", 4) == 0) {
      atomic_store(&g_hot_stop, 1);
      for (int i = 0; i < g_nhot; i++) pthread_join(g_hot[i], NULL);
      g_nhot = 0;
      printf("ok %ld\n", atomic_load(&g_hot_calls));
    } else if (sscanf(line, "fork %ld", &n) == 1) {
      pid_t c = fork();
      if (c == 0) {
        run_calls(n);
        _exit(0);
      }
      int st = -1;
      waitpid(c, &st, 0);
      printf("ok %d %d\n", (int)c, st);
    } else if (sscanf(line, "vfork %ld", &n) == 1) {
      vfork_calls(n);
    } else if (sscanf(line, "pspawn %399s", arg) == 1) {
      pid_t c = -1;
      char *argv[] = {arg, NULL};
      int st = -1;
      if (posix_spawn(&c, arg, NULL, NULL, argv, environ) == 0) waitpid(c, &st, 0);
      printf("ok %d %d\n", (int)c, st);
    } else if (sscanf(line, "forks %ld %ld", &t, &n) == 2 && t > 0) {
      long ok = 0;
      for (long i = 0; i < t; i++) {
        pid_t c = fork();
        if (c == 0) {
          run_calls(n);
          _exit(0);
        }
        int st = -1;
        if (c > 0 && waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0) ok++;
      }
      printf("ok %ld\n", ok);
    } else if (sscanf(line, "spawns %ld %399s", &t, arg) == 2 && t > 0) {
      long ok = 0;
      for (long i = 0; i < t; i++) {
        pid_t c = fork();
        if (c == 0) {
          execl(arg, arg, (char *)NULL);
          _exit(127);
        }
        int st = -1;
        if (c > 0 && waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0) ok++;
      }
      printf("ok %ld\n", ok);
    } else if (strncmp(line, "hold", 4) == 0) {
      pid_t c = fork();
      if (c == 0) {
        run_calls(1);
        for (;;) pause();
      }
      printf("ok %d\n", (int)c);
    } else if (sscanf(line, "run %399s", arg) == 1) {
      char *args[] = {arg, NULL};
      execv(arg, args);
      printf("WRONG run failed\n");
    } else if (strncmp(line, "exec", 4) == 0) {
      char *args[] = {argv[0], "--after-exec", NULL};
      execv("/proc/self/exe", args);
      printf("WRONG exec failed\n");
    } else if (sscanf(line, "env %399s", arg) == 1) {
      const char *v = getenv(arg);
      printf("ok %s\n", v ? v : "-");
    } else if (sscanf(line, "dlopen %399s", arg) == 1) {
      char *sym = strchr(line + 7, ' ');
      sym = sym ? strtok(sym + 1, " \n") : NULL;
      void *h = dlopen(arg, RTLD_NOW);
      long (*fn)(long) = h && sym ? (long (*)(long))dlsym(h, sym) : NULL;
      if (!fn) printf("WRONG dlopen %s\n", dlerror());
      else printf("ok %ld\n", fn(7));
    } else if (strncmp(line, "sleeps ", 7) == 0) {
      long us[16], k = 0, calls = 0;
      char *save = NULL, *tok = strtok_r(line + 7, " \n", &save);
      long times = tok ? atol(tok) : 0;
      while ((tok = strtok_r(NULL, " \n", &save)) != NULL && k < 16) us[k++] = atol(tok);
      for (long t = 0; t < times; ++t)
        for (long i = 0; i < k; ++i, ++calls)
          if (traced_sleep(us[i]) != us[i]) wrong("traced_sleep", us[i], us[i]);
      printf("ok %ld\n", calls);
    } else if (sscanf(line, "recurse %ld", &n) == 1 && n >= 0 && n <= 1000) {
      long r = traced_rec(n);
      if (r != n) wrong("traced_rec", r, n);
      printf("ok %ld\n", r);
    } else if (strncmp(line, "spin", 4) == 0 && atomic_load(&g_spin_state) == 0) {
      pthread_create(&g_spinner, NULL, spin_thread, NULL);
      while (atomic_load(&g_spin_state) != 1) {
      }
      printf("ok\n");
    } else if (strncmp(line, "unspin", 6) == 0 && atomic_load(&g_spin_state) == 1) {
      atomic_store(&g_spin_state, 2);
      pthread_join(g_spinner, NULL);
      atomic_store(&g_spin_state, 0);
      printf("ok\n");
    } else if (strncmp(line, "pid", 3) == 0) {
      printf("ok %d\n", (int)getpid());
    } else if (strncmp(line, "quit", 4) == 0) {
      return 0;
    } else {
      printf("WRONG command %s", line);
    }
  }
  return 0;
}
