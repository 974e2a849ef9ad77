// The program the agent tests trace: calls with known arguments and known results.
//
//   target calls N           add(i, 1000 + i) and square(i) for i in [0, N), then
//                            greet("hello"), greet(NULL), greet((char*)8); exits 0
//   target phases N K        K phases: waits for a line on stdin, runs `calls N`, prints
//                            "done\n"; exits 0 at EOF
//   target loop              add(i, 1) until stdin ends, aborting on a wrong result; prints
//                            "running\n" once it has started
//   target fork N            fork: the child runs add(i, 2000 + i) N times, the parent
//                            waits for it, then runs `calls N`
//   target exec N            execs itself as `target calls N`
//   target dlopen LIB N      dlopen(LIB) (whose constructor calls probefs_late_ctor_fn(7)),
//                            probefs_late_ctor_fn(i) for i in [0, N), dlclose, `calls 1`
//   target attach AGENT N    dlopen(AGENT), then for each line of stdin: "go" runs
//                            `calls N` and prints "done"; anything else is a link name
//                            for probefs_agent_attach, whose result it prints
//                            ("attach RC"); "exec" execs `target calls N`
//   target threads T N       T threads started after main, each add(k, i) for i in [0, N)
//   target dlopen-agent AGENT  dlopen(AGENT) with RTLD_NOW and prints "ok"
//
// Each call's result is checked, so a probe that changed a register or the stack would
// make the program fail.
#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

__attribute__((noinline)) long probefs_target_add(long a, long b) {
  __asm__ volatile("" ::: "memory");
  return a + b;
}

__attribute__((noinline)) long probefs_target_square(long x) {
  __asm__ volatile("" ::: "memory");
  return x * x;
}

// Takes a string and never reads it: the tests pass bad pointers.
__attribute__((noinline)) int probefs_target_greet(const char* s) {
  __asm__ volatile("" ::: "memory");
  return s != NULL;
}

static void check(int ok, const char* what) {
  if (!ok) {
    fprintf(stderr, "wrong result: %s\n", what);
    abort();
  }
}

static void calls(long n, long base) {
  for (long i = 0; i < n; ++i) {
    check(probefs_target_add(i, base + i) == base + 2 * i, "add");
    check(probefs_target_square(i) == i * i, "square");
  }
}

static long g_thread_calls;

static void* thread_calls(void* arg) {
  const long k = (long)arg;
  for (long i = 0; i < g_thread_calls; ++i) check(probefs_target_add(k, i) == k + i, "add");
  return NULL;
}

static int read_line(char* buf, size_t cap) {
  if (!fgets(buf, (int)cap, stdin)) return 0;
  buf[strcspn(buf, "\n")] = 0;
  return 1;
}

static int phases(long n) {
  char line[256];
  while (read_line(line, sizeof line)) {
    calls(n, 1000);
    printf("done\n");
    fflush(stdout);
  }
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc < 2) return 2;
  const char* mode = argv[1];
  if (!strcmp(mode, "calls") && argc == 3) {
    calls(atol(argv[2]), 1000);
    check(probefs_target_greet("hello") == 1, "greet");
    check(probefs_target_greet(NULL) == 0, "greet");
    check(probefs_target_greet((const char*)8) == 1, "greet");
    return 0;
  }
  if (!strcmp(mode, "phases") && argc == 3) return phases(atol(argv[2]));
  if (!strcmp(mode, "loop")) {
    printf("running\n");
    fflush(stdout);
    // Between batches of calls, a look at stdin without waiting: EOF ends the loop.
    for (long i = 0;; ++i) {
      check(probefs_target_add(i, 1) == i + 1, "add");
      if ((i & 1023) != 0) continue;
      struct pollfd p = {0, POLLIN, 0};
      if (poll(&p, 1, 0) > 0) {
        char c;
        if (read(0, &c, 1) <= 0) break;
      }
    }
    return 0;
  }
  if (!strcmp(mode, "fork") && argc == 3) {
    const long n = atol(argv[2]);
    pid_t child = fork();
    if (child < 0) return 3;
    if (child == 0) {
      for (long i = 0; i < n; ++i) check(probefs_target_add(i, 2000 + i) == 2000 + 2 * i, "add");
      _exit(0);
    }
    int status = 0;
    if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
      return 4;
    calls(n, 1000);
    return 0;
  }
  if (!strcmp(mode, "exec") && argc == 3) {
    char* args[] = {argv[0], (char*)"calls", argv[2], NULL};
    execv("/proc/self/exe", args);
    return 5;
  }
  if (!strcmp(mode, "dlopen") && argc == 4) {
    void* lib = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      fprintf(stderr, "%s\n", dlerror());
      return 6;
    }
    long (*fn)(long) = (long (*)(long))dlsym(lib, "probefs_late_ctor_fn");
    if (!fn) return 7;
    const long n = atol(argv[3]);
    for (long i = 0; i < n; ++i) check(fn(i) == 3 * i, "late");
    dlclose(lib);
    calls(1, 1000);
    return 0;
  }
  if (!strcmp(mode, "attach") && argc == 4) {
    void* agent = dlopen(argv[2], RTLD_NOW);
    if (!agent) {
      fprintf(stderr, "%s\n", dlerror());
      return 9;
    }
    int (*attach)(const char*) = (int (*)(const char*))dlsym(agent, "probefs_agent_attach");
    if (!attach) return 10;
    const long n = atol(argv[3]);
    char line[256];
    while (read_line(line, sizeof line)) {
      if (!strcmp(line, "go")) {
        calls(n, 1000);
        printf("done\n");
      } else if (!strcmp(line, "exec")) {
        char* args[] = {argv[0], (char*)"calls", argv[3], NULL};
        execv("/proc/self/exe", args);
        return 12;
      } else {
        printf("attach %d\n", attach(line));
      }
      fflush(stdout);
    }
    return 0;
  }
  if (!strcmp(mode, "threads") && argc == 4) {
    const long nthreads = atol(argv[2]);
    g_thread_calls = atol(argv[3]);
    pthread_t t[64];
    if (nthreads < 1 || nthreads > 64) return 13;
    for (long k = 0; k < nthreads; ++k)
      if (pthread_create(&t[k], NULL, thread_calls, (void*)k) != 0) return 14;
    for (long k = 0; k < nthreads; ++k) pthread_join(t[k], NULL);
    return 0;
  }
  if (!strcmp(mode, "dlopen-agent") && argc == 3) {
    void* agent = dlopen(argv[2], RTLD_NOW);
    if (!agent) {
      fprintf(stderr, "%s\n", dlerror());
      return 11;
    }
    printf("ok\n");
    return 0;
  }
  return 2;
}
