// C++ functions that throw through each other, for the exception tests: destructors to run
// while unwinding, catches in between, a rethrow. Built twice (exceptions.inc), at -O0 and
// at -O2; the helpers they call live out of line in exceptions_support.cc.
#pragma once

#include <string>

namespace probefs::probecore::exc {

struct Thrown {
  int code;
};

// Logs its destruction; the destructor is out of line, as in most real code, so the
// compiler must keep a landing pad to run it.
struct Guard {
  explicit Guard(int i) : id(i) {}
  ~Guard();
  int id;
};

// The G: no members, an out-of-line destructor.
struct G {
  ~G();
};

void maybe_throw(int x);  // throws Thrown{x} when x % 3 == 0
void note(char what, int value);
std::string& log();

#define PF_EXC_DECLARE(sfx)          \
  int exc_exact_##sfx(int x);        \
  int exc_foo_##sfx(int x);          \
  int exc_thrower_##sfx(int x);      \
  int exc_catch_##sfx(int x);        \
  int exc_nested_##sfx(int x);       \
  int exc_outer_##sfx(int x);

PF_EXC_DECLARE(o0)
PF_EXC_DECLARE(o2)

}  // namespace probefs::probecore::exc
