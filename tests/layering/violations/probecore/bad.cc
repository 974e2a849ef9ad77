// Forbidden: Capstone outside the ISA toolkit; probecore sees tracee.
#include <capstone/capstone.h>
#include "arch/arch.h"
#include "tracee/elf_symbols.h"
