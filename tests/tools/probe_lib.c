// The library of probe_prog (libprobefs_probe_lib.so), built with -g.
#include "probe_prog.h"

int lib_checksum(const char *s, int n) {
  unsigned sum = 0;
  for (int i = 0; i < n; i++) sum = sum * 31 + (unsigned char)s[i];
  return (int)(sum & 0xffff);
}
