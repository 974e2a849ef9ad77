// A library whose constructor does not return until the test lets it: a dlopen that takes
// as long as the test wants, holding the dynamic loader's lock meanwhile. It waits for a
// byte on the nap pipe the target inherited (PROBEFS_INJECT_NAP_FD), at most a minute, and
// reports on the report pipe (PROBEFS_INJECT_REPORT_FD) before and after.
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "inject_work.h"

static void report(const char* line) {
  const char* fd = getenv(PROBEFS_INJECT_REPORT_FD_ENV);
  if (fd != NULL) (void)!write(atoi(fd), line, strlen(line));
}

__attribute__((constructor)) static void probefs_inject_slow_lib_load(void) {
  report("slow:loading\n");
  const char* fd = getenv(PROBEFS_INJECT_NAP_FD_ENV);
  struct pollfd p = {fd != NULL ? atoi(fd) : -1, POLLIN, 0};
  if (poll(&p, 1, 60000) == 1) {
    char c;
    (void)!read(p.fd, &c, 1);
  }
  report("slow:loaded\n");
}

int probefs_inject_slow_value(void) { return 42; }
