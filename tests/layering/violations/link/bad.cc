// The link's sockets carry events' messages; the daemon side is above them.
#include "events/link.h"
#include "tracee/agent_link.h"
