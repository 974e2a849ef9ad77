/* A library with a USDT point and no semaphore (<sys/sdt.h> without
 * _SDT_HAS_SEMAPHORES: the point is a nop that always runs), for the tests of USDT points
 * in an object a program loads later (dlopen). sdtlib_fire(i) passes the point an int and
 * a string: sdtlib:fire(i, name). */
#include <sys/sdt.h>

static const char* const kNames[] = {"alpha", "beta", "gamma"};

__attribute__((noinline, visibility("default"))) int sdtlib_fire(int i) {
  const char* name = kNames[i % 3];
  __asm__ volatile("" : "+r"(name));  /* in a register: an operand a fetch can read */
  STAP_PROBE2(sdtlib, fire, i, name);
  return i;
}
