// The return addresses of a thread's stack by its frame-pointer chain (x86-64 System V):
// a function built with frame pointers keeps, at [rbp], its caller's rbp and, at [rbp+8],
// its return address. Read through a memory reader (events/memory_reader.h), so a chain
// that leads anywhere ends in a failed read, never a fault; and bounded besides: each frame
// lies above the last and within kMaxFrameSpan of the stack pointer, so a loop or a wild
// pointer ends the walk.
//
// What it cannot see: a function built without frame pointers leaves rbp to its own use,
// and the walk ends (or skips its caller) there; a probe on the first instruction of a
// function sees its caller through the return address at [rsp] (the caller asks for it).
#pragma once

#include <cstdint>

#include "arch/unwind_table.h"

namespace probefs::arch {

// The walk gives up on a frame further than this above the stack pointer.
inline constexpr uint64_t kMaxFrameSpan = uint64_t{64} << 20;

// Stores up to `max` return addresses of the chain from `bp` into out[0..), and returns
// how many. `sp` is the stack pointer of the same moment. `fix(slot, value)` gives what a
// return address read at stack address `slot` stands for (a return probe may have put its
// own return point there).
template <class Reader, class Fix>
inline uint32_t walk_frame_pointers(const Reader& rd, uint64_t bp, uint64_t sp, uint64_t* out,
                                    uint32_t max, Fix&& fix) {
  uint32_t n = 0;
  while (n < max) {
    if (bp < sp || bp - sp > kMaxFrameSpan || (bp & 7) != 0) break;
    uint64_t frame[2];  // the caller's rbp, the return address
    if (!rd.read(bp, frame, sizeof frame)) break;
    if (frame[1] == 0) break;
    out[n++] = fix(bp + 8, frame[1]);
    if (frame[0] <= bp) break;  // frames lie above each other: anything else ends here
    bp = frame[0];
  }
  return n;
}

// The return addresses of a thread's stack by the unwind tables of its code
// (arch/unwind_table.h), where the code has them, and by the frame-pointer chain where it
// has none: a thread stopped at `pc` with stack pointer `sp` and frame pointer `bp`.
// `find(address)` gives the row that holds an address, or nullptr; `entry` says the
// thread stopped on a function's first instruction, which needs no table to see its
// caller at [sp] (the frame-pointer chain would skip it). Stores up to `max` return
// addresses into out[0..) and returns how many; bounded as walk_frame_pointers() is: each
// frame lies above the last, within kMaxFrameSpan of the stack pointer, every read
// through the reader.
template <class Reader, class Find, class Fix>
inline uint32_t walk_unwind(const Reader& rd, uint64_t pc, uint64_t sp, uint64_t bp, bool entry,
                            uint64_t* out, uint32_t max, Find&& find, Fix&& fix) {
  const uint64_t bottom = sp;
  uint32_t n = 0;
  while (n < max) {
    // A caller's row is the one of its call instruction, which the return address follows
    // (a call may be a function's last instruction): looked up one byte before it.
    const UnwindRow* row = find(n == 0 ? pc : pc - 1);
    uint64_t cfa, next_bp = bp, ra;
    if (row != nullptr && row->kind == kUnwindOutermost) break;
    if (row != nullptr && row->kind != kUnwindUnknown) {
      cfa = (row->kind == kUnwindCfaSp ? sp : bp) + static_cast<int64_t>(row->cfa_offset);
      if (cfa <= sp || cfa - bottom > kMaxFrameSpan || (cfa & 7) != 0) break;
      if (!rd.read(cfa - 8, &ra, 8)) break;
      if (row->bp_rule == kUnwindBpSaved &&
          !rd.read(cfa + static_cast<int64_t>(row->bp_offset), &next_bp, 8))
        break;
    } else if (n == 0 && entry) {
      cfa = sp + 8;  // nothing pushed yet: the return address is at the stack pointer
      if (!rd.read(sp, &ra, 8)) break;
    } else {
      if (bp < sp || bp - bottom > kMaxFrameSpan || (bp & 7) != 0) break;
      uint64_t frame[2];  // the caller's rbp, the return address
      if (!rd.read(bp, frame, sizeof frame)) break;
      cfa = bp + 16;
      next_bp = frame[0];
      ra = frame[1];
    }
    if (ra == 0) break;
    out[n++] = fix(cfa - 8, ra);
    pc = out[n - 1];
    sp = cfa;
    bp = next_bp;
  }
  return n;
}

}  // namespace probefs::arch
