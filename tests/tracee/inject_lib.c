// The library the injection tests load into their targets. Its constructor proves that it
// ran by writing to the pipe the target inherited (PROBEFS_INJECT_REPORT_FD); its
// functions are called from outside through PtraceSession::call.
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "inject_work.h"

static int report_fd = -1;

static void report(const char* a, const char* b) {
  if (report_fd < 0) return;
  char line[512];
  size_t n = 0;
  for (const char* s = a; *s != '\0' && n < sizeof line - 1; ++s) line[n++] = *s;
  for (const char* s = b; *s != '\0' && n < sizeof line - 1; ++s) line[n++] = *s;
  line[n++] = '\n';
  (void)!write(report_fd, line, n);
}

__attribute__((constructor)) static void probefs_inject_lib_load(void) {
  const char* fd = getenv(PROBEFS_INJECT_REPORT_FD_ENV);
  report_fd = fd != NULL ? atoi(fd) : -1;
  report("loaded", "");
}

// Leaves the vector unit as code that uses it may: ymm0-15 zeroed (glibc's own string
// functions use ymm16-31 where AVX-512 is present, and would leave them alone), and
// another rounding mode in MXCSR.
__attribute__((target("avx"))) static void clobber_vector_state_avx(void) {
  __asm__ volatile("vzeroall" ::: "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6",
                   "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14",
                   "xmm15");
}

static void clobber_vector_state(void) {
  if (__builtin_cpu_supports("avx")) clobber_vector_state_avx();
  unsigned int round_toward_zero = 0x7f80;
  __asm__ volatile("ldmxcsr %0" ::"m"(round_toward_zero));
}

// Reports the string and returns a number made of it, so that the caller can check both.
// It changes errno and the vector state, as library code may: the session must put the
// thread's back.
long probefs_inject_echo(const char* s) {
  report("echo:", s);
  long result = (long)strlen(s) * 1000 + (unsigned char)s[0];
  errno = EILSEQ;
  clobber_vector_state();
  return result;
}

// Waits in poll, with a timeout, until the nap pipe has data: a call that sits in a
// timed wait, whose restart block the kernel sets if a stop interrupts it.
long probefs_inject_nap(void) {
  const char* fd = getenv(PROBEFS_INJECT_NAP_FD_ENV);
  struct pollfd p = {fd != NULL ? atoi(fd) : -1, POLLIN, 0};
  report("napping", "");
  return poll(&p, 1, 60000);
}

// Executes another program: a call after which there is nothing to return to.
long probefs_inject_exec(const char* path, const char* arg1, const char* arg2) {
  execl(path, path, arg1, arg2, (char*)NULL);
  return -1;
}

// Faults: a call that crashes.
long probefs_inject_crash(void) {
  volatile long* volatile p = NULL;
  return *p;
}

// Never returns: a call that times out.
long probefs_inject_spin(void) {
  volatile long n = 0;
  for (;;) ++n;
  return n;
}
