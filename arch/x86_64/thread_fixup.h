// Moving other threads of this process off code that is about to change, and holding them
// still while it changes.
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

// A thread whose ip is `from` resumes at `to`; `to` == 0: a thread there cannot be moved,
// and the park fails with -EAGAIN (the caller tries again once it has left).
struct IpMove {
  uintptr_t from;
  uintptr_t to;
};

// Parks every other thread that runs user code until unpark_threads(): each gets the fixup
// signal, moves its ip if it is on a listed address, and waits in the handler (a futex, no
// library call). While they are parked no running thread can enter or leave the code
// being rewritten, block a signal, or take a trap there. Threads asleep or stopped are
// checked, not disturbed. 0: parked (call unpark_threads()); -EAGAIN: some thread is on a
// listed address where it cannot be moved, blocks the fixup signal while running, or did
// not answer (nothing stays parked; try again later); -E2BIG: too many moves.
//
// Between park and unpark the caller must not allocate or take a lock that a parked
// thread could hold: write the text and return.
//
// `hazards` lists out-of-line code whose way out leads into code being rewritten (the
// detour of a region that now overlaps a new one, the thunks): a thread in one, or inside
// a handler that a detour called (probefs_arch_detour_depth) while any is listed, makes the
// park fail with -EAGAIN, unless a move covers its exact ip.
struct CodeRange {
  uintptr_t start;
  uintptr_t end;
};
[[nodiscard]] int park_threads(const IpMove* moves, size_t n, const CodeRange* hazards = nullptr,
                               size_t nhazards = 0);
void unpark_threads();

// The real-time signal used to reach other threads.
int thread_fixup_signal();

}  // namespace probefs::arch::x86_64
