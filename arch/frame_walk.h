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

}  // namespace probefs::arch
