// C++ functions that throw through each other (throwing.inc, built at -O0 and -O2), for
// the landing-pad reader's tests, and one whose unlikely path GCC moves to `NAME.cold`.
#pragma once

#include <cstdint>

namespace probefs::tracee::throwing {

struct Thrown {
  int code;
};
struct Cleanup {
  ~Cleanup();  // out of line: the frame needs a landing pad to run it
};

void maybe_throw(int x);  // throws Thrown{x} for odd x
// Records the address it returns to (in the caller's cold part); cold, so that GCC moves
// the path that calls it out of line.
[[gnu::cold]] void note_return_address();
uintptr_t noted_return_address();

#define PF_THROWING_DECLARE(sfx)    \
  int cleanup_only_##sfx(int x);    \
  int two_cleanups_##sfx(int x);    \
  int catches_##sfx(int x);         \
  int with_cold_##sfx(int x);

PF_THROWING_DECLARE(o0)
PF_THROWING_DECLARE(o2)

}  // namespace probefs::tracee::throwing
