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
 *   quit         exits 0
 */
#define _SDT_HAS_SEMAPHORES 1
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sdt.h>

/* The semaphore the note names (provider_name_semaphore, in .probes); read anew at each
 * round, as a tracer may change it at any time. */
__extension__ volatile unsigned short sdtprog_tick_semaphore
    __attribute__((section(".probes"), used));

__attribute__((noinline)) int sdt_tick(int i) {
  __asm__ volatile("" : "+r"(i));
  return i * 3;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  puts("ready");
  char line[128];
  while (fgets(line, sizeof line, stdin)) {
    long n = 0;
    if (strncmp(line, "sem", 3) == 0) {
      printf("ok %u\n", (unsigned)sdtprog_tick_semaphore);
    } else if (sscanf(line, "tick %ld", &n) == 1) {
      long calls = 0;
      for (int i = 0; i < n; ++i) {
        if (sdtprog_tick_semaphore) {
          STAP_PROBE1(sdtprog, tick, i);
          calls += sdt_tick(i) >= 0;
        }
      }
      printf("ok %ld\n", calls);
    } else if (strncmp(line, "quit", 4) == 0) {
      return 0;
    } else {
      puts("?");
    }
  }
  return 0;
}
