// The agent's signal guard (agent/signal_guard.h), as the rest of the agent calls it.
#include "agent/agent.h"
#include "agent/signal_guard.h"

#include <vector>

namespace probefs::agent {

int install_guards(probecore::Kprobe* const* also, int n_also) {
  // Every guard and every probe given, in one write window.
  std::vector<probecore::Kprobe*> all(kMaxSpawnGuards);
  all.resize(register_spawn_guards(all.data(), all.size()));
  if (also && n_also > 0) all.insert(all.end(), also, also + n_also);
  return install_signal_guards(all.data(), static_cast<int>(all.size()));
}
void uninstall_guards() {
  uninstall_spawn_guards();
  if (signal_guards_installed()) uninstall_signal_guards();
}
bool fault_fixup_installed() { return signal_guards_installed(); }

}  // namespace probefs::agent
