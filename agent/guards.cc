// The agent's signal guard, as the rest of the agent calls it. Until the guard is part of
// the agent, nothing is installed and fetch arguments are read through system calls
// (events::LiveMemoryReader), which need no SIGSEGV handler.
#include "agent/agent.h"

namespace probefs::agent {

int install_guards() { return 0; }
void uninstall_guards() {}
bool fault_fixup_installed() { return false; }

}  // namespace probefs::agent
