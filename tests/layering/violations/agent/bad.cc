// The agent never sees libelf.
#include <gelf.h>
#include "probecore/kprobes.h"
#include "events/fetch.h"
#include "gelf.h"
