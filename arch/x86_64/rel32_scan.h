// Every position of a stretch of code whose bytes read as a direct branch with a 32-bit
// displacement (call rel32 e8, jmp rel32 e9, jcc rel32 0f 8x), wherever instructions
// really start: a superset of the real branches, which the optimizer narrows down by
// decoding around the few candidates that matter (optimize.cc).
//
// Sixteen bytes at a time with SSE2 (rel32_scan.cc is built apart from the rest of arch,
// which is -mgeneral-regs-only: this runs in control operations, never on the hit path),
// so that a process start scans libc's 1.4 MB in a few hundred microseconds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace probefs::arch::x86_64 {

// Writes to out[] the positions p < owned of buf[0, n) whose bytes read as a rel32
// branch opcode (e8, e9, or 0f followed by 8x), in increasing order, at most `cap` of
// them from position `from` on; returns how many, and in *next where to go on (owned when
// done). Positions from owned on belong to the next chunk of a scan in chunks.
size_t rel32_opcodes(const uint8_t* buf, size_t n, size_t owned, size_t from, uint32_t* out,
                     size_t cap, size_t* next);

// Calls fn(pos, target) for each position pos < owned of buf[0, n) that reads as a rel32
// branch whose bytes all lie in buf, with target = pos + its length + displacement (an
// offset from buf, possibly negative or beyond n).
template <class Fn>
inline void for_each_rel32(const uint8_t* buf, size_t n, size_t owned, Fn&& fn) {
  constexpr size_t kBatch = 512;
  uint32_t at[kBatch];
  for (size_t from = 0; from < owned;) {
    const size_t k = rel32_opcodes(buf, n, owned, from, at, kBatch, &from);
    for (size_t i = 0; i < k; ++i) {
      const size_t q = at[i];
      const size_t field = q + (buf[q] == 0x0f ? 2 : 1);
      if (field + 4 > n) continue;
      int32_t rel;
      std::memcpy(&rel, buf + field, 4);
      fn(q, static_cast<int64_t>(field + 4) + rel);
    }
  }
}

// One bit per byte of a mapping: set where some candidate rel32 branch lands.
struct Rel32Targets {
  uint64_t* bits = nullptr;
  size_t size = 0;  // bytes covered

  void mark(int64_t target) {
    if (target >= 0 && static_cast<uint64_t>(target) < size)
      bits[static_cast<uint64_t>(target) >> 6] |= uint64_t{1} << (target & 63);
  }
  // Whether a candidate lands in [from, to).
  bool any(size_t from, size_t to) const {
    if (to > size) to = size;
    for (size_t i = from; i < to; ++i)
      if (bits[i >> 6] >> (i & 63) & 1) return true;
    return false;
  }
};

}  // namespace probefs::arch::x86_64
