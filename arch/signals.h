// The signals the engine takes for itself inside the process, and where the ones that are
// not the engine's go.
//
// The engine installs a handler for SIGTRAP (int3 probes, arch::install()) and for the
// thread-fixup real-time signal (parking threads while code changes, installed at the first
// park or by install_thread_fixup_handler()). What reaches those handlers without being the
// engine's — a breakpoint or a SIGTRAP of the program's own, a fixup signal that the engine
// did not send — is passed on to the program: to the action the program had for the signal
// when the engine installed its handler, or, once set_foreign_signal_handler() names one,
// to that handler instead (the agent's, which keeps the program's actions and masks itself
// and hands the actions back with set_program_signal_action() when it stops).
#pragma once

#include <signal.h>

#include <cstdint>

namespace probefs::arch {

// The real-time signal the engine sends to other threads to park them (SIGRTMAX - 1).
int fixup_signal();

// Installs the fixup signal's handler now rather than at the first park. Idempotent.
// 0 or -errno.
[[nodiscard]] int install_thread_fixup_handler();

// An engine thread with nothing to do sleeps in the engine's own code until *word is
// nonzero (set it, then wake_quiet_sleeper(word)). Write windows opened while it sleeps
// there pass it by: no look at its registers and stack through /proc, no signal (nothing
// of the program's code lies under it; a look cost each window a third of a millisecond).
// It returns only between windows. For a thread that blocks every asynchronous signal.
void sleep_quietly_until(const uint32_t* word);
void wake_quiet_sleeper(const uint32_t* word);

// The action the program had for `sig` (SIGTRAP or fixup_signal()) when the engine
// installed its handler, as foreign signals are passed on to it. 0; -EAGAIN when the
// engine's handler is not installed yet; -EINVAL for any other signal.
[[nodiscard]] int program_signal_action(int sig, struct sigaction* out);
// Replaces that action. Control plane; 0, -EAGAIN or -EINVAL as above.
[[nodiscard]] int set_program_signal_action(int sig, const struct sigaction& act);

// The action the engine installs for sig (SIGTRAP or fixup_signal()): its handler, flags
// and mask, to tell whether the program displaced it and to put it back. 0, -EAGAIN or
// -EINVAL as above.
[[nodiscard]] int engine_signal_action(int sig, struct sigaction* out);

// Runs in the engine's signal handler (SIGTRAP: with nothing blocked but what the
// interrupted code blocked; the fixup signal: with every signal blocked), with that
// handler's siginfo and ucontext.
using ForeignSignalHandler = void (*)(int sig, siginfo_t* info, void* ucontext);
// Foreign SIGTRAP and fixup signals go to `handler` from now on; nullptr: back to the
// program's actions above.
void set_foreign_signal_handler(ForeignSignalHandler handler);

}  // namespace probefs::arch
