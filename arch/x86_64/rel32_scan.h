// Every position of a stretch of code whose bytes read as a direct branch with a 32-bit
// displacement (call rel32 e8, jmp rel32 e9, jcc rel32 0f 8x), wherever instructions
// really start: a superset of the real branches, which the optimizer narrows down by
// decoding around the few candidates that matter (optimize.cc).
//
// Eight bytes at a time: a few ALU operations find the opcode bytes of a word, and only
// those are looked at, so that a process start scans libc's 1.4 MB in a fraction of a
// millisecond. General-purpose registers
// only: this runs inside targets, in code built -mgeneral-regs-only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace probefs::arch::x86_64 {

namespace rel32_scan_detail {

constexpr uint64_t kOnes = 0x0101010101010101ull;
constexpr uint64_t kHighs = 0x8080808080808080ull;

// The high bit of each byte of x that equals b, and no other bit.
constexpr uint64_t bytes_equal(uint64_t x, uint8_t b) {
  const uint64_t v = x ^ (kOnes * b);
  return ~(((v & ~kHighs) + ~kHighs) | v) & kHighs;
}

}  // namespace rel32_scan_detail

// Calls fn(pos, target) for each position pos < owned of buf[0, n) that reads as a rel32
// branch whose bytes all lie in buf, with target = pos + its length + displacement (an
// offset from buf, possibly negative or beyond n). Positions from owned on belong to the
// next chunk of a scan in chunks (owned <= n; a chunk overlaps the next by 5 bytes).
template <class Fn>
inline void for_each_rel32(const uint8_t* buf, size_t n, size_t owned, Fn&& fn) {
  using namespace rel32_scan_detail;
  auto at = [&](size_t q) {
    const uint8_t op = buf[q];
    size_t field;
    if ((op & 0xfe) == 0xe8) field = q + 1;
    else if (op == 0x0f && q + 1 < n && (buf[q + 1] & 0xf0) == 0x80) field = q + 2;
    else return;
    if (field + 4 > n) return;
    int32_t rel;
    std::memcpy(&rel, buf + field, 4);
    fn(q, static_cast<int64_t>(field + 4) + rel);
  };
  size_t q = 0;
  for (; q + 8 <= owned; q += 8) {
    uint64_t x;
    std::memcpy(&x, buf + q, 8);
    // e8 and e9 both read as e9 with the low bit set; 0f counts where the next byte is
    // 8x (the word one byte on, read only when this one has a 0f); then each in turn.
    uint64_t m = bytes_equal(x | kOnes, 0xe9);
    if (const uint64_t f = bytes_equal(x, 0x0f); f != 0) {
      uint64_t next = x >> 8;
      if (q + 8 < n) next |= uint64_t{buf[q + 8]} << 56;
      m |= f & bytes_equal(next & (kOnes * 0xf0), 0x80);
    }
    for (; m != 0; m &= m - 1) at(q + (static_cast<unsigned>(__builtin_ctzll(m)) >> 3));
  }
  for (; q < owned; ++q) at(q);
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
