// A range of code, [start, end) in run-time addresses. Plain data, shared by the engine's
// contract (arch.h) and by the bounds the symbol side hands the engine
// (probecore/symbol_resolver.h).
#pragma once

#include <cstdint>

namespace probefs::arch {

struct TextRange {
  uintptr_t start = 0, end = 0;
};

}  // namespace probefs::arch
