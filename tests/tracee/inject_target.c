// The program the injection tests attach to: `inject_target MODE [SHM_FD]`. Each mode
// stops in one place a thread can be held in (busy in user code, blocked in a system
// call of each restart kind, in a condition wait beside hot threads, ...), checks for
// itself that it saw no EINTR, no changed errno and no lost signal, and prints one line
// of results on standard output. Standard input brings the test's go-ahead.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "inject_work.h"

// Set by each mode before it blocks; the mode checks it again afterwards. Through a
// volatile pointer, so that the compiler cannot carry the value across code it can see
// leaves errno alone (the hot loop).
#define EXPECTED_ERRNO 1234
#define SET_ERRNO() (*(volatile int*)&errno = EXPECTED_ERRNO)
#define GET_ERRNO() (*(volatile int*)&errno)

static void say(const char* fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof line - 1) n = (int)sizeof line - 1;
  (void)!write(1, line, (size_t)n);
}

static struct probefs_inject_shared* shared;

static void map_shared(int argc, char** argv) {
  if (argc < 3) {
    say("usage: missing SHM_FD\n");
    exit(2);
  }
  shared = mmap(NULL, sizeof *shared, PROT_READ | PROT_WRITE, MAP_SHARED, atoi(argv[2]), 0);
  if (shared == MAP_FAILED) {
    say("mmap: %s\n", strerror(errno));
    exit(2);
  }
}

// The hot loop: x in a general register, the four lanes in one vector register (a ymm
// register where the CPU has AVX2), until the test sets `stop`.
typedef double v4df __attribute__((vector_size(32)));

#define HOT_LOOP_BODY                                                                     \
  uint64_t x = w->x;                                                                      \
  uint64_t steps = w->steps;                                                              \
  v4df acc = {w->acc[0], w->acc[1], w->acc[2], w->acc[3]};                                \
  const v4df decay = {PROBEFS_INJECT_DECAY, PROBEFS_INJECT_DECAY, PROBEFS_INJECT_DECAY,   \
                      PROBEFS_INJECT_DECAY};                                              \
  while (!shared->stop) {                                                                 \
    for (int i = 0; i < 4096; ++i) {                                                      \
      x ^= x << 13;                                                                       \
      x ^= x >> 7;                                                                        \
      x ^= x << 17;                                                                       \
      v4df add = {(double)(x & 0xff), (double)((x >> 8) & 0xff),                          \
                  (double)((x >> 16) & 0xff), (double)((x >> 24) & 0xff)};                \
      acc = acc * decay + add;                                                            \
    }                                                                                     \
    steps += 4096;                                                                        \
    ++shared->progress[slot];                                                             \
  }                                                                                       \
  w->x = x;                                                                               \
  w->steps = steps;                                                                       \
  for (int i = 0; i < 4; ++i) w->acc[i] = acc[i];

__attribute__((target("avx2"), noinline)) static void hot_loop_avx2(
    struct probefs_inject_work* w, int slot) {
  HOT_LOOP_BODY
}

__attribute__((noinline)) static void hot_loop_sse(struct probefs_inject_work* w, int slot) {
  HOT_LOOP_BODY
}

static void hot_loop(struct probefs_inject_work* w, int slot) {
  if (__builtin_cpu_supports("avx2")) {
    hot_loop_avx2(w, slot);
  } else {
    hot_loop_sse(w, slot);
  }
}

static void say_work(const char* what, int slot, const struct probefs_inject_work* w) {
  say("%s %d %llu %llx %a %a %a %a\n", what, slot, (unsigned long long)w->steps,
      (unsigned long long)w->x, w->acc[0], w->acc[1], w->acc[2], w->acc[3]);
}

// Called by the tests through PtraceSession::call, in the dynamic and the static build.
long probefs_inject_twice(long x) { return 2 * x; }

static int mode_busy(void) {
  struct probefs_inject_work w;
  probefs_inject_work_init(&w, 0);
  SET_ERRNO();
  hot_loop(&w, 0);
  int e = GET_ERRNO();
  say_work("busy", 0, &w);
  say("errno=%d\n", e);
  return 0;
}

static int mode_read(void) {
  char buf[64];
  say("ready\n");
  SET_ERRNO();
  ssize_t n = read(0, buf, sizeof buf);
  int e = GET_ERRNO();
  say("read %zd %.*s errno=%d\n", n, n > 0 ? (int)n : 0, buf, e);
  return 0;
}

static volatile sig_atomic_t usr1_count;
static void on_usr1(int sig) {
  (void)sig;
  ++usr1_count;
}

static int mode_usr1(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1;
  sa.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &sa, NULL);
  char buf[64];
  say("ready\n");
  SET_ERRNO();
  ssize_t n = read(0, buf, sizeof buf);
  int e = GET_ERRNO();
  say("usr1 count=%d read=%zd errno=%d\n", (int)usr1_count, n, e);
  return 0;
}

// The classic sigsuspend loop: SIGUSR1 blocked but while waiting. Afterwards the mask
// must be the program's again (SIGUSR1 blocked), not sigsuspend's temporary one.
static int mode_sigsuspend(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1;
  sigaction(SIGUSR1, &sa, NULL);
  sigset_t block, wait_mask, after;
  sigemptyset(&block);
  sigaddset(&block, SIGUSR1);
  sigprocmask(SIG_BLOCK, &block, NULL);
  sigemptyset(&wait_mask);
  say("ready\n");
  SET_ERRNO();
  int r = 0, e = 0, waits = 0;
  while (usr1_count == 0) {
    r = sigsuspend(&wait_mask);
    e = GET_ERRNO();
    ++waits;
  }
  sigprocmask(SIG_BLOCK, NULL, &after);
  say("sigsuspend r=%d errno=%d count=%d waits=%d usr1_blocked_after=%d\n", r, e,
      (int)usr1_count, waits, sigismember(&after, SIGUSR1));
  return 0;
}

static int mode_poll(int use_epoll) {
  say("ready\n");
  int r;
  SET_ERRNO();
  if (use_epoll) {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = 0};
    epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev);
    SET_ERRNO();
    r = epoll_wait(ep, &ev, 1, -1);
  } else {
    struct pollfd p = {.fd = 0, .events = POLLIN};
    r = poll(&p, 1, -1);
  }
  int e = GET_ERRNO();
  char buf[64];
  ssize_t n = read(0, buf, sizeof buf);
  say("%s r=%d errno=%d read=%zd\n", use_epoll ? "epoll" : "poll", r, e, n);
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

// Sleeps 1.5 s, held for part of it. Restarted through restart_syscall, the sleep ends at
// its first deadline: neither short (rem lost) nor EINTR.
static int mode_sleep(int clock_form) {
  struct timespec req = {1, 500000000}, rem = {0, 0};
  say("ready\n");
  double t0 = now_s();
  SET_ERRNO();
  int r;
  if (clock_form) {
    r = clock_nanosleep(CLOCK_MONOTONIC, 0, &req, &rem);  // returns the error number
  } else {
    r = (int)syscall(SYS_nanosleep, &req, &rem);
  }
  int e = GET_ERRNO();
  double slept = now_s() - t0;
  say("sleep r=%d errno=%d slept_enough=%d\n", r, e, slept >= 1.5 ? 1 : 0);
  return 0;
}

static pthread_mutex_t go_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t go_cv = PTHREAD_COND_INITIALIZER;
static int go;

static void* hot_thread(void* arg) {
  int slot = (int)(intptr_t)arg;
  struct probefs_inject_work* w = malloc(sizeof *w);
  probefs_inject_work_init(w, (uint64_t)slot);
  hot_loop(w, slot);
  return w;
}

static void* stdin_waker(void* arg) {
  (void)arg;
  char buf[16];
  (void)!read(0, buf, sizeof buf);
  pthread_mutex_lock(&go_mu);
  go = 1;
  pthread_cond_signal(&go_cv);
  pthread_mutex_unlock(&go_mu);
  return NULL;
}

// Four threads in hot loops, one reading standard input, and the main thread waiting on a
// condition variable (a futex wait) for that one.
static int mode_threads(void) {
  pthread_t hot[PROBEFS_INJECT_HOT_THREADS], waker;
  for (int i = 0; i < PROBEFS_INJECT_HOT_THREADS; ++i) {
    pthread_create(&hot[i], NULL, hot_thread, (void*)(intptr_t)i);
  }
  pthread_create(&waker, NULL, stdin_waker, NULL);
  say("ready\n");
  pthread_mutex_lock(&go_mu);
  SET_ERRNO();
  int waits = 0;
  while (!go) {
    int r = pthread_cond_wait(&go_cv, &go_mu);
    if (r != 0) say("pthread_cond_wait: %d\n", r);
    ++waits;
  }
  int e = GET_ERRNO();
  pthread_mutex_unlock(&go_mu);
  shared->stop = 1;
  for (int i = 0; i < PROBEFS_INJECT_HOT_THREADS; ++i) {
    void* w;
    pthread_join(hot[i], &w);
    say_work("hot", i, w);
    free(w);
  }
  pthread_join(waker, NULL);
  say("main errno=%d waits=%d\n", e, waits);
  return 0;
}

// The main thread in epoll_wait, where a stop would end the wait with EINTR, and one
// thread in a hot loop: the session should hold the hot one.
static int mode_epoll_hot(void) {
  pthread_t hot;
  pthread_create(&hot, NULL, hot_thread, (void*)(intptr_t)0);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = 0};
  epoll_ctl(ep, EPOLL_CTL_ADD, 0, &ev);
  say("ready\n");
  SET_ERRNO();
  int r = epoll_wait(ep, &ev, 1, -1);
  int e = GET_ERRNO();
  char buf[64];
  ssize_t n = read(0, buf, sizeof buf);
  shared->stop = 1;
  void* w;
  pthread_join(hot, &w);
  say_work("hot", 0, w);
  free(w);
  say("epoll r=%d errno=%d read=%zd\n", r, e, n);
  return 0;
}

static void* leader_exit_worker(void* arg) {
  (void)arg;
  char buf[64];
  say("ready\n");
  SET_ERRNO();
  ssize_t n = read(0, buf, sizeof buf);
  int e = GET_ERRNO();
  say("worker read=%zd errno=%d\n", n, e);
  exit(0);
}

// The main thread leaves with pthread_exit: the leader is a zombie, the process lives.
static int mode_leader_exit(void) {
  pthread_t t;
  pthread_create(&t, NULL, leader_exit_worker, NULL);
  pthread_exit(NULL);
}

// The parent sits in vfork, where only a fatal signal reaches it, until the child reads
// a line of standard input.
static int mode_vfork(void) {
  say("ready\n");
  pid_t child = vfork();
  if (child == 0) {
    char buf[16];
    syscall(SYS_read, 0, buf, sizeof buf);
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  say("vfork done %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return 0;
}

static void* stdin_reader(void* arg) {
  char buf[16];
  *(ssize_t*)arg = read(0, buf, sizeof buf);
  return NULL;
}

// The main thread sits in malloc_stats, writing to a standard error that the test keeps
// full: in a write system call, inside the allocator's statistics. With `beside`, another
// thread waits in read(2) on standard input meanwhile.
static int mode_malloc_stats(int beside) {
  pthread_t t;
  ssize_t beside_read = -1;
  if (beside) pthread_create(&t, NULL, stdin_reader, &beside_read);
  say("ready\n");
  SET_ERRNO();
  malloc_stats();
  int e = GET_ERRNO();
  if (beside) pthread_join(t, NULL);
  say("malloc_stats done errno=%d beside_read=%zd\n", e, beside_read);
  return 0;
}

// The main thread loads a library whose constructor waits for the nap pipe: it sits in
// the dynamic loader, owning its lock, until the test lets it go.
static int mode_dlopen_slow(void) {
#ifdef PROBEFS_INJECT_STATIC
  say("no dlopen in the static build\n");
  return 2;
#else
  const char* lib = getenv(PROBEFS_INJECT_SLOW_LIB_ENV);
  say("ready\n");
  void* h = lib != NULL ? dlopen(lib, RTLD_NOW) : NULL;
  int (*value)(void) = h != NULL ? (int (*)(void))dlsym(h, "probefs_inject_slow_value") : NULL;
  say("dlopen_slow value=%d\n", value != NULL ? value() : -1);
  return 0;
#endif
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  if (strcmp(mode, "busy") == 0) {
    map_shared(argc, argv);
    return mode_busy();
  }
  if (strcmp(mode, "threads") == 0) {
    map_shared(argc, argv);
    return mode_threads();
  }
  if (strcmp(mode, "epoll_hot") == 0) {
    map_shared(argc, argv);
    return mode_epoll_hot();
  }
  if (strcmp(mode, "read") == 0) return mode_read();
  if (strcmp(mode, "usr1") == 0) return mode_usr1();
  if (strcmp(mode, "sigsuspend") == 0) return mode_sigsuspend();
  if (strcmp(mode, "poll") == 0) return mode_poll(0);
  if (strcmp(mode, "epoll") == 0) return mode_poll(1);
  if (strcmp(mode, "nanosleep") == 0) return mode_sleep(0);
  if (strcmp(mode, "clock_nanosleep") == 0) return mode_sleep(1);
  if (strcmp(mode, "leader_exit") == 0) return mode_leader_exit();
  if (strcmp(mode, "vfork") == 0) return mode_vfork();
  if (strcmp(mode, "malloc_stats") == 0) return mode_malloc_stats(0);
  if (strcmp(mode, "malloc_stats_beside") == 0) return mode_malloc_stats(1);
  if (strcmp(mode, "dlopen_slow") == 0) return mode_dlopen_slow();
  if (strcmp(mode, "exit") == 0) {
    say("ready\n");
    return 0;
  }
  say("unknown mode '%s'\n", mode);
  return 2;
}
