// The out-of-line helpers of exceptions.inc: never inlined into the functions the tests
// probe, so every call the tests throw through is a real call.
#include "tests/probecore/exceptions.h"

#include <cstdio>

namespace probefs::probecore::exc {

std::string& log() {
  static std::string text;
  return text;
}

void note(char what, int value) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%c%d ", what, value);
  log() += buf;
}

Guard::~Guard() { note('~', id); }
G::~G() { note('~', 0); }

void maybe_throw(int x) {
  if (x % 3 == 0) throw Thrown{x};
}

}  // namespace probefs::probecore::exc
