// libprobefs-tracefs.so, preloaded by `probefs run` (fs/run_command.cc) where it cannot
// make a mount namespace. libtracefs finds tracefs only as a `tracefs` entry of
// /proc/mounts, which a FUSE mount never is; before main, this points it at the directory
// in PROBEFS_TRACING_DIR (a probefs mount) through its own setter.
#include <stdlib.h>
#include <tracefs.h>

__attribute__((constructor)) static void probefs_set_tracing_dir(void) {
  char* dir = getenv("PROBEFS_TRACING_DIR");
  if (dir && *dir) tracefs_set_tracing_dir(dir);
}
