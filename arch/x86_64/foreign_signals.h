// For the engine's signal handlers (trap.cc, thread_fixup.cc): what to do with a signal
// that is not the engine's (arch/signals.h).
#pragma once

#include <signal.h>

namespace probefs::arch::x86_64 {

// Called once the engine's handler for sig is installed: the engine's action, and the
// program's that it replaced.
void remember_actions(int sig, const struct sigaction& engine, const struct sigaction& program);

// From inside the engine's handler for sig: to the foreign handler if one is set, else to
// the program's action (its handler; ignored; or the default action, which ends the
// process as it would have ended without the engine).
void pass_on_foreign(int sig, siginfo_t* info, void* ucontext);

}  // namespace probefs::arch::x86_64
