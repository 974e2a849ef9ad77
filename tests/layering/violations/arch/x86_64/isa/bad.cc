// Capstone is the toolkit's; the backend is not.
#include <capstone/capstone.h>
#include "arch/x86_64/isa/insn.h"
#include "arch/x86_64/site.h"
