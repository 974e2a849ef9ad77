// Verbs for tests only: not part of the contract probecore calls (arch/arch.h), and
// nothing but tests/ includes this header. Implemented by the backend.
#pragma once

#include <cstddef>
#include <cstdint>

#include "arch/arch.h"

namespace probefs::arch::testing {

// Reads code as it would be with no probe armed (through our int3s and jmps). 0 or -EFAULT.
[[nodiscard]] int read_text(uintptr_t addr, void* buf, size_t n);

// How many sites the optimizer keeps per-site state for (prepared for optimization and
// not yet released).
size_t site_detour_entries();

// Where the out-of-line copy of a prepared site jumps back to the original code (the jmp's
// address), as recorded when the copy was built; 0 when it has none (not boosted, or an
// instruction that does not fall through).
uintptr_t boost_return(const Site* site);

// A write window's look at the other threads, with one address listed where no thread may
// be (as a region being rewritten): 0 when every other thread was parked or passed by (the
// window is then open: close_window()); -EAGAIN when one sits on `listed_pc` (asleep in
// the kernel with that resume point, or running there).
[[nodiscard]] int open_window_listing(uintptr_t listed_pc);
void close_window();

}  // namespace probefs::arch::testing
