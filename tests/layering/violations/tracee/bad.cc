// libelf is tracee's; FUSE is not.
#include <libelf.h>
#include <fuse3/fuse.h>
