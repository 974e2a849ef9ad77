// Moving other threads of this process off code that is about to change.
//
// Before the bytes of a region are rewritten, no thread may be left with its ip on one of
// the region's instructions (it would resume in the middle of the new jmp). Threads that
// are running or runnable in user code get a signal whose handler moves their ip, if it is
// on one of the listed addresses, to the same instruction's copy. Threads asleep in the
// kernel are not disturbed (no signal, so no EINTR): their resume address is read from
// /proc/self/task/TID/syscall, and if it is on a listed address the move is refused with
// -EAGAIN (the caller retries later). Stopped threads are treated the same way.
#pragma once

#include <cstddef>
#include <cstdint>

namespace probefs::arch::x86_64 {

struct IpMove {
  uintptr_t from;
  uintptr_t to;
};

// 0, or -EAGAIN when some thread could not be checked or moved (try again later).
[[nodiscard]] int move_threads(const IpMove* moves, size_t n);

// The real-time signal used to reach other threads.
int thread_fixup_signal();

}  // namespace probefs::arch::x86_64
