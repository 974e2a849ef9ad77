// The third tier of errors (DESIGN.md §1): a broken invariant inside someone else's process.
// A user's mistake is a diagnostic and a failure the caller can handle is a negative errno;
// a state the code assumed impossible (a write to code that was there failed, a barrier
// the kernel refused) is neither. It must not kill the program the engine lives in: it is
// warned once on stderr, counted, and listed for the daemon (the kprobes/ files), and the
// code goes on with the least harmful choice.
//
//   if (PROBEFS_WARN_ON_ONCE(rc != 0, "the jmp's tail could not be written")) { ...undo... }
//
// The macro is an expression with the value of `cond`. Safe on the hit path and in signal
// handlers: one atomic add per hit of the broken condition; the first one also takes a
// slot of a fixed table and issues one raw write(2) to stderr. No libc call, no allocation,
// no lock, errno untouched.
#pragma once

#include <cstddef>
#include <cstdint>

namespace probefs::arch {

// One call site of PROBEFS_WARN_ON_ONCE (a static of its own, constant-initialized).
struct WarnSite {
  const char* text;
  const char* file;
  int line;
  uint64_t count;  // atomic
};

// Counts a hit of `site`; the first one prints and lists it.
void warn(WarnSite* site);

// A warning as the daemon lists it.
struct Warning {
  const char* text;
  const char* file;
  int line;
  uint64_t count;
};

// The call sites that have warned, in the order they first did: fills out[0, min(n, max))
// and returns n. Any thread, any time.
size_t warnings(Warning* out, size_t max);

}  // namespace probefs::arch

#define PROBEFS_WARN_ON_ONCE(cond, text)                                                  \
  __extension__({                                                                         \
    const bool probefs_warn_cond_ = static_cast<bool>(cond);                              \
    if (__builtin_expect(probefs_warn_cond_, 0)) {                                        \
      static constinit ::probefs::arch::WarnSite probefs_warn_site_{text, __FILE__,       \
                                                                    __LINE__, 0};         \
      ::probefs::arch::warn(&probefs_warn_site_);                                         \
    }                                                                                     \
    probefs_warn_cond_;                                                                   \
  })
