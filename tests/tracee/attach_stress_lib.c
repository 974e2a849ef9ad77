/* The library tests/tracee/attach_stress_prog.c loads and unloads all the time. Each load
 * allocates in its constructor, takes a TLS slot (the loader's TLS tables change with every
 * load and unload, under the lock pthread_create takes too) and frees in its destructor. */
#include <stdlib.h>
#include <string.h>

static __thread long calls;
static char* scratch;

__attribute__((constructor)) static void attach_stress_lib_load(void) {
  scratch = malloc(4096);
  if (scratch != NULL) memset(scratch, 0x5a, 4096);
}

__attribute__((destructor)) static void attach_stress_lib_unload(void) {
  free(scratch);
  scratch = NULL;
}

/* x * x + 7 + the bytes of the constructor's block (4096 * 0x5a, or 0 when it could not
 * allocate, which the caller then sees as a wrong result). */
long attach_stress_value(long x) {
  ++calls;
  long sum = 0;
  for (int i = 0; scratch != NULL && i < 4096; i += 64) sum += scratch[i];
  return x * x + 7 + sum * 64 + (calls > 0 ? 0 : 1);
}
