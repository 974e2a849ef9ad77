// The agent's signal guard (agent/signal_guard.h), as the rest of the agent calls it.
#include "agent/agent.h"
#include "agent/signal_guard.h"

namespace probefs::agent {

int install_guards() {
  install_spawn_guards();
  return install_signal_guards();
}
void uninstall_guards() {
  uninstall_spawn_guards();
  if (signal_guards_installed()) uninstall_signal_guards();
}
bool fault_fixup_installed() { return signal_guards_installed(); }

}  // namespace probefs::agent
