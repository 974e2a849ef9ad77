/* tests/tracee/unwind_chain.c: a call chain without frame pointers. */
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define UNW_MAX_FRAMES 16

struct unw_regs {
  uint64_t pc, sp, bp;
};

struct unw_seen {
  struct unw_regs regs;          /* unw_leaf's, after its call of unw_capture */
  void* callers[UNW_MAX_FRAMES]; /* backtrace() right after, in unw_leaf */
  int frames;
  /* Called by unw_leaf after both, while the chain's frames are on the stack. */
  void (*walk)(struct unw_seen* seen);
  void* context;
};

void unw_capture(struct unw_regs* out);
int unw_top(struct unw_seen* seen);

#ifdef __cplusplus
}
#endif
