/* A program with a USDT probe (<sys/sdt.h>) guarded by its semaphore, for the tests of
 * uprobes' reference counters (PATH:OFFSET(REF_CTR_OFFSET)). A tracer that enables a
 * probe with the semaphore's file offset as its reference counter makes the guarded code
 * run; with nothing enabled it is skipped, as in any program built with SDT semaphores
 * (Python's function__entry, PostgreSQL's, ...). Prints "ready", then answers one line
 * per command on stdin:
 *
 *   sem          "ok V": the value of sdtprog_tick's semaphore now
 *   tick N       N rounds, each running the guarded code (the SDT point, then
 *                sdt_tick(i)) while the semaphore is nonzero: "ok CALLS"
 *   fork         a child that serves the same commands from a pipe of its own (one at
 *                a time): "ok PID"
 *   child CMD    CMD for the child, its answer relayed ("?" with no child)
 *   load PATH    dlopen()s the library at PATH (tests/tracee/sdt_lib.c): "ok"
 *   lib N        calls its sdtlib_fire(i) for i in 0..N-1: "ok N" ("?" before load)
 *   quit         exits 0 (a child is told to quit first, and waited for)
 */
#define _SDT_HAS_SEMAPHORES 1
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>
#include <sys/wait.h>
#include <unistd.h>

/* The semaphore the note names (provider_name_semaphore, in .probes); read anew at each
 * round, as a tracer may change it at any time. */
__extension__ volatile unsigned short sdtprog_tick_semaphore
    __attribute__((section(".probes"), used));

__attribute__((noinline)) int sdt_tick(int i) {
  __asm__ volatile("" : "+r"(i));
  return i * 3;
}

static pid_t child = -1;
static int (*lib_fire)(int);
static FILE *to_child, *from_child;

/* The command loop, on `in`, answering on `out`. */
static int serve(FILE* in, FILE* out) {
  char line[128];
  while (fgets(line, sizeof line, in)) {
    long n = 0;
    if (strncmp(line, "child ", 6) == 0) {
      char answer[128] = "?\n";
      if (child > 0 && fputs(line + 6, to_child) >= 0 && fflush(to_child) == 0 &&
          !fgets(answer, sizeof answer, from_child))
        strcpy(answer, "?\n");
      fputs(answer, out);
      fflush(out);
    } else if (strncmp(line, "fork", 4) == 0 && child < 0) {
      int down[2], up[2];
      if (pipe(down) != 0 || pipe(up) != 0) {
        fputs("?\n", out);
        fflush(out);
        continue;
      }
      child = fork();
      if (child == 0) {
        close(down[1]);
        close(up[0]);
        FILE* cin = fdopen(down[0], "r");
        FILE* cout = fdopen(up[1], "w");
        _exit(cin && cout ? serve(cin, cout) : 1);
      }
      close(down[0]);
      close(up[1]);
      to_child = fdopen(down[1], "w");
      from_child = fdopen(up[0], "r");
      fprintf(out, "ok %d\n", (int)child);
      fflush(out);
    } else if (strncmp(line, "sem", 3) == 0) {
      fprintf(out, "ok %u\n", (unsigned)sdtprog_tick_semaphore);
      fflush(out);
    } else if (sscanf(line, "tick %ld", &n) == 1) {
      long calls = 0;
      for (int i = 0; i < n; ++i) {
        if (sdtprog_tick_semaphore) {
          STAP_PROBE1(sdtprog, tick, i);
          calls += sdt_tick(i) >= 0;
        }
      }
      fprintf(out, "ok %ld\n", calls);
      fflush(out);
    } else if (strncmp(line, "load ", 5) == 0) {
      line[strcspn(line, "\n")] = '\0';
      void* lib = dlopen(line + 5, RTLD_NOW);
      lib_fire = lib ? (int (*)(int))dlsym(lib, "sdtlib_fire") : NULL;
      fputs(lib_fire ? "ok\n" : "?\n", out);
      fflush(out);
    } else if (sscanf(line, "lib %ld", &n) == 1) {
      if (lib_fire) {
        for (int i = 0; i < n; ++i) lib_fire(i);
        fprintf(out, "ok %ld\n", n);
      } else {
        fputs("?\n", out);
      }
      fflush(out);
    } else if (strncmp(line, "quit", 4) == 0) {
      break;
    } else {
      fputs("?\n", out);
      fflush(out);
    }
  }
  if (child > 0) {
    fputs("quit\n", to_child);
    fclose(to_child);
    waitpid(child, NULL, 0);
  }
  return 0;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  puts("ready");
  return serve(stdin, stdout);
}
