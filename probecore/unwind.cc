// C++ exceptions through functions with a return probe in flight.
//
// A return probe's entry replaces the function's return address on the stack with the
// trampoline's (or, for an optimized entry in call mode, with a return point in its
// detour). The unwinder finds no unwind information at that address, and an exception
// thrown through such a frame would end in std::terminate. So before an exception starts
// to unwind, the thread's instances in flight put the program's own return addresses back
// and return to their pools (give_back_hijacked_returns, kretprobe_instances.cc).
//
// The engine does that from the unwinder's entry points that start an unwind, which it
// interposes: libstdc++ calls _Unwind_RaiseException (throw) and _Unwind_Resume_or_Rethrow
// (rethrow) through its PLT, so a program linked with the engine, or that preloads it,
// reaches these first; they then call the next definition (libgcc_s's). A frame the
// exception unwinds runs no return handler, as with longjmp; neither does a frame that
// lies above the catch and returns later (which ones those are is known only once the
// unwinder's search is over, after the addresses had to be back).
//
// Not covered: pthread_cancel and pthread_exit unwind through an unwinder glibc looks up
// by itself (they stop at the first hijacked frame, and the thread ends there).
#include <dlfcn.h>
#include <unwind.h>

#include "probecore/engine_state.h"

namespace probefs::probecore::detail {
namespace {

template <typename Fn>
Fn next_definition(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

}  // namespace
}  // namespace probefs::probecore::detail

using probefs::probecore::detail::give_back_hijacked_returns;
using probefs::probecore::detail::next_definition;

extern "C" {

__attribute__((visibility("default"))) _Unwind_Reason_Code _Unwind_RaiseException(
    _Unwind_Exception* exc) {
  using Fn = _Unwind_Reason_Code (*)(_Unwind_Exception*);
  static const Fn next = next_definition<Fn>("_Unwind_RaiseException");
  give_back_hijacked_returns(__builtin_frame_address(0));
  return next ? next(exc) : _URC_FATAL_PHASE1_ERROR;
}

__attribute__((visibility("default"))) _Unwind_Reason_Code _Unwind_Resume_or_Rethrow(
    _Unwind_Exception* exc) {
  using Fn = _Unwind_Reason_Code (*)(_Unwind_Exception*);
  static const Fn next = next_definition<Fn>("_Unwind_Resume_or_Rethrow");
  give_back_hijacked_returns(__builtin_frame_address(0));
  return next ? next(exc) : _URC_FATAL_PHASE1_ERROR;
}

}  // extern "C"
