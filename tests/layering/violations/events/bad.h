// Forbidden: events sees probecore, arch below its top, and the link that carries its messages.
#include "arch/regs.h"
#include "probecore/kprobes.h"
#include "arch/x86_64/site.h"
#include "link/socket.h"
