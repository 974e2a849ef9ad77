// The agent never sees libelf.
#include <gelf.h>
#include "probecore/kprobes.h"
#include "events/fetch.h"
#include "link/socket.h"
#include "gelf.h"
