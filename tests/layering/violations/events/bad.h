// Forbidden: events sees probecore, and arch below its top.
#include "arch/regs.h"
#include "probecore/kprobes.h"
#include "arch/x86_64/site.h"
