// libelf is tracee's; FUSE is not.
#include <libelf.h>
#include "link/socket.h"
#include <fuse3/fuse.h>
