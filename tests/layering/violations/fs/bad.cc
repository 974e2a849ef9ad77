// FUSE is the daemon's; the engine is not.
#include <fuse3/fuse_lowlevel.h>
#include "tracee/elf_symbols.h"
#include "probecore/kprobes.h"
