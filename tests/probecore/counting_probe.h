// A probe that counts its hits, and the bounds of the function around an address of this
// test program (its ELF symbols): what the optimizer tests register by the hundred.
#pragma once

#include <atomic>
#include <cstdint>

#include "probecore/kprobes.h"
#include "tracee/self_symbols.h"

namespace probefs::probecore::test_util {

struct Counter : Kprobe {
  std::atomic<long> hits{0};
};

inline int count_hit(Kprobe* p, PtRegs*) {
  static_cast<Counter*>(p)->hits.fetch_add(1, std::memory_order_relaxed);
  return 0;
}

// The bounds of the function that contains addr, from the ELF resolver (.symtab, .dynsym,
// or the .eh_frame entry for libc's local implementations such as __strlen_avx2).
inline FunctionBounds bounds_at(uintptr_t addr) {
  SymbolLocation loc;
  if (tracee::self_symbol_resolver().describe(addr, &loc) != 0) return {};
  return loc.bounds;
}

}  // namespace probefs::probecore::test_util
